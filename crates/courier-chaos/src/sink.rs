//! The sink: a SQLite file (WAL, busy timeout) in the harness's temp dir, never killed, where the
//! workers record every handling of a `chaos.item` with the wall clock (one row per handling). The workers find it through the `CHAOS_SINK` environment variable.

use std::path::Path;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use courier_core::HandlerError;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use tokio::sync::OnceCell;

/// The environment variable naming the sink file for the workers.
pub const SINK_ENV: &str = "CHAOS_SINK";

const SCHEMA: [&str; 3] = [
    "CREATE TABLE IF NOT EXISTS chaos_log (id INTEGER NOT NULL, pid INTEGER NOT NULL, at_ms INTEGER NOT NULL)",
    "CREATE INDEX IF NOT EXISTS chaos_log_at ON chaos_log (at_ms)",
    // One row per finished handling of a `chaos.keyed` (see `keyed`), times in microseconds.
    "CREATE TABLE IF NOT EXISTS chaos_keyed (id INTEGER NOT NULL, tenant TEXT NOT NULL, \
     pid INTEGER NOT NULL, start_us INTEGER NOT NULL, end_us INTEGER NOT NULL)",
];

/// Milliseconds since the Unix epoch by the wall clock (the workers and the harness share it).
#[must_use]
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Opens (creating it when missing) the sink at `path` and creates its tables.
///
/// # Errors
/// The driver's error.
pub async fn open(path: &Path) -> Result<SqlitePool, sqlx::Error> {
    let options = SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(Duration::from_secs(30));
    let pool = SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await?;
    for statement in SCHEMA {
        sqlx::query(statement).execute(&pool).await?;
    }
    Ok(pool)
}

static POOL: OnceCell<SqlitePool> = OnceCell::const_new();

async fn pool() -> Result<&'static SqlitePool, String> {
    POOL.get_or_try_init(|| async {
        let path = std::env::var(SINK_ENV).map_err(|_| format!("{SINK_ENV} is not set"))?;
        open(Path::new(&path))
            .await
            .map_err(|e| format!("cannot open the sink {path}: {e}"))
    })
    .await
}

/// Runs one insert, retrying for up to a minute (the sink is shared by every worker).
pub(crate) async fn write<'q>(
    make: impl Fn() -> sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>>,
) -> Result<(), String> {
    let pool = pool().await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        match make().execute(pool).await {
            Ok(_) => return Ok(()),
            Err(e) if tokio::time::Instant::now() < deadline => {
                eprintln!("chaos sink: write failed, retrying: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(format!("chaos sink: write failed: {e}")),
        }
    }
}

/// The `chaos.item` handler's work: one row per handling. A sink that stays unwritable for a
/// minute fails the handling as recoverable (it is retried, never counted as handled).
///
/// # Errors
/// [`HandlerError`] (recoverable) when the sink cannot be written.
pub async fn record_handled(id: u64) -> Result<(), HandlerError> {
    let id = i64::try_from(id).map_err(|_| HandlerError::unrecoverable("id out of range"))?;
    let pid = i64::from(std::process::id());
    write(|| {
        sqlx::query("INSERT INTO chaos_log (id, pid, at_ms) VALUES (?, ?, ?)")
            .bind(id)
            .bind(pid)
            .bind(now_ms())
    })
    .await
    .map_err(|e| HandlerError::recoverable(e, None))
}
