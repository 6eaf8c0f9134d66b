//! The durable steps of a [`RunContext`]: [`RunContext::step`], [`RunContext::sleep`] and
//! [`RunContext::wait_for_signal`]. The journal is read once per execution, at the first step;
//! a step found there returns its result without running; a step that runs is journaled in the
//! write that renews the lease (one statement on PostgreSQL), with its usage.

use std::collections::HashSet;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::{AgentError, RunContext, Step, StepError};
use crate::step::{
    Budget, Effect, FOREVER, JournalMode, OnAmbiguous, SIGNAL_EVENT, Signal, StepRecord, StepScope,
    StepStatus, StepWrite, Usage, WAIT_EFFECT,
};
use crate::{FailureClass, RunStatus, StoreError};

/// The default cap of a step's serialised result: 1 MiB.
pub const DEFAULT_MAX_STEP_RESULT: usize = 1 << 20;

/// A run's journal as one execution sees it.
#[derive(Debug)]
pub(crate) struct Journal {
    /// The rows read at the first step (None: not read yet).
    rows: Option<Vec<StepRecord>>,
    /// The next step's index, from 1.
    next: i64,
    /// The run's usage so far (as stored at the claim, plus this execution's steps).
    usage: Usage,
    budget: Budget,
    /// When the run first started, epoch ms of the store clock.
    started_ms: i64,
    /// The store clock at the claim, and the local instant then.
    clock: (i64, tokio::time::Instant),
    /// Steps replayed and not yet counted in the store.
    replayed: u64,
    pub(crate) max_result: usize,
}

impl Journal {
    pub(crate) fn new(run: &crate::Run, max_result: usize) -> Self {
        Self {
            // A claim that found no journaled step: nothing to read.
            rows: (run.journaled == Some(false)).then(Vec::new),
            next: 1,
            usage: run.usage,
            budget: run.budget.unwrap_or_default(),
            started_ms: run.started_at.unwrap_or(run.updated_at),
            clock: (run.updated_at, tokio::time::Instant::now()),
            replayed: 0,
            max_result,
        }
    }

    /// The store clock now, estimated from the claim's.
    fn now_ms(&self) -> i64 {
        let elapsed = i64::try_from(self.clock.1.elapsed().as_millis()).unwrap_or(i64::MAX / 4);
        self.clock.0.saturating_add(elapsed)
    }
}

fn corrupt(index: i64, name: &str, detail: impl std::fmt::Display) -> StepError {
    StepError::CorruptJournal {
        index,
        name: name.to_owned(),
        detail: detail.to_string(),
    }
}

impl RunContext {
    /// The journal's rows, read once per execution.
    async fn rows(&mut self) -> Result<&[StepRecord], StepError> {
        if self.journal.rows.is_none() {
            let read = self.store.steps(self.run.id);
            let rows = match self.within_lease("reading the step journal", read).await {
                Err(StepError::Store(StoreError::Corrupt(detail))) => {
                    return Err(corrupt(0, "", detail));
                }
                other => other?,
            };
            self.journal.rows = Some(rows);
        }
        Ok(self.journal.rows.as_deref().unwrap_or_default())
    }

    /// The journaled row at `index`, checked against the name asked for.
    async fn journaled(&mut self, index: i64, name: &str) -> Result<Option<StepRecord>, StepError> {
        let Some(row) = self
            .rows()
            .await?
            .iter()
            .find(|r| r.index == index)
            .cloned()
        else {
            return Ok(None);
        };
        if row.name != name {
            return Err(StepError::Nondeterminism {
                index,
                journaled: row.name,
                requested: name.to_owned(),
            });
        }
        Ok(Some(row))
    }

    /// Writes to the journal in the lease's renewal; a refused guard is a lost lease or a
    /// cancellation.
    async fn write(&mut self, mut write: StepWrite) -> Result<(), StepError> {
        write.replayed = self.journal.replayed;
        let journal = self
            .store
            .journal(self.run.id, self.owner.as_deref(), self.lease, &write);
        if self.within_lease("journaling a step", journal).await? {
            self.journal.replayed = 0;
            self.journal.usage = self.journal.usage.plus(write.usage);
            if self.owner.is_some() {
                metrics::counter!(courier_core::metrics::LEASE_RENEWALS).increment(1);
            }
            if let Some(rows) = &mut self.journal.rows {
                rows.retain(|r| r.index != write.index);
            }
            return Ok(());
        }
        Err(self.refused().await)
    }

    /// Why a guarded write matched nothing: cancelled, or another worker owns the run.
    async fn refused(&mut self) -> StepError {
        let find = self.store.find(self.run.id);
        let status = self.within_lease("reading the run", find).await;
        self.token.cancel();
        match status {
            Ok(Some(run)) if run.status == RunStatus::Cancelled => StepError::Cancelled,
            Err(e @ StepError::Store(_)) => e,
            _ => {
                tracing::warn!(courier.run.id = %self.run.id, "lease lost at a step boundary");
                StepError::LeaseLost
            }
        }
    }

    /// Refuses a step the budget has no room for.
    fn check_budget(&self, index: i64) -> Result<(), StepError> {
        let elapsed = u64::try_from(self.journal.now_ms() - self.journal.started_ms).unwrap_or(0);
        match self.journal.budget.exhausted(&self.journal.usage, elapsed) {
            Some((what, used, limit)) => Err(StepError::BudgetExhausted {
                index,
                what,
                used,
                limit,
            }),
            None => Ok(()),
        }
    }

    /// The run's usage so far (journaled steps of every execution).
    #[must_use]
    pub fn usage(&self) -> Usage {
        self.journal.usage
    }

    /// A durable step: returns the journaled result when an earlier execution finished the step
    /// at this position (the closure does not run), else runs `f` and journals its result in
    /// the write that renews the lease. `f` gets the step's [`StepScope`]: its idempotency key
    /// (`<run id>:<index>`, the same on every attempt and host) and where it reports its
    /// [`Usage`], which is added to the run's budget in the same write.
    ///
    /// The run's [`Budget`] is checked before a step runs; a [`Effect::Guarded`] step journals
    /// its intent before `f` runs, and a resume that finds the intent without a result does
    /// what its [`OnAmbiguous`] says.
    ///
    /// ```
    /// use courier_runs::{Agent, AgentError, AgentOutcome, Effect, OnAmbiguous, RunContext, Usage};
    ///
    /// struct Refund;
    ///
    /// #[courier_runs::async_trait]
    /// impl Agent for Refund {
    ///     async fn run(&self, cx: &mut RunContext) -> Result<AgentOutcome, AgentError> {
    ///         let plan: String = cx
    ///             .step("plan", Effect::Pure, |s| async move {
    ///                 s.report(Usage::tokens(120, 40));
    ///                 Ok("refund 10 EUR".to_owned())
    ///             })
    ///             .await?;
    ///         let receipt: String = cx
    ///             .step("pay", Effect::Guarded(OnAmbiguous::Park), |s| async move {
    ///                 // Pass s.key() to the payment API as its idempotency key.
    ///                 Ok(format!("paid with key {}", s.key()))
    ///             })
    ///             .await?;
    ///         Ok(AgentOutcome::Completed(serde_json::json!({ "plan": plan, "receipt": receipt })))
    ///     }
    /// }
    /// ```
    ///
    /// # Errors
    /// [`StepError`]: propagate it with `?` (the runtime settles the run by its class).
    pub async fn step<T, F, Fut>(
        &mut self,
        name: &str,
        effect: Effect,
        f: F,
    ) -> Result<T, StepError>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce(StepScope) -> Fut,
        Fut: Future<Output = Result<T, AgentError>>,
    {
        let index = self.journal.next;
        self.journal.next += 1;
        let mut mode = JournalMode::Insert;
        if let Some(row) = self.journaled(index, name).await? {
            match row.status {
                StepStatus::Done => {
                    self.journal.replayed += 1;
                    let output = row.output.unwrap_or(Value::Null);
                    return serde_json::from_value(output).map_err(|e| corrupt(index, name, e));
                }
                StepStatus::Failed => {
                    let class = row
                        .error_class
                        .as_deref()
                        .and_then(|c| c.parse().ok())
                        .unwrap_or(FailureClass::Unknown);
                    return Err(StepError::FailedEarlier {
                        index,
                        name: name.to_owned(),
                        class,
                        message: row.error.unwrap_or_default(),
                    });
                }
                StepStatus::Intent => match effect {
                    Effect::Guarded(OnAmbiguous::Fail) => {
                        return Err(StepError::AmbiguousEffect {
                            index,
                            name: name.to_owned(),
                        });
                    }
                    Effect::Guarded(OnAmbiguous::Park) => {
                        return Err(self.park(index, name).await);
                    }
                    _ => {
                        tracing::info!(courier.run.id = %self.run.id, step = index, name, "a step that began without a result runs again with the same key");
                        mode = JournalMode::Finish;
                    }
                },
                StepStatus::Retry => mode = JournalMode::Finish,
                StepStatus::Waiting => {
                    return Err(StepError::Nondeterminism {
                        index,
                        journaled: format!("{} (a durable wait)", row.name),
                        requested: name.to_owned(),
                    });
                }
            }
        }
        self.check_budget(index)?;
        self.steps.boundary();
        if mode == JournalMode::Insert && matches!(effect, Effect::Guarded(_)) {
            self.write(StepWrite {
                mode: JournalMode::Insert,
                index,
                name: name.to_owned(),
                effect: effect.as_str(),
                status: StepStatus::Intent,
                output: None,
                error: None,
                error_class: None,
                usage: Usage::default(),
                duration_ms: 0,
                replayed: 0,
            })
            .await?;
            mode = JournalMode::Finish;
        }
        let scope = StepScope {
            key: format!("{}:{index}", self.run.id),
            index,
            usage: Arc::new(Mutex::new(Usage::default())),
        };
        let started = tokio::time::Instant::now();
        let result = f(scope.clone()).await;
        let duration_ms = i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX);
        let mut write = StepWrite {
            mode,
            index,
            name: name.to_owned(),
            effect: effect.as_str(),
            status: StepStatus::Done,
            output: None,
            error: None,
            error_class: None,
            usage: scope.reported(),
            duration_ms,
            replayed: 0,
        };
        match result {
            Ok(value) => {
                let output = serde_json::to_value(&value).map_err(|e| StepError::Failed {
                    index,
                    name: name.to_owned(),
                    error: Box::new(AgentError::other(e)),
                })?;
                let size = serde_json::to_vec(&output).map_or(0, |v| v.len());
                if size > self.journal.max_result {
                    return Err(StepError::ResultTooLarge {
                        index,
                        name: name.to_owned(),
                        size,
                        limit: self.journal.max_result,
                    });
                }
                for observer in self.observers.iter() {
                    observer.on_step(self.run.id, &Step::new(name, output.clone()));
                }
                write.output = Some(output);
                self.write(write).await?;
                Ok(value)
            }
            Err(error) => {
                // A terminal failure is journaled (it is the step's result); a retryable one
                // leaves the step unfinished, to run again on the retry.
                let class = error.class();
                if let Some(class) = class.filter(|c| !c.is_retryable()) {
                    write.status = StepStatus::Failed;
                    write.error = Some(error.to_string());
                    write.error_class = Some(class.as_str().to_owned());
                    self.write(write).await?;
                }
                Err(StepError::Failed {
                    index,
                    name: name.to_owned(),
                    error: Box::new(error),
                })
            }
        }
    }

    /// Parks the run on a guarded step whose effect is ambiguous: `waiting_for_approval`,
    /// the step named in `pending_effect`.
    async fn park(&mut self, index: i64, name: &str) -> StepError {
        let effect = format!("step {index}: {name}");
        let mark = self
            .store
            .set_pending_effect(self.run.id, self.owner.as_deref(), Some(&effect));
        match self.within_lease("parking a step", mark).await {
            Ok(true) => StepError::Parked {
                index,
                name: name.to_owned(),
            },
            Ok(false) => self.refused().await,
            Err(e) => e,
        }
    }

    /// A durable sleep: the run is parked `waiting` until `duration` has passed (by the store's
    /// clock) and its worker is freed; the reaper dispatches it again when it is due, and the
    /// sleep returns on that execution. Propagate the error with `?`: it is how the execution
    /// ends ([`StepError::Suspended`]).
    ///
    /// # Errors
    /// [`StepError::Suspended`] while the sleep lasts; lease and store failures.
    pub async fn sleep(&mut self, duration: Duration) -> Result<(), StepError> {
        let index = self.journal.next;
        self.journal.next += 1;
        let name = "sleep";
        let row = self.journaled(index, name).await?;
        let until = match &row {
            Some(r) if r.status == StepStatus::Done => {
                self.journal.replayed += 1;
                return Ok(());
            }
            Some(r) => r
                .output
                .as_ref()
                .and_then(|o| o["until"].as_i64())
                .ok_or_else(|| corrupt(index, name, "a wait without `until`"))?,
            None => self
                .journal
                .now_ms()
                .saturating_add(i64::try_from(duration.as_millis()).unwrap_or(FOREVER)),
        };
        let state = json!({ "until": until });
        if row.is_some() && self.journal.now_ms() >= until {
            self.write(self.wait_write(JournalMode::Finish, index, name, StepStatus::Done, state))
                .await?;
            return Ok(());
        }
        if row.is_none() {
            self.write(self.wait_write(
                JournalMode::Insert,
                index,
                name,
                StepStatus::Waiting,
                state,
            ))
            .await?;
        }
        self.suspend(until, None).await
    }

    /// A durable wait for the signal `name` (sent with
    /// [`Runtime::signal`](crate::Runtime::signal), `courier runs signal`, a bus message or
    /// the dashboard), at most `timeout` (None: forever). The run is parked `waiting` and its
    /// worker freed; the signal (or the timeout, through the reaper) dispatches it again, and
    /// on that execution this returns the signal, journaled, or [`Signal::Timeout`]. Each
    /// signal is delivered to one wait.
    ///
    /// # Errors
    /// [`StepError::Suspended`] while the wait lasts; lease and store failures.
    pub async fn wait_for_signal(
        &mut self,
        name: &str,
        timeout: Option<Duration>,
    ) -> Result<Signal, StepError> {
        let index = self.journal.next;
        self.journal.next += 1;
        let step = format!("signal:{name}");
        let row = self.journaled(index, &step).await?;
        if let Some(r) = &row
            && r.status == StepStatus::Done
        {
            self.journal.replayed += 1;
            return signal_of(r.output.as_ref())
                .ok_or_else(|| corrupt(index, &step, "not a signal result"));
        }
        let until = match &row {
            Some(r) => r
                .output
                .as_ref()
                .and_then(|o| o["until"].as_i64())
                .ok_or_else(|| corrupt(index, &step, "a wait without `until`"))?,
            None => timeout.map_or(FOREVER, |t| {
                self.journal
                    .now_ms()
                    .saturating_add(i64::try_from(t.as_millis()).unwrap_or(FOREVER))
            }),
        };
        let mode = if row.is_some() {
            JournalMode::Finish
        } else {
            JournalMode::Insert
        };
        if let Some(received) = self.unconsumed_signal(name).await? {
            let signal = signal_of(Some(&received)).unwrap_or(Signal::Timeout);
            self.write(self.wait_write(mode, index, &step, StepStatus::Done, received))
                .await?;
            return Ok(signal);
        }
        if row.is_some() && self.journal.now_ms() >= until {
            let timed_out = json!({ "timeout": true, "until": until });
            self.write(self.wait_write(mode, index, &step, StepStatus::Done, timed_out))
                .await?;
            return Ok(Signal::Timeout);
        }
        if row.is_none() {
            let state = json!({ "until": until, "signal": name });
            self.write(self.wait_write(mode, index, &step, StepStatus::Waiting, state))
                .await?;
        }
        self.suspend(until, Some(name)).await?;
        unreachable_suspended()
    }

    /// The first signal `name` sent to this run that no journaled wait consumed, as the result
    /// a wait journals: `{"received": {"seq", "data", "by", "at"}}`.
    async fn unconsumed_signal(&mut self, name: &str) -> Result<Option<Value>, StepError> {
        let consumed: HashSet<i64> = self
            .rows()
            .await?
            .iter()
            .filter_map(|r| r.output.as_ref()?["received"]["seq"].as_i64())
            .collect();
        let events = self.store.events(self.run.id);
        let events = self.within_lease("reading signals", events).await?;
        Ok(events
            .into_iter()
            .filter(|e| e.kind == SIGNAL_EVENT && e.payload["name"] == name)
            .find(|e| !consumed.contains(&e.seq))
            .map(|e| {
                json!({"received": {
                    "seq": e.seq,
                    "data": e.payload["data"],
                    "by": e.payload["by"],
                    "at": e.created_at,
                }})
            }))
    }

    fn wait_write(
        &self,
        mode: JournalMode,
        index: i64,
        name: &str,
        status: StepStatus,
        output: Value,
    ) -> StepWrite {
        StepWrite {
            mode,
            index,
            name: name.to_owned(),
            effect: WAIT_EFFECT,
            status,
            output: Some(output),
            error: None,
            error_class: None,
            usage: Usage::default(),
            duration_ms: 0,
            replayed: 0,
        }
    }

    /// Parks the run `waiting` until `until` or `signal`; a signal that arrived meanwhile wakes
    /// it at once (the sender's wake found it still running).
    async fn suspend(&mut self, until: i64, signal: Option<&str>) -> Result<(), StepError> {
        let park = self
            .store
            .suspend(self.run.id, self.owner.as_deref(), until, signal);
        if !self.within_lease("parking the run", park).await? {
            return Err(self.refused().await);
        }
        let mut woken = false;
        if let Some(name) = signal
            && self.unconsumed_signal(name).await?.is_some()
        {
            let wake = self.store.wake(self.run.id, Some(name));
            woken = self.within_lease("waking the run", wake).await?;
        }
        Err(StepError::Suspended { woken })
    }
}

/// `suspend` always returns an error; this satisfies the type of the code after it.
fn unreachable_suspended() -> Result<Signal, StepError> {
    Err(StepError::Suspended { woken: false })
}

/// A journaled wait result as a [`Signal`].
fn signal_of(output: Option<&Value>) -> Option<Signal> {
    let output = output?;
    if output["timeout"] == Value::Bool(true) {
        return Some(Signal::Timeout);
    }
    let received = output.get("received")?;
    Some(Signal::Received {
        data: received["data"].clone(),
        by: received["by"].as_str().map(str::to_owned),
        at: received["at"].as_i64().unwrap_or_default(),
    })
}
