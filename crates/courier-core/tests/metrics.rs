//! The worker and the bus emit the documented metrics, with their labels, to the installed
//! recorder. One test per binary: the recorder is process-global.
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Job, queue_with};
use courier_core::metrics as m;
use courier_core::{
    CancellationToken, Envelope, HandlerError, InMemoryTransport, KeyLoad, KeyLoads, KeyedQueue,
    MessageBus, MultiplierRetryStrategy, TransportError, Worker,
};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

/// One recorded value: name, labels, value.
type Entry = (String, Vec<(String, String)>, DebugValue);

/// Everything recorded so far (a snapshot drains the recorder, so snapshots are accumulated).
struct Seen {
    snap: Snapshotter,
    all: Vec<Entry>,
}

impl Seen {
    fn take(&mut self) {
        for (key, _, _, value) in self.snap.snapshot().into_vec() {
            let key = key.key();
            let labels = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            self.all.push((key.name().to_owned(), labels, value));
        }
    }

    fn matching<'a>(
        &'a mut self,
        name: &'a str,
        labels: &'a [(&str, &str)],
    ) -> impl Iterator<Item = &'a DebugValue> + 'a {
        self.take();
        self.all.iter().filter_map(move |(n, ls, v)| {
            (n == name
                && labels
                    .iter()
                    .all(|(k, v)| ls.iter().any(|(lk, lv)| lk == k && lv == v)))
            .then_some(v)
        })
    }

    fn counter(&mut self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.matching(name, labels)
            .map(|v| match v {
                DebugValue::Counter(n) => *n,
                _ => 0,
            })
            .sum()
    }

    fn histogram_count(&mut self, name: &str, labels: &[(&str, &str)]) -> usize {
        self.matching(name, labels)
            .map(|v| match v {
                DebugValue::Histogram(xs) => xs.len(),
                _ => 0,
            })
            .sum()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_and_the_bus_emit_counters_with_transport_and_message_type() {
    let recorder = DebuggingRecorder::new();
    let mut seen = Seen {
        snap: recorder.snapshotter(),
        all: Vec::new(),
    };
    recorder.install().unwrap();

    // Sent: the bus routes jobs to `async`.
    let ok = Arc::new(InMemoryTransport::new());
    let producer = MessageBus::builder()
        .route("test.job", ["async"])
        .transport("async", ok.clone())
        .build();
    for i in 0..5 {
        producer.dispatch(Envelope::new(Job(i))).await.unwrap();
    }
    let job = [("transport", "async"), ("message_type", "test.job")];
    assert_eq!(seen.counter(m::MESSAGES_SENT, &job), 5);

    // Handled: 5 received, 5 handled, nothing failed.
    let bus = MessageBus::builder()
        .handler_fn("h", |_: Arc<Job>| async { Ok::<(), HandlerError>(()) })
        .build();
    let stats = Worker::builder(bus)
        .receiver("async", ok.clone())
        .sleep(Duration::from_millis(10))
        .limit(5)
        .build()
        .run(CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(stats.handled, 5);
    assert_eq!(seen.counter(m::MESSAGES_RECEIVED, &job), 5);
    assert_eq!(seen.counter(m::MESSAGES_HANDLED, &job), 5);
    assert_eq!(seen.counter(m::MESSAGES_FAILED, &job), 0);
    assert_eq!(seen.histogram_count(m::HANDLER_DURATION, &job), 5);
    assert!(seen.histogram_count(m::ACK_BATCH_SIZE, &job[..1]) >= 1);

    // Failing: one message, one retry, then the failure transport.
    let flaky = queue_with(1).await;
    let failed = Arc::new(InMemoryTransport::new());
    let bus = MessageBus::builder()
        .handler_fn("h", |_: Arc<Job>| async {
            Err::<(), _>(HandlerError::msg("down"))
        })
        .build();
    let stats = Worker::builder(bus)
        .receiver("flaky", flaky.clone())
        .retry_strategy(Arc::new(
            MultiplierRetryStrategy::default()
                .max_retries(1)
                .delay(Duration::from_millis(1)),
        ))
        .failure_transport("failed", failed.clone())
        .sleep(Duration::from_millis(10))
        .limit(2)
        .build()
        .run(CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(stats.failed, 2);
    let flaky = [("transport", "flaky"), ("message_type", "test.job")];
    assert_eq!(seen.counter(m::MESSAGES_RECEIVED, &flaky), 2);
    assert_eq!(seen.counter(m::MESSAGES_HANDLED, &flaky), 0);
    assert_eq!(seen.counter(m::MESSAGES_FAILED, &flaky), 2);
    assert_eq!(seen.counter(m::MESSAGES_RETRIED, &flaky), 1);
    assert_eq!(seen.counter(m::MESSAGES_MOVED_TO_FAILURE, &flaky), 1);
    // The `async` counters are untouched by the second worker.
    assert_eq!(seen.counter(m::MESSAGES_RECEIVED, &job), 5);

    // Queue depth: sampled on demand only.
    let stop = CancellationToken::new();
    let depth = m::spawn_queue_depth(
        vec![(
            "failed".to_owned(),
            failed.clone() as Arc<dyn courier_core::Transport>,
        )],
        Duration::from_millis(10),
        stop.clone(),
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    stop.cancel();
    depth.await.unwrap();
    let gauge = seen
        .matching(m::QUEUE_DEPTH, &[("transport", "failed")])
        .find_map(|v| match v {
            DebugValue::Gauge(x) => Some(x.into_inner()),
            _ => None,
        });
    assert_eq!(gauge, Some(1.0));

    // Per-key gauges of a keyed queue: the top keys by name, the rest as `other`, and a key
    // that leaves the top set to 0.
    let keyed = Arc::new(Keyed::default());
    let loads = |range: std::ops::Range<u64>| {
        range
            .map(|i| KeyLoad {
                key: format!("k{i:02}"),
                in_flight: 100 - i,
                queued: i,
            })
            .collect::<Vec<_>>()
    };
    *keyed.loads.lock().unwrap() = loads(0..12);
    // One sampler, as in a worker: it remembers which keys it labelled.
    let stop = CancellationToken::new();
    let sampler = m::spawn_queue_depth(
        vec![(
            "keyed".to_owned(),
            keyed.clone() as Arc<dyn courier_core::Transport>,
        )],
        Duration::from_millis(10),
        stop.clone(),
    );
    let ticks = || tokio::time::sleep(Duration::from_millis(60));
    // A snapshot drains the gauges: take one after each sample, then read what it saw.
    let last = |seen: &Seen, name: &str, key: &str| {
        seen.all
            .iter()
            .rev()
            .filter(|(n, ls, _)| {
                n == name
                    && ls.iter().any(|(k, v)| k == "transport" && v == "keyed")
                    && ls.iter().any(|(k, v)| k == "key" && v == key)
            })
            .filter_map(|(_, _, v)| match v {
                DebugValue::Gauge(x) => Some(x.into_inner()),
                _ => None,
            })
            .next()
    };
    ticks().await;
    seen.take();
    assert_eq!(last(&seen, m::KEY_IN_FLIGHT, "k00"), Some(100.0));
    assert_eq!(last(&seen, m::KEY_QUEUED, "k09"), Some(9.0));
    assert_eq!(last(&seen, m::KEY_IN_FLIGHT, "k10"), None, "past the top");
    assert_eq!(
        last(&seen, m::KEY_IN_FLIGHT, "other"),
        Some(f64::from(90 + 89)),
        "k10 and k11 summed"
    );
    assert_eq!(last(&seen, m::KEY_QUEUED, "other"), Some(21.0));
    // Keys that leave the top are set to 0 (the sentinels show they were written).
    for key in ["k00", "other"] {
        metrics::gauge!(m::KEY_IN_FLIGHT, "transport" => "keyed", "key" => key).set(42.0);
    }
    *keyed.loads.lock().unwrap() = loads(1..3);
    ticks().await;
    stop.cancel();
    sampler.await.unwrap();
    seen.take();
    assert_eq!(
        last(&seen, m::KEY_IN_FLIGHT, "k00"),
        Some(0.0),
        "left the top"
    );
    assert_eq!(last(&seen, m::KEY_IN_FLIGHT, "other"), Some(0.0));
    assert_eq!(last(&seen, m::KEY_IN_FLIGHT, "k01"), Some(99.0));
}

/// A keyed queue whose key loads the test sets.
#[derive(Debug, Default)]
struct Keyed {
    loads: std::sync::Mutex<Vec<KeyLoad>>,
    inner: InMemoryTransport,
}

#[courier_core::async_trait]
impl KeyedQueue for Keyed {
    async fn key_loads(&self, top: usize) -> Result<KeyLoads, TransportError> {
        let all = self.loads.lock().unwrap().clone();
        Ok(KeyLoads::top(Some(100), all, top))
    }
}

#[courier_core::async_trait]
impl courier_core::Transport for Keyed {
    async fn send(&self, envelope: Envelope) -> Result<Envelope, TransportError> {
        self.inner.send(envelope).await
    }
    async fn get(&self, max: usize) -> Result<Vec<Envelope>, TransportError> {
        self.inner.get(max).await
    }
    async fn ack(&self, envelope: &Envelope) -> Result<(), TransportError> {
        self.inner.ack(envelope).await
    }
    async fn reject(&self, envelope: &Envelope) -> Result<(), TransportError> {
        self.inner.reject(envelope).await
    }
    fn abilities(&self) -> courier_core::Abilities<'_> {
        courier_core::Abilities::none().keyed_queue(self)
    }
    fn capabilities(&self) -> courier_core::Capabilities {
        self.inner.capabilities()
    }
}
