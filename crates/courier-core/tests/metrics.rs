//! The worker and the bus emit the documented metrics, with their labels, to the installed
//! recorder. One test per binary: the recorder is process-global.
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Job, queue_with};
use courier_core::metrics as m;
use courier_core::{
    CancellationToken, Envelope, HandlerError, InMemoryTransport, MessageBus,
    MultiplierRetryStrategy, Worker,
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
}
