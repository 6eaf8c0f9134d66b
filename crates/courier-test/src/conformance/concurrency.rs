//! Item 6: concurrent consumers get disjoint messages and nothing is lost.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use courier_core::Transport;
use tokio::time::Instant;

use super::support::{
    count, expect_nothing, idle, ok, receive_window, receive_within, send_seqs, seq, seqs,
};
use crate::Harness;

const MESSAGES: u64 = 200;
const CONSUMERS: usize = 4;
/// The consumers stop once this many messages have been handled, leaving the rest waiting.
const HANDLE_AT_LEAST: usize = 150;

#[derive(Default)]
struct Tally {
    /// seq -> (consumer, how it was settled: true = acked, false = rejected)
    seen: BTreeMap<u64, Vec<(usize, bool)>>,
    acked: usize,
    rejected: usize,
}

fn lock(t: &Mutex<Tally>) -> std::sync::MutexGuard<'_, Tally> {
    t.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

async fn consume(
    h: &dyn Harness,
    t: Arc<dyn Transport>,
    me: usize,
    tally: Arc<Mutex<Tally>>,
    deadline: Instant,
) {
    while Instant::now() < deadline {
        {
            let tl = lock(&tally);
            if tl.acked + tl.rejected >= HANDLE_AT_LEAST {
                return;
            }
        }
        let batch = ok(h, "get (concurrent consumer)", t.get(8)).await;
        assert!(
            batch.len() <= 8,
            "get(8) returned {} envelopes",
            batch.len()
        );
        if batch.is_empty() {
            idle().await;
        }
        for envelope in batch {
            let s = seq(&envelope);
            // Even consumers reject every 10th message; odd ones ack everything.
            let reject = me.is_multiple_of(2) && s.is_multiple_of(10);
            lock(&tally).seen.entry(s).or_default().push((me, !reject));
            if reject {
                ok(h, "reject (concurrent consumer)", t.reject(&envelope)).await;
                lock(&tally).rejected += 1;
            } else {
                ok(h, "ack (concurrent consumer)", t.ack(&envelope)).await;
                lock(&tally).acked += 1;
            }
        }
    }
}

/// Four consumers on the same transport, each acking (two of them rejecting every 10th
/// message) as soon as they receive, never get the same message twice; after they stop, the
/// messages still waiting are exactly the ones nobody handled: sent (200) = acked + rejected +
/// remaining, with `message_count` equal to remaining and a final drain returning exactly
/// the unhandled sequence numbers.
pub async fn concurrent_consumers_get_disjoint_messages(h: &dyn Harness) {
    let t = h.transport().await;
    send_seqs(h, &t, 0..MESSAGES).await;

    let tally = Arc::new(Mutex::new(Tally::default()));
    let deadline = Instant::now() + receive_window(h) + Duration::from_secs(20);
    let consumers =
        (0..CONSUMERS).map(|me| consume(h, Arc::clone(&t), me, Arc::clone(&tally), deadline));
    futures_util::future::join_all(consumers).await;

    let (handled, acked, rejected) = {
        let tl = lock(&tally);
        let doubles: Vec<_> = tl.seen.iter().filter(|(_, v)| v.len() > 1).collect();
        assert!(
            doubles.is_empty(),
            "messages delivered twice while their delivery was live: {doubles:?}"
        );
        (
            tl.seen.keys().copied().collect::<Vec<u64>>(),
            tl.acked,
            tl.rejected,
        )
    };
    assert!(
        handled.len() >= HANDLE_AT_LEAST,
        "the consumers handled only {} of {MESSAGES} messages before the deadline",
        handled.len()
    );
    assert_eq!(acked + rejected, handled.len());
    let remaining = MESSAGES as usize - handled.len();
    if let Some(n) = count(h, &t).await {
        assert_eq!(
            n, remaining as u64,
            "sent {MESSAGES} = acked {acked} + rejected {rejected} + remaining, but message_count says {n}"
        );
    }
    let rest = receive_within(h, &t, remaining, receive_window(h)).await;
    let mut all: Vec<u64> = handled.clone();
    all.extend(seqs(&rest));
    all.sort_unstable();
    assert_eq!(
        all,
        (0..MESSAGES).collect::<Vec<_>>(),
        "handled + remaining is not every message exactly once (handled {}, drained {:?})",
        handled.len(),
        seqs(&rest)
    );
    for e in &rest {
        ok(h, "ack (drain)", t.ack(e)).await;
    }
    expect_nothing(h, &t, "after draining").await;
    if let Some(n) = count(h, &t).await {
        assert_eq!(n, 0, "message_count after draining everything");
    }
}
