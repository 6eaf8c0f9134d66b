//! SQLite: WAL, a busy timeout, the file created on first use. A claim is one
//! `UPDATE ... WHERE id IN (SELECT ... LIMIT n) RETURNING ...`: an autocommit write statement
//! takes the write lock up front (waiting up to the busy timeout), so several processes can share
//! one file and never claim the same row twice. What is SQLite's own: the writes of this process
//! take turns, and inserts read the ids from the last rowid.

use std::fmt::Write as _;

use async_trait::async_trait;
use sqlx::{Sqlite, SqliteConnection};
use tokio::sync::Mutex;

use crate::backend::NewRow;
use crate::messages::{CHUNK, MessageDialect, Messages, bind_row};
use crate::pool::{PoolSettings, sqlite_pool};
use crate::{Dialect, SqlOptions};

/// What SQLite keeps beside its pool.
#[derive(Debug, Default)]
pub(crate) struct SqliteState {
    /// SQLite has one writer: this process's writes take turns here instead of meeting in
    /// SQLite's busy handler, which sleeps in steps of milliseconds (a worker's claim of the
    /// next batch and its ack flush of the last one run at the same time).
    writer: Mutex<()>,
}

pub(crate) async fn connect(url: &str, o: &SqlOptions) -> Result<Messages<Sqlite>, sqlx::Error> {
    let pool = sqlite_pool(url, &PoolSettings::from(o)).await?;
    Ok(Messages::new(pool, o, SqliteState::default()))
}

/// A multi-row INSERT. When every row shares its priority and delay (the usual batch), the
/// queue, priority and delay are bound once (`?1`-`?3`) and each row binds only its body and
/// headers; otherwise each row binds all five.
fn insert_sql(table: &str, rows: usize, shared: bool) -> String {
    let now = Dialect::Sqlite.now_ms_sql();
    let mut values = String::with_capacity(rows * 48);
    for i in 0..rows {
        if i > 0 {
            values.push_str(", ");
        }
        if shared {
            let (b, h) = (4 + 2 * i, 5 + 2 * i);
            let _ = write!(values, "(?1, ?{b}, ?{h}, ?2, {now}, {now} + ?3)");
        } else {
            let _ = write!(values, "(?, ?, ?, ?, {now}, {now} + ?)");
        }
    }
    format!(
        "INSERT INTO {table} (queue_name, body, headers, priority, created_at, available_at) VALUES {values}"
    )
}

#[async_trait]
impl MessageDialect for Sqlite {
    type State = SqliteState;

    fn writer(state: &SqliteState) -> Option<&Mutex<()>> {
        Some(&state.writer)
    }

    async fn insert(
        m: &Messages<Self>,
        conn: &mut SqliteConnection,
        rows: &[NewRow],
    ) -> Result<Vec<i64>, sqlx::Error> {
        // One statement is atomic by itself; several go in one transaction (a savepoint inside
        // the caller's).
        if rows.len() <= CHUNK {
            return insert_chunks(m, conn, rows).await;
        }
        let mut tx = sqlx::Connection::begin(&mut *conn).await?;
        let ids = insert_chunks(m, &mut tx, rows).await?;
        tx.commit().await?;
        Ok(ids)
    }
}

/// Inserts `rows` in statements of [`CHUNK`] rows on `conn`; returns their ids in order.
async fn insert_chunks(
    m: &Messages<Sqlite>,
    conn: &mut SqliteConnection,
    rows: &[NewRow],
) -> Result<Vec<i64>, sqlx::Error> {
    let mut ids = Vec::with_capacity(rows.len());
    for chunk in rows.chunks(CHUNK) {
        let Some(first) = chunk.first() else {
            continue;
        };
        let shared = chunk
            .iter()
            .all(|r| r.priority == first.priority && r.delay_ms == first.delay_ms);
        let sql = insert_sql(&m.table, chunk.len(), shared);
        let mut q = sqlx::query(&sql);
        if shared {
            q = q.bind(&m.queue).bind(first.priority).bind(first.delay_ms);
            for r in chunk {
                q = q.bind(&r.body).bind(&r.headers);
            }
        } else {
            for r in chunk {
                q = bind_row(q, &m.queue, r);
            }
        }
        let done = q.execute(&mut *conn).await?;
        // Under the write lock, AUTOINCREMENT gives the rows of one statement consecutive
        // ids (each is the largest id ever used plus one), ending at the last one. Another
        // row count is a protocol error, which is never retried (a retry could insert the
        // rows twice); a transaction rolls back when dropped.
        if done.rows_affected() != chunk.len() as u64 {
            return Err(sqlx::Error::Protocol(format!(
                "inserted {} rows for {} messages",
                done.rows_affected(),
                chunk.len()
            )));
        }
        let last = done.last_insert_rowid();
        let n = i64::try_from(chunk.len()).unwrap_or(i64::MAX);
        ids.extend(last - n + 1..=last);
    }
    Ok(ids)
}
