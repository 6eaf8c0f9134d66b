//! Pausing a queue (River, Oban): a flag in the transport's own server (`courier pause T`),
//! read by every worker of that transport. [`PauseGate`] wraps a receiver: its first fetch reads
//! the flag, then a watcher task reads it every 250 ms and, while it is set, the gate's `get`
//! returns nothing (after a short wait) so the worker fetches nothing; messages already fetched
//! finish as usual.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use super::Transport;
use super::gate::{Admission, Gate};
use crate::TransportError;

/// How often a gate reads the shared pause flag.
pub const PAUSE_CHECK: Duration = Duration::from_millis(250);

/// A receiver that fetches nothing while its transport is paused: while the flag is set, its
/// `get` returns nothing after [`PAUSE_CHECK`], and its `ack_and_get` sends the acks and
/// fetches nothing.
///
/// [`Transports::worker`](crate::config::Transports::worker) wraps every receiver that can be
/// paused in one; a worker built by hand wraps its receivers itself.
#[derive(Debug)]
pub struct PauseGate {
    paused: Arc<AtomicBool>,
    /// The transport whose flag the watcher reads and when it stops, until the first fetch
    /// starts the watcher.
    unwatched: Mutex<Option<(Arc<dyn Transport>, CancellationToken)>>,
}

impl PauseGate {
    /// Wraps `inner`; `None` when the transport cannot be paused. The gate's first fetch reads
    /// the flag (so a worker started on a paused queue fetches nothing) and starts the task
    /// that reads it every [`PAUSE_CHECK`], until `done` is cancelled or the gate is dropped.
    /// Needs no runtime until that first fetch.
    #[must_use]
    pub fn wrap(inner: Arc<dyn Transport>, done: CancellationToken) -> Option<Arc<dyn Transport>> {
        inner.as_pausable()?;
        Some(Arc::new(Gate {
            inner: inner.clone(),
            admission: Self {
                paused: Arc::new(AtomicBool::new(false)),
                unwatched: Mutex::new(Some((inner, done))),
            },
        }))
    }

    /// Reads the flag and starts the watcher, the first time only.
    async fn watch(&self) {
        let unwatched = match self.unwatched.lock() {
            Ok(mut guard) => guard.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        let Some((inner, done)) = unwatched else {
            return;
        };
        read_flag(&*inner, &self.paused).await;
        let flag = Arc::downgrade(&self.paused);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = done.cancelled() => return,
                    () = tokio::time::sleep(PAUSE_CHECK) => {}
                }
                // The gate is gone (its worker stopped): so is the flag.
                let Some(flag) = flag.upgrade() else {
                    return;
                };
                read_flag(&*inner, &flag).await;
            }
        });
    }

    fn is_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }
}

/// Reads `inner`'s pause flag into `flag` (an error keeps it as it was).
async fn read_flag(inner: &dyn Transport, flag: &AtomicBool) {
    let Some(p) = inner.as_pausable() else {
        return;
    };
    match p.is_paused().await {
        Ok(now) => {
            if flag.swap(now, Ordering::SeqCst) != now {
                tracing::info!(paused = now, "the transport's pause flag changed");
            }
        }
        Err(e) => tracing::debug!(error = %crate::error_chain(&e),
            "cannot read the pause flag (kept as it was)"),
    }
}

#[async_trait]
impl Admission for PauseGate {
    async fn now(&self, _: &dyn Transport, max: usize) -> Result<Option<usize>, TransportError> {
        self.watch().await;
        Ok((!self.is_paused()).then_some(max))
    }

    async fn wait(&self, _: &dyn Transport, max: usize) -> Result<usize, TransportError> {
        self.watch().await;
        if self.is_paused() {
            tokio::time::sleep(PAUSE_CHECK).await;
            return Ok(0);
        }
        Ok(max)
    }
}
