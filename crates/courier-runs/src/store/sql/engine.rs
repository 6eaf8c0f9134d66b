//! The run store's executor, generic over the sqlx driver: the same statements (rendered per
//! dialect in `queries.rs`) and binds on every database. What differs is the type a run id
//! travels as ([`RunDialect::Id`]) and, read from the dialect, MySQL's missing `RETURNING`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use courier_sql::migrate::{self, Applied};
use courier_sql::{Dialect, SqlDatabase};
use sqlx::{Pool, Row as _};
use uuid::Uuid;

/// An impl block on `Runs<DB>` (the head in brackets: `[impl<DB> Runs<DB>]`, or a trait's)
/// with the bounds on `DB` that the engine's statements need, written once for every file of
/// the engine.
macro_rules! runs_impl {
    ([$($head:tt)*] $($body:tt)*) => {
        $($head)*
        where
            DB: RunDialect,
            for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
            for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
            for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
            for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
            for<'q> serde_json::Value: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
            for<'q> Option<&'q str>: sqlx::Encode<'q, DB>,
            for<'q> Option<serde_json::Value>: sqlx::Encode<'q, DB>,
            for<'r> Run: sqlx::FromRow<'r, DB::Row>,
            for<'r> (i64,): sqlx::FromRow<'r, DB::Row>,
            for<'r> String: sqlx::Decode<'r, DB>,
            for<'r> i64: sqlx::Decode<'r, DB>,
            for<'r> serde_json::Value: sqlx::Decode<'r, DB>,
            for<'a> &'a str: sqlx::ColumnIndex<DB::Row>,
        {
            $($body)*
        }
    };
}

#[cfg(feature = "postgres")]
mod batch;
mod claims;
#[cfg(feature = "sqlite")]
mod combine;
mod events;
mod inserts;
mod journal;
mod leases;
mod listing;
mod reaping;
mod row;
mod settles;
mod steps;

use self::listing::PageQueries;
use self::row::rows_error;
use super::queries::Queries;
use super::{Engine, SqlRunStoreOptions, db};
use crate::store::{
    Inserted, NewRun, Run, RunEvent, RunPageQuery, RunStore, Settlement, StoreError, UniqueKey,
};
use crate::{RunStatus, TerminationReason};

/// A database the run store runs on, with the type its run ids travel as: PostgreSQL's `UUID`,
/// hyphenated text elsewhere.
pub(super) trait RunDialect: SqlDatabase {
    type Id: for<'q> sqlx::Encode<'q, Self>
        + for<'r> sqlx::Decode<'r, Self>
        + sqlx::Type<Self>
        + Send
        + Sync
        + 'static;

    fn id(id: Uuid) -> Self::Id;

    fn uuid(id: Self::Id) -> Uuid;
}

#[cfg(feature = "postgres")]
impl RunDialect for sqlx::Postgres {
    type Id = Uuid;

    fn id(id: Uuid) -> Uuid {
        id
    }

    fn uuid(id: Uuid) -> Uuid {
        id
    }
}

/// Run ids as hyphenated text, on databases without a UUID type.
macro_rules! text_run_ids {
    ($($feature:literal => $db:ty),*) => {$(
        #[cfg(feature = $feature)]
        impl RunDialect for $db {
            type Id = uuid::fmt::Hyphenated;

            fn id(id: Uuid) -> Self::Id {
                id.hyphenated()
            }

            fn uuid(id: Self::Id) -> Uuid {
                id.into_uuid()
            }
        }
    )*};
}

text_run_ids!("sqlite" => sqlx::Sqlite, "mysql" => sqlx::MySql);

/// The run tables on the database `DB`.
#[derive(Debug)]
pub(super) struct Runs<DB: RunDialect> {
    pool: Pool<DB>,
    runs: String,
    events: String,
    q: Queries,
    pub(super) pages: PageQueries,
    sq: steps::StepQueries,
    /// The database has `INSERT ... RETURNING`: an insert returns the new row (or sequence
    /// number) in the same statement.
    insert_returning: bool,
    /// SQLite has one writer: this store's writes take turns here rather than in SQLite's busy
    /// handler, which sleeps in steps of milliseconds, and the hot ones (claim, step, settle) of
    /// concurrent runs share a transaction (None elsewhere).
    #[cfg(feature = "sqlite")]
    pub(super) combiner: Option<combine::Combiner>,
    /// PostgreSQL: the hot writes (claim, step, settle) of concurrent runs ride one statement
    /// per kind (None elsewhere).
    #[cfg(feature = "postgres")]
    batches: Option<batch::Batches>,
    /// What the batches and the combiner sent.
    shared: Arc<super::WriteCounter>,
    /// The leases this store set, and how long they surely last.
    leases: leases::Leases,
}

impl<DB: RunDialect> Runs<DB> {
    /// This process's turn to write, on SQLite (see `writer`); nothing elsewhere.
    pub(super) async fn turn(&self) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        #[cfg(feature = "sqlite")]
        if let Some(combiner) = &self.combiner {
            return Some(combiner.turn().await);
        }
        None
    }

    /// The run tables on `pool`; `insert_returning`: inserts use `INSERT ... RETURNING`
    /// (PostgreSQL, SQLite).
    pub(super) fn new(
        pool: Pool<DB>,
        options: &SqlRunStoreOptions,
        insert_returning: bool,
    ) -> Self {
        let shared = Arc::<super::WriteCounter>::default();
        Self {
            #[cfg(feature = "sqlite")]
            combiner: (&pool as &dyn std::any::Any)
                .downcast_ref::<sqlx::SqlitePool>()
                .map(|pool| combine::Combiner::new(pool.clone(), shared.clone())),
            #[cfg(feature = "postgres")]
            batches: (&pool as &dyn std::any::Any)
                .downcast_ref::<sqlx::PgPool>()
                .map(|pool| batch::Batches::new(pool.clone(), &options.runs_table, shared.clone())),
            shared,
            pool,
            runs: options.runs_table.clone(),
            events: options.events_table.clone(),
            q: Queries::new(
                DB::DIALECT,
                &options.runs_table,
                &options.events_table,
                insert_returning,
            ),
            pages: PageQueries::new(DB::DIALECT, &options.runs_table),
            sq: steps::StepQueries::new(DB::DIALECT, &options.runs_table),
            insert_returning,
            // PostgreSQL's step statement decides the renewal itself.
            leases: leases::Leases::new(DB::DIALECT != Dialect::Postgres),
        }
    }

    /// The pool.
    pub(super) fn pool(&self) -> &Pool<DB> {
        &self.pool
    }

    /// Whether a guarded write matched its row.
    fn matched(
        &self,
        context: &'static str,
        done: Result<DB::QueryResult, sqlx::Error>,
    ) -> Result<bool, StoreError> {
        Ok(DB::rows_affected(&done.map_err(db(context))?) > 0)
    }
}

/// MySQL's deadlock between concurrent writers (SQLSTATE 40001): the statement did nothing and
/// may be run again.
fn is_deadlock(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|c| c == "40001")
}

fn limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

runs_impl! {
[#[async_trait] impl<DB> RunStore for Runs<DB>]
    async fn setup(&self) -> Result<(), StoreError> {
        self.migrate().await.map(drop)
    }

    async fn now_ms(&self) -> Result<i64, StoreError> {
        let (now,): (i64,) = sqlx::query_as(&self.q.now)
            .fetch_one(&self.pool)
            .await
            .map_err(db("now"))?;
        Ok(now)
    }

    async fn insert_queued(&self, run: &NewRun) -> Result<Run, StoreError> {
        self.insert(&self.q.insert_queued, run).await
    }

    async fn insert_interactive(&self, run: &NewRun) -> Result<Run, StoreError> {
        self.insert(&self.q.insert_interactive, run).await
    }

    async fn insert_queued_unique(
        &self,
        run: &NewRun,
        unique: &UniqueKey,
    ) -> Result<Inserted, StoreError> {
        self.insert_unique_run(run, unique).await
    }

    async fn find(&self, id: Uuid) -> Result<Option<Run>, StoreError> {
        let q = sqlx::query_as(&self.q.find).bind(DB::id(id));
        in_flight(q.fetch_optional(&self.pool))
            .await
            .map_err(rows_error("find run"))
    }

    async fn probe(&self, ids: &[Uuid]) -> Result<Vec<crate::RunProbe>, StoreError> {
        self.probe_runs(ids).await
    }

    async fn renew_many(
        &self,
        ids: &[Uuid],
        worker: &str,
        lease: Duration,
    ) -> Result<Vec<Uuid>, StoreError> {
        let sent = std::time::Instant::now();
        let lost = self.renew_leases(ids, worker, lease).await?;
        for id in ids {
            if lost.contains(id) {
                self.leases.forget(*id);
            } else {
                self.leases.set(*id, sent, lease);
            }
        }
        Ok(lost)
    }

    async fn list(&self, status: Option<RunStatus>, n: usize) -> Result<Vec<Run>, StoreError> {
        self.list_runs(status, n).await
    }

    async fn page(&self, query: &RunPageQuery) -> Result<Vec<Run>, StoreError> {
        self.select_page(query).await
    }

    async fn count_by_status(&self) -> Result<Vec<(RunStatus, u64)>, StoreError> {
        self.status_counts().await
    }

    async fn claim(
        &self,
        id: Uuid,
        worker: &str,
        lease: Duration,
    ) -> Result<Option<Run>, StoreError> {
        let sent = std::time::Instant::now();
        let run = self.claim_run(id, worker, lease).await?;
        if run.is_some() {
            self.leases.set(id, sent, lease);
        }
        Ok(run)
    }

    async fn renew(&self, id: Uuid, worker: &str, lease: Duration) -> Result<bool, StoreError> {
        let sent = std::time::Instant::now();
        let renewed = self.renew_lease(id, worker, lease).await?;
        if renewed {
            self.leases.set(id, sent, lease);
        } else {
            self.leases.forget(id);
        }
        Ok(renewed)
    }

    async fn requeue_owned(
        &self,
        id: Uuid,
        worker: &str,
        due_in: Duration,
    ) -> Result<bool, StoreError> {
        self.leases.forget(id);
        self.requeue_run(id, worker, due_in).await
    }

    async fn select_overdue(&self, after: Duration, n: usize) -> Result<Vec<Run>, StoreError> {
        self.overdue_runs(after, n).await
    }

    async fn redispatch_overdue(&self, id: Uuid, after: Duration) -> Result<bool, StoreError> {
        self.redispatch_overdue_run(id, after).await
    }

    async fn redispatch_queued(&self, id: Uuid) -> Result<bool, StoreError> {
        self.redispatch_queued_run(id).await
    }

    async fn select_stale(&self, n: usize) -> Result<Vec<Run>, StoreError> {
        self.stale_runs(n).await
    }

    async fn requeue_stale(&self, id: Uuid) -> Result<bool, StoreError> {
        self.requeue_stale_run(id).await
    }

    async fn dead_letter_stale(
        &self,
        id: Uuid,
        reason: TerminationReason,
    ) -> Result<bool, StoreError> {
        self.dead_letter_stale_run(id, reason).await
    }

    async fn settle(
        &self,
        id: Uuid,
        owner: Option<&str>,
        s: &Settlement,
    ) -> Result<bool, StoreError> {
        self.leases.forget(id);
        self.settle_run(id, owner, s).await
    }

    async fn fail_queued(&self, id: Uuid, reason: TerminationReason) -> Result<bool, StoreError> {
        self.fail_queued_run(id, reason).await
    }

    async fn resume(&self, id: Uuid, from: RunStatus) -> Result<bool, StoreError> {
        self.resume_run(id, from).await
    }

    async fn cancel(&self, id: Uuid) -> Result<bool, StoreError> {
        self.cancel_run(id).await
    }

    async fn set_pending_effect(
        &self,
        id: Uuid,
        owner: Option<&str>,
        effect: Option<&str>,
    ) -> Result<bool, StoreError> {
        self.write_pending_effect(id, owner, effect).await
    }

    async fn append_event(
        &self,
        id: Uuid,
        kind: &str,
        payload: &serde_json::Value,
    ) -> Result<i64, StoreError> {
        self.append_run_event(id, kind, payload).await
    }

    async fn events(&self, id: Uuid) -> Result<Vec<RunEvent>, StoreError> {
        self.run_events(id).await
    }

    async fn steps(&self, id: Uuid) -> Result<Vec<crate::StepRecord>, StoreError> {
        self.select_steps(id).await
    }

    async fn journal(
        &self,
        id: Uuid,
        owner: Option<&str>,
        lease: Duration,
        write: &crate::StepWrite,
    ) -> Result<bool, StoreError> {
        self.journal_step(id, owner, lease, write).await
    }

    async fn suspend(
        &self,
        id: Uuid,
        owner: Option<&str>,
        until: i64,
        signal: Option<&str>,
    ) -> Result<bool, StoreError> {
        self.leases.forget(id);
        self.suspend_run(id, owner, until, signal).await
    }

    async fn select_due_waits(&self, n: usize) -> Result<Vec<Run>, StoreError> {
        self.due_waits(n).await
    }

    async fn wake(&self, id: Uuid, signal: Option<&str>) -> Result<bool, StoreError> {
        self.wake_run(id, signal).await
    }

    async fn release_parked(&self, id: Uuid) -> Result<bool, StoreError> {
        self.release_parked_run(id).await
    }

    async fn resolve_step(
        &self,
        id: Uuid,
        index: i64,
        status: crate::StepStatus,
        output: Option<&serde_json::Value>,
    ) -> Result<bool, StoreError> {
        self.resolve_parked_step(id, index, status, output).await
    }

    async fn copy_steps(&self, from: Uuid, to: Uuid, before: i64) -> Result<u64, StoreError> {
        self.copy_journal(from, to, before).await
    }

    async fn prune(
        &self,
        older_than: Duration,
        statuses: &[RunStatus],
        limit: usize,
    ) -> Result<u64, StoreError> {
        self.prune_runs(older_than, statuses, limit).await
    }
}

#[async_trait]
impl<DB> Engine for Runs<DB>
where
    Self: RunStore,
    DB: RunDialect,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'r> (i64,): sqlx::FromRow<'r, DB::Row>,
    for<'r> String: sqlx::Decode<'r, DB>,
    for<'r> i64: sqlx::Decode<'r, DB>,
    for<'a> &'a str: sqlx::ColumnIndex<DB::Row>,
{
    async fn migrate(&self) -> Result<Vec<Applied>, StoreError> {
        let tables = [
            ("{runs}", self.runs.as_str()),
            ("{events}", self.events.as_str()),
        ];
        migrate::migrate(&self.pool, &super::MIGRATIONS, &tables)
            .await
            .map_err(db("setup"))
    }

    async fn missing_migrations(&self) -> Result<Vec<migrate::Missing>, StoreError> {
        let tables = [
            ("{runs}", self.runs.as_str()),
            ("{events}", self.events.as_str()),
        ];
        migrate::missing(&self.pool, &super::MIGRATIONS, &tables)
            .await
            .map_err(db("check the schema"))
    }

    #[cfg(feature = "test-util")]
    async fn execute(&self, sql: &str) -> Result<u64, StoreError> {
        let done = sqlx::query(sql)
            .execute(&self.pool)
            .await
            .map_err(db("execute"))?;
        Ok(DB::rows_affected(&done))
    }

    async fn explain_stale(&self, n: usize) -> Result<Vec<String>, StoreError> {
        let prefix = if DB::DIALECT == Dialect::Sqlite {
            "EXPLAIN QUERY PLAN "
        } else {
            "EXPLAIN "
        };
        let sql = format!("{prefix}{}", self.q.select_stale);
        let rows = sqlx::query(&sql)
            .bind(limit(n))
            .fetch_all(&self.pool)
            .await
            .map_err(db("explain"))?;
        let text = |row: &DB::Row, col: &str| -> String {
            row.try_get_unchecked::<Option<String>, _>(col)
                .ok()
                .flatten()
                .or_else(|| {
                    row.try_get_unchecked::<Option<i64>, _>(col)
                        .ok()
                        .flatten()
                        .map(|n| n.to_string())
                })
                .unwrap_or_else(|| "NULL".into())
        };
        Ok(rows
            .iter()
            .map(|row| match DB::DIALECT {
                Dialect::Sqlite => text(row, "detail"),
                Dialect::Postgres => text(row, "QUERY PLAN"),
                _ => ["table", "type", "key", "rows", "Extra"]
                    .iter()
                    .map(|c| format!("{c}={}", text(row, c)))
                    .collect::<Vec<_>>()
                    .join(" "),
            })
            .collect())
    }

    fn stale_query(&self) -> &str {
        &self.q.select_stale
    }

    fn page_query(&self, query: &RunPageQuery) -> &str {
        self.pages.statement(query)
    }

    fn insert_returning(&self) -> bool {
        self.insert_returning
    }

    fn shared_writes(&self) -> super::SharedWrites {
        self.shared.read()
    }
}

/// Runs a statement a worker run may give up on (a call unanswered for a whole lease, see
/// `agent::within_lease` and the claim in `Runtime::run_queued`), as a [`courier_sql::InFlight`]: given up, the pool replaces the
/// connections of the silent path.
async fn in_flight<T>(statement: impl std::future::Future<Output = T>) -> T {
    let in_flight = courier_sql::InFlight::start();
    let done = statement.await;
    in_flight.done();
    done
}
