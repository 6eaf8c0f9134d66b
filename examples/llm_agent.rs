//! A durable LLM agent against a local OpenAI-compatible server: this example starts its own on
//! 127.0.0.1 (scripted answers, no model, no network), with two providers: `primary` answers
//! 503 (twice), so each model step falls back to `backup`, which asks for a tool call, then
//! answers.
//!
//! ```sh
//! cargo run --example llm_agent --features agent
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use courier::agent::{LlmAgent, Price, Provider, Tool};
use courier::runs::{Effect, MemoryRunStore, Outcome, RunStore, Runtime};
use courier::{InMemoryTransport, MessageBus};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// Scripted answers by path, and how many calls each path received.
type Script = Arc<Mutex<HashMap<String, Vec<(u16, Value)>>>>;

/// A minimal OpenAI-compatible server: each POST to `/NAME/v1/chat/completions` gets the next
/// scripted answer of NAME.
async fn serve(script: Script, calls: Arc<Mutex<HashMap<String, u32>>>) -> std::io::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (script, calls) = (script.clone(), calls.clone());
            tokio::spawn(async move {
                let mut reader = BufReader::new(stream);
                let mut request_line = String::new();
                reader.read_line(&mut request_line).await?;
                let path = request_line
                    .split_whitespace()
                    .nth(1)
                    .unwrap_or("/")
                    .to_owned();
                let mut length = 0;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).await? == 0 || line == "\r\n" {
                        break;
                    }
                    if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        length = v.trim().parse().unwrap_or(0);
                    }
                }
                let mut body = vec![0; length];
                reader.read_exact(&mut body).await?;
                let provider = path
                    .trim_start_matches('/')
                    .split('/')
                    .next()
                    .unwrap_or("")
                    .to_owned();
                *calls
                    .lock()
                    .expect("lock")
                    .entry(provider.clone())
                    .or_default() += 1;
                let (status, answer) = {
                    let mut script = script.lock().expect("lock");
                    let queue = script.entry(provider).or_default();
                    if queue.is_empty() {
                        (500, json!({"error": "unscripted"}))
                    } else {
                        queue.remove(0)
                    }
                };
                let text = answer.to_string();
                let reply = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}",
                    text.len()
                );
                reader.get_mut().write_all(reply.as_bytes()).await
            });
        }
    });
    Ok(format!("http://{addr}"))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let usage = |i: u64, o: u64| json!({"prompt_tokens": i, "completion_tokens": o});
    let script: Script = Arc::new(Mutex::new(HashMap::from([
        (
            "primary".to_owned(),
            vec![(503, json!({"error": "overloaded"}))],
        ),
        (
            "backup".to_owned(),
            vec![
                (
                    200,
                    json!({"choices": [{"message": {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "order_status", "arguments": "{\"order\":\"A-17\"}"}}
                ]}, "finish_reason": "tool_calls"}], "usage": usage(120, 18)}),
                ),
                (
                    200,
                    json!({"choices": [{"message": {"role": "assistant", "content": "Order A-17 shipped yesterday."},
                    "finish_reason": "stop"}], "usage": usage(160, 9)}),
                ),
            ],
        ),
    ])));
    let calls = Arc::new(Mutex::new(HashMap::new()));
    let server = serve(script, calls.clone()).await?;

    let agent = LlmAgent::builder()
        .provider(Provider::new("primary", format!("{server}/primary/v1"), "big-model"))
        .provider(Provider::new("backup", format!("{server}/backup/v1"), "small-model"))
        .system("You answer questions about orders.")
        .price("small-model", Price::per_million(150_000, 600_000))
        .tool(Tool::new(
            "order_status",
            "The shipping status of an order",
            json!({"type": "object", "properties": {"order": {"type": "string"}}, "required": ["order"]}),
            Effect::Pure,
            |args, _step| async move { Ok(json!({"order": args["order"], "status": "shipped", "on": "yesterday"})) },
        ))
        .max_turns(5)
        .build()?;

    let store = Arc::new(MemoryRunStore::new());
    let runtime = Runtime::builder(store.clone())
        .agent("orders", agent)
        .build();
    let _bus = runtime
        .register(
            MessageBus::builder()
                .transport("runs", Arc::new(InMemoryTransport::new()))
                .route("courier.run_agent", ["runs"]),
        )
        .build();

    let (id, outcome) = runtime
        .run("orders", json!({"prompt": "Where is order A-17?"}))
        .await?;
    let Outcome::Completed { output } = outcome else {
        return Err(format!("the run did not complete: {outcome:?}").into());
    };
    println!("answer: {}", output["answer"]);
    for step in store.steps(id).await? {
        let provider = step
            .output
            .as_ref()
            .and_then(|o| o.get("provider"))
            .cloned()
            .unwrap_or(Value::Null);
        println!(
            "step {} {:<18} {:<10} provider={provider}",
            step.index, step.name, step.effect
        );
    }
    let run = store.find(id).await?.ok_or("the run is gone")?;
    println!(
        "usage: {} tokens in, {} out, {} turns, {} tool call(s), cost {} micro-units",
        run.usage.tokens_in,
        run.usage.tokens_out,
        run.usage.turns,
        run.usage.tool_calls,
        run.usage.cost_micros
    );
    let calls = calls.lock().expect("lock").clone();
    println!(
        "server calls: primary {}, backup {}",
        calls.get("primary").unwrap_or(&0),
        calls.get("backup").unwrap_or(&0)
    );
    Ok(())
}
