//! Submitting runs: enqueue (unique or not), submit, fork.

use uuid::Uuid;

use super::dispatch::check_keyed;
use super::{RunError, Runtime};
use crate::{Enqueued, Inserted, NewRun, TerminationReason, UniqueKey};

impl Runtime {
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
        if run.concurrency_key.is_some() {
            check_keyed(&self.bus, run.id)?;
        }
        self.inner.store.insert_queued(&run).await?;
        self.dispatch_new(run.id, run.concurrency_key.as_deref())
            .await?;
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
                self.dispatch_new(run.id, None).await?;
                Ok(Enqueued::Queued(run.id))
            }
        }
    }

    /// Dispatches a run just queued; a failed dispatch settles it `failed`/`dispatch_failed`.
    async fn dispatch_new(&self, id: Uuid, key: Option<&str>) -> Result<(), RunError> {
        if let Err(e) = self.dispatch(id, key, None).await {
            self.inner
                .store
                .fail_queued(id, TerminationReason::DispatchFailed)
                .await?;
            return Err(e);
        }
        Ok(())
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
        fork.concurrency_key = run.concurrency_key;
        // The journal first: a fork that exists has its steps (rows without a run are inert).
        let copied = store.copy_steps(run_id, fork.id, from_step.max(1)).await?;
        tracing::info!(courier.run.id = %fork.id, forked_from = %run_id, from_step, copied, "run forked");
        self.submit(fork).await
    }
}
