//! Item 4: FIFO among equal priorities; higher `PriorityStamp` first where supported.

use courier_core::PriorityStamp;

use super::support::{
    ack_all, expect_count, id, idle, message, ok, receive_window, receive_within, send_seqs, seqs,
};
use crate::Harness;

/// Twenty non-delayed messages of equal priority sent one by one by one producer are received
/// in send order, across several `get`s of at most 7, each with the id `send` returned.
pub async fn fifo_for_equal_priority(h: &dyn Harness) {
    let t = h.transport().await;
    let sent = send_seqs(h, &t, 0..20).await;
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + receive_window(h);
    while got.len() < 20 && tokio::time::Instant::now() < deadline {
        let want = (20 - got.len()).min(7);
        let batch = ok(h, "get", t.get(want)).await;
        assert!(
            batch.len() <= want,
            "get({want}) returned {} envelopes",
            batch.len()
        );
        if batch.is_empty() {
            idle().await;
        }
        got.extend(batch);
    }
    assert_eq!(
        seqs(&got),
        (0..20).collect::<Vec<_>>(),
        "messages were not received in send order"
    );
    let sent_ids: Vec<String> = sent.iter().map(|e| id(e, "send")).collect();
    let got_ids: Vec<String> = got.iter().map(|e| id(e, "get")).collect();
    assert_eq!(
        got_ids, sent_ids,
        "received ids differ from the ids send returned"
    );
    ack_all(h, &t, &got).await;
    expect_count(h, &t, 0, "after acking all 20").await;
}

/// Where priorities are supported, messages already waiting are received highest
/// `PriorityStamp` first, and in send order within one priority.
pub async fn higher_priority_first(h: &dyn Harness) {
    let t = h.transport().await;
    if !h.supports_priority() || !t.capabilities().priority {
        return;
    }
    let plan: [(u64, u8); 7] = [(0, 0), (1, 5), (2, 9), (3, 5), (4, 0), (5, 9), (6, 1)];
    for (s, p) in plan {
        ok(h, "send", t.send(message(s).with(PriorityStamp(p)))).await;
    }
    let got = receive_within(h, &t, plan.len(), receive_window(h)).await;
    assert_eq!(
        seqs(&got),
        vec![2, 5, 1, 3, 6, 0, 4],
        "expected priority 9 (seqs 2, 5), then 5 (1, 3), then 1 (6), then 0 (0, 4)"
    );
    ack_all(h, &t, &got).await;
    expect_count(h, &t, 0, "after acking all").await;
}
