//! The SQL run store: PostgreSQL, SQLite and MySQL/MariaDB through sqlx's `Any` driver with
//! runtime queries, one guarded statement per transition, "now" from the database clock.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{AnyPool, Row};
use uuid::Uuid;

use super::{NewRun, Run, RunEvent, RunStore, Settlement, StoreError, lease_ms};
use crate::{RunStatus, TerminationReason};

mod queries;
mod setup;

use queries::Queries;
#[cfg(test)]
use queries::numbered;

type Query<'a> = sqlx::query::Query<'a, sqlx::Any, sqlx::any::AnyArguments<'a>>;

const SQLITE_MIGRATION: &str = include_str!("../../migrations/sqlite/0002_courier_runs.sql");
const POSTGRES_MIGRATION: &str = include_str!("../../migrations/postgres/0002_courier_runs.sql");
const MYSQL_MIGRATION: &str = include_str!("../../migrations/mysql/0002_courier_runs.sql");

/// How long the pool waits for a connection.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

/// The SQL dialect of a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Dialect {
    /// SQLite 3.
    Sqlite,
    /// PostgreSQL.
    Postgres,
    /// MySQL 8 or MariaDB 10.6+.
    Mysql,
}

impl Dialect {
    /// The dialect a DSN names.
    ///
    /// # Errors
    /// [`StoreError::UnsupportedDsn`] for other schemes.
    pub fn from_dsn(dsn: &str) -> Result<Self, StoreError> {
        let scheme = dsn.split(':').next().unwrap_or_default();
        match scheme {
            "sqlite" => Ok(Self::Sqlite),
            "postgres" | "postgresql" => Ok(Self::Postgres),
            "mysql" | "mariadb" => Ok(Self::Mysql),
            _ => Err(StoreError::UnsupportedDsn(courier_core::redact(dsn))),
        }
    }

    /// The expression giving the database clock in epoch milliseconds.
    #[must_use]
    pub fn now_ms_sql(self) -> &'static str {
        match self {
            Self::Sqlite => "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)",
            Self::Postgres => "CAST(EXTRACT(EPOCH FROM statement_timestamp()) * 1000 AS BIGINT)",
            Self::Mysql => "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)",
        }
    }

    fn migration(self) -> &'static str {
        match self {
            Self::Sqlite => SQLITE_MIGRATION,
            Self::Postgres => POSTGRES_MIGRATION,
            Self::Mysql => MYSQL_MIGRATION,
        }
    }
}

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

fn valid_identifier(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 48
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit())
}

const SQLITE_PRAGMAS: [&str; 3] = [
    "PRAGMA journal_mode = WAL",
    "PRAGMA synchronous = NORMAL",
    "PRAGMA busy_timeout = 5000",
];

/// The SQL run store.
///
/// ```no_run
/// use courier_runs::{RunStore, SqlRunStore, SqlRunStoreOptions};
/// # async fn demo() -> Result<(), courier_runs::StoreError> {
/// let store = SqlRunStore::connect("sqlite://courier.db?mode=rwc", SqlRunStoreOptions::default()).await?;
/// store.setup().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct SqlRunStore {
    pool: AnyPool,
    dialect: Dialect,
    options: SqlRunStoreOptions,
    q: std::sync::Arc<Queries>,
}

fn db(context: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
    move |e| StoreError::Database {
        context,
        source: Box::new(e),
    }
}

impl SqlRunStore {
    /// Connects to `dsn` (`sqlite://`, `postgres://`, `mysql://`); the matching crate feature
    /// must be on.
    ///
    /// # Errors
    /// Unsupported DSN, bad table names, connection failure.
    pub async fn connect(dsn: &str, options: SqlRunStoreOptions) -> Result<Self, StoreError> {
        let dialect = Dialect::from_dsn(dsn)?;
        for name in [&options.runs_table, &options.events_table] {
            if !valid_identifier(name) {
                return Err(StoreError::Corrupt(format!("invalid table name `{name}`")));
            }
        }
        // Like the CLI's default `sqlite://courier.db`: create the file when it is missing.
        let dsn = if dialect == Dialect::Sqlite && !dsn.contains("mode=") {
            let sep = if dsn.contains('?') { '&' } else { '?' };
            format!("{dsn}{sep}mode=rwc")
        } else {
            dsn.to_owned()
        };
        sqlx::any::install_default_drivers();
        let sqlite = dialect == Dialect::Sqlite;
        if !sqlite {
            // One connection first, so that a server that is down or refuses the credentials
            // is named at once by the driver's own error instead of the pool's "timed out".
            use sqlx::Connection as _;
            if let Ok(probe) =
                tokio::time::timeout(ACQUIRE_TIMEOUT, sqlx::AnyConnection::connect(&dsn)).await
            {
                // A failed goodbye after a successful probe changes nothing.
                let _ = probe.map_err(db("connect"))?.close().await;
            }
        }
        let pool = AnyPoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    if sqlite {
                        // WAL with synchronous=NORMAL: one fsync per checkpoint instead of
                        // several per commit; readers never block the writer.
                        for pragma in SQLITE_PRAGMAS {
                            sqlx::query(pragma).execute(&mut *conn).await?;
                        }
                    }
                    Ok(())
                })
            })
            .connect(&dsn)
            .await
            .map_err(db("connect"))?;
        let q = std::sync::Arc::new(Queries::new(
            dialect,
            &options.runs_table,
            &options.events_table,
        ));
        Ok(Self {
            pool,
            dialect,
            options,
            q,
        })
    }

    /// The pool (tests rewrite timestamps through it).
    #[must_use]
    pub fn pool(&self) -> &AnyPool {
        &self.pool
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

    /// The query the reaper's stale select runs, with `?`/`$1` placeholders (for EXPLAIN).
    #[must_use]
    pub fn stale_query(&self) -> &str {
        &self.q.select_stale
    }

    /// Runs one statement on the store's pool (maintenance, tests, benches); returns the rows
    /// affected.
    ///
    /// # Errors
    /// The database failed.
    pub async fn execute(&self, sql: &str) -> Result<u64, StoreError> {
        let done = sqlx::query(sql)
            .execute(&self.pool)
            .await
            .map_err(db("execute"))?;
        Ok(done.rows_affected())
    }

    /// The database's plan for the reaper's stale select (`EXPLAIN QUERY PLAN` on SQLite,
    /// `EXPLAIN` elsewhere), one line per plan row: it should name the
    /// `(status, lease_expires)` index.
    ///
    /// # Errors
    /// The database failed.
    pub async fn explain_stale(&self, limit: usize) -> Result<Vec<String>, StoreError> {
        let prefix = if self.dialect == Dialect::Sqlite {
            "EXPLAIN QUERY PLAN "
        } else {
            "EXPLAIN "
        };
        let sql = format!("{prefix}{}", self.q.select_stale);
        let rows = sqlx::query(&sql)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .await
            .map_err(db("explain"))?;
        let line = |row: &AnyRow| -> String {
            match self.dialect {
                Dialect::Sqlite => text_opt(row, "detail").ok().flatten().unwrap_or_default(),
                Dialect::Postgres => text_opt(row, "QUERY PLAN")
                    .ok()
                    .flatten()
                    .unwrap_or_default(),
                Dialect::Mysql => ["table", "type", "key", "rows", "Extra"]
                    .iter()
                    .map(|c| {
                        let v = text_opt(row, c).ok().flatten().or_else(|| {
                            row.try_get::<Option<i64>, _>(*c)
                                .ok()
                                .flatten()
                                .map(|n| n.to_string())
                        });
                        format!("{c}={}", v.unwrap_or_else(|| "NULL".into()))
                    })
                    .collect::<Vec<_>>()
                    .join(" "),
            }
        };
        Ok(rows.iter().map(line).collect())
    }

    /// Drops both tables (tests).
    ///
    /// # Errors
    /// The database failed.
    pub async fn drop_tables(&self) -> Result<(), StoreError> {
        for t in [&self.options.events_table, &self.options.runs_table] {
            sqlx::query(&format!("DROP TABLE IF EXISTS {t}"))
                .execute(&self.pool)
                .await
                .map_err(db("drop"))?;
        }
        Ok(())
    }

    async fn write<'a>(&self, context: &'static str, q: Query<'a>) -> Result<bool, StoreError> {
        let done = q.execute(&self.pool).await.map_err(db(context))?;
        Ok(done.rows_affected() > 0)
    }

    async fn runs<'a>(&self, context: &'static str, q: Query<'a>) -> Result<Vec<Run>, StoreError> {
        let rows = q.fetch_all(&self.pool).await.map_err(db(context))?;
        rows.iter().map(decode_run).collect()
    }
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|_| serde_json::Value::String(text.to_owned()))
}

fn get<'r, T: sqlx::Decode<'r, sqlx::Any> + sqlx::Type<sqlx::Any>>(
    row: &'r AnyRow,
    col: &str,
) -> Result<T, StoreError> {
    row.try_get(col)
        .map_err(|e| StoreError::Corrupt(format!("column `{col}`: {e}")))
}

/// A text column; MySQL reports text with a binary collation as BLOB through the `Any` driver.
fn text_opt(row: &AnyRow, col: &str) -> Result<Option<String>, StoreError> {
    match row.try_get::<Option<String>, _>(col) {
        Ok(v) => Ok(v),
        Err(_) => get::<Option<Vec<u8>>>(row, col)?
            .map(|b| {
                String::from_utf8(b)
                    .map_err(|e| StoreError::Corrupt(format!("column `{col}`: {e}")))
            })
            .transpose(),
    }
}

fn text(row: &AnyRow, col: &str) -> Result<String, StoreError> {
    text_opt(row, col)?.ok_or_else(|| StoreError::Corrupt(format!("column `{col}` is null")))
}

fn parse<T: std::str::FromStr>(value: Option<String>, col: &str) -> Result<Option<T>, StoreError>
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

fn uuid(text: &str) -> Result<Uuid, StoreError> {
    Uuid::parse_str(text).map_err(|e| StoreError::Corrupt(format!("run id: {e}")))
}

fn decode_run(row: &AnyRow) -> Result<Run, StoreError> {
    let status = text(row, "status")?;
    Ok(Run {
        id: uuid(&text(row, "id")?)?,
        agent: text(row, "agent")?,
        status: status
            .parse()
            .map_err(|e| StoreError::Corrupt(format!("{e}")))?,
        input: json(&text(row, "input")?),
        output: text_opt(row, "output")?.as_deref().map(json),
        error_class: parse(text_opt(row, "error_class")?, "error_class")?,
        termination_reason: parse(text_opt(row, "termination_reason")?, "termination_reason")?,
        claimed_by: text_opt(row, "claimed_by")?,
        lease_expires: get(row, "lease_expires")?,
        requeue_count: u32::try_from(get::<i64>(row, "requeue_count")?).unwrap_or(u32::MAX),
        pending_effect: text_opt(row, "pending_effect")?,
        created_at: get(row, "created_at")?,
        started_at: get(row, "started_at")?,
        finished_at: get(row, "finished_at")?,
        updated_at: get(row, "updated_at")?,
        due_at: get(row, "due_at")?,
    })
}

fn limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[async_trait]
impl RunStore for SqlRunStore {
    async fn setup(&self) -> Result<(), StoreError> {
        self.locked_setup().await
    }

    async fn now_ms(&self) -> Result<i64, StoreError> {
        let row = sqlx::query(&self.q.now)
            .fetch_one(&self.pool)
            .await
            .map_err(db("now"))?;
        row.try_get::<i64, _>(0)
            .map_err(|e| StoreError::Corrupt(format!("clock: {e}")))
    }

    async fn insert_queued(&self, run: &NewRun) -> Result<Run, StoreError> {
        let q = sqlx::query(&self.q.insert_queued)
            .bind(run.id.to_string())
            .bind(&run.agent)
            .bind(run.input.to_string());
        self.write("insert run", q).await?;
        self.find(run.id)
            .await?
            .ok_or_else(|| StoreError::Corrupt(format!("run {} vanished", run.id)))
    }

    async fn insert_interactive(&self, run: &NewRun) -> Result<Run, StoreError> {
        let q = sqlx::query(&self.q.insert_interactive)
            .bind(run.id.to_string())
            .bind(&run.agent)
            .bind(run.input.to_string());
        self.write("insert run", q).await?;
        self.find(run.id)
            .await?
            .ok_or_else(|| StoreError::Corrupt(format!("run {} vanished", run.id)))
    }

    async fn find(&self, id: Uuid) -> Result<Option<Run>, StoreError> {
        Ok(self
            .runs("find run", sqlx::query(&self.q.find).bind(id.to_string()))
            .await?
            .pop())
    }

    async fn list(&self, status: Option<RunStatus>, n: usize) -> Result<Vec<Run>, StoreError> {
        match status {
            Some(s) => {
                self.runs(
                    "list runs",
                    sqlx::query(&self.q.list_status)
                        .bind(s.as_str())
                        .bind(limit(n)),
                )
                .await
            }
            None => {
                self.runs("list runs", sqlx::query(&self.q.list_all).bind(limit(n)))
                    .await
            }
        }
    }

    async fn claim(&self, id: Uuid, worker: &str, lease: Duration) -> Result<bool, StoreError> {
        let q = sqlx::query(&self.q.claim)
            .bind(worker)
            .bind(lease_ms(lease))
            .bind(id.to_string());
        self.write("claim", q).await
    }

    async fn renew(&self, id: Uuid, worker: &str, lease: Duration) -> Result<bool, StoreError> {
        let q = sqlx::query(&self.q.renew)
            .bind(lease_ms(lease))
            .bind(id.to_string())
            .bind(worker);
        self.write("renew", q).await
    }

    async fn requeue_owned(
        &self,
        id: Uuid,
        worker: &str,
        due_in: Duration,
    ) -> Result<bool, StoreError> {
        self.write(
            "requeue",
            sqlx::query(&self.q.requeue_owned)
                .bind(lease_ms(due_in))
                .bind(id.to_string())
                .bind(worker),
        )
        .await
    }

    async fn select_overdue(&self, after: Duration, n: usize) -> Result<Vec<Run>, StoreError> {
        self.runs(
            "select overdue",
            sqlx::query(&self.q.select_overdue)
                .bind(lease_ms(after))
                .bind(limit(n)),
        )
        .await
    }

    async fn redispatch_overdue(&self, id: Uuid, after: Duration) -> Result<bool, StoreError> {
        self.write(
            "re-dispatch overdue",
            sqlx::query(&self.q.redispatch_overdue)
                .bind(id.to_string())
                .bind(lease_ms(after)),
        )
        .await
    }

    async fn redispatch_queued(&self, id: Uuid) -> Result<bool, StoreError> {
        self.write(
            "re-dispatch queued",
            sqlx::query(&self.q.redispatch_queued).bind(id.to_string()),
        )
        .await
    }

    async fn select_stale(&self, n: usize) -> Result<Vec<Run>, StoreError> {
        self.runs(
            "select stale",
            sqlx::query(&self.q.select_stale).bind(limit(n)),
        )
        .await
    }

    async fn requeue_stale(&self, id: Uuid) -> Result<bool, StoreError> {
        self.write(
            "stale requeue",
            sqlx::query(&self.q.requeue_stale).bind(id.to_string()),
        )
        .await
    }

    async fn dead_letter_stale(
        &self,
        id: Uuid,
        reason: TerminationReason,
    ) -> Result<bool, StoreError> {
        let q = sqlx::query(&self.q.dead_letter_stale)
            .bind(reason.as_str())
            .bind(id.to_string());
        self.write("stale dead-letter", q).await
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
        let mut q = sqlx::query(sql)
            .bind(s.status.as_str())
            .bind(s.reason.map(|r| r.as_str().to_owned()))
            .bind(s.class.map(|c| c.as_str().to_owned()))
            .bind(s.output.as_ref().map(ToString::to_string))
            .bind(i64::from(s.status.is_terminal()))
            .bind(id.to_string());
        if let Some(owner) = owner {
            q = q.bind(owner.to_owned());
        }
        self.write("settle", q).await
    }

    async fn fail_queued(&self, id: Uuid, reason: TerminationReason) -> Result<bool, StoreError> {
        let q = sqlx::query(&self.q.fail_queued)
            .bind(reason.as_str())
            .bind(id.to_string());
        self.write("fail queued", q).await
    }

    async fn resume(&self, id: Uuid, from: RunStatus) -> Result<bool, StoreError> {
        self.write(
            "resume",
            sqlx::query(&self.q.resume)
                .bind(id.to_string())
                .bind(from.as_str()),
        )
        .await
    }

    async fn cancel(&self, id: Uuid) -> Result<bool, StoreError> {
        self.write("cancel", sqlx::query(&self.q.cancel).bind(id.to_string()))
            .await
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
        let mut q = sqlx::query(sql)
            .bind(effect.map(str::to_owned))
            .bind(id.to_string());
        if let Some(owner) = owner {
            q = q.bind(owner.to_owned());
        }
        self.write("pending effect", q).await
    }

    async fn append_event(
        &self,
        id: Uuid,
        kind: &str,
        payload: &serde_json::Value,
    ) -> Result<i64, StoreError> {
        // One statement computes MAX(seq)+1 and inserts; MySQL may report a deadlock (40001)
        // between two concurrent INSERT ... SELECT: that statement did nothing and is retried.
        let mut attempt = 0;
        loop {
            let q = sqlx::query(&self.q.append_event)
                .bind(id.to_string())
                .bind(kind)
                .bind(payload.to_string())
                .bind(id.to_string());
            let done = if self.dialect == Dialect::Mysql {
                q.execute(&self.pool).await.map(|_| None)
            } else {
                q.fetch_one(&self.pool).await.map(Some)
            };
            match done {
                Ok(Some(row)) => return get(&row, "seq"),
                Ok(None) => return self.max_seq(id).await,
                Err(sqlx::Error::Database(d)) if d.is_unique_violation() => {
                    let seq = self.max_seq(id).await?;
                    return Err(StoreError::DuplicateSequence { run_id: id, seq });
                }
                Err(sqlx::Error::Database(d))
                    if d.code().as_deref() == Some("40001") && attempt < 5 =>
                {
                    attempt += 1;
                }
                Err(e) => return Err(db("append event")(e)),
            }
        }
    }

    async fn events(&self, id: Uuid) -> Result<Vec<RunEvent>, StoreError> {
        let rows = sqlx::query(&self.q.events)
            .bind(id.to_string())
            .fetch_all(&self.pool)
            .await
            .map_err(db("events"))?;
        rows.iter()
            .map(|row| {
                Ok(RunEvent {
                    run_id: uuid(&text(row, "run_id")?)?,
                    seq: get(row, "seq")?,
                    kind: text(row, "kind")?,
                    payload: json(&text(row, "payload")?),
                    created_at: get(row, "created_at")?,
                })
            })
            .collect()
    }
}

impl SqlRunStore {
    async fn max_seq(&self, id: Uuid) -> Result<i64, StoreError> {
        let row = sqlx::query(&self.q.max_seq)
            .bind(id.to_string())
            .fetch_one(&self.pool)
            .await
            .map_err(db("max seq"))?;
        get(&row, "seq")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_placeholders_are_numbered() {
        assert_eq!(numbered("a = ? AND b = ?"), "a = $1 AND b = $2");
    }

    #[test]
    fn dialect_comes_from_the_scheme() {
        assert_eq!(
            Dialect::from_dsn("sqlite://x.db").ok(),
            Some(Dialect::Sqlite)
        );
        assert_eq!(
            Dialect::from_dsn("postgresql://h/db").ok(),
            Some(Dialect::Postgres)
        );
        assert_eq!(
            Dialect::from_dsn("mariadb://h/db").ok(),
            Some(Dialect::Mysql)
        );
        assert!(Dialect::from_dsn("redis://h").is_err());
    }
}
