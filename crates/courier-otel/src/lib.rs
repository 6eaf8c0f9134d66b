//! OpenTelemetry for [Courier](https://docs.rs/courier): one trace from a dispatch, across any
//! transport, to the handler and on through whatever the handler dispatches.
//!
//! ```no_run
//! use tracing_subscriber::layer::SubscriberExt;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Export to the collector at OTEL_EXPORTER_OTLP_ENDPOINT (default http://localhost:4318),
//! // and carry W3C trace context on every message Courier sends.
//! let otlp = courier_otel::otlp_layer("billing")?;
//! let subscriber = tracing_subscriber::registry().with(otlp.layer);
//! tracing::subscriber::set_global_default(subscriber)?;
//!
//! // ... build the bus and the worker, dispatch, consume ...
//!
//! // Dropping the guard (at the end of main) flushes the spans not exported yet.
//! drop(otlp.guard);
//! # Ok(()) }
//! ```
//!
//! What it does:
//!
//! - [`OtelPropagator`] is Courier's [`TracePropagator`] for OpenTelemetry: the bus stamps each
//!   `send <transport>` span's context on the message as a
//!   [`TraceContextStamp`] (W3C `traceparent` and `tracestate`,
//!   which every transport carries in its headers), and the worker parents its
//!   `process <transport>` span on it. [`layer`] and [`otlp_layer`] install it
//!   ([`install_propagator`] does it alone).
//! - [`layer`] turns an [`SdkTracerProvider`] you configured into a `tracing` layer, so Courier's
//!   spans (named and attributed after the OpenTelemetry messaging conventions, see
//!   [`courier_core::trace`]) become OpenTelemetry spans.
//! - [`otlp_layer`] (feature `otlp`, on by default) builds that provider with an OTLP/HTTP
//!   (protobuf) exporter and a batch processor, configured by the standard `OTEL_EXPORTER_OTLP_*`
//!   variables; `OTEL_SERVICE_NAME` overrides the service name given.
//!
//! The versions of [`opentelemetry`], [`opentelemetry_sdk`] and [`tracing_opentelemetry`] this
//! crate is built with are re-exported, so an application configures the same ones.

use courier_core::{PropagatorAlreadySet, TraceContextStamp, TracePropagator};
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{TraceContextExt, TracerProvider};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use tracing_opentelemetry::{OpenTelemetryLayer, OpenTelemetrySpanExt};
use tracing_subscriber::registry::LookupSpan;

pub use opentelemetry;
pub use opentelemetry_sdk;
pub use tracing_opentelemetry;

#[cfg(feature = "otlp")]
mod otlp;
#[cfg(feature = "otlp")]
pub use otlp::{Otlp, OtlpError, OtlpGuard, otlp_layer};

/// The instrumentation scope of Courier's spans.
pub const TRACER_NAME: &str = "courier";

/// Courier's [`TracePropagator`] for OpenTelemetry: W3C trace context (`traceparent`,
/// `tracestate`) between a span and a [`TraceContextStamp`].
#[derive(Debug, Default)]
pub struct OtelPropagator {
    w3c: TraceContextPropagator,
}

impl OtelPropagator {
    /// The W3C trace-context propagator.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }
}

impl TracePropagator for OtelPropagator {
    fn inject(&self, span: &tracing::Span) -> Option<TraceContextStamp> {
        let cx = span.context();
        if !cx.span().span_context().is_valid() {
            return None;
        }
        let mut carrier = Carrier::default();
        self.w3c.inject_context(&cx, &mut carrier);
        Some(TraceContextStamp {
            traceparent: carrier.traceparent?,
            tracestate: carrier.tracestate.filter(|s| !s.is_empty()),
        })
    }

    fn extract(&self, stamp: &TraceContextStamp, span: &tracing::Span) {
        let cx = self.w3c.extract(&StampCarrier(stamp));
        if cx.span().span_context().is_valid() {
            // Fails only when the span has no OpenTelemetry layer or was entered already: then
            // it keeps the parent it has.
            let _ = span.set_parent(cx);
        }
    }
}

/// Installs [`OtelPropagator`] as Courier's trace propagator.
///
/// # Errors
/// [`PropagatorAlreadySet`] when a propagator is installed already (an earlier call included);
/// that one stays.
pub fn install_propagator() -> Result<(), PropagatorAlreadySet> {
    courier_core::set_trace_propagator(OtelPropagator::new())
}

/// A `tracing` layer that records spans through `provider`'s tracer (scope [`TRACER_NAME`]), and
/// installs [`OtelPropagator`] unless a propagator is installed already.
///
/// ```
/// use opentelemetry_sdk::trace::SdkTracerProvider;
/// use tracing_subscriber::layer::SubscriberExt;
///
/// let provider = SdkTracerProvider::builder().build(); // add your exporter here
/// let subscriber = tracing_subscriber::registry().with(courier_otel::layer(&provider));
/// tracing::subscriber::with_default(subscriber, || {
///     tracing::info_span!("work").in_scope(|| { /* dispatch, consume */ });
/// });
/// ```
#[must_use]
pub fn layer<S>(provider: &SdkTracerProvider) -> OpenTelemetryLayer<S, SdkTracer>
where
    S: tracing::Subscriber + for<'span> LookupSpan<'span>,
{
    // Already installed (a second layer, or the application's own propagator) is fine.
    let _ = install_propagator();
    tracing_opentelemetry::layer().with_tracer(provider.tracer(TRACER_NAME))
}

/// Collects what the W3C propagator injects.
#[derive(Default)]
struct Carrier {
    traceparent: Option<String>,
    tracestate: Option<String>,
}

impl Injector for Carrier {
    fn set(&mut self, key: &str, value: String) {
        match key {
            "traceparent" => self.traceparent = Some(value),
            "tracestate" => self.tracestate = Some(value),
            _ => {}
        }
    }
}

/// A stamp read as W3C headers.
struct StampCarrier<'a>(&'a TraceContextStamp);

impl Extractor for StampCarrier<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            "traceparent" => Some(&self.0.traceparent),
            "tracestate" => self.0.tracestate.as_deref(),
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        let mut keys = vec!["traceparent"];
        if self.0.tracestate.is_some() {
            keys.push("tracestate");
        }
        keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_stamp_reads_as_the_w3c_context_it_carries() {
        let stamp = TraceContextStamp {
            traceparent: TRACEPARENT.into(),
            tracestate: Some("vendor=1".into()),
        };
        let cx = TraceContextPropagator::new().extract(&StampCarrier(&stamp));
        let span = cx.span();
        let sc = span.span_context();
        assert!(sc.is_valid() && sc.is_remote());
        assert_eq!(
            sc.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(sc.span_id().to_string(), "00f067aa0ba902b7");
        assert_eq!(sc.trace_state().header(), "vendor=1");

        let mut carrier = Carrier::default();
        TraceContextPropagator::new().inject_context(&cx, &mut carrier);
        assert_eq!(carrier.traceparent.as_deref(), Some(TRACEPARENT));
        assert_eq!(carrier.tracestate.as_deref(), Some("vendor=1"));
    }

    #[test]
    fn a_span_without_an_opentelemetry_layer_injects_nothing() {
        let span = tracing::info_span!("send");
        assert_eq!(OtelPropagator::new().inject(&span), None);
    }
}
