//! SIGTERM in the middle of a slow message: it finishes, is acked, and the process exits 0.

#![cfg(unix)]

mod common;

use std::time::{Duration, Instant};

use common::{Env, eventually, signal, wait};

#[test]
fn sigterm_lets_the_slow_message_finish_and_exits_zero() {
    let env = Env::with_config();
    let id = env.submit(r#"{"steps":[{"sleep_ms":10},{"sleep_ms":1500},{"output":"finished"}]}"#);
    let child = env.spawn(&["consume", "--sleep", "20ms", "--grace", "10s"]);
    eventually("the run to start", || env.show(&id)["status"] == "running");
    let sent = Instant::now();
    signal(&child, "TERM");
    let out = wait(child, Duration::from_secs(20));
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        sent.elapsed() < Duration::from_secs(10),
        "exited within the grace period"
    );
    let run = env.show(&id);
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(run["output"], "finished");
    let stats = env.run(&["stats", "async", "--format", "json"]).json();
    assert_eq!(stats["async"], 0, "the message was acked");
}

#[test]
fn past_the_grace_period_the_message_is_left_for_redelivery_and_the_exit_is_still_zero() {
    let env = Env::with_config();
    let id = env.submit(r#"{"steps":[{"sleep_ms":10},{"hang_ms":30000},{"output":"late"}]}"#);
    let child = env.spawn(&["consume", "--sleep", "20ms", "--grace", "300ms"]);
    eventually("the run to start", || env.show(&id)["status"] == "running");
    signal(&child, "INT");
    let out = wait(child, Duration::from_secs(15));
    assert_eq!(out.code, 0, "{}", out.stderr);
    let stats = env.run(&["stats", "async", "--format", "json"]).json();
    assert_eq!(stats["async"], 1, "the message stays for redelivery");
}

#[test]
fn a_second_signal_exits_at_once_and_says_what_it_leaves_for_redelivery() {
    let env = Env::with_config();
    let id = env.submit(r#"{"steps":[{"sleep_ms":10},{"hang_ms":30000},{"output":"late"}]}"#);
    let child = env.spawn(&["consume", "--sleep", "20ms", "--grace", "30s"]);
    eventually("the run to start", || env.show(&id)["status"] == "running");
    signal(&child, "INT");
    std::thread::sleep(Duration::from_millis(300));
    let sent = Instant::now();
    signal(&child, "TERM");
    let out = wait(child, Duration::from_secs(15));
    assert_eq!(out.code, 130, "{}", out.stderr);
    assert!(sent.elapsed() < Duration::from_secs(5), "exited at once");
    assert!(
        out.stderr
            .contains("1 in-flight message(s) left for redelivery"),
        "{}",
        out.stderr
    );
    let stats = env.run(&["stats", "async", "--format", "json"]).json();
    assert_eq!(stats["async"], 1, "the message stays for redelivery");
}
