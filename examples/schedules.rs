//! A recurring schedule and a paused queue on SQLite: a schedule fires every 200 ms (its lease and
//! last tick kept in the transport's `courier_schedules` table, so any number of workers would
//! fire each tick once), a worker handles the messages; the queue is paused for a second (the
//! ticks pile up, the worker fetches nothing) and resumed (the worker catches up). Exits after
//! about three seconds.
//!
//! `cargo run --example schedules` (creates `courier-example-schedules.db` in the working directory)
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use courier::schedule::Fire;
use courier::sql::SqlTransport;
use courier::{
    BoxError, CancellationToken, Dsn, HandlerError, Message, MessageBus, MessageCount,
    MessageRegistry, PauseGate, Schedule, Scheduler, Transport, Trigger, Worker, async_trait,
    shared_schedule_store,
};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Report {
    tick_ms: i64,
}

impl Message for Report {
    const NAME: &'static str = "app.report";
}

/// What the schedule does on each tick: dispatch a `Report` (routed to the SQLite queue).
struct DispatchReport(MessageBus);

#[async_trait]
impl Fire for DispatchReport {
    async fn fire(&self, _schedule: &str, tick_ms: i64) -> Result<(), BoxError> {
        self.0.dispatch(Report { tick_ms }).await?;
        Ok(())
    }
}

/// Waits until `handled` reaches `n` (at most 5 s).
async fn handled_at_least(handled: &AtomicU64, n: u64) -> anyhow::Result<()> {
    tokio::time::timeout(Duration::from_secs(5), async {
        while handled.load(Ordering::SeqCst) < n {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .map_err(|_| anyhow::anyhow!("fewer than {n} reports handled"))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let db = "courier-example-schedules.db";
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{db}{suffix}")); // start empty each run
    }
    let registry = Arc::new(MessageRegistry::new().with::<Report>());
    let queue = Arc::new(
        SqlTransport::connect("async", &Dsn::parse(&format!("sqlite://{db}"))?, registry).await?,
    );
    if let Some(setup) = queue.abilities().setup {
        setup.setup().await?; // messages, schedules and paused tables
    }

    let handled = Arc::new(AtomicU64::new(0));
    let count = handled.clone();
    let bus = MessageBus::builder()
        .transport("async", queue.clone())
        .route("app.*", ["async"])
        .handler_fn("report", move |r: Arc<Report>| {
            let n = count.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                println!("report #{n} for the tick at {} ms", r.tick_ms);
                Ok::<(), HandlerError>(())
            }
        })
        .build();

    let stop = CancellationToken::new();
    // The schedule store lives in the transport's own database.
    let store = shared_schedule_store(queue.clone())
        .ok_or_else(|| anyhow::anyhow!("SQL transports keep a schedule store"))?;
    let scheduler = Scheduler::new(store, "example-worker").schedule(Schedule::new(
        "report",
        Trigger::every(Duration::from_millis(200))?,
        DispatchReport(bus.clone()),
    ));
    let scheduler = tokio::spawn(scheduler.run(stop.clone()));

    // The worker fetches through a PauseGate, as `courier consume` does: it reads the
    // transport's pause flag every 250 ms and fetches nothing while it is set.
    let gate = PauseGate::wrap(queue.clone(), stop.clone())
        .ok_or_else(|| anyhow::anyhow!("SQL transports can be paused"))?;
    let worker = Worker::builder(bus)
        .receiver("async", gate)
        .sleep(Duration::from_millis(50))
        .build();
    let worker = tokio::spawn(worker.run(stop.clone()));

    handled_at_least(&handled, 3).await?;
    let pausable = queue
        .abilities()
        .pausable
        .ok_or_else(|| anyhow::anyhow!("SQL transports can be paused"))?;
    pausable.set_paused(true).await?; // what `courier pause async` does
    println!("paused `async`");
    tokio::time::sleep(Duration::from_millis(400)).await; // the gate sees the flag
    let before = handled.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let waiting = queue.message_count().await?;
    println!(
        "a second later: {} more handled, {waiting} report(s) waiting",
        handled.load(Ordering::SeqCst) - before
    );
    pausable.set_paused(false).await?; // `courier resume async`
    println!("resumed `async`");
    handled_at_least(&handled, before + waiting).await?;

    stop.cancel();
    scheduler.await?;
    let stats = worker.await??;
    println!("handled {} report(s) in all", stats.handled);
    Ok(())
}
