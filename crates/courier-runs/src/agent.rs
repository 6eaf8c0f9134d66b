//! The [`Agent`] trait users implement, and the [`RunContext`] whose `checkpoint` is the step
//! boundary.

pub(crate) mod journal;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::{FailureClass, ProviderError, Run, RunStatus, RunStore, StoreError, TerminationReason};

/// User code a run executes. It calls [`RunContext::checkpoint`] at every step boundary, and may
/// watch [`RunContext::cancellation`] between boundaries.
///
/// ```
/// use courier_runs::{Agent, AgentError, AgentOutcome, RunContext, Step};
///
/// struct Summarise;
///
/// #[courier_runs::async_trait]
/// impl Agent for Summarise {
///     async fn run(&self, cx: &mut RunContext) -> Result<AgentOutcome, AgentError> {
///         let text = cx.input()["text"].as_str().unwrap_or_default().to_owned();
///         cx.checkpoint(Step::new("model_call", serde_json::json!({"chars": text.len()}))).await?;
///         Ok(AgentOutcome::Completed(serde_json::json!({"summary": text.chars().take(20).collect::<String>()})))
///     }
/// }
/// ```
#[async_trait]
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a Courier agent",
    note = "implement `courier_runs::Agent` (with `#[async_trait]`) for `{Self}`"
)]
pub trait Agent: Send + Sync + 'static {
    /// Executes (or resumes) the run. Errors: [`AgentError::Step`] from a checkpoint (propagate it
    /// with `?`), [`AgentError::Provider`] for a provider failure (classified for you), or
    /// [`AgentError::Other`] (class `unknown`, not retried).
    async fn run(&self, cx: &mut RunContext) -> Result<AgentOutcome, AgentError>;
}

const _: () = {
    fn assert_dyn(_: &dyn Agent) {}
    let _ = assert_dyn;
};

/// How an agent's execution ended, when it did not fail.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum AgentOutcome {
    /// Finished with this output.
    Completed(serde_json::Value),
    /// Needs an approval; resume with [`Runtime::approve`](crate::Runtime::approve).
    AwaitingApproval,
    /// Needs input from someone.
    AwaitingInput,
    /// Stopped for a reason of its own (max_steps, budget_exhausted, policy_denied,
    /// approval_denied): the run is `failed` with that reason, never retried.
    Stopped(TerminationReason),
}

/// One step of a run, persisted at the next sequence number.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// The kind (e.g. `model_call`, `tool_call`).
    pub kind: String,
    /// The payload.
    pub payload: serde_json::Value,
}

impl Step {
    /// A step.
    #[must_use]
    pub fn new(kind: impl Into<String>, payload: serde_json::Value) -> Self {
        Self {
            kind: kind.into(),
            payload,
        }
    }
}

/// A step boundary stopped the agent.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StepError {
    /// Another worker owns the run: stop at once, settle nothing.
    #[error("lease lost: another worker owns the run")]
    LeaseLost,
    /// The run was cancelled; the step was persisted.
    #[error("run cancelled")]
    Cancelled,
    /// The store failed.
    #[error("run store failed at a step boundary")]
    Store(#[from] StoreError),
    /// A step's closure failed (the error is classified like the agent's own).
    #[error("step {index} `{name}` failed")]
    Failed {
        /// The step's index.
        index: i64,
        /// The step's name.
        name: String,
        /// What failed.
        #[source]
        error: Box<AgentError>,
    },
    /// The step failed on an earlier execution with a terminal error, journaled: replayed.
    #[error("step {index} `{name}` failed earlier ({class}): {message}")]
    FailedEarlier {
        /// The step's index.
        index: i64,
        /// The step's name.
        name: String,
        /// The failure class journaled.
        class: FailureClass,
        /// The error journaled.
        message: String,
    },
    /// A resumed run asked, at a journaled position, for another step than the journal holds
    /// (the agent's code or its input changed): class `nondeterminism`, never retried.
    #[error(
        "nondeterminism at step {index}: the journal holds `{journaled}`, the agent asked for `{requested}`"
    )]
    Nondeterminism {
        /// The position.
        index: i64,
        /// The name journaled there.
        journaled: String,
        /// The name the agent asked for.
        requested: String,
    },
    /// A step's result is larger than the journal accepts (`runs.max_step_result`): class
    /// `result_too_large`, never retried.
    #[error("step {index} `{name}` returned {size} bytes of JSON, over the limit of {limit}")]
    ResultTooLarge {
        /// The step's index.
        index: i64,
        /// The step's name.
        name: String,
        /// Its serialised size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// A journaled step cannot be read back (bad JSON, or a result of another shape): class
    /// `corrupt_journal`, never retried.
    #[error("step {index} `{name}` has a corrupt journal row: {detail}")]
    CorruptJournal {
        /// The step's index (0 when the journal could not be read at all).
        index: i64,
        /// The step's name.
        name: String,
        /// What is wrong.
        detail: String,
    },
    /// The run spent a limit of its budget: it ends `failed` / `budget_exhausted`.
    #[error("budget exhausted before step {index}: {what} used {used} of {limit}")]
    BudgetExhausted {
        /// The step that did not run.
        index: i64,
        /// Which limit (`tokens_out`, `wall_time_ms`...).
        what: &'static str,
        /// What was used.
        used: u64,
        /// The limit.
        limit: u64,
    },
    /// A guarded step began on an earlier execution and never recorded a result, and its policy
    /// is [`OnAmbiguous::Fail`](crate::OnAmbiguous::Fail): class `ambiguous_effect`.
    #[error(
        "step {index} `{name}` is guarded and began without recording a result: its effect may or may not have happened"
    )]
    AmbiguousEffect {
        /// The step's index.
        index: i64,
        /// The step's name.
        name: String,
    },
    /// A guarded step with [`OnAmbiguous::Park`](crate::OnAmbiguous::Park) found its intent
    /// without a result: the run is parked `waiting_for_approval`, naming the step.
    #[error(
        "step {index} `{name}` is parked for an operator: its effect may or may not have happened"
    )]
    Parked {
        /// The step's index.
        index: i64,
        /// The step's name.
        name: String,
    },
    /// The run entered a durable wait: the execution ends and frees its worker. Propagate it
    /// with `?`.
    #[error("the run is waiting (durable wait)")]
    Suspended {
        /// The wait's signal was already there when the run was parked: it was woken at once
        /// and must be dispatched again.
        woken: bool,
    },
}

impl StepError {
    /// The failure class a step error settles the run with (None: not a failure of the run:
    /// lease lost, cancelled, suspended, parked, or a store failure).
    #[must_use]
    pub fn class(&self) -> Option<FailureClass> {
        match self {
            Self::Failed { error, .. } => error.class(),
            Self::FailedEarlier { class, .. } => Some(*class),
            Self::Nondeterminism { .. } => Some(FailureClass::Nondeterminism),
            Self::ResultTooLarge { .. } => Some(FailureClass::ResultTooLarge),
            Self::CorruptJournal { .. } => Some(FailureClass::CorruptJournal),
            Self::BudgetExhausted { .. } => Some(FailureClass::BudgetExhausted),
            Self::AmbiguousEffect { .. } => Some(FailureClass::AmbiguousEffect),
            Self::LeaseLost
            | Self::Cancelled
            | Self::Store(_)
            | Self::Parked { .. }
            | Self::Suspended { .. } => None,
        }
    }
}

/// An agent failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// A step boundary stopped it.
    #[error(transparent)]
    Step(#[from] StepError),
    /// A provider failed; classified by [`classify`](crate::classify).
    #[error(transparent)]
    Provider(#[from] ProviderError),
    /// A step ran longer than `runs.step_timeout`
    /// ([`RuntimeOptions::step_timeout`](crate::RuntimeOptions::step_timeout)): the agent was
    /// cancelled. Class `connection` (retryable), like every timeout.
    #[error("a step ran longer than the step timeout of {after:?}")]
    StepTimeout {
        /// The step timeout.
        after: std::time::Duration,
    },
    /// Anything else (class `unknown`).
    #[error(transparent)]
    Other(courier_core::BoxError),
}

impl AgentError {
    /// Wraps any error as [`AgentError::Other`].
    pub fn other(error: impl Into<courier_core::BoxError>) -> Self {
        Self::Other(error.into())
    }

    /// The failure class (None for step errors that are not failures: lease lost, cancelled,
    /// suspended, parked, store failures).
    #[must_use]
    pub fn class(&self) -> Option<FailureClass> {
        match self {
            Self::Step(step) => step.class(),
            Self::Provider(p) => Some(p.class()),
            Self::StepTimeout { .. } => Some(FailureClass::Connection),
            Self::Other(_) => Some(FailureClass::Unknown),
        }
    }

    /// The delay a provider asked for before a retry (a 429's `Retry-After`), through a failed
    /// step: the runtime requeues the run after it instead of its backoff.
    #[must_use]
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Step(StepError::Failed { error, .. }) => error.retry_after(),
            Self::Provider(p) => p.retry_after(),
            _ => None,
        }
    }
}

/// Sees every step as it happens (first thing at each boundary), e.g. to stream it to a UI.
pub trait RunObserver: Send + Sync + 'static {
    /// A step of `run_id` reached its boundary.
    fn on_step(&self, run_id: Uuid, step: &Step);
}

/// What a running agent gets: its run, the step boundary, the effect fence and a cancellation
/// token.
pub struct RunContext {
    pub(crate) run: Run,
    /// When the current step started (for the step timeout).
    pub(crate) steps: crate::watch::StepClock,
    pub(crate) store: Arc<dyn RunStore>,
    /// The worker identity for worker runs; None for interactive runs (no lease, no heartbeat).
    pub(crate) owner: Option<String>,
    pub(crate) lease: Duration,
    pub(crate) observers: Arc<[Arc<dyn RunObserver>]>,
    pub(crate) token: CancellationToken,
    pub(crate) approved: bool,
    /// The input given to resume a run that was waiting for it.
    pub(crate) provided: Option<serde_json::Value>,
    /// The step journal and the budget (see `agent/journal.rs`).
    pub(crate) journal: journal::Journal,
}

impl std::fmt::Debug for RunContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunContext")
            .field("run_id", &self.run.id)
            .field("owner", &self.owner)
            .field("approved", &self.approved)
            .field("provided_input", &self.provided.is_some())
            .finish_non_exhaustive()
    }
}

impl RunContext {
    /// The run as it was when this execution started.
    #[must_use]
    pub fn run(&self) -> &Run {
        &self.run
    }

    /// The run's input.
    #[must_use]
    pub fn input(&self) -> &serde_json::Value {
        &self.run.input
    }

    /// Which execution of this run this is: 1, then 2 after one requeue, ...
    #[must_use]
    pub fn execution(&self) -> u32 {
        self.run.requeue_count.saturating_add(1)
    }

    /// Whether this execution resumes an approved run.
    #[must_use]
    pub fn approved(&self) -> bool {
        self.approved
    }

    /// The input given with [`Runtime::provide_input`](crate::Runtime::provide_input) when this
    /// execution resumes a run that was `waiting_for_input`; `None` otherwise. It is also the
    /// payload of the run's `input` event.
    #[must_use]
    pub fn provided_input(&self) -> Option<&serde_json::Value> {
        self.provided.as_ref()
    }

    /// Whether this is a worker run (under a lease) rather than an interactive one.
    #[must_use]
    pub fn is_worker_run(&self) -> bool {
        self.owner.is_some()
    }

    /// Cancelled promptly when the lease is lost (or the run is cancelled at a boundary): watch it
    /// in long awaits between checkpoints.
    #[must_use]
    pub fn cancellation(&self) -> &CancellationToken {
        &self.token
    }

    /// The step boundary, in this order: emit to observers -> cancellation probe
    /// (cancelled: persist this step and stop) -> heartbeat renew (worker runs only; refused:
    /// stop with [`StepError::LeaseLost`] without persisting) -> persist at MAX(seq)+1.
    /// Returns the step's sequence number.
    ///
    /// A worker run probes and renews in one statement: the renew's guard (`running` and
    /// claimed by this worker) refuses a cancelled run too, and only a refused renew reads the
    /// run to tell a cancellation from a lost lease. Two statements per step, not three. A
    /// store call of a worker run's boundary left unanswered for a whole lease is a lost lease
    /// too (the lease ran out while it waited).
    ///
    /// # Errors
    /// [`StepError`]: propagate it with `?`.
    pub async fn checkpoint(&mut self, step: Step) -> Result<i64, StepError> {
        self.steps.boundary();
        for observer in self.observers.iter() {
            observer.on_step(self.run.id, &step);
        }
        let refused = match &self.owner {
            Some(owner) => {
                let renew = self.store.renew(self.run.id, owner, self.lease);
                !self.within_lease("renewing the lease", renew).await?
            }
            None => false,
        };
        if refused || self.owner.is_none() {
            let find = self.store.find(self.run.id);
            let status = self.within_lease("reading the run", find).await?;
            if status.map(|r| r.status) == Some(RunStatus::Cancelled) {
                let append = self
                    .store
                    .append_event(self.run.id, &step.kind, &step.payload);
                self.within_lease("persisting the step", append).await?;
                self.token.cancel();
                return Err(StepError::Cancelled);
            }
        }
        if self.owner.is_some() && !refused {
            metrics::counter!(courier_core::metrics::LEASE_RENEWALS).increment(1);
        }
        if refused {
            tracing::warn!(courier.run.id = %self.run.id, "lease lost at a step boundary");
            self.token.cancel();
            return Err(StepError::LeaseLost);
        }
        let append = self
            .store
            .append_event(self.run.id, &step.kind, &step.payload);
        self.within_lease("persisting the step", append).await
    }

    /// A store call of the step boundary, [`within_lease`] for a worker run: unanswered for a
    /// whole lease, the run stops as for a lost lease (whatever the call did, the next owner
    /// goes on from the persisted steps). An interactive run (no lease) waits.
    pub(crate) async fn within_lease<T>(
        &self,
        doing: &'static str,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StepError> {
        let lease = self.owner.is_some().then_some(self.lease);
        match within_lease(lease, self.run.id, doing, call).await? {
            Some(done) => Ok(done),
            None => {
                self.token.cancel();
                Err(StepError::LeaseLost)
            }
        }
    }

    /// Marks a non-idempotent effect as in flight (the write fence): a failure or a stale
    /// reclaim while it is set dead-letters the run instead of retrying it. Idempotent effects
    /// need no mark.
    ///
    /// # Errors
    /// The store failed, or the lease is lost.
    pub async fn begin_effect(&mut self, name: &str) -> Result<(), StepError> {
        self.set_effect(Some(name)).await
    }

    /// Clears the in-flight effect once it is known to be done.
    ///
    /// # Errors
    /// The store failed, or the lease is lost.
    pub async fn end_effect(&mut self) -> Result<(), StepError> {
        self.set_effect(None).await
    }

    async fn set_effect(&mut self, effect: Option<&str>) -> Result<(), StepError> {
        let mark = self
            .store
            .set_pending_effect(self.run.id, self.owner.as_deref(), effect);
        if self.within_lease("marking an effect", mark).await? {
            Ok(())
        } else {
            self.token.cancel();
            Err(StepError::LeaseLost)
        }
    }
}

/// Runs a store call of a worker run (`lease` is its lease; `None` for an interactive run,
/// which waits), giving it up after the lease: no answer by then (a connection black-holed by
/// a failover) means the lease ran out meanwhile and the reaper may have given the run to
/// another worker, so the caller stops as for a lost lease rather than wait until TCP gives up
/// on the connection. `None` when it was given up.
pub(crate) async fn within_lease<T>(
    lease: Option<Duration>,
    run_id: Uuid,
    doing: &'static str,
    call: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<Option<T>, StoreError> {
    let Some(lease) = lease else {
        return call.await.map(Some);
    };
    match tokio::time::timeout(lease, call).await {
        Ok(done) => done.map(Some),
        Err(_) => {
            tracing::warn!(courier.run.id = %run_id, lease = ?lease, doing, "lease lost: the store left a call unanswered for a whole lease; the run is left to the reaper");
            Ok(None)
        }
    }
}
