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
use crate::pool::{PoolSettings, in_memory, sqlite_pool};
use crate::{Dialect, SqlOptions};

/// What SQLite keeps beside its pool.
#[derive(Debug)]
pub(crate) struct SqliteState {
    /// SQLite has one writer: this process's writes take turns here instead of meeting in
    /// SQLite's busy handler, which sleeps in steps of milliseconds (a worker's claim of the
    /// next batch and its ack flush of the last one run at the same time).
    writer: Mutex<()>,
    /// A file's writes go through one connection of their own (`None`: an in-memory database,
    /// whose one connection is the pool's): its page cache stays warm across the claim of one
    /// batch and the ack of the last, where two connections taking turns would each find the
    /// other's commit and drop their whole cache (measured: 0.82x -> 1.04-1.13x the raw loop).
    writes: Option<sqlx::SqlitePool>,
}

pub(crate) async fn connect(url: &str, o: &SqlOptions) -> Result<Messages<Sqlite>, sqlx::Error> {
    let settings = PoolSettings::from(o);
    let pool = sqlite_pool(url, &settings).await?;
    let writes = if in_memory(url) {
        None
    } else {
        let one = PoolSettings {
            max_connections: Some(1),
            min_connections: 0,
            ..settings
        };
        Some(sqlite_pool(url, &one).await?)
    };
    let state = SqliteState {
        writer: Mutex::new(()),
        writes,
    };
    Ok(Messages::new(pool, o, state))
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

    fn write_pool(m: &Messages<Self>) -> &sqlx::Pool<Self> {
        m.state.writes.as_ref().unwrap_or(&m.pool)
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

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::backend::Backend;

    fn row(n: usize) -> NewRow {
        NewRow {
            body: format!("{{\"n\":{n}}}"),
            headers: "{}".to_owned(),
            priority: 0,
            delay_ms: 0,
        }
    }

    /// A file's writes (inserts, claims, deletes, keepalives, all at once) share one connection
    /// of their own, apart from the pool readers use; every write still lands.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_files_writes_share_one_connection_of_their_own() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("w.db").display());
        let m = Arc::new(connect(&url, &SqlOptions::default()).await.unwrap());
        m.setup().await.unwrap();
        let writes = m.state.writes.as_ref().expect("a file has a writer pool");
        assert_eq!(writes.options().get_max_connections(), 1);
        let tasks: Vec<_> = (0..8)
            .map(|i| {
                let m = m.clone();
                tokio::spawn(async move {
                    m.insert(&(0..10).map(row).collect::<Vec<_>>())
                        .await
                        .unwrap();
                    let claimed = m.claim(5, 100 + i).await.unwrap();
                    let pairs: Vec<(i64, i64)> = claimed.iter().map(|r| (r.id, 100 + i)).collect();
                    m.keepalive_many(&pairs).await.unwrap();
                    m.delete(&pairs).await.unwrap()
                })
            })
            .collect();
        let mut deleted = 0;
        for t in tasks {
            deleted += t.await.unwrap();
        }
        assert_eq!(deleted, 40, "each of 8 claims of 5 deleted its own rows");
        assert_eq!(m.count().await.unwrap(), 40);
        assert!(
            writes.size() <= 1,
            "writes opened {} connections",
            writes.size()
        );
    }

    /// An in-memory database lives in its one connection: writes and reads share it.
    #[tokio::test]
    async fn an_in_memory_database_writes_on_its_one_pool() {
        let m = connect("sqlite::memory:", &SqlOptions::default())
            .await
            .unwrap();
        assert!(m.state.writes.is_none());
        m.setup().await.unwrap();
        m.insert(&[row(1)]).await.unwrap();
        assert_eq!(m.count().await.unwrap(), 1);
    }
}
