//! The reaper's transitions in memory: overdue queued runs, stale runs, pruning.

use std::time::Duration;

use uuid::Uuid;

use super::{MemoryRunStore, finish, requeue};
use crate::store::{Run, StoreError, lease_ms};
use crate::{RunStatus, TerminationReason};

fn is_stale(run: &Run, now: i64) -> bool {
    run.status == RunStatus::Running && run.lease_expires > 0 && run.lease_expires < now
}

fn is_overdue(run: &Run, now: i64, after: Duration) -> bool {
    run.status == RunStatus::Queued && run.due_at < now - lease_ms(after)
}

impl MemoryRunStore {
    /// [`RunStore::select_overdue`](crate::RunStore::select_overdue).
    pub(super) async fn overdue_runs(
        &self,
        after: Duration,
        limit: usize,
    ) -> Result<Vec<Run>, StoreError> {
        let now = self.clock();
        let mut runs: Vec<Run> = self
            .lock()
            .runs
            .values()
            .filter(|r| is_overdue(r, now, after))
            .cloned()
            .collect();
        runs.sort_by_key(|r| (r.due_at, r.id));
        runs.truncate(limit);
        Ok(runs)
    }

    /// [`RunStore::redispatch_overdue`](crate::RunStore::redispatch_overdue).
    pub(super) async fn redispatch_overdue_run(
        &self,
        id: Uuid,
        after: Duration,
    ) -> Result<bool, StoreError> {
        Ok(self.guarded(
            id,
            |r, now| is_overdue(r, now, after),
            |r, now| r.due_at = now,
        ))
    }

    /// [`RunStore::redispatch_queued`](crate::RunStore::redispatch_queued).
    pub(super) async fn redispatch_queued_run(&self, id: Uuid) -> Result<bool, StoreError> {
        Ok(self.guarded(
            id,
            |r, _| r.status == RunStatus::Queued,
            |r, now| r.due_at = now,
        ))
    }

    /// [`RunStore::select_stale`](crate::RunStore::select_stale).
    pub(super) async fn stale_runs(&self, limit: usize) -> Result<Vec<Run>, StoreError> {
        let now = self.clock();
        let mut runs: Vec<Run> = self
            .lock()
            .runs
            .values()
            .filter(|r| is_stale(r, now))
            .cloned()
            .collect();
        runs.sort_by_key(|r| (r.lease_expires, r.id));
        runs.truncate(limit);
        Ok(runs)
    }

    /// [`RunStore::requeue_stale`](crate::RunStore::requeue_stale).
    pub(super) async fn requeue_stale_run(&self, id: Uuid) -> Result<bool, StoreError> {
        Ok(self.guarded(id, is_stale, |r, now| {
            requeue(r);
            r.due_at = now;
        }))
    }

    /// [`RunStore::dead_letter_stale`](crate::RunStore::dead_letter_stale).
    pub(super) async fn dead_letter_stale_run(
        &self,
        id: Uuid,
        reason: TerminationReason,
    ) -> Result<bool, StoreError> {
        Ok(self.guarded(id, is_stale, |r, now| {
            finish(r, now, RunStatus::Failed, Some(reason))
        }))
    }

    /// [`RunStore::prune`](crate::RunStore::prune).
    pub(super) async fn prune_runs(
        &self,
        older_than: Duration,
        statuses: &[RunStatus],
        limit: usize,
    ) -> Result<u64, StoreError> {
        let before = self.clock() - lease_ms(older_than);
        let mut state = self.lock();
        let mut old: Vec<(i64, Uuid)> = state
            .runs
            .values()
            .filter(|r| statuses.contains(&r.status) && r.finished_at.is_some_and(|f| f < before))
            .map(|r| (r.finished_at.unwrap_or_default(), r.id))
            .collect();
        old.sort_unstable();
        old.truncate(limit);
        for (_, id) in &old {
            state.runs.remove(id);
            state.events.remove(id);
            state.steps.remove(id);
        }
        Ok(old.len() as u64)
    }
}
