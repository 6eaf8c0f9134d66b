//! SQLite: WAL, a busy timeout, the file created on first use. A claim is one
//! `UPDATE ... WHERE id IN (SELECT ... LIMIT n) RETURNING ...`: an autocommit write statement
//! takes the write lock up front (waiting up to the busy timeout), so several processes can share
//! one file and never claim the same row twice.

use std::fmt::Write as _;
use std::str::FromStr;

use async_trait::async_trait;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use crate::SqlOptions;
use crate::backend::{Backend, NewRow, StoredRow, grouped_delete, sort_claimed};

/// The migration, the source of truth for the schema.
const MIGRATION: &str = include_str!("../migrations/sqlite/0001_courier_messages.sql");

/// Epoch milliseconds from SQLite's clock (`'now'` is fixed for the duration of a statement).
const NOW: &str = "(CAST(strftime('%s', 'now') AS INTEGER) * 1000 + CAST(substr(strftime('%f', 'now'), 4) AS INTEGER))";

/// Rows per statement in batch inserts and deletes (well under SQLite's bound-parameter limit).
const CHUNK: usize = 500;

#[derive(Debug)]
pub(crate) struct SqliteBackend {
    pool: SqlitePool,
    /// SQLite has one writer: this process's writes take turns here instead of meeting in
    /// SQLite's busy handler, which sleeps in steps of milliseconds (a worker's claim of the
    /// next batch and its ack flush of the last one run at the same time).
    writer: tokio::sync::Mutex<()>,
    table: String,
    queue: String,
    redeliver_ms: i64,
    insert_one_sql: String,
    claim_sql: String,
    next_due_sql: String,
    keepalive_sql: String,
    reschedule_sql: String,
    list_sql: String,
    find_sql: String,
    delete_id_sql: String,
    count_sql: String,
}

impl SqliteBackend {
    pub(crate) async fn connect(url: &str, o: &SqlOptions) -> Result<Self, sqlx::Error> {
        let connect = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(o.busy_timeout);
        let in_memory = url.contains(":memory:") || url.contains("mode=memory");
        let mut pool = SqlitePoolOptions::new()
            .test_before_acquire(false)
            .acquire_timeout(o.acquire_timeout)
            .min_connections(o.min_connections);
        pool = if in_memory {
            // The database lives as long as one connection does: keep exactly one, forever.
            pool.max_connections(1)
                .min_connections(1)
                .idle_timeout(None)
                .max_lifetime(None)
        } else {
            pool.max_connections(o.max_connections.unwrap_or(4))
        };
        let pool = pool.connect_with(connect).await?;
        let t = &o.table_name;
        Ok(Self {
            pool,
            writer: tokio::sync::Mutex::new(()),
            table: t.clone(),
            queue: o.queue_name.clone(),
            redeliver_ms: i64::try_from(o.redeliver_timeout.as_millis()).unwrap_or(i64::MAX),
            insert_one_sql: format!(
                "INSERT INTO {t} (queue_name, body, headers, priority, created_at, available_at) \
                 VALUES (?, ?, ?, ?, {NOW}, {NOW} + ?)"
            ),
            claim_sql: format!(
                "UPDATE {t} SET delivered_at = {NOW}, delivery_id = ?1 WHERE id IN (\
                 SELECT id FROM {t} WHERE queue_name = ?2 AND available_at <= {NOW} \
                 AND (delivered_at IS NULL OR delivered_at < {NOW} - ?3) \
                 ORDER BY priority DESC, available_at, id LIMIT ?4) \
                 RETURNING id, body, headers, priority, available_at"
            ),
            next_due_sql: format!(
                "SELECT MIN(CASE WHEN delivered_at IS NULL THEN available_at \
                 ELSE MAX(available_at, delivered_at + ?2) END) - {NOW} FROM {t} WHERE queue_name = ?1"
            ),
            keepalive_sql: format!(
                "UPDATE {t} SET delivered_at = {NOW} WHERE id = ?1 AND delivery_id = ?2"
            ),
            reschedule_sql: format!(
                "UPDATE {t} SET headers = ?3, priority = ?4, available_at = {NOW} + ?5, \
                 delivered_at = NULL, delivery_id = NULL WHERE id = ?1 AND delivery_id = ?2"
            ),
            list_sql: format!(
                "SELECT id, body, headers, priority, available_at FROM {t} WHERE queue_name = ?1 ORDER BY id LIMIT ?2"
            ),
            find_sql: format!(
                "SELECT id, body, headers, priority, available_at FROM {t} WHERE queue_name = ?1 AND id = ?2"
            ),
            delete_id_sql: format!("DELETE FROM {t} WHERE queue_name = ?1 AND id = ?2"),
            count_sql: format!("SELECT COUNT(*) FROM {t} WHERE queue_name = ?1"),
        })
    }

    /// A multi-row INSERT. When every row shares its priority and delay (the usual batch), the
    /// queue, priority and delay are bound once (`?1`-`?3`) and each row binds only its body and
    /// headers; otherwise each row binds all five.
    fn insert_sql(&self, rows: usize, shared: bool) -> String {
        let mut values = String::with_capacity(rows * 48);
        for i in 0..rows {
            if i > 0 {
                values.push_str(", ");
            }
            if shared {
                let (b, h) = (4 + 2 * i, 5 + 2 * i);
                let _ = write!(values, "(?1, ?{b}, ?{h}, ?2, {NOW}, {NOW} + ?3)");
            } else {
                let _ = write!(values, "(?, ?, ?, ?, {NOW}, {NOW} + ?)");
            }
        }
        format!(
            "INSERT INTO {} (queue_name, body, headers, priority, created_at, available_at) VALUES {values}",
            self.table
        )
    }
}

#[async_trait]
impl Backend for SqliteBackend {
    async fn setup(&self) -> Result<(), sqlx::Error> {
        let ddl = MIGRATION.replace(crate::options::DEFAULT_TABLE, &self.table);
        sqlx::raw_sql(&ddl).execute(&self.pool).await?;
        Ok(())
    }

    async fn insert(&self, rows: &[NewRow]) -> Result<Vec<i64>, sqlx::Error> {
        let _writer = self.writer.lock().await;
        if let [r] = rows {
            // One row: no RETURNING round through the row stream, just the rowid.
            let done = sqlx::query(&self.insert_one_sql)
                .bind(&self.queue)
                .bind(&r.body)
                .bind(&r.headers)
                .bind(r.priority)
                .bind(r.delay_ms)
                .execute(&self.pool)
                .await?;
            return Ok(vec![done.last_insert_rowid()]);
        }
        let mut ids = Vec::with_capacity(rows.len());
        // One statement is atomic by itself; several go in one transaction.
        let mut tx = if rows.len() > CHUNK {
            Some(self.pool.begin().await?)
        } else {
            None
        };
        for chunk in rows.chunks(CHUNK) {
            let Some(first) = chunk.first() else {
                continue;
            };
            let shared = chunk
                .iter()
                .all(|r| r.priority == first.priority && r.delay_ms == first.delay_ms);
            let sql = self.insert_sql(chunk.len(), shared);
            let mut q = sqlx::query(&sql);
            if shared {
                q = q
                    .bind(&self.queue)
                    .bind(first.priority)
                    .bind(first.delay_ms);
                for r in chunk {
                    q = q.bind(&r.body).bind(&r.headers);
                }
            } else {
                for r in chunk {
                    q = q
                        .bind(&self.queue)
                        .bind(&r.body)
                        .bind(&r.headers)
                        .bind(r.priority)
                        .bind(r.delay_ms);
                }
            }
            let done = match tx.as_mut() {
                Some(tx) => q.execute(&mut **tx).await?,
                None => q.execute(&self.pool).await?,
            };
            // Under the write lock, AUTOINCREMENT gives the rows of one statement consecutive
            // ids (each is the largest id ever used plus one), ending at the last one.
            let last = done.last_insert_rowid();
            let n = i64::try_from(chunk.len()).unwrap_or(i64::MAX);
            if done.rows_affected() != chunk.len() as u64 {
                return Err(sqlx::Error::Protocol(format!(
                    "inserted {} rows for {} messages",
                    done.rows_affected(),
                    chunk.len()
                )));
            }
            ids.extend(last - n + 1..=last);
        }
        if let Some(tx) = tx {
            tx.commit().await?;
        }
        Ok(ids)
    }

    async fn claim(&self, max: usize, delivery_id: i64) -> Result<Vec<StoredRow>, sqlx::Error> {
        let _writer = self.writer.lock().await;
        let mut rows: Vec<StoredRow> = sqlx::query_as(&self.claim_sql)
            .bind(delivery_id)
            .bind(&self.queue)
            .bind(self.redeliver_ms)
            .bind(i64::try_from(max).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .await?;
        sort_claimed(&mut rows);
        Ok(rows)
    }

    async fn next_due_in(&self) -> Result<Option<i64>, sqlx::Error> {
        sqlx::query_scalar(&self.next_due_sql)
            .bind(&self.queue)
            .bind(self.redeliver_ms)
            .fetch_one(&self.pool)
            .await
    }

    async fn delete(&self, deliveries: &[(i64, i64)]) -> Result<u64, sqlx::Error> {
        let _writer = self.writer.lock().await;
        let mut deleted = 0;
        for chunk in deliveries.chunks(CHUNK) {
            let (sql, binds) = grouped_delete(&self.table, chunk);
            let mut q = sqlx::query(&sql);
            for b in binds {
                q = q.bind(b);
            }
            deleted += q.execute(&self.pool).await?.rows_affected();
        }
        Ok(deleted)
    }

    async fn delete_id(&self, id: i64) -> Result<u64, sqlx::Error> {
        let _writer = self.writer.lock().await;
        Ok(sqlx::query(&self.delete_id_sql)
            .bind(&self.queue)
            .bind(id)
            .execute(&self.pool)
            .await?
            .rows_affected())
    }

    async fn keepalive(&self, id: i64, delivery_id: i64) -> Result<u64, sqlx::Error> {
        let _writer = self.writer.lock().await;
        Ok(sqlx::query(&self.keepalive_sql)
            .bind(id)
            .bind(delivery_id)
            .execute(&self.pool)
            .await?
            .rows_affected())
    }

    async fn reschedule(
        &self,
        id: i64,
        delivery_id: i64,
        row: &NewRow,
    ) -> Result<u64, sqlx::Error> {
        let _writer = self.writer.lock().await;
        Ok(sqlx::query(&self.reschedule_sql)
            .bind(id)
            .bind(delivery_id)
            .bind(&row.headers)
            .bind(row.priority)
            .bind(row.delay_ms)
            .execute(&self.pool)
            .await?
            .rows_affected())
    }

    async fn list(&self, limit: usize) -> Result<Vec<StoredRow>, sqlx::Error> {
        sqlx::query_as(&self.list_sql)
            .bind(&self.queue)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .await
    }

    async fn find(&self, id: i64) -> Result<Option<StoredRow>, sqlx::Error> {
        sqlx::query_as(&self.find_sql)
            .bind(&self.queue)
            .bind(id)
            .fetch_optional(&self.pool)
            .await
    }

    async fn count(&self) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar(&self.count_sql)
            .bind(&self.queue)
            .fetch_one(&self.pool)
            .await
    }
}
