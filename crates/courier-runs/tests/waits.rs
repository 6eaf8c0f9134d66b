//! Durable waits with a real worker and the SQL transport: 1,000 runs waiting for a signal hold
//! no worker slot (a worker at concurrency 4 keeps handling other messages), and signals sent
//! after every part was restarted resume each run once.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use courier_core::{Dsn, Envelope, Message, MessageBus, MessageRegistry, Worker};
use courier_runs::{
    RunAgent, RunStatus, RunStore, Runtime, RuntimeOptions, ScriptedAgent, SignalSent, StepStatus,
};
use courier_sql::SqlTransport;
use serde::{Deserialize, Serialize};
use serde_json::json;
use support::Fixture;
use tokio_util::sync::CancellationToken;

const RUNS: usize = 1_000;

#[derive(Serialize, Deserialize)]
struct Ping;

impl Message for Ping {
    const NAME: &'static str = "test.ping";
}

/// The queue, a runtime and a bus routing `RunAgent` and `Ping` to it, and a running worker at
/// concurrency 4: one "process".
struct Process {
    runtime: Runtime,
    bus: MessageBus,
    stop: CancellationToken,
    worker: tokio::task::JoinHandle<()>,
}

async fn start(fx: &Fixture, queue_dsn: &str, pings: Arc<AtomicUsize>) -> Process {
    let mut registry = MessageRegistry::new();
    registry.register::<RunAgent>();
    registry.register::<Ping>();
    let queue = SqlTransport::connect("async", &Dsn::parse(queue_dsn).unwrap(), Arc::new(registry))
        .await
        .unwrap();
    let queue = Arc::new(queue);
    let runtime = Runtime::builder(fx.store.clone())
        .agent("scripted", ScriptedAgent)
        .options(RuntimeOptions {
            lease: Duration::from_secs(30),
            ..RuntimeOptions::default()
        })
        .build();
    let bus = runtime
        .register(
            MessageBus::builder()
                .transport("async", queue.clone())
                .route("courier.run_agent", ["async"])
                .route("test.ping", ["async"])
                .handler_fn("ping", move |_: Arc<Ping>| {
                    let pings = pings.clone();
                    async move {
                        pings.fetch_add(1, Ordering::SeqCst);
                        Ok(())
                    }
                }),
        )
        .build();
    let stop = CancellationToken::new();
    let worker = Worker::builder(bus.clone())
        .receiver("async", queue)
        .concurrency(4)
        .sleep(Duration::from_millis(10))
        .build();
    let token = stop.clone();
    let worker = tokio::spawn(async move {
        worker.run(token).await.unwrap();
    });
    Process {
        runtime,
        bus,
        stop,
        worker,
    }
}

impl Process {
    async fn stop(self) {
        self.stop.cancel();
        tokio::time::timeout(Duration::from_secs(30), self.worker)
            .await
            .expect("the worker stops")
            .unwrap();
        drop(self.bus);
    }
}

async fn count(store: &Arc<dyn RunStore>, status: RunStatus) -> u64 {
    store
        .count_by_status()
        .await
        .unwrap()
        .into_iter()
        .find(|(s, _)| *s == status)
        .map_or(0, |(_, n)| n)
}

async fn wait_for(store: &Arc<dyn RunStore>, status: RunStatus, n: u64, within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let now = count(store, status).await;
        if now >= n {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{now} of {n} runs {status} after {within:?}: {:?}",
            store.count_by_status().await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn waiting_runs_hold_no_worker(fx: &Fixture, queue_dsn: &str) {
    let pings = Arc::new(AtomicUsize::new(0));
    let first = start(fx, queue_dsn, pings.clone()).await;
    let script = json!({"steps": [
        {"step": "before"},
        {"wait_signal": "go"},
        {"step": "after"},
        {"output": "done"},
    ]});
    let mut ids = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        ids.push(
            first
                .runtime
                .enqueue("scripted", script.clone())
                .await
                .unwrap(),
        );
    }
    wait_for(
        &fx.store,
        RunStatus::Waiting,
        RUNS as u64,
        Duration::from_secs(120),
    )
    .await;
    // Every slot is free: other messages are handled while 1,000 runs wait.
    for _ in 0..40 {
        first.bus.dispatch(Envelope::new(Ping)).await.unwrap();
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while pings.load(Ordering::SeqCst) < 40 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "pings handled: {}",
            pings.load(Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        count(&fx.store, RunStatus::Running).await,
        0,
        "no run holds a worker"
    );
    // Every part restarts: a new queue connection, runtime, bus and worker.
    first.stop().await;
    let second = start(fx, queue_dsn, pings.clone()).await;
    for id in &ids {
        let sent = second
            .runtime
            .signal(*id, "go", json!({"n": 1}), Some("test"))
            .await
            .unwrap();
        assert_eq!(sent, SignalSent::Woken);
    }
    wait_for(
        &fx.store,
        RunStatus::Completed,
        RUNS as u64,
        Duration::from_secs(300),
    )
    .await;
    second.stop().await;
    for id in &ids {
        let steps = fx.store.steps(*id).await.unwrap();
        let names: Vec<&str> = steps.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["before", "signal:go", "after"], "{id}");
        assert!(
            steps
                .iter()
                .all(|s| s.status == StepStatus::Done && s.attempts == 1),
            "{steps:?}"
        );
        assert_eq!(
            steps[1].output.as_ref().unwrap()["received"]["data"],
            json!({"n": 1})
        );
        let run = fx.run(*id).await;
        assert_eq!(
            run.steps_replayed, 1,
            "the step before the wait was replayed once: {run:?}"
        );
        let resumed = fx
            .store
            .events(*id)
            .await
            .unwrap()
            .iter()
            .filter(|e| e.kind == "signal")
            .count();
        // One signal event recorded by the sender, one checkpoint by the resumed agent.
        assert_eq!(resumed, 2, "{id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_waiting_runs_hold_no_worker_and_resume_once_after_a_restart() {
    let fx = support::sqlite().await;
    let dir = support::TempDir::new();
    let dsn = format!(
        "sqlite://{}?poll_window=50ms",
        dir.0.join("queue.db").display()
    );
    waiting_runs_hold_no_worker(&fx, &dsn).await;
    fx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL (scripts/services)"]
async fn postgres_waiting_runs_hold_no_worker_and_resume_once_after_a_restart() {
    // The queue's table and every table beside it go when the test ends, pass or fail.
    let cleanup = courier_test::Cleanup::new();
    let fx = support::postgres().await;
    let table = cleanup.postgres_table("waits_q");
    let dsn = format!("{}?table_name={table}", courier_test::env::postgres_url());
    waiting_runs_hold_no_worker(&fx, &dsn).await;
    fx.cleanup().await;
}
