//! End to end with the SQL transport and a real worker: the requeue delays are honoured by the
//! transport (a short backoff base keeps the test fast).
#![allow(clippy::unwrap_used)]
#![cfg(feature = "sqlite")]

mod support;

use std::sync::Arc;
use std::time::Duration;

use courier_core::{Dsn, MessageBus, MessageRegistry, Worker};
use courier_runs::{Backoff, RunAgent, RunStatus, Runtime, RuntimeOptions, ScriptedAgent};
use courier_sql::SqlTransport;
use serde_json::json;
use support::Fixture;
use tokio_util::sync::CancellationToken;

async fn completes_after_the_delays(fx: &Fixture, queue_dsn: &str) {
    let mut registry = MessageRegistry::new();
    registry.register::<RunAgent>();
    let dsn = Dsn::parse(queue_dsn).unwrap();
    let queue = tokio::time::timeout(
        Duration::from_secs(20),
        SqlTransport::connect("async", &dsn, Arc::new(registry)),
    )
    .await
    .unwrap()
    .unwrap();
    let queue = Arc::new(queue);
    let base = Duration::from_millis(300);
    let options = RuntimeOptions {
        backoff: Backoff::new(base, Duration::from_secs(10)),
        ..RuntimeOptions::default()
    };
    let runtime = Runtime::builder(fx.store.clone())
        .agent("scripted", ScriptedAgent)
        .options(options)
        .build();
    let bus = runtime
        .register(
            MessageBus::builder()
                .transport("async", queue.clone())
                .route("courier.run_agent", ["async"]),
        )
        .build();
    let input = json!({"steps": [{"fail": "server_error", "attempts": 2}, {"output": "done"}]});
    let id = runtime.enqueue("scripted", input).await.unwrap();
    let created = fx.run(id).await.created_at;

    let worker = Worker::builder(bus.clone())
        .receiver("async", queue.clone())
        .sleep(Duration::from_millis(20))
        .limit(3)
        .build();
    let stats = tokio::time::timeout(
        Duration::from_secs(30),
        worker.run(CancellationToken::new()),
    )
    .await
    .expect("the worker finished in time")
    .unwrap();
    assert_eq!(stats.handled, 3);
    let run = fx.run(id).await;
    assert_eq!((run.status, run.requeue_count), (RunStatus::Completed, 2));
    let waited = run.finished_at.unwrap() - created;
    assert!(
        waited >= 900,
        "not before 300 ms + 600 ms of backoff: {waited} ms"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_worker_completes_a_run_after_honouring_the_delays() {
    let fx = support::sqlite().await;
    let dir = support::TempDir::new();
    let dsn = format!(
        "sqlite://{}?poll_window=50ms",
        dir.0.join("queue.db").display()
    );
    completes_after_the_delays(&fx, &dsn).await;
    fx.cleanup().await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
async fn sql_worker_completes_a_run_after_honouring_the_delays_on_postgres() {
    let cleanup = courier_test::Cleanup::new();
    let fx = support::postgres().await;
    let table = cleanup.postgres_table("runs_queue");
    let url = courier_test::env::postgres_url();
    let sep = if url.contains('?') { '&' } else { '?' };
    let dsn = format!("{url}{sep}table_name={table}&poll_window=50ms");
    completes_after_the_delays(&fx, &dsn).await;
}
