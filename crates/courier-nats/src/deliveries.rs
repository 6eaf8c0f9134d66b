//! The live deliveries this process received, so the late ack of a superseded delivery is a
//! no-op instead of an ack of the new one.
//!
//! JetStream acks by stream sequence: the server removes the message whichever delivery's ack
//! subject the ack came on. So the transport remembers, per stream sequence, the newest
//! delivery (consumer sequence) it handed out, and settles an older one only locally.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::wire::AckSubject;

/// Entries are pruned once there are this many, dropping those untouched for two ack waits
/// (their delivery has expired on the server, so no newer one of ours depends on them).
const PRUNE_AT: usize = 8192;

#[derive(Debug)]
struct Live {
    consumer_seq: u64,
    reply: String,
    touched: Instant,
}

/// Newest delivery per stream sequence.
#[derive(Debug)]
pub(crate) struct Deliveries {
    live: Mutex<HashMap<u64, Live>>,
    stale_after: Duration,
}

impl Deliveries {
    pub(crate) fn new(ack_wait: Duration) -> Self {
        Self {
            live: Mutex::new(HashMap::new()),
            stale_after: ack_wait.saturating_mul(2),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Live>> {
        self.live
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records a delivery handed out by `get`.
    pub(crate) fn received(&self, ack: AckSubject, reply: &str) {
        let now = Instant::now();
        let mut live = self.lock();
        if live.len() >= PRUNE_AT {
            let stale_after = self.stale_after;
            live.retain(|_, l| now.saturating_duration_since(l.touched) < stale_after);
        }
        match live.get_mut(&ack.stream_seq) {
            Some(l) if l.consumer_seq > ack.consumer_seq => {}
            Some(l) => {
                l.consumer_seq = ack.consumer_seq;
                reply.clone_into(&mut l.reply);
                l.touched = now;
            }
            None => {
                live.insert(
                    ack.stream_seq,
                    Live {
                        consumer_seq: ack.consumer_seq,
                        reply: reply.to_owned(),
                        touched: now,
                    },
                );
            }
        }
    }

    /// Whether this process handed out a newer delivery of the same message.
    pub(crate) fn superseded(&self, ack: AckSubject) -> bool {
        self.lock()
            .get(&ack.stream_seq)
            .is_some_and(|l| l.consumer_seq > ack.consumer_seq)
    }

    /// Marks a delivery kept alive.
    pub(crate) fn touched(&self, ack: AckSubject) {
        if let Some(l) = self.lock().get_mut(&ack.stream_seq)
            && l.consumer_seq == ack.consumer_seq
        {
            l.touched = Instant::now();
        }
    }

    /// Forgets a settled delivery (acked, rejected or released).
    pub(crate) fn settled(&self, ack: AckSubject) {
        let mut live = self.lock();
        if live
            .get(&ack.stream_seq)
            .is_some_and(|l| l.consumer_seq == ack.consumer_seq)
        {
            live.remove(&ack.stream_seq);
        }
    }

    /// Every live delivery's ack subject.
    pub(crate) fn all(&self) -> Vec<String> {
        self.lock().values().map(|l| l.reply.clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ack(stream_seq: u64, consumer_seq: u64) -> AckSubject {
        AckSubject {
            stream_seq,
            consumer_seq,
            published_nanos: 0,
        }
    }

    #[test]
    fn an_older_delivery_is_superseded_by_a_newer_one_only() {
        let d = Deliveries::new(Duration::from_secs(30));
        d.received(ack(7, 1), "r1");
        assert!(!d.superseded(ack(7, 1)));
        d.received(ack(7, 4), "r4");
        assert!(d.superseded(ack(7, 1)));
        assert!(!d.superseded(ack(7, 4)));
        assert_eq!(d.all(), vec!["r4".to_owned()]);
        d.settled(ack(7, 1));
        assert!(
            d.superseded(ack(7, 1)),
            "settling the old one keeps the new one"
        );
        d.settled(ack(7, 4));
        assert!(!d.superseded(ack(7, 1)));
        assert!(d.all().is_empty());
    }
}
