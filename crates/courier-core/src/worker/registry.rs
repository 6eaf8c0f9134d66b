//! The worker's part of the [worker registry](crate::WorkerRegistry): register at
//! start, heartbeat beside the loop, stop when asked, unregister on the way out.
//!
//! Set with [`WorkerBuilder::registry`](super::WorkerBuilder::registry). The heartbeat runs on a
//! task of its own every [`WorkerBuilder::registry_heartbeat`](super::WorkerBuilder::registry_heartbeat)
//! (default 2 s, at most a third of the registry's
//! [`stale_after`](crate::WorkerRegistry::stale_after)), so handlers never wait on
//! the store. A store that fails logs a warning and is tried again at the next tick: a registry
//! outage never stops the worker (it only drops out of `courier workers` until the store is
//! back). A heartbeat that answers [`Heartbeat::stop_requested`](crate::Heartbeat) stops the
//! worker as its shutdown token would: no new fetches, in-flight handlers finish within the
//! grace period. Whatever ends the run, the worker then unregisters, waiting at most
//! [`UNREGISTER_TIMEOUT`] for the store (a record left behind expires after `stale_after`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::io::AbortOnDrop;
use crate::transport::{WorkerRecord, WorkerRegistry};

/// The default heartbeat interval.
pub const DEFAULT_REGISTRY_HEARTBEAT: Duration = Duration::from_secs(2);

/// How long a stopping worker waits for the store to take its record off.
pub const UNREGISTER_TIMEOUT: Duration = Duration::from_secs(3);

/// The shortest heartbeat interval (a `stale_after` of a few ms would make it spin).
const MIN_HEARTBEAT: Duration = Duration::from_millis(20);

/// A worker's registration: where, as what, how often.
#[derive(Clone)]
pub(crate) struct Registration {
    pub(crate) registry: Arc<dyn WorkerRegistry>,
    pub(crate) record: WorkerRecord,
    pub(crate) heartbeat: Option<Duration>,
    pub(crate) counts: Arc<LiveCounts>,
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("id", &self.record.id)
            .field("heartbeat", &self.heartbeat)
            .finish_non_exhaustive()
    }
}

/// The counts a heartbeat reports, bumped by the loop as messages settle.
#[derive(Debug, Default)]
pub(crate) struct LiveCounts {
    handled: AtomicU64,
    failed: AtomicU64,
}

impl LiveCounts {
    pub(crate) fn settled(&self, handled: bool, failed: bool) {
        if handled {
            self.handled.fetch_add(1, Ordering::Relaxed);
        }
        if failed {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Registration {
    /// The heartbeat interval: the one set, else 2 s, at most a third of `stale_after`.
    pub(crate) fn interval(&self) -> Duration {
        let ceiling = (self.registry.stale_after() / 3).max(MIN_HEARTBEAT);
        self.heartbeat
            .unwrap_or(DEFAULT_REGISTRY_HEARTBEAT)
            .min(ceiling)
            .max(MIN_HEARTBEAT)
    }

    /// The record with the current counts.
    fn current(&self) -> WorkerRecord {
        let mut record = self.record.clone();
        record.handled = self.counts.handled.load(Ordering::Relaxed);
        record.failed = self.counts.failed.load(Ordering::Relaxed);
        record
    }

    /// Starts the heartbeat task; it cancels `stop` when a stop is requested.
    pub(crate) fn start(self: Arc<Self>, stop: CancellationToken) -> Beating {
        let registered = Arc::new(AtomicBool::new(false));
        let flag = registered.clone();
        let this = self.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(this.interval());
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                this.beat(&flag, &stop).await;
            }
        });
        Beating {
            registration: self,
            registered,
            task: AbortOnDrop(task),
        }
    }

    /// One tick: register (until that worked once), else heartbeat.
    async fn beat(&self, registered: &AtomicBool, stop: &CancellationToken) {
        let id = &self.record.id;
        if !registered.load(Ordering::Acquire) {
            match self.registry.register(&self.current()).await {
                Ok(()) => {
                    registered.store(true, Ordering::Release);
                    tracing::debug!(courier.worker.id = %id, "worker registered");
                }
                Err(e) => {
                    tracing::warn!(courier.worker.id = %id, error = %crate::error_chain(&e),
                        "cannot register the worker; trying again at the next heartbeat");
                }
            }
            return;
        }
        match self.registry.heartbeat(&self.current()).await {
            Ok(beat) => {
                if beat.reregistered {
                    tracing::info!(courier.worker.id = %id, "worker record was gone; registered again");
                }
                if beat.stop_requested && !stop.is_cancelled() {
                    tracing::info!(courier.worker.id = %id, "stop requested through the worker registry");
                    stop.cancel();
                }
            }
            Err(e) => {
                tracing::warn!(courier.worker.id = %id, error = %crate::error_chain(&e),
                    "worker heartbeat failed; trying again at the next one");
            }
        }
    }
}

/// A running heartbeat task.
pub(crate) struct Beating {
    registration: Arc<Registration>,
    registered: Arc<AtomicBool>,
    task: AbortOnDrop<()>,
}

impl Beating {
    /// Stops the heartbeats and takes the record off the registry (at most
    /// [`UNREGISTER_TIMEOUT`]).
    pub(crate) async fn finish(self) {
        drop(self.task);
        if !self.registered.load(Ordering::Acquire) {
            return;
        }
        let id = &self.registration.record.id;
        let registry = &self.registration.registry;
        match tokio::time::timeout(UNREGISTER_TIMEOUT, registry.unregister(id)).await {
            Ok(Ok(())) => tracing::debug!(courier.worker.id = %id, "worker unregistered"),
            Ok(Err(e)) => tracing::warn!(courier.worker.id = %id, error = %crate::error_chain(&e),
                "cannot unregister the worker; its record expires once stale"),
            Err(_) => tracing::warn!(courier.worker.id = %id,
                "unregistering the worker timed out; its record expires once stale"),
        }
    }
}

/// A worker id for this process: `host:pid:random`. Host and pid alone are not unique (two
/// containers often both run pid 1 on hosts of the same name), hence the random part.
#[must_use]
pub fn default_worker_id() -> String {
    format!(
        "{}:{}:{:08x}",
        host_name(),
        std::process::id(),
        fastrand::u32(..)
    )
}

/// This machine's name: `$HOSTNAME`, else `/etc/hostname`, else `localhost`.
#[must_use]
pub fn host_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().replace(char::is_whitespace, "-"))
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}
