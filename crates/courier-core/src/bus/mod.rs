//! The message bus: dispatch through middleware to transports or handlers.

mod batch;
mod builder;
mod dedup;
mod error;
mod handler;
mod link;
pub(crate) mod middleware;
mod query;
mod routing;
mod sending;

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

pub use batch::{BatchHandler, BatchItem, BatchOptions};
pub use builder::MessageBusBuilder;
pub use error::{BusError, HandlerFailure, QueryError};
pub use handler::{Handler, HandlerOptions};
pub use link::{BusLink, Dispatcher};
pub use middleware::{Middleware, Next, with_trace_context};
pub use query::{HandledResultStamp, QueryHandler};
pub use routing::Router;
pub use sending::{SendHook, Sending};

use handler::HandlerEntry;

use crate::stamp::AnyStamp;
use crate::{Envelope, Message, MessageRegistry, Transport};

/// The default bus name.
pub const DEFAULT_BUS: &str = "default";

pub(crate) struct BusInner {
    name: String,
    /// The bus's [`BusNameStamp`](crate::BusNameStamp), shared by every envelope it stamps.
    name_stamp: Arc<dyn AnyStamp>,
    chain: Vec<Arc<dyn Middleware>>,
    handlers: HashMap<String, Vec<HandlerEntry>>,
    transports: HashMap<String, Arc<dyn Transport>>,
    router: Router,
    registry: Arc<MessageRegistry>,
    on_send: Vec<SendHook>,
    allow_no_handlers: bool,
    dedup_store: Option<dedup::Store>,
    batchers: Vec<Arc<dyn batch::Flush>>,
}

/// A message bus (Symfony's `MessageBusInterface`): routes each message to its transports, or
/// handles it in-process with every handler registered for it.
///
/// ```
/// use courier_core::{Envelope, HandlerError, InMemoryTransport, Message, MessageBus};
/// use serde::{Deserialize, Serialize};
/// use std::sync::Arc;
///
/// #[derive(Serialize, Deserialize)]
/// struct Welcome { user: String }
/// impl Message for Welcome { const NAME: &'static str = "mail.welcome"; }
///
/// #[derive(Serialize, Deserialize)]
/// struct Audit;
/// impl Message for Audit { const NAME: &'static str = "app.audit"; }
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let queue = InMemoryTransport::new();
/// let bus = MessageBus::builder()
///     .transport("async", Arc::new(queue.clone()))
///     .route("mail.*", ["async"])
///     .handler_fn("audit", |_: Arc<Audit>| async { Ok::<(), HandlerError>(()) })
///     .build();
///
/// bus.dispatch(Welcome { user: "ada".into() }).await?;   // routed: sent, not handled
/// bus.dispatch(Audit).await?;                            // not routed: handled now
/// assert_eq!(queue.sent().len(), 1);
/// # Ok::<(), courier_core::BusError>(()) }).unwrap();
/// ```
#[derive(Clone)]
pub struct MessageBus {
    pub(crate) inner: Arc<BusInner>,
}

impl fmt::Debug for MessageBus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut transports: Vec<_> = self.inner.transports.keys().collect();
        transports.sort();
        f.debug_struct("MessageBus")
            .field("name", &self.inner.name)
            .field("transports", &transports)
            .field("router", &self.inner.router)
            .finish_non_exhaustive()
    }
}

impl MessageBus {
    /// Starts building a bus.
    #[must_use]
    pub fn builder() -> MessageBusBuilder {
        MessageBusBuilder::default()
    }

    /// Dispatches a message or an envelope through the middleware chain.
    ///
    /// # Errors
    /// [`BusError`]: no handler, handler failures (all of them, in one error), send failures.
    pub async fn dispatch(&self, message: impl Into<Envelope>) -> Result<Envelope, BusError> {
        Next {
            chain: &self.inner.chain,
            bus: self,
        }
        .run(message.into())
        .await
    }

    /// Runs the chain as [`dispatch`](Self::dispatch) does, up to the send, and returns what it
    /// would send instead of sending it: each envelope with its transport's name, routed and
    /// stamped (bus name, [`MessageIdStamp`](crate::MessageIdStamp), trace context, `on_send`
    /// hooks, [`SentStamp`](crate::SentStamp)), for a caller that writes them itself, in its
    /// own database transaction (`courier_sql::dispatch_in`). Messages stamped
    /// [`DispatchAfterCurrentBusStamp`](crate::DispatchAfterCurrentBusStamp) are collected too.
    /// Deduplication keys ([`DeduplicateStamp`](crate::DeduplicateStamp)) of transports that
    /// take them in their send ([`Deduplicate::takes_keys_on_send`](crate::Deduplicate::takes_keys_on_send),
    /// SQL) are left to the write: the envelopes keep the stamp, and `dispatch_in` takes each
    /// key in the caller's transaction, so a rolled-back transaction leaves it free. Other
    /// stores' keys are taken now: they stay taken if the caller never writes the message.
    ///
    /// ```
    /// use courier_core::{InMemoryTransport, Message, MessageBus, MessageIdStamp};
    /// use serde::{Deserialize, Serialize};
    /// use std::sync::Arc;
    ///
    /// #[derive(Serialize, Deserialize)]
    /// struct Placed { order: u32 }
    /// impl Message for Placed { const NAME: &'static str = "orders.placed"; }
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let queue = InMemoryTransport::new();
    /// let bus = MessageBus::builder()
    ///     .transport("outbox", Arc::new(queue.clone()))
    ///     .route("orders.*", ["outbox"])
    ///     .build();
    /// let prepared = bus.prepare(Placed { order: 7 }).await?;
    /// assert_eq!(prepared.sends.len(), 1);
    /// assert_eq!(prepared.sends[0].0, "outbox");
    /// assert!(prepared.sends[0].1.has::<MessageIdStamp>());
    /// assert!(queue.sent().is_empty());                  // nothing was sent
    /// # Ok::<(), courier_core::BusError>(()) }).unwrap();
    /// ```
    ///
    /// # Errors
    /// [`BusError::NotRouted`] when the message goes to no transport (it would be handled here,
    /// outside the caller's transaction), [`BusError::UnknownTransport`], and what middleware
    /// returns.
    pub async fn prepare(&self, message: impl Into<Envelope>) -> Result<Prepared, BusError> {
        let (result, sends) = middleware::collecting_sends(self.dispatch(message)).await;
        Ok(Prepared {
            envelope: result?,
            sends,
        })
    }

    /// Dispatches a query and returns the answer of the one handler that handled it (Symfony's
    /// `HandleTrait::handle`): see [`QueryHandler`].
    ///
    /// # Errors
    /// What [`dispatch`](Self::dispatch) returns, or [`BusError::Query`] when the message was
    /// sent to a transport instead, several handlers handled it, none answered, or the answer
    /// is not an `R`.
    pub async fn query<R: Send + 'static>(
        &self,
        message: impl Into<Envelope>,
    ) -> Result<R, BusError> {
        let envelope = self.dispatch(message).await?;
        query::result_of::<R>(&envelope).map_err(|reason| BusError::Query {
            name: envelope.message_name().to_owned(),
            reason,
        })
    }

    /// The bus's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// A transport the bus sends to, by name.
    #[must_use]
    pub fn transport(&self, name: &str) -> Option<&Arc<dyn Transport>> {
        self.inner.transports.get(name)
    }

    /// Every transport, by name.
    pub fn transports(&self) -> impl Iterator<Item = (&str, &Arc<dyn Transport>)> + '_ {
        self.inner.transports.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// The router.
    #[must_use]
    pub fn router(&self) -> &Router {
        &self.inner.router
    }

    /// The messages this bus knows (registered explicitly or through handlers).
    #[must_use]
    pub fn registry(&self) -> &Arc<MessageRegistry> {
        &self.inner.registry
    }

    /// The bus handling the current message, inside a handler (`None` elsewhere). A handler
    /// dispatches follow-up messages on it without holding its bus.
    #[must_use]
    pub fn current() -> Option<MessageBus> {
        middleware::current_bus()
    }

    /// Whether a handler is registered for the wire name.
    #[must_use]
    pub fn has_handler(&self, name: &str) -> bool {
        self.inner.handlers.get(name).is_some_and(|h| !h.is_empty())
    }

    /// The largest batch of the [`BatchHandler`]s of the wire name, if it has any: the worker
    /// lets so many of its messages be in flight together.
    #[must_use]
    pub fn batch_size(&self, name: &str) -> Option<usize> {
        self.inner
            .handlers
            .get(name)?
            .iter()
            .filter_map(|e| e.batch_size)
            .max()
    }

    /// The largest batch of any [`BatchHandler`] of this bus (`None`: it has none).
    #[must_use]
    pub fn largest_batch(&self) -> Option<usize> {
        self.inner
            .handlers
            .values()
            .flatten()
            .filter_map(|e| e.batch_size)
            .max()
    }

    /// Runs every batch being gathered now rather than after its wait (the worker does this
    /// when it stops, so partial batches are handled within the grace period).
    pub fn flush_batches(&self) {
        for b in &self.inner.batchers {
            b.flush();
        }
    }
}

/// What [`MessageBus::prepare`] returns: the envelope [`dispatch`](MessageBus::dispatch) would
/// return (its [`SentStamp`](crate::SentStamp)s, no transport ids yet) and what it would send.
#[derive(Debug)]
#[non_exhaustive]
pub struct Prepared {
    /// The dispatched envelope, as `dispatch` would return it without the transports' ids.
    pub envelope: Envelope,
    /// Each envelope to send with its transport's name, in dispatch order.
    pub sends: Vec<(String, Envelope)>,
}

impl<M: Message> From<M> for Envelope {
    fn from(message: M) -> Self {
        Envelope::new(message)
    }
}
