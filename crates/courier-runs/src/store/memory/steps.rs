//! The step journal and durable waits in memory.

use std::time::Duration;

use uuid::Uuid;

use super::MemoryRunStore;
use crate::RunStatus;
use crate::step::{JournalMode, StepRecord, StepStatus, StepWrite};
use crate::store::{Run, StoreError, lease_ms};

/// When a step row written with `status` finished: now, unless it is still unfinished.
fn finished(status: StepStatus, now: i64) -> Option<i64> {
    matches!(status, StepStatus::Done | StepStatus::Failed).then_some(now)
}

impl MemoryRunStore {
    /// [`RunStore::steps`](crate::RunStore::steps).
    pub(super) async fn journal_steps(&self, id: Uuid) -> Result<Vec<StepRecord>, StoreError> {
        Ok(self
            .lock()
            .steps
            .get(&id)
            .map(|s| s.values().cloned().collect())
            .unwrap_or_default())
    }

    /// [`RunStore::journal`](crate::RunStore::journal).
    pub(super) async fn journal_step(
        &self,
        id: Uuid,
        owner: Option<&str>,
        lease: Duration,
        write: &StepWrite,
    ) -> Result<bool, StoreError> {
        let now = self.clock();
        let mut state = self.lock();
        let Some(run) = state.runs.get_mut(&id) else {
            return Ok(false);
        };
        if run.status != RunStatus::Running || run.claimed_by.as_deref() != owner {
            return Ok(false);
        }
        // The step row first: a Finish that finds no unfinished row writes nothing at all.
        let steps = state.steps.entry(id).or_default();
        match write.mode {
            JournalMode::Insert => {
                if steps.contains_key(&write.index) {
                    return Err(StoreError::DuplicateSequence {
                        run_id: id,
                        seq: write.index,
                    });
                }
                steps.insert(
                    write.index,
                    StepRecord {
                        run_id: id,
                        index: write.index,
                        name: write.name.clone(),
                        effect: write.effect.to_owned(),
                        status: write.status,
                        output: write.output.clone(),
                        error: write.error.clone(),
                        error_class: write.error_class.clone(),
                        usage: write.usage,
                        duration_ms: write.duration_ms,
                        attempts: i64::from(finished(write.status, now).is_some()),
                        created_at: now,
                        finished_at: finished(write.status, now),
                    },
                );
            }
            JournalMode::Finish => {
                let Some(row) = steps.get_mut(&write.index).filter(|r| {
                    matches!(
                        r.status,
                        StepStatus::Intent | StepStatus::Retry | StepStatus::Waiting
                    )
                }) else {
                    return Ok(false);
                };
                row.status = write.status;
                row.output = write.output.clone();
                row.error = write.error.clone();
                row.error_class = write.error_class.clone();
                row.usage = write.usage;
                row.duration_ms = write.duration_ms;
                row.attempts += 1;
                row.finished_at = finished(write.status, now);
            }
        }
        let run = state
            .runs
            .get_mut(&id)
            .ok_or_else(|| StoreError::Corrupt(format!("run {id} vanished")))?;
        run.lease_expires = if owner.is_some() {
            now + lease_ms(lease)
        } else {
            0
        };
        run.usage = run.usage.plus(write.usage);
        run.steps_replayed = run.steps_replayed.saturating_add(write.replayed);
        run.updated_at = now;
        Ok(true)
    }

    /// [`RunStore::suspend`](crate::RunStore::suspend).
    pub(super) async fn suspend_run(
        &self,
        id: Uuid,
        owner: Option<&str>,
        until: i64,
        signal: Option<&str>,
    ) -> Result<bool, StoreError> {
        Ok(self.guarded(
            id,
            |r, _| r.status == RunStatus::Running && r.claimed_by.as_deref() == owner,
            |r, _| {
                r.status = RunStatus::Waiting;
                r.claimed_by = None;
                r.lease_expires = 0;
                r.due_at = until;
                r.wait_signal = signal.map(str::to_owned);
            },
        ))
    }

    /// [`RunStore::select_due_waits`](crate::RunStore::select_due_waits).
    pub(super) async fn due_waits(&self, limit: usize) -> Result<Vec<Run>, StoreError> {
        let now = self.clock();
        let mut due: Vec<Run> = self
            .lock()
            .runs
            .values()
            .filter(|r| r.status == RunStatus::Waiting && r.due_at <= now)
            .cloned()
            .collect();
        due.sort_by_key(|r| r.due_at);
        due.truncate(limit);
        Ok(due)
    }

    /// [`RunStore::wake`](crate::RunStore::wake).
    pub(super) async fn wake_run(
        &self,
        id: Uuid,
        signal: Option<&str>,
    ) -> Result<bool, StoreError> {
        Ok(self.guarded(
            id,
            |r, now| {
                r.status == RunStatus::Waiting
                    && match signal {
                        None => r.due_at <= now,
                        Some(name) => r.wait_signal.as_deref() == Some(name),
                    }
            },
            |r, now| {
                r.status = RunStatus::Queued;
                r.due_at = now;
                r.wait_signal = None;
            },
        ))
    }

    /// [`RunStore::release_parked`](crate::RunStore::release_parked).
    pub(super) async fn release_parked_run(&self, id: Uuid) -> Result<bool, StoreError> {
        Ok(self.guarded(
            id,
            |r, _| r.status == RunStatus::WaitingForApproval,
            |r, now| {
                r.status = RunStatus::Queued;
                r.due_at = now;
                r.claimed_by = None;
                r.lease_expires = 0;
                r.pending_effect = None;
            },
        ))
    }

    /// [`RunStore::copy_steps`](crate::RunStore::copy_steps).
    pub(super) async fn copy_journal(
        &self,
        from: Uuid,
        to: Uuid,
        before: i64,
    ) -> Result<u64, StoreError> {
        let now = self.clock();
        let mut state = self.lock();
        let copied: Vec<StepRecord> = state
            .steps
            .get(&from)
            .map(|s| {
                s.values()
                    .filter(|r| r.index < before && r.status == StepStatus::Done)
                    .map(|r| StepRecord {
                        run_id: to,
                        created_at: now,
                        ..r.clone()
                    })
                    .collect()
            })
            .unwrap_or_default();
        let n = copied.len() as u64;
        let journal = state.steps.entry(to).or_default();
        for row in copied {
            journal.insert(row.index, row);
        }
        Ok(n)
    }

    /// [`RunStore::resolve_step`](crate::RunStore::resolve_step).
    pub(super) async fn resolve_parked_step(
        &self,
        id: Uuid,
        index: i64,
        status: StepStatus,
        output: Option<&serde_json::Value>,
    ) -> Result<bool, StoreError> {
        let now = self.clock();
        let mut state = self.lock();
        let Some(row) = state
            .steps
            .get_mut(&id)
            .and_then(|s| s.get_mut(&index))
            .filter(|r| r.status == StepStatus::Intent)
        else {
            return Ok(false);
        };
        row.status = status;
        row.output = output.cloned();
        row.finished_at = finished(status, now);
        Ok(true)
    }
}
