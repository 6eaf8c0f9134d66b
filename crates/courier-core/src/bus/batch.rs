//! Batch handlers (Symfony's `BatchHandlerInterface`): a handler that receives up to `size`
//! messages at once, or what has gathered after `wait`, whichever comes first, and settles
//! each message on its own.
//!
//! Each message still goes through the bus on its own (middleware, signing, deduplication);
//! at the handler it joins the batch being gathered and its dispatch waits for the batch's
//! result. The dispatch that fills the batch, or the first whose `wait` runs out, calls the
//! handler with the whole batch and hands each message its own result. So a message of a
//! batch fails alone: the worker retries it (or moves it to the failure transport) through
//! its [`RetryStrategy`](crate::RetryStrategy) like any failed message, while the others are
//! acked. The worker lets a batch's messages be in flight together (`size` per
//! `concurrency`), keeps them alive while they wait, and on a stop runs the partial batches
//! at once (within the grace period) instead of waiting out `wait`.

use std::marker::PhantomData;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use super::handler::ErasedHandler;
use crate::{Envelope, HandlerError, Message};

/// How a batch handler gathers its batches: at most `size` messages, waiting at most `wait`
/// after the first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchOptions {
    size: usize,
    wait: Duration,
}

impl BatchOptions {
    /// Batches of up to `size` messages (at least 1), each called at most `wait` after its first
    /// message arrived.
    #[must_use]
    pub fn new(size: usize, wait: Duration) -> Self {
        Self {
            size: size.max(1),
            wait,
        }
    }

    /// The largest batch.
    #[must_use]
    pub fn size(&self) -> usize {
        self.size
    }

    /// The longest a batch waits for more messages.
    #[must_use]
    pub fn wait(&self) -> Duration {
        self.wait
    }
}

/// One message of a batch, with its envelope (for its stamps).
#[derive(Debug)]
pub struct BatchItem<M> {
    /// The message.
    pub message: Arc<M>,
    /// Its envelope.
    pub envelope: Envelope,
}

/// Handles messages of type `M` in batches: up to [`BatchOptions::size`] at once, or what has
/// gathered [`BatchOptions::wait`] after the first. Each message still goes through the bus on
/// its own; the handler returns one result per message, so a failed one is retried (or moved
/// to the failure transport) alone while the others are acked. The worker lets a batch's
/// messages be in flight together and, when it stops, runs partial batches at once.
///
/// ```
/// use courier_core::{BatchHandler, BatchItem, HandlerError, Message};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)]
/// struct Row { id: u32 }
/// impl Message for Row { const NAME: &'static str = "app.row"; }
///
/// struct BulkInsert;
///
/// #[async_trait::async_trait]
/// impl BatchHandler<Row> for BulkInsert {
///     async fn handle(&self, batch: &[BatchItem<Row>]) -> Vec<Result<(), HandlerError>> {
///         // One multi-row insert for the whole batch; one result per message, in order.
///         batch
///             .iter()
///             .map(|item| if item.message.id == 0 { Err(HandlerError::msg("no id")) } else { Ok(()) })
///             .collect()
///     }
/// }
/// ```
#[async_trait]
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot handle batches of `{M}`",
    note = "implement `courier::BatchHandler<{M}>` (with `#[async_trait]`) for `{Self}`, or use `batch_handler_fn` with a closure"
)]
pub trait BatchHandler<M: Message>: Send + Sync + 'static {
    /// Handles a batch; returns one result per message, in the batch's order (a message
    /// without a result fails, and is retried).
    async fn handle(&self, batch: &[BatchItem<M>]) -> Vec<Result<(), HandlerError>>;
}

/// A closure batch handler: `Fn(Vec<Arc<M>>) -> impl Future<Output = Vec<Result<..>>>`.
pub(crate) struct FnBatchHandler<F>(pub(crate) F);

#[async_trait]
impl<M, F, Fut> BatchHandler<M> for FnBatchHandler<F>
where
    M: Message,
    F: Fn(Vec<Arc<M>>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Vec<Result<(), HandlerError>>> + Send + 'static,
{
    async fn handle(&self, batch: &[BatchItem<M>]) -> Vec<Result<(), HandlerError>> {
        (self.0)(batch.iter().map(|i| i.message.clone()).collect()).await
    }
}

/// What the worker asks of every batch handler of a bus when it stops.
pub(crate) trait Flush: Send + Sync {
    /// Runs the batch being gathered now, rather than after its wait.
    fn flush(&self);
}

type Waiting<M> = (BatchItem<M>, oneshot::Sender<Result<(), HandlerError>>);

struct Open<M> {
    id: u64,
    deadline: Instant,
    items: Vec<Waiting<M>>,
}

struct Gathering<M> {
    open: Option<Open<M>>,
    next_id: u64,
}

/// The batch handler as the bus calls it: one message at a time, gathered into batches.
pub(crate) struct Batcher<M, H> {
    handler: H,
    options: BatchOptions,
    gathering: Mutex<Gathering<M>>,
    flushed: watch::Sender<u64>,
    _message: PhantomData<fn(M)>,
}

impl<M: Message, H: BatchHandler<M>> Batcher<M, H> {
    pub(crate) fn new(handler: H, options: BatchOptions) -> Self {
        Self {
            handler,
            options,
            gathering: Mutex::new(Gathering {
                open: None,
                next_id: 0,
            }),
            flushed: watch::channel(0).0,
            _message: PhantomData,
        }
    }

    /// Adds a message to the open batch: the batch's id and deadline, and the batch itself
    /// when this message filled it.
    fn join(&self, item: Waiting<M>) -> (u64, Instant, Option<Vec<Waiting<M>>>) {
        let mut g = self
            .gathering
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if g.open.is_none() {
            g.next_id += 1;
            g.open = Some(Open {
                id: g.next_id,
                deadline: Instant::now() + self.options.wait,
                items: Vec::with_capacity(self.options.size),
            });
        }
        let Some(open) = g.open.as_mut() else {
            return (0, Instant::now(), Some(vec![item]));
        };
        open.items.push(item);
        let (id, deadline) = (open.id, open.deadline);
        let full = open.items.len() >= self.options.size;
        let batch = if full {
            g.open.take().map(|o| o.items)
        } else {
            None
        };
        (id, deadline, batch)
    }

    /// Takes batch `id` if it is still open.
    fn take(&self, id: u64) -> Option<Vec<Waiting<M>>> {
        let mut g = self
            .gathering
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if g.open.as_ref().is_some_and(|o| o.id == id) {
            g.open.take().map(|o| o.items)
        } else {
            None
        }
    }

    /// Calls the handler with a batch and hands each message its result.
    async fn run(&self, batch: Vec<Waiting<M>>) {
        let (items, replies): (Vec<_>, Vec<_>) = batch.into_iter().unzip();
        let size = items.len();
        let mut results = self.handler.handle(&items).await.into_iter();
        for reply in replies {
            let result = results.next().unwrap_or_else(|| {
                Err(HandlerError::msg(format!(
                    "the batch handler returned fewer results than the {size} messages of its batch"
                )))
            });
            // A message whose dispatch was dropped (the worker gave up on it) is redelivered.
            let _ = reply.send(result);
        }
    }
}

impl<M: Message, H: BatchHandler<M>> Flush for Batcher<M, H> {
    fn flush(&self) {
        self.flushed.send_modify(|n| *n += 1);
    }
}

#[async_trait]
impl<M: Message, H: BatchHandler<M>> ErasedHandler for Batcher<M, H> {
    async fn call(
        &self,
        envelope: &Envelope,
    ) -> Result<Option<Box<dyn std::any::Any + Send>>, HandlerError> {
        let message = envelope.message_arc::<M>().ok_or_else(|| {
            HandlerError::unrecoverable(format!(
                "envelope holds `{}`, not `{}`",
                envelope.message_name(),
                M::NAME
            ))
        })?;
        let mut flushed = self.flushed.subscribe();
        let (tx, mut rx) = oneshot::channel();
        let item = BatchItem {
            message,
            envelope: envelope.clone(),
        };
        let (id, deadline, full) = self.join((item, tx));
        if let Some(batch) = full {
            self.run(batch).await;
        } else {
            tokio::select! {
                result = &mut rx => return reply(result),
                () = tokio::time::sleep_until(deadline) => {}
                _ = flushed.changed() => {}
            }
            // Time is up (or the worker is stopping): run the batch unless another message of
            // it already does.
            if let Some(batch) = self.take(id) {
                self.run(batch).await;
            }
        }
        reply(rx.await)
    }
}

fn reply(
    result: Result<Result<(), HandlerError>, oneshot::error::RecvError>,
) -> Result<Option<Box<dyn std::any::Any + Send>>, HandlerError> {
    match result {
        Ok(r) => r.map(|()| None),
        Err(_) => Err(HandlerError::msg(
            "the batch this message was in was abandoned before it was handled",
        )),
    }
}
