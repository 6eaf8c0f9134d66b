//! The runtime: enqueue, worker runs (claim, lease, recovery), interactive runs, cancel.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use courier_core::{BusError, DelayStamp, Dispatcher, Envelope, MessageBus, MessageBusBuilder};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use uuid::Uuid;

use crate::agent::{
    Agent, AgentError, AgentOutcome, RunContext, RunObserver, StepError, within_lease,
};
use crate::watch::{Held, Lost, StepClock, watch_steps};
use crate::{
    Backoff, Enqueued, Inserted, NewRun, Outcome, Reaper, Run, RunAgent, RunAgentHandler,
    RunStatus, RunStore, Settlement, StoreError, TerminationReason, UniqueKey, worker_identity,
};

/// The default requeue backoff: 30 s doubling up to 10 min, no jitter.
pub(crate) const REQUEUE_BACKOFF: Backoff =
    Backoff::new(Duration::from_secs(30), Duration::from_secs(600));

/// The longest wait, between step boundaries, before a worker run notices that it was cancelled
/// or that another worker owns it.
pub const CANCEL_CHECK_EVERY: Duration = Duration::from_millis(500);

/// Runtime settings (see [`RunsConfig`](crate::RunsConfig) for the file form).
#[derive(Debug, Clone)]
pub struct RuntimeOptions {
    /// Lease of a claimed run, renewed at every step boundary (default 900 s).
    pub lease: Duration,
    /// Requeues allowed, failure retries and stale reclaims together (default 3).
    pub max_requeues: u32,
    /// Requeue delays: attempt `n` is the requeue of a run requeued `n` times before (default
    /// 30 s doubling up to 10 min, no jitter).
    pub backoff: Backoff,
    /// How often a worker run checks, between step boundaries, that it still owns its row and
    /// was not cancelled, so the agent is stopped promptly when another worker took it or an
    /// operator cancelled it (`courier runs cancel`, on any host): default the shorter of lease / 4
    /// and [`CANCEL_CHECK_EVERY`] (500 ms), one read for all the runs the runtime holds
    /// ([`RunStore::probe`]); None: only at step boundaries.
    pub lease_check_every: Option<Duration>,
    /// The longest a step may take, from the run's start or its last step boundary to the next
    /// one: a step that takes longer is cancelled and fails the execution as a retryable
    /// timeout ([`AgentError::StepTimeout`], class `connection`, like every timeout). None
    /// (default): no limit.
    pub step_timeout: Option<Duration>,
    /// How long past its due time a queued run waits before the reaper dispatches it again
    /// (None: the lease).
    pub redispatch_after: Option<Duration>,
    /// The largest result a step may journal, in bytes of JSON (default 1 MiB): a larger one
    /// fails the run with class `result_too_large`.
    pub max_step_result: usize,
    /// How long finished runs are kept before the reaper deletes them, with their events and
    /// steps (None, the default: forever).
    pub retention: Option<Duration>,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(900),
            max_requeues: 3,
            backoff: REQUEUE_BACKOFF,
            lease_check_every: Some(CANCEL_CHECK_EVERY),
            step_timeout: None,
            redispatch_after: None,
            max_step_result: crate::journal::DEFAULT_MAX_STEP_RESULT,
            retention: None,
        }
    }
}

/// The runtime failed (not a run outcome: those are [`Outcome`]s).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Dispatching `RunAgent` failed; the run was settled `failed`/`dispatch_failed`.
    #[error("could not dispatch run {run_id}")]
    Dispatch {
        /// The run.
        run_id: Uuid,
        /// The bus error.
        #[source]
        source: BusError,
    },
    /// The runtime was never registered on a bus that was built (see [`Runtime::register`]),
    /// or a [`RunAgentHandler`] ran outside its bus.
    #[error(
        "the run runtime has no bus to dispatch on: register it on a bus builder (Runtime::register) and build the bus"
    )]
    NotRegistered,
    /// No agent of that name is registered.
    #[error("unknown agent `{0}`")]
    UnknownAgent(String),
    /// The run waits for another signal than the one sent (nothing was recorded).
    #[error("run {run_id} is not waiting for signal `{name}`{}", match waiting_for { Some(w) => format!(" (it waits for `{w}`)"), None => String::new() })]
    UnknownSignal {
        /// The run.
        run_id: Uuid,
        /// The signal sent.
        name: String,
        /// The signal it waits for.
        waiting_for: Option<String>,
    },
    /// The run does not exist.
    #[error("run {0} not found")]
    NotFound(Uuid),
    /// An operator's requeue was refused.
    #[error("run {run_id} was not requeued: {reason}")]
    NotRequeued {
        /// The run.
        run_id: Uuid,
        /// Why (its status, a live lease...).
        reason: String,
    },
    /// The run is not in the status the operation needs.
    #[error("run {run_id} is {status}, not {expected}")]
    WrongStatus {
        /// The run.
        run_id: Uuid,
        /// Its status.
        status: RunStatus,
        /// The status needed.
        expected: RunStatus,
    },
    /// An interactive run's agent failed: the failure, unchanged (the run is `failed`).
    #[error("run {run_id} failed")]
    Agent {
        /// The run.
        run_id: Uuid,
        /// The agent's error.
        #[source]
        error: AgentError,
    },
}

impl RunError {
    /// Whether this is a dispatch that failed because its transport is unreachable for now
    /// (connection lost, timed out): the message may be sent later, so a run already requeued
    /// stays queued for the reaper to dispatch again instead of being dead-lettered.
    #[must_use]
    pub fn is_transient_dispatch(&self) -> bool {
        matches!(
            self,
            Self::Dispatch {
                source: BusError::Send { source, .. },
                ..
            } if source.is_transient()
        )
    }
}

pub(crate) struct Inner {
    pub(crate) store: Arc<dyn RunStore>,
    pub(crate) agents: HashMap<String, Arc<dyn Agent>>,
    pub(crate) worker: String,
    pub(crate) options: RuntimeOptions,
    pub(crate) observers: Arc<[Arc<dyn RunObserver>]>,
    /// Runs its reapers owe a dispatch (see [`Reaper`]).
    pub(crate) owed: crate::reaper::Owed,
    /// The runs it executes under a lease, probed together.
    pub(crate) held: Held,
}

/// Runs agents durably. Cheap to clone.
///
/// ```
/// use courier_runs::{MemoryRunStore, Outcome, Runtime, ScriptedAgent};
/// use courier_core::MessageBus;
/// use std::sync::Arc;
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let runtime = Runtime::builder(Arc::new(MemoryRunStore::new())).agent("scripted", ScriptedAgent).build();
/// let bus = runtime
///     .register(MessageBus::builder().sync_transport("sync").route("courier.run_agent", ["sync"]))
///     .build();
/// let id = runtime.enqueue("scripted", serde_json::json!({"steps": [{"output": "done"}]})).await?;
/// let run = runtime.store().find(id).await?.unwrap();
/// assert_eq!(run.output, Some(serde_json::json!("done")));
/// # drop(bus);
/// # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
/// ```
#[derive(Clone)]
pub struct Runtime {
    pub(crate) inner: Arc<Inner>,
    pub(crate) bus: Via,
}

/// The bus a [`Runtime`] dispatches `RunAgent` on.
#[derive(Clone, Debug)]
pub(crate) enum Via {
    /// The bus its [`Dispatcher`] holds once built (the runtime keeps it alive).
    Dispatcher(Dispatcher),
    /// The bus handling the current message ([`MessageBus::current`]): the runtime inside a
    /// [`RunAgentHandler`], which the bus holds, so it must not hold the bus back.
    Handling,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut agents: Vec<_> = self.inner.agents.keys().collect();
        agents.sort();
        f.debug_struct("Runtime")
            .field("worker", &self.inner.worker)
            .field("agents", &agents)
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}

/// Builds a [`Runtime`].
pub struct RuntimeBuilder {
    store: Arc<dyn RunStore>,
    agents: HashMap<String, Arc<dyn Agent>>,
    worker: Option<String>,
    options: RuntimeOptions,
    dispatcher: Dispatcher,
    observers: Vec<Arc<dyn RunObserver>>,
}

impl RuntimeBuilder {
    /// Registers an agent under `name`.
    #[must_use]
    pub fn agent(mut self, name: impl Into<String>, agent: impl Agent) -> Self {
        self.agents.insert(name.into(), Arc::new(agent));
        self
    }

    /// Sets the options.
    #[must_use]
    pub fn options(mut self, options: RuntimeOptions) -> Self {
        self.options = options;
        self
    }

    /// Overrides the worker identity (tests simulating several processes; production uses
    /// [`worker_identity`]).
    #[must_use]
    pub fn worker_identity(mut self, id: impl Into<String>) -> Self {
        self.worker = Some(id.into());
        self
    }

    /// Adds an observer of every step.
    #[must_use]
    pub fn observer(mut self, observer: impl RunObserver) -> Self {
        self.observers.push(Arc::new(observer));
        self
    }

    /// Dispatches on `dispatcher`'s bus (filled elsewhere, or later by a bus builder it was
    /// given to) instead of a new dispatcher that [`Runtime::register`] fills.
    #[must_use]
    pub fn dispatcher(mut self, dispatcher: Dispatcher) -> Self {
        self.dispatcher = dispatcher;
        self
    }

    /// Builds the runtime.
    #[must_use]
    pub fn build(self) -> Runtime {
        Runtime {
            inner: Arc::new(Inner {
                store: self.store,
                agents: self.agents,
                worker: self.worker.unwrap_or_else(|| worker_identity().to_owned()),
                options: self.options,
                observers: self.observers.into(),
                owed: crate::reaper::Owed::default(),
                held: Held::default(),
            }),
            bus: Via::Dispatcher(self.dispatcher),
        }
    }
}

impl Runtime {
    /// Starts building a runtime over `store`.
    #[must_use]
    pub fn builder(store: Arc<dyn RunStore>) -> RuntimeBuilder {
        RuntimeBuilder {
            store,
            agents: HashMap::new(),
            worker: None,
            options: RuntimeOptions::default(),
            dispatcher: Dispatcher::new(),
            observers: Vec::new(),
        }
    }

    /// Registers the [`RunAgentHandler`] on a bus builder and gives it this runtime's
    /// [`Dispatcher`]: once built, the bus is the one the runtime (and its reapers) dispatch
    /// `RunAgent` on, and they keep it alive; the handler dispatches its requeues on the bus
    /// handling the message.
    #[must_use]
    pub fn register(&self, builder: MessageBusBuilder) -> MessageBusBuilder {
        let builder = builder
            .handler_named::<RunAgent, _>("courier.runs", RunAgentHandler::new(self.clone()))
            .handler_named::<crate::RunSignal, _>(
                "courier.runs.signal",
                crate::RunSignalHandler::new(self.clone()),
            );
        match &self.bus {
            Via::Dispatcher(d) => builder.dispatcher(d),
            Via::Handling => builder,
        }
    }

    /// The dispatcher this runtime dispatches through (`None` for the runtime inside a
    /// [`RunAgentHandler`], which uses the bus handling the message).
    #[must_use]
    pub fn dispatcher(&self) -> Option<&Dispatcher> {
        match &self.bus {
            Via::Dispatcher(d) => Some(d),
            Via::Handling => None,
        }
    }

    /// This runtime dispatching on the bus handling the current message: the form a handler
    /// inside the bus holds.
    pub(crate) fn handling(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            bus: Via::Handling,
        }
    }

    /// The store.
    #[must_use]
    pub fn store(&self) -> &Arc<dyn RunStore> {
        &self.inner.store
    }

    /// This runtime's worker identity.
    #[must_use]
    pub fn worker(&self) -> &str {
        &self.inner.worker
    }

    /// The options.
    #[must_use]
    pub fn options(&self) -> &RuntimeOptions {
        &self.inner.options
    }

    /// A reaper over the same store and bus.
    #[must_use]
    pub fn reaper(&self) -> Reaper {
        let options = &self.inner.options;
        Reaper::with_via(
            self.inner.store.clone(),
            self.bus.clone(),
            options.max_requeues,
            self.inner.owed.clone(),
        )
        .redispatch_after(options.redispatch_after.unwrap_or(options.lease))
        .retention(options.retention)
    }

    pub(crate) async fn dispatch(
        &self,
        run_id: Uuid,
        delay: Option<Duration>,
    ) -> Result<(), RunError> {
        dispatch_run(&self.bus, run_id, delay).await
    }

    /// Inserts a `queued` run and dispatches `RunAgent` for it. A failed dispatch settles the run
    /// `failed`/`dispatch_failed` (no orphan) and returns the error.
    ///
    /// # Errors
    /// Store failure, [`RunError::Dispatch`], [`RunError::NotRegistered`].
    pub async fn enqueue(&self, agent: &str, input: serde_json::Value) -> Result<Uuid, RunError> {
        self.submit(NewRun::new(agent, input)).await
    }

    /// Inserts the `queued` run `run` (its id, agent, input and [`Budget`](crate::Budget)) and
    /// dispatches `RunAgent` for it, as [`Runtime::enqueue`] does.
    ///
    /// ```
    /// use courier_core::MessageBus;
    /// use courier_runs::{Budget, MemoryRunStore, NewRun, Runtime, ScriptedAgent};
    /// use std::sync::Arc;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let runtime = Runtime::builder(Arc::new(MemoryRunStore::new())).agent("scripted", ScriptedAgent).build();
    /// let bus = runtime
    ///     .register(MessageBus::builder().sync_transport("sync").route("courier.run_agent", ["sync"]))
    ///     .build();
    /// let mut run = NewRun::new("scripted", serde_json::json!({"steps": [{"output": "done"}]}));
    /// run.budget = Some(Budget::new().tokens_out(1_000));
    /// let id = runtime.submit(run).await?;
    /// assert_eq!(runtime.store().find(id).await?.unwrap().budget, Some(Budget::new().tokens_out(1_000)));
    /// # drop(bus);
    /// # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    ///
    /// # Errors
    /// As [`Runtime::enqueue`].
    pub async fn submit(&self, run: NewRun) -> Result<Uuid, RunError> {
        self.inner.store.insert_queued(&run).await?;
        self.dispatch_new(run.id).await?;
        Ok(run.id)
    }

    /// [`Runtime::enqueue`] unless a run holds `unique`'s key inside its period: then nothing
    /// is enqueued and [`Enqueued::Duplicate`] names the run holding it. Of many concurrent
    /// enqueues with one key, on any number of hosts, exactly one is queued (the store decides:
    /// a unique index on SQL).
    ///
    /// ```
    /// use courier_core::{InMemoryTransport, MessageBus};
    /// use courier_runs::{Enqueued, MemoryRunStore, Runtime, ScriptedAgent, UniqueKey};
    /// use std::{sync::Arc, time::Duration};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let runtime = Runtime::builder(Arc::new(MemoryRunStore::new())).agent("scripted", ScriptedAgent).build();
    /// let bus = runtime
    ///     .register(MessageBus::builder().transport("async", Arc::new(InMemoryTransport::new())).route("courier.run_agent", ["async"]))
    ///     .build();
    /// let unique = UniqueKey::new("nightly-report", Duration::from_secs(3600))?;
    /// let first = runtime.enqueue_unique("scripted", serde_json::json!({}), unique.clone()).await?;
    /// let again = runtime.enqueue_unique("scripted", serde_json::json!({}), unique).await?;
    /// assert!(matches!(first, Enqueued::Queued(_)));
    /// assert_eq!(again, Enqueued::Duplicate(first.id()));
    /// # drop(bus);
    /// # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    ///
    /// # Errors
    /// As [`Runtime::enqueue`]; a run whose dispatch failed gives its key back.
    pub async fn enqueue_unique(
        &self,
        agent: &str,
        input: serde_json::Value,
        unique: UniqueKey,
    ) -> Result<Enqueued, RunError> {
        let run = NewRun::new(agent, input);
        match self.inner.store.insert_queued_unique(&run, &unique).await? {
            Inserted::Duplicate(holder) => {
                tracing::debug!(courier.run.id = %holder, courier.run.unique_key = unique.key(), "duplicate run not enqueued");
                Ok(Enqueued::Duplicate(holder))
            }
            Inserted::Queued(_) => {
                self.dispatch_new(run.id).await?;
                Ok(Enqueued::Queued(run.id))
            }
        }
    }

    /// Dispatches a run just queued; a failed dispatch settles it `failed`/`dispatch_failed`.
    async fn dispatch_new(&self, id: Uuid) -> Result<(), RunError> {
        if let Err(e) = self.dispatch(id, None).await {
            self.inner
                .store
                .fail_queued(id, TerminationReason::DispatchFailed)
                .await?;
            return Err(e);
        }
        Ok(())
    }

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
                crate::recovery::recover(
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
    /// [`RunContext::approved`]).
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
    /// [`RunContext::provided_input`].
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
            self.dispatch(run_id, None).await?;
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
        self.dispatch(run_id, None).await?;
        Ok(Outcome::Requeued {
            delay: Duration::ZERO,
        })
    }

    /// Forks a run: a new queued run of the same agent, input and budget whose steps before
    /// `from_step` (1-based) replay the original's journal, so it runs again from that step
    /// (like a time-travel debugger). The original is left as it is. Returns the new run's id.
    ///
    /// # Errors
    /// [`RunError::NotFound`], store and dispatch failures.
    pub async fn fork(&self, run_id: Uuid, from_step: i64) -> Result<Uuid, RunError> {
        let store = &self.inner.store;
        let run = store
            .find(run_id)
            .await?
            .ok_or(RunError::NotFound(run_id))?;
        let mut fork = NewRun::new(run.agent, run.input);
        fork.budget = run.budget;
        // The journal first: a fork that exists has its steps (rows without a run are inert).
        let copied = store.copy_steps(run_id, fork.id, from_step.max(1)).await?;
        tracing::info!(courier.run.id = %fork.id, forked_from = %run_id, from_step, copied, "run forked");
        self.submit(fork).await
    }

    /// Cancels a run in any non-terminal status; returns false when it was already terminal.
    /// A running agent stops at its next step boundary.
    ///
    /// # Errors
    /// Store failures.
    pub async fn cancel(&self, run_id: Uuid) -> Result<bool, RunError> {
        Ok(self.inner.store.cancel(run_id).await?)
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

    async fn execute(
        &self,
        agent: Arc<dyn Agent>,
        run: Run,
        owner: Option<String>,
        resume: Resume,
    ) -> Result<Executed, RunError> {
        let run_id = run.id;
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
            journal: crate::journal::Journal::new(&run_row, self.inner.options.max_step_result),
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
        let owner = owner.as_deref();
        let (settlement, outcome) = match result {
            Ok(AgentOutcome::Completed(output)) => (
                Settlement {
                    status: RunStatus::Completed,
                    reason: Some(TerminationReason::Completed),
                    class: None,
                    output: Some(output.clone()),
                },
                Outcome::Completed { output },
            ),
            Ok(AgentOutcome::AwaitingApproval) => (
                Settlement {
                    status: RunStatus::WaitingForApproval,
                    reason: None,
                    class: None,
                    output: None,
                },
                Outcome::AwaitingApproval,
            ),
            Ok(AgentOutcome::AwaitingInput) => (
                Settlement {
                    status: RunStatus::WaitingForInput,
                    reason: None,
                    class: None,
                    output: None,
                },
                Outcome::AwaitingInput,
            ),
            Ok(AgentOutcome::Stopped(reason)) => {
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
            Err(AgentError::Step(StepError::LeaseLost)) => {
                return Ok(Executed::Outcome(Outcome::LeaseLost));
            }
            Err(AgentError::Step(StepError::Cancelled)) => {
                return Ok(Executed::Outcome(Outcome::Cancelled));
            }
            Err(AgentError::Step(StepError::Store(e))) => return Err(e.into()),
            Err(AgentError::Step(StepError::Suspended { woken })) => {
                if woken && let Err(e) = self.dispatch(run_id, None).await {
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

/// What [`Runtime::signal`] did with a signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SignalSent {
    /// The run waited for it: it was queued and dispatched.
    Woken,
    /// The run was not waiting yet: it finds the signal when it reaches its wait.
    Buffered,
}

/// How an interactive execution resumes a waiting run.
#[derive(Debug, Default)]
struct Resume {
    /// The run was approved (it waited for approval).
    approved: bool,
    /// The input the run waited for.
    input: Option<serde_json::Value>,
}

pub(crate) enum Executed {
    Outcome(Outcome),
    Failed(AgentError),
}

pub(crate) async fn dispatch_run(
    via: &Via,
    run_id: Uuid,
    delay: Option<Duration>,
) -> Result<(), RunError> {
    let bus: MessageBus = match via {
        Via::Dispatcher(d) => d.bus().cloned(),
        Via::Handling => MessageBus::current(),
    }
    .ok_or(RunError::NotRegistered)?;
    let mut envelope = Envelope::new(RunAgent { run_id });
    if let Some(delay) = delay {
        envelope = envelope.with(DelayStamp(delay));
    }
    bus.dispatch(envelope)
        .await
        .map(drop)
        .map_err(|source| RunError::Dispatch { run_id, source })
}
