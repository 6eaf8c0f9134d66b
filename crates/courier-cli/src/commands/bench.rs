//! `courier bench`: send then consume N messages through the real worker path, then measure
//! send -> handler latency with an idle worker; with `--raw`, the raw driver doing the same
//! protocol work in the same run.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use courier_core::{
    CancellationToken, Dsn, Envelope, FactoryContext, HandlerError, Message, MessageBus,
    MessageRegistry, Transport, Worker,
};
use serde::{Deserialize, Serialize};

use crate::app::App;
use crate::cli::{BenchArgs, Cli, Format};
use crate::error::{CliError, CliResult};

/// The benchmark transport's name (the AMQP exchange and queue are named after it).
const BENCH: &str = "courier_bench";

/// The benchmark message.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct BenchMessage {
    seq: u64,
    payload: String,
}

impl Message for BenchMessage {
    const NAME: &'static str = "courier.bench";
}

/// Throughput and latency of one implementation.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct Figures {
    pub(crate) produce_per_s: f64,
    pub(crate) consume_per_s: f64,
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
}

/// What the raw driver is asked to do.
#[derive(Debug, Clone)]
#[cfg_attr(
    not(feature = "sql"),
    allow(dead_code, reason = "read by the raw SQL benchmark")
)]
pub(crate) struct Work {
    pub(crate) messages: u64,
    pub(crate) size: usize,
    pub(crate) fetch_size: usize,
    pub(crate) latency_samples: usize,
}

pub(crate) async fn run(app: &App, cli: &Cli, args: &BenchArgs) -> CliResult {
    let (dsn, temp) = match &args.dsn {
        Some(raw) => (
            Dsn::parse(raw).map_err(|e| CliError::usage(format!("--dsn: {e}")))?,
            None,
        ),
        None => {
            let path = std::env::temp_dir().join(format!(
                "courier-bench-{}.db",
                uuid::Uuid::new_v4().simple()
            ));
            (
                Dsn::parse(&format!("sqlite://{}", path.display()))
                    .map_err(|e| CliError::usage(e.to_string()))?,
                Some(path),
            )
        }
    };
    if let Some(p) = dsn.password() {
        crate::error::remember_secret(p);
    }
    let work = Work {
        messages: args.messages,
        size: usize::try_from(args.size).unwrap_or(200),
        fetch_size: usize::from(args.fetch_size),
        latency_samples: usize::try_from(args.messages / 20)
            .unwrap_or(500)
            .clamp(20, 500),
    };
    let result = measure(app, cli, args, &dsn, &work).await;
    if let Some(path) = temp {
        for suffix in ["", "-wal", "-shm", "-journal"] {
            let mut p = path.clone().into_os_string();
            p.push(suffix);
            let _ = std::fs::remove_file(p);
        }
    }
    result
}

async fn measure(app: &App, cli: &Cli, args: &BenchArgs, dsn: &Dsn, work: &Work) -> CliResult {
    let queue = format!("bench_{}", fastrand::u32(..));
    let isolated = isolate(dsn, &queue);
    let registry = Arc::new(MessageRegistry::new().with::<BenchMessage>());
    let ctx = FactoryContext::new(BENCH, isolated.clone()).registry(registry);
    let transport = app.factories.create(ctx).await?;
    if let Some(setup) = transport.as_setup() {
        setup.setup().await?;
    }
    if cli.format == Format::Text && !cli.quiet {
        eprintln!(
            "Benchmarking {dsn}: {} messages of {} B, fetch size {}, concurrency {}{}",
            work.messages,
            work.size,
            work.fetch_size,
            args.concurrency,
            if args.raw { ", and the raw driver" } else { "" }
        );
    }
    let rounds = args.rounds.unwrap_or(if args.raw { 3 } else { 1 });
    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    for round in 0..rounds {
        // ABBA order, so neither side always runs on the colder (or fuller) database.
        let raw_first = args.raw && round % 2 == 1;
        if raw_first {
            theirs.extend(crate::raw::measure(&isolated, work).await?);
        }
        ours.push(courier_figures(&transport, work, usize::from(args.concurrency)).await?);
        if args.raw && !raw_first {
            theirs.extend(crate::raw::measure(&isolated, work).await?);
        }
    }
    let courier = median(&ours);
    let raw = (!theirs.is_empty()).then(|| median(&theirs));
    let ratio = raw.map(|r| courier.consume_per_s / r.consume_per_s);
    if cli.format == Format::Json {
        let mut value = serde_json::json!({
            "dsn": dsn.to_string(),
            "messages": work.messages,
            "size": work.size,
            "fetch_size": work.fetch_size,
            "concurrency": args.concurrency,
            "rounds": rounds,
            "raw": raw,
            "ratio": ratio,
        });
        if let (Some(obj), Ok(serde_json::Value::Object(figs))) =
            (value.as_object_mut(), serde_json::to_value(courier))
        {
            obj.extend(figs);
        }
        let text =
            serde_json::to_string_pretty(&value).map_err(|e| CliError::runtime(e.to_string()))?;
        println!("{text}");
        return Ok(());
    }
    println!(
        "{:<10} {:>12} {:>12} {:>9} {:>9}",
        "", "produce/s", "consume/s", "p50 ms", "p99 ms"
    );
    let line = |name: &str, f: &Figures| {
        println!(
            "{name:<10} {:>12.0} {:>12.0} {:>9.3} {:>9.3}",
            f.produce_per_s, f.consume_per_s, f.p50_ms, f.p99_ms
        );
    };
    line("courier", &courier);
    match (&raw, ratio) {
        (Some(r), Some(ratio)) => {
            line("raw", r);
            println!("ratio (courier / raw consume): {ratio:.2}");
        }
        _ if args.raw => println!("raw: no raw implementation for `{}`", dsn.scheme()),
        _ => {}
    }
    Ok(())
}

/// The DSN with a queue of its own, so the benchmark never touches application messages: a
/// fresh SQL `queue_name`, the Redis stream `courier_bench` (AMQP: the transport name).
fn isolate(dsn: &Dsn, queue: &str) -> Dsn {
    match dsn.scheme() {
        "sqlite" | "postgres" | "postgresql" | "mysql" | "mariadb"
            if dsn.option("queue_name").is_none() =>
        {
            dsn.clone().with_option("queue_name", queue)
        }
        "redis" | "rediss" if dsn.option("stream").is_none() => {
            dsn.clone().with_option("stream", BENCH)
        }
        _ => dsn.clone(),
    }
}

/// A payload of `size` bytes of JSON-safe text.
pub(crate) fn payload(size: usize) -> String {
    "x".repeat(size)
}

async fn courier_figures(
    transport: &Arc<dyn Transport>,
    work: &Work,
    concurrency: usize,
) -> CliResult<Figures> {
    let body = payload(work.size);
    // Produce: batches of fetch_size through send_batch.
    let started = Instant::now();
    let mut seq = 0;
    while seq < work.messages {
        let n = (work.messages - seq).min(work.fetch_size as u64);
        let batch: Vec<Envelope> = (seq..seq + n)
            .map(|s| {
                Envelope::new(BenchMessage {
                    seq: s,
                    payload: body.clone(),
                })
            })
            .collect();
        transport.send_batch(batch).await?;
        seq += n;
    }
    let produce = started.elapsed();

    // Consume: the real worker path.
    let handled = Arc::new(AtomicU64::new(0));
    let count = handled.clone();
    let bus = bench_bus(transport, move |_| {
        count.fetch_add(1, Ordering::Relaxed);
    });
    let started = Instant::now();
    let stats = Worker::builder(bus)
        .receiver(BENCH, transport.clone())
        .fetch_size(work.fetch_size)
        .concurrency(concurrency)
        .sleep(Duration::from_millis(1))
        .limit(work.messages)
        .build()
        .run(CancellationToken::new())
        .await
        .map_err(|e| CliError::runtime(e.to_string()))?;
    let consume = started.elapsed();
    if stats.handled != work.messages {
        return Err(CliError::runtime(format!(
            "benchmark consumed {} of {} messages ({} failed)",
            stats.handled, work.messages, stats.failed
        )));
    }

    // Latency: one message at a time to an idle worker.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<u64>();
    let bus = bench_bus(transport, move |seq| {
        let _ = tx.send(seq);
    });
    let stop = CancellationToken::new();
    let worker = Worker::builder(bus)
        .receiver(BENCH, transport.clone())
        .fetch_size(work.fetch_size)
        .concurrency(concurrency)
        .sleep(Duration::from_millis(1))
        .ack_linger(Duration::ZERO)
        .build();
    let running = tokio::spawn(worker.run(stop.clone()));
    let mut samples = Vec::with_capacity(work.latency_samples);
    for i in 0..work.latency_samples as u64 {
        let sent = Instant::now();
        transport
            .send(Envelope::new(BenchMessage {
                seq: i,
                payload: body.clone(),
            }))
            .await?;
        match tokio::time::timeout(Duration::from_secs(30), rx.recv()).await {
            Ok(Some(_)) => samples.push(sent.elapsed()),
            _ => {
                stop.cancel();
                return Err(CliError::runtime("a latency sample took over 30 s"));
            }
        }
    }
    stop.cancel();
    let _ = running.await;
    let (p50, p99) = percentiles(&mut samples);
    Ok(Figures {
        produce_per_s: per_second(work.messages, produce),
        consume_per_s: per_second(work.messages, consume),
        p50_ms: p50,
        p99_ms: p99,
    })
}

fn bench_bus(
    transport: &Arc<dyn Transport>,
    on: impl Fn(u64) + Send + Sync + 'static,
) -> MessageBus {
    let on = Arc::new(on);
    MessageBus::builder()
        .transport(BENCH, transport.clone())
        .handler_fn("bench", move |m: Arc<BenchMessage>| {
            let on = on.clone();
            async move {
                on(m.seq);
                Ok::<(), HandlerError>(())
            }
        })
        .build()
}

pub(crate) fn per_second(n: u64, elapsed: Duration) -> f64 {
    n as f64 / elapsed.as_secs_f64().max(1e-9)
}

/// The median of each figure.
fn median(all: &[Figures]) -> Figures {
    let pick = |f: fn(&Figures) -> f64| {
        let mut v: Vec<f64> = all.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    Figures {
        produce_per_s: pick(|f| f.produce_per_s),
        consume_per_s: pick(|f| f.consume_per_s),
        p50_ms: pick(|f| f.p50_ms),
        p99_ms: pick(|f| f.p99_ms),
    }
}

/// p50 and p99 in milliseconds.
pub(crate) fn percentiles(samples: &mut [Duration]) -> (f64, f64) {
    if samples.is_empty() {
        return (0.0, 0.0);
    }
    samples.sort_unstable();
    let at = |q: f64| {
        let i = ((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1;
        samples[i].as_secs_f64() * 1000.0
    };
    (at(0.50), at(0.99))
}
