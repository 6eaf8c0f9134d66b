//! `rate_limit = { limit = 50, interval = "1s" }` on a transport, with 4 `courier consume`
//! processes sharing its bucket on PostgreSQL and on Redis: over 20 s they handle at most
//! 1,000 messages (+2 %) together, and at least 800 (the flow goes on). The messages are of a
//! type no handler decodes: each worker moves each to the failure transport, whose count says
//! how many were handled.

#![cfg(all(feature = "postgres", feature = "redis"))]

mod common;

use std::process::Child;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Env, RedisKeys, block_on, service_url, signal, unique, wait};
use courier_core::config::Config;
use courier_core::{Encoded, MessageRegistry, TYPE_HEADER, TransportRegistry};

/// Worker processes, killed if the test fails before stopping them.
struct Workers(Vec<Child>);

impl Drop for Workers {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Sends `n` undecodable messages to transport `a` of `config`, in batches.
fn send(config: &str, n: usize) {
    block_on(async {
        let config: Config = config.parse().unwrap_or_else(|e| panic!("config: {e}"));
        let factories = TransportRegistry::new()
            .with(Arc::new(courier_sql::SqlTransportFactory))
            .with(Arc::new(courier_redis::RedisTransportFactory));
        let registry = Arc::new(MessageRegistry::new());
        let transports = tokio::time::timeout(
            Duration::from_secs(10),
            config.connect(&factories, registry.clone()),
        )
        .await
        .unwrap_or_else(|_| panic!("connecting timed out"))
        .unwrap_or_else(|e| panic!("connect: {e}"));
        let a = transports.get("a").unwrap_or_else(|| panic!("transport a"));
        let envelopes: Vec<_> = (0..n)
            .map(|i| {
                registry.decode(
                    Encoded::new(format!("{{\"n\":{i}}}")).header(TYPE_HEADER, "test.limited"),
                )
            })
            .collect();
        for chunk in envelopes.chunks(250) {
            tokio::time::timeout(Duration::from_secs(30), a.send_batch(chunk.to_vec()))
                .await
                .unwrap_or_else(|_| panic!("send timed out"))
                .unwrap_or_else(|e| panic!("send: {e}"));
        }
    });
}

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
    send(&text, 1_500);
    assert_eq!(count(&env, "a"), 1_500);
    let started = Instant::now();
    let mut workers = Workers(
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
    let handled = count(&env, "failed");
    assert!(
        handled <= 1_020,
        "at most 1,000 (+2 %) in 20 s at 50/s: {handled}"
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
    let url = service_url("COURIER_TEST_POSTGRES_URL");
    let sep = if url.contains('?') { '&' } else { '?' };
    let base = format!("{url}{sep}table_name={}_messages", unique("cli_limit"));
    four_workers_stay_under_the_shared_limit(
        &format!("{base}&queue_name=a"),
        &format!("{base}&queue_name=failed"),
    );
}

#[test]
#[ignore = "needs redis: set COURIER_TEST_REDIS_URL"]
fn redis_four_workers_handle_at_most_the_shared_rate() {
    let url = service_url("COURIER_TEST_REDIS_URL");
    let sep = if url.contains('?') { '&' } else { '?' };
    let name = unique("cli_limit");
    let _keys = RedisKeys {
        url: url.clone(),
        keys: ["a", "failed"]
            .iter()
            .flat_map(|q| {
                let s = format!("{name}_{q}");
                [
                    s.clone(),
                    format!("{s}:limit"),
                    format!("{s}:paused"),
                    format!("{s}:delayed"),
                    format!("{s}:delayed:data"),
                ]
            })
            .chain([format!("{name}:workers"), format!("{name}:workers:stop")])
            .collect(),
    };
    let dsn = |q: &str| format!("{url}{sep}stream={name}_{q}&group={name}");
    four_workers_stay_under_the_shared_limit(&dsn("a"), &dsn("failed"));
}
