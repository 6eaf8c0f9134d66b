//! Messenger's consume and setup options: `setup TRANSPORT...`, `consume --queues`,
//! `--exclude-receivers`, `--bus`, and buses declared in `[buses.NAME]`.

mod common;

use common::Env;

const SCRIPT: &str = r#"{"steps":[{"output":"done"}]}"#;

/// `async` reads the table's `default` queue; runs are routed to the `high` queue of the same
/// table, which only a `--queues high` consumer of `async` (or `high` itself) reads.
const QUEUES: &str = r#"
[transports.async]
dsn = "sqlite://courier.db"
failure_transport = "failed"

[transports.high]
dsn = "sqlite://courier.db?queue_name=high"
failure_transport = "failed"

[transports.failed]
dsn = "sqlite://courier.db?queue_name=failed"

[routing]
"courier.run_agent" = "high"

[runs]
store = "sqlite://courier.db"
"#;

fn consumed(env: &Env, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["consume"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--sleep", "20ms", "--format", "json"]);
    env.run(&all).json()
}

#[test]
fn setup_of_one_transport_leaves_the_others_and_the_run_store_alone() {
    let env = Env::empty();
    env.write(
        "courier.toml",
        r#"
[transports.a]
dsn = "sqlite://a.db"
[transports.b]
dsn = "sqlite://b.db"
[runs]
store = "sqlite://runs.db"
"#,
    );
    let out = env.run(&["setup", "a", "--format", "json"]).json();
    assert_eq!(
        out["transports"],
        serde_json::json!({"a": "ready"}),
        "{out}"
    );
    assert!(out["runs"].is_null(), "{out}");
    assert!(env.path("a.db").exists());
    assert!(!env.path("b.db").exists(), "b was not touched");
    assert!(
        !env.path("runs.db").exists(),
        "the run store was not touched"
    );
    let err = env.run(&["setup", "nope"]).fails(2).to_owned();
    assert!(err.contains("unknown transport `nope`"), "{err}");
}

#[test]
fn consume_queues_reads_another_queue_of_the_same_table() {
    let env = Env::empty();
    env.write("courier.toml", QUEUES);
    let a = env.submit(SCRIPT);
    let b = env.submit(SCRIPT);
    // `async` alone reads its own queue: nothing there.
    let idle = consumed(&env, &["async", "--time-limit", "500ms"]);
    assert_eq!(idle["handled"], 0, "{idle}");
    assert_eq!(env.show(&a)["status"], "queued");
    // Through `async`, the `high` queue.
    let out = consumed(&env, &["async", "--queues", "high", "--limit", "2"]);
    assert_eq!(out["handled"], 2, "{out}");
    for id in [&a, &b] {
        assert_eq!(env.show(id)["status"], "completed");
    }
    let err = env
        .run(&["consume", "async", "--queues", "", "--limit", "1"])
        .fails(2)
        .to_owned();
    assert!(err.contains("invalid queue name"), "{err}");
}

#[test]
fn consume_exclude_receivers_consumes_all_but_those() {
    let env = Env::empty();
    env.write("courier.toml", QUEUES);
    let id = env.submit(SCRIPT);
    let idle = consumed(
        &env,
        &["--exclude-receivers", "high", "--time-limit", "500ms"],
    );
    assert_eq!(idle["handled"], 0, "{idle}");
    let out = consumed(&env, &["--exclude-receivers", "async", "--limit", "1"]);
    assert_eq!(out["handled"], 1, "{out}");
    assert_eq!(env.show(&id)["status"], "completed");
    let err = env
        .run(&["consume", "high", "--exclude-receivers", "async"])
        .fails(2)
        .to_owned();
    assert!(err.contains("--exclude-receivers"), "{err}");
    let err = env
        .run(&["consume", "--exclude-receivers", "nope"])
        .fails(2)
        .to_owned();
    assert!(err.contains("unknown transport `nope`"), "{err}");
}

#[test]
fn consume_bus_sends_every_message_to_that_bus() {
    let env = Env::empty();
    let config = format!(
        "default_bus = \"command\"\n{QUEUES}\n[buses.command]\n\n[buses.event]\nallow_no_handlers = true\n"
    );
    env.write("courier.toml", &config);
    let id = env.submit(SCRIPT);
    // The event bus has no handler for the run message and allows none: it is acked unhandled,
    // and the run stays queued (the reaper would dispatch it again later).
    let out = consumed(&env, &["high", "--bus", "event", "--limit", "1"]);
    assert_eq!(
        (out["handled"].as_u64(), out["failed"].as_u64()),
        (Some(1), Some(0)),
        "{out}"
    );
    assert_eq!(env.show(&id)["status"], "queued");
    let stats = env.run(&["stats", "high", "--format", "json"]).json();
    assert_eq!(stats["high"], 0, "{stats}");
    // Its own bus (named by the message's bus stamp) runs it.
    env.run(&["runs", "requeue", &id]).ok();
    let out = consumed(&env, &["high", "--limit", "1"]);
    assert_eq!(out["handled"], 1, "{out}");
    assert_eq!(env.show(&id)["status"], "completed");
    let err = env
        .run(&["consume", "high", "--bus", "query"])
        .fails(2)
        .to_owned();
    assert!(
        err.contains("unknown bus `query`") && err.contains("command, event"),
        "{err}"
    );
}

#[test]
fn buses_that_name_unknown_middleware_or_no_default_are_configuration_errors() {
    let env = Env::empty();
    env.write(
        "courier.toml",
        &format!("{QUEUES}\n[buses.command]\nmiddleware = [\"audit\"]\n"),
    );
    let err = env.run(&["stats"]).fails(2).to_owned();
    assert!(
        err.contains("buses.command.middleware: unknown middleware `audit`"),
        "{err}"
    );
    env.write(
        "courier.toml",
        &format!("{QUEUES}\n[buses.command]\n[buses.event]\n"),
    );
    let err = env.run(&["stats"]).fails(2).to_owned();
    assert!(err.contains("default_bus"), "{err}");
}
