//! `agent-worker`: a worker process for the LLM agent crash tests (issue 39). It runs an
//! [`LlmAgent`] (`refunds`) whose one tool, `refund`, is a guarded step that POSTs to
//! `AGENT_TOOL_URL` with the step's idempotency key in an `Idempotency-Key` header; the model is
//! the OpenAI-compatible server at `AGENT_MODEL_URL`. It consumes `RunAgent` from the SQL queue
//! `AGENT_QUEUE` with a [`SqlRunStore`] of the tables `<AGENT_PREFIX>_*` in `AGENT_STORE`
//! (lease `AGENT_LEASE_MS`), reaps every `AGENT_REAP_MS`, until it is killed.
//! `AGENT_ON_AMBIGUOUS` is `retry` or `park`: what a resumed run does with a refund whose
//! worker died between its intent and its result.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use courier_agent::{LlmAgent, Provider, Tool};
use courier_core::{Backoff, Dsn, MessageBus, MessageRegistry, Worker};
use courier_runs::{
    AgentError, CancellationToken, Effect, OnAmbiguous, ReapOptions, RunAgent, RunStore, Runtime,
    RuntimeOptions, SqlRunStore, SqlRunStoreOptions,
};
use courier_sql::SqlTransport;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The agent's name.
const AGENT: &str = "refunds";

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("agent-worker: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn var(name: &str) -> anyhow::Result<String> {
    std::env::var(name).with_context(|| format!("{name} is not set"))
}

fn millis(name: &str) -> anyhow::Result<Duration> {
    Ok(Duration::from_millis(
        var(name)?
            .parse()
            .with_context(|| format!("{name}: not a number of ms"))?,
    ))
}

/// POSTs to `url` (`http://HOST:PORT/PATH`) with the key; the response's JSON body.
async fn post(url: &str, key: &str) -> Result<Value, String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("not an http:// URL: {url}"))?;
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let mut stream = tokio::net::TcpStream::connect(host)
        .await
        .map_err(|e| format!("tool endpoint: {e}"))?;
    let request = format!(
        "POST /{path} HTTP/1.1\r\nHost: {host}\r\nIdempotency-Key: {key}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| format!("tool endpoint: {e}"))?;
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .await
        .map_err(|e| format!("tool endpoint: {e}"))?;
    let body = response.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    serde_json::from_str(body).map_err(|e| format!("tool endpoint answered {body:?}: {e}"))
}

async fn run() -> anyhow::Result<()> {
    let store_dsn = var("AGENT_STORE")?;
    let prefix = var("AGENT_PREFIX")?;
    let tool_url = var("AGENT_TOOL_URL")?;
    let on_ambiguous = match var("AGENT_ON_AMBIGUOUS")?.as_str() {
        "retry" => OnAmbiguous::Retry,
        "park" => OnAmbiguous::Park,
        other => anyhow::bail!("AGENT_ON_AMBIGUOUS: `{other}` is not retry or park"),
    };
    let store = SqlRunStore::connect(
        &store_dsn,
        SqlRunStoreOptions::default().table_prefix(&prefix),
    )
    .await
    .context("connecting the run store")?;
    store.setup().await.context("setting up the run store")?;
    let agent = LlmAgent::builder()
        .provider(Provider::new("p1", var("AGENT_MODEL_URL")?, "test-model"))
        .tool(Tool::new(
            "refund",
            "Refunds the order",
            json!({"type": "object", "properties": {}}),
            Effect::Guarded(on_ambiguous),
            move |_args, step| {
                let url = tool_url.clone();
                let key = step.key().to_owned();
                async move { post(&url, &key).await.map_err(AgentError::other) }
            },
        ))
        .build()
        .context("building the agent")?;
    let mut registry = MessageRegistry::new();
    registry.register::<RunAgent>();
    let dsn = Dsn::parse(&var("AGENT_QUEUE")?).context("AGENT_QUEUE")?;
    let queue = Arc::new(
        SqlTransport::connect("async", &dsn, Arc::new(registry))
            .await
            .context("connecting the queue")?,
    );
    let options = RuntimeOptions {
        lease: millis("AGENT_LEASE_MS")?,
        backoff: Backoff::new(Duration::from_millis(100), Duration::from_secs(1)),
        ..RuntimeOptions::default()
    };
    let runtime = Runtime::builder(Arc::new(store))
        .agent(AGENT, agent)
        .options(options)
        .build();
    let bus = runtime
        .register(
            MessageBus::builder()
                .transport("async", queue.clone())
                .route("courier.run_agent", ["async"]),
        )
        .build();
    let shutdown = CancellationToken::new();
    let reaper = runtime.reaper();
    let every = millis("AGENT_REAP_MS")?;
    let reaping = shutdown.clone();
    tokio::spawn(async move {
        reaper
            .run_every(every, ReapOptions::default(), reaping)
            .await;
    });
    Worker::builder(bus)
        .receiver("async", queue)
        .build()
        .run(shutdown)
        .await
        .context("the worker")?;
    Ok(())
}
