//! PostgreSQL: claims with `FOR UPDATE SKIP LOCKED` in one statement, batch writes through
//! `UNNEST` arrays (one prepared statement whatever the batch size), and `LISTEN`/`NOTIFY`
//! wake-ups: every insert and retry notifies the channel named after the table with the queue
//! name as payload, and a listener task per transport wakes the consumers of that queue.

use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgListener, PgPool, PgPoolOptions};
use tokio::task::JoinHandle;

use crate::SqlOptions;
use crate::backend::{
    Backend, EXPLAIN_WITHIN, Hidden, NewRow, StoredRow, Wake, explain_with, probe, sort_claimed,
};

/// The migration, the source of truth for the schema.
const MIGRATION: &str = include_str!("../migrations/postgres/0001_courier_messages.sql");

/// Epoch milliseconds from the server clock, fixed for the statement.
const NOW: &str = "(EXTRACT(EPOCH FROM statement_timestamp()) * 1000)::BIGINT";

#[derive(Debug)]
pub(crate) struct PgBackend {
    pool: PgPool,
    /// How connections open, for [`Backend::explain`].
    connect: Hidden<PgConnectOptions>,
    table: String,
    queue: String,
    redeliver_ms: i64,
    listener: Mutex<Option<JoinHandle<()>>>,
    insert_sql: String,
    claim_sql: String,
    next_due_sql: String,
    delete_one_sql: String,
    delete_sql: String,
    /// The common case: every delivery of one claim shares its delivery id.
    delete_same_sql: String,
    keepalive_sql: String,
    reschedule_sql: String,
    list_sql: String,
    find_sql: String,
    delete_id_sql: String,
    count_sql: String,
}

impl PgBackend {
    pub(crate) async fn connect(url: &str, o: &SqlOptions) -> Result<Self, sqlx::Error> {
        let connect = PgConnectOptions::from_str(url)?;
        probe::<PgConnection>(&connect, o.acquire_timeout).await?;
        let pool = PgPoolOptions::new()
            // No ping per acquire: a dead connection fails the statement, which is retried.
            .test_before_acquire(false)
            .max_connections(o.max_connections.unwrap_or(10))
            .min_connections(o.min_connections)
            .acquire_timeout(o.acquire_timeout)
            .connect_with(connect.clone())
            .await?;
        let t = &o.table_name;
        let cols = "id, body, headers, priority, available_at";
        Ok(Self {
            pool,
            connect: Hidden(connect),
            table: t.clone(),
            queue: o.queue_name.clone(),
            redeliver_ms: i64::try_from(o.redeliver_timeout.as_millis()).unwrap_or(i64::MAX),
            listener: Mutex::new(None),
            insert_sql: format!(
                "WITH ins AS (\
                 INSERT INTO {t} (queue_name, body, headers, priority, created_at, available_at) \
                 SELECT $1, x.body, x.headers, x.priority, {NOW}, {NOW} + x.delay \
                 FROM UNNEST($2::TEXT[], $3::TEXT[], $4::INT2[], $5::INT8[]) WITH ORDINALITY \
                 AS x(body, headers, priority, delay, ord) ORDER BY x.ord RETURNING id), \
                 wake AS (SELECT pg_notify($6, $1)) \
                 SELECT array_agg(ins.id ORDER BY ins.id) FROM ins CROSS JOIN wake"
            ),
            claim_sql: format!(
                "WITH picked AS (\
                 SELECT id FROM {t} WHERE queue_name = $1 AND available_at <= {NOW} \
                 AND (delivered_at IS NULL OR delivered_at < {NOW} - $2) \
                 ORDER BY priority DESC, available_at, id LIMIT $3 FOR UPDATE SKIP LOCKED) \
                 UPDATE {t} SET delivered_at = {NOW}, delivery_id = $4 FROM picked WHERE {t}.id = picked.id \
                 RETURNING {t}.id, {t}.body, {t}.headers, {t}.priority, {t}.available_at"
            ),
            next_due_sql: format!(
                "SELECT MIN(CASE WHEN delivered_at IS NULL THEN available_at \
                 ELSE GREATEST(available_at, delivered_at + $2) END) - {NOW} FROM {t} WHERE queue_name = $1"
            ),
            delete_one_sql: format!("DELETE FROM {t} WHERE id = $1 AND delivery_id = $2"),
            delete_sql: format!(
                "DELETE FROM {t} WHERE (id, delivery_id) IN (SELECT * FROM UNNEST($1::INT8[], $2::INT8[]))"
            ),
            delete_same_sql: format!("DELETE FROM {t} WHERE id = ANY($1) AND delivery_id = $2"),
            keepalive_sql: format!(
                "UPDATE {t} SET delivered_at = {NOW} WHERE id = $1 AND delivery_id = $2"
            ),
            reschedule_sql: format!(
                "WITH upd AS (\
                 UPDATE {t} SET headers = $3, priority = $4, available_at = {NOW} + $5, \
                 delivered_at = NULL, delivery_id = NULL WHERE id = $1 AND delivery_id = $2 RETURNING id), \
                 wake AS (SELECT pg_notify($6, $7)) \
                 SELECT COUNT(*) FROM upd CROSS JOIN wake"
            ),
            list_sql: format!("SELECT {cols} FROM {t} WHERE queue_name = $1 ORDER BY id LIMIT $2"),
            find_sql: format!("SELECT {cols} FROM {t} WHERE queue_name = $1 AND id = $2"),
            delete_id_sql: format!("DELETE FROM {t} WHERE queue_name = $1 AND id = $2"),
            count_sql: format!("SELECT COUNT(*) FROM {t} WHERE queue_name = $1"),
        })
    }
}

impl Drop for PgBackend {
    fn drop(&mut self) {
        if let Some(task) = self
            .listener
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            task.abort();
        }
    }
}

/// Keeps a `LISTEN` on `channel` alive, bumping `wake` for each notification about `queue`
/// (and once after every (re)connect, since notifications may have been missed meanwhile).
/// While it is down, `wake.listening` is false and consumers poll.
async fn listen(pool: PgPool, channel: String, queue: String, wake: Arc<Wake>) {
    let mut backoff = Duration::from_millis(50);
    loop {
        let connected = async {
            let mut listener = PgListener::connect_with(&pool).await?;
            listener.listen(&channel).await?;
            Ok::<_, sqlx::Error>(listener)
        }
        .await;
        let mut listener = match connected {
            Ok(l) => l,
            Err(e) => {
                wake.set_listening(false);
                tracing::debug!(error = %e, "LISTEN failed; consumers poll until it is back");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        backoff = Duration::from_millis(50);
        wake.set_listening(true);
        wake.bump();
        loop {
            match listener.try_recv().await {
                Ok(Some(n)) if n.payload() == queue => wake.bump(),
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => {
                    // The connection dropped: notifications may be lost, so poll until relistening.
                    wake.set_listening(false);
                    wake.bump();
                    tracing::debug!("LISTEN connection lost; reconnecting");
                    break;
                }
            }
        }
    }
}

#[async_trait]
impl Backend for PgBackend {
    async fn explain(&self, e: sqlx::Error) -> sqlx::Error {
        explain_with::<PgConnection>(&self.connect.0, EXPLAIN_WITHIN, e).await
    }

    async fn setup(&self) -> Result<(), sqlx::Error> {
        // Concurrent setups of one table would race in CREATE ... IF NOT EXISTS: serialise them
        // with a transaction-scoped advisory lock. One DO block is one implicit transaction, so
        // a failure rolls back and never leaves a pooled connection inside a transaction. (The
        // table name is a validated identifier.)
        let ddl = format!(
            "DO $courier$ BEGIN PERFORM pg_advisory_xact_lock(hashtext('{}')); {} END $courier$",
            self.table,
            MIGRATION.replace(crate::options::DEFAULT_TABLE, &self.table)
        );
        sqlx::raw_sql(&ddl).execute(&self.pool).await?;
        Ok(())
    }

    async fn insert(&self, rows: &[NewRow]) -> Result<Vec<i64>, sqlx::Error> {
        let bodies: Vec<&str> = rows.iter().map(|r| r.body.as_str()).collect();
        let headers: Vec<&str> = rows.iter().map(|r| r.headers.as_str()).collect();
        let priorities: Vec<i16> = rows.iter().map(|r| r.priority).collect();
        let delays: Vec<i64> = rows.iter().map(|r| r.delay_ms).collect();
        // One row back, the ids as one array, rather than a row per message.
        let ids: Option<Vec<i64>> = sqlx::query_scalar(&self.insert_sql)
            .bind(&self.queue)
            .bind(bodies)
            .bind(headers)
            .bind(priorities)
            .bind(delays)
            .bind(&self.table)
            .fetch_one(&self.pool)
            .await?;
        // Ids come from one sequence in insertion order.
        Ok(ids.unwrap_or_default())
    }

    async fn claim(&self, max: usize, delivery_id: i64) -> Result<Vec<StoredRow>, sqlx::Error> {
        let mut rows: Vec<StoredRow> = sqlx::query_as(&self.claim_sql)
            .bind(&self.queue)
            .bind(self.redeliver_ms)
            .bind(i64::try_from(max).unwrap_or(i64::MAX))
            .bind(delivery_id)
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

    async fn delete_one(&self, id: i64, delivery_id: i64) -> Result<u64, sqlx::Error> {
        Ok(sqlx::query(&self.delete_one_sql)
            .bind(id)
            .bind(delivery_id)
            .execute(&self.pool)
            .await?
            .rows_affected())
    }

    async fn delete(&self, deliveries: &[(i64, i64)]) -> Result<u64, sqlx::Error> {
        let ids: Vec<i64> = deliveries.iter().map(|d| d.0).collect();
        if let Some(&(_, tag)) = deliveries.first()
            && deliveries.iter().all(|d| d.1 == tag)
        {
            return Ok(sqlx::query(&self.delete_same_sql)
                .bind(ids)
                .bind(tag)
                .execute(&self.pool)
                .await?
                .rows_affected());
        }
        let tags: Vec<i64> = deliveries.iter().map(|d| d.1).collect();
        Ok(sqlx::query(&self.delete_sql)
            .bind(ids)
            .bind(tags)
            .execute(&self.pool)
            .await?
            .rows_affected())
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
        let n: i64 = sqlx::query_scalar(&self.reschedule_sql)
            .bind(id)
            .bind(delivery_id)
            .bind(&row.headers)
            .bind(row.priority)
            .bind(row.delay_ms)
            .bind(&self.table)
            .bind(&self.queue)
            .fetch_one(&self.pool)
            .await?;
        Ok(u64::try_from(n).unwrap_or(0))
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

    fn start_listener(&self, wake: &Arc<Wake>) {
        let mut task = self.listener.lock().unwrap_or_else(|e| e.into_inner());
        if task.as_ref().is_none_or(JoinHandle::is_finished) {
            let span = tracing::debug_span!("courier.sql.listen", messaging.destination.name = %self.queue);
            *task = Some(tokio::spawn(tracing::Instrument::instrument(
                listen(
                    self.pool.clone(),
                    self.table.clone(),
                    self.queue.clone(),
                    wake.clone(),
                ),
                span,
            )));
        }
    }
}
