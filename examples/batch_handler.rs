//! A batch handler (Symfony's `BatchHandlerInterface`): 120 messages handled 50 at a time, the
//! last 20 once the wait is over; one message fails and is retried alone. All in memory.
//! `cargo run --example batch_handler`
use std::sync::Arc;
use std::time::Duration;

use courier::{
    BatchOptions, CancellationToken, HandlerError, HandlerOptions, InMemoryTransport, Message,
    MessageBus, Worker,
};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Row {
    id: u32,
}

impl Message for Row {
    const NAME: &'static str = "app.row";
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let queue = Arc::new(InMemoryTransport::new());
    let refused_once = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let bus = MessageBus::builder()
        .transport("async", queue.clone())
        .route("app.*", ["async"])
        .batch_handler_fn(
            HandlerOptions::new("bulk_insert"),
            // Up to 50 rows per call, or what has come within 200 ms.
            BatchOptions::new(50, Duration::from_millis(200)),
            move |rows: Vec<Arc<Row>>| {
                let ids: Vec<u32> = rows.iter().map(|r| r.id).collect();
                println!(
                    "inserting {} rows ({}..={})",
                    ids.len(),
                    ids[0],
                    ids[ids.len() - 1]
                );
                // One result per row: row 7 fails the first time and is retried on its own.
                let results = ids
                    .iter()
                    .map(|id| {
                        if *id == 7
                            && !refused_once.swap(true, std::sync::atomic::Ordering::Relaxed)
                        {
                            Err(HandlerError::msg("row 7 was locked"))
                        } else {
                            Ok(())
                        }
                    })
                    .collect();
                async move { results }
            },
        )
        .build();
    for id in 0..120 {
        bus.dispatch(Row { id }).await?;
    }
    let stats = Worker::builder(bus)
        .receiver("async", queue)
        .limit(121)
        .build()
        .run(CancellationToken::new())
        .await?;
    println!("handled {} rows, {} retried", stats.handled, stats.retried);
    anyhow::ensure!(stats.handled == 120 && stats.retried == 1);
    Ok(())
}
