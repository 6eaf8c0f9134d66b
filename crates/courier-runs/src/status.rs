//! Run statuses, termination reasons and outcomes.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{FailureClass, UnknownName};

/// The status of a run, as stored in `courier_runs.status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RunStatus {
    /// Waiting for a worker to claim it.
    Queued,
    /// Claimed by a worker (under a lease) or running interactively (no lease).
    Running,
    /// Stopped until someone approves it.
    WaitingForApproval,
    /// Stopped until someone gives it input.
    WaitingForInput,
    /// Parked by a durable wait (`RunContext::sleep`, `RunContext::wait_for_signal`) until its
    /// due time or its signal: no lease, no worker holds it.
    Waiting,
    /// Finished successfully (terminal).
    Completed,
    /// Finished with a failure; `failed` plus a termination reason is the dead letter (terminal).
    Failed,
    /// Cancelled (terminal).
    Cancelled,
}

impl RunStatus {
    /// Every status, in lifecycle order.
    pub const ALL: [RunStatus; 8] = [
        Self::Queued,
        Self::Running,
        Self::WaitingForApproval,
        Self::WaitingForInput,
        Self::Waiting,
        Self::Completed,
        Self::Failed,
        Self::Cancelled,
    ];

    /// The stored name.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::WaitingForApproval => "waiting_for_approval",
            Self::WaitingForInput => "waiting_for_input",
            Self::Waiting => "waiting",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    /// Whether no transition leaves this status.
    #[must_use]
    pub fn is_terminal(self) -> bool {
        match self {
            Self::Queued
            | Self::Running
            | Self::WaitingForApproval
            | Self::WaitingForInput
            | Self::Waiting => false,
            Self::Completed | Self::Failed | Self::Cancelled => true,
        }
    }
}

impl fmt::Display for RunStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for RunStatus {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| UnknownName {
                what: "status",
                value: s.to_owned(),
            })
    }
}

/// Why a run stopped, as stored in `courier_runs.termination_reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum TerminationReason {
    /// The agent finished.
    Completed,
    /// The agent hit its step limit.
    MaxSteps,
    /// The agent spent its budget.
    BudgetExhausted,
    /// A policy refused an action.
    PolicyDenied,
    /// A human refused the approval.
    ApprovalDenied,
    /// A model or tool provider failed (the only retryable reason).
    ProviderFailed,
    /// Someone cancelled the run.
    Cancelled,
    /// The failure was retryable but the requeue budget is spent.
    RetriesExhausted,
    /// The failure must not be retried (its class, or a non-idempotent effect in flight).
    NotRetryable,
    /// Dispatching the `RunAgent` message failed, so nothing would ever run it.
    DispatchFailed,
}

impl TerminationReason {
    /// Every reason.
    pub const ALL: [TerminationReason; 10] = [
        Self::Completed,
        Self::MaxSteps,
        Self::BudgetExhausted,
        Self::PolicyDenied,
        Self::ApprovalDenied,
        Self::ProviderFailed,
        Self::Cancelled,
        Self::RetriesExhausted,
        Self::NotRetryable,
        Self::DispatchFailed,
    ];

    /// The stored name.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::MaxSteps => "max_steps",
            Self::BudgetExhausted => "budget_exhausted",
            Self::PolicyDenied => "policy_denied",
            Self::ApprovalDenied => "approval_denied",
            Self::ProviderFailed => "provider_failed",
            Self::Cancelled => "cancelled",
            Self::RetriesExhausted => "retries_exhausted",
            Self::NotRetryable => "not_retryable",
            Self::DispatchFailed => "dispatch_failed",
        }
    }

    /// Whether a run stopped for this reason may be requeued: true only for `provider_failed`.
    #[must_use]
    pub fn is_retryable(self) -> bool {
        match self {
            Self::ProviderFailed => true,
            Self::Completed
            | Self::MaxSteps
            | Self::BudgetExhausted
            | Self::PolicyDenied
            | Self::ApprovalDenied
            | Self::Cancelled
            | Self::RetriesExhausted
            | Self::NotRetryable
            | Self::DispatchFailed => false,
        }
    }
}

impl fmt::Display for TerminationReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TerminationReason {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| UnknownName {
                what: "termination reason",
                value: s.to_owned(),
            })
    }
}

/// What one execution of a run came to.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Outcome {
    /// The agent finished; the run is `completed`.
    Completed {
        /// The agent's output.
        output: serde_json::Value,
    },
    /// The run waits for an approval (`waiting_for_approval`).
    AwaitingApproval,
    /// The run waits for input (`waiting_for_input`).
    AwaitingInput,
    /// The run is `failed` (the dead letter) for `reason`.
    Failed {
        /// Why.
        reason: TerminationReason,
        /// The failure class, when a failure caused it.
        class: Option<FailureClass>,
    },
    /// The run was cancelled; it stopped at a step boundary.
    Cancelled,
    /// The run was put back in the queue and one `RunAgent` dispatched with this delay.
    Requeued {
        /// The delay on the dispatched message.
        delay: Duration,
    },
    /// Another worker owns the run now: this execution stopped without settling or persisting.
    LeaseLost,
    /// The claim was lost (the run was not `queued`): a non-event, nothing ran.
    NotClaimed,
    /// The run is in a durable wait (`waiting`): no lease, no worker holds it until its due
    /// time or its signal.
    Waiting,
}

impl Outcome {
    /// The `outcome` label of the run metrics.
    fn label(&self) -> &'static str {
        match self {
            Self::Completed { .. } => "completed",
            Self::AwaitingApproval => "awaiting_approval",
            Self::AwaitingInput => "awaiting_input",
            Self::Failed { .. } => "failed",
            Self::Cancelled => "cancelled",
            Self::Requeued { .. } => "requeued",
            Self::LeaseLost => "lease_lost",
            Self::Waiting => "waiting",
            Self::NotClaimed => "not_claimed",
        }
    }

    /// Counts one execution that came to this outcome (`courier_runs_total`,
    /// `courier_run_duration_seconds`, `courier_leases_lost_total`).
    pub(crate) fn record_metrics(&self, elapsed: Duration) {
        use courier_core::metrics as m;
        let outcome = self.label();
        metrics::counter!(m::RUNS, "outcome" => outcome).increment(1);
        if !matches!(self, Self::NotClaimed) {
            metrics::histogram!(m::RUN_DURATION, "outcome" => outcome)
                .record(elapsed.as_secs_f64());
        }
        if matches!(self, Self::LeaseLost) {
            metrics::counter!(m::LEASES_LOST).increment(1);
        }
    }
}
