//! `[schedules.NAME]`: recurring messages (see [`crate::schedule`]).

use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, de_opt_duration};
use crate::schedule::{Missed, Trigger, parse_missed};

/// One `[schedules.NAME]` table: what each tick does (send a message, or submit a durable run
/// with `agent` + `input`), and when.
///
/// ```toml
/// [schedules.report]
/// message = "app.report"              # the wire name, routed by [routing]
/// payload = { kind = "daily" }        # the message body (a TOML table as JSON)
/// cron = "0 0 6 * * *"                # 5 fields, or 6 with seconds first
/// timezone = "Europe/Berlin"          # IANA name, default UTC
/// missed = "catch_up"                 # or "skip" (the default)
///
/// [schedules.ping]
/// message = "app.ping"
/// every = "1s"
///
/// [schedules.cleanup]
/// agent = "scripted"                  # submits a durable run (needs runs wired)
/// input = { steps = [] }
/// every = "1h"
/// ```
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ScheduleConfig {
    /// The wire name of the message sent on each tick (exclusive with `agent`).
    #[serde(default)]
    pub message: Option<String>,
    /// The message body: a TOML table sent as JSON (default `{}`).
    #[serde(default)]
    pub payload: Option<super::Table>,
    /// The agent of the durable run submitted on each tick (exclusive with `message`).
    #[serde(default)]
    pub agent: Option<String>,
    /// The run's input: a TOML table as JSON (default `{}`).
    #[serde(default)]
    pub input: Option<super::Table>,
    /// A cron expression (exclusive with `every`).
    #[serde(default)]
    pub cron: Option<String>,
    /// The cron expression's IANA time zone (default `UTC`).
    #[serde(default)]
    pub timezone: Option<String>,
    /// A fixed interval (exclusive with `cron`).
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub every: Option<Duration>,
    /// `skip` (default) or `catch_up`: what a new lease holder does with missed ticks.
    #[serde(default)]
    pub missed: Option<String>,
}

impl ScheduleConfig {
    /// Its trigger.
    ///
    /// # Errors
    /// [`ConfigError`] naming `schedules.NAME.<key>`.
    pub fn trigger(&self, name: &str) -> Result<Trigger, ConfigError> {
        match (&self.cron, self.every) {
            (Some(cron), None) => Trigger::cron(cron, self.timezone.as_deref().unwrap_or("UTC"))
                .map_err(|e| {
                    let key = if e.to_string().contains("time zone") {
                        "timezone"
                    } else {
                        "cron"
                    };
                    ConfigError::new(format!("schedules.{name}.{key}: {e}"))
                }),
            (None, Some(every)) => {
                if self.timezone.is_some() {
                    return Err(ConfigError::new(format!(
                        "schedules.{name}.timezone: applies to `cron` only"
                    )));
                }
                Trigger::every(every)
                    .map_err(|e| ConfigError::new(format!("schedules.{name}.every: {e}")))
            }
            _ => Err(ConfigError::new(format!(
                "schedules.{name}: set exactly one of `cron` and `every`"
            ))),
        }
    }

    /// Its missed-tick policy.
    ///
    /// # Errors
    /// [`ConfigError`] naming `schedules.NAME.missed`.
    pub fn missed(&self, name: &str) -> Result<Missed, ConfigError> {
        self.missed
            .as_deref()
            .map_or(Ok(Missed::Skip), parse_missed)
            .map_err(|e| ConfigError::new(format!("schedules.{name}.missed: {e}")))
    }

    /// Checks that exactly one of `message` and `agent` is set, each with its own body key.
    ///
    /// # Errors
    /// [`ConfigError`] naming `schedules.NAME.<key>`.
    pub fn check_action(&self, name: &str) -> Result<(), ConfigError> {
        match (&self.message, &self.agent) {
            (Some(_), None) if self.input.is_some() => Err(ConfigError::new(format!(
                "schedules.{name}.input: applies to `agent` only (a message takes `payload`)"
            ))),
            (None, Some(_)) if self.payload.is_some() => Err(ConfigError::new(format!(
                "schedules.{name}.payload: applies to `message` only (a run takes `input`)"
            ))),
            (Some(_), None) | (None, Some(_)) => Ok(()),
            _ => Err(ConfigError::new(format!(
                "schedules.{name}: set exactly one of `message` and `agent`"
            ))),
        }
    }

    /// The body sent on each tick (the payload as JSON).
    #[must_use]
    pub fn body(&self) -> String {
        self.payload.as_ref().map_or_else(
            || "{}".to_owned(),
            |t| serde_json::to_string(t).unwrap_or_else(|_| "{}".to_owned()),
        )
    }

    /// The input of the run submitted on each tick (`input` as JSON).
    #[must_use]
    pub fn run_input(&self) -> serde_json::Value {
        self.input.as_ref().map_or_else(
            || serde_json::Value::Object(serde_json::Map::new()),
            |t| serde_json::to_value(t).unwrap_or_default(),
        )
    }
}
