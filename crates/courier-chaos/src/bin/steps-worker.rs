//! `steps-worker`: a worker process for the durable steps crash tests (issue 38). It builds a
//! [`Runtime`] with the [`StepsAgent`] (`steps`) over a [`SqlRunStore`] of the tables
//! `<STEPS_PREFIX>_*` in `STEPS_STORE`, consumes `RunAgent` from the SQL transport
//! `STEPS_QUEUE` (`STEPS_CONCURRENCY` runs at once) and reaps stale runs every `STEPS_REAP_MS`,
//! until it is killed. See [`courier_chaos::steps`] for every variable, including the stall
//! point a test kills it at.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use courier_chaos::steps::{Effects, STEPS_AGENT, StepsAgent, WorkerSettings};
use courier_core::{Backoff, Dsn, MessageBus, MessageRegistry, Worker};
use courier_runs::{
    CancellationToken, ReapOptions, RunAgent, RunStore, Runtime, RuntimeOptions, SqlRunStore,
    SqlRunStoreOptions,
};
use courier_sql::SqlTransport;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("steps-worker: {e:#}");
            ExitCode::from(2)
        }
    }
}

async fn run() -> anyhow::Result<()> {
    let settings = WorkerSettings::from_env()?;
    let store = SqlRunStore::connect(
        &settings.store,
        SqlRunStoreOptions::default().table_prefix(&settings.prefix),
    )
    .await
    .context("connecting the run store")?;
    store.setup().await.context("setting up the run store")?;
    let effects = Effects::connect(&settings.store, &settings.prefix).await?;
    let mut registry = MessageRegistry::new();
    registry.register::<RunAgent>();
    let dsn = Dsn::parse(&settings.queue).context("STEPS_QUEUE")?;
    let queue = Arc::new(
        SqlTransport::connect("async", &dsn, Arc::new(registry))
            .await
            .context("connecting the queue")?,
    );
    let options = RuntimeOptions {
        lease: settings.lease,
        max_requeues: settings.max_requeues,
        // A failed step's retry (an effect the database refused) comes back soon, not in 30 s.
        backoff: Backoff::new(Duration::from_millis(100), Duration::from_secs(1)),
        ..RuntimeOptions::default()
    };
    let runtime = Runtime::builder(Arc::new(store))
        .agent(
            STEPS_AGENT,
            StepsAgent::new(effects, settings.stall.clone()),
        )
        .options(options)
        .build();
    let bus = runtime
        .register(
            MessageBus::builder()
                .transport("async", queue.clone())
                .route("courier.run_agent", ["async"]),
        )
        .build();
    let shutdown = CancellationToken::new();
    let reaper = runtime.reaper();
    let reaping = shutdown.clone();
    let every = settings.reap_every;
    tokio::spawn(async move {
        reaper
            .run_every(every, ReapOptions::default(), reaping)
            .await;
    });
    let worker = Worker::builder(bus)
        .receiver("async", queue)
        .concurrency(settings.concurrency.max(1))
        .sleep(Duration::from_millis(20))
        .build();
    worker.run(shutdown).await.context("worker")?;
    Ok(())
}
