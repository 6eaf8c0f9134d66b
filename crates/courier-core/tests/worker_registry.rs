//! The worker in its registry, on tokio's paused clock: it registers, heartbeats with its counts,
//! stops when asked and unregisters on the way out; a registry that fails never stops it.
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::{Job, queue_with};
use courier_core::{
    CancellationToken, Heartbeat, InMemoryWorkerRegistry, MessageBus, StopReason, TransportError,
    TransportErrorKind, Worker, WorkerRecord, WorkerRegistry, WorkerStats, async_trait,
};
use tokio::task::JoinHandle;

fn record(id: &str) -> WorkerRecord {
    WorkerRecord::new(id, "test-host", 7, vec!["async".into()])
}

fn bus() -> MessageBus {
    MessageBus::builder()
        .handler_fn("h", |_: Arc<Job>| async { Ok(()) })
        .build()
}

/// A worker on a queue of `jobs` jobs, registered in `registry`, heartbeating every second.
async fn spawn_worker(
    registry: Arc<dyn WorkerRegistry>,
    id: &str,
    jobs: u32,
    shutdown: CancellationToken,
) -> JoinHandle<WorkerStats> {
    let q = queue_with(jobs).await;
    let worker = Worker::builder(bus())
        .receiver("async", q)
        .sleep(Duration::from_millis(50))
        .registry(registry, record(id))
        .registry_heartbeat(Duration::from_secs(1))
        .build();
    tokio::spawn(async move { worker.run(shutdown).await.unwrap() })
}

#[tokio::test(start_paused = true)]
async fn a_running_worker_is_listed_with_fresh_heartbeats_and_its_counts() {
    let registry = Arc::new(InMemoryWorkerRegistry::new());
    let shutdown = CancellationToken::new();
    let task = spawn_worker(registry.clone(), "w1", 3, shutdown.clone()).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let first = registry.list().await.unwrap();
    assert_eq!(first.len(), 1, "registered at start: {first:?}");
    assert_eq!(first[0].id, "w1");
    assert_eq!(first[0].transports, vec!["async".to_owned()]);
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let later = registry.list().await.unwrap();
    assert_eq!(later.len(), 1);
    assert!(
        later[0].last_heartbeat_ms >= first[0].last_heartbeat_ms + 2_000,
        "two heartbeats in 2.5 s: {} then {}",
        first[0].last_heartbeat_ms,
        later[0].last_heartbeat_ms
    );
    assert_eq!(later[0].started_at_ms, first[0].started_at_ms);
    assert_eq!(
        (later[0].handled, later[0].failed),
        (3, 0),
        "counts reported"
    );
    shutdown.cancel();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_stop_request_stops_the_worker_and_it_unregisters() {
    let registry = Arc::new(InMemoryWorkerRegistry::new());
    let task = spawn_worker(registry.clone(), "w1", 0, CancellationToken::new()).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(registry.request_stop(None).await.unwrap(), 1);
    let stats = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the worker stops within a heartbeat or two")
        .unwrap();
    assert_eq!(stats.stop_reason, Some(StopReason::Shutdown));
    assert!(
        registry.records_unpruned().is_empty(),
        "unregistered on exit: {:?}",
        registry.records_unpruned()
    );
}

#[tokio::test(start_paused = true)]
async fn a_stop_request_for_another_id_leaves_the_worker_running() {
    let registry = Arc::new(InMemoryWorkerRegistry::new());
    let shutdown = CancellationToken::new();
    let task = spawn_worker(registry.clone(), "w1", 0, shutdown.clone()).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(registry.request_stop(Some("w2")).await.unwrap(), 0);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!task.is_finished(), "w1 was not asked");
    shutdown.cancel();
    task.await.unwrap();
    assert!(
        registry.records_unpruned().is_empty(),
        "unregistered on exit"
    );
}

#[tokio::test(start_paused = true)]
async fn a_worker_that_stopped_heartbeating_drops_out_of_the_list() {
    let registry = InMemoryWorkerRegistry::with_stale_after(Duration::from_secs(5));
    registry.register(&record("dead")).await.unwrap();
    tokio::time::advance(Duration::from_secs(4)).await;
    assert_eq!(registry.list().await.unwrap().len(), 1);
    tokio::time::advance(Duration::from_secs(2)).await;
    assert!(registry.list().await.unwrap().is_empty(), "stale after 5 s");
    assert!(registry.records_unpruned().is_empty(), "and pruned");
    let beat = registry.heartbeat(&record("dead")).await.unwrap();
    assert_eq!(
        beat,
        Heartbeat::new(false, true),
        "a heartbeat registers it again"
    );
}

#[tokio::test(start_paused = true)]
async fn the_heartbeat_is_at_most_a_third_of_stale_after() {
    let registry = Arc::new(InMemoryWorkerRegistry::with_stale_after(
        Duration::from_secs(3),
    ));
    let shutdown = CancellationToken::new();
    let q = queue_with(0).await;
    let worker = Worker::builder(bus())
        .receiver("async", q)
        .registry(registry.clone(), record("w1"))
        .build();
    let task = tokio::spawn(worker.run(shutdown.clone()));
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(registry.list().await.unwrap().len(), 1, "never stale");
    }
    shutdown.cancel();
    task.await.unwrap().unwrap();
}

/// A registry whose store is down: every call fails.
#[derive(Debug, Default)]
struct Down {
    calls: AtomicU64,
}

#[async_trait]
impl WorkerRegistry for Down {
    async fn register(&self, _: &WorkerRecord) -> Result<(), TransportError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Err(TransportError::new(TransportErrorKind::Connection, "down"))
    }
    async fn heartbeat(&self, _: &WorkerRecord) -> Result<Heartbeat, TransportError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Err(TransportError::new(TransportErrorKind::Connection, "down"))
    }
    async fn unregister(&self, _: &str) -> Result<(), TransportError> {
        Err(TransportError::new(TransportErrorKind::Connection, "down"))
    }
    async fn list(&self) -> Result<Vec<WorkerRecord>, TransportError> {
        Err(TransportError::new(TransportErrorKind::Connection, "down"))
    }
    async fn request_stop(&self, _: Option<&str>) -> Result<u64, TransportError> {
        Err(TransportError::new(TransportErrorKind::Connection, "down"))
    }
}

#[tokio::test(start_paused = true)]
async fn a_registry_that_is_down_is_retried_and_never_stops_the_worker() {
    let registry = Arc::new(Down::default());
    let shutdown = CancellationToken::new();
    let q = queue_with(5).await;
    let worker = Worker::builder(bus())
        .receiver("async", q.clone())
        .sleep(Duration::from_millis(50))
        .registry(registry.clone(), record("w1"))
        .registry_heartbeat(Duration::from_secs(1))
        .build();
    let task = tokio::spawn(worker.run(shutdown.clone()));
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    assert!(!task.is_finished(), "still running");
    assert!(
        registry.calls.load(Ordering::SeqCst) >= 3,
        "registration tried at every tick"
    );
    shutdown.cancel();
    let stats = task.await.unwrap().unwrap();
    assert_eq!(stats.handled, 5, "the messages were handled all along");
}
