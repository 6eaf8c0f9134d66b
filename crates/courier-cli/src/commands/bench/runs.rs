//! `courier bench --runs`: N scripted runs of 3 durable no-op steps (`{"step": ...}`, each
//! journaled in the write that renews the lease), submitted one by one (`Runtime::submit`: the run row, then its
//! `RunAgent` message), then executed by W in-process workers sharing one bus and one runtime,
//! the run store and the RunAgent queue on the same database (`--dsn`, SQL only; tables and
//! queue of their own, dropped after). Beside it, round for round (ABBA over `--rounds`,
//! default 1), the raw sqlx loop of [`courier_raw::runs`] does the same state machine with
//! `workers x concurrency` tasks. Reports submitted and executed runs per second on both sides
//! and their ratio (the median of the rounds), the submit-to-settle latency (p50, p99) idle
//! (one run at a time) and under load (runs submitted as fast as one submitter goes while the
//! workers execute them), and the statements, round trips and calls each run cost, counted by
//! the decorators of [`super::counting`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use courier_core::{
    CancellationToken, Dsn, FactoryContext, Message, MessageBus, MessageRegistry, Transport, Worker,
};
use courier_raw::runs::RawRuns;
use courier_runs::{
    Dialect, NewRun, RunAgent, RunStore, Runtime, ScriptedAgent, SqlRunStore, SqlRunStoreOptions,
};
use serde_json::{Map, Value, json};
use uuid::Uuid;

use super::counting::{CountingStore, CountingTransport, STORE_METHODS, TRANSPORT_METHODS};
use super::{BENCH, chatty, isolate, per_second, percentiles, print_json, remove_isolated};
use crate::cli::{BenchArgs, Cli, Format};
use crate::error::{CliError, CliResult, chain};
use crate::wiring::Wiring;

/// Runs when `--messages` is not given.
const DEFAULT_RUNS: u64 = 1_000;
/// The most runs whose latency is measured (half of them idle, one at a time).
const LATENCY_RUNS: u64 = 1_000;
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
    let raw = match RawRuns::connect(&store_dsn, dialect, &prefix, connections).await {
        Ok(raw) => Arc::new(raw),
        Err(e) => {
            let _ = store.drop_tables().await;
            remove_isolated(&isolated, dsn).await;
            return Err(e.into());
        }
    };
    let result = execute(
        app,
        cli,
        args,
        dsn,
        &isolated,
        store.clone(),
        dialect,
        raw.clone(),
    )
    .await;
    raw.drop_tables().await;
    let _ = store.drop_tables().await;
    remove_isolated(&isolated, dsn).await;
    result
}

/// One side's figures over one round.
#[derive(Debug, Clone, Copy, Default)]
struct Round {
    submit_per_s: f64,
    runs_per_s: f64,
}

/// The figures of Courier's rounds: calls per run, counted over every round.
struct Counted {
    submit_statements: f64,
    execute_statements: f64,
    round_trips: f64,
    store_calls: Map<String, Value>,
    transport_calls: Map<String, Value>,
    transport_statements: f64,
    empty_gets: f64,
}

/// The bench's Courier side: the runtime and bus over the counted store and transport.
struct Side<'a> {
    counting: Arc<CountingStore>,
    counted: Arc<CountingTransport>,
    transport: Arc<dyn Transport>,
    runtime: Runtime,
    bus: MessageBus,
    args: &'a BenchArgs,
}

impl Side<'_> {
    fn workers(&self, stop: &CancellationToken) -> Vec<tokio::task::JoinHandle<()>> {
        (0..usize::from(self.args.workers))
            .map(|_| {
                let worker = Worker::builder(self.bus.clone())
                    .receiver(BENCH, self.transport.clone())
                    .fetch_size(usize::from(self.args.fetch_size))
                    .concurrency(usize::from(self.args.concurrency))
                    .sleep(Duration::from_millis(1))
                    .build();
                let stop = stop.clone();
                tokio::spawn(async move {
                    let _ = worker.run(stop).await;
                })
            })
            .collect()
    }

    async fn submit(&self, track: bool) -> CliResult<Uuid> {
        let run = NewRun::new("scripted", script());
        if track {
            self.counting.track(run.id);
        }
        self.runtime
            .submit(run)
            .await
            .map_err(|e| CliError::runtime(format!("cannot submit a run: {}", chain(&e))))
    }

    /// Submits `runs` one by one, then executes them with the workers.
    async fn round(&self, runs: u64) -> CliResult<Round> {
        let started = Instant::now();
        for _ in 0..runs {
            self.submit(false).await?;
        }
        let submit = started.elapsed();
        let target = self.counting.settled() + runs;
        let stop = CancellationToken::new();
        let started = Instant::now();
        let handles = self.workers(&stop);
        let settled = self.counting.settled_at_least(target, STALL).await;
        let elapsed = started.elapsed();
        stop.cancel();
        for handle in handles {
            let _ = handle.await;
        }
        if settled < target {
            return Err(CliError::runtime(format!(
                "runs benchmark: {} of {runs} runs finished, then none for {STALL:?}",
                runs - (target - settled)
            )));
        }
        Ok(Round {
            submit_per_s: per_second(runs, submit),
            runs_per_s: per_second(runs, elapsed),
        })
    }

    /// Submit-to-settle times: one run at a time to idle workers, then `runs` submitted as
    /// fast as one submitter goes while the workers execute them (under load).
    async fn latency(
        &self,
        idle_runs: u64,
        runs: u64,
    ) -> CliResult<(Vec<Duration>, Vec<Duration>)> {
        let stop = CancellationToken::new();
        let handles = self.workers(&stop);
        let result = async {
            self.counting.take_latencies();
            for _ in 0..idle_runs {
                let target = self.counting.settled() + 1;
                self.submit(true).await?;
                if self.counting.settled_at_least(target, STALL).await < target {
                    return Err(CliError::runtime(
                        "runs benchmark: an idle run did not finish",
                    ));
                }
            }
            let idle = self.counting.take_latencies();
            let target = self.counting.settled() + runs;
            for _ in 0..runs {
                self.submit(true).await?;
            }
            if self.counting.settled_at_least(target, STALL).await < target {
                return Err(CliError::runtime(
                    "runs benchmark: runs under load did not finish",
                ));
            }
            Ok((idle, self.counting.take_latencies()))
        }
        .await;
        stop.cancel();
        for handle in handles {
            let _ = handle.await;
        }
        result
    }

    fn counted(&self, runs: u64) -> Counted {
        let store = self.counting.calls();
        let transport = self.counted.calls();
        let insert = STORE_METHODS
            .iter()
            .position(|m| *m == "insert_queued")
            .unwrap_or_default();
        let mut submit_only = [0; STORE_METHODS.len()];
        submit_only[insert] = store[insert];
        let mut execute_only = store;
        execute_only[insert] = 0;
        let per_run = |n: u64| n as f64 / runs.max(1) as f64;
        Counted {
            submit_statements: per_run(self.counting.statements(&submit_only)),
            execute_statements: per_run(self.counting.statements(&execute_only)),
            round_trips: per_run(self.counting.round_trips(&store)),
            store_calls: per_method(&STORE_METHODS, &store, runs),
            transport_calls: per_method(&TRANSPORT_METHODS, &transport, runs),
            transport_statements: per_run(CountingTransport::statements(&transport)),
            empty_gets: per_run(transport[3]),
        }
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

#[allow(
    clippy::too_many_arguments,
    reason = "the bench's parts, set up by measure()"
)]
async fn execute(
    app: &Wiring,
    cli: &Cli,
    args: &BenchArgs,
    dsn: &Dsn,
    isolated: &Dsn,
    store: Arc<SqlRunStore>,
    dialect: Dialect,
    raw: Arc<RawRuns>,
) -> CliResult {
    let runs = args.messages.unwrap_or(DEFAULT_RUNS);
    let workers = usize::from(args.workers);
    let rounds = usize::from(args.rounds.unwrap_or(1).max(1));
    let counting = Arc::new(CountingStore::new(store.clone(), dialect));
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
    let side = Side {
        counting,
        counted,
        transport,
        runtime,
        bus,
        args,
    };
    if chatty(cli) {
        eprintln!(
            "Runs on {dsn}: {runs} scripted runs of {STEPS} no-op steps, {workers} worker(s) \
             (fetch size {}, concurrency {}), {rounds} round(s) beside a raw sqlx loop",
            args.fetch_size, args.concurrency
        );
    }
    let tasks = workers * usize::from(args.concurrency);
    let shared_before = store.shared_writes();
    let mut ours = Vec::with_capacity(rounds);
    let mut theirs = Vec::with_capacity(rounds);
    for round in 0..rounds {
        // ABBA: the side that goes first alternates.
        if round % 2 == 1 {
            theirs.push(raw_round(&raw, runs, tasks).await?);
        }
        ours.push(side.round(runs).await?);
        if round % 2 == 0 {
            theirs.push(raw_round(&raw, runs, tasks).await?);
        }
    }
    let counted = side.counted(runs * rounds as u64);
    let shared = {
        let after = store.shared_writes();
        let per_run = |n: u64| n as f64 / (runs * rounds as u64).max(1) as f64;
        // The raw rounds write elsewhere: only Courier's rounds are counted.
        (
            per_run(after.writes - shared_before.writes),
            per_run(after.statements - shared_before.statements),
        )
    };
    let latency_runs = runs.min(LATENCY_RUNS);
    let (mut idle, mut loaded) = side.latency(latency_runs / 2, latency_runs).await?;
    let (idle_p50, idle_p99) = percentiles(&mut idle);
    let (loaded_p50, loaded_p99) = percentiles(&mut loaded);
    let ratios: Vec<f64> = ours
        .iter()
        .zip(&theirs)
        .map(|(o, t)| o.runs_per_s / t.runs_per_s.max(1e-9))
        .collect();
    let ratio = median(ratios.clone());
    let submit_per_s = median(ours.iter().map(|r| r.submit_per_s).collect());
    let runs_per_s = median(ours.iter().map(|r| r.runs_per_s).collect());
    let raw_submit_per_s = median(theirs.iter().map(|r| r.submit_per_s).collect());
    let raw_runs_per_s = median(theirs.iter().map(|r| r.runs_per_s).collect());
    let raw_cost = raw.cost(STEPS);
    let Counted {
        submit_statements,
        execute_statements,
        round_trips,
        store_calls,
        transport_calls,
        transport_statements,
        empty_gets,
    } = counted;

    if cli.format == Format::Json {
        return print_json(&json!({
            "mode": "runs",
            "dsn": dsn.to_string(),
            "runs": runs,
            "rounds": rounds,
            "workers": workers,
            "steps_per_run": STEPS,
            "fetch_size": args.fetch_size,
            "concurrency": args.concurrency,
            "submit_per_s": submit_per_s,
            "runs_per_s": runs_per_s,
            "ratio": ratio,
            "round_ratios": ratios,
            "latency_ms": {
                "idle": {"p50": idle_p50, "p99": idle_p99, "runs": idle.len()},
                "loaded": {"p50": loaded_p50, "p99": loaded_p99, "runs": loaded.len()},
            },
            "store_statements_per_run": submit_statements + execute_statements,
            "store_statements": { "submit": submit_statements, "execute": execute_statements },
            "store_round_trips_per_run": round_trips,
            "shared_writes_per_run": {"writes": shared.0, "statements": shared.1},
            "store_calls_per_run": store_calls,
            "transport_statements_per_run": transport_statements,
            "transport_calls_per_run": transport_calls,
            "empty_gets_per_run": empty_gets,
            "raw": {
                "submit_per_s": raw_submit_per_s,
                "runs_per_s": raw_runs_per_s,
                "statements_per_run": raw_cost.submit_statements + raw_cost.execute_statements,
                "statements": { "submit": raw_cost.submit_statements, "execute": raw_cost.execute_statements },
                "round_trips_per_run": raw_cost.round_trips,
            },
        }));
    }
    println!("{:<10} {:>10} {:>10}", "runs/s", "courier", "raw");
    println!(
        "{:<10} {submit_per_s:>10.0} {raw_submit_per_s:>10.0}",
        "submit"
    );
    println!(
        "{:<10} {runs_per_s:>10.0} {raw_runs_per_s:>10.0}",
        "execute"
    );
    let listed: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
    println!(
        "ratio (courier / raw, execute): {ratio:.2} (median of {} round(s): {})",
        ratios.len(),
        listed.join(", ")
    );
    println!(
        "submit-to-settle latency: idle p50 {idle_p50:.2} ms, p99 {idle_p99:.2} ms ({} runs); \
         under load p50 {loaded_p50:.2} ms, p99 {loaded_p99:.2} ms ({} runs)",
        idle.len(),
        loaded.len()
    );
    println!(
        "store statements per run: courier {:.2} (submit {submit_statements:.2}, execute {execute_statements:.2}), \
         raw {:.2} (its queue's included); round trips: courier {round_trips:.2}, raw {:.2}",
        submit_statements + execute_statements,
        raw_cost.submit_statements + raw_cost.execute_statements,
        raw_cost.round_trips,
    );
    println!("  calls per run: {}", listing(&store_calls));
    if shared.0 > 0.0 {
        println!(
            "  the hot writes (claims, steps, settles) of concurrent runs, sent together: {:.2} writes per run \
             in {:.2} statements per run ({:.1} writes per statement{})",
            shared.0,
            shared.1,
            shared.0 / shared.1.max(1e-9),
            if dialect == Dialect::Sqlite {
                ", BEGIN and COMMIT included"
            } else {
                ""
            }
        );
    }
    println!(
        "transport statements per run: {transport_statements:.2} ({}); idle polls (empty gets) per run: {empty_gets:.2}",
        listing(&transport_calls)
    );
    Ok(())
}

async fn raw_round(raw: &Arc<RawRuns>, runs: u64, tasks: usize) -> CliResult<Round> {
    let submit = raw.submit(runs).await?;
    let elapsed = raw.execute(runs, tasks, STEPS, STALL).await?;
    Ok(Round {
        submit_per_s: per_second(runs, submit),
        runs_per_s: per_second(runs, elapsed),
    })
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
