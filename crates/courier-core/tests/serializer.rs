//! MessagePack bodies (`serializer = "msgpack"`) on the in-memory transport: every stamp kind
//! survives the round trip, and JSON and MessagePack messages on one queue are both consumed.
#![allow(clippy::unwrap_used, missing_docs)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use courier_core::{
    DecodeError, Encoded, Envelope, InMemoryOptions, InMemoryTransport, MSGPACK_CONTENT_TYPE,
    Serializer, SignatureStamp, Transport, async_trait, encode, encode_with,
};
use courier_test::{Harness, TestMessage, conformance, serializer};

struct Memory(Serializer);

#[async_trait]
impl Harness for Memory {
    async fn transport(&self) -> Arc<dyn Transport> {
        Arc::new(InMemoryTransport::with_options(
            InMemoryOptions::default()
                .serialize(true)
                .serializer(self.0),
            courier_test::registry(),
        ))
    }
    async fn expire_deliveries(&self, _: &Arc<dyn Transport>) {}
    async fn send_raw(&self, transport: &Arc<dyn Transport>, encoded: Encoded) {
        // Decoded as stored, then stored again by a transport writing `self.0`: a message that
        // decoded from MessagePack has no JSON text to keep, so it is stored as MessagePack.
        let wire = courier_test::registry().decode(encoded);
        transport.send(wire).await.unwrap();
    }
    fn poll_window(&self) -> Duration {
        Duration::from_millis(10)
    }
}

#[tokio::test]
async fn msgpack_round_trip_keeps_every_stamp_kind_in_memory() {
    conformance::round_trip(&Memory(Serializer::MessagePack)).await;
    conformance::large_body_round_trip(&Memory(Serializer::MessagePack)).await;
}

#[tokio::test]
async fn json_and_msgpack_messages_on_one_queue_are_both_consumed() {
    serializer::json_and_msgpack_producers_are_both_consumed(&Memory(Serializer::Json)).await;
    serializer::json_and_msgpack_producers_are_both_consumed(&Memory(Serializer::MessagePack))
        .await;
}

fn stamped() -> Envelope {
    conformance::fully_stamped(1, conformance::UNICODE_TEXT).with(SignatureStamp {
        key: "k".into(),
        hmac: "00".repeat(32),
    })
}

#[test]
fn msgpack_writes_a_base64_msgpack_body_and_keeps_stamps_in_json_headers() {
    let envelope = stamped();
    let json = encode(&envelope).unwrap();
    let packed = encode_with(&envelope, Serializer::MessagePack).unwrap();
    assert_eq!(packed.headers["content-type"], MSGPACK_CONTENT_TYPE);
    assert_eq!(packed.headers["x-courier-body-encoding"], "base64");
    let stamps = |h: &BTreeMap<String, String>| -> BTreeMap<String, String> {
        h.iter()
            .filter(|(k, _)| k.starts_with("x-courier-stamp-"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    assert_eq!(stamps(&packed.headers), stamps(&json.headers));
    assert!(!packed.body.starts_with('{'), "{}", packed.body);
    let back = courier_test::registry().decode(packed);
    assert_eq!(
        back.message::<TestMessage>(),
        envelope.message::<TestMessage>()
    );
    // Re-encoded as JSON, the decoded message is the JSON producer's message exactly.
    assert_eq!(encode(&back).unwrap(), json);
}

#[test]
fn a_raw_binary_msgpack_body_decodes_and_a_bad_one_is_a_decode_error() {
    let registry = courier_test::registry();
    let message = TestMessage::new(9);
    let bytes = rmp_serde::to_vec_named(&message).unwrap();
    let headers: BTreeMap<String, String> = [
        ("type".to_owned(), "courier.test".to_owned()),
        ("content-type".to_owned(), MSGPACK_CONTENT_TYPE.to_owned()),
    ]
    .into();
    let ok = registry.decode_bytes(bytes, headers.clone());
    assert_eq!(ok.message::<TestMessage>(), Some(&message));
    let bad = registry.decode_bytes(vec![0xc1, 0xff], headers);
    assert!(
        matches!(
            bad.decode_error(),
            Some(DecodeError::InvalidMsgpackBody { .. })
        ),
        "{:?}",
        bad.decode_error()
    );
    // Sent on, it keeps its bytes and content type: it stays undecodable the same way.
    let again = registry.decode(encode(&bad).unwrap());
    assert!(matches!(
        again.decode_error(),
        Some(DecodeError::InvalidMsgpackBody { .. })
    ));
}
