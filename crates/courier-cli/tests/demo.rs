//! `courier demo` with small numbers: the summary adds up and matches the store.

mod common;

use common::Env;

#[test]
fn the_demo_summary_adds_up_to_the_runs_submitted_and_matches_the_store() {
    let env = Env::empty();
    let s = env
        .run(&["demo", "--runs", "24", "--workers", "2", "--format", "json"])
        .json();
    let completed = s["completed"].as_u64().expect("completed");
    let dead = s["dead_lettered"].as_u64().expect("dead_lettered");
    let other: u64 = s["other"]
        .as_object()
        .expect("other")
        .values()
        .filter_map(serde_json::Value::as_u64)
        .sum();
    assert_eq!(completed + dead + other, 24, "{s}");
    assert_eq!(other, 0, "every run finished: {s}");
    let by_reason: u64 = s["dead_lettered_by_reason"]
        .as_object()
        .expect("reasons")
        .values()
        .filter_map(serde_json::Value::as_u64)
        .sum();
    assert_eq!(by_reason, dead);
    assert_eq!(s["reaped"], 1, "the killed worker's run was reaped: {s}");
    assert_eq!(s["workers_killed"], 1);
    assert!(s["requeued"].as_u64().expect("requeued") >= 1);
    for reason in [
        "not_retryable (auth)",
        "not_retryable (client_error)",
        "retries_exhausted (server_error)",
    ] {
        assert!(
            s["dead_lettered_by_reason"].get(reason).is_some(),
            "{reason} in {s}"
        );
    }

    let runs = env
        .run(&["runs", "list", "--limit", "1000", "--format", "json"])
        .json();
    let runs = runs.as_array().expect("array");
    assert_eq!(runs.len(), 24);
    let count = |status: &str| runs.iter().filter(|r| r["status"] == status).count() as u64;
    assert_eq!(count("completed"), completed);
    assert_eq!(count("failed"), dead);
    let requeued: u64 = runs
        .iter()
        .filter_map(|r| r["requeue_count"].as_u64())
        .sum();
    assert_eq!(requeued, s["requeued"].as_u64().expect("requeued"));

    let text = env.run(&["demo", "--runs", "5", "--workers", "1"]);
    let out = text.ok();
    assert!(
        out.contains("completed") && out.lines().all(|l| l.chars().count() <= 80),
        "{out}"
    );
}
