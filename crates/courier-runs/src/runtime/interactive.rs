//! Interactive runs, in the caller's task: run, approve, provide input.

use std::sync::Arc;

use uuid::Uuid;

use super::execute::{Executed, Resume};
use super::{RunError, Runtime};
use crate::agent::Agent;
use crate::{NewRun, Outcome, Run, RunStatus, Settlement, TerminationReason};

impl Runtime {
    /// Runs an agent interactively, in this task: no lease, no heartbeat, no recovery; a failure
    /// is settled `failed`/`provider_failed` and returned unchanged in [`RunError::Agent`].
    ///
    /// # Errors
    /// [`RunError::UnknownAgent`], store failures, [`RunError::Agent`].
    pub async fn run(
        &self,
        agent: &str,
        input: serde_json::Value,
    ) -> Result<(Uuid, Outcome), RunError> {
        let handler = self
            .inner
            .agents
            .get(agent)
            .cloned()
            .ok_or_else(|| RunError::UnknownAgent(agent.to_owned()))?;
        let run = self
            .inner
            .store
            .insert_interactive(&NewRun::new(agent, input))
            .await?;
        let id = run.id;
        Ok((id, self.interactive(handler, run, Resume::default()).await?))
    }

    /// Approves a run `waiting_for_approval` and resumes it interactively (the agent sees
    /// [`RunContext::approved`](crate::RunContext::approved)).
    ///
    /// # Errors
    /// Not found, not waiting for approval, unknown agent, store failures, [`RunError::Agent`].
    pub async fn approve(&self, run_id: Uuid) -> Result<Outcome, RunError> {
        let resume = Resume {
            approved: true,
            input: None,
        };
        self.resume(run_id, RunStatus::WaitingForApproval, resume)
            .await
    }

    /// Gives a run `waiting_for_input` the input it asked for and resumes it interactively: the
    /// input is recorded as the run's next event (kind `input`) and the agent sees it in
    /// [`RunContext::provided_input`](crate::RunContext::provided_input).
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use courier_runs::{MemoryRunStore, Outcome, Runtime, ScriptedAgent};
    /// # use serde_json::json;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let runtime = Runtime::builder(Arc::new(MemoryRunStore::new()))
    ///     .agent("scripted", ScriptedAgent)
    ///     .build();
    /// let script = json!({"steps": [{"await_input": "your name?"}, {"output": "done"}]});
    /// let (id, outcome) = runtime.run("scripted", script).await?;
    /// assert_eq!(outcome, Outcome::AwaitingInput);
    /// let outcome = runtime.provide_input(id, json!("Ada")).await?;
    /// assert_eq!(outcome, Outcome::Completed { output: json!("done") });
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// Not found, not waiting for input, unknown agent, store failures, [`RunError::Agent`].
    pub async fn provide_input(
        &self,
        run_id: Uuid,
        input: serde_json::Value,
    ) -> Result<Outcome, RunError> {
        let resume = Resume {
            approved: false,
            input: Some(input),
        };
        self.resume(run_id, RunStatus::WaitingForInput, resume)
            .await
    }

    /// Moves a waiting run from `from` back to running and executes it interactively.
    async fn resume(
        &self,
        run_id: Uuid,
        from: RunStatus,
        resume: Resume,
    ) -> Result<Outcome, RunError> {
        let run = self
            .inner
            .store
            .find(run_id)
            .await?
            .ok_or(RunError::NotFound(run_id))?;
        let agent = self
            .inner
            .agents
            .get(&run.agent)
            .cloned()
            .ok_or_else(|| RunError::UnknownAgent(run.agent.clone()))?;
        if !self.inner.store.resume(run_id, from).await? {
            let status = self
                .inner
                .store
                .find(run_id)
                .await?
                .map_or(run.status, |r| r.status);
            return Err(RunError::WrongStatus {
                run_id,
                status,
                expected: from,
            });
        }
        if let Some(input) = &resume.input {
            self.inner
                .store
                .append_event(run_id, "input", input)
                .await?;
        }
        let run = self
            .inner
            .store
            .find(run_id)
            .await?
            .ok_or(RunError::NotFound(run_id))?;
        self.interactive(agent, run, resume).await
    }

    async fn interactive(
        &self,
        agent: Arc<dyn Agent>,
        run: Run,
        resume: Resume,
    ) -> Result<Outcome, RunError> {
        let run_id = run.id;
        match self.execute(agent, run, None, resume).await? {
            Executed::Outcome(o) => Ok(o),
            Executed::Failed(error) => {
                let class = error.class();
                let settled = Settlement::failed(TerminationReason::ProviderFailed, class);
                self.inner.store.settle(run_id, None, &settled).await?;
                Err(RunError::Agent { run_id, error })
            }
        }
    }
}
