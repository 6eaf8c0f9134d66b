//! Item 5: unacked deliveries come back; a superseded delivery's late ack deletes nothing;
//! keepalive is accepted and postpones the redelivery.

use std::time::Duration;

use tokio::time::Instant;

use super::support::{expect_count, expect_nothing, id, ok, receive, send_seqs, seq};
use crate::Harness;

/// A message received and never acked (its consumer died) is delivered again, with the same
/// id and body, once its redelivery window has passed (`Harness::expire_deliveries`).
pub async fn unacked_message_is_redelivered(h: &dyn Harness) {
    let t = h.transport().await;
    let sent = send_seqs(h, &t, [1]).await;
    let first = receive(h, &t, 1, "the first delivery").await;
    h.expire_deliveries(&t).await;
    let again = receive(h, &t, 1, "the redelivery after expire_deliveries").await;
    assert_eq!(seq(&again[0]), 1);
    assert_eq!(
        id(&again[0], "get (redelivery)"),
        id(&sent[0], "send"),
        "a redelivery must keep the message id"
    );
    assert_eq!(id(&first[0], "get"), id(&sent[0], "send"));
    expect_count(h, &t, 1, "one message, redelivered").await;
    ok(h, "ack (redelivery)", t.ack(&again[0])).await;
    expect_count(h, &t, 0, "after acking the redelivery").await;
    expect_nothing(h, &t, "after acking the redelivery").await;
}

/// The late ack (or reject, or `ack_and_get`) of a superseded delivery does not delete the message's new
/// delivery: after it the count is still 1, and the new delivery can still be acked (count 0).
pub async fn late_ack_of_superseded_delivery_keeps_new_one(h: &dyn Harness) {
    let t = h.transport().await;
    send_seqs(h, &t, [1]).await;
    let old = receive(h, &t, 1, "the first delivery").await;
    h.expire_deliveries(&t).await;
    let new = receive(h, &t, 1, "the redelivery").await;
    assert_eq!(seq(&new[0]), 1);

    // Acking the superseded delivery may succeed or fail, but must not remove the message.
    let late =
        super::support::bounded(h, "late ack of the superseded delivery", t.ack(&old[0])).await;
    expect_count(
        h,
        &t,
        1,
        &format!("the late ack of a superseded delivery (result {late:?}) deleted the message"),
    )
    .await;
    let late = super::support::bounded(
        h,
        "late reject of the superseded delivery",
        t.reject(&old[0]),
    )
    .await;
    expect_count(
        h,
        &t,
        1,
        &format!("the late reject of a superseded delivery (result {late:?}) deleted the message"),
    )
    .await;
    // Where acks ride on the next claim (SQL), the same: the live delivery is not claimed
    // again, and the stale ack deletes nothing.
    let late = super::support::bounded(
        h,
        "late ack_and_get of the superseded delivery",
        t.ack_and_get(&old, 1),
    )
    .await;
    assert!(
        late.as_ref().is_err() || late.as_ref().is_ok_and(Vec::is_empty),
        "ack_and_get handed out a message whose live delivery is not due: {late:?}"
    );
    expect_count(
        h,
        &t,
        1,
        &format!(
            "the late ack_and_get of a superseded delivery (result {late:?}) deleted the message"
        ),
    )
    .await;

    ok(h, "ack of the live delivery", t.ack(&new[0])).await;
    expect_count(h, &t, 0, "after acking the live delivery").await;
    h.expire_deliveries(&t).await;
    expect_nothing(h, &t, "the acked redelivery came back").await;
}

/// `keepalive` on a live delivery succeeds, leaves it ackable, and postpones its redelivery:
/// on a transport with a redelivery window `W` (from [`Harness::transport_with_redelivery`],
/// at least 4 s and four poll windows), a message kept alive `W / 2` after it was received is
/// still not delivered again past `W`, then is acked for good.
///
/// # Panics
/// When the transport has a redelivery window and the harness gives no transport with a short
/// one, or when the kept-alive message comes back.
pub async fn keepalive_on_live_delivery_is_ok(h: &dyn Harness) {
    let t = h.transport().await;
    send_seqs(h, &t, [1]).await;
    let got = receive(h, &t, 1, "the delivery").await;
    ok(h, "keepalive", t.keepalive(&got[0])).await;
    ok(h, "second keepalive", t.keepalive(&got[0])).await;
    ok(h, "ack after keepalive", t.ack(&got[0])).await;
    expect_count(h, &t, 0, "after acking the kept-alive delivery").await;

    let window = (h.poll_window() * 4).max(Duration::from_secs(4));
    let Some(t) = h.transport_with_redelivery(window).await else {
        let has = t.capabilities().redeliver_after;
        assert!(
            has.is_none(),
            "the transport redelivers after {has:?} (capabilities().redeliver_after), but the \
             harness's transport_with_redelivery gives no transport with a {window:?} window: \
             the case cannot check that keepalive postpones the redelivery"
        );
        return;
    };
    assert_eq!(
        t.capabilities().redeliver_after,
        Some(window),
        "transport_with_redelivery({window:?}) gave a transport with another redelivery window"
    );
    send_seqs(h, &t, [2]).await;
    let got = receive(h, &t, 1, "the delivery to keep alive").await;
    // The delivery happened before now: its window ends by `received + window`.
    let received = Instant::now();
    let keep_at = received + window / 2;
    tokio::time::sleep_until(keep_at).await;
    ok(
        h,
        "keepalive halfway through the window",
        t.keepalive(&got[0]),
    )
    .await;
    // Past the first window, and the `get` (at most a poll window) ends well before the
    // kept-alive window (from `keep_at`, ending `window / 2` after the first) does.
    let check_at = received + window + (window / 2 - h.poll_window()) / 2;
    tokio::time::sleep_until(check_at).await;
    expect_nothing(
        h,
        &t,
        &format!(
            "keepalive did not postpone the redelivery: a delivery kept alive {:?} after it was \
             received, {:?} into its {window:?} window, was delivered again by {:?} after it \
             was received",
            keep_at - received,
            window / 2,
            check_at - received
        ),
    )
    .await;
    ok(h, "ack of the kept-alive delivery", t.ack(&got[0])).await;
    expect_count(h, &t, 0, "after acking the kept-alive delivery").await;
}
