//! A durable run: an agent with checkpoints whose provider fails once with a 503; the run is
//! requeued with backoff and completes on the next execution. `cargo run --example runs`
use std::sync::Arc;
use std::time::Duration;

use courier::runs::{
    Agent, AgentError, AgentOutcome, Backoff, MemoryRunStore, ProviderError, RunContext, RunStore,
    Runtime, RuntimeOptions, Step, async_trait,
};
use courier::{CancellationToken, InMemoryTransport, Worker};
use serde_json::json;

/// Summarises a document in three steps; its provider is down on the first execution.
struct Summariser;

#[async_trait]
impl Agent for Summariser {
    async fn run(&self, cx: &mut RunContext) -> Result<AgentOutcome, AgentError> {
        let doc = cx.input()["document"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        cx.checkpoint(Step::new("fetch", json!({ "chars": doc.len() })))
            .await?;
        if cx.execution() == 1 {
            return Err(ProviderError::http(503).into()); // retryable: requeued with a delay
        }
        cx.checkpoint(Step::new("model_call", json!({ "model": "tiny" })))
            .await?;
        Ok(AgentOutcome::Completed(
            json!({ "summary": doc.split_whitespace().take(3).collect::<Vec<_>>().join(" ") }),
        ))
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let store = Arc::new(MemoryRunStore::new());
    let options = RuntimeOptions {
        backoff: Backoff::new(Duration::from_millis(200), Duration::from_secs(600)),
        ..RuntimeOptions::default()
    };
    let runtime = Runtime::builder(store.clone())
        .agent("summariser", Summariser)
        .options(options)
        .build();
    let queue = Arc::new(InMemoryTransport::new());
    let bus = runtime
        .register(
            courier::MessageBus::builder()
                .transport("async", queue.clone())
                .route("courier.run_agent", ["async"]),
        )
        .build();

    let id = runtime
        .enqueue(
            "summariser",
            json!({ "document": "Courier moves messages and runs durably" }),
        )
        .await?;
    Worker::builder(bus)
        .receiver("async", queue)
        .sleep(Duration::from_millis(20))
        .limit(2) // the first execution (503, requeued) and the second (completed)
        .build()
        .run(CancellationToken::new())
        .await?;

    let run = store
        .find(id)
        .await?
        .ok_or_else(|| anyhow::anyhow!("run {id} vanished"))?;
    println!(
        "run {id}: {:?}, requeued {} time(s), output {}",
        run.status,
        run.requeue_count,
        run.output.unwrap_or_default()
    );
    for event in store.events(id).await? {
        println!("  step {} {} {}", event.seq, event.kind, event.payload);
    }
    Ok(())
}
