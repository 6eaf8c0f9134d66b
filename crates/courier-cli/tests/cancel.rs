//! Stopping a running agent from outside its worker: `runs cancel` from another process reaches
//! an agent that never checkpoints, and `runs.step_timeout` cancels a step that runs too long.

mod common;

use std::time::{Duration, Instant};

use common::{CONFIG, Env, eventually, wait};

const HANG: &str = r#"{"steps":[{"hang_ms":600000},{"output":"never"}]}"#;

#[test]
fn runs_cancel_from_another_process_stops_a_running_agent_that_never_checkpoints() {
    let env = Env::with_config();
    let hung = env.submit(HANG);
    // One handler at a time: the quick run behind it can only run once the hung agent stopped.
    let worker = env.spawn(&["consume", "async", "--concurrency", "1", "--sleep", "20ms"]);
    eventually("the hung run to be running", || {
        env.show(&hung)["status"] == "running"
    });
    let quick = env.submit(r#"{"steps":[{"output":"after"}]}"#);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(env.show(&quick)["status"], "queued", "the worker is busy");

    let out = env
        .run(&["runs", "cancel", &hung, "--format", "json"])
        .json();
    let cancelled_at = Instant::now();
    assert_eq!(out["cancelled"], true, "{out}");
    eventually("the queued run to complete on the freed worker", || {
        env.show(&quick)["status"] == "completed"
    });
    assert!(
        cancelled_at.elapsed() < Duration::from_secs(5),
        "the worker was freed {:?} after the cancel",
        cancelled_at.elapsed()
    );
    let run = env.show(&hung);
    assert_eq!(
        (run["status"].as_str(), run["termination_reason"].as_str()),
        (Some("cancelled"), Some("cancelled")),
        "{run}"
    );

    // Nothing left in flight: a SIGTERM stops the worker at once, well inside the grace.
    let stopped = Instant::now();
    let pid = worker.id().to_string();
    std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    let done = wait(worker, Duration::from_secs(30));
    assert_eq!(done.code, 0, "stderr: {}", done.stderr);
    assert!(stopped.elapsed() < Duration::from_secs(10));
}

#[test]
fn a_step_past_runs_step_timeout_is_cancelled_and_counts_as_a_retryable_timeout() {
    let env = Env::empty();
    let config = CONFIG.replace(
        "[runs]\n",
        "[runs]\nlease = \"5s\"\nstep_timeout = \"1s\"\nmax_requeues = 0\n",
    );
    env.write("courier.toml", &config);
    let id = env.submit(HANG);
    let started = Instant::now();
    env.run(&["consume", "async", "--limit", "1", "--sleep", "20ms"])
        .ok();
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the hang was cut short"
    );
    let run = env.show(&id);
    assert_eq!(
        (
            run["status"].as_str(),
            run["termination_reason"].as_str(),
            run["error_class"].as_str()
        ),
        (
            Some("failed"),
            Some("retries_exhausted"),
            Some("connection")
        ),
        "retryable, with no requeue left: {run}"
    );
}
