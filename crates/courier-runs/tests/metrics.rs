//! A worker's run executions and the reaper emit the documented metrics. One test per binary:
//! the recorder is process-global.
#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::Arc;
use std::time::Duration;

use courier_core::MessageBus;
use courier_core::metrics as m;
use courier_runs::{MemoryRunStore, Outcome, Runtime, RuntimeOptions, ScriptedAgent};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use serde_json::json;

#[tokio::test(start_paused = true)]
async fn run_outcomes_requeues_and_lease_renewals_are_counted() {
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    recorder.install().unwrap();

    let store = MemoryRunStore::new();
    let queue = courier_core::InMemoryTransport::new();
    let runtime = Runtime::builder(Arc::new(store.clone()))
        .agent("scripted", ScriptedAgent)
        .worker_identity("worker:metrics:1:aaaaaaaa")
        .options(RuntimeOptions {
            lease_check_every: None,
            ..RuntimeOptions::default()
        })
        .build();
    let _bus = runtime
        .register(
            MessageBus::builder()
                .transport("async", Arc::new(queue.clone()))
                .route("courier.run_agent", ["async"]),
        )
        .build();

    // Three step boundaries (the output is one): three renewals, one completed run.
    let done = runtime
        .enqueue(
            "scripted",
            json!({"steps": [{"sleep_ms": 1}, {"sleep_ms": 1}, {"output": 1}]}),
        )
        .await
        .unwrap();
    assert!(matches!(
        runtime.run_queued(done).await.unwrap(),
        Outcome::Completed { .. }
    ));
    // A retryable failure: requeued, counted by class.
    let flaky = runtime
        .enqueue(
            "scripted",
            json!({"steps": [{"fail": "rate_limit", "attempts": 1}]}),
        )
        .await
        .unwrap();
    assert!(matches!(
        runtime.run_queued(flaky).await.unwrap(),
        Outcome::Requeued { .. }
    ));
    // A run already settled: not claimed.
    assert_eq!(runtime.run_queued(done).await.unwrap(), Outcome::NotClaimed);
    tokio::time::sleep(Duration::from_millis(1)).await;

    let mut counters = std::collections::BTreeMap::new();
    let mut durations = 0;
    for (key, _, _, value) in snap.snapshot().into_vec() {
        let key = key.key();
        let labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        match value {
            DebugValue::Counter(n) => {
                counters.insert(format!("{}{labels:?}", key.name()), n);
            }
            DebugValue::Histogram(v) if key.name() == m::RUN_DURATION => durations += v.len(),
            _ => {}
        }
    }
    let get = |k: &str| counters.get(k).copied().unwrap_or(0);
    assert_eq!(
        get(r#"courier_runs_total["outcome=completed"]"#),
        1,
        "{counters:?}"
    );
    assert_eq!(
        get(r#"courier_runs_total["outcome=requeued"]"#),
        1,
        "{counters:?}"
    );
    assert_eq!(
        get(r#"courier_runs_total["outcome=not_claimed"]"#),
        1,
        "{counters:?}"
    );
    assert_eq!(
        get(r#"courier_run_requeues_total["class=rate_limit"]"#),
        1,
        "{counters:?}"
    );
    assert_eq!(get("courier_lease_renewals_total[]"), 3, "{counters:?}");
    assert_eq!(get("courier_leases_lost_total[]"), 0, "{counters:?}");
    assert_eq!(durations, 2, "a lost claim has no duration");
}
