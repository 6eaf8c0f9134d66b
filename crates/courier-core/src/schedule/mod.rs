//! Recurring schedules (Symfony Scheduler, Oban Cron, River periodic jobs): a message sent on a
//! cron expression or a fixed interval, by whichever worker holds the schedule's lease, so N
//! workers on N hosts fire each tick exactly once.
//!
//! The lease and the last fired tick live together in a [`ScheduleStore`] the workers share
//! (a `<table>_schedules` row on SQL, one key per schedule on Redis,
//! [`InMemoryScheduleStore`] in a process). A [`Scheduler`] claims (or renews) each schedule's
//! lease every poll; the holder computes the ticks due since the last fired one, fires each, and
//! once it fired records it with [`ScheduleStore::advance`], which succeeds only while the lease
//! is live and the stored tick is older, in one statement or script. A tick is thus fired at
//! least once: a fire that fails is logged and fired again at the next poll, and a holder that
//! dies (or loses its lease) between firing a tick and recording it leaves the tick to the next
//! holder, which fires it again. A [`Fire`] that deduplicates on the schedule and tick (the
//! `courier` command line sends each tick with a deduplication key and a message id derived from
//! both) makes each tick take effect once.
//!
//! A worker killed while holding a lease stops renewing it; once it expires another worker takes
//! it and owes the ticks since the last fired one, per [`Missed`]: `skip` fires the newest of
//! them if it is late by less than the lease, `catch_up` fires up to [`Missed::CatchUp`]'s bound,
//! oldest first. A schedule seen for the first time starts from the current time (nothing in the
//! past fires). Ticks are computed from the worker's clock (keep hosts in NTP sync); leases use
//! the store's clock.

mod memory;
mod scheduler;
mod trigger;

use std::time::Duration;

use async_trait::async_trait;
use serde::Serialize;

use crate::TransportError;

pub use memory::InMemoryScheduleStore;
pub use scheduler::{Fire, Schedule, Scheduler, shared_schedule_store};
pub use trigger::{Trigger, TriggerError};

/// How long a schedule's lease lasts unless renewed (workers renew it every poll).
pub const DEFAULT_SCHEDULE_LEASE: Duration = Duration::from_secs(3);

/// The default bound of [`Missed::CatchUp`].
pub const DEFAULT_CATCH_UP: u32 = 10;

/// What a new lease holder does with the ticks that passed while no one held the lease (a
/// downtime, a killed holder).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Missed {
    /// Fire only the newest due tick, and only if it is late by less than the lease.
    #[default]
    Skip,
    /// Fire the due ticks, oldest first, at most this many (the newest ones).
    CatchUp(u32),
}

/// What a successful [`ScheduleStore::claim`] tells the holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Held {
    /// The last fired tick (epoch ms), `None` for a schedule never fired.
    pub last_tick_ms: Option<i64>,
}

impl Held {
    /// A claim reply.
    #[must_use]
    pub const fn new(last_tick_ms: Option<i64>) -> Self {
        Self { last_tick_ms }
    }
}

/// A schedule's shared state, for `courier schedules`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ScheduleState {
    /// The worker holding the lease (possibly expired).
    pub owner: Option<String>,
    /// When the lease expires (epoch ms, the store's clock).
    pub lease_until_ms: i64,
    /// The last fired tick (epoch ms).
    pub last_tick_ms: Option<i64>,
}

impl ScheduleState {
    /// A state as read from a store.
    #[must_use]
    pub const fn new(
        owner: Option<String>,
        lease_until_ms: i64,
        last_tick_ms: Option<i64>,
    ) -> Self {
        Self {
            owner,
            lease_until_ms,
            last_tick_ms,
        }
    }
}

/// The shared lease and last-fired-tick store of the schedules.
#[async_trait]
pub trait ScheduleStore: Send + Sync {
    /// Takes the lease of `schedule` for `owner` when it is free or expired, or renews it when
    /// `owner` holds it, for `lease` from now (the store's clock), in one atomic step. `Some`
    /// when `owner` holds it afterwards, `None` when another worker does.
    async fn claim(
        &self,
        schedule: &str,
        owner: &str,
        lease: Duration,
    ) -> Result<Option<Held>, TransportError>;

    /// Records `tick_ms` as the last fired tick, only if `owner` holds a live lease and the stored
    /// tick is older (or none), in one atomic step. `true`: the caller fires this tick.
    async fn advance(
        &self,
        schedule: &str,
        owner: &str,
        tick_ms: i64,
    ) -> Result<bool, TransportError>;

    /// The schedule's state, `None` when never claimed.
    async fn state(&self, schedule: &str) -> Result<Option<ScheduleState>, TransportError>;

    /// Where the state lives, redacted, for logs and docs.
    fn location(&self) -> Option<String> {
        None
    }
}

const _: () = {
    fn _obj_safe(_: &dyn ScheduleStore) {}
};

/// Parses a `missed` setting: `skip`, `catch_up` (bound [`DEFAULT_CATCH_UP`]).
///
/// # Errors
/// A message naming the accepted values.
pub fn parse_missed(text: &str) -> Result<Missed, String> {
    match text {
        "skip" => Ok(Missed::Skip),
        "catch_up" => Ok(Missed::CatchUp(DEFAULT_CATCH_UP)),
        other => Err(format!(
            "unknown value `{other}` (expected `skip` or `catch_up`)"
        )),
    }
}

/// The current wall-clock time in epoch ms.
#[must_use]
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}
