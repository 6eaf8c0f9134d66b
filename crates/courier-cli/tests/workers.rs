//! `courier workers` and `courier stop-workers` through the worker registry, with real `consume`
//! processes: workers started from different directories with different configuration files on
//! one database are listed together and stopped together (no stop file involved), and a worker
//! killed with SIGKILL drops out of the list once its heartbeat is stale.

mod common;

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

#[cfg(feature = "redis")]
use common::RedisKeys;
use common::{Children, Env, eventually, signal, wait};

/// A configuration with one transport on `dsn` (no runs, so nothing else is opened).
fn config(dsn: &str) -> String {
    format!("[transports.async]\ndsn = \"{dsn}\"\n")
}

/// `courier workers --format json` run in `env` with `--config config`.
fn workers(env: &Env, config: &str) -> Vec<serde_json::Value> {
    env.run(&["--config", config, "workers", "--format", "json"])
        .json()
        .as_array()
        .cloned()
        .unwrap_or_else(|| panic!("`workers --format json` prints an array"))
}

fn ids(list: &[serde_json::Value]) -> Vec<String> {
    let mut ids: Vec<String> = list
        .iter()
        .map(|w| w["id"].as_str().unwrap_or_default().to_owned())
        .collect();
    ids.sort();
    ids
}

/// Starts `consume` in `env` with `--config config` as worker `id`.
fn consume(env: &Env, config: &str, id: &str) -> Child {
    env.spawn(&[
        "--config",
        config,
        "consume",
        "async",
        "--sleep",
        "20ms",
        "--worker-id",
        id,
    ])
}

/// Two workers in one directory and a third one elsewhere (another working directory, another
/// configuration file, the same store) are listed, then all stopped by `stop-workers` from the
/// first directory; each exits 0 and leaves the list.
fn workers_of_one_store_are_listed_and_stopped_from_anywhere(config_text: &str) {
    let first = Env::empty();
    let elsewhere = Env::empty();
    first.write("a.toml", config_text);
    std::fs::create_dir(elsewhere.path("conf")).unwrap_or_else(|e| panic!("mkdir: {e}"));
    elsewhere.write("conf/b.toml", config_text);
    first.run(&["--config", "a.toml", "setup"]).ok();

    let mut running = Children(vec![
        consume(&first, "a.toml", "one"),
        consume(&first, "a.toml", "two"),
    ]);
    let mut listed = Vec::new();
    eventually("both workers to be listed", || {
        listed = workers(&first, "a.toml");
        listed.len() == 2
    });
    assert_eq!(ids(&listed), ["one", "two"]);
    let pids: Vec<u64> = running.0.iter().map(|c| u64::from(c.id())).collect();
    for w in &listed {
        assert!(
            w["pid"].as_u64().is_some_and(|p| pids.contains(&p)),
            "the pid of a running worker: {w}"
        );
        assert_eq!(w["transports"], serde_json::json!(["async"]), "{w}");
        assert!(
            w["started_at"].as_str().is_some_and(|t| t.ends_with('Z')),
            "{w}"
        );
        assert!(
            w["last_heartbeat_ms"].as_i64().is_some_and(|t| t > 0),
            "{w}"
        );
        assert_eq!(w["stop_requested"], false, "{w}");
    }
    let table = first
        .run(&["--config", "a.toml", "workers"])
        .ok()
        .to_owned();
    assert!(
        table.contains("HEARTBEAT") && table.contains("one") && table.contains("two"),
        "{table}"
    );

    running.0.push(consume(&elsewhere, "conf/b.toml", "three"));
    eventually("the third worker to be listed", || {
        ids(&workers(&first, "a.toml")) == ["one", "three", "two"]
    });

    let started = Instant::now();
    let asked = first
        .run(&["--config", "a.toml", "stop-workers", "--format", "json"])
        .json();
    assert_eq!(asked, serde_json::json!({ "requested": 3 }));
    for child in running.0.drain(..) {
        let out = wait(child, Duration::from_secs(20));
        out.ok();
        assert!(out.stderr.contains("shutdown requested"), "{}", out.stderr);
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "stopped within a few heartbeats: {:?}",
        started.elapsed()
    );
    assert!(
        workers(&first, "a.toml").is_empty(),
        "each unregistered on its way out"
    );
    for stop_file in [
        first.path("a.toml.stop-workers"),
        elsewhere.path("conf/b.toml.stop-workers"),
    ] {
        assert!(!stop_file.exists(), "no stop file: {}", stop_file.display());
    }
}

fn sqlite_dsn(dir: &Path, extra: &str) -> String {
    format!("sqlite://{}{extra}", dir.join("shared.db").display())
}

#[test]
fn sqlite_workers_are_listed_and_stopped_across_directories_and_config_files() {
    let store = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
    workers_of_one_store_are_listed_and_stopped_from_anywhere(&config(&sqlite_dsn(
        store.path(),
        "",
    )));
}

#[test]
fn a_killed_worker_drops_out_of_the_list_once_stale() {
    let store = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
    let env = Env::empty();
    env.write(
        "a.toml",
        &config(&sqlite_dsn(store.path(), "?worker_stale_after=2s")),
    );
    env.run(&["--config", "a.toml", "setup"]).ok();
    let mut running = Children(vec![consume(&env, "a.toml", "doomed")]);
    eventually("the worker to be listed", || {
        ids(&workers(&env, "a.toml")) == ["doomed"]
    });
    signal(&running.0[0], "KILL");
    let killed = Instant::now();
    let _ = running.0[0].wait();
    running.0.clear();
    assert_eq!(
        ids(&workers(&env, "a.toml")),
        ["doomed"],
        "still listed right after the kill: it did not unregister"
    );
    eventually("the killed worker to go stale", || {
        workers(&env, "a.toml").is_empty()
    });
    assert!(
        killed.elapsed() >= Duration::from_secs(1),
        "gone by staleness (2 s), not at once: {:?}",
        killed.elapsed()
    );
}

#[test]
fn without_a_shared_store_stop_workers_falls_back_to_the_stop_file() {
    let env = Env::empty();
    env.write("mem.toml", &config("in-memory://"));
    let out = env
        .run(&["--config", "mem.toml", "stop-workers", "--format", "json"])
        .json();
    assert!(out["stop_file"].is_string(), "{out}");
    assert!(env.path("mem.toml.stop-workers").is_file());
    assert!(workers(&env, "mem.toml").is_empty());

    // A worker of that configuration watches the file (from once it is up: ask until it stops).
    let mut child = env.spawn(&["--config", "mem.toml", "consume", "--sleep", "20ms"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().ok().flatten().is_none() {
        assert!(
            Instant::now() < deadline,
            "the worker never saw the stop file"
        );
        env.run(&["--config", "mem.toml", "stop-workers"]).ok();
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = wait(child, Duration::from_secs(5));
    out.ok();
    assert!(out.stderr.contains("shutdown requested"), "{}", out.stderr);
}

#[cfg(feature = "redis")]
#[test]
#[ignore = "needs redis: set COURIER_TEST_REDIS_URL"]
fn redis_workers_are_listed_and_stopped_across_directories_and_config_files() {
    let url = std::env::var("COURIER_TEST_REDIS_URL").unwrap_or_else(|_| {
        panic!(
            "set COURIER_TEST_REDIS_URL (scripts/services prints it), e.g. redis://127.0.0.1:6379"
        )
    });
    let name = format!(
        "courier_cli_workers_{}_{:08x}",
        std::process::id(),
        fastrand::u32(..)
    );
    let _keys = RedisKeys {
        url: url.clone(),
        keys: vec![
            name.clone(),
            format!("{name}:delayed"),
            format!("{name}:delayed:data"),
            format!("{name}:workers"),
            format!("{name}:workers:stop"),
        ],
    };
    let sep = if url.contains('?') { '&' } else { '?' };
    workers_of_one_store_are_listed_and_stopped_from_anywhere(&config(&format!(
        "{url}{sep}stream={name}&group={name}"
    )));
}

/// RabbitMQ keeps no registry: the workers register in the run store's database (SQLite here).
#[cfg(feature = "amqp")]
#[test]
#[ignore = "needs rabbitmq: set COURIER_TEST_AMQP_URL"]
fn amqp_workers_register_in_the_sql_run_store() {
    let url = std::env::var("COURIER_TEST_AMQP_URL").unwrap_or_else(|_| {
        panic!("set COURIER_TEST_AMQP_URL (scripts/services prints it), e.g. amqp://guest:guest@127.0.0.1:5672/%2f")
    });
    let store = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
    let sep = if url.contains('?') { '&' } else { '?' };
    // An exchange and queue of its own (a fixed name was left on the server), deleted with the
    // delay exchange when the test ends, pass or fail.
    let name = common::unique("courier_cli_workers");
    let dsn = format!("{url}{sep}exchange={name}&queues={name}");
    let topology = courier_test::Cleanup::new();
    topology.defer(format!("the AMQP exchange and queue {name}"), {
        let dsn = dsn.clone();
        async move {
            let dsn = courier_core::Dsn::parse(&dsn).map_err(|e| e.to_string())?;
            let registry = std::sync::Arc::new(courier_core::MessageRegistry::new());
            let t = courier_amqp::AmqpTransport::connect("cleanup", &dsn, registry)
                .await
                .map_err(|e| e.to_string())?;
            let deleted = t.delete_topology().await.map_err(|e| e.to_string());
            t.close().await;
            deleted
        }
    });
    let text = format!(
        "{}\n[runs]\nstore = \"{}\"\n",
        config(&dsn),
        sqlite_dsn(store.path(), "")
    );
    workers_of_one_store_are_listed_and_stopped_from_anywhere(&text);
}
