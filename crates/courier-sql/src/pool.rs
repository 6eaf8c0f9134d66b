//! Opening a pool per dialect, the same way for the message transport and the run store:
//! SQLite in WAL mode with the file created when missing, PostgreSQL and MySQL probed with one
//! connection first, MySQL sessions in UTC, and [`SqlDatabase`], what the generic executors ask
//! of a driver beyond sqlx's own traits.

use std::time::Duration;

use crate::Dialect;

/// A sqlx driver Courier runs its statements on: SQLite, PostgreSQL or MySQL.
pub trait SqlDatabase: sqlx::Database {
    /// The dialect of its SQL text.
    const DIALECT: Dialect;

    /// The rows a statement matched (MySQL connects with `CLIENT_FOUND_ROWS`).
    fn rows_affected(done: &Self::QueryResult) -> u64;
}

#[cfg(feature = "sqlite")]
impl SqlDatabase for sqlx::Sqlite {
    const DIALECT: Dialect = Dialect::Sqlite;

    fn rows_affected(done: &Self::QueryResult) -> u64 {
        done.rows_affected()
    }
}

#[cfg(feature = "postgres")]
impl SqlDatabase for sqlx::Postgres {
    const DIALECT: Dialect = Dialect::Postgres;

    fn rows_affected(done: &Self::QueryResult) -> u64 {
        done.rows_affected()
    }
}

#[cfg(feature = "mysql")]
impl SqlDatabase for sqlx::MySql {
    const DIALECT: Dialect = Dialect::Mysql;

    fn rows_affected(done: &Self::QueryResult) -> u64 {
        done.rows_affected()
    }
}

/// When a statement was last abandoned mid-flight, in nanoseconds since [`EPOCH`] (0: never).
#[cfg(any(feature = "postgres", feature = "mysql"))]
static ABANDONED_AT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

#[cfg(any(feature = "postgres", feature = "mysql"))]
static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

/// How long after an abandonment a connection opened before it is closed when it comes back to
/// its pool rather than reused.
#[cfg(any(feature = "postgres", feature = "mysql"))]
const ABANDONED_RELEASE_WINDOW: Duration = Duration::from_secs(1);

/// A statement in flight: dropped before [`InFlight::done`] (its caller gave up on a server
/// that stopped answering: the worker's and the relay's bounds, a run's heartbeat, a
/// shutdown), it marks the
/// moment, and the server pools (PostgreSQL, MySQL) stop trusting the connections they had
/// then. A connection black-holed by a failover or a NAT answers nothing, and neither does any
/// other on the same dead path: without this, the next statement would take another of those
/// from the pool and hang as long again, once per pooled connection. From the mark on, a
/// connection that sat idle since before it is discarded when next acquired (its replacement
/// opens on the path that works now), and one opened before it that comes back within a
/// second (the abandoned one, whose return would otherwise wait on a ping that never
/// answers, holding its slot) is closed. At most one reconnect per pooled connection; healthy
/// connections pay it too, once.
///
/// `SqlTransport` wraps each of its statements in one; code running its own statements on a
/// pool from [`postgres_pool`] or [`mysql_pool`] that it may give up on does the same:
///
/// ```
/// # async fn renew(pool: &sqlx::PgPool) -> Result<(), sqlx::Error> {
/// let in_flight = courier_sql::InFlight::start();
/// let done = sqlx::query("SELECT 1").execute(pool).await;
/// in_flight.done();
/// done?;
/// # Ok(()) }
/// ```
#[must_use = "dropped before `done`, it marks the statement abandoned"]
#[derive(Debug)]
pub struct InFlight(bool);

impl InFlight {
    /// A statement starts.
    pub fn start() -> Self {
        Self(false)
    }

    /// It finished (with or without an error): nothing to mark.
    pub fn done(mut self) {
        self.0 = true;
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        #[cfg(any(feature = "postgres", feature = "mysql"))]
        if !self.0 {
            let at = EPOCH.get_or_init(std::time::Instant::now).elapsed();
            let nanos = u64::try_from(at.as_nanos()).unwrap_or(u64::MAX).max(1);
            ABANDONED_AT.fetch_max(nanos, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// How long ago a statement was last abandoned (`None`: never).
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn abandoned_ago() -> Option<Duration> {
    let at = ABANDONED_AT.load(std::sync::atomic::Ordering::Relaxed);
    let epoch = EPOCH.get()?;
    (at > 0).then(|| epoch.elapsed().saturating_sub(Duration::from_nanos(at)))
}

/// Whether an idle connection being acquired went idle before the last abandonment.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn idle_since_abandoned(meta: &sqlx::pool::PoolConnectionMetadata) -> bool {
    abandoned_ago().is_some_and(|ago| meta.idle_for > ago)
}

/// Whether a connection coming back to its pool was opened before an abandonment of the last
/// second.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn back_from_abandoned(meta: &sqlx::pool::PoolConnectionMetadata) -> bool {
    abandoned_ago().is_some_and(|ago| ago < ABANDONED_RELEASE_WINDOW && meta.age > ago)
}

/// How a pool is sized and how long it waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSettings {
    /// The most connections (`None`: 10 on servers, 4 on SQLite files; `:memory:` always 1).
    pub max_connections: Option<u32>,
    /// Idle connections kept open.
    pub min_connections: u32,
    /// How long an operation waits for a connection.
    pub acquire_timeout: Duration,
    /// SQLite: how long a writer waits for the file lock.
    pub busy_timeout: Duration,
    /// MySQL: sessions run READ COMMITTED (no gap locks between claims, inserts and deletes).
    pub read_committed: bool,
    /// PostgreSQL: sessions plan with `enable_sort = off`, so that a statement whose `ORDER BY
    /// ... LIMIT` an index provides walks that index rather than sorting what it matched.
    /// Queue statements want this: on a table filled since its last `ANALYZE` the planner
    /// guesses a few rows match, and would sort them all (a whole backlog per batch).
    pub ordered_scans: bool,
}

impl Default for PoolSettings {
    fn default() -> Self {
        Self {
            max_connections: None,
            min_connections: 0,
            acquire_timeout: Duration::from_secs(30),
            busy_timeout: Duration::from_secs(10),
            read_committed: false,
            ordered_scans: false,
        }
    }
}

/// Whether a SQLite URL names an in-memory database (which lives as long as its one connection).
#[cfg(feature = "sqlite")]
pub(crate) fn in_memory(url: &str) -> bool {
    url.contains(":memory:") || url.contains("mode=memory")
}

/// A SQLite pool: WAL, `synchronous=NORMAL`, the busy timeout, rows handed over up to 1,024 at
/// a time, and the file created when it is missing (the one place that decides it). An
/// in-memory database keeps exactly one connection, forever, since it lives as long as that
/// connection does.
///
/// # Errors
/// A bad URL or a file that cannot be opened.
#[cfg(feature = "sqlite")]
pub async fn sqlite_pool(url: &str, s: &PoolSettings) -> Result<sqlx::SqlitePool, sqlx::Error> {
    use sqlx::sqlite::SqlitePoolOptions;

    let connect = sqlite_options(url, s)?;
    let pool = SqlitePoolOptions::new()
        .test_before_acquire(false)
        .acquire_timeout(s.acquire_timeout)
        .min_connections(s.min_connections);
    let pool = if in_memory(url) {
        pool.max_connections(1)
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
    } else {
        pool.max_connections(s.max_connections.unwrap_or(4))
    };
    pool.connect_with(connect).await
}

/// The write turn of a SQLite database in this process: one lock per file, shared by everything
/// of Courier's that writes it through `pool` (the message table's writes and checkpoints, the
/// run store's), so that they take turns here instead of meeting in SQLite's busy handler,
/// which sleeps in steps of milliseconds. An in-memory database gets a lock of its own.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use courier_sql::{PoolSettings, sqlite_pool, sqlite_write_turn};
/// let path = std::env::temp_dir().join(format!("courier-doc-turn-{}.db", std::process::id()));
/// let url = format!("sqlite://{}", path.display());
/// let a = sqlite_pool(&url, &PoolSettings::default()).await?;
/// let b = sqlite_pool(&url, &PoolSettings::default()).await?;
/// assert!(std::sync::Arc::ptr_eq(&sqlite_write_turn(&a), &sqlite_write_turn(&b)));
/// let memory = sqlite_pool("sqlite::memory:", &PoolSettings::default()).await?;
/// assert!(!std::sync::Arc::ptr_eq(&sqlite_write_turn(&a), &sqlite_write_turn(&memory)));
/// # drop((a, b)); let _ = std::fs::remove_file(&path);
/// # Ok::<(), sqlx::Error>(()) }).unwrap();
/// ```
#[cfg(feature = "sqlite")]
#[must_use]
pub fn sqlite_write_turn(pool: &sqlx::SqlitePool) -> std::sync::Arc<tokio::sync::Mutex<()>> {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};

    type Turns = Mutex<HashMap<std::path::PathBuf, Weak<tokio::sync::Mutex<()>>>>;
    static TURNS: OnceLock<Turns> = OnceLock::new();
    let file = pool.connect_options().get_filename().to_path_buf();
    let Ok(path) = std::fs::canonicalize(&file) else {
        // In memory (or gone): nothing else in this process writes it through another pool.
        return Arc::default();
    };
    let mut turns = TURNS
        .get_or_init(Turns::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if let Some(turn) = turns.get(&path).and_then(Weak::upgrade) {
        return turn;
    }
    turns.retain(|_, turn| turn.strong_count() > 0);
    let turn = Arc::default();
    turns.insert(path, Arc::downgrade(&turn));
    turn
}

/// Connections of a SQLite file's write pool (see [`sqlite_writer_pool`]).
#[cfg(feature = "sqlite")]
pub(crate) const SQLITE_WRITERS: u32 = 2;

/// The pool of two connections a SQLite file's writes go through (they take turns, see
/// `SqliteState::writer`): as [`sqlite_pool`]'s, except that its commits never checkpoint the
/// WAL (`wal_autocheckpoint = 0`); the checkpoints, and their fsyncs, are the caller's to run on
/// another connection ([`crate::SqliteCheckpoints`]).
///
/// Two, not one: sqlx returns a released connection to its pool on a task of its own, after a
/// ping (a round trip to the connection's thread); with one connection, every write waited for
/// the last one's release, most of all on a disk whose syncs take milliseconds. The second is
/// taken while the first is being returned.
#[cfg(feature = "sqlite")]
///
/// # Errors
/// A bad URL or a file that cannot be opened.
pub async fn sqlite_writer_pool(
    url: &str,
    s: &PoolSettings,
) -> Result<sqlx::SqlitePool, sqlx::Error> {
    let connect = sqlite_options(url, s)?.pragma("wal_autocheckpoint", "0");
    sqlx::sqlite::SqlitePoolOptions::new()
        .test_before_acquire(false)
        .acquire_timeout(s.acquire_timeout)
        .max_connections(SQLITE_WRITERS)
        .connect_with(connect)
        .await
}

#[cfg(feature = "sqlite")]
fn sqlite_options(
    url: &str,
    s: &PoolSettings,
) -> Result<sqlx::sqlite::SqliteConnectOptions, sqlx::Error> {
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
    use std::str::FromStr as _;

    Ok(SqliteConnectOptions::from_str(url)?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(s.busy_timeout)
        // A claim's rows cross from the connection's thread in one go: with sqlx's default of
        // 50, a batch of 64 stopped the thread mid-statement, write lock held, until this side
        // took rows off.
        .row_buffer_size(1024))
}

/// A PostgreSQL pool and the options its connections open with (for [`explain_timeout`]).
///
/// # Errors
/// A bad URL, or the driver's own error when the server is down or refuses the credentials.
#[cfg(feature = "postgres")]
pub async fn postgres_pool(
    url: &str,
    s: &PoolSettings,
) -> Result<(sqlx::PgPool, sqlx::postgres::PgConnectOptions), sqlx::Error> {
    use std::str::FromStr as _;

    let mut connect = sqlx::postgres::PgConnectOptions::from_str(url)?;
    if s.ordered_scans {
        connect = connect.options([("enable_sort", "off")]);
    }
    probe::<sqlx::PgConnection>(&connect, s.acquire_timeout).await?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        // No ping per acquire: a dead connection fails the statement, which is retried.
        .test_before_acquire(false)
        .max_connections(s.max_connections.unwrap_or(10))
        .min_connections(s.min_connections)
        .acquire_timeout(s.acquire_timeout)
        // Connections on a path that stopped answering are replaced (see `InFlight`).
        .before_acquire(|_, meta| Box::pin(async move { Ok(!idle_since_abandoned(&meta)) }))
        .after_release(|_, meta| Box::pin(async move { Ok(!back_from_abandoned(&meta)) }))
        .connect_with(connect.clone())
        .await?;
    Ok((pool, connect))
}

/// A MySQL / MariaDB pool (sessions in UTC, so `UNIX_TIMESTAMP(NOW(3))` is unambiguous), the
/// options its connections open with, and the server ids of its live connections.
///
/// # Errors
/// A bad URL, or the driver's own error when the server is down or refuses the credentials.
#[cfg(feature = "mysql")]
pub async fn mysql_pool(
    url: &str,
    s: &PoolSettings,
) -> Result<
    (
        sqlx::MySqlPool,
        sqlx::mysql::MySqlConnectOptions,
        ConnectionIds,
    ),
    sqlx::Error,
> {
    use sqlx::Executor as _;
    use std::str::FromStr as _;

    let connect = sqlx::mysql::MySqlConnectOptions::from_str(url)?;
    probe::<sqlx::MySqlConnection>(&connect, s.acquire_timeout).await?;
    let ids = ConnectionIds::default();
    let known = ids.clone();
    let read_committed = s.read_committed;
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        // No ping per acquire: a dead connection fails the statement, which is retried.
        .test_before_acquire(false)
        .max_connections(s.max_connections.unwrap_or(10))
        .min_connections(s.min_connections)
        .acquire_timeout(s.acquire_timeout)
        // Connections on a path that stopped answering are replaced (see `InFlight`).
        .before_acquire(|_, meta| Box::pin(async move { Ok(!idle_since_abandoned(&meta)) }))
        .after_release(|_, meta| Box::pin(async move { Ok(!back_from_abandoned(&meta)) }))
        .after_connect(move |conn, _meta| {
            let known = known.clone();
            Box::pin(async move {
                if read_committed {
                    conn.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                        .await?;
                }
                conn.execute("SET time_zone = '+00:00'").await?;
                known.connected(conn).await
            })
        })
        .connect_with(connect.clone())
        .await?;
    Ok((pool, connect, ids))
}

/// The server-side ids of a MySQL pool's connections (tests kill them). Each new connection
/// adds its id and drops those of connections the server no longer has, so the set stays the
/// size of the pool however often connections are replaced.
#[cfg(feature = "mysql")]
#[derive(Debug, Clone, Default)]
pub struct ConnectionIds(std::sync::Arc<std::sync::Mutex<std::collections::BTreeSet<u64>>>);

#[cfg(feature = "mysql")]
impl ConnectionIds {
    /// The ids known now.
    #[must_use]
    pub fn snapshot(&self) -> Vec<u64> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .copied()
            .collect()
    }

    async fn connected(&self, conn: &mut sqlx::MySqlConnection) -> Result<(), sqlx::Error> {
        let id: u64 = sqlx::query_scalar("SELECT CONNECTION_ID()")
            .fetch_one(&mut *conn)
            .await?;
        let known = self.snapshot();
        let live: Vec<u64> = if known.is_empty() {
            Vec::new()
        } else {
            let list = known
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ");
            sqlx::query_scalar(&format!(
                "SELECT CAST(ID AS UNSIGNED) FROM information_schema.PROCESSLIST WHERE ID IN ({list})"
            ))
            .fetch_all(&mut *conn)
            .await?
        };
        let mut ids = self.0.lock().unwrap_or_else(|e| e.into_inner());
        ids.retain(|id| !known.contains(id) || live.contains(id));
        ids.insert(id);
        Ok(())
    }
}

/// Opens (and closes) one connection before a pool is built, so that a server that is down or
/// refuses the credentials fails `connect` at once with the driver's own error ("connection
/// refused", "password authentication failed"), not with the pool's "timed out" after its whole
/// `acquire_timeout`. A server that does not answer within `within` is left to the pool.
#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn probe<C: sqlx::Connection>(
    options: &<C as sqlx::Connection>::Options,
    within: Duration,
) -> Result<(), sqlx::Error> {
    match tokio::time::timeout(within, C::connect_with(options)).await {
        Ok(Ok(conn)) => {
            // The probe has done its job; a failed goodbye changes nothing.
            let _ = conn.close().await;
            Ok(())
        }
        Ok(Err(e)) => Err(e),
        Err(_) => Ok(()),
    }
}

/// How long [`explain_timeout`] waits for its connection attempt at most.
#[cfg(any(feature = "postgres", feature = "mysql"))]
const EXPLAIN_WITHIN: Duration = Duration::from_secs(5);

/// The cause behind a pool that timed out, when one direct connection attempt finds it (the
/// server is down, the credentials are refused); any other error unchanged.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub async fn explain_timeout<C: sqlx::Connection>(
    options: &<C as sqlx::Connection>::Options,
    e: sqlx::Error,
) -> sqlx::Error {
    if !matches!(e, sqlx::Error::PoolTimedOut) {
        return e;
    }
    match probe::<C>(options, EXPLAIN_WITHIN).await {
        Err(cause) => cause,
        Ok(()) => e,
    }
}

/// Connect options kept beside a pool. They hold the password, so their `Debug` shows nothing.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) struct Hidden<T>(pub(crate) T);

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl<T> std::fmt::Debug for Hidden<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<connect options>")
    }
}
