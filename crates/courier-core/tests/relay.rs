//! The relay's pipeline: batch k is sent while batch k - 1 is acked and batch k + 1 fetched;
//! sends stay in fetch order, a batch is acked only after its confirmation, a stop sends the
//! batch fetched ahead rather than leave it claimed.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod common;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{CountAcks, Job, Unanswering, queue_with, within_ten_minutes};
use courier_core::relay::{Relay, RelayOptions};
use courier_core::{
    Backoff, CancellationToken, Capabilities, Envelope, InMemoryTransport, Transport,
    TransportError, async_trait,
};

/// A destination that checks, at each `send_batch`, that the source acked only what was
/// confirmed, and waits until the ack of the previous batch ran beside this send (a relay that
/// acked after the send, not beside it, would never get past the second batch).
#[derive(Debug)]
struct Destination {
    inner: InMemoryTransport,
    source: Arc<InMemoryTransport>,
    /// Messages confirmed so far, and the size of the last batch.
    confirmed: Mutex<(usize, usize)>,
    /// Cancelled at the first send, when set.
    stop: Option<CancellationToken>,
}

impl Destination {
    fn new(source: Arc<InMemoryTransport>, stop: Option<CancellationToken>) -> Arc<Self> {
        Arc::new(Self {
            inner: InMemoryTransport::new(),
            source,
            confirmed: Mutex::new((0, 0)),
            stop,
        })
    }

    fn order(&self) -> Vec<u32> {
        jobs(&self.inner.sent())
    }
}

fn jobs(envelopes: &[Envelope]) -> Vec<u32> {
    envelopes
        .iter()
        .map(|e| e.message::<Job>().unwrap().0)
        .collect()
}

/// Relays 9 jobs from `from` over `source` in batches of 2 to a checking destination: all
/// arrive in order, in 5 batches, all acked at the source.
async fn relay_nine(source: &Arc<InMemoryTransport>, from: Arc<CountAcks>) {
    let to = Destination::new(source.clone(), None);
    let relay = Relay::new("outbox", from, "to", to.clone()).options(options(2).limit(Some(9)));
    let stats = relay.run(CancellationToken::new()).await.unwrap();
    assert_eq!((stats.relayed, stats.batches), (9, 5));
    assert_eq!(to.order(), (0..9).collect::<Vec<_>>());
    assert_eq!(source.acked().len(), 9);
    assert!(source.get(10).await.unwrap().is_empty(), "nothing left");
}

#[async_trait]
impl Transport for Destination {
    async fn send(&self, e: Envelope) -> Result<Envelope, TransportError> {
        self.inner.send(e).await
    }
    async fn send_batch(&self, es: Vec<Envelope>) -> Result<Vec<Envelope>, TransportError> {
        if let Some(stop) = &self.stop {
            stop.cancel();
        }
        let (confirmed, last) = *self.confirmed.lock().unwrap();
        let acked = self.source.acked().len();
        assert!(
            acked <= confirmed,
            "{acked} acked at the source, {confirmed} confirmed"
        );
        let mut polls = 0;
        while self.stop.is_none() && self.source.acked().len() < confirmed {
            polls += 1;
            assert!(
                polls < 10_000,
                "the ack of the previous batch ({last}) does not run beside this send"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let n = es.len();
        let sent = self.inner.send_batch(es).await?;
        *self.confirmed.lock().unwrap() = (confirmed + n, n);
        Ok(sent)
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
}

fn options(batch: usize) -> RelayOptions {
    RelayOptions::default()
        .batch_size(batch)
        .backoff(Backoff::new(
            Duration::from_millis(1),
            Duration::from_millis(5),
        ))
}

#[tokio::test]
async fn the_relay_acks_each_batch_beside_the_next_send_in_order() {
    let source = queue_with(9).await;
    let from = CountAcks::new(source.clone(), false);
    relay_nine(&source, from.clone()).await;
    assert_eq!(from.ack_batches(), 5, "one ack per batch");
}

#[tokio::test]
async fn where_the_source_acks_with_get_the_acks_ride_on_the_fetches() {
    let source = queue_with(9).await;
    // The first ack_and_get carrying acks fails (a connection error): retried with them.
    let from = CountAcks::acking_with_get(source.clone(), 1);
    relay_nine(&source, from.clone()).await;
    assert_eq!(from.ack_batches(), 0, "no ack of its own");
    assert_eq!(from.ack_gets.load(Ordering::SeqCst), 5);
    assert_eq!(from.carried.load(Ordering::SeqCst), 9);
}

#[tokio::test]
async fn a_stop_sends_and_acks_the_batch_fetched_ahead() {
    let source = queue_with(9).await;
    let from = CountAcks::new(source.clone(), false);
    let stop = CancellationToken::new();
    let to = Destination::new(source.clone(), Some(stop.clone()));
    let relay = Relay::new("outbox", from, "to", to.clone()).options(options(2));
    let stats = relay.run(stop).await.unwrap();
    // Stopped while sending the first batch, with the second fetched ahead: both forwarded.
    assert_eq!((stats.relayed, stats.batches), (4, 2));
    assert_eq!(to.order(), [0, 1, 2, 3]);
    assert_eq!(source.acked().len(), 4);
    let left = jobs(&source.get(10).await.unwrap());
    assert_eq!(left, [4, 5, 6, 7, 8], "nothing left claimed");
}

/// A destination that stops answering while a claimed batch is sent to it (a connection
/// black-holed by a failover) does not stall the relay: the attempt is given up at the hold
/// limit, the batch kept alive at the source and sent again; every job arrives once, in order.
#[tokio::test(start_paused = true)]
async fn a_destination_that_stops_answering_does_not_stall_the_relay() {
    let source = queue_with(6).await;
    let to = Arc::new(Unanswering::default());
    let relay = Relay::new("outbox", source.clone(), "to", to.clone())
        .options(options(2).limit(Some(6)).hold_limit(Duration::from_secs(5)));
    let (stats, waited) = within_ten_minutes(
        "the relay waited on a destination that does not answer",
        relay.run(CancellationToken::new()),
    )
    .await;
    let stats = stats.unwrap();
    assert!(
        (Duration::from_secs(5)..Duration::from_secs(6)).contains(&waited),
        "one hold limit lost: {waited:?}"
    );
    assert_eq!(
        jobs(&to.inner.sent()),
        [0, 1, 2, 3, 4, 5],
        "once each, in order"
    );
    assert_eq!((stats.relayed, stats.batches), (6, 3));
    assert!(
        to.send_calls.load(Ordering::SeqCst) >= 4,
        "the send was tried again"
    );
    assert_eq!(source.acked().len(), 6);
}

/// Relays six jobs from `from` (over `source`) in batches of two with a hold limit of 100 ms;
/// fails if the relay is still waiting after ten minutes (of the paused clock).
async fn relay_six_unanswered(
    from: Arc<Unanswering>,
) -> (courier_core::relay::RelayStats, Vec<u32>) {
    let to = Arc::new(InMemoryTransport::new());
    let relay = Relay::new("outbox", from, "to", to.clone()).options(
        options(2)
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

/// A relay cut off from a source read with `get` and `ack_batch` does not wait on it
/// forever: the fetch and the ack that never
/// answer are tried again after a minute; every job is relayed and acked once.
#[tokio::test(start_paused = true)]
async fn a_claimed_source_that_stops_answering_does_not_stall_the_relay() {
    let source = queue_with(6).await;
    let from = Arc::new(Unanswering {
        inner: source.clone(),
        ..Unanswering::default()
    });
    let (stats, sent) = relay_six_unanswered(from.clone()).await;
    assert_eq!(sent, [0, 1, 2, 3, 4, 5], "everything sent once, in order");
    assert_eq!((stats.relayed, stats.batches), (6, 3));
    assert_eq!(source.acked().len(), 6);
    assert!(
        from.get_calls.load(Ordering::SeqCst) >= 2,
        "the fetch was tried again"
    );
    assert!(
        from.ack_calls.load(Ordering::SeqCst) >= 4,
        "the ack was tried again"
    );
}
