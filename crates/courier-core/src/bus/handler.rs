//! Handlers: what runs when a message is handled in-process.

use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::{Envelope, HandlerError, Message};

/// Handles messages of type `M`.
///
/// ```
/// use courier_core::{Envelope, Handler, HandlerError, Message};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)]
/// struct Welcome { user: String }
/// impl Message for Welcome { const NAME: &'static str = "mail.welcome"; }
///
/// struct SendWelcome;
///
/// #[async_trait::async_trait]
/// impl Handler<Welcome> for SendWelcome {
///     async fn handle(&self, message: &Welcome, _envelope: &Envelope) -> Result<(), HandlerError> {
///         if message.user.is_empty() {
///             return Err(HandlerError::unrecoverable("empty user"));
///         }
///         Ok(())
///     }
/// }
/// ```
#[async_trait]
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot handle `{M}`",
    note = "implement `courier::Handler<{M}>` (with `#[async_trait]`) for `{Self}`, or use `handler_fn` with a closure"
)]
pub trait Handler<M: Message>: Send + Sync + 'static {
    /// Handles one message; the envelope gives access to its stamps.
    async fn handle(&self, message: &M, envelope: &Envelope) -> Result<(), HandlerError>;
}

#[async_trait]
pub(crate) trait ErasedHandler: Send + Sync {
    /// Handles the envelope; a query handler's answer comes back boxed.
    async fn call(
        &self,
        envelope: &Envelope,
    ) -> Result<Option<Box<dyn std::any::Any + Send>>, HandlerError>;
}

pub(crate) struct Typed<M, H> {
    handler: H,
    _message: PhantomData<fn(M)>,
}

impl<M, H> Typed<M, H> {
    pub(crate) fn new(handler: H) -> Self {
        Self {
            handler,
            _message: PhantomData,
        }
    }
}

#[async_trait]
impl<M: Message, H: Handler<M>> ErasedHandler for Typed<M, H> {
    async fn call(
        &self,
        envelope: &Envelope,
    ) -> Result<Option<Box<dyn std::any::Any + Send>>, HandlerError> {
        let message = envelope.message::<M>().ok_or_else(|| {
            HandlerError::unrecoverable(format!(
                "envelope holds `{}`, not `{}`",
                envelope.message_name(),
                M::NAME
            ))
        })?;
        self.handler.handle(message, envelope).await.map(|()| None)
    }
}

/// A closure handler: `Fn(Arc<M>) -> impl Future<Output = Result<(), HandlerError>>`.
pub(crate) struct FnHandler<F>(pub(crate) F);

#[async_trait]
impl<M, F, Fut> Handler<M> for FnHandler<F>
where
    M: Message,
    F: Fn(Arc<M>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    async fn handle(&self, _message: &M, envelope: &Envelope) -> Result<(), HandlerError> {
        let message = envelope.message_arc::<M>().ok_or_else(|| {
            HandlerError::unrecoverable(format!("envelope does not hold `{}`", M::NAME))
        })?;
        (self.0)(message).await
    }
}

/// How a handler is registered (Messenger's `#[AsMessageHandler]` options): its name, the
/// transport it handles messages from, and its priority.
///
/// ```
/// use courier_core::{HandlerError, HandlerOptions, Message, MessageBus};
/// use serde::{Deserialize, Serialize};
/// use std::sync::Arc;
///
/// #[derive(Serialize, Deserialize)]
/// struct Ordered { id: u32 }
/// impl Message for Ordered { const NAME: &'static str = "orders.placed"; }
///
/// let bus = MessageBus::builder()
///     // Runs first (higher priority), for every message of the type.
///     .handler_fn_with(HandlerOptions::new("audit").priority(10), |_: Arc<Ordered>| async {
///         Ok::<(), HandlerError>(())
///     })
///     // Runs only for messages a worker received from the `orders` transport.
///     .handler_fn_with(HandlerOptions::new("ship").from_transport("orders"), |_: Arc<Ordered>| async {
///         Ok::<(), HandlerError>(())
///     })
///     .build();
/// # let _ = bus;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HandlerOptions {
    /// The handler's name, recorded in [`HandledStamp`](crate::HandledStamp): keep it stable
    /// across deployments.
    pub name: String,
    /// Handle only messages received from this transport (a worker's
    /// [`ReceivedStamp`](crate::ReceivedStamp)); messages dispatched in-process and those
    /// received elsewhere skip this handler.
    pub from_transport: Option<String>,
    /// Handlers of one message run highest priority first (default 0; equal priorities in the
    /// order registered).
    pub priority: i32,
    /// How long one call of the handler may run (default: no limit, as in Symfony). Past it
    /// the handler's future is dropped (it stops at its next `.await`; blocking code it runs
    /// on the thread is not interrupted) and it fails with [`HandlerError::Timeout`], class
    /// `timeout`: a worker retries the message as its retry strategy says (the handlers that
    /// succeeded keep their [`HandledStamp`](crate::HandledStamp) and are skipped), an
    /// in-process dispatch returns the failure. For a batch handler it bounds a message's wait
    /// for its batch's result; the batch itself runs on. To bound everything a worker does for
    /// a message (middleware included), set the transport's
    /// [`WorkerBuilder::handler_timeout`](crate::WorkerBuilder::handler_timeout) instead.
    pub timeout: Option<Duration>,
}

impl HandlerOptions {
    /// Options for a handler named `name`: every transport, priority 0.
    #[must_use]
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            from_transport: None,
            priority: 0,
            timeout: None,
        }
    }

    /// Sets [`HandlerOptions::from_transport`].
    #[must_use]
    pub fn from_transport(mut self, transport: impl Into<String>) -> Self {
        self.from_transport = Some(transport.into());
        self
    }

    /// Sets [`HandlerOptions::priority`].
    #[must_use]
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// Sets [`HandlerOptions::timeout`].
    ///
    /// ```
    /// use courier_core::HandlerOptions;
    /// use std::time::Duration;
    ///
    /// let options = HandlerOptions::new("render_pdf").timeout(Duration::from_secs(30));
    /// assert_eq!(options.timeout, Some(Duration::from_secs(30)));
    /// ```
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }
}

pub(crate) struct HandlerEntry {
    pub(crate) name: Arc<str>,
    /// Only for messages received from this transport.
    pub(crate) from_transport: Option<Arc<str>>,
    /// Higher runs first.
    pub(crate) priority: i32,
    /// How long one call may run ([`HandlerOptions::timeout`]).
    pub(crate) timeout: Option<Duration>,
    /// The [`HandledStamp`](crate::HandledStamp) added on success, shared by every envelope.
    pub(crate) handled: Arc<dyn crate::stamp::AnyStamp>,
    pub(crate) handler: Arc<dyn ErasedHandler>,
    /// A batch handler's largest batch (its messages are in flight together).
    pub(crate) batch_size: Option<usize>,
}
