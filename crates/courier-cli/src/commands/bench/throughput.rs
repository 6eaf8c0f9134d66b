//! The default mode: produce then consume N messages through the real worker path, then a short
//! latency sample with an idle worker; with `--raw`, the raw driver in paired rounds.
//!
//! When both sides are Courier (`--beside`, `--concurrency-keys`), each side's produce and
//! consume phases are also metered in machine-wide CPU time per message (client and servers,
//! [`super::cpu`]): what sets the rate once the servers' cores are saturated, where on two
//! cores shared by the bench and its servers a phase is a chain of round trips. Both ratios are
//! printed; on such a machine each moves by a fifth or more from run to run (disk flushes, a
//! backend waiting for a core), so only many rounds tell.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use courier_core::{
    CancellationToken, ConcurrencyKeyStamp, Dsn, Envelope, FactoryContext, MessageRegistry,
    Transport, Worker,
};

use super::cpu::CpuClock;
use super::{
    BENCH, BenchMessage, Figures, Work, bench_bus, chatty, isolate, payload, per_second,
    percentiles, print_json, remove_isolated,
};
use crate::cli::{BenchArgs, Cli, Format};
use crate::error::{CliError, CliResult};
use crate::wiring::Wiring;

/// A transport on a queue of its own (see [`isolate`]), set up; the caller removes it.
async fn fresh(app: &Wiring, dsn: &Dsn, fetch_size: u16) -> CliResult<(Arc<dyn Transport>, Dsn)> {
    let queue = format!("bench_{}", fastrand::u32(..));
    let isolated = isolate(dsn, &queue, fetch_size);
    let registry = Arc::new(MessageRegistry::new().with::<BenchMessage>());
    let ctx = FactoryContext::new(BENCH, isolated.clone()).registry(registry);
    let transport = app.factories.create(ctx).await?;
    if let Some(setup) = transport.as_setup() {
        setup.setup().await?;
    }
    Ok((transport, isolated))
}

/// Paired rounds of Courier and (with `--raw`) the raw driver, each on a fresh queue.
pub(super) async fn measure(
    app: &Wiring,
    cli: &Cli,
    args: &BenchArgs,
    dsn: &Dsn,
    work: &Work,
) -> CliResult {
    if chatty(cli) {
        eprintln!(
            "Benchmarking {dsn}: {} messages of {} B, fetch size {}, concurrency {}{}",
            work.messages,
            work.size,
            work.fetch_size,
            args.concurrency,
            if args.raw { ", and the raw driver" } else { "" }
        );
    }
    // The second DSN Courier runs on, beside --dsn: with --beside, that DSN; with
    // --concurrency-keys, a plain queue of the same DSN (no flow-control options).
    let second = match (&args.beside, args.concurrency_keys) {
        (Some(raw), _) => {
            let beside = Dsn::parse(raw).map_err(|e| CliError::usage(format!("--beside: {e}")))?;
            for secret in beside.secrets() {
                crate::error::remember_secret(secret);
            }
            Some(beside)
        }
        (None, Some(_)) => Some(
            [
                "concurrency_max",
                "concurrency_key",
                "fair",
                "queue_name",
                "stream",
            ]
            .into_iter()
            .fold(dsn.clone(), Dsn::without_option),
        ),
        (None, None) => None,
    };
    let paired = args.raw || second.is_some();
    let rounds = args.rounds.unwrap_or(if paired { 3 } else { 1 });
    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    // Each round's CPU per message of both sides (Courier on both only).
    let mut cpu_rounds: Vec<(CpuPerMessage, CpuPerMessage)> = Vec::new();
    for round in 0..rounds {
        // Each round, each side starts on a queue and a connection of its own, as the raw side
        // always did: a broker's queue keeps state from the rounds before it (RabbitMQ's
        // classic queues move between serving from memory and from their index, at about twice
        // the rate apart), and one side must not inherit it while the other starts fresh.
        let (transport, isolated) = fresh(app, dsn, args.fetch_size).await?;
        let beside = match &second {
            Some(plain) => match fresh(app, plain, args.fetch_size).await {
                Ok(made) => Some(made),
                Err(e) => {
                    drop(transport);
                    remove_isolated(&isolated, dsn).await;
                    return Err(e);
                }
            },
            None => None,
        };
        // ABBA order, so neither side always runs on the colder (or fuller) database.
        let other_first = paired && round % 2 == 1;
        let measured = async {
            // Each side starts on a table without the other's dead rows (PostgreSQL: VACUUM).
            let other = async {
                match &beside {
                    Some((plain, plain_isolated)) => {
                        courier_raw::level(plain_isolated).await;
                        let (figures, cpu) =
                            courier_figures(plain, work, usize::from(args.concurrency), None)
                                .await?;
                        Ok::<_, CliError>(Some((figures, Some(cpu))))
                    }
                    None if args.raw => {
                        courier_raw::level(&isolated).await;
                        Ok(courier_raw::measure(&isolated, work)
                            .await?
                            .map(|figures| (figures, None)))
                    }
                    None => Ok(None),
                }
            };
            let mine = async {
                courier_raw::level(&isolated).await;
                courier_figures(
                    &transport,
                    work,
                    usize::from(args.concurrency),
                    args.concurrency_keys,
                )
                .await
            };
            let (mine, other) = if other_first {
                let other = other.await?;
                (mine.await?, other)
            } else {
                (mine.await?, other.await?)
            };
            ours.push(mine.0);
            if let Some((figures, cpu)) = other {
                theirs.push(figures);
                cpu_rounds.extend(cpu.map(|cpu| (mine.1, cpu)));
            }
            Ok::<_, CliError>(())
        }
        .await;
        drop(transport);
        remove_isolated(&isolated, dsn).await;
        if let (Some((plain, plain_isolated)), Some(second)) = (beside, &second) {
            drop(plain);
            remove_isolated(&plain_isolated, second).await;
        }
        measured?;
    }
    let on_second = second.is_some();
    let courier = median(&ours);
    // The side beside: the raw driver, or Courier on the second DSN (--beside, --concurrency-keys).
    let raw = (!theirs.is_empty()).then(|| median(&theirs));
    let ratio = raw.map(|r| courier.consume_per_s / r.consume_per_s);
    let produce_ratio = raw.map(|r| courier.produce_per_s / r.produce_per_s);
    // Each round ran both sides back to back: its own ratio shows how far the machine drifted
    // between rounds, which the ratio of the medians hides.
    let round_ratios: Vec<f64> = ours
        .iter()
        .zip(&theirs)
        .map(|(c, r)| c.consume_per_s / r.consume_per_s)
        .collect();
    let produce_round_ratios: Vec<f64> = ours
        .iter()
        .zip(&theirs)
        .map(|(c, r)| c.produce_per_s / r.produce_per_s)
        .collect();
    let cpu = CpuRatios::of(&cpu_rounds);
    if cli.format == Format::Json {
        let mut value = serde_json::json!({
            "mode": "throughput",
            "dsn": dsn.to_string(),
            "messages": work.messages,
            "size": work.size,
            "fetch_size": work.fetch_size,
            "concurrency": args.concurrency,
            "concurrency_keys": args.concurrency_keys,
            "rounds": rounds,
            "beside_dsn": args.beside.as_ref().and(second.as_ref()).map(ToString::to_string),
            "raw": if on_second { None } else { raw.as_ref() },
            "unkeyed": if on_second && args.beside.is_none() { raw.as_ref() } else { None },
            "beside": if args.beside.is_some() { raw.as_ref() } else { None },
            "ratio": ratio,
            "produce_ratio": produce_ratio,
            "round_ratios": round_ratios,
            "produce_round_ratios": produce_round_ratios,
            "cpu": cpu,
        });
        if let (Some(obj), Ok(serde_json::Value::Object(figs))) =
            (value.as_object_mut(), serde_json::to_value(courier))
        {
            obj.extend(figs);
        }
        return print_json(&value);
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
    let (other, ratio_of) = match (on_second, args.beside.is_some()) {
        (_, true) => ("beside", "dsn / beside"),
        (true, false) => ("unkeyed", "keyed / unkeyed"),
        (false, false) => ("raw", "courier / raw"),
    };
    match (&raw, ratio, produce_ratio) {
        (Some(r), Some(ratio), Some(produce)) => {
            line(other, r);
            println!("ratio ({ratio_of}): produce {produce:.2}, consume {ratio:.2}");
            for (what, ratios) in [
                ("produce", &produce_round_ratios),
                ("consume", &round_ratios),
            ] {
                if let Some((low, high)) = spread(ratios) {
                    println!(
                        "{what} ratio of each round (both sides back to back): {low:.2} to {high:.2}, median {:.2}, over {} rounds",
                        middle(ratios),
                        ratios.len()
                    );
                }
            }
            if let Some(cpu) = &cpu {
                cpu.print(other);
            }
        }
        _ if args.raw => println!("raw: no raw implementation for `{}`", dsn.scheme()),
        _ => {}
    }
    Ok(())
}

async fn courier_figures(
    transport: &Arc<dyn Transport>,
    work: &Work,
    concurrency: usize,
    keys: Option<u32>,
) -> CliResult<(Figures, CpuPerMessage)> {
    let body = payload(work.size);
    let keys: Vec<ConcurrencyKeyStamp> = (0..keys.unwrap_or(0))
        .map(|k| ConcurrencyKeyStamp::new(format!("key-{k}")))
        .collect::<Result<_, _>>()
        .map_err(|e| CliError::runtime(e.to_string()))?;
    let keyed = |seq: u64, envelope: Envelope| match keys.len() {
        0 => envelope,
        n => envelope.with(keys[usize::try_from(seq).unwrap_or(0) % n].clone()),
    };
    // Produce: batches of fetch_size through send_batch.
    let (started, cpu) = (Instant::now(), CpuClock::now());
    let mut seq = 0;
    while seq < work.messages {
        let n = (work.messages - seq).min(work.fetch_size as u64);
        let batch: Vec<Envelope> = (seq..seq + n)
            .map(|s| {
                keyed(
                    s,
                    Envelope::new(BenchMessage {
                        seq: s,
                        payload: body.clone(),
                    }),
                )
            })
            .collect();
        transport.send_batch(batch).await?;
        seq += n;
    }
    let produce = started.elapsed();
    let produce_cpu = cpu.and_then(|c| c.spent());

    // Consume: the real worker path.
    let handled = Arc::new(AtomicU64::new(0));
    let count = handled.clone();
    let bus = bench_bus(transport, move |_| {
        count.fetch_add(1, Ordering::Relaxed);
    });
    let (started, cpu) = (Instant::now(), CpuClock::now());
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
    let consume_cpu = cpu.and_then(|c| c.spent());
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
            .send(keyed(
                i,
                Envelope::new(BenchMessage {
                    seq: i,
                    payload: body.clone(),
                }),
            ))
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
    let figures = Figures {
        produce_per_s: per_second(work.messages, produce),
        consume_per_s: per_second(work.messages, consume),
        p50_ms: p50,
        p99_ms: p99,
    };
    let cpu = CpuPerMessage {
        produce_us: produce_cpu.map(|c| c.micros_per(work.messages)),
        consume_us: consume_cpu.map(|c| c.micros_per(work.messages)),
    };
    Ok((figures, cpu))
}

/// Machine-wide CPU microseconds per message of one side's phases (`None`: not Linux).
#[derive(Debug, Clone, Copy)]
struct CpuPerMessage {
    produce_us: Option<f64>,
    consume_us: Option<f64>,
}

/// The two sides' CPU per message over the rounds: medians, and the rate ratio it implies on a
/// saturated machine (the other side's CPU per message over this side's), each round's too.
#[derive(Debug, serde::Serialize)]
struct CpuRatios {
    /// Medians of this side's, then the other side's, CPU microseconds per message.
    produce_us: (f64, f64),
    consume_us: (f64, f64),
    /// Each round's rate ratio on a saturated machine (other's CPU / this side's).
    produce_round_ratios: Vec<f64>,
    round_ratios: Vec<f64>,
}

impl CpuRatios {
    /// `None` without a metered round (not Linux, or the raw driver beside).
    fn of(rounds: &[(CpuPerMessage, CpuPerMessage)]) -> Option<Self> {
        let pairs = |phase: fn(&CpuPerMessage) -> Option<f64>| -> Vec<(f64, f64)> {
            rounds
                .iter()
                .filter_map(|(mine, other)| Some((phase(mine)?, phase(other)?)))
                .filter(|(mine, other)| *mine > 0.0 && *other > 0.0)
                .collect()
        };
        let (produce, consume) = (pairs(|c| c.produce_us), pairs(|c| c.consume_us));
        if consume.is_empty() {
            return None;
        }
        let medians = |v: &[(f64, f64)]| {
            (
                middle(&v.iter().map(|p| p.0).collect::<Vec<_>>()),
                middle(&v.iter().map(|p| p.1).collect::<Vec<_>>()),
            )
        };
        let ratios = |v: &[(f64, f64)]| v.iter().map(|(mine, other)| other / mine).collect();
        Some(Self {
            produce_us: medians(&produce),
            consume_us: medians(&consume),
            produce_round_ratios: ratios(&produce),
            round_ratios: ratios(&consume),
        })
    }

    fn print(&self, other: &str) {
        println!(
            "CPU per message, machine-wide (client and servers), courier / {other}: \
             produce {:.1} / {:.1} us, consume {:.1} / {:.1} us",
            self.produce_us.0, self.produce_us.1, self.consume_us.0, self.consume_us.1
        );
        for (what, ratios) in [
            ("produce", &self.produce_round_ratios),
            ("consume", &self.round_ratios),
        ] {
            if !ratios.is_empty() {
                println!(
                    "{what} ratio by CPU (the rate ratio of a saturated machine), each round's median {:.2}{}",
                    middle(ratios),
                    spread(ratios).map_or(String::new(), |(low, high)| format!(
                        " ({low:.2} to {high:.2}, {} rounds)",
                        ratios.len()
                    ))
                );
            }
        }
    }
}

/// The median of `values` (the upper one of an even count; 0 when empty).
fn middle(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// The lowest and highest of `values` (`None` when there are fewer than two).
fn spread(values: &[f64]) -> Option<(f64, f64)> {
    if values.len() < 2 {
        return None;
    }
    let low = values.iter().copied().fold(f64::INFINITY, f64::min);
    let high = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Some((low, high))
}

/// The median of each figure.
fn median(all: &[Figures]) -> Figures {
    let pick = |f: fn(&Figures) -> f64| middle(&all.iter().map(f).collect::<Vec<_>>());
    Figures {
        produce_per_s: pick(|f| f.produce_per_s),
        consume_per_s: pick(|f| f.consume_per_s),
        p50_ms: pick(|f| f.p50_ms),
        p99_ms: pick(|f| f.p99_ms),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpu(produce: Option<f64>, consume: Option<f64>) -> CpuPerMessage {
        CpuPerMessage {
            produce_us: produce,
            consume_us: consume,
        }
    }

    #[test]
    fn cpu_ratios_are_the_other_sides_cost_over_this_sides_round_by_round() {
        let rounds = [
            (cpu(Some(10.0), Some(50.0)), cpu(Some(9.0), Some(40.0))),
            (cpu(Some(8.0), Some(60.0)), cpu(Some(8.0), Some(30.0))),
            // A round whose phases were too short to tick is left out, not counted as free.
            (cpu(Some(0.0), Some(40.0)), cpu(Some(7.0), Some(36.0))),
        ];
        let ratios = CpuRatios::of(&rounds).expect("metered rounds");
        assert_eq!(ratios.round_ratios, vec![0.8, 0.5, 0.9]);
        assert_eq!(ratios.produce_round_ratios, vec![0.9, 1.0]);
        // Medians of each side (the upper of an even count).
        assert_eq!(ratios.consume_us, (50.0, 36.0));
        assert_eq!(ratios.produce_us, (10.0, 9.0));
    }

    #[test]
    fn no_cpu_figures_without_a_metered_round() {
        assert!(CpuRatios::of(&[]).is_none());
        assert!(CpuRatios::of(&[(cpu(None, None), cpu(Some(1.0), Some(1.0)))]).is_none());
    }
}
