//! The flow-control message: `chaos.keyed`, one tenant's unit of work. Its handler works for
//! `work_ms`, then records the handling in the sink (table `chaos_keyed`) with its start and
//! end by the wall clock, so the harness can count, per tenant, the handlings that overlapped
//! across every worker process.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use courier_core::{HandlerError, Message};
use serde::{Deserialize, Serialize};

/// A tenant's message; the configuration keys it by `$.tenant`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyedItem {
    /// The message's number, 0..N per scenario.
    pub id: u64,
    /// The concurrency key.
    pub tenant: String,
    /// How long the handler works.
    pub work_ms: u64,
}

impl Message for KeyedItem {
    const NAME: &'static str = "chaos.keyed";
}

/// Microseconds since the Unix epoch by the wall clock (the workers and the harness share it).
#[must_use]
pub fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

/// The handler: works, then records the handling. A handling whose process is killed before it
/// records is not counted (its slot stays taken until its lease ends; the harness's count only
/// under-states what was in flight, never over-states it).
///
/// # Errors
/// [`HandlerError`] (recoverable) when the sink cannot be written.
pub async fn handle(item: &KeyedItem) -> Result<(), HandlerError> {
    let start = now_us();
    tokio::time::sleep(Duration::from_millis(item.work_ms)).await;
    let id = i64::try_from(item.id).map_err(|_| HandlerError::unrecoverable("id out of range"))?;
    let pid = i64::from(std::process::id());
    let end = now_us();
    crate::sink::write(|| {
        sqlx::query(
            "INSERT INTO chaos_keyed (id, tenant, pid, start_us, end_us) VALUES (?, ?, ?, ?, ?)",
        )
        .bind(id)
        .bind(item.tenant.as_str())
        .bind(pid)
        .bind(start)
        .bind(end)
    })
    .await
    .map_err(|e| HandlerError::recoverable(e, None))
}

/// One recorded handling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handling {
    /// The message's number.
    pub id: i64,
    /// Its key.
    pub tenant: String,
    /// The worker process.
    pub pid: i64,
    /// When its handler started (µs).
    pub start_us: i64,
    /// When it finished (µs).
    pub end_us: i64,
}

/// Every recorded handling, oldest first.
///
/// # Errors
/// The driver's error.
pub async fn handlings(pool: &sqlx::SqlitePool) -> Result<Vec<Handling>, sqlx::Error> {
    let rows: Vec<(i64, String, i64, i64, i64)> = sqlx::query_as(
        "SELECT id, tenant, pid, start_us, end_us FROM chaos_keyed ORDER BY start_us",
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(id, tenant, pid, start_us, end_us)| Handling {
            id,
            tenant,
            pid,
            start_us,
            end_us,
        })
        .collect())
}

/// The most handlings of one key that overlapped, per key: a handling counts from its start to
/// its end (an end and a start at the same microsecond do not overlap: the slot is freed after
/// the end and taken before the start).
#[must_use]
pub fn most_in_flight(handlings: &[Handling]) -> std::collections::BTreeMap<String, usize> {
    let mut events: Vec<(&str, i64, i8)> = Vec::with_capacity(handlings.len() * 2);
    for h in handlings {
        events.push((&h.tenant, h.start_us, 1));
        events.push((&h.tenant, h.end_us, -1));
    }
    events.sort_by_key(|(key, at, delta)| (*key, *at, *delta));
    let mut most: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
    let mut live: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
    for (key, _, delta) in events {
        let n = live.entry(key).or_default();
        if delta > 0 {
            *n += 1;
        } else {
            *n = n.saturating_sub(1);
        }
        let m = most.entry(key.to_owned()).or_default();
        *m = (*m).max(*n);
    }
    most
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(tenant: &str, start_us: i64, end_us: i64) -> Handling {
        Handling {
            id: 0,
            tenant: tenant.to_owned(),
            pid: 1,
            start_us,
            end_us,
        }
    }

    #[test]
    fn overlaps_are_counted_per_key() {
        let most = most_in_flight(&[
            h("a", 0, 10),
            h("a", 5, 15),
            h("a", 10, 20),
            h("b", 0, 100),
            h("a", 14, 30),
        ]);
        assert_eq!(
            most["a"], 3,
            "5-15, 10-20 and 14-30 overlap; 0-10 ends as 10-20 starts"
        );
        assert_eq!(most["b"], 1);
    }
}
