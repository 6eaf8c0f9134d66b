//! Retry strategies: whether a failed message is retried, and after how long.

use std::fmt::Debug;
use std::time::Duration;

use crate::transport::retry_count;
use crate::{Backoff, BusError, Envelope, HandlerError, Jitter};

/// What to do with a failed message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RetryDecision {
    /// Retry after this delay.
    Retry(Duration),
    /// Give up: the failure transport, or the error to the caller.
    Reject,
}

/// Decides retries for one transport (Symfony's `RetryStrategyInterface`).
///
/// [`decide`] applies the handler's intent first: [`HandlerError::Recoverable`] always retries and
/// [`HandlerError::Unrecoverable`] never does; the strategy decides the rest.
///
/// ```
/// use courier_core::{Envelope, HandlerError, RetryStrategy};
/// use std::time::Duration;
///
/// /// Retries forever, every 5 seconds.
/// #[derive(Debug)]
/// struct Forever;
///
/// impl RetryStrategy for Forever {
///     fn is_retryable(&self, _: &Envelope, _: Option<&HandlerError>) -> bool { true }
///     fn waiting_time(&self, _: &Envelope, _: Option<&HandlerError>) -> Duration { Duration::from_secs(5) }
/// }
/// ```
pub trait RetryStrategy: Send + Sync + Debug {
    /// Whether another attempt should be made (the envelope's
    /// [`RedeliveryStamp`](crate::RedeliveryStamp) says how many were made).
    fn is_retryable(&self, envelope: &Envelope, error: Option<&HandlerError>) -> bool;
    /// How long to wait before the next attempt.
    fn waiting_time(&self, envelope: &Envelope, error: Option<&HandlerError>) -> Duration;
}

const _: () = {
    fn _obj_safe(_: &dyn RetryStrategy) {}
};

impl RetryDecision {
    /// Combines the decisions for two failures of one message: retry if either retries (after
    /// the longer delay).
    #[must_use]
    pub fn combine(self, other: Self) -> Self {
        match (self, other) {
            (Self::Retry(a), Self::Retry(b)) => Self::Retry(a.max(b)),
            (Self::Retry(a), Self::Reject) | (Self::Reject, Self::Retry(a)) => Self::Retry(a),
            (Self::Reject, Self::Reject) => Self::Reject,
        }
    }
}

/// Decides what to do after `error`, with Symfony's rules: any recoverable failure retries
/// (after its `retry_after`, else the strategy's delay); if every failure is unrecoverable, or
/// the message cannot be handled at all (no handler, undecodable), it is rejected; otherwise the
/// strategy decides.
#[must_use]
pub fn decide(
    strategy: &dyn RetryStrategy,
    envelope: &Envelope,
    error: &BusError,
) -> RetryDecision {
    let failures = error.handler_failures();
    if failures.is_empty() {
        return match error {
            BusError::NoHandler { .. }
            | BusError::Undecodable(_)
            | BusError::Signature { .. }
            | BusError::UnknownTransport { .. }
            | BusError::NotRouted { .. } => RetryDecision::Reject,
            _ if strategy.is_retryable(envelope, None) => {
                RetryDecision::Retry(strategy.waiting_time(envelope, None))
            }
            _ => RetryDecision::Reject,
        };
    }
    for f in failures {
        if let HandlerError::Recoverable { retry_after, .. } = f.error.classifying() {
            let delay =
                retry_after.unwrap_or_else(|| strategy.waiting_time(envelope, Some(&f.error)));
            return RetryDecision::Retry(delay);
        }
    }
    let deciding = failures
        .iter()
        .find(|f| !matches!(f.error.classifying(), HandlerError::Unrecoverable(_)));
    match deciding {
        None => RetryDecision::Reject,
        Some(f) if strategy.is_retryable(envelope, Some(&f.error)) => {
            RetryDecision::Retry(strategy.waiting_time(envelope, Some(&f.error)))
        }
        Some(_) => RetryDecision::Reject,
    }
}

/// Exponential backoff: `delay * multiplier^retries`, capped at `max_delay`, with `jitter`
/// (a fraction: 0.1 = +-10 %), for at most `max_retries` retries; the waits come from a
/// [`Backoff`] with [`Jitter::Spread`]. Symfony's defaults: 3 retries, 1 s, x2, no cap, 0.1
/// jitter.
///
/// ```
/// use courier_core::MultiplierRetryStrategy;
/// use std::time::Duration;
///
/// let strategy = MultiplierRetryStrategy::default()
///     .max_retries(5)
///     .delay(Duration::from_millis(500))
///     .max_delay(Some(Duration::from_secs(10)))
///     .jitter(0.0);
/// assert_eq!(strategy.delay_for(0), Duration::from_millis(500));
/// assert_eq!(strategy.delay_for(3), Duration::from_secs(4));
/// assert_eq!(strategy.delay_for(9), Duration::from_secs(10));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct MultiplierRetryStrategy {
    max_retries: u32,
    backoff: Backoff,
}

impl Default for MultiplierRetryStrategy {
    fn default() -> Self {
        Self {
            max_retries: 3,
            backoff: Backoff::new(Duration::from_secs(1), Duration::MAX)
                .jitter(Jitter::Spread(0.1)),
        }
    }
}

impl MultiplierRetryStrategy {
    /// Sets the number of retries (0: never retry).
    #[must_use]
    pub fn max_retries(mut self, n: u32) -> Self {
        self.max_retries = n;
        self
    }

    /// Sets the first delay.
    #[must_use]
    pub fn delay(mut self, delay: Duration) -> Self {
        self.backoff.base = delay;
        self
    }

    /// Sets the multiplier (values below 1 are treated as 1).
    #[must_use]
    pub fn multiplier(mut self, multiplier: f64) -> Self {
        self.backoff.multiplier = multiplier.max(1.0);
        self
    }

    /// Sets the cap on the delay.
    #[must_use]
    pub fn max_delay(mut self, max: Option<Duration>) -> Self {
        self.backoff.cap = max.unwrap_or(Duration::MAX);
        self
    }

    /// Sets the jitter fraction, clamped to 0..=1.
    #[must_use]
    pub fn jitter(mut self, jitter: f64) -> Self {
        let jitter = jitter.clamp(0.0, 1.0);
        self.backoff.jitter = if jitter > 0.0 {
            Jitter::Spread(jitter)
        } else {
            Jitter::None
        };
        self
    }

    /// The delay before retry number `retries + 1`, without jitter.
    #[must_use]
    pub fn delay_for(&self, retries: u32) -> Duration {
        self.backoff.exact(retries)
    }
}

impl RetryStrategy for MultiplierRetryStrategy {
    fn is_retryable(&self, envelope: &Envelope, _error: Option<&HandlerError>) -> bool {
        retry_count(envelope) < self.max_retries
    }

    fn waiting_time(&self, envelope: &Envelope, _error: Option<&HandlerError>) -> Duration {
        self.backoff.delay(retry_count(envelope))
    }
}
