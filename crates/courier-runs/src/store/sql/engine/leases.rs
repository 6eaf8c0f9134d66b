//! What this store knows of the leases it set: for each run it claimed or renewed, a time by
//! which the lease cannot have run out. A step on SQLite or MySQL then leaves the run's row alone
//! (one statement: the step's row, guarded by the run's) while more than three quarters of the
//! lease is surely left, and renews it otherwise.
//!
//! The bound is taken from this process's monotonic clock before the statement that set the
//! lease was sent: the database ran it later, so the lease (which its own clock measures) lasts
//! at least that long. Clock skew between the two cannot shorten it. The bound only saves
//! renewals: every step still checks the run's claim, so a run taken over is never written.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use uuid::Uuid;

/// Entries beyond which a new one first drops those whose lease has surely run out (runs this
/// process lost without hearing of it).
const TIDY_ABOVE: usize = 4096;

/// Per run: the earliest its lease can run out. Off (nothing kept, no lease fresh) where the
/// database decides the renewal itself (PostgreSQL's step statement).
#[derive(Debug)]
pub(super) struct Leases {
    on: bool,
    map: Mutex<HashMap<Uuid, Instant>>,
}

impl Leases {
    /// Leases kept when `on`.
    pub(super) fn new(on: bool) -> Self {
        Self {
            on,
            map: Mutex::default(),
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, Instant>> {
        self.map
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A statement sent at `sent` set run `id`'s lease to `lease` from the database's now.
    pub(super) fn set(&self, id: Uuid, sent: Instant, lease: Duration) {
        if !self.on {
            return;
        }
        let mut map = self.map();
        if map.len() >= TIDY_ABOVE {
            let now = Instant::now();
            map.retain(|_, until| *until > now);
        }
        map.insert(id, sent + lease);
    }

    /// Run `id` is no longer held here (settled, requeued, suspended, or lost).
    pub(super) fn forget(&self, id: Uuid) {
        if self.on {
            self.map().remove(&id);
        }
    }

    /// Whether run `id`'s lease surely has more than `left` to go.
    pub(super) fn fresh(&self, id: Uuid, left: Duration) -> bool {
        self.map()
            .get(&id)
            .is_some_and(|until| until.checked_duration_since(Instant::now()) > Some(left))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_fresh_until_less_than_the_bound_is_left() {
        let leases = Leases::new(true);
        let id = Uuid::new_v4();
        assert!(!leases.fresh(id, Duration::ZERO), "unknown: not fresh");
        let sent = Instant::now();
        leases.set(id, sent, Duration::from_secs(60));
        assert!(leases.fresh(id, Duration::from_secs(45)));
        assert!(
            !leases.fresh(id, Duration::from_secs(60)),
            "time has passed since it was sent"
        );
        leases.set(id, sent - Duration::from_secs(20), Duration::from_secs(60));
        assert!(
            !leases.fresh(id, Duration::from_secs(45)),
            "less than 45 s left"
        );
        leases.forget(id);
        assert!(!leases.fresh(id, Duration::ZERO));
        let off = Leases::new(false);
        off.set(id, Instant::now(), Duration::from_secs(60));
        assert!(!off.fresh(id, Duration::ZERO), "off: nothing kept");
        assert!(off.map().is_empty());
    }

    #[test]
    fn runs_lost_without_a_word_are_dropped_when_the_map_grows() {
        let leases = Leases::new(true);
        let long_ago = Instant::now() - Duration::from_secs(120);
        for _ in 0..TIDY_ABOVE {
            leases.set(Uuid::new_v4(), long_ago, Duration::from_secs(60));
        }
        let id = Uuid::new_v4();
        leases.set(id, Instant::now(), Duration::from_secs(60));
        assert_eq!(leases.map().len(), 1, "only the live lease is kept");
        assert!(leases.fresh(id, Duration::from_secs(30)));
    }
}
