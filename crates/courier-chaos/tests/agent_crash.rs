//! The LLM agent's guarded tool across a real crash (issue 39): a worker process is SIGKILLed
//! while its `refund` tool call is in flight (the tool endpoint received it and never answers),
//! then another worker process resumes the run. With `OnAmbiguous::Retry` the tool endpoint
//! sees the same idempotency key twice and never a third time, and the run completes; with
//! `OnAmbiguous::Park` it sees it once and the run waits for an operator. The model is a
//! scripted OpenAI-compatible server on 127.0.0.1 (`courier_agent::testing`), and the model
//! step finished before the crash is replayed, not called again.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use courier_agent::testing::{Reply, TestServer, answer, tool_call};
use courier_core::{Dsn, MessageBus, MessageRegistry};
use courier_runs::{
    NewRun, Run, RunAgent, RunStatus, RunStore, Runtime, SqlRunStore, SqlRunStoreOptions,
};
use courier_sql::SqlTransport;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};
use tokio::sync::Notify;
use uuid::Uuid;

const WORKER: &str = env!("CARGO_BIN_EXE_agent-worker");

/// The keys the tool endpoint received, in order; the first call is held open, never answered.
#[derive(Clone, Default)]
struct ToolEndpoint {
    keys: Arc<Mutex<Vec<String>>>,
    entered: Arc<Notify>,
}

impl ToolEndpoint {
    async fn start(&self) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/refund", listener.local_addr().unwrap());
        let me = self.clone();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((mut stream, _)) = listener.accept().await {
                let mut request = Vec::new();
                let mut buf = [0_u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&request).into_owned();
                let key = text
                    .lines()
                    .find_map(|l| l.strip_prefix("Idempotency-Key: "))
                    .unwrap_or("")
                    .trim()
                    .to_owned();
                let first = {
                    let mut keys = me.keys.lock().unwrap();
                    keys.push(key);
                    keys.len() == 1
                };
                if first {
                    // The refund reached the payment system; its answer never comes back.
                    held.push(stream);
                    me.entered.notify_one();
                    continue;
                }
                let body = r#"{"refunded":true}"#;
                let response = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(response.as_bytes()).await;
            }
        });
        url
    }

    fn keys(&self) -> Vec<String> {
        self.keys.lock().unwrap().clone()
    }
}

struct Place {
    dir: tempfile::TempDir,
    store: SqlRunStore,
    store_dsn: String,
    queue_dsn: String,
    runtime: Runtime,
    _bus: MessageBus,
}

impl Place {
    async fn sqlite() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store_dsn = format!("sqlite://{}", dir.path().join("runs.db").display());
        let queue_dsn = format!(
            "sqlite://{}?poll_window=50ms&redeliver_timeout=5s",
            dir.path().join("queue.db").display()
        );
        let store = SqlRunStore::connect(
            &store_dsn,
            SqlRunStoreOptions::default().table_prefix("agent"),
        )
        .await
        .unwrap();
        store.setup().await.unwrap();
        let mut registry = MessageRegistry::new();
        registry.register::<RunAgent>();
        let queue = SqlTransport::connect(
            "async",
            &Dsn::parse(&queue_dsn).unwrap(),
            Arc::new(registry),
        )
        .await
        .unwrap();
        let runtime = Runtime::builder(Arc::new(store.clone())).build();
        let bus = runtime
            .register(
                MessageBus::builder()
                    .transport("async", Arc::new(queue))
                    .route("courier.run_agent", ["async"]),
            )
            .build();
        Self {
            dir,
            store,
            store_dsn,
            queue_dsn,
            runtime,
            _bus: bus,
        }
    }

    fn spawn(&self, label: &str, model: &TestServer, tool_url: &str, policy: &str) -> Child {
        let log = std::fs::File::create(self.log_path(label)).unwrap();
        Command::new(WORKER)
            .env("AGENT_STORE", &self.store_dsn)
            .env("AGENT_PREFIX", "agent")
            .env("AGENT_QUEUE", &self.queue_dsn)
            .env("AGENT_MODEL_URL", model.base_url("p1"))
            .env("AGENT_TOOL_URL", tool_url)
            .env("AGENT_ON_AMBIGUOUS", policy)
            .env("AGENT_LEASE_MS", "1500")
            .env("AGENT_REAP_MS", "200")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .unwrap()
    }

    fn log_path(&self, label: &str) -> std::path::PathBuf {
        self.dir.path().join(format!("{label}.log"))
    }

    fn log(&self, label: &str) -> String {
        std::fs::read_to_string(self.log_path(label)).unwrap_or_default()
    }

    async fn run(&self, id: Uuid) -> Run {
        self.store.find(id).await.unwrap().unwrap()
    }

    async fn wait_for(&self, id: Uuid, status: RunStatus, logs: &[&str]) -> Run {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let run = self.run(id).await;
            if run.status == status {
                return run;
            }
            assert!(
                Instant::now() < deadline,
                "run {id} is {} after 60 s, not {}; logs:\n{}",
                run.status.as_str(),
                status.as_str(),
                logs.iter()
                    .map(|l| self.log(l))
                    .collect::<Vec<_>>()
                    .join("\n---\n")
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The model: a refund tool call at turn 1, the final answer at turn 2.
async fn model() -> TestServer {
    TestServer::start(|request| {
        if request.turn() <= 1 {
            Reply::Json(tool_call("c1", "refund", &json!({}), 10, 5))
        } else {
            Reply::Json(answer("refunded", 12, 3))
        }
    })
    .await
    .unwrap()
}

/// Submits a run, starts worker A, SIGKILLs it once its refund reached the tool endpoint, and
/// starts worker B (which reaps A's run when its lease ends and resumes it).
async fn crash_in_the_refund(
    place: &Place,
    policy: &str,
) -> (Uuid, TestServer, ToolEndpoint, Child) {
    let model = model().await;
    let tool = ToolEndpoint::default();
    let url = tool.start().await;
    let entered = tool.entered.notified();
    let id = place
        .runtime
        .submit(NewRun::new(
            "refunds",
            json!({"prompt": "Refund order A-17"}),
        ))
        .await
        .unwrap();
    let mut a = place.spawn("a", &model, &url, policy);
    if tokio::time::timeout(Duration::from_secs(30), entered)
        .await
        .is_err()
    {
        let run = place.run(id).await;
        panic!(
            "the refund never reached the tool endpoint; the run: {run:?}; model calls: {:?}; worker A:\n{}",
            model.calls(),
            place.log("a")
        );
    }
    a.kill().await.unwrap(); // SIGKILL, the refund in flight
    let b = place.spawn("b", &model, &url, policy);
    (id, model, tool, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guarded_retry_tool_is_called_again_with_the_same_key_after_a_sigkill() {
    let place = Place::sqlite().await;
    let (id, model, tool, mut b) = crash_in_the_refund(&place, "retry").await;
    let run = place.wait_for(id, RunStatus::Completed, &["a", "b"]).await;
    b.kill().await.unwrap();
    assert_eq!(run.output, Some(json!({"answer": "refunded", "turns": 2})));
    let key = format!("{id}:2");
    assert_eq!(
        tool.keys(),
        [key.clone(), key],
        "the same key twice (the crash, the retry), never a third time"
    );
    // The model step finished before the crash is replayed: the model was called for turn 1
    // once (by A) and for turn 2 once (by B).
    let calls = model.calls();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_eq!(
        calls[0].idempotency_key.as_deref(),
        Some(format!("{id}:1").as_str())
    );
    assert_eq!(
        calls[1].idempotency_key.as_deref(),
        Some(format!("{id}:3").as_str())
    );
    let steps = place.store.steps(id).await.unwrap();
    assert_eq!(steps.len(), 3, "{steps:?}");
    assert_eq!(steps[1].name, "tool:refund");
    assert_eq!(
        steps[1].output,
        Some(json!({"refunded": true})),
        "{:?}",
        steps[1]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guarded_park_tool_parks_the_run_after_a_sigkill() {
    let place = Place::sqlite().await;
    let (id, model, tool, mut b) = crash_in_the_refund(&place, "park").await;
    let run = place
        .wait_for(id, RunStatus::WaitingForApproval, &["a", "b"])
        .await;
    // Give the parked run time to be (wrongly) picked up again before looking.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    b.kill().await.unwrap();
    assert_eq!(place.run(id).await.status, RunStatus::WaitingForApproval);
    assert!(
        run.pending_effect
            .as_deref()
            .is_some_and(|e| e.contains("refund")),
        "{run:?}"
    );
    assert_eq!(tool.keys(), [format!("{id}:2")], "never called again");
    assert_eq!(model.calls().len(), 1, "the model was called once, by A");
}
