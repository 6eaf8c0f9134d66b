//! An OpenAI-compatible test server (axum on 127.0.0.1:0) answering scripted sequences per
//! provider path, counting and recording every call; runtimes over a store.
#![allow(dead_code, unreachable_pub, missing_docs, clippy::unwrap_used)]

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::post;
use courier_core::{InMemoryTransport, MessageBus};
use courier_runs::{RunStore, Runtime, RuntimeOptions};
use serde_json::{Value, json};

/// One scripted answer.
#[derive(Debug, Clone)]
pub enum Reply {
    /// 200 with this chat completion.
    Json(Value),
    /// This status and headers, a small JSON error body.
    Status(u16, Vec<(&'static str, String)>),
    /// 200 with this raw body (truncated or malformed JSON).
    Raw(String),
    /// Waits, then answers.
    Slow(Duration, Value),
}

/// A call the server received.
#[derive(Debug, Clone)]
pub struct Call {
    pub provider: String,
    pub authorization: Option<String>,
    pub idempotency_key: Option<String>,
    pub body: Value,
}

#[derive(Default)]
struct Inner {
    script: Mutex<HashMap<String, VecDeque<Reply>>>,
    calls: Mutex<Vec<Call>>,
    /// Idempotency keys the `/tool/NAME` endpoint saw.
    tool_keys: Mutex<Vec<(String, String)>>,
}

/// The server.
#[derive(Clone)]
pub struct Server {
    pub addr: std::net::SocketAddr,
    inner: Arc<Inner>,
}

fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

async fn chat(
    State(inner): State<Arc<Inner>>,
    Path(provider): Path<String>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let body: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    inner.calls.lock().unwrap().push(Call {
        provider: provider.clone(),
        authorization: header(&headers, "authorization"),
        idempotency_key: header(&headers, "idempotency-key"),
        body,
    });
    let next = inner
        .script
        .lock()
        .unwrap()
        .get_mut(&provider)
        .and_then(VecDeque::pop_front);
    let json = |status: u16, v: &Value| {
        Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Body::from(v.to_string()))
            .unwrap()
    };
    match next {
        None => json(
            500,
            &json!({"error": {"message": format!("nothing scripted for {provider}")}}),
        ),
        Some(Reply::Json(v)) => json(200, &v),
        Some(Reply::Status(status, headers)) => {
            let mut r = Response::builder()
                .status(status)
                .header("content-type", "application/json");
            for (k, v) in headers {
                r = r.header(k, v);
            }
            r.body(Body::from(
                json!({"error": {"message": "scripted"}}).to_string(),
            ))
            .unwrap()
        }
        Some(Reply::Raw(text)) => Response::builder()
            .status(200)
            .header("content-type", "application/json")
            .body(Body::from(text))
            .unwrap(),
        Some(Reply::Slow(after, v)) => {
            tokio::time::sleep(after).await;
            json(200, &v)
        }
    }
}

async fn tool(
    State(inner): State<Arc<Inner>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> StatusCode {
    let key = header(&headers, "idempotency-key").unwrap_or_default();
    inner.tool_keys.lock().unwrap().push((name, key));
    StatusCode::OK
}

impl Server {
    pub async fn start() -> Self {
        let inner = Arc::new(Inner::default());
        let app = Router::new()
            .route("/{provider}/v1/chat/completions", post(chat))
            .route("/tool/{name}", post(tool))
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { addr, inner }
    }

    /// The base URL of `provider` (up to `/v1`).
    pub fn base_url(&self, provider: &str) -> String {
        format!("http://{}/{provider}/v1", self.addr)
    }

    pub fn script(&self, provider: &str, replies: impl IntoIterator<Item = Reply>) {
        self.inner
            .script
            .lock()
            .unwrap()
            .entry(provider.to_owned())
            .or_default()
            .extend(replies);
    }

    /// Model calls `provider` received (the server's own counter).
    pub fn calls_to(&self, provider: &str) -> usize {
        self.calls()
            .iter()
            .filter(|c| c.provider == provider)
            .count()
    }

    pub fn calls(&self) -> Vec<Call> {
        self.inner.calls.lock().unwrap().clone()
    }

    pub fn tool_keys(&self, name: &str) -> Vec<String> {
        self.inner
            .tool_keys
            .lock()
            .unwrap()
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, k)| k.clone())
            .collect()
    }

    /// A POST to `/tool/NAME` with the key, over a plain TCP connection (what a tool calling an
    /// outside system does).
    pub async fn call_tool(&self, name: &str, key: &str) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(self.addr).await.unwrap();
        let req = format!(
            "POST /tool/{name} HTTP/1.1\r\nhost: 127.0.0.1\r\nidempotency-key: {key}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
        );
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.unwrap();
        assert!(
            out.starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&out)
        );
    }
}

/// A chat completion with a final answer.
pub fn answer(text: &str, tokens_in: u64, tokens_out: u64) -> Value {
    json!({
        "id": "chatcmpl-1", "object": "chat.completion", "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": tokens_in, "completion_tokens": tokens_out, "total_tokens": tokens_in + tokens_out}
    })
}

/// A chat completion asking for one tool call.
pub fn tool_call(id: &str, name: &str, args: Value, tokens_in: u64, tokens_out: u64) -> Value {
    json!({
        "id": "chatcmpl-2", "object": "chat.completion", "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": null, "tool_calls": [
            {"id": id, "type": "function", "function": {"name": name, "arguments": args.to_string()}}
        ]}, "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": tokens_in, "completion_tokens": tokens_out, "total_tokens": tokens_in + tokens_out}
    })
}

/// A worker runtime of `worker` over `store` running `agent` as "llm"; its `RunAgent` messages
/// go to an in-memory queue, not run (tests call `run_queued`).
pub fn runtime(
    store: Arc<dyn RunStore>,
    worker: &str,
    agent: courier_agent::LlmAgent,
) -> (Runtime, MessageBus) {
    let runtime = Runtime::builder(store)
        .agent("llm", agent)
        .worker_identity(worker)
        .options(RuntimeOptions {
            lease: Duration::from_secs(30),
            ..RuntimeOptions::default()
        })
        .build();
    let bus = runtime
        .register(
            MessageBus::builder()
                .transport("async", Arc::new(InMemoryTransport::new()))
                .route("courier.run_agent", ["async"]),
        )
        .build();
    (runtime, bus)
}

/// A SQLite run store in a temporary directory (kept while the guard lives).
pub async fn sqlite_store() -> (courier_runs::SqlRunStore, tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let dsn = format!("sqlite://{}?mode=rwc", dir.path().join("runs.db").display());
    let store =
        courier_runs::SqlRunStore::connect(&dsn, courier_runs::SqlRunStoreOptions::default())
            .await
            .unwrap();
    store.migrate().await.unwrap();
    (store, dir, dsn)
}

/// Expires the lease of `id` (its worker was killed).
pub async fn expire_lease(store: &courier_runs::SqlRunStore, id: uuid::Uuid) {
    let sql = format!(
        "UPDATE {} SET lease_expires = 1 WHERE id = '{id}'",
        store.runs_table()
    );
    store.execute(&sql).await.unwrap();
}
