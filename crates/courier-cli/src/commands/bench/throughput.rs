//! The default mode: produce then consume N messages through the real worker path, then a short
//! latency sample with an idle worker; with `--raw`, the raw driver in paired rounds.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use courier_core::{
    CancellationToken, ConcurrencyKeyStamp, Dsn, Envelope, FactoryContext, MessageRegistry,
    Transport, Worker,
};

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
                        let figures =
                            courier_figures(plain, work, usize::from(args.concurrency), None)
                                .await?;
                        Ok::<_, CliError>(Some(figures))
                    }
                    None if args.raw => {
                        courier_raw::level(&isolated).await;
                        Ok(courier_raw::measure(&isolated, work).await?)
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
            if other_first {
                theirs.extend(other.await?);
                ours.push(mine.await?);
            } else {
                ours.push(mine.await?);
                theirs.extend(other.await?);
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
) -> CliResult<Figures> {
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
    let started = Instant::now();
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
    Ok(Figures {
        produce_per_s: per_second(work.messages, produce),
        consume_per_s: per_second(work.messages, consume),
        p50_ms: p50,
        p99_ms: p99,
    })
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
