//! SqlTransport against the raw sqlx loop doing the same protocol work, in one process, on
//! SQLite (a temp file, WAL) and PostgreSQL (`COURIER_TEST_POSTGRES_URL`; skipped with a note
//! when unset). Same N, same ~200-byte body, `fetch` 1 (one INSERT / claim / DELETE per message;
//! N = `COURIER_BENCH_N`, default 500) and 64 (one multi-row INSERT, one claim of 64, one DELETE
//! of 64; N = `COURIER_BENCH_N64`, default 20 x `COURIER_BENCH_N`, so that a round lasts long
//! enough for a WAL checkpoint or an fsync stall to average out). The raw loop runs the same
//! statements as the transport (the INSERT with its `RETURNING` ids and, on PostgreSQL, its
//! `pg_notify`; the single-statement claim; DELETE by id and delivery id), so the ratio is what
//! the framework costs: encoding, decoding,
//! stamps, the wake-ups of its own listener. The `produce/plain` lines compare Courier with the
//! smallest INSERT a hand-written queue could use (no ids back, no notify): what those features
//! cost on top.
//!
//! ```text
//! COURIER_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test COURIER_BENCH_N=500 \
//!   cargo bench --bench sql --no-default-features --features sql,postgres,sqlite
//! ```
//!
//! Both sides start from the application's typed messages, built before the clock starts, and
//! do the same job: the raw producer serializes each message with serde_json and binds a
//! constant headers text; the raw consumer deserializes each body it claims. Courier encodes and
//! decodes whole envelopes (body, headers object, stamps).
//!
//! After criterion's per-iteration times it runs `COURIER_BENCH_ROUNDS` (default 9) paired
//! rounds, raw and Courier back to back with the order alternating, and prints produce and
//! consume msg/s of both and the median of the per-round ratios courier / raw.

mod common;

use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Paired, rate};

use courier_core::{Dsn, Envelope, Message, MessageRegistry, Transport, encode};
use courier_sql::SqlTransport;
use criterion::{Criterion, Throughput};
use serde::{Deserialize, Serialize};
use sqlx::{PgPool, SqlitePool};

#[derive(Serialize, Deserialize)]
struct BenchMessage {
    seq: u64,
    text: String,
}

impl Message for BenchMessage {
    const NAME: &'static str = "bench.sql";
}

fn message(seq: u64) -> BenchMessage {
    BenchMessage {
        seq,
        text: "x".repeat(180),
    }
}

const SQLITE_NOW: &str = "(CAST(strftime('%s', 'now') AS INTEGER) * 1000 + CAST(substr(strftime('%f', 'now'), 4) AS INTEGER))";
const PG_NOW: &str = "(EXTRACT(EPOCH FROM statement_timestamp()) * 1000)::BIGINT";

#[derive(Clone)]
enum Raw {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// The ids of claimed rows, each body deserialized as a hand-written consumer would.
fn decoded_ids(rows: Vec<(i64, String, String, i16, i64)>) -> Vec<i64> {
    rows.into_iter()
        .map(|(id, body, ..)| {
            let _message: BenchMessage = serde_json::from_str(&body).expect("deserialize");
            id
        })
        .collect()
}

/// The raw loop: the transport's statements by hand, no framework. With `plain`, produce uses
/// the smallest INSERT instead (literal queue, priority and delay; on PostgreSQL no `RETURNING`
/// and no `pg_notify`), to show what those features cost.
struct RawQueue {
    pool: Raw,
    table: String,
    headers: String,
    plain: bool,
}

impl RawQueue {
    /// Serializes each message with serde_json, as any producer must, and inserts them.
    async fn produce(&self, messages: &[BenchMessage], fetch: usize) {
        let t = &self.table;
        for chunk in messages.chunks(fetch) {
            let k = chunk.len();
            let bodies: Vec<String> = chunk
                .iter()
                .map(|m| serde_json::to_string(m).expect("serialize"))
                .collect();
            match &self.pool {
                Raw::Sqlite(p) if self.plain => {
                    let values =
                        vec![format!("('default', ?, ?, 0, {SQLITE_NOW}, {SQLITE_NOW})"); k]
                            .join(", ");
                    let sql = format!(
                        "INSERT INTO {t} (queue_name, body, headers, priority, created_at, available_at) VALUES {values}"
                    );
                    let mut q = sqlx::query(&sql);
                    for body in &bodies {
                        q = q.bind(body).bind(&self.headers);
                    }
                    q.execute(p).await.expect("insert");
                }
                Raw::Sqlite(p) if k == 1 => {
                    let sql = format!(
                        "INSERT INTO {t} (queue_name, body, headers, priority, created_at, available_at) \
                         VALUES (?, ?, ?, ?, {SQLITE_NOW}, {SQLITE_NOW} + ?)"
                    );
                    sqlx::query(&sql)
                        .bind("default")
                        .bind(&bodies[0])
                        .bind(&self.headers)
                        .bind(0_i16)
                        .bind(0_i64)
                        .execute(p)
                        .await
                        .expect("insert");
                }
                Raw::Sqlite(p) => {
                    let values = (0..k)
                        .map(|i| {
                            format!(
                                "(?1, ?{}, ?{}, ?2, {SQLITE_NOW}, {SQLITE_NOW} + ?3)",
                                4 + 2 * i,
                                5 + 2 * i
                            )
                        })
                        .collect::<Vec<_>>()
                        .join(", ");
                    let sql = format!(
                        "INSERT INTO {t} (queue_name, body, headers, priority, created_at, available_at) VALUES {values}"
                    );
                    let mut q = sqlx::query(&sql).bind("default").bind(0_i16).bind(0_i64);
                    for body in &bodies {
                        q = q.bind(body).bind(&self.headers);
                    }
                    q.execute(p).await.expect("insert");
                }
                Raw::Postgres(p) if self.plain => {
                    let sql = format!(
                        "INSERT INTO {t} (queue_name, body, headers, priority, created_at, available_at) \
                         SELECT 'default', b, h, 0, {PG_NOW}, {PG_NOW} FROM UNNEST($1::TEXT[], $2::TEXT[]) AS x(b, h)"
                    );
                    let headers = vec![self.headers.as_str(); k];
                    sqlx::query(&sql)
                        .bind(bodies)
                        .bind(headers)
                        .execute(p)
                        .await
                        .expect("insert");
                }
                Raw::Postgres(p) => {
                    let sql = format!(
                        "WITH ins AS (\
                         INSERT INTO {t} (queue_name, body, headers, priority, created_at, available_at) \
                         SELECT $1, x.body, x.headers, x.priority, {PG_NOW}, {PG_NOW} + x.delay \
                         FROM UNNEST($2::TEXT[], $3::TEXT[], $4::INT2[], $5::INT8[]) WITH ORDINALITY \
                         AS x(body, headers, priority, delay, ord) ORDER BY x.ord RETURNING id), \
                         wake AS (SELECT pg_notify($6, $1)) \
                         SELECT array_agg(ins.id ORDER BY ins.id) FROM ins CROSS JOIN wake"
                    );
                    let ids: Option<Vec<i64>> = sqlx::query_scalar(&sql)
                        .bind("default")
                        .bind(&bodies)
                        .bind(vec![self.headers.as_str(); k])
                        .bind(vec![0_i16; k])
                        .bind(vec![0_i64; k])
                        .bind(t)
                        .fetch_one(p)
                        .await
                        .expect("insert");
                    assert_eq!(ids.map(|i| i.len()), Some(k));
                }
            }
        }
    }

    async fn consume(&self, n: u64, fetch: usize) {
        let t = &self.table;
        let mut got = 0;
        while got < n {
            let delivery = fastrand::i64(1..i64::MAX);
            let ids: Vec<i64> = match &self.pool {
                Raw::Sqlite(p) => {
                    let sql = format!(
                        "UPDATE {t} SET delivered_at = {SQLITE_NOW}, delivery_id = ?1 WHERE id IN (\
                         SELECT id FROM {t} WHERE queue_name = ?2 AND available_at <= {SQLITE_NOW} \
                         AND (delivered_at IS NULL OR delivered_at < {SQLITE_NOW} - ?3) \
                         ORDER BY priority DESC, available_at, id LIMIT ?4) RETURNING id, body, headers, priority, available_at"
                    );
                    let rows: Vec<(i64, String, String, i16, i64)> = sqlx::query_as(&sql)
                        .bind(delivery)
                        .bind("default")
                        .bind(3_600_000_i64)
                        .bind(fetch as i64)
                        .fetch_all(p)
                        .await
                        .expect("claim");
                    decoded_ids(rows)
                }
                Raw::Postgres(p) => {
                    let sql = format!(
                        "WITH picked AS (SELECT id FROM {t} WHERE queue_name = $1 AND available_at <= {PG_NOW} \
                         AND (delivered_at IS NULL OR delivered_at < {PG_NOW} - $2) \
                         ORDER BY priority DESC, available_at, id LIMIT $3 FOR UPDATE SKIP LOCKED) \
                         UPDATE {t} SET delivered_at = {PG_NOW}, delivery_id = $4 FROM picked WHERE {t}.id = picked.id \
                         RETURNING {t}.id, {t}.body, {t}.headers, {t}.priority, {t}.available_at"
                    );
                    let rows: Vec<(i64, String, String, i16, i64)> = sqlx::query_as(&sql)
                        .bind("default")
                        .bind(3_600_000_i64)
                        .bind(fetch as i64)
                        .bind(delivery)
                        .fetch_all(p)
                        .await
                        .expect("claim");
                    decoded_ids(rows)
                }
            };
            got += ids.len() as u64;
            match &self.pool {
                Raw::Sqlite(p) => {
                    let sql = format!(
                        "DELETE FROM {t} WHERE delivery_id = ? AND id IN ({})",
                        vec!["?"; ids.len()].join(", ")
                    );
                    let mut q = sqlx::query(&sql).bind(delivery);
                    for id in ids {
                        q = q.bind(id);
                    }
                    q.execute(p).await.expect("delete");
                }
                Raw::Postgres(p) => {
                    if ids.len() == 1 {
                        let sql = format!("DELETE FROM {t} WHERE id = $1 AND delivery_id = $2");
                        sqlx::query(&sql)
                            .bind(ids[0])
                            .bind(delivery)
                            .execute(p)
                            .await
                            .expect("delete");
                    } else {
                        let sql =
                            format!("DELETE FROM {t} WHERE delivery_id = $1 AND id = ANY($2)");
                        sqlx::query(&sql)
                            .bind(delivery)
                            .bind(ids)
                            .execute(p)
                            .await
                            .expect("delete");
                    }
                }
            }
        }
    }
}

async fn courier_produce(t: &SqlTransport, envelopes: Vec<Envelope>, fetch: usize) {
    if fetch == 1 {
        for envelope in envelopes {
            t.send(envelope).await.expect("send");
        }
    } else {
        let mut envelopes = envelopes.into_iter();
        loop {
            let batch: Vec<Envelope> = envelopes.by_ref().take(fetch).collect();
            if batch.is_empty() {
                break;
            }
            t.send_batch(batch).await.expect("send_batch");
        }
    }
}

async fn courier_consume(t: &SqlTransport, n: u64, fetch: usize) {
    let mut got = 0;
    while got < n {
        let batch = t.get(fetch).await.expect("get");
        got += batch.len() as u64;
        if fetch == 1 {
            for e in &batch {
                t.ack(e).await.expect("ack");
            }
        } else {
            t.ack_batch(&batch).await.expect("ack_batch");
        }
    }
}

struct Backend {
    label: &'static str,
    base: String,
    raw: Raw,
}

/// One timed produce and consume of N messages by one side (`None`: Courier):
/// (produce, consume).
async fn round(
    raw: Option<&RawQueue>,
    courier: &SqlTransport,
    n: u64,
    fetch: usize,
) -> (Duration, Duration) {
    let messages: Vec<BenchMessage> = (0..n).map(message).collect();
    let start;
    match raw {
        Some(raw) => {
            start = Instant::now();
            raw.produce(&messages, fetch).await;
        }
        None => {
            let batch = messages.into_iter().map(Envelope::new).collect();
            start = Instant::now();
            courier_produce(courier, batch, fetch).await;
        }
    }
    let produced = start.elapsed();
    match raw {
        Some(raw) => raw.consume(n, fetch).await,
        None => courier_consume(courier, n, fetch).await,
    }
    (produced, start.elapsed() - produced)
}

fn bench_backend(
    c: &mut Criterion,
    rt: &tokio::runtime::Runtime,
    b: &Backend,
    (n1, n64): (u64, u64),
    paired: &mut Paired,
) {
    let registry = Arc::new(MessageRegistry::new().with::<BenchMessage>());
    let encoded = encode(&Envelope::new(message(0))).expect("encode");
    for (fetch, n) in [(1_usize, n1), (64, n64)] {
        let config = format!("{}/fetch{fetch}", b.label);
        let suffix = fastrand::u32(..);
        let courier_table = format!("bench_courier_{suffix}");
        let raw_table = format!("bench_raw_{suffix}");
        // The plain INSERT runs against a table of its own, so that the raw and Courier tables
        // see the same traffic (and the same dead rows to skip).
        let plain_table = format!("bench_plain_{suffix}");
        let (courier, raw) = rt.block_on(async {
            let dsn = Dsn::parse(&format!(
                "{}?table_name={courier_table}&poll_window=50ms",
                b.base
            ))
            .expect("dsn");
            let courier = SqlTransport::connect("bench", &dsn, registry.clone())
                .await
                .expect("connect");
            // The raw tables: same schema, created by the same setup.
            for table in [&raw_table, &plain_table] {
                let dsn = Dsn::parse(&format!("{}?table_name={table}", b.base)).expect("dsn");
                drop(
                    SqlTransport::connect("setup", &dsn, registry.clone())
                        .await
                        .expect("setup"),
                );
            }
            let raw = RawQueue {
                pool: b.raw.clone(),
                table: raw_table.clone(),
                headers: encoded.headers_json(),
                plain: false,
            };
            (courier, raw)
        });
        let mut group = c.benchmark_group(format!("sql/{config}"));
        group.throughput(Throughput::Elements(n));
        for side in ["raw", "courier"] {
            group.bench_function(side, |bench| {
                bench.to_async(rt).iter_custom(|iters| {
                    let raw = (side == "raw").then_some(&raw);
                    let courier = &courier;
                    async move {
                        let mut total = Duration::ZERO;
                        for _ in 0..iters {
                            let (produce, consume) = round(raw, courier, n, fetch).await;
                            total += produce + consume;
                        }
                        total
                    }
                });
            });
        }
        group.finish();
        let plain = RawQueue {
            pool: raw.pool.clone(),
            table: plain_table.clone(),
            headers: raw.headers.clone(),
            plain: true,
        };
        rt.block_on(async {
            for r in 0..common::rounds() {
                let minimal = round(Some(&plain), &courier, n, fetch).await;
                let raw_first = r % 2 == 0;
                let first = round(raw_first.then_some(&raw), &courier, n, fetch).await;
                let second = round((!raw_first).then_some(&raw), &courier, n, fetch).await;
                let (raw_t, courier_t) = if raw_first {
                    (first, second)
                } else {
                    (second, first)
                };
                paired.add(
                    &format!("{config} produce"),
                    rate(n, raw_t.0),
                    rate(n, courier_t.0),
                );
                paired.add(
                    &format!("{config} consume"),
                    rate(n, raw_t.1),
                    rate(n, courier_t.1),
                );
                paired.add(
                    &format!("{config} produce/plain"),
                    rate(n, minimal.0),
                    rate(n, courier_t.0),
                );
            }
        });
        rt.block_on(async {
            for table in [&courier_table, &raw_table, &plain_table] {
                let sql = format!("DROP TABLE IF EXISTS {table}");
                match &b.raw {
                    Raw::Sqlite(p) => sqlx::query(&sql).execute(p).await.map(drop),
                    Raw::Postgres(p) => sqlx::query(&sql).execute(p).await.map(drop),
                }
                .expect("drop");
            }
        });
    }
}

fn main() {
    let n: u64 = std::env::var("COURIER_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500);
    let n64: u64 = std::env::var("COURIER_BENCH_N64")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20 * n);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut paired = Paired::default();
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .configure_from_args();

    let dir = std::env::temp_dir().join(format!("courier-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("bench.db");
    let base = format!("sqlite://{}", path.display());
    let pool = rt.block_on(async {
        let opts = sqlx::sqlite::SqliteConnectOptions::from_str(&base)
            .expect("sqlite url")
            .create_if_missing(true)
            .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
            .synchronous(sqlx::sqlite::SqliteSynchronous::Normal);
        sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(4)
            .test_before_acquire(false)
            .connect_with(opts)
            .await
            .expect("sqlite pool")
    });
    bench_backend(
        &mut c,
        &rt,
        &Backend {
            label: "sqlite",
            base,
            raw: Raw::Sqlite(pool),
        },
        (n, n64),
        &mut paired,
    );

    match std::env::var("COURIER_TEST_POSTGRES_URL") {
        Ok(url) if !url.is_empty() => {
            let pool = rt.block_on(async {
                sqlx::postgres::PgPoolOptions::new()
                    .max_connections(10)
                    .test_before_acquire(false)
                    .connect(&url)
                    .await
                    .expect("postgres pool")
            });
            bench_backend(
                &mut c,
                &rt,
                &Backend {
                    label: "postgres",
                    base: url,
                    raw: Raw::Postgres(pool),
                },
                (n, n64),
                &mut paired,
            );
        }
        _ => {
            println!("note: COURIER_TEST_POSTGRES_URL is not set; skipping the PostgreSQL benches")
        }
    }

    c.final_summary();
    paired.print(&format!(
        "N = {n} (fetch 1) / {n64} (fetch 64) messages of ~200 bytes, {} paired rounds, medians:",
        common::rounds()
    ));
    let _ = std::fs::remove_dir_all(&dir);
}
