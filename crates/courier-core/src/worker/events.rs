//! Worker events and statistics.

use std::sync::Arc;
use std::time::Duration;

/// What a worker reports to its listeners (and to tracing).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum WorkerEvent {
    /// The worker started consuming these transports.
    Started {
        /// Receiver names, in priority order.
        transports: Vec<String>,
    },
    /// A message was received.
    Received {
        /// The transport it came from.
        transport: String,
        /// Its wire name.
        message: String,
        /// Its transport id.
        id: Option<String>,
    },
    /// A [`Received`](super::Received) hook told the worker not to handle a message.
    Skipped {
        /// The transport it came from.
        transport: String,
        /// Its wire name.
        message: String,
        /// Its transport id.
        id: Option<String>,
        /// Acked or rejected.
        how: super::Skip,
    },
    /// A message was handled successfully.
    Handled {
        /// The transport it came from.
        transport: String,
        /// Its wire name.
        message: String,
        /// Its transport id.
        id: Option<String>,
        /// How long handling took.
        elapsed: Duration,
    },
    /// Handling failed.
    Failed {
        /// The transport it came from.
        transport: String,
        /// Its wire name.
        message: String,
        /// Its transport id.
        id: Option<String>,
        /// The error, displayed.
        error: String,
        /// Whether it will be retried.
        will_retry: bool,
    },
    /// A failed message was put back for another attempt.
    Retried {
        /// The transport.
        transport: String,
        /// Its transport id.
        id: Option<String>,
        /// The retry number (1 for the first retry).
        retry_count: u32,
        /// The delay before the retry.
        delay: Duration,
    },
    /// A failed message was moved to a failure transport.
    MovedToFailureTransport {
        /// The transport it failed on.
        transport: String,
        /// The failure transport.
        failure_transport: String,
        /// Its transport id on the original transport.
        id: Option<String>,
    },
    /// A message could not be acked, retried or moved; it stays on its transport and will be
    /// delivered again.
    LeftForRedelivery {
        /// The transport.
        transport: String,
        /// Its transport id.
        id: Option<String>,
        /// Why.
        reason: String,
    },
    /// A transport operation failed (the worker keeps going, backing off on transient errors).
    TransportError {
        /// The transport.
        transport: String,
        /// The error, displayed.
        error: String,
    },
    /// No transport had a message.
    Idle,
    /// The worker stopped.
    Stopped {
        /// Why.
        reason: StopReason,
    },
}

/// Why a worker stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StopReason {
    /// Shutdown was requested (signal, `stop-workers`, cancellation token).
    Shutdown,
    /// `limit` messages were handled.
    MessageLimit,
    /// `failure_limit` messages failed.
    FailureLimit,
    /// `time_limit` passed.
    TimeLimit,
    /// The process used more than `memory_limit`.
    MemoryLimit,
    /// A [`Received`](super::Received) hook or a handler
    /// ([`HandlerError::stop_worker`](crate::HandlerError::stop_worker)) asked the worker to
    /// stop after a message.
    StopRequested,
}

/// A listener for worker events.
pub type Listener = Arc<dyn Fn(&WorkerEvent) + Send + Sync>;

/// What a worker did, returned by [`Worker::run`](super::Worker::run).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerStats {
    /// Messages received.
    pub received: u64,
    /// Messages handled successfully (and acked).
    pub handled: u64,
    /// Messages whose handling failed (retried, moved or left).
    pub failed: u64,
    /// Failed messages put back for a retry.
    pub retried: u64,
    /// Messages a [`Received`](super::Received) hook told the worker not to handle (acked or
    /// rejected without handling).
    pub skipped: u64,
    /// Failed messages moved to a failure transport.
    pub moved_to_failure: u64,
    /// Messages left on their transport for redelivery (a move or ack failed, or shutdown).
    pub left_for_redelivery: u64,
    /// Fetched messages that were never started and were put back on their transport when the
    /// worker stopped.
    pub released: u64,
    /// Why the worker stopped.
    pub stop_reason: Option<StopReason>,
}
