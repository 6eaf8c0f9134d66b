//! Query handlers: a handler that returns a value, and the bus call that reads it back
//! (Symfony's `HandleTrait` and `HandledStamp::getResult`).

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use super::error::QueryError;
use super::handler::ErasedHandler;
use crate::{Envelope, HandlerError, Message, Stamp};

/// Handles messages of type `M` and answers with an [`Output`](QueryHandler::Output): what
/// [`MessageBus::query`](crate::MessageBus::query) returns.
///
/// Register it with [`MessageBusBuilder::query_handler`](crate::MessageBusBuilder::query_handler)
/// (or a closure with [`query_fn`](crate::MessageBusBuilder::query_fn)). Dispatched with
/// [`MessageBus::dispatch`](crate::MessageBus::dispatch), or consumed by a worker, it is an
/// ordinary handler whose result is dropped.
///
/// ```
/// use courier_core::{Envelope, HandlerError, Message, MessageBus, QueryHandler};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)]
/// struct GetPrice { sku: String }
/// impl Message for GetPrice { const NAME: &'static str = "shop.get_price"; }
///
/// struct Prices;
///
/// #[async_trait::async_trait]
/// impl QueryHandler<GetPrice> for Prices {
///     type Output = u32;
///     async fn handle(&self, query: &GetPrice, _: &Envelope) -> Result<u32, HandlerError> {
///         Ok(if query.sku == "tea" { 450 } else { 0 })
///     }
/// }
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let bus = MessageBus::builder().query_handler::<GetPrice, _>(Prices).build();
/// let price: u32 = bus.query(GetPrice { sku: "tea".into() }).await?;
/// assert_eq!(price, 450);
/// # Ok::<(), courier_core::BusError>(()) }).unwrap();
/// ```
#[async_trait]
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot answer `{M}`",
    note = "implement `courier::QueryHandler<{M}>` (with `#[async_trait]`) for `{Self}`, or use `query_fn` with a closure"
)]
pub trait QueryHandler<M: Message>: Send + Sync + 'static {
    /// What the handler answers.
    type Output: Send + 'static;

    /// Handles one message and answers it.
    async fn handle(&self, message: &M, envelope: &Envelope) -> Result<Self::Output, HandlerError>;
}

/// A handler's result, carried back to [`MessageBus::query`](crate::MessageBus::query) on the
/// envelope the dispatch returns (Symfony's `HandledStamp::getResult`). Local: never sent; the
/// value is taken out once, by [`HandledResultStamp::take`].
#[derive(Clone)]
pub struct HandledResultStamp {
    /// The handler's name (as in its [`HandledStamp`](crate::HandledStamp)).
    pub handler: String,
    result: Arc<Mutex<Option<Box<dyn Any + Send>>>>,
}

impl HandledResultStamp {
    pub(crate) fn new(handler: &str, result: Box<dyn Any + Send>) -> Self {
        Self {
            handler: handler.to_owned(),
            result: Arc::new(Mutex::new(Some(result))),
        }
    }

    /// Takes the result out if it is an `R` (`Err(())` when it is not, left in place; `Ok(None)`
    /// when it was taken already).
    ///
    /// # Errors
    /// `Err(())` when the result is of another type.
    #[allow(
        clippy::result_unit_err,
        reason = "the caller names the error with its context"
    )]
    pub fn take<R: 'static>(&self) -> Result<Option<R>, ()> {
        let mut slot = self
            .result
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match slot.take() {
            None => Ok(None),
            Some(boxed) => match boxed.downcast::<R>() {
                Ok(r) => Ok(Some(*r)),
                Err(other) => {
                    *slot = Some(other);
                    Err(())
                }
            },
        }
    }
}

impl fmt::Debug for HandledResultStamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandledResultStamp")
            .field("handler", &self.handler)
            .finish_non_exhaustive()
    }
}

impl serde::Serialize for HandledResultStamp {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // Local: never on the wire; only its handler's name is printable.
        s.serialize_str(&self.handler)
    }
}

impl<'de> serde::Deserialize<'de> for HandledResultStamp {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let handler = String::deserialize(d)?;
        Ok(Self {
            handler,
            result: Arc::new(Mutex::new(None)),
        })
    }
}

impl Stamp for HandledResultStamp {
    const NAME: &'static str = "handled-result";
    const SENDABLE: bool = false;
}

pub(crate) struct QueryTyped<M, H> {
    handler: H,
    _message: PhantomData<fn(M)>,
}

impl<M, H> QueryTyped<M, H> {
    pub(crate) fn new(handler: H) -> Self {
        Self {
            handler,
            _message: PhantomData,
        }
    }
}

#[async_trait]
impl<M: Message, H: QueryHandler<M>> ErasedHandler for QueryTyped<M, H> {
    async fn call(&self, envelope: &Envelope) -> Result<Option<Box<dyn Any + Send>>, HandlerError> {
        let message = envelope.message::<M>().ok_or_else(|| {
            HandlerError::unrecoverable(format!(
                "envelope holds `{}`, not `{}`",
                envelope.message_name(),
                M::NAME
            ))
        })?;
        let output = self.handler.handle(message, envelope).await?;
        Ok(Some(Box::new(output)))
    }
}

/// A closure query handler: `Fn(Arc<M>) -> impl Future<Output = Result<R, HandlerError>>`.
pub(crate) struct FnQueryHandler<F, R>(pub(crate) F, pub(crate) PhantomData<fn() -> R>);

#[async_trait]
impl<M, F, Fut, R> QueryHandler<M> for FnQueryHandler<F, R>
where
    M: Message,
    F: Fn(Arc<M>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<R, HandlerError>> + Send + 'static,
    R: Send + 'static,
{
    type Output = R;

    async fn handle(&self, _message: &M, envelope: &Envelope) -> Result<R, HandlerError> {
        let message = envelope.message_arc::<M>().ok_or_else(|| {
            HandlerError::unrecoverable(format!("envelope does not hold `{}`", M::NAME))
        })?;
        (self.0)(message).await
    }
}

/// Reads the one result of a dispatched query.
pub(crate) fn result_of<R: 'static>(envelope: &Envelope) -> Result<R, QueryError> {
    let sent: Vec<String> = envelope
        .all::<crate::SentStamp>()
        .map(|s| s.transport.clone())
        .collect();
    if !sent.is_empty() {
        return Err(QueryError::SentToTransport { transports: sent });
    }
    let handlers: Vec<String> = envelope
        .all::<crate::HandledStamp>()
        .map(|h| h.handler.clone())
        .collect();
    if handlers.len() > 1 {
        return Err(QueryError::SeveralHandlers { handlers });
    }
    let Some(stamp) = envelope.last::<HandledResultStamp>() else {
        return Err(QueryError::NoResult { handlers });
    };
    let wrong = || QueryError::WrongType {
        handler: stamp.handler.clone(),
        expected: std::any::type_name::<R>(),
    };
    match stamp.take::<R>() {
        Ok(Some(r)) => Ok(r),
        Ok(None) => Err(QueryError::NoResult { handlers }),
        Err(()) => Err(wrong()),
    }
}
