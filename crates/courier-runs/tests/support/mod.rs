//! Shared fixtures: stores on every backend, timestamp rewrites, a transport that refuses sends.
#![allow(dead_code, unreachable_pub, missing_docs)]

use std::sync::Arc;
use std::time::Duration;

use courier_core::{
    Capabilities, Envelope, InMemoryTransport, MessageBus, Transport, TransportError,
    TransportErrorKind,
};
use courier_runs::{
    MemoryRunStore, NewRun, Run, RunStore, Runtime, RuntimeOptions, SqlRunStore, SqlRunStoreOptions,
};
use uuid::Uuid;

/// A store under test plus the means to rewrite its rows behind its back.
pub struct Fixture {
    pub store: Arc<dyn RunStore>,
    /// The SQL store's DSN (None in memory).
    pub dsn: Option<String>,
    backend: Backend,
    _dir: Option<TempDir>,
    /// Drops the store's tables on a server when the fixture goes, pass or fail (last, after
    /// the store).
    _cleanup: courier_test::Cleanup,
}

enum Backend {
    Memory(MemoryRunStore),
    Sql(SqlRunStore),
}

/// A temporary directory removed on drop.
pub struct TempDir(pub std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl TempDir {
    pub fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("courier-runs-{}", Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        Self(dir)
    }
}

pub fn memory() -> Fixture {
    let m = MemoryRunStore::new();
    Fixture {
        store: Arc::new(m.clone()),
        dsn: None,
        backend: Backend::Memory(m),
        _dir: None,
        _cleanup: courier_test::Cleanup::new(),
    }
}

pub async fn sql(dsn: &str, dir: Option<TempDir>) -> Fixture {
    let prefix = courier_test::env::unique_name("runs");
    let cleanup = courier_test::Cleanup::new();
    cleanup.sql_tables(dsn, &prefix);
    let options = SqlRunStoreOptions::default().table_prefix(&prefix);
    let s = tokio::time::timeout(Duration::from_secs(20), SqlRunStore::connect(dsn, options))
        .await
        .expect("connect timed out")
        .expect("connect");
    s.setup().await.expect("setup");
    s.setup().await.expect("setup is idempotent");
    Fixture {
        store: Arc::new(s.clone()),
        dsn: Some(dsn.to_owned()),
        backend: Backend::Sql(s),
        _dir: dir,
        _cleanup: cleanup,
    }
}

pub async fn sqlite() -> Fixture {
    let dir = TempDir::new();
    let dsn = format!("sqlite://{}?mode=rwc", dir.0.join("runs.db").display());
    sql(&dsn, Some(dir)).await
}

pub async fn postgres() -> Fixture {
    sql(&courier_test::env::postgres_url(), None).await
}

pub async fn mysql() -> Fixture {
    sql(&courier_test::env::mysql_url(), None).await
}

impl Fixture {
    pub fn sql(&self) -> Option<&SqlRunStore> {
        match &self.backend {
            Backend::Sql(s) => Some(s),
            Backend::Memory(_) => None,
        }
    }

    /// Rewrites `lease_expires` (1 = long expired).
    pub async fn set_lease(&self, id: Uuid, lease_expires: i64) {
        match &self.backend {
            Backend::Memory(m) => assert!(m.rewrite(id, |r| r.lease_expires = lease_expires)),
            Backend::Sql(s) => {
                let sql = format!(
                    "UPDATE {} SET lease_expires = {lease_expires} WHERE id = '{id}'",
                    s.runs_table()
                );
                s.execute(&sql).await.expect("rewrite lease");
            }
        }
    }

    /// Rewrites `due_at` (1 = due long ago).
    pub async fn set_due_at(&self, id: Uuid, due_at: i64) {
        match &self.backend {
            Backend::Memory(m) => assert!(m.rewrite(id, |r| r.due_at = due_at)),
            Backend::Sql(s) => {
                let sql = format!(
                    "UPDATE {} SET due_at = {due_at} WHERE id = '{id}'",
                    s.runs_table()
                );
                s.execute(&sql).await.expect("rewrite due_at");
            }
        }
    }

    /// Rewrites `created_at`.
    /// Rewrites `finished_at`.
    pub async fn set_finished_at(&self, id: Uuid, finished_at: i64) {
        match &self.backend {
            Backend::Memory(m) => assert!(m.rewrite(id, |r| r.finished_at = Some(finished_at))),
            Backend::Sql(s) => {
                let sql = format!(
                    "UPDATE {} SET finished_at = {finished_at} WHERE id = '{id}'",
                    s.runs_table()
                );
                s.execute(&sql).await.expect("rewrite finished_at");
            }
        }
    }

    pub async fn set_created_at(&self, id: Uuid, created_at: i64) {
        match &self.backend {
            Backend::Memory(m) => assert!(m.rewrite(id, |r| r.created_at = created_at)),
            Backend::Sql(s) => {
                let sql = format!(
                    "UPDATE {} SET created_at = {created_at} WHERE id = '{id}'",
                    s.runs_table()
                );
                s.execute(&sql).await.expect("rewrite created_at");
            }
        }
    }

    /// Moves the claim to another worker (it now owns the row).
    pub async fn give_to(&self, id: Uuid, worker: &str) {
        match &self.backend {
            Backend::Memory(m) => {
                assert!(m.rewrite(id, |r| r.claimed_by = Some(worker.to_owned())))
            }
            Backend::Sql(s) => {
                let sql = format!(
                    "UPDATE {} SET claimed_by = '{worker}' WHERE id = '{id}'",
                    s.runs_table()
                );
                s.execute(&sql).await.expect("rewrite claim");
            }
        }
    }

    /// Sets the requeue count.
    pub async fn set_requeue_count(&self, id: Uuid, n: u32) {
        match &self.backend {
            Backend::Memory(m) => assert!(m.rewrite(id, |r| r.requeue_count = n)),
            Backend::Sql(s) => {
                let sql = format!(
                    "UPDATE {} SET requeue_count = {n} WHERE id = '{id}'",
                    s.runs_table()
                );
                s.execute(&sql).await.expect("rewrite count");
            }
        }
    }

    /// Ends the period of a unique key now.
    pub async fn expire_unique(&self, key: &str) {
        match &self.backend {
            Backend::Memory(m) => assert!(m.expire_unique(key)),
            Backend::Sql(s) => {
                let sql = format!(
                    "UPDATE {} SET unique_until = 1 WHERE unique_key = '{key}'",
                    s.runs_table()
                );
                assert_eq!(s.execute(&sql).await.expect("expire key"), 1);
            }
        }
    }

    pub async fn queued(&self, agent: &str) -> Run {
        let run = NewRun {
            id: Uuid::new_v4(),
            agent: agent.into(),
            input: serde_json::json!({"n": 1}),
            budget: None,
            concurrency_key: None,
        };
        self.store.insert_queued(&run).await.expect("insert")
    }

    pub async fn run(&self, id: Uuid) -> Run {
        self.store.find(id).await.expect("find").expect("exists")
    }

    pub async fn cleanup(self) {
        if let Backend::Sql(s) = &self.backend {
            s.drop_tables().await.expect("drop tables");
        }
    }
}

/// A transport whose sends always fail with this kind of error.
#[derive(Debug)]
pub struct RefusingTransport(pub TransportErrorKind);

#[courier_core::async_trait]
impl Transport for RefusingTransport {
    async fn send(&self, _: Envelope) -> Result<Envelope, TransportError> {
        Err(TransportError::new(self.0, "refusing").with_context("test: sends fail"))
    }
    async fn get(&self, _: usize) -> Result<Vec<Envelope>, TransportError> {
        Ok(vec![])
    }
    async fn ack(&self, _: &Envelope) -> Result<(), TransportError> {
        Ok(())
    }
    async fn reject(&self, _: &Envelope) -> Result<(), TransportError> {
        Ok(())
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::none().with_delay(None)
    }
}

/// An in-memory queue whose broker can be taken down: while `down`, sends fail with a
/// connection error (transient), as a restarting broker's do.
#[derive(Debug, Clone, Default)]
pub struct OutageTransport {
    pub queue: InMemoryTransport,
    pub down: Arc<std::sync::atomic::AtomicBool>,
}

impl OutageTransport {
    pub fn set_down(&self, down: bool) {
        self.down.store(down, std::sync::atomic::Ordering::SeqCst);
    }
}

#[courier_core::async_trait]
impl Transport for OutageTransport {
    async fn send(&self, envelope: Envelope) -> Result<Envelope, TransportError> {
        if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(
                TransportError::new(TransportErrorKind::Connection, "outage")
                    .with_context("test: the broker is down"),
            );
        }
        self.queue.send(envelope).await
    }
    async fn get(&self, max: usize) -> Result<Vec<Envelope>, TransportError> {
        self.queue.get(max).await
    }
    async fn ack(&self, envelope: &Envelope) -> Result<(), TransportError> {
        self.queue.ack(envelope).await
    }
    async fn reject(&self, envelope: &Envelope) -> Result<(), TransportError> {
        self.queue.reject(envelope).await
    }
    fn capabilities(&self) -> Capabilities {
        self.queue.capabilities()
    }
}

/// A runtime over `store` whose `RunAgent` messages go to `transport` (recorded, not run).
pub fn outage_runtime(
    store: Arc<dyn RunStore>,
    worker: &str,
    transport: &OutageTransport,
) -> (Runtime, MessageBus) {
    routed_runtime(
        store,
        worker,
        RuntimeOptions::default(),
        Arc::new(transport.clone()),
    )
}

/// A runtime over `store` for `worker` with the scripted agent, on a bus routing `RunAgent`
/// to `transport`.
fn routed_runtime(
    store: Arc<dyn RunStore>,
    worker: &str,
    options: RuntimeOptions,
    transport: Arc<dyn Transport>,
) -> (Runtime, MessageBus) {
    let runtime = Runtime::builder(store)
        .agent("scripted", courier_runs::ScriptedAgent)
        .worker_identity(worker)
        .options(options)
        .build();
    let bus = runtime
        .register(
            MessageBus::builder()
                .transport("async", transport)
                .route("courier.run_agent", ["async"]),
        )
        .build();
    (runtime, bus)
}

/// A runtime over `store` whose `RunAgent` messages go to an in-memory queue (recorded, not run).
pub fn queued_runtime(
    store: Arc<dyn RunStore>,
    worker: &str,
    options: RuntimeOptions,
) -> (Runtime, MessageBus, InMemoryTransport) {
    let queue = InMemoryTransport::new();
    let (runtime, bus) = routed_runtime(store, worker, options, Arc::new(queue.clone()));
    (runtime, bus, queue)
}

/// A runtime whose dispatches all fail for good (a misconfigured transport).
pub fn refusing_runtime(store: Arc<dyn RunStore>, worker: &str) -> (Runtime, MessageBus) {
    failing_runtime(store, worker, TransportErrorKind::Config)
}

/// A runtime whose transport is unreachable for now (its dispatches fail, transiently).
pub fn unreachable_runtime(store: Arc<dyn RunStore>, worker: &str) -> (Runtime, MessageBus) {
    failing_runtime(store, worker, TransportErrorKind::Connection)
}

fn failing_runtime(
    store: Arc<dyn RunStore>,
    worker: &str,
    kind: TransportErrorKind,
) -> (Runtime, MessageBus) {
    routed_runtime(
        store,
        worker,
        RuntimeOptions::default(),
        Arc::new(RefusingTransport(kind)),
    )
}

/// The `RunAgent` messages sent, as (run id, delay).
pub fn dispatched(queue: &InMemoryTransport) -> Vec<(Uuid, Option<Duration>)> {
    queue
        .sent()
        .iter()
        .map(|e| {
            let m = e.message::<courier_runs::RunAgent>().expect("a RunAgent");
            (m.run_id, e.last::<courier_core::DelayStamp>().map(|d| d.0))
        })
        .collect()
}

/// A runtime over `store` for `worker` with the scripted agent, registered on a bus that routes
/// `RunAgent` to an in-memory queue; `f` adjusts the builder.
pub fn runtime_with(
    store: &MemoryRunStore,
    worker: &str,
    f: impl FnOnce(courier_runs::RuntimeBuilder) -> courier_runs::RuntimeBuilder,
) -> (Runtime, MessageBus, InMemoryTransport) {
    let queue = InMemoryTransport::new();
    let runtime = f(Runtime::builder(Arc::new(store.clone()))
        .agent("scripted", courier_runs::ScriptedAgent)
        .worker_identity(worker))
    .build();
    let bus = runtime
        .register(
            MessageBus::builder()
                .transport("async", Arc::new(queue.clone()))
                .route("courier.run_agent", ["async"]),
        )
        .build();
    (runtime, bus, queue)
}

/// The stored run (it must exist).
pub async fn row(store: &MemoryRunStore, id: Uuid) -> Run {
    store
        .find(id)
        .await
        .expect("store")
        .expect("the run exists")
}
