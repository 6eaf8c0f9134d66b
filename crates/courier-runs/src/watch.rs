//! What watches a worker run between its step boundaries, beside the agent: the row (lost
//! lease, operator cancel) and the step clock (`runs.step_timeout`).

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::{RunStatus, RunStore};

/// Why [`watch_lease`] stopped an execution.
pub(crate) enum Lost {
    /// Another worker owns the run (or it is gone).
    Lease,
    /// An operator cancelled it.
    Cancelled,
}

/// Between step boundaries, checks every `every` that the worker still owns the row and that it
/// was not cancelled; returns (after cancelling `token`) when either changed. Never returns for
/// interactive runs.
pub(crate) async fn watch_lease(
    store: Arc<dyn RunStore>,
    run_id: Uuid,
    owner: Option<String>,
    every: Option<Duration>,
    token: CancellationToken,
) -> Lost {
    let (Some(owner), Some(every)) = (owner, every) else {
        return std::future::pending().await;
    };
    loop {
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = token.cancelled() => return std::future::pending().await,
        }
        let Ok(run) = store.find(run_id).await else {
            continue;
        };
        let lost = match run {
            Some(r) if r.status == RunStatus::Cancelled => Lost::Cancelled,
            Some(r)
                if r.status == RunStatus::Running && r.claimed_by.as_deref() == Some(&owner) =>
            {
                continue;
            }
            _ => Lost::Lease,
        };
        match lost {
            Lost::Cancelled => {
                tracing::info!(courier.run.id = %run_id, "run cancelled while running; the agent is stopped");
            }
            Lost::Lease => {
                tracing::warn!(courier.run.id = %run_id, "lease lost between step boundaries");
            }
        }
        token.cancel();
        return lost;
    }
}

/// When the current step started: the run's start, then each step boundary.
#[derive(Debug, Clone)]
pub(crate) struct StepClock(Arc<std::sync::Mutex<tokio::time::Instant>>);

impl StepClock {
    pub(crate) fn start() -> Self {
        Self(Arc::new(std::sync::Mutex::new(tokio::time::Instant::now())))
    }

    fn started(&self) -> tokio::time::Instant {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A step boundary: the next step starts now.
    pub(crate) fn boundary(&self) {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = tokio::time::Instant::now();
    }
}

/// Returns `timeout` (after cancelling `token`) once a step has run longer than it; never
/// without a timeout.
pub(crate) async fn watch_steps(
    timeout: Option<Duration>,
    steps: StepClock,
    token: CancellationToken,
) -> Duration {
    let Some(timeout) = timeout else {
        return std::future::pending().await;
    };
    loop {
        let deadline = steps.started() + timeout;
        tokio::select! {
            () = tokio::time::sleep_until(deadline) => {}
            () = token.cancelled() => return std::future::pending().await,
        }
        if steps.started() + timeout <= tokio::time::Instant::now() {
            token.cancel();
            return timeout;
        }
    }
}
