//! MySQL 8 / MariaDB 10.6+: a claim is `SELECT ... FOR UPDATE SKIP LOCKED` then one `UPDATE`
//! in a short READ COMMITTED transaction (no gap locks, so claims, inserts and deletes do not
//! deadlock each other; a deadlock that still happens is retried). Sessions run in UTC so
//! `UNIX_TIMESTAMP(NOW(3))` is unambiguous. sqlx connects with `CLIENT_FOUND_ROWS`, so affected
//! rows count rows matched. MariaDB inserts with `RETURNING id`; MySQL (no `RETURNING`) inserts
//! row by row in one transaction, reading `LAST_INSERT_ID()`.

use std::collections::BTreeSet;
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlPool, MySqlPoolOptions};
use sqlx::{Executor, Row};

use crate::SqlOptions;
use crate::backend::{
    Backend, EXPLAIN_WITHIN, Hidden, NewRow, StoredRow, explain_with, grouped_delete, probe,
    sort_claimed,
};

/// The migration, the source of truth for the schema.
const MIGRATION: &str = include_str!("../migrations/mysql/0001_courier_messages.sql");

/// Epoch milliseconds from the server clock.
const NOW: &str = "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)";

/// Rows per statement in batch inserts and deletes.
const CHUNK: usize = 500;

#[derive(Debug)]
pub(crate) struct MySqlBackend {
    pool: MySqlPool,
    /// How connections open, for [`Backend::explain`].
    connect: Hidden<MySqlConnectOptions>,
    table: String,
    queue: String,
    redeliver_ms: i64,
    mariadb: bool,
    connection_ids: Arc<Mutex<BTreeSet<u64>>>,
    select_claim_sql: String,
    next_due_sql: String,
    keepalive_sql: String,
    reschedule_sql: String,
    list_sql: String,
    find_sql: String,
    delete_id_sql: String,
    count_sql: String,
}

impl MySqlBackend {
    pub(crate) async fn connect(url: &str, o: &SqlOptions) -> Result<Self, sqlx::Error> {
        let connect = MySqlConnectOptions::from_str(url)?;
        probe::<MySqlConnection>(&connect, o.acquire_timeout).await?;
        let connection_ids: Arc<Mutex<BTreeSet<u64>>> = Arc::default();
        let ids = connection_ids.clone();
        let pool = MySqlPoolOptions::new()
            // No ping per acquire: a dead connection fails the statement, which is retried.
            .test_before_acquire(false)
            .max_connections(o.max_connections.unwrap_or(10))
            .min_connections(o.min_connections)
            .acquire_timeout(o.acquire_timeout)
            .after_connect(move |conn, _meta| {
                let ids = ids.clone();
                Box::pin(async move {
                    conn.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                        .await?;
                    conn.execute("SET time_zone = '+00:00'").await?;
                    let id: u64 = sqlx::query_scalar("SELECT CONNECTION_ID()")
                        .fetch_one(&mut *conn)
                        .await?;
                    ids.lock().unwrap_or_else(|e| e.into_inner()).insert(id);
                    Ok(())
                })
            })
            .connect_with(connect.clone())
            .await?;
        let version: String = sqlx::query_scalar("SELECT VERSION()")
            .fetch_one(&pool)
            .await?;
        let t = &o.table_name;
        let cols = "id, body, headers, priority, available_at";
        Ok(Self {
            pool,
            connect: Hidden(connect),
            table: t.clone(),
            queue: o.queue_name.clone(),
            redeliver_ms: i64::try_from(o.redeliver_timeout.as_millis()).unwrap_or(i64::MAX),
            mariadb: version.to_ascii_lowercase().contains("mariadb"),
            connection_ids,
            select_claim_sql: format!(
                "SELECT {cols} FROM {t} WHERE queue_name = ? AND available_at <= {NOW} \
                 AND (delivered_at IS NULL OR delivered_at < {NOW} - ?) \
                 ORDER BY priority DESC, available_at, id LIMIT ? FOR UPDATE SKIP LOCKED"
            ),
            next_due_sql: format!(
                "SELECT CAST(MIN(CASE WHEN delivered_at IS NULL THEN available_at \
                 ELSE GREATEST(available_at, delivered_at + ?) END) - {NOW} AS SIGNED) \
                 FROM {t} WHERE queue_name = ?"
            ),
            keepalive_sql: format!(
                "UPDATE {t} SET delivered_at = {NOW} WHERE id = ? AND delivery_id = ?"
            ),
            reschedule_sql: format!(
                "UPDATE {t} SET headers = ?, priority = ?, available_at = {NOW} + ?, \
                 delivered_at = NULL, delivery_id = NULL WHERE id = ? AND delivery_id = ?"
            ),
            list_sql: format!("SELECT {cols} FROM {t} WHERE queue_name = ? ORDER BY id LIMIT ?"),
            find_sql: format!("SELECT {cols} FROM {t} WHERE queue_name = ? AND id = ?"),
            delete_id_sql: format!("DELETE FROM {t} WHERE queue_name = ? AND id = ?"),
            count_sql: format!("SELECT COUNT(*) FROM {t} WHERE queue_name = ?"),
        })
    }

    fn insert_sql(&self, rows: usize, returning: bool) -> String {
        let values = vec![format!("(?, ?, ?, ?, {NOW}, {NOW} + ?)"); rows].join(", ");
        format!(
            "INSERT INTO {} (queue_name, body, headers, priority, created_at, available_at) VALUES {values}{}",
            self.table,
            if returning { " RETURNING id" } else { "" }
        )
    }
}

#[async_trait]
impl Backend for MySqlBackend {
    async fn explain(&self, e: sqlx::Error) -> sqlx::Error {
        explain_with::<MySqlConnection>(&self.connect.0, EXPLAIN_WITHIN, e).await
    }

    async fn setup(&self) -> Result<(), sqlx::Error> {
        let ddl = MIGRATION.replace(crate::options::DEFAULT_TABLE, &self.table);
        sqlx::raw_sql(&ddl).execute(&self.pool).await?;
        Ok(())
    }

    async fn insert(&self, rows: &[NewRow]) -> Result<Vec<i64>, sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        let mut ids = Vec::with_capacity(rows.len());
        if self.mariadb {
            for chunk in rows.chunks(CHUNK) {
                let sql = self.insert_sql(chunk.len(), true);
                let mut q = sqlx::query_scalar::<_, i64>(&sql);
                for r in chunk {
                    q = q
                        .bind(&self.queue)
                        .bind(&r.body)
                        .bind(&r.headers)
                        .bind(r.priority)
                        .bind(r.delay_ms);
                }
                let mut got = q.fetch_all(&mut *tx).await?;
                got.sort_unstable();
                ids.extend(got);
            }
        } else {
            let sql = self.insert_sql(1, false);
            for r in rows {
                let done = sqlx::query(&sql)
                    .bind(&self.queue)
                    .bind(&r.body)
                    .bind(&r.headers)
                    .bind(r.priority)
                    .bind(r.delay_ms)
                    .execute(&mut *tx)
                    .await?;
                ids.push(i64::try_from(done.last_insert_id()).unwrap_or(i64::MAX));
            }
        }
        tx.commit().await?;
        Ok(ids)
    }

    async fn claim(&self, max: usize, delivery_id: i64) -> Result<Vec<StoredRow>, sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        let mut rows: Vec<StoredRow> = sqlx::query_as(&self.select_claim_sql)
            .bind(&self.queue)
            .bind(self.redeliver_ms)
            .bind(i64::try_from(max).unwrap_or(i64::MAX))
            .fetch_all(&mut *tx)
            .await?;
        if rows.is_empty() {
            tx.rollback().await?;
            return Ok(rows);
        }
        let sql = format!(
            "UPDATE {} SET delivered_at = {NOW}, delivery_id = ? WHERE id IN ({})",
            self.table,
            vec!["?"; rows.len()].join(", ")
        );
        let mut q = sqlx::query(&sql).bind(delivery_id);
        for r in &rows {
            q = q.bind(r.id);
        }
        q.execute(&mut *tx).await?;
        tx.commit().await?;
        sort_claimed(&mut rows);
        Ok(rows)
    }

    async fn next_due_in(&self) -> Result<Option<i64>, sqlx::Error> {
        let row = sqlx::query(&self.next_due_sql)
            .bind(self.redeliver_ms)
            .bind(&self.queue)
            .fetch_one(&self.pool)
            .await?;
        row.try_get(0)
    }

    async fn delete(&self, deliveries: &[(i64, i64)]) -> Result<u64, sqlx::Error> {
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
        Ok(sqlx::query(&self.delete_id_sql)
            .bind(&self.queue)
            .bind(id)
            .execute(&self.pool)
            .await?
            .rows_affected())
    }

    async fn keepalive(&self, id: i64, delivery_id: i64) -> Result<u64, sqlx::Error> {
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
        Ok(sqlx::query(&self.reschedule_sql)
            .bind(&row.headers)
            .bind(row.priority)
            .bind(row.delay_ms)
            .bind(id)
            .bind(delivery_id)
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

    fn connection_ids(&self) -> Vec<u64> {
        self.connection_ids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .copied()
            .collect()
    }
}
