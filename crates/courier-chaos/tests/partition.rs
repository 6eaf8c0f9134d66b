//! A host cut off mid-run (issue 15): two network-namespace hosts, each one `consume` worker,
//! against private servers on a bridge. Host A is executing two durable runs and holds plain
//! messages un-acked when its link goes down. Then: A's leases expire, B's reaper requeues the
//! runs and B completes them; A's messages are redelivered to B (the SQL redeliver timeout, Redis
//! XAUTOCLAIM); A finds its leases lost (its heartbeats unanswered for a lease) and stops
//! without settling or writing a step (the fence), and nothing is settled twice. Last,
//! `workers` on B lists both workers and `stop-workers` on B stops both (the worker registry).
//!
//! The keyed case (issue 41): A holds every tenant's concurrency slot (`max = 1`) when its link
//! goes down; B gets the slots back within the lease, long before A's handlers would have freed
//! them, and handles every tenant's queue one at a time.
//! Needs root (`ip netns`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use courier_chaos::hosts::{Hosts, ServerKind, unavailable};
use courier_chaos::keyed::{self, KeyedItem};
use courier_chaos::{ChaosItem, sink};
use courier_core::config::Config;
use courier_core::{Envelope, MessageRegistry, Transport, TransportRegistry};
use courier_runs::{
    Run, RunAgent, RunEvent, RunStatus, RunStore, Runtime, SqlRunStore, SqlRunStoreOptions,
};
use serde_json::json;
use sqlx::Connection as _;
use tokio::process::Child;
use tokio::time::{Instant, sleep, timeout};

/// One scenario at a time: each has its own hosts and servers, but they share two cores.
static SERIAL: Mutex<()> = Mutex::new(());

const RUNS: usize = 2;
/// Plain messages sent before the cut (A holds them) and after it (only B can take them).
const HELD: u64 = 20;
const LATE: u64 = 10;
/// The runs' steps: B's whole execution takes STEPS x STEP_MS.
const STEPS: u64 = 6;
const STEP_MS: u64 = 300;
const QUEUE: &str = "partition";

/// The keyed case: tenants' messages under `max = 1` per tenant, each tenant's first message
/// slow (A holds its slot when the link goes down), the rest quick.
const TENANTS: [&str; 2] = ["tenant-a", "tenant-b"];
const PER_TENANT: u64 = 5;
const SLOW_MS: u64 = 20_000;
const QUICK_MS: u64 = 100;
/// The queue's lease (`redeliver_timeout` in [`config`]).
const LEASE: Duration = Duration::from_secs(3);

/// The hosts' `courier.toml`; `keyed` adds the tenants' limit, which makes the queue keyed (on
/// Redis a keyed queue keeps its messages in lists per key, not in the stream's group).
fn config(messages: ServerKind, hosts: &Hosts, keyed: bool) -> anyhow::Result<String> {
    let pg = hosts.url(ServerKind::Postgres).context("no postgres")?;
    let dsn = match messages {
        ServerKind::Redis => format!(
            "{}?stream={QUEUE}",
            hosts.url(ServerKind::Redis).context("no redis")?
        ),
        _ => format!("{pg}?queue_name={QUEUE}"),
    };
    Ok(format!(
        r#"[transports.async]
dsn = "{dsn}"
failure_transport = "failed"
options = {{ redeliver_timeout = "3s" }}

[transports.failed]
dsn = "{pg}?queue_name=failed"

[routing]
"chaos.item" = "async"
"courier.run_agent" = "async"
"chaos.keyed" = "async"

[runs]
store = "{pg}"
lease = "3s"
reap_every = "1s"
{limit}"#,
        limit = if keyed {
            "\n[limits.concurrency.\"chaos.keyed\"]\nkey = \"$.tenant\"\nmax = 1\n"
        } else {
            ""
        }
    ))
}

struct Worker {
    child: Child,
    pid: u32,
    log: PathBuf,
}

impl Worker {
    fn start(hosts: &Hosts, i: usize, exe: &Path, dir: &Path) -> anyhow::Result<Self> {
        let log = dir.join(format!("worker-{}.log", hosts.name(i)));
        let child = hosts
            .command(i, exe)
            .args([
                "consume",
                "async",
                "--concurrency",
                "2",
                "--reap-every",
                "1s",
            ])
            .arg("--config")
            .arg(dir.join("courier.toml"))
            .env(sink::SINK_ENV, dir.join("sink.db"))
            .env("RUST_LOG", "warn")
            .current_dir(dir)
            .stdin(std::process::Stdio::null())
            .stdout(std::fs::File::create(log.with_extension("out"))?)
            .stderr(std::fs::File::create(&log)?)
            .kill_on_drop(true)
            .spawn()
            .context("starting a worker with ip netns exec")?;
        let pid = child.id().context("the worker has no pid")?;
        Ok(Self { child, pid, log })
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Its exit status once it exits on its own (after `stop-workers`), at most `limit`.
    async fn exited(mut self, limit: Duration) -> anyhow::Result<std::process::ExitStatus> {
        Ok(timeout(limit, self.child.wait())
            .await
            .with_context(|| format!("a worker did not stop within {limit:?} of stop-workers"))??)
    }
}

/// Polls `check` every 100 ms until it returns `Some`, at most `limit`.
async fn until<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check().await? {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("timed out after {limit:?} waiting until {what}");
        }
        sleep(Duration::from_millis(100)).await;
    }
}

/// Messages of the queue a worker holds (delivered, not acked).
async fn held(messages: ServerKind, hosts: &Hosts) -> anyhow::Result<u64> {
    let attempt = async {
        if messages == ServerKind::Redis {
            let url = hosts.url(ServerKind::Redis).context("no redis")?;
            let mut c = redis::Client::open(url)?
                .get_multiplexed_async_connection()
                .await?;
            let (n, ..): (u64, redis::Value, redis::Value, redis::Value) = redis::cmd("XPENDING")
                .arg(QUEUE)
                .arg("courier")
                .query_async(&mut c)
                .await?;
            return Ok(n);
        }
        let url = hosts.url(ServerKind::Postgres).context("no postgres")?;
        let mut c = sqlx::PgConnection::connect(url).await?;
        let n: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM courier_messages WHERE queue_name = $1 AND delivered_at IS NOT NULL",
        )
        .bind(QUEUE)
        .fetch_one(&mut c)
        .await?;
        Ok(u64::try_from(n).unwrap_or(0))
    };
    timeout(Duration::from_secs(10), attempt)
        .await
        .context("counting held messages timed out")?
}

/// Keyed messages a worker holds, and (Redis) the slots in use: a keyed Redis queue keeps its
/// deliveries as leases in a sorted set and its slots in a hash, not in the stream's group.
async fn keyed_held(messages: ServerKind, hosts: &Hosts) -> anyhow::Result<(u64, u64)> {
    if messages != ServerKind::Redis {
        return Ok((held(messages, hosts).await?, 0));
    }
    let attempt = async {
        let url = hosts.url(ServerKind::Redis).context("no redis")?;
        let mut c = redis::Client::open(url)?
            .get_multiplexed_async_connection()
            .await?;
        let (leases, busy): (u64, u64) = redis::pipe()
            // The deliveries' leases, not the member at +inf that keeps the set a skiplist.
            .cmd("ZCOUNT")
            .arg(format!("{QUEUE}:keyed:leases"))
            .arg("-inf")
            .arg("(+inf")
            .cmd("HLEN")
            .arg(format!("{QUEUE}:keyed:busy"))
            .query_async(&mut c)
            .await?;
        Ok((leases, busy))
    };
    timeout(Duration::from_secs(10), attempt)
        .await
        .context("counting held keyed messages timed out")?
}

/// `(id, pid)` of every handling recorded in the sink.
async fn handlings(sink: &sqlx::SqlitePool) -> anyhow::Result<Vec<(u64, u32)>> {
    let rows: Vec<(i64, i64)> = sqlx::query_as("SELECT id, pid FROM chaos_log ORDER BY at_ms")
        .fetch_all(sink)
        .await?;
    Ok(rows
        .into_iter()
        .map(|(id, pid)| {
            (
                u64::try_from(id).unwrap_or(u64::MAX),
                u32::try_from(pid).unwrap_or(0),
            )
        })
        .collect())
}

fn owner(e: &RunEvent) -> String {
    e.payload["owner"].as_str().unwrap_or("?").to_owned()
}

/// The run's events: seqs contiguous from 1, and the owners in exactly two blocks (A's partial
/// execution, then B's complete one), B's block being the run's output owner.
fn check_events(run: &Run, events: &[RunEvent]) -> anyhow::Result<()> {
    let seqs: Vec<i64> = events.iter().map(|e| e.seq).collect();
    let want: Vec<i64> = (1..=i64::try_from(seqs.len())?).collect();
    ensure!(
        seqs == want,
        "run {}: seqs not contiguous: {seqs:?}",
        run.id
    );
    let mut blocks: Vec<(String, usize)> = Vec::new();
    for e in events {
        match blocks.last_mut() {
            Some((o, n)) if *o == owner(e) => *n += 1,
            _ => blocks.push((owner(e), 1)),
        }
    }
    ensure!(
        blocks.len() == 2,
        "run {}: want A's steps then B's, got owner blocks {blocks:?}",
        run.id
    );
    let b = &blocks[1];
    ensure!(
        b.1 == usize::try_from(STEPS)?
            && run.output.as_ref().map(|o| o["owner"].as_str()) == Some(Some(b.0.as_str())),
        "run {}: B's execution wrote {} of {STEPS} steps, output {:?}, blocks {blocks:?}",
        run.id,
        b.1,
        run.output
    );
    Ok(())
}

#[allow(clippy::too_many_lines, reason = "one scenario read top to bottom")]
async fn scenario(messages: ServerKind, hosts: &Hosts, dir: &Path) -> anyhow::Result<()> {
    let exe = Path::new(env!("CARGO_BIN_EXE_chaos-worker"));
    let pg = hosts.url(ServerKind::Postgres).context("no postgres")?;
    let config_path = dir.join("courier.toml");
    std::fs::write(&config_path, config(messages, hosts, false)?)?;
    let setup = tokio::process::Command::new(exe)
        .args(["setup", "--config"])
        .arg(&config_path)
        .current_dir(dir)
        .output()
        .await?;
    ensure!(
        setup.status.success(),
        "setup failed: {}",
        String::from_utf8_lossy(&setup.stderr)
    );
    let sink = sink::open(&dir.join("sink.db")).await?;

    // The producer: this process, in the root namespace, through the bridge.
    let mut registry = MessageRegistry::new();
    registry.register::<ChaosItem>();
    registry.register::<RunAgent>();
    let mut factories = TransportRegistry::new();
    factories.register(Arc::new(courier_sql::SqlTransportFactory));
    factories.register(Arc::new(courier_redis::RedisTransportFactory));
    let transports = Config::load(&config_path)?
        .connect(&factories, Arc::new(registry))
        .await?;
    let transport: Arc<dyn Transport> = transports.get("async").cloned().context("no async")?;
    let store: Arc<dyn RunStore> =
        Arc::new(SqlRunStore::connect(pg, SqlRunStoreOptions::default()).await?);
    let runtime = Runtime::builder(store.clone()).build();
    let _bus = runtime.register(transports.bus_builder()).build();
    let mut runs = Vec::new();
    for _ in 0..RUNS {
        let input = json!({ "steps": STEPS, "sleep_ms": STEP_MS });
        runs.push(runtime.enqueue("chaos", input).await?);
    }
    let items = |ids: std::ops::Range<u64>| {
        ids.map(|id| Envelope::new(ChaosItem { id }))
            .collect::<Vec<_>>()
    };
    transport.send_batch(items(0..HELD)).await?;

    // A takes everything: both runs under way, the items held behind them.
    let a = Worker::start(hosts, 0, exe, dir)?;
    let a_owner = until(
        "A runs both runs and holds every message",
        Duration::from_secs(30),
        || async {
            let mut owners = BTreeSet::new();
            for &id in &runs {
                let run = store.find(id).await?.context("run missing")?;
                if run.status != RunStatus::Running || store.events(id).await?.is_empty() {
                    return Ok(None);
                }
                owners.insert(run.claimed_by.unwrap_or_default());
            }
            let held = held(messages, hosts).await?;
            Ok((held == HELD + RUNS as u64 && owners.len() == 1)
                .then(|| owners.pop_first())
                .flatten())
        },
    )
    .await?;
    let b = Worker::start(hosts, 1, exe, dir)?;
    sleep(Duration::from_secs(1)).await; // B connects (a real process starting)

    hosts.cut(0)?;
    let cut = Instant::now();
    transport.send_batch(items(HELD..HELD + LATE)).await?;

    // B's reaper requeues the runs once A's leases expire; B completes them and takes A's items.
    let done = until(
        "B completed both runs and handled every message",
        Duration::from_secs(60),
        || async {
            for &id in &runs {
                if store.find(id).await?.map(|r| r.status) != Some(RunStatus::Completed) {
                    return Ok(None);
                }
            }
            let by_b: BTreeSet<u64> = handlings(&sink)
                .await?
                .into_iter()
                .filter(|(_, p)| *p == b.pid)
                .map(|(id, _)| id)
                .collect();
            Ok((by_b.len() == usize::try_from(HELD + LATE)?).then_some(()))
        },
    )
    .await;
    if let Err(e) = done {
        bail!(
            "{e:#}\n--- A ---\n{}\n--- B ---\n{}",
            a.log_text(),
            b.log_text()
        );
    }
    eprintln!(
        "partition: B finished A's work {:.1} s after the cut",
        cut.elapsed().as_secs_f64()
    );
    let mut settled = BTreeMap::new();
    for &id in &runs {
        let run = store.find(id).await?.context("run missing")?;
        ensure!(
            run.claimed_by.as_deref() != Some(a_owner.as_str()),
            "run {id} completed by A while cut off"
        );
        ensure!(
            run.requeue_count == 1,
            "run {id}: {} requeues, want 1 (the reaper's)",
            run.requeue_count
        );
        settled.insert(id, (run, store.events(id).await?));
    }

    // A stops both runs: its heartbeats, hung on the cut link, are given up after a lease (or,
    // had the link come back sooner, refused). The link comes back; a step A writes meanwhile
    // breaks the fence and fails at once.
    hosts.restore(0)?;
    let lost = until(
        "A reports both leases lost",
        Duration::from_secs(40),
        || async {
            for (id, (_, events)) in &settled {
                let now = store.events(*id).await?;
                ensure!(
                    now == *events,
                    "the fence failed: run {id} got steps after B completed it: {:?}",
                    &now[events.len().min(now.len())..]
                );
            }
            let text = a.log_text();
            let lost = runs
                .iter()
                .filter(|id| {
                    text.lines()
                        .any(|l| l.contains("lease lost") && l.contains(&id.to_string()))
                })
                .count();
            Ok((lost == RUNS).then_some(()))
        },
    )
    .await;
    if let Err(e) = lost {
        bail!("{e:#}\n--- A ---\n{}", a.log_text());
    }
    // A may now handle the items it still held (duplicates): wait until the sink is quiet.
    let quiet_by = Instant::now() + Duration::from_secs(30);
    let mut seen = handlings(&sink).await?.len();
    loop {
        sleep(Duration::from_secs(1)).await; // A is a real process finishing its batch
        let now = handlings(&sink).await?.len();
        if now == seen || Instant::now() > quiet_by {
            break;
        }
        seen = now;
    }
    // Remote control across hosts: `courier workers` on B lists both workers, and
    // `courier stop-workers` on B stops A too (through the worker registry in the shared store).
    let cli = |args: &'static [&'static str]| {
        let mut c = hosts.command(1, exe);
        c.args(args)
            .arg("--config")
            .arg(&config_path)
            .current_dir(dir)
            .env("RUST_LOG", "warn");
        c
    };
    until(
        "`workers` on B lists A and B",
        Duration::from_secs(20),
        || async {
            let out = timeout(
                Duration::from_secs(15),
                cli(&["workers", "--format", "json"]).output(),
            )
            .await
            .context("`workers` timed out")??;
            let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            let pids: BTreeSet<u64> = listed
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|w| w["pid"].as_u64())
                .collect();
            Ok((pids == BTreeSet::from([u64::from(a.pid), u64::from(b.pid)])).then_some(()))
        },
    )
    .await?;
    let stop = timeout(Duration::from_secs(15), cli(&["stop-workers"]).output())
        .await
        .context("`stop-workers` timed out")??;
    ensure!(
        stop.status.success(),
        "stop-workers failed: {}",
        String::from_utf8_lossy(&stop.stderr)
    );
    let a_log = a.log_text();
    let a_status = a.exited(Duration::from_secs(40)).await?;
    let b_status = b.exited(Duration::from_secs(40)).await?;
    ensure!(
        a_status.success() && b_status.success(),
        "exits after stop-workers: A {a_status}, B {b_status}\n{a_log}"
    );

    // The fence held: A settled nothing and wrote no step once B owned the runs.
    for (id, (run, events)) in &settled {
        let now = store.find(*id).await?.context("run missing")?;
        ensure!(
            now == *run,
            "run {id} changed after B settled it:\nthen {run:?}\nnow  {now:?}"
        );
        let after = store.events(*id).await?;
        ensure!(
            after == *events,
            "run {id}: events written after B settled it: {:?}",
            &after[events.len().min(after.len())..]
        );
        ensure!(
            events
                .iter()
                .any(|e| owner(e) != owner(&events[events.len() - 1])),
            "run {id}: no step of A's first execution"
        );
        check_events(&now, &after)?;
    }
    // Plain messages: every id handled; only the ones A held more than once.
    let mut counts: BTreeMap<u64, usize> = BTreeMap::new();
    for (id, _) in handlings(&sink).await? {
        *counts.entry(id).or_default() += 1;
    }
    let all: Vec<u64> = (0..HELD + LATE).collect();
    ensure!(
        counts.keys().copied().collect::<Vec<_>>() == all,
        "handled ids {counts:?}"
    );
    let twice: Vec<u64> = counts
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(id, _)| *id)
        .collect();
    ensure!(
        twice.iter().all(|id| *id < HELD),
        "ids sent after the cut handled twice: {twice:?}"
    );
    ensure!(
        counts.values().all(|n| *n <= 2),
        "an id handled more than twice: {counts:?}"
    );
    let left = transport
        .as_message_count()
        .context("no count")?
        .message_count()
        .await?;
    ensure!(left == 0, "{left} message(s) left in the queue");
    eprintln!("partition: A's duplicates after the link came back: {twice:?}");
    Ok(())
}

/// A cut-off host's concurrency slots come back within the lease: A holds both tenants' slots
/// (their slow first messages) when its link goes down, with the tenants' quick messages queued
/// behind them. B cannot take those while A's slots are live; once A's lease ends, B takes the
/// slow messages over (before A's handlers would have ended them) and then every quick one,
/// never two of a tenant at once; at the end nothing is queued or held.
async fn keyed_scenario(messages: ServerKind, hosts: &Hosts, dir: &Path) -> anyhow::Result<()> {
    let exe = Path::new(env!("CARGO_BIN_EXE_chaos-worker"));
    let config_path = dir.join("courier.toml");
    std::fs::write(&config_path, config(messages, hosts, true)?)?;
    let setup = tokio::process::Command::new(exe)
        .args(["setup", "--config"])
        .arg(&config_path)
        .current_dir(dir)
        .output()
        .await?;
    ensure!(
        setup.status.success(),
        "setup failed: {}",
        String::from_utf8_lossy(&setup.stderr)
    );
    let sink = sink::open(&dir.join("sink.db")).await?;
    let registry = Arc::new(MessageRegistry::new().with::<KeyedItem>());
    let factories = TransportRegistry::new()
        .with(Arc::new(courier_sql::SqlTransportFactory))
        .with(Arc::new(courier_redis::RedisTransportFactory));
    let transports = Config::load(&config_path)?
        .connect(&factories, registry)
        .await?;
    let bus = transports.bus_builder().build();
    let transport: Arc<dyn Transport> = transports.get("async").cloned().context("no async")?;
    // Each tenant's first message is the slow one: A takes both, one per tenant.
    let tenants = u64::try_from(TENANTS.len())?;
    for id in 0..tenants * PER_TENANT {
        let tenant = TENANTS[usize::try_from(id % tenants)?].to_owned();
        let work_ms = if id < tenants { SLOW_MS } else { QUICK_MS };
        bus.dispatch(KeyedItem {
            id,
            tenant,
            work_ms,
        })
        .await?;
    }
    let a = Worker::start(hosts, 0, exe, dir)?;
    until(
        "A holds both tenants' slow messages",
        Duration::from_secs(30),
        || async { Ok((keyed_held(messages, hosts).await?.0 == tenants).then_some(())) },
    )
    .await?;
    let b = Worker::start(hosts, 1, exe, dir)?;
    sleep(Duration::from_secs(2)).await; // B connects and polls: both tenants are full
    let early = keyed::handlings(&sink).await?;
    ensure!(
        early.is_empty(),
        "handled while A held every tenant's slot: {early:?}"
    );

    hosts.cut(0)?;
    let cut_us = keyed::now_us();
    let done = until(
        "B handled every message",
        Duration::from_secs(90),
        || async {
            let by_b: BTreeSet<i64> = keyed::handlings(&sink)
                .await?
                .into_iter()
                .filter(|h| h.pid == i64::from(b.pid))
                .map(|h| h.id)
                .collect();
            Ok((by_b.len() == usize::try_from(tenants * PER_TENANT)?).then_some(()))
        },
    )
    .await;
    if let Err(e) = done {
        bail!(
            "{e:#}\n--- A ---\n{}\n--- B ---\n{}",
            a.log_text(),
            b.log_text()
        );
    }
    let by_b: Vec<keyed::Handling> = keyed::handlings(&sink)
        .await?
        .into_iter()
        .filter(|h| h.pid == i64::from(b.pid))
        .collect();
    for tenant in TENANTS {
        let first = by_b
            .iter()
            .filter(|h| h.tenant == tenant)
            .map(|h| h.start_us)
            .min()
            .context("B handled none of a tenant")?;
        let after = Duration::from_micros(u64::try_from(first - cut_us)?);
        eprintln!("partition (keyed): B took {tenant}'s slot {after:?} after the cut");
        // Within the lease and B's next claims; A's own handler would hold it until SLOW_MS.
        ensure!(
            after < LEASE + Duration::from_secs(5),
            "{tenant}'s slot came back to B {after:?} after the cut, the lease is {LEASE:?}"
        );
    }
    let most = keyed::most_in_flight(&by_b);
    ensure!(
        most.values().all(|n| *n == 1),
        "B ran two of a tenant at once: {most:?}"
    );
    let mut counts: BTreeMap<i64, usize> = BTreeMap::new();
    for h in &by_b {
        *counts.entry(h.id).or_default() += 1;
    }
    ensure!(
        counts.values().all(|n| *n == 1),
        "B handled a message twice: {counts:?}"
    );
    // Every slot free: nothing queued, nothing held (A's deliveries were taken over).
    let count = transport.as_message_count().context("no count")?;
    until("the queue is empty", Duration::from_secs(20), || async {
        Ok((count.message_count().await? == 0).then_some(()))
    })
    .await?;
    let (held, busy) = keyed_held(messages, hosts).await?;
    ensure!(
        held == 0 && busy == 0,
        "after B handled all: {held} message(s) still held, {busy} key(s) with a slot in use"
    );
    drop(a);
    drop(b);
    Ok(())
}

/// Which scenario [`run`] plays.
#[derive(Clone, Copy)]
enum Scenario {
    RunsAndMessages,
    KeyedSlots,
}

fn run(messages: ServerKind, scenario_kind: Scenario, prefix: &str, net: &str) {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(why) = unavailable() {
        panic!(
            "the partition test makes network-namespace hosts and cannot here: {why}; run it as \
             root: cargo test -p courier-chaos --test partition -- --include-ignored"
        );
    }
    let servers = if messages == ServerKind::Redis {
        vec![ServerKind::Postgres, ServerKind::Redis]
    } else {
        vec![ServerKind::Postgres]
    };
    let hosts = Hosts::up(prefix, net, 2, &servers).unwrap_or_else(|e| panic!("{e:#}"));
    let dir = std::env::temp_dir().join(format!(
        "courier-partition-{prefix}-{:08x}",
        fastrand::u32(..)
    ));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let Ok(rt) = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    else {
        panic!("cannot start a tokio runtime");
    };
    let result = rt.block_on(async {
        let play = async {
            match scenario_kind {
                Scenario::RunsAndMessages => scenario(messages, &hosts, &dir).await,
                Scenario::KeyedSlots => keyed_scenario(messages, &hosts, &dir).await,
            }
        };
        timeout(Duration::from_secs(150), play)
            .await
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the scenario took over 150 s")))
    });
    drop(hosts);
    match result {
        Ok(()) => {
            let _ = std::fs::remove_dir_all(&dir);
        }
        Err(e) => panic!("{e:#}\n(worker logs kept in {})", dir.display()),
    }
}

#[test]
#[ignore = "needs root and ip netns: run as root"]
fn a_cut_off_host_loses_its_runs_and_messages_to_another_host_on_postgres() {
    run(
        ServerKind::Postgres,
        Scenario::RunsAndMessages,
        "cpp",
        "10.231.78",
    );
}

#[test]
#[ignore = "needs root and ip netns: run as root"]
fn a_cut_off_host_loses_its_runs_and_messages_to_another_host_on_redis() {
    run(
        ServerKind::Redis,
        Scenario::RunsAndMessages,
        "cpr",
        "10.231.79",
    );
}

#[test]
#[ignore = "needs root and ip netns: run as root"]
fn a_cut_off_host_loses_its_runs_and_messages_and_its_concurrency_slots_on_postgres() {
    run(
        ServerKind::Postgres,
        Scenario::KeyedSlots,
        "ckp",
        "10.231.80",
    );
}

#[test]
#[ignore = "needs root and ip netns: run as root"]
fn a_cut_off_host_loses_its_runs_and_messages_and_its_concurrency_slots_on_redis() {
    run(ServerKind::Redis, Scenario::KeyedSlots, "ckr", "10.231.81");
}
