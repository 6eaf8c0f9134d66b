//! The worker's I/O beside its handlers: every held message kept alive, a dead worker's messages
//! back within the redelivery window, and a stalled server that delays nothing but itself.
//! On tokio's paused clock.
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use common::{CountAcks, Job, Unanswering, queue_with, within_ten_minutes};
use courier_core::{
    CancellationToken, Capabilities, Envelope, HandlerError, InMemoryTransport, MessageBus,
    StopReason, Transport, TransportError, Worker, WorkerStats, async_trait,
};
use tokio::time::Instant;

/// A bus whose handler takes `each` per message and counts the messages it finished.
fn slow_bus(each: Duration) -> (MessageBus, Arc<AtomicUsize>) {
    let done = Arc::new(AtomicUsize::new(0));
    let d = done.clone();
    let bus = MessageBus::builder()
        .handler_fn("slow", move |_: Arc<Job>| {
            let d = d.clone();
            async move {
                tokio::time::sleep(each).await;
                d.fetch_add(1, Ordering::SeqCst);
                Ok::<(), HandlerError>(())
            }
        })
        .build();
    (bus, done)
}

#[tokio::test(start_paused = true)]
async fn a_dead_workers_unstarted_messages_come_back_within_the_default_window() {
    let q = queue_with(10).await;
    let (bus, _) = slow_bus(Duration::from_secs(3600));
    let worker = Worker::builder(bus).receiver("async", q.clone()).build();
    let run = tokio::spawn(worker.run(CancellationToken::new()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        q.get(32).await.unwrap().is_empty(),
        "the worker holds all ten"
    );
    run.abort(); // the worker dies without releasing anything
    let _ = run.await;
    tokio::time::sleep(Duration::from_secs(61)).await;
    assert_eq!(
        q.get(32).await.unwrap().len(),
        10,
        "a dead worker's messages, started or not, are back within a minute"
    );
}

#[tokio::test(start_paused = true)]
async fn a_live_workers_unstarted_messages_are_kept_alive() {
    let q = queue_with(10).await;
    let (bus, done) = slow_bus(Duration::from_secs(60));
    let worker = Worker::builder(bus).receiver("async", q.clone()).build();
    let token = CancellationToken::new();
    let run = tokio::spawn(worker.run(token.clone()));
    tokio::time::sleep(Duration::from_secs(150)).await;
    assert_eq!(done.load(Ordering::SeqCst), 2);
    assert!(
        q.get(32).await.unwrap().is_empty(),
        "minutes past the window, nothing the live worker holds is delivered again"
    );
    token.cancel();
    let stats = run.await.unwrap().unwrap();
    assert_eq!((stats.handled, stats.released), (3, 7));
    assert_eq!(q.get(32).await.unwrap().len(), 7, "released at shutdown");
}

/// An in-memory transport whose server stops answering acks and releases while `stalled` is
/// set; counts keepalive calls.
#[derive(Debug)]
struct Stalling {
    inner: Arc<InMemoryTransport>,
    stalled: AtomicBool,
    keepalives: AtomicUsize,
}

impl Stalling {
    async fn stall(&self) {
        if self.stalled.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
    }
}

#[async_trait]
impl Transport for Stalling {
    async fn send(&self, e: Envelope) -> Result<Envelope, TransportError> {
        self.inner.send(e).await
    }
    async fn get(&self, max: usize) -> Result<Vec<Envelope>, TransportError> {
        self.inner.get(max).await
    }
    async fn ack(&self, e: &Envelope) -> Result<(), TransportError> {
        self.stall().await;
        self.inner.ack(e).await
    }
    async fn reject(&self, e: &Envelope) -> Result<(), TransportError> {
        self.inner.reject(e).await
    }
    async fn retry(&self, e: Envelope, delay: Duration) -> Result<(), TransportError> {
        self.stall().await;
        self.inner.retry(e, delay).await
    }
    async fn keepalive(&self, e: &Envelope) -> Result<(), TransportError> {
        self.keepalives.fetch_add(1, Ordering::SeqCst);
        self.inner.keepalive(e).await
    }
    async fn ack_batch(&self, es: &[Envelope]) -> Result<(), TransportError> {
        self.stall().await;
        self.inner.ack_batch(es).await
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
}

async fn stalling(n: u32) -> Arc<Stalling> {
    Arc::new(Stalling {
        inner: queue_with(n).await,
        stalled: AtomicBool::new(true),
        keepalives: AtomicUsize::new(0),
    })
}

#[tokio::test(start_paused = true)]
async fn an_ack_stalled_on_the_server_stops_neither_handlers_nor_keepalives() {
    let t = stalling(3).await;
    let (bus, done) = slow_bus(Duration::from_secs(1));
    let worker = Worker::builder(bus)
        .receiver("async", t.clone())
        .keepalive(Some(Duration::from_secs(1)))
        .build();
    let token = CancellationToken::new();
    let run = tokio::spawn(worker.run(token.clone()));
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        done.load(Ordering::SeqCst),
        3,
        "every handler ran while the first ack hung"
    );
    assert!(
        t.keepalives.load(Ordering::SeqCst) >= 9,
        "keepalives went on during the stall: {}",
        t.keepalives.load(Ordering::SeqCst)
    );
    assert!(
        t.inner.get(10).await.unwrap().is_empty(),
        "handled but unacked messages are still kept alive, not redelivered"
    );
    t.stalled.store(false, Ordering::SeqCst);
    token.cancel();
    run.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn shutdown_takes_at_most_a_second_past_the_grace_period_whatever_the_server_does() {
    let t = stalling(8).await;
    let (bus, _) = slow_bus(Duration::from_secs(3));
    let worker = Worker::builder(bus)
        .receiver("async", t.clone())
        .grace(Duration::from_secs(5))
        .build();
    let token = CancellationToken::new();
    let run = tokio::spawn(worker.run(token.clone()));
    tokio::time::sleep(Duration::from_secs(4)).await;
    let asked = Instant::now();
    token.cancel();
    let stats = run.await.unwrap().unwrap();
    let took = asked.elapsed();
    assert_eq!(stats.stop_reason, Some(StopReason::Shutdown));
    assert!(
        took <= Duration::from_secs(6),
        "grace 5 s + 1 s at most, took {took:?}"
    );
    assert_eq!(
        stats.handled, 2,
        "the in-flight handler finished in the grace"
    );
    assert_eq!(
        stats.left_for_redelivery, 8,
        "nothing could be acked or released: all eight are left for redelivery"
    );
}

#[tokio::test(start_paused = true)]
async fn one_at_a_time_under_a_bounded_window_each_ack_goes_out_before_the_next_fetch() {
    let q = queue_with(5).await;
    let t = CountAcks::new(q.clone(), true);
    let (bus, done) = slow_bus(Duration::from_millis(10));
    let stats = Worker::builder(bus)
        .receiver("async", t.clone())
        .fetch_size(1)
        .limit(5)
        .build()
        .run(CancellationToken::new())
        .await
        .unwrap();
    assert_eq!((stats.handled, done.load(Ordering::SeqCst)), (5, 5));
    assert_eq!(q.acked().len(), 5, "every message acked");
    assert_eq!(
        t.ack_batches(),
        5,
        "one ack per message, each sent before the next fetch (the last at the stop)"
    );
    assert!(q.get(10).await.unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn under_a_broker_window_acks_go_out_in_chunks_of_half_of_it() {
    let q = queue_with(64).await;
    let t = CountAcks::windowed(q.clone(), 16);
    let stats = handle_64(&t).await;
    assert_eq!(stats.handled, 64);
    assert_eq!(
        acked_jobs(&q),
        (0..64).collect::<Vec<_>>(),
        "each acked exactly once"
    );
    // Deliveries come two at a time: acked at each fetch or each batch's end, that would be
    // 32 acks, each answered by a broker with a small delivery.
    assert!(
        t.ack_batches() <= 8,
        "at most one ack per half window (8 of 16), neither at each fetch nor at each batch's end: {}",
        t.ack_batches()
    );
    assert!(q.get(10).await.unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn acks_ride_on_the_next_fetch_where_the_transport_acks_in_its_get() {
    let q = queue_with(64).await;
    let t = CountAcks::acking_with_get(q.clone(), 0);
    let stats = handle_64(&t).await;
    assert_eq!(stats.handled, 64);
    assert_eq!(
        acked_jobs(&q),
        (0..64).collect::<Vec<_>>(),
        "each acked exactly once"
    );
    let carried = t.carried.load(Ordering::SeqCst);
    assert!(
        carried >= 32,
        "most acks go in the fetches' round trips: {carried} of 64 (ack_batch calls: {})",
        t.ack_batches()
    );
    assert!(
        t.ack_batches() < 4,
        "fewer separate ack statements than batches: {}",
        t.ack_batches()
    );
}

#[tokio::test(start_paused = true)]
async fn acks_that_rode_on_a_failed_fetch_are_acked_again_and_nothing_is_lost() {
    let q = queue_with(64).await;
    let t = CountAcks::acking_with_get(q.clone(), 2);
    let stats = handle_64(&t).await;
    assert_eq!(stats.handled, 64);
    assert_eq!(stats.left_for_redelivery, 0, "{stats:?}");
    let mut acked = acked_jobs(&q);
    acked.dedup();
    assert_eq!(acked.len(), 64, "every message acked after the failures");
    assert_eq!(
        t.fail_ack_gets.load(Ordering::SeqCst),
        0,
        "both failures happened"
    );
    assert!(q.get(100).await.unwrap().is_empty());
}

/// Runs a worker over `t` with a no-op handler, fetch size 16, until 64 messages are handled
/// (every one counted by the handler too).
async fn handle_64(t: &Arc<CountAcks>) -> WorkerStats {
    let (bus, done) = slow_bus(Duration::ZERO);
    let stats = Worker::builder(bus)
        .receiver("async", t.clone())
        .fetch_size(16)
        .limit(64)
        .build()
        .run(CancellationToken::new())
        .await
        .unwrap();
    let done = u64::try_from(done.load(Ordering::SeqCst)).unwrap();
    assert_eq!(stats.handled, done, "the handler saw each: {stats:?}");
    stats
}

/// The jobs `q` saw acked, in order of their numbers (repeats kept).
/// One message at a time under a backlog (each fetch a quick round trip, the handler instant, so
/// the next fetch is always under way when a message is done): the acks of several fetches go
/// out in one `ack_batch`, up to 16 or the linger, not one statement per message. Where each
/// fetch waits for its message (an idle worker's), each ack goes at once. All acked, once.
#[tokio::test(start_paused = true)]
async fn one_at_a_time_the_acks_of_several_fetches_go_together_under_a_backlog() {
    let (quick, waiting) = (Duration::from_millis(1), Duration::from_millis(10));
    for (get_takes, linger, batches_in) in [
        (quick, None, 4..=16),
        (quick, Some(Duration::from_secs(1)), 4..=4),
        (waiting, None, 64..=64),
    ] {
        let q = queue_with(64).await;
        let t = CountAcks::slow_gets(q.clone(), get_takes);
        let (bus, done) = slow_bus(Duration::ZERO);
        let mut worker = Worker::builder(bus)
            .receiver("async", t.clone())
            .fetch_size(1)
            .limit(64);
        if let Some(linger) = linger {
            worker = worker.ack_linger(linger);
        }
        let stats = worker.build().run(CancellationToken::new()).await.unwrap();
        assert_eq!((stats.handled, done.load(Ordering::SeqCst)), (64, 64));
        assert_eq!(
            acked_jobs(&q),
            (0..64).collect::<Vec<_>>(),
            "each acked once"
        );
        let batches = t.ack_batches();
        assert!(
            batches_in.contains(&batches),
            "64 acks in {batches} ack_batch calls (gets taking {get_takes:?}, linger {linger:?}), \
             expected {batches_in:?}: at most 16 each, gathered only under a backlog"
        );
    }
}

fn acked_jobs(q: &InMemoryTransport) -> Vec<u32> {
    let mut acked: Vec<u32> = q
        .acked()
        .iter()
        .map(|e| e.message::<Job>().unwrap().0)
        .collect();
    acked.sort_unstable();
    acked
}

/// An in-memory transport whose `get` fails (a connection error) until `up_at`; records when
/// each `get` was called.
#[derive(Debug)]
struct Outage {
    inner: Arc<InMemoryTransport>,
    up_at: Instant,
    gets: std::sync::Mutex<Vec<Instant>>,
}

#[async_trait]
impl Transport for Outage {
    async fn send(&self, e: Envelope) -> Result<Envelope, TransportError> {
        self.inner.send(e).await
    }
    async fn get(&self, max: usize) -> Result<Vec<Envelope>, TransportError> {
        let now = Instant::now();
        self.gets.lock().unwrap().push(now);
        if now < self.up_at {
            return Err(TransportError::new(
                courier_core::TransportErrorKind::Connection,
                "outage",
            ));
        }
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

#[tokio::test(start_paused = true)]
async fn after_a_long_outage_the_worker_is_back_within_two_seconds() {
    let outage = Duration::from_secs(60);
    let t = Arc::new(Outage {
        inner: queue_with(5).await,
        up_at: Instant::now() + outage,
        gets: std::sync::Mutex::new(Vec::new()),
    });
    let (bus, done) = slow_bus(Duration::ZERO);
    let start = Instant::now();
    let stats = Worker::builder(bus)
        .receiver("async", t.clone())
        .limit(5)
        .build()
        .run(CancellationToken::new())
        .await
        .unwrap();
    assert_eq!((stats.handled, done.load(Ordering::SeqCst)), (5, 5));
    let gets = t.gets.lock().unwrap().clone();
    let widest = gets.windows(2).map(|w| w[1] - w[0]).max().unwrap();
    assert!(
        widest <= Duration::from_secs(2),
        "failed gets are retried at most 2 s apart, widest gap {widest:?}"
    );
    let back = start.elapsed() - outage;
    assert!(
        back <= Duration::from_secs(2),
        "the messages were handled {back:?} after the transport came back"
    );
}

/// A worker whose server stops answering on a connection (a failover or a NAT's idle timeout
/// black-holed it: no error, no answer, until TCP gives up many minutes later) is not stuck
/// behind it: its first fetch and its first ack never answer, and each is given up after a
/// minute past the fetch's own wait; the fetch is tried again, the acks whose flush was given up
/// (all six jobs': batches this small gather their acks while the next fetch is under way) come
/// back after the redelivery window and are handled and acked again. Nothing is lost.
#[tokio::test(start_paused = true)]
async fn a_fetch_or_an_ack_that_never_answers_is_given_up_after_a_minute() {
    let q = queue_with(6).await;
    let t = Arc::new(Unanswering {
        inner: q.clone(),
        ..Unanswering::default()
    });
    let (bus, done) = slow_bus(Duration::ZERO);
    let worker = Worker::builder(bus)
        .receiver("async", t.clone())
        .fetch_size(2)
        .limit(12)
        .build();
    let (stats, took) = within_ten_minutes(
        "the worker waited on a server that does not answer",
        worker.run(CancellationToken::new()),
    )
    .await;
    let stats = stats.unwrap();
    // A minute for the fetch, a minute for the ack, then the redelivery window (30 s, less
    // the time since the batch was last kept alive).
    assert!(
        (Duration::from_secs(120)..Duration::from_secs(155)).contains(&took),
        "{took:?}"
    );
    assert!(t.get_calls.load(Ordering::SeqCst) >= 2, "fetched again");
    assert!(t.ack_calls.load(Ordering::SeqCst) >= 2, "acked again");
    assert_eq!(
        (stats.handled, done.load(Ordering::SeqCst)),
        (12, 12),
        "six jobs, each twice: {stats:?}"
    );
    assert_eq!(stats.left_for_redelivery, 6, "{stats:?}");
    let mut acked = acked_jobs(&q);
    acked.dedup();
    assert_eq!(acked, [0, 1, 2, 3, 4, 5], "every job acked");
    assert!(q.get(10).await.unwrap().is_empty(), "nothing left");
}
