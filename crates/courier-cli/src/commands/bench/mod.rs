//! `courier bench`: three modes, each beside the raw driver where there is one.
//!
//! - default ([`throughput`]): send then consume N messages through the real worker path, then a
//!   short send -> handler latency sample; with `--raw`, the raw driver doing the same protocol
//!   work in paired rounds (ABBA order).
//! - `--runs` ([`runs`]): N scripted 3-step no-op runs executed by W in-process workers, with the
//!   run store's statements per run counted by a decorator.
//! - `--latency` ([`latency`]): an idle worker, one message at a time, beside the raw driver's
//!   floor (Redis blocking read, PostgreSQL LISTEN/NOTIFY + claim, RabbitMQ push, SQLite polling).

#[cfg(feature = "runs")]
mod counting;
mod cpu;
mod latency;
mod relay;
#[cfg(feature = "runs")]
mod runs;
#[cfg(feature = "runs")]
mod steps;
mod throughput;

use std::sync::Arc;

use courier_core::{Dsn, HandlerError, Message, MessageBus, Transport};
use serde::{Deserialize, Serialize};

pub(crate) use courier_raw::{
    CLASSIC_QUEUE_VERSION, Figures, Work, payload, per_second, percentiles,
};

use crate::cli::{BenchArgs, Cli, Format};
use crate::error::{CliError, CliResult};
use crate::wiring::Wiring;

/// The benchmark transport's name.
pub(crate) const BENCH: &str = "courier_bench";

/// Messages of the default mode when `--messages` is not given.
const DEFAULT_MESSAGES: u64 = 20_000;

/// The benchmark message.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct BenchMessage {
    pub(crate) seq: u64,
    pub(crate) payload: String,
}

impl Message for BenchMessage {
    const NAME: &'static str = "courier.bench";
}

pub(crate) async fn run(app: &Wiring, cli: &Cli, args: &BenchArgs) -> CliResult {
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
    for secret in dsn.secrets() {
        crate::error::remember_secret(secret);
    }
    let result = if args.runs {
        runs_mode(app, cli, args, &dsn).await
    } else if args.relay {
        relay::measure(
            app,
            cli,
            args,
            &dsn,
            args.messages.unwrap_or(DEFAULT_MESSAGES),
        )
        .await
    } else if args.latency {
        latency::measure(app, cli, args, &dsn).await
    } else {
        let messages = args.messages.unwrap_or(DEFAULT_MESSAGES);
        let work = Work {
            messages,
            size: usize::try_from(args.size).unwrap_or(200),
            fetch_size: usize::from(args.fetch_size),
            latency_samples: usize::try_from(messages / 20).unwrap_or(500).clamp(20, 500),
        };
        throughput::measure(app, cli, args, &dsn, &work).await
    };
    if let Some(path) = temp {
        for suffix in ["", "-wal", "-shm", "-journal"] {
            let mut p = path.clone().into_os_string();
            p.push(suffix);
            let _ = std::fs::remove_file(p);
        }
    }
    result
}

#[cfg(feature = "runs")]
async fn runs_mode(app: &Wiring, cli: &Cli, args: &BenchArgs, dsn: &Dsn) -> CliResult {
    match args.steps {
        Some(steps) => steps::measure(cli, args, dsn, u64::from(steps)).await,
        None => runs::measure(app, cli, args, dsn).await,
    }
}

#[cfg(not(feature = "runs"))]
async fn runs_mode(_: &Wiring, _: &Cli, _: &BenchArgs, _: &Dsn) -> CliResult {
    Err(CliError::usage(
        "--runs: this binary was built without the `runs` feature",
    ))
}

/// The DSN with a queue of its own, so the benchmark never touches application messages: a
/// fresh SQL `queue_name`, Redis stream or AMQP exchange and queue named `queue` (on AMQP a
/// classic queue of [`CLASSIC_QUEUE_VERSION`]), and on AMQP the prefetch set to the fetch size
/// (unless the DSN sets them).
pub(crate) fn isolate(dsn: &Dsn, queue: &str, fetch_size: u16) -> Dsn {
    match dsn.scheme() {
        "sqlite" | "postgres" | "postgresql" | "mysql" | "mariadb"
            if dsn.option("queue_name").is_none() =>
        {
            dsn.clone().with_option("queue_name", queue)
        }
        "redis" | "rediss" if dsn.option("stream").is_none() => {
            dsn.clone().with_option("stream", queue)
        }
        "nats" if dsn.path().trim_matches('/').is_empty() && dsn.option("stream").is_none() => {
            dsn.clone().with_option("stream", queue)
        }
        "amqp" | "amqps" => {
            let mut d = dsn.clone();
            if d.option("exchange").is_none() && d.option("queues").is_none() {
                d = d
                    .with_option("exchange", queue)
                    .with_option("queues", queue)
                    .with_option(
                        format!("queue_arguments[{queue}][x-queue-version]"),
                        CLASSIC_QUEUE_VERSION.to_string(),
                    );
            }
            if d.option("prefetch").is_none() {
                d = d.with_option("prefetch", fetch_size.to_string());
            }
            d
        }
        // Symfony's Doctrine table: a `queue_name` of its own (its rows are consumed).
        "symfony+sqlite" | "symfony+postgres" | "symfony+postgresql" | "symfony+mysql"
        | "symfony+mariadb"
            if dsn.option("queue_name").is_none() =>
        {
            dsn.clone().with_option("queue_name", queue)
        }
        // Symfony's Redis layout: a stream of its own (the path's stream, group and consumer win
        // over the options, so the path is replaced), removed afterwards with its delayed set.
        "symfony+redis" | "symfony+rediss" => {
            with_path(dsn, &format!("/{queue}")).unwrap_or_else(|| dsn.clone())
        }
        // Symfony's AMQP layout: an exchange and a queue of their own (the path's exchange
        // stays in the DSN; `exchange[name]` and `queues[...]` replace it), of the classic queue
        // version the `amqp://` side declares, and a delay exchange of their own.
        "symfony+amqp"
            if dsn.option("exchange[name]").is_none()
                && !dsn.options().iter().any(|(k, _)| k.starts_with("queues[")) =>
        {
            dsn.clone()
                .with_option("exchange[name]", queue)
                .with_option(
                    format!("queues[{queue}][arguments][x-queue-version]"),
                    CLASSIC_QUEUE_VERSION.to_string(),
                )
                .with_option("delay[exchange_name]", format!("{queue}_delays"))
        }
        _ => dsn.clone(),
    }
}

/// `dsn` with its path replaced by `path` (its scheme, authority and query kept).
fn with_path(dsn: &Dsn, path: &str) -> Option<Dsn> {
    let raw = dsn.expose();
    let authority = raw.find("://")? + 3;
    let path_at = raw[authority..]
        .find(['/', '?'])
        .map_or(raw.len(), |i| authority + i);
    let query_at = raw[path_at..].find('?').map_or(raw.len(), |i| path_at + i);
    Dsn::parse(&format!("{}{path}{}", &raw[..path_at], &raw[query_at..])).ok()
}

/// The broker of a `symfony+amqp://user:pass@host:port/vhost/exchange` DSN as
/// `amqp://user:pass@host:port/vhost`, without its query.
#[cfg(feature = "amqp")]
fn symfony_amqp_broker(dsn: &Dsn) -> Option<Dsn> {
    let raw = dsn.expose_without_query().strip_prefix("symfony+")?;
    let path = raw.find("://")? + 3;
    let end = match raw[path..].find('/') {
        Some(slash) => {
            let vhost = path + slash + 1;
            raw[vhost..]
                .find('/')
                .map_or(raw.len(), |next| vhost + next)
        }
        None => raw.len(),
    };
    Dsn::parse(&raw[..end]).ok()
}

/// Removes what [`isolate`] made the transport create on a server (AMQP: the exchange, its
/// delay exchange and the queue; Redis: the stream, its delayed keys and a keyed queue's; NATS: the stream); SQL
/// rows are consumed.
pub(crate) async fn remove_isolated(isolated: &Dsn, original: &Dsn) {
    #[cfg(feature = "redis")]
    if matches!(isolated.scheme(), "redis" | "rediss")
        && original.option("stream").is_none()
        && let Some(stream) = isolated.option("stream")
    {
        // A keyed queue's (`concurrency_max`, `fair`) keys too: its lists per key are gone
        // once consumed, these may stay.
        let keys = [
            stream.to_owned(),
            format!("{stream}:delayed"),
            format!("{stream}:delayed:data"),
            format!("{stream}:keyed:signal"),
            format!("{stream}:keyed:data"),
            format!("{stream}:keyed:key"),
            format!("{stream}:keyed:ring"),
            format!("{stream}:keyed:ringset"),
            format!("{stream}:keyed:delayed"),
            format!("{stream}:keyed:leases"),
            format!("{stream}:keyed:busy"),
        ];
        courier_raw::redis_streams::delete(isolated, &keys.each_ref().map(String::as_str)).await;
    }
    #[cfg(feature = "amqp")]
    if matches!(isolated.scheme(), "amqp" | "amqps")
        && original.option("exchange").is_none()
        && let (Some(exchange), Some(queue)) =
            (isolated.option("exchange"), isolated.option("queues"))
    {
        let delay = format!("{exchange}.delay");
        courier_raw::amqp::delete(isolated, &[queue], &[exchange, &delay]).await;
    }
    #[cfg(feature = "redis")]
    if matches!(isolated.scheme(), "symfony+redis" | "symfony+rediss")
        && let Some(stream) = isolated.path().trim_matches('/').split('/').next()
        && stream.starts_with("bench_")
        && isolated.path() != original.path()
        && let Some(server) = with_path(
            isolated,
            &isolated
                .option("dbindex")
                .map_or_else(String::new, |db| format!("/{db}")),
        )
        && let Ok(server) = Dsn::parse(server.expose().trim_start_matches("symfony+"))
    {
        let queue = format!("{stream}__queue");
        courier_raw::redis_streams::delete(&server, &[stream, &queue]).await;
    }
    #[cfg(feature = "amqp")]
    if isolated.scheme() == "symfony+amqp"
        && original.option("exchange[name]").is_none()
        && let (Some(exchange), Some(delays), Some(broker)) = (
            isolated.option("exchange[name]"),
            isolated.option("delay[exchange_name]"),
            symfony_amqp_broker(isolated),
        )
    {
        courier_raw::amqp::delete(&broker, &[exchange], &[exchange, delays]).await;
    }
    #[cfg(feature = "nats")]
    if isolated.scheme() == "nats"
        && original.option("stream").is_none()
        && isolated.option("stream").is_some()
    {
        let registry = std::sync::Arc::new(courier_core::MessageRegistry::new());
        match courier_nats::NatsTransport::connect("bench", isolated, registry).await {
            Ok(t) => {
                if let Err(e) = t.delete_stream().await {
                    tracing::warn!(error = %e, "bench: deleting the NATS stream failed");
                }
            }
            Err(e) => tracing::warn!(error = %e, "bench: deleting the NATS stream failed"),
        }
    }
    let _ = (isolated, original);
}

/// A bus with the benchmark handler, which calls `on` with each message's sequence number.
pub(crate) fn bench_bus(
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

/// Prints a JSON value (pretty) on stdout.
pub(crate) fn print_json(value: &serde_json::Value) -> CliResult {
    let text = serde_json::to_string_pretty(value).map_err(|e| CliError::runtime(e.to_string()))?;
    println!("{text}");
    Ok(())
}

/// Whether to print progress on stderr.
pub(crate) fn chatty(cli: &Cli) -> bool {
    cli.format == Format::Text && !cli.quiet
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    /// Both sides of a RabbitMQ round read a classic queue of the same version (the raw side
    /// declares `CLASSIC_QUEUE_VERSION` too), so the ratio is not the broker's draw of a v1 rate.
    #[cfg(feature = "amqp")]
    #[test]
    fn an_isolated_rabbitmq_queue_is_a_version_2_classic_queue() {
        use courier_amqp::{AmqpOptions, ArgumentValue, QueueOptions};

        let dsn: Dsn = "amqp://guest:guest@127.0.0.1:5672/%2f".parse().unwrap();
        let options = AmqpOptions::from_dsn(BENCH, &isolate(&dsn, "bench_7", 64)).unwrap();
        assert_eq!(options.exchange_name(), "bench_7");
        assert_eq!(
            options.queue_options(),
            [QueueOptions::new("bench_7")
                .argument("x-queue-version", ArgumentValue::Int(CLASSIC_QUEUE_VERSION))]
        );

        // A DSN that names its own queues keeps them as they are.
        let own: Dsn = "amqp://127.0.0.1/%2f?queues=orders".parse().unwrap();
        let options = AmqpOptions::from_dsn(BENCH, &isolate(&own, "bench_7", 64)).unwrap();
        assert_eq!(options.queue_options(), [QueueOptions::new("orders")]);
    }

    /// `courier bench` on a Symfony AMQP DSN measures on an exchange and a queue of its own (it
    /// never reads the application's queue), a classic queue of the version the `amqp://` side
    /// declares, and removes them through the DSN's broker and vhost.
    #[cfg(all(feature = "amqp", feature = "symfony"))]
    #[test]
    fn an_isolated_symfony_rabbitmq_queue_is_its_own_version_2_classic_queue() {
        use courier::symfony::{AmqpOptions, QueueArgument};

        let dsn: Dsn = "symfony+amqp://guest:s3cr3t@127.0.0.1:5672/%2f/orders?prefetch_count=64"
            .parse()
            .unwrap();
        let isolated = isolate(&dsn, "bench_7", 64);
        let options = AmqpOptions::from_query("orders", isolated.options()).unwrap();
        assert_eq!(options.exchange_name(), "bench_7");
        assert_eq!(options.delay_exchange_name(), "bench_7_delays");
        assert_eq!(options.queues().len(), 1);
        assert_eq!(options.queues()[0].name, "bench_7");
        assert_eq!(
            options.queues()[0].arguments,
            [(
                "x-queue-version".to_owned(),
                QueueArgument::Int(CLASSIC_QUEUE_VERSION)
            )]
        );
        let broker = symfony_amqp_broker(&isolated).unwrap();
        assert_eq!(
            broker.expose(),
            "amqp://guest:s3cr3t@127.0.0.1:5672/%2f",
            "the vhost, not the exchange"
        );

        // A DSN that names its own queues keeps them as they are.
        let own: Dsn = "symfony+amqp://127.0.0.1/%2f/orders?queues[orders]"
            .parse()
            .unwrap();
        assert_eq!(isolate(&own, "bench_7", 64), own);
    }

    /// `courier bench` on a Symfony Doctrine or Redis DSN measures on a queue of its own: a
    /// `queue_name` of its own in the table, a stream of its own on the server (the path's
    /// stream, which wins over the options, replaced), never the application's.
    #[test]
    fn an_isolated_symfony_table_or_stream_is_the_benchs_own() {
        let table: Dsn = "symfony+postgres://u:p@127.0.0.1/test?timezone=UTC"
            .parse()
            .unwrap();
        let isolated = isolate(&table, "bench_7", 64);
        assert_eq!(isolated.option("queue_name"), Some("bench_7"));
        assert_eq!(isolated.option("timezone"), Some("UTC"));
        let named: Dsn = "symfony+sqlite:///tmp/x.db?queue_name=emails"
            .parse()
            .unwrap();
        assert_eq!(isolate(&named, "bench_7", 64), named);

        let stream: Dsn = "symfony+redis://:s3cr3t@127.0.0.1:6379/messages/g/c?delete_after_ack=1"
            .parse()
            .unwrap();
        let isolated = isolate(&stream, "bench_7", 64);
        assert_eq!(
            isolated.expose(),
            "symfony+redis://:s3cr3t@127.0.0.1:6379/bench_7?delete_after_ack=1"
        );
        let bare: Dsn = "symfony+redis://127.0.0.1:6379".parse().unwrap();
        assert_eq!(
            isolate(&bare, "bench_7", 64).expose(),
            "symfony+redis://127.0.0.1:6379/bench_7"
        );
    }
}
