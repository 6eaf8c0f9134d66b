//! What bounds a worker and its handlers, on tokio's paused clock: handler timeouts (the
//! transport's `handler_timeout`, a handler's own `HandlerOptions::timeout`), the memory limit,
//! and the rate limit of a worker built from configuration.
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Job, queue_with};
use courier_core::config::Config;
use courier_core::metrics as m;
use courier_core::{
    BusError, CancellationToken, Envelope, ErrorDetailsStamp, HandlerError, HandlerOptions,
    InMemoryTransport, MessageBus, MessageCount, MessageRegistry, MultiplierRetryStrategy,
    StopReason, TransportRegistry, Worker, WorkerEvent, WorkerStats,
};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

/// A worker that does not stop within this (virtual) hour is stuck: the test fails rather than
/// hangs.
const STUCK: Duration = Duration::from_secs(3600);

async fn run(worker: Worker) -> WorkerStats {
    tokio::time::timeout(STUCK, worker.run(CancellationToken::new()))
        .await
        .expect("the worker stopped within the hour: no handler held it")
        .unwrap()
}

/// Counts the drops of what a handler holds: a dropped handler future drops it.
struct DropCount(Arc<AtomicUsize>);

impl Drop for DropCount {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn failures(log: &Mutex<Vec<WorkerEvent>>) -> Vec<(String, bool)> {
    log.lock()
        .unwrap()
        .iter()
        .filter_map(|e| match e {
            WorkerEvent::Failed {
                error, will_retry, ..
            } => Some((error.clone(), *will_retry)),
            _ => None,
        })
        .collect()
}

async fn details(t: &InMemoryTransport) -> Vec<ErrorDetailsStamp> {
    courier_core::Transport::abilities(t)
        .listable
        .unwrap()
        .list(10)
        .await
        .unwrap()
        .iter()
        .filter_map(|e| e.last::<ErrorDetailsStamp>().cloned())
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_hung_handler_is_dropped_at_the_handler_timeout_retried_then_moved() {
    // Job 0 hangs forever; job 1, behind it on a worker running one handler at a time, is
    // handled once the hung one's slot is freed.
    let q = queue_with(2).await;
    let failed = Arc::new(InMemoryTransport::new());
    let (started, dropped) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (s, d) = (started.clone(), dropped.clone());
    let bus = MessageBus::builder()
        .handler_fn("h", move |job: Arc<Job>| {
            let guard = (job.0 == 0).then(|| {
                s.fetch_add(1, Ordering::SeqCst);
                DropCount(d.clone())
            });
            async move {
                if let Some(guard) = guard {
                    std::future::pending::<()>().await;
                    drop(guard);
                }
                Ok::<(), HandlerError>(())
            }
        })
        .build();
    let log = Arc::new(Mutex::new(Vec::new()));
    let l = log.clone();
    let t0 = tokio::time::Instant::now();
    let stats = run(Worker::builder(bus)
        .receiver("async", q.clone())
        .retry_strategy(Arc::new(
            MultiplierRetryStrategy::default()
                .max_retries(1)
                .delay(Duration::from_secs(1))
                .jitter(0.0),
        ))
        .handler_timeout(Some(Duration::from_secs(30)))
        .failure_transport("failed", failed.clone())
        .sleep(Duration::from_millis(100))
        .limit(3)
        .listener(move |e| l.lock().unwrap().push(e.clone()))
        .build())
    .await;
    assert_eq!(
        (
            stats.handled,
            stats.failed,
            stats.retried,
            stats.moved_to_failure
        ),
        (1, 2, 1, 1),
        "{stats:?}"
    );
    assert_eq!(stats.stop_reason, Some(StopReason::MessageLimit));
    assert_eq!(started.load(Ordering::SeqCst), 2, "tried, then retried");
    assert_eq!(
        dropped.load(Ordering::SeqCst),
        2,
        "each hung future was dropped"
    );
    assert!(
        t0.elapsed() >= Duration::from_secs(61),
        "30 s, the 1 s retry delay, 30 s: {:?}",
        t0.elapsed()
    );
    let failures = failures(&log);
    assert_eq!(failures.len(), 2, "{failures:?}");
    assert!(
        failures[0].0.contains("did not finish within 30s") && failures[0].1,
        "{failures:?}"
    );
    assert!(!failures[1].1, "the retry strategy gave up: {failures:?}");
    let moved = details(&failed).await;
    assert_eq!(moved.len(), 1);
    assert_eq!(moved[0].class, "timeout");
    assert_eq!(
        moved[0].message,
        "handling `test.job` did not finish within 30s"
    );
    assert_eq!(q.message_count().await.unwrap(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_handler_past_its_own_timeout_is_retried_and_the_others_are_not_run_again() {
    let q = queue_with(1).await;
    let (good, slow) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (g, s) = (good.clone(), slow.clone());
    let bus = MessageBus::builder()
        .handler_fn("good", move |_: Arc<Job>| {
            g.fetch_add(1, Ordering::SeqCst);
            async { Ok::<(), HandlerError>(()) }
        })
        .handler_fn_with(
            HandlerOptions::new("slow").timeout(Duration::from_secs(5)),
            move |_: Arc<Job>| {
                // The first call hangs; the second takes 4 s, within the timeout.
                let first = s.fetch_add(1, Ordering::SeqCst) == 0;
                async move {
                    if first {
                        std::future::pending::<()>().await;
                    }
                    tokio::time::sleep(Duration::from_secs(4)).await;
                    Ok::<(), HandlerError>(())
                }
            },
        )
        .build();
    let log = Arc::new(Mutex::new(Vec::new()));
    let l = log.clone();
    let stats = run(Worker::builder(bus)
        .receiver("async", q.clone())
        .retry_strategy(Arc::new(
            MultiplierRetryStrategy::default()
                .max_retries(1)
                .delay(Duration::from_secs(1)),
        ))
        .sleep(Duration::from_millis(100))
        .limit(2)
        .listener(move |e| l.lock().unwrap().push(e.clone()))
        .build())
    .await;
    assert_eq!(
        (stats.handled, stats.failed, stats.retried),
        (1, 1, 1),
        "{stats:?}"
    );
    assert_eq!(
        (good.load(Ordering::SeqCst), slow.load(Ordering::SeqCst)),
        (1, 2),
        "only the handler that timed out ran again"
    );
    let failures = failures(&log);
    assert!(
        failures.len() == 1
            && failures[0].0.contains("`slow`: did not finish within 5s")
            && failures[0].1,
        "{failures:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_in_process_dispatch_returns_the_handler_timeout() {
    let bus = MessageBus::builder()
        .handler_fn_with(
            HandlerOptions::new("hangs").timeout(Duration::from_millis(250)),
            |_: Arc<Job>| async {
                std::future::pending::<()>().await;
                Ok::<(), HandlerError>(())
            },
        )
        .build();
    let err = tokio::time::timeout(STUCK, bus.dispatch(Envelope::new(Job(7))))
        .await
        .expect("the dispatch came back")
        .expect_err("the handler timed out");
    assert_eq!(err.class(), "timeout");
    match &err {
        BusError::HandlerFailed { failures, .. } => {
            assert_eq!(failures.len(), 1);
            assert_eq!(failures[0].handler, "hangs");
            assert!(
                matches!(&failures[0].error, HandlerError::Timeout(t) if t.after == Duration::from_millis(250)),
                "{:?}",
                failures[0].error
            );
        }
        other => panic!("expected a handler failure: {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_worker_built_from_configuration_applies_its_handler_timeout() {
    let config: Config = r#"
        [transports.async]
        dsn = "in-memory://"
        failure_transport = "failed"
        handler_timeout = "2s"
        retry = { max_retries = 0 }

        [transports.failed]
        dsn = "in-memory://"
    "#
    .parse()
    .unwrap();
    assert_eq!(
        config.transports["async"].handler_timeout,
        Some(Duration::from_secs(2))
    );
    let messages = Arc::new(MessageRegistry::new().with::<Job>());
    let transports = config
        .connect(&TransportRegistry::new(), messages)
        .await
        .unwrap();
    transports
        .get("async")
        .unwrap()
        .send(Envelope::new(Job(1)))
        .await
        .unwrap();
    let bus = transports
        .bus_builder()
        .handler_fn("hangs", |_: Arc<Job>| async {
            std::future::pending::<()>().await;
            Ok::<(), HandlerError>(())
        })
        .build();
    let t0 = tokio::time::Instant::now();
    let stats = run(transports
        .worker(bus, &[])
        .unwrap()
        .sleep(Duration::from_millis(100))
        .limit(1)
        .build())
    .await;
    assert_eq!((stats.failed, stats.moved_to_failure), (1, 1), "{stats:?}");
    assert!(t0.elapsed() >= Duration::from_secs(2));
    let failed = transports.get("failed").unwrap();
    let moved = failed
        .as_listable()
        .unwrap()
        .list(10)
        .await
        .unwrap()
        .iter()
        .filter_map(|e| e.last::<ErrorDetailsStamp>().map(|d| d.class.clone()))
        .collect::<Vec<_>>();
    assert_eq!(moved, ["timeout"]);
}

#[tokio::test(start_paused = true)]
async fn a_worker_built_from_configuration_keeps_to_its_rate_limit() {
    // 10 a second in bursts of 1: 20 messages take at least 1.9 s.
    let config: Config = r#"
        [transports.limited]
        dsn = "in-memory://"
        rate_limit = { limit = 10, interval = "1s", burst = 1 }
    "#
    .parse()
    .unwrap();
    let messages = Arc::new(MessageRegistry::new().with::<Job>());
    let transports = config
        .connect(&TransportRegistry::new(), messages)
        .await
        .unwrap();
    let limited = transports.get("limited").unwrap();
    for i in 0..20 {
        limited.send(Envelope::new(Job(i))).await.unwrap();
    }
    let bus = transports
        .bus_builder()
        .handler_fn("h", |_: Arc<Job>| async { Ok::<(), HandlerError>(()) })
        .build();
    let t0 = tokio::time::Instant::now();
    let stats = run(transports
        .worker(bus, &[])
        .unwrap()
        .sleep(Duration::from_millis(10))
        .limit(20)
        .build())
    .await;
    assert_eq!(stats.handled, 20);
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(1_900),
        "20 messages at 10/s in bursts of 1 took {took:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_worker_over_its_memory_limit_stops_and_leaves_its_messages_queued() {
    // Any process holds more than 64 KiB: the limit is passed from the start, seen once the
    // first fetch is back, and what it fetched is put back.
    let q = queue_with(5).await;
    let bus = MessageBus::builder()
        .handler_fn("h", |_: Arc<Job>| async { Ok::<(), HandlerError>(()) })
        .build();
    let stats = run(Worker::builder(bus)
        .receiver("async", q.clone())
        .fetch_size(1)
        .memory_limit(64 * 1024)
        .build())
    .await;
    assert_eq!(stats.stop_reason, Some(StopReason::MemoryLimit));
    assert_eq!((stats.handled, stats.released), (0, 1), "{stats:?}");
    assert_eq!(q.message_count().await.unwrap(), 5, "every message stays");
    // A limit far above what the process holds lets the worker go on to its message limit.
    let stats = run(Worker::builder(
        MessageBus::builder()
            .handler_fn("h", |_: Arc<Job>| async { Ok::<(), HandlerError>(()) })
            .build(),
    )
    .receiver("async", q.clone())
    .fetch_size(1)
    .memory_limit(1 << 40)
    .limit(4)
    .build())
    .await;
    assert_eq!(stats.stop_reason, Some(StopReason::MessageLimit));
    assert_eq!(stats.handled, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_timeout_is_counted_in_its_own_metric() {
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    recorder.install().unwrap();
    let q = queue_with(1).await;
    let bus = MessageBus::builder()
        .handler_fn("hangs", |_: Arc<Job>| async {
            std::future::pending::<()>().await;
            Ok::<(), HandlerError>(())
        })
        .build();
    // Real time here (the recorder needs no paused clock): stuck means 10 s.
    let worker = Worker::builder(bus)
        .receiver("timed_out", q)
        .retry_strategy(Arc::new(MultiplierRetryStrategy::default().max_retries(0)))
        .handler_timeout(Some(Duration::from_millis(50)))
        .limit(1)
        .build();
    let stats = tokio::time::timeout(
        Duration::from_secs(10),
        worker.run(CancellationToken::new()),
    )
    .await
    .expect("the worker stopped: the hung handler was dropped")
    .unwrap();
    assert_eq!(stats.failed, 1);
    let counted = |name: &str| -> u64 {
        snap.snapshot()
            .into_vec()
            .into_iter()
            .filter(|(key, _, _, _)| {
                key.key().name() == name
                    && key
                        .key()
                        .labels()
                        .any(|l| l.key() == "transport" && l.value() == "timed_out")
            })
            .map(|(_, _, _, v)| match v {
                DebugValue::Counter(n) => n,
                _ => 0,
            })
            .sum()
    };
    assert_eq!(counted(m::HANDLER_TIMEOUTS), 1);
}
