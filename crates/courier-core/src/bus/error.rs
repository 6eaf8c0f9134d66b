//! Why a dispatch failed: [`BusError`], with each handler's failure and a query's missing
//! answer.

use crate::{BoxError, HandlerError, HandlerTimeout, TransportError};

/// Why [`MessageBus::query`](crate::MessageBus::query) has no single result to return.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QueryError {
    /// The message was routed to transports: sent, not handled here.
    #[error("sent to transport(s) {} instead of being handled", transports.join(", "))]
    SentToTransport {
        /// The transports it went to.
        transports: Vec<String>,
    },
    /// No handler that answers handled it (only handlers without a result did).
    #[error("no query handler answered (handled by: {})", if handlers.is_empty() { "none".to_owned() } else { handlers.join(", ") })]
    NoResult {
        /// The handlers that handled it without a result.
        handlers: Vec<String>,
    },
    /// Several handlers handled it: which result is meant is not clear.
    #[error("handled by {} handlers ({}), a query needs exactly one", handlers.len(), handlers.join(", "))]
    SeveralHandlers {
        /// Their names.
        handlers: Vec<String>,
    },
    /// The handler answered with another type than the one asked for.
    #[error("handler `{handler}` does not answer with `{expected}`")]
    WrongType {
        /// The handler's name.
        handler: String,
        /// The type asked for.
        expected: &'static str,
    },
}

/// One handler's failure inside [`BusError::HandlerFailed`].
#[derive(Debug)]
pub struct HandlerFailure {
    /// The handler's name.
    pub handler: String,
    /// What it returned.
    pub error: HandlerError,
}

/// Dispatching on a bus failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BusError {
    /// One or more handlers failed. `envelope` carries a [`HandledStamp`](crate::HandledStamp)
    /// for each handler that succeeded, so a retry skips them.
    #[error("{} handler(s) failed for `{}`: {}", failures.len(), envelope.message_name(), first_failure(failures))]
    HandlerFailed {
        /// The envelope after handling, with the successful handlers' stamps.
        envelope: Box<crate::Envelope>,
        /// Each failure, in handler order.
        failures: Vec<HandlerFailure>,
    },
    /// No handler and no transport for the message.
    #[error("no handler and no transport for message `{name}`")]
    NoHandler {
        /// The wire name.
        name: String,
    },
    /// Sending to a transport failed.
    #[error("could not send `{name}`")]
    Send {
        /// The wire name.
        name: String,
        /// The transport error.
        #[source]
        source: TransportError,
    },
    /// Routing or a `TransportNamesStamp` names a transport the bus does not have.
    #[error("unknown transport `{transport}` for message `{name}`")]
    UnknownTransport {
        /// The transport name.
        transport: String,
        /// The wire name.
        name: String,
    },
    /// [`MessageBus::prepare`](crate::MessageBus::prepare) (a dispatch inside a database
    /// transaction) was given a message routed to no transport.
    #[error(
        "message `{name}` is routed to no transport: only a routed message can be written in a transaction"
    )]
    NotRouted {
        /// The wire name.
        name: String,
    },
    /// The envelope holds a message that could not be decoded.
    #[error("cannot handle an undecodable message")]
    Undecodable(#[source] std::sync::Arc<crate::DecodeError>),
    /// A middleware failed.
    #[error("middleware failed")]
    Middleware(#[source] BoxError),
    /// A message of a signed type is unsigned, signed with an unknown key, or changed since it
    /// was signed (see [`signing`](crate::signing)). Never retried: it goes straight to the
    /// failure transport.
    #[error("signature check failed for `{name}`")]
    Signature {
        /// The wire name.
        name: String,
        /// Why.
        #[source]
        reason: crate::signing::SignatureError,
    },
    /// A worker's handling of a received message ran past its transport's handler timeout
    /// ([`WorkerBuilder::handler_timeout`](crate::WorkerBuilder::handler_timeout),
    /// `[transports.NAME] handler_timeout`): the dispatch's future was dropped, handlers and
    /// middleware with it. Retried according to the transport's retry strategy; class
    /// `timeout`.
    #[error("handling `{name}` {timeout}")]
    Timeout {
        /// The wire name.
        name: String,
        /// The timeout that ran out.
        timeout: HandlerTimeout,
    },
    /// [`MessageBus::query`](crate::MessageBus::query) found no single answer.
    #[error("query `{name}` has no single answer")]
    Query {
        /// The wire name.
        name: String,
        /// Why.
        #[source]
        reason: crate::QueryError,
    },
}

fn first_failure(failures: &[HandlerFailure]) -> String {
    failures
        .first()
        .map(|f| format!("`{}`: {}", f.handler, f.error))
        .unwrap_or_default()
}

impl BusError {
    /// A short class name for [`ErrorDetailsStamp`](crate::ErrorDetailsStamp) and logs: the
    /// first handler failure's class, `no_handler`, `decode`, `send`, `timeout` or `error`.
    #[must_use]
    pub fn class(&self) -> &'static str {
        match self {
            Self::HandlerFailed { failures, .. } => {
                failures.first().map_or("error", |f| f.error.class())
            }
            Self::NoHandler { .. } => "no_handler",
            Self::Undecodable(_) => "decode",
            Self::Send { .. } | Self::UnknownTransport { .. } | Self::NotRouted { .. } => "send",
            Self::Middleware(_) => "error",
            Self::Query { .. } => "query",
            Self::Signature { .. } => "signature",
            Self::Timeout { .. } => "timeout",
        }
    }

    /// The handler failures, including those of a synchronous transport nested in a send error.
    #[must_use]
    pub fn handler_failures(&self) -> &[HandlerFailure] {
        match self {
            Self::HandlerFailed { failures, .. } => failures,
            Self::Send { source, .. } => std::error::Error::source(source)
                .and_then(|e| e.downcast_ref::<BusError>())
                .map(BusError::handler_failures)
                .unwrap_or(&[]),
            _ => &[],
        }
    }
}
