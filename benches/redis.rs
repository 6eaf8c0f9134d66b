//! Redis Streams: the raw `redis` driver doing the protocol by hand vs `RedisTransport`, same N,
//! same message, same ack pattern, in one process and one run.
//!
//! - produce, one at a time: `XADD` per message vs `send`
//! - produce, batch 64: 64 pipelined `XADD`s vs `send_batch(64)`
//! - consume, one at a time: `XREADGROUP COUNT 1` + pipelined `XACK`/`XDEL` vs `get(1)` + `ack`
//! - consume, batch 64: `XREADGROUP COUNT 64` + one `XACK` and one `XDEL` with 64 ids vs
//!   `get(64)` + `ack_batch`
//!
//! Both sides start from the application's typed messages, built before the clock starts, and
//! do the same job: the raw producer serializes each payload with serde_json and writes it with
//! a constant headers text; the raw consumer deserializes each body it reads. Courier encodes
//! and decodes whole envelopes (body, headers object, stamps).
//!
//! `COURIER_TEST_REDIS_URL=redis://127.0.0.1:6379 COURIER_BENCH_N=2000 cargo bench --bench redis --no-default-features --features redis`
//! prints criterion's figures (N messages per run one at a time, `COURIER_BENCH_N64`, default
//! 20 x N, batched), then `COURIER_BENCH_ROUNDS` (default 9) paired rounds: raw and
//! Courier back to back, the order alternating, with the median messages/s of each and the
//! median of the per-round ratios courier / raw.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Paired, rate};

use courier::{Envelope, Message, MessageRegistry, Transport, encode};
use courier_redis::{RedisOptions, RedisTransport};
use criterion::{Criterion, Throughput};
use redis::Value;
use redis::aio::MultiplexedConnection;
use serde::{Deserialize, Serialize};
use tokio::runtime::Runtime;

#[derive(Serialize, Deserialize)]
struct Payload {
    seq: u64,
    text: String,
}

impl Message for Payload {
    const NAME: &'static str = "bench.payload";
}

const GROUP: &str = "courier";

/// Messages per run of a one-at-a-time pattern: `COURIER_BENCH_N`, default 2,000.
fn n() -> u64 {
    std::env::var("COURIER_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
}

/// Messages per run of a batched pattern: `COURIER_BENCH_N64`, default 20 x N, so that a run
/// lasts as long as a one-at-a-time run and scheduling noise averages out.
fn n64() -> u64 {
    std::env::var("COURIER_BENCH_N64")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20 * n())
}

/// The messages per run of a pattern with this batch size.
fn n_for(batch: u64) -> u64 {
    if batch > 1 { n64() } else { n() }
}

fn payload(seq: u64) -> Payload {
    // ~200 bytes on the wire, like ../shared/BASELINES.md
    Payload {
        seq,
        text: "x".repeat(120),
    }
}

fn message(seq: u64) -> Envelope {
    Envelope::new(payload(seq))
}

struct Bench {
    rt: Runtime,
    conn: MultiplexedConnection,
    raw_stream: String,
    transport: RedisTransport,
    fields: (String, String),
}

impl Bench {
    fn new() -> Self {
        let url = std::env::var("COURIER_TEST_REDIS_URL")
            .expect("set COURIER_TEST_REDIS_URL=redis://127.0.0.1:6379");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let suffix = format!("{:08x}", fastrand_u32());
        let raw_stream = format!("courier_bench_raw_{suffix}");
        let (conn, transport) = rt.block_on(async {
            let client = redis::Client::open(url.as_str()).expect("redis url");
            let mut conn = client
                .get_multiplexed_async_connection()
                .await
                .expect("connect");
            let _: () = redis::cmd("XGROUP")
                .arg("CREATE")
                .arg(&raw_stream)
                .arg(GROUP)
                .arg("0")
                .arg("MKSTREAM")
                .query_async(&mut conn)
                .await
                .expect("XGROUP CREATE");
            let registry = Arc::new(MessageRegistry::new().with::<Payload>());
            let options = RedisOptions::default().stream(format!("courier_bench_courier_{suffix}"));
            let transport = RedisTransport::connect(&url, options, registry)
                .await
                .expect("transport");
            transport
                .abilities()
                .setup
                .expect("setup")
                .setup()
                .await
                .expect("setup");
            (conn, transport)
        });
        let encoded = encode(&message(0)).expect("encode");
        let fields = (encoded.body.clone(), encoded.headers_json());
        Self {
            rt,
            conn,
            raw_stream,
            transport,
            fields,
        }
    }

    fn xadd(&self, pipe: &mut redis::Pipeline, stream: &str, body: &str) {
        pipe.cmd("XADD")
            .arg(stream)
            .arg("*")
            .arg("body")
            .arg(body)
            .arg("headers")
            .arg(&self.fields.1);
    }

    /// Fills a stream with `n` messages (pipelined, not measured).
    async fn fill(&self, stream: &str, n: u64) {
        let mut conn = self.conn.clone();
        for chunk in 0..n.div_ceil(1000) {
            let mut pipe = redis::pipe();
            for _ in 0..(n - chunk * 1000).min(1000) {
                self.xadd(&mut pipe, stream, &self.fields.0);
                pipe.ignore();
            }
            let _: () = pipe.query_async(&mut conn).await.expect("fill");
        }
    }

    async fn clear(&self, stream: &str) {
        let mut conn = self.conn.clone();
        let _: () = redis::cmd("XTRIM")
            .arg(stream)
            .arg("MAXLEN")
            .arg(0)
            .query_async(&mut conn)
            .await
            .expect("XTRIM");
    }

    async fn raw_produce(&self, n: u64, batch: u64) -> Duration {
        let mut conn = self.conn.clone();
        let payloads: Vec<Payload> = (0..n).map(payload).collect();
        let start = Instant::now();
        for chunk in payloads.chunks(batch as usize) {
            let mut pipe = redis::pipe();
            for p in chunk {
                let body = serde_json::to_string(p).expect("serialize");
                self.xadd(&mut pipe, &self.raw_stream, &body);
            }
            let ids: Vec<String> = pipe.query_async(&mut conn).await.expect("XADD");
            assert_eq!(ids.len(), chunk.len());
        }
        let elapsed = start.elapsed();
        self.clear(&self.raw_stream).await;
        elapsed
    }

    async fn courier_produce(&self, n: u64, batch: u64) -> Duration {
        let mut envelopes = (0..n).map(message);
        let batches: Vec<Vec<Envelope>> = (0..n.div_ceil(batch))
            .map(|_| envelopes.by_ref().take(batch as usize).collect())
            .collect();
        let start = Instant::now();
        for batch in batches {
            if batch.len() == 1 {
                let envelope = batch.into_iter().next().expect("one envelope");
                self.transport.send(envelope).await.expect("send");
            } else {
                let k = batch.len();
                let out = self.transport.send_batch(batch).await.expect("send_batch");
                assert_eq!(out.len(), k);
            }
        }
        let elapsed = start.elapsed();
        self.clear(&self.transport.options().stream).await;
        elapsed
    }

    async fn raw_consume(&self, n: u64, count: u64) -> Duration {
        self.fill(&self.raw_stream, n).await;
        let mut conn = self.conn.clone();
        let start = Instant::now();
        let mut done = 0;
        while done < n {
            let reply: Value = redis::cmd("XREADGROUP")
                .arg("GROUP")
                .arg(GROUP)
                .arg("raw")
                .arg("COUNT")
                .arg(count)
                .arg("BLOCK")
                .arg(1000)
                .arg("STREAMS")
                .arg(&self.raw_stream)
                .arg(">")
                .query_async(&mut conn)
                .await
                .expect("XREADGROUP");
            let (ids, payloads) = read_entries(&reply);
            assert!(!ids.is_empty(), "raw consumer starved");
            assert_eq!(payloads.len(), ids.len(), "undecodable body");
            let mut pipe = redis::pipe();
            pipe.cmd("XACK")
                .arg(&self.raw_stream)
                .arg(GROUP)
                .arg(&ids)
                .ignore();
            pipe.cmd("XDEL").arg(&self.raw_stream).arg(&ids).ignore();
            let _: () = pipe.query_async(&mut conn).await.expect("XACK+XDEL");
            done += ids.len() as u64;
        }
        start.elapsed()
    }

    async fn courier_consume(&self, n: u64, count: u64) -> Duration {
        self.fill(&self.transport.options().stream, n).await;
        let start = Instant::now();
        let mut done = 0;
        while done < n {
            let got = self.transport.get(count as usize).await.expect("get");
            assert!(!got.is_empty(), "courier consumer starved");
            if got.len() == 1 {
                self.transport.ack(&got[0]).await.expect("ack");
            } else {
                self.transport.ack_batch(&got).await.expect("ack_batch");
            }
            done += got.len() as u64;
        }
        start.elapsed()
    }

    fn cleanup(&self) {
        self.rt.block_on(async {
            let mut conn = self.conn.clone();
            let mut keys = vec![self.raw_stream.clone()];
            keys.extend(self.transport.keys().iter().map(|k| (*k).to_owned()));
            let _: () = redis::cmd("DEL")
                .arg(keys)
                .query_async(&mut conn)
                .await
                .expect("DEL");
        });
    }
}

/// The ids and decoded bodies of an `XREADGROUP` reply, as a hand-written consumer reads them.
fn read_entries(reply: &Value) -> (Vec<String>, Vec<Payload>) {
    let (mut ids, mut payloads) = (Vec::new(), Vec::new());
    let Value::Array(streams) = reply else {
        return (ids, payloads);
    };
    let Some(Value::Array(stream)) = streams.first() else {
        return (ids, payloads);
    };
    let Some(Value::Array(entries)) = stream.get(1) else {
        return (ids, payloads);
    };
    for entry in entries {
        let Value::Array(parts) = entry else { continue };
        if let Some(Value::BulkString(id)) = parts.first() {
            ids.push(String::from_utf8_lossy(id).into_owned());
        }
        if let Some(Value::Array(fields)) = parts.get(1) {
            let body = fields.chunks_exact(2).find_map(|kv| match kv {
                [Value::BulkString(k), Value::BulkString(v)] if k == b"body" => Some(v),
                _ => None,
            });
            if let Some(p) = body.and_then(|b| serde_json::from_slice::<Payload>(b).ok()) {
                payloads.push(p);
            }
        }
    }
    (ids, payloads)
}

fn fastrand_u32() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    nanos ^ std::process::id().rotate_left(16)
}

const PATTERNS: [(&str, u64); 4] = [
    ("produce_1", 1),
    ("produce_64", 64),
    ("consume_1", 1),
    ("consume_64", 64),
];

impl Bench {
    /// One timed run of a pattern by one side.
    fn run(&self, pattern: &str, batch: u64, raw: bool, n: u64) -> Duration {
        self.rt.block_on(async {
            match (pattern.starts_with("produce"), raw) {
                (true, true) => self.raw_produce(n, batch).await,
                (true, false) => self.courier_produce(n, batch).await,
                (false, true) => self.raw_consume(n, batch).await,
                (false, false) => self.courier_consume(n, batch).await,
            }
        })
    }
}

fn redis_streams(c: &mut Criterion, bench: &Bench, paired: &mut Paired) {
    for (pattern, batch) in PATTERNS {
        let n = n_for(batch);
        let mut group = c.benchmark_group(format!("redis/{pattern}"));
        group
            .throughput(Throughput::Elements(n))
            .sample_size(10)
            .warm_up_time(Duration::from_millis(500));
        for side in ["raw", "courier"] {
            group.bench_function(side, |b| {
                b.iter_custom(|iters| {
                    // criterion's throughput is per iteration of N messages
                    (0..iters)
                        .map(|_| bench.run(pattern, batch, side == "raw", n))
                        .sum()
                });
            });
        }
        group.finish();
    }
    for round in 0..common::rounds() {
        for (pattern, batch) in PATTERNS {
            let n = n_for(batch);
            let raw_first = round % 2 == 0;
            let first = bench.run(pattern, batch, raw_first, n);
            let second = bench.run(pattern, batch, !raw_first, n);
            let (raw, courier) = if raw_first {
                (first, second)
            } else {
                (second, first)
            };
            paired.add(pattern, rate(n, raw), rate(n, courier));
        }
    }
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    let bench = Bench::new();
    let mut paired = Paired::default();
    redis_streams(&mut criterion, &bench, &mut paired);
    bench.cleanup();
    criterion.final_summary();
    paired.print(&format!(
        "N = {} (batch 1) / {} (batch 64) messages of ~200 bytes, {} paired rounds, medians:",
        n(),
        n64(),
        common::rounds()
    ));
}
