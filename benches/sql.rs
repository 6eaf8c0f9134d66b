//! SqlTransport against the raw sqlx loop doing the same protocol work, in one process, on
//! SQLite (a temp file, WAL) and PostgreSQL (`COURIER_TEST_POSTGRES_URL`; skipped with a note
//! when unset). Same N, same ~200-byte body, `fetch` 1 (one INSERT / claim / DELETE per message)
//! and 64 (one multi-row INSERT, one claim of 64, one DELETE of 64). The raw loop runs the same
//! statements as the transport (single-statement claim, DELETE by id and delivery id) with the
//! body and headers encoded once up front; the transport pays for encoding, decoding, stamps and
//! (PostgreSQL) the `pg_notify` in every insert.
//!
//! ```text
//! COURIER_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test COURIER_BENCH_N=500 \
//!   cargo bench --bench sql --features sql,postgres,sqlite
//! ```
//!
//! Besides criterion's per-iteration times it prints produce and consume msg/s of both and the
//! ratio courier / raw.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

/// Produce and consume seconds per (config, implementation), summed over iterations.
type Totals = BTreeMap<(String, &'static str), (f64, f64, u64)>;
static TOTALS: Mutex<Totals> = Mutex::new(BTreeMap::new());

fn record(config: &str, which: &'static str, produce: Duration, consume: Duration, n: u64) {
    let mut t = TOTALS.lock().unwrap_or_else(|e| e.into_inner());
    let e = t.entry((config.to_owned(), which)).or_default();
    e.0 += produce.as_secs_f64();
    e.1 += consume.as_secs_f64();
    e.2 += n;
}

enum Raw {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// The raw loop: the transport's statements, no framework.
struct RawQueue {
    pool: Raw,
    table: String,
    body: String,
    headers: String,
}

impl RawQueue {
    async fn produce(&self, n: u64, fetch: usize) {
        let t = &self.table;
        let mut left = n as usize;
        while left > 0 {
            let k = left.min(fetch);
            left -= k;
            match &self.pool {
                Raw::Sqlite(p) => {
                    let values =
                        vec![format!("('default', ?, ?, 0, {SQLITE_NOW}, {SQLITE_NOW})"); k]
                            .join(", ");
                    let sql = format!(
                        "INSERT INTO {t} (queue_name, body, headers, priority, created_at, available_at) VALUES {values}"
                    );
                    let mut q = sqlx::query(&sql);
                    for _ in 0..k {
                        q = q.bind(&self.body).bind(&self.headers);
                    }
                    q.execute(p).await.expect("insert");
                }
                Raw::Postgres(p) => {
                    let sql = format!(
                        "INSERT INTO {t} (queue_name, body, headers, priority, created_at, available_at) \
                         SELECT 'default', b, h, 0, {PG_NOW}, {PG_NOW} FROM UNNEST($1::TEXT[], $2::TEXT[]) AS x(b, h)"
                    );
                    let bodies = vec![self.body.as_str(); k];
                    let headers = vec![self.headers.as_str(); k];
                    sqlx::query(&sql)
                        .bind(bodies)
                        .bind(headers)
                        .execute(p)
                        .await
                        .expect("insert");
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
                         SELECT id FROM {t} WHERE queue_name = 'default' AND available_at <= {SQLITE_NOW} \
                         AND (delivered_at IS NULL OR delivered_at < {SQLITE_NOW} - 3600000) \
                         ORDER BY priority DESC, available_at, id LIMIT ?2) RETURNING id, body, headers"
                    );
                    let rows: Vec<(i64, String, String)> = sqlx::query_as(&sql)
                        .bind(delivery)
                        .bind(fetch as i64)
                        .fetch_all(p)
                        .await
                        .expect("claim");
                    rows.into_iter().map(|r| r.0).collect()
                }
                Raw::Postgres(p) => {
                    let sql = format!(
                        "WITH picked AS (SELECT id FROM {t} WHERE queue_name = 'default' AND available_at <= {PG_NOW} \
                         AND (delivered_at IS NULL OR delivered_at < {PG_NOW} - 3600000) \
                         ORDER BY priority DESC, available_at, id LIMIT $1 FOR UPDATE SKIP LOCKED) \
                         UPDATE {t} SET delivered_at = {PG_NOW}, delivery_id = $2 FROM picked WHERE {t}.id = picked.id \
                         RETURNING {t}.id, {t}.body, {t}.headers"
                    );
                    let rows: Vec<(i64, String, String)> = sqlx::query_as(&sql)
                        .bind(fetch as i64)
                        .bind(delivery)
                        .fetch_all(p)
                        .await
                        .expect("claim");
                    rows.into_iter().map(|r| r.0).collect()
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

async fn courier_produce(t: &SqlTransport, n: u64, fetch: usize) {
    if fetch == 1 {
        for i in 0..n {
            t.send(Envelope::new(message(i))).await.expect("send");
        }
    } else {
        let mut i = 0;
        while i < n {
            let k = (n - i).min(fetch as u64);
            t.send_batch((i..i + k).map(|s| Envelope::new(message(s))).collect())
                .await
                .expect("send_batch");
            i += k;
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

fn bench_backend(c: &mut Criterion, rt: &tokio::runtime::Runtime, b: &Backend, n: u64) {
    let registry = Arc::new(MessageRegistry::new().with::<BenchMessage>());
    let encoded = encode(&Envelope::new(message(0))).expect("encode");
    for fetch in [1_usize, 64] {
        let config = format!("{}/fetch{fetch}", b.label);
        let suffix = fastrand::u32(..);
        let courier_table = format!("bench_courier_{suffix}");
        let raw_table = format!("bench_raw_{suffix}");
        let (courier, raw) = rt.block_on(async {
            let dsn = Dsn::parse(&format!(
                "{}?table_name={courier_table}&poll_window=50ms",
                b.base
            ))
            .expect("dsn");
            let courier = SqlTransport::connect("bench", &dsn, registry.clone())
                .await
                .expect("connect");
            // The raw table: same schema, created by the same setup.
            let dsn = Dsn::parse(&format!("{}?table_name={raw_table}", b.base)).expect("dsn");
            drop(
                SqlTransport::connect("setup", &dsn, registry.clone())
                    .await
                    .expect("setup"),
            );
            let pool = match &b.raw {
                Raw::Sqlite(p) => Raw::Sqlite(p.clone()),
                Raw::Postgres(p) => Raw::Postgres(p.clone()),
            };
            let raw = RawQueue {
                pool,
                table: raw_table.clone(),
                body: encoded.body.clone(),
                headers: encoded.headers_json(),
            };
            (courier, raw)
        });
        let mut group = c.benchmark_group(format!("sql/{config}"));
        group.throughput(Throughput::Elements(n));
        group.bench_function("raw", |bench| {
            bench.to_async(rt).iter_custom(|iters| {
                let (raw, config) = (&raw, &config);
                async move {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let start = Instant::now();
                        raw.produce(n, fetch).await;
                        let produced = start.elapsed();
                        raw.consume(n, fetch).await;
                        let consumed = start.elapsed() - produced;
                        record(config, "raw", produced, consumed, n);
                        total += produced + consumed;
                    }
                    total
                }
            });
        });
        group.bench_function("courier", |bench| {
            bench.to_async(rt).iter_custom(|iters| {
                let (courier, config) = (&courier, &config);
                async move {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let start = Instant::now();
                        courier_produce(courier, n, fetch).await;
                        let produced = start.elapsed();
                        courier_consume(courier, n, fetch).await;
                        let consumed = start.elapsed() - produced;
                        record(config, "courier", produced, consumed, n);
                        total += produced + consumed;
                    }
                    total
                }
            });
        });
        group.finish();
        rt.block_on(async {
            for table in [&courier_table, &raw_table] {
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

fn print_ratios() {
    let totals = TOTALS.lock().unwrap_or_else(|e| e.into_inner());
    let configs: Vec<&String> = totals
        .keys()
        .map(|(c, _)| c)
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    println!(
        "\nconfig                  raw produce  courier produce  ratio | raw consume  courier consume  ratio  (msg/s)"
    );
    for config in configs {
        let rate = |which: &'static str| {
            totals
                .get(&(config.clone(), which))
                .map(|(p, c, n)| (*n as f64 / p, *n as f64 / c))
        };
        if let (Some(raw), Some(courier)) = (rate("raw"), rate("courier")) {
            println!(
                "{config:<22} {:>12.0} {:>16.0} {:>6.2} | {:>11.0} {:>16.0} {:>6.2}",
                raw.0,
                courier.0,
                courier.0 / raw.0,
                raw.1,
                courier.1,
                courier.1 / raw.1
            );
        }
    }
}

fn main() {
    let n: u64 = std::env::var("COURIER_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
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
        n,
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
                n,
            );
        }
        _ => {
            println!("note: COURIER_TEST_POSTGRES_URL is not set; skipping the PostgreSQL benches")
        }
    }

    c.final_summary();
    print_ratios();
    let _ = std::fs::remove_dir_all(&dir);
}
