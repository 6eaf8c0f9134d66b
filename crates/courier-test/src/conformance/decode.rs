//! Item 9: a stored message that cannot be decoded surfaces as an envelope with a decode
//! error (never a panic, never an error of `get`), keeps its raw body, can be acked, and does
//! not hold up the messages behind it.

use courier_core::{Encoded, encode};

use super::support::{expect_count, expect_nothing, id, message, ok, receive, seq};
use crate::Harness;

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
