//! Dispatch to a SQLite-backed queue and consume it with retries and a failure transport.
//!
//! `cargo run --example sqlite_worker` (creates `courier-example.db` in the working directory)
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use courier::sql::SqlTransport;
use courier::{
    CancellationToken, Dsn, HandlerError, Listable, Message, MessageBus, MessageRegistry,
    MultiplierRetryStrategy, Worker,
};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct ChargeCard {
    order: u32,
}

impl Message for ChargeCard {
    const NAME: &'static str = "billing.charge_card";
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    for file in [
        "courier-example.db",
        "courier-example.db-wal",
        "courier-example.db-shm",
    ] {
        let _ = std::fs::remove_file(file); // start from an empty queue each run
    }
    let registry = Arc::new(MessageRegistry::new().with::<ChargeCard>());
    let jobs = Arc::new(
        SqlTransport::connect(
            "async",
            &Dsn::parse("sqlite://courier-example.db")?,
            registry.clone(),
        )
        .await?,
    );
    let failed = Arc::new(
        SqlTransport::connect(
            "failed",
            &Dsn::parse("sqlite://courier-example.db?queue_name=failed")?,
            registry,
        )
        .await?,
    );

    let attempts = Arc::new(AtomicU32::new(0));
    let seen = attempts.clone();
    let bus = MessageBus::builder()
        .transport("async", jobs.clone())
        .route("billing.*", ["async"])
        .handler_fn("charge", move |m: Arc<ChargeCard>| {
            let n = seen.fetch_add(1, Ordering::SeqCst);
            async move {
                match m.order {
                    // Order 2 is declined for good: straight to the failure transport.
                    2 => Err(HandlerError::unrecoverable("card declined")),
                    // Order 3's payment provider is flaky once: retried after a short delay.
                    3 if n < 3 => Err(HandlerError::msg("payment provider timed out")),
                    _ => Ok(()),
                }
            }
        })
        .build();

    for order in 1..=3 {
        bus.dispatch(ChargeCard { order }).await?;
    }

    let stats = Worker::builder(bus)
        .receiver("async", jobs)
        .retry_strategy(Arc::new(
            MultiplierRetryStrategy::default().delay(Duration::from_millis(200)),
        ))
        .failure_transport("failed", failed.clone())
        .sleep(Duration::from_millis(50))
        .time_limit(Duration::from_secs(5))
        .limit(4)
        .build()
        .run(CancellationToken::new())
        .await?;
    println!(
        "handled {}, failed {} (retried {}, moved to `failed` {})",
        stats.handled, stats.failed, stats.retried, stats.moved_to_failure
    );
    for envelope in failed.list(10).await? {
        let details = envelope.last::<courier::ErrorDetailsStamp>();
        println!(
            "in `failed`: {} ({})",
            envelope.message_name(),
            details.map_or("?", |d| d.message.as_str())
        );
        failed.remove(envelope.id().unwrap_or_default()).await?;
    }
    Ok(())
}
