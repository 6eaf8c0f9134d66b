//! SQLite: the transport's statements on a pool of its own.

use std::str::FromStr;
use std::time::Duration;

use courier_core::Dsn;
use sqlx::Row;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use super::{Driver, OnHandled, decode};
use crate::error::{RawError, RawResult};

const NOW: &str = "(CAST(strftime('%s', 'now') AS INTEGER) * 1000 + CAST(substr(strftime('%f', 'now'), 4) AS INTEGER))";
const HEADERS: &str = r#"{"content-type":"application/json","type":"courier.bench"}"#;

/// The raw driver on a SQLite table: Courier's own layout, or Symfony's Doctrine table
/// (`symfony_sqlite.rs` makes its statements).
pub(super) struct Raw {
    pub(super) pool: SqlitePool,
    pub(super) queue: String,
    pub(super) table: String,
    /// The batch insert per batch size (1 to the fetch size).
    pub(super) insert: Vec<String>,
    pub(super) claim: String,
    /// Symfony's layout: its own binds, no delivery id.
    pub(super) symfony: Option<&'static str>,
}

pub(super) fn err(e: sqlx::Error) -> RawError {
    RawError::failed(format!("raw sqlite benchmark: {e}"))
}

impl Raw {
    pub(super) async fn connect(dsn: &Dsn, fetch_size: usize) -> RawResult<Self> {
        let pool = pool(dsn.expose_without_query(), err).await?;
        let table = dsn.option("table_name").unwrap_or("courier_messages");
        let insert = (1..=fetch_size)
            .map(|n| {
                let values = vec![format!("(?, ?, ?, 0, {NOW}, {NOW})"); n].join(", ");
                format!(
                    "INSERT INTO {table} (queue_name, body, headers, priority, created_at, available_at) \
                     VALUES {values} RETURNING id"
                )
            })
            .collect();
        let claim = format!(
            "UPDATE {table} SET delivered_at = {NOW}, delivery_id = ?1 WHERE id IN (\
             SELECT id FROM {table} WHERE queue_name = ?2 AND available_at <= {NOW} \
             AND (delivered_at IS NULL OR delivered_at < {NOW} - 3600000) \
             ORDER BY priority DESC, available_at, id LIMIT ?3) \
             RETURNING id, body, headers, priority, available_at"
        );
        let queue = format!("bench_raw_{}", fastrand::u32(..));
        Ok(Self {
            pool,
            queue,
            table: table.to_owned(),
            insert,
            claim,
            symfony: None,
        })
    }
}

#[courier_core::async_trait]
impl Driver for Raw {
    async fn send(&self, bodies: &[String]) -> RawResult {
        let mut q = sqlx::query(&self.insert[bodies.len() - 1]);
        for body in bodies {
            q = match self.symfony {
                Some(headers) => q.bind(body).bind(headers).bind(&self.queue),
                None => q.bind(&self.queue).bind(body).bind(HEADERS),
            };
        }
        q.fetch_all(&self.pool).await.map_err(err)?;
        Ok(())
    }

    async fn consume(&self, max: usize, on: OnHandled<'_>) -> RawResult<usize> {
        let max = i64::try_from(max).unwrap_or(i64::MAX);
        // Courier's layout claims under a delivery id, which the delete checks; Symfony's has
        // none (`delivered_at` alone is the lease).
        let delivery = self.symfony.is_none().then(|| i64::from(fastrand::u32(..)));
        let claim = sqlx::query(&self.claim);
        let claim = match delivery {
            Some(delivery) => claim.bind(delivery).bind(&self.queue).bind(max),
            None => claim.bind(&self.queue).bind(max),
        };
        let rows = claim.fetch_all(&self.pool).await.map_err(err)?;
        let (delete, what) = match delivery {
            Some(_) => ("delivery_id = ? AND", "sqlite"),
            None => ("", "symfony+sqlite"),
        };
        handle_and_delete(
            &self.pool,
            &rows,
            on,
            &format!("DELETE FROM {} WHERE {delete}", self.table),
            (delivery, what, err),
        )
        .await
    }
}

/// The pool of both SQLite drivers, as the transports open theirs: WAL, `synchronous=NORMAL`,
/// no ping per acquire.
pub(super) async fn pool(url: &str, err: fn(sqlx::Error) -> RawError) -> RawResult<SqlitePool> {
    let options = SqliteConnectOptions::from_str(url)
        .map_err(err)?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(Duration::from_secs(5));
    SqlitePoolOptions::new()
        .test_before_acquire(false)
        .max_connections(4)
        .connect_with(options)
        .await
        .map_err(err)
}

/// Hands each claimed row's body to `on`, then deletes the rows: `delete` is the statement up
/// to the id list (`DELETE FROM t WHERE delivery_id = ? AND`), `guard` its parameter, if any.
/// How many there were.
pub(super) async fn handle_and_delete(
    pool: &SqlitePool,
    rows: &[sqlx::sqlite::SqliteRow],
    on: OnHandled<'_>,
    delete: &str,
    (guard, what, err): (Option<i64>, &str, fn(sqlx::Error) -> RawError),
) -> RawResult<usize> {
    if rows.is_empty() {
        return Ok(0);
    }
    let mut ids = Vec::with_capacity(rows.len());
    for row in rows {
        let body: String = row.try_get("body").map_err(err)?;
        on(decode(body.as_bytes(), what)?);
        ids.push(row.try_get::<i64, _>("id").map_err(err)?);
    }
    let sql = format!("{delete} id IN ({})", vec!["?"; ids.len()].join(", "));
    let mut q = sqlx::query(&sql);
    if let Some(guard) = guard {
        q = q.bind(guard);
    }
    for id in &ids {
        q = q.bind(id);
    }
    q.execute(pool).await.map_err(err)?;
    Ok(ids.len())
}

/// The first idle wait of the latency floor's polling, doubled while the queue stays empty.
const FIRST_IDLE_BACKOFF: Duration = Duration::from_millis(5);
/// The longest idle wait (the transport's cap).
const MAX_IDLE_BACKOFF: Duration = Duration::from_millis(250);

/// The latency floor's consumer: the claim statement polled on the SQL transport's schedule
/// (5 ms, doubling up to 250 ms while empty, back to 5 ms after a hit).
pub(super) async fn poll(raw: std::sync::Arc<Raw>, fetch_size: usize, handled: super::Handled) {
    let mut backoff = FIRST_IDLE_BACKOFF;
    let on = move |seq: u64| {
        super::report_handled(&handled, seq);
    };
    loop {
        match raw.consume(fetch_size, &on).await {
            Ok(0) => {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_IDLE_BACKOFF);
            }
            Ok(_) => backoff = FIRST_IDLE_BACKOFF,
            Err(e) => {
                tracing::warn!(error = %e, "raw sqlite latency consumer failed");
                return;
            }
        }
    }
}
