//! `courier pause` / `courier resume` with a real `consume` process on PostgreSQL and Redis: a
//! paused queue's worker fetches nothing for 5 s while messages sent to another queue of the
//! same worker all along keep flowing, and resume restores the flow. Messages are sent with the
//! library (an undecodable type: the worker moves each to the failure transport, so its queue's
//! count shows what was fetched, and the failure transport's what was handled).

#![cfg(all(feature = "postgres", feature = "redis"))]

mod common;

use std::process::Child;
use std::time::{Duration, Instant};

use common::{Env, eventually, redis_streams, send_unknown, sql_queues};

struct Worker(Child);

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        if std::thread::panicking()
            && let Some(mut err) = self.0.stderr.take()
        {
            let mut text = String::new();
            let _ = std::io::Read::read_to_string(&mut err, &mut text);
            eprintln!("worker stderr:\n{text}");
        }
    }
}

fn counts(env: &Env) -> (u64, u64) {
    let (a, b, _) = all_counts(env);
    (a, b)
}

/// The depths of `a`, `b` and `failed` (where every handled message ends).
fn all_counts(env: &Env) -> (u64, u64, u64) {
    let out = env
        .run(&[
            "--config", "c.toml", "stats", "a", "b", "failed", "--format", "json",
        ])
        .json();
    let n = |k: &str| {
        out[k]
            .as_u64()
            .unwrap_or_else(|| panic!("a count for `{k}`: {out}"))
    };
    (n("a"), n("b"), n("failed"))
}

/// Transports `a` and `b` (consumed) and `failed` (their failure transport) on `a`, `b`,
/// `failed`.
fn paused_queue_fetches_nothing_while_another_flows(a: &str, b: &str, failed: &str) {
    let text = format!(
        "failure_transport = \"failed\"\n\n[transports.a]\ndsn = \"{a}\"\n\n\
         [transports.b]\ndsn = \"{b}\"\n\n[transports.failed]\ndsn = \"{failed}\"\n"
    );
    let env = Env::empty();
    env.write("c.toml", &text);
    env.run(&["--config", "c.toml", "setup"]).ok();
    let paused = env
        .run(&["--config", "c.toml", "pause", "a", "--format", "json"])
        .json();
    assert_eq!(
        paused,
        serde_json::json!({ "transport": "a", "paused": true, "changed": true })
    );
    let _worker = Worker(env.spawn(&[
        "--quiet", "--config", "c.toml", "consume", "a", "b", "--sleep", "50ms",
    ]));
    send_unknown(&text, "b", "test.ping", 5);
    eventually("the worker to be up and consuming b", || {
        counts(&env).1 == 0
    });
    send_unknown(&text, "a", "test.ping", 10);
    send_unknown(&text, "b", "test.ping", 10);
    eventually("b to keep flowing", || counts(&env).1 == 0);
    // For 5 s: nothing is fetched from `a`, while messages sent to `b` all along are handled.
    let watched = Instant::now();
    let mut sent_to_b = 15;
    while watched.elapsed() < Duration::from_secs(5) {
        send_unknown(&text, "b", "test.ping", 2);
        sent_to_b += 2;
        eventually("b to keep flowing while a is paused", || {
            counts(&env).1 == 0
        });
        assert_eq!(counts(&env).0, 10, "nothing fetched from the paused queue");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (a_left, b_left, handled) = all_counts(&env);
    assert_eq!(
        (a_left, b_left, handled),
        (10, 0, sent_to_b),
        "after {:?}: every message of b handled, none of a",
        watched.elapsed()
    );
    let resumed = env
        .run(&["--config", "c.toml", "resume", "a", "--format", "json"])
        .json();
    assert_eq!(resumed["changed"], true, "{resumed}");
    let started = Instant::now();
    eventually("a to flow again", || counts(&env).0 == 0);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "resumed within a second or so: {:?}",
        started.elapsed()
    );
    let again = env
        .run(&["--config", "c.toml", "resume", "a", "--format", "json"])
        .json();
    assert_eq!(again["changed"], false, "{again}");

    // Paused under a running worker: within a second it fetches nothing more.
    env.run(&["--config", "c.toml", "pause", "a"]).ok();
    std::thread::sleep(Duration::from_secs(1));
    send_unknown(&text, "a", "test.ping", 5);
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_secs(1) {
        assert_eq!(counts(&env).0, 5, "paused within a second");
        std::thread::sleep(Duration::from_millis(100));
    }
    env.run(&["--config", "c.toml", "resume", "a"]).ok();
    eventually("a to flow after the second resume", || counts(&env).0 == 0);
}

#[test]
#[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
fn postgres_a_paused_queue_fetches_nothing_while_another_flows() {
    let dsn = sql_queues("COURIER_TEST_POSTGRES_URL", "cli_pause");
    paused_queue_fetches_nothing_while_another_flows(&dsn("a"), &dsn("b"), &dsn("failed"));
}

#[test]
#[ignore = "needs redis: set COURIER_TEST_REDIS_URL"]
fn redis_a_paused_stream_fetches_nothing_while_another_flows() {
    let (_keys, dsn) = redis_streams("cli_pause", &["a", "b", "failed"]);
    paused_queue_fetches_nothing_while_another_flows(&dsn("a"), &dsn("b"), &dsn("failed"));
}
