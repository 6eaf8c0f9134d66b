//! Settling a run: the owner-guarded write of its outcome.

use uuid::Uuid;

use super::{RunError, Runtime};
use crate::agent::{AgentOutcome, within_lease};
use crate::{Outcome, RunStatus, Settlement, TerminationReason};

impl Runtime {
    /// Settles with the owner guard; a refused settle means the first outcome stands (cancelled)
    /// or another worker owns the run (lease lost). A worker run's settle left unanswered for a
    /// whole lease is a lost lease too ([`within_lease`]).
    pub(crate) async fn settle(
        &self,
        run_id: Uuid,
        owner: Option<&str>,
        settlement: Settlement,
        outcome: Outcome,
    ) -> Result<Outcome, RunError> {
        let lease = owner.map(|_| self.inner.options.lease);
        let settle = self.inner.store.settle(run_id, owner, &settlement);
        match within_lease(lease, run_id, "settling", settle).await? {
            Some(true) => return Ok(outcome),
            Some(false) => {}
            None => return Ok(Outcome::LeaseLost),
        }
        let find = self.inner.store.find(run_id);
        let now = within_lease(lease, run_id, "reading the run", find).await?;
        Ok(match now.flatten().map(|r| r.status) {
            Some(RunStatus::Cancelled) => Outcome::Cancelled,
            _ => Outcome::LeaseLost,
        })
    }
}

/// The settlement of what an agent returned, and the outcome it gives.
pub(super) fn settlement_of(done: AgentOutcome) -> (Settlement, Outcome) {
    match done {
        AgentOutcome::Completed(output) => (
            Settlement {
                status: RunStatus::Completed,
                reason: Some(TerminationReason::Completed),
                class: None,
                output: Some(output.clone()),
            },
            Outcome::Completed { output },
        ),
        AgentOutcome::AwaitingApproval => (
            Settlement {
                status: RunStatus::WaitingForApproval,
                reason: None,
                class: None,
                output: None,
            },
            Outcome::AwaitingApproval,
        ),
        AgentOutcome::AwaitingInput => (
            Settlement {
                status: RunStatus::WaitingForInput,
                reason: None,
                class: None,
                output: None,
            },
            Outcome::AwaitingInput,
        ),
        AgentOutcome::Stopped(reason) => {
            let status = match reason {
                TerminationReason::Completed => RunStatus::Completed,
                TerminationReason::Cancelled => RunStatus::Cancelled,
                _ => RunStatus::Failed,
            };
            let outcome = match status {
                RunStatus::Cancelled => Outcome::Cancelled,
                RunStatus::Completed => Outcome::Completed {
                    output: serde_json::Value::Null,
                },
                _ => Outcome::Failed {
                    reason,
                    class: None,
                },
            };
            (
                Settlement {
                    status,
                    reason: Some(reason),
                    class: None,
                    output: None,
                },
                outcome,
            )
        }
    }
}
