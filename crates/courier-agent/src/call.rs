//! One model call: the fallback chain over the providers, their breakers, the HTTP exchange
//! and how its failures are classified.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use courier_core::error_chain;
use courier_runs::{ProviderError, StepScope, Usage};
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderValue, RETRY_AFTER};
use serde_json::Value;

use crate::breaker::{BreakerPolicy, BreakerStore, Permit};
use crate::provider::{Price, Provider};
use crate::streams::{StreamKind, StreamStore};
use crate::wire::{ModelTurn, StreamFold, parse_reply};

/// The header carrying the step's idempotency key on every model call.
pub const IDEMPOTENCY_HEADER: &str = "Idempotency-Key";

/// Makes rustls' ring provider the process's default, unless one is installed already.
///
/// This crate builds reqwest without a crypto provider of its own (its `rustls` feature would
/// bring aws-lc) and hands its client a ring configuration. Cargo unifies features, so every
/// other reqwest client of the process (the OTLP exporter's, for one) is then built without a
/// provider too and panics unless a default is installed: call this at startup, before any
/// such client is built (`courier` does; building an agent's client does too).
pub fn install_crypto_provider() {
    // Err: a provider is installed already, which is all this asks for.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The HTTP client: HTTP/1, rustls on the ring provider with the webpki roots.
pub(crate) fn http_client() -> Result<reqwest::Client, ProviderError> {
    install_crypto_provider();
    let roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| ProviderError::Configuration(format!("TLS: {e}")))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .build()
        .map_err(|e| ProviderError::Configuration(format!("HTTP client: {e}")))
}

/// The providers of one agent and what their calls share.
#[derive(Debug, Clone)]
pub(crate) struct Chain {
    pub(crate) providers: Vec<Provider>,
    pub(crate) client: reqwest::Client,
    pub(crate) breakers: Option<Arc<dyn BreakerStore>>,
    pub(crate) policy: BreakerPolicy,
    pub(crate) prices: HashMap<String, Price>,
    /// Where streaming providers' chunks go, and for how long.
    pub(crate) streams: Option<(Arc<dyn StreamStore>, Duration)>,
}

/// A streamed call's events in its run's stream (best effort: a failing store is logged).
struct Sink<'a> {
    store: &'a dyn StreamStore,
    ttl: Duration,
    run: &'a str,
    step: i64,
}

impl Sink<'_> {
    async fn append(&self, kind: StreamKind, data: &str) {
        if let Err(e) = self
            .store
            .append(self.run, self.step, kind, data, now_ms(), self.ttl)
            .await
        {
            tracing::warn!(error = %error_chain(&e), "token stream not appended");
        }
    }

    /// Before a call: a `retry` marker when an earlier attempt of this step left output.
    async fn begin(&self) {
        match self.store.read(self.run, 0, usize::MAX, now_ms()).await {
            Ok(events) => {
                let last = events.iter().rev().find(|e| e.step == self.step);
                if last.is_some_and(|e| e.kind != StreamKind::Retry) {
                    self.append(StreamKind::Retry, "").await;
                }
            }
            Err(e) => tracing::warn!(error = %error_chain(&e), "token stream not read"),
        }
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Whether the chain moves on to the next provider after this failure: the retryable classes
/// and a broken protocol (another provider may answer well). Auth, client errors and
/// configuration stop it: the next provider would not fix the request.
fn falls_back(e: &ProviderError) -> bool {
    use courier_runs::FailureClass as C;
    matches!(
        e.class(),
        C::Connection | C::RateLimit | C::ServerError | C::CircuitOpen | C::Protocol
    )
}

/// Whether a failure counts against the provider's breaker (it did not answer properly).
fn counts(e: &ProviderError) -> bool {
    use courier_runs::FailureClass as C;
    matches!(
        e.class(),
        C::Connection | C::RateLimit | C::ServerError | C::Protocol
    )
}

impl Chain {
    /// Calls the providers in order until one answers; reports the answer's usage and cost to
    /// the step. The failure of a chain of one is that provider's; of several,
    /// [`ProviderError::FallbackChainExhausted`] (classified by its last attempt).
    pub(crate) async fn complete(
        &self,
        body: &Value,
        scope: &StepScope,
    ) -> Result<ModelTurn, ProviderError> {
        let mut failed = Vec::new();
        for provider in &self.providers {
            let permit = self.acquire(provider).await;
            if permit == Permit::Open {
                tracing::info!(provider = %provider.name, "circuit open: provider skipped");
                failed.push(ProviderError::CircuitOpen);
                continue;
            }
            match self.call(provider, body, scope.key()).await {
                Ok(turn) => {
                    self.record(provider, permit, None).await;
                    scope.report(
                        Usage::tokens(turn.tokens_in, turn.tokens_out).with_cost(turn.cost_micros),
                    );
                    return Ok(turn);
                }
                Err(e) => {
                    self.record(provider, permit, Some(&e)).await;
                    tracing::warn!(provider = %provider.name, model = %provider.model, class = %e.class(), error = %error_chain(&e), "model call failed");
                    if !falls_back(&e) {
                        return Err(e);
                    }
                    failed.push(e);
                }
            }
        }
        Err(match failed.len() {
            0 => ProviderError::Configuration("the agent has no provider".to_owned()),
            1 => failed.remove(0),
            _ => ProviderError::FallbackChainExhausted(failed),
        })
    }

    async fn acquire(&self, provider: &Provider) -> Permit {
        let Some(breakers) = &self.breakers else {
            return Permit::Closed;
        };
        match breakers
            .acquire(&provider.name, &self.policy, now_ms())
            .await
        {
            Ok(permit) => permit,
            Err(e) => {
                tracing::warn!(provider = %provider.name, error = %error_chain(&e), "circuit breaker unreadable; calling the provider");
                Permit::Closed
            }
        }
    }

    async fn record(&self, provider: &Provider, permit: Permit, failure: Option<&ProviderError>) {
        let Some(breakers) = &self.breakers else {
            return;
        };
        let done = match failure {
            Some(e) if counts(e) => {
                breakers
                    .failure(&provider.name, &self.policy, now_ms())
                    .await
            }
            // It answered (even a 401): the provider is up.
            _ => breakers.success(&provider.name, permit, now_ms()).await,
        };
        if let Err(e) = done {
            tracing::warn!(provider = %provider.name, error = %error_chain(&e), "circuit breaker not updated");
        }
    }

    /// One HTTP exchange with one provider.
    async fn call(
        &self,
        provider: &Provider,
        body: &Value,
        key: &str,
    ) -> Result<ModelTurn, ProviderError> {
        let mut body = body.clone();
        body["model"] = Value::String(provider.model.clone());
        if provider.stream {
            body["stream"] = Value::Bool(true);
            body["stream_options"] = serde_json::json!({ "include_usage": true });
        }
        let bytes = serde_json::to_vec(&body)
            .map_err(|e| ProviderError::Other(format!("request not serialisable: {e}")))?;
        let mut request = self
            .client
            .post(provider.url())
            .timeout(provider.timeout)
            .header(CONTENT_TYPE, "application/json")
            .body(bytes);
        if let Ok(value) = HeaderValue::from_str(key) {
            request = request.header(IDEMPOTENCY_HEADER, value);
        }
        if let Some(api_key) = &provider.api_key {
            let mut value = HeaderValue::from_str(&format!("Bearer {}", api_key.expose()))
                .map_err(|_| {
                    ProviderError::Configuration(format!(
                        "the API key of provider `{}` is not a valid header value",
                        provider.name
                    ))
                })?;
            value.set_sensitive(true);
            request = request.header(AUTHORIZATION, value);
        }
        let response = request.send().await.map_err(|e| transport(provider, e))?;
        let status = response.status().as_u16();
        if !response.status().is_success() {
            return Err(match status {
                429 => ProviderError::RateLimited {
                    retry_after: retry_after(response.headers()),
                },
                s => ProviderError::http(s),
            });
        }
        let protocol =
            |d: String| ProviderError::Protocol(format!("provider `{}`: {d}", provider.name));
        let reply = if provider.stream {
            let mut response = response;
            let mut fold = StreamFold::default();
            let sink = match (&self.streams, key.rsplit_once(':')) {
                (Some((store, ttl)), Some((run, step))) => step.parse().ok().map(|step| Sink {
                    store: store.as_ref(),
                    ttl: *ttl,
                    run,
                    step,
                }),
                _ => None,
            };
            if let Some(sink) = &sink {
                sink.begin().await;
            }
            while let Some(bytes) = response.chunk().await.map_err(|e| transport(provider, e))? {
                let added = fold.feed(&bytes).map_err(protocol)?;
                if let (Some(sink), false) = (&sink, added.is_empty()) {
                    sink.append(StreamKind::Chunk, &added).await;
                }
            }
            if let (Some(sink), true) = (&sink, fold.is_complete()) {
                sink.append(StreamKind::Done, "").await;
            }
            match fold.finish() {
                Ok(reply) => reply,
                Err(Ok(detail)) => return Err(protocol(detail)),
                Err(Err(cut)) => {
                    return Err(ProviderError::Connection(Some(Box::new(CallFailed {
                        provider: provider.name.clone(),
                        detail: cut,
                    }))));
                }
            }
        } else {
            let bytes = response.bytes().await.map_err(|e| transport(provider, e))?;
            parse_reply(&bytes).map_err(protocol)?
        };
        let price = self
            .prices
            .get(&provider.model)
            .copied()
            .unwrap_or_default();
        Ok(ModelTurn {
            provider: provider.name.clone(),
            model: provider.model.clone(),
            cost_micros: price.cost(reply.tokens_in, reply.tokens_out),
            content: reply.content,
            tool_calls: reply.tool_calls,
            finish_reason: reply.finish_reason,
            tokens_in: reply.tokens_in,
            tokens_out: reply.tokens_out,
        })
    }
}

/// A transport failure: a timeout, or a connection refused, reset or cut mid-answer.
fn transport(provider: &Provider, e: reqwest::Error) -> ProviderError {
    if e.is_timeout() {
        return ProviderError::Timeout(provider.timeout);
    }
    // Without the URL (a base URL may carry credentials).
    let e = e.without_url();
    ProviderError::Connection(Some(Box::new(CallFailed {
        provider: provider.name.clone(),
        detail: error_chain(&e).to_string(),
    })))
}

/// A call to a named provider failed.
#[derive(Debug, thiserror::Error)]
#[error("provider `{provider}`: {detail}")]
struct CallFailed {
    provider: String,
    detail: String,
}

/// `Retry-After` as delay-seconds or an HTTP date.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    if let Ok(secs) = value.parse::<f64>()
        && secs.is_finite()
        && secs >= 0.0
    {
        return Some(Duration::from_secs_f64(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(
        at.duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        let mut h = HeaderMap::new();
        h.insert(RETRY_AFTER, HeaderValue::from_static("7"));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(7)));
        h.insert(
            RETRY_AFTER,
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(retry_after(&h), Some(Duration::ZERO), "a date in the past");
        h.insert(RETRY_AFTER, HeaderValue::from_static("soon"));
        assert_eq!(retry_after(&h), None);
    }
}
