//! The OTLP exporter: spans over OTLP/HTTP (protobuf) to an OpenTelemetry collector.

use opentelemetry_otlp::{ExporterBuildError, Protocol, SpanExporter, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use tracing_opentelemetry::OpenTelemetryLayer;
use tracing_subscriber::registry::LookupSpan;

/// What [`otlp_layer`] builds: the layer to add to the subscriber, and the guard that flushes the
/// exporter when dropped.
#[must_use = "add the layer to a subscriber and keep the guard until the end of main"]
pub struct Otlp<S> {
    /// The `tracing` layer exporting through OTLP.
    pub layer: OpenTelemetryLayer<S, SdkTracer>,
    /// Flushes and shuts down the exporter when dropped.
    pub guard: OtlpGuard,
}

/// Flushes the spans not exported yet and shuts the exporter down when dropped (this waits up
/// to the exporter's timeout for an unreachable collector).
#[derive(Debug)]
pub struct OtlpGuard {
    provider: SdkTracerProvider,
}

impl OtlpGuard {
    /// The tracer provider behind the layer (e.g. to set it as OpenTelemetry's global one).
    #[must_use]
    pub fn provider(&self) -> &SdkTracerProvider {
        &self.provider
    }
}

impl Drop for OtlpGuard {
    fn drop(&mut self) {
        // Nothing to do with a failure at exit: the spans are lost either way.
        let _ = self.provider.shutdown();
    }
}

/// The OTLP exporter could not be built (an invalid `OTEL_EXPORTER_OTLP_*` setting).
#[derive(Debug, thiserror::Error)]
#[error("cannot build the otlp span exporter")]
pub struct OtlpError(#[source] ExporterBuildError);

/// A layer exporting Courier's (and every other) span to an OpenTelemetry collector over
/// OTLP/HTTP with protobuf, in batches, and installs [`OtelPropagator`](crate::OtelPropagator)
/// unless a propagator is installed already.
///
/// The endpoint and headers come from the standard variables: `OTEL_EXPORTER_OTLP_ENDPOINT`
/// (the collector's base URL, default `http://localhost:4318`; spans go to `/v1/traces`) or
/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (the full URL), `OTEL_EXPORTER_OTLP_HEADERS`,
/// `OTEL_EXPORTER_OTLP_TIMEOUT`. The resource's `service.name` is `OTEL_SERVICE_NAME` when set,
/// else `service_name`. Plain `http://` only: this build carries no TLS. In a process that also
/// uses `courier-agent` (whose reqwest features are unified with the exporter's), call
/// `courier_agent::install_crypto_provider()` first.
///
/// # Errors
/// [`OtlpError`] when the exporter cannot be built from its settings.
pub fn otlp_layer<S>(service_name: &str) -> Result<Otlp<S>, OtlpError>
where
    S: tracing::Subscriber + for<'span> LookupSpan<'span>,
{
    let exporter = SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .build()
        .map_err(OtlpError)?;
    let resource = match std::env::var("OTEL_SERVICE_NAME") {
        Ok(name) if !name.is_empty() => Resource::builder().build(),
        _ => Resource::builder()
            .with_service_name(service_name.to_owned())
            .build(),
    };
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build();
    Ok(Otlp {
        layer: crate::layer(&provider),
        guard: OtlpGuard { provider },
    })
}
