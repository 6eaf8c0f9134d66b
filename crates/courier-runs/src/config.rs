//! `[runs]` configuration, with humantime durations.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{Backoff, Jitter, ReapOptions, RuntimeOptions};

/// The `[runs]` table of `courier.toml`.
///
/// ```
/// use courier_runs::RunsConfig;
/// let config: RunsConfig = toml::from_str(r#"
///     store = "sqlite://courier.db"
///     lease = "15min"
///     backoff = { base = "30s", cap = "10min" }
///     reap_every = "30s"
/// "#).unwrap();
/// config.validate().unwrap();
/// assert_eq!(config.lease.as_secs(), 900);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunsConfig {
    /// The run store DSN (None: the CLI's default database).
    pub store: Option<String>,
    /// Lease of a claimed run (default 900 s).
    #[serde(with = "human")]
    pub lease: Duration,
    /// Requeues allowed (default 3).
    pub max_requeues: u32,
    /// Requeue backoff.
    pub backoff: BackoffConfig,
    /// Most stale runs one reap handles (default 50).
    pub reap_limit: usize,
    /// Reap every this often inside `consume` (None: never).
    #[serde(with = "human_opt")]
    pub reap_every: Option<Duration>,
    /// How long past its due time a queued run waits before the reaper dispatches its
    /// `RunAgent` again, its message presumably lost (None: the lease).
    #[serde(with = "human_opt")]
    pub redispatch_after: Option<Duration>,
    /// The longest a step may take (from the run's start or a step boundary to the next
    /// boundary, the heartbeat cadence): a longer step is cancelled and fails the execution as
    /// a retryable timeout, requeued with backoff like any retryable failure. The lease must be
    /// longer. None: no limit.
    #[serde(with = "human_opt")]
    pub step_timeout: Option<Duration>,
    /// How long finished runs (completed, failed, cancelled) are kept: the reaper deletes
    /// those finished longer ago, with their events and steps, at most `reap_limit` per pass.
    /// None (default): kept forever (`courier runs prune` deletes them on demand).
    #[serde(with = "human_opt")]
    pub retention: Option<Duration>,
    /// The largest result a durable step may journal, in bytes of JSON (default 1 MiB).
    pub max_step_result: usize,
    /// Whether a worker creates and migrates the run store's tables when it connects (default
    /// true). Off, it only checks them: a missing or older schema stops it at startup, naming
    /// the first missing migration (apply `courier setup --print-sql` with your own migration
    /// tool, or run `courier setup`, which always migrates).
    pub auto_setup: bool,
}

/// `backoff = { base, cap, jitter }`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BackoffConfig {
    /// First delay (default 30 s).
    #[serde(with = "human")]
    pub base: Duration,
    /// Longest delay (default 10 min).
    #[serde(with = "human")]
    pub cap: Duration,
    /// Fraction taken off at random, 0 to 1 (default 0): [`Jitter::Shorten`].
    pub jitter: f64,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        let b = crate::runtime::REQUEUE_BACKOFF;
        Self {
            base: b.base,
            cap: b.cap,
            jitter: 0.0,
        }
    }
}

impl Default for RunsConfig {
    fn default() -> Self {
        Self {
            store: None,
            lease: Duration::from_secs(900),
            max_requeues: 3,
            backoff: BackoffConfig::default(),
            reap_limit: 50,
            reap_every: None,
            redispatch_after: None,
            step_timeout: None,
            retention: None,
            max_step_result: crate::DEFAULT_MAX_STEP_RESULT,
            auto_setup: true,
        }
    }
}

/// A `[runs]` value is invalid; `key` names it (`runs.lease`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid `{key}`: {message}")]
pub struct RunsConfigError {
    /// The dotted key.
    pub key: &'static str,
    /// What is wrong.
    pub message: String,
}

/// The shortest lease accepted: a shorter one would expire between two database round trips.
pub const MIN_LEASE: Duration = Duration::from_secs(1);

/// The shortest `redispatch_after` accepted.
pub const MIN_REDISPATCH_AFTER: Duration = Duration::from_secs(1);

fn fmt(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

impl RunsConfig {
    /// Checks a reaper interval against these values (`runs.reap_every` or a command line's
    /// `--reap-every`): longer than 0 and not longer than the lease. The message names no key.
    ///
    /// # Errors
    /// What is wrong with `every`.
    pub fn check_reap_every(&self, every: Duration) -> Result<(), String> {
        if every.is_zero() {
            return Err("must be longer than 0s".into());
        }
        if every > self.lease {
            return Err(format!(
                "{} must not be longer than runs.lease ({})",
                fmt(every),
                fmt(self.lease)
            ));
        }
        Ok(())
    }

    /// The threshold of the reaper's re-dispatch of overdue queued runs: `redispatch_after`,
    /// else the lease.
    #[must_use]
    pub fn redispatch_after(&self) -> Duration {
        self.redispatch_after.unwrap_or(self.lease)
    }

    /// Checks the values together: lease >= 1 s ([`MIN_LEASE`]) and > step_timeout;
    /// reap_every <= lease and > 0; redispatch_after >= 1 s; base <= cap; jitter in [0, 1];
    /// reap_limit > 0.
    ///
    /// # Errors
    /// The first bad key.
    pub fn validate(&self) -> Result<(), RunsConfigError> {
        let err = |key, message: String| Err(RunsConfigError { key, message });
        if self.lease < MIN_LEASE {
            return err(
                "runs.lease",
                format!(
                    "{} is too short: a lease must be at least {}",
                    fmt(self.lease),
                    fmt(MIN_LEASE)
                ),
            );
        }
        if let Some(step) = self.step_timeout
            && self.lease <= step
        {
            return err(
                "runs.lease",
                format!(
                    "{} must be longer than runs.step_timeout ({})",
                    fmt(self.lease),
                    fmt(step)
                ),
            );
        }
        if let Some(every) = self.reap_every
            && let Err(message) = self.check_reap_every(every)
        {
            return err("runs.reap_every", message);
        }
        if let Some(after) = self.redispatch_after
            && after < MIN_REDISPATCH_AFTER
        {
            return err(
                "runs.redispatch_after",
                format!(
                    "{} is too short: it must be at least {}",
                    fmt(after),
                    fmt(MIN_REDISPATCH_AFTER)
                ),
            );
        }
        if self.backoff.base > self.backoff.cap {
            return err(
                "runs.backoff.base",
                format!(
                    "{} must not exceed runs.backoff.cap ({})",
                    fmt(self.backoff.base),
                    fmt(self.backoff.cap)
                ),
            );
        }
        if !(0.0..=1.0).contains(&self.backoff.jitter) {
            return err(
                "runs.backoff.jitter",
                format!("{} is not between 0 and 1", self.backoff.jitter),
            );
        }
        if self.reap_limit == 0 {
            return err("runs.reap_limit", "must be at least 1".into());
        }
        if self.retention == Some(Duration::ZERO) {
            return err(
                "runs.retention",
                "must be longer than 0 (leave it out to keep finished runs)".into(),
            );
        }
        if self.max_step_result == 0 {
            return err("runs.max_step_result", "must be at least 1 byte".into());
        }
        Ok(())
    }

    /// The runtime options these values give.
    #[must_use]
    pub fn runtime_options(&self) -> RuntimeOptions {
        RuntimeOptions {
            lease: self.lease,
            max_requeues: self.max_requeues,
            backoff: Backoff::new(self.backoff.base, self.backoff.cap).jitter(
                if self.backoff.jitter > 0.0 {
                    Jitter::Shorten(self.backoff.jitter)
                } else {
                    Jitter::None
                },
            ),
            lease_check_every: Some((self.lease / 4).min(crate::runtime::CANCEL_CHECK_EVERY)),
            step_timeout: self.step_timeout,
            redispatch_after: Some(self.redispatch_after()),
            max_step_result: self.max_step_result,
            retention: self.retention,
        }
    }

    /// The reap options these values give.
    #[must_use]
    pub fn reap_options(&self) -> ReapOptions {
        ReapOptions {
            limit: self.reap_limit,
            dry_run: false,
        }
    }
}

mod human {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&humantime::format_duration(*d))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_duration(&text)
            .map_err(|e| serde::de::Error::custom(format!("`{text}`: {e}")))
    }
}

mod human_opt {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.collect_str(&humantime::format_duration(*d)),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_duration(&text)
            .map(Some)
            .map_err(|e| serde::de::Error::custom(format!("`{text}`: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<RunsConfig, toml::de::Error> {
        toml::from_str(text)
    }

    #[test]
    fn defaults_are_the_seeds() {
        let c = parse("").expect("empty table");
        assert_eq!(c, RunsConfig::default());
        assert_eq!(c.lease, Duration::from_secs(900));
        assert_eq!(c.max_requeues, 3);
        assert_eq!(c.backoff.base, Duration::from_secs(30));
        assert_eq!(c.backoff.cap, Duration::from_secs(600));
        assert_eq!(c.reap_limit, 50);
        c.validate().expect("defaults are valid");
    }

    #[test]
    fn durations_are_humantime_strings() {
        let c = parse("lease = \"2min\"\nreap_every = \"30s\"\nbackoff = { base = \"250ms\", cap = \"1h\", jitter = 0.1 }")
            .expect("valid");
        assert_eq!(c.lease, Duration::from_secs(120));
        assert_eq!(c.reap_every, Some(Duration::from_secs(30)));
        assert_eq!(c.backoff.base, Duration::from_millis(250));
        assert!(parse("lease = 900").is_err());
        assert!(parse("lease = \"soon\"").is_err());
    }

    #[test]
    fn retention_and_the_step_result_cap_reach_the_runtime() {
        let c = parse("retention = \"30d\"\nmax_step_result = 4096").expect("parses");
        c.validate().expect("valid");
        let options = c.runtime_options();
        assert_eq!(options.retention, Some(Duration::from_secs(30 * 86_400)));
        assert_eq!(options.max_step_result, 4096);
        let defaults = RunsConfig::default().runtime_options();
        assert_eq!(
            (defaults.retention, defaults.max_step_result),
            (None, 1 << 20)
        );
        let zero = parse("retention = \"0s\"").expect("parses");
        assert_eq!(zero.validate().map_err(|e| e.key), Err("runs.retention"));
        let zero = parse("max_step_result = 0").expect("parses");
        assert_eq!(
            zero.validate().map_err(|e| e.key),
            Err("runs.max_step_result")
        );
    }

    #[test]
    fn unknown_keys_are_errors() {
        let e = parse("leese = \"1s\"")
            .expect_err("unknown key")
            .to_string();
        assert!(e.contains("leese"), "{e}");
        assert!(parse("backoff = { bse = \"1s\" }").is_err());
    }

    #[test]
    fn validation_names_the_key() {
        let c = parse("lease = \"1min\"\nreap_every = \"2min\"").expect("parses");
        assert_eq!(c.validate().map_err(|e| e.key), Err("runs.reap_every"));
        let c = parse("lease = \"30s\"\nstep_timeout = \"1min\"").expect("parses");
        let e = c.validate().expect_err("lease shorter than step timeout");
        assert_eq!(e.key, "runs.lease");
        assert!(e.to_string().contains("runs.lease"), "{e}");
        let c = parse("backoff = { base = \"1h\", cap = \"1min\" }").expect("parses");
        assert_eq!(c.validate().map_err(|e| e.key), Err("runs.backoff.base"));
        let c = parse("backoff = { jitter = 2.0 }").expect("parses");
        assert_eq!(c.validate().map_err(|e| e.key), Err("runs.backoff.jitter"));
        let c = parse("reap_limit = 0").expect("parses");
        assert_eq!(c.validate().map_err(|e| e.key), Err("runs.reap_limit"));
    }

    #[test]
    fn a_lease_under_one_second_is_refused() {
        let c = parse("lease = \"1ms\"").expect("parses");
        let e = c.validate().expect_err("1 ms lease");
        assert_eq!(e.key, "runs.lease");
        assert!(e.to_string().contains("at least 1s"), "{e}");
        let c = parse("lease = \"0s\"").expect("parses");
        assert_eq!(c.validate().map_err(|e| e.key), Err("runs.lease"));
        parse("lease = \"1s\"")
            .expect("parses")
            .validate()
            .expect("1 s is the minimum");
    }

    #[test]
    fn redispatch_after_defaults_to_the_lease_and_is_validated() {
        let c = parse("lease = \"2min\"").expect("parses");
        assert_eq!(c.redispatch_after(), Duration::from_secs(120));
        assert_eq!(
            c.runtime_options().redispatch_after,
            Some(Duration::from_secs(120))
        );
        let c = parse("redispatch_after = \"30s\"").expect("parses");
        c.validate().expect("valid");
        assert_eq!(c.redispatch_after(), Duration::from_secs(30));
        let c = parse("redispatch_after = \"10ms\"").expect("parses");
        assert_eq!(
            c.validate().map_err(|e| e.key),
            Err("runs.redispatch_after")
        );
    }

    #[test]
    fn a_reap_interval_is_checked_against_the_lease() {
        let c = parse("lease = \"1min\"").expect("parses");
        assert!(c.check_reap_every(Duration::from_secs(30)).is_ok());
        let e = c
            .check_reap_every(Duration::from_secs(120))
            .expect_err("longer than the lease");
        assert!(e.contains("runs.lease (1m)"), "{e}");
        assert!(c.check_reap_every(Duration::ZERO).is_err());
    }
}
