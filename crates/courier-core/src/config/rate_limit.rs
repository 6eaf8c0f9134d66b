//! `rate_limit = { ... }` on a transport (Symfony's `rate_limiter`): see
//! [`RateLimit`](crate::RateLimit).

use serde::Deserialize;

use super::ConfigError;
use crate::RateLimit;

/// A transport's `rate_limit` table: at most `limit` messages per `interval`, shared by every
/// worker of the transport, in bursts of at most `burst` (default a tenth of the limit).
///
/// ```toml
/// [transports.mail]
/// dsn = "postgres://localhost/app"
/// rate_limit = { limit = 50, interval = "1s" }   # burst = 5 by default
/// ```
///
/// Values are read as written and checked by [`Config::validate`](super::Config::validate), so
/// a zero, negative or malformed one is an error naming its key.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct RateLimitConfig {
    /// Messages per interval (a positive whole number).
    pub limit: i64,
    /// The interval (`"1s"`, `"1min"`; default `"1s"`).
    #[serde(default)]
    pub interval: Option<String>,
    /// The largest burst (`1..=limit`; default a tenth of the limit, at least 1).
    #[serde(default)]
    pub burst: Option<i64>,
}

impl RateLimitConfig {
    /// The limit of transport `transport`.
    ///
    /// # Errors
    /// [`ConfigError`] naming `transports.NAME.rate_limit.<key>`.
    pub fn rate_limit(&self, transport: &str) -> Result<RateLimit, ConfigError> {
        let key = |k: &str, why: String| {
            ConfigError::new(format!("transports.{transport}.rate_limit.{k}: {why}"))
        };
        let limit = u32::try_from(self.limit)
            .ok()
            .filter(|l| *l > 0)
            .ok_or_else(|| {
                key(
                    "limit",
                    format!(
                        "expected a positive whole number of messages, got {}",
                        self.limit
                    ),
                )
            })?;
        let text = self.interval.as_deref().unwrap_or("1s");
        let interval = humantime::parse_duration(text).map_err(|e| {
            key(
                "interval",
                format!("invalid duration `{text}` ({e}); write e.g. \"1s\", \"1min\""),
            )
        })?;
        let rate = RateLimit::new(limit, interval)
            .ok_or_else(|| key("interval", "must be longer than zero".to_owned()))?;
        match self.burst {
            None => Ok(rate),
            Some(b) if (1..=i64::from(limit)).contains(&b) => {
                Ok(rate.with_burst(u32::try_from(b).unwrap_or(limit)))
            }
            Some(b) => Err(key("burst", format!("expected 1 to {limit}, got {b}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(table: &str) -> Result<RateLimit, String> {
        let c: RateLimitConfig = toml::from_str(table).map_err(|e| e.to_string())?;
        c.rate_limit("t").map_err(|e| e.to_string())
    }

    #[test]
    fn bad_values_name_their_key() {
        for (table, key) in [
            ("limit = 0", "transports.t.rate_limit.limit"),
            ("limit = -5", "transports.t.rate_limit.limit"),
            (
                "limit = 5\ninterval = \"0s\"",
                "transports.t.rate_limit.interval",
            ),
            (
                "limit = 5\ninterval = \"soon\"",
                "transports.t.rate_limit.interval",
            ),
            ("limit = 5\nburst = 0", "transports.t.rate_limit.burst"),
            ("limit = 5\nburst = 6", "transports.t.rate_limit.burst"),
        ] {
            let err = parse(table).expect_err(table);
            assert!(err.contains(key), "{table}: {err}");
        }
    }

    #[test]
    fn the_interval_defaults_to_a_second_and_the_burst_to_a_tenth() {
        let rate = parse("limit = 50").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(rate.interval(), std::time::Duration::from_secs(1));
        assert_eq!(rate.burst(), 5);
        let rate =
            parse("limit = 50\ninterval = \"1min\"\nburst = 50").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(rate.burst(), 50);
    }
}
