//! Error types: transport errors (with a retry answer), handler errors (with a retry intent) and
//! bus errors.

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

/// A boxed error, as carried in `source` fields.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What kind of transport failure happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TransportErrorKind {
    /// Could not reach the server, or the connection broke.
    Connection,
    /// The server did not answer in time.
    Timeout,
    /// The transport cannot do what was asked (e.g. a delay longer than it supports).
    Unsupported,
    /// Bad options or DSN.
    Config,
    /// The envelope could not be encoded.
    Encode,
    /// The server answered something unexpected (schema missing, protocol error, constraint).
    Protocol,
    /// No such message, table, queue or stream.
    NotFound,
    /// A handler failed while a synchronous transport handled the message in-process.
    Handler,
    /// Anything else.
    Other,
}

impl TransportErrorKind {
    /// Whether retrying the same operation later may succeed.
    #[must_use]
    pub fn is_transient(self) -> bool {
        match self {
            Self::Connection | Self::Timeout => true,
            Self::Unsupported
            | Self::Config
            | Self::Encode
            | Self::Protocol
            | Self::NotFound
            | Self::Handler
            | Self::Other => false,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::Connection => "connection failed",
            Self::Timeout => "timed out",
            Self::Unsupported => "unsupported",
            Self::Config => "invalid configuration",
            Self::Encode => "cannot encode",
            Self::Protocol => "protocol error",
            Self::NotFound => "not found",
            Self::Handler => "handler failed",
            Self::Other => "error",
        }
    }
}

impl fmt::Display for TransportErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A transport operation failed.
///
/// Carries the transport's name and a short context, never a message body or a password.
///
/// ```
/// use courier_core::{TransportError, TransportErrorKind};
///
/// let err = TransportError::new(TransportErrorKind::Unsupported, "async")
///     .with_context("delay of 40 days exceeds the maximum of 30 days");
/// assert_eq!(err.to_string(), "transport `async`: unsupported: delay of 40 days exceeds the maximum of 30 days");
/// assert!(!err.is_transient());
/// ```
#[derive(Debug)]
pub struct TransportError {
    kind: TransportErrorKind,
    transport: Cow<'static, str>,
    context: Option<Cow<'static, str>>,
    source: Option<BoxError>,
}

impl TransportError {
    /// An error of `kind` on the named transport.
    #[must_use]
    pub fn new(kind: TransportErrorKind, transport: impl Into<Cow<'static, str>>) -> Self {
        Self {
            kind,
            transport: transport.into(),
            context: None,
            source: None,
        }
    }

    /// Adds a short description of what was being done.
    #[must_use]
    pub fn with_context(mut self, context: impl Into<Cow<'static, str>>) -> Self {
        self.context = Some(context.into());
        self
    }

    /// Sets the underlying cause.
    #[must_use]
    pub fn with_source(mut self, source: impl Into<BoxError>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// The kind of failure.
    #[must_use]
    pub fn kind(&self) -> TransportErrorKind {
        self.kind
    }

    /// The transport's name.
    #[must_use]
    pub fn transport(&self) -> &str {
        &self.transport
    }

    /// The context, if any.
    #[must_use]
    pub fn context(&self) -> Option<&str> {
        self.context.as_deref()
    }

    /// Whether retrying later may succeed (see [`TransportErrorKind::is_transient`]).
    #[must_use]
    pub fn is_transient(&self) -> bool {
        self.kind.is_transient()
    }
}

impl fmt::Display for TransportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "transport `{}`: {}", self.transport, self.kind)?;
        if let Some(c) = &self.context {
            write!(f, ": {c}")?;
        }
        Ok(())
    }
}

impl std::error::Error for TransportError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// An error and its causes (its `source` chain) displayed on one line, `: `-separated, a cause
/// whose text the line already holds skipped: what a log line or a command's message shows, so
/// that "claiming messages" is followed by the driver's own words.
///
/// ```
/// use courier_core::{TransportError, TransportErrorKind, error_chain};
///
/// let io = std::io::Error::other("connection reset by peer");
/// let err = TransportError::new(TransportErrorKind::Connection, "async")
///     .with_context("claiming messages")
///     .with_source(io);
/// assert_eq!(
///     error_chain(&err).to_string(),
///     "transport `async`: connection failed: claiming messages: connection reset by peer"
/// );
/// ```
#[must_use]
pub fn error_chain<'e>(error: &'e (dyn std::error::Error + 'static)) -> ErrorChain<'e> {
    ErrorChain(error)
}

/// See [`error_chain`].
#[derive(Debug, Clone, Copy)]
pub struct ErrorChain<'e>(&'e (dyn std::error::Error + 'static));

impl fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut shown = self.0.to_string();
        let mut source = self.0.source();
        while let Some(cause) = source {
            let text = cause.to_string();
            if !shown.contains(&text) {
                shown.push_str(": ");
                shown.push_str(&text);
            }
            source = cause.source();
        }
        f.write_str(&shown)
    }
}

/// What a handler says about its failure, and so whether the worker retries.
///
/// Any `std::error::Error` converts into [`HandlerError::Other`] with `?`; use the
/// [`HandlerResultExt`] helpers to say more:
///
/// ```
/// use courier_core::{HandlerError, HandlerResultExt};
///
/// fn charge(card: &str) -> Result<(), HandlerError> {
///     let amount: u32 = "12".parse()?;                         // Other: retried per strategy
///     let _id: u32 = card.parse().unrecoverable()?;             // never retried
///     std::fs::metadata("/").recoverable()?;                    // always retried
///     let _ = amount;
///     Ok(())
/// }
/// assert!(matches!(charge("x"), Err(HandlerError::Unrecoverable(_))));
/// ```
///
/// `HandlerError` deliberately does not implement `std::error::Error` (like `anyhow::Error`), so
/// that the blanket conversion from every error type can exist.
#[non_exhaustive]
pub enum HandlerError {
    /// Never retry: the message goes straight to the failure transport.
    Unrecoverable(BoxError),
    /// Always retry (ignoring `max_retries`), after `retry_after` when given.
    Recoverable {
        /// The cause.
        source: BoxError,
        /// How long to wait before the retry; the strategy's delay when `None`.
        retry_after: Option<Duration>,
    },
    /// Retry according to the transport's retry strategy.
    Other(BoxError),
    /// The handler did not finish within its [`HandlerOptions::timeout`](crate::HandlerOptions::timeout):
    /// its future was dropped. Retried according to the transport's retry strategy, like
    /// [`HandlerError::Other`]; class `timeout`.
    Timeout(HandlerTimeout),
    /// The inner error, and the worker stops once this message is done (Messenger's
    /// `StopWorkerExceptionInterface`); the message is retried or moved as the inner error
    /// says. Made with [`HandlerError::stop_worker`].
    StopWorker(Box<HandlerError>),
}

impl HandlerError {
    /// This error, and stop the worker after this message (see [`HandlerError::StopWorker`]):
    ///
    /// ```
    /// use courier_core::HandlerError;
    /// let e = HandlerError::unrecoverable("the license expired").stop_worker();
    /// assert!(e.stops_worker());
    /// assert!(matches!(e.classifying(), HandlerError::Unrecoverable(_)));
    /// ```
    #[must_use]
    pub fn stop_worker(self) -> Self {
        match self {
            Self::StopWorker(_) => self,
            other => Self::StopWorker(Box::new(other)),
        }
    }

    /// Whether the worker should stop after this message.
    #[must_use]
    pub fn stops_worker(&self) -> bool {
        matches!(self, Self::StopWorker(_))
    }

    /// The error that decides the retry (the inner one of [`HandlerError::StopWorker`]).
    #[must_use]
    pub fn classifying(&self) -> &HandlerError {
        match self {
            Self::StopWorker(inner) => inner.classifying(),
            other => other,
        }
    }

    /// An unrecoverable error from a message.
    #[must_use]
    pub fn unrecoverable(msg: impl fmt::Display) -> Self {
        Self::Unrecoverable(msg.to_string().into())
    }

    /// A recoverable error from a message, retried after `retry_after` when given.
    #[must_use]
    pub fn recoverable(msg: impl fmt::Display, retry_after: Option<Duration>) -> Self {
        Self::Recoverable {
            source: msg.to_string().into(),
            retry_after,
        }
    }

    /// A plain error from a message.
    #[must_use]
    pub fn msg(msg: impl fmt::Display) -> Self {
        Self::Other(msg.to_string().into())
    }

    /// The underlying error.
    #[must_use]
    pub fn source_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        match self {
            Self::Unrecoverable(e) | Self::Recoverable { source: e, .. } | Self::Other(e) => {
                e.as_ref()
            }
            Self::Timeout(e) => e,
            Self::StopWorker(inner) => inner.source_error(),
        }
    }

    /// A short class name for [`ErrorDetailsStamp`](crate::ErrorDetailsStamp) and logs.
    #[must_use]
    pub fn class(&self) -> &'static str {
        match self {
            Self::Unrecoverable(_) => "unrecoverable",
            Self::Recoverable { .. } => "recoverable",
            Self::Other(_) => "error",
            Self::Timeout(_) => "timeout",
            Self::StopWorker(inner) => inner.class(),
        }
    }
}

impl fmt::Debug for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unrecoverable(e) => f.debug_tuple("Unrecoverable").field(e).finish(),
            Self::Recoverable {
                source,
                retry_after,
            } => f
                .debug_struct("Recoverable")
                .field("source", source)
                .field("retry_after", retry_after)
                .finish(),
            Self::Other(e) => f.debug_tuple("Other").field(e).finish(),
            Self::Timeout(e) => f.debug_tuple("Timeout").field(e).finish(),
            Self::StopWorker(inner) => f.debug_tuple("StopWorker").field(inner).finish(),
        }
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self.source_error(), f)
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for HandlerError {
    fn from(e: E) -> Self {
        Self::Other(Box::new(e))
    }
}

/// A handler, or the whole handling of a received message, ran past its timeout and its future
/// was dropped ([`HandlerError::Timeout`], [`BusError::Timeout`](crate::BusError::Timeout)).
///
/// ```
/// use courier_core::HandlerTimeout;
/// use std::time::Duration;
///
/// let e = HandlerTimeout::new(Duration::from_secs(30));
/// assert_eq!(e.to_string(), "did not finish within 30s");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("did not finish within {}", humantime::format_duration(*.after))]
#[non_exhaustive]
pub struct HandlerTimeout {
    /// The timeout that ran out.
    pub after: Duration,
}

impl HandlerTimeout {
    /// The timeout `after` ran out.
    #[must_use]
    pub fn new(after: Duration) -> Self {
        Self { after }
    }
}

/// `.unrecoverable()?` and `.recoverable()?` on any `Result` whose error converts to [`BoxError`].
pub trait HandlerResultExt<T> {
    /// Marks the error as never worth retrying.
    ///
    /// # Errors
    /// [`HandlerError::Unrecoverable`] with the original error.
    fn unrecoverable(self) -> Result<T, HandlerError>;
    /// Marks the error as always worth retrying (after the strategy's delay).
    ///
    /// # Errors
    /// [`HandlerError::Recoverable`] with the original error.
    fn recoverable(self) -> Result<T, HandlerError>;
    /// Marks the error as worth retrying after `delay`.
    ///
    /// # Errors
    /// [`HandlerError::Recoverable`] with the original error and `retry_after`.
    fn retry_after(self, delay: Duration) -> Result<T, HandlerError>;
}

impl<T, E: Into<BoxError>> HandlerResultExt<T> for Result<T, E> {
    fn unrecoverable(self) -> Result<T, HandlerError> {
        self.map_err(|e| HandlerError::Unrecoverable(e.into()))
    }
    fn recoverable(self) -> Result<T, HandlerError> {
        self.map_err(|e| HandlerError::Recoverable {
            source: e.into(),
            retry_after: None,
        })
    }
    fn retry_after(self, delay: Duration) -> Result<T, HandlerError> {
        self.map_err(|e| HandlerError::Recoverable {
            source: e.into(),
            retry_after: Some(delay),
        })
    }
}
