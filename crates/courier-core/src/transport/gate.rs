//! What the pause and rate-limit gates share: a receiver that forwards everything to the
//! transport it wraps, and asks its admission ([`PauseGate`](super::PauseGate),
//! [`RateLimitGate`](super::RateLimitGate)) how many messages it may fetch first.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::{Abilities, Capabilities, RateLimiter, Transport};
use crate::{Envelope, TransportError};

/// How many messages a gate may fetch.
#[async_trait]
pub(crate) trait Admission: Send + Sync + Debug + 'static {
    /// Without waiting: how many of `max` may be fetched now (`None`: none now).
    async fn now(&self, inner: &dyn Transport, max: usize)
    -> Result<Option<usize>, TransportError>;

    /// Waits until some may be fetched; how many of `max` (0: none this time, and the gate's
    /// `get` returns nothing).
    async fn wait(&self, inner: &dyn Transport, max: usize) -> Result<usize, TransportError>;

    /// The bucket the gate answers [`Abilities::rate_limiter`] with.
    fn rate_limiter<'a>(&'a self, _inner: &'a dyn Transport) -> Option<&'a dyn RateLimiter> {
        None
    }
}

/// A receiver gated by an [`Admission`]: only `get` and `ack_and_get` differ from `inner`.
#[derive(Debug)]
pub(crate) struct Gate<A> {
    pub(crate) inner: Arc<dyn Transport>,
    pub(crate) admission: A,
}

#[async_trait]
impl<A: Admission> Transport for Gate<A> {
    fn messaging_system(&self) -> &'static str {
        self.inner.messaging_system()
    }
    async fn send(&self, envelope: Envelope) -> Result<Envelope, TransportError> {
        self.inner.send(envelope).await
    }
    async fn get(&self, max: usize) -> Result<Vec<Envelope>, TransportError> {
        match self.admission.wait(&*self.inner, max).await? {
            0 => Ok(Vec::new()),
            n => self.inner.get(n).await,
        }
    }
    /// The inner transport's `ack_and_get` (one statement on PostgreSQL) when the admission
    /// lets messages through now; otherwise the acks go out at once (never held while the gate
    /// waits) and the fetch waits like `get`.
    async fn ack_and_get(
        &self,
        acks: &[Envelope],
        max: usize,
    ) -> Result<Vec<Envelope>, TransportError> {
        if let Some(n) = self.admission.now(&*self.inner, max).await? {
            return self.inner.ack_and_get(acks, n).await;
        }
        if !acks.is_empty() {
            self.inner.ack_batch(acks).await?;
        }
        self.get(max).await
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
    fn abilities(&self) -> Abilities<'_> {
        let mut abilities = self.inner.abilities().through_gate();
        abilities.rate_limiter = self.admission.rate_limiter(&*self.inner);
        abilities
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
}
