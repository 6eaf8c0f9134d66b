//! End to end through a real bus: SyncTransport (in-process, delays ignored) and an
//! InMemoryTransport consumed by courier_core's Worker (delays honoured on the paused clock).
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use courier_core::{InMemoryTransport, MessageBus, Worker};
use courier_runs::{
    MemoryRunStore, RunStatus, RunStore, Runtime, ScriptedAgent, TerminationReason,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

fn fails_twice_then_succeeds() -> serde_json::Value {
    json!({"steps": [{"sleep_ms": 5}, {"fail": "server_error", "attempts": 2}, {"output": "done"}]})
}

async fn sync_run_that_fails_twice_completes(store: Arc<dyn RunStore>) {
    let runtime = Runtime::builder(store.clone())
        .agent("scripted", ScriptedAgent)
        .build();
    let bus = runtime
        .register(
            MessageBus::builder()
                .sync_transport("sync")
                .route("courier.run_agent", ["sync"]),
        )
        .build();
    let id = runtime
        .enqueue("scripted", fails_twice_then_succeeds())
        .await
        .unwrap();
    let run = store.find(id).await.unwrap().unwrap();
    assert_eq!(
        run.status,
        RunStatus::Completed,
        "completed in-process, nested requeues"
    );
    assert_eq!(run.requeue_count, 2);
    assert_eq!(run.output, Some(json!("done")));
    let kinds: Vec<String> = store
        .events(id)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(
        kinds,
        ["sleep", "sleep", "sleep", "attempt", "output"],
        "one stream across three executions"
    );
    drop(bus);
}

#[tokio::test]
async fn sync_transport_run_failing_twice_with_503_completes_in_process() {
    sync_run_that_fails_twice_completes(Arc::new(MemoryRunStore::new())).await;
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn sync_transport_run_failing_twice_completes_on_sqlite() {
    let fx = support::sqlite().await;
    tokio::time::timeout(
        Duration::from_secs(30),
        sync_run_that_fails_twice_completes(fx.store.clone()),
    )
    .await
    .expect("timed out");
    fx.cleanup().await;
}

#[tokio::test]
async fn sync_transport_requeues_are_bounded_by_max_requeues() {
    let store = Arc::new(MemoryRunStore::new());
    let runtime = Runtime::builder(store.clone())
        .agent("scripted", ScriptedAgent)
        .build();
    let _bus = runtime
        .register(
            MessageBus::builder()
                .sync_transport("sync")
                .route("courier.run_agent", ["sync"]),
        )
        .build();
    let id = runtime
        .enqueue("scripted", json!({"steps": [{"fail": "rate_limit"}]}))
        .await
        .unwrap();
    let run = store.find(id).await.unwrap().unwrap();
    assert_eq!(
        (run.status, run.termination_reason),
        (RunStatus::Failed, Some(TerminationReason::RetriesExhausted))
    );
    assert_eq!(run.requeue_count, 3);
}

#[tokio::test(start_paused = true)]
async fn worker_on_in_memory_transport_honours_the_requeue_delays() {
    let store = Arc::new(MemoryRunStore::new());
    let queue = InMemoryTransport::new();
    let runtime = Runtime::builder(store.clone())
        .agent("scripted", ScriptedAgent)
        .build();
    let bus = runtime
        .register(
            MessageBus::builder()
                .transport("async", Arc::new(queue.clone()))
                .route("courier.run_agent", ["async"]),
        )
        .build();
    let id = runtime
        .enqueue("scripted", fails_twice_then_succeeds())
        .await
        .unwrap();
    let created = store.find(id).await.unwrap().unwrap().created_at;

    let shutdown = CancellationToken::new();
    let worker = Worker::builder(bus.clone())
        .receiver("async", Arc::new(queue.clone()))
        .limit(3)
        .build();
    let stats = tokio::time::timeout(Duration::from_secs(3600), worker.run(shutdown))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stats.handled, 3, "three executions, each one message");

    let run = store.find(id).await.unwrap().unwrap();
    assert_eq!((run.status, run.requeue_count), (RunStatus::Completed, 2));
    let events = store.events(id).await.unwrap();
    let done_at = events.last().unwrap().created_at;
    let waited = done_at - created;
    assert!(
        waited >= 90_000,
        "30 s then 60 s of backoff were honoured, finished after {waited} ms"
    );
    assert!(waited < 95_000, "and not much later: {waited} ms");
    assert_eq!(queue.sent().len(), 3);
    assert_eq!(
        queue.acked().len(),
        3,
        "every RunAgent acked: outcomes are never handler errors"
    );
}
