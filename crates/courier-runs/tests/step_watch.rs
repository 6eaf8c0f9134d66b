//! What watches a worker run between its step boundaries: an operator's cancel reaches a running
//! agent within a second, and `runs.step_timeout` cancels a step that runs too long and fails
//! the execution as a retryable timeout (tokio's paused clock, in-memory store).
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use courier_runs::{
    FailureClass, MemoryRunStore, Outcome, RunStatus, RunStore, RuntimeOptions, TerminationReason,
};
use serde_json::json;
use support::{row, runtime_with};
use tokio::time::Instant;

const A: &str = "worker:test-a:1:aaaaaaaa";

#[tokio::test(start_paused = true)]
async fn a_running_run_cancelled_by_an_operator_stops_its_hung_agent_within_a_second() {
    let store = MemoryRunStore::new();
    // Default options: the watcher reads the row every 500 ms.
    let (worker, _bus, _) = runtime_with(&store, A, |b| b);
    // The operator's side: another runtime on the same store (another host, `courier runs cancel`).
    let (operator, _obus, _) = runtime_with(&store, "worker:ops:9:cccccccc", |b| b);
    let id = worker
        .enqueue(
            "scripted",
            json!({"steps": [{"hang_ms": 3_600_000}, {"output": "never"}]}),
        )
        .await
        .unwrap();
    let task = tokio::spawn({
        let worker = worker.clone();
        async move { worker.run_queued(id).await }
    });
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    assert_eq!(row(&store, id).await.status, RunStatus::Running);
    assert!(operator.cancel(id).await.unwrap());
    let cancelled_at = Instant::now();
    let outcome = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the hung agent is stopped")
        .unwrap()
        .unwrap();
    assert_eq!(outcome, Outcome::Cancelled);
    assert!(
        cancelled_at.elapsed() <= Duration::from_secs(1),
        "stopped {:?} after the cancel",
        cancelled_at.elapsed()
    );
    let now = row(&store, id).await;
    assert_eq!(
        (now.status, now.termination_reason),
        (RunStatus::Cancelled, Some(TerminationReason::Cancelled)),
        "the cancel stands; the worker settled nothing over it"
    );
    assert!(store.events(id).await.unwrap().is_empty(), "no step ran");
}

#[tokio::test(start_paused = true)]
async fn without_the_watcher_a_hung_agent_ignores_a_cancel_until_its_boundary() {
    // The control for the test above: the watcher, not the boundary, stopped that agent.
    let store = MemoryRunStore::new();
    let options = RuntimeOptions {
        lease_check_every: None,
        ..RuntimeOptions::default()
    };
    let (worker, _bus, _) = runtime_with(&store, A, |b| b.options(options));
    let id = worker
        .enqueue(
            "scripted",
            json!({"steps": [{"hang_ms": 3_600_000}, {"output": "never"}]}),
        )
        .await
        .unwrap();
    let task = tokio::spawn({
        let worker = worker.clone();
        async move { worker.run_queued(id).await }
    });
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    assert!(worker.cancel(id).await.unwrap());
    assert!(
        tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .is_err(),
        "still hung a minute after the cancel"
    );
}

#[tokio::test(start_paused = true)]
async fn a_step_longer_than_the_step_timeout_is_cancelled_and_requeued_as_a_retryable_timeout() {
    let store = MemoryRunStore::new();
    let options = RuntimeOptions {
        step_timeout: Some(Duration::from_secs(2)),
        ..RuntimeOptions::default()
    };
    let (worker, _bus, _) = runtime_with(&store, A, |b| b.options(options));
    let id = worker
        .enqueue(
            "scripted",
            json!({"steps": [{"sleep_ms": 500}, {"hang_ms": 3_600_000}, {"output": "never"}]}),
        )
        .await
        .unwrap();
    let started = Instant::now();
    let outcome = tokio::time::timeout(Duration::from_secs(60), worker.run_queued(id))
        .await
        .expect("the step timeout fired")
        .unwrap();
    assert!(
        matches!(outcome, Outcome::Requeued { .. }),
        "retryable: {outcome:?}"
    );
    // The first step's boundary at 0.5 s restarted the clock: 0.5 s + 2 s.
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(2_500) && took < Duration::from_millis(2_600),
        "timed out after {took:?}"
    );
    let now = row(&store, id).await;
    assert_eq!(now.status, RunStatus::Queued);
    assert_eq!(now.requeue_count, 1);
    let kinds: Vec<String> = store
        .events(id)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(kinds, ["sleep"], "the first step only");
}

#[tokio::test(start_paused = true)]
async fn a_timed_out_step_with_no_requeue_left_is_dead_lettered_as_a_connection_failure() {
    let store = MemoryRunStore::new();
    let options = RuntimeOptions {
        step_timeout: Some(Duration::from_secs(2)),
        max_requeues: 0,
        ..RuntimeOptions::default()
    };
    let (worker, _bus, _) = runtime_with(&store, A, |b| b.options(options));
    let id = worker
        .enqueue("scripted", json!({"steps": [{"hang_ms": 3_600_000}]}))
        .await
        .unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(60), worker.run_queued(id))
        .await
        .expect("the step timeout fired")
        .unwrap();
    // Retryable (a budget was what stopped it, not the class), classed like every timeout.
    assert_eq!(
        outcome,
        Outcome::Failed {
            reason: TerminationReason::RetriesExhausted,
            class: Some(FailureClass::Connection)
        }
    );
    assert_eq!(
        row(&store, id).await.error_class,
        Some(FailureClass::Connection)
    );
}

#[tokio::test(start_paused = true)]
async fn the_step_timeout_bounds_each_step_not_the_whole_run() {
    let store = MemoryRunStore::new();
    let options = RuntimeOptions {
        step_timeout: Some(Duration::from_secs(2)),
        ..RuntimeOptions::default()
    };
    let (worker, _bus, _) = runtime_with(&store, A, |b| b.options(options));
    let id = worker
        .enqueue(
            "scripted",
            json!({"steps": [{"sleep_ms": 1_500}, {"sleep_ms": 1_500}, {"sleep_ms": 1_500}, {"output": "done"}]}),
        )
        .await
        .unwrap();
    let outcome = worker.run_queued(id).await.unwrap();
    assert_eq!(
        outcome,
        Outcome::Completed {
            output: json!("done")
        }
    );
    assert_eq!(row(&store, id).await.status, RunStatus::Completed);
}
