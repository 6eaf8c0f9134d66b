//! A transport server that stops answering for longer than the lease does not cost a run its
//! lease: the worker's acks wait beside the handlers, so the run's heartbeats (to its own store)
//! go on, the reaper finds nothing stale, and the run is not run twice.
//!
//! The transport is a private `redis-server` on a free loopback port, frozen with SIGSTOP and
//! thawed with SIGCONT (the shared server on 6379 is never touched); the run store is SQLite.
#![allow(clippy::unwrap_used, missing_docs)]
#![cfg(all(unix, feature = "sqlite"))]

mod support;

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use courier_core::{MessageBus, MessageRegistry, Worker};
use courier_redis::{RedisOptions, RedisTransport};
use courier_runs::{
    ReapOptions, RunAgent, RunStatus, RunStore, Runtime, RuntimeOptions, ScriptedAgent,
    SqlRunStore, SqlRunStoreOptions,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// A `redis-server` of this test's own, killed on drop.
struct PrivateRedis {
    child: Child,
    port: u16,
    _dir: support::TempDir,
}

impl PrivateRedis {
    fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = support::TempDir::new();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", ""])
            .arg("--dir")
            .arg(&dir.0)
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("this test starts its own redis-server and could not ({e}): install it with scripts/services (Debian package redis-server)")
            });
        let server = Self {
            child,
            port,
            _dir: dir,
        };
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return server;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("the private redis-server did not listen on port {port} within 5 s");
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill {signal} the private redis-server");
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.signal("-CONT");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the redis-server binary: run via scripts/test (scripts/services installs it)"]
async fn a_transport_stalled_past_the_lease_does_not_cost_a_running_run_its_lease() {
    let redis = PrivateRedis::start();
    let dir = support::TempDir::new();
    let store = SqlRunStore::connect(
        &format!("sqlite://{}", dir.0.join("runs.db").display()),
        SqlRunStoreOptions::default(),
    )
    .await
    .unwrap();
    store.setup().await.unwrap();
    let mut registry = MessageRegistry::new();
    registry.register::<RunAgent>();
    let queue = Arc::new(
        RedisTransport::connect(
            &redis.url(),
            RedisOptions::default()
                .name("async")
                .stream("stall")
                .poll_window(Duration::from_millis(100)),
            Arc::new(registry),
        )
        .await
        .unwrap(),
    );
    let lease = Duration::from_secs(2);
    let runtime = Runtime::builder(Arc::new(store.clone()))
        .agent("scripted", ScriptedAgent)
        .options(RuntimeOptions {
            lease,
            lease_check_every: Some(Duration::from_millis(500)),
            ..RuntimeOptions::default()
        })
        .build();
    let bus = runtime
        .register(
            MessageBus::builder()
                .transport("async", queue.clone())
                .route("courier.run_agent", ["async"]),
        )
        .build();

    // A short run whose ack will meet the frozen server, and a long one that must keep its
    // lease all the while.
    let short = runtime
        .enqueue(
            "scripted",
            json!({"steps": [{"sleep_ms": 1000}, {"output": "short"}]}),
        )
        .await
        .unwrap();
    let long_steps: Vec<_> = (0..40)
        .map(|_| json!({"sleep_ms": 200}))
        .chain([json!({"output": "long"})])
        .collect();
    let long = runtime
        .enqueue("scripted", json!({ "steps": long_steps }))
        .await
        .unwrap();

    let token = CancellationToken::new();
    let worker = Worker::builder(bus)
        .receiver("async", queue.clone())
        .concurrency(2)
        .fetch_size(2)
        .build();
    let consuming = tokio::spawn(worker.run(token.clone()));
    tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let mut both_running = true;
            for id in [short, long] {
                let run = store.find(id).await.unwrap().unwrap();
                both_running &= run.status == RunStatus::Running;
            }
            if both_running {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("both runs started");

    redis.signal("-STOP");
    let reaper = runtime.reaper();
    let frozen_for = lease * 3;
    let until = tokio::time::Instant::now() + frozen_for;
    while tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(250)).await;
        // The reaper's dispatch would wait on the frozen server too: bound it; a stale run would
        // show as selected (or as this timeout) either way.
        let report =
            tokio::time::timeout(Duration::from_secs(1), reaper.reap(ReapOptions::default()))
                .await
                .expect(
                    "the reaper found a stale run and waited on the frozen server to requeue it",
                )
                .unwrap();
        assert_eq!(
            report.selected, 0,
            "no run went stale while the transport was frozen"
        );
    }
    assert_eq!(
        store.find(short).await.unwrap().unwrap().status,
        RunStatus::Completed,
        "the short run finished during the stall (its ack is what waits)"
    );
    redis.signal("-CONT");

    tokio::time::timeout(Duration::from_secs(30), async {
        while store.find(long).await.unwrap().unwrap().status != RunStatus::Completed {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the long run completed after the stall");
    token.cancel();
    tokio::time::timeout(Duration::from_secs(10), consuming)
        .await
        .expect("the worker stopped")
        .unwrap()
        .unwrap();

    let run = store.find(long).await.unwrap().unwrap();
    assert_eq!(run.requeue_count, 0, "never requeued: it kept its lease");
    assert_eq!(run.claimed_by.as_deref(), Some(runtime.worker()));
    assert_eq!(run.output, Some(json!("long")));
    let seqs: Vec<i64> = store
        .events(long)
        .await
        .unwrap()
        .iter()
        .map(|e| e.seq)
        .collect();
    let expected: Vec<i64> = (1..=i64::try_from(seqs.len()).unwrap()).collect();
    assert_eq!(
        seqs, expected,
        "one owner, contiguous steps, none run twice"
    );
}
