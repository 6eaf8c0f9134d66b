//! A schedule store in one process, on tokio's (pausable) clock: for tests and single-process
//! setups.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::{Held, ScheduleState, ScheduleStore};
use crate::TransportError;

#[derive(Debug)]
struct Entry {
    owner: String,
    until: Instant,
    last: Option<i64>,
}

/// Schedules' leases and last ticks in memory; leases run on tokio's clock, so a test with a
/// paused clock controls their expiry.
#[derive(Debug, Default)]
pub struct InMemoryScheduleStore {
    entries: Mutex<HashMap<String, Entry>>,
}

impl InMemoryScheduleStore {
    /// An empty store.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[async_trait]
impl ScheduleStore for InMemoryScheduleStore {
    async fn claim(
        &self,
        schedule: &str,
        owner: &str,
        lease: Duration,
    ) -> Result<Option<Held>, TransportError> {
        let now = Instant::now();
        let mut entries = self.lock();
        let entry = entries.entry(schedule.to_owned()).or_insert_with(|| Entry {
            owner: owner.to_owned(),
            until: now,
            last: None,
        });
        if entry.owner != owner && entry.until >= now {
            return Ok(None);
        }
        entry.owner = owner.to_owned();
        entry.until = now + lease;
        Ok(Some(Held::new(entry.last)))
    }

    async fn advance(
        &self,
        schedule: &str,
        owner: &str,
        tick_ms: i64,
    ) -> Result<bool, TransportError> {
        let now = Instant::now();
        let mut entries = self.lock();
        match entries.get_mut(schedule) {
            Some(e) if e.owner == owner && e.until >= now && e.last.is_none_or(|l| l < tick_ms) => {
                e.last = Some(tick_ms);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn state(&self, schedule: &str) -> Result<Option<ScheduleState>, TransportError> {
        let now = Instant::now();
        Ok(self.lock().get(schedule).map(|e| {
            let left = i64::try_from(e.until.saturating_duration_since(now).as_millis())
                .unwrap_or(i64::MAX);
            ScheduleState::new(Some(e.owner.clone()), super::now_ms() + left, e.last)
        }))
    }

    fn location(&self) -> Option<String> {
        Some(format!("in-memory://{:p}", self))
    }
}
