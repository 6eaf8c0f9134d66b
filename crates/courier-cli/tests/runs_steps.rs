//! Durable steps from the command line: `runs show` lists a run's journal, budget and pending
//! wait; `runs signal` wakes a waiting run; `runs resolve` settles a guarded step a run parked
//! on; `runs fork` reruns a run from a step; `runs approve` and `runs input` resume a run here.
//! On SQLite, and on PostgreSQL (a database of its own, dropped after; `--include-ignored`).

mod common;

use std::time::Duration;

use common::{CONFIG, Env, eventually, wait};
use serde_json::{Value, json};

/// Where the transports and the run store live.
enum Db {
    Sqlite,
    #[cfg(feature = "postgres")]
    Postgres {
        /// The server's database, to create and drop ours.
        admin: String,
        /// Our database's name.
        name: String,
        /// Its URL.
        url: String,
    },
}

impl Db {
    /// `courier.toml` of a new working directory for this database.
    fn env(&self) -> Env {
        let env = Env::empty();
        let config = match self {
            Self::Sqlite => CONFIG.to_owned(),
            #[cfg(feature = "postgres")]
            Self::Postgres { url, .. } => CONFIG.replace("sqlite://courier.db", url),
        };
        env.write("courier.toml", &config);
        env
    }

    /// Executes one statement on the run store's database.
    fn sql(&self, env: &Env, statement: &str) {
        match self {
            Self::Sqlite => env.sql(statement),
            #[cfg(feature = "postgres")]
            Self::Postgres { url, .. } => common::block_on(async {
                use sqlx::Connection;
                let mut conn = sqlx::PgConnection::connect(url).await.expect("connect");
                sqlx::query(statement)
                    .execute(&mut conn)
                    .await
                    .expect("sql");
            }),
        }
    }

    /// A fresh database on the PostgreSQL server of `COURIER_TEST_POSTGRES_URL`.
    #[cfg(feature = "postgres")]
    fn postgres() -> Self {
        use sqlx::Connection;
        let admin = common::service_url("COURIER_TEST_POSTGRES_URL");
        let name = common::unique("courier_cli_steps");
        let (base, query) = admin.split_once('?').unwrap_or((&admin, ""));
        let server = base.rsplit_once('/').map_or(base, |(s, _)| s);
        let url = if query.is_empty() {
            format!("{server}/{name}")
        } else {
            format!("{server}/{name}?{query}")
        };
        common::block_on(async {
            let mut conn = sqlx::PgConnection::connect(&admin).await.expect("connect");
            sqlx::query(&format!("CREATE DATABASE {name}"))
                .execute(&mut conn)
                .await
                .expect("create database");
        });
        Self::Postgres { admin, name, url }
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        match self {
            Self::Sqlite => {}
            #[cfg(feature = "postgres")]
            Self::Postgres { admin, name, .. } => common::block_on(async {
                use sqlx::Connection;
                let Ok(mut conn) = sqlx::PgConnection::connect(admin).await else {
                    return;
                };
                let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .execute(&mut conn)
                    .await;
            }),
        }
    }
}

fn consume(env: &Env, n: usize) {
    env.run(&[
        "consume",
        "async",
        "--limit",
        &n.to_string(),
        "--sleep",
        "20ms",
        "--time-limit",
        "30s",
    ])
    .ok();
}

/// `runs show` lists the journal (result, usage, attempts), the budget used against its limits
/// and the pending wait; `runs signal` refuses the wrong name, bad JSON and a finished run, and
/// wakes the run with the right one, whose wait then returns the data.
fn show_lists_the_journal_and_signal_wakes_the_run(db: &Db) {
    let env = db.env();
    let long = "x".repeat(300);
    let script = json!({"steps": [
        {"step": "fetch", "tokens_out": 60, "result": {"doc": long}},
        {"wait_signal": "approve", "timeout_ms": 3_600_000},
        {"step": "write", "tokens_out": 30},
        {"output": "done"},
    ]});
    let id = env.submit(&script.to_string());
    db.sql(
        &env,
        &format!(
            "UPDATE courier_runs SET budget = '{{\"tokens_out\":1000,\"turns\":10}}' \
             WHERE id = '{id}'"
        ),
    );
    consume(&env, 1);

    let run = env.show(&id);
    assert_eq!(run["status"], "waiting", "{run}");
    assert_eq!(run["wait_signal"], "approve", "{run}");
    assert!(run["wakes_at"].is_string(), "the timeout: {run}");
    assert_eq!(run["budget"]["tokens_out"], 1000, "{run}");
    assert_eq!(run["usage"]["tokens_out"], 60, "{run}");
    let steps = run["steps"].as_array().expect("steps beside events");
    assert_eq!(steps.len(), 2, "{run}");
    assert_eq!(
        (
            steps[0]["index"].as_i64(),
            steps[0]["name"].as_str(),
            steps[0]["effect"].as_str(),
            steps[0]["status"].as_str(),
            steps[0]["attempts"].as_i64(),
        ),
        (Some(1), Some("fetch"), Some("pure"), Some("done"), Some(1)),
        "{run}"
    );
    assert_eq!(steps[0]["usage"]["tokens_out"], 60);
    assert_eq!(steps[0]["output"]["doc"], long.as_str(), "whole in JSON");
    assert!(steps[0]["duration_ms"].is_i64() && steps[0]["finished_at"].is_string());
    assert_eq!(
        (steps[1]["effect"].as_str(), steps[1]["status"].as_str()),
        (Some("wait"), Some("waiting")),
        "{run}"
    );

    let text = env.run(&["runs", "show", &id]).ok().to_owned();
    assert!(
        text.contains("waiting for         signal `approve` (times out at "),
        "{text}"
    );
    assert!(
        text.contains("budget              tokens_out 60/1000, turns 1/10"),
        "{text}"
    );
    assert!(text.contains("steps replayed      0"), "{text}");
    // STEP NAME EFFECT STATUS MS RAN USAGE
    let row: Vec<&str> = text
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|cells| cells.get(1) == Some(&"fetch"))
        .unwrap_or_else(|| panic!("the step's row: {text}"));
    assert_eq!(
        [&row[..4], &row[5..]].concat(),
        [
            "1", "fetch", "pure", "done", "1", "out", "60,", "turns", "1"
        ],
        "{text}"
    );
    let result = text
        .lines()
        .find(|l| l.starts_with("  #1 fetch: "))
        .unwrap_or_else(|| panic!("the step's result: {text}"));
    let shown = result.trim_start_matches("  #1 fetch: ");
    assert_eq!(
        shown.chars().count(),
        200,
        "cut to 200 characters: {result}"
    );
    assert!(shown.starts_with("{\"doc\":\"xxx") && shown.ends_with('…'));

    let refused = env
        .run(&["runs", "signal", &id, "reject"])
        .fails(1)
        .to_owned();
    assert!(
        refused.contains("not waiting for signal `reject`")
            && refused.contains("waits for `approve`"),
        "{refused}"
    );
    let bad = env
        .run(&["runs", "signal", &id, "approve", "--data", "{nope"])
        .fails(2)
        .to_owned();
    assert!(bad.contains("--data: invalid JSON"), "{bad}");
    let missing = uuid_like();
    let absent = env
        .run(&["runs", "signal", &missing, "approve"])
        .fails(1)
        .to_owned();
    assert!(absent.contains("not found"), "{absent}");
    assert_eq!(env.show(&id)["status"], "waiting", "nothing delivered yet");

    let sent = env
        .run(&[
            "runs",
            "signal",
            &id,
            "approve",
            "--data",
            r#"{"ok":true}"#,
            "--by",
            "ops",
            "--format",
            "json",
        ])
        .json();
    assert_eq!(
        sent,
        json!({"id": id, "signal": "approve", "sent": "woken"})
    );
    assert_eq!(env.show(&id)["status"], "queued");
    consume(&env, 1);
    let run = env.show(&id);
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(run["steps_replayed"], 1, "fetch was replayed: {run}");
    assert_eq!(run["usage"]["tokens_out"], 90, "{run}");
    let steps = run["steps"].as_array().expect("steps");
    assert_eq!(steps.len(), 3, "{run}");
    assert_eq!(steps[1]["status"], "done");
    assert_eq!(steps[1]["output"]["received"]["data"], json!({"ok": true}));
    assert_eq!(steps[1]["output"]["received"]["by"], "ops");
    assert_eq!(steps[0]["attempts"], 1, "the closure ran once");
    let finished = env
        .run(&["runs", "signal", &id, "approve"])
        .fails(1)
        .to_owned();
    assert!(finished.contains("is completed"), "{finished}");

    // A signal sent before the wait is kept for it.
    let early = env.submit(r#"{"steps":[{"wait_signal":"go"},{"output":"went"}]}"#);
    let sent = env
        .run(&["runs", "signal", &early, "go", "--format", "json"])
        .json();
    assert_eq!(sent["sent"], "buffered", "{sent}");
    consume(&env, 1);
    assert_eq!(env.show(&early)["status"], "completed");
}

/// A run id no run has.
fn uuid_like() -> String {
    format!("6f1c1c1e-0000-4000-8000-{:012x}", fastrand::u64(..1 << 48))
}

/// Two runs whose workers died inside a guarded `park` step park `waiting_for_approval`;
/// `runs approve` refuses them (the step may have happened), `runs resolve` skips one with a
/// result and fails the other; `runs fork` reruns the first from its third step.
fn parked_steps_are_resolved_and_a_run_is_forked(db: &Db) {
    let env = db.env();
    let script = json!({"steps": [
        {"step": "quote"},
        {"step": "pay", "effect": "guarded_park", "ms": 600_000},
        {"step": "receipt"},
        {"output": "done"},
    ]});
    let ids = [
        env.submit(&script.to_string()),
        env.submit(&script.to_string()),
    ];
    let worker = env.spawn(&["consume", "async", "--concurrency", "2", "--sleep", "20ms"]);
    eventually("both runs inside their guarded step", || {
        ids.iter()
            .all(|id| env.show(id)["steps"][1]["status"] == "intent")
    });
    let mut worker = worker;
    worker.kill().expect("kill the worker");
    wait(worker, Duration::from_secs(10));
    for id in &ids {
        db.sql(
            &env,
            &format!("UPDATE courier_runs SET lease_expires = 1 WHERE id = '{id}'"),
        );
    }
    let reaped = env.run(&["reap", "--format", "json"]).json();
    assert_eq!(reaped["requeued"], 2, "{reaped}");
    consume(&env, 2);
    for id in &ids {
        let run = env.show(id);
        assert_eq!(
            (run["status"].as_str(), run["pending_effect"].as_str()),
            (Some("waiting_for_approval"), Some("step 2: pay")),
            "{run}"
        );
    }
    let [paid, failed] = &ids;
    let text = env.run(&["runs", "show", paid]).ok().to_owned();
    assert!(text.contains("pending effect      step 2: pay"), "{text}");

    let refused = env.run(&["runs", "approve", paid]).fails(1).to_owned();
    assert!(
        refused.contains("parked on step 2: pay") && refused.contains("courier runs resolve"),
        "{refused}"
    );
    let extra = env
        .run(&["runs", "resolve", paid, "retry", "--result", "1"])
        .fails(2)
        .to_owned();
    assert!(extra.contains("--result"), "{extra}");
    let bad = env
        .run(&["runs", "resolve", paid, "skip", "--result", "{paid"])
        .fails(2)
        .to_owned();
    assert!(bad.contains("--result: invalid JSON"), "{bad}");
    env.run(&["runs", "resolve", paid, "later"]).fails(2);

    let out = env
        .run(&[
            "runs",
            "resolve",
            paid,
            "skip",
            "--result",
            r#"{"paid":true}"#,
            "--format",
            "json",
        ])
        .json();
    assert_eq!(
        out,
        json!({"id": paid, "resolution": "skip", "step": "step 2: pay", "status": "queued"})
    );
    let text = env
        .run(&["runs", "resolve", failed, "fail"])
        .ok()
        .to_owned();
    assert!(text.contains("failed at step 2: pay"), "{text}");
    let run = env.show(failed);
    assert_eq!(
        (run["status"].as_str(), run["error_class"].as_str()),
        (Some("failed"), Some("ambiguous_effect")),
        "{run}"
    );
    consume(&env, 1);
    let run = env.show(paid);
    assert_eq!(run["status"], "completed", "{run}");
    let steps = run["steps"].as_array().expect("steps");
    assert_eq!(steps[1]["output"], json!({"paid": true}), "{run}");
    assert_eq!(steps[2]["status"], "done", "{run}");
    let again = env
        .run(&["runs", "resolve", paid, "retry"])
        .fails(1)
        .to_owned();
    assert!(again.contains("not parked"), "{again}");

    let fork = env
        .run(&["runs", "fork", paid, "--from-step", "3", "--format", "json"])
        .json();
    let fork_id = fork["id"].as_str().expect("the new id").to_owned();
    assert_ne!(fork_id, *paid);
    assert_eq!(fork["forked_from"], paid.as_str());
    consume(&env, 1);
    let run = env.show(&fork_id);
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(run["steps_replayed"], 2, "steps 1 and 2 replayed: {run}");
    assert_eq!(run["steps"][1]["output"], json!({"paid": true}), "{run}");
    let printed = env
        .run(&["runs", "fork", paid, "--from-step", "1"])
        .ok()
        .trim()
        .to_owned();
    assert!(
        uuid::Uuid::parse_str(&printed).is_ok(),
        "prints the id: {printed}"
    );
    env.run(&["runs", "fork", paid, "--from-step", "0"])
        .fails(2);
    let absent = env
        .run(&["runs", "fork", &uuid_like(), "--from-step", "1"])
        .fails(1)
        .to_owned();
    assert!(absent.contains("not found"), "{absent}");
}

/// `runs approve` and `runs input` resume a run waiting for approval or input here, in this
/// process, and refuse a run in another status.
fn approve_and_input_resume_a_run_here(db: &Db) {
    let env = db.env();
    let approval = env.submit(r#"{"steps":[{"await_approval":true},{"output":"approved"}]}"#);
    let input = env.submit(r#"{"steps":[{"await_input":"name?"},{"output":"hi"}]}"#);
    consume(&env, 2);
    assert_eq!(env.show(&approval)["status"], "waiting_for_approval");
    assert_eq!(env.show(&input)["status"], "waiting_for_input");
    let wrong = env
        .run(&["runs", "input", &approval, "--data", r#""Ada""#])
        .fails(1)
        .to_owned();
    assert!(
        wrong.contains("is waiting_for_approval, not waiting_for_input"),
        "{wrong}"
    );
    let wrong = env.run(&["runs", "approve", &input]).fails(1).to_owned();
    assert!(
        wrong.contains("is waiting_for_input, not waiting_for_approval"),
        "{wrong}"
    );
    let out = env
        .run(&["runs", "approve", &approval, "--format", "json"])
        .json();
    assert_eq!(out, json!({"id": approval, "status": "completed"}));
    assert_eq!(env.show(&approval)["output"], "approved");

    let bad = env
        .run(&["runs", "input", &input, "--data", "{Ada"])
        .fails(2)
        .to_owned();
    assert!(bad.contains("--data: invalid JSON"), "{bad}");
    let text = env
        .run(&["runs", "input", &input, "--data", r#""Ada""#])
        .ok()
        .to_owned();
    assert!(text.contains("is completed"), "{text}");
    let run = env.show(&input);
    assert_eq!(run["output"], "hi", "{run}");
    let events: Vec<Value> = run["events"].as_array().cloned().unwrap_or_default();
    assert!(
        events
            .iter()
            .any(|e| e["kind"] == "input" && e["payload"] == "Ada"),
        "{run}"
    );
    let done = env.run(&["runs", "approve", &approval]).fails(1).to_owned();
    assert!(done.contains("is completed"), "{done}");
}

/// A `courier.run_signal` message a producer wrote to a worker's transport wakes its run there;
/// one that cannot be delivered (the run waits for another signal) goes to the failure
/// transport, saying why, without a retry.
fn a_run_signal_message_wakes_the_run_on_a_worker(db: &Db) {
    let env = db.env();
    let id = env.submit(r#"{"steps":[{"wait_signal":"paid"},{"output":"shipped"}]}"#);
    let other = env.submit(r#"{"steps":[{"wait_signal":"paid"},{"output":"shipped"}]}"#);
    consume(&env, 2);
    let raw = |run: &str, name: &str| {
        let body = json!({"run_id": run, "name": name, "data": {"amount": 42}, "by": "webhook"});
        let headers = json!({"type": "courier.run_signal", "content-type": "application/json"});
        db.sql(
            &env,
            &format!(
                "INSERT INTO courier_messages (queue_name, body, headers, priority, created_at, \
                 available_at) VALUES ('default', '{body}', '{headers}', 0, 0, 0)"
            ),
        );
    };
    raw(&id, "paid");
    consume(&env, 2);
    let run = env.show(&id);
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(
        run["steps"][0]["output"]["received"]["data"],
        json!({"amount": 42}),
        "{run}"
    );
    assert_eq!(run["steps"][0]["output"]["received"]["by"], "webhook");

    raw(&other, "refunded");
    consume(&env, 1);
    assert_eq!(env.show(&other)["status"], "waiting");
    let failed = env.run(&["failed", "show", "--format", "json"]).json();
    let failed = failed.as_array().expect("failed messages");
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0]["type"], "courier.run_signal", "{failed:?}");
    assert_eq!(
        (
            failed[0]["error_class"].as_str(),
            failed[0]["retry_count"].as_u64()
        ),
        (Some("unrecoverable"), Some(0)),
        "{failed:?}"
    );
    let error = failed[0]["error"].as_str().unwrap_or_default();
    assert!(error.contains("waits for `paid`"), "{error}");
}

macro_rules! on_every_store {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[test]
                fn $name() {
                    super::$name(&super::Db::Sqlite);
                }
            )*
        }
        #[cfg(feature = "postgres")]
        mod postgres {
            $(
                #[test]
                #[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
                fn $name() {
                    super::$name(&super::Db::postgres());
                }
            )*
        }
    };
}

on_every_store!(
    show_lists_the_journal_and_signal_wakes_the_run,
    parked_steps_are_resolved_and_a_run_is_forked,
    approve_and_input_resume_a_run_here,
    a_run_signal_message_wakes_the_run_on_a_worker,
);
