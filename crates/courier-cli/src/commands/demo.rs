//! `courier demo`: the main job on the embedded SQLite database, needing no config and no server.
//!
//! Submits `--runs` scripted runs with a realistic mix (most succeed after a few steps, some fail
//! transiently once or twice with 503 / 429 / connection errors, a few fail for good with 401 or
//! 400, a few exhaust their requeue budget, a few fail after a non-idempotent effect), runs
//! `--workers` consumers in this process with a short backoff, kills the worker running one
//! chosen run mid-step, expires that run's lease by rewriting `lease_expires` (as if its lease had
//! run out) so the reaper recovers it, and ends with a summary read back from the store.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use courier_core::{CancellationToken, Dsn, FactoryContext, MessageBus, MessageRegistry, Worker};
use courier_runs::{
    ReapOptions, RunAgent, RunStatus, RunStore, RunsConfig, Runtime, SqlRunStore,
    SqlRunStoreOptions, new_worker_identity,
};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::app::App;
use crate::cli::{Cli, DemoArgs, Format};
use crate::error::{CliError, CliResult, chain};

/// What the summary reports, read back from the store.
#[derive(Debug, Default, serde::Serialize)]
struct Summary {
    runs: usize,
    workers: u16,
    completed: usize,
    completed_first_try: usize,
    dead_lettered: usize,
    dead_lettered_by_reason: BTreeMap<String, usize>,
    other: BTreeMap<String, usize>,
    requeued: u64,
    reaped: usize,
    workers_killed: usize,
    duration_s: f64,
    runs_per_s: f64,
}

/// The input of run `i` of `n` (the first one is the run whose worker gets killed).
fn script(i: u32, rng: &mut fastrand::Rng) -> Value {
    let sleep = |rng: &mut fastrand::Rng| json!({ "sleep_ms": rng.u64(2..15) });
    if i == 0 {
        return json!({ "steps": [sleep(rng), { "hang_ms": 1500 }, { "output": "recovered after a worker crash" }] });
    }
    let mut steps: Vec<Value> = (0..rng.usize(1..4)).map(|_| sleep(rng)).collect();
    let transient = ["server_error", "rate_limit", "connection"];
    // Every 20 consecutive runs hold the whole mix, spread out: 65 % succeed, 15 % fail
    // transiently once or twice, 5 % each: 401, 400, budget exhausted, effect then failure.
    match (i * 7) % 20 {
        0..=12 => {}
        13..=15 => {
            steps.push(json!({ "fail": transient[rng.usize(..3)], "attempts": rng.u32(1..3) }))
        }
        16 => steps.push(json!({ "fail": "auth" })),
        17 => steps.push(json!({ "fail": "client_error" })),
        18 => steps.push(json!({ "fail": "server_error" })),
        _ => {
            steps.push(json!({ "effect": "non_idempotent" }));
            steps.push(json!({ "fail": "connection", "attempts": 1 }));
        }
    }
    steps.push(sleep(rng));
    steps.push(json!({ "output": { "answer": i } }));
    json!({ "steps": steps })
}

struct WorkerSlot {
    identity: String,
    task: tokio::task::JoinHandle<()>,
}

pub(crate) async fn run(app: &App, cli: &Cli, args: &DemoArgs) -> CliResult {
    let text = cli.format == Format::Text && !cli.quiet;
    let db = args
        .db
        .clone()
        .unwrap_or_else(|| PathBuf::from("courier.db"));
    let db_text = db.display().to_string();
    let store = SqlRunStore::connect(
        &format!("sqlite://{db_text}?mode=rwc"),
        SqlRunStoreOptions::default(),
    )
    .await
    .map_err(|e| CliError::runtime(format!("cannot open `{db_text}`: {}", chain(&e))))?;
    store
        .setup()
        .await
        .map_err(|e| CliError::runtime(format!("cannot set up `{db_text}`: {}", chain(&e))))?;
    let raw_store = store.clone();
    let store: Arc<dyn RunStore> = Arc::new(store);

    let registry = Arc::new(MessageRegistry::new().with::<RunAgent>());
    let dsn = |queue: &str| {
        Dsn::parse(&format!("sqlite://{db_text}?queue_name={queue}"))
            .map_err(|e| CliError::usage(format!("--db: {e}")))
    };
    let queue = app
        .factories
        .create(FactoryContext::new("demo", dsn("demo")?).registry(registry.clone()))
        .await?;
    let failed = app
        .factories
        .create(FactoryContext::new("demo_failed", dsn("demo_failed")?).registry(registry))
        .await?;
    for t in [&queue, &failed] {
        if let Some(setup) = t.as_setup() {
            setup.setup().await?;
        }
    }

    let config = RunsConfig {
        lease: Duration::from_secs(30),
        backoff: courier_runs::BackoffConfig {
            base: Duration::from_millis(50),
            cap: Duration::from_millis(400),
            jitter: 0.0,
        },
        ..RunsConfig::default()
    };
    let agents = crate::runs::Agents::with_builtin();
    let runtime_for = |id: Option<String>| {
        let mut options = config.clone();
        options.store = None;
        crate::runs::build_runtime_as(&agents, &options, store.clone(), id)
    };
    let bus_for = |rt: &Runtime| {
        rt.register(
            MessageBus::builder()
                .transport("demo", queue.clone())
                .route("courier.run_agent", ["demo"]),
        )
        .build()
    };

    // Submit.
    let started = Instant::now();
    let control = runtime_for(None);
    let _control_bus = bus_for(&control);
    let mut rng = fastrand::Rng::with_seed(7);
    let mut ids = Vec::with_capacity(args.runs as usize);
    for i in 0..args.runs {
        let id = control
            .enqueue("scripted", script(i, &mut rng))
            .await
            .map_err(|e| CliError::runtime(format!("cannot submit run {i}: {}", chain(&e))))?;
        ids.push(id);
    }
    if text {
        eprintln!(
            "Submitted {} runs to {db_text}; starting {} worker(s).",
            ids.len(),
            args.workers
        );
    }

    // Workers.
    let stop = CancellationToken::new();
    let start_worker = || {
        let identity = new_worker_identity();
        let rt = runtime_for(Some(identity.clone()));
        let worker = Worker::builder(bus_for(&rt))
            .receiver("demo", queue.clone())
            .failure_transport("demo_failed", failed.clone())
            .fetch_size(1)
            .sleep(Duration::from_millis(10))
            .ack_linger(Duration::ZERO)
            .build();
        let stop = stop.clone();
        let task = tokio::spawn(async move {
            let _ = worker.run(stop).await;
        });
        WorkerSlot { identity, task }
    };
    let mut workers: Vec<WorkerSlot> = (0..args.workers).map(|_| start_worker()).collect();

    // Kill the worker running the first run, expire its lease, reap.
    let victim = ids[0];
    let mut killed = 0;
    let mut reaped = 0;
    let reaper = control.reaper();
    let deadline = Instant::now() + Duration::from_secs(120);
    let tty = std::io::stderr().is_terminal();
    let mut last_progress = Instant::now();
    loop {
        if killed == 0
            && let Some(run) = store
                .find(victim)
                .await
                .map_err(|e| CliError::runtime(chain(&e)))?
            && run.status == RunStatus::Running
            && !store
                .events(victim)
                .await
                .map_err(|e| CliError::runtime(chain(&e)))?
                .is_empty()
            && let Some(i) = workers
                .iter()
                .position(|w| Some(&w.identity) == run.claimed_by.as_ref())
        {
            let slot = workers.swap_remove(i);
            slot.task.abort();
            let _ = slot.task.await;
            killed += 1;
            expire_lease(&raw_store, victim).await?;
            workers.push(start_worker());
            if text {
                let run = victim.to_string();
                note(
                    tty,
                    &format!(
                        "Killed the worker running run {}… mid-step; expired its lease.",
                        &run[..8]
                    ),
                );
            }
        }
        let report = reaper
            .reap(ReapOptions {
                limit: 50,
                dry_run: false,
            })
            .await
            .map_err(|e| CliError::runtime(chain(&e)))?;
        reaped += report.requeued + report.dead_lettered;
        if text && report.selected > 0 {
            note(tty, &report.to_string());
        }
        let counts = statuses(&store, &ids).await?;
        let done: usize = counts
            .iter()
            .filter(|(s, _)| s.is_terminal())
            .map(|(_, n)| n)
            .sum();
        if text && (tty || last_progress.elapsed() >= Duration::from_secs(2) || done == ids.len()) {
            let line = progress_line(&counts, ids.len(), started.elapsed());
            if tty {
                eprint!("\r\x1b[2K{line}");
            } else {
                eprintln!("{line}");
            }
            last_progress = Instant::now();
        }
        if done == ids.len() {
            if text && tty {
                eprintln!();
            }
            break;
        }
        if Instant::now() > deadline {
            stop.cancel();
            return Err(CliError::runtime(format!(
                "the demo did not finish within 2 minutes ({done} of {} runs done)",
                ids.len()
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let elapsed = started.elapsed();
    stop.cancel();
    for w in workers.drain(..) {
        let _ = w.task.await;
    }

    let summary = summarise(&store, &ids, args.workers, killed, reaped, elapsed).await?;
    if cli.format == Format::Json {
        let text =
            serde_json::to_string_pretty(&summary).map_err(|e| CliError::runtime(e.to_string()))?;
        println!("{text}");
    } else {
        print!("{}", render(&summary, &db_text));
    }
    Ok(())
}

/// A line on stderr, clearing the progress line first on a terminal.
fn note(tty: bool, text: &str) {
    if tty {
        eprint!("\r\x1b[2K");
    }
    eprintln!("{text}");
}

/// Rewrites the run's lease into the past, as if its worker's lease had run out.
async fn expire_lease(store: &SqlRunStore, id: Uuid) -> CliResult {
    let sql = format!(
        "UPDATE {} SET lease_expires = 1 WHERE id = ? AND status = 'running'",
        store.runs_table()
    );
    sqlx::query(&sql)
        .bind(id.to_string())
        .execute(store.pool())
        .await
        .map_err(|e| CliError::runtime(format!("cannot expire the lease of run {id}: {e}")))?;
    Ok(())
}

async fn statuses(store: &Arc<dyn RunStore>, ids: &[Uuid]) -> CliResult<Vec<(RunStatus, usize)>> {
    let mut counts: BTreeMap<&'static str, (RunStatus, usize)> = BTreeMap::new();
    for id in ids {
        if let Some(run) = store
            .find(*id)
            .await
            .map_err(|e| CliError::runtime(chain(&e)))?
        {
            counts
                .entry(run.status.as_str())
                .or_insert((run.status, 0))
                .1 += 1;
        }
    }
    Ok(counts.into_values().collect())
}

fn progress_line(counts: &[(RunStatus, usize)], total: usize, elapsed: Duration) -> String {
    let get = |s: RunStatus| counts.iter().find(|(k, _)| *k == s).map_or(0, |(_, n)| *n);
    format!(
        "{:>5.1}s  completed {}  failed {}  running {}  queued {}  of {total}",
        elapsed.as_secs_f64(),
        get(RunStatus::Completed),
        get(RunStatus::Failed),
        get(RunStatus::Running),
        get(RunStatus::Queued),
    )
}

async fn summarise(
    store: &Arc<dyn RunStore>,
    ids: &[Uuid],
    workers: u16,
    killed: usize,
    reaped: usize,
    elapsed: Duration,
) -> CliResult<Summary> {
    let mut s = Summary {
        runs: ids.len(),
        workers,
        workers_killed: killed,
        reaped,
        ..Summary::default()
    };
    for id in ids {
        let run = store
            .find(*id)
            .await
            .map_err(|e| CliError::runtime(chain(&e)))?
            .ok_or_else(|| CliError::runtime(format!("run {id} vanished")))?;
        s.requeued += u64::from(run.requeue_count);
        match run.status {
            RunStatus::Completed => {
                s.completed += 1;
                if run.requeue_count == 0 {
                    s.completed_first_try += 1;
                }
            }
            RunStatus::Failed => {
                s.dead_lettered += 1;
                let reason = run.termination_reason.map_or("unknown", |r| r.as_str());
                let key = match (run.pending_effect.is_some(), run.error_class) {
                    (true, _) => format!("{reason} (effect in flight)"),
                    (false, Some(c)) => format!("{reason} ({c})"),
                    (false, None) => reason.to_owned(),
                };
                *s.dead_lettered_by_reason.entry(key).or_default() += 1;
            }
            other => *s.other.entry(other.as_str().to_owned()).or_default() += 1,
        }
    }
    s.duration_s = elapsed.as_secs_f64();
    s.runs_per_s = ids.len() as f64 / s.duration_s.max(1e-9);
    Ok(s)
}

fn render(s: &Summary, db: &str) -> String {
    let mut out = String::new();
    let mut line =
        |label: &str, value: String| out.push_str(&format!("  {label:<48}{value:>10}\n"));
    line("runs submitted", s.runs.to_string());
    line("completed", s.completed.to_string());
    line("  on the first try", s.completed_first_try.to_string());
    line(
        "  after requeues",
        (s.completed - s.completed_first_try).to_string(),
    );
    line("dead-lettered (failed)", s.dead_lettered.to_string());
    for (reason, n) in &s.dead_lettered_by_reason {
        line(&format!("  {reason}"), n.to_string());
    }
    for (status, n) in &s.other {
        line(status, n.to_string());
    }
    line(
        "requeued along the way (sum of requeue_count)",
        s.requeued.to_string(),
    );
    line("reaped after a worker was killed", s.reaped.to_string());
    line(
        "workers (killed mid-run)",
        format!("{} ({})", s.workers, s.workers_killed),
    );
    line("duration", format!("{:.2} s", s.duration_s));
    line("throughput", format!("{:.1} runs/s", s.runs_per_s));
    format!(
        "\nCourier demo: scripted runs on SQLite `{db}`, read back from the store\n\n{out}\nExplore: courier runs list | courier runs show ID | courier stats\n"
    )
}
