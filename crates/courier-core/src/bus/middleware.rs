//! Middleware: the chain every dispatch runs through.
//!
//! The chain is, in order: bus name -> dispatch after current bus -> failed message processing ->
//! your middleware (in the order added) -> send -> handle. Each middleware gets the envelope and
//! [`Next`], and decides whether and how to call the rest.

use std::cell::RefCell;
use std::sync::Arc;

use async_trait::async_trait;
use tracing::Instrument;

use super::MessageBus;
use super::handler::HandlerEntry;
use crate::{
    BusError, BusNameStamp, DispatchAfterCurrentBusStamp, Envelope, HandledStamp, HandlerError,
    HandlerFailure, MessageIdStamp, ReceivedStamp, SentStamp, SentToFailureTransportStamp,
    TraceContextStamp, TransportNamesStamp,
};

/// A step in the bus's chain (Symfony's `MiddlewareInterface`).
///
/// ```
/// use courier_core::{BusError, Envelope, Middleware, Next};
///
/// /// Logs every message that goes through the bus.
/// struct Audit;
///
/// #[async_trait::async_trait]
/// impl Middleware for Audit {
///     async fn handle(&self, envelope: Envelope, next: Next<'_>) -> Result<Envelope, BusError> {
///         let name = envelope.message_name().to_owned();
///         let result = next.run(envelope).await;
///         println!("{name}: {}", if result.is_ok() { "ok" } else { "failed" });
///         result
///     }
/// }
/// ```
#[async_trait]
pub trait Middleware: Send + Sync + 'static {
    /// Processes the envelope; call `next.run(envelope)` to continue the chain.
    async fn handle(&self, envelope: Envelope, next: Next<'_>) -> Result<Envelope, BusError>;
}

/// The rest of the chain.
pub struct Next<'a> {
    pub(crate) chain: &'a [Arc<dyn Middleware>],
    pub(crate) bus: &'a MessageBus,
}

impl Next<'_> {
    /// Runs the rest of the chain.
    ///
    /// # Errors
    /// Whatever the rest of the chain returns.
    pub async fn run(self, envelope: Envelope) -> Result<Envelope, BusError> {
        match self.chain.split_first() {
            Some((first, rest)) => {
                first
                    .handle(
                        envelope,
                        Next {
                            chain: rest,
                            bus: self.bus,
                        },
                    )
                    .await
            }
            None => Ok(envelope),
        }
    }

    /// The bus being dispatched on.
    #[must_use]
    pub fn bus(&self) -> &MessageBus {
        self.bus
    }
}

tokio::task_local! {
    static CURRENT: MessageBus;
    static DEFERRED: RefCell<Vec<(MessageBus, Envelope)>>;
    static TRACE: Option<TraceContextStamp>;
    static PREPARING: RefCell<Vec<(String, Envelope)>>;
}

/// Runs `fut` with sends collected instead of made: every envelope the bus would send inside it
/// is returned, with its transport's name, in order (see [`MessageBus::prepare`]).
pub(crate) async fn collecting_sends<F: std::future::Future>(
    fut: F,
) -> (F::Output, Vec<(String, Envelope)>) {
    PREPARING
        .scope(RefCell::new(Vec::new()), async {
            let out = fut.await;
            (
                out,
                PREPARING.with(|p| std::mem::take(&mut *p.borrow_mut())),
            )
        })
        .await
}

/// The bus whose handlers are running on this task, if any.
pub(crate) fn current_bus() -> Option<MessageBus> {
    CURRENT.try_with(Clone::clone).ok()
}

/// Runs `fut` with `trace` as the current trace context: envelopes dispatched inside it without a
/// [`TraceContextStamp`] get this one (the worker wraps each handled message in it).
pub async fn with_trace_context<F: std::future::Future>(
    trace: Option<TraceContextStamp>,
    fut: F,
) -> F::Output {
    TRACE.scope(trace, fut).await
}

/// The built-in steps before user middleware, in Symfony's order, fused into one link of the
/// chain: bus name (and the current trace context) -> dispatch after current bus -> failed
/// message processing.
pub(crate) struct Prelude;

#[async_trait]
impl Middleware for Prelude {
    async fn handle(&self, mut envelope: Envelope, next: Next<'_>) -> Result<Envelope, BusError> {
        // Bus name: the worker dispatches the message on the same bus.
        if !envelope.has::<BusNameStamp>() {
            envelope = envelope.with_shared(&next.bus.inner.name_stamp);
        }
        // The message's id, created once where it is first dispatched (never on receipt: a
        // message without one keeps none, so each delivery does not look new).
        if !envelope.has::<MessageIdStamp>() && !envelope.has::<ReceivedStamp>() {
            envelope = envelope.with(MessageIdStamp::new());
        }
        if !envelope.has::<TraceContextStamp>()
            && let Ok(Some(trace)) = TRACE.try_with(Clone::clone)
        {
            envelope = envelope.with(trace);
        }
        // Dispatch after current bus: inside a dispatch, hold stamped envelopes until it succeeded.
        if DEFERRED.try_with(|_| ()).is_ok() {
            if envelope.has::<DispatchAfterCurrentBusStamp>() {
                let bus = next.bus.clone();
                let queued = envelope.clone();
                DEFERRED.with(|d| d.borrow_mut().push((bus, queued)));
                return Ok(envelope);
            }
            return next.run(failed_message_processing(envelope)).await;
        }
        let (result, deferred) = DEFERRED
            .scope(RefCell::new(Vec::new()), async {
                let result = next.run(failed_message_processing(envelope)).await;
                (
                    result,
                    DEFERRED.with(|d| std::mem::take(&mut *d.borrow_mut())),
                )
            })
            .await;
        let envelope = result?;
        for (bus, queued) in deferred {
            Box::pin(bus.dispatch(queued.without_all::<DispatchAfterCurrentBusStamp>())).await?;
        }
        Ok(envelope)
    }
}

/// A message retried from the failure transport is treated as received from its original one.
fn failed_message_processing(envelope: Envelope) -> Envelope {
    match (
        envelope.last::<SentToFailureTransportStamp>(),
        envelope.has::<ReceivedStamp>(),
    ) {
        (Some(failed), true) => {
            let original = ReceivedStamp(failed.original.clone());
            envelope.with(original)
        }
        _ => envelope,
    }
}

/// The built-in steps after user middleware, fused: send routed messages to their transports
/// (never a received one), else handle them with every handler.
pub(crate) struct Terminal;

#[async_trait]
impl Middleware for Terminal {
    async fn handle(&self, envelope: Envelope, next: Next<'_>) -> Result<Envelope, BusError> {
        if !envelope.has::<ReceivedStamp>() {
            let bus = next.bus;
            let names: Vec<String> = match envelope.last::<TransportNamesStamp>() {
                Some(TransportNamesStamp(names)) => names.clone(),
                None => bus.inner.router.resolve(envelope.message_name()).to_vec(),
            };
            if PREPARING.try_with(|_| ()).is_ok() {
                return collect(bus, envelope, names);
            }
            if !names.is_empty() {
                return send(bus, envelope, names).await;
            }
        }
        let envelope = handle(next.bus, envelope).await?;
        next.run(envelope).await
    }
}

/// The envelope to send to `names`: without its routing stamp, through the bus's `on_send`
/// hooks.
fn on_send(bus: &MessageBus, envelope: Envelope, names: &[String]) -> Envelope {
    let outgoing = envelope.without_all::<TransportNamesStamp>();
    if bus.inner.on_send.is_empty() {
        return outgoing;
    }
    let mut sending = super::Sending::new(outgoing, names);
    for hook in &bus.inner.on_send {
        hook(&mut sending);
    }
    sending.into_envelope()
}

/// Sends to every named transport; returns the envelope with their `SentStamp`s and ids.
async fn send(
    bus: &MessageBus,
    envelope: Envelope,
    names: Vec<String>,
) -> Result<Envelope, BusError> {
    let outgoing = on_send(bus, envelope, &names);
    let message_type = crate::metrics::message_type(&outgoing);
    let mut result = outgoing.clone();
    for name in names {
        let transport = bus
            .transport(&name)
            .ok_or_else(|| BusError::UnknownTransport {
                transport: name.clone(),
                name: outgoing.message_name().to_owned(),
            })?;
        let span =
            crate::trace::send_span(&name, transport.messaging_system(), outgoing.message_name());
        let envelope = stamp_trace_context(
            outgoing.clone().with(SentStamp {
                transport: name.clone(),
            }),
            &span,
        );
        let deduplicated_before = envelope.all::<crate::DeduplicatedStamp>().count();
        let sent = transport
            .send(envelope)
            .instrument(span.clone())
            .await
            .map_err(|source| BusError::Send {
                name: outgoing.message_name().to_owned(),
                source,
            })?;
        // A transport that takes deduplication keys in its send found this one held: nothing
        // was sent (see `Deduplicate::takes_keys_on_send`).
        if sent.all::<crate::DeduplicatedStamp>().count() > deduplicated_before
            && let Some(deduplicated) = sent.last::<crate::DeduplicatedStamp>()
        {
            result = result.with(deduplicated.clone());
            continue;
        }
        if let Some(id) = sent.id() {
            span.record("messaging.message.id", id);
        }
        crate::metrics::message(
            crate::metrics::MESSAGES_SENT,
            &crate::metrics::SharedString::from_owned(name.clone()),
            &message_type,
        );
        result = result.with(SentStamp { transport: name });
        if let Some(id) = sent.last::<crate::TransportMessageIdStamp>() {
            result = result.with(id.clone());
        }
    }
    Ok(result)
}

/// What [`send`] would send, collected for [`MessageBus::prepare`]: the same stamps, no I/O.
fn collect(bus: &MessageBus, envelope: Envelope, names: Vec<String>) -> Result<Envelope, BusError> {
    if names.is_empty() {
        return Err(BusError::NotRouted {
            name: envelope.message_name().to_owned(),
        });
    }
    let outgoing = on_send(bus, envelope, &names);
    let mut result = outgoing.clone();
    let mut collected = Vec::with_capacity(names.len());
    for name in names {
        if bus.transport(&name).is_none() {
            return Err(BusError::UnknownTransport {
                transport: name,
                name: outgoing.message_name().to_owned(),
            });
        }
        let sent = outgoing.clone().with(SentStamp {
            transport: name.clone(),
        });
        result = result.with(SentStamp {
            transport: name.clone(),
        });
        collected.push((name, sent));
    }
    PREPARING.with(|p| p.borrow_mut().extend(collected));
    Ok(result)
}

/// With a propagator and a span someone listens to, the `send` span's context becomes the
/// envelope's trace context (parented on the stamp it carried when no span is current);
/// otherwise the envelope keeps the stamp it has (the handled message's, see [`Prelude`]).
fn stamp_trace_context(envelope: Envelope, span: &tracing::Span) -> Envelope {
    let Some(propagator) = crate::trace::propagator() else {
        return envelope;
    };
    if span.is_disabled() {
        return envelope;
    }
    if tracing::Span::current().is_none()
        && let Some(stamp) = envelope.last::<TraceContextStamp>()
    {
        propagator.extract(stamp, span);
    }
    match propagator.inject(span) {
        Some(stamp) => envelope.without_all::<TraceContextStamp>().with(stamp),
        None => envelope,
    }
}

/// Runs every handler of the message that has not handled it yet; collects the failures.
async fn handle(bus: &MessageBus, mut envelope: Envelope) -> Result<Envelope, BusError> {
    if let crate::envelope::Payload::Undecodable { error, .. } = &envelope.payload {
        return Err(BusError::Undecodable(Arc::clone(error)));
    }
    let handlers = bus
        .inner
        .handlers
        .get(envelope.message_name())
        .map_or(&[][..], Vec::as_slice);
    // Read only when a handler filters by transport: the common case costs nothing.
    let received = if handlers.iter().any(|e| e.from_transport.is_some()) {
        envelope.last::<ReceivedStamp>().map(|r| r.0.clone())
    } else {
        None
    };
    let applies = move |entry: &&HandlerEntry| {
        entry
            .from_transport
            .as_deref()
            .is_none_or(|from| received.as_deref() == Some(from))
    };
    if !handlers.iter().any(|e| applies(&e)) {
        if bus.inner.allow_no_handlers {
            return Ok(envelope);
        }
        return Err(BusError::NoHandler {
            name: envelope.message_name().to_owned(),
        });
    }
    let (envelope, failures) = CURRENT
        .scope(bus.clone(), async move {
            let mut failures = Vec::new();
            for entry in handlers.iter().filter(applies) {
                if envelope
                    .all::<HandledStamp>()
                    .any(|h| *h.handler == *entry.name)
                {
                    continue;
                }
                let called = match entry.timeout {
                    None => entry.handler.call(&envelope).await,
                    Some(after) => tokio::time::timeout(after, entry.handler.call(&envelope))
                        .await
                        .unwrap_or_else(|_| {
                            tracing::warn!(handler = %entry.name, timeout = ?after,
                                "handler timed out: its future was dropped");
                            Err(HandlerError::Timeout(crate::HandlerTimeout::new(after)))
                        }),
                };
                match called {
                    Ok(None) => envelope = envelope.with_shared(&entry.handled),
                    Ok(Some(result)) => {
                        envelope = envelope
                            .with_shared(&entry.handled)
                            .with(super::query::HandledResultStamp::new(&entry.name, result));
                    }
                    Err(error) => failures.push(HandlerFailure {
                        handler: entry.name.to_string(),
                        error,
                    }),
                }
            }
            (envelope, failures)
        })
        .await;
    if !failures.is_empty() {
        return Err(BusError::HandlerFailed {
            envelope: Box::new(envelope),
            failures,
        });
    }
    Ok(envelope)
}
