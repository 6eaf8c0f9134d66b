//! Streamed answers (`stream = true`) from a real HTTP server on 127.0.0.1
//! ([`courier_agent::testing::TestServer`], `Reply::Sse`): the SSE stream is folded into the
//! same model turn (content, tool calls, usage); a stream cut before its `[DONE]` is a
//! `connection` failure: the chain falls back, and alone the run is requeued and retried.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;

use courier_agent::testing::{Reply, TestServer};
use courier_agent::{LlmAgent, Provider, Tool};
use courier_runs::{Effect, FailureClass, MemoryRunStore, NewRun, Outcome, RunError, RunStore};
use serde_json::{Value, json};
use support::runtime;

fn delta(d: Value) -> String {
    json!({"choices": [{"index": 0, "delta": d}]}).to_string()
}

fn usage(tokens_in: u64, tokens_out: u64) -> String {
    json!({"choices": [], "usage": {"prompt_tokens": tokens_in, "completion_tokens": tokens_out}})
        .to_string()
}

/// A streamed answer of `words`, with its usage and `[DONE]`.
fn streamed_answer(words: &[&str]) -> Vec<String> {
    let mut items: Vec<String> = words.iter().map(|w| delta(json!({"content": w}))).collect();
    items
        .push(json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}).to_string());
    items.push(usage(11, 4));
    items.push("[DONE]".to_owned());
    items
}

fn streaming(server: &TestServer, name: &str) -> Provider {
    Provider::new(name, server.base_url(name), "m")
        .timeout(std::time::Duration::from_secs(5))
        .stream(true)
}

#[tokio::test]
async fn a_streamed_tool_call_and_answer_fold_into_the_journaled_turns() {
    let server = TestServer::start(|req| match req.turn() {
        1 => Reply::Sse(vec![
            delta(
                json!({"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                "function": {"name": "add", "arguments": "{\"a\":"}}]}),
            ),
            delta(json!({"tool_calls": [{"index": 0, "function": {"arguments": "2,\"b\":3}"}}]})),
            usage(20, 6),
            "[DONE]".to_owned(),
        ]),
        _ => Reply::Sse(streamed_answer(&["The sum ", "is ", "5."])),
    })
    .await
    .unwrap();
    let agent = LlmAgent::builder()
        .provider(streaming(&server, "p1"))
        .tool(Tool::new(
            "add",
            "adds",
            json!({"type": "object"}),
            Effect::Pure,
            |args, _| async move {
                Ok(json!(
                    args["a"].as_i64().unwrap() + args["b"].as_i64().unwrap()
                ))
            },
        ))
        .build()
        .unwrap();
    let store = Arc::new(MemoryRunStore::new());
    let (rt, _bus) = runtime(store.clone(), "worker:a", agent);
    let (id, outcome) = rt.run("llm", json!({"prompt": "2+3?"})).await.unwrap();
    assert_eq!(
        outcome,
        Outcome::Completed {
            output: json!({"answer": "The sum is 5.", "turns": 2})
        }
    );
    let steps = store.steps(id).await.unwrap();
    let names: Vec<&str> = steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["model", "tool:add", "model"]);
    let first = steps[0].output.as_ref().unwrap();
    assert_eq!(first["tool_calls"][0]["arguments"], "{\"a\":2,\"b\":3}");
    assert_eq!(steps[1].output, Some(json!(5)));
    let last = steps[2].output.as_ref().unwrap();
    assert_eq!(
        last["content"], "The sum is 5.",
        "the stream folded into the result"
    );
    assert_eq!(
        (last["tokens_in"].as_u64(), last["tokens_out"].as_u64()),
        (Some(11), Some(4))
    );
    let run = store.find(id).await.unwrap().unwrap();
    assert_eq!((run.usage.tokens_in, run.usage.tokens_out), (31, 10));
    assert_eq!(server.calls().len(), 2, "one call per model step");
}

#[tokio::test]
async fn a_stream_cut_mid_way_is_a_connection_failure_then_fallback_or_retry() {
    // p1 cuts its stream mid-way (no [DONE]); p2 streams the answer.
    let server = TestServer::start(|req| match (req.provider.as_str(), req.attempt) {
        ("p1", 1) => Reply::Sse(vec![delta(json!({"content": "Partial ans"}))]),
        _ => Reply::Sse(streamed_answer(&["Whole ", "answer."])),
    })
    .await
    .unwrap();
    let agent = LlmAgent::builder()
        .provider(streaming(&server, "p1"))
        .provider(streaming(&server, "p2"))
        .build()
        .unwrap();
    let (rt, _bus) = runtime(Arc::new(MemoryRunStore::new()), "worker:a", agent);
    let (_, outcome) = rt.run("llm", json!("hi")).await.unwrap();
    assert_eq!(
        outcome,
        Outcome::Completed {
            output: json!({"answer": "Whole answer.", "turns": 1})
        },
        "the partial output of the cut stream is dropped"
    );
    let providers: Vec<String> = server.calls().iter().map(|c| c.provider.clone()).collect();
    assert_eq!(providers, ["p1", "p2"], "fell back in the same step");

    // Alone, p1's cut stream fails the step as `connection`: requeued, and the retry (same
    // step key, second attempt) completes.
    let agent = LlmAgent::builder()
        .provider(streaming(&server, "p1"))
        .build()
        .unwrap();
    let (once, _bus1) = runtime(Arc::new(MemoryRunStore::new()), "worker:c", agent.clone());
    match once.run("llm", json!("hi")).await {
        Err(RunError::Agent { error, .. }) => {
            assert_eq!(error.class(), Some(FailureClass::Connection), "{error:?}");
        }
        other => panic!("expected a connection failure, got {other:?}"),
    }
    let store = Arc::new(MemoryRunStore::new());
    let (rt, _bus) = runtime(store.clone(), "worker:b", agent);
    let id = rt
        .submit(NewRun::new("llm", json!({"prompt": "hi"})))
        .await
        .unwrap();
    let first = rt.run_queued(id).await.unwrap();
    assert!(
        matches!(first, Outcome::Requeued { .. }),
        "retried: {first:?}"
    );
    assert!(
        store.steps(id).await.unwrap().is_empty(),
        "nothing journaled"
    );
    // The retry is p1's second call with this key: it streams the whole answer.
    let outcome = rt.run_queued(id).await.unwrap();
    assert_eq!(
        outcome,
        Outcome::Completed {
            output: json!({"answer": "Whole answer.", "turns": 1})
        }
    );
}

#[tokio::test]
async fn a_stream_whose_chunk_is_not_json_breaks_the_protocol() {
    let server =
        TestServer::start(|_| Reply::Sse(vec!["{not json".to_owned(), "[DONE]".to_owned()]))
            .await
            .unwrap();
    let agent = LlmAgent::builder()
        .provider(streaming(&server, "p1"))
        .build()
        .unwrap();
    let (rt, _bus) = runtime(Arc::new(MemoryRunStore::new()), "worker:a", agent);
    match rt.run("llm", json!("hi")).await {
        Err(RunError::Agent { error, .. }) => {
            assert_eq!(error.class(), Some(FailureClass::Protocol), "{error:?}");
        }
        other => panic!("expected a protocol failure, got {other:?}"),
    }
}

/// A streaming step's chunks go to its run's stream in the run store's database (SQLite here,
/// two pools: the worker's and a reader's, as a dashboard process would have): offsets 1, 2, ...
/// with no gap; the retried step first publishes a `retry` marker (a reader drops the partial
/// output before it); the completed step ends with `done` and its journaled result holds the
/// whole text; a reader resuming after an offset gets exactly the rest; events expire after
/// their TTL, and pruning never lets an offset be reused.
#[tokio::test]
async fn a_streamed_step_appends_offsets_a_retry_marker_and_done_to_its_runs_stream() {
    use courier_agent::{SqlStreams, StreamKind, StreamStore};
    let server = TestServer::start(|req| match req.attempt {
        1 => Reply::Sse(vec![
            delta(json!({"content": "Partial "})),
            delta(json!({"content": "ans"})),
        ]),
        _ => Reply::Sse(streamed_answer(&["Whole ", "answer."])),
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let dsn = format!("sqlite://{}?mode=rwc", dir.path().join("runs.db").display());
    let pool = || async {
        courier_sql::sqlite_pool(&dsn, &courier_sql::PoolSettings::default())
            .await
            .unwrap()
    };
    let writer = SqlStreams::new(pool().await, None).unwrap();
    writer.setup().await.unwrap();
    let reader = SqlStreams::new(pool().await, None).unwrap();
    let ttl = std::time::Duration::from_secs(600);
    let agent = LlmAgent::builder()
        .provider(streaming(&server, "p1"))
        .streams(Arc::new(writer.clone()), ttl)
        .build()
        .unwrap();
    let store = Arc::new(MemoryRunStore::new());
    let (rt, _bus) = runtime(store.clone(), "worker:a", agent);
    let id = rt
        .submit(NewRun::new("llm", json!({"prompt": "hi"})))
        .await
        .unwrap();
    let first = rt.run_queued(id).await.unwrap();
    assert!(matches!(first, Outcome::Requeued { .. }), "{first:?}");
    let second = rt.run_queued(id).await.unwrap();
    assert!(matches!(second, Outcome::Completed { .. }), "{second:?}");

    let now = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    let run = id.to_string();
    let events = reader.read(&run, 0, 1000, now).await.unwrap();
    let offsets: Vec<i64> = events.iter().map(|e| e.offset).collect();
    assert_eq!(
        offsets,
        (1..=offsets.len() as i64).collect::<Vec<_>>(),
        "no gap"
    );
    assert!(events.iter().all(|e| e.step == 1), "{events:?}");
    let retry = events
        .iter()
        .position(|e| e.kind == StreamKind::Retry)
        .expect("a retry marker");
    let text = |es: &[courier_agent::StreamEvent]| -> String {
        es.iter()
            .filter(|e| e.kind == StreamKind::Chunk)
            .map(|e| e.data.as_str())
            .collect()
    };
    assert_eq!(
        text(&events[..retry]),
        "Partial ans",
        "the cut attempt's output"
    );
    assert_eq!(
        text(&events[retry..]),
        "Whole answer.",
        "the retry's output"
    );
    assert_eq!(events.last().map(|e| e.kind), Some(StreamKind::Done));
    assert_eq!(
        events
            .iter()
            .filter(|e| e.kind == StreamKind::Retry)
            .count(),
        1
    );
    let steps = store.steps(id).await.unwrap();
    assert_eq!(
        steps[0].output.as_ref().unwrap()["content"],
        "Whole answer.",
        "folded into the step's result"
    );

    // A reader resuming after each offset gets exactly the rest.
    for seen in 0..events.len() {
        let rest = reader
            .read(&run, events[seen].offset, 1000, now)
            .await
            .unwrap();
        assert_eq!(
            rest,
            events[seen + 1..],
            "resumed after offset {}",
            events[seen].offset
        );
    }

    // Expired after the TTL; pruned, and the next offset still follows the last one.
    let later = now + 601_000;
    assert!(reader.read(&run, 0, 1000, later).await.unwrap().is_empty());
    let pruned = reader.prune(later).await.unwrap();
    assert_eq!(
        pruned,
        events.len() as u64 - 1,
        "the newest stays as a tombstone"
    );
    let next = writer
        .append(&run, 3, StreamKind::Done, "", later, ttl)
        .await
        .unwrap();
    assert_eq!(next, events.len() as i64 + 1, "offsets are never reused");
}

/// `SqlStreams` on PostgreSQL: two pools (a worker's, a reader's) on one table: consecutive
/// offsets per run, a resumed read gets exactly the rest, expiry, pruning keeps the newest so
/// that no offset is reused.
#[cfg(feature = "postgres")]
#[tokio::test]
#[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
async fn postgres_streams_keep_offsets_across_pools() {
    use courier_agent::{SqlStreams, StreamKind, StreamStore};
    let cleanup = courier_test::Cleanup::new();
    let table = cleanup.postgres_table("agent_streams");
    let url = courier_test::env::postgres_url();
    let writer = SqlStreams::connect(&url, Some(&table)).await.unwrap();
    let reader = SqlStreams::connect(&url, Some(&table)).await.unwrap();
    let ttl = std::time::Duration::from_secs(60);
    let (now, run) = (1_000_000_i64, uuid::Uuid::new_v4().to_string());
    let other = uuid::Uuid::new_v4().to_string();
    for (i, (kind, data)) in [
        (StreamKind::Chunk, "Hel"),
        (StreamKind::Retry, ""),
        (StreamKind::Chunk, "Hello"),
        (StreamKind::Done, ""),
    ]
    .into_iter()
    .enumerate()
    {
        let offset = writer.append(&run, 1, kind, data, now, ttl).await.unwrap();
        assert_eq!(offset, i as i64 + 1);
    }
    assert_eq!(
        writer
            .append(&other, 1, StreamKind::Chunk, "x", now, ttl)
            .await
            .unwrap(),
        1,
        "offsets are per run"
    );
    let all = reader.read(&run, 0, 100, now).await.unwrap();
    assert_eq!(all.len(), 4);
    assert_eq!(reader.read(&run, 2, 100, now).await.unwrap(), all[2..]);
    assert_eq!(all[1].kind, StreamKind::Retry);
    let later = now + 61_000;
    assert!(reader.read(&run, 0, 100, later).await.unwrap().is_empty());
    assert_eq!(
        reader.prune(later).await.unwrap(),
        3,
        "the newest of each run stays"
    );
    assert_eq!(
        writer
            .append(&run, 2, StreamKind::Chunk, "y", later, ttl)
            .await
            .unwrap(),
        5
    );
}
