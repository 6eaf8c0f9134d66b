//! Every command through the real binary, in a temporary directory.

mod common;

use std::time::Duration;

use common::{Env, eventually, signal, wait};

#[test]
fn setup_is_idempotent_and_stats_counts_every_transport() {
    let env = Env::with_config();
    env.run(&["setup"]).ok();
    let out = env.run(&["setup", "--format", "json"]).json();
    assert_eq!(out["transports"]["async"], "ready");
    let stats = env.run(&["stats", "--format", "json"]).json();
    assert_eq!(stats, serde_json::json!({ "async": 0, "failed": 0 }));
    let one = env.run(&["stats", "failed", "--format", "json"]).json();
    assert_eq!(one, serde_json::json!({ "failed": 0 }));
    assert!(env.run(&["stats"]).ok().contains("TRANSPORT"));
}

#[test]
fn setup_reports_the_migrations_it_applied_then_that_all_is_up_to_date() {
    let env = Env::empty();
    let first = env.run(&["setup", "--format", "json"]).json();
    let applied = |out: &serde_json::Value, key: &str| -> Vec<String> {
        out["applied"][key]
            .as_array()
            .unwrap_or_else(|| panic!("no applied list for {key}: {out}"))
            .iter()
            .map(|v| v.as_str().expect("migration names are strings").to_owned())
            .collect()
    };
    let messages = applied(&first, "async");
    assert!(
        messages.first().is_some_and(|m| m.starts_with("0001")),
        "the messages table was created by migration 0001: {messages:?}"
    );
    let runs = applied(&first, "runs");
    assert!(
        runs.iter().any(|m| m.starts_with("0002")),
        "the run tables were created: {runs:?}"
    );
    let again = env.run(&["setup"]).ok().to_owned();
    assert!(
        again.contains("async: ready, up to date") && again.contains("ready, up to date"),
        "a second setup applies nothing: {again}"
    );
}

#[test]
fn the_embedded_default_uses_courier_db_in_the_working_directory() {
    let env = Env::empty();
    env.run(&["setup"]).ok();
    assert!(env.path("courier.db").is_file());
    let stats = env.run(&["stats", "--format", "json"]).json();
    assert_eq!(stats, serde_json::json!({ "async": 0, "failed": 0 }));
}

#[test]
fn a_run_failing_twice_completes_after_two_requeues() {
    let env = Env::with_config();
    let id = env.submit(r#"{"steps":[{"fail":"server_error","attempts":2},{"output":"ok"}]}"#);
    assert_eq!(env.show(&id)["status"], "queued");
    let consumed = env.run(&[
        "consume",
        "--limit",
        "3",
        "--sleep",
        "20ms",
        "--time-limit",
        "30s",
        "-v",
    ]);
    consumed.ok();
    assert!(
        consumed.stderr.contains("handled"),
        "per-message logs with -v: {}",
        consumed.stderr
    );
    let run = env.show(&id);
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(run["requeue_count"], 2);
    assert_eq!(run["output"], "ok");
    for key in [
        "termination_reason",
        "claimed_by",
        "lease_expires",
        "error_class",
        "started_at",
        "finished_at",
    ] {
        assert!(run.get(key).is_some(), "missing {key}");
    }
    let events = run["events"].as_array().expect("events");
    assert_eq!(events.last().expect("an event")["kind"], "output");
    assert_eq!(
        env.run(&["stats", "async", "--format", "json"]).json()["async"],
        0
    );
}

#[test]
fn runs_list_events_and_cancel() {
    let env = Env::with_config();
    let first = env.submit(r#"{"steps":[{"output":1}]}"#);
    let second = env.submit(r#"{"steps":[{"output":2}]}"#);
    let list = env.run(&["runs", "list", "--format", "json"]).json();
    let ids: Vec<&str> = list
        .as_array()
        .expect("array")
        .iter()
        .map(|r| r["id"].as_str().expect("id"))
        .collect();
    assert_eq!(ids.len(), 2);
    assert!(list[0].get("events").is_none());
    assert!(env.run(&["runs", "list"]).ok().contains(&first));
    let queued = env
        .run(&["runs", "list", "--status", "queued", "--format", "json"])
        .json();
    assert_eq!(queued.as_array().map(Vec::len), Some(2));

    let cancelled = env
        .run(&["runs", "cancel", &second, "--format", "json"])
        .json();
    assert_eq!(cancelled["status"], "cancelled");
    env.run(&["runs", "cancel", &second]).fails(1);

    env.run(&[
        "consume",
        "--limit",
        "2",
        "--sleep",
        "20ms",
        "--time-limit",
        "30s",
    ])
    .ok();
    assert_eq!(env.show(&first)["status"], "completed");
    assert_eq!(env.show(&second)["status"], "cancelled");
    let events = env
        .run(&["runs", "events", &first, "--format", "json"])
        .json();
    assert_eq!(events[0]["seq"], 1);
    assert_eq!(events[0]["kind"], "output");
    assert!(
        events[0]["created_at"]
            .as_str()
            .expect("time")
            .ends_with('Z')
    );
    assert!(
        env.run(&["runs", "show", &first])
            .ok()
            .contains("completed")
    );
}

#[test]
fn runs_submit_with_a_unique_key_queues_one_run_and_names_the_holder() {
    let env = Env::with_config();
    let submit = |key: &str| {
        env.run(&[
            "runs",
            "submit",
            "scripted",
            "--unique",
            key,
            "--unique-for",
            "1h",
            "--format",
            "json",
        ])
        .json()
    };
    let first = submit("nightly");
    assert_eq!(first["duplicate"], false, "{first}");
    let again = submit("nightly");
    assert_eq!(again["duplicate"], true, "{again}");
    assert_eq!(again["id"], first["id"], "the duplicate names the holder");
    let text = env.run(&[
        "runs",
        "submit",
        "scripted",
        "--unique",
        "nightly",
        "--unique-for",
        "1h",
    ]);
    assert!(text.ok().contains(first["id"].as_str().expect("id")));
    assert!(
        text.stderr.contains("nothing was queued"),
        "{}",
        text.stderr
    );
    assert_eq!(submit("weekly")["duplicate"], false, "another key");
    let list = env.run(&["runs", "list", "--format", "json"]).json();
    assert_eq!(list.as_array().map(Vec::len), Some(2), "{list}");
    // The period over, the key is free again.
    env.sql("UPDATE courier_runs SET unique_until = 1 WHERE unique_key = 'nightly'");
    let later = submit("nightly");
    assert_eq!(later["duplicate"], false, "{later}");
    assert_ne!(later["id"], first["id"]);
}

#[test]
fn interactive_runs_and_input_files() {
    let env = Env::with_config();
    env.write(
        "input.json",
        r#"{"steps":[{"sleep_ms":1},{"output":"from a file"}]}"#,
    );
    let out = env
        .run(&[
            "runs",
            "submit",
            "scripted",
            "--input",
            "@input.json",
            "--interactive",
            "--format",
            "json",
        ])
        .json();
    assert_eq!(out["status"], "completed");
    let run = env.show(out["id"].as_str().expect("id"));
    assert_eq!(run["output"], "from a file");
    assert_eq!(run["lease_expires"], 0);
    let failed = env.run(&[
        "runs",
        "submit",
        "scripted",
        "--input",
        r#"{"steps":[{"fail":"auth"}]}"#,
        "--interactive",
    ]);
    failed.fails(1);
}

#[test]
fn reap_recovers_a_run_whose_worker_was_killed() {
    let env = Env::with_config();
    let id = env.submit(r#"{"steps":[{"sleep_ms":1},{"hang_ms":60000},{"output":"x"}]}"#);
    let child = env.spawn(&["consume", "--sleep", "20ms"]);
    eventually("the run to start", || env.show(&id)["status"] == "running");
    signal(&child, "KILL");
    let _ = wait(child, Duration::from_secs(10));
    let nothing = env.run(&["reap", "--format", "json"]).json();
    assert_eq!(nothing["selected"], 0, "the lease has not expired yet");

    env.sql(&format!(
        "UPDATE courier_runs SET lease_expires = 1 WHERE id = '{id}'"
    ));
    let dry = env.run(&["reap", "--dry-run", "--format", "json"]).json();
    assert_eq!(
        (dry["selected"].as_u64(), dry["requeued"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(
        env.show(&id)["status"],
        "running",
        "a dry run changes nothing"
    );
    let out = env.run(&["reap"]);
    assert_eq!(
        out.ok().trim(),
        "Reaped 1 stale run(s): 1 requeued, 0 dead-lettered, 0 skipped."
    );
    let run = env.show(&id);
    assert_eq!(run["status"], "queued");
    assert_eq!(run["requeue_count"], 1);
}

#[test]
fn failed_messages_can_be_shown_retried_and_removed() {
    let env = Env::with_config();
    env.run(&["setup"]).ok();
    env.sql(
        "INSERT INTO courier_messages (queue_name, body, headers, priority, created_at, available_at) \
         VALUES ('default', '{\"x\":1}', '{\"type\":\"app.unknown\",\"content-type\":\"application/json\"}', 0, 0, 0)",
    );
    env.run(&[
        "consume",
        "async",
        "--limit",
        "1",
        "--sleep",
        "20ms",
        "--time-limit",
        "30s",
    ])
    .ok();
    let failed = env.run(&["failed", "show", "--format", "json"]).json();
    let rows = failed.as_array().expect("array");
    assert_eq!(rows.len(), 1, "{failed}");
    assert_eq!(rows[0]["type"], "app.unknown");
    assert_eq!(rows[0]["transport"], "async");
    for key in ["id", "error_class", "error", "retry_count", "failed_at"] {
        assert!(rows[0].get(key).is_some(), "missing {key}");
    }
    let id = rows[0]["id"].as_str().expect("id").to_owned();
    let text = env.run(&["failed", "show"]).ok().to_owned();
    assert!(
        text.contains("app.unknown") && text.lines().all(|l| l.chars().count() <= 80),
        "{text}"
    );
    assert!(
        env.run(&["failed", "show", &id])
            .ok()
            .contains("app.unknown")
    );

    env.run(&["failed", "retry", &id]).ok();
    let stats = env.run(&["stats", "--format", "json"]).json();
    assert_eq!(stats, serde_json::json!({ "async": 1, "failed": 0 }));
    // With --oldest each queue says how long its oldest message has waited (null: empty).
    let ages = env.run(&["stats", "--oldest", "--format", "json"]).json();
    assert_eq!(ages["async"]["messages"], 1, "{ages}");
    let waited = ages["async"]["oldest_s"]
        .as_f64()
        .expect("an age in seconds");
    assert!((0.0..3600.0).contains(&waited), "{ages}");
    assert_eq!(
        ages["failed"],
        serde_json::json!({ "messages": 0, "oldest_s": null })
    );

    env.run(&[
        "consume",
        "async",
        "--limit",
        "1",
        "--sleep",
        "20ms",
        "--time-limit",
        "30s",
    ])
    .ok();
    env.run(&["failed", "remove", "--all"]).ok();
    let stats = env.run(&["stats", "--format", "json"]).json();
    assert_eq!(stats, serde_json::json!({ "async": 0, "failed": 0 }));
    env.run(&["failed", "remove", "12345"]).fails(1);
}

#[test]
fn stop_workers_stops_a_running_consume() {
    let env = Env::with_config();
    env.run(&["setup"]).ok();
    let child = env.spawn(&["consume", "--sleep", "20ms"]);
    // Registered (in courier_workers) once it is up.
    eventually("the worker to register", || {
        env.run(&["workers", "--format", "json"])
            .json()
            .as_array()
            .is_some_and(|a| a.len() == 1)
    });
    let asked = env.run(&["stop-workers", "--format", "json"]).json();
    assert_eq!(asked, serde_json::json!({ "requested": 1 }));
    let out = wait(child, Duration::from_secs(15));
    out.ok();
    assert!(out.stderr.contains("shutdown requested"), "{}", out.stderr);
}

#[test]
fn bench_prints_the_documented_json() {
    let env = Env::empty();
    let out = env
        .run(&[
            "bench",
            "--messages",
            "300",
            "--size",
            "64",
            "--fetch-size",
            "16",
            "--raw",
            "--format",
            "json",
        ])
        .json();
    for key in [
        "dsn",
        "messages",
        "size",
        "fetch_size",
        "concurrency",
        "produce_per_s",
        "consume_per_s",
        "p50_ms",
        "p99_ms",
    ] {
        assert!(out.get(key).is_some(), "missing {key}: {out}");
    }
    assert_eq!(out["messages"], 300);
    assert!(out["consume_per_s"].as_f64().is_some_and(|v| v > 0.0));
    assert!(out.get("raw").is_some() && out.get("ratio").is_some());
    let text = env.run(&["bench", "--messages", "100", "--dsn", "in-memory://"]);
    assert!(text.ok().contains("courier"));
}

#[test]
fn help_and_version_exit_zero() {
    let env = Env::empty();
    assert!(env.run(&["--help"]).ok().contains("consume"));
    env.run(&["--version"]).ok();
    assert!(env.run(&["runs", "--help"]).ok().contains("submit"));
}

#[test]
fn consume_with_reap_every_recovers_a_stale_run_itself() {
    let env = Env::with_config();
    let id = env.submit(r#"{"steps":[{"sleep_ms":1},{"hang_ms":1500},{"output":"recovered"}]}"#);
    let first = env.spawn(&["consume", "--sleep", "20ms"]);
    eventually("the run to start", || env.show(&id)["status"] == "running");
    signal(&first, "KILL");
    let _ = wait(first, Duration::from_secs(10));
    env.sql(&format!(
        "UPDATE courier_runs SET lease_expires = 1 WHERE id = '{id}'"
    ));
    let out = env.run(&[
        "consume",
        "--reap-every",
        "100ms",
        "--limit",
        "1",
        "--sleep",
        "20ms",
        "--time-limit",
        "30s",
    ]);
    out.ok();
    assert!(
        out.stderr.contains("Reaped 1 stale run(s): 1 requeued"),
        "{}",
        out.stderr
    );
    let run = env.show(&id);
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(run["requeue_count"], 1);
}

#[test]
fn a_configuration_without_runs_gets_no_run_store() {
    let env = Env::empty();
    env.write("app.toml", "[transports.async]\ndsn = \"in-memory://\"\n");
    let out = env
        .run(&["--config", "app.toml", "setup", "--format", "json"])
        .json();
    assert_eq!(out["runs"], serde_json::Value::Null);
    assert!(!env.path("courier.db").exists());
    env.run(&[
        "--config",
        "app.toml",
        "consume",
        "--limit",
        "1",
        "--time-limit",
        "200ms",
    ])
    .ok();
    assert!(!env.path("courier.db").exists());
    env.run(&["--config", "app.toml", "consume", "--reap-every", "1s"])
        .fails(2);
}
