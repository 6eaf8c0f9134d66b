//! Failure classes, the ordered classifier and [`ProviderError`].

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::UnknownName;

/// What kind of failure stopped a run; decides whether it may be retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum FailureClass {
    /// A circuit breaker is open.
    CircuitOpen,
    /// The provider could not be reached, or timed out.
    Connection,
    /// HTTP 401 or 403.
    Auth,
    /// HTTP 429.
    RateLimit,
    /// HTTP 5xx.
    ServerError,
    /// Any other HTTP 4xx.
    ClientError,
    /// The provider answered something that is not what its protocol promises: malformed or
    /// truncated JSON, a required field missing. Not retried (a fallback chain still moves on).
    Protocol,
    /// The agent or provider is misconfigured.
    Configuration,
    /// Anything else.
    Unknown,
    /// A resumed run asked for a different step than its journal holds at that position.
    Nondeterminism,
    /// A guarded step began and never recorded a result, and its policy is to fail.
    AmbiguousEffect,
    /// The run spent one of its budget's limits.
    BudgetExhausted,
    /// A step's result is larger than the journal accepts.
    ResultTooLarge,
    /// A journaled step's row cannot be read back (edited by hand, or written by an
    /// incompatible version).
    CorruptJournal,
}

impl FailureClass {
    /// Every class.
    pub const ALL: [FailureClass; 14] = [
        Self::CircuitOpen,
        Self::Connection,
        Self::Auth,
        Self::RateLimit,
        Self::ServerError,
        Self::ClientError,
        Self::Protocol,
        Self::Configuration,
        Self::Unknown,
        Self::Nondeterminism,
        Self::AmbiguousEffect,
        Self::BudgetExhausted,
        Self::ResultTooLarge,
        Self::CorruptJournal,
    ];

    /// The stored name.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::CircuitOpen => "circuit_open",
            Self::Connection => "connection",
            Self::Auth => "auth",
            Self::RateLimit => "rate_limit",
            Self::ServerError => "server_error",
            Self::ClientError => "client_error",
            Self::Protocol => "protocol",
            Self::Configuration => "configuration",
            Self::Unknown => "unknown",
            Self::Nondeterminism => "nondeterminism",
            Self::AmbiguousEffect => "ambiguous_effect",
            Self::BudgetExhausted => "budget_exhausted",
            Self::ResultTooLarge => "result_too_large",
            Self::CorruptJournal => "corrupt_journal",
        }
    }

    /// Retryable: connection, rate_limit, server_error, circuit_open.
    #[must_use]
    pub fn is_retryable(self) -> bool {
        match self {
            Self::Connection | Self::RateLimit | Self::ServerError | Self::CircuitOpen => true,
            Self::Auth
            | Self::ClientError
            | Self::Protocol
            | Self::Configuration
            | Self::Unknown
            | Self::Nondeterminism
            | Self::AmbiguousEffect
            | Self::BudgetExhausted
            | Self::ResultTooLarge
            | Self::CorruptJournal => false,
        }
    }
}

impl fmt::Display for FailureClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for FailureClass {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| UnknownName {
                what: "failure class",
                value: s.to_owned(),
            })
    }
}

/// A failure of a model or tool provider, as an agent reports it, so that it is classified
/// without a classifier of its own.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProviderError {
    /// The provider answered with an HTTP error status.
    #[error("provider answered http {status}")]
    Http {
        /// The status code.
        status: u16,
    },
    /// The provider answered HTTP 429; `retry_after` is its `Retry-After`, which becomes the
    /// run's requeue delay ([`AgentError::retry_after`](crate::AgentError::retry_after)).
    #[error("provider answered http 429 (rate limited{})", .retry_after.map(|d| format!(", retry after {d:?}")).unwrap_or_default())]
    RateLimited {
        /// The delay the provider asked for.
        retry_after: Option<Duration>,
    },
    /// The provider's answer broke its protocol (malformed or truncated JSON, a missing field).
    #[error("provider broke its protocol: {0}")]
    Protocol(String),
    /// The provider could not be reached.
    #[error("cannot connect to the provider")]
    Connection(#[source] Option<courier_core::BoxError>),
    /// The provider did not answer in time.
    #[error("the provider timed out after {0:?}")]
    Timeout(Duration),
    /// The agent or provider is misconfigured (missing key, unknown model...).
    #[error("provider misconfigured: {0}")]
    Configuration(String),
    /// A circuit breaker refused the call.
    #[error("circuit open for the provider")]
    CircuitOpen,
    /// Every provider of a fallback chain failed; classified by its last attempt.
    #[error("fallback chain exhausted after {} attempt(s)", .0.len())]
    FallbackChainExhausted(Vec<ProviderError>),
    /// Anything else.
    #[error("provider failed: {0}")]
    Other(String),
}

impl ProviderError {
    /// An HTTP status failure.
    #[must_use]
    pub fn http(status: u16) -> Self {
        Self::Http { status }
    }

    /// Classifies this failure (see [`classify`]).
    #[must_use]
    pub fn class(&self) -> FailureClass {
        classify(self)
    }

    /// The delay the provider asked for before a retry (`Retry-After` of a 429); a fallback
    /// chain's is its last attempt's, like its class.
    #[must_use]
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::RateLimited { retry_after } => *retry_after,
            Self::FallbackChainExhausted(chain) => chain.last().and_then(Self::retry_after),
            _ => None,
        }
    }
}

/// The ordered classifier: circuit open; a fallback chain is classified by its
/// LAST attempt (recursively, an empty chain is unknown); connection and timeout are
/// connection; configuration; HTTP 401/403 auth, 429 (and [`ProviderError::RateLimited`]) rate
/// limit, 5xx server error, other 4xx client error; a broken answer protocol; anything else
/// unknown.
#[must_use]
pub fn classify(error: &ProviderError) -> FailureClass {
    match error {
        ProviderError::CircuitOpen => FailureClass::CircuitOpen,
        ProviderError::FallbackChainExhausted(chain) => {
            chain.last().map_or(FailureClass::Unknown, classify)
        }
        ProviderError::Connection(_) | ProviderError::Timeout(_) => FailureClass::Connection,
        ProviderError::Configuration(_) => FailureClass::Configuration,
        ProviderError::RateLimited { .. } => FailureClass::RateLimit,
        ProviderError::Protocol(_) => FailureClass::Protocol,
        ProviderError::Http { status } => match status {
            401 | 403 => FailureClass::Auth,
            429 => FailureClass::RateLimit,
            500..=599 => FailureClass::ServerError,
            400..=499 => FailureClass::ClientError,
            _ => FailureClass::Unknown,
        },
        ProviderError::Other(_) => FailureClass::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifier_follows_design_order() {
        assert_eq!(
            classify(&ProviderError::CircuitOpen),
            FailureClass::CircuitOpen
        );
        assert_eq!(
            classify(&ProviderError::Connection(None)),
            FailureClass::Connection
        );
        assert_eq!(
            classify(&ProviderError::Timeout(Duration::from_secs(1))),
            FailureClass::Connection
        );
        assert_eq!(
            classify(&ProviderError::Configuration("no key".into())),
            FailureClass::Configuration
        );
        assert_eq!(classify(&ProviderError::http(401)), FailureClass::Auth);
        assert_eq!(classify(&ProviderError::http(403)), FailureClass::Auth);
        assert_eq!(classify(&ProviderError::http(429)), FailureClass::RateLimit);
        assert_eq!(
            classify(&ProviderError::http(500)),
            FailureClass::ServerError
        );
        assert_eq!(
            classify(&ProviderError::http(503)),
            FailureClass::ServerError
        );
        assert_eq!(
            classify(&ProviderError::http(400)),
            FailureClass::ClientError
        );
        assert_eq!(
            classify(&ProviderError::http(404)),
            FailureClass::ClientError
        );
        assert_eq!(classify(&ProviderError::http(302)), FailureClass::Unknown);
        let limited = ProviderError::RateLimited {
            retry_after: Some(Duration::from_secs(7)),
        };
        assert_eq!(classify(&limited), FailureClass::RateLimit);
        assert_eq!(limited.retry_after(), Some(Duration::from_secs(7)));
        assert_eq!(
            classify(&ProviderError::Protocol("truncated".into())),
            FailureClass::Protocol
        );
        let chain = ProviderError::FallbackChainExhausted(vec![ProviderError::http(503), limited]);
        assert_eq!(chain.retry_after(), Some(Duration::from_secs(7)));
        assert_eq!(ProviderError::http(429).retry_after(), None);
        assert_eq!(
            classify(&ProviderError::Other("?".into())),
            FailureClass::Unknown
        );
    }

    #[test]
    fn fallback_chain_is_classified_by_its_last_attempt_recursively() {
        let chain = ProviderError::FallbackChainExhausted(vec![
            ProviderError::http(401),
            ProviderError::http(503),
        ]);
        assert_eq!(classify(&chain), FailureClass::ServerError);
        let chain = ProviderError::FallbackChainExhausted(vec![
            ProviderError::http(503),
            ProviderError::http(401),
        ]);
        assert_eq!(classify(&chain), FailureClass::Auth);
        let nested = ProviderError::FallbackChainExhausted(vec![
            ProviderError::http(500),
            ProviderError::FallbackChainExhausted(vec![
                ProviderError::CircuitOpen,
                ProviderError::http(429),
            ]),
        ]);
        assert_eq!(classify(&nested), FailureClass::RateLimit);
        assert_eq!(
            classify(&ProviderError::FallbackChainExhausted(vec![])),
            FailureClass::Unknown
        );
    }

    #[test]
    fn only_transient_classes_are_retryable() {
        let retryable: Vec<_> = FailureClass::ALL
            .into_iter()
            .filter(|c| c.is_retryable())
            .collect();
        assert_eq!(
            retryable,
            [
                FailureClass::CircuitOpen,
                FailureClass::Connection,
                FailureClass::RateLimit,
                FailureClass::ServerError
            ]
        );
    }

    #[test]
    fn names_round_trip() {
        for c in FailureClass::ALL {
            assert_eq!(c.as_str().parse::<FailureClass>().ok(), Some(c));
        }
    }
}
