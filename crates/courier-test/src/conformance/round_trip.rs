//! Item 1: send -> get -> ack round trip, byte for byte.

use std::collections::BTreeMap;
use std::time::{Duration, UNIX_EPOCH};

use courier_core::{
    BusNameStamp, Encoded, Envelope, ErrorDetailsStamp, HandledStamp, PriorityStamp,
    RedeliveryStamp, SentToFailureTransportStamp, TraceContextStamp, encode,
};

use super::support::{ack_all, expect_count, expect_nothing, id, ok, receive, seq};
use crate::{Harness, TestMessage};

/// Text that exercises JSON escaping and every UTF-8 width (including 4-byte emoji, which
/// MySQL's 3-byte `utf8` would mangle).
pub const UNICODE_TEXT: &str =
    "héllo wörld ✓ 日本語 😀🚀 \"quoted\" back\\slash\nnew line\ttab \u{1} ctrl \u{0} nul";

fn wire(envelope: &Envelope, what: &str) -> Encoded {
    match encode(envelope) {
        Ok(e) => e,
        Err(err) => panic!("cannot encode the {what} envelope: {err}"),
    }
}

fn assert_same_wire(sent: &Envelope, received: &Envelope, what: &str) {
    let a = wire(sent, "sent");
    let b = wire(received, "received");
    if a.body != b.body {
        let at = a
            .body
            .bytes()
            .zip(b.body.bytes())
            .position(|(x, y)| x != y)
            .unwrap_or(a.body.len().min(b.body.len()));
        panic!(
            "{what}: body changed in transit (sent {} bytes, received {} bytes, first difference at byte {at})",
            a.body.len(),
            b.body.len()
        );
    }
    assert_eq!(
        b.headers, a.headers,
        "{what}: headers changed in transit (left: received, right: sent)"
    );
}

/// A message carrying every sendable built-in stamp (but no delay).
#[must_use]
pub fn fully_stamped(seq: u64, text: &str) -> Envelope {
    Envelope::new(TestMessage {
        seq,
        text: text.to_owned(),
    })
    .with(RedeliveryStamp {
        retry_count: 2,
        at: UNIX_EPOCH + Duration::from_millis(1_700_000_000_123),
    })
    .with(ErrorDetailsStamp::new(
        "recoverable",
        "boom ✗",
        vec!["cause 1".into(), "cause 😀".into()],
    ))
    .with(HandledStamp {
        handler: "first".into(),
    })
    .with(HandledStamp {
        handler: "second".into(),
    })
    .with(BusNameStamp("command.bus".into()))
    .with(TraceContextStamp {
        traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
        tracestate: Some("vendor=opaque".into()),
    })
    .with(SentToFailureTransportStamp::new("async"))
    .with(PriorityStamp(0))
}

/// `send` returns the envelope with a `TransportMessageIdStamp`; `get` returns it with the same
/// id, and its body and headers (every sendable stamp: redelivery, error details, handled,
/// bus name, trace context, failure transport, priority) are byte-for-byte what was sent,
/// unicode included; `ack` then leaves the transport empty.
pub async fn round_trip(h: &dyn Harness) {
    let t = h.transport().await;
    let envelope = fully_stamped(1, UNICODE_TEXT);
    let sent = ok(h, "send", t.send(envelope.clone())).await;
    let sent_id = id(&sent, "send");
    assert_same_wire(&envelope, &sent, "send must return the envelope it stored");

    let got = receive(h, &t, 1, "round trip").await;
    let received = &got[0];
    assert!(
        received.decode_error().is_none(),
        "the round-tripped message did not decode: {:?}",
        received.decode_error()
    );
    assert_eq!(
        id(received, "get"),
        sent_id,
        "get returned a different transport id than send"
    );
    assert_eq!(
        received.message::<TestMessage>().map(|m| m.text.as_str()),
        Some(UNICODE_TEXT),
        "text changed"
    );
    assert_same_wire(&envelope, received, "round trip");
    assert_eq!(
        received.all::<HandledStamp>().count(),
        2,
        "both HandledStamps must survive, in order"
    );

    ok(h, "ack", t.ack(received)).await;
    expect_count(h, &t, 0, "after the ack").await;
    expect_nothing(h, &t, "after the ack").await;
}

/// A 1 MiB body (multi-byte characters throughout) survives send -> get byte for byte.
pub async fn large_body_round_trip(h: &dyn Harness) {
    let t = h.transport().await;
    let unit = "abc déf 日本 😀 ";
    let text = unit.repeat((1 << 20) / unit.len() + 1);
    let envelope = fully_stamped(2, &text);
    let sent = ok(h, "send (1 MiB)", t.send(envelope.clone())).await;
    let got = receive(h, &t, 1, "1 MiB round trip").await;
    assert_eq!(id(&got[0], "get"), id(&sent, "send"));
    assert_eq!(seq(&got[0]), 2);
    assert_same_wire(&envelope, &got[0], "1 MiB round trip");
    ack_all(h, &t, &got).await;
    expect_count(h, &t, 0, "after acking the 1 MiB message").await;
}

/// A message stored in wire form by a producer in another language (body, `type`,
/// `content-type`, a stamp header and an extra custom header) is received decoded, and encodes
/// back to exactly the body and headers that producer wrote.
pub async fn raw_message_round_trip(h: &dyn Harness) {
    let t = h.transport().await;
    let raw = Encoded::new(r#"{"seq":7,"text":"from python ✓"}"#)
        .header("type", "courier.test")
        .header("content-type", "application/json")
        .header(
            "x-courier-stamp-redelivery",
            r#"[{"retry_count":1,"at":1700000000000}]"#,
        )
        .header("x-custom-header", "kept verbatim ✓");
    h.send_raw(&t, raw.clone()).await;
    let got = receive(h, &t, 1, "raw message").await;
    let received = &got[0];
    assert!(
        received.decode_error().is_none(),
        "a well-formed raw message must decode: {:?}",
        received.decode_error()
    );
    let _id = id(received, "get");
    assert_eq!(
        received.message::<TestMessage>(),
        Some(&TestMessage {
            seq: 7,
            text: "from python ✓".into()
        })
    );
    assert_eq!(
        received.last::<RedeliveryStamp>().map(|r| r.retry_count),
        Some(1)
    );
    let again = wire(received, "received raw");
    assert_eq!(again.body, raw.body, "the raw body changed in transit");
    let expected: BTreeMap<String, String> = raw.headers.clone();
    assert_eq!(
        again.headers, expected,
        "the raw headers changed in transit (left: received, right: written)"
    );
    ack_all(h, &t, &got).await;
    expect_count(h, &t, 0, "after acking the raw message").await;
}
