//! One execution of a run: the agent under its watches (lease, cancellation, step timeout),
//! then its outcome settled.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::settle::settlement_of;
use super::{RunError, Runtime};
use crate::agent::{Agent, AgentError, AgentOutcome, RunContext, StepError};
use crate::watch::{Lost, StepClock, watch_steps};
use crate::{Outcome, Run, RunStatus, Settlement, TerminationReason};

/// How an interactive execution resumes a waiting run.
#[derive(Debug, Default)]
pub(super) struct Resume {
    /// The run was approved (it waited for approval).
    pub(super) approved: bool,
    /// The input the run waited for.
    pub(super) input: Option<serde_json::Value>,
}

/// How an execution ended: settled, or an agent failure left to the caller.
pub(super) enum Executed {
    Outcome(Outcome),
    Failed(AgentError),
}

impl Runtime {
    /// Executes `run` with `agent` (`owner`: a worker run, under its lease) and settles it.
    pub(super) async fn execute(
        &self,
        agent: Arc<dyn Agent>,
        run: Run,
        owner: Option<String>,
        resume: Resume,
    ) -> Result<Executed, RunError> {
        let run_id = run.id;
        let key = run.concurrency_key.clone();
        let token = CancellationToken::new();
        let steps = StepClock::start();
        let run_row = run.clone();
        let mut cx = RunContext {
            steps: steps.clone(),
            run,
            store: self.inner.store.clone(),
            owner: owner.clone(),
            lease: self.inner.options.lease,
            observers: self.inner.observers.clone(),
            token: token.clone(),
            approved: resume.approved,
            provided: resume.input,
            journal: crate::agent::journal::Journal::new(
                &run_row,
                self.inner.options.max_step_result,
            ),
        };
        let watch = self.inner.held.watch(
            self.inner.store.clone(),
            run_id,
            owner.clone(),
            self.inner.options.lease_check_every,
            token.clone(),
        );
        let step_timeout = watch_steps(self.inner.options.step_timeout, steps, token.clone());
        let result = tokio::select! {
            result = agent.run(&mut cx) => result,
            lost = watch => {
                return Ok(Executed::Outcome(match lost {
                    Lost::Lease => Outcome::LeaseLost,
                    Lost::Cancelled => Outcome::Cancelled,
                }));
            }
            after = step_timeout => {
                tracing::warn!(courier.run.id = %run_id, timeout = ?after, "step timed out; the agent is cancelled");
                Err(AgentError::StepTimeout { after })
            }
        };
        self.conclude(run_id, key.as_deref(), owner.as_deref(), result)
            .await
    }

    /// Settles what the agent returned (a failure to recover from is returned as it is).
    async fn conclude(
        &self,
        run_id: Uuid,
        key: Option<&str>,
        owner: Option<&str>,
        result: Result<AgentOutcome, AgentError>,
    ) -> Result<Executed, RunError> {
        let (settlement, outcome) = match result {
            Ok(done) => settlement_of(done),
            Err(AgentError::Step(StepError::LeaseLost)) => {
                return Ok(Executed::Outcome(Outcome::LeaseLost));
            }
            Err(AgentError::Step(StepError::Cancelled)) => {
                return Ok(Executed::Outcome(Outcome::Cancelled));
            }
            Err(AgentError::Step(StepError::Store(e))) => return Err(e.into()),
            Err(AgentError::Step(StepError::Suspended { woken })) => {
                if woken && let Err(e) = self.dispatch(run_id, key, None).await {
                    tracing::warn!(courier.run.id = %run_id, error = %e, "dispatch of a run woken by its signal failed; the reaper dispatches it again");
                }
                return Ok(Executed::Outcome(Outcome::Waiting));
            }
            Err(AgentError::Step(StepError::Parked { index, name })) => {
                tracing::warn!(courier.run.id = %run_id, step = index, name, "guarded step began without a result: run parked for an operator");
                (
                    Settlement {
                        status: RunStatus::WaitingForApproval,
                        reason: None,
                        class: None,
                        output: None,
                    },
                    Outcome::AwaitingApproval,
                )
            }
            Err(AgentError::Step(e @ StepError::BudgetExhausted { .. })) => {
                tracing::warn!(courier.run.id = %run_id, error = %e, "run stopped: budget exhausted");
                let class = Some(crate::FailureClass::BudgetExhausted);
                let reason = TerminationReason::BudgetExhausted;
                (
                    Settlement::failed(reason, class),
                    Outcome::Failed { reason, class },
                )
            }
            Err(error) => return Ok(Executed::Failed(error)),
        };
        Ok(Executed::Outcome(
            self.settle(run_id, owner, settlement, outcome).await?,
        ))
    }
}
