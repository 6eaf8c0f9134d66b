//! What bounds a real `courier consume` process, and a worker built from the same configuration
//! through the library: the transport's `handler_timeout` (a scripted run that hangs is the
//! hung handler: its `RunAgent` message's handler executes it), `--memory-limit`, and the
//! rate limit and pause flag of the configuration.

#![cfg(feature = "sqlite")]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Env, wait};
use courier_core::config::{Config, Transports};
use courier_core::{
    CancellationToken, Envelope, HandlerError, Message, MessageRegistry, StopReason,
    TransportRegistry, WorkerStats,
};
use serde::{Deserialize, Serialize};

/// `async` (its handler timeout and retries as given) and its failure transport, in `db`.
fn config(db: &str, async_extra: &str) -> String {
    format!(
        r#"
[transports.async]
dsn = "{db}"
failure_transport = "failed"
{async_extra}

[transports.failed]
dsn = "{db_failed}"

[routing]
"courier.run_agent" = "async"
"test.ping" = "async"

[runs]
store = "sqlite://courier.db"
"#,
        db_failed = failed_dsn(db),
    )
}

fn failed_dsn(db: &str) -> String {
    let sep = if db.contains('?') { '&' } else { '?' };
    match db.split_once("queue_name=") {
        Some((base, _)) => format!("{base}queue_name=failed"),
        None => format!("{db}{sep}queue_name=failed"),
    }
}

/// A run that hangs for 30 s, then one that completes at once; a worker running one handler
/// at a time handles the second only once the first's slot is freed.
fn hung_then_quick(env: &Env) -> (String, String) {
    let hung = env.submit(r#"{"steps":[{"hang_ms":30000}]}"#);
    let quick = env.submit(r#"{"steps":[{"output":"done"}]}"#);
    (hung, quick)
}

fn consume(env: &Env, args: &[&str]) -> (serde_json::Value, String, Duration) {
    let mut all = vec!["consume", "async", "--sleep", "20ms", "--format", "json"];
    all.extend_from_slice(args);
    let started = Instant::now();
    // The hung run takes 30 s: a worker that waits for it fails the deadline.
    let run = wait(env.spawn(&all), Duration::from_secs(20));
    let took = started.elapsed();
    (run.json(), run.stderr, took)
}

/// The handler timeout drops the hung run's handler: the worker goes on to the next message,
/// and the failure transport holds the hung one with class `timeout` and the timeout.
fn hung_handler_is_dropped_and_moved(dsn: &str) {
    let env = Env::empty();
    env.write(
        "courier.toml",
        &config(
            dsn,
            "handler_timeout = \"300ms\"\nretry = { max_retries = 0 }",
        ),
    );
    env.run(&["setup"]).ok();
    let (_, quick) = hung_then_quick(&env);
    let (out, stderr, took) = consume(&env, &["--limit", "2"]);
    assert!(took < Duration::from_secs(15), "took {took:?}");
    assert_eq!(
        (
            &out["handled"],
            &out["failed"],
            &out["moved_to_failure"],
            &out["stop_reason"]
        ),
        (
            &serde_json::json!(1),
            &serde_json::json!(1),
            &serde_json::json!(1),
            &serde_json::json!("message limit reached")
        ),
        "{out}\n{stderr}"
    );
    assert!(
        stderr.contains("handler timed out") && stderr.contains("did not finish within 300ms"),
        "the timeout is logged: {stderr}"
    );
    assert_eq!(env.show(&quick)["status"], "completed");
    let failed = env.run(&["failed", "show", "--format", "json"]).json();
    let rows = failed.as_array().expect("an array");
    assert_eq!(rows.len(), 1, "{failed}");
    assert_eq!(rows[0]["type"], "courier.run_agent");
    assert_eq!(rows[0]["error_class"], "timeout");
    assert_eq!(
        rows[0]["error"],
        "handling `courier.run_agent` did not finish within 300ms"
    );
}

#[test]
fn sqlite_consume_drops_a_hung_handler_at_the_handler_timeout_and_moves_it() {
    hung_handler_is_dropped_and_moved("sqlite://courier.db");
}

#[test]
#[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
fn postgres_consume_drops_a_hung_handler_at_the_handler_timeout_and_moves_it() {
    let dsn = common::sql_queues("COURIER_TEST_POSTGRES_URL", "cli_timeout");
    hung_handler_is_dropped_and_moved(&dsn("default"));
}

#[test]
fn a_timed_out_handler_is_retried_as_the_retry_strategy_says() {
    let env = Env::empty();
    env.write(
        "courier.toml",
        &config(
            "sqlite://courier.db",
            "handler_timeout = \"300ms\"\nretry = { max_retries = 1, delay = \"50ms\" }",
        ),
    );
    env.submit(r#"{"steps":[{"hang_ms":30000}]}"#);
    // The retry finds the run claimed by the dropped attempt (its lease runs on, for the
    // reaper): it is acked.
    let (out, stderr, took) = consume(&env, &["--limit", "2"]);
    assert!(took < Duration::from_secs(15), "took {took:?}");
    assert_eq!(
        (&out["failed"], &out["retried"], &out["moved_to_failure"]),
        (
            &serde_json::json!(1),
            &serde_json::json!(1),
            &serde_json::json!(0)
        ),
        "{out}\n{stderr}"
    );
}

#[test]
fn consume_with_a_low_memory_limit_stops_on_it() {
    let env = Env::empty();
    env.write("courier.toml", &config("sqlite://courier.db", ""));
    let id = env.submit(r#"{"steps":[{"output":"done"}]}"#);
    // A worker process holds more than 1 MiB: the limit is passed at the first check.
    let (out, stderr, _) = consume(&env, &["--memory-limit", "1M", "--time-limit", "15s"]);
    assert_eq!(
        out["stop_reason"], "memory limit reached",
        "{out}\n{stderr}"
    );
    assert_eq!(out["handled"], 0, "{out}");
    assert_eq!(
        env.show(&id)["status"],
        "queued",
        "left for the next worker"
    );
    // A limit far above it does not stop the worker.
    let (out, _, _) = consume(&env, &["--memory-limit", "64G", "--limit", "1"]);
    assert_eq!(out["stop_reason"], "message limit reached", "{out}");
    assert_eq!(env.show(&id)["status"], "completed");
}

/// A message the library-built worker handles.
#[derive(Debug, Serialize, Deserialize)]
struct Ping(u32);

impl Message for Ping {
    const NAME: &'static str = "test.ping";
}

async fn connect(text: &str) -> Transports {
    let config: Config = text.parse().unwrap_or_else(|e| panic!("config: {e}"));
    let factories = TransportRegistry::new().with(Arc::new(courier_sql::SqlTransportFactory));
    let messages = Arc::new(MessageRegistry::new().with::<Ping>());
    tokio::time::timeout(
        Duration::from_secs(10),
        config.connect(&factories, messages),
    )
    .await
    .unwrap_or_else(|_| panic!("connecting timed out"))
    .unwrap_or_else(|e| panic!("connect: {e}"))
}

async fn send_pings(transports: &Transports, n: u32) {
    let bus = transports.bus_builder().build();
    for i in 0..n {
        bus.dispatch(Envelope::new(Ping(i)))
            .await
            .unwrap_or_else(|e| panic!("send: {e}"));
    }
}

/// Runs the worker `Transports::worker` builds for `async` until `limit` messages or `for_at_most`.
async fn library_worker(transports: &Transports, limit: u64, for_at_most: Duration) -> WorkerStats {
    let bus = transports
        .bus_builder()
        .handler_fn("ping", |_: Arc<Ping>| async { Ok::<(), HandlerError>(()) })
        .build();
    let worker = transports
        .worker(bus, &["async".to_owned()])
        .unwrap_or_else(|e| panic!("worker: {e}"))
        .sleep(Duration::from_millis(20))
        .limit(limit)
        .time_limit(for_at_most)
        .build();
    tokio::time::timeout(
        for_at_most + Duration::from_secs(10),
        worker.run(CancellationToken::new()),
    )
    .await
    .unwrap_or_else(|_| panic!("the worker did not stop"))
    .unwrap_or_else(|e| panic!("worker: {e}"))
}

fn absolute(env: &Env) -> String {
    format!("sqlite://{}", env.path("courier.db").display())
}

#[test]
fn a_worker_built_from_the_configuration_honours_courier_pause() {
    let env = Env::empty();
    let text = config(&absolute(&env), "");
    env.write("courier.toml", &text);
    env.run(&["setup"]).ok();
    env.run(&["pause", "async"]).ok();
    common::block_on(async {
        let transports = connect(&text).await;
        send_pings(&transports, 3).await;
        let stats = library_worker(&transports, 3, Duration::from_millis(1_500)).await;
        assert_eq!(
            (stats.received, stats.stop_reason),
            (0, Some(StopReason::TimeLimit)),
            "a paused queue's worker fetches nothing: {stats:?}"
        );
    });
    env.run(&["resume", "async"]).ok();
    common::block_on(async {
        let transports = connect(&text).await;
        let stats = library_worker(&transports, 3, Duration::from_secs(10)).await;
        assert_eq!(
            (stats.handled, stats.stop_reason),
            (3, Some(StopReason::MessageLimit)),
            "{stats:?}"
        );
    });
    // `courier consume` honours it the same way.
    env.run(&["pause", "async"]).ok();
    let id = env.submit(r#"{"steps":[{"output":"done"}]}"#);
    let (out, _, _) = consume(&env, &["--time-limit", "1s"]);
    assert_eq!(out["received"], 0, "{out}");
    env.run(&["resume", "async"]).ok();
    let (out, _, _) = consume(&env, &["--limit", "1"]);
    assert_eq!(out["handled"], 1, "{out}");
    assert_eq!(env.show(&id)["status"], "completed");
}

#[test]
fn a_worker_built_from_the_configuration_keeps_to_its_rate_limit() {
    let env = Env::empty();
    // 10 a second in bursts of 1: 12 messages take at least 1.1 s.
    let text = config(
        &absolute(&env),
        "rate_limit = { limit = 10, interval = \"1s\", burst = 1 }",
    );
    env.write("courier.toml", &text);
    env.run(&["setup"]).ok();
    common::block_on(async {
        let transports = connect(&text).await;
        send_pings(&transports, 12).await;
        let started = Instant::now();
        let stats = library_worker(&transports, 12, Duration::from_secs(20)).await;
        let took = started.elapsed();
        assert_eq!(stats.handled, 12, "{stats:?}");
        assert!(
            took >= Duration::from_millis(1_050),
            "12 messages at 10/s in bursts of 1 took {took:?}"
        );
    });
}
