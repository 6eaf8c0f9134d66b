//! Where the command line's logs and spans go: stderr at the level `-q` / `-v` choose, and with
//! the `otel` feature, when `OTEL_EXPORTER_OTLP_ENDPOINT` is set, spans to that OpenTelemetry
//! collector too (OTLP/HTTP).

use tracing_subscriber::filter::LevelFilter;

/// Keeps the exporter alive; dropping it flushes the spans not exported yet.
pub(crate) struct Telemetry {
    #[cfg(feature = "otel")]
    _otlp: Option<courier_otel::OtlpGuard>,
}

/// Installs the global subscriber (unless one is installed already).
pub(crate) fn init(level: LevelFilter, with_target: bool) -> Telemetry {
    // Before any HTTP client is built (the OTLP exporter's below): with the agent's reqwest
    // features unified in, reqwest has no crypto provider of its own.
    #[cfg(feature = "agent")]
    courier_agent::install_crypto_provider();
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    #[cfg(feature = "otel")]
    if let Some(otlp) = otlp(level, ansi, with_target) {
        return Telemetry { _otlp: Some(otlp) };
    }
    let _ = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .with_target(with_target)
        .try_init();
    Telemetry {
        #[cfg(feature = "otel")]
        _otlp: None,
    }
}

/// The service name spans are exported under, unless `OTEL_SERVICE_NAME` says otherwise.
#[cfg(feature = "otel")]
const SERVICE_NAME: &str = "courier";

/// Stderr plus OTLP, when `OTEL_EXPORTER_OTLP_ENDPOINT` (or the traces one) names a collector.
/// Spans go out from `INFO` (`send`, `process`, runs), or from the stderr level when lower.
#[cfg(feature = "otel")]
fn otlp(level: LevelFilter, ansi: bool, with_target: bool) -> Option<courier_otel::OtlpGuard> {
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;

    let configured = [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ]
    .iter()
    .any(|var| std::env::var_os(var).is_some_and(|v| !v.is_empty()));
    if !configured {
        return None;
    }
    let otlp = match courier_otel::otlp_layer(SERVICE_NAME) {
        Ok(otlp) => otlp,
        Err(e) => {
            // The endpoint may carry credentials: scrub them (quotes split off first).
            let reason = courier_core::error_chain(&e).to_string().replace('\'', " ");
            eprintln!(
                "warning: not exporting traces: {}",
                crate::error::scrub(&reason)
            );
            return None;
        }
    };
    let stderr = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .with_target(with_target)
        .with_filter(level);
    let _ = tracing_subscriber::registry()
        .with(stderr)
        .with(otlp.layer.with_filter(level.max(LevelFilter::INFO)))
        .try_init();
    Some(otlp.guard)
}
