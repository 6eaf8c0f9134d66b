//! `rate_limit = { limit = 50, interval = "1s" }` on a transport, with 4 `courier consume`
//! processes sharing its bucket on PostgreSQL and on Redis, for 20 s: together they handle at
//! most the bucket's burst (5) and 50 a second for as long as any of them ran (+2 %: from their
//! start until the last one has stopped, which on a loaded machine is well past 20 s), and at
//! least 800 (the flow goes on). The messages are of a type no handler decodes: each worker
//! moves each to the failure transport, whose count says how many were handled.

#![cfg(all(feature = "postgres", feature = "redis"))]

mod common;

use std::time::{Duration, Instant};

use common::{Children, Env, redis_streams, send_unknown, signal, sql_queues, wait};

fn count(env: &Env, name: &str) -> u64 {
    let out = env
        .run(&["--config", "c.toml", "stats", name, "--format", "json"])
        .json();
    out[name]
        .as_u64()
        .unwrap_or_else(|| panic!("a count for `{name}`: {out}"))
}

/// Transport `a` (limited, consumed by 4 processes) and `failed` (its failure transport).
fn four_workers_stay_under_the_shared_limit(a: &str, failed: &str) {
    let text = format!(
        "failure_transport = \"failed\"\n\n[transports.a]\ndsn = \"{a}\"\n\
         rate_limit = {{ limit = 50, interval = \"1s\" }}\n\n\
         [transports.failed]\ndsn = \"{failed}\"\n"
    );
    let env = Env::empty();
    env.write("c.toml", &text);
    env.run(&["--config", "c.toml", "setup"]).ok();
    send_unknown(&text, "a", "test.limited", 1_500);
    assert_eq!(count(&env, "a"), 1_500);
    let started = Instant::now();
    let mut workers = Children(
        (0..4)
            .map(|_| env.spawn(&["--quiet", "--config", "c.toml", "consume", "a"]))
            .collect(),
    );
    while started.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(100));
    }
    for child in &workers.0 {
        signal(child, "TERM");
    }
    for child in std::mem::take(&mut workers.0) {
        let run = wait(child, Duration::from_secs(30));
        assert_eq!(run.code, 0, "a worker stopped cleanly: {}", run.stderr);
    }
    // No token can be taken before the workers started or after the last one stopped.
    let ran = started.elapsed().as_secs_f64();
    let most = (5.0 + 50.0 * ran) * 1.02;
    let handled = count(&env, "failed");
    assert!(
        handled as f64 <= most,
        "at most 5 + 50/s over the {ran:.2} s the workers ran (+2 %), {most:.0}: {handled}"
    );
    assert!(handled >= 800, "the messages kept flowing: {handled}");
    assert_eq!(
        count(&env, "a") + handled,
        1_500,
        "nothing lost: what was not handled is still queued"
    );
}

#[test]
#[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
fn postgres_four_workers_handle_at_most_the_shared_rate() {
    let dsn = sql_queues("COURIER_TEST_POSTGRES_URL", "cli_limit");
    four_workers_stay_under_the_shared_limit(&dsn("a"), &dsn("failed"));
}

#[test]
#[ignore = "needs redis: set COURIER_TEST_REDIS_URL"]
fn redis_four_workers_handle_at_most_the_shared_rate() {
    let (_keys, dsn) = redis_streams("cli_limit", &["a", "failed"]);
    four_workers_stay_under_the_shared_limit(&dsn("a"), &dsn("failed"));
}
