//! The run store's executor, generic over the sqlx driver: the same statements (rendered per
//! dialect in `queries.rs`) and binds on every database. What differs is the type a run id
//! travels as ([`RunDialect::Id`]) and, read from the dialect, MySQL's missing `RETURNING`.

use std::time::Duration;

use async_trait::async_trait;
use courier_sql::migrate::{self, Applied};
use courier_sql::{Dialect, SqlDatabase};
use sqlx::{Pool, Row as _};
use uuid::Uuid;

#[cfg(feature = "sqlite")]
mod combine;
mod steps;

use super::listing::PageQueries;
use super::queries::Queries;
use super::{Engine, SqlRunStoreOptions, db};
use crate::store::{
    Inserted, NewRun, Run, RunEvent, RunPageQuery, RunStore, Settlement, StoreError, UniqueKey,
    lease_ms,
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
        Self {
            #[cfg(feature = "sqlite")]
            combiner: (&pool as &dyn std::any::Any)
                .downcast_ref::<sqlx::SqlitePool>()
                .map(|pool| combine::Combiner::new(pool.clone())),
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
        }
    }

    /// The pool.
    pub(super) fn pool(&self) -> &Pool<DB> {
        &self.pool
    }
}

fn corrupt(col: &str) -> impl FnOnce(sqlx::Error) -> StoreError + '_ {
    move |e| StoreError::Corrupt(format!("column `{col}`: {e}"))
}

/// A column read without the driver's type check (MySQL reports text of a binary collation as
/// bytes), decoded all the same: a value that does not decode is an error.
pub(super) fn column<'r, R, T>(row: &'r R, col: &str) -> Result<T, StoreError>
where
    R: sqlx::Row,
    for<'a> &'a str: sqlx::ColumnIndex<R>,
    T: sqlx::Decode<'r, R::Database>,
{
    row.try_get_unchecked(col).map_err(corrupt(col))
}

fn parsed<T: std::str::FromStr>(value: Option<String>, col: &str) -> Result<Option<T>, StoreError>
where
    T::Err: std::fmt::Display,
{
    value
        .map(|v| {
            v.parse::<T>()
                .map_err(|e| StoreError::Corrupt(format!("column `{col}`: {e}")))
        })
        .transpose()
}

impl<'r, R> sqlx::FromRow<'r, R> for Run
where
    R: sqlx::Row,
    R::Database: RunDialect,
    for<'a> &'a str: sqlx::ColumnIndex<R>,
    String: sqlx::Decode<'r, R::Database>,
    i64: sqlx::Decode<'r, R::Database>,
    serde_json::Value: sqlx::Decode<'r, R::Database>,
{
    fn from_row(row: &'r R) -> Result<Self, sqlx::Error> {
        decode_run(row).map_err(|e| sqlx::Error::Decode(Box::new(e)))
    }
}

fn decode_run<'r, R>(row: &'r R) -> Result<Run, StoreError>
where
    R: sqlx::Row,
    R::Database: RunDialect,
    for<'a> &'a str: sqlx::ColumnIndex<R>,
    String: sqlx::Decode<'r, R::Database>,
    i64: sqlx::Decode<'r, R::Database>,
    serde_json::Value: sqlx::Decode<'r, R::Database>,
{
    let status: String = column(row, "status")?;
    let id: <R::Database as RunDialect>::Id = column(row, "id")?;
    Ok(Run {
        id: <R::Database as RunDialect>::uuid(id),
        agent: column(row, "agent")?,
        status: status
            .parse()
            .map_err(|e| StoreError::Corrupt(format!("{e}")))?,
        input: column(row, "input")?,
        output: column(row, "output")?,
        error_class: parsed(column(row, "error_class")?, "error_class")?,
        termination_reason: parsed(column(row, "termination_reason")?, "termination_reason")?,
        claimed_by: column(row, "claimed_by")?,
        lease_expires: column(row, "lease_expires")?,
        requeue_count: u32::try_from(column::<_, i64>(row, "requeue_count")?).unwrap_or(u32::MAX),
        pending_effect: column(row, "pending_effect")?,
        created_at: column(row, "created_at")?,
        started_at: column(row, "started_at")?,
        finished_at: column(row, "finished_at")?,
        updated_at: column(row, "updated_at")?,
        due_at: column(row, "due_at")?,
        budget: column::<_, Option<serde_json::Value>>(row, "budget")?
            .map(serde_json::from_value)
            .transpose()
            .map_err(|e| StoreError::Corrupt(format!("column `budget`: {e}")))?,
        usage: crate::Usage {
            tokens_in: counter(row, "used_tokens_in")?,
            tokens_out: counter(row, "used_tokens_out")?,
            cost_micros: counter(row, "used_cost")?,
            tool_calls: counter(row, "used_tool_calls")?,
            turns: counter(row, "used_turns")?,
        },
        steps_replayed: counter(row, "steps_replayed")?,
        wait_signal: column(row, "wait_signal")?,
        // Only a claim returns it (a missing column is "not known").
        journaled: column::<_, Option<i64>>(row, "has_steps")
            .ok()
            .flatten()
            .map(|n| n != 0),
    })
}

/// The most ids one `id IN (...)` statement binds.
const MAX_IDS_PER_STATEMENT: usize = 500;

/// `n` placeholders, comma-separated.
fn marks(n: usize) -> String {
    vec!["?"; n].join(", ")
}

/// A usage counter (a BIGINT that is never negative).
fn counter<'r, R>(row: &'r R, col: &str) -> Result<u64, StoreError>
where
    R: sqlx::Row,
    for<'a> &'a str: sqlx::ColumnIndex<R>,
    i64: sqlx::Decode<'r, R::Database>,
{
    Ok(u64::try_from(column::<_, i64>(row, col)?).unwrap_or(0))
}

/// A run's budget as bound to its column.
fn budget_json(run: &NewRun) -> Option<serde_json::Value> {
    run.budget
        .filter(|b| !b.is_unlimited())
        .and_then(|b| serde_json::to_value(b).ok())
}

/// A decode failure inside `FromRow` back to the store's own error.
pub(super) fn rows_error(context: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
    move |e| match e {
        sqlx::Error::Decode(inner) => match inner.downcast::<StoreError>() {
            Ok(store) => *store,
            Err(other) => StoreError::Corrupt(other.to_string()),
        },
        e @ sqlx::Error::ColumnDecode { .. } => StoreError::Corrupt(e.to_string()),
        e => db(context)(e),
    }
}

/// How many times a unique insert goes round before it gives up.
const UNIQUE_ATTEMPTS: usize = 8;

/// What the unique insert did.
enum Taken {
    /// Inserted, the row read in the same statement.
    Row(Box<Run>),
    /// Inserted, the row to be read back (MySQL).
    Written,
    /// The key is held: nothing inserted.
    Held,
}

/// MySQL's deadlock between concurrent writers (SQLSTATE 40001): the statement did nothing and
/// may be run again.
fn is_deadlock(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|c| c == "40001")
}

fn vanished(id: Uuid) -> StoreError {
    StoreError::Corrupt(format!("run {id} vanished"))
}

fn limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[async_trait]
impl<DB> RunStore for Runs<DB>
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
        let key = unique.key();
        // Clear an expired key, insert unless the key is held, else read its holder. A holder
        // whose key expired between the insert and the read, or (MySQL) a deadlock between
        // concurrent takers, goes round again.
        for _ in 0..UNIQUE_ATTEMPTS {
            let cleared = sqlx::query(&self.q.clear_unique)
                .bind(key)
                .execute(&self.pool)
                .await;
            match cleared {
                Err(e) if is_deadlock(&e) => continue,
                other => other.map_err(db("clear expired unique key"))?,
            };
            match self.insert_unique(run, unique).await {
                Ok(Taken::Row(row)) => return Ok(Inserted::Queued(row)),
                Ok(Taken::Written) => {
                    let row = self.find(run.id).await?;
                    let row = row.ok_or_else(|| vanished(run.id))?;
                    return Ok(Inserted::Queued(Box::new(row)));
                }
                Ok(Taken::Held) => {}
                Err(e) if is_deadlock(&e) => continue,
                Err(e) => return Err(rows_error("insert unique run")(e)),
            }
            let holder = sqlx::query(&self.q.unique_holder)
                .bind(key)
                .fetch_optional(&self.pool)
                .await
                .map_err(db("unique key holder"))?;
            if let Some(row) = holder {
                let id: DB::Id = column(&row, "id")?;
                return Ok(Inserted::Duplicate(DB::uuid(id)));
            }
        }
        Err(StoreError::Corrupt(format!(
            "unique key `{key}` changed hands {UNIQUE_ATTEMPTS} times during one enqueue"
        )))
    }

    async fn find(&self, id: Uuid) -> Result<Option<Run>, StoreError> {
        let q = sqlx::query_as(&self.q.find).bind(DB::id(id));
        in_flight(q.fetch_optional(&self.pool))
            .await
            .map_err(rows_error("find run"))
    }

    async fn probe(&self, ids: &[Uuid]) -> Result<Vec<crate::RunProbe>, StoreError> {
        let mut found = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(MAX_IDS_PER_STATEMENT) {
            let sql = DB::DIALECT.render(&format!(
                "SELECT id, status, claimed_by FROM {} WHERE id IN ({})",
                self.runs,
                marks(chunk.len())
            ));
            let mut q = sqlx::query(&sql);
            for &id in chunk {
                q = q.bind(DB::id(id));
            }
            let rows = in_flight(q.fetch_all(&self.pool))
                .await
                .map_err(db("probe runs"))?;
            for row in &rows {
                let status: String = column(row, "status")?;
                found.push(crate::RunProbe {
                    id: DB::uuid(column(row, "id")?),
                    status: status
                        .parse()
                        .map_err(|e| StoreError::Corrupt(format!("{e}")))?,
                    claimed_by: column(row, "claimed_by")?,
                });
            }
        }
        Ok(found)
    }

    async fn renew_many(
        &self,
        ids: &[Uuid],
        worker: &str,
        lease: Duration,
    ) -> Result<Vec<Uuid>, StoreError> {
        let mut held = std::collections::HashSet::with_capacity(ids.len());
        let mysql = DB::DIALECT == Dialect::Mysql;
        for chunk in ids.chunks(MAX_IDS_PER_STATEMENT) {
            let marks = marks(chunk.len());
            let guard = format!("id IN ({marks}) AND status = 'running' AND claimed_by = ?");
            let update = DB::DIALECT.render(&format!(
                "UPDATE {} SET lease_expires = {{now}} + ?, updated_at = {{now}} WHERE {guard}{}",
                self.runs,
                if mysql { "" } else { " RETURNING id" }
            ));
            let mut q = sqlx::query(&update).bind(lease_ms(lease));
            for &id in chunk {
                q = q.bind(DB::id(id));
            }
            let q = q.bind(worker);
            let rows = if mysql {
                // No UPDATE ... RETURNING: the renew, then a read of the runs still held.
                in_flight(q.execute(&self.pool))
                    .await
                    .map_err(db("renew runs"))?;
                let select =
                    DB::DIALECT.render(&format!("SELECT id FROM {} WHERE {guard}", self.runs));
                let mut q = sqlx::query(&select);
                for &id in chunk {
                    q = q.bind(DB::id(id));
                }
                in_flight(q.bind(worker).fetch_all(&self.pool))
                    .await
                    .map_err(db("renew runs"))?
            } else {
                let _turn = self.turn().await;
                in_flight(q.fetch_all(&self.pool))
                    .await
                    .map_err(db("renew runs"))?
            };
            for row in &rows {
                held.insert(DB::uuid(column(row, "id")?));
            }
        }
        Ok(ids
            .iter()
            .copied()
            .filter(|id| !held.contains(id))
            .collect())
    }

    async fn list(&self, status: Option<RunStatus>, n: usize) -> Result<Vec<Run>, StoreError> {
        let q = match status {
            Some(s) => sqlx::query_as(&self.q.list_status)
                .bind(s.as_str())
                .bind(limit(n)),
            None => sqlx::query_as(&self.q.list_all).bind(limit(n)),
        };
        q.fetch_all(&self.pool)
            .await
            .map_err(rows_error("list runs"))
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
        #[cfg(feature = "sqlite")]
        if let Some(combiner) = &self.combiner {
            use combine::Bind;
            let write = combine::Write {
                sql: self.q.claim.clone(),
                statements: 1,
                binds: vec![
                    Bind::Text(worker.to_owned()),
                    Bind::Int(lease_ms(lease)),
                    Bind::Text(id.hyphenated().to_string()),
                ],
            };
            let written = in_flight(combiner.write(write))
                .await
                .map_err(rows_error("claim"))?;
            return written
                .rows
                .first()
                .and_then(|rows| rows.first())
                .map(decode_run::<sqlx::sqlite::SqliteRow>)
                .transpose();
        }
        if DB::DIALECT != Dialect::Mysql {
            // UPDATE ... RETURNING: a row back is the guard matched.
            let q = sqlx::query_as(&self.q.claim)
                .bind(worker)
                .bind(lease_ms(lease))
                .bind(DB::id(id));
            let _turn = self.turn().await;
            return in_flight(q.fetch_optional(&self.pool))
                .await
                .map_err(rows_error("claim"));
        }
        // MySQL: the guarded UPDATE, then a read of the row this worker now owns.
        let q = sqlx::query(&self.q.claim)
            .bind(worker)
            .bind(lease_ms(lease))
            .bind(DB::id(id));
        if !self.matched("claim", in_flight(q.execute(&self.pool)).await)? {
            return Ok(None);
        }
        sqlx::query_as(&self.q.find_claimed)
            .bind(DB::id(id))
            .fetch_optional(&self.pool)
            .await
            .map_err(rows_error("read a claimed run"))
    }

    async fn renew(&self, id: Uuid, worker: &str, lease: Duration) -> Result<bool, StoreError> {
        let q = sqlx::query(&self.q.renew)
            .bind(lease_ms(lease))
            .bind(DB::id(id))
            .bind(worker);
        self.matched("renew", in_flight(q.execute(&self.pool)).await)
    }

    async fn requeue_owned(
        &self,
        id: Uuid,
        worker: &str,
        due_in: Duration,
    ) -> Result<bool, StoreError> {
        let q = sqlx::query(&self.q.requeue_owned)
            .bind(lease_ms(due_in))
            .bind(DB::id(id))
            .bind(worker);
        self.matched("requeue", in_flight(q.execute(&self.pool)).await)
    }

    async fn select_overdue(&self, after: Duration, n: usize) -> Result<Vec<Run>, StoreError> {
        sqlx::query_as(&self.q.select_overdue)
            .bind(lease_ms(after))
            .bind(limit(n))
            .fetch_all(&self.pool)
            .await
            .map_err(rows_error("select overdue"))
    }

    async fn redispatch_overdue(&self, id: Uuid, after: Duration) -> Result<bool, StoreError> {
        let q = sqlx::query(&self.q.redispatch_overdue)
            .bind(DB::id(id))
            .bind(lease_ms(after));
        self.matched("re-dispatch overdue", q.execute(&self.pool).await)
    }

    async fn redispatch_queued(&self, id: Uuid) -> Result<bool, StoreError> {
        let q = sqlx::query(&self.q.redispatch_queued).bind(DB::id(id));
        self.matched("re-dispatch queued", q.execute(&self.pool).await)
    }

    async fn select_stale(&self, n: usize) -> Result<Vec<Run>, StoreError> {
        sqlx::query_as(&self.q.select_stale)
            .bind(limit(n))
            .fetch_all(&self.pool)
            .await
            .map_err(rows_error("select stale"))
    }

    async fn requeue_stale(&self, id: Uuid) -> Result<bool, StoreError> {
        let q = sqlx::query(&self.q.requeue_stale).bind(DB::id(id));
        self.matched("stale requeue", q.execute(&self.pool).await)
    }

    async fn dead_letter_stale(
        &self,
        id: Uuid,
        reason: TerminationReason,
    ) -> Result<bool, StoreError> {
        let q = sqlx::query(&self.q.dead_letter_stale)
            .bind(reason.as_str())
            .bind(DB::id(id));
        self.matched("stale dead-letter", q.execute(&self.pool).await)
    }

    async fn settle(
        &self,
        id: Uuid,
        owner: Option<&str>,
        s: &Settlement,
    ) -> Result<bool, StoreError> {
        let sql = if owner.is_some() {
            &self.q.settle_owned
        } else {
            &self.q.settle_interactive
        };
        #[cfg(feature = "sqlite")]
        if let Some(combiner) = &self.combiner {
            use combine::Bind;
            let mut binds = vec![
                Bind::Text(s.status.as_str().to_owned()),
                Bind::OptText(s.reason.map(|r| r.as_str().to_owned())),
                Bind::OptText(s.class.map(|c| c.as_str().to_owned())),
                Bind::OptJson(s.output.clone()),
                Bind::Int(i64::from(s.status.is_terminal())),
                Bind::Text(id.hyphenated().to_string()),
            ];
            if let Some(owner) = owner {
                binds.push(Bind::Text(owner.to_owned()));
            }
            let write = combine::Write {
                sql: sql.clone(),
                statements: 1,
                binds,
            };
            let written = in_flight(combiner.write(write))
                .await
                .map_err(db("settle"))?;
            return Ok(written.changes.first().is_some_and(|n| *n > 0));
        }
        let mut q = sqlx::query(sql)
            .bind(s.status.as_str())
            .bind(s.reason.map(|r| r.as_str()))
            .bind(s.class.map(|c| c.as_str()))
            .bind(s.output.clone())
            .bind(i64::from(s.status.is_terminal()))
            .bind(DB::id(id));
        if let Some(owner) = owner {
            q = q.bind(owner);
        }
        let _turn = self.turn().await;
        self.matched("settle", in_flight(q.execute(&self.pool)).await)
    }

    async fn fail_queued(&self, id: Uuid, reason: TerminationReason) -> Result<bool, StoreError> {
        let q = sqlx::query(&self.q.fail_queued)
            .bind(reason.as_str())
            .bind(DB::id(id));
        self.matched("fail queued", q.execute(&self.pool).await)
    }

    async fn resume(&self, id: Uuid, from: RunStatus) -> Result<bool, StoreError> {
        let q = sqlx::query(&self.q.resume)
            .bind(DB::id(id))
            .bind(from.as_str());
        self.matched("resume", q.execute(&self.pool).await)
    }

    async fn cancel(&self, id: Uuid) -> Result<bool, StoreError> {
        let q = sqlx::query(&self.q.cancel).bind(DB::id(id));
        self.matched("cancel", q.execute(&self.pool).await)
    }

    async fn set_pending_effect(
        &self,
        id: Uuid,
        owner: Option<&str>,
        effect: Option<&str>,
    ) -> Result<bool, StoreError> {
        let sql = if owner.is_some() {
            &self.q.effect_owned
        } else {
            &self.q.effect_interactive
        };
        let mut q = sqlx::query(sql).bind(effect).bind(DB::id(id));
        if let Some(owner) = owner {
            q = q.bind(owner);
        }
        self.matched("pending effect", in_flight(q.execute(&self.pool)).await)
    }

    async fn append_event(
        &self,
        id: Uuid,
        kind: &str,
        payload: &serde_json::Value,
    ) -> Result<i64, StoreError> {
        // One statement computes MAX(seq)+1 and inserts (and returns it, where the database has
        // INSERT ... RETURNING); MySQL may report a deadlock (40001)
        // between two concurrent INSERT ... SELECT: that statement did nothing and is retried.
        let mut attempt = 0;
        loop {
            let q = sqlx::query(&self.q.append_event)
                .bind(DB::id(id))
                .bind(kind)
                .bind(payload.clone())
                .bind(DB::id(id));
            let done = if self.insert_returning {
                in_flight(q.fetch_one(&self.pool)).await.map(Some)
            } else {
                in_flight(q.execute(&self.pool)).await.map(|_| None)
            };
            let max_seq = || async {
                let (seq,): (i64,) = sqlx::query_as(&self.q.max_seq)
                    .bind(DB::id(id))
                    .fetch_one(&self.pool)
                    .await
                    .map_err(db("max seq"))?;
                Ok::<_, StoreError>(seq)
            };
            match done {
                Ok(Some(row)) => return row.try_get_unchecked("seq").map_err(corrupt("seq")),
                Ok(None) => return max_seq().await,
                Err(sqlx::Error::Database(d)) if d.is_unique_violation() => {
                    let seq = max_seq().await?;
                    return Err(StoreError::DuplicateSequence { run_id: id, seq });
                }
                Err(e) if is_deadlock(&e) && attempt < 5 => {
                    attempt += 1;
                }
                Err(e) => return Err(db("append event")(e)),
            }
        }
    }

    async fn events(&self, id: Uuid) -> Result<Vec<RunEvent>, StoreError> {
        let rows = sqlx::query(&self.q.events)
            .bind(DB::id(id))
            .fetch_all(&self.pool)
            .await
            .map_err(db("events"))?;
        rows.iter()
            .map(|row| {
                let run_id: DB::Id = column(row, "run_id")?;
                Ok(RunEvent {
                    run_id: DB::uuid(run_id),
                    seq: column(row, "seq")?,
                    kind: column(row, "kind")?,
                    payload: column(row, "payload")?,
                    created_at: column(row, "created_at")?,
                })
            })
            .collect()
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

impl<DB> Runs<DB>
where
    DB: RunDialect,
    Self: RunStore,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> serde_json::Value: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> Option<serde_json::Value>: sqlx::Encode<'q, DB>,
    for<'r> Run: sqlx::FromRow<'r, DB::Row>,
{
    /// Inserts a run with one of the insert statements (binds: id, agent, input) and returns it:
    /// in the same statement (`INSERT ... RETURNING`) where the database can, else read back.
    async fn insert(&self, sql: &str, run: &NewRun) -> Result<Run, StoreError> {
        if self.insert_returning {
            let _turn = self.turn().await;
            return sqlx::query_as(sql)
                .bind(DB::id(run.id))
                .bind(run.agent.as_str())
                .bind(run.input.clone())
                .bind(budget_json(run))
                .fetch_one(&self.pool)
                .await
                .map_err(rows_error("insert run"));
        }
        sqlx::query(sql)
            .bind(DB::id(run.id))
            .bind(run.agent.as_str())
            .bind(run.input.clone())
            .bind(budget_json(run))
            .execute(&self.pool)
            .await
            .map_err(db("insert run"))?;
        self.find(run.id).await?.ok_or_else(|| vanished(run.id))
    }

    /// The unique insert: the run as stored (or only written: MySQL), or nothing, the key held.
    async fn insert_unique(&self, run: &NewRun, unique: &UniqueKey) -> Result<Taken, sqlx::Error> {
        let sql = &self.q.insert_unique;
        if self.insert_returning {
            let row = sqlx::query_as(sql)
                .bind(DB::id(run.id))
                .bind(run.agent.as_str())
                .bind(run.input.clone())
                .bind(budget_json(run))
                .bind(unique.key())
                .bind(lease_ms(unique.period()))
                .fetch_optional(&self.pool)
                .await?;
            return Ok(row.map_or(Taken::Held, |row| Taken::Row(Box::new(row))));
        }
        let done = sqlx::query(sql)
            .bind(DB::id(run.id))
            .bind(run.agent.as_str())
            .bind(run.input.clone())
            .bind(budget_json(run))
            .bind(unique.key())
            .bind(lease_ms(unique.period()))
            .execute(&self.pool)
            .await?;
        Ok(if DB::rows_affected(&done) > 0 {
            Taken::Written
        } else {
            Taken::Held
        })
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
