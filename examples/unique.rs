//! Unique messages and unique runs: a message that names its own uniqueness key
//! (`Message::deduplicate`) is sent once however often it is dispatched within its period, a
//! key given at dispatch (`DeduplicateStamp`) works the same, and ten concurrent enqueues of a
//! durable run with one unique key queue exactly one (on SQLite: a unique index). Service-free.
//!
//! `cargo run --example unique` (creates `courier-example-unique.db` in the working directory)
use std::sync::Arc;
use std::time::Duration;

use courier::runs::UniqueKey;
use courier::runs::{Enqueued, RunStore, Runtime, ScriptedAgent, SqlRunStore, SqlRunStoreOptions};
use courier::{
    DeduplicateStamp, DeduplicatedStamp, Envelope, InMemoryTransport, Message, MessageBus,
    SentStamp,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

#[derive(Serialize, Deserialize)]
struct SendInvoice {
    invoice: u64,
}

impl Message for SendInvoice {
    const NAME: &'static str = "billing.send_invoice";

    // One invoice mail per invoice and hour, however often it is dispatched.
    fn deduplicate(&self) -> Option<DeduplicateStamp> {
        let key = format!("invoice:{}", self.invoice);
        Some(DeduplicateStamp::new(key, Duration::from_secs(3600)))
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let db = "courier-example-unique.db";
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{db}{suffix}")); // start empty each run
    }

    // Unique messages: the in-memory transport keeps the keys (SQL: `<table>_dedup`, Redis:
    // SET NX PX).
    let queue = InMemoryTransport::new();
    let bus = MessageBus::builder()
        .transport("async", Arc::new(queue.clone()))
        .route("billing.*", ["async"])
        .build();
    for attempt in 1..=3 {
        let envelope = bus.dispatch(SendInvoice { invoice: 42 }).await?;
        let sent = envelope.has::<SentStamp>();
        println!(
            "invoice 42, dispatch {attempt}: {}",
            if sent { "sent" } else { "duplicate, not sent" }
        );
    }
    // A key given at dispatch wins over the message's own.
    let batch = Envelope::new(SendInvoice { invoice: 42 })
        .with(DeduplicateStamp::new("resend:42", Duration::from_secs(60)));
    let resent = bus.dispatch(batch).await?;
    println!(
        "invoice 42 with key `resend:42`: {}",
        if resent.has::<DeduplicatedStamp>() {
            "duplicate"
        } else {
            "sent"
        }
    );
    println!("{} message(s) in the queue", queue.sent().len());

    // Unique runs: the run store decides (a unique index on SQL).
    let store = Arc::new(
        SqlRunStore::connect(
            &format!("sqlite://{db}?mode=rwc"),
            SqlRunStoreOptions::default(),
        )
        .await?,
    );
    store.setup().await?;
    let runtime = Runtime::builder(store.clone())
        .agent("scripted", ScriptedAgent)
        .build();
    let run_queue = InMemoryTransport::new();
    let _bus = runtime
        .register(
            MessageBus::builder()
                .transport("runs", Arc::new(run_queue.clone()))
                .route("courier.run_agent", ["runs"]),
        )
        .build();
    let unique = UniqueKey::new("nightly-report:2024-06-01", Duration::from_secs(3600))?;
    let enqueues = (0..10).map(|_| {
        let (runtime, unique) = (runtime.clone(), unique.clone());
        tokio::spawn(async move {
            runtime
                .enqueue_unique("scripted", json!({ "steps": [] }), unique)
                .await
        })
    });
    let mut queued = 0;
    let mut duplicates = 0;
    for outcome in futures_util::future::join_all(enqueues).await {
        match outcome?? {
            Enqueued::Queued(id) => {
                queued += 1;
                println!("run {id} queued, holding `{}`", unique.key());
            }
            Enqueued::Duplicate(_) => duplicates += 1,
            _ => {}
        }
    }
    println!(
        "10 concurrent enqueues: {queued} queued, {duplicates} duplicate(s); {} run(s) stored, \
         {} RunAgent message(s) sent",
        store.list(None, 100).await?.len(),
        run_queue.sent().len()
    );
    Ok(())
}
