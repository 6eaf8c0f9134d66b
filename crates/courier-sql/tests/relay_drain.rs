//! The relay's drain pipeline ([`relay_drained`]: SQL on PostgreSQL) against a source that
//! stops answering, on tokio's paused clock: an in-memory queue that drains, whose first drain
//! and first commit never return.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use courier_core::relay::{Relay, RelayOptions, RelaySource, RelayStats};
use courier_core::{
    Backoff, CancellationToken, Capabilities, Envelope, InMemoryTransport, Message, Transport,
    TransportError, async_trait,
};
use courier_sql::relay::{Drain, DrainHold, Drained, relay_drained};
use serde::{Deserialize, Serialize};

/// A job carrying its number.
#[derive(Serialize, Deserialize, Debug, Clone)]
struct Job(u32);
impl Message for Job {
    const NAME: &'static str = "test.job";
}

/// An in-memory queue holding jobs `0..n`.
async fn queue_with(n: u32) -> Arc<InMemoryTransport> {
    let q = Arc::new(InMemoryTransport::new());
    for i in 0..n {
        q.send(Envelope::new(Job(i)))
            .await
            .expect("the in-memory queue takes every job");
    }
    q
}

/// Never returns the first time it is called; at once afterwards.
async fn silent_once(calls: &AtomicUsize) {
    if calls.fetch_add(1, Ordering::SeqCst) == 0 {
        std::future::pending::<()>().await;
    }
}

/// A draining source whose server stops answering (a network partition, a connection
/// black-holed by a failover): its first drain and first commit never return; later ones
/// take from, and ack on, an in-memory queue.
#[derive(Debug, Default)]
struct Draining {
    inner: Arc<InMemoryTransport>,
    drain_calls: AtomicUsize,
    commit_calls: Arc<AtomicUsize>,
    /// The `hold_for` each drain was given.
    holds: Mutex<Vec<Duration>>,
}

struct Hold {
    inner: Arc<InMemoryTransport>,
    envelopes: Vec<Envelope>,
    commit_calls: Arc<AtomicUsize>,
}

#[async_trait]
impl DrainHold for Hold {
    async fn commit(self: Box<Self>) -> Result<(), TransportError> {
        silent_once(&self.commit_calls).await;
        self.inner.ack_batch(&self.envelopes).await
    }
}

#[async_trait]
impl Drain for Draining {
    async fn drain(
        &self,
        max: usize,
        hold_for: Duration,
        held: &tokio::sync::Notify,
    ) -> Result<Drained, TransportError> {
        self.holds.lock().unwrap().push(hold_for);
        silent_once(&self.drain_calls).await;
        let envelopes = self.inner.get(max).await?;
        if !envelopes.is_empty() {
            held.notify_one();
        }
        let hold = Hold {
            inner: self.inner.clone(),
            envelopes: envelopes.clone(),
            commit_calls: self.commit_calls.clone(),
        };
        Ok(Drained::new(envelopes, Box::new(hold)))
    }
}

#[async_trait]
impl RelaySource for Draining {
    async fn relay(
        &self,
        relay: &Relay,
        shutdown: &CancellationToken,
    ) -> Result<RelayStats, TransportError> {
        relay_drained(relay, self, shutdown).await
    }
}

#[async_trait]
impl Transport for Draining {
    async fn send(&self, e: Envelope) -> Result<Envelope, TransportError> {
        self.inner.send(e).await
    }
    async fn get(&self, max: usize) -> Result<Vec<Envelope>, TransportError> {
        self.inner.get(max).await
    }
    async fn ack(&self, e: &Envelope) -> Result<(), TransportError> {
        self.inner.ack(e).await
    }
    async fn reject(&self, e: &Envelope) -> Result<(), TransportError> {
        self.inner.reject(e).await
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn abilities(&self) -> courier_core::Abilities<'_> {
        let mut abilities = courier_core::Abilities::none();
        abilities.relay_source = Some(self);
        abilities
    }
}

/// Runs `work` on the paused clock; panics with `stalled` if it still waits after ten minutes.
/// Returns its output and how long it took.
async fn within_ten_minutes<T>(
    stalled: &str,
    work: impl std::future::Future<Output = T>,
) -> (T, Duration) {
    let started = tokio::time::Instant::now();
    let out = tokio::time::timeout(Duration::from_secs(600), work)
        .await
        .unwrap_or_else(|_| panic!("{stalled}"));
    (out, started.elapsed())
}

fn jobs(envelopes: &[Envelope]) -> Vec<u32> {
    envelopes
        .iter()
        .map(|e| e.message::<Job>().unwrap().0)
        .collect()
}

/// Relays six jobs from `from` in batches of two with a hold limit of 100 ms; fails if the
/// relay is still waiting after ten minutes (of the paused clock).
async fn relay_six_unanswered(from: Arc<Draining>) -> (RelayStats, Vec<u32>) {
    let to = Arc::new(InMemoryTransport::new());
    let relay = Relay::new("outbox", from, "to", to.clone()).options(
        RelayOptions::default()
            .batch_size(2)
            .backoff(Backoff::new(
                Duration::from_millis(1),
                Duration::from_millis(5),
            ))
            .limit(Some(6))
            .hold_limit(Duration::from_millis(100)),
    );
    let (stats, waited) = within_ten_minutes(
        "the relay waited on a source that does not answer",
        relay.run(CancellationToken::new()),
    )
    .await;
    let stats = stats.unwrap();
    // Two calls went unanswered, one after the other, each given up after a minute (four hold
    // limits are less: the shortest bound).
    assert!(
        (Duration::from_secs(120)..Duration::from_secs(125)).contains(&waited),
        "{waited:?}"
    );
    (stats, jobs(&to.sent()))
}

/// A relay cut off from its draining source does not wait on it forever: a drain or a commit
/// with no answer is given up after four hold limits, a minute at least (the bound each drain
/// asks the source to end its hold by), the drain tried again, the commit's batch left to come
/// back; the relay goes on.
#[tokio::test(start_paused = true)]
async fn a_draining_source_that_stops_answering_does_not_stall_the_relay() {
    let source = queue_with(6).await;
    let from = Arc::new(Draining {
        inner: source.clone(),
        ..Draining::default()
    });
    let (stats, sent) = relay_six_unanswered(from.clone()).await;
    assert_eq!(sent, [0, 1, 2, 3, 4, 5], "everything sent, in order");
    // The first batch's commit never answered: not counted, its rows left to the source.
    assert_eq!((stats.relayed, stats.batches), (4, 2));
    assert_eq!(source.acked().len(), 4);
    let holds = from.holds.lock().unwrap().clone();
    assert!(holds.len() >= 4, "{holds:?}");
    assert!(
        holds.iter().all(|&h| h == Duration::from_secs(60)),
        "each drain asks for four hold limits, a minute at least: {holds:?}"
    );
}
