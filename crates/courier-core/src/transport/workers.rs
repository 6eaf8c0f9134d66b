//! The worker registry: where running workers announce themselves, so operators (`courier
//! workers`, `courier stop-workers`, the dashboard) see and reach them on every host.
//!
//! A registry lives in a store the workers already share (a `courier_workers` table on SQL, a
//! hash on Redis). Each worker [`register`](WorkerRegistry::register)s at start,
//! [`heartbeat`](WorkerRegistry::heartbeat)s every few seconds (which also tells it whether a stop
//! was requested), and [`unregister`](WorkerRegistry::unregister)s on a clean exit. A worker
//! that dies stops heartbeating; [`list`](WorkerRegistry::list) leaves out (and prunes) records
//! older than [`WorkerRegistry::stale_after`]. Times are the store's clock, in epoch ms.

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::TransportError;

/// How long a worker may go without a heartbeat before the registry counts it as gone.
pub const DEFAULT_WORKER_STALE_AFTER: Duration = Duration::from_secs(30);

/// One running worker, as registered (the shape of `courier workers --format json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct WorkerRecord {
    /// Unique across hosts: set by the user (`consume --worker-id`) or host + pid + random.
    pub id: String,
    /// The host name the worker runs on.
    pub host: String,
    /// Its process id on that host.
    pub pid: u32,
    /// The Courier version it runs.
    pub version: String,
    /// The transports it consumes, in priority order.
    pub transports: Vec<String>,
    /// When it registered (epoch ms, the store's clock).
    pub started_at_ms: i64,
    /// Its last heartbeat (epoch ms, the store's clock).
    pub last_heartbeat_ms: i64,
    /// Messages it handled.
    pub handled: u64,
    /// Messages whose handling failed.
    pub failed: u64,
    /// A stop was requested (`courier stop-workers`) and not yet seen through.
    pub stop_requested: bool,
}

impl WorkerRecord {
    /// A record for a worker about to register; the store sets the times.
    #[must_use]
    pub fn new(
        id: impl Into<String>,
        host: impl Into<String>,
        pid: u32,
        transports: Vec<String>,
    ) -> Self {
        Self {
            id: id.into(),
            host: host.into(),
            pid,
            version: env!("CARGO_PKG_VERSION").to_owned(),
            transports,
            started_at_ms: 0,
            last_heartbeat_ms: 0,
            handled: 0,
            failed: 0,
            stop_requested: false,
        }
    }
}

/// What a heartbeat tells the worker back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Heartbeat {
    /// Someone asked this worker to stop: it stops like on SIGTERM.
    pub stop_requested: bool,
    /// The record was gone (pruned as stale, or removed) and the heartbeat registered it anew.
    pub reregistered: bool,
}

impl Heartbeat {
    /// A heartbeat reply.
    #[must_use]
    pub const fn new(stop_requested: bool, reregistered: bool) -> Self {
        Self {
            stop_requested,
            reregistered,
        }
    }
}

/// A shared store of running workers. Each worker [`register`](WorkerRegistry::register)s at
/// start, [`heartbeat`](WorkerRegistry::heartbeat)s every few seconds (learning whether a stop
/// was requested) and [`unregister`](WorkerRegistry::unregister)s on a clean exit;
/// [`list`](WorkerRegistry::list) leaves out (and prunes) records older than
/// [`WorkerRegistry::stale_after`]. Times are the store's clock, in epoch ms.
#[async_trait]
pub trait WorkerRegistry: Send + Sync {
    /// Registers (or replaces) the worker's record, stamping `started_at_ms` and
    /// `last_heartbeat_ms` with the store's clock and clearing `stop_requested`.
    async fn register(&self, worker: &WorkerRecord) -> Result<(), TransportError>;

    /// Refreshes the worker's heartbeat and counts; answers whether a stop was requested. A
    /// record that is gone is registered again from `worker` (a worker that lost its store for
    /// longer than [`WorkerRegistry::stale_after`] comes back in the list).
    async fn heartbeat(&self, worker: &WorkerRecord) -> Result<Heartbeat, TransportError>;

    /// Removes the worker's record (a clean exit). Removing an unknown id is not an error.
    async fn unregister(&self, id: &str) -> Result<(), TransportError>;

    /// The live workers (heartbeat within [`WorkerRegistry::stale_after`]), oldest first;
    /// stale records are pruned on the way.
    async fn list(&self) -> Result<Vec<WorkerRecord>, TransportError>;

    /// Asks the live workers to stop: all of them (`None`) or one id. Returns how many were
    /// asked.
    async fn request_stop(&self, id: Option<&str>) -> Result<u64, TransportError>;

    /// How long a record lives without a heartbeat.
    fn stale_after(&self) -> Duration {
        DEFAULT_WORKER_STALE_AFTER
    }

    /// Where the records live, redacted (e.g. `postgres://app:***@db/app#courier_workers`), so
    /// a caller holding several registries (one per transport of a configuration) can tell which
    /// share a store and ask each store once. `None`: unknown, treat as its own store.
    fn location(&self) -> Option<String> {
        None
    }
}

const _: () = {
    fn _obj_safe(_: &dyn WorkerRegistry) {}
};
