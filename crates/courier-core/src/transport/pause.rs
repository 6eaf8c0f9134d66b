//! Pausing a queue (River, Oban): a flag in the transport's own server (`courier pause T`),
//! read by every worker of that transport. [`PauseGate`] wraps a receiver: a watcher task
//! reads the flag every 250 ms and, while it is set, the gate's `get` returns nothing (after a
//! short wait) so the worker fetches nothing; messages already fetched finish as usual.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use super::{Capabilities, Transport};
use crate::{Envelope, TransportError};

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

/// A receiver that fetches nothing while its transport is paused.
#[derive(Debug)]
pub struct PauseGate {
    inner: Arc<dyn Transport>,
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
        Some(Arc::new(Self { inner, paused }))
    }

    fn is_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl Transport for PauseGate {
    fn messaging_system(&self) -> &'static str {
        self.inner.messaging_system()
    }
    async fn send(&self, envelope: Envelope) -> Result<Envelope, TransportError> {
        self.inner.send(envelope).await
    }
    async fn get(&self, max: usize) -> Result<Vec<Envelope>, TransportError> {
        if self.is_paused() {
            tokio::time::sleep(PAUSE_CHECK).await;
            return Ok(Vec::new());
        }
        self.inner.get(max).await
    }
    /// The inner transport's `ack_and_get` (one statement on PostgreSQL); paused, the acks
    /// still go out and nothing is fetched.
    async fn ack_and_get(
        &self,
        acks: &[Envelope],
        max: usize,
    ) -> Result<Vec<Envelope>, TransportError> {
        if self.is_paused() {
            if !acks.is_empty() {
                self.inner.ack_batch(acks).await?;
            }
            tokio::time::sleep(PAUSE_CHECK).await;
            return Ok(Vec::new());
        }
        self.inner.ack_and_get(acks, max).await
    }
    async fn ack(&self, envelope: &Envelope) -> Result<(), TransportError> {
        self.inner.ack(envelope).await
    }
    async fn reject(&self, envelope: &Envelope) -> Result<(), TransportError> {
        self.inner.reject(envelope).await
    }
    async fn retry(&self, envelope: Envelope, delay: Duration) -> Result<(), TransportError> {
        self.inner.retry(envelope, delay).await
    }
    async fn keepalive(&self, envelope: &Envelope) -> Result<(), TransportError> {
        self.inner.keepalive(envelope).await
    }
    async fn keepalive_batch(&self, envelopes: &[Envelope]) -> Result<(), TransportError> {
        self.inner.keepalive_batch(envelopes).await
    }
    async fn send_batch(&self, envelopes: Vec<Envelope>) -> Result<Vec<Envelope>, TransportError> {
        self.inner.send_batch(envelopes).await
    }
    async fn ack_batch(&self, envelopes: &[Envelope]) -> Result<(), TransportError> {
        self.inner.ack_batch(envelopes).await
    }
    super::forward_views!();
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
}
