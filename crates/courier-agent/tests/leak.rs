//! No API key in any output: logs (every level), errors, `Debug`, the run's row, its journal and
//! its events, across the failure paths (401, 503 then fallback, a timeout, truncated JSON) and
//! a success.
#![allow(clippy::unwrap_used)]

mod support;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use courier_agent::{AgentConfig, ApiKey, LlmAgent, MemoryBreakers, Provider};
use courier_runs::{MemoryRunStore, NewRun, RunStore};
use serde_json::json;
use support::{Reply, Server, answer, runtime};

const KEY: &str = "sk-leak-canary-9f8e7d6c5b4a";

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn no_api_key_in_logs_errors_debug_or_the_store() {
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let server = Server::start().await;
    let table: courier_core::config::Table = format!(
        "system = \"s\"\n[[providers]]\nname = \"p1\"\nbase_url = \"{}\"\nmodel = \"m\"\napi_key = \"{KEY}\"\ntimeout = \"300ms\"\n\
         [[providers]]\nname = \"p2\"\nbase_url = \"{}\"\nmodel = \"m\"\napi_key = \"{KEY}\"\ntimeout = \"300ms\"",
        server.base_url("p1"),
        server.base_url("p2"),
    )
    .parse()
    .unwrap();
    let config = AgentConfig::from_table("leaky", &table).unwrap();
    let agent = config
        .builder("leaky")
        .unwrap()
        .breakers(Arc::new(MemoryBreakers::new()), Default::default())
        .build()
        .unwrap();
    let mut shown = format!("{config:?} {agent:?}");
    let store = Arc::new(MemoryRunStore::new());
    let (rt, _bus) = runtime(store.clone(), "worker:a", agent);
    let scripts: Vec<(Reply, Option<Reply>)> = vec![
        (Reply::Status(401, vec![]), None),
        (
            Reply::Status(503, vec![]),
            Some(Reply::Json(answer("ok", 1, 1))),
        ),
        (
            Reply::Slow(Duration::from_secs(3), answer("late", 1, 1)),
            Some(Reply::Raw("{\"choices\":[".into())),
        ),
        (
            Reply::Status(429, vec![("retry-after", "1".into())]),
            Some(Reply::Status(403, vec![])),
        ),
    ];
    for (first, second) in scripts {
        server.script("p1", [first]);
        if let Some(second) = second {
            server.script("p2", [second]);
        }
        let id = rt
            .submit(NewRun::new("llm", json!({"prompt": "hi"})))
            .await
            .unwrap();
        let outcome = rt.run_queued(id).await;
        shown.push_str(&format!("{outcome:?}\n"));
        let run = store.find(id).await.unwrap().unwrap();
        shown.push_str(&format!("{run:?} {}\n", run.to_json()));
        for step in store.steps(id).await.unwrap() {
            shown.push_str(&format!(
                "{step:?} {}\n",
                serde_json::to_string(&step).unwrap()
            ));
        }
        for event in store.events(id).await.unwrap() {
            shown.push_str(&format!("{event:?}\n"));
        }
        match rt.run("llm", json!("again")).await {
            Err(e) => shown.push_str(&format!("{e} {e:?}\n")),
            Ok(o) => shown.push_str(&format!("{o:?}\n")),
        }
    }
    shown.push_str(&format!(
        "{:?}",
        Provider::new("x", "http://127.0.0.1/v1", "m").api_key(ApiKey::new(KEY))
    ));
    let _ = LlmAgent::builder()
        .build()
        .map_err(|e| shown.push_str(&e.to_string()));
    let logged = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(
        logged.contains("model call failed"),
        "the failures were logged: {logged}"
    );
    assert!(
        server
            .calls()
            .iter()
            .any(|c| c.authorization.as_deref() == Some(&*format!("Bearer {KEY}"))),
        "the key was sent"
    );
    assert!(!logged.contains(KEY), "a key in the logs:\n{logged}");
    assert!(!shown.contains(KEY), "a key in an output:\n{shown}");
}
