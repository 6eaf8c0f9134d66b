//! An in-memory run store with the SQL store's semantics, on tokio's (pausable) clock: its
//! state and the runs' own transitions here, the step journal and durable waits in `steps.rs`,
//! the reaper's transitions in `reaping.rs`.

mod reaping;
mod steps;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use tokio::time::Instant;
use uuid::Uuid;

use super::{
    Inserted, NewRun, Run, RunEvent, RunPageQuery, RunStore, Settlement, StoreError, UniqueKey,
    count_statuses, lease_ms,
};
use crate::step::{StepRecord, StepStatus, StepWrite, Usage};
use crate::{RunStatus, TerminationReason};

#[derive(Debug, Default)]
struct State {
    runs: BTreeMap<Uuid, Run>,
    events: BTreeMap<Uuid, Vec<RunEvent>>,
    steps: BTreeMap<Uuid, BTreeMap<i64, StepRecord>>,
    /// Unique keys: the run holding each, and until when (epoch ms).
    unique: HashMap<String, (Uuid, i64)>,
}

/// A run store in memory, for tests and single-process experiments. Its clock is
/// `SystemTime` at creation plus tokio's [`Instant`] since, so `tokio::time::pause` and
/// `advance` move it.
#[derive(Debug, Clone)]
pub struct MemoryRunStore {
    state: Arc<Mutex<State>>,
    base_ms: i64,
    start: Instant,
}

impl Default for MemoryRunStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryRunStore {
    /// An empty store.
    #[must_use]
    pub fn new() -> Self {
        let base_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(0));
        Self {
            state: Arc::default(),
            base_ms,
            start: Instant::now(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn clock(&self) -> i64 {
        self.base_ms + lease_ms(self.start.elapsed())
    }

    /// Rewrites a stored run directly (tests: expire a lease, move the claim to another worker).
    /// Returns false when the run does not exist.
    pub fn rewrite(&self, id: Uuid, f: impl FnOnce(&mut Run)) -> bool {
        self.lock().runs.get_mut(&id).map(f).is_some()
    }

    /// Ends a unique key's period now (tests: let the next run take it). Returns false when no
    /// run holds the key.
    pub fn expire_unique(&self, key: &str) -> bool {
        let now = self.clock();
        self.lock()
            .unique
            .get_mut(key)
            .map(|(_, until)| *until = now)
            .is_some()
    }

    fn guarded(
        &self,
        id: Uuid,
        guard: impl FnOnce(&Run, i64) -> bool,
        set: impl FnOnce(&mut Run, i64),
    ) -> bool {
        self.guarded_returning(id, guard, set).is_some()
    }

    /// One guarded write: `set` runs (and `updated_at` moves) only when `guard` holds; returns the
    /// run as written.
    fn guarded_returning(
        &self,
        id: Uuid,
        guard: impl FnOnce(&Run, i64) -> bool,
        set: impl FnOnce(&mut Run, i64),
    ) -> Option<Run> {
        let now = self.clock();
        let mut state = self.lock();
        match state.runs.get_mut(&id) {
            Some(run) if guard(run, now) => {
                set(run, now);
                run.updated_at = now;
                Some(run.clone())
            }
            _ => None,
        }
    }

    fn insert(&self, run: &NewRun, status: RunStatus) -> Run {
        let row = self.row(run, status, self.clock());
        self.lock().runs.insert(run.id, row.clone());
        row
    }

    fn row(&self, run: &NewRun, status: RunStatus, now: i64) -> Run {
        Run {
            id: run.id,
            agent: run.agent.clone(),
            status,
            input: run.input.clone(),
            output: None,
            error_class: None,
            termination_reason: None,
            claimed_by: None,
            lease_expires: 0,
            requeue_count: 0,
            pending_effect: None,
            created_at: now,
            started_at: (status == RunStatus::Running).then_some(now),
            finished_at: None,
            updated_at: now,
            due_at: now,
            budget: run.budget,
            usage: Usage::default(),
            steps_replayed: 0,
            wait_signal: None,
            concurrency_key: run.concurrency_key.clone(),
            journaled: None,
        }
    }
}

fn owned_by(run: &Run, worker: &str) -> bool {
    run.status == RunStatus::Running && run.claimed_by.as_deref() == Some(worker)
}

fn requeue(run: &mut Run) {
    run.status = RunStatus::Queued;
    run.requeue_count += 1;
    run.claimed_by = None;
    run.lease_expires = 0;
}

fn finish(run: &mut Run, now: i64, status: RunStatus, reason: Option<TerminationReason>) {
    run.status = status;
    run.termination_reason = reason;
    run.lease_expires = 0;
    if status.is_terminal() {
        run.finished_at = Some(now);
    }
}

#[async_trait]
impl RunStore for MemoryRunStore {
    async fn setup(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn now_ms(&self) -> Result<i64, StoreError> {
        Ok(self.clock())
    }

    async fn insert_queued(&self, run: &NewRun) -> Result<Run, StoreError> {
        Ok(self.insert(run, RunStatus::Queued))
    }

    async fn insert_queued_unique(
        &self,
        run: &NewRun,
        unique: &UniqueKey,
    ) -> Result<Inserted, StoreError> {
        let now = self.clock();
        let mut state = self.lock();
        if let Some((holder, until)) = state.unique.get(unique.key())
            && *until > now
        {
            return Ok(Inserted::Duplicate(*holder));
        }
        let row = self.row(run, RunStatus::Queued, now);
        let until = now + lease_ms(unique.period());
        state
            .unique
            .insert(unique.key().to_owned(), (run.id, until));
        state.runs.insert(run.id, row.clone());
        Ok(Inserted::Queued(Box::new(row)))
    }

    async fn insert_interactive(&self, run: &NewRun) -> Result<Run, StoreError> {
        Ok(self.insert(run, RunStatus::Running))
    }

    async fn find(&self, id: Uuid) -> Result<Option<Run>, StoreError> {
        Ok(self.lock().runs.get(&id).cloned())
    }

    async fn list(&self, status: Option<RunStatus>, limit: usize) -> Result<Vec<Run>, StoreError> {
        let mut runs: Vec<Run> = self
            .lock()
            .runs
            .values()
            .filter(|r| status.is_none_or(|s| r.status == s))
            .cloned()
            .collect();
        runs.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(b.id.cmp(&a.id)));
        runs.truncate(limit);
        Ok(runs)
    }

    async fn page(&self, query: &RunPageQuery) -> Result<Vec<Run>, StoreError> {
        let runs: Vec<Run> = self.lock().runs.values().cloned().collect();
        Ok(query.select(runs))
    }

    async fn count_by_status(&self) -> Result<Vec<(RunStatus, u64)>, StoreError> {
        Ok(count_statuses(self.lock().runs.values().map(|r| r.status)))
    }

    async fn claim(
        &self,
        id: Uuid,
        worker: &str,
        lease: Duration,
    ) -> Result<Option<Run>, StoreError> {
        let claimed = self.guarded_returning(
            id,
            |r, _| r.status == RunStatus::Queued,
            |r, now| {
                r.status = RunStatus::Running;
                r.claimed_by = Some(worker.to_owned());
                r.lease_expires = now + lease_ms(lease);
                r.started_at.get_or_insert(now);
            },
        );
        Ok(claimed.map(|mut run| {
            run.journaled = Some(self.lock().steps.get(&id).is_some_and(|s| !s.is_empty()));
            run
        }))
    }

    async fn renew(&self, id: Uuid, worker: &str, lease: Duration) -> Result<bool, StoreError> {
        Ok(self.guarded(
            id,
            |r, _| owned_by(r, worker),
            |r, now| r.lease_expires = now + lease_ms(lease),
        ))
    }

    async fn requeue_owned(
        &self,
        id: Uuid,
        worker: &str,
        due_in: Duration,
    ) -> Result<bool, StoreError> {
        Ok(self.guarded(
            id,
            |r, _| owned_by(r, worker),
            |r, now| {
                requeue(r);
                r.due_at = now + lease_ms(due_in);
            },
        ))
    }

    async fn select_overdue(&self, after: Duration, limit: usize) -> Result<Vec<Run>, StoreError> {
        self.overdue_runs(after, limit).await
    }

    async fn redispatch_overdue(&self, id: Uuid, after: Duration) -> Result<bool, StoreError> {
        self.redispatch_overdue_run(id, after).await
    }

    async fn redispatch_queued(&self, id: Uuid) -> Result<bool, StoreError> {
        self.redispatch_queued_run(id).await
    }

    async fn select_stale(&self, limit: usize) -> Result<Vec<Run>, StoreError> {
        self.stale_runs(limit).await
    }

    async fn requeue_stale(&self, id: Uuid) -> Result<bool, StoreError> {
        self.requeue_stale_run(id).await
    }

    async fn dead_letter_stale(
        &self,
        id: Uuid,
        reason: TerminationReason,
    ) -> Result<bool, StoreError> {
        self.dead_letter_stale_run(id, reason).await
    }

    async fn settle(
        &self,
        id: Uuid,
        owner: Option<&str>,
        s: &Settlement,
    ) -> Result<bool, StoreError> {
        Ok(self.guarded(
            id,
            |r, _| !r.status.is_terminal() && r.claimed_by.as_deref() == owner,
            |r, now| {
                finish(r, now, s.status, s.reason);
                r.error_class = s.class;
                if s.output.is_some() {
                    r.output.clone_from(&s.output);
                }
            },
        ))
    }

    async fn fail_queued(&self, id: Uuid, reason: TerminationReason) -> Result<bool, StoreError> {
        let failed = self.guarded(
            id,
            |r, _| r.status == RunStatus::Queued,
            |r, now| finish(r, now, RunStatus::Failed, Some(reason)),
        );
        if failed {
            self.lock().unique.retain(|_, (holder, _)| *holder != id);
        }
        Ok(failed)
    }

    async fn resume(&self, id: Uuid, from: RunStatus) -> Result<bool, StoreError> {
        Ok(self.guarded(
            id,
            |r, _| r.status == from,
            |r, _| {
                r.status = RunStatus::Running;
                r.claimed_by = None;
                r.lease_expires = 0;
            },
        ))
    }

    async fn cancel(&self, id: Uuid) -> Result<bool, StoreError> {
        Ok(self.guarded(
            id,
            |r, _| !r.status.is_terminal(),
            |r, now| {
                finish(
                    r,
                    now,
                    RunStatus::Cancelled,
                    Some(TerminationReason::Cancelled),
                )
            },
        ))
    }

    async fn set_pending_effect(
        &self,
        id: Uuid,
        owner: Option<&str>,
        effect: Option<&str>,
    ) -> Result<bool, StoreError> {
        Ok(self.guarded(
            id,
            |r, _| r.status == RunStatus::Running && r.claimed_by.as_deref() == owner,
            |r, _| r.pending_effect = effect.map(str::to_owned),
        ))
    }

    async fn append_event(
        &self,
        id: Uuid,
        kind: &str,
        payload: &serde_json::Value,
    ) -> Result<i64, StoreError> {
        let now = self.clock();
        let mut state = self.lock();
        let events = state.events.entry(id).or_default();
        let seq = events.last().map_or(0, |e| e.seq) + 1;
        events.push(RunEvent {
            run_id: id,
            seq,
            kind: kind.to_owned(),
            payload: payload.clone(),
            created_at: now,
        });
        Ok(seq)
    }

    async fn events(&self, id: Uuid) -> Result<Vec<RunEvent>, StoreError> {
        Ok(self.lock().events.get(&id).cloned().unwrap_or_default())
    }

    async fn steps(&self, id: Uuid) -> Result<Vec<StepRecord>, StoreError> {
        self.journal_steps(id).await
    }

    async fn journal(
        &self,
        id: Uuid,
        owner: Option<&str>,
        lease: Duration,
        write: &StepWrite,
    ) -> Result<bool, StoreError> {
        self.journal_step(id, owner, lease, write).await
    }

    async fn suspend(
        &self,
        id: Uuid,
        owner: Option<&str>,
        until: i64,
        signal: Option<&str>,
    ) -> Result<bool, StoreError> {
        self.suspend_run(id, owner, until, signal).await
    }

    async fn select_due_waits(&self, limit: usize) -> Result<Vec<Run>, StoreError> {
        self.due_waits(limit).await
    }

    async fn wake(&self, id: Uuid, signal: Option<&str>) -> Result<bool, StoreError> {
        self.wake_run(id, signal).await
    }

    async fn release_parked(&self, id: Uuid) -> Result<bool, StoreError> {
        self.release_parked_run(id).await
    }

    async fn prune(
        &self,
        older_than: Duration,
        statuses: &[RunStatus],
        limit: usize,
    ) -> Result<u64, StoreError> {
        self.prune_runs(older_than, statuses, limit).await
    }

    async fn copy_steps(&self, from: Uuid, to: Uuid, before: i64) -> Result<u64, StoreError> {
        self.copy_journal(from, to, before).await
    }

    async fn resolve_step(
        &self,
        id: Uuid,
        index: i64,
        status: StepStatus,
        output: Option<&serde_json::Value>,
    ) -> Result<bool, StoreError> {
        self.resolve_parked_step(id, index, status, output).await
    }
}
