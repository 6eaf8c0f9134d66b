//! `courier bench --relay --dsn OUTBOX --to DESTINATION`: the relay's throughput from a SQL
//! outbox to a destination, beside the destination's own batched send in the same run. Each
//! round sends `--messages` straight to the destination with `send_batch` in batches of
//! `--fetch-size` (the baseline), then fills the outbox (untimed) and times the relay draining
//! it into the destination (`Relay::run`, pipelined, until it forwarded them all), batches of
//! the same size; then fills it again and times the same relay into an in-memory transport: the
//! outbox's own ceiling, what no destination can raise; on PostgreSQL, then the server's own
//! share of that ceiling: the execution time of the relay's drain (its lock and its delete, as
//! one statement) over the same rows
//! (`EXPLAIN ANALYZE`, no round trip, no commit); and from PostgreSQL to Redis, the raw drivers
//! doing the relay's work in the naive loop (sqlx and redis-rs: take a batch, `XADD` it in one
//! pipeline, commit; `courier_raw::postgres::RawRelay`). Medians over `--rounds`.
//!
//! Beside each rate, the machine-wide CPU time each phase spent per message (client and
//! servers alike, see [`super::cpu`]) and Courier's own share of it (the rest is the
//! servers'): with the servers on the bench's machine, a phase that keeps the cores busy is
//! paced by that cost, so the relay's ratio to the destination's own send is bounded by the
//! inverse ratio of their costs.

use std::sync::Arc;
use std::time::Instant;

use courier_core::relay::{Relay, RelayOptions};
use courier_core::{
    CancellationToken, Dsn, Envelope, FactoryContext, InMemoryTransport, MessageRegistry, Transport,
};

use super::cpu::{CpuClock, CpuSpent};
use super::{BenchMessage, chatty, isolate, payload, per_second, remove_isolated};
use crate::cli::{BenchArgs, Cli, Format};
use crate::error::{CliError, CliResult};
use crate::wiring::Wiring;

pub(crate) async fn measure(
    app: &Wiring,
    cli: &Cli,
    args: &BenchArgs,
    outbox: &Dsn,
    messages: u64,
) -> CliResult {
    let to = args
        .to
        .as_deref()
        .ok_or_else(|| CliError::usage("--relay needs --to DESTINATION_DSN"))?;
    let to = Dsn::parse(to).map_err(|e| CliError::usage(format!("--to: {e}")))?;
    for secret in to.secrets() {
        crate::error::remember_secret(secret);
    }
    let queue = format!("bench_relay_{}", fastrand::u32(..));
    let (from_dsn, to_dsn) = (
        isolate(outbox, &queue, args.fetch_size),
        isolate(&to, &queue, args.fetch_size),
    );
    let result = rounds(app, cli, args, &from_dsn, &to_dsn, messages).await;
    remove_isolated(&to_dsn, &to).await;
    #[cfg(feature = "postgres")]
    if matches!(from_dsn.scheme(), "postgres" | "postgresql")
        && outbox.option("queue_name").is_none()
        && from_dsn.parse_option::<bool>("cursor").ok().flatten() == Some(true)
    {
        courier_raw::postgres::forget_cursor(&from_dsn).await;
    }
    result
}

async fn connect(app: &Wiring, name: &str, dsn: &Dsn) -> CliResult<Arc<dyn Transport>> {
    let registry = Arc::new(MessageRegistry::new().with::<BenchMessage>());
    let transport = app
        .factories
        .create(FactoryContext::new(name, dsn.clone()).registry(registry))
        .await?;
    if let Some(setup) = transport.as_setup() {
        setup.setup().await?;
    }
    Ok(transport)
}

async fn send_all(t: &Arc<dyn Transport>, messages: u64, batch: usize, body: &str) -> CliResult {
    let mut seq = 0;
    while seq < messages {
        let end = (seq + batch as u64).min(messages);
        let envelopes: Vec<Envelope> = (seq..end)
            .map(|seq| {
                Envelope::new(BenchMessage {
                    seq,
                    payload: body.to_owned(),
                })
                .with(courier_core::MessageIdStamp::new())
            })
            .collect();
        t.send_batch(envelopes).await?;
        seq = end;
    }
    Ok(())
}

/// Takes everything off the destination (between rounds), acking it.
async fn drain(t: &Arc<dyn Transport>, messages: u64) -> CliResult {
    let mut left = messages;
    while left > 0 {
        let got = t.get(500).await?;
        if got.is_empty() {
            break;
        }
        t.ack_batch(&got).await?;
        left = left.saturating_sub(got.len() as u64);
    }
    Ok(())
}

async fn rounds(
    app: &Wiring,
    cli: &Cli,
    args: &BenchArgs,
    from_dsn: &Dsn,
    to_dsn: &Dsn,
    messages: u64,
) -> CliResult {
    let from = connect(app, "outbox", from_dsn).await?;
    let to = connect(app, "destination", to_dsn).await?;
    let batch = usize::from(args.fetch_size);
    let body = payload(usize::try_from(args.size).unwrap_or(200));
    let rounds = args.rounds.unwrap_or(3);
    if chatty(cli) {
        eprintln!(
            "Benchmarking the relay {} -> {}: {messages} messages of {} B, batches of {batch}, {rounds} round(s)",
            from_dsn, to_dsn, args.size
        );
    }
    let (mut direct, mut relayed, mut alone, mut raw) = (
        Phase::default(),
        Phase::default(),
        Phase::default(),
        Phase::default(),
    );
    let mut floor = Vec::new();
    let memory: Arc<dyn Transport> = Arc::new(InMemoryTransport::new());
    for _ in 0..rounds {
        let (started, cpu) = (Instant::now(), CpuClock::now());
        send_all(&to, messages, batch, &body).await?;
        direct.push(messages, started.elapsed(), cpu.and_then(|c| c.spent()));
        drain(&to, messages).await?;

        relay_rate(&from, &to, messages, batch, &body, &mut relayed).await?;
        drain(&to, messages).await?;

        relay_rate(&from, &memory, messages, batch, &body, &mut alone).await?;
        drain(&memory, messages).await?;

        if let Some(rate) = raw_drain(from_dsn, messages, batch, &body).await? {
            floor.push(rate);
        }
        raw_relay(from_dsn, to_dsn, messages, batch, &body, &mut raw).await?;
    }
    let (cpu_direct, cpu_relayed, cpu_alone, cpu_raw) =
        (direct.cpu(), relayed.cpu(), alone.cpu(), raw.cpu());
    let (direct, relayed, alone) = (direct.rate(), relayed.rate(), alone.rate());
    let raw = (!raw.rates.is_empty()).then(|| raw.rate());
    let ratio = relayed / direct;
    let floor = (!floor.is_empty()).then(|| median(&mut floor));
    if cli.format == Format::Json {
        let cpu = |c: Option<(f64, f64, f64)>| {
            c.map(|(us, cores, own)| {
                serde_json::json!({"us_per_msg": us, "cores_busy": cores, "courier_us_per_msg": own})
            })
        };
        super::print_json(&serde_json::json!({
            "mode": "relay", "from": from_dsn.to_string(), "to": to_dsn.to_string(),
            "messages": messages, "size": args.size, "batch_size": batch, "rounds": rounds,
            "direct_send_per_s": direct, "relay_per_s": relayed, "ratio": ratio,
            "outbox_alone_per_s": alone, "drain_execution_per_s": floor,
            "raw_relay_per_s": raw,
            "cpu": {
                "direct_send": cpu(cpu_direct), "relay": cpu(cpu_relayed),
                "outbox_alone": cpu(cpu_alone), "raw_relay": cpu(cpu_raw),
            },
        }))
    } else {
        let cpu = |c: Option<(f64, f64, f64)>| {
            c.map(|(us, cores, own)| {
                format!("  CPU {us:.1} us/msg (Courier {own:.1}), {cores:.2} cores busy")
            })
            .unwrap_or_default()
        };
        println!(
            "destination send_batch: {direct:>10.0} msg/s{}",
            cpu(cpu_direct)
        );
        println!(
            "relay from the outbox:  {relayed:>10.0} msg/s  ({ratio:.2}x){}",
            cpu(cpu_relayed)
        );
        println!(
            "relay into memory:      {alone:>10.0} msg/s  (the outbox's ceiling, {:.2}x the destination){}",
            alone / direct,
            cpu(cpu_alone)
        );
        if let Some(raw) = raw {
            println!(
                "raw relay (sqlx + redis): {raw:>8.0} msg/s  (the drivers doing the relay's work in the naive loop: {:.2}x the destination; Courier's relay {:.2}x this){}",
                raw / direct,
                relayed / raw,
                cpu(cpu_raw)
            );
        }
        if let Some(floor) = floor {
            println!(
                "drain statements alone: {floor:>10.0} msg/s  (the server's execution time of the relay's lock and DELETE ... RETURNING as one statement, no round trip, no commit: {:.2}x the destination)",
                floor / direct
            );
        }
        Ok(())
    }
}

/// The server's execution time of the drain statements over the same rows, without a relay
/// (see `courier_raw::postgres::drain_rate`); `None` for another outbox.
async fn raw_drain(dsn: &Dsn, messages: u64, batch: usize, body: &str) -> CliResult<Option<f64>> {
    let _ = (messages, batch, body);
    match dsn.scheme() {
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => Ok(Some(
            courier_raw::postgres::drain_rate(dsn, messages, batch, body).await?,
        )),
        _ => Ok(None),
    }
}

/// From a PostgreSQL outbox to Redis, the raw drivers doing the relay's work in the naive loop
/// (see `courier_raw::postgres::RawRelay`): fills an outbox of its own (untimed), then times relaying
/// it, into `phase`. Nothing for other pairs.
async fn raw_relay(
    from: &Dsn,
    to: &Dsn,
    messages: u64,
    batch: usize,
    body: &str,
    phase: &mut Phase,
) -> CliResult {
    let _ = (messages, batch, body, &phase);
    #[cfg(all(feature = "postgres", feature = "redis"))]
    if matches!(from.scheme(), "postgres" | "postgresql") && matches!(to.scheme(), "redis") {
        let mut raw = courier_raw::postgres::RawRelay::fill(from, to, messages, body).await?;
        let (started, cpu) = (Instant::now(), CpuClock::now());
        let relayed = raw.run(batch).await;
        phase.push(messages, started.elapsed(), cpu.and_then(|c| c.spent()));
        raw.cleanup().await;
        relayed?;
    }
    #[cfg(not(all(feature = "postgres", feature = "redis")))]
    let _ = (from, to);
    Ok(())
}

/// Fills the outbox (untimed), then times one relay forwarding all of it to `to`, into `phase`.
async fn relay_rate(
    from: &Arc<dyn Transport>,
    to: &Arc<dyn Transport>,
    messages: u64,
    batch: usize,
    body: &str,
    phase: &mut Phase,
) -> CliResult {
    send_all(from, messages, 500, body).await?;
    let relay = Relay::new("outbox", from.clone(), "destination", to.clone()).options(
        RelayOptions::default()
            .batch_size(batch)
            .limit(Some(messages)),
    );
    let (started, cpu) = (Instant::now(), CpuClock::now());
    relay.run(CancellationToken::new()).await?;
    phase.push(messages, started.elapsed(), cpu.and_then(|c| c.spent()));
    Ok(())
}

/// One phase's figures over the rounds: its rate and, where the machine tells, its CPU cost.
#[derive(Default)]
struct Phase {
    rates: Vec<f64>,
    /// CPU microseconds per message (machine-wide), cores busy, and this process's CPU
    /// microseconds per message, per round.
    cpu: Vec<(f64, f64, f64)>,
}

impl Phase {
    fn push(&mut self, messages: u64, elapsed: std::time::Duration, cpu: Option<CpuSpent>) {
        self.rates.push(per_second(messages, elapsed));
        if let Some(cpu) = cpu {
            self.cpu.push((
                cpu.micros_per(messages),
                cpu.cores(),
                cpu.own_micros_per(messages),
            ));
        }
    }

    /// The median rate.
    fn rate(&mut self) -> f64 {
        median(&mut self.rates)
    }

    /// The median CPU cost per message, the median cores busy and the median cost in this
    /// process; `None` if any round lacked a figure.
    fn cpu(&self) -> Option<(f64, f64, f64)> {
        if self.cpu.is_empty() || self.cpu.len() != self.rates.len() {
            return None;
        }
        let column = |pick: fn(&(f64, f64, f64)) -> f64| {
            median(&mut self.cpu.iter().map(pick).collect::<Vec<_>>())
        };
        Some((column(|c| c.0), column(|c| c.1), column(|c| c.2)))
    }
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}
