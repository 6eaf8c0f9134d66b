//! Worker runs: claim a queued run under a lease, execute it, recover from a failure.

use tracing::Instrument;
use uuid::Uuid;

use super::execute::{Executed, Resume};
use super::{RunError, Runtime};
use crate::{Outcome, Settlement, StoreError, TerminationReason};

impl Runtime {
    /// Executes a queued run as a worker: claim (lost claim: [`Outcome::NotClaimed`], nothing
    /// runs), lease renewed at each step boundary, recovery hook on failure.
    ///
    /// # Errors
    /// Only store failures; every run outcome is an [`Outcome`].
    pub async fn run_queued(&self, run_id: Uuid) -> Result<Outcome, RunError> {
        let span = tracing::info_span!("courier.run", courier.run.id = %run_id, courier.worker = %self.inner.worker);
        let started = std::time::Instant::now();
        let outcome = self.run_queued_inner(run_id).instrument(span).await;
        if let Ok(outcome) = &outcome {
            outcome.record_metrics(started.elapsed());
        }
        outcome
    }

    async fn run_queued_inner(&self, run_id: Uuid) -> Result<Outcome, RunError> {
        let store = &self.inner.store;
        let me = self.inner.worker.as_str();
        // The claim returns the run it claimed: no second read. One the store never answers (a
        // connection a failover black-holed) is given up after a lease, like every call made
        // under one: the error has the `RunAgent` message retried. A claim that did land left
        // the run `running` under a lease that ran out meanwhile, for the reaper (or the retry).
        let lease = self.inner.options.lease;
        let claimed = tokio::time::timeout(lease, store.claim(run_id, me, lease))
            .await
            .map_err(|_| {
                tracing::warn!(lease = ?lease, "the store left a claim unanswered for a whole lease; the message is retried");
                StoreError::Database {
                    context: "claiming a run",
                    source: format!("no answer within the lease ({lease:?})").into(),
                }
            })??;
        let Some(run) = claimed else {
            tracing::debug!("claim lost: not claimed");
            return Ok(Outcome::NotClaimed);
        };
        let Some(agent) = self.inner.agents.get(&run.agent).cloned() else {
            let class = Some(crate::FailureClass::Configuration);
            let settled = Settlement::failed(TerminationReason::NotRetryable, class);
            return self
                .settle(
                    run_id,
                    Some(me),
                    settled,
                    Outcome::Failed {
                        reason: TerminationReason::NotRetryable,
                        class,
                    },
                )
                .await;
        };
        let owner = Some(me.to_owned());
        match self.execute(agent, run, owner, Resume::default()).await? {
            Executed::Outcome(o) => Ok(o),
            Executed::Failed(error) => {
                let class = error.class().unwrap_or(crate::FailureClass::Unknown);
                tracing::info!(error = %error, courier.run.error_class = %class, "agent failed");
                let after = error.retry_after();
                super::recovery::recover(
                    self,
                    run_id,
                    TerminationReason::ProviderFailed,
                    class,
                    after,
                )
                .await
            }
        }
    }
}
