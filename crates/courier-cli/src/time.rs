//! RFC 3339 times for JSON and tables.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `2026-11-30T01:02:03.456Z`.
pub(crate) fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// An epoch-milliseconds time as RFC 3339.
#[cfg_attr(
    not(feature = "runs"),
    allow(dead_code, reason = "used by the runs commands")
)]
pub(crate) fn rfc3339_ms(ms: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    rfc3339(t)
}
