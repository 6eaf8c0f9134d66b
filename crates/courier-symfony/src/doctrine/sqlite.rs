//! The SQLite parts of the Doctrine layout: the file written as Courier's own SQL transport
//! writes it, and the batch insert.

use courier_core::TransportError;

use super::rows::{insert_values, row_values};

/// The table as Doctrine DBAL lays it out on SQLite (PHP's three indexes are made after it).
pub(crate) const SQLITE_CREATE: &str = "CREATE TABLE IF NOT EXISTS {t} (id INTEGER PRIMARY KEY AUTOINCREMENT NOT NULL, \
     body CLOB NOT NULL, headers CLOB NOT NULL, queue_name VARCHAR(190) NOT NULL, \
     created_at DATETIME NOT NULL, available_at DATETIME NOT NULL, delivered_at DATETIME DEFAULT NULL)";

/// A SQLite file as Courier's own SQL transport writes it: a pool of two writer connections
/// whose commits never checkpoint, taking turns in this process, and the WAL checkpointed beside
/// them (a checkpoint inside a commit, SQLite's way, stopped the writer for its copy and fsyncs:
/// 13 % of a batch send's time).
#[derive(Debug, Clone)]
pub(crate) struct SqliteDb {
    /// The writes, and the listing's reads (an in-memory database: its one connection).
    pub(crate) pool: sqlx::SqlitePool,
    /// This process's writes of the file take turns here rather than in SQLite's busy handler.
    turn: std::sync::Arc<tokio::sync::Mutex<()>>,
    /// `None` in memory (no WAL).
    checkpoints: Option<std::sync::Arc<courier_sql::SqliteCheckpoints>>,
}

impl SqliteDb {
    /// Opens the database at `url` (a file, created when missing, or in memory).
    pub(crate) async fn connect(
        url: &str,
        config: impl Fn(String) -> TransportError,
        connection: impl Fn(sqlx::Error) -> TransportError,
    ) -> Result<Self, TransportError> {
        use std::str::FromStr;
        // As Courier's own SQL transport: WAL (PHP's PDO connections use it as they find it),
        // one fsync per checkpoint rather than per commit, a claim's rows crossing from the
        // connection's thread in one go, the writes and checkpoints of the type's doc.
        sqlx::sqlite::SqliteConnectOptions::from_str(url)
            .map_err(|e| config(format!("invalid SQLite URL: {e}")))?;
        let settings = courier_sql::PoolSettings {
            // The checkpoints' pool (a file), or the one connection (in memory).
            max_connections: Some(1),
            busy_timeout: std::time::Duration::from_secs(30),
            ..courier_sql::PoolSettings::default()
        };
        let pool = courier_sql::sqlite_pool(url, &settings)
            .await
            .map_err(&connection)?;
        let (writes, checkpoints) = courier_sql::sqlite_writes(url, &settings, &pool)
            .await
            .map_err(&connection)?;
        Ok(Self {
            turn: courier_sql::sqlite_write_turn(&pool),
            pool: writes.unwrap_or(pool),
            checkpoints: checkpoints.map(std::sync::Arc::new),
        })
    }

    /// Takes this process's write turn for one write, counted for the checkpoints.
    pub(crate) async fn write_turn(&self) -> tokio::sync::MutexGuard<'_, ()> {
        if let Some(c) = &self.checkpoints {
            c.wrote();
        }
        self.turn.lock().await
    }
}

/// SQLite's batch insert: one statement, the ids read from the last rowid
/// ([`courier_sql::sqlite_inserted_ids`]) rather than returned row by row (each returned row
/// crossed from the connection's thread on its own, a wake-up of the sending task each: 64 per
/// batch where this takes one).
pub(crate) async fn sqlite_insert_many(
    db: &SqliteDb,
    t: &str,
    rows: &[(String, String, String)],
    queue: &str,
    created: &str,
) -> Result<Vec<i64>, sqlx::Error> {
    let sql = insert_values(t, rows.len());
    let mut query = sqlx::query(&sql);
    for value in row_values(rows, queue, created) {
        query = query.bind(value);
    }
    let done = {
        let _turn = db.write_turn().await;
        query.execute(&db.pool).await?
    };
    Ok(courier_sql::sqlite_inserted_ids(&done, rows.len())?.collect())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use std::time::{Duration, Instant};

    use courier_core::TransportErrorKind;

    use super::*;

    async fn open(url: &str) -> SqliteDb {
        let db = SqliteDb::connect(
            url,
            |c| TransportError::new(TransportErrorKind::Config, "t").with_context(c),
            |e| TransportError::new(TransportErrorKind::Connection, "t").with_source(e),
        )
        .await
        .unwrap();
        sqlx::query(&SQLITE_CREATE.replace("{t}", "messenger_messages"))
            .execute(&db.pool)
            .await
            .unwrap();
        db
    }

    /// Sends `n` rows of 2 KB in batches of 100; checks each batch's ids are its rows', in order.
    async fn send(db: &SqliteDb, n: usize) {
        for start in (0..n).step_by(100) {
            let rows: Vec<(String, String, String)> = (start..n.min(start + 100))
                .map(|i| {
                    (
                        format!("{i}:{}", "x".repeat(2048)),
                        "[]".to_owned(),
                        "2026-01-01 00:00:00".to_owned(),
                    )
                })
                .collect();
            let ids = sqlite_insert_many(
                db,
                "messenger_messages",
                &rows,
                "default",
                "2026-01-01 00:00:00",
            )
            .await
            .unwrap();
            assert_eq!(ids.len(), rows.len());
            for (id, (body, ..)) in ids.iter().zip(&rows) {
                let stored: String =
                    sqlx::query_scalar("SELECT body FROM messenger_messages WHERE id = ?1")
                        .bind(id)
                        .fetch_one(&db.pool)
                        .await
                        .unwrap();
                assert_eq!(&stored, body, "row {id}");
            }
        }
    }

    /// A file's writers never checkpoint inside a commit (their connections say
    /// `wal_autocheckpoint = 0`), and the WAL still reaches the database file, beside them. Before,
    /// the transport's one connection checkpointed inside the commit that crossed 10,000 pages.
    #[tokio::test]
    async fn a_files_commits_leave_the_checkpoint_beside_them() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("d.db");
        let db = open(&format!("sqlite://{}", file.display())).await;
        let (mut a, mut b) = (
            db.pool.acquire().await.unwrap(),
            db.pool.acquire().await.unwrap(),
        );
        for conn in [&mut a, &mut b] {
            let every: i64 = sqlx::query_scalar("PRAGMA wal_autocheckpoint")
                .fetch_one(&mut **conn)
                .await
                .unwrap();
            assert_eq!(
                every, 0,
                "a writer's commit checkpoints every {every} pages"
            );
        }
        drop((a, b));
        send(&db, 3000).await;
        let deadline = Instant::now() + Duration::from_secs(10);
        let size = || std::fs::metadata(&file).map_or(0, |m| m.len());
        while size() < 4 << 20 {
            assert!(
                Instant::now() < deadline,
                "no checkpoint within 10 s: the file holds {} bytes",
                size()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// In memory: the one connection writes, and a batch's ids are its rows'.
    #[tokio::test]
    async fn an_in_memory_database_writes_on_its_one_connection() {
        let db = open("sqlite::memory:").await;
        assert!(db.checkpoints.is_none());
        send(&db, 250).await;
        let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM messenger_messages")
            .fetch_one(&db.pool)
            .await
            .unwrap();
        assert_eq!(count, 250);
    }
}
