//! A rate limit shared by every worker of a transport: 4 workers on one in-memory queue, 20
//! messages per second between them. On SQL and Redis the bucket lives in the server (a row in
//! `<table>_limits`, the key `<stream>:limit`), so workers on other hosts share it too.
//! `cargo run --example rate_limit`
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use courier::{
    CancellationToken, HandlerError, InMemoryTransport, Message, MessageBus, RateLimit,
    RateLimitGate, Worker,
};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Notify {
    n: u32,
}

impl Message for Notify {
    const NAME: &'static str = "app.notify";
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let queue = Arc::new(InMemoryTransport::new());
    let handled = Arc::new(AtomicU64::new(0));
    let count = handled.clone();
    let bus = MessageBus::builder()
        .transport("async", queue.clone())
        .route("app.*", ["async"])
        .handler_fn("notify", move |_: Arc<Notify>| {
            count.fetch_add(1, Ordering::Relaxed);
            async { Ok::<(), HandlerError>(()) }
        })
        .build();
    for n in 0..200 {
        bus.dispatch(Notify { n }).await?;
    }

    // 20 per second in bursts of at most 2 (config: `rate_limit = { limit = 20, interval =
    // "1s", burst = 2 }` on the transport).
    let limit = RateLimit::new(20, Duration::from_secs(1))
        .ok_or_else(|| anyhow::anyhow!("a positive rate"))?
        .with_burst(2);
    let stop = CancellationToken::new();
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let worker = Worker::builder(bus.clone())
                .receiver("async", RateLimitGate::wrap(queue.clone(), limit))
                .build();
            tokio::spawn(worker.run(stop.clone()))
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.cancel();
    for worker in workers {
        worker.await??;
    }
    let handled = handled.load(Ordering::Relaxed);
    println!("4 workers handled {handled} messages in 2 s at 20/s");
    // At most the burst plus 20/s over the 2 s (and the moment the stop takes).
    anyhow::ensure!(handled <= 2 + 40 + 2, "the shared limit holds");
    Ok(())
}
