//! Traces: the spans Courier opens, named and attributed after the OpenTelemetry messaging
//! conventions, and the hook that carries their context across a transport.
//!
//! | span (`otel.name`) | `otel.kind` | `messaging.operation.type` | where |
//! |---|---|---|---|
//! | `send <transport>` | `producer` | `send` | the bus sends a routed message (one per transport) |
//! | `process <transport>` | `consumer` | `process` | the worker dispatches a received message |
//! | `ack <transport>` | | `settle` | the worker acks a batch (`messaging.batch.message_count`) |
//! | `release <transport>` | | `settle` | the worker puts unstarted messages back at shutdown |
//! | `keepalive <transport>` | | | the worker extends the redelivery window of what it holds |
//! | `receive <transport>` | | `receive` | `AmqpTransport::get` (the other transports have none) |
//!
//! Every span has `messaging.system` (the transport's [`Transport::messaging_system`]: `sqlite`,
//! `postgresql`, `mysql`, `redis`, `rabbitmq`, ...), `messaging.destination.name` (the transport's
//! name in the application) and `messaging.operation.name`; `send` and `process` add
//! `messaging.message.id` (the transport's id) and `courier.message.type` (the wire name); the
//! batch operations add `messaging.batch.message_count`. The `tracing` span names are short
//! (`send`, `process`, `settle` for ack and release, `keepalive`, `receive`), so a log line stays
//! short; `otel.name` is what an OpenTelemetry exporter shows. `send` and `process` are at `INFO`,
//! the others at `DEBUG`; the batch spans are roots, as a batch mixes messages of many traces.
//!
//! Trace context travels in a [`TraceContextStamp`] (W3C `traceparent`), a sendable stamp, so it
//! crosses every transport in the `x-courier-stamp-trace-context` header. Without a
//! [`TracePropagator`], Courier passes the stamp along: a message dispatched while another is
//! handled gets the handled message's stamp. With one installed ([`set_trace_propagator`];
//! `courier-otel` has the OpenTelemetry one), the `send` span's own context is stamped on the
//! message and the worker's `process` span is parented on it, so one trace runs from a dispatch
//! through the transport to the handler, and on through anything the handler dispatches.
//!
//! [`Transport::messaging_system`]: crate::Transport::messaging_system

use std::sync::OnceLock;

use crate::{Envelope, TraceContextStamp};

/// Moves trace context between the current span and a [`TraceContextStamp`].
///
/// Courier calls it only for spans a subscriber is interested in: [`inject`](Self::inject) in each
/// `send` span (its result replaces the envelope's stamp), [`extract`](Self::extract) on each
/// `process` span before it is entered. `courier-otel` implements it with the W3C propagator of
/// OpenTelemetry.
///
/// ```
/// use courier_core::{TraceContextStamp, TracePropagator};
///
/// /// Stamps a fixed context and ignores incoming ones (a real one reads the span's context).
/// struct Fixed;
///
/// impl TracePropagator for Fixed {
///     fn inject(&self, _span: &tracing::Span) -> Option<TraceContextStamp> {
///         Some(TraceContextStamp {
///             traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
///             tracestate: None,
///         })
///     }
///
///     fn extract(&self, _stamp: &TraceContextStamp, _span: &tracing::Span) {}
/// }
///
/// courier_core::set_trace_propagator(Fixed).ok();
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a Courier trace propagator",
    note = "implement `courier::TracePropagator` (`inject` and `extract`) for `{Self}`"
)]
pub trait TracePropagator: Send + Sync + 'static {
    /// The trace context of `span`, to send with a message; `None` when it has none.
    fn inject(&self, span: &tracing::Span) -> Option<TraceContextStamp>;

    /// Makes the context in `stamp` the parent of `span` (which has not been entered yet).
    fn extract(&self, stamp: &TraceContextStamp, span: &tracing::Span);
}

const _: () = {
    fn _obj_safe(_: &dyn TracePropagator) {}
};

static PROPAGATOR: OnceLock<Box<dyn TracePropagator>> = OnceLock::new();

/// A propagator was already installed; the process keeps the first one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a trace propagator is already installed")]
pub struct PropagatorAlreadySet;

/// Installs the process-wide [`TracePropagator`], once (an application's `main`, or its tests).
///
/// # Errors
/// [`PropagatorAlreadySet`] when one is installed already; that one stays.
pub fn set_trace_propagator(propagator: impl TracePropagator) -> Result<(), PropagatorAlreadySet> {
    PROPAGATOR
        .set(Box::new(propagator))
        .map_err(|_| PropagatorAlreadySet)
}

/// The installed propagator, if any.
pub(crate) fn propagator() -> Option<&'static dyn TracePropagator> {
    PROPAGATOR.get().map(|p| &**p)
}

/// The `send <transport>` producer span of one send; `messaging.message.id` is recorded once the
/// transport has answered.
pub(crate) fn send_span(destination: &str, system: &'static str, message: &str) -> tracing::Span {
    tracing::info_span!(
        "send",
        otel.name = %format_args!("send {destination}"),
        otel.kind = "producer",
        messaging.system = system,
        messaging.destination.name = destination,
        messaging.operation.type = "send",
        messaging.operation.name = "send",
        messaging.message.id = tracing::field::Empty,
        courier.message.type = message,
    )
}

/// The `process <transport>` consumer span of one received message, parented on its stamp's
/// context when a propagator is installed.
pub(crate) fn process_span(
    destination: &str,
    system: &'static str,
    id: &str,
    envelope: &Envelope,
) -> tracing::Span {
    let span = tracing::info_span!(
        "process",
        otel.name = %format_args!("process {destination}"),
        otel.kind = "consumer",
        messaging.system = system,
        messaging.destination.name = destination,
        messaging.operation.type = "process",
        messaging.operation.name = "process",
        messaging.message.id = id,
        courier.message.type = envelope.message_name(),
    );
    // The stamp is looked up only when someone will read the span.
    if let Some(propagator) = propagator()
        && !span.is_disabled()
        && let Some(stamp) = envelope.last::<TraceContextStamp>()
    {
        propagator.extract(stamp, &span);
    }
    span
}
