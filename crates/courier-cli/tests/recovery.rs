//! Runs whose message is gone: `reap` re-dispatches a run queued long past its due time, an
//! operator re-dispatches or requeues one with `runs requeue ID`, and `stats` says which pending
//! messages belong to runs already settled.

mod common;

use common::Env;

const SCRIPT: &str = r#"{"steps":[{"output":"done"}]}"#;

#[test]
fn reap_redispatches_a_queued_run_whose_message_was_lost() {
    let env = Env::with_config();
    let id = env.submit(SCRIPT);
    // The message is lost (a transport restarted without its data), the run stays queued.
    env.sql("DELETE FROM courier_messages");
    let report = env.run(&["reap", "--format", "json"]).json();
    assert_eq!(report["redispatched"], 0, "not overdue yet: {report}");
    let run = env.show(&id);
    assert!(
        run["due_at"].is_string(),
        "a queued run shows when it is due: {run}"
    );
    env.sql(&format!(
        "UPDATE courier_runs SET due_at = 1 WHERE id = '{id}'"
    ));
    let dry = env.run(&["reap", "--dry-run", "--format", "json"]).json();
    assert_eq!(dry["redispatched"], 1, "{dry}");
    let text = env.run(&["reap"]).ok().to_owned();
    assert!(
        text.contains(
            "Reaped 0 stale run(s): 0 requeued, 0 dead-lettered, 0 skipped, 1 re-dispatched."
        ),
        "{text}"
    );
    let stats = env.run(&["stats", "async", "--format", "json"]).json();
    assert_eq!(stats["async"], 1, "one new message: {stats}");
    env.run(&["consume", "async", "--limit", "1", "--sleep", "20ms"])
        .ok();
    let run = env.show(&id);
    assert_eq!(run["status"], "completed");
    assert!(run["due_at"].is_null(), "{run}");
}

#[test]
fn runs_requeue_redispatches_a_queued_run_and_requeues_an_expired_lease() {
    let env = Env::with_config();
    let queued = env.submit(SCRIPT);
    env.sql("DELETE FROM courier_messages");
    let out = env
        .run(&["runs", "requeue", &queued, "--format", "json"])
        .json();
    assert_eq!(out["action"], "redispatched", "{out}");
    let stats = env.run(&["stats", "async", "--format", "json"]).json();
    assert_eq!(stats["async"], 1, "{stats}");

    let stale = env.submit(SCRIPT);
    env.sql(&format!(
        "UPDATE courier_runs SET status = 'running', claimed_by = 'worker:gone:1:0', \
         lease_expires = 4102444800000 WHERE id = '{stale}'"
    ));
    let refused = env.run(&["runs", "requeue", &stale]).fails(1).to_owned();
    assert!(
        refused.contains("was not requeued") && refused.contains("live lease"),
        "{refused}"
    );
    env.sql(&format!(
        "UPDATE courier_runs SET lease_expires = 1 WHERE id = '{stale}'"
    ));
    let text = env.run(&["runs", "requeue", &stale]).ok().to_owned();
    assert!(text.contains("Requeued run"), "{text}");
    let run = env.show(&stale);
    assert_eq!(
        (run["status"].as_str(), run["requeue_count"].as_u64()),
        (Some("queued"), Some(1))
    );

    env.run(&[
        "consume",
        "async",
        "--limit",
        "3",
        "--sleep",
        "20ms",
        "--time-limit",
        "20s",
    ])
    .ok();
    for id in [&queued, &stale] {
        assert_eq!(env.show(id)["status"], "completed", "{id}");
    }
    let refused = env.run(&["runs", "requeue", &queued]).fails(1).to_owned();
    assert!(refused.contains("it is completed"), "{refused}");
    env.run(&["runs", "requeue", "6f1c1c1e-0000-4000-8000-000000000000"])
        .fails(1);
    env.run(&["runs", "requeue", "nope"]).fails(2);
}

#[test]
fn stats_says_which_pending_messages_belong_to_settled_runs() {
    let env = Env::with_config();
    let id = env.submit(SCRIPT);
    env.submit(SCRIPT);
    env.run(&["runs", "cancel", &id]).ok();
    let out = env.run(&["stats", "--format", "json"]);
    let counts: serde_json::Value = out.json();
    assert_eq!(counts["async"], 2, "the JSON keeps its shape: {counts}");
    assert_eq!(
        counts.as_object().map(|o| o.len()),
        Some(2),
        "one key per transport: {counts}"
    );
    assert!(
        out.stderr.contains(
            "1 message(s) counted in `async` are RunAgent messages of runs already settled"
        ),
        "{}",
        out.stderr
    );
}
