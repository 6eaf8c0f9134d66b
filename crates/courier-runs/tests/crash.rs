//! Crash test with real processes: a worker process is killed with SIGKILL in the middle of a
//! run; once its lease has expired (rewritten in SQL, not waited for) the reaper requeues the
//! run and another worker completes it: nothing lost, no step sequence duplicated. On SQLite
//! (files in a temporary directory) and on PostgreSQL (tables of their own).
#![allow(clippy::unwrap_used)]
#![cfg(all(unix, feature = "sqlite"))]

mod support;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use courier_core::{Dsn, MessageBus, MessageRegistry, Worker};
use courier_runs::{
    ReapOptions, RunAgent, RunStatus, RunStore, Runtime, ScriptedAgent, SqlRunStore,
    SqlRunStoreOptions,
};
use courier_sql::SqlTransport;
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// Set in the child process only: where its node keeps runs and queue ([`Place::encode`]).
const CHILD_ENV: &str = "COURIER_RUNS_CRASH_CHILD";

/// Where a node keeps its runs and its queue; the parent and the child share one.
struct Place {
    store_dsn: String,
    prefix: String,
    queue_dsn: String,
}

impl Place {
    fn sqlite(dir: &Path) -> Self {
        Self {
            store_dsn: format!("sqlite://{}", dir.join("runs.db").display()),
            prefix: "courier".to_owned(),
            queue_dsn: format!(
                "sqlite://{}?poll_window=50ms",
                dir.join("queue.db").display()
            ),
        }
    }

    /// Runs and queue on the database server at `url`, in tables of this test's own.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    fn server(url: String) -> Self {
        let sep = if url.contains('?') { '&' } else { '?' };
        let queue = courier_test::env::unique_name("crash_queue");
        Self {
            queue_dsn: format!("{url}{sep}table_name={queue}&poll_window=50ms"),
            store_dsn: url,
            prefix: courier_test::env::unique_name("crash"),
        }
    }

    fn encode(&self) -> String {
        [&self.store_dsn, &self.prefix, &self.queue_dsn]
            .map(String::as_str)
            .join("\n")
    }

    fn decode(text: &str) -> Self {
        let mut parts = text.splitn(3, '\n').map(str::to_owned);
        let mut next = || parts.next().unwrap();
        Self {
            store_dsn: next(),
            prefix: next(),
            queue_dsn: next(),
        }
    }
}

struct Node {
    store: SqlRunStore,
    queue: Arc<SqlTransport>,
    runtime: Runtime,
    bus: MessageBus,
}

async fn node(place: &Place) -> Node {
    let store = SqlRunStore::connect(
        &place.store_dsn,
        SqlRunStoreOptions::default().table_prefix(&place.prefix),
    )
    .await
    .unwrap();
    store.setup().await.unwrap();
    let mut registry = MessageRegistry::new();
    registry.register::<RunAgent>();
    let dsn = Dsn::parse(&place.queue_dsn).unwrap();
    let queue = Arc::new(
        SqlTransport::connect("async", &dsn, Arc::new(registry))
            .await
            .unwrap(),
    );
    let runtime = Runtime::builder(Arc::new(store.clone()))
        .agent("scripted", ScriptedAgent)
        .build();
    let bus = runtime
        .register(
            MessageBus::builder()
                .transport("async", queue.clone())
                .route("courier.run_agent", ["async"]),
        )
        .build();
    Node {
        store,
        queue,
        runtime,
        bus,
    }
}

async fn consume_one(node: &Node) -> u64 {
    let worker = Worker::builder(node.bus.clone())
        .receiver("async", node.queue.clone())
        .sleep(Duration::from_millis(20))
        .limit(1)
        .build();
    worker.run(CancellationToken::new()).await.unwrap().handled
}

/// The child worker process of `worker_killed_mid_run_is_reaped_and_completed_by_another`; does
/// nothing when run on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_child_worker() {
    let Ok(place) = std::env::var(CHILD_ENV) else {
        return;
    };
    let node = node(&Place::decode(&place)).await;
    consume_one(&node).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_killed_mid_run_is_reaped_and_completed_by_another() {
    let dir = support::TempDir::new();
    killed_mid_run(&Place::sqlite(&dir.0)).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
async fn worker_killed_mid_run_is_reaped_and_completed_by_another_on_postgres() {
    killed_mid_run_then_drop(Place::server(courier_test::env::postgres_url())).await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs mysql: set COURIER_TEST_MYSQL_URL"]
async fn worker_killed_mid_run_is_reaped_and_completed_by_another_on_mariadb() {
    killed_mid_run_then_drop(Place::server(courier_test::env::mysql_url())).await;
}

/// [`killed_mid_run`] on a shared server, dropping the test's tables whatever the outcome.
#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn killed_mid_run_then_drop(place: Place) {
    let queue_table = Dsn::parse(&place.queue_dsn)
        .unwrap()
        .option("table_name")
        .unwrap()
        .to_owned();
    let cleanup = courier_test::Cleanup::new();
    cleanup.sql_tables(&place.store_dsn, &place.prefix);
    cleanup.sql_tables(&place.store_dsn, &queue_table);
    killed_mid_run(&place).await;
}

async fn killed_mid_run(place: &Place) {
    let node = node(place).await;
    let mut steps: Vec<_> = (0..15).map(|_| json!({"sleep_ms": 100})).collect();
    steps.push(json!({"output": "survived"}));
    let id = node
        .runtime
        .enqueue("scripted", json!({ "steps": steps }))
        .await
        .unwrap();

    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "crash_child_worker",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, place.encode())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let progressed = tokio::time::timeout(Duration::from_secs(30), async {
        while node.store.events(id).await.unwrap().len() < 3 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    progressed.expect("the child worker made progress");

    let run = node.store.find(id).await.unwrap().unwrap();
    assert_eq!(
        run.status,
        RunStatus::Running,
        "the dead worker settled nothing"
    );
    let owner = run.claimed_by.clone().unwrap();
    assert!(
        owner.contains(&format!(":{}:", child.id())),
        "claimed under the child's identity: {owner}"
    );
    let persisted = node.store.events(id).await.unwrap().len();
    assert!(persisted < 16, "killed mid-run");

    let reaper = node.runtime.reaper();
    assert_eq!(
        reaper.reap(ReapOptions::default()).await.unwrap().selected,
        0,
        "its lease is still fresh"
    );
    let expire = format!(
        "UPDATE {} SET lease_expires = 1 WHERE id = '{id}'",
        node.store.runs_table()
    );
    assert_eq!(node.store.execute(&expire).await.unwrap(), 1);
    let report = reaper.reap(ReapOptions::default()).await.unwrap();
    assert_eq!(
        report.to_string(),
        "Reaped 1 stale run(s): 1 requeued, 0 dead-lettered, 0 skipped."
    );

    let handled = tokio::time::timeout(Duration::from_secs(30), consume_one(&node))
        .await
        .unwrap();
    assert_eq!(handled, 1);
    let run = node.store.find(id).await.unwrap().unwrap();
    assert_eq!((run.status, run.requeue_count), (RunStatus::Completed, 1));
    assert_eq!(run.output, Some(json!("survived")));
    assert_eq!(run.claimed_by.as_deref(), Some(node.runtime.worker()));
    let seqs: Vec<i64> = node
        .store
        .events(id)
        .await
        .unwrap()
        .iter()
        .map(|e| e.seq)
        .collect();
    let expected: Vec<i64> = (1..=i64::try_from(persisted + 16).unwrap()).collect();
    assert_eq!(
        seqs, expected,
        "continued at MAX(seq)+1, no duplicate, nothing lost"
    );
}
