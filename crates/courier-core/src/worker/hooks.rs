//! Listeners that act (Messenger's `WorkerMessageReceivedEvent`): a hook sees every received
//! message before it is handled, and may add stamps to it, skip it (ack or reject it without
//! handling: `shouldHandle(false)`), or ask the worker to stop once it is done (Messenger's
//! `StopWorkerOnCustomStopExceptionListener`; a handler can ask the same with
//! [`HandlerError::stop_worker`](crate::HandlerError::stop_worker)).
//!
//! ```
//! use courier_core::worker::{Received, Skip};
//! use courier_core::{HandlerError, InMemoryTransport, Message, MessageBus, Worker, PriorityStamp};
//! use serde::{Deserialize, Serialize};
//! use std::sync::Arc;
//!
//! #[derive(Serialize, Deserialize)]
//! struct Ping { n: u32 }
//! impl Message for Ping { const NAME: &'static str = "ping"; }
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! let queue = Arc::new(InMemoryTransport::new());
//! let bus = MessageBus::builder()
//!     .transport("async", queue.clone())
//!     .route("ping", ["async"])
//!     .handler_fn("ping", |_: Arc<Ping>| async { Ok::<(), HandlerError>(()) })
//!     .build();
//! for n in 0..3 {
//!     bus.dispatch(Ping { n }).await?;
//! }
//! let stats = Worker::builder(bus)
//!     .receiver("async", queue.clone())
//!     .on_received(|received: &mut Received<'_>| {
//!         let n = received.envelope().message::<Ping>().map_or(0, |p| p.n);
//!         match n {
//!             0 => received.add_stamp(PriorityStamp(9)),   // handled, with a stamp added
//!             1 => received.skip(Skip::Reject),            // not handled, rejected
//!             _ => received.stop_worker(),                 // handled, then the worker stops
//!         }
//!     })
//!     .build()
//!     .run(Default::default())
//!     .await?;
//! assert_eq!((stats.handled, stats.skipped), (2, 1));
//! assert_eq!(queue.rejected().len(), 1);
//! # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
//! ```

use std::sync::Arc;

use crate::{Envelope, Stamp};

/// What becomes of a message a hook decided not to handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Skip {
    /// Remove it as if it had been handled.
    Ack,
    /// Remove it without handling ([`Transport::reject`](crate::Transport::reject)).
    Reject,
}

/// A received message as a [`ReceivedHook`] sees it, before it is handled.
#[derive(Debug)]
pub struct Received<'a> {
    transport: &'a str,
    envelope: Envelope,
    skip: Option<Skip>,
    stop: bool,
}

impl<'a> Received<'a> {
    pub(crate) fn new(transport: &'a str, envelope: Envelope) -> Self {
        Self {
            transport,
            envelope,
            skip: None,
            stop: false,
        }
    }

    /// The transport it came from.
    #[must_use]
    pub fn transport(&self) -> &str {
        self.transport
    }

    /// The message with its stamps (including the ones added so far).
    #[must_use]
    pub fn envelope(&self) -> &Envelope {
        &self.envelope
    }

    /// Adds a stamp the handlers (and a retry or the failure transport) will see.
    pub fn add_stamp<S: Stamp>(&mut self, stamp: S) {
        self.envelope = self.envelope.clone().with(stamp);
    }

    /// Does not handle the message: acks or rejects it as `how` says.
    pub fn skip(&mut self, how: Skip) {
        self.skip = Some(how);
    }

    /// Stops the worker once this message is done (handled, or skipped), like a graceful
    /// shutdown: no new message starts, in-flight ones finish within the grace period.
    pub fn stop_worker(&mut self) {
        self.stop = true;
    }

    pub(crate) fn into_parts(self) -> (Envelope, Option<Skip>, bool) {
        (self.envelope, self.skip, self.stop)
    }
}

/// A hook called with every received message before it is handled (see [`Received`]); hooks
/// run in the order added.
pub type ReceivedHook = Arc<dyn Fn(&mut Received<'_>) + Send + Sync>;
