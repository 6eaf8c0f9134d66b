//! Durable agent runs on top of Courier: a run is a row, the
//! message [`RunAgent`] carries only its id, and **the row is the state**: a worker claims it
//! under a lease, checks its claim at every step boundary (renewing the lease once a quarter of
//! it has passed), and on failure either requeues it
//! with backoff or dead-letters it (`failed` + a [`TerminationReason`]); a [`Reaper`] recovers
//! runs whose worker died.
//!
//! ```
//! use courier_core::MessageBus;
//! use courier_runs::{MemoryRunStore, RunStatus, RunStore, Runtime, ScriptedAgent};
//! use std::sync::Arc;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! let store = Arc::new(MemoryRunStore::new());
//! let runtime = Runtime::builder(store.clone()).agent("scripted", ScriptedAgent).build();
//! // RunAgent routed to a sync transport: each run executes in-process when dispatched.
//! let bus = runtime
//!     .register(MessageBus::builder().sync_transport("sync").route("courier.run_agent", ["sync"]))
//!     .build();
//!
//! let id = runtime.enqueue("scripted", serde_json::json!({"steps": [{"sleep_ms": 1}, {"output": "hi"}]})).await?;
//! let run = store.find(id).await?.expect("stored");
//! assert_eq!(run.status, RunStatus::Completed);
//! assert_eq!(store.events(id).await?.len(), 2);
//! # drop(bus);
//! # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
//! ```
//!
//! Stores: [`MemoryRunStore`] (tests, on tokio's pausable clock) and [`SqlRunStore`] over sqlx's
//! runtime queries, tested against SQLite (bundled, WAL), PostgreSQL 15 and MariaDB 10.11 (crate
//! features `sqlite` (default), `postgres`, `mysql`, each turning on `sql`, the SQL store and its
//! dependencies: without it, as with `default-features = false`, neither sqlx nor courier-sql is
//! compiled). Every transition is one guarded statement
//! judged by rows matched (sqlx's MySQL driver always connects with `CLIENT_FOUND_ROWS`), with
//! "now" read from the database clock; tables and indexes are in `migrations/runs/*/0002_courier_runs.sql`
//! and `0003_courier_runs_due_at.sql`. [`RunStore::setup`] is safe when several workers start at
//! once: it holds a per-table lock (PostgreSQL `pg_advisory_xact_lock`, MySQL `GET_LOCK`, SQLite
//! `BEGIN IMMEDIATE`) while it creates the tables, and adds `due_at` to tables created before it.
//!
//! **The bus.** [`Runtime::register`] adds the [`RunAgentHandler`] to a bus builder and gives it
//! the runtime's [`Dispatcher`](courier_core::Dispatcher): building the bus fills it, and from
//! then on the runtime (and every [`Reaper`] it makes) holds that bus and dispatches `RunAgent`
//! on it, even after the caller dropped its own handle. The handler, which the bus holds, holds
//! no bus: it dispatches requeues on the bus handling its message
//! ([`MessageBus::current`](courier_core::MessageBus::current)), so nothing keeps a dropped bus
//! alive. A runtime never registered on a built bus fails with [`RunError::NotRegistered`].
//!
//! **Lost messages.** A queued run records when it is due (`due_at`: when it was queued, plus the
//! backoff its `RunAgent` was dispatched with). The [`Reaper`] also re-dispatches runs still
//! queued more than `redispatch_after` (default: the lease) past that time, because their message
//! is gone (a broker restarted without its data) or stranded: one guarded UPDATE moves `due_at` to
//! now, so two reapers never both dispatch, and a message that was only late is harmless (the
//! claim is guarded). [`Reaper::requeue`] (`courier runs requeue ID`) does it for an operator.
//!
//! **Unique runs.** [`Runtime::enqueue_unique`] with a [`UniqueKey`] (a key and a period) queues
//! a run unless another holds the key inside its period, and says which ([`Enqueued`]); the SQL
//! store decides with a unique index (`0008_courier_runs_unique.sql`), so concurrent enqueues on
//! any number of hosts queue one run.
//!
//! Choices made here: every agent failure is `provider_failed` and the class
//! decides whether it is retried; an agent's own stop (`max_steps`, `budget_exhausted`...) is never
//! retried; a worker run also checks its ownership every `lease / 4` between boundaries so a hung
//! agent is cancelled soon after a reaper gave its run away; timestamps are epoch milliseconds
//! from the store's clock; jitter only shortens a delay. A run that stops `waiting_for_approval`
//! resumes with [`Runtime::approve`], one `waiting_for_input` with [`Runtime::provide_input`]
//! (the input becomes the run's `input` event and [`RunContext::provided_input`]); both resume
//! interactively, in the caller's task.

mod agent;
mod classify;
mod config;
mod handler;
mod identity;
mod message;
mod reaper;
mod runtime;
mod scripted;
mod signal_message;
mod status;
mod step;
mod store;
mod unknown_name;
mod watch;

pub use agent::journal::DEFAULT_MAX_STEP_RESULT;
pub use agent::{Agent, AgentError, AgentOutcome, RunContext, RunObserver, Step, StepError};
pub use classify::{FailureClass, ProviderError, classify};
pub use config::{BackoffConfig, MIN_LEASE, MIN_REDISPATCH_AFTER, RunsConfig, RunsConfigError};
pub use courier_core::{Backoff, Jitter};
pub use handler::RunAgentHandler;
pub use identity::{new_worker_identity, worker_identity};
pub use message::RunAgent;
pub use reaper::{
    DEFAULT_REDISPATCH_AFTER, ManualRequeue, PRUNABLE, ReapOptions, ReapReport, Reaper,
};
pub use runtime::{
    CANCEL_CHECK_EVERY, RunError, Runtime, RuntimeBuilder, RuntimeOptions, SignalSent,
};
pub use scripted::ScriptedAgent;
pub use signal_message::{RunSignal, RunSignalHandler};
pub use status::{Outcome, RunStatus, TerminationReason};
pub use step::{
    Budget, Effect, JournalMode, OnAmbiguous, Resolution, Signal, StepRecord, StepScope,
    StepStatus, StepWrite, Usage,
};
#[cfg(feature = "sql")]
pub use store::{Dialect, MIGRATIONS, SharedWrites, SqlRunStore, SqlRunStoreOptions};
pub use store::{
    Enqueued, Inserted, InvalidCursor, InvalidUnique, MemoryRunStore, NewRun, PageFrom, Run,
    RunCursor, RunEvent, RunPageQuery, RunProbe, RunStore, Settlement, StoreError, UniqueKey,
    rfc3339_ms,
};
pub use unknown_name::UnknownName;

/// Re-exported for implementing [`Agent`].
pub use async_trait::async_trait;
/// Re-exported: the token of [`RunContext::cancellation`].
pub use tokio_util::sync::CancellationToken;
