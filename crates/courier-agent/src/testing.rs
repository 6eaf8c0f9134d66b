//! A scripted OpenAI-compatible server on 127.0.0.1 (feature `test-server`), for demos and
//! tests: no model, no network.
//!
//! Each `POST /PROVIDER/v1/chat/completions` is handed to a function that decides its [`Reply`]
//! from the [`Request`] (the provider in the path, the body, the `Idempotency-Key` and how many
//! times this provider saw that key), and is counted: [`TestServer::calls`] is the server's own
//! record of what it was asked, so a caller can check that a resumed run did not call the model
//! again for the steps it had finished. HTTP/1, one request per connection.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use courier_agent::testing::{Reply, TestServer, answer};
//! let server = TestServer::start(|req| match (req.provider.as_str(), req.attempt) {
//!     ("primary", 1) => Reply::Status { status: 503, retry_after: None },
//!     _ => Reply::Json(answer("hello", 10, 2)),
//! })
//! .await?;
//! let base_url = server.base_url("primary"); // http://127.0.0.1:PORT/primary/v1
//! # let _ = base_url; Ok(()) }
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// A call as the server's script sees it.
#[derive(Debug, Clone)]
pub struct Request {
    /// The first path segment (`/PROVIDER/v1/chat/completions`).
    pub provider: String,
    /// The `Idempotency-Key` header (the model step's key).
    pub idempotency_key: Option<String>,
    /// The JSON body (`Null` when it is not JSON).
    pub body: Value,
    /// How many calls this provider received with this idempotency key, this one included.
    pub attempt: u32,
}

impl Request {
    /// The content of the first user message (what the run was asked).
    #[must_use]
    pub fn prompt(&self) -> Option<&str> {
        self.messages()
            .iter()
            .find(|m| m["role"] == "user")
            .and_then(|m| m["content"].as_str())
    }

    /// The model turn this call is: 1 + the assistant messages already in the conversation.
    #[must_use]
    pub fn turn(&self) -> usize {
        1 + self
            .messages()
            .iter()
            .filter(|m| m["role"] == "assistant")
            .count()
    }

    fn messages(&self) -> &[Value] {
        self.body["messages"].as_array().map_or(&[], Vec::as_slice)
    }
}

/// What the server answers.
#[derive(Debug, Clone)]
pub enum Reply {
    /// 200 with this chat completion.
    Json(Value),
    /// This status with a small JSON error body, and `Retry-After: SECONDS` when given.
    Status {
        /// The HTTP status.
        status: u16,
        /// `Retry-After`, seconds.
        retry_after: Option<u64>,
    },
    /// Waits, then answers 200 with this chat completion.
    Slow(Duration, Value),
    /// 200 with this raw body (truncated or malformed JSON).
    Raw(String),
    /// 200 as an SSE stream (`text/event-stream`): each item sent as `data: ITEM` and a blank
    /// line, flushed one by one, then the connection closes. Without a last `[DONE]` item the
    /// stream is cut mid-way.
    Sse(Vec<String>),
}

impl Reply {
    fn status(&self) -> u16 {
        match self {
            Self::Status { status, .. } => *status,
            _ => 200,
        }
    }
}

/// A call the server received, in arrival order.
#[derive(Debug, Clone)]
pub struct Call {
    /// The provider in the path.
    pub provider: String,
    /// The `Idempotency-Key` header.
    pub idempotency_key: Option<String>,
    /// The first user message.
    pub prompt: Option<String>,
    /// The model turn ([`Request::turn`]).
    pub turn: usize,
    /// The status it was answered (200 for [`Reply::Slow`] and [`Reply::Raw`]).
    pub status: u16,
}

type Script = dyn Fn(&Request) -> Reply + Send + Sync;

struct Inner {
    script: Box<Script>,
    calls: Mutex<Vec<Call>>,
    attempts: Mutex<HashMap<(String, String), u32>>,
}

/// The server; it serves until the process ends.
#[derive(Clone)]
pub struct TestServer {
    addr: std::net::SocketAddr,
    inner: Arc<Inner>,
}

impl std::fmt::Debug for TestServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl TestServer {
    /// Listens on 127.0.0.1 (a free port) and answers each call with `script`'s reply.
    ///
    /// # Errors
    /// The port cannot be bound.
    pub async fn start(
        script: impl Fn(&Request) -> Reply + Send + Sync + 'static,
    ) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let inner = Arc::new(Inner {
            script: Box::new(script),
            calls: Mutex::new(Vec::new()),
            attempts: Mutex::new(HashMap::new()),
        });
        let serving = inner.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let inner = serving.clone();
                tokio::spawn(async move {
                    if let Err(e) = serve(&inner, stream).await {
                        tracing::debug!(error = %e, "test server connection");
                    }
                });
            }
        });
        Ok(Self { addr, inner })
    }

    /// Its address.
    #[must_use]
    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }

    /// The base URL of `provider`, up to `/v1`.
    #[must_use]
    pub fn base_url(&self, provider: &str) -> String {
        format!("http://{}/{provider}/v1", self.addr)
    }

    /// Every call received so far, in arrival order.
    #[must_use]
    pub fn calls(&self) -> Vec<Call> {
        self.inner
            .calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

async fn serve(inner: &Inner, stream: tokio::net::TcpStream) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream);
    let mut request_line = String::new();
    reader.read_line(&mut request_line).await?;
    let path = request_line
        .split_whitespace()
        .nth(1)
        .unwrap_or("/")
        .to_owned();
    let (mut length, mut key) = (0usize, None);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).await? == 0 || line == "\r\n" {
            break;
        }
        let (name, value) = line.split_once(':').unwrap_or((&line, ""));
        match name.trim().to_ascii_lowercase().as_str() {
            "content-length" => length = value.trim().parse().unwrap_or(0),
            "idempotency-key" => key = Some(value.trim().to_owned()),
            _ => {}
        }
    }
    let mut body = vec![0; length.min(16 << 20)];
    reader.read_exact(&mut body).await?;
    let provider = path
        .trim_start_matches('/')
        .split('/')
        .next()
        .unwrap_or("")
        .to_owned();
    let attempt = {
        let mut attempts = inner
            .attempts
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let n = attempts
            .entry((provider.clone(), key.clone().unwrap_or_default()))
            .or_default();
        *n += 1;
        *n
    };
    let request = Request {
        provider,
        idempotency_key: key,
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        attempt,
    };
    let reply = (inner.script)(&request);
    inner
        .calls
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(Call {
            provider: request.provider.clone(),
            idempotency_key: request.idempotency_key.clone(),
            prompt: request.prompt().map(str::to_owned),
            turn: request.turn(),
            status: reply.status(),
        });
    let (status, extra, text) = match reply {
        Reply::Json(v) => (200, String::new(), v.to_string()),
        Reply::Status {
            status,
            retry_after,
        } => (
            status,
            retry_after.map_or_else(String::new, |s| format!("retry-after: {s}\r\n")),
            json!({"error": {"message": "scripted"}}).to_string(),
        ),
        Reply::Slow(after, v) => {
            tokio::time::sleep(after).await;
            (200, String::new(), v.to_string())
        }
        Reply::Raw(text) => (200, String::new(), text),
        Reply::Sse(items) => {
            let stream = reader.get_mut();
            stream
                .write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n",
                )
                .await?;
            for item in items {
                stream
                    .write_all(format!("data: {item}\n\n").as_bytes())
                    .await?;
                stream.flush().await?;
            }
            return stream.shutdown().await;
        }
    };
    let reply = format!(
        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n{extra}content-length: {}\r\nconnection: close\r\n\r\n{text}",
        text.len()
    );
    reader.get_mut().write_all(reply.as_bytes()).await?;
    reader.get_mut().shutdown().await
}

/// A chat completion with a final answer.
#[must_use]
pub fn answer(text: &str, tokens_in: u64, tokens_out: u64) -> Value {
    json!({
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": tokens_in, "completion_tokens": tokens_out, "total_tokens": tokens_in + tokens_out}
    })
}

/// A chat completion asking for one call of tool `name` with `args`.
#[must_use]
pub fn tool_call(id: &str, name: &str, args: &Value, tokens_in: u64, tokens_out: u64) -> Value {
    json!({
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": null, "tool_calls": [
            {"id": id, "type": "function", "function": {"name": name, "arguments": args.to_string()}}
        ]}, "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": tokens_in, "completion_tokens": tokens_out, "total_tokens": tokens_in + tokens_out}
    })
}
