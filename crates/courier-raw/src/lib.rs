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
//! every id of the batch. RabbitMQ (lapin): a durable fanout exchange and a durable queue of
//! their own; persistent, mandatory publishes of a batch on a confirm channel, then one wait for
//! all their confirms; `basic.qos(fetch_size)` and `basic.consume` (push); the deliveries already
//! pushed, up to `fetch_size`, are decoded and acked with one `basic.ack(multiple)`. NATS
//! (async-nats): a work-queue stream and a durable pull consumer of their own; a batch's
//! publishes, then all their PubAcks; one `no_wait` fetch of up to `fetch_size`; every `+ACK`
//! as a request, their answers awaited together. Other transports have no raw implementation
//! (`raw` is `null`).
//!
//! [`floor`] is the raw side of `courier bench --latency`: a consumer already waiting the
//! cheapest way the driver allows (see [`floor`]) and a sender on a connection of its own.
//! `runs` (a SQL feature) is the raw side of `courier bench --runs`; `postgres` has the raw
//! side of `courier bench --relay` (the drain's server time, and with `redis` the naive relay).
//!
//! A crate of its own below `courier-cli`, which converts its [`RawError`] and reports its
//! [`Figures`]: each driver comes with its feature (`sqlite`, `postgres`, `mysql`, `redis`,
//! `amqp`, `nats`; `sqlite` also measures `symfony+sqlite`, Symfony's Doctrine table, and `redis`
//! `symfony+redis`, Symfony's Redis layout); without
//! it the scheme has no raw implementation.

use std::sync::Arc;
use std::time::{Duration, Instant};

use courier_core::Dsn;
use tokio::sync::mpsc::UnboundedSender;

mod error;
pub mod figures;

pub use error::{RawError, RawResult};
pub use figures::{Figures, Work, payload, per_second, percentiles};

/// The version of the classic queues the benchmark declares on RabbitMQ, on both sides: a
/// version 1 queue is served at one of two rates drawn per queue, whichever client reads it
/// which would make one round's ratio the broker's draw.
/// Version 2 is the default from RabbitMQ 3.13 and the only one from 4.0; a broker older than
/// 3.10 ignores the argument.
pub const CLASSIC_QUEUE_VERSION: i64 = 2;

/// Measures the raw driver for `dsn`, or `None` when there is no raw implementation.
pub async fn measure(dsn: &Dsn, work: &Work) -> RawResult<Option<Figures>> {
    let _ = work;
    match dsn.scheme() {
        #[cfg(feature = "sqlite")]
        scheme @ ("sqlite" | "symfony+sqlite") => {
            let raw = if scheme == "sqlite" {
                sqlite::Raw::connect(dsn, work.fetch_size).await?
            } else {
                sqlite::Raw::symfony(dsn, work.fetch_size).await?
            };
            run(Arc::new(raw), work).await.map(Some)
        }
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => run(Arc::new(postgres::Raw::connect(dsn, None).await?), work)
            .await
            .map(Some),
        #[cfg(feature = "redis")]
        "redis" | "rediss" => run(Arc::new(redis_streams::Raw::connect(dsn).await?), work)
            .await
            .map(Some),
        #[cfg(feature = "redis")]
        "symfony+redis" => run(Arc::new(redis_streams::Raw::symfony(dsn).await?), work)
            .await
            .map(Some),
        #[cfg(feature = "amqp")]
        "amqp" | "amqps" => run(
            Arc::new(amqp::Raw::connect(dsn, work.fetch_size).await?),
            work,
        )
        .await
        .map(Some),
        #[cfg(feature = "nats")]
        "nats" => run(Arc::new(nats::Raw::connect(dsn).await?), work)
            .await
            .map(Some),
        _ => Ok(None),
    }
}

/// Makes the ground even before one side of a paired round: PostgreSQL `VACUUM`s the table
/// (Courier's, or Symfony's for a `symfony+postgres://` DSN).
pub async fn level(dsn: &Dsn) {
    #[cfg(feature = "postgres")]
    if matches!(
        dsn.scheme(),
        "postgres" | "postgresql" | "symfony+postgres" | "symfony+postgresql"
    ) {
        postgres::vacuum(dsn).await;
    }
    let _ = dsn;
}

/// Called with the `seq` of each decoded body, before its ack (the handler's place).
type OnHandled<'a> = &'a (dyn Fn(u64) + Send + Sync);

/// The protocol work of one raw driver.
#[cfg_attr(
    not(feature = "sql"),
    allow(dead_code, reason = "implemented by the SQL drivers")
)]
#[courier_core::async_trait]
trait Driver: Send + Sync + 'static {
    /// Stores these bodies as one batch.
    async fn send(&self, bodies: &[String]) -> RawResult;
    /// Claims, decodes (calling `on` with each body's `seq`) and deletes up to `max` rows;
    /// returns how many.
    async fn consume(&self, max: usize, on: OnHandled<'_>) -> RawResult<usize>;
    /// Removes what the benchmark created.
    async fn cleanup(&self) {}
}

/// A benchmark body: `{"seq": seq, "payload": "xxx..."}` (what the bench message encodes to).
fn body(seq: u64, size: usize) -> String {
    serde_json::json!({ "seq": seq, "payload": payload(size) }).to_string()
}

/// Decodes a body as JSON (the handler's decode) and returns its `seq`.
#[cfg_attr(
    not(any(feature = "sql", feature = "redis", feature = "amqp", feature = "nats")),
    allow(dead_code, reason = "used by the drivers")
)]
fn decode(body: &[u8], driver: &str) -> RawResult<u64> {
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| RawError::failed(format!("raw {driver} benchmark: bad body: {e}")))?;
    Ok(value
        .get("seq")
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(0))
}

/// Ignores handled messages.
fn ignore(_: u64) {}

/// Where a latency probe's consumer reports each message it handled: its `seq` and when the
/// handler ran (a sample ends there, not when the sender's own reply came back).
pub type Handled = UnboundedSender<(u64, std::time::Instant)>;

/// Reports `seq` handled now.
pub fn report_handled(handled: &Handled, seq: u64) {
    let _ = handled.send((seq, std::time::Instant::now()));
}

/// One side of `courier bench --latency`: a consumer already waiting, which reports the `seq`
/// of each message it handled (and when) on the channel it was made with, and a sender.
#[courier_core::async_trait]
pub trait Probe: Send + Sync {
    /// Sends the message `seq`.
    async fn send(&self, seq: u64) -> RawResult;
    /// Stops the consumer and removes what the probe created.
    async fn close(&self);
}

/// The raw latency floor for `dsn` and the name of its wait, or `None` without a raw driver:
///
/// - Redis: `XREADGROUP ... BLOCK` on a connection of its own, `XADD` on another;
/// - PostgreSQL: `LISTEN` on a connection of its own; each notification (or 1 s without one)
///   triggers the claim statement; the sender's `INSERT` carries the `pg_notify`, like the
///   transport's;
/// - RabbitMQ: a push consumer (`basic.consume`, `basic.qos(fetch_size)`), publishes confirmed
///   one by one;
/// - SQLite: no server push: the claim statement polled on the transport's schedule (5 ms,
///   doubling up to 250 ms while empty, back to 5 ms after a hit).
pub async fn floor(
    dsn: &Dsn,
    size: usize,
    fetch_size: usize,
    handled: Handled,
) -> RawResult<Option<(Box<dyn Probe>, &'static str)>> {
    let _ = (size, fetch_size, &handled);
    match dsn.scheme() {
        #[cfg(feature = "sqlite")]
        "sqlite" => {
            let raw = Arc::new(sqlite::Raw::connect(dsn, fetch_size).await?);
            let consumer = tokio::spawn(sqlite::poll(raw.clone(), fetch_size, handled));
            Ok(Some((
                Box::new(Floor {
                    raw,
                    consumer,
                    size,
                }),
                "polling (5 ms doubling to 250 ms)",
            )))
        }
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => {
            let channel = format!("bench_raw_{}", fastrand::u32(..));
            let raw = Arc::new(postgres::Raw::connect(dsn, Some(channel.clone())).await?);
            let consumer = postgres::listen(raw.clone(), channel, fetch_size, handled).await?;
            Ok(Some((
                Box::new(Floor {
                    raw,
                    consumer,
                    size,
                }),
                "LISTEN/NOTIFY + claim",
            )))
        }
        #[cfg(feature = "redis")]
        "redis" | "rediss" => {
            let raw = Arc::new(redis_streams::Raw::connect(dsn).await?);
            let consumer = raw.block(fetch_size, handled).await?;
            Ok(Some((
                Box::new(Floor {
                    raw,
                    consumer,
                    size,
                }),
                "XREADGROUP BLOCK",
            )))
        }
        #[cfg(feature = "amqp")]
        "amqp" | "amqps" => {
            let raw = Arc::new(amqp::Raw::connect(dsn, fetch_size).await?);
            let consumer = raw.push(handled).await?;
            Ok(Some((
                Box::new(Floor {
                    raw,
                    consumer,
                    size,
                }),
                "basic.consume push",
            )))
        }
        _ => Ok(None),
    }
}

/// A raw driver with its waiting consumer.
#[cfg_attr(
    not(any(feature = "sql", feature = "redis", feature = "amqp")),
    allow(dead_code, reason = "built by the drivers")
)]
struct Floor<D: Driver> {
    raw: Arc<D>,
    consumer: tokio::task::JoinHandle<()>,
    size: usize,
}

#[courier_core::async_trait]
impl<D: Driver> Probe for Floor<D> {
    async fn send(&self, seq: u64) -> RawResult {
        self.raw.send(&[body(seq, self.size)]).await
    }

    async fn close(&self) {
        self.consumer.abort();
        self.raw.cleanup().await;
    }
}

#[cfg_attr(
    not(feature = "sql"),
    allow(dead_code, reason = "used by the SQL drivers")
)]
async fn run<D: Driver>(raw: Arc<D>, work: &Work) -> RawResult<Figures> {
    let result = run_on(&raw, work).await;
    raw.cleanup().await;
    result
}

#[cfg_attr(
    not(feature = "sql"),
    allow(dead_code, reason = "used by the SQL drivers")
)]
async fn run_on<D: Driver>(raw: &Arc<D>, work: &Work) -> RawResult<Figures> {
    let body = |seq: u64| body(seq, work.size);
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
        let n = raw.consume(work.fetch_size, &ignore).await?;
        if n == 0 {
            return Err(RawError::failed("raw benchmark: rows went missing"));
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
                match raw.consume(fetch, &ignore).await {
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
                return Err(RawError::failed(
                    "raw benchmark: a latency sample took over 30 s",
                ));
            }
        }
    }
    consumer.abort();
    let (p50, p99) = percentiles(&mut samples);
    Ok(Figures {
        produce_per_s: per_second(work.messages, produce),
        consume_per_s: per_second(work.messages, consume),
        p50_ms: p50,
        p99_ms: p99,
    })
}

#[cfg(feature = "amqp")]
pub mod amqp;
#[cfg(feature = "nats")]
mod nats;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis_streams;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub mod runs;
#[cfg(feature = "sqlite")]
mod sqlite;
#[cfg(feature = "sqlite")]
mod symfony_sqlite;
