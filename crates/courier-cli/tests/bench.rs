//! `courier bench`: the output of each mode (throughput with the raw driver, `--runs`,
//! `--latency`) on SQLite, and on the real servers (run with `--include-ignored`). Small numbers,
//! shapes and counts only: never a wall-clock threshold.

mod common;

use common::{Env, service_url};
use serde_json::Value;

/// A service database's URL with a message table of its own (`table_name`), dropped with its
/// side tables (`<table>_workers`, `_paused`, ...) when `cleanup` goes. Without it the bench
/// creates the default `courier_messages` and its side tables, which stay (a fresh server
/// then fails the leftovers check).
#[cfg_attr(
    not(any(feature = "postgres", feature = "mysql")),
    allow(dead_code, reason = "used by the service tests")
)]
fn own_table(var: &str, cleanup: &courier_test::Cleanup) -> String {
    let url = service_url(var);
    let table = if var == "COURIER_TEST_MYSQL_URL" {
        cleanup.mysql_table("bench_cli")
    } else {
        cleanup.postgres_table("bench_cli")
    };
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}table_name={table}")
}

fn positive(v: &Value) -> bool {
    v.as_f64().is_some_and(|x| x > 0.0 && x.is_finite())
}

#[cfg_attr(
    not(any(feature = "postgres", feature = "redis", feature = "amqp")),
    allow(dead_code, reason = "used by the service tests")
)]
/// `bench --raw` as JSON: both sides measured, both ratios given.
fn throughput_beside_raw(dsn: Option<&str>) -> Value {
    let env = Env::empty();
    let mut args = vec![
        "bench",
        "--raw",
        "--messages",
        "200",
        "--fetch-size",
        "16",
        "--size",
        "64",
        "--rounds",
        "2",
        "--format",
        "json",
    ];
    if let Some(dsn) = dsn {
        args.extend(["--dsn", dsn]);
    }
    let out = env.run(&args).json();
    assert_eq!(out["mode"], "throughput", "{out}");
    assert_eq!(out["messages"], 200, "{out}");
    assert_eq!(out["rounds"], 2, "{out}");
    for key in ["produce_per_s", "consume_per_s", "p50_ms", "p99_ms"] {
        assert!(positive(&out[key]), "{key}: {out}");
        assert!(positive(&out["raw"][key]), "raw {key}: {out}");
    }
    assert!(
        positive(&out["ratio"]) && positive(&out["produce_ratio"]),
        "{out}"
    );
    let rounds = out["round_ratios"].as_array().expect("round_ratios");
    assert_eq!(rounds.len(), 2, "one paired ratio per round: {out}");
    assert!(rounds.iter().all(positive), "{out}");
    out
}

#[cfg(feature = "sqlite")]
#[test]
fn bench_raw_reports_produce_and_consume_ratios_on_sqlite() {
    throughput_beside_raw(None);
}

/// The rows of `table` in the SQLite file `db`.
#[cfg(feature = "sqlite")]
fn sqlite_rows(db: &std::path::Path, table: &str) -> i64 {
    tokio::runtime::Runtime::new()
        .expect("runtime")
        .block_on(async {
            let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", db.display())).await?;
            sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {table}"))
                .fetch_one(&pool)
                .await
        })
        .unwrap_or_else(|e| panic!("counting the rows of {table}: {e}"))
}

/// On Symfony's Doctrine table the raw side runs the same statements on the same layout (PHP's
/// indexes on both sides), and leaves no row of its own behind.
#[cfg(all(feature = "sqlite", feature = "symfony"))]
#[test]
fn bench_raw_on_symfonys_table_measures_sqlx_on_the_same_layout() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("messenger.db");
    let out = throughput_beside_raw(Some(&format!("symfony+sqlite://{}", db.display())));
    assert_eq!(
        out["dsn"].as_str().map(|d| d.starts_with("symfony+sqlite")),
        Some(true),
        "{out}"
    );
    assert_eq!(
        sqlite_rows(&db, "messenger_messages"),
        0,
        "rows left in Symfony's table"
    );
}

/// On Symfony's Redis layout the raw side is redis-rs writing and reading Symfony's `message`
/// field on a stream of its own (deleted at the end; the leftovers check of `scripts/test` sees
/// a key left behind).
#[cfg(all(feature = "redis", feature = "symfony"))]
#[test]
#[ignore = "needs redis: set COURIER_TEST_REDIS_URL"]
fn bench_raw_on_symfonys_redis_stream_measures_redis_rs_on_the_same_layout() {
    let cleanup = courier_test::Cleanup::new();
    let stream = cleanup.redis_name("bench_symfony");
    let url = service_url("COURIER_TEST_REDIS_URL");
    let out = throughput_beside_raw(Some(&format!(
        "symfony+{}/{stream}/g/c",
        url.trim_end_matches('/')
    )));
    assert_eq!(
        out["dsn"].as_str().map(|d| d.starts_with("symfony+redis")),
        Some(true),
        "{out}"
    );
}

/// `bench --concurrency-keys` measures the keyed queue beside the same queue without keys, in
/// paired rounds: both sides' figures, the ratio keyed / unkeyed, one ratio per round, no raw
/// side. The keyed queue's messages were all handled (the bench fails otherwise) and leave no
/// row behind.
#[cfg(feature = "sqlite")]
#[test]
fn bench_with_concurrency_keys_measures_the_queue_without_keys_beside_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("keyed.db");
    let dsn = format!("sqlite://{}?concurrency_max=2", db.display());
    let env = Env::empty();
    let out = env
        .run(&[
            "bench",
            "--dsn",
            &dsn,
            "--concurrency-keys",
            "5",
            "--messages",
            "100",
            "--fetch-size",
            "16",
            "--rounds",
            "2",
            "--format",
            "json",
        ])
        .json();
    assert_eq!(out["mode"], "throughput", "{out}");
    assert_eq!(out["concurrency_keys"], 5, "{out}");
    assert_eq!(out["rounds"], 2, "{out}");
    assert!(out["raw"].is_null(), "no raw side: {out}");
    for key in ["produce_per_s", "consume_per_s", "p50_ms", "p99_ms"] {
        assert!(positive(&out[key]), "{key}: {out}");
        assert!(positive(&out["unkeyed"][key]), "unkeyed {key}: {out}");
    }
    let ratio = out["ratio"].as_f64().expect("a ratio");
    let expected = out["consume_per_s"].as_f64().unwrap_or_default()
        / out["unkeyed"]["consume_per_s"].as_f64().unwrap_or(f64::NAN);
    assert!((ratio - expected).abs() < 1e-9, "keyed / unkeyed: {out}");
    let rounds = out["round_ratios"].as_array().expect("round_ratios");
    assert_eq!(rounds.len(), 2, "one paired ratio per round: {out}");
    assert_eq!(
        sqlite_rows(&db, "courier_messages"),
        0,
        "rows left behind: {out}"
    );
}

/// `bench --beside` measures a second DSN beside the first in paired rounds: both sides'
/// figures, the ratios of the medians (produce and consume), one ratio of each per round, no raw
/// side; each side's messages were all handled and none is left in either file.
#[cfg(all(feature = "sqlite", feature = "symfony"))]
#[test]
fn bench_beside_measures_a_second_dsn_in_paired_rounds() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (symfony, own) = (dir.path().join("sf.db"), dir.path().join("own.db"));
    let beside = format!("sqlite://{}", own.display());
    let out = Env::empty()
        .run(&[
            "bench",
            "--dsn",
            &format!("symfony+sqlite://{}", symfony.display()),
            "--beside",
            &beside,
            "--messages",
            "100",
            "--fetch-size",
            "16",
            "--rounds",
            "2",
            "--format",
            "json",
        ])
        .json();
    assert_eq!(out["beside_dsn"].as_str(), Some(beside.as_str()), "{out}");
    assert!(out["raw"].is_null() && out["unkeyed"].is_null(), "{out}");
    for key in ["produce_per_s", "consume_per_s", "p50_ms", "p99_ms"] {
        assert!(positive(&out[key]), "{key}: {out}");
        assert!(positive(&out["beside"][key]), "beside {key}: {out}");
    }
    for (ratio, figure) in [
        ("ratio", "consume_per_s"),
        ("produce_ratio", "produce_per_s"),
    ] {
        let expected = out[figure].as_f64().unwrap_or_default()
            / out["beside"][figure].as_f64().unwrap_or(f64::NAN);
        let got = out[ratio].as_f64().expect("a ratio");
        assert!((got - expected).abs() < 1e-9, "{ratio}: {out}");
    }
    for rounds in ["round_ratios", "produce_round_ratios"] {
        let ratios = out[rounds].as_array().expect(rounds);
        assert_eq!(ratios.len(), 2, "one paired ratio per round: {out}");
        assert!(ratios.iter().all(positive), "{rounds}: {out}");
    }
    assert_eq!(sqlite_rows(&symfony, "messenger_messages"), 0, "{out}");
    assert_eq!(sqlite_rows(&own, "courier_messages"), 0, "{out}");
}

fn calls_total_of(calls: &Value) -> f64 {
    calls
        .as_object()
        .map(|m| m.values().filter_map(Value::as_f64).sum())
        .unwrap_or(0.0)
}

/// `bench --runs` as JSON: every run executed once, its statements counted.
fn runs_are_counted(dsn: Option<&str>) -> Value {
    let env = Env::empty();
    let mut args = vec![
        "bench",
        "--runs",
        "--messages",
        "12",
        "--workers",
        "2",
        "--format",
        "json",
    ];
    if let Some(dsn) = dsn {
        args.extend(["--dsn", dsn]);
    }
    let out = env.run(&args).json();
    assert_eq!(out["mode"], "runs", "{out}");
    assert_eq!(out["runs"], 12, "{out}");
    assert_eq!(out["workers"], 2, "{out}");
    assert_eq!(out["steps_per_run"], 3, "{out}");
    assert!(
        positive(&out["runs_per_s"]) && positive(&out["submit_per_s"]),
        "{out}"
    );
    let calls = &out["store_calls_per_run"];
    // Each run is inserted, claimed and settled exactly once, and journals its 3 durable
    // steps, each in the write that renews its lease (no separate renewal, no event).
    assert_eq!(calls["insert_queued"], 1.0, "{out}");
    assert_eq!(calls["claim"], 1.0, "{out}");
    assert_eq!(calls["settle"], 1.0, "{out}");
    assert_eq!(calls["journal"], 3.0, "{out}");
    assert!(
        calls["renew"].is_null() && calls["append_event"].is_null(),
        "{out}"
    );
    // A fresh run's claim says it has no journaled step: its first step reads no journal.
    assert!(calls["steps"].is_null(), "{out}");
    let submit = out["store_statements"]["submit"].as_f64().unwrap_or(0.0);
    let execute = out["store_statements"]["execute"].as_f64().unwrap_or(0.0);
    assert!(submit > 0.0 && execute > 0.0, "{out}");
    let total = out["store_statements_per_run"].as_f64().unwrap_or(0.0);
    assert!((total - submit - execute).abs() < 1e-9, "{out}");
    // Statements are at least the calls (a call is one statement or more).
    let calls_total = calls_total_of(calls);
    assert!(total >= calls_total && calls_total > 0.0, "{out}");
    // At most 6 statements per 3-step run on SQLite and PostgreSQL: the submit, the claim, one
    // per step (the step's row; its lease is fresh), the settle. MariaDB reads back what it
    // inserted and claimed (no `RETURNING` on its `UPDATE`): 8.
    let most = if dsn.is_some_and(|d| d.starts_with("mysql")) {
        8.0
    } else {
        6.0
    };
    assert!(total <= most, "{total} statements per run: {out}");
    // Round trips: at least one per call, at most one per statement.
    let trips = out["store_round_trips_per_run"].as_f64().unwrap_or(0.0);
    assert!(trips >= calls_total && trips <= total, "{out}");
    // The hot writes (claim, 3 steps, settle) ride shared statements on SQLite (its combiner's
    // transactions) and PostgreSQL (one statement per batch, never more than one per write);
    // MariaDB sends them one by one (none counted).
    let shared = &out["shared_writes_per_run"];
    let (writes, sent) = (
        shared["writes"].as_f64().unwrap_or(-1.0),
        shared["statements"].as_f64().unwrap_or(-1.0),
    );
    if dsn.is_some_and(|d| d.starts_with("mysql")) {
        assert_eq!((writes, sent), (0.0, 0.0), "{out}");
    } else {
        assert_eq!(writes, 5.0, "{out}");
        assert!(sent > 0.0, "{out}");
        if dsn.is_some_and(|d| d.starts_with("postgres")) {
            assert!(sent <= writes, "{out}");
        }
    }
    // Each run's RunAgent message was sent once and came back in some batch.
    assert_eq!(out["transport_calls_per_run"]["send"], 1.0, "{out}");
    assert!(positive(&out["transport_calls_per_run"]["get"]), "{out}");
    assert!(positive(&out["transport_statements_per_run"]), "{out}");
    assert!(out["empty_gets_per_run"].as_f64().is_some(), "{out}");
    // Beside it, the raw sqlx loop ran the same runs: its rate, the ratio and its cost.
    let raw = &out["raw"];
    assert!(
        positive(&raw["runs_per_s"]) && positive(&raw["submit_per_s"]),
        "{out}"
    );
    assert!(positive(&out["ratio"]), "{out}");
    assert_eq!(
        out["round_ratios"].as_array().map(Vec::len),
        Some(1),
        "{out}"
    );
    let raw_total = raw["statements_per_run"].as_f64().unwrap_or(0.0);
    let raw_submit = raw["statements"]["submit"].as_f64().unwrap_or(0.0);
    let raw_execute = raw["statements"]["execute"].as_f64().unwrap_or(0.0);
    // Submit: the run and its message; execute: the message claim, the run's claim, a renew
    // and a step row per step, the settle, the message's delete.
    assert_eq!(raw_submit, 2.0, "{out}");
    assert!(raw_execute >= 10.0, "{out}");
    assert!((raw_total - raw_submit - raw_execute).abs() < 1e-9, "{out}");
    assert!(positive(&raw["round_trips_per_run"]), "{out}");
    // Submit-to-settle latency, idle (half of the 12 runs, one at a time) and under load.
    let latency = &out["latency_ms"];
    assert_eq!(latency["idle"]["runs"], 6, "{out}");
    assert_eq!(latency["loaded"]["runs"], 12, "{out}");
    for phase in ["idle", "loaded"] {
        let (p50, p99) = (&latency[phase]["p50"], &latency[phase]["p99"]);
        assert!(positive(p50) && p99.as_f64() >= p50.as_f64(), "{out}");
    }
    out
}

#[cfg(all(feature = "runs", feature = "sqlite"))]
#[test]
fn bench_runs_reports_runs_per_second_and_statements_per_run_on_sqlite() {
    runs_are_counted(None);
    let env = Env::empty();
    let text = env.run(&["bench", "--runs", "--messages", "3"]);
    let stdout = text.ok();
    assert!(stdout.contains("execute"), "{stdout}");
    assert!(stdout.contains("store statements per run"), "{stdout}");
    assert!(stdout.contains("transport statements per run"), "{stdout}");
}

#[cfg(feature = "runs")]
#[test]
fn bench_runs_refuses_a_dsn_without_sql() {
    let env = Env::empty();
    let err = env
        .run(&["bench", "--runs", "--dsn", "in-memory://"])
        .fails(2)
        .to_owned();
    assert!(err.contains("--runs"), "{err}");
}

/// `bench --runs --steps 10` as JSON: both sides timed, every step journaled once in the
/// statements and round trips the dialect costs.
#[cfg_attr(
    not(all(feature = "runs", feature = "sqlite")),
    allow(dead_code, reason = "used by the tests of the dialects compiled in")
)]
fn steps_are_timed(dsn: &str, statements: f64, round_trips: f64) -> Value {
    let env = Env::empty();
    let args = [
        "bench",
        "--runs",
        "--steps",
        "10",
        "--messages",
        "6",
        "--rounds",
        "2",
        "--dsn",
        dsn,
        "--format",
        "json",
    ];
    let out = env.run(&args).json();
    assert_eq!(out["mode"], "steps", "{out}");
    assert_eq!(out["runs"], 6, "{out}");
    assert_eq!(out["steps_per_run"], 10, "{out}");
    for side in ["courier", "raw"] {
        for key in ["p50_us", "p99_us", "steps_per_s"] {
            assert!(positive(&out[side][key]), "{side} {key}: {out}");
        }
    }
    assert!(positive(&out["ratio"]), "{out}");
    assert_eq!(
        out["round_ratios"].as_array().map(Vec::len),
        Some(2),
        "{out}"
    );
    assert_eq!(out["statements_per_step"]["courier"], statements, "{out}");
    assert_eq!(out["round_trips_per_step"]["courier"], round_trips, "{out}");
    assert_eq!(out["statements_per_step"]["raw"], 4.0, "{out}");
    out
}

#[cfg(all(feature = "runs", feature = "sqlite"))]
#[test]
fn bench_steps_times_a_durable_step_beside_raw_sqlx_on_sqlite() {
    // One statement: the step's row, guarded by the run's (the lease, 15 minutes, is fresh).
    steps_are_timed("sqlite://steps.db", 1.0, 1.0);
}

#[cfg(all(feature = "runs", feature = "postgres"))]
#[test]
#[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
fn bench_steps_times_a_durable_step_beside_raw_sqlx_on_postgres() {
    // One data-modifying CTE.
    steps_are_timed(&service_url("COURIER_TEST_POSTGRES_URL"), 1.0, 1.0);
}

#[cfg(all(feature = "runs", feature = "mysql"))]
#[test]
#[ignore = "needs mariadb: set COURIER_TEST_MYSQL_URL"]
fn bench_steps_times_a_durable_step_beside_raw_sqlx_on_mariadb() {
    // One statement: the step's row, guarded by the run's (the lease, 15 minutes, is fresh).
    steps_are_timed(&service_url("COURIER_TEST_MYSQL_URL"), 1.0, 1.0);
}

/// `bench --latency` as JSON: the samples asked for on both sides, and the p50 ratio.
fn latency_beside_floor(dsn: Option<&str>, floor: &str) -> Value {
    let env = Env::empty();
    let mut args = vec!["bench", "--latency", "--samples", "15", "--format", "json"];
    if let Some(dsn) = dsn {
        args.extend(["--dsn", dsn]);
    }
    let out = env.run(&args).json();
    assert_eq!(out["mode"], "latency", "{out}");
    assert_eq!(out["samples"], 15, "{out}");
    assert!(
        out.get("rounds").is_none(),
        "samples alternate, no rounds: {out}"
    );
    for side in ["courier", "raw"] {
        assert!(positive(&out[side]["p50_ms"]), "{side}: {out}");
        let (p50, p99) = (
            out[side]["p50_ms"].as_f64().unwrap_or(0.0),
            out[side]["p99_ms"].as_f64().unwrap_or(0.0),
        );
        assert!(p99 >= p50, "{side}: {out}");
    }
    assert!(
        out["raw"]["floor"]
            .as_str()
            .is_some_and(|f| f.contains(floor)),
        "{out}"
    );
    assert!(positive(&out["ratio"]), "{out}");
    out
}

#[cfg(feature = "sqlite")]
#[test]
fn bench_latency_reports_p50_beside_the_polling_floor_on_sqlite() {
    latency_beside_floor(None, "polling");
    let env = Env::empty();
    let text = env.run(&["bench", "--latency", "--samples", "3"]);
    let stdout = text.ok();
    assert!(stdout.contains("ratio (courier / raw p50)"), "{stdout}");
}

#[test]
fn bench_latency_without_a_raw_driver_says_so() {
    let env = Env::empty();
    let out = env
        .run(&[
            "bench",
            "--latency",
            "--samples",
            "3",
            "--dsn",
            "in-memory://",
            "--format",
            "json",
        ])
        .json();
    assert!(positive(&out["courier"]["p50_ms"]), "{out}");
    assert!(out["raw"].is_null() && out["ratio"].is_null(), "{out}");
}

#[cfg(feature = "amqp")]
#[test]
#[ignore = "needs rabbitmq: set COURIER_TEST_AMQP_URL"]
fn bench_raw_on_rabbitmq_measures_lapin_beside_courier() {
    throughput_beside_raw(Some(&service_url("COURIER_TEST_AMQP_URL")));
}

#[cfg(feature = "amqp")]
#[test]
#[ignore = "needs rabbitmq: set COURIER_TEST_AMQP_URL"]
fn bench_latency_on_rabbitmq_is_beside_a_push_consumer() {
    latency_beside_floor(Some(&service_url("COURIER_TEST_AMQP_URL")), "basic.consume");
}

#[cfg(feature = "redis")]
#[test]
#[ignore = "needs redis: set COURIER_TEST_REDIS_URL"]
fn bench_latency_on_redis_is_beside_a_blocking_read() {
    latency_beside_floor(
        Some(&service_url("COURIER_TEST_REDIS_URL")),
        "XREADGROUP BLOCK",
    );
}

#[cfg(feature = "postgres")]
#[test]
#[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
fn bench_latency_on_postgres_is_beside_listen_notify() {
    let cleanup = courier_test::Cleanup::new();
    latency_beside_floor(
        Some(&own_table("COURIER_TEST_POSTGRES_URL", &cleanup)),
        "LISTEN/NOTIFY",
    );
}

#[cfg(all(feature = "runs", feature = "postgres"))]
#[test]
#[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
fn bench_runs_on_postgres_counts_statements_per_run() {
    let cleanup = courier_test::Cleanup::new();
    runs_are_counted(Some(&own_table("COURIER_TEST_POSTGRES_URL", &cleanup)));
}

#[cfg(all(feature = "runs", feature = "mysql"))]
#[test]
#[ignore = "needs mysql: set COURIER_TEST_MYSQL_URL"]
fn bench_runs_on_mariadb_counts_statements_per_run_beside_the_raw_loop() {
    let cleanup = courier_test::Cleanup::new();
    runs_are_counted(Some(&own_table("COURIER_TEST_MYSQL_URL", &cleanup)));
}

#[cfg_attr(
    not(feature = "postgres"),
    allow(dead_code, reason = "used by the service test")
)]
/// `bench --relay` as JSON: the destination's own send, the relay, the outbox's ceiling, (on
/// PostgreSQL) the drain statements' execution time and (from PostgreSQL to Redis) the raw
/// drivers relaying the same way.
fn relay_beside_direct_send(from: &str, to: &str) -> Value {
    let env = Env::empty();
    let out = env
        .run(&[
            "bench",
            "--relay",
            "--dsn",
            from,
            "--to",
            to,
            "--messages",
            "300",
            "--fetch-size",
            "64",
            "--size",
            "64",
            "--rounds",
            "1",
            "--format",
            "json",
        ])
        .json();
    assert_eq!(out["mode"], "relay", "{out}");
    assert_eq!(out["messages"], 300, "{out}");
    for key in [
        "direct_send_per_s",
        "relay_per_s",
        "outbox_alone_per_s",
        "ratio",
    ] {
        assert!(positive(&out[key]), "{key}: {out}");
    }
    // The server's own share of a PostgreSQL outbox's ceiling; none for another outbox.
    if from.starts_with("postgres") {
        assert!(positive(&out["drain_execution_per_s"]), "{out}");
    } else {
        assert!(out["drain_execution_per_s"].is_null(), "{out}");
    }
    if from.starts_with("postgres") && to.starts_with("redis") {
        assert!(positive(&out["raw_relay_per_s"]), "{out}");
    } else {
        assert!(out["raw_relay_per_s"].is_null(), "{out}");
    }
    // Each phase's machine-wide CPU cost and Courier's share (Linux's /proc; 300 messages
    // may take no tick).
    if cfg!(target_os = "linux") {
        for phase in ["direct_send", "relay", "outbox_alone"] {
            let cpu = &out["cpu"][phase];
            for key in ["us_per_msg", "cores_busy", "courier_us_per_msg"] {
                assert!(
                    cpu[key].as_f64().is_some_and(|v| v >= 0.0),
                    "{phase}: {out}"
                );
            }
        }
    }
    out
}

#[cfg(feature = "sqlite")]
#[test]
fn bench_relay_reports_the_outbox_ceiling_on_sqlite() {
    relay_beside_direct_send("sqlite://outbox.db", "sqlite://destination.db");
}

#[cfg(all(feature = "postgres", feature = "redis"))]
#[test]
#[ignore = "needs postgres and redis: set COURIER_TEST_POSTGRES_URL and COURIER_TEST_REDIS_URL"]
fn bench_relay_from_postgres_to_redis() {
    let cleanup = courier_test::Cleanup::new();
    relay_beside_direct_send(
        &own_table("COURIER_TEST_POSTGRES_URL", &cleanup),
        &service_url("COURIER_TEST_REDIS_URL"),
    );
}

#[cfg(all(feature = "postgres", feature = "nats"))]
#[test]
#[ignore = "needs postgres and nats: set COURIER_TEST_POSTGRES_URL and COURIER_TEST_NATS_URL"]
fn bench_relay_from_postgres_to_nats() {
    let cleanup = courier_test::Cleanup::new();
    relay_beside_direct_send(
        &own_table("COURIER_TEST_POSTGRES_URL", &cleanup),
        &service_url("COURIER_TEST_NATS_URL"),
    );
}
