//! `courier bench --runs`: N scripted runs of 3 durable no-op steps (`{"step": ...}`, each
//! journaled in the write that renews the lease), submitted one by one (`Runtime::enqueue`: the run row, then its
//! `RunAgent` message), then executed by W in-process workers sharing one bus and one runtime,
//! the run store and the RunAgent queue on the same database (`--dsn`, SQL only; tables and
//! queue of their own, dropped after). Reports submitted and executed runs per second, and the
//! statements and calls each run cost, counted by the decorators of [`super::counting`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use courier_core::{
    CancellationToken, Dsn, FactoryContext, Message, MessageBus, MessageRegistry, Transport, Worker,
};
use courier_runs::{
    Dialect, RunAgent, RunStore, Runtime, ScriptedAgent, SqlRunStore, SqlRunStoreOptions,
};
use serde_json::{Map, Value, json};

use super::counting::{
    CountingStore, CountingTransport, STORE_METHODS, StoreCalls, TRANSPORT_METHODS,
};
use super::{BENCH, chatty, isolate, per_second, print_json, remove_isolated};
use crate::cli::{BenchArgs, Cli, Format};
use crate::error::{CliError, CliResult, chain};
use crate::wiring::Wiring;

/// Runs when `--messages` is not given.
const DEFAULT_RUNS: u64 = 1_000;
/// Steps per run.
const STEPS: u64 = 3;
/// The benchmark fails when no run finishes for this long.
const STALL: Duration = Duration::from_secs(60);

fn script() -> Value {
    json!({"steps": [{"step": "one"}, {"step": "two"}, {"step": "three", "result": "ok"}]})
}

pub(super) async fn measure(app: &Wiring, cli: &Cli, args: &BenchArgs, dsn: &Dsn) -> CliResult {
    let store_dsn = crate::runs::store_dsn(Some(dsn.expose_without_query()));
    let dialect = Dialect::from_dsn(&store_dsn).map_err(|_| {
        CliError::usage(format!(
            "--runs: the run store and its queue need a SQL --dsn (sqlite://, postgres://, mysql://), not `{}`",
            dsn.scheme()
        ))
    })?;
    let prefix = format!("bench_{}", fastrand::u32(..));
    let connections = u32::from(args.workers) * u32::from(args.concurrency) + 2;
    let options = SqlRunStoreOptions::default()
        .table_prefix(&prefix)
        .max_connections(connections.max(5));
    let store = SqlRunStore::connect(&store_dsn, options)
        .await
        .map_err(|e| CliError::runtime(format!("cannot open the run store: {}", chain(&e))))?;
    store
        .setup()
        .await
        .map_err(|e| CliError::runtime(format!("cannot set up the run store: {}", chain(&e))))?;
    let store = Arc::new(store);
    let isolated = isolate(dsn, &prefix, args.fetch_size);
    let result = execute(app, cli, args, dsn, &isolated, store.clone(), dialect).await;
    let _ = store.drop_tables().await;
    remove_isolated(&isolated, dsn).await;
    result
}

async fn execute(
    app: &Wiring,
    cli: &Cli,
    args: &BenchArgs,
    dsn: &Dsn,
    isolated: &Dsn,
    store: Arc<SqlRunStore>,
    dialect: Dialect,
) -> CliResult {
    let runs = args.messages.unwrap_or(DEFAULT_RUNS);
    let workers = usize::from(args.workers);
    let counting = Arc::new(CountingStore::new(store, dialect));
    let registry = Arc::new(MessageRegistry::new().with::<RunAgent>());
    let ctx = FactoryContext::new(BENCH, isolated.clone()).registry(registry);
    let inner = app.factories.create(ctx).await?;
    if let Some(setup) = inner.as_setup() {
        setup.setup().await?;
    }
    let counted = Arc::new(CountingTransport::new(inner));
    let transport: Arc<dyn Transport> = counted.clone();
    let runtime = Runtime::builder(counting.clone() as Arc<dyn RunStore>)
        .agent("scripted", ScriptedAgent)
        .build();
    let bus = runtime
        .register(
            MessageBus::builder()
                .transport(BENCH, transport.clone())
                .route(RunAgent::NAME, [BENCH]),
        )
        .build();
    if chatty(cli) {
        eprintln!(
            "Runs on {dsn}: {runs} scripted runs of {STEPS} no-op steps, {workers} worker(s) \
             (fetch size {}, concurrency {})",
            args.fetch_size, args.concurrency
        );
    }

    // Submit: one run at a time, as `courier runs submit` does.
    let input = script();
    let started = Instant::now();
    for _ in 0..runs {
        runtime
            .enqueue("scripted", input.clone())
            .await
            .map_err(|e| CliError::runtime(format!("cannot submit a run: {}", chain(&e))))?;
    }
    let submit = started.elapsed();
    let submit_store = counting.calls();

    // Execute: W workers until every run was settled.
    let stop = CancellationToken::new();
    let started = Instant::now();
    let handles: Vec<_> = (0..workers)
        .map(|_| {
            let worker = Worker::builder(bus.clone())
                .receiver(BENCH, transport.clone())
                .fetch_size(usize::from(args.fetch_size))
                .concurrency(usize::from(args.concurrency))
                .sleep(Duration::from_millis(1))
                .build();
            tokio::spawn(worker.run(stop.clone()))
        })
        .collect();
    let settled = counting.settled_at_least(runs, STALL).await;
    let elapsed = started.elapsed();
    stop.cancel();
    for handle in handles {
        let _ = handle.await;
    }
    if settled < runs {
        return Err(CliError::runtime(format!(
            "runs benchmark: {settled} of {runs} runs finished, then none for {STALL:?}"
        )));
    }
    let total_store = counting.calls();
    let total_transport = counted.calls();
    let execute_store: StoreCalls = std::array::from_fn(|i| total_store[i] - submit_store[i]);
    let per_run = |n: u64| n as f64 / runs as f64;
    let submit_statements = per_run(counting.statements(&submit_store));
    let execute_statements = per_run(counting.statements(&execute_store));
    let round_trips = per_run(counting.round_trips(&total_store));
    let store_calls = per_method(&STORE_METHODS, &total_store, runs);
    let transport_calls = per_method(&TRANSPORT_METHODS, &total_transport, runs);
    let transport_statements = per_run(CountingTransport::statements(&total_transport));
    let empty_gets = per_run(total_transport[3]);
    let submit_per_s = per_second(runs, submit);
    let runs_per_s = per_second(runs, elapsed);

    if cli.format == Format::Json {
        return print_json(&json!({
            "mode": "runs",
            "dsn": dsn.to_string(),
            "runs": runs,
            "workers": workers,
            "steps_per_run": STEPS,
            "fetch_size": args.fetch_size,
            "concurrency": args.concurrency,
            "submit_per_s": submit_per_s,
            "runs_per_s": runs_per_s,
            "store_statements_per_run": submit_statements + execute_statements,
            "store_statements": { "submit": submit_statements, "execute": execute_statements },
            "store_round_trips_per_run": round_trips,
            "store_calls_per_run": store_calls,
            "transport_statements_per_run": transport_statements,
            "transport_calls_per_run": transport_calls,
            "empty_gets_per_run": empty_gets,
        }));
    }
    println!("{:<10} {:>10}", "", "runs/s");
    println!("{:<10} {submit_per_s:>10.0}", "submit");
    println!("{:<10} {runs_per_s:>10.0}", "execute");
    println!(
        "store statements per run: {:.2} (submit {submit_statements:.2}, execute {execute_statements:.2}); round trips {round_trips:.2}",
        submit_statements + execute_statements
    );
    println!("  calls per run: {}", listing(&store_calls));
    println!(
        "transport statements per run: {transport_statements:.2} ({}); idle polls (empty gets) per run: {empty_gets:.2}",
        listing(&transport_calls)
    );
    Ok(())
}

/// `{method: calls per run}` for the methods that were called.
fn per_method(methods: &[&str], calls: &[u64], runs: u64) -> Map<String, Value> {
    methods
        .iter()
        .zip(calls)
        .filter(|(_, n)| **n > 0)
        .map(|(m, n)| ((*m).to_owned(), json!(*n as f64 / runs as f64)))
        .collect()
}

fn listing(calls: &Map<String, Value>) -> String {
    calls
        .iter()
        .filter(|(m, _)| m.as_str() != "get_empty")
        .map(|(m, v)| format!("{m} {:.2}", v.as_f64().unwrap_or(0.0)))
        .collect::<Vec<_>>()
        .join(", ")
}
