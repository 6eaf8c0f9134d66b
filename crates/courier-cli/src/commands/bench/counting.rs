//! Decorators that count what `courier bench --runs` costs the databases.
//!
//! [`CountingStore`] wraps the run store and counts calls per [`RunStore`] method. Every call of
//! [`SqlRunStore`] is one SQL statement, except (read from `courier-runs/src/store/sql/engine.rs`):
//! where inserts do not use `INSERT ... RETURNING` (MySQL/MariaDB:
//! [`SqlRunStore::insert_returning`] is false), `insert_queued`, `insert_interactive` and
//! `append_event` are two (the INSERT, then a SELECT of the new row or of the sequence number it
//! got); on MySQL/MariaDB (no `UPDATE ... RETURNING`) `claim` is two (the guarded UPDATE, then a
//! SELECT of the claimed row; one when the guard matched nothing, counted as two all the same),
//! and so is `renew_many` (the UPDATE, then a SELECT of the runs still held; up to 500 runs).
//! `journal` (a durable step) takes what the store reports it sent
//! ([`SharedWrites::journal_statements`](courier_runs::SharedWrites)): one statement on
//! PostgreSQL (a data-modifying CTE); on SQLite and MySQL one (the step's row, guarded by the
//! run's) unless the run's row changes too (its lease is due for renewal, or the step adds
//! usage): then two on SQLite (one script, one round trip to the connection's thread) and four
//! on MySQL (BEGIN, the guarded renew, the step row's write, COMMIT, four round trips).
//! [`CountingStore::statements`] and [`CountingStore::round_trips`] apply exactly those rules.
//!
//! [`CountingTransport`] wraps the RunAgent transport and counts calls per [`Transport`] method,
//! splitting `get` into the calls that returned messages (one claim statement on the SQL
//! transports) and the empty ones (idle polling: on SQL, one claim and one next-due statement
//! per poll inside the poll window, so they are reported apart). On the SQL transports `send`,
//! `send_batch`, `ack`, `ack_batch`, `reject` and `retry` are one statement each, and `keepalive`
//! one per message (`keepalive_batch` loops).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use courier_core::{Capabilities, Envelope, Transport, TransportError};
use courier_runs::{
    Dialect, Inserted, NewRun, Run, RunEvent, RunStatus, RunStore, Settlement, SqlRunStore,
    StoreError, TerminationReason, UniqueKey, async_trait,
};
use uuid::Uuid;

/// The run store methods, in the order of [`CountingStore::calls`].
pub(super) const STORE_METHODS: [&str; 33] = [
    "setup",
    "now_ms",
    "insert_queued",
    "insert_interactive",
    "find",
    "probe",
    "renew_many",
    "list",
    "claim",
    "renew",
    "requeue_owned",
    "select_stale",
    "select_overdue",
    "redispatch_overdue",
    "redispatch_queued",
    "requeue_stale",
    "dead_letter_stale",
    "settle",
    "fail_queued",
    "resume",
    "cancel",
    "set_pending_effect",
    "append_event",
    "steps",
    "journal",
    "suspend",
    "select_due_waits",
    "wake",
    "release_parked",
    "resolve_step",
    "copy_steps",
    "prune",
    "events",
];

fn index(method: &str) -> usize {
    STORE_METHODS
        .iter()
        .position(|m| *m == method)
        .unwrap_or(STORE_METHODS.len() - 1)
}

/// Calls per method, indexed like [`STORE_METHODS`].
pub(super) type StoreCalls = [u64; STORE_METHODS.len()];

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A run store that counts its calls (see the module docs) and the runs it settled.
#[derive(Debug)]
pub(super) struct CountingStore {
    inner: Arc<dyn RunStore>,
    /// The store, for the statements its journal writes took ([`SqlRunStore::shared_writes`]),
    /// counted from `journal_base`.
    sql: Arc<SqlRunStore>,
    journal_base: u64,
    dialect: Dialect,
    insert_returning: bool,
    calls: [AtomicU64; STORE_METHODS.len()],
    settled: AtomicU64,
    settled_changed: tokio::sync::Notify,
    /// Runs whose submit-to-settle time is measured: when each was submitted.
    tracked: std::sync::Mutex<std::collections::HashMap<Uuid, std::time::Instant>>,
    /// The submit-to-settle times of the tracked runs settled so far.
    latencies: std::sync::Mutex<Vec<Duration>>,
}

impl CountingStore {
    pub(super) fn new(inner: Arc<SqlRunStore>, dialect: Dialect) -> Self {
        Self {
            insert_returning: inner.insert_returning(),
            journal_base: inner.shared_writes().journal_statements,
            sql: inner.clone(),
            inner,
            dialect,
            calls: std::array::from_fn(|_| AtomicU64::new(0)),
            settled: AtomicU64::new(0),
            settled_changed: tokio::sync::Notify::new(),
            tracked: std::sync::Mutex::default(),
            latencies: std::sync::Mutex::default(),
        }
    }

    /// Measures run `id`'s time from now (its submit) to its settle.
    pub(super) fn track(&self, id: Uuid) {
        lock(&self.tracked).insert(id, std::time::Instant::now());
    }

    /// The submit-to-settle times measured since the last call.
    pub(super) fn take_latencies(&self) -> Vec<Duration> {
        std::mem::take(&mut *lock(&self.latencies))
    }

    /// Runs settled so far.
    pub(super) fn settled(&self) -> u64 {
        self.settled.load(Ordering::Acquire)
    }

    fn bump(&self, method: &str) {
        self.calls[index(method)].fetch_add(1, Ordering::Relaxed);
    }

    /// Calls so far, per method.
    pub(super) fn calls(&self) -> StoreCalls {
        std::array::from_fn(|i| self.calls[i].load(Ordering::Relaxed))
    }

    /// The statements the journal writes took so far, as the store reports them; none when
    /// `calls` holds none.
    fn journal_statements(&self, calls: &StoreCalls) -> u64 {
        if calls[index("journal")] == 0 {
            return 0;
        }
        self.sql.shared_writes().journal_statements - self.journal_base
    }

    /// The round trips to the database these calls cost: the statements, except a journal
    /// write on SQLite, one script (see the module docs).
    pub(super) fn round_trips(&self, calls: &StoreCalls) -> u64 {
        let journal = index("journal");
        let mut others = *calls;
        others[journal] = 0;
        let journal_trips = match self.dialect {
            Dialect::Mysql => self.journal_statements(calls),
            _ => calls[journal],
        };
        self.statements(&others) + journal_trips
    }

    /// The SQL statements these calls cost (see the module docs).
    pub(super) fn statements(&self, calls: &StoreCalls) -> u64 {
        let journal = index("journal");
        let mut others = *calls;
        others[journal] = 0;
        self.journal_statements(calls)
            + others
                .iter()
                .enumerate()
                .map(|(i, n)| {
                    let per_call = match STORE_METHODS[i] {
                        "insert_queued" | "insert_interactive" | "append_event"
                            if !self.insert_returning =>
                        {
                            2
                        }
                        "claim" | "renew_many" if self.dialect == Dialect::Mysql => 2,
                        // Select, then BEGIN, three deletes, COMMIT.
                        "prune" => 6,
                        _ => 1,
                    };
                    n * per_call
                })
                .sum::<u64>()
    }

    /// Waits until `n` runs were settled (a settle whose guard matched), or `idle` passed
    /// without one; returns how many were settled.
    pub(super) async fn settled_at_least(&self, n: u64, idle: Duration) -> u64 {
        loop {
            let changed = self.settled_changed.notified();
            let now = self.settled.load(Ordering::Acquire);
            if now >= n {
                return now;
            }
            if tokio::time::timeout(idle, changed).await.is_err() {
                return self.settled.load(Ordering::Acquire);
            }
        }
    }
}

#[async_trait]
impl RunStore for CountingStore {
    async fn setup(&self) -> Result<(), StoreError> {
        self.bump("setup");
        self.inner.setup().await
    }
    async fn now_ms(&self) -> Result<i64, StoreError> {
        self.bump("now_ms");
        self.inner.now_ms().await
    }
    async fn insert_queued(&self, run: &NewRun) -> Result<Run, StoreError> {
        self.bump("insert_queued");
        self.inner.insert_queued(run).await
    }
    async fn insert_queued_unique(
        &self,
        run: &NewRun,
        unique: &UniqueKey,
    ) -> Result<Inserted, StoreError> {
        self.bump("insert_queued_unique");
        self.inner.insert_queued_unique(run, unique).await
    }
    async fn insert_interactive(&self, run: &NewRun) -> Result<Run, StoreError> {
        self.bump("insert_interactive");
        self.inner.insert_interactive(run).await
    }
    async fn find(&self, id: Uuid) -> Result<Option<Run>, StoreError> {
        self.bump("find");
        self.inner.find(id).await
    }
    async fn probe(&self, ids: &[Uuid]) -> Result<Vec<courier_runs::RunProbe>, StoreError> {
        self.bump("probe");
        self.inner.probe(ids).await
    }
    async fn renew_many(
        &self,
        ids: &[Uuid],
        worker: &str,
        lease: Duration,
    ) -> Result<Vec<Uuid>, StoreError> {
        self.bump("renew_many");
        self.inner.renew_many(ids, worker, lease).await
    }
    async fn list(&self, status: Option<RunStatus>, limit: usize) -> Result<Vec<Run>, StoreError> {
        self.bump("list");
        self.inner.list(status, limit).await
    }
    async fn claim(
        &self,
        id: Uuid,
        worker: &str,
        lease: Duration,
    ) -> Result<Option<Run>, StoreError> {
        self.bump("claim");
        self.inner.claim(id, worker, lease).await
    }
    async fn renew(&self, id: Uuid, worker: &str, lease: Duration) -> Result<bool, StoreError> {
        self.bump("renew");
        self.inner.renew(id, worker, lease).await
    }
    async fn requeue_owned(
        &self,
        id: Uuid,
        worker: &str,
        due_in: Duration,
    ) -> Result<bool, StoreError> {
        self.bump("requeue_owned");
        self.inner.requeue_owned(id, worker, due_in).await
    }
    async fn select_stale(&self, limit: usize) -> Result<Vec<Run>, StoreError> {
        self.bump("select_stale");
        self.inner.select_stale(limit).await
    }
    async fn select_overdue(&self, after: Duration, limit: usize) -> Result<Vec<Run>, StoreError> {
        self.bump("select_overdue");
        self.inner.select_overdue(after, limit).await
    }
    async fn redispatch_overdue(&self, id: Uuid, after: Duration) -> Result<bool, StoreError> {
        self.bump("redispatch_overdue");
        self.inner.redispatch_overdue(id, after).await
    }
    async fn redispatch_queued(&self, id: Uuid) -> Result<bool, StoreError> {
        self.bump("redispatch_queued");
        self.inner.redispatch_queued(id).await
    }
    async fn requeue_stale(&self, id: Uuid) -> Result<bool, StoreError> {
        self.bump("requeue_stale");
        self.inner.requeue_stale(id).await
    }
    async fn dead_letter_stale(
        &self,
        id: Uuid,
        reason: TerminationReason,
    ) -> Result<bool, StoreError> {
        self.bump("dead_letter_stale");
        self.inner.dead_letter_stale(id, reason).await
    }
    async fn settle(
        &self,
        id: Uuid,
        owner: Option<&str>,
        settlement: &Settlement,
    ) -> Result<bool, StoreError> {
        self.bump("settle");
        let settled = self.inner.settle(id, owner, settlement).await?;
        if settled && settlement.status.is_terminal() {
            if let Some(at) = lock(&self.tracked).remove(&id) {
                lock(&self.latencies).push(at.elapsed());
            }
            self.settled.fetch_add(1, Ordering::AcqRel);
            self.settled_changed.notify_waiters();
        }
        Ok(settled)
    }
    async fn fail_queued(&self, id: Uuid, reason: TerminationReason) -> Result<bool, StoreError> {
        self.bump("fail_queued");
        self.inner.fail_queued(id, reason).await
    }
    async fn resume(&self, id: Uuid, from: RunStatus) -> Result<bool, StoreError> {
        self.bump("resume");
        self.inner.resume(id, from).await
    }
    async fn cancel(&self, id: Uuid) -> Result<bool, StoreError> {
        self.bump("cancel");
        self.inner.cancel(id).await
    }
    async fn set_pending_effect(
        &self,
        id: Uuid,
        owner: Option<&str>,
        effect: Option<&str>,
    ) -> Result<bool, StoreError> {
        self.bump("set_pending_effect");
        self.inner.set_pending_effect(id, owner, effect).await
    }
    async fn append_event(
        &self,
        id: Uuid,
        kind: &str,
        payload: &serde_json::Value,
    ) -> Result<i64, StoreError> {
        self.bump("append_event");
        self.inner.append_event(id, kind, payload).await
    }
    async fn events(&self, id: Uuid) -> Result<Vec<RunEvent>, StoreError> {
        self.bump("events");
        self.inner.events(id).await
    }
    async fn steps(&self, id: Uuid) -> Result<Vec<courier_runs::StepRecord>, StoreError> {
        self.bump("steps");
        self.inner.steps(id).await
    }
    async fn journal(
        &self,
        id: Uuid,
        owner: Option<&str>,
        lease: Duration,
        write: &courier_runs::StepWrite,
    ) -> Result<bool, StoreError> {
        self.bump("journal");
        self.inner.journal(id, owner, lease, write).await
    }
    async fn suspend(
        &self,
        id: Uuid,
        owner: Option<&str>,
        until: i64,
        signal: Option<&str>,
    ) -> Result<bool, StoreError> {
        self.bump("suspend");
        self.inner.suspend(id, owner, until, signal).await
    }
    async fn select_due_waits(&self, limit: usize) -> Result<Vec<Run>, StoreError> {
        self.bump("select_due_waits");
        self.inner.select_due_waits(limit).await
    }
    async fn wake(&self, id: Uuid, signal: Option<&str>) -> Result<bool, StoreError> {
        self.bump("wake");
        self.inner.wake(id, signal).await
    }
    async fn release_parked(&self, id: Uuid) -> Result<bool, StoreError> {
        self.bump("release_parked");
        self.inner.release_parked(id).await
    }
    async fn resolve_step(
        &self,
        id: Uuid,
        index: i64,
        status: courier_runs::StepStatus,
        output: Option<&serde_json::Value>,
    ) -> Result<bool, StoreError> {
        self.bump("resolve_step");
        self.inner.resolve_step(id, index, status, output).await
    }
    async fn copy_steps(&self, from: Uuid, to: Uuid, before: i64) -> Result<u64, StoreError> {
        self.bump("copy_steps");
        self.inner.copy_steps(from, to, before).await
    }
    async fn prune(
        &self,
        older_than: Duration,
        statuses: &[RunStatus],
        limit: usize,
    ) -> Result<u64, StoreError> {
        self.bump("prune");
        self.inner.prune(older_than, statuses, limit).await
    }
}

/// The transport operations counted, in the order of [`CountingTransport::calls`].
pub(super) const TRANSPORT_METHODS: [&str; 9] = [
    "send",
    "send_batch",
    "get",
    "get_empty",
    "ack",
    "ack_batch",
    "reject",
    "retry",
    "keepalive",
];

/// Calls per operation, indexed like [`TRANSPORT_METHODS`].
pub(super) type TransportCalls = [u64; TRANSPORT_METHODS.len()];

/// A transport that counts its operations (see the module docs).
#[derive(Debug)]
pub(super) struct CountingTransport {
    inner: Arc<dyn Transport>,
    calls: [AtomicU64; TRANSPORT_METHODS.len()],
}

impl CountingTransport {
    pub(super) fn new(inner: Arc<dyn Transport>) -> Self {
        Self {
            inner,
            calls: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    fn bump(&self, op: &str, n: u64) {
        if let Some(i) = TRANSPORT_METHODS.iter().position(|m| *m == op) {
            self.calls[i].fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Operations so far.
    pub(super) fn calls(&self) -> TransportCalls {
        std::array::from_fn(|i| self.calls[i].load(Ordering::Relaxed))
    }

    /// The statements of the busy path on a SQL transport: every operation but the empty gets.
    pub(super) fn statements(calls: &TransportCalls) -> u64 {
        TRANSPORT_METHODS
            .iter()
            .zip(calls)
            .filter(|(m, _)| **m != "get_empty")
            .map(|(_, n)| n)
            .sum()
    }
}

#[async_trait]
impl Transport for CountingTransport {
    fn messaging_system(&self) -> &'static str {
        self.inner.messaging_system()
    }

    async fn send(&self, envelope: Envelope) -> Result<Envelope, TransportError> {
        self.bump("send", 1);
        self.inner.send(envelope).await
    }
    async fn get(&self, max: usize) -> Result<Vec<Envelope>, TransportError> {
        let got = self.inner.get(max).await?;
        self.bump(if got.is_empty() { "get_empty" } else { "get" }, 1);
        Ok(got)
    }
    async fn ack(&self, envelope: &Envelope) -> Result<(), TransportError> {
        self.bump("ack", 1);
        self.inner.ack(envelope).await
    }
    async fn reject(&self, envelope: &Envelope) -> Result<(), TransportError> {
        self.bump("reject", 1);
        self.inner.reject(envelope).await
    }
    async fn retry(&self, envelope: Envelope, delay: Duration) -> Result<(), TransportError> {
        self.bump("retry", 1);
        self.inner.retry(envelope, delay).await
    }
    async fn keepalive(&self, envelope: &Envelope) -> Result<(), TransportError> {
        self.bump("keepalive", 1);
        self.inner.keepalive(envelope).await
    }
    async fn keepalive_batch(&self, envelopes: &[Envelope]) -> Result<(), TransportError> {
        self.bump("keepalive", envelopes.len() as u64);
        self.inner.keepalive_batch(envelopes).await
    }
    async fn send_batch(&self, envelopes: Vec<Envelope>) -> Result<Vec<Envelope>, TransportError> {
        self.bump("send_batch", 1);
        self.inner.send_batch(envelopes).await
    }
    async fn ack_batch(&self, envelopes: &[Envelope]) -> Result<(), TransportError> {
        self.bump("ack_batch", 1);
        self.inner.ack_batch(envelopes).await
    }
    fn abilities(&self) -> courier_core::Abilities<'_> {
        let mut abilities = courier_core::Abilities::none();
        abilities.setup = self.inner.as_setup();
        abilities.listable = self.inner.as_listable();
        abilities.message_count = self.inner.as_message_count();
        abilities
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
}
