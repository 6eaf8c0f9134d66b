//! `courier.toml`: transports, retry, failure transports and routing.
//!
//! ```
//! use courier_core::config::Config;
//!
//! let config: Config = r#"
//!     [transports.async]
//!     dsn = "${COURIER_DSN:-in-memory://}"
//!     failure_transport = "failed"
//!     retry = { max_retries = 3, delay = "1s", multiplier = 2.0 }
//!
//!     [transports.failed]
//!     dsn = "in-memory://"
//!
//!     [routing]
//!     "app.*" = "async"
//! "#.parse()?;
//! assert_eq!(config.transports["async"].dsn.scheme(), "in-memory");
//! assert_eq!(config.routing["app.*"].names(), ["async"]);
//!
//! let err = "[transports.async]\ndns = 'in-memory://'".parse::<Config>().unwrap_err();
//! assert!(err.to_string().contains("unknown field `dns`"));
//! # Ok::<(), courier_core::config::ConfigError>(())
//! ```
//!
//! Strings may use `${VAR}` and `${VAR:-default}`; an unset variable without a default is an
//! error naming it. Durations are humantime strings (`250ms`, `30s`, `10min`). Unknown keys are
//! errors naming the key. The `[runs]` table is kept as-is for `courier-runs` to validate, the
//! `[agents.NAME]` tables for `courier-agent`.

mod buses;
mod concurrency;
mod rate_limit;
mod schedules;
mod table;
mod transports;
mod wire_format;

pub use buses::BusConfig;
pub use concurrency::{ConcurrencyKeyError, ConcurrencyKeys, ConcurrencyLimitConfig, LimitsConfig};
pub use rate_limit::RateLimitConfig;
pub use schedules::ScheduleConfig;
pub use table::{Table, TransportOptions};
pub use transports::Transports;
pub use wire_format::WireFormat;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use crate::retry::MultiplierRetryStrategy;
use crate::{Dsn, Router};

/// A configuration error, naming the file, key or variable at fault.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ConfigError {
    message: String,
    #[source]
    source: Option<crate::BoxError>,
}

impl ConfigError {
    /// An error with this message.
    #[must_use]
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            source: None,
        }
    }

    fn with_source(mut self, source: impl Into<crate::BoxError>) -> Self {
        self.source = Some(source.into());
        self
    }
}

/// The whole configuration file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Config {
    /// Transports by name.
    #[serde(default)]
    pub transports: BTreeMap<String, TransportConfig>,
    /// Routing: wire name, `prefix.*` or `*` -> transport name(s).
    #[serde(default)]
    pub routing: BTreeMap<String, RouteTarget>,
    /// The failure transport of transports that name none.
    #[serde(default)]
    pub failure_transport: Option<String>,
    /// The `[runs]` table, validated by `courier-runs`.
    #[serde(default)]
    pub runs: Option<Table>,
    /// The `[symfony]` table (`[symfony.types]`: PHP classes to wire names), kept as-is for
    /// `courier-symfony` to validate (`SymfonyTypes::from_config`).
    #[serde(default)]
    pub symfony: Option<Table>,
    /// The bus messages are dispatched on and received messages go to when they name none
    /// (see [`Config::default_bus_name`]).
    #[serde(default)]
    pub default_bus: Option<String>,
    /// `[buses.NAME]`: named buses with their middleware ([`BusConfig`]).
    #[serde(default)]
    pub buses: BTreeMap<String, BusConfig>,
    /// The `[signing]` table: signed messages (see [`signing`](crate::signing)).
    #[serde(default)]
    pub signing: Option<crate::signing::SigningConfig>,
    /// `[schedules.NAME]`: recurring messages ([`ScheduleConfig`]).
    #[serde(default)]
    pub schedules: BTreeMap<String, ScheduleConfig>,
    /// `[agents.NAME]`: agent tables kept as-is for `courier-agent` to validate.
    #[serde(default)]
    pub agents: AgentTables,
    /// `[limits.concurrency.NAME]`: a concurrency key per message type ([`LimitsConfig`]).
    #[serde(default)]
    pub limits: LimitsConfig,
}

/// The `[agents.NAME]` tables, kept as-is. They hold API keys: `Debug` shows their names only.
#[derive(Clone, Default, Deserialize)]
#[serde(transparent)]
pub struct AgentTables(pub BTreeMap<String, Table>);

impl std::fmt::Debug for AgentTables {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

/// One `[transports.NAME]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct TransportConfig {
    /// Where the transport lives (password redacted when shown).
    #[serde(deserialize_with = "de_dsn")]
    pub dsn: Dsn,
    /// Options merged into the DSN's query (they override it).
    #[serde(default)]
    pub options: TransportOptions,
    /// Retry strategy.
    #[serde(default)]
    pub retry: RetryConfig,
    /// The failure transport's name.
    #[serde(default)]
    pub failure_transport: Option<String>,
    /// At most so many messages per interval, shared by every worker of the transport
    /// ([`RateLimitConfig`]).
    #[serde(default)]
    pub rate_limit: Option<RateLimitConfig>,
    /// How long a worker's handling of one of its messages may take (`"30s"`; default none,
    /// as in Symfony): past it the handler's future is dropped and the message fails with
    /// class `timeout`, retried as `retry` says (see
    /// [`WorkerBuilder::handler_timeout`](crate::WorkerBuilder::handler_timeout)).
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub handler_timeout: Option<Duration>,
    /// The wire format ([`WireFormat`]): Courier's own (the default) or Symfony Messenger's,
    /// on Symfony's own table, stream or queue.
    #[serde(default)]
    pub serializer: Option<WireFormat>,
}

/// A `retry = { ... }` table: a [`MultiplierRetryStrategy`].
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct RetryConfig {
    /// Retries before the failure transport (default 3).
    pub max_retries: u32,
    /// First delay (default `1s`).
    #[serde(deserialize_with = "de_duration")]
    pub delay: Duration,
    /// Multiplier per retry (default 2).
    pub multiplier: f64,
    /// Cap on the delay (default none).
    #[serde(deserialize_with = "de_opt_duration")]
    pub max_delay: Option<Duration>,
    /// Jitter fraction (default 0.1).
    pub jitter: f64,
}

impl Default for RetryConfig {
    fn default() -> Self {
        Self {
            max_retries: 3,
            delay: Duration::from_secs(1),
            multiplier: 2.0,
            max_delay: None,
            jitter: 0.1,
        }
    }
}

impl RetryConfig {
    /// The strategy these settings describe.
    #[must_use]
    pub fn strategy(&self) -> MultiplierRetryStrategy {
        MultiplierRetryStrategy::default()
            .max_retries(self.max_retries)
            .delay(self.delay)
            .multiplier(self.multiplier)
            .max_delay(self.max_delay)
            .jitter(self.jitter)
    }
}

/// One transport name or several (fan-out).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
#[non_exhaustive]
pub enum RouteTarget {
    /// `"async"`
    One(String),
    /// `["async", "audit"]`
    Many(Vec<String>),
}

impl RouteTarget {
    /// The transport names.
    #[must_use]
    pub fn names(&self) -> Vec<String> {
        match self {
            Self::One(n) => vec![n.clone()],
            Self::Many(v) => v.clone(),
        }
    }
}

fn de_dsn<'de, D: Deserializer<'de>>(d: D) -> Result<Dsn, D::Error> {
    let s = String::deserialize(d)?;
    Dsn::parse(&s).map_err(serde::de::Error::custom)
}

/// Parses a humantime duration (`"30s"`), for serde.
///
/// # Errors
/// The deserializer's error naming the bad value.
pub fn de_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    humantime::parse_duration(&s).map_err(|e| {
        serde::de::Error::custom(format!(
            "invalid duration `{s}` ({e}); write e.g. \"250ms\", \"30s\", \"10min\""
        ))
    })
}

/// Parses an optional humantime duration, for serde.
///
/// # Errors
/// The deserializer's error naming the bad value.
pub fn de_opt_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    de_duration(d).map(Some)
}

/// Replaces `${VAR}` and `${VAR:-default}` with environment values, escaped for TOML strings.
///
/// # Errors
/// [`ConfigError`] naming an unset variable without a default, or an unclosed `${`.
pub fn interpolate(
    text: &str,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<String, ConfigError> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| ConfigError::new("unclosed `${` in configuration"))?;
        let expr = &after[..end];
        let (var, default) = match expr.split_once(":-") {
            Some((v, d)) => (v, Some(d)),
            None => (expr, None),
        };
        let value = match (lookup(var).filter(|v| !v.is_empty()), default) {
            (Some(v), _) => v,
            (None, Some(d)) => d.to_owned(),
            (None, None) => {
                return Err(ConfigError::new(format!(
                    "environment variable `{var}` is not set (use `${{{var}:-default}}` for a default)"
                )));
            }
        };
        out.push_str(&value.replace('\\', "\\\\").replace('"', "\\\""));
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

impl std::str::FromStr for Config {
    type Err = ConfigError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse_with(text, |k| std::env::var(k).ok())
    }
}

impl Config {
    /// Parses configuration text, interpolating with `lookup`, and validates references.
    ///
    /// # Errors
    /// [`ConfigError`] naming the key, variable or transport at fault.
    pub fn parse_with(
        text: &str,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let text = interpolate(text, lookup)?;
        let config: Config = toml::from_str(&text).map_err(|e| toml_error(&text, &e))?;
        config.validate()?;
        Ok(config)
    }

    /// Reads and parses a file.
    ///
    /// # Errors
    /// [`ConfigError`] naming the file and what is wrong.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigError::new(format!(
                "cannot read configuration `{}`: {e}",
                path.display()
            ))
            .with_source(e)
        })?;
        text.parse().map_err(|e: ConfigError| {
            ConfigError::new(format!("configuration `{}`: {}", path.display(), e.message))
        })
    }

    /// Checks that routing and failure transports name configured transports.
    ///
    /// # Errors
    /// [`ConfigError`] naming the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        buses::validate(self.default_bus.as_deref(), &self.buses)?;
        let known = |name: &str| self.transports.contains_key(name);
        let list = || {
            self.transports
                .keys()
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        };
        for (pattern, target) in &self.routing {
            for name in target.names() {
                if !known(&name) {
                    return Err(ConfigError::new(format!(
                        "routing.\"{pattern}\": unknown transport `{name}` (configured: {})",
                        list()
                    )));
                }
            }
        }
        if let Some(f) = &self.failure_transport
            && !known(f)
        {
            return Err(ConfigError::new(format!(
                "failure_transport: unknown transport `{f}` (configured: {})",
                list()
            )));
        }
        for (name, t) in &self.transports {
            if let Some(f) = &t.failure_transport {
                if !known(f) {
                    return Err(ConfigError::new(format!(
                        "transports.{name}.failure_transport: unknown transport `{f}` (configured: {})",
                        list()
                    )));
                }
                if f == name {
                    return Err(ConfigError::new(format!(
                        "transports.{name}.failure_transport: a transport cannot be its own failure transport"
                    )));
                }
            }
            if let Some(limit) = &t.rate_limit {
                limit.rate_limit(name)?;
            }
            t.check_serializer(name)?;
            if t.handler_timeout.is_some_and(|d| d.is_zero()) {
                return Err(ConfigError::new(format!(
                    "transports.{name}.handler_timeout: must be longer than zero (leave it out for no timeout)"
                )));
            }
            for (key, value) in t.options.iter() {
                if value.is_none() {
                    return Err(ConfigError::new(format!(
                        "transports.{name}.options.{key}: expected a string, number or boolean"
                    )));
                }
            }
        }
        let router = self.router();
        self.limits
            .transport_maxima(&router, |t| self.own_option(t, "concurrency_max"))?;
        for (name, s) in &self.schedules {
            s.trigger(name)?;
            s.missed(name)?;
            s.check_action(name)?;
            if let Some(message) = &s.message
                && router.resolve(message).is_empty()
            {
                return Err(ConfigError::new(format!(
                    "schedules.{name}.message: no [routing] entry sends `{message}` to a transport"
                )));
            }
        }
        Ok(())
    }

    /// The default bus's name: `default_bus`, else the only bus declared, else
    /// [`DEFAULT_BUS`](crate::DEFAULT_BUS).
    #[must_use]
    pub fn default_bus_name(&self) -> &str {
        buses::default_bus(self.default_bus.as_deref(), &self.buses)
    }

    /// The router the `[routing]` table describes.
    #[must_use]
    pub fn router(&self) -> Router {
        let mut router = Router::new();
        for (pattern, target) in &self.routing {
            router.add(pattern, target.names());
        }
        router
    }

    /// The DSN of a transport with its `options` merged in, and the `concurrency_max` a
    /// `[limits.concurrency]` table routed to it gives.
    #[must_use]
    pub fn effective_dsn(&self, name: &str) -> Option<Dsn> {
        let mut dsn = self.own_dsn(name)?;
        let maxima = self
            .limits
            .transport_maxima(&self.router(), |t| self.own_option(t, "concurrency_max"))
            .unwrap_or_default();
        if let Some((max, _)) = maxima.get(name) {
            dsn = dsn.with_option("concurrency_max".to_owned(), max.to_string());
        }
        Some(dsn)
    }

    /// The DSN of a transport with its `options` merged in.
    fn own_dsn(&self, name: &str) -> Option<Dsn> {
        let t = self.transports.get(name)?;
        let mut dsn = t.dsn_of_format();
        for (k, v) in t.options.iter() {
            if let Some(v) = v {
                dsn = dsn.with_option(k, v);
            }
        }
        Some(dsn)
    }

    fn own_option(&self, transport: &str, option: &str) -> Option<String> {
        self.own_dsn(transport)?.option(option).map(str::to_owned)
    }

    /// The failure transport of a transport (its own, else the global one).
    #[must_use]
    pub fn failure_transport_of(&self, name: &str) -> Option<&str> {
        self.transports
            .get(name)?
            .failure_transport
            .as_deref()
            .or(self.failure_transport.as_deref())
    }

    /// The failure transports (those some transport names as its `failure_transport`), sorted,
    /// each once.
    #[must_use]
    pub fn failure_transport_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .transports
            .keys()
            .filter_map(|n| self.failure_transport_of(n).map(str::to_owned))
            .collect();
        names.sort();
        names.dedup();
        names
    }
}

/// Describes a TOML error by line and key, never quoting the line itself (it may hold a password).
fn toml_error(text: &str, e: &toml::de::Error) -> ConfigError {
    let message = e.message().trim_end();
    let Some(span) = e.span() else {
        return ConfigError::new(message.to_owned());
    };
    let before = &text[..span.start.min(text.len())];
    let line_no = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let line = text[line_start..].lines().next().unwrap_or("");
    let key = line
        .split_once('=')
        .map(|(k, _)| k.trim())
        .filter(|k| !k.is_empty() && !k.starts_with('['));
    match key {
        Some(key) => ConfigError::new(format!("line {line_no}, key `{key}`: {message}")),
        None => ConfigError::new(format!("line {line_no}: {message}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, String> {
        Config::parse_with(text, |k| (k == "SET").then(|| "in-memory://".to_owned()))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_transport_dsn_that_does_not_parse_never_shows_its_password() {
        for dsn in [
            "postgres://user:ab/cd+ef==@db:nope/app",
            "postgres://user:s3cr#t@db:nope/app",
            "redis://:pa?ss@db:nope",
        ] {
            let err = parse(&format!("[transports.a]\ndsn = \"{dsn}\""))
                .err()
                .unwrap_or_default();
            assert!(err.contains("percent-encode"), "{err}");
            for secret in ["ab/cd", "ef==", "s3cr#t", "pa?ss"] {
                assert!(!err.contains(secret), "{err}");
            }
        }
    }

    #[test]
    fn interpolation_uses_the_variable_then_the_default() {
        let c =
            parse("[transports.a]\ndsn = \"${SET}\"\n[transports.b]\ndsn = \"${UNSET:-sync://}\"")
                .unwrap_or_default();
        assert_eq!(c.transports["a"].dsn.scheme(), "in-memory");
        assert_eq!(c.transports["b"].dsn.scheme(), "sync");
    }

    #[test]
    fn an_unset_variable_without_default_is_named() {
        let err = parse("[transports.a]\ndsn = \"${NOPE}\"")
            .err()
            .unwrap_or_default();
        assert!(err.contains("`NOPE` is not set"), "{err}");
    }

    #[test]
    fn unknown_keys_are_named_with_their_place() {
        let err = parse("[transports.a]\ndsn = \"sync://\"\nretry = { max_retry = 3 }")
            .err()
            .unwrap_or_default();
        assert!(err.contains("unknown field `max_retry`"), "{err}");
        let err = parse("[transport.a]\ndsn = \"sync://\"")
            .err()
            .unwrap_or_default();
        assert!(err.contains("unknown field `transport`"), "{err}");
    }

    #[test]
    fn bad_durations_and_dsns_are_named() {
        let err = parse("[transports.a]\ndsn = \"sync://\"\nretry = { delay = \"soon\" }")
            .err()
            .unwrap_or_default();
        assert!(err.contains("invalid duration `soon`"), "{err}");
        let err = parse("[transports.a]\ndsn = \"postgres://u:hunter2@h:x/db\"")
            .err()
            .unwrap_or_default();
        assert!(
            err.contains("invalid port") && err.contains("key `dsn`"),
            "{err}"
        );
        assert!(!err.contains("hunter2"), "{err}");
    }

    #[test]
    fn routing_and_failure_transports_must_exist() {
        let err = parse("[transports.a]\ndsn = \"sync://\"\n[routing]\n\"x.*\" = \"b\"")
            .err()
            .unwrap_or_default();
        assert!(
            err.contains("routing.\"x.*\": unknown transport `b`"),
            "{err}"
        );
        let err = parse("[transports.a]\ndsn = \"sync://\"\nfailure_transport = \"f\"")
            .err()
            .unwrap_or_default();
        assert!(
            err.contains("transports.a.failure_transport: unknown transport `f`"),
            "{err}"
        );
    }

    #[test]
    fn agent_tables_are_kept_and_never_shown() {
        let text = "[agents.a]\nmodel = \"m\"\n[[agents.a.providers]]\nbase_url = \"http://127.0.0.1/v1\"\napi_key = \"${KEY}\"";
        let config = Config::parse_with(text, |v| (v == "KEY").then(|| "sk-agent-key".to_owned()))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            config.agents.0["a"].get("model"),
            Some(serde_json::json!("m"))
        );
        assert!(
            !format!("{config:?}").contains("sk-agent-key"),
            "{config:?}"
        );
    }

    #[test]
    fn the_signing_table_reads_interpolated_keys_and_never_shows_them() {
        let key = "k".repeat(40);
        let text = "[signing]\nkeys = [\"${KEY}\", \"${OLD:-}\"]\nmessages = [\"orders.*\"]";
        let config = Config::parse_with(text, |v| (v == "KEY").then(|| key.clone()))
            .unwrap_or_else(|e| panic!("{e}"));
        let signing = config.signing.as_ref().map(|s| s.signing().clone());
        assert!(signing.as_ref().is_some_and(|s| s.signs("orders.placed")));
        assert!(signing.is_some_and(|s| !s.signs("mail.sent")));
        assert!(!format!("{config:?}").contains(&key), "{config:?}");
        let short = parse("[signing]\nkeys = [\"short-secret\"]").expect_err("too short");
        assert!(
            short.contains("signing.keys") && short.contains("shorter than"),
            "{short}"
        );
        assert!(!short.contains("short-secret"), "{short}");
        let unknown = parse("[signing]\nkeys = []\nkey = 1").expect_err("unknown key");
        assert!(unknown.contains("key"), "{unknown}");
    }

    #[test]
    fn retry_table_builds_the_strategy() {
        let c = parse("[transports.a]\ndsn = \"sync://\"\nretry = { max_retries = 5, delay = \"250ms\", multiplier = 3.0, max_delay = \"2s\", jitter = 0.0 }")
            .unwrap_or_default();
        let s = c.transports["a"].retry.strategy();
        assert_eq!(s.delay_for(0), Duration::from_millis(250));
        assert_eq!(s.delay_for(1), Duration::from_millis(750));
        assert_eq!(s.delay_for(5), Duration::from_secs(2));
    }

    #[test]
    fn handler_timeout_is_a_positive_duration_or_absent() {
        let c = parse("[transports.a]\ndsn = \"sync://\"\nhandler_timeout = \"90s\"")
            .unwrap_or_default();
        assert_eq!(
            c.transports["a"].handler_timeout,
            Some(Duration::from_secs(90))
        );
        let c = parse("[transports.a]\ndsn = \"sync://\"").unwrap_or_default();
        assert_eq!(c.transports["a"].handler_timeout, None, "off by default");
        let err = parse("[transports.a]\ndsn = \"sync://\"\nhandler_timeout = \"0s\"")
            .err()
            .unwrap_or_default();
        assert!(
            err.contains("transports.a.handler_timeout: must be longer than zero"),
            "{err}"
        );
        let err = parse("[transports.a]\ndsn = \"sync://\"\nhandler_timeout = \"soon\"")
            .err()
            .unwrap_or_default();
        assert!(
            err.contains("handler_timeout") && err.contains("invalid duration `soon`"),
            "{err}"
        );
    }

    #[test]
    fn options_override_the_dsn_query() {
        let c = parse("[transports.a]\ndsn = \"in-memory://?redeliver_timeout=1s\"\noptions = { redeliver_timeout = \"5s\", serialize = true }")
            .unwrap_or_default();
        let dsn = c.effective_dsn("a").map(|d| {
            (
                d.option("redeliver_timeout").map(str::to_owned),
                d.option("serialize").map(str::to_owned),
            )
        });
        assert_eq!(dsn, Some((Some("5s".into()), Some("true".into()))));
    }
}
