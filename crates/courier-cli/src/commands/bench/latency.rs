//! `courier bench --latency`: pickup latency of an idle worker, beside the raw driver's floor.
//!
//! Courier's side is a worker (`--fetch-size`, `--concurrency`, the worker's defaults otherwise)
//! on one transport instance, and a second transport instance on the same DSN that sends, as
//! another process would (so no in-process wake-up helps; `in-memory://` sends to itself). Each sample sends one message and
//! times until the handler runs (the handler's own timestamp: the sender's reply, which in this
//! one process competes for the same cores as the consumer's work after the pickup, is not
//! waited for). The raw side ([`courier_raw::floor`]) does the same with the
//! driver's cheapest wait. Before each sample the benchmark pauses 1-5 ms (uniformly random),
//! so each send lands at a random point of the consumer's wait; 3 unrecorded warm-up messages
//! open each side. The two sides' samples alternate one by one in ABBA order (Courier, raw,
//! raw, Courier, ...): whatever drifts on the machine between samples falls on both alike.
//! (Rounds of a few hundred samples per side let that drift decide the ratio; sample by
//! sample, it does not.)

use std::sync::Arc;
use std::time::{Duration, Instant};

use courier_core::{
    CancellationToken, Dsn, Envelope, FactoryContext, MessageRegistry, Transport, Worker,
};
use courier_raw::{Handled, report_handled};
use serde_json::json;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use super::{
    BENCH, BenchMessage, bench_bus, chatty, isolate, payload, percentiles, print_json,
    remove_isolated,
};
use crate::cli::{BenchArgs, Cli, Format};
use crate::error::{CliError, CliResult};
use crate::wiring::Wiring;

/// Unrecorded messages that open each side.
const WARM_UP: u64 = 3;
/// The longest a sample may take.
const SAMPLE_TIMEOUT: Duration = Duration::from_secs(30);

pub(super) async fn measure(app: &Wiring, cli: &Cli, args: &BenchArgs, dsn: &Dsn) -> CliResult {
    let queue = format!("bench_{}", fastrand::u32(..));
    let isolated = isolate(dsn, &queue, args.fetch_size);
    let result = interleaved(app, cli, args, dsn, &isolated).await;
    remove_isolated(&isolated, dsn).await;
    result
}

async fn interleaved(
    app: &Wiring,
    cli: &Cli,
    args: &BenchArgs,
    dsn: &Dsn,
    isolated: &Dsn,
) -> CliResult {
    let size = usize::try_from(args.size).unwrap_or(200);
    let fetch_size = usize::from(args.fetch_size);
    let samples = args.samples as usize;
    if chatty(cli) {
        eprintln!(
            "Pickup latency on {dsn}: {samples} samples of {size} B per side, idle worker \
             (fetch size {fetch_size}, concurrency {}), beside the raw driver",
            args.concurrency
        );
    }
    let (courier_tx, mut courier_rx) = unbounded_channel();
    let courier = CourierProbe::start(
        app,
        isolated,
        size,
        fetch_size,
        usize::from(args.concurrency),
        courier_tx,
    )
    .await?;
    let (raw_tx, mut raw_rx) = unbounded_channel();
    let raw = match courier_raw::floor(isolated, size, fetch_size, raw_tx).await {
        Ok(raw) => raw,
        Err(e) => {
            courier.close().await;
            return Err(e.into());
        }
    };
    let result = alternate(
        (&courier, &mut courier_rx),
        raw.as_ref()
            .map(|(probe, _)| (probe as &dyn Probe, &mut raw_rx)),
        samples,
    )
    .await;
    courier.close().await;
    if let Some((probe, _)) = &raw {
        probe.close().await;
    }
    let (mut ours, mut theirs) = result?;

    let (p50, p99) = percentiles(&mut ours);
    let floor = raw.as_ref().map(|(_, name)| *name);
    let raw_figures = floor.map(|name| {
        let (p50, p99) = percentiles(&mut theirs);
        (p50, p99, name)
    });
    let ratio = raw_figures.map(|(raw_p50, _, _)| p50 / raw_p50.max(1e-9));
    if cli.format == Format::Json {
        return print_json(&json!({
            "mode": "latency",
            "dsn": dsn.to_string(),
            "samples": samples,
            "size": size,
            "fetch_size": fetch_size,
            "concurrency": args.concurrency,
            "courier": { "p50_ms": p50, "p99_ms": p99 },
            "raw": raw_figures.map(|(p50, p99, floor)| json!({
                "p50_ms": p50, "p99_ms": p99, "floor": floor,
            })),
            "ratio": ratio,
        }));
    }
    println!("{:<10} {:>9} {:>9}", "", "p50 ms", "p99 ms");
    println!("{:<10} {p50:>9.3} {p99:>9.3}", "courier");
    match (raw_figures, ratio) {
        (Some((raw_p50, raw_p99, floor)), Some(ratio)) => {
            println!("{:<10} {raw_p50:>9.3} {raw_p99:>9.3}   ({floor})", "raw");
            println!("ratio (courier / raw p50): {ratio:.2}");
        }
        _ => println!("raw: no raw implementation for `{}`", dsn.scheme()),
    }
    Ok(())
}

/// One side of `courier bench --latency`: a consumer already waiting, which reports the `seq`
/// of each message it handled (and when) on the channel it was made with, and a sender.
#[courier_core::async_trait]
trait Probe: Send + Sync {
    /// Sends the message `seq`.
    async fn send(&self, seq: u64) -> CliResult;
    /// Stops the consumer and removes what the probe created.
    async fn close(&self);
}

/// The raw driver's side ([`courier_raw::floor`]).
#[courier_core::async_trait]
impl Probe for Box<dyn courier_raw::Probe> {
    async fn send(&self, seq: u64) -> CliResult {
        Ok(courier_raw::Probe::send(self.as_ref(), seq).await?)
    }

    async fn close(&self) {
        courier_raw::Probe::close(self.as_ref()).await;
    }
}

/// A probe and the receiver its handler reports to.
type Side<'a> = (&'a dyn Probe, &'a mut UnboundedReceiver<(u64, Instant)>);

/// Warms both sides up, then takes `samples` from each, one by one in ABBA order (Courier, raw,
/// raw, Courier, ...): whatever drifts on the machine between samples (another process, the
/// servers' state) falls on both sides alike. Returns Courier's samples and the raw side's.
async fn alternate(
    (courier, courier_rx): Side<'_>,
    mut raw: Option<Side<'_>>,
    samples: usize,
) -> CliResult<(Vec<Duration>, Vec<Duration>)> {
    let mut ours = Vec::with_capacity(samples);
    let mut theirs = Vec::with_capacity(samples);
    let mut seq = 0;
    warm_up(courier, courier_rx, &mut seq).await?;
    if let Some((probe, rx)) = &mut raw {
        warm_up(*probe, rx, &mut seq).await?;
    }
    for i in 0..samples {
        let raw_first = i % 2 == 1;
        if raw_first && let Some((probe, rx)) = &mut raw {
            theirs.extend(sample(*probe, rx, 1, &mut seq).await?);
        }
        ours.extend(sample(courier, courier_rx, 1, &mut seq).await?);
        if !raw_first && let Some((probe, rx)) = &mut raw {
            theirs.extend(sample(*probe, rx, 1, &mut seq).await?);
        }
    }
    Ok((ours, theirs))
}

/// Sends a few unrecorded messages through `probe` (connections, listeners, consumers open).
async fn warm_up(
    probe: &dyn Probe,
    rx: &mut UnboundedReceiver<(u64, Instant)>,
    seq: &mut u64,
) -> CliResult {
    sample(probe, rx, WARM_UP as usize, seq).await.map(drop)
}

/// `n` samples: pause 1-5 ms, send one message, wait until it was handled; each sample is
/// the time from the send's start to the handler's run (reported by the handler), whether or
/// not the sender's own reply came back first.
async fn sample(
    probe: &dyn Probe,
    rx: &mut UnboundedReceiver<(u64, Instant)>,
    n: usize,
    seq: &mut u64,
) -> CliResult<Vec<Duration>> {
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        tokio::time::sleep(Duration::from_micros(fastrand::u64(1_000..=5_000))).await;
        *seq += 1;
        let expected = *seq;
        let sent = Instant::now();
        probe.send(expected).await?;
        let deadline = tokio::time::Instant::now() + SAMPLE_TIMEOUT;
        loop {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some((got, at))) if got == expected => {
                    samples.push(at.saturating_duration_since(sent));
                    break;
                }
                // A late copy of an earlier message (a redelivery): not this sample.
                Ok(Some(_)) => {}
                Ok(None) => return Err(CliError::runtime("latency benchmark: consumer stopped")),
                Err(_) => {
                    return Err(CliError::runtime(format!(
                        "latency benchmark: a message was not handled within {SAMPLE_TIMEOUT:?}"
                    )));
                }
            }
        }
    }
    Ok(samples)
}

/// Courier's side: a worker on one transport instance, a sender on another.
struct CourierProbe {
    sender: Arc<dyn Transport>,
    stop: CancellationToken,
    worker: tokio::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    body: String,
}

impl CourierProbe {
    async fn start(
        app: &Wiring,
        dsn: &Dsn,
        size: usize,
        fetch_size: usize,
        concurrency: usize,
        handled: Handled,
    ) -> CliResult<Self> {
        let registry = Arc::new(MessageRegistry::new().with::<BenchMessage>());
        let ctx = FactoryContext::new(BENCH, dsn.clone()).registry(registry.clone());
        let transport = app.factories.create(ctx).await?;
        if let Some(setup) = transport.as_setup() {
            setup.setup().await?;
        }
        // A transport with no server (in-memory) is one queue per instance: it sends to itself.
        let sender = if matches!(dsn.scheme(), "in-memory" | "sync") {
            transport.clone()
        } else {
            let ctx = FactoryContext::new(BENCH, dsn.clone()).registry(registry);
            app.factories.create(ctx).await?
        };
        let bus = bench_bus(&transport, move |seq| {
            report_handled(&handled, seq);
        });
        let stop = CancellationToken::new();
        let worker = Worker::builder(bus)
            .receiver(BENCH, transport)
            .fetch_size(fetch_size)
            .concurrency(concurrency)
            .build();
        let running = worker.run(stop.clone());
        let worker = tokio::spawn(async move {
            if let Err(e) = running.await {
                tracing::warn!(error = %e, "latency benchmark worker failed");
            }
        });
        Ok(Self {
            sender,
            stop,
            worker: tokio::sync::Mutex::new(Some(worker)),
            body: payload(size),
        })
    }
}

#[courier_core::async_trait]
impl Probe for CourierProbe {
    async fn send(&self, seq: u64) -> CliResult {
        self.sender
            .send(Envelope::new(BenchMessage {
                seq,
                payload: self.body.clone(),
            }))
            .await?;
        Ok(())
    }

    async fn close(&self) {
        self.stop.cancel();
        if let Some(worker) = self.worker.lock().await.take() {
            let _ = worker.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A probe whose handler runs at once but whose send returns only 200 ms later (a sender's
    /// reply delayed by whatever else the process does).
    struct SlowReply(Handled);

    #[courier_core::async_trait]
    impl Probe for SlowReply {
        async fn send(&self, seq: u64) -> CliResult {
            report_handled(&self.0, seq);
            tokio::time::sleep(Duration::from_millis(200)).await;
            Ok(())
        }

        async fn close(&self) {}
    }

    /// A probe that notes its name in `order` at each send, then reports it handled.
    struct Named(
        &'static str,
        Handled,
        Arc<std::sync::Mutex<Vec<&'static str>>>,
    );

    #[courier_core::async_trait]
    impl Probe for Named {
        async fn send(&self, seq: u64) -> CliResult {
            self.2
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(self.0);
            report_handled(&self.1, seq);
            Ok(())
        }

        async fn close(&self) {}
    }

    #[tokio::test]
    async fn the_two_sides_samples_alternate_one_by_one_in_abba_order() {
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (c_tx, mut c_rx) = unbounded_channel();
        let (r_tx, mut r_rx) = unbounded_channel();
        let courier = Named("c", c_tx, order.clone());
        let raw = Named("r", r_tx, order.clone());
        let (ours, theirs) = alternate((&courier, &mut c_rx), Some((&raw, &mut r_rx)), 4)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((ours.len(), theirs.len()), (4, 4));
        let sent = order
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .concat();
        // Three warm-up messages each, then c r r c c r r c.
        assert_eq!(sent, "cccrrrcrrccrrc");
    }

    #[tokio::test]
    async fn a_sample_ends_when_the_handler_ran_not_when_the_send_returned() {
        let (tx, mut rx) = unbounded_channel();
        let mut seq = 0;
        let samples = sample(&SlowReply(tx), &mut rx, 2, &mut seq)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(samples.len(), 2);
        assert!(
            samples.iter().all(|s| *s < Duration::from_millis(100)),
            "{samples:?}"
        );
    }
}
