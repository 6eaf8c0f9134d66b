//! `sync://`: handles messages in-process at dispatch time.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::{Capabilities, Transport};
use crate::retry::{MultiplierRetryStrategy, RetryDecision, RetryStrategy, decide};
use crate::{
    BusError, BusLink, Envelope, ErrorDetailsStamp, ReceivedStamp, RedeliveryStamp,
    SentToFailureTransportStamp, TransportError, TransportErrorKind,
};

/// A transport that handles each message on the bus as soon as it is sent (Symfony's
/// `sync://`): useful to route a message "nowhere" in development, or to keep one code path
/// whether a message is queued or not.
///
/// Documented exceptions to the transport contract: it stores nothing, so `get` returns nothing
/// and `ack` / `reject` do nothing; it **ignores [`DelayStamp`](crate::DelayStamp)**; on handler
/// failure it retries at once, in-process, as many times as its retry strategy allows (the
/// strategy's delays are not waited), then sends the message to its failure transport when one
/// is configured, else returns the failure to the dispatcher.
#[derive(Debug, Clone)]
pub struct SyncTransport {
    name: String,
    bus: BusLink,
    retry: Arc<dyn RetryStrategy>,
    failure_transport: Option<String>,
}

impl SyncTransport {
    /// A sync transport named `name` that handles on the bus `bus` is (or will be) bound to.
    #[must_use]
    pub fn new(name: impl Into<String>, bus: BusLink) -> Self {
        Self {
            name: name.into(),
            bus,
            retry: Arc::new(MultiplierRetryStrategy::default()),
            failure_transport: None,
        }
    }

    /// Sets the retry strategy.
    #[must_use]
    pub fn retry_strategy(mut self, retry: Arc<dyn RetryStrategy>) -> Self {
        self.retry = retry;
        self
    }

    /// Sets the failure transport (a transport of the same bus, by name).
    #[must_use]
    pub fn failure_transport(mut self, name: Option<String>) -> Self {
        self.failure_transport = name;
        self
    }

    fn error(&self, kind: TransportErrorKind) -> TransportError {
        TransportError::new(kind, self.name.clone())
    }
}

#[async_trait]
impl Transport for SyncTransport {
    fn messaging_system(&self) -> &'static str {
        "sync"
    }

    async fn send(&self, envelope: Envelope) -> Result<Envelope, TransportError> {
        let bus = self.bus.get().ok_or_else(|| {
            self.error(TransportErrorKind::Config)
                .with_context("not bound to a bus")
        })?;
        let mut current = envelope.with(ReceivedStamp(self.name.clone()));
        let mut retries = 0u32;
        loop {
            let err = match bus.dispatch(current.clone()).await {
                Ok(handled) => return Ok(handled),
                Err(e) => e,
            };
            let decision = decide(&*self.retry, &current, &err);
            let after = match &err {
                BusError::HandlerFailed { envelope, .. } => envelope.as_ref().clone(),
                _ => current.clone(),
            };
            let details = ErrorDetailsStamp::from_error(err.class(), &err);
            match decision {
                RetryDecision::Retry(_) => {
                    retries += 1;
                    current = after
                        .with_error_details(details)
                        .with(RedeliveryStamp::new(retries));
                }
                RetryDecision::Reject => {
                    let Some(failure) = &self.failure_transport else {
                        return Err(self.error(TransportErrorKind::Handler).with_source(err));
                    };
                    let target = bus.transport(failure).ok_or_else(|| {
                        self.error(TransportErrorKind::Config)
                            .with_context(format!("unknown failure transport `{failure}`"))
                    })?;
                    let moved = after
                        .with_error_details(details)
                        .with(SentToFailureTransportStamp::new(self.name.clone()))
                        .without_all::<ReceivedStamp>();
                    return target.send(moved).await;
                }
            }
        }
    }

    async fn get(&self, _max: usize) -> Result<Vec<Envelope>, TransportError> {
        Ok(Vec::new())
    }

    async fn ack(&self, _envelope: &Envelope) -> Result<(), TransportError> {
        Ok(())
    }

    async fn reject(&self, _envelope: &Envelope) -> Result<(), TransportError> {
        Ok(())
    }

    async fn retry(&self, envelope: Envelope, _delay: Duration) -> Result<(), TransportError> {
        self.send(envelope.without_all::<ReceivedStamp>())
            .await
            .map(drop)
    }

    fn capabilities(&self) -> Capabilities {
        // Delays are ignored rather than refused: the documented exception.
        Capabilities::none().with_delay(None)
    }
}
