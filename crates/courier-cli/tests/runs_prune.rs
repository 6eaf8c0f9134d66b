//! `courier runs prune --older-than AGE [--status ...]`: finished runs older than AGE go, with
//! their events and steps; newer ones, other statuses and unfinished runs stay; a status that
//! is not a finished one is refused.

mod common;

use std::time::Duration;

use common::{Env, block_on};

fn interactive(env: &Env, input: &str) -> String {
    let out = env
        .run(&[
            "runs",
            "submit",
            "scripted",
            "--input",
            input,
            "--interactive",
            "--format",
            "json",
        ])
        .json();
    out["id"].as_str().expect("id").to_owned()
}

/// One number read from `courier.db`.
fn scalar(env: &Env, statement: &str) -> i64 {
    let db = env.path("courier.db");
    block_on(async move {
        use sqlx::ConnectOptions;
        let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&db)
            .busy_timeout(Duration::from_secs(10))
            .connect()
            .await
            .expect("open courier.db");
        let (n,): (i64,) = sqlx::query_as(statement)
            .fetch_one(&mut conn)
            .await
            .expect("sql");
        n
    })
}

#[test]
fn prune_deletes_old_finished_runs_with_their_events_and_steps() {
    let env = Env::with_config();
    let script = r#"{"steps":[{"step":"a"},{"step":"b"},{"output":"done"}]}"#;
    let old: Vec<String> = (0..3).map(|_| interactive(&env, script)).collect();
    let recent = interactive(&env, script);
    let queued = env.submit(script);
    let list = old
        .iter()
        .map(|id| format!("'{id}'"))
        .collect::<Vec<_>>()
        .join(", ");
    env.sql(&format!(
        "UPDATE courier_runs SET finished_at = 1000 WHERE id IN ({list})"
    ));
    assert_eq!(
        scalar(
            &env,
            &format!("SELECT COUNT(*) FROM courier_runs_steps WHERE run_id IN ({list})")
        ),
        6
    );

    // Not a finished status: refused, nothing deleted.
    let refused = env.run(&["runs", "prune", "--older-than", "30d", "--status", "queued"]);
    assert!(refused.fails(2).contains("queued"), "{}", refused.fails(2));
    // Other statuses only: none of these goes.
    let none = env
        .run(&[
            "runs",
            "prune",
            "--older-than",
            "30d",
            "--status",
            "failed,cancelled",
            "--format",
            "json",
        ])
        .json();
    assert_eq!(none["deleted"], 0, "{none}");

    let out = env
        .run(&[
            "runs",
            "prune",
            "--older-than",
            "30d",
            "--batch",
            "2",
            "--format",
            "json",
        ])
        .json();
    assert_eq!(out["deleted"], 3, "in two batches: {out}");
    for id in &old {
        env.run(&["runs", "show", id]).fails(1);
    }
    for table in ["courier_runs_steps", "courier_run_events"] {
        assert_eq!(
            scalar(
                &env,
                &format!("SELECT COUNT(*) FROM {table} WHERE run_id IN ({list})")
            ),
            0,
            "{table} of the pruned runs"
        );
    }
    let run = env.show(&recent);
    assert_eq!(run["status"], "completed", "a recent run stays: {run}");
    assert_eq!(
        scalar(
            &env,
            &format!("SELECT COUNT(*) FROM courier_runs_steps WHERE run_id = '{recent}'")
        ),
        2,
        "with its steps"
    );
    assert_eq!(
        env.show(&queued)["status"],
        "queued",
        "an unfinished run stays"
    );
    let text = env.run(&["runs", "prune", "--older-than", "1h"]);
    assert!(text.ok().contains("Deleted 0 run(s)"), "{}", text.ok());
}
