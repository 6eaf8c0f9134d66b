//! Batch equivalence: `send_batch` / `ack_batch` behave like their loops.

use courier_core::Envelope;

use super::support::{
    assert_distinct_ids, expect_count, expect_nothing, id, message, ok, receive, send_seqs, seq,
    seqs,
};
use crate::Harness;

/// `send_batch` of ten returns ten envelopes in order, each with a distinct id, and they are
/// received in that order with those ids, exactly like ten `send`s; `ack_batch` of all ten
/// leaves the transport empty. Empty batches are accepted and do nothing.
pub async fn send_batch_and_ack_batch_behave_like_loops(h: &dyn Harness) {
    let t = h.transport().await;
    assert!(
        ok(h, "send_batch (empty)", t.send_batch(Vec::new()))
            .await
            .is_empty()
    );
    let batch: Vec<Envelope> = (0..10).map(message).collect();
    let sent = ok(h, "send_batch", t.send_batch(batch)).await;
    assert_eq!(
        seqs(&sent),
        (0..10).collect::<Vec<_>>(),
        "send_batch must return the envelopes in order"
    );
    assert_distinct_ids(&sent, "send_batch");
    expect_count(h, &t, 10, "after send_batch of ten").await;

    let got = receive(h, &t, 10, "the batch").await;
    assert_eq!(
        seqs(&got),
        (0..10).collect::<Vec<_>>(),
        "a batch must be received in order"
    );
    let sent_ids: Vec<String> = sent.iter().map(|e| id(e, "send_batch")).collect();
    let got_ids: Vec<String> = got.iter().map(|e| id(e, "get")).collect();
    assert_eq!(
        got_ids, sent_ids,
        "received ids differ from the ids send_batch returned"
    );

    ok(h, "ack_batch (empty)", t.ack_batch(&[])).await;
    ok(h, "ack_batch", t.ack_batch(&got)).await;
    expect_count(h, &t, 0, "after ack_batch of all ten").await;
    h.expire_deliveries(&t).await;
    expect_nothing(h, &t, "after ack_batch, nothing may come back").await;
}

/// `ack_batch` with a mix of live and already-acked deliveries succeeds, acks the live ones,
/// and deletes nothing else (a message that was not in the batch stays).
pub async fn ack_batch_with_already_acked_envelopes_acks_the_rest(h: &dyn Harness) {
    let t = h.transport().await;
    send_seqs(h, &t, 0..4).await;
    let got = receive(h, &t, 3, "three of four").await;
    assert_eq!(seqs(&got), vec![0, 1, 2]);
    ok(h, "ack", t.ack(&got[0])).await;
    ok(
        h,
        "ack_batch (one already acked, two live)",
        t.ack_batch(&got),
    )
    .await;
    expect_count(
        h,
        &t,
        1,
        "after ack_batch: only message 3 (never received) must remain",
    )
    .await;
    let rest = receive(h, &t, 1, "message 3, outside the batch").await;
    assert_eq!(seq(&rest[0]), 3);
    ok(
        h,
        "ack_batch (the acked batch again + message 3)",
        t.ack_batch(&[got.clone(), rest.clone()].concat()),
    )
    .await;
    expect_count(h, &t, 0, "after acking everything").await;
    h.expire_deliveries(&t).await;
    expect_nothing(h, &t, "after ack_batch, nothing may come back").await;
}

/// `ack_and_get` acks the given deliveries and receives the next ones, like `ack_batch` then
/// `get` (SQL does both in one transaction): the acked messages are gone for good, what it
/// returns is delivered once, and an empty ack list is a plain `get`.
pub async fn ack_and_get_acks_then_receives(h: &dyn Harness) {
    let t = h.transport().await;
    send_seqs(h, &t, 0..5).await;
    let first = receive(h, &t, 2, "the first two").await;
    assert_eq!(seqs(&first), vec![0, 1]);
    let mut next = ok(h, "ack_and_get (two acks)", t.ack_and_get(&first, 2)).await;
    if next.len() < 2 {
        // A pushing transport may have fewer at hand at once; the rest come by `get`.
        next.extend(receive(h, &t, 2 - next.len(), "the rest of the second two").await);
    }
    assert_eq!(seqs(&next), vec![2, 3], "ack_and_get receives in order");
    expect_count(h, &t, 3, "after ack_and_get: 2 and 3 in flight, 4 waiting").await;
    let mut last = ok(h, "ack_and_get (two more acks)", t.ack_and_get(&next, 1)).await;
    if last.is_empty() {
        last = receive(h, &t, 1, "the last one").await;
    }
    assert_eq!(seqs(&last), vec![4]);
    expect_count(h, &t, 1, "after the second ack_and_get: only 4").await;
    ok(
        h,
        "ack_and_get (the last ack, nothing wanted)",
        t.ack_and_get(&last, 0),
    )
    .await;
    expect_count(h, &t, 0, "after acking everything").await;
    h.expire_deliveries(&t).await;
    expect_nothing(h, &t, "after ack_and_get, nothing acked may come back").await;
}
