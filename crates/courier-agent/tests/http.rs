//! The LLM agent against a real HTTP server (axum on 127.0.0.1, scripted answers): tool calls,
//! usage and cost, every failure class, the fallback chain, Retry-After as the requeue delay,
//! and a resumed run that never calls the model again for a finished step.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use courier_agent::{ApiKey, LlmAgent, Price, Provider, Tool};
use courier_runs::{
    Effect, FailureClass, MemoryRunStore, NewRun, OnAmbiguous, Outcome, RunError, RunStatus,
    RunStore, StepStatus, TerminationReason,
};
use serde_json::{Value, json};
use support::{Reply, Server, answer, runtime, tool_call};

const KEY: &str = "sk-test-secret-0123456789";

fn provider(server: &Server, name: &str) -> Provider {
    Provider::new(name, server.base_url(name), format!("model-{name}"))
        .api_key(ApiKey::new(KEY))
        .timeout(Duration::from_millis(500))
}

fn add_tool() -> Tool {
    Tool::new(
        "add",
        "Adds a and b",
        json!({"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}),
        Effect::Pure,
        |args, _step| async move {
            Ok(json!(
                args["a"].as_i64().unwrap_or(0) + args["b"].as_i64().unwrap_or(0)
            ))
        },
    )
}

#[tokio::test]
async fn tool_calls_go_back_to_the_model_and_usage_and_cost_feed_the_run() {
    let server = Server::start().await;
    server.script(
        "p1",
        [
            Reply::Json(tool_call("call_1", "add", json!({"a": 2, "b": 3}), 100, 10)),
            Reply::Json(answer("2 + 3 = 5", 150, 20)),
        ],
    );
    let agent = LlmAgent::builder()
        .provider(provider(&server, "p1"))
        .system("You add numbers.")
        .tool(add_tool())
        .price("model-p1", Price::per_million(1_000_000, 2_000_000))
        .build()
        .unwrap();
    let store = Arc::new(MemoryRunStore::new());
    let (rt, _bus) = runtime(store.clone(), "worker:a", agent);
    let id = rt
        .submit(NewRun::new("llm", json!({"prompt": "2+3?"})))
        .await
        .unwrap();
    let outcome = rt.run_queued(id).await.unwrap();
    assert_eq!(
        outcome,
        Outcome::Completed {
            output: json!({"answer": "2 + 3 = 5", "turns": 2})
        }
    );

    let calls = server.calls();
    assert_eq!(calls.len(), 2);
    assert!(
        calls
            .iter()
            .all(|c| c.authorization.as_deref() == Some(&*format!("Bearer {KEY}")))
    );
    assert_eq!(calls[0].body["model"], "model-p1");
    assert_eq!(
        calls[0].body["messages"][0],
        json!({"role": "system", "content": "You add numbers."})
    );
    assert_eq!(calls[0].body["tools"][0]["function"]["name"], "add");
    let second = calls[1].body["messages"].as_array().unwrap();
    assert_eq!(
        second[2]["tool_calls"][0]["id"], "call_1",
        "the assistant's tool call is sent back"
    );
    assert_eq!(
        second[3],
        json!({"role": "tool", "tool_call_id": "call_1", "content": "5"})
    );
    assert_eq!(
        calls[0].idempotency_key,
        Some(format!("{id}:1")),
        "the step's key"
    );
    assert_eq!(calls[1].idempotency_key, Some(format!("{id}:3")));

    let steps = store.steps(id).await.unwrap();
    let names: Vec<_> = steps
        .iter()
        .map(|s| (s.name.as_str(), s.effect.as_str()))
        .collect();
    assert_eq!(
        names,
        [
            ("model", "idempotent"),
            ("tool:add", "pure"),
            ("model", "idempotent")
        ]
    );
    let run = store.find(id).await.unwrap().unwrap();
    assert_eq!(
        (
            run.usage.tokens_in,
            run.usage.tokens_out,
            run.usage.turns,
            run.usage.tool_calls
        ),
        (250, 30, 2, 1)
    );
    // 1 micro-unit per prompt token, 2 per completion token.
    assert_eq!(run.usage.cost_micros, 250 + 60);
}

/// The error of an interactive run of an agent on `provider` scripted with `reply`.
async fn failure_of(server: &Server, name: &str, reply: Option<Reply>) -> courier_runs::AgentError {
    if let Some(reply) = reply {
        server.script(name, [reply]);
    }
    let agent = LlmAgent::builder()
        .provider(provider(server, name))
        .build()
        .unwrap();
    let store = Arc::new(MemoryRunStore::new());
    let (rt, _bus) = runtime(store, "worker:a", agent);
    match rt.run("llm", json!({"prompt": "hi"})).await {
        Err(RunError::Agent { error, .. }) => error,
        other => panic!("{name}: expected an agent failure, got {other:?}"),
    }
}

#[tokio::test]
async fn every_failure_is_classified_and_names_no_key() {
    let server = Server::start().await;
    let ok = answer("late", 1, 1);
    let cases: Vec<(&str, Option<Reply>, FailureClass)> = vec![
        ("s401", Some(Reply::Status(401, vec![])), FailureClass::Auth),
        ("s403", Some(Reply::Status(403, vec![])), FailureClass::Auth),
        (
            "s400",
            Some(Reply::Status(400, vec![])),
            FailureClass::ClientError,
        ),
        (
            "s422",
            Some(Reply::Status(422, vec![])),
            FailureClass::ClientError,
        ),
        (
            "s429",
            Some(Reply::Status(429, vec![("retry-after", "7".into())])),
            FailureClass::RateLimit,
        ),
        (
            "s500",
            Some(Reply::Status(500, vec![])),
            FailureClass::ServerError,
        ),
        (
            "s503",
            Some(Reply::Status(503, vec![])),
            FailureClass::ServerError,
        ),
        (
            "slow",
            Some(Reply::Slow(Duration::from_secs(5), ok)),
            FailureClass::Connection,
        ),
        (
            "truncated",
            Some(Reply::Raw(
                r#"{"id":"x","choices":[{"message":{"role":"assis"#.into(),
            )),
            FailureClass::Protocol,
        ),
        (
            "nochoices",
            Some(Reply::Json(json!({"id": "x", "choices": []}))),
            FailureClass::Protocol,
        ),
        (
            "nomessage",
            Some(Reply::Json(json!({"choices": [{"index": 0}]}))),
            FailureClass::Protocol,
        ),
        (
            "notjson",
            Some(Reply::Raw("<html>bad gateway</html>".into())),
            FailureClass::Protocol,
        ),
    ];
    for (name, reply, class) in cases {
        let error = failure_of(&server, name, reply).await;
        assert_eq!(error.class(), Some(class), "{name}: {error:?}");
        let shown = format!("{error} {error:?}");
        assert!(!shown.contains(KEY), "{name}: {shown}");
        if name == "s429" {
            assert_eq!(
                error.retry_after(),
                Some(Duration::from_secs(7)),
                "Retry-After is kept"
            );
        }
    }
    // A port nobody listens on: refused.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let agent = LlmAgent::builder()
        .provider(Provider::new("gone", format!("http://{addr}/v1"), "m").api_key(ApiKey::new(KEY)))
        .build()
        .unwrap();
    let (rt, _bus) = runtime(Arc::new(MemoryRunStore::new()), "worker:a", agent);
    let Err(RunError::Agent { error, .. }) = rt.run("llm", json!("hi")).await else {
        panic!("refused connection did not fail");
    };
    assert_eq!(error.class(), Some(FailureClass::Connection), "{error:?}");
    assert!(!format!("{error:?}").contains(KEY));
}

#[tokio::test]
async fn a_429_requeues_the_run_after_its_retry_after_and_the_retry_completes() {
    let server = Server::start().await;
    server.script(
        "p1",
        [
            Reply::Status(429, vec![("retry-after", "7".into())]),
            Reply::Json(answer("done", 5, 5)),
        ],
    );
    let agent = LlmAgent::builder()
        .provider(provider(&server, "p1"))
        .build()
        .unwrap();
    let store = Arc::new(MemoryRunStore::new());
    let (rt, _bus) = runtime(store.clone(), "worker:a", agent);
    let id = rt
        .submit(NewRun::new("llm", json!({"prompt": "hi"})))
        .await
        .unwrap();
    assert_eq!(
        rt.run_queued(id).await.unwrap(),
        Outcome::Requeued {
            delay: Duration::from_secs(7)
        }
    );
    assert!(
        store.steps(id).await.unwrap().is_empty(),
        "a retryable failure journals no result"
    );
    let outcome = rt.run_queued(id).await.unwrap();
    assert_eq!(
        outcome,
        Outcome::Completed {
            output: json!({"answer": "done", "turns": 1})
        }
    );
    assert_eq!(server.calls_to("p1"), 2);
}

#[tokio::test]
async fn a_503_falls_back_to_the_next_provider_in_the_same_step() {
    let server = Server::start().await;
    server.script("p1", [Reply::Status(503, vec![])]);
    server.script("p2", [Reply::Json(answer("from p2", 5, 5))]);
    let agent = LlmAgent::builder()
        .provider(provider(&server, "p1"))
        .provider(provider(&server, "p2"))
        .build()
        .unwrap();
    let store = Arc::new(MemoryRunStore::new());
    let (rt, _bus) = runtime(store.clone(), "worker:a", agent);
    let id = rt
        .submit(NewRun::new("llm", json!({"prompt": "hi"})))
        .await
        .unwrap();
    let outcome = rt.run_queued(id).await.unwrap();
    assert_eq!(
        outcome,
        Outcome::Completed {
            output: json!({"answer": "from p2", "turns": 1})
        }
    );
    assert_eq!((server.calls_to("p1"), server.calls_to("p2")), (1, 1));
    let calls = server.calls();
    assert_eq!(
        calls[1].body["model"], "model-p2",
        "each provider with its model"
    );
    assert_eq!(
        calls[0].idempotency_key, calls[1].idempotency_key,
        "one step, one key"
    );
    let steps = store.steps(id).await.unwrap();
    assert_eq!(steps.len(), 1);
    assert_eq!(steps[0].output.as_ref().unwrap()["provider"], "p2");

    // A slow primary times out (connection) and the fallback answers too.
    server.script(
        "slow1",
        [Reply::Slow(
            Duration::from_secs(5),
            answer("too late", 1, 1),
        )],
    );
    server.script("p3", [Reply::Json(answer("from p3", 1, 1))]);
    let agent = LlmAgent::builder()
        .provider(provider(&server, "slow1"))
        .provider(provider(&server, "p3"))
        .build()
        .unwrap();
    let (rt, _bus) = runtime(Arc::new(MemoryRunStore::new()), "worker:a", agent);
    let (_, outcome) = rt.run("llm", json!("hi")).await.unwrap();
    assert_eq!(
        outcome,
        Outcome::Completed {
            output: json!({"answer": "from p3", "turns": 1})
        }
    );
}

#[tokio::test]
async fn a_401_is_neither_retried_nor_fallen_back() {
    let server = Server::start().await;
    server.script("p1", [Reply::Status(401, vec![])]);
    server.script("p2", [Reply::Json(answer("never", 1, 1))]);
    let agent = LlmAgent::builder()
        .provider(provider(&server, "p1"))
        .provider(provider(&server, "p2"))
        .build()
        .unwrap();
    let store = Arc::new(MemoryRunStore::new());
    let (rt, _bus) = runtime(store.clone(), "worker:a", agent);
    let id = rt
        .submit(NewRun::new("llm", json!({"prompt": "hi"})))
        .await
        .unwrap();
    let outcome = rt.run_queued(id).await.unwrap();
    assert_eq!(
        outcome,
        Outcome::Failed {
            reason: TerminationReason::NotRetryable,
            class: Some(FailureClass::Auth)
        }
    );
    assert_eq!((server.calls_to("p1"), server.calls_to("p2")), (1, 0));
    let run = store.find(id).await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Failed);
    let steps = store.steps(id).await.unwrap();
    assert_eq!(
        steps[0].status,
        StepStatus::Failed,
        "a terminal failure is journaled"
    );
    assert!(!format!("{run:?} {steps:?}").contains(KEY));
}

#[tokio::test]
async fn max_turns_and_the_agents_budget_stop_the_loop() {
    let server = Server::start().await;
    let again = || Reply::Json(tool_call("c", "add", json!({"a": 1, "b": 1}), 10, 10));
    server.script("loop", [again(), again(), again()]);
    let agent = LlmAgent::builder()
        .provider(provider(&server, "loop"))
        .tool(add_tool())
        .max_turns(2)
        .build()
        .unwrap();
    let (rt, _bus) = runtime(Arc::new(MemoryRunStore::new()), "worker:a", agent);
    let (_, outcome) = rt.run("llm", json!("loop")).await.unwrap();
    assert_eq!(
        outcome,
        Outcome::Failed {
            reason: TerminationReason::MaxSteps,
            class: None
        }
    );
    assert_eq!(server.calls_to("loop"), 2);

    server.script("budget", [again(), again(), again()]);
    let agent = LlmAgent::builder()
        .provider(provider(&server, "budget"))
        .tool(add_tool())
        .budget(courier_runs::Budget::new().tokens_out(15))
        .build()
        .unwrap();
    let (rt, _bus) = runtime(Arc::new(MemoryRunStore::new()), "worker:a", agent);
    let (_, outcome) = rt.run("llm", json!("loop")).await.unwrap();
    assert_eq!(
        outcome,
        Outcome::Failed {
            reason: TerminationReason::BudgetExhausted,
            class: None
        }
    );
    assert_eq!(
        server.calls_to("budget"),
        2,
        "10 then 20 tokens out: the third call is not made"
    );
}

/// A tool that blocks forever on its first call (the worker is killed in it), counting calls,
/// and posts its idempotency key to the server's `/tool/NAME` endpoint first.
fn blocking_tool(
    server: &Server,
    name: &'static str,
    effect: Effect,
    calls: Arc<AtomicU32>,
) -> Tool {
    let server = server.clone();
    Tool::new(
        name,
        "does something outside",
        json!({"type": "object"}),
        effect,
        move |_args, step| {
            let (server, calls) = (server.clone(), calls.clone());
            async move {
                server.call_tool(name, step.key()).await;
                if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                    std::future::pending::<()>().await;
                }
                Ok(json!({"done": name}))
            }
        },
    )
}

/// Submits a run on `a`, kills it once the tool ran `times` times, expires its lease and lets
/// `b`'s reaper requeue it.
async fn kill_in_tool(
    store: &courier_runs::SqlRunStore,
    a: &courier_runs::Runtime,
    b: &courier_runs::Runtime,
    calls: &AtomicU32,
) -> uuid::Uuid {
    let id = a
        .submit(NewRun::new("llm", json!({"prompt": "go"})))
        .await
        .unwrap();
    let rt = a.clone();
    let task = tokio::spawn(async move { rt.run_queued(id).await });
    while calls.load(Ordering::SeqCst) == 0 {
        assert!(
            !task.is_finished(),
            "the run ended before the tool: {:?}",
            task.await
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    task.abort();
    let _ = task.await;
    support::expire_lease(store, id).await;
    let report = b
        .reaper()
        .reap(courier_runs::ReapOptions::default())
        .await
        .unwrap();
    assert_eq!(report.requeued, 1, "{report:?}");
    id
}

fn two_agents(
    server: &Server,
    provider_name: &str,
    tool: impl Fn() -> Tool,
) -> (LlmAgent, LlmAgent) {
    let build = || {
        LlmAgent::builder()
            .provider(provider(server, provider_name))
            .tool(tool())
            .build()
            .unwrap()
    };
    (build(), build())
}

#[tokio::test]
async fn a_resumed_run_never_calls_the_model_again_for_a_finished_step() {
    let server = Server::start().await;
    server.script(
        "p1",
        [
            Reply::Json(tool_call("c1", "lookup", json!({}), 10, 10)),
            Reply::Json(answer("found it", 10, 10)),
        ],
    );
    let calls = Arc::new(AtomicU32::new(0));
    let (first, second) = two_agents(&server, "p1", || {
        blocking_tool(&server, "lookup", Effect::Idempotent, calls.clone())
    });
    let (store, _dir, _dsn) = support::sqlite_store().await;
    let shared: Arc<dyn RunStore> = Arc::new(store.clone());
    let (a, _bus_a) = runtime(shared.clone(), "worker:a", first);
    let (b, _bus_b) = runtime(shared.clone(), "worker:b", second);
    let id = kill_in_tool(&store, &a, &b, &calls).await;
    assert_eq!(
        server.calls_to("p1"),
        1,
        "the first model call happened before the kill"
    );

    let outcome = b.run_queued(id).await.unwrap();
    assert_eq!(
        outcome,
        Outcome::Completed {
            output: json!({"answer": "found it", "turns": 2})
        }
    );
    assert_eq!(
        server.calls_to("p1"),
        2,
        "the finished model step was replayed, not called again"
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "the idempotent tool, unfinished, ran again"
    );
    let run = shared.find(id).await.unwrap().unwrap();
    assert_eq!(run.steps_replayed, 1);
    assert_eq!(
        (run.usage.tokens_out, run.usage.turns, run.usage.tool_calls),
        (20, 2, 1),
        "usage counted once"
    );
}

#[tokio::test]
async fn a_crash_in_a_guarded_tool_retries_with_the_same_key_once() {
    let server = Server::start().await;
    server.script(
        "p1",
        [
            Reply::Json(tool_call("c1", "refund", json!({}), 10, 10)),
            Reply::Json(answer("refunded", 10, 10)),
        ],
    );
    let calls = Arc::new(AtomicU32::new(0));
    let (first, second) = two_agents(&server, "p1", || {
        blocking_tool(
            &server,
            "refund",
            Effect::Guarded(OnAmbiguous::Retry),
            calls.clone(),
        )
    });
    let (store, _dir, _dsn) = support::sqlite_store().await;
    let shared: Arc<dyn RunStore> = Arc::new(store.clone());
    let (a, _bus_a) = runtime(shared.clone(), "worker:a", first);
    let (b, _bus_b) = runtime(shared.clone(), "worker:b", second);
    let id = kill_in_tool(&store, &a, &b, &calls).await;
    let outcome = b.run_queued(id).await.unwrap();
    assert_eq!(
        outcome,
        Outcome::Completed {
            output: json!({"answer": "refunded", "turns": 2})
        }
    );
    let keys = server.tool_keys("refund");
    assert_eq!(
        keys,
        [format!("{id}:2"), format!("{id}:2")],
        "the same key twice, never a third time"
    );
    assert_eq!(server.calls_to("p1"), 2);
}

#[tokio::test]
async fn a_crash_in_a_parked_guarded_tool_parks_the_run() {
    let server = Server::start().await;
    server.script(
        "p1",
        [Reply::Json(tool_call("c1", "pay", json!({}), 10, 10))],
    );
    let calls = Arc::new(AtomicU32::new(0));
    let (first, second) = two_agents(&server, "p1", || {
        blocking_tool(
            &server,
            "pay",
            Effect::Guarded(OnAmbiguous::Park),
            calls.clone(),
        )
    });
    let (store, _dir, _dsn) = support::sqlite_store().await;
    let shared: Arc<dyn RunStore> = Arc::new(store.clone());
    let (a, _bus_a) = runtime(shared.clone(), "worker:a", first);
    let (b, _bus_b) = runtime(shared.clone(), "worker:b", second);
    let id = kill_in_tool(&store, &a, &b, &calls).await;
    assert_eq!(b.run_queued(id).await.unwrap(), Outcome::AwaitingApproval);
    let run = shared.find(id).await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::WaitingForApproval);
    assert_eq!(run.pending_effect.as_deref(), Some("step 2: tool:pay"));
    assert_eq!(
        server.tool_keys("pay").len(),
        1,
        "a parked tool is not called again"
    );
    assert_eq!(server.calls_to("p1"), 1, "nor is the model");
}

#[tokio::test]
async fn bad_tool_arguments_and_unknown_tools_are_answered_to_the_model() {
    let server = Server::start().await;
    let bad_args = json!({"choices": [{"message": {"role": "assistant", "content": null, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{not json"}},
        {"id": "c2", "type": "function", "function": {"name": "nope", "arguments": "{}"}}
    ]}}], "usage": {"prompt_tokens": 1, "completion_tokens": 1}});
    server.script(
        "p1",
        [Reply::Json(bad_args), Reply::Json(answer("ok", 1, 1))],
    );
    let agent = LlmAgent::builder()
        .provider(provider(&server, "p1"))
        .tool(add_tool())
        .build()
        .unwrap();
    let (rt, _bus) = runtime(Arc::new(MemoryRunStore::new()), "worker:a", agent);
    let (_, outcome) = rt.run("llm", json!("x")).await.unwrap();
    assert_eq!(
        outcome,
        Outcome::Completed {
            output: json!({"answer": "ok", "turns": 2})
        }
    );
    let messages: Vec<Value> = server.calls()[1].body["messages"]
        .as_array()
        .unwrap()
        .clone();
    let tool_answers: Vec<&str> = messages
        .iter()
        .filter(|m| m["role"] == "tool")
        .filter_map(|m| m["content"].as_str())
        .collect();
    assert!(tool_answers[0].contains("not JSON"), "{tool_answers:?}");
    assert!(
        tool_answers[1].contains("no tool named `nope`"),
        "{tool_answers:?}"
    );
}
