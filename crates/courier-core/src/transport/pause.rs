//! Pausing a queue (River, Oban): a flag in the transport's own server (`courier pause T`),
//! read by every worker of that transport. [`PauseGate`] wraps a receiver: a watcher task
//! reads the flag every 250 ms and, while it is set, the gate's `get` returns nothing (after a
//! short wait) so the worker fetches nothing; messages already fetched finish as usual.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use super::Transport;
use super::gate::{Admission, Gate};
use crate::TransportError;

/// How often a gate reads the shared pause flag.
pub const PAUSE_CHECK: Duration = Duration::from_millis(250);

/// A transport whose queue can be paused, the flag shared through its server.
#[async_trait]
pub trait Pausable: Send + Sync {
    /// Sets (`true`) or clears the pause flag of this transport's queue; returns whether it
    /// changed.
    async fn set_paused(&self, paused: bool) -> Result<bool, TransportError>;

    /// Whether this transport's queue is paused.
    async fn is_paused(&self) -> Result<bool, TransportError>;
}

/// A receiver that fetches nothing while its transport is paused: while the flag is set, its
/// `get` returns nothing after [`PAUSE_CHECK`], and its `ack_and_get` sends the acks and
/// fetches nothing.
#[derive(Debug)]
pub struct PauseGate {
    paused: Arc<AtomicBool>,
}

impl PauseGate {
    /// Wraps `inner` and spawns the watcher that reads its pause flag until `done`. `None` when
    /// the transport cannot be paused.
    #[must_use]
    pub fn wrap(inner: Arc<dyn Transport>, done: CancellationToken) -> Option<Arc<dyn Transport>> {
        inner.as_pausable()?;
        let paused = Arc::new(AtomicBool::new(false));
        let watched = inner.clone();
        let flag = paused.clone();
        tokio::spawn(async move {
            loop {
                if let Some(p) = watched.as_pausable() {
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
                tokio::select! {
                    () = done.cancelled() => return,
                    () = tokio::time::sleep(PAUSE_CHECK) => {}
                }
            }
        });
        Some(Arc::new(Gate {
            inner,
            admission: Self { paused },
        }))
    }

    fn is_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl Admission for PauseGate {
    async fn now(&self, _: &dyn Transport, max: usize) -> Result<Option<usize>, TransportError> {
        Ok((!self.is_paused()).then_some(max))
    }

    async fn wait(&self, _: &dyn Transport, max: usize) -> Result<usize, TransportError> {
        if self.is_paused() {
            tokio::time::sleep(PAUSE_CHECK).await;
            return Ok(0);
        }
        Ok(max)
    }
}
