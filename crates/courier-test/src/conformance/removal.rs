//! Item 2: ack and reject remove a message for good; acking twice is harmless.

use super::support::{expect_count, expect_nothing, id, ok, receive, send_seqs, seq};
use crate::Harness;

/// An acked message and a rejected message are gone for good: the count drops to 0 and they
/// do not come back, not even after every delivery's redelivery window has passed.
pub async fn ack_and_reject_remove_for_good(h: &dyn Harness) {
    let t = h.transport().await;
    send_seqs(h, &t, [1, 2]).await;
    let got = receive(h, &t, 2, "two sent messages").await;
    ok(h, "ack", t.ack(&got[0])).await;
    ok(h, "reject", t.reject(&got[1])).await;
    expect_count(h, &t, 0, "after one ack and one reject").await;
    h.expire_deliveries(&t).await;
    expect_nothing(
        h,
        &t,
        "an acked or rejected message came back after expire_deliveries",
    )
    .await;
    expect_count(h, &t, 0, "after expire_deliveries").await;
}

/// Acking the same delivery twice is not an error and deletes nothing else: with two messages
/// sent, acking the first twice leaves the second to be delivered.
pub async fn double_ack_is_harmless(h: &dyn Harness) {
    let t = h.transport().await;
    let sent = send_seqs(h, &t, [1, 2]).await;
    let first = receive(h, &t, 1, "the first message").await;
    assert_eq!(
        seq(&first[0]),
        1,
        "FIFO: the first get must return message 1"
    );
    ok(h, "ack", t.ack(&first[0])).await;
    ok(h, "second ack of the same delivery", t.ack(&first[0])).await;
    expect_count(h, &t, 1, "after acking message 1 twice").await;

    let second = receive(h, &t, 1, "message 2 after acking message 1 twice").await;
    assert_eq!(seq(&second[0]), 2);
    assert_eq!(id(&second[0], "get"), id(&sent[1], "send"));
    ok(h, "ack", t.ack(&second[0])).await;
    ok(h, "second ack of message 2", t.ack(&second[0])).await;
    expect_count(h, &t, 0, "after acking both").await;
    expect_nothing(h, &t, "after acking both").await;
}

/// Rejecting the same delivery twice is not an error and deletes nothing else.
pub async fn double_reject_is_harmless(h: &dyn Harness) {
    let t = h.transport().await;
    send_seqs(h, &t, [1, 2]).await;
    let first = receive(h, &t, 1, "the first message").await;
    ok(h, "reject", t.reject(&first[0])).await;
    ok(h, "second reject of the same delivery", t.reject(&first[0])).await;
    expect_count(h, &t, 1, "after rejecting message 1 twice").await;
    let second = receive(h, &t, 1, "message 2 after rejecting message 1 twice").await;
    assert_eq!(seq(&second[0]), 2);
    ok(h, "ack", t.ack(&second[0])).await;
    expect_count(h, &t, 0, "after acking message 2").await;
}
