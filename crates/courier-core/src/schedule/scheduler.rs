//! The loop that claims each schedule's lease and fires the ticks it owes.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use super::{DEFAULT_SCHEDULE_LEASE, Missed, ScheduleState, ScheduleStore, Trigger, now_ms};
use crate::{BoxError, Transport, TransportError, TransportErrorKind};

/// How often the scheduler claims its leases and looks for due ticks.
const POLL: Duration = Duration::from_millis(200);

/// The most ticks walked to find the due ones after a long downtime.
const MAX_WALK: usize = 1_000_000;

/// What a schedule does on a tick (send a message, submit a run).
///
/// A tick is fired at least once: the scheduler records it only after `fire` returned `Ok`, so
/// a fire that failed, or whose worker died before recording it, is fired again (the same
/// `schedule` and `tick_ms`). Make the effect idempotent on that pair (a deduplication key, a
/// unique key) to get it exactly once.
#[async_trait]
pub trait Fire: Send + Sync {
    /// Fires the tick `tick_ms` (epoch ms) of `schedule`.
    async fn fire(&self, schedule: &str, tick_ms: i64) -> Result<(), BoxError>;
}

/// One recurring schedule: a name (its key in the store), a trigger, what to do with missed
/// ticks, and what to fire.
#[derive(Clone)]
pub struct Schedule {
    name: String,
    trigger: Trigger,
    missed: Missed,
    fire: Arc<dyn Fire>,
}

impl std::fmt::Debug for Schedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Schedule")
            .field("name", &self.name)
            .field("trigger", &self.trigger)
            .field("missed", &self.missed)
            .finish_non_exhaustive()
    }
}

impl Schedule {
    /// A schedule that skips missed ticks ([`Schedule::missed`] changes that).
    pub fn new(name: impl Into<String>, trigger: Trigger, fire: impl Fire + 'static) -> Self {
        Self {
            name: name.into(),
            trigger,
            missed: Missed::Skip,
            fire: Arc::new(fire),
        }
    }

    /// What to do with the ticks missed while no worker held the lease.
    #[must_use]
    pub const fn missed(mut self, missed: Missed) -> Self {
        self.missed = missed;
        self
    }

    /// Its name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its trigger.
    #[must_use]
    pub const fn trigger(&self) -> &Trigger {
        &self.trigger
    }

    /// Its missed-tick policy.
    #[must_use]
    pub const fn missed_policy(&self) -> Missed {
        self.missed
    }
}

/// Fires schedules from one worker: build one per worker with its id as the owner, and
/// [`run`](Scheduler::run) it beside the worker.
pub struct Scheduler {
    store: Arc<dyn ScheduleStore>,
    owner: String,
    lease: Duration,
    schedules: Vec<Schedule>,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("owner", &self.owner)
            .field("lease", &self.lease)
            .field("schedules", &self.schedules)
            .finish_non_exhaustive()
    }
}

impl Scheduler {
    /// A scheduler for `owner` (unique per worker) on `store`, with the default lease.
    pub fn new(store: Arc<dyn ScheduleStore>, owner: impl Into<String>) -> Self {
        Self {
            store,
            owner: owner.into(),
            lease: DEFAULT_SCHEDULE_LEASE,
            schedules: Vec::new(),
        }
    }

    /// Adds a schedule.
    #[must_use]
    pub fn schedule(mut self, schedule: Schedule) -> Self {
        self.schedules.push(schedule);
        self
    }

    /// How long a lease lasts unless renewed: the longest a killed holder delays its schedules.
    #[must_use]
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease.max(POLL * 2);
        self
    }

    /// The schedules.
    #[must_use]
    pub fn schedules(&self) -> &[Schedule] {
        &self.schedules
    }

    /// Claims each schedule's lease and fires the ticks due at `now_ms` (epoch ms) for those it
    /// holds. Returns how many ticks fired. Store errors end the pass early.
    ///
    /// # Errors
    /// The first store error.
    pub async fn poll(&self, now_ms: i64) -> Result<u64, TransportError> {
        let mut fired = 0;
        for schedule in &self.schedules {
            fired += self.poll_one(schedule, now_ms).await?;
        }
        Ok(fired)
    }

    async fn poll_one(&self, schedule: &Schedule, now: i64) -> Result<u64, TransportError> {
        let name = schedule.name.as_str();
        let Some(held) = self.store.claim(name, &self.owner, self.lease).await? else {
            return Ok(0);
        };
        let Some(last) = held.last_tick_ms else {
            // First sight: start from now, nothing in the past fires.
            self.store.advance(name, &self.owner, now).await?;
            return Ok(0);
        };
        let keep = match schedule.missed {
            Missed::Skip => 1,
            Missed::CatchUp(n) => usize::try_from(n.max(1)).unwrap_or(usize::MAX),
        };
        let mut due = VecDeque::with_capacity(keep.min(64));
        let mut at = last;
        for _ in 0..MAX_WALK {
            match schedule.trigger.next_after(at) {
                Some(t) if t <= now => {
                    if due.len() == keep {
                        due.pop_front();
                    }
                    due.push_back(t);
                    at = t;
                }
                _ => break,
            }
        }
        let grace = i64::try_from(self.lease.as_millis()).unwrap_or(i64::MAX);
        let mut fired = 0;
        for tick in due {
            if schedule.missed == Missed::Skip && now - tick >= grace {
                if !self.store.advance(name, &self.owner, tick).await? {
                    // The lease moved on, or another holder recorded it.
                    break;
                }
                tracing::info!(
                    courier.schedule = name,
                    tick_ms = tick,
                    "skipping a missed tick"
                );
                continue;
            }
            // Fired first, recorded once it fired: a tick whose fire failed (or whose holder
            // died before recording it) is fired again, by the next poll or the next holder.
            if let Err(e) = schedule.fire.fire(name, tick).await {
                tracing::warn!(courier.schedule = name, tick_ms = tick,
                    error = %crate::error_chain(&*e),
                    "a scheduled fire failed (retried at the next poll)");
                break;
            }
            fired += 1;
            tracing::debug!(courier.schedule = name, tick_ms = tick, "fired");
            if !self.store.advance(name, &self.owner, tick).await? {
                // The lease moved on while firing: the next holder fires the tick again.
                tracing::info!(
                    courier.schedule = name,
                    tick_ms = tick,
                    "lost the lease while firing a tick"
                );
                break;
            }
        }
        Ok(fired)
    }

    /// Polls until `shutdown`, about every 200 ms (and at each due tick). Store errors are
    /// logged and the next poll tries again.
    pub async fn run(self, shutdown: CancellationToken) {
        while !shutdown.is_cancelled() {
            if let Err(e) = self.poll(now_ms()).await {
                tracing::warn!(error = %crate::error_chain(&e), "the scheduler cannot reach its store");
            }
            let now = now_ms();
            let next = self
                .schedules
                .iter()
                .filter_map(|s| s.trigger.next_after(now))
                .min()
                .map_or(POLL, |t| {
                    Duration::from_millis(u64::try_from(t - now).unwrap_or(0))
                });
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(next.min(POLL)) => {}
            }
        }
    }

    /// Each schedule with its next tick after `now_ms` and its stored state.
    ///
    /// # Errors
    /// The store's.
    pub async fn describe(
        &self,
        now_ms: i64,
    ) -> Result<Vec<(&Schedule, Option<i64>, Option<ScheduleState>)>, TransportError> {
        let mut out = Vec::with_capacity(self.schedules.len());
        for s in &self.schedules {
            let state = self.store.state(&s.name).await?;
            out.push((s, s.trigger.next_after(now_ms), state));
        }
        Ok(out)
    }
}

/// A transport's schedule store ([`Abilities::schedule_store`](crate::Abilities::schedule_store)) as an
/// `Arc<dyn ScheduleStore>` that keeps the transport alive; `None` when it has none.
#[must_use]
pub fn shared_schedule_store(transport: Arc<dyn Transport>) -> Option<Arc<dyn ScheduleStore>> {
    transport.as_schedule_store()?;
    Some(Arc::new(TransportScheduleStore(transport)))
}

/// A transport whose `as_schedule_store` is known to be `Some`.
#[derive(Debug)]
struct TransportScheduleStore(Arc<dyn Transport>);

impl TransportScheduleStore {
    fn inner(&self) -> Result<&dyn ScheduleStore, TransportError> {
        self.0.as_schedule_store().ok_or_else(|| {
            TransportError::new(TransportErrorKind::Config, "schedule store")
                .with_context("the transport no longer offers a schedule store")
        })
    }
}

#[async_trait]
impl ScheduleStore for TransportScheduleStore {
    async fn claim(
        &self,
        schedule: &str,
        owner: &str,
        lease: Duration,
    ) -> Result<Option<super::Held>, TransportError> {
        self.inner()?.claim(schedule, owner, lease).await
    }

    async fn advance(
        &self,
        schedule: &str,
        owner: &str,
        tick_ms: i64,
    ) -> Result<bool, TransportError> {
        self.inner()?.advance(schedule, owner, tick_ms).await
    }

    async fn state(&self, schedule: &str) -> Result<Option<ScheduleState>, TransportError> {
        self.inner()?.state(schedule).await
    }

    fn location(&self) -> Option<String> {
        self.inner().ok().and_then(ScheduleStore::location)
    }
}
