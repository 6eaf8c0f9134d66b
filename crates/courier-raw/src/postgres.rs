//! PostgreSQL: the transport's statements on a pool of its own.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use courier_core::Dsn;
use sqlx::Row;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use tokio::task::JoinHandle;

use super::{Driver, OnHandled, decode};
use crate::error::{RawError, RawResult};

const NOW: &str = "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT";
const HEADERS: &str = r#"{"content-type":"application/json","type":"courier.bench"}"#;

pub(super) struct Raw {
    pool: PgPool,
    queue: String,
    /// The channel every insert notifies (the latency floor), like the transport's `pg_notify`.
    notify: Option<String>,
    insert: String,
    claim: String,
    delete: String,
}

fn err(e: sqlx::Error) -> RawError {
    RawError::failed(format!("raw postgres benchmark: {e}"))
}

impl Raw {
    /// A pool of its own on `dsn`'s table, a queue of its own; with `notify`, every insert
    /// also notifies that channel in the same statement.
    pub(super) async fn connect(dsn: &Dsn, notify: Option<String>) -> RawResult<Self> {
        let options = PgConnectOptions::from_str(dsn.expose_without_query()).map_err(err)?;
        // No ping per acquire, like the transport's pool (a ping is a round trip per statement).
        let pool = PgPoolOptions::new()
            .test_before_acquire(false)
            .max_connections(4)
            .connect_with(options)
            .await
            .map_err(err)?;
        let t = dsn.option("table_name").unwrap_or("courier_messages");
        Ok(Self {
            pool,
            queue: format!("bench_raw_{}", fastrand::u32(..)),
            insert: if notify.is_some() {
                format!(
                    "WITH ins AS (INSERT INTO {t} (queue_name, body, headers, priority, created_at, available_at) \
                     SELECT $1, x.body, $3, 0, {NOW}, {NOW} FROM UNNEST($2::TEXT[]) WITH ORDINALITY AS x(body, ord) \
                     ORDER BY x.ord RETURNING id), wake AS (SELECT pg_notify($4, $1)) \
                     SELECT array_agg(ins.id ORDER BY ins.id) FROM ins CROSS JOIN wake"
                )
            } else {
                format!(
                    "INSERT INTO {t} (queue_name, body, headers, priority, created_at, available_at) \
                     SELECT $1, x.body, $3, 0, {NOW}, {NOW} FROM UNNEST($2::TEXT[]) WITH ORDINALITY AS x(body, ord) \
                     ORDER BY x.ord RETURNING id"
                )
            },
            notify,
            claim: format!(
                "WITH picked AS (SELECT id FROM {t} WHERE queue_name = $1 AND available_at <= {NOW} \
                 AND (delivered_at IS NULL OR delivered_at < {NOW} - 3600000) \
                 ORDER BY priority DESC, available_at, id LIMIT $2 FOR UPDATE SKIP LOCKED) \
                 UPDATE {t} SET delivered_at = {NOW}, delivery_id = $3 FROM picked WHERE {t}.id = picked.id \
                 RETURNING {t}.id, {t}.body, {t}.headers, {t}.priority, {t}.available_at"
            ),
            delete: format!("DELETE FROM {t} WHERE id = ANY($1) AND delivery_id = $2"),
        })
    }
}

impl Raw {
    /// A queue of its own on `dsn` holding `messages` bodies, then the table `VACUUM ANALYZE`d:
    /// as a relay's planner sees it at best, analyzed, without earlier dead rows.
    async fn filled(dsn: &Dsn, messages: u64, body: &str) -> RawResult<Self> {
        let raw = Self::connect(dsn, None).await?;
        let t = dsn.option("table_name").unwrap_or("courier_messages");
        let bodies: Vec<String> = (0..500).map(|_| body.to_owned()).collect();
        let mut stored = 0;
        while stored < messages {
            let n = usize::try_from((messages - stored).min(500)).unwrap_or(500);
            raw.send(&bodies[..n]).await?;
            stored += n as u64;
        }
        sqlx::query(&format!("VACUUM ANALYZE {t}"))
            .execute(&raw.pool)
            .await
            .map_err(err)?;
        Ok(raw)
    }
}

#[courier_core::async_trait]
impl Driver for Raw {
    async fn send(&self, bodies: &[String]) -> RawResult {
        let mut q = sqlx::query(&self.insert)
            .bind(&self.queue)
            .bind(bodies)
            .bind(HEADERS);
        if let Some(channel) = &self.notify {
            q = q.bind(channel);
        }
        q.fetch_all(&self.pool).await.map_err(err)?;
        Ok(())
    }

    async fn consume(&self, max: usize, on: OnHandled<'_>) -> RawResult<usize> {
        let delivery = i64::from(fastrand::u32(..));
        let rows = sqlx::query(&self.claim)
            .bind(&self.queue)
            .bind(i64::try_from(max).unwrap_or(i64::MAX))
            .bind(delivery)
            .fetch_all(&self.pool)
            .await
            .map_err(err)?;
        let mut ids = Vec::with_capacity(rows.len());
        for row in &rows {
            let body: String = row.try_get("body").map_err(err)?;
            on(decode(body.as_bytes(), "postgres")?);
            ids.push(row.try_get::<i64, _>("id").map_err(err)?);
        }
        if !ids.is_empty() {
            sqlx::query(&self.delete)
                .bind(&ids)
                .bind(delivery)
                .execute(&self.pool)
                .await
                .map_err(err)?;
        }
        Ok(ids.len())
    }
}

/// The latency floor's consumer: `LISTEN` on a connection of its own; the claim statement runs
/// at each notification, or after 1 s without one (the transport's poll window).
pub(super) async fn listen(
    raw: Arc<Raw>,
    channel: String,
    fetch_size: usize,
    handled: super::Handled,
) -> RawResult<JoinHandle<()>> {
    let mut listener = PgListener::connect_with(&raw.pool).await.map_err(err)?;
    listener.listen(&channel).await.map_err(err)?;
    Ok(tokio::spawn(async move {
        let on = move |seq: u64| {
            super::report_handled(&handled, seq);
        };
        loop {
            match raw.consume(fetch_size, &on).await {
                Ok(0) => {
                    let woken = tokio::time::timeout(Duration::from_secs(1), listener.recv()).await;
                    if let Ok(Err(_)) = woken {
                        // The listener lost its connection (it reconnects on the next recv).
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "raw postgres latency consumer failed");
                    return;
                }
            }
        }
    }))
}

/// `VACUUM`s the benchmark's table, so each side of a paired round starts on a table without the
/// dead rows of the one before (a claim scans past them until autovacuum comes). Best effort.
pub(crate) async fn vacuum(dsn: &Dsn) {
    if let Some((mut conn, table)) = housekeeping(dsn).await {
        let vacuum = format!("VACUUM {table}");
        if let Err(e) = sqlx::Executor::execute(&mut conn, vacuum.as_str()).await {
            tracing::debug!(error = %e, "benchmark VACUUM failed");
        }
        let _ = sqlx::Connection::close(conn).await;
    }
}

/// A connection for the benchmark's housekeeping on `dsn`'s table, with the table's name
/// (checked); `None` if either fails (housekeeping is best effort).
async fn housekeeping(dsn: &Dsn) -> Option<(sqlx::PgConnection, &str)> {
    let (url, table) = housekeeping_target(dsn)?;
    let options = PgConnectOptions::from_str(url).ok()?;
    let conn = sqlx::ConnectOptions::connect(&options).await.ok()?;
    Some((conn, table))
}

/// The server's URL and the (checked) table of [`housekeeping`]: Courier's table, or for a
/// `symfony+postgres://` DSN PHP's, on the server it names.
fn housekeeping_target(dsn: &Dsn) -> Option<(&str, &str)> {
    let exposed = dsn.expose_without_query();
    let (url, default) = match exposed.strip_prefix("symfony+") {
        Some(url) => (url, "messenger_messages"),
        None => (exposed, "courier_messages"),
    };
    let table = dsn.option("table_name").unwrap_or(default);
    courier_sql::is_valid_identifier(table).then_some((url, table))
}

/// Deletes the cursor of the benchmark's own cursor outbox (`cursor=true`), which the relay
/// leaves behind in `<table>_cursors` (its rows are gone). Best effort.
pub async fn forget_cursor(dsn: &Dsn) {
    let Some(queue) = dsn.option("queue_name") else {
        return;
    };
    if let Some((mut conn, table)) = housekeeping(dsn).await {
        let forget = format!("DELETE FROM {table}_cursors WHERE queue_name = $1");
        if let Err(e) = sqlx::query(&forget).bind(queue).execute(&mut conn).await {
            tracing::debug!(error = %e, "benchmark: deleting the cursor failed");
        }
        let _ = sqlx::Connection::close(conn).await;
    }
}

/// The server's own share of a PostgreSQL outbox's ceiling, for `courier bench --relay`: `messages` rows
/// of `body` stored on a queue of their own (untimed, then `VACUUM ANALYZE`d), deleted a
/// `batch` at a time by the relay's own work in one statement (the claim index walked `FOR
/// UPDATE SKIP LOCKED`, then `DELETE ... RETURNING`; the relay runs the two apart, so that the
/// next drain can start between them) under `EXPLAIN (ANALYZE)`; returns messages per second of the
/// server's execution time alone (no round trip, no row sent back, no commit). A relay runs
/// the same statements and more (the rows travel, each batch is held until the destination
/// confirmed, then committed, decoded and re-encoded); what it reaches beyond this figure is
/// the cost of that rest.
pub async fn drain_rate(dsn: &Dsn, messages: u64, batch: usize, body: &str) -> RawResult<f64> {
    let raw = Raw::filled(dsn, messages, body).await?;
    let t = dsn.option("table_name").unwrap_or("courier_messages");
    let mut conn = raw.pool.acquire().await.map_err(err)?;
    // The queue is ours (`bench_raw_<number>`) and the limit a number: written into the text,
    // so the statement needs no parameters under EXPLAIN.
    let drain = format!(
        "EXPLAIN (ANALYZE, TIMING OFF) DELETE FROM {t} WHERE id = ANY(ARRAY(\
         SELECT id FROM {t} WHERE queue_name = '{q}' AND available_at <= {NOW} \
         AND (delivered_at IS NULL OR delivered_at < {NOW} - 3600000) \
         ORDER BY priority DESC, available_at, id LIMIT {batch} FOR UPDATE SKIP LOCKED)) \
         RETURNING id, body, headers, priority, available_at",
        q = raw.queue
    );
    let mut server_ms = 0.0;
    for _ in 0..messages.div_ceil(batch.max(1) as u64) {
        let plan: Vec<(String,)> = sqlx::query_as(&drain)
            .fetch_all(&mut *conn)
            .await
            .map_err(err)?;
        server_ms += plan
            .iter()
            .find_map(|(line,)| {
                line.strip_prefix("Execution Time: ")?
                    .strip_suffix(" ms")?
                    .parse::<f64>()
                    .ok()
            })
            .ok_or_else(|| RawError::failed("raw postgres drain: no execution time"))?;
    }
    let (left,): (i64,) =
        sqlx::query_as(&format!("SELECT COUNT(*) FROM {t} WHERE queue_name = $1"))
            .bind(&raw.queue)
            .fetch_one(&mut *conn)
            .await
            .map_err(err)?;
    drop(conn);
    raw.pool.close().await;
    if left != 0 {
        return Err(RawError::failed(format!(
            "raw postgres drain: {left} rows left after the drain"
        )));
    }
    Ok(crate::figures::per_second(
        messages,
        Duration::from_secs_f64(server_ms / 1000.0),
    ))
}

/// A relay's work done by the raw drivers in the naive loop, beside Courier's relay from a
/// PostgreSQL outbox to Redis: in one transaction whose commit does not wait for the disk (as
/// the relay's drains), take `batch` rows (`DELETE ... RETURNING` of the rows locked `FOR
/// UPDATE SKIP LOCKED`, in the outbox's order), `XADD` each in one pipeline (its replies are
/// the confirmations), then commit; again until the outbox is empty. Nothing overlaps.
#[cfg(feature = "redis")]
pub struct RawRelay {
    raw: Raw,
    redis: redis::aio::MultiplexedConnection,
    stream: String,
    take: String,
    messages: u64,
}

#[cfg(feature = "redis")]
impl RawRelay {
    /// Fills an outbox queue of its own on `from` with `messages` bodies (untimed), then
    /// `VACUUM ANALYZE`s the table, and opens a connection to `to` for a stream of its own.
    pub async fn fill(from: &Dsn, to: &Dsn, messages: u64, body: &str) -> RawResult<Self> {
        let redis_err = |e: redis::RedisError| RawError::failed(format!("raw relay: {e}"));
        let raw = Raw::filled(from, messages, body).await?;
        let t = from.option("table_name").unwrap_or("courier_messages");
        let client = redis::Client::open(to.expose_without_query()).map_err(redis_err)?;
        let redis = client
            .get_multiplexed_async_connection()
            .await
            .map_err(redis_err)?;
        Ok(Self {
            take: format!(
                "DELETE FROM {t} WHERE id = ANY(ARRAY(\
                 SELECT id FROM {t} WHERE queue_name = $1 AND available_at <= {NOW} \
                 AND (delivered_at IS NULL OR delivered_at < {NOW} - 3600000) \
                 ORDER BY priority DESC, available_at, id LIMIT $2 FOR UPDATE SKIP LOCKED)) \
                 RETURNING id, body, headers"
            ),
            raw,
            redis,
            stream: format!("courier_raw_relay_{}", fastrand::u32(..)),
            messages,
        })
    }

    /// Relays the whole outbox, `batch` rows at a time (the part to time).
    pub async fn run(&mut self, batch: usize) -> RawResult {
        let redis_err = |e: redis::RedisError| RawError::failed(format!("raw relay: {e}"));
        let mut left = self.messages;
        while left > 0 {
            let mut tx = self
                .raw
                .pool
                .begin_with("BEGIN; SET LOCAL synchronous_commit TO OFF")
                .await
                .map_err(err)?;
            let rows = sqlx::query(&self.take)
                .bind(&self.raw.queue)
                .bind(i64::try_from(batch).unwrap_or(i64::MAX))
                .fetch_all(&mut *tx)
                .await
                .map_err(err)?;
            if rows.is_empty() {
                return Err(RawError::failed(format!(
                    "raw relay: the outbox ran out with {left} messages still to relay"
                )));
            }
            let mut taken = Vec::with_capacity(rows.len());
            for row in &rows {
                let id: i64 = row.try_get("id").map_err(err)?;
                let body: String = row.try_get("body").map_err(err)?;
                let headers: String = row.try_get("headers").map_err(err)?;
                taken.push((id, body, headers));
            }
            taken.sort_unstable_by_key(|(id, _, _)| *id);
            let mut pipe = redis::pipe();
            for (id, body, headers) in &taken {
                pipe.cmd("XADD")
                    .arg(&self.stream)
                    .arg("*")
                    .arg("id")
                    .arg(*id)
                    .arg("body")
                    .arg(body)
                    .arg("headers")
                    .arg(headers);
            }
            let confirmed: Vec<String> =
                pipe.query_async(&mut self.redis).await.map_err(redis_err)?;
            if confirmed.len() != taken.len() {
                return Err(RawError::failed("raw relay: an XADD went unconfirmed"));
            }
            tx.commit().await.map_err(err)?;
            left = left.saturating_sub(taken.len() as u64);
        }
        Ok(())
    }

    /// Removes the stream it filled.
    pub async fn cleanup(mut self) {
        let _: Result<(), _> = redis::cmd("DEL")
            .arg(&self.stream)
            .query_async(&mut self.redis)
            .await;
        self.raw.pool.close().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_symfony_dsn_is_kept_on_phps_table_on_the_server_it_names() {
        let target = |dsn: &str| {
            let dsn = Dsn::parse(dsn).expect("a DSN");
            housekeeping_target(&dsn).map(|(url, table)| (url.to_owned(), table.to_owned()))
        };
        let pair = |url: &str, table: &str| Some((url.to_owned(), table.to_owned()));
        assert_eq!(
            target("symfony+postgres://u@127.0.0.1:5432/db?queue_name=bench_1"),
            pair("postgres://u@127.0.0.1:5432/db", "messenger_messages")
        );
        assert_eq!(
            target("symfony+postgresql://u@h/db?table_name=mm"),
            pair("postgresql://u@h/db", "mm")
        );
        assert_eq!(
            target("postgres://u@h/db"),
            pair("postgres://u@h/db", "courier_messages")
        );
        assert_eq!(target("postgres://u@h/db?table_name=x;drop"), None);
    }
}
