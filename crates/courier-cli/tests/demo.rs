//! `courier demo` with small numbers: a real worker process is SIGKILLed, its run is reaped once
//! and finished by another worker process, and the summary matches the store.

mod common;

use std::time::Duration;

use common::{Env, wait};
use serde_json::Value;

fn u32_of(v: &Value) -> u32 {
    v.as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .unwrap_or_else(|| panic!("not a pid: {v}"))
}

/// The pid in a worker identity (`worker:<host>:<pid>:<random>`).
fn pid_in(identity: &str) -> u32 {
    identity
        .rsplit(':')
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {identity}"))
}

#[cfg(unix)]
#[test]
fn the_demo_kills_a_worker_process_whose_run_is_reaped_once_and_finished_by_another() {
    let env = Env::empty();
    let demo = env.spawn(&["demo", "--runs", "24", "--workers", "2", "--format", "json"]);
    let demo_pid = demo.id();
    let out = wait(demo, Duration::from_secs(90));
    let s = out.json();

    // The killed worker: a child process of its own, dead of SIGKILL.
    let k = &s["killed_worker"];
    let killed = u32_of(&k["pid"]);
    let workers: Vec<u32> = s["worker_pids"]
        .as_array()
        .expect("worker_pids")
        .iter()
        .map(u32_of)
        .collect();
    assert_eq!(u32_of(&s["demo_pid"]), demo_pid, "{s}");
    assert_eq!(workers.len(), 2, "{s}");
    assert!(
        !workers.contains(&demo_pid),
        "workers are other processes: {s}"
    );
    assert!(workers.contains(&killed), "{s}");
    assert_eq!(k["signal"], 9, "the worker exited by SIGKILL: {s}");
    assert_eq!(s["workers_killed"], 1, "{s}");
    let reaper = u32_of(&k["reaped_by_pid"]);
    let finisher = u32_of(&k["finished_by_pid"]);
    assert!(reaper != killed && workers.contains(&reaper), "{s}");
    assert!(finisher != killed && workers.contains(&finisher), "{s}");
    assert_eq!(
        s["reaped"], 1,
        "one run reaped, by a worker's own reaper: {s}"
    );

    // The store agrees: claimed by the killed process, reaped once, finished by another.
    let worker_id = k["worker_id"].as_str().expect("worker_id");
    assert_eq!(pid_in(worker_id), killed);
    let run = env.show(k["run_id"].as_str().expect("run_id"));
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(k["finished_status"], "completed", "{s}");
    assert_eq!(run["requeue_count"], 1, "reaped exactly once: {run}");
    let owner = run["claimed_by"].as_str().expect("claimed_by");
    assert_ne!(owner, worker_id, "another worker finished it");
    assert_eq!(pid_in(owner), finisher, "{run}");
    // The run resumed at the step where it died: the steps the killed worker journaled were
    // replayed, not run again; every step is journaled once.
    let before = k["steps_before_kill"].as_u64().expect("steps_before_kill");
    let replayed = k["steps_replayed"].as_u64().expect("steps_replayed");
    let ran = k["steps_ran_after"].as_u64().expect("steps_ran_after");
    assert!(before >= 2, "killed mid-run: {s}");
    assert!(
        (before..10).contains(&replayed),
        "the steps journaled before the kill were replayed: {s}"
    );
    assert_eq!(replayed + ran, 10, "every step journaled once: {s}");
    assert_eq!(run["steps_replayed"], replayed, "{run}");
    // The summary adds up and matches the store.
    let completed = s["completed"].as_u64().expect("completed");
    let dead = s["dead_lettered"].as_u64().expect("dead_lettered");
    let other: u64 = s["other"]
        .as_object()
        .expect("other")
        .values()
        .filter_map(Value::as_u64)
        .sum();
    assert_eq!(completed + dead + other, 24, "{s}");
    assert_eq!(other, 0, "every run finished: {s}");
    let by_reason: u64 = s["dead_lettered_by_reason"]
        .as_object()
        .expect("reasons")
        .values()
        .filter_map(Value::as_u64)
        .sum();
    assert_eq!(by_reason, dead);
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
    let first_try = runs
        .iter()
        .filter(|r| r["status"] == "completed" && r["requeue_count"] == 0)
        .count() as u64;
    assert_eq!(first_try, s["completed_first_try"].as_u64().expect("first"));
}

#[cfg(unix)]
#[test]
fn the_demo_in_text_tells_which_worker_process_died_and_who_finished_its_run() {
    let env = Env::empty();
    let run = env.run(&["demo", "--runs", "5", "--workers", "2"]);
    let out = run.ok();
    assert!(out.contains("completed"), "{out}");
    assert!(out.contains("died of signal 9"), "{out}");
    assert!(out.lines().all(|l| l.chars().count() <= 80), "{out}");
    for said in ["killed worker", "requeued", "by worker"] {
        assert!(run.stderr.contains(said), "{said} in {}", run.stderr);
    }
}

#[test]
fn the_demo_needs_two_workers() {
    let env = Env::empty();
    let err = env.run(&["demo", "--runs", "5", "--workers", "1"]);
    assert!(err.fails(2).contains("--workers"), "{}", err.stderr);
}
