//! One scenario per transport: produce messages and runs, SIGKILL a random worker every couple
//! of seconds, kill the server twice mid-consume, inject poison, then check everything.

use std::collections::HashSet;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use courier_core::config::Config;
use courier_core::{Envelope, MessageRegistry, Transport, TransportRegistry};
use courier_runs::{RunAgent, RunStore, Runtime, SqlRunStore, SqlRunStoreOptions};
use serde_json::json;
use sqlx::SqlitePool;
use tokio::process::{Child, Command};
use tokio::time::{Instant, sleep, sleep_until, timeout};
use uuid::Uuid;

use crate::ChaosItem;
use crate::poison;
use crate::report::Report;
use crate::server::Server;
use crate::sink::{self, now_ms};

mod checks;
mod layout;

use checks::{check_failed, check_messages, check_runs, leftovers, worker_warnings};
use layout::{config_text, layout};

pub use crate::target::Target;

/// How hard a scenario pushes.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Plain messages produced.
    pub messages: u64,
    /// Durable runs submitted (one in five `scripted`, the rest `chaos`).
    pub runs: u32,
    /// Workers consuming at once.
    pub workers: usize,
    /// Messages are produced evenly over this long, while the chaos goes on.
    pub produce_for: Duration,
    /// A random worker is SIGKILLed and restarted this often while producing.
    pub kill_every: Duration,
    /// Times the server is killed and restarted.
    pub server_kills: u32,
    /// How long the server stays down.
    pub downtime: Duration,
    /// The workers' `fetch_size` (the `consume` default).
    pub fetch_size: u64,
    /// `[runs] lease`.
    pub lease: Duration,
    /// `consume --reap-every`.
    pub reap_every: Duration,
    /// The transports' `redeliver_timeout`.
    pub redeliver: Duration,
    /// How long to wait after the last kill for everything to finish before reporting.
    pub drain_limit: Duration,
}

impl Plan {
    /// The short variant: 2,000 messages and 50 runs, about half a minute per transport.
    #[must_use]
    pub fn short() -> Self {
        Self {
            messages: 2_000,
            runs: 50,
            workers: 3,
            produce_for: Duration::from_secs(16),
            kill_every: Duration::from_secs(2),
            server_kills: 2,
            downtime: Duration::from_secs(3),
            fetch_size: 32,
            lease: Duration::from_secs(5),
            reap_every: Duration::from_secs(2),
            redeliver: Duration::from_secs(5),
            drain_limit: Duration::from_secs(30),
        }
    }

    /// The long variant: 100,000 messages and 500 runs per transport.
    #[must_use]
    pub fn long() -> Self {
        Self {
            messages: 100_000,
            runs: 500,
            produce_for: Duration::from_secs(90),
            drain_limit: Duration::from_secs(120),
            ..Self::short()
        }
    }

    /// The time every run must be terminal in after the last kill or server restart: lease +
    /// reap + redeliver.
    #[must_use]
    pub fn runs_bound(&self) -> Duration {
        self.lease + self.reap_every + self.redeliver
    }
}

fn log(target: Target, t0: Instant, message: &str) {
    eprintln!(
        "[{} +{:5.1}s] {message}",
        target.name(),
        t0.elapsed().as_secs_f64()
    );
}

fn humantime(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

/// The worker processes, by slot.
struct Workers {
    exe: PathBuf,
    config: PathBuf,
    sink: PathBuf,
    dir: PathBuf,
    reap_every: Duration,
    fetch_size: u64,
    slots: Vec<Option<Child>>,
    started: u32,
}

impl Workers {
    fn spawn(&mut self, slot: usize) -> anyhow::Result<()> {
        self.started += 1;
        let log =
            std::fs::File::create(self.dir.join(format!("worker-{slot}-{}.log", self.started)))?;
        let child = Command::new(&self.exe)
            .arg("consume")
            .arg("--config")
            .arg(&self.config)
            .args(["--reap-every", &humantime(self.reap_every)])
            .args(["--fetch-size", &self.fetch_size.to_string()])
            .env(sink::SINK_ENV, &self.sink)
            .env("RUST_LOG", "warn")
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", self.exe.display()))?;
        self.slots[slot] = Some(child);
        Ok(())
    }

    async fn kill(&mut self, slot: usize) {
        if let Some(mut child) = self.slots[slot].take() {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }

    async fn kill_all(&mut self) {
        for slot in 0..self.slots.len() {
            self.kill(slot).await;
        }
    }
}

fn factories() -> TransportRegistry {
    courier::transport_registry()
}

async fn setup(worker: &Path, config: &Path, dir: &Path) -> anyhow::Result<()> {
    let out = Command::new(worker)
        .arg("setup")
        .arg("--config")
        .arg(config)
        .env(sink::SINK_ENV, dir.join("sink.db"))
        .output()
        .await?;
    if !out.status.success() {
        bail!(
            "`chaos-worker setup` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Sends `messages` in batches spread over `over`; a failed batch is sent again (its ids are
/// remembered as possibly duplicated by the producer). The last batch waits for `last_batch`
/// (its sender dropped once the server restarts are over), so every restart, however late a
/// slow node start pushes it, has messages left to recover with.
async fn produce(
    transport: Arc<dyn Transport>,
    messages: u64,
    over: Duration,
    resent: Arc<Mutex<HashSet<u64>>>,
    last_batch: tokio::sync::oneshot::Receiver<()>,
) {
    let mut last_batch = Some(last_batch);
    let batches = (over.as_millis() / 100).max(1) as u64;
    let per_batch = messages.div_ceil(batches).max(1);
    let start = Instant::now();
    let mut next = 0;
    let mut n = 0u64;
    while next < messages {
        let end = (next + per_batch).min(messages);
        if end == messages
            && let Some(released) = last_batch.take()
        {
            // Never sent: released when the server task ends and drops its sender.
            let _ = released.await;
        }
        loop {
            let envelopes: Vec<Envelope> = (next..end)
                .map(|id| Envelope::new(ChaosItem { id }))
                .collect();
            match timeout(Duration::from_secs(10), transport.send_batch(envelopes)).await {
                Ok(Ok(_)) => break,
                _ => {
                    if let Ok(mut r) = resent.lock() {
                        r.extend(next..end);
                    }
                    sleep(Duration::from_millis(250)).await;
                }
            }
        }
        next = end;
        n += 1;
        sleep_until(start + Duration::from_millis(100) * u32::try_from(n).unwrap_or(u32::MAX))
            .await;
    }
}

async fn distinct_handled(sink: &SqlitePool) -> i64 {
    sqlx::query_scalar("SELECT COUNT(DISTINCT id) FROM chaos_log")
        .fetch_one(sink)
        .await
        .unwrap_or(0)
}

/// Runs the scenario for `target` with `worker` (the `chaos-worker` binary) and checks it.
///
/// # Errors
/// The harness itself failed (a server did not start, the configuration was refused); the
/// checks' failures are in [`Report::failures`].
pub async fn run(target: Target, plan: &Plan, worker: &Path) -> anyhow::Result<Report> {
    poison::install_drivers();
    let t0 = Instant::now();
    let dir = std::env::temp_dir().join(format!(
        "courier-chaos-{}-{:08x}",
        target.name(),
        fastrand::u32(..)
    ));
    std::fs::create_dir_all(&dir)?;
    let result = run_in(target, plan, worker, &dir, t0).await;
    match &result {
        Ok(r) if r.failures.is_empty() && std::env::var_os("CHAOS_KEEP").is_none() => {
            let _ = std::fs::remove_dir_all(&dir);
        }
        _ => {}
    }
    result
}

#[allow(clippy::too_many_lines, reason = "one scenario read top to bottom")]
async fn run_in(
    target: Target,
    plan: &Plan,
    worker: &Path,
    dir: &Path,
    t0: Instant,
) -> anyhow::Result<Report> {
    let mut report = Report {
        transport: target.name().into(),
        messages: plan.messages,
        runs: plan.runs as usize,
        runs_bound_ms: i64::try_from(plan.runs_bound().as_millis()).unwrap_or(i64::MAX),
        ..Report::default()
    };
    let mut server = match target.server() {
        Some(kind) => {
            let s = Server::start(kind, &dir.join("server")).await?;
            log(
                target,
                t0,
                &format!("{kind:?} up on 127.0.0.1:{}", s.port()),
            );
            Some(s)
        }
        None => None,
    };
    let sink_path = dir.join("sink.db");
    let sink = sink::open(&sink_path).await?;
    let layout = layout(target, dir, server.as_ref(), plan);
    let config_path = dir.join("chaos.toml");
    std::fs::write(&config_path, config_text(&layout, plan))?;
    setup(worker, &config_path, dir).await?;

    // The producer side: the same configuration through the library.
    let config = Config::load(&config_path)?;
    let mut registry = MessageRegistry::new();
    registry.register::<ChaosItem>();
    registry.register::<RunAgent>();
    let transports = config.connect(&factories(), Arc::new(registry)).await?;
    let store: Arc<dyn RunStore> =
        Arc::new(SqlRunStore::connect(&layout.store, SqlRunStoreOptions::default()).await?);
    let runtime = Runtime::builder(store.clone()).build();
    let _bus = runtime.register(transports.bus_builder()).build();
    let transport = transports
        .get("async")
        .cloned()
        .context("no transport `async`")?;

    let (poison, refused) = poison::inject(target, &layout.poison).await?;
    report.poison = poison.iter().map(|p| p.kind.to_owned()).collect();
    for r in refused {
        report
            .notes
            .push(format!("poison refused by the storage: {r}"));
    }
    let mut run_ids = Vec::new();
    for i in 0..plan.runs {
        let (agent, input) = if i % 5 == 4 {
            (
                "scripted",
                json!({"steps": [{"sleep_ms": 50}, {"sleep_ms": 50}, {"output": "done"}]}),
            )
        } else {
            ("chaos", json!({"steps": 4, "sleep_ms": 100}))
        };
        run_ids.push(runtime.enqueue(agent, input).await?);
    }
    log(
        target,
        t0,
        &format!(
            "{} poison, {} runs submitted; starting {} workers",
            poison.len(),
            run_ids.len(),
            plan.workers
        ),
    );

    let mut workers = Workers {
        exe: worker.to_owned(),
        config: config_path.clone(),
        sink: sink_path.clone(),
        dir: dir.to_owned(),
        reap_every: plan.reap_every,
        fetch_size: plan.fetch_size,
        slots: (0..plan.workers).map(|_| None).collect(),
        started: 0,
    };
    for slot in 0..plan.workers {
        workers.spawn(slot)?;
    }
    let chaos_start = Instant::now();
    let resent = Arc::new(Mutex::new(HashSet::new()));
    let (restarts_over, last_batch) = tokio::sync::oneshot::channel::<()>();
    let producer = tokio::spawn(produce(
        transport.clone(),
        plan.messages,
        plan.produce_for,
        resent.clone(),
        last_batch,
    ));

    // Server kills at 30% and 65% of the production, each after the server was up at least as
    // long as its downtime (SQLite: a worker killed mid-write instead).
    let kill_at: Vec<Instant> = (0..plan.server_kills)
        .map(|k| {
            let frac = 0.3 + 0.35 * f64::from(k);
            chaos_start + plan.produce_for.mul_f64(frac.min(0.95))
        })
        .collect();
    let server_task = {
        let kill_at = kill_at.clone();
        let downtime = plan.downtime;
        let mut server = server.take();
        tokio::spawn(async move {
            // Dropped when this task ends: the producer's last batch goes then.
            let _restarts_over = restarts_over;
            let mut backs = Vec::new();
            if let Some(s) = server.as_mut() {
                let mut up_since: Option<Instant> = None;
                for at in kill_at {
                    // A node slow to start is not killed again the moment it is back: it stays
                    // up at least as long as it was down, so each restart's recovery is seen.
                    let at = up_since.map_or(at, |up| at.max(up + downtime));
                    sleep_until(at).await;
                    s.kill();
                    log(target, t0, "server killed (kill -9)");
                    sleep(downtime).await;
                    if let Err(e) = s.restart().await {
                        return (server, backs, Some(format!("server restart failed: {e:#}")));
                    }
                    let back = now_ms();
                    up_since = Some(Instant::now());
                    log(target, t0, "server restarted and accepting connections");
                    backs.push(back);
                }
            }
            (server, backs, None)
        })
    };

    let kill_until = chaos_start + plan.produce_for + plan.kill_every;
    let mut next_kill = chaos_start + plan.kill_every;
    let mut mid_write = kill_at
        .iter()
        .copied()
        .filter(|_| target == Target::Sqlite)
        .collect::<Vec<_>>();
    let mut last_kill = now_ms();
    while next_kill <= kill_until {
        let at = match mid_write.first() {
            Some(m) if *m < next_kill => mid_write.remove(0),
            _ => {
                let at = next_kill;
                next_kill += plan.kill_every;
                at
            }
        };
        sleep_until(at).await;
        let slot = fastrand::usize(..plan.workers);
        workers.kill(slot).await;
        workers.spawn(slot)?;
        report.worker_kills += 1;
        last_kill = now_ms();
    }
    log(
        target,
        t0,
        &format!("{} worker kills done; draining", report.worker_kills),
    );
    let _ = producer.await;
    let (server_back, backs, server_error) = server_task.await?;
    server = server_back;
    // The bounds run from the last disruption: a server restart that ends after the last
    // worker kill (a slow node start) is one too, since until then nothing can recover.
    let last_kill = backs.iter().copied().fold(last_kill, i64::max);
    if let Some(e) = server_error {
        report.failures.push(e);
    }
    if target.server().is_some() {
        report.server_restarts = Some(u32::try_from(backs.len()).unwrap_or(u32::MAX));
    } else {
        report.notes.push(format!(
            "no server: {} of the worker kills were timed mid-write in place of server restarts",
            kill_at.len()
        ));
    }
    if target == Target::Rabbitmq {
        report.notes.push("the server restarts are kill -9 and restart of a second RabbitMQ node (not only connection loss)".into());
    }
    if target == Target::Nats {
        report.notes.push("the server restarts are kill -9 and restart of a private nats-server on its JetStream store (file storage)".into());
    }

    // Drain: wait for every message and every run, at most drain_limit after the last kill.
    let mut pending: Vec<Uuid> = run_ids.clone();
    let deadline = Instant::now() + plan.drain_limit;
    let expected = i64::try_from(plan.messages).unwrap_or(i64::MAX);
    loop {
        if report.messages_done_ms.is_none() && distinct_handled(&sink).await >= expected {
            report.messages_done_ms = Some((now_ms() - last_kill).max(0));
        }
        if report.runs_terminal_ms.is_none() {
            let mut still = Vec::new();
            for id in pending {
                match store.find(id).await {
                    Ok(Some(run)) if run.status.is_terminal() => {}
                    _ => still.push(id),
                }
            }
            pending = still;
            if pending.is_empty() {
                report.runs_terminal_ms = Some((now_ms() - last_kill).max(0));
            }
        }
        if (report.messages_done_ms.is_some() && report.runs_terminal_ms.is_some())
            || Instant::now() > deadline
        {
            break;
        }
        sleep(Duration::from_millis(250)).await;
    }
    // Let the last acks and failure moves land, then stop the workers.
    sleep(Duration::from_secs(1)).await;
    workers.kill_all().await;
    log(target, t0, "workers stopped; checking");

    check_messages(&mut report, &sink, plan, &resent, &backs).await?;
    check_runs(&mut report, store.as_ref(), &run_ids).await?;
    check_failed(&mut report, &layout.failed, &poison).await;
    leftovers(&mut report, &layout.poison).await;
    worker_warnings(&mut report, dir);
    if !report.failures.is_empty() {
        if let Some(s) = server.as_mut() {
            s.keep();
        }
        report.kept = Some(dir.to_owned());
    }
    drop(server);
    Ok(report)
}
