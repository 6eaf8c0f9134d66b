//! The SQL run store: PostgreSQL, SQLite and MySQL/MariaDB on the SQL layer of `courier-sql`
//! (its dialects, pools and migrations): one guarded statement per transition, "now" from the
//! database clock, each statement a template rendered per dialect and run by one executor
//! generic over the sqlx driver (`engine.rs`). Run ids and JSON are the database's own types
//! where it has them (UUID and JSONB on PostgreSQL; text elsewhere).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use courier_sql::migrate::{Applied, Migrations, Missing};
use courier_sql::{PoolSettings, invalid_table_name, is_valid_identifier};
use uuid::Uuid;

use super::{
    Inserted, NewRun, Run, RunEvent, RunPageQuery, RunStore, Settlement, StoreError, UniqueKey,
};
use crate::{RunStatus, TerminationReason};

mod engine;
mod queries;

pub use courier_sql::Dialect;

/// The SQL run store's migrations (placeholders `{runs}` and `{events}`, recorded in
/// `{runs}_migrations`): the files of `migrations/runs/<dialect>/`, found by `build.rs`.
pub static MIGRATIONS: Migrations = Migrations {
    main: "{runs}",
    list: found::RUNS,
};

/// The list `build.rs` writes from `migrations/runs/`.
mod found {
    use courier_sql::migrate::Migration;

    include!(concat!(env!("OUT_DIR"), "/migrations.rs"));
}

/// How long the pool waits for a connection.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a SQLite writer waits for the file lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Options of a [`SqlRunStore`].
#[derive(Debug, Clone)]
pub struct SqlRunStoreOptions {
    /// The runs table (default `courier_runs`).
    pub runs_table: String,
    /// The events table (default `courier_run_events`).
    pub events_table: String,
    /// Pool size (default 5).
    pub max_connections: u32,
}

impl Default for SqlRunStoreOptions {
    fn default() -> Self {
        Self {
            runs_table: "courier_runs".into(),
            events_table: "courier_run_events".into(),
            max_connections: 5,
        }
    }
}

impl SqlRunStoreOptions {
    /// Uses `{prefix}_runs` and `{prefix}_run_events` (tests: one pair of tables each).
    #[must_use]
    pub fn table_prefix(mut self, prefix: &str) -> Self {
        self.runs_table = format!("{prefix}_runs");
        self.events_table = format!("{prefix}_run_events");
        self
    }

    /// Sets the pool size.
    #[must_use]
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n.max(1);
        self
    }
}

/// What the store does beyond [`RunStore`], on one dialect.
#[async_trait]
trait Engine: RunStore {
    async fn migrate(&self) -> Result<Vec<Applied>, StoreError>;
    async fn missing_migrations(&self) -> Result<Vec<Missing>, StoreError>;
    #[cfg(feature = "test-util")]
    async fn execute(&self, sql: &str) -> Result<u64, StoreError>;
    async fn explain_stale(&self, limit: usize) -> Result<Vec<String>, StoreError>;
    fn stale_query(&self) -> &str;
    fn page_query(&self, query: &RunPageQuery) -> &str;
    fn insert_returning(&self) -> bool;
    fn shared_writes(&self) -> SharedWrites;
}

/// What the hot writes (claims, journaled steps, settles) of concurrent runs cost together:
/// on PostgreSQL the statements they rode (one per batch), on SQLite the statements of the
/// transactions they shared, `BEGIN` and `COMMIT` included (a lone write of one statement is
/// one); and what the step journal's writes took on their own. Read by `courier bench --runs`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SharedWrites {
    /// Writes sent.
    pub writes: u64,
    /// Statements they took.
    pub statements: u64,
    /// The statements of the step journal's writes, before any sharing: on PostgreSQL one per
    /// write (a CTE); on SQLite one (the step's row, guarded by the run's) or two (and the
    /// run's row: its lease or its usage), `BEGIN` and `COMMIT` not counted; on MySQL one or
    /// four (`BEGIN`, the run's row, the step's row, `COMMIT`).
    pub journal_statements: u64,
}

/// Counters of [`SharedWrites`], bumped by the batches.
#[derive(Debug, Default)]
pub(super) struct WriteCounter {
    writes: std::sync::atomic::AtomicU64,
    statements: std::sync::atomic::AtomicU64,
    journal_statements: std::sync::atomic::AtomicU64,
}

impl WriteCounter {
    #[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]
    pub(super) fn add(&self, writes: usize, statements: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        self.writes.fetch_add(writes as u64, Relaxed);
        self.statements.fetch_add(statements as u64, Relaxed);
    }

    /// A journal write took `statements` (see [`SharedWrites::journal_statements`]).
    pub(super) fn add_journal(&self, statements: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        self.journal_statements.fetch_add(statements, Relaxed);
    }

    pub(super) fn read(&self) -> SharedWrites {
        use std::sync::atomic::Ordering::Relaxed;
        SharedWrites {
            writes: self.writes.load(Relaxed),
            statements: self.statements.load(Relaxed),
            journal_statements: self.journal_statements.load(Relaxed),
        }
    }
}

/// The SQL run store.
///
/// ```no_run
/// use courier_runs::{RunStore, SqlRunStore, SqlRunStoreOptions};
/// # async fn demo() -> Result<(), courier_runs::StoreError> {
/// let store = SqlRunStore::connect("sqlite://courier.db", SqlRunStoreOptions::default()).await?;
/// store.setup().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct SqlRunStore {
    dialect: Dialect,
    options: SqlRunStoreOptions,
    engine: Arc<dyn Engine>,
}

pub(super) fn db(context: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
    move |e| StoreError::Database {
        context,
        source: Box::new(e),
    }
}

impl SqlRunStore {
    /// Connects to `dsn` (`sqlite://`, `postgres://`, `mysql://`); the matching crate feature
    /// must be on. A SQLite file is created when missing.
    ///
    /// # Errors
    /// Unsupported DSN, bad table names, connection failure.
    pub async fn connect(dsn: &str, options: SqlRunStoreOptions) -> Result<Self, StoreError> {
        let dialect = Dialect::from_dsn(dsn)
            .map_err(|_| StoreError::UnsupportedDsn(courier_core::redact(dsn)))?;
        for name in [&options.runs_table, &options.events_table] {
            if !is_valid_identifier(name) {
                return Err(StoreError::Corrupt(invalid_table_name(name)));
            }
        }
        let settings = PoolSettings {
            max_connections: Some(options.max_connections),
            acquire_timeout: ACQUIRE_TIMEOUT,
            busy_timeout: BUSY_TIMEOUT,
            ..PoolSettings::default()
        };
        let engine: Arc<dyn Engine> = match dialect {
            #[cfg(feature = "sqlite")]
            Dialect::Sqlite => {
                let pool = courier_sql::sqlite_pool(dsn, &settings)
                    .await
                    .map_err(db("connect"))?;
                Arc::new(engine::Runs::new(pool, &options, true))
            }
            #[cfg(feature = "postgres")]
            Dialect::Postgres => {
                let (pool, _) = courier_sql::postgres_pool(dsn, &settings)
                    .await
                    .map_err(db("connect"))?;
                Arc::new(engine::Runs::new(pool, &options, true))
            }
            #[cfg(feature = "mysql")]
            Dialect::Mysql => {
                let (pool, _, _) = courier_sql::mysql_pool(dsn, &settings)
                    .await
                    .map_err(db("connect"))?;
                // MariaDB 10.5+ has INSERT ... RETURNING, but sqlx's MySQL driver reads its row
                // without columns (the prepared statement announces none): two statements.
                Arc::new(engine::Runs::new(pool, &options, false))
            }
            #[allow(unreachable_patterns, reason = "every dialect's feature may be on")]
            _ => {
                let _ = settings;
                return Err(StoreError::UnsupportedDsn(courier_core::redact(dsn)));
            }
        };
        Ok(Self {
            dialect,
            options,
            engine,
        })
    }

    /// The store on the application's own pool ([`courier_sql::SqlPool`], built with `.into()`
    /// from a `SqlitePool`, `PgPool` or `MySqlPool`), sharing its connection budget with the
    /// application and a transport built with
    /// [`SqlTransport::from_pool`](courier_sql::SqlTransport::from_pool).
    /// `options.max_connections` is the pool's own and ignored. The store never closes the pool,
    /// and creates no table: call [`SqlRunStore::migrate`] (or apply the SQL of
    /// `courier setup --print-sql`).
    ///
    /// # Errors
    /// Bad table names.
    pub fn from_pool(
        pool: impl Into<courier_sql::SqlPool>,
        options: SqlRunStoreOptions,
    ) -> Result<Self, StoreError> {
        for name in [&options.runs_table, &options.events_table] {
            if !is_valid_identifier(name) {
                return Err(StoreError::Corrupt(invalid_table_name(name)));
            }
        }
        let pool: courier_sql::SqlPool = pool.into();
        let dialect = pool.dialect();
        let engine: Arc<dyn Engine> = match pool {
            #[cfg(feature = "sqlite")]
            courier_sql::SqlPool::Sqlite(pool) => Arc::new(engine::Runs::new(pool, &options, true)),
            #[cfg(feature = "postgres")]
            courier_sql::SqlPool::Postgres(pool) => {
                Arc::new(engine::Runs::new(pool, &options, true))
            }
            #[cfg(feature = "mysql")]
            courier_sql::SqlPool::Mysql(pool) => Arc::new(engine::Runs::new(pool, &options, false)),
            #[allow(unreachable_patterns, reason = "courier-sql may have more dialects on")]
            _ => return Err(StoreError::UnsupportedDsn(format!("{dialect:?} pool"))),
        };
        Ok(Self {
            dialect,
            options,
            engine,
        })
    }

    /// Applies the run store's migrations not yet recorded (creating the tables on a fresh
    /// database), under the setup lock; returns those it recorded, oldest first.
    ///
    /// # Errors
    /// The database failed.
    pub async fn migrate(&self) -> Result<Vec<Applied>, StoreError> {
        self.engine.migrate().await
    }

    /// The run store's migrations not recorded in the database, oldest first, creating nothing:
    /// what a worker with `auto_setup = false` checks at startup (empty: the schema is current).
    ///
    /// # Errors
    /// The database failed.
    pub async fn missing_migrations(&self) -> Result<Vec<Missing>, StoreError> {
        self.engine.missing_migrations().await
    }

    /// The dialect.
    #[must_use]
    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// The runs table name.
    #[must_use]
    pub fn runs_table(&self) -> &str {
        &self.options.runs_table
    }

    /// The events table name.
    #[must_use]
    pub fn events_table(&self) -> &str {
        &self.options.events_table
    }

    /// Whether an insert (a new run, an event) returns its row in the same statement
    /// (`INSERT ... RETURNING`: PostgreSQL, SQLite) rather than reading it back with a second
    /// one (MySQL/MariaDB). A claim returns its row in the same statement on
    /// PostgreSQL and SQLite only (no MySQL-protocol server has `UPDATE ... RETURNING`).
    #[must_use]
    pub fn insert_returning(&self) -> bool {
        self.engine.insert_returning()
    }

    /// What the hot writes of concurrent runs cost together so far (see [`SharedWrites`]);
    /// zero on MySQL/MariaDB, whose writes go one by one.
    #[must_use]
    pub fn shared_writes(&self) -> SharedWrites {
        self.engine.shared_writes()
    }

    /// The query the reaper's stale select runs, with `?`/`$1` placeholders (for EXPLAIN).
    #[must_use]
    pub fn stale_query(&self) -> &str {
        self.engine.stale_query()
    }

    /// The statement [`RunStore::page`] runs for `query` (for EXPLAIN): the status filter is
    /// written in it; it binds, in order, the agent when filtered, the cursor's `created_at`
    /// twice and id when it has one, then the limit.
    #[must_use]
    pub fn page_query(&self, query: &RunPageQuery) -> &str {
        self.engine.page_query(query)
    }

    /// Runs one statement on the store's pool (tests, benches: feature `test-util`); returns
    /// the rows affected.
    ///
    /// # Errors
    /// The database failed.
    #[cfg(feature = "test-util")]
    pub async fn execute(&self, sql: &str) -> Result<u64, StoreError> {
        self.engine.execute(sql).await
    }

    /// The database's plan for the reaper's stale select (`EXPLAIN QUERY PLAN` on SQLite,
    /// `EXPLAIN` elsewhere), one line per plan row: it should name the
    /// `(status, lease_expires)` index.
    ///
    /// # Errors
    /// The database failed.
    pub async fn explain_stale(&self, limit: usize) -> Result<Vec<String>, StoreError> {
        self.engine.explain_stale(limit).await
    }

    /// Drops both tables and their migrations table (tests, benches: feature `test-util`).
    ///
    /// # Errors
    /// The database failed.
    #[cfg(any(test, feature = "test-util"))]
    pub async fn drop_tables(&self) -> Result<(), StoreError> {
        let runs = &self.options.runs_table;
        for t in [
            self.options.events_table.clone(),
            format!("{runs}_steps"),
            runs.clone(),
            format!("{runs}_migrations"),
        ] {
            self.execute(&format!("DROP TABLE IF EXISTS {t}")).await?;
        }
        Ok(())
    }
}

#[async_trait]
impl RunStore for SqlRunStore {
    async fn setup(&self) -> Result<(), StoreError> {
        self.engine.migrate().await.map(drop)
    }

    async fn now_ms(&self) -> Result<i64, StoreError> {
        self.engine.now_ms().await
    }

    async fn insert_queued(&self, run: &NewRun) -> Result<Run, StoreError> {
        self.engine.insert_queued(run).await
    }

    async fn insert_interactive(&self, run: &NewRun) -> Result<Run, StoreError> {
        self.engine.insert_interactive(run).await
    }

    async fn insert_queued_unique(
        &self,
        run: &NewRun,
        unique: &UniqueKey,
    ) -> Result<Inserted, StoreError> {
        self.engine.insert_queued_unique(run, unique).await
    }

    async fn find(&self, id: Uuid) -> Result<Option<Run>, StoreError> {
        self.engine.find(id).await
    }

    async fn list(&self, status: Option<RunStatus>, n: usize) -> Result<Vec<Run>, StoreError> {
        self.engine.list(status, n).await
    }

    async fn page(&self, query: &RunPageQuery) -> Result<Vec<Run>, StoreError> {
        self.engine.page(query).await
    }

    async fn count_by_status(&self) -> Result<Vec<(RunStatus, u64)>, StoreError> {
        self.engine.count_by_status().await
    }

    async fn claim(
        &self,
        id: Uuid,
        worker: &str,
        lease: Duration,
    ) -> Result<Option<Run>, StoreError> {
        self.engine.claim(id, worker, lease).await
    }

    async fn renew(&self, id: Uuid, worker: &str, lease: Duration) -> Result<bool, StoreError> {
        self.engine.renew(id, worker, lease).await
    }

    async fn renew_many(
        &self,
        ids: &[Uuid],
        worker: &str,
        lease: Duration,
    ) -> Result<Vec<Uuid>, StoreError> {
        self.engine.renew_many(ids, worker, lease).await
    }

    async fn probe(&self, ids: &[Uuid]) -> Result<Vec<crate::RunProbe>, StoreError> {
        self.engine.probe(ids).await
    }

    async fn requeue_owned(
        &self,
        id: Uuid,
        worker: &str,
        due_in: Duration,
    ) -> Result<bool, StoreError> {
        self.engine.requeue_owned(id, worker, due_in).await
    }

    async fn select_overdue(&self, after: Duration, n: usize) -> Result<Vec<Run>, StoreError> {
        self.engine.select_overdue(after, n).await
    }

    async fn redispatch_overdue(&self, id: Uuid, after: Duration) -> Result<bool, StoreError> {
        self.engine.redispatch_overdue(id, after).await
    }

    async fn redispatch_queued(&self, id: Uuid) -> Result<bool, StoreError> {
        self.engine.redispatch_queued(id).await
    }

    async fn select_stale(&self, n: usize) -> Result<Vec<Run>, StoreError> {
        self.engine.select_stale(n).await
    }

    async fn requeue_stale(&self, id: Uuid) -> Result<bool, StoreError> {
        self.engine.requeue_stale(id).await
    }

    async fn dead_letter_stale(
        &self,
        id: Uuid,
        reason: TerminationReason,
    ) -> Result<bool, StoreError> {
        self.engine.dead_letter_stale(id, reason).await
    }

    async fn settle(
        &self,
        id: Uuid,
        owner: Option<&str>,
        s: &Settlement,
    ) -> Result<bool, StoreError> {
        self.engine.settle(id, owner, s).await
    }

    async fn fail_queued(&self, id: Uuid, reason: TerminationReason) -> Result<bool, StoreError> {
        self.engine.fail_queued(id, reason).await
    }

    async fn resume(&self, id: Uuid, from: RunStatus) -> Result<bool, StoreError> {
        self.engine.resume(id, from).await
    }

    async fn cancel(&self, id: Uuid) -> Result<bool, StoreError> {
        self.engine.cancel(id).await
    }

    async fn set_pending_effect(
        &self,
        id: Uuid,
        owner: Option<&str>,
        effect: Option<&str>,
    ) -> Result<bool, StoreError> {
        self.engine.set_pending_effect(id, owner, effect).await
    }

    async fn append_event(
        &self,
        id: Uuid,
        kind: &str,
        payload: &serde_json::Value,
    ) -> Result<i64, StoreError> {
        self.engine.append_event(id, kind, payload).await
    }

    async fn events(&self, id: Uuid) -> Result<Vec<RunEvent>, StoreError> {
        self.engine.events(id).await
    }

    async fn steps(&self, id: Uuid) -> Result<Vec<crate::StepRecord>, StoreError> {
        self.engine.steps(id).await
    }

    async fn journal(
        &self,
        id: Uuid,
        owner: Option<&str>,
        lease: Duration,
        write: &crate::StepWrite,
    ) -> Result<bool, StoreError> {
        self.engine.journal(id, owner, lease, write).await
    }

    async fn suspend(
        &self,
        id: Uuid,
        owner: Option<&str>,
        until: i64,
        signal: Option<&str>,
    ) -> Result<bool, StoreError> {
        self.engine.suspend(id, owner, until, signal).await
    }

    async fn select_due_waits(&self, n: usize) -> Result<Vec<Run>, StoreError> {
        self.engine.select_due_waits(n).await
    }

    async fn wake(&self, id: Uuid, signal: Option<&str>) -> Result<bool, StoreError> {
        self.engine.wake(id, signal).await
    }

    async fn release_parked(&self, id: Uuid) -> Result<bool, StoreError> {
        self.engine.release_parked(id).await
    }

    async fn resolve_step(
        &self,
        id: Uuid,
        index: i64,
        status: crate::StepStatus,
        output: Option<&serde_json::Value>,
    ) -> Result<bool, StoreError> {
        self.engine.resolve_step(id, index, status, output).await
    }

    async fn copy_steps(&self, from: Uuid, to: Uuid, before: i64) -> Result<u64, StoreError> {
        self.engine.copy_steps(from, to, before).await
    }

    async fn prune(
        &self,
        older_than: Duration,
        statuses: &[RunStatus],
        limit: usize,
    ) -> Result<u64, StoreError> {
        self.engine.prune(older_than, statuses, limit).await
    }
}
