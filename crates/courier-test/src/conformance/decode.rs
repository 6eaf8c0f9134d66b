//! Item 9: a stored message that cannot be decoded surfaces as an envelope with a decode
//! error (never a panic, never an error of `get`), keeps its raw body, can be acked, and does
//! not hold up the messages behind it.

use std::collections::BTreeMap;

use courier_core::{
    DelayStamp, Encoded, Envelope, ErrorDetailsStamp, SentToFailureTransportStamp, encode,
};

use super::support::{expect_count, expect_nothing, id, message, ok, receive, seq};
use crate::{Harness, Poison};

async fn undecodable_surfaces(h: &dyn Harness, raw: Encoded, what: &str) {
    let t = h.transport().await;
    h.send_raw(&t, raw.clone()).await;
    ok(h, "send", t.send(message(2))).await;
    let got = receive(h, &t, 2, what).await;
    let env = &got[0];
    assert_eq!(
        seq(&got[1]),
        2,
        "{what}: the decodable message sent after it must be delivered too"
    );
    ok(h, "ack", t.ack(&got[1])).await;
    assert!(
        env.decode_error().is_some(),
        "{what}: get must return the message with decode_error() set"
    );
    let _id = id(env, "get");
    let again = match encode(env) {
        Ok(e) => e,
        Err(e) => panic!("{what}: an undecodable envelope must encode back to its raw form: {e}"),
    };
    assert_eq!(
        again.body, raw.body,
        "{what}: the raw body must be kept byte for byte"
    );
    if let Some(ty) = raw.headers.get("type") {
        assert_eq!(
            again.headers.get("type"),
            Some(ty),
            "{what}: the type header must be kept"
        );
    }
    ok(h, "ack (undecodable)", t.ack(env)).await;
    expect_count(h, &t, 0, &format!("{what}: after acking")).await;
    expect_nothing(h, &t, &format!("{what}: after acking")).await;
}

/// A message whose `type` names no registered message decodes to an envelope with
/// `decode_error()` set; its body is kept and it can be acked.
pub async fn unknown_type_surfaces_as_decode_error(h: &dyn Harness) {
    let raw = Encoded::new(r#"{"seq":1,"text":"x"}"#)
        .header("type", "courier.test.unknown")
        .header("content-type", "application/json");
    undecodable_surfaces(h, raw, "unknown type").await;
}

/// A message whose body is not valid JSON for its type decodes to an envelope with
/// `decode_error()` set; its body is kept and it can be acked.
pub async fn bad_json_surfaces_as_decode_error(h: &dyn Harness) {
    let raw = Encoded::new("{not json ✗")
        .header("type", "courier.test")
        .header("content-type", "application/json");
    undecodable_surfaces(h, raw, "bad JSON body").await;
}

/// A message without a `type` header decodes to an envelope with `decode_error()` set; its
/// body is kept and it can be acked.
pub async fn missing_type_surfaces_as_decode_error(h: &dyn Harness) {
    let raw = Encoded::new(r#"{"seq":1,"text":"x"}"#);
    undecodable_surfaces(h, raw, "missing type header").await;
}

/// The wire headers of an envelope, without the stamps a failure transport adds.
fn headers_without_failure_stamps(envelope: &Envelope, what: &str) -> BTreeMap<String, String> {
    let bare = envelope
        .clone()
        .without_all::<ErrorDetailsStamp>()
        .without_all::<SentToFailureTransportStamp>()
        .without_all::<DelayStamp>();
    match encode(&bare) {
        Ok(wire) => wire.headers,
        Err(e) => panic!("{what}: an undecodable envelope must encode back to its raw form: {e}"),
    }
}

/// Poison stored straight into the storage ([`Harness::store_poison`]: a body that is not
/// UTF-8 or of another type, missing or unreadable headers) between two good messages: `get`
/// returns all three, the poison as an envelope with `decode_error()` set that keeps its
/// bytes; moved to another queue as the worker moves it to a failure transport, it comes back
/// with the same body bytes and headers and is still undecodable; and reject / ack remove it
/// for good.
pub async fn poison_messages_surface_as_decode_errors(h: &dyn Harness) {
    for poison in Poison::ALL {
        let what = format!("{poison:?}");
        let t = h.transport().await;
        ok(h, "send", t.send(message(1))).await;
        if !h.store_poison(&t, poison).await {
            continue;
        }
        ok(h, "send", t.send(message(3))).await;
        let got = receive(h, &t, 3, &what).await;
        let (bad, good): (Vec<Envelope>, Vec<Envelope>) =
            got.into_iter().partition(|e| e.decode_error().is_some());
        assert_eq!(bad.len(), 1, "{what}: exactly the poison is undecodable");
        let mut seqs: Vec<u64> = good.iter().map(seq).collect();
        seqs.sort_unstable();
        assert_eq!(
            seqs,
            vec![1, 3],
            "{what}: the messages beside it are delivered"
        );
        ok(h, "ack", t.ack_batch(&good)).await;
        let poison_env = &bad[0];
        let _id = id(poison_env, "get");
        let body = poison_env
            .undecodable_body()
            .map(<[u8]>::to_vec)
            .unwrap_or_default();
        if poison == Poison::BinaryBody {
            assert_eq!(body, crate::POISON_BODY, "{what}: the bytes are kept");
        }
        let headers = headers_without_failure_stamps(poison_env, &what);

        // Moved to a failure transport as the worker moves it ...
        let failure = h.transport().await;
        let moved = poison_env
            .clone()
            .with_error_details(ErrorDetailsStamp::new("decode", "undecodable", vec![]))
            .with(SentToFailureTransportStamp::new("conformance"))
            .without_all::<DelayStamp>();
        ok(h, "send to the failure queue", failure.send(moved)).await;
        let back = receive(h, &failure, 1, &format!("{what}: from the failure queue")).await;
        let back = &back[0];
        assert!(
            back.decode_error().is_some(),
            "{what}: still undecodable after the failure transport"
        );
        assert_eq!(
            back.undecodable_body(),
            Some(&body[..]),
            "{what}: the same body bytes"
        );
        assert!(
            back.last::<ErrorDetailsStamp>().is_some(),
            "{what}: details"
        );
        assert!(
            back.last::<SentToFailureTransportStamp>().is_some(),
            "{what}: failure stamp"
        );
        assert_eq!(
            headers_without_failure_stamps(back, &what),
            headers,
            "{what}: the same headers"
        );
        ok(h, "ack (failure queue)", failure.ack(back)).await;
        expect_count(h, &failure, 0, &format!("{what}: failure queue")).await;

        ok(h, "reject (undecodable)", t.reject(poison_env)).await;
        expect_count(h, &t, 0, &format!("{what}: after rejecting")).await;
        expect_nothing(h, &t, &format!("{what}: after rejecting")).await;
    }
}
