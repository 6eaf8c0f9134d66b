//! The runtime: enqueue, worker runs (claim, lease, recovery), interactive runs, cancel.
//!
//! This file holds the [`Runtime`] and its builder; its parts, each an `impl Runtime` or a piece
//! of one, are in the files beside it.

mod bus;
mod control;
mod dispatch;
mod error;
mod execute;
mod interactive;
mod options;
mod recovery;
mod settle;
mod submit;
mod worker;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use courier_core::Dispatcher;
use uuid::Uuid;

use crate::agent::{Agent, RunObserver};
use crate::reaper::{Owed, Reaper};
use crate::watch::Held;
use crate::{RunStore, worker_identity};

pub use control::SignalSent;
pub(crate) use dispatch::{Via, dispatch_run};
pub use error::RunError;
pub(crate) use options::REQUEUE_BACKOFF;
pub use options::{CANCEL_CHECK_EVERY, RuntimeOptions};

pub(crate) struct Inner {
    pub(crate) store: Arc<dyn RunStore>,
    pub(crate) agents: HashMap<String, Arc<dyn Agent>>,
    pub(crate) worker: String,
    pub(crate) options: RuntimeOptions,
    pub(crate) observers: Arc<[Arc<dyn RunObserver>]>,
    /// Runs its reapers owe a dispatch (see [`Reaper`]).
    pub(crate) owed: Owed,
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
                owed: Owed::default(),
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
        key: Option<&str>,
        delay: Option<Duration>,
    ) -> Result<(), RunError> {
        dispatch_run(&self.bus, run_id, key, delay).await
    }
}
