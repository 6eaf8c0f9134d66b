//! Flow control per key across real crashes (issue 41), on Redis and PostgreSQL: 1,000
//! `chaos.keyed` messages over 20 tenants (queued tenant after tenant), keyed by
//! `[limits.concurrency."chaos.keyed"] key = "$.tenant", max = 3` in `courier.toml`, consumed by
//! two `chaos-worker consume --concurrency 3` processes (6 workers), one of them SIGKILLed every
//! 2 s and restarted. Sampled in the handler (each handling's start and end by the wall clock, in
//! the sink), never more than 3 of a tenant overlap; every message is handled, more than once
//! only when a killed process had handled it (its ack lost); at the end the queue is empty and
//! every slot free. The same run without the limit (which does go over 3: the check can fail)
//! gives the throughput the limited run is reported against.
//!
//! Run with `cargo test -p courier-chaos --test keyed_crash -- --include-ignored` (the services
//! of `scripts/services`); the tests run one at a time.

#![allow(clippy::unwrap_used, clippy::too_many_lines, reason = "tests")]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use courier_chaos::keyed::{self, KeyedItem};
use courier_chaos::sink;
use courier_core::config::Config;
use courier_core::{MessageRegistry, TransportRegistry};
use courier_test::Cleanup;
use courier_test::env::{postgres_url, redis_url, unique_name};
use tokio::process::{Child, Command};

const WORKER: &str = env!("CARGO_BIN_EXE_chaos-worker");
const MESSAGES: u64 = 1_000;
const KEYS: u64 = 20;
const MAX: usize = 3;
const WORK_MS: u64 = 50;
/// The queue's lease: a killed process's messages (and slots) come back after it.
const LEASE: &str = "2s";

/// The tests run one at a time: each kills and times processes on two cores.
static SERIAL: Mutex<()> = Mutex::new(());

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Redis,
    Postgres,
}

/// What one run measured.
struct Outcome {
    elapsed: Duration,
    kills: usize,
    most: BTreeMap<String, usize>,
    handled_again: usize,
}

/// The queue's DSN, its keys or tables registered with `cleanup`.
fn queue_dsn(target: Target, cleanup: &Cleanup) -> String {
    match target {
        Target::Redis => {
            let url = redis_url();
            let stream = unique_name("chaos_keyed");
            cleanup.redis_keys(&url, &stream);
            // A group of its own too: the worker registry is `<group>:workers`, and the
            // SIGKILLed workers' entries must go with the test's keys.
            format!("{url}?stream={stream}&group={stream}")
        }
        Target::Postgres => {
            let url = postgres_url();
            let prefix = unique_name("chaos_keyed");
            cleanup.sql_tables(&url, &prefix);
            let sep = if url.contains('?') { '&' } else { '?' };
            format!("{url}{sep}table_name={prefix}_queue&poll_window=1s")
        }
    }
}

fn spawn(dir: &Path, n: usize) -> Child {
    let log = dir.join(format!("worker-{n}.log"));
    Command::new(WORKER)
        .args([
            "consume",
            "async",
            "--concurrency",
            "3",
            "--fetch-size",
            "3",
            "--keepalive",
            "300ms",
        ])
        .arg("--config")
        .arg(dir.join("courier.toml"))
        .env(sink::SINK_ENV, dir.join("sink.db"))
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

async fn run(target: Target, limited: bool) -> Outcome {
    let cleanup = Cleanup::new();
    let dir = tempfile::tempdir().unwrap();
    let dsn = queue_dsn(target, &cleanup);
    let limit = if limited {
        format!("[limits.concurrency.\"chaos.keyed\"]\nkey = \"$.tenant\"\nmax = {MAX}\n")
    } else {
        String::new()
    };
    let text = format!(
        "[transports.async]\ndsn = \"{dsn}\"\noptions = {{ redeliver_timeout = \"{LEASE}\" }}\n\
         [routing]\n\"chaos.keyed\" = \"async\"\n{limit}"
    );
    std::fs::write(dir.path().join("courier.toml"), &text).unwrap();
    let config: Config = text.parse().unwrap();
    let factories = TransportRegistry::new()
        .with(Arc::new(courier_redis::RedisTransportFactory))
        .with(Arc::new(courier_sql::SqlTransportFactory));
    let registry = Arc::new(MessageRegistry::new().with::<KeyedItem>());
    let transports = config.connect(&factories, registry).await.unwrap();
    let bus = transports.bus_builder().build();
    let queue = transports.get("async").unwrap().clone();
    if let Some(setup) = queue.as_setup() {
        setup.setup().await.unwrap();
    }
    let sink_pool = sink::open(&dir.path().join("sink.db")).await.unwrap();
    // Tenant after tenant: without a limit, every worker takes the same tenant's messages.
    for id in 0..MESSAGES {
        let tenant = format!("tenant-{:02}", id / (MESSAGES / KEYS));
        bus.dispatch(KeyedItem {
            id,
            tenant,
            work_ms: WORK_MS,
        })
        .await
        .unwrap();
    }
    let started = Instant::now();
    let mut spawned = 0;
    let mut slots: Vec<Child> = (0..2)
        .map(|_| {
            spawned += 1;
            spawn(dir.path(), spawned)
        })
        .collect();
    let mut killed: BTreeSet<i64> = BTreeSet::new();
    let mut next_kill = Instant::now() + Duration::from_secs(2);
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let (done,): (i64,) = sqlx::query_as("SELECT COUNT(DISTINCT id) FROM chaos_keyed")
            .fetch_one(&sink_pool)
            .await
            .unwrap();
        if u64::try_from(done).unwrap() >= MESSAGES {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{target:?}: {done} of {MESSAGES} handled; logs kept in {}",
            dir.keep().display()
        );
        if Instant::now() >= next_kill {
            let slot = fastrand::usize(..slots.len());
            if let Some(pid) = slots[slot].id() {
                killed.insert(i64::from(pid));
            }
            slots[slot].kill().await.unwrap(); // SIGKILL
            spawned += 1;
            slots[slot] = spawn(dir.path(), spawned);
            next_kill += Duration::from_secs(2);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let elapsed = started.elapsed();
    // Every message settled: a killed process's last ones come back within the lease.
    let count = queue.as_message_count().unwrap();
    let settle_by = Instant::now() + Duration::from_secs(30);
    while count.message_count().await.unwrap() > 0 {
        assert!(
            Instant::now() < settle_by,
            "{target:?}: messages left unsettled"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for mut child in slots {
        child.kill().await.unwrap();
    }
    if target == Target::Redis && limited {
        let stream = dsn
            .split("stream=")
            .nth(1)
            .unwrap()
            .split('&')
            .next()
            .unwrap();
        let client = redis::Client::open(redis_url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let busy: BTreeMap<String, i64> = redis::cmd("HGETALL")
            .arg(format!("{stream}:keyed:busy"))
            .query_async(&mut conn)
            .await
            .unwrap();
        // The deliveries' leases, not the member at +inf that keeps the set a skiplist.
        let leases: u64 = redis::cmd("ZCOUNT")
            .arg(format!("{stream}:keyed:leases"))
            .arg("-inf")
            .arg("(+inf")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(
            busy.is_empty() && leases == 0,
            "slots left: {busy:?}, {leases} leases"
        );
    }
    let handlings = keyed::handlings(&sink_pool).await.unwrap();
    let mut by_id: BTreeMap<i64, Vec<&keyed::Handling>> = BTreeMap::new();
    for h in &handlings {
        by_id.entry(h.id).or_default().push(h);
    }
    assert_eq!(
        by_id.len() as u64,
        MESSAGES,
        "{target:?}: every message handled"
    );
    // A message handled again: every handling but its last was by a process killed later (the
    // kill lost its ack).
    let unexplained: Vec<_> = by_id
        .iter()
        .filter(|(_, hs)| hs[..hs.len() - 1].iter().any(|h| !killed.contains(&h.pid)))
        .map(|(id, _)| *id)
        .collect();
    assert!(
        unexplained.is_empty(),
        "{target:?}: handled again without a kill: {unexplained:?}"
    );
    drop(transports);
    let errors = cleanup.run().await;
    assert!(errors.is_empty(), "cleanup: {errors:?}");
    Outcome {
        elapsed,
        kills: killed.len(),
        most: keyed::most_in_flight(&handlings),
        handled_again: by_id.values().filter(|hs| hs.len() > 1).count(),
    }
}

fn kill_loop(target: Target) {
    block_on(async {
        let limited = run(target, true).await;
        let over: Vec<_> = limited.most.iter().filter(|(_, n)| **n > MAX).collect();
        assert!(
            over.is_empty(),
            "{target:?}: more than {MAX} in flight: {over:?}"
        );
        let unlimited = run(target, false).await;
        assert!(
            unlimited.most.values().any(|n| *n > MAX),
            "{target:?}: without the limit some tenant goes over {MAX} (the check can fail): {:?}",
            unlimited.most
        );
        let rate = |o: &Outcome| MESSAGES as f64 / o.elapsed.as_secs_f64();
        println!(
            "{target:?} keyed kill loop: {MESSAGES} messages over {KEYS} tenants, 2 processes x 3 \
             workers, one SIGKILLed every 2 s: max {MAX} per tenant {:.0} msg/s ({} kills, {} \
             handled again, most in flight per tenant {}) vs unlimited {:.0} msg/s ({} kills, most \
             {})",
            rate(&limited),
            limited.kills,
            limited.handled_again,
            limited.most.values().max().unwrap_or(&0),
            rate(&unlimited),
            unlimited.kills,
            unlimited.most.values().max().unwrap_or(&0),
        );
    });
}

#[test]
#[ignore = "needs redis: set COURIER_TEST_REDIS_URL"]
fn keyed_kill_loop_redis() {
    kill_loop(Target::Redis);
}

#[test]
#[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
fn keyed_kill_loop_postgres() {
    kill_loop(Target::Postgres);
}
