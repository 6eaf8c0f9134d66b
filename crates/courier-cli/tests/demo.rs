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

/// `courier demo --agent llm`: LLM agent runs against the in-process test server; a worker
/// process is SIGKILLed in the long run's slow tool; the server's own call counter agrees with
/// the journal: every call it answered 200 is one model step journaled (none ran twice), and
/// after the kill it got no call for a model step finished before it.
#[cfg(all(unix, feature = "agent"))]
#[test]
fn the_llm_demo_resumes_the_killed_run_without_calling_the_model_again_for_finished_steps() {
    let env = Env::empty();
    let demo = env.spawn(&[
        "demo",
        "--agent",
        "llm",
        "--runs",
        "8",
        "--workers",
        "2",
        "--format",
        "json",
    ]);
    let out = wait(demo, Duration::from_secs(110));
    let s = out.json();
    let num = |v: &Value| {
        v.as_u64()
            .unwrap_or_else(|| panic!("not a number: {v} in {s}"))
    };
    assert_eq!(s["agent"], "llm", "{s}");
    assert_eq!(num(&s["runs"]), 8);
    assert_eq!(num(&s["completed"]), 8, "every run completed: {s}");

    // The crash: a worker process died of SIGKILL; another reaped and finished its run.
    let k = &s["killed_worker"];
    let killed = u32_of(&k["pid"]);
    assert_eq!(k["signal"], 9, "{s}");
    assert_eq!(k["finished_status"], "completed", "{s}");
    assert_ne!(u32_of(&k["finished_by_pid"]), killed, "{s}");
    let run = env.show(k["run_id"].as_str().expect("run_id"));
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(run["requeue_count"], 1, "reaped once: {run}");
    assert_eq!(run["steps_replayed"], k["steps_replayed"], "{run}");

    // The killed run, from the server's record: before the kill, one call per finished model
    // step; after it, one call per model step that ran after the resume, none for a step the
    // killed worker had finished (those were replayed from the journal).
    let kr = &s["killed_run"];
    let before = num(&kr["model_steps_before_kill"]);
    assert!(before >= 2, "killed after its second model call: {s}");
    assert_eq!(num(&kr["server_calls_before_kill"]), before, "{s}");
    assert_eq!(num(&kr["calls_again_for_finished_steps"]), 0, "{s}");
    let after = num(&kr["model_steps_ran_after"]);
    assert!(after >= 1, "{s}");
    assert_eq!(num(&kr["server_calls_after_kill"]), after, "{s}");
    let model_steps = |run: &Value| {
        run["steps"]
            .as_array()
            .expect("steps")
            .iter()
            .filter(|st| st["name"] == "model")
            .count() as u64
    };
    assert_eq!(model_steps(&run), before + after, "{run}");
    assert!(
        num(&k["steps_replayed"]) >= before,
        "the finished model steps were replayed: {s}"
    );

    // All runs: the server's 200 answers are the model steps journaled in the store (read back
    // run by run here), each once; the scripted failures were seen and the fallback answered.
    let runs = env
        .run(&["runs", "list", "--limit", "100", "--format", "json"])
        .json();
    let journaled: u64 = runs
        .as_array()
        .expect("array")
        .iter()
        .map(|r| model_steps(&env.show(r["id"].as_str().expect("id"))))
        .sum();
    assert_eq!(num(&s["model_steps_journaled"]), journaled, "{s}");
    let server = &s["server"];
    assert_eq!(num(&server["answered"]), journaled, "{s}");
    assert_eq!(num(&server["by_status"]["200"]), journaled, "{s}");
    let by_status: u64 = server["by_status"]
        .as_object()
        .expect("by_status")
        .values()
        .map(num)
        .sum();
    assert_eq!(by_status, num(&server["calls"]), "{s}");
    assert!(
        num(&server["by_status"]["429"]) >= 2,
        "a 429 from both providers: {s}"
    );
    assert!(num(&server["by_status"]["503"]) >= 1, "{s}");
    assert!(num(&s["runs_answered_by_fallback"]) >= 1, "{s}");
    assert!(
        num(&s["requeued"]) >= 2,
        "the 429 runs and the killed one: {s}"
    );
    let providers: Vec<&str> = s["breakers"]
        .as_array()
        .expect("breakers")
        .iter()
        .filter_map(|b| b["provider"].as_str())
        .collect();
    assert_eq!(providers, ["fallback", "primary"], "{s}");
}
