//! A provider of the fallback chain ([`Provider`]), its API key ([`ApiKey`], never shown) and
//! the per-model price table ([`Price`]).

use std::fmt;
use std::time::Duration;

/// The default time a provider gets to answer one model call.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// An API key: sent as `Authorization: Bearer ...` (a header marked sensitive), never shown:
/// `Debug` and `Display` print `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// A key.
    #[must_use]
    pub fn new(key: impl Into<String>) -> Self {
        Self(key.into())
    }

    /// The key itself, for the request header (and for a caller that scrubs it from output).
    #[must_use]
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(***)")
    }
}

impl fmt::Display for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// What a model costs, in micro-units of the budget's currency per million tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    /// Per million prompt tokens.
    #[serde(default)]
    pub input: u64,
    /// Per million completion tokens.
    #[serde(default)]
    pub output: u64,
}

impl Price {
    /// A price: `input` and `output` micro-units per million tokens.
    #[must_use]
    pub fn per_million(input: u64, output: u64) -> Self {
        Self { input, output }
    }

    /// The cost of `tokens_in` prompt and `tokens_out` completion tokens, micro-units, rounded up.
    #[must_use]
    pub fn cost(&self, tokens_in: u64, tokens_out: u64) -> u64 {
        let micros = u128::from(tokens_in) * u128::from(self.input)
            + u128::from(tokens_out) * u128::from(self.output);
        u64::try_from(micros.div_ceil(1_000_000)).unwrap_or(u64::MAX)
    }
}

/// One OpenAI-compatible endpoint of the chain: where, which model, which key.
///
/// ```
/// use courier_agent::{ApiKey, Provider};
/// let p = Provider::new("local", "http://127.0.0.1:8000/v1", "llama3").api_key(ApiKey::new("sk-secret"));
/// assert!(!format!("{p:?}").contains("sk-secret"));
/// ```
#[derive(Clone)]
pub struct Provider {
    /// Its name (logs, breakers, step results).
    pub name: String,
    /// The API's base URL, up to and including `/v1` (`/chat/completions` is appended).
    pub base_url: String,
    /// The model asked for.
    pub model: String,
    /// Its key (none: no `Authorization` header, e.g. a local server).
    pub api_key: Option<ApiKey>,
    /// How long one call may take, connection and whole answer included.
    pub timeout: Duration,
    /// Ask for the answer as an SSE stream (`"stream": true`) and fold it into the same turn;
    /// a stream cut before its `[DONE]` is a `connection` failure.
    pub stream: bool,
}

impl fmt::Debug for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Provider")
            .field("name", &self.name)
            .field("base_url", &courier_core::redact(&self.base_url))
            .field("model", &self.model)
            .field("api_key", &self.api_key)
            .field("timeout", &self.timeout)
            .field("stream", &self.stream)
            .finish()
    }
}

impl Provider {
    /// A provider without a key, with the default timeout.
    #[must_use]
    pub fn new(
        name: impl Into<String>,
        base_url: impl Into<String>,
        model: impl Into<String>,
    ) -> Self {
        Self {
            name: name.into(),
            base_url: base_url.into(),
            model: model.into(),
            api_key: None,
            timeout: DEFAULT_TIMEOUT,
            stream: false,
        }
    }

    /// Streams its answers (see [`Provider::stream`](Self#structfield.stream)).
    #[must_use]
    pub fn stream(mut self, stream: bool) -> Self {
        self.stream = stream;
        self
    }

    /// Sets its key.
    #[must_use]
    pub fn api_key(mut self, key: ApiKey) -> Self {
        self.api_key = Some(key);
        self
    }

    /// Sets its timeout.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The chat completions URL.
    pub(crate) fn url(&self) -> String {
        format!("{}/chat/completions", self.base_url.trim_end_matches('/'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_rounds_up_in_micro_units() {
        let p = Price::per_million(150_000, 600_000);
        assert_eq!(p.cost(1_000_000, 0), 150_000);
        assert_eq!(p.cost(100, 50), 15 + 30);
        assert_eq!(p.cost(1, 0), 1, "rounded up");
        assert_eq!(Price::default().cost(10, 10), 0);
    }

    #[test]
    fn a_key_is_never_shown() {
        let key = ApiKey::new("sk-live-123");
        let p = Provider::new("a", "http://user:pw@127.0.0.1/v1", "m").api_key(key.clone());
        let shown = format!("{p:?} {key} {key:?}");
        assert!(!shown.contains("sk-live-123"), "{shown}");
        assert!(!shown.contains("pw@"), "{shown}");
    }
}
