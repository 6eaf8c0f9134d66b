//! `[schedules]` with real `consume` processes on PostgreSQL and Redis: a schedule firing every
//! second on 3 workers fires once per second in total (30 +-1 over 30 s), and a worker SIGKILLed
//! while holding the schedule's lease does not stop it (another takes the lease once it expires
//! and catches up the ticks it owes). On PostgreSQL each tick submits a `scripted` run (counted
//! with `runs list`, the run store a SQLite file of the test's own); on Redis each tick sends a
//! message (counted with `stats`). Either lands on a transport no worker consumes.

#![cfg(any(feature = "postgres", feature = "redis"))]

mod common;

use std::process::Child;
use std::time::{Duration, Instant};

#[cfg(feature = "redis")]
use common::RedisKeys;
use common::{Env, eventually, service_url, signal, unique};

/// What each tick does, and how the test counts the ticks.
#[derive(Clone, Copy)]
enum Action {
    /// Sends `test.tick` to `ticks`.
    Message,
    /// Submits a `scripted` run (its `RunAgent` message routed to `ticks`).
    Run,
}

/// Two transports (the consumed one, `async`, keeps the schedule store; `ticks` receives what a
/// tick sends) and a schedule every second that catches up.
fn config(consumed: &str, ticks: &str, action: Action) -> String {
    let (routing, what) = match action {
        Action::Message => (
            "\"test.tick\" = \"ticks\"",
            "message = \"test.tick\"\npayload = { n = 1 }",
        ),
        Action::Run => (
            "\"courier.run_agent\" = \"ticks\"",
            "agent = \"scripted\"\ninput = { steps = [] }",
        ),
    };
    let runs = match action {
        Action::Message => "",
        Action::Run => "[runs]\nstore = \"sqlite://runs.db\"\n\n",
    };
    format!(
        "[transports.async]\ndsn = \"{consumed}\"\n\n[transports.ticks]\ndsn = \"{ticks}\"\n\n\
         [routing]\n{routing}\n\n{runs}\
         [schedules.tick]\n{what}\nevery = \"1s\"\nmissed = \"catch_up\"\n"
    )
}

/// Kills what is left of the workers when the test ends.
struct Workers(Vec<(String, Child)>);

impl Drop for Workers {
    fn drop(&mut self) {
        for (_, child) in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn ticks(env: &Env, action: Action) -> u64 {
    match action {
        Action::Message => {
            let out = env
                .run(&["--config", "c.toml", "stats", "ticks", "--format", "json"])
                .json();
            out["ticks"]
                .as_u64()
                .unwrap_or_else(|| panic!("a count for `ticks`: {out}"))
        }
        Action::Run => {
            let out = env
                .run(&[
                    "--config", "c.toml", "runs", "list", "--limit", "1000", "--format", "json",
                ])
                .json();
            let runs = out
                .as_array()
                .unwrap_or_else(|| panic!("`runs list` prints an array: {out}"));
            assert!(
                runs.iter().all(|r| r["agent"] == "scripted"),
                "only scheduled runs: {out}"
            );
            runs.len() as u64
        }
    }
}

fn owner(env: &Env) -> Option<String> {
    let out = env
        .run(&["--config", "c.toml", "schedules", "--format", "json"])
        .json();
    assert_eq!(out[0]["name"], "tick", "{out}");
    assert!(out[0]["next_fire_ms"].as_i64().is_some(), "{out}");
    out[0]["owner"].as_str().map(str::to_owned)
}

fn three_workers_fire_each_tick_once_and_survive_a_killed_holder(
    config_text: &str,
    action: Action,
) {
    let env = Env::empty();
    env.write("c.toml", config_text);
    env.run(&["--config", "c.toml", "setup"]).ok();
    let mut workers = Workers(
        (0..3)
            .map(|i| {
                let id = format!("w{i}");
                let child = env.spawn(&[
                    "--quiet",
                    "--config",
                    "c.toml",
                    "consume",
                    "async",
                    "--sleep",
                    "50ms",
                    "--worker-id",
                    &id,
                ]);
                (id, child)
            })
            .collect(),
    );
    eventually("the first tick", || ticks(&env, action) >= 1);
    let start = Instant::now();
    let first = ticks(&env, action);
    let holder = owner(&env).unwrap_or_else(|| panic!("a lease holder once a tick fired"));
    std::thread::sleep(Duration::from_secs(5));
    let index = workers
        .0
        .iter()
        .position(|(id, _)| *id == holder)
        .unwrap_or_else(|| panic!("the holder `{holder}` is one of the workers"));
    signal(&workers.0[index].1, "KILL");
    let (_, mut killed) = workers.0.remove(index);
    let _ = killed.wait();
    eventually("another worker to take the lease", || {
        owner(&env).is_some_and(|o| o != holder)
    });
    let left = Duration::from_secs(30).saturating_sub(start.elapsed());
    std::thread::sleep(left);
    let fired = ticks(&env, action) - first;
    assert!(
        (29..=31).contains(&fired),
        "30 +-1 ticks in 30 s across 3 workers (one killed), got {fired}"
    );
}

#[cfg(feature = "postgres")]
#[test]
#[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
fn postgres_schedules_submit_one_run_per_tick_across_workers() {
    let dsn = service_url("COURIER_TEST_POSTGRES_URL");
    let name = unique("cli_sched");
    let tables = courier_test::Cleanup::new();
    tables.sql_tables(&dsn, &name);
    let table = format!("{name}_messages");
    let sep = if dsn.contains('?') { '&' } else { '?' };
    let base = format!("{dsn}{sep}table_name={table}");
    three_workers_fire_each_tick_once_and_survive_a_killed_holder(
        &config(
            &format!("{base}&queue_name=async"),
            &format!("{base}&queue_name=ticks"),
            Action::Run,
        ),
        Action::Run,
    );
}

#[cfg(feature = "redis")]
#[test]
#[ignore = "needs redis: set COURIER_TEST_REDIS_URL"]
fn redis_schedules_send_one_message_per_tick_across_workers() {
    let dsn = service_url("COURIER_TEST_REDIS_URL");
    let name = unique("courier_cli_sched");
    let _keys = RedisKeys {
        url: dsn.clone(),
        keys: vec![
            name.clone(),
            format!("{name}:delayed"),
            format!("{name}:delayed:data"),
            format!("{name}_ticks"),
            format!("{name}_ticks:delayed"),
            format!("{name}_ticks:delayed:data"),
            format!("{name}:workers"),
            format!("{name}:workers:stop"),
            format!("{name}:schedule:tick"),
        ],
    };
    // Each tick's deduplication key (`<stream>:dedup:schedule:tick:<ms>:ticks`).
    let _dedup = DedupKeys {
        url: dsn.clone(),
        pattern: format!("{name}_ticks:dedup:*"),
    };
    let sep = if dsn.contains('?') { '&' } else { '?' };
    three_workers_fire_each_tick_once_and_survive_a_killed_holder(
        &config(
            &format!("{dsn}{sep}stream={name}&group={name}"),
            &format!("{dsn}{sep}stream={name}_ticks&group={name}"),
            Action::Message,
        ),
        Action::Message,
    );
}

/// Deletes the Redis keys matching `pattern` (a test's own) when dropped (best effort, bounded).
#[cfg(feature = "redis")]
struct DedupKeys {
    url: String,
    pattern: String,
}

#[cfg(feature = "redis")]
impl Drop for DedupKeys {
    fn drop(&mut self) {
        let keys = RedisKeys {
            url: self.url.clone(),
            keys: common::block_on(async {
                let Ok(client) = redis::Client::open(self.url.as_str()) else {
                    return Vec::new();
                };
                let scan = async {
                    let mut conn = client.get_multiplexed_async_connection().await?;
                    let mut found: Vec<String> = Vec::new();
                    let mut cursor = 0_u64;
                    loop {
                        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                            .arg(cursor)
                            .arg("MATCH")
                            .arg(&self.pattern)
                            .arg("COUNT")
                            .arg(1000)
                            .query_async(&mut conn)
                            .await?;
                        found.extend(batch);
                        if next == 0 {
                            return Ok::<_, redis::RedisError>(found);
                        }
                        cursor = next;
                    }
                };
                tokio::time::timeout(Duration::from_secs(10), scan)
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .unwrap_or_default()
            }),
        };
        drop(keys);
    }
}
