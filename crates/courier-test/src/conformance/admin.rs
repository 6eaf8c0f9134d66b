//! Item 8: setup is idempotent, counts are exact when idle, listable transports find, list and
//! remove by id.

use super::support::{ack_all, expect_count, id, ok, receive, send_seqs, seq, seqs};
use crate::Harness;

/// `setup` may be called again on a set-up transport (twice more here) without error, and
/// the transport still works afterwards.
pub async fn setup_is_idempotent(h: &dyn Harness) {
    let t = h.transport().await;
    send_seqs(h, &t, [1]).await;
    if let Some(setup) = t.as_setup() {
        ok(h, "setup", setup.setup()).await;
        ok(h, "setup (again)", setup.setup()).await;
    }
    expect_count(h, &t, 1, "setup must not delete waiting messages").await;
    let got = receive(h, &t, 1, "a message sent before setup ran again").await;
    assert_eq!(seq(&got[0]), 1);
    ack_all(h, &t, &got).await;
}

/// `message_count` is exact on an idle transport: 0 when fresh, 7 after seven sends, 4 after
/// three of them were received and acked.
pub async fn message_count_is_exact_when_idle(h: &dyn Harness) {
    let t = h.transport().await;
    if t.as_message_count().is_none() {
        return;
    }
    expect_count(h, &t, 0, "a fresh transport").await;
    send_seqs(h, &t, 0..7).await;
    expect_count(h, &t, 7, "after seven sends").await;
    let got = receive(h, &t, 3, "three of seven").await;
    ack_all(h, &t, &got).await;
    expect_count(h, &t, 4, "after receiving and acking three of seven").await;
}

/// A listable transport lists waiting messages oldest first (honouring the limit, without
/// claiming them), finds one by its id, and removes by id: `true` the first time, `false`
/// after; a removed message is neither found, listed, counted nor delivered.
pub async fn listable_finds_lists_and_removes_by_id(h: &dyn Harness) {
    let t = h.transport().await;
    let Some(list) = t.as_listable() else { return };
    let sent = send_seqs(h, &t, [0, 1, 2]).await;
    let ids: Vec<String> = sent.iter().map(|e| id(e, "send")).collect();

    let all = ok(h, "list", list.list(10)).await;
    assert_eq!(
        seqs(&all),
        vec![0, 1, 2],
        "list must return every stored message, oldest first"
    );
    let unbounded = ok(
        h,
        "list (usize::MAX, as `--all` asks)",
        list.list(usize::MAX),
    )
    .await;
    assert_eq!(
        seqs(&unbounded),
        vec![0, 1, 2],
        "list(usize::MAX) must mean all of them"
    );
    let listed: Vec<String> = all.iter().map(|e| id(e, "list")).collect();
    assert_eq!(listed, ids, "list must return the ids send returned");
    let one = ok(h, "list(1)", list.list(1)).await;
    assert_eq!(
        seqs(&one),
        vec![0],
        "list(1) must return only the oldest message"
    );

    let found = ok(h, "find", list.find(&ids[1])).await;
    let Some(found) = found else {
        panic!("find({}) returned None for a waiting message", ids[1])
    };
    assert_eq!(seq(&found), 1);
    assert_eq!(id(&found, "find"), ids[1]);

    assert!(
        ok(h, "remove", list.remove(&ids[1])).await,
        "remove({}) of a stored message returned false",
        ids[1]
    );
    assert!(
        !ok(h, "remove (again)", list.remove(&ids[1])).await,
        "a second remove({}) returned true",
        ids[1]
    );
    assert!(
        ok(h, "find (removed)", list.find(&ids[1])).await.is_none(),
        "find returned a removed message"
    );
    assert_eq!(
        seqs(&ok(h, "list", list.list(10)).await),
        vec![0, 2],
        "list after removing message 1"
    );
    expect_count(h, &t, 2, "after removing one of three").await;

    let got = receive(
        h,
        &t,
        2,
        "the two messages left (listing must not claim them)",
    )
    .await;
    assert_eq!(seqs(&got), vec![0, 2]);
    ack_all(h, &t, &got).await;
    expect_count(h, &t, 0, "after acking the rest").await;
}
