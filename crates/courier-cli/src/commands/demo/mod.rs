//! `courier demo`: the main job on an embedded SQLite file, needing no config and no server.
//!
//! Writes a configuration for its workers (a queue, a failure transport and the run store in one
//! SQLite file, a 3 s lease, the reaper every second), submits one long run and `--runs` - 1
//! scripted runs with a realistic mix (most succeed after a few steps, some fail transiently once
//! or twice with 503 / 429 / connection errors, a few fail for good with 401 or 400, a few exhaust
//! their requeue budget, a few fail after a non-idempotent effect), and starts `--workers` worker
//! processes: this same binary running `consume demo`. When the store shows the long run running
//! under one of them, mid-run, it SIGKILLs that process. Nothing else touches the run: its lease
//! runs out, a surviving worker's reaper requeues it and a worker finishes it. The demo ends with
//! a summary read back from the store.

#[cfg(feature = "agent")]
pub(crate) mod llm;
#[cfg(feature = "agent")]
pub(crate) mod llm_tools;
mod script;
mod summary;
mod workers;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use courier_core::MessageRegistry;
use courier_core::config::Config;
use courier_runs::{RunAgent, RunStatus, RunStore, RunsConfig};
use uuid::Uuid;

use crate::cli::{Cli, DemoArgs, Format};
use crate::error::{CliError, CliResult, chain};
use crate::wiring::Wiring;
use summary::{KilledWorker, Tally};
use workers::{Line, WorkDir, Workers};

/// Runs submitted without --runs.
const DEFAULT_RUNS: u32 = 200;
/// The longest the demo may take.
const DEADLINE: Duration = Duration::from_secs(120);
/// The longest the demo waits for a worker to be running the long run.
const CRASH_DEADLINE: Duration = Duration::from_secs(30);

pub(crate) async fn run(app: &Wiring, cli: &Cli, args: &DemoArgs) -> CliResult {
    if args.agent.is_some() {
        #[cfg(feature = "agent")]
        return llm::run(app, cli, args).await;
        #[cfg(not(feature = "agent"))]
        return Err(CliError::usage(
            "`demo --agent llm` needs the `agent` feature (cargo run --features agent -- demo --agent llm)",
        ));
    }
    let out = Out::new(cli.format == Format::Text && !cli.quiet);
    let db = args
        .db
        .clone()
        .unwrap_or_else(|| PathBuf::from("courier.db"));
    let db_text = db.display().to_string();

    // The configuration the workers run with, and the same transports and store here.
    let config_text = workers::config(&db_text);
    let config: Config = config_text
        .parse()
        .map_err(|e| CliError::usage(format!("--db `{db_text}`: {e}")))?;
    let runs_config: RunsConfig = config
        .runs
        .clone()
        .unwrap_or_default()
        .deserialize()
        .map_err(|e| CliError::runtime(format!("[runs]: {e}")))?;
    let transports = config
        .connect(
            &app.factories,
            Arc::new(MessageRegistry::new().with::<RunAgent>()),
        )
        .await?;
    for t in transports.all().values() {
        if let Some(setup) = t.as_setup() {
            setup.setup().await?;
        }
    }
    let store = crate::runs::open_store(&runs_config).await?;
    let control = crate::runs::build_runtime(&app.agents, &runs_config, store.clone());
    let _bus = control.register(transports.bus_builder()).build();

    // Submit: the long run first, so the first worker to fetch takes it.
    let started = Instant::now();
    let submit = |i: u32, input| {
        let control = &control;
        async move {
            control
                .enqueue("scripted", input)
                .await
                .map_err(|e| CliError::runtime(format!("cannot submit run {i}: {}", chain(&e))))
        }
    };
    let crash_run = submit(0, script::crash_run()).await?;
    let mut ids = vec![crash_run];
    let mut rng = fastrand::Rng::with_seed(7);
    for i in 1..args.runs.unwrap_or(DEFAULT_RUNS) {
        ids.push(submit(i, script::run(i, &mut rng)).await?);
    }

    let work = WorkDir::create(&config_text)?;
    let mut workers = Workers::start(&work, args.workers)?;
    out.note(&format!(
        "Submitted {} runs to {db_text}; started {} worker processes ({}),\n\
         each `courier consume demo` with a {} lease and its reaper every {}.",
        ids.len(),
        args.workers,
        pids(&workers.pids()),
        humantime::format_duration(workers::LEASE),
        humantime::format_duration(workers::REAP_EVERY),
    ));

    let mut watch = Watch {
        run: crash_run,
        started,
        killed: None,
        reaped: 0,
    };
    let driven = drive(&out, &store, &ids, &mut watch, &mut MidRun, &mut workers).await;
    let elapsed = started.elapsed();
    let worker_pids = workers.pids();
    // Stop the workers whatever happened, so none is left behind.
    let registry = transports
        .get("demo")
        .cloned()
        .and_then(courier_core::shared_worker_registry);
    let stopped = workers.stop(&work, registry).await;
    driven?;
    for line in stopped? {
        watch.line(&out, &line);
    }

    let mut summary = summary::summarise(&store, &ids, args.workers, elapsed).await?;
    summary.reaped = watch.reaped;
    summary.demo_pid = std::process::id();
    summary.worker_pids = worker_pids;
    if let Some(mut killed) = watch.killed {
        summary::Summary::resumed(&store, &mut killed).await?;
        summary.killed(killed);
    }
    if cli.format == Format::Json {
        let text =
            serde_json::to_string_pretty(&summary).map_err(|e| CliError::runtime(e.to_string()))?;
        println!("{text}");
    } else {
        print!("{}", summary::render(&summary, &db_text));
    }
    Ok(())
}

/// When a demo kills the worker running its crash run: asked at every tick until it has.
trait Crash {
    /// Kills the worker now if the run is where the demo wants it killed.
    async fn try_kill(
        &mut self,
        out: &Out,
        store: &Arc<dyn RunStore>,
        watch: &mut Watch,
        workers: &mut Workers,
    ) -> CliResult;
}

/// The main demo's crash: the worker is killed once the run is mid-run.
struct MidRun;

impl Crash for MidRun {
    async fn try_kill(
        &mut self,
        out: &Out,
        store: &Arc<dyn RunStore>,
        watch: &mut Watch,
        workers: &mut Workers,
    ) -> CliResult {
        watch.try_kill(out, store, workers).await
    }
}

/// Watches the store until every run is terminal: kills the worker running the crash run when
/// `crash` says, then follows that run; shows progress and the workers' reaper reports.
async fn drive(
    out: &Out,
    store: &Arc<dyn RunStore>,
    ids: &[Uuid],
    watch: &mut Watch,
    crash: &mut impl Crash,
    workers: &mut Workers,
) -> CliResult {
    let started = watch.started;
    let mut tally = Tally::new(ids);
    let mut last_progress = Instant::now();
    loop {
        for line in workers.drain() {
            watch.line(out, &line);
        }
        workers.check_alive().await?;
        match &watch.killed {
            None => crash.try_kill(out, store, watch, workers).await?,
            Some(_) => watch.follow(out, store).await?,
        }
        let (counts, done) = tally.refresh(store).await?;
        if out.on
            && (out.tty || last_progress.elapsed() >= Duration::from_secs(2) || done == ids.len())
        {
            out.progress(&summary::progress_line(
                &counts,
                ids.len(),
                started.elapsed(),
            ));
            last_progress = Instant::now();
        }
        if done == ids.len() && watch.killed.is_some() {
            watch.follow(out, store).await?;
            out.end_progress();
            return Ok(());
        }
        if started.elapsed() > DEADLINE {
            return Err(CliError::runtime(format!(
                "the demo did not finish within {} ({done} of {} runs done)",
                humantime::format_duration(DEADLINE),
                ids.len()
            )));
        }
        let tick = if watch.killed.is_none() { 50 } else { 200 };
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(tick)) => {}
            _ = tokio::signal::ctrl_c() => {
                out.end_progress();
                return Err(CliError::runtime("interrupted (the worker processes were asked to stop)"));
            }
        }
    }
}

/// The crash, as the demo sees it: which worker it killed and what became of the run.
struct Watch {
    run: Uuid,
    started: Instant,
    killed: Option<KilledWorker>,
    reaped: usize,
}

impl Watch {
    fn at(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// A worker's stderr line: reaper reports count (and are shown), errors are shown.
    fn line(&mut self, out: &Out, line: &Line) {
        if let Some((requeued, dead)) = workers::reaped(&line.text) {
            if requeued + dead == 0 {
                return;
            }
            self.reaped += requeued + dead;
            if let Some(k) = &mut self.killed
                && k.reaped_by_pid.is_none()
            {
                k.reaped_by_pid = Some(line.pid);
            }
            out.note(&format!(
                "{:>5.1}s  worker {}: {}",
                self.at(),
                line.pid,
                line.text.trim()
            ));
        } else if line.text.starts_with("error") || line.text.contains("ERROR") {
            out.note(&format!("worker {}: {}", line.pid, line.text.trim()));
        }
    }

    /// Kills the worker running the long run once it is mid-run.
    async fn try_kill(
        &mut self,
        out: &Out,
        store: &Arc<dyn RunStore>,
        workers: &mut Workers,
    ) -> CliResult {
        let run = find(store, self.run).await?;
        let owner = run.claimed_by.clone().unwrap_or_default();
        let pid = workers::pid_of(&owner).filter(|pid| workers.contains(*pid));
        let Some(pid) = pid.filter(|_| run.status == RunStatus::Running) else {
            if run.status.is_terminal() || self.started.elapsed() > CRASH_DEADLINE {
                return Err(CliError::runtime(format!(
                    "run {} was not seen running under a demo worker (status {}, claimed by {})",
                    self.run,
                    run.status.as_str(),
                    run.claimed_by.as_deref().unwrap_or("nobody")
                )));
            }
            return Ok(());
        };
        let steps = store
            .steps(self.run)
            .await
            .map_err(|e| CliError::runtime(chain(&e)))?
            .len();
        if steps < script::CRASH_AFTER_STEPS {
            return Ok(());
        }
        let status = workers.kill(pid).await?;
        let killed_at_s = self.at();
        let signal = workers::signal(status);
        let lease_left_ms = match store.now_ms().await {
            Ok(now) => (run.lease_expires - now).max(0),
            Err(_) => 0,
        };
        out.note(&format!(
            "{killed_at_s:>5.1}s  killed worker {pid} ({}) in step {} of run {}; \
             lease ends in {:.1} s",
            signal.map_or_else(|| "killed".to_owned(), |n| format!("exit: signal {n}")),
            steps + 1,
            short(self.run),
            lease_left_ms as f64 / 1000.0,
        ));
        self.killed = Some(KilledWorker {
            pid,
            signal,
            worker_id: owner,
            run_id: self.run,
            steps_before_kill: steps,
            steps_replayed: 0,
            steps_ran_after: 0,
            killed_at_s,
            reaped_at_s: None,
            reaped_by_pid: None,
            finished_at_s: None,
            finished_status: None,
            finished_by_pid: None,
        });
        Ok(())
    }

    /// Notes when the killed worker's run is requeued and when it finishes.
    async fn follow(&mut self, out: &Out, store: &Arc<dyn RunStore>) -> CliResult {
        let at = self.at();
        let Some(k) = &mut self.killed else {
            return Ok(());
        };
        if k.finished_at_s.is_some() {
            return Ok(());
        }
        let run = find(store, k.run_id).await?;
        if k.reaped_at_s.is_none() && run.requeue_count > 0 {
            k.reaped_at_s = Some(at);
            out.note(&format!(
                "{at:>5.1}s  run {} requeued (requeue_count {}): its lease had run out",
                short(k.run_id),
                run.requeue_count
            ));
        }
        if run.status.is_terminal() {
            k.finished_at_s = Some(at);
            k.finished_status = Some(run.status.as_str().to_owned());
            k.finished_by_pid = run.claimed_by.as_deref().and_then(workers::pid_of);
            out.note(&format!(
                "{at:>5.1}s  run {} {} by worker {}, {:.1} s after worker {} was killed",
                short(k.run_id),
                run.status.as_str(),
                k.finished_by_pid
                    .map_or_else(|| "?".to_owned(), |p| p.to_string()),
                at - k.killed_at_s,
                k.pid,
            ));
        }
        Ok(())
    }
}

async fn find(store: &Arc<dyn RunStore>, id: Uuid) -> CliResult<courier_runs::Run> {
    store
        .find(id)
        .await
        .map_err(|e| CliError::runtime(chain(&e)))?
        .ok_or_else(|| CliError::runtime(format!("run {id} vanished")))
}

fn short(id: Uuid) -> String {
    let mut s = id.to_string();
    s.truncate(8);
    s.push('…');
    s
}

fn pids(pids: &[u32]) -> String {
    let list: Vec<String> = pids.iter().map(u32::to_string).collect();
    format!("pids {}", list.join(", "))
}

/// Progress on stderr: notes, and a progress line redrawn in place on a terminal.
struct Out {
    on: bool,
    tty: bool,
}

impl Out {
    fn new(on: bool) -> Self {
        Self {
            on,
            tty: std::io::stderr().is_terminal(),
        }
    }

    /// A line, clearing the progress line first on a terminal.
    fn note(&self, text: &str) {
        if !self.on {
            return;
        }
        if self.tty {
            eprint!("\r\x1b[2K");
        }
        eprintln!("{text}");
    }

    fn progress(&self, line: &str) {
        if self.tty {
            eprint!("\r\x1b[2K{line}");
        } else {
            eprintln!("{line}");
        }
    }

    fn end_progress(&self) {
        if self.on && self.tty {
            eprintln!();
        }
    }
}
