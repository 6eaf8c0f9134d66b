//! Worker registries that need no server: [`InMemoryWorkerRegistry`] (tests, one process), and
//! [`shared_worker_registry`], a transport's own registry as an `Arc` a worker can keep.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;

use super::workers::{DEFAULT_WORKER_STALE_AFTER, Heartbeat, WorkerRecord, WorkerRegistry};
use crate::{Transport, TransportError, TransportErrorKind};

/// A worker registry in this process's memory, for tests and single-process applications.
///
/// Its clock is tokio's (so a test with a paused clock moves it with `tokio::time::advance`),
/// counted from the wall-clock time at which the registry was created.
///
/// ```
/// use courier_core::{InMemoryWorkerRegistry, WorkerRecord, WorkerRegistry};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), courier_core::TransportError> {
/// let registry = InMemoryWorkerRegistry::new();
/// registry.register(&WorkerRecord::new("w1", "host", 42, vec!["async".into()])).await?;
/// assert_eq!(registry.list().await?.len(), 1);
/// assert_eq!(registry.request_stop(None).await?, 1);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct InMemoryWorkerRegistry {
    records: Mutex<BTreeMap<String, WorkerRecord>>,
    stale_after: Duration,
    epoch_ms: i64,
    started: tokio::time::Instant,
}

impl Default for InMemoryWorkerRegistry {
    fn default() -> Self {
        Self::new()
    }
}

impl InMemoryWorkerRegistry {
    /// An empty registry whose records go stale after [`DEFAULT_WORKER_STALE_AFTER`].
    #[must_use]
    pub fn new() -> Self {
        Self::with_stale_after(DEFAULT_WORKER_STALE_AFTER)
    }

    /// An empty registry whose records go stale after `stale_after`.
    #[must_use]
    pub fn with_stale_after(stale_after: Duration) -> Self {
        let epoch_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 2));
        Self {
            records: Mutex::new(BTreeMap::new()),
            stale_after,
            epoch_ms,
            started: tokio::time::Instant::now(),
        }
    }

    fn now_ms(&self) -> i64 {
        let elapsed = i64::try_from(self.started.elapsed().as_millis()).unwrap_or(i64::MAX / 2);
        self.epoch_ms.saturating_add(elapsed)
    }

    fn stale_ms(&self) -> i64 {
        i64::try_from(self.stale_after.as_millis()).unwrap_or(i64::MAX / 2)
    }

    fn records(&self) -> MutexGuard<'_, BTreeMap<String, WorkerRecord>> {
        self.records
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Every record, stale or not, without pruning (what a test inspects).
    #[must_use]
    pub fn records_unpruned(&self) -> Vec<WorkerRecord> {
        self.records().values().cloned().collect()
    }
}

#[async_trait]
impl WorkerRegistry for InMemoryWorkerRegistry {
    async fn register(&self, worker: &WorkerRecord) -> Result<(), TransportError> {
        let now = self.now_ms();
        let mut record = worker.clone();
        record.started_at_ms = now;
        record.last_heartbeat_ms = now;
        record.stop_requested = false;
        self.records().insert(record.id.clone(), record);
        Ok(())
    }

    async fn heartbeat(&self, worker: &WorkerRecord) -> Result<Heartbeat, TransportError> {
        let now = self.now_ms();
        let mut records = self.records();
        if let Some(record) = records.get_mut(&worker.id) {
            record.last_heartbeat_ms = now;
            record.handled = worker.handled;
            record.failed = worker.failed;
            return Ok(Heartbeat::new(record.stop_requested, false));
        }
        let mut record = worker.clone();
        record.started_at_ms = now;
        record.last_heartbeat_ms = now;
        record.stop_requested = false;
        records.insert(record.id.clone(), record);
        Ok(Heartbeat::new(false, true))
    }

    async fn unregister(&self, id: &str) -> Result<(), TransportError> {
        self.records().remove(id);
        Ok(())
    }

    async fn list(&self) -> Result<Vec<WorkerRecord>, TransportError> {
        let oldest = self.now_ms() - self.stale_ms();
        let mut records = self.records();
        records.retain(|_, r| r.last_heartbeat_ms >= oldest);
        let mut live: Vec<WorkerRecord> = records.values().cloned().collect();
        live.sort_by(|a, b| a.started_at_ms.cmp(&b.started_at_ms).then(a.id.cmp(&b.id)));
        Ok(live)
    }

    async fn request_stop(&self, id: Option<&str>) -> Result<u64, TransportError> {
        let oldest = self.now_ms() - self.stale_ms();
        let mut asked = 0;
        for record in self.records().values_mut() {
            if record.last_heartbeat_ms >= oldest && id.is_none_or(|id| id == record.id) {
                record.stop_requested = true;
                asked += 1;
            }
        }
        Ok(asked)
    }

    fn stale_after(&self) -> Duration {
        self.stale_after
    }

    fn location(&self) -> Option<String> {
        Some(format!("in-memory://{:p}", self))
    }
}

/// A transport's worker registry ([`Abilities::worker_registry`](crate::Abilities::worker_registry)) as an
/// `Arc<dyn WorkerRegistry>` that keeps the transport alive; `None` when it has none.
#[must_use]
pub fn shared_worker_registry(transport: Arc<dyn Transport>) -> Option<Arc<dyn WorkerRegistry>> {
    transport.as_worker_registry()?;
    Some(Arc::new(TransportWorkerRegistry(transport)))
}

/// A transport whose `as_worker_registry` is known to be `Some`.
#[derive(Debug)]
struct TransportWorkerRegistry(Arc<dyn Transport>);

impl TransportWorkerRegistry {
    fn inner(&self) -> Result<&dyn WorkerRegistry, TransportError> {
        self.0.as_worker_registry().ok_or_else(|| {
            TransportError::new(TransportErrorKind::Config, "worker registry")
                .with_context("the transport no longer offers a worker registry")
        })
    }
}

#[async_trait]
impl WorkerRegistry for TransportWorkerRegistry {
    async fn register(&self, worker: &WorkerRecord) -> Result<(), TransportError> {
        self.inner()?.register(worker).await
    }

    async fn heartbeat(&self, worker: &WorkerRecord) -> Result<Heartbeat, TransportError> {
        self.inner()?.heartbeat(worker).await
    }

    async fn unregister(&self, id: &str) -> Result<(), TransportError> {
        self.inner()?.unregister(id).await
    }

    async fn list(&self) -> Result<Vec<WorkerRecord>, TransportError> {
        self.inner()?.list().await
    }

    async fn request_stop(&self, id: Option<&str>) -> Result<u64, TransportError> {
        self.inner()?.request_stop(id).await
    }

    fn stale_after(&self) -> Duration {
        self.inner()
            .map_or(DEFAULT_WORKER_STALE_AFTER, WorkerRegistry::stale_after)
    }

    fn location(&self) -> Option<String> {
        self.inner().ok().and_then(WorkerRegistry::location)
    }
}
