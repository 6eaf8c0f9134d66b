//! Concurrency per key for durable runs: a run submitted with a concurrency key carries it on
//! every `RunAgent` dispatched for it, so a keyed runs transport (`concurrency_max=N`) runs at
//! most N runs of one key at once across every worker; a key is never dropped silently.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![cfg(feature = "sqlite")]

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use courier_core::{Dsn, MessageBus, MessageRegistry, Worker};
use courier_runs::{
    Agent, AgentError, AgentOutcome, NewRun, RunAgent, RunContext, RunError, RunStatus, Runtime,
    Step,
};
use courier_sql::SqlTransport;
use serde_json::json;
use support::Fixture;
use tokio_util::sync::CancellationToken;

/// How many runs of each key run at once, and the most seen.
#[derive(Default)]
struct Gauge {
    now: HashMap<String, usize>,
    most: HashMap<String, usize>,
}

/// Holds a slot for a while: counts itself in while it runs, across a checkpoint.
struct Busy(Arc<Mutex<Gauge>>);

#[courier_runs::async_trait]
impl Agent for Busy {
    async fn run(&self, cx: &mut RunContext) -> Result<AgentOutcome, AgentError> {
        let key = cx
            .run()
            .concurrency_key
            .clone()
            .unwrap_or_else(|| "(none)".into());
        {
            let mut g = self.0.lock().unwrap();
            let n = g.now.entry(key.clone()).or_default();
            *n += 1;
            let n = *n;
            let most = g.most.entry(key.clone()).or_default();
            *most = (*most).max(n);
        }
        tokio::time::sleep(Duration::from_millis(120)).await;
        let step = cx.checkpoint(Step::new("work", json!(null))).await;
        tokio::time::sleep(Duration::from_millis(30)).await;
        *self.0.lock().unwrap().now.get_mut(&key).unwrap() -= 1;
        step?;
        Ok(AgentOutcome::Completed(json!("done")))
    }
}

async fn queue(dsn: &str) -> Arc<SqlTransport> {
    let mut registry = MessageRegistry::new();
    registry.register::<RunAgent>();
    let dsn = Dsn::parse(dsn).unwrap();
    let t = tokio::time::timeout(
        Duration::from_secs(20),
        SqlTransport::connect("runs", &dsn, Arc::new(registry)),
    )
    .await
    .unwrap()
    .unwrap();
    Arc::new(t)
}

/// One "host": a runtime of its own and a worker of 3 handlers on a connection of its own.
async fn host(fx: &Fixture, dsn: &str, name: &str, gauge: &Arc<Mutex<Gauge>>) -> (Runtime, Worker) {
    let queue = queue(dsn).await;
    let runtime = Runtime::builder(fx.store.clone())
        .agent("busy", Busy(gauge.clone()))
        .worker_identity(format!("worker:{name}:1:{name}"))
        .build();
    let bus = runtime
        .register(
            MessageBus::builder()
                .transport("runs", queue.clone())
                .route("courier.run_agent", ["runs"]),
        )
        .build();
    let worker = Worker::builder(bus)
        .receiver("runs", queue)
        .concurrency(3)
        .fetch_size(3)
        .sleep(Duration::from_millis(10))
        .build();
    (runtime, worker)
}

/// 2 hosts x 3 handlers, `concurrency_max=2`: 6 runs without a key (queued first, so a host's
/// first fetch takes 3 of them at once), then 10 runs of key a and 10 of key b, interleaved.
/// No key ever has more than 2 runs running; the runs without a key are not limited.
async fn at_most_max_runs_of_a_key_run_at_once(fx: &Fixture, dsn: &str) {
    let gauge = Arc::new(Mutex::new(Gauge::default()));
    let (submitter, first) = host(fx, dsn, "a", &gauge).await;
    let (_second_runtime, second) = host(fx, dsn, "b", &gauge).await;
    let mut ids = Vec::new();
    for i in 0..26 {
        let run = NewRun::new("busy", json!({ "i": i }));
        let run = match i {
            0..6 => run,
            _ if i % 2 == 0 => run.with_concurrency_key("tenant-a").unwrap(),
            _ => run.with_concurrency_key("tenant-b").unwrap(),
        };
        ids.push(submitter.submit(run).await.unwrap());
    }
    assert_eq!(
        fx.run(ids[6]).await.concurrency_key.as_deref(),
        Some("tenant-a"),
        "the key is stored with the run"
    );
    let stop = CancellationToken::new();
    let workers = [first, second].map(|w| {
        let stop = stop.clone();
        tokio::spawn(async move { w.run(stop).await })
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let mut done = 0;
        for &id in &ids {
            if fx.run(id).await.status == RunStatus::Completed {
                done += 1;
            }
        }
        if done == ids.len() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{done} of {} runs completed within 60 s",
            ids.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    for w in workers {
        w.await.unwrap().unwrap();
    }
    let g = gauge.lock().unwrap();
    assert_eq!(g.most.get("tenant-a"), Some(&2), "{:?}", g.most);
    assert_eq!(g.most.get("tenant-b"), Some(&2), "{:?}", g.most);
    assert!(
        g.most.get("(none)").is_some_and(|&n| n > 2),
        "runs without a key are not limited: {:?}",
        g.most
    );
    assert!(g.now.values().all(|&n| n == 0), "{:?}", g.now);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_max_runs_of_a_key_run_at_once_on_sqlite() {
    let fx = support::sqlite().await;
    let dir = support::TempDir::new();
    let dsn = format!(
        "sqlite://{}?poll_window=20ms&concurrency_max=2",
        dir.0.join("queue.db").display()
    );
    at_most_max_runs_of_a_key_run_at_once(&fx, &dsn).await;
    fx.cleanup().await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
async fn at_most_max_runs_of_a_key_run_at_once_on_postgres() {
    let cleanup = courier_test::Cleanup::new();
    let fx = support::postgres().await;
    let table = cleanup.postgres_table("runs_keyed");
    let url = courier_test::env::postgres_url();
    let sep = if url.contains('?') { '&' } else { '?' };
    let dsn = format!("{url}{sep}table_name={table}&poll_window=20ms&concurrency_max=2");
    at_most_max_runs_of_a_key_run_at_once(&fx, &dsn).await;
}

/// A run with a key, routed to a transport that cannot limit per key: refused before anything
/// is stored, naming the transport.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_is_refused_where_the_runs_transport_cannot_limit_per_key() {
    let fx = support::sqlite().await;
    let dir = support::TempDir::new();
    let dsn = format!("sqlite://{}", dir.0.join("queue.db").display());
    let gauge = Arc::new(Mutex::new(Gauge::default()));
    let (runtime, _worker) = host(&fx, &dsn, "a", &gauge).await;
    let run = NewRun::new("busy", json!({}))
        .with_concurrency_key("tenant-a")
        .unwrap();
    let id = run.id;
    let err = runtime.submit(run).await.unwrap_err();
    assert!(
        matches!(&err, RunError::NotKeyed { run_id, transport } if *run_id == id && transport == "runs"),
        "{err:?}"
    );
    assert!(err.to_string().contains("concurrency_max"), "{err}");
    assert!(fx.store.find(id).await.unwrap().is_none(), "nothing stored");
    // Without a key it is accepted.
    runtime
        .submit(NewRun::new("busy", json!({})))
        .await
        .unwrap();
    fx.cleanup().await;
}

#[test]
fn a_bad_key_is_refused_when_the_run_is_made() {
    let run = || NewRun::new("busy", json!({}));
    assert!(run().with_concurrency_key("").is_err());
    let long = "k".repeat(201);
    let err = run().with_concurrency_key(long).unwrap_err();
    assert!(err.to_string().contains("201 bytes"), "{err}");
    assert!(run().with_concurrency_key("k".repeat(200)).is_ok());
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs mysql: set COURIER_TEST_MYSQL_URL"]
async fn at_most_max_runs_of_a_key_run_at_once_on_mariadb() {
    let cleanup = courier_test::Cleanup::new();
    let fx = support::mysql().await;
    let table = cleanup.mysql_table("runs_keyed");
    let url = courier_test::env::mysql_url();
    let sep = if url.contains('?') { '&' } else { '?' };
    let dsn = format!("{url}{sep}table_name={table}&poll_window=20ms&concurrency_max=2");
    at_most_max_runs_of_a_key_run_at_once(&fx, &dsn).await;
}
