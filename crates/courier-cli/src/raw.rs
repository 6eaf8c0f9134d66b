//! The raw drivers doing the same protocol work as the transports, for `courier bench --raw`:
//! the same table, rows, statements and batch sizes, without the framework (no envelopes, no
//! stamps, no bus, no worker).
//!
//! SQLite: one multi-row `INSERT ... RETURNING id` per batch of `fetch_size`; a claim is one
//! `UPDATE ... WHERE id IN (SELECT ... LIMIT n) RETURNING ...`; each claimed body is parsed as
//! JSON (the handler's decode); one `DELETE ... WHERE delivery_id = ? AND id IN (...)` per batch.
//! PostgreSQL: one `INSERT ... SELECT FROM UNNEST(...)` per batch; a claim is one
//! `UPDATE ... FROM (SELECT ... FOR UPDATE SKIP LOCKED LIMIT n)`; one `DELETE ... = ANY($1)`.
//! Redis: pipelined `XADD`s per batch; `XREADGROUP COUNT n`; one pipelined `XACK` + `XDEL` with
//! every id of the batch. Other transports have no raw implementation yet (`raw` is `null`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use courier_core::Dsn;

use crate::commands::bench::{Figures, Work, payload, per_second, percentiles};
use crate::error::{CliError, CliResult};

/// Measures the raw driver for `dsn`, or `None` when there is no raw implementation.
pub(crate) async fn measure(dsn: &Dsn, work: &Work) -> CliResult<Option<Figures>> {
    let _ = work;
    match dsn.scheme() {
        #[cfg(feature = "sqlite")]
        "sqlite" => run(
            Arc::new(sqlite::Raw::connect(dsn, work.fetch_size).await?),
            work,
        )
        .await
        .map(Some),
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => run(Arc::new(postgres::Raw::connect(dsn).await?), work)
            .await
            .map(Some),
        #[cfg(feature = "redis")]
        "redis" | "rediss" => run(Arc::new(redis_streams::Raw::connect(dsn).await?), work)
            .await
            .map(Some),
        _ => Ok(None),
    }
}

/// The protocol work of one raw driver.
#[cfg_attr(
    not(feature = "sql"),
    allow(dead_code, reason = "implemented by the SQL drivers")
)]
#[courier_core::async_trait]
trait Driver: Send + Sync + 'static {
    /// Stores these bodies as one batch.
    async fn send(&self, bodies: &[String]) -> CliResult;
    /// Claims, decodes and deletes up to `max` rows; returns how many.
    async fn consume(&self, max: usize) -> CliResult<usize>;
    /// Removes what the benchmark created.
    async fn cleanup(&self) {}
}

#[cfg_attr(
    not(feature = "sql"),
    allow(dead_code, reason = "used by the SQL drivers")
)]
async fn run<D: Driver>(raw: Arc<D>, work: &Work) -> CliResult<Figures> {
    let body =
        |seq: u64| serde_json::json!({ "seq": seq, "payload": payload(work.size) }).to_string();
    let started = Instant::now();
    let mut seq = 0;
    while seq < work.messages {
        let n = (work.messages - seq).min(work.fetch_size as u64);
        let bodies: Vec<String> = (seq..seq + n).map(body).collect();
        raw.send(&bodies).await?;
        seq += n;
    }
    let produce = started.elapsed();

    let started = Instant::now();
    let mut consumed = 0u64;
    while consumed < work.messages {
        let n = raw.consume(work.fetch_size).await?;
        if n == 0 {
            return Err(CliError::runtime("raw benchmark: rows went missing"));
        }
        consumed += n as u64;
    }
    let consume = started.elapsed();

    // Latency: a consumer task woken by the producer, like the transport's in-process wake.
    let wake = Arc::new(tokio::sync::Notify::new());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<usize>();
    let consumer = {
        let (raw, wake, fetch) = (raw.clone(), wake.clone(), work.fetch_size);
        tokio::spawn(async move {
            loop {
                let _ = tokio::time::timeout(Duration::from_millis(250), wake.notified()).await;
                match raw.consume(fetch).await {
                    Ok(0) => {}
                    Ok(n) if tx.send(n).is_ok() => {}
                    _ => return,
                }
            }
        })
    };
    let mut samples = Vec::with_capacity(work.latency_samples);
    for i in 0..work.latency_samples as u64 {
        let sent = Instant::now();
        raw.send(&[body(i)]).await?;
        wake.notify_one();
        match tokio::time::timeout(Duration::from_secs(30), rx.recv()).await {
            Ok(Some(_)) => samples.push(sent.elapsed()),
            _ => {
                consumer.abort();
                return Err(CliError::runtime(
                    "raw benchmark: a latency sample took over 30 s",
                ));
            }
        }
    }
    consumer.abort();
    raw.cleanup().await;
    let (p50, p99) = percentiles(&mut samples);
    Ok(Figures {
        produce_per_s: per_second(work.messages, produce),
        consume_per_s: per_second(work.messages, consume),
        p50_ms: p50,
        p99_ms: p99,
    })
}

#[cfg(feature = "sqlite")]
mod sqlite {
    use std::str::FromStr;
    use std::time::Duration;

    use courier_core::Dsn;
    use sqlx::Row;
    use sqlx::sqlite::{
        SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
    };

    use super::Driver;
    use crate::error::{CliError, CliResult};

    const NOW: &str = "(CAST(strftime('%s', 'now') AS INTEGER) * 1000 + CAST(substr(strftime('%f', 'now'), 4) AS INTEGER))";
    const HEADERS: &str = r#"{"content-type":"application/json","type":"courier.bench"}"#;

    pub(super) struct Raw {
        pool: SqlitePool,
        queue: String,
        table: String,
        insert: Vec<String>,
        claim: String,
    }

    fn err(e: sqlx::Error) -> CliError {
        CliError::runtime(format!("raw sqlite benchmark: {e}"))
    }

    impl Raw {
        pub(super) async fn connect(dsn: &Dsn, fetch_size: usize) -> CliResult<Self> {
            let url = dsn.expose_without_query();
            let options = SqliteConnectOptions::from_str(url)
                .map_err(err)?
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Normal)
                .busy_timeout(Duration::from_secs(5));
            let pool = SqlitePoolOptions::new()
                .max_connections(4)
                .connect_with(options)
                .await
                .map_err(err)?;
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
            })
        }
    }

    #[courier_core::async_trait]
    impl Driver for Raw {
        async fn send(&self, bodies: &[String]) -> CliResult {
            let mut q = sqlx::query(&self.insert[bodies.len() - 1]);
            for body in bodies {
                q = q.bind(&self.queue).bind(body).bind(HEADERS);
            }
            q.fetch_all(&self.pool).await.map_err(err)?;
            Ok(())
        }

        async fn consume(&self, max: usize) -> CliResult<usize> {
            let delivery = i64::from(fastrand::u32(..));
            let rows = sqlx::query(&self.claim)
                .bind(delivery)
                .bind(&self.queue)
                .bind(i64::try_from(max).unwrap_or(i64::MAX))
                .fetch_all(&self.pool)
                .await
                .map_err(err)?;
            if rows.is_empty() {
                return Ok(0);
            }
            let mut ids = Vec::with_capacity(rows.len());
            for row in &rows {
                let body: String = row.try_get("body").map_err(err)?;
                let _: serde_json::Value = serde_json::from_str(&body).map_err(|e| {
                    CliError::runtime(format!("raw sqlite benchmark: bad body: {e}"))
                })?;
                ids.push(row.try_get::<i64, _>("id").map_err(err)?);
            }
            let sql = format!(
                "DELETE FROM {} WHERE delivery_id = ? AND id IN ({})",
                self.table,
                vec!["?"; ids.len()].join(", ")
            );
            let mut q = sqlx::query(&sql).bind(delivery);
            for id in &ids {
                q = q.bind(id);
            }
            q.execute(&self.pool).await.map_err(err)?;
            Ok(ids.len())
        }
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use std::str::FromStr;

    use courier_core::Dsn;
    use sqlx::Row;
    use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

    use super::Driver;
    use crate::error::{CliError, CliResult};

    const NOW: &str = "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT";
    const HEADERS: &str = r#"{"content-type":"application/json","type":"courier.bench"}"#;

    pub(super) struct Raw {
        pool: PgPool,
        queue: String,
        insert: String,
        claim: String,
        delete: String,
    }

    fn err(e: sqlx::Error) -> CliError {
        CliError::runtime(format!("raw postgres benchmark: {e}"))
    }

    impl Raw {
        pub(super) async fn connect(dsn: &Dsn) -> CliResult<Self> {
            let options = PgConnectOptions::from_str(dsn.expose_without_query()).map_err(err)?;
            let pool = PgPoolOptions::new()
                .max_connections(4)
                .connect_with(options)
                .await
                .map_err(err)?;
            let t = dsn.option("table_name").unwrap_or("courier_messages");
            Ok(Self {
                pool,
                queue: format!("bench_raw_{}", fastrand::u32(..)),
                insert: format!(
                    "INSERT INTO {t} (queue_name, body, headers, priority, created_at, available_at) \
                     SELECT $1, x.body, $3, 0, {NOW}, {NOW} FROM UNNEST($2::TEXT[]) WITH ORDINALITY AS x(body, ord) \
                     ORDER BY x.ord RETURNING id"
                ),
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

    #[courier_core::async_trait]
    impl Driver for Raw {
        async fn send(&self, bodies: &[String]) -> CliResult {
            sqlx::query(&self.insert)
                .bind(&self.queue)
                .bind(bodies)
                .bind(HEADERS)
                .fetch_all(&self.pool)
                .await
                .map_err(err)?;
            Ok(())
        }

        async fn consume(&self, max: usize) -> CliResult<usize> {
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
                let _: serde_json::Value = serde_json::from_str(&body).map_err(|e| {
                    CliError::runtime(format!("raw postgres benchmark: bad body: {e}"))
                })?;
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
}

#[cfg(feature = "redis")]
mod redis_streams {
    use courier_core::Dsn;
    use redis::Value;
    use redis::aio::MultiplexedConnection;

    use super::Driver;
    use crate::error::{CliError, CliResult};

    const HEADERS: &str = r#"{"content-type":"application/json","type":"courier.bench"}"#;
    const GROUP: &str = "courier";

    pub(super) struct Raw {
        conn: MultiplexedConnection,
        stream: String,
    }

    fn err(e: redis::RedisError) -> CliError {
        CliError::runtime(format!("raw redis benchmark: {e}"))
    }

    impl Raw {
        pub(super) async fn connect(dsn: &Dsn) -> CliResult<Self> {
            let client = redis::Client::open(dsn.expose_without_query()).map_err(err)?;
            let mut conn = client
                .get_multiplexed_async_connection()
                .await
                .map_err(err)?;
            let stream = format!("courier_raw_bench_{}", fastrand::u32(..));
            let _: () = redis::cmd("XGROUP")
                .arg("CREATE")
                .arg(&stream)
                .arg(GROUP)
                .arg("$")
                .arg("MKSTREAM")
                .query_async(&mut conn)
                .await
                .map_err(err)?;
            Ok(Self { conn, stream })
        }
    }

    /// The entry ids and bodies of an `XREADGROUP` reply for one stream.
    fn entries(reply: &Value) -> Vec<(&[u8], &[u8])> {
        let Value::Array(streams) = reply else {
            return Vec::new();
        };
        let Some(Value::Array(stream)) = streams.first() else {
            return Vec::new();
        };
        let Some(Value::Array(entries)) = stream.get(1) else {
            return Vec::new();
        };
        entries
            .iter()
            .filter_map(|e| {
                let Value::Array(parts) = e else { return None };
                let (Some(Value::BulkString(id)), Some(Value::Array(fields))) =
                    (parts.first(), parts.get(1))
                else {
                    return None;
                };
                let body = fields.chunks(2).find_map(|kv| match kv {
                    [Value::BulkString(k), Value::BulkString(v)] if k == b"body" => {
                        Some(v.as_slice())
                    }
                    _ => None,
                })?;
                Some((id.as_slice(), body))
            })
            .collect()
    }

    #[courier_core::async_trait]
    impl Driver for Raw {
        async fn send(&self, bodies: &[String]) -> CliResult {
            let mut pipe = redis::pipe();
            for body in bodies {
                pipe.cmd("XADD")
                    .arg(&self.stream)
                    .arg("*")
                    .arg("body")
                    .arg(body)
                    .arg("headers")
                    .arg(HEADERS)
                    .ignore();
            }
            let mut conn = self.conn.clone();
            pipe.query_async::<()>(&mut conn).await.map_err(err)
        }

        async fn consume(&self, max: usize) -> CliResult<usize> {
            let mut conn = self.conn.clone();
            let reply: Value = redis::cmd("XREADGROUP")
                .arg("GROUP")
                .arg(GROUP)
                .arg("raw")
                .arg("COUNT")
                .arg(max)
                .arg("STREAMS")
                .arg(&self.stream)
                .arg(">")
                .query_async(&mut conn)
                .await
                .map_err(err)?;
            let entries = entries(&reply);
            if entries.is_empty() {
                return Ok(0);
            }
            let mut ids = Vec::with_capacity(entries.len());
            for (id, body) in &entries {
                serde_json::from_slice::<serde_json::Value>(body)
                    .map_err(|e| CliError::runtime(format!("raw redis benchmark: {e}")))?;
                ids.push(*id);
            }
            let mut pipe = redis::pipe();
            pipe.cmd("XACK")
                .arg(&self.stream)
                .arg(GROUP)
                .arg(&ids)
                .ignore();
            pipe.cmd("XDEL").arg(&self.stream).arg(&ids).ignore();
            pipe.query_async::<()>(&mut conn).await.map_err(err)?;
            Ok(entries.len())
        }

        async fn cleanup(&self) {
            let mut conn = self.conn.clone();
            let _: Result<(), _> = redis::cmd("DEL")
                .arg(&self.stream)
                .query_async(&mut conn)
                .await;
        }
    }
}
