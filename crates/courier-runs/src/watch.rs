//! What watches a worker run between its step boundaries, beside the agent: the row (lost
//! lease, operator cancel: all the runs a runtime holds in one read) and the step clock
//! (`runs.step_timeout`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::{RunStatus, RunStore};

/// Why [`Held::watch`] stopped an execution.
pub(crate) enum Lost {
    /// Another worker owns the run (or it is gone).
    Lease,
    /// An operator cancelled it.
    Cancelled,
}

/// The runs a runtime executes under a lease, watched together between their step boundaries:
/// every `lease_check_every`, one [`RunStore::probe`] of all of them (not one read per run)
/// finds those another worker took or an operator cancelled. A ticking task runs while
/// anything is held, and stops when nothing is.
#[derive(Clone, Default)]
pub(crate) struct Held(Arc<Mutex<HeldState>>);

#[derive(Default)]
struct HeldState {
    runs: HashMap<Uuid, Entry>,
    ticking: bool,
}

struct Entry {
    owner: String,
    lost: Option<oneshot::Sender<Lost>>,
}

impl Held {
    fn state(&self) -> std::sync::MutexGuard<'_, HeldState> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Returns (after cancelling `token`) once the run is found taken or cancelled; never for
    /// interactive runs, or without an interval.
    pub(crate) async fn watch(
        &self,
        store: Arc<dyn RunStore>,
        run_id: Uuid,
        owner: Option<String>,
        every: Option<Duration>,
        token: CancellationToken,
    ) -> Lost {
        let (Some(owner), Some(every)) = (owner, every) else {
            return std::future::pending().await;
        };
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut state = self.state();
            state.runs.insert(
                run_id,
                Entry {
                    owner,
                    lost: Some(tx),
                },
            );
            !std::mem::replace(&mut state.ticking, true)
        };
        if start {
            tokio::spawn(self.clone().tick(store, every));
        }
        // Dropped when the execution ends (this future with it): the run is no longer held.
        let _held = Release(self, run_id);
        match rx.await {
            // Cancelled here, in the poll that returns: the execution ends on this outcome,
            // not on the agent's own reaction to the cancellation.
            Ok(lost) => {
                token.cancel();
                lost
            }
            Err(_) => std::future::pending().await,
        }
    }

    async fn tick(self, store: Arc<dyn RunStore>, every: Duration) {
        loop {
            tokio::time::sleep(every).await;
            let held: Vec<(Uuid, String)> = {
                let mut state = self.state();
                if state.runs.is_empty() {
                    state.ticking = false;
                    return;
                }
                state
                    .runs
                    .iter()
                    .map(|(id, e)| (*id, e.owner.clone()))
                    .collect()
            };
            let ids: Vec<Uuid> = held.iter().map(|(id, _)| *id).collect();
            // A store that cannot answer now is asked again at the next tick.
            let Ok(probed) = store.probe(&ids).await else {
                continue;
            };
            let probed: HashMap<Uuid, crate::RunProbe> =
                probed.into_iter().map(|p| (p.id, p)).collect();
            for (id, owner) in held {
                let lost = match probed.get(&id) {
                    Some(p) if p.status == RunStatus::Cancelled => Lost::Cancelled,
                    Some(p)
                        if p.status == RunStatus::Running
                            && p.claimed_by.as_deref() == Some(owner.as_str()) =>
                    {
                        continue;
                    }
                    _ => Lost::Lease,
                };
                self.lose(id, lost);
            }
        }
    }

    fn lose(&self, run_id: Uuid, lost: Lost) {
        let Some(mut entry) = self.state().runs.remove(&run_id) else {
            return;
        };
        match lost {
            Lost::Cancelled => {
                tracing::info!(courier.run.id = %run_id, "run cancelled while running; the agent is stopped");
            }
            Lost::Lease => {
                tracing::warn!(courier.run.id = %run_id, "lease lost between step boundaries");
            }
        }
        if let Some(tx) = entry.lost.take() {
            let _ = tx.send(lost);
        }
    }
}

/// Stops holding a run when its execution ends.
struct Release<'a>(&'a Held, Uuid);

impl Drop for Release<'_> {
    fn drop(&mut self) {
        self.0.state().runs.remove(&self.1);
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
