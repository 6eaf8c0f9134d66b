//! `courier pause` / `courier resume` with a real `consume` process on PostgreSQL: a paused
//! queue's worker fetches nothing for 3 s while another queue of the same worker keeps flowing,
//! and resume restores the flow. Messages are sent with the library (an undecodable type: the
//! worker moves each to the failure transport, so its queue's count shows what was fetched).

#![cfg(feature = "postgres")]

mod common;

use std::process::Child;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Env, block_on, eventually};
use courier_core::{Dsn, Encoded, MessageRegistry, TYPE_HEADER, Transport};

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
    let out = env
        .run(&["--config", "c.toml", "stats", "a", "b", "--format", "json"])
        .json();
    let n = |k: &str| {
        out[k]
            .as_u64()
            .unwrap_or_else(|| panic!("a count for `{k}`: {out}"))
    };
    (n("a"), n("b"))
}

fn send(dsn: &str, n: usize) {
    block_on(async {
        let dsn = Dsn::parse(dsn).unwrap_or_else(|e| panic!("dsn: {e}"));
        let registry = Arc::new(MessageRegistry::new());
        let connect = courier_sql::SqlTransport::connect("t", &dsn, registry.clone());
        let transport = tokio::time::timeout(Duration::from_secs(10), connect)
            .await
            .unwrap_or_else(|_| panic!("connecting timed out"))
            .unwrap_or_else(|e| panic!("connect: {e}"));
        for i in 0..n {
            let envelope = registry
                .decode(Encoded::new(format!("{{\"n\":{i}}}")).header(TYPE_HEADER, "test.ping"));
            tokio::time::timeout(Duration::from_secs(10), transport.send(envelope))
                .await
                .unwrap_or_else(|_| panic!("send timed out"))
                .unwrap_or_else(|e| panic!("send: {e}"));
        }
    });
}

#[test]
#[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
fn a_paused_queue_fetches_nothing_while_another_flows_and_resume_restores_it() {
    let url = std::env::var("COURIER_TEST_POSTGRES_URL").unwrap_or_else(|_| {
        panic!("set COURIER_TEST_POSTGRES_URL (scripts/services prints it), e.g. postgres://postgres@127.0.0.1:5432/test")
    });
    let table = format!(
        "cli_pause_{}_{:08x}_messages",
        std::process::id(),
        fastrand::u32(..)
    );
    let sep = if url.contains('?') { '&' } else { '?' };
    let a = format!("{url}{sep}table_name={table}&queue_name=a");
    let b = format!("{url}{sep}table_name={table}&queue_name=b");
    let failed = format!("{url}{sep}table_name={table}&queue_name=failed");
    let env = Env::empty();
    env.write(
        "c.toml",
        &format!(
            "failure_transport = \"failed\"\n\n[transports.a]\ndsn = \"{a}\"\n\n\
             [transports.b]\ndsn = \"{b}\"\n\n[transports.failed]\ndsn = \"{failed}\"\n"
        ),
    );
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
    send(&b, 5);
    eventually("the worker to be up and consuming b", || {
        counts(&env).1 == 0
    });
    send(&a, 10);
    send(&b, 10);
    eventually("b to keep flowing", || counts(&env).1 == 0);
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_secs(3) {
        assert_eq!(counts(&env).0, 10, "nothing fetched from the paused queue");
        std::thread::sleep(Duration::from_millis(100));
    }
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
    send(&a, 5);
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_secs(1) {
        assert_eq!(counts(&env).0, 5, "paused within a second");
        std::thread::sleep(Duration::from_millis(100));
    }
    env.run(&["--config", "c.toml", "resume", "a"]).ok();
    eventually("a to flow after the second resume", || counts(&env).0 == 0);
}
