//! The run store: every transition of a run as one guarded write.

mod json;
mod memory;
mod page;
#[cfg(feature = "sql")]
mod sql;
mod unique;

use std::time::Duration;

use async_trait::async_trait;
use serde::Serialize;
use uuid::Uuid;

use crate::step::{Budget, StepRecord, StepStatus, StepWrite, Usage};
use crate::{FailureClass, RunStatus, TerminationReason};

pub use json::rfc3339_ms;
pub use memory::MemoryRunStore;
pub use page::{InvalidCursor, PageFrom, RunCursor, RunPageQuery};
#[cfg(feature = "sql")]
pub use sql::{Dialect, MIGRATIONS, SharedWrites, SqlRunStore, SqlRunStoreOptions};
pub use unique::{Enqueued, Inserted, InvalidUnique, UniqueKey};

/// A run as stored. Times are epoch milliseconds from the store's clock (the database clock for
/// SQL stores); `lease_expires == 0` means no lease.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Run {
    /// The run id.
    pub id: Uuid,
    /// The agent name.
    pub agent: String,
    /// The status.
    pub status: RunStatus,
    /// The input (JSON).
    pub input: serde_json::Value,
    /// The output (JSON), once completed.
    pub output: Option<serde_json::Value>,
    /// The failure class of the failure that stopped it.
    pub error_class: Option<FailureClass>,
    /// Why it stopped.
    pub termination_reason: Option<TerminationReason>,
    /// The worker identity holding the lease.
    pub claimed_by: Option<String>,
    /// Lease expiry, epoch ms (0 = no lease).
    pub lease_expires: i64,
    /// How many times it was requeued (failure retries and stale reclaims together).
    pub requeue_count: u32,
    /// A non-idempotent effect in flight (the write fence), if any.
    pub pending_effect: Option<String>,
    /// Creation time, epoch ms.
    pub created_at: i64,
    /// First start, epoch ms.
    pub started_at: Option<i64>,
    /// When it reached a terminal status, epoch ms.
    pub finished_at: Option<i64>,
    /// Last write, epoch ms.
    pub updated_at: i64,
    /// When a queued run is due, epoch ms: when it was queued, plus the delay of a requeue with
    /// backoff. The reaper re-dispatches a run still queued long past it (its message was lost).
    /// For a run in a durable wait: when the wait ends (its sleep, or its signal's timeout).
    pub due_at: i64,
    /// The run's limits, if it was submitted with any.
    pub budget: Option<Budget>,
    /// What its journaled steps used, in total.
    pub usage: Usage,
    /// How many journaled steps its executions replayed instead of running.
    pub steps_replayed: u64,
    /// The signal a run in a durable wait waits for.
    pub wait_signal: Option<String>,
    /// Its concurrency key ([`NewRun::concurrency_key`]).
    pub concurrency_key: Option<String>,
    /// Whether the run had journaled steps when this worker claimed it, read by the claim's
    /// own statement (PostgreSQL, SQLite, memory): `Some(false)` spares its first step the
    /// journal read. None (any other read, MySQL's claim): not known; the journal is read at the
    /// first step. Not stored.
    #[serde(skip)]
    pub journaled: Option<bool>,
}

/// What [`RunStore::probe`] reads of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunProbe {
    /// The run.
    pub id: Uuid,
    /// Its status.
    pub status: RunStatus,
    /// The worker holding its lease, if any.
    pub claimed_by: Option<String>,
}

/// One persisted step of a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunEvent {
    /// The run.
    pub run_id: Uuid,
    /// 1, 2, 3... unique per run.
    pub seq: i64,
    /// The step kind.
    pub kind: String,
    /// The step payload (JSON).
    pub payload: serde_json::Value,
    /// When it was persisted, epoch ms.
    pub created_at: i64,
}

/// A new run.
#[derive(Debug, Clone)]
pub struct NewRun {
    /// The id (generate with [`Uuid::new_v4`]).
    pub id: Uuid,
    /// The agent name.
    pub agent: String,
    /// The input.
    pub input: serde_json::Value,
    /// Its limits (None: none), stored with the run.
    pub budget: Option<Budget>,
    /// Its concurrency key (None: none), stored with the run: each `RunAgent` dispatched for it
    /// carries it as a [`ConcurrencyKeyStamp`](courier_core::ConcurrencyKeyStamp), so a keyed
    /// runs transport (`concurrency_max=N` on its DSN) runs at most N runs of one key at once,
    /// across every worker and host. Set it with [`NewRun::with_concurrency_key`], which checks it.
    pub concurrency_key: Option<String>,
}

impl NewRun {
    /// A new run of `agent` with `input`, a fresh id, no budget and no concurrency key.
    #[must_use]
    pub fn new(agent: impl Into<String>, input: serde_json::Value) -> Self {
        Self {
            id: Uuid::new_v4(),
            agent: agent.into(),
            input,
            budget: None,
            concurrency_key: None,
        }
    }

    /// The run with concurrency key `key` (for example a customer, or an LLM provider
    /// account): at most `concurrency_max` runs of one key run at once on a keyed runs
    /// transport; a run whose key is full waits queued, without holding a worker.
    ///
    /// ```
    /// use courier_runs::NewRun;
    ///
    /// let run = NewRun::new("support", serde_json::json!({}))
    ///     .with_concurrency_key("customer-42")?;
    /// assert_eq!(run.concurrency_key.as_deref(), Some("customer-42"));
    /// assert!(NewRun::new("support", serde_json::json!({})).with_concurrency_key("").is_err());
    /// # Ok::<(), courier_core::InvalidConcurrencyKey>(())
    /// ```
    ///
    /// # Errors
    /// [`InvalidConcurrencyKey`](courier_core::InvalidConcurrencyKey) for an empty key or one
    /// longer than 200 bytes.
    pub fn with_concurrency_key(
        mut self,
        key: impl Into<String>,
    ) -> Result<Self, courier_core::InvalidConcurrencyKey> {
        let stamp = courier_core::ConcurrencyKeyStamp::new(key)?;
        self.concurrency_key = Some(stamp.as_str().to_owned());
        Ok(self)
    }
}

/// How a run ends (or pauses): the values [`RunStore::settle`] writes.
#[derive(Debug, Clone, PartialEq)]
pub struct Settlement {
    /// The new status (completed, failed, cancelled, waiting_for_*).
    pub status: RunStatus,
    /// The reason (None while waiting).
    pub reason: Option<TerminationReason>,
    /// The failure class.
    pub class: Option<FailureClass>,
    /// The output.
    pub output: Option<serde_json::Value>,
}

impl Settlement {
    /// `failed` for `reason`.
    #[must_use]
    pub fn failed(reason: TerminationReason, class: Option<FailureClass>) -> Self {
        Self {
            status: RunStatus::Failed,
            reason: Some(reason),
            class,
            output: None,
        }
    }
}

/// The run store failed (connection, SQL, corrupt row).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The database failed.
    #[error("run store query failed: {context}")]
    Database {
        /// What was being done.
        context: &'static str,
        /// The driver error.
        #[source]
        source: courier_core::BoxError,
    },
    /// A stored value could not be read.
    #[error("corrupt run row: {0}")]
    Corrupt(String),
    /// The DSN names no supported database.
    #[error("unsupported run store dsn `{0}`")]
    UnsupportedDsn(String),
    /// Two writers appended the same sequence number (the UNIQUE (run_id, seq) index held).
    #[error("event sequence {seq} of run {run_id} already exists")]
    DuplicateSequence {
        /// The run.
        run_id: Uuid,
        /// The sequence.
        seq: i64,
    },
}

impl StoreError {
    /// Whether the same operation may succeed later: the database could not be reached, the
    /// connection broke, the pool timed out, or the server cannot accept connections right now
    /// (starting up, too many connections).
    #[must_use]
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Database { source, .. } => is_transient_source(source),
            Self::Corrupt(_) | Self::UnsupportedDsn(_) | Self::DuplicateSequence { .. } => false,
        }
    }

    /// Whether the DSN or the options are at fault (an unsupported scheme, a DSN the driver
    /// cannot parse), so retrying cannot help.
    #[must_use]
    pub fn is_config(&self) -> bool {
        match self {
            Self::UnsupportedDsn(_) => true,
            Self::Database { source, .. } => is_config_source(source),
            Self::Corrupt(_) | Self::DuplicateSequence { .. } => false,
        }
    }
}

/// Whether a database error's source is a transient driver error (without the SQL store there
/// is no driver: none is).
#[cfg(feature = "sql")]
fn is_transient_source(source: &courier_core::BoxError) -> bool {
    source
        .downcast_ref::<sqlx::Error>()
        .is_some_and(sqlx_is_transient)
}

#[cfg(not(feature = "sql"))]
fn is_transient_source(_: &courier_core::BoxError) -> bool {
    false
}

/// Whether a database error's source is the driver refusing its configuration (a DSN it cannot
/// parse).
#[cfg(feature = "sql")]
fn is_config_source(source: &courier_core::BoxError) -> bool {
    matches!(
        source.downcast_ref::<sqlx::Error>(),
        Some(sqlx::Error::Configuration(_))
    )
}

#[cfg(not(feature = "sql"))]
fn is_config_source(_: &courier_core::BoxError) -> bool {
    false
}

#[cfg(feature = "sql")]
fn sqlx_is_transient(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        // SQLSTATE class 08: connection exception; 57P03: cannot connect now (starting up);
        // 53300: too many connections.
        sqlx::Error::Database(d) => d
            .code()
            .is_some_and(|c| c.starts_with("08") || c == "57P03" || c == "53300"),
        _ => false,
    }
}

/// Storage of runs and their events. Each method is ONE guarded write judged by rows matched,
/// with "now" from the store's clock; `bool` results say whether the guard matched.
#[async_trait]
pub trait RunStore: Send + Sync + std::fmt::Debug + 'static {
    /// Creates the tables and index if missing (idempotent).
    async fn setup(&self) -> Result<(), StoreError>;
    /// The store clock, epoch ms.
    async fn now_ms(&self) -> Result<i64, StoreError>;
    /// Inserts a `queued` run and returns it as stored (one `INSERT ... RETURNING` where the
    /// database has it; else the insert, then a read).
    async fn insert_queued(&self, run: &NewRun) -> Result<Run, StoreError>;
    /// Inserts a `queued` run holding `unique`'s key until its period has passed, unless
    /// another run holds the key: then nothing is inserted and that run's id is returned. Of
    /// many concurrent inserts with one key exactly one is inserted (SQL: a unique index on the
    /// key, an expired key cleared first, "now" from the database clock).
    async fn insert_queued_unique(
        &self,
        run: &NewRun,
        unique: &UniqueKey,
    ) -> Result<Inserted, StoreError>;
    /// Inserts an interactive `running` run (no claim, `lease_expires = 0`).
    async fn insert_interactive(&self, run: &NewRun) -> Result<Run, StoreError>;
    /// Finds a run.
    async fn find(&self, id: Uuid) -> Result<Option<Run>, StoreError>;
    /// The status and owner of several runs, in one read where the store can (the SQL store:
    /// `id IN (...)`, 500 ids a statement): what a worker checks of the runs it holds between
    /// their step boundaries. Runs that do not exist are left out. The default reads them one
    /// by one.
    async fn probe(&self, ids: &[Uuid]) -> Result<Vec<RunProbe>, StoreError> {
        let mut found = Vec::with_capacity(ids.len());
        for &id in ids {
            if let Some(run) = self.find(id).await? {
                found.push(RunProbe {
                    id,
                    status: run.status,
                    claimed_by: run.claimed_by,
                });
            }
        }
        Ok(found)
    }
    /// Renews the leases of several runs `worker` holds, in one statement where the store can
    /// (`id IN (...) AND status = 'running' AND claimed_by = worker`, 500 ids a statement):
    /// returns the ids the guard refused, the leases `worker` lost (stolen, cancelled, gone).
    /// The default renews them one by one.
    async fn renew_many(
        &self,
        ids: &[Uuid],
        worker: &str,
        lease: Duration,
    ) -> Result<Vec<Uuid>, StoreError> {
        let mut lost = Vec::new();
        for &id in ids {
            if !self.renew(id, worker, lease).await? {
                lost.push(id);
            }
        }
        Ok(lost)
    }
    /// Lists runs, newest first.
    async fn list(&self, status: Option<RunStatus>, limit: usize) -> Result<Vec<Run>, StoreError>;
    /// A page of runs, newest first: those matching the query's filters, from its cursor (keyset
    /// pagination, see [`RunPageQuery`]). The default filters [`RunStore::list`] in memory; the
    /// SQL and memory stores override it (the SQL one with indexed queries).
    async fn page(&self, query: &RunPageQuery) -> Result<Vec<Run>, StoreError> {
        Ok(query.select(self.list(query.status, usize::MAX).await?))
    }
    /// How many runs there are of each status, in [`RunStatus::ALL`] order, statuses without
    /// runs left out. The default counts [`RunStore::list`]; the SQL store counts in one
    /// `GROUP BY` over its status index.
    async fn count_by_status(&self) -> Result<Vec<(RunStatus, u64)>, StoreError> {
        let runs = self.list(None, usize::MAX).await?;
        Ok(count_statuses(runs.iter().map(|r| r.status)))
    }
    /// Claim: `id AND status='queued'` -> running, claimed_by=worker, lease = now + lease.
    /// Returns the claimed run as written (None: the guard matched nothing), read in the same
    /// statement where the database can (`UPDATE ... RETURNING` on PostgreSQL and SQLite; MySQL
    /// reads the row it now owns with a second statement).
    async fn claim(
        &self,
        id: Uuid,
        worker: &str,
        lease: Duration,
    ) -> Result<Option<Run>, StoreError>;
    /// Renew: `id AND status='running' AND claimed_by=worker` -> lease = now + lease.
    async fn renew(&self, id: Uuid, worker: &str, lease: Duration) -> Result<bool, StoreError>;
    /// Owner requeue: the renew guard -> queued, requeue_count+1, claim and lease cleared, due
    /// after `due_in` (the delay its `RunAgent` message is dispatched with).
    async fn requeue_owned(
        &self,
        id: Uuid,
        worker: &str,
        due_in: Duration,
    ) -> Result<bool, StoreError>;
    /// Stale select: running with `0 < lease_expires < now`, oldest lease first.
    async fn select_stale(&self, limit: usize) -> Result<Vec<Run>, StoreError>;
    /// Overdue select: queued with `due_at < now - after` (its message is presumably lost),
    /// longest overdue first.
    async fn select_overdue(&self, after: Duration, limit: usize) -> Result<Vec<Run>, StoreError>;
    /// Overdue re-dispatch: `id AND queued AND due_at < now - after` -> due now. Moving `due_at`
    /// forward is what makes a concurrent reaper's identical write match nothing.
    async fn redispatch_overdue(&self, id: Uuid, after: Duration) -> Result<bool, StoreError>;
    /// Operator re-dispatch: `id AND status='queued'` -> due now.
    async fn redispatch_queued(&self, id: Uuid) -> Result<bool, StoreError>;
    /// Stale requeue, staleness re-checked inside the write.
    async fn requeue_stale(&self, id: Uuid) -> Result<bool, StoreError>;
    /// Stale dead-letter (`failed` + reason), staleness re-checked inside the write.
    async fn dead_letter_stale(
        &self,
        id: Uuid,
        reason: TerminationReason,
    ) -> Result<bool, StoreError>;
    /// Settle: `id AND non-terminal AND claimed_by = owner` (`owner` None: interactive, no claim).
    async fn settle(
        &self,
        id: Uuid,
        owner: Option<&str>,
        settlement: &Settlement,
    ) -> Result<bool, StoreError>;
    /// Fails a `queued` run (a dispatch failure): `id AND status='queued'`; the run gives back
    /// its unique key, if it holds one.
    async fn fail_queued(&self, id: Uuid, reason: TerminationReason) -> Result<bool, StoreError>;
    /// Resumes a waiting run interactively: `id AND status=from` -> running, no lease.
    async fn resume(&self, id: Uuid, from: RunStatus) -> Result<bool, StoreError>;
    /// Cancel: any non-terminal status -> cancelled.
    async fn cancel(&self, id: Uuid) -> Result<bool, StoreError>;
    /// Sets or clears the pending non-idempotent effect: `id AND running AND claimed_by <=> owner`.
    async fn set_pending_effect(
        &self,
        id: Uuid,
        owner: Option<&str>,
        effect: Option<&str>,
    ) -> Result<bool, StoreError>;
    /// Appends an event at MAX(seq)+1 in one statement; returns its seq.
    async fn append_event(
        &self,
        id: Uuid,
        kind: &str,
        payload: &serde_json::Value,
    ) -> Result<i64, StoreError>;
    /// The events of a run, in seq order.
    async fn events(&self, id: Uuid) -> Result<Vec<RunEvent>, StoreError>;
    /// The step journal of a run, in index order.
    async fn steps(&self, id: Uuid) -> Result<Vec<StepRecord>, StoreError>;
    /// Journals a step in the write that renews the lease: the renew guard (`id AND running AND
    /// claimed_by <=> owner`) -> lease = now + lease, the write's usage and replays added to
    /// the run, and the step row inserted ([`JournalMode::Insert`](crate::JournalMode)) or the
    /// row holding its intent, retry or wait finished ([`JournalMode::Finish`](crate::JournalMode)).
    /// One statement on PostgreSQL, one transaction elsewhere. `false`: the guard refused and
    /// nothing was written.
    async fn journal(
        &self,
        id: Uuid,
        owner: Option<&str>,
        lease: Duration,
        write: &StepWrite,
    ) -> Result<bool, StoreError>;
    /// Parks a running run in a durable wait: the renew guard -> `waiting`, due at `until`
    /// (epoch ms), waiting for `signal` if any, claim and lease cleared.
    async fn suspend(
        &self,
        id: Uuid,
        owner: Option<&str>,
        until: i64,
        signal: Option<&str>,
    ) -> Result<bool, StoreError>;
    /// Runs in a durable wait whose due time has passed, earliest first.
    async fn select_due_waits(&self, limit: usize) -> Result<Vec<Run>, StoreError>;
    /// Wakes a run in a durable wait: `id AND waiting AND` (its due time has passed, or, with
    /// `signal`, it waits for that signal) -> `queued`, due now.
    async fn wake(&self, id: Uuid, signal: Option<&str>) -> Result<bool, StoreError>;
    /// Releases a run parked on a guarded step: `id AND waiting_for_approval` -> `queued`, due
    /// now, pending effect cleared.
    async fn release_parked(&self, id: Uuid) -> Result<bool, StoreError>;
    /// Copies the finished steps (`done`) of `from` before index `before` to the journal of
    /// `to` (a fork: a run whose first steps replay another's), in one statement; returns how
    /// many it copied.
    async fn copy_steps(&self, from: Uuid, to: Uuid, before: i64) -> Result<u64, StoreError>;
    /// Deletes up to `limit` runs in one of `statuses` (terminal ones) that finished more than
    /// `older_than` ago, oldest first, with their events and steps, in one transaction; returns
    /// how many runs it deleted. Call it again while it returns `limit`.
    async fn prune(
        &self,
        older_than: Duration,
        statuses: &[RunStatus],
        limit: usize,
    ) -> Result<u64, StoreError>;
    /// Rewrites a journaled step that holds an intent (an operator resolving a parked step):
    /// `run AND index AND status = intent` -> `status`, `output`.
    async fn resolve_step(
        &self,
        id: Uuid,
        index: i64,
        status: StepStatus,
        output: Option<&serde_json::Value>,
    ) -> Result<bool, StoreError>;
}

const _: () = {
    fn assert_dyn(_: &dyn RunStore) {}
    fn assert_send_sync<T: Send + Sync>() {}
    fn check() {
        assert_send_sync::<std::sync::Arc<dyn RunStore>>();
    }
    let _ = (assert_dyn, check);
};

/// Counts statuses, in [`RunStatus::ALL`] order, leaving out those with none.
pub(crate) fn count_statuses(statuses: impl Iterator<Item = RunStatus>) -> Vec<(RunStatus, u64)> {
    let mut counts = RunStatus::ALL.map(|s| (s, 0_u64));
    for status in statuses {
        if let Some(slot) = counts.iter_mut().find(|(s, _)| *s == status) {
            slot.1 += 1;
        }
    }
    counts.into_iter().filter(|(_, n)| *n > 0).collect()
}

pub(crate) fn lease_ms(lease: Duration) -> i64 {
    i64::try_from(lease.as_millis()).unwrap_or(i64::MAX / 4)
}
