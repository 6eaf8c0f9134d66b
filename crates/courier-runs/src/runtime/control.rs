//! Acting on a run from outside: signal it, resolve the step it parked on, cancel it.

use std::time::Duration;

use uuid::Uuid;

use super::{RunError, Runtime};
use crate::{Outcome, RunStatus, Settlement, TerminationReason};

impl Runtime {
    /// Sends the signal `name` to a run: journaled with the run (its data, who sent it, when) and
    /// delivered once, to the first [`RunContext::wait_for_signal`](crate::RunContext::wait_for_signal)
    /// for that name that has not consumed one. A run waiting for it is queued and dispatched at
    /// once; a run still running or queued finds it when it reaches the wait.
    ///
    /// # Errors
    /// [`RunError::NotFound`]; [`RunError::UnknownSignal`] when the run waits for another
    /// signal (nothing is recorded); [`RunError::WrongStatus`] for a finished run; store and
    /// dispatch failures (a woken run whose dispatch failed stays queued for the reaper).
    pub async fn signal(
        &self,
        run_id: Uuid,
        name: &str,
        data: serde_json::Value,
        by: Option<&str>,
    ) -> Result<SignalSent, RunError> {
        let store = &self.inner.store;
        let run = store
            .find(run_id)
            .await?
            .ok_or(RunError::NotFound(run_id))?;
        if run.status.is_terminal() {
            return Err(RunError::WrongStatus {
                run_id,
                status: run.status,
                expected: RunStatus::Waiting,
            });
        }
        if run.status == RunStatus::Waiting && run.wait_signal.as_deref() != Some(name) {
            return Err(RunError::UnknownSignal {
                run_id,
                name: name.to_owned(),
                waiting_for: run.wait_signal,
            });
        }
        let payload = serde_json::json!({ "name": name, "data": data, "by": by });
        let seq = store
            .append_event(run_id, crate::step::SIGNAL_EVENT, &payload)
            .await?;
        tracing::info!(courier.run.id = %run_id, signal = name, seq, "signal recorded");
        if store.wake(run_id, Some(name)).await? {
            self.dispatch(run_id, run.concurrency_key.as_deref(), None)
                .await?;
            return Ok(SignalSent::Woken);
        }
        Ok(SignalSent::Buffered)
    }

    /// Resolves a guarded step a run parked on (`waiting_for_approval`, the step named in its
    /// `pending_effect`): run it again with the same key, skip it with a result, or fail the run.
    /// A retried or skipped step's run is queued and dispatched.
    ///
    /// # Errors
    /// [`RunError::NotFound`]; [`RunError::WrongStatus`] when the run is not parked on a step;
    /// store and dispatch failures.
    pub async fn resolve_step(
        &self,
        run_id: Uuid,
        resolution: crate::Resolution,
    ) -> Result<Outcome, RunError> {
        let store = &self.inner.store;
        let run = store
            .find(run_id)
            .await?
            .ok_or(RunError::NotFound(run_id))?;
        let parked = store
            .steps(run_id)
            .await?
            .into_iter()
            .filter(|s| s.status == crate::StepStatus::Intent)
            .max_by_key(|s| s.index);
        let (Some(step), RunStatus::WaitingForApproval) = (parked, run.status) else {
            return Err(RunError::WrongStatus {
                run_id,
                status: run.status,
                expected: RunStatus::WaitingForApproval,
            });
        };
        let (status, output) = match resolution {
            crate::Resolution::Fail => {
                let class = Some(crate::FailureClass::AmbiguousEffect);
                let reason = TerminationReason::NotRetryable;
                let owner = run.claimed_by.as_deref();
                let settled = store
                    .settle(run_id, owner, &Settlement::failed(reason, class))
                    .await?;
                if !settled {
                    return Err(RunError::WrongStatus {
                        run_id,
                        status: store.find(run_id).await?.map_or(run.status, |r| r.status),
                        expected: RunStatus::WaitingForApproval,
                    });
                }
                return Ok(Outcome::Failed { reason, class });
            }
            crate::Resolution::Retry => (crate::StepStatus::Retry, None),
            crate::Resolution::Skip(value) => (crate::StepStatus::Done, Some(value)),
        };
        store
            .resolve_step(run_id, step.index, status, output.as_ref())
            .await?;
        if !store.release_parked(run_id).await? {
            return Err(RunError::WrongStatus {
                run_id,
                status: store.find(run_id).await?.map_or(run.status, |r| r.status),
                expected: RunStatus::WaitingForApproval,
            });
        }
        self.dispatch(run_id, run.concurrency_key.as_deref(), None)
            .await?;
        Ok(Outcome::Requeued {
            delay: Duration::ZERO,
        })
    }

    /// Cancels a run in any non-terminal status; returns false when it was already terminal.
    /// A running agent stops at its next step boundary.
    ///
    /// # Errors
    /// Store failures.
    pub async fn cancel(&self, run_id: Uuid) -> Result<bool, RunError> {
        Ok(self.inner.store.cancel(run_id).await?)
    }
}

/// What [`Runtime::signal`] did with a signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SignalSent {
    /// The run waited for it: it was queued and dispatched.
    Woken,
    /// The run was not waiting yet: it finds the signal when it reaches its wait.
    Buffered,
}
