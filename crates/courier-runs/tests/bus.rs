//! How a runtime reaches the bus it dispatches on: a [`Dispatcher`](courier_core::Dispatcher)
//! filled when the bus is built and held by the runtime, while the handler inside the bus
//! dispatches on the bus handling its message and holds no bus.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use courier_core::{Dispatcher, InMemoryTransport, MessageBus, Worker};
use courier_runs::{MemoryRunStore, RunError, RunStatus, RunStore, Runtime, ScriptedAgent};
use serde_json::json;
use tokio_util::sync::CancellationToken;

fn runtime(store: &Arc<MemoryRunStore>) -> Runtime {
    Runtime::builder(store.clone())
        .agent("scripted", ScriptedAgent)
        .build()
}

/// The bus the runtime is registered on, routing `RunAgent` to `queue`.
fn on_queue(runtime: &Runtime, queue: &Arc<InMemoryTransport>) -> MessageBus {
    runtime
        .register(
            MessageBus::builder()
                .transport("async", queue.clone())
                .route("courier.run_agent", ["async"]),
        )
        .build()
}

fn steps() -> serde_json::Value {
    json!({"steps": [{"output": "done"}]})
}

#[tokio::test]
async fn a_runtime_keeps_dispatching_after_the_caller_dropped_its_bus() {
    let store = Arc::new(MemoryRunStore::new());
    let runtime = runtime(&store);
    let queue = Arc::new(InMemoryTransport::new());
    let _ = on_queue(&runtime, &queue);
    let id = runtime.enqueue("scripted", steps()).await.unwrap();
    assert_eq!(queue.sent().len(), 1, "RunAgent sent on the registered bus");
    assert_eq!(
        store.find(id).await.unwrap().unwrap().status,
        RunStatus::Queued
    );
}

#[tokio::test]
async fn a_runtime_never_registered_on_a_bus_says_so() {
    let store = Arc::new(MemoryRunStore::new());
    let err = runtime(&store)
        .enqueue("scripted", steps())
        .await
        .unwrap_err();
    assert!(matches!(err, RunError::NotRegistered), "{err:?}");
    assert!(err.to_string().contains("Runtime::register"), "{err}");
}

#[tokio::test]
async fn the_handler_requeues_on_the_bus_handling_its_message() {
    let store = Arc::new(MemoryRunStore::new());
    let runtime = runtime(&store);
    let queue = Arc::new(InMemoryTransport::new());
    let bus = on_queue(&runtime, &queue);
    let input = json!({"steps": [{"fail": "server_error", "attempts": 1}, {"output": "done"}]});
    let id = runtime.enqueue("scripted", input).await.unwrap();
    Worker::builder(bus.clone())
        .receiver("async", queue.clone())
        .limit(1)
        .build()
        .run(CancellationToken::new())
        .await
        .unwrap();
    let run = store.find(id).await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Queued, "requeued after the failure");
    assert_eq!(run.requeue_count, 1);
    assert_eq!(
        queue.sent().len(),
        2,
        "the requeue dispatched a second RunAgent"
    );
}

#[tokio::test]
async fn dropping_the_runtime_and_the_bus_frees_the_transports() {
    let store = Arc::new(MemoryRunStore::new());
    let queue = Arc::new(InMemoryTransport::new());
    {
        let runtime = runtime(&store);
        let bus = on_queue(&runtime, &queue);
        runtime.enqueue("scripted", steps()).await.unwrap();
        assert!(Arc::strong_count(&queue) > 1);
        drop(bus);
        let reaper = runtime.reaper();
        drop(runtime);
        assert!(Arc::strong_count(&queue) > 1, "the reaper holds the bus");
        drop(reaper);
    }
    assert_eq!(Arc::strong_count(&queue), 1, "no cycle keeps the bus alive");
}

#[tokio::test]
async fn a_dispatcher_filled_elsewhere_is_the_runtimes_bus() {
    let store = Arc::new(MemoryRunStore::new());
    let queue = Arc::new(InMemoryTransport::new());
    let dispatcher = Dispatcher::new();
    let runtime = Runtime::builder(store.clone())
        .agent("scripted", ScriptedAgent)
        .dispatcher(dispatcher.clone())
        .build();
    let bus = runtime
        .register(
            MessageBus::builder()
                .name("runs")
                .transport("async", queue.clone())
                .route("courier.run_agent", ["async"]),
        )
        .build();
    assert_eq!(dispatcher.bus().map(MessageBus::name), Some(bus.name()));
    runtime.enqueue("scripted", steps()).await.unwrap();
    assert_eq!(queue.sent().len(), 1);
}
