//! `courier failed` as Messenger's `messenger:failed:*`: `--stats`, `--class-filter`, the body in
//! `show ID`, `retry --to`, and the interactive retry / remove on a terminal (a pseudo-terminal
//! made by util-linux `script`, as an operator's shell would be).

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Env, wait};

const CONFIG: &str = r#"
[transports.async]
dsn = "sqlite://courier.db"
failure_transport = "failed"

[transports.other]
dsn = "sqlite://courier.db?queue_name=other"

[transports.failed]
dsn = "sqlite://courier.db?queue_name=failed"
"#;

/// Three messages of unknown types (`app.a`, `app.a`, `app.b`) moved to the failure transport.
fn with_failed() -> Env {
    let env = Env::empty();
    env.write("courier.toml", CONFIG);
    env.run(&["setup"]).ok();
    for (n, kind) in [(1, "app.a"), (2, "app.a"), (3, "app.b")] {
        env.sql(&format!(
            "INSERT INTO courier_messages (queue_name, body, headers, priority, created_at, available_at) \
             VALUES ('default', '{{\"n\":{n}}}', '{{\"type\":\"{kind}\",\"content-type\":\"application/json\"}}', 0, 0, {n})"
        ));
    }
    env.run(&["consume", "async", "--limit", "3", "--sleep", "20ms"])
        .ok();
    env
}

fn failed(env: &Env, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["failed"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--format", "json"]);
    env.run(&all).json()
}

/// Runs `courier ARGS` on a pseudo-terminal, typing `answers`.
fn on_terminal(env: &Env, args: &str, answers: &str) -> common::Run {
    let command = format!("{} {args}", env!("CARGO_BIN_EXE_courier-cli"));
    let mut child = Command::new("script")
        .args(["-q", "-e", "-c", &command, "/dev/null"])
        .current_dir(env.root())
        .env_remove("COURIER_CONFIG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("util-linux `script` makes the pseudo-terminal (Debian: bsdutils)");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(answers.as_bytes())
        .expect("type the answers");
    wait(child, Duration::from_secs(60))
}

#[test]
fn failed_show_counts_by_type_and_error_class_and_filters_by_type() {
    let env = with_failed();
    let stats = failed(&env, &["show", "--stats"]);
    assert_eq!(
        stats,
        serde_json::json!({
            "total": 3,
            "by_type": {"app.a": 2, "app.b": 1},
            "by_error_class": {"decode": 3},
        })
    );
    let text = env.run(&["failed", "show", "--stats"]).ok().to_owned();
    assert!(text.contains("app.a") && text.contains("decode"), "{text}");
    let only_b = failed(&env, &["show", "--class-filter", "app.b"]);
    let rows = only_b.as_array().expect("array");
    assert_eq!(rows.len(), 1, "{only_b}");
    assert_eq!(rows[0]["type"], "app.b");
    let id = rows[0]["id"].as_str().expect("id").to_owned();
    let one = env.run(&["failed", "show", &id]).ok().to_owned();
    assert!(one.contains("body") && one.contains(r#"{"n":3}"#), "{one}");
}

#[test]
fn failed_retry_class_filter_and_to_send_only_that_type_to_the_chosen_transport() {
    let env = with_failed();
    let out = failed(
        &env,
        &["retry", "--all", "--class-filter", "app.a", "--to", "other"],
    );
    assert_eq!(out["done"].as_array().map(Vec::len), Some(2), "{out}");
    let stats = env.run(&["stats", "--format", "json"]).json();
    assert_eq!(
        stats,
        serde_json::json!({"async": 0, "other": 2, "failed": 1}),
        "both app.a went to `other`, app.b stayed"
    );
    let err = env
        .run(&["failed", "retry", "--all", "--to", "nope"])
        .fails(2)
        .to_owned();
    assert!(err.contains("unknown transport `nope`"), "{err}");
}

#[test]
fn failed_retry_on_a_terminal_shows_each_message_and_asks() {
    let env = with_failed();
    // Oldest first: the first is retried, the second skipped, the third deleted.
    let run = on_terminal(&env, "failed retry --all", "r\ns\nd\n");
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(
        run.stdout
            .matches("Retry (r), delete (d), skip (s) or quit (q)?")
            .count(),
        3,
        "{}",
        run.stdout
    );
    for shown in [
        "app.a",
        "app.b",
        r#"{"n":1}"#,
        "error class",
        "decode",
        "stamps",
    ] {
        assert!(
            run.stdout.contains(shown),
            "{shown} not shown:\n{}",
            run.stdout
        );
    }
    assert!(
        run.stdout
            .contains("Retried 1 failed message(s), removed 1, skipped 1."),
        "{}",
        run.stdout
    );
    let stats = env.run(&["stats", "--format", "json"]).json();
    assert_eq!(
        stats,
        serde_json::json!({"async": 1, "other": 0, "failed": 1})
    );
    let left = failed(&env, &["show"]);
    assert_eq!(left[0]["type"], "app.a", "the skipped one stays: {left}");

    // Quit stops at once; without a terminal (or with --force) nothing is asked.
    let run = on_terminal(&env, "failed remove --all", "q\n");
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stdout.contains("Removed 0 failed message(s)."),
        "{}",
        run.stdout
    );
    let run = on_terminal(&env, "failed remove --all --force", "");
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(!run.stdout.contains("Remove it for good"), "{}", run.stdout);
    let stats = env.run(&["stats", "--format", "json"]).json();
    assert_eq!(stats["failed"], 0, "{stats}");
}
