//! When a schedule fires: a cron expression in a time zone, or a fixed interval aligned on the
//! Unix epoch (so every worker computes the same ticks).

use std::fmt;
use std::time::Duration;

use chrono::{TimeZone, Utc};

/// An invalid trigger: the expression, time zone or interval at fault (no panics, no defaults).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TriggerError(String);

/// When a schedule fires.
#[derive(Clone)]
#[non_exhaustive]
pub enum Trigger {
    /// Every interval, on multiples of it since the Unix epoch (`every = "5s"` fires at :00, :05…).
    Every(Duration),
    /// A cron expression (5 fields, or 6 with seconds first) in a time zone.
    Cron {
        /// The parsed expression.
        cron: Box<croner::Cron>,
        /// The time zone it is read in.
        tz: chrono_tz::Tz,
        /// The text, for display.
        text: String,
    },
}

impl fmt::Debug for Trigger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

impl Trigger {
    /// A fixed interval of at least 1 ms.
    ///
    /// # Errors
    /// [`TriggerError`] for an interval under 1 ms.
    pub fn every(interval: Duration) -> Result<Self, TriggerError> {
        if interval < Duration::from_millis(1) {
            return Err(TriggerError("the interval must be at least 1ms".to_owned()));
        }
        Ok(Self::Every(interval))
    }

    /// A cron expression (`*/5 * * * *`, or with seconds `*/5 * * * * *`) in the IANA time zone
    /// `tz` (`Europe/Berlin`, `UTC`).
    ///
    /// # Errors
    /// [`TriggerError`] naming the bad expression or unknown time zone.
    pub fn cron(expression: &str, tz: &str) -> Result<Self, TriggerError> {
        let zone: chrono_tz::Tz = tz
            .parse()
            .map_err(|_| TriggerError(format!("unknown time zone `{tz}`")))?;
        let cron = croner::Cron::new(expression)
            .with_seconds_optional()
            .parse()
            .map_err(|e| TriggerError(format!("invalid cron expression `{expression}`: {e}")))?;
        Ok(Self::Cron {
            cron: Box::new(cron),
            tz: zone,
            text: expression.to_owned(),
        })
    }

    /// The first tick strictly after `ms` (epoch ms), `None` when there is none.
    #[must_use]
    pub fn next_after(&self, ms: i64) -> Option<i64> {
        match self {
            Self::Every(d) => {
                let step = i64::try_from(d.as_millis()).ok()?.max(1);
                ms.div_euclid(step).checked_add(1)?.checked_mul(step)
            }
            Self::Cron { cron, tz, .. } => {
                let at = Utc.timestamp_millis_opt(ms).single()?.with_timezone(tz);
                cron.find_next_occurrence(&at, false)
                    .ok()
                    .map(|t| t.timestamp_millis())
            }
        }
    }

    /// What it is, for listings (`every 1s`, `cron */5 * * * * * (Europe/Berlin)`).
    #[must_use]
    pub fn describe(&self) -> String {
        match self {
            Self::Every(d) => format!("every {}", humantime::format_duration(*d)),
            Self::Cron { text, tz, .. } => format!("cron {text} ({tz})"),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn intervals_align_on_the_epoch() {
        let t = Trigger::every(Duration::from_secs(5)).unwrap();
        assert_eq!(t.next_after(0), Some(5_000));
        assert_eq!(t.next_after(4_999), Some(5_000));
        assert_eq!(t.next_after(5_000), Some(10_000));
        assert!(Trigger::every(Duration::ZERO).is_err());
    }

    #[test]
    fn cron_reads_seconds_and_time_zones() {
        let t = Trigger::cron("*/5 * * * * *", "Europe/Berlin").unwrap();
        assert_eq!(t.next_after(1_000), Some(5_000));
        // 02:00 Berlin is 01:00 UTC in winter.
        let daily = Trigger::cron("0 2 * * *", "Europe/Berlin").unwrap();
        assert_eq!(daily.next_after(0), Some(3_600_000));
        let err = Trigger::cron("not cron", "UTC").unwrap_err();
        assert!(err.to_string().contains("invalid cron expression"), "{err}");
        let err = Trigger::cron("* * * * *", "Mars/Olympus").unwrap_err();
        assert!(
            err.to_string().contains("unknown time zone `Mars/Olympus`"),
            "{err}"
        );
    }
}
