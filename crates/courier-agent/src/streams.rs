//! Per-run token streams: what a streaming model step ([`Provider::stream`](crate::Provider))
//! receives, appended as it arrives to a stream of its run, each event with an offset (1, 2, ...
//! per run, never reused) and an expiry (a TTL), so that a reader can follow a run live and
//! resume after the last offset it saw.
//!
//! Events: `chunk` (text the model produced), `retry` (the step is tried again, by a retry of
//! the run or by the next provider of the chain: a reader drops the partial output of the
//! step since its last `retry`), `done` (the step's answer is complete and journaled: the
//! step's result holds the whole text, so the stream is only for live readers).

use std::collections::HashMap;
use std::fmt;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;

/// What an event says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamKind {
    /// Text the model produced.
    Chunk,
    /// The step starts again: drop its partial output.
    Retry,
    /// The step's answer is complete.
    Done,
}

impl StreamKind {
    /// `chunk`, `retry`, `done`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Chunk => "chunk",
            Self::Retry => "retry",
            Self::Done => "done",
        }
    }

    fn parse(s: &str) -> Self {
        match s {
            "retry" => Self::Retry,
            "done" => Self::Done,
            _ => Self::Chunk,
        }
    }
}

/// One event of a run's stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamEvent {
    /// Its offset in the run's stream, from 1.
    pub offset: i64,
    /// The model step (its index in the run) it belongs to.
    pub step: i64,
    /// What it says.
    pub kind: StreamKind,
    /// The text of a chunk (empty otherwise).
    pub data: String,
}

/// A stream store failed (the step goes on: a stream is for live readers, the journal holds
/// the answer).
#[derive(Debug, thiserror::Error)]
#[error("token stream store failed while {doing}")]
pub struct StreamError {
    doing: &'static str,
    #[source]
    source: Box<dyn std::error::Error + Send + Sync>,
}

/// Where run streams live.
#[async_trait]
pub trait StreamStore: Send + Sync + fmt::Debug + 'static {
    /// Appends an event to run `run`'s stream, kept until `now + ttl`; returns its offset.
    async fn append(
        &self,
        run: &str,
        step: i64,
        kind: StreamKind,
        data: &str,
        now: i64,
        ttl: Duration,
    ) -> Result<i64, StreamError>;

    /// The unexpired events of `run` after offset `after`, at most `limit`, in offset order.
    async fn read(
        &self,
        run: &str,
        after: i64,
        limit: usize,
        now: i64,
    ) -> Result<Vec<StreamEvent>, StreamError>;

    /// Deletes expired events; returns how many.
    async fn prune(&self, now: i64) -> Result<u64, StreamError>;
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Streams in this process's memory (tests, a single process).
#[derive(Debug, Default)]
pub struct MemoryStreams {
    runs: Mutex<HashMap<String, Vec<(StreamEvent, i64)>>>,
}

impl MemoryStreams {
    /// Empty.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }
}

#[async_trait]
impl StreamStore for MemoryStreams {
    async fn append(
        &self,
        run: &str,
        step: i64,
        kind: StreamKind,
        data: &str,
        now: i64,
        ttl: Duration,
    ) -> Result<i64, StreamError> {
        let mut runs = self.runs.lock().unwrap_or_else(PoisonError::into_inner);
        let events = runs.entry(run.to_owned()).or_default();
        let offset = events.last().map_or(0, |(e, _)| e.offset) + 1;
        let event = StreamEvent {
            offset,
            step,
            kind,
            data: data.to_owned(),
        };
        events.push((event, now.saturating_add(ms(ttl))));
        Ok(offset)
    }

    async fn read(
        &self,
        run: &str,
        after: i64,
        limit: usize,
        now: i64,
    ) -> Result<Vec<StreamEvent>, StreamError> {
        let runs = self.runs.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(runs
            .get(run)
            .map(|events| {
                events
                    .iter()
                    .filter(|(e, expires)| e.offset > after && *expires > now)
                    .take(limit)
                    .map(|(e, _)| e.clone())
                    .collect()
            })
            .unwrap_or_default())
    }

    async fn prune(&self, now: i64) -> Result<u64, StreamError> {
        let mut runs = self.runs.lock().unwrap_or_else(PoisonError::into_inner);
        let mut pruned = 0;
        for events in runs.values_mut() {
            let before = events.len();
            // The newest event stays (as a tombstone) so that offsets are never reused.
            let keep_last = events.last().map(|(e, _)| e.offset);
            events.retain(|(e, expires)| *expires > now || Some(e.offset) == keep_last);
            pruned += (before - events.len()) as u64;
        }
        Ok(pruned)
    }
}

/// The default table of [`SqlStreams`].
pub const DEFAULT_STREAM_TABLE: &str = "courier_agent_streams";

/// Streams in a table of the run store's database (SQLite or PostgreSQL): every process on it
/// (the workers appending, a dashboard reading) sees one stream per run.
#[derive(Clone)]
pub struct SqlStreams {
    pool: courier_sql::SqlPool,
    table: String,
}

impl fmt::Debug for SqlStreams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlStreams")
            .field("dialect", &self.pool.dialect())
            .field("table", &self.table)
            .finish()
    }
}

fn db(doing: &'static str) -> impl FnOnce(sqlx::Error) -> StreamError {
    move |e| StreamError {
        doing,
        source: Box::new(e),
    }
}

/// Runs the same query text on whichever pool (see [`crate::sql::on_dialect`]).
macro_rules! on_pool {
    ($self:ident, $sql:expr, |$q:ident, $pool:ident| $body:expr) => {
        crate::sql::on_dialect!(
            &$self.pool,
            $sql,
            StreamError {
                doing: "choosing a dialect",
                source: "token streams need SQLite or PostgreSQL".into(),
            },
            |$q, $pool| $body
        )
    };
}

impl SqlStreams {
    /// Streams on `pool` in `table` (default [`DEFAULT_STREAM_TABLE`]).
    ///
    /// # Errors
    /// A table name that is not a plain identifier.
    pub fn new(
        pool: impl Into<courier_sql::SqlPool>,
        table: Option<&str>,
    ) -> Result<Self, StreamError> {
        let table = table.unwrap_or(DEFAULT_STREAM_TABLE).to_owned();
        if table.is_empty() || !table.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(StreamError {
                doing: "naming the table",
                source: format!("`{table}` is not a plain identifier").into(),
            });
        }
        Ok(Self {
            pool: pool.into(),
            table,
        })
    }

    /// Connects a small pool of its own to `dsn` (the run store's: `sqlite://`, `postgres://`)
    /// and creates the table when missing.
    ///
    /// # Errors
    /// An unsupported DSN, the database failed.
    pub async fn connect(dsn: &str, table: Option<&str>) -> Result<Self, StreamError> {
        let settings = courier_sql::PoolSettings {
            max_connections: Some(2),
            ..courier_sql::PoolSettings::default()
        };
        let unsupported = || StreamError {
            doing: "connecting",
            source: format!(
                "token streams need a SQLite or PostgreSQL run store, not `{}`",
                courier_core::redact(dsn)
            )
            .into(),
        };
        let pool: courier_sql::SqlPool = if dsn.starts_with("sqlite:") {
            #[cfg(feature = "sqlite")]
            {
                courier_sql::sqlite_pool(dsn, &settings)
                    .await
                    .map_err(db("connecting"))?
                    .into()
            }
            #[cfg(not(feature = "sqlite"))]
            return Err(unsupported());
        } else if dsn.starts_with("postgres:") || dsn.starts_with("postgresql:") {
            #[cfg(feature = "postgres")]
            {
                courier_sql::postgres_pool(dsn, &settings)
                    .await
                    .map_err(db("connecting"))?
                    .0
                    .into()
            }
            #[cfg(not(feature = "postgres"))]
            return Err(unsupported());
        } else {
            return Err(unsupported());
        };
        let streams = Self::new(pool, table)?;
        streams.setup().await?;
        Ok(streams)
    }

    /// Creates the table when missing.
    ///
    /// # Errors
    /// The database failed.
    pub async fn setup(&self) -> Result<(), StreamError> {
        let sql = format!(
            "CREATE TABLE IF NOT EXISTS {} (run_id VARCHAR(64) NOT NULL, seq BIGINT NOT NULL, \
             step BIGINT NOT NULL, kind VARCHAR(8) NOT NULL, data TEXT NOT NULL, \
             expires_at BIGINT NOT NULL, PRIMARY KEY (run_id, seq))",
            self.table
        );
        on_pool!(self, sql, |q, pool| q
            .execute(pool)
            .await
            .map(|_| ())
            .map_err(db("creating the table")))
    }

    /// Drops the table (tests).
    ///
    /// # Errors
    /// The database failed.
    pub async fn drop_table(&self) -> Result<(), StreamError> {
        let sql = format!("DROP TABLE IF EXISTS {}", self.table);
        on_pool!(self, sql, |q, pool| q
            .execute(pool)
            .await
            .map(|_| ())
            .map_err(db("dropping the table")))
    }
}

#[async_trait]
impl StreamStore for SqlStreams {
    async fn append(
        &self,
        run: &str,
        step: i64,
        kind: StreamKind,
        data: &str,
        now: i64,
        ttl: Duration,
    ) -> Result<i64, StreamError> {
        // One writer per run (the lease holder): the next offset is the largest + 1, in the
        // same statement; the primary key refuses a duplicate if two ever raced.
        let sql = format!(
            "INSERT INTO {t} (run_id, seq, step, kind, data, expires_at) \
             SELECT $1, COALESCE(MAX(seq), 0) + 1, $2, $3, $4, $5 FROM {t} WHERE run_id = $1 \
             RETURNING seq",
            t = self.table
        );
        let expires = now.saturating_add(ms(ttl));
        on_pool!(self, sql, |q, pool| {
            let row = q
                .bind(run)
                .bind(step)
                .bind(kind.as_str())
                .bind(data)
                .bind(expires)
                .fetch_one(pool)
                .await
                .map_err(db("appending to a run's stream"))?;
            sqlx::Row::try_get::<i64, _>(&row, "seq").map_err(db("reading the offset"))
        })
    }

    async fn read(
        &self,
        run: &str,
        after: i64,
        limit: usize,
        now: i64,
    ) -> Result<Vec<StreamEvent>, StreamError> {
        let sql = format!(
            "SELECT seq, step, kind, data FROM {} WHERE run_id = $1 AND seq > $2 AND expires_at > $3 \
             ORDER BY seq LIMIT $4",
            self.table
        );
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        on_pool!(self, sql, |q, pool| {
            let rows = q
                .bind(run)
                .bind(after)
                .bind(now)
                .bind(limit)
                .fetch_all(pool)
                .await
                .map_err(db("reading a run's stream"))?;
            rows.iter()
                .map(|r| {
                    let kind: String =
                        sqlx::Row::try_get(r, "kind").map_err(db("reading an event"))?;
                    Ok(StreamEvent {
                        offset: sqlx::Row::try_get(r, "seq").map_err(db("reading an event"))?,
                        step: sqlx::Row::try_get(r, "step").map_err(db("reading an event"))?,
                        kind: StreamKind::parse(&kind),
                        data: sqlx::Row::try_get(r, "data").map_err(db("reading an event"))?,
                    })
                })
                .collect()
        })
    }

    async fn prune(&self, now: i64) -> Result<u64, StreamError> {
        // The newest event of each run stays (a tombstone), so that offsets are never reused.
        let sql = format!(
            "DELETE FROM {t} WHERE expires_at <= $1 AND seq < \
             (SELECT MAX(seq) FROM {t} AS newest WHERE newest.run_id = {t}.run_id)",
            t = self.table
        );
        on_pool!(self, sql, |q, pool| q
            .bind(now)
            .execute(pool)
            .await
            .map(|r| r.rows_affected())
            .map_err(db("pruning the streams")))
    }
}

/// How long a stream event is kept by default.
pub const DEFAULT_STREAM_TTL: Duration = Duration::from_secs(3600);

/// [`SqlStreams`] that connect (and create their table) on first use: for a caller that builds
/// its agents before it may await, like the command line.
pub struct LazySqlStreams {
    dsn: String,
    table: Option<String>,
    cell: tokio::sync::OnceCell<SqlStreams>,
}

impl fmt::Debug for LazySqlStreams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LazySqlStreams")
            .field("dsn", &courier_core::redact(&self.dsn))
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

impl LazySqlStreams {
    /// Streams on the database of `dsn`, connected on first use.
    #[must_use]
    pub fn new(dsn: impl Into<String>, table: Option<&str>) -> Self {
        Self {
            dsn: dsn.into(),
            table: table.map(str::to_owned),
            cell: tokio::sync::OnceCell::new(),
        }
    }

    async fn get(&self) -> Result<&SqlStreams, StreamError> {
        self.cell
            .get_or_try_init(|| SqlStreams::connect(&self.dsn, self.table.as_deref()))
            .await
    }
}

#[async_trait]
impl StreamStore for LazySqlStreams {
    async fn append(
        &self,
        run: &str,
        step: i64,
        kind: StreamKind,
        data: &str,
        now: i64,
        ttl: Duration,
    ) -> Result<i64, StreamError> {
        self.get()
            .await?
            .append(run, step, kind, data, now, ttl)
            .await
    }

    async fn read(
        &self,
        run: &str,
        after: i64,
        limit: usize,
        now: i64,
    ) -> Result<Vec<StreamEvent>, StreamError> {
        self.get().await?.read(run, after, limit, now).await
    }

    async fn prune(&self, now: i64) -> Result<u64, StreamError> {
        self.get().await?.prune(now).await
    }
}
