//! The runtime rules on the in-memory store with tokio's paused clock.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use courier_core::MessageBus;
use courier_runs::{
    Agent, AgentError, AgentOutcome, FailureClass, MemoryRunStore, NewRun, Outcome, ProviderError,
    ReapOptions, Run, RunContext, RunError, RunEvent, RunStatus, RunStore, Runtime, RuntimeOptions,
    ScriptedAgent, Settlement, Step, StoreError, TerminationReason,
};
use serde_json::json;
use support::{
    OutageTransport, dispatched, outage_runtime, queued_runtime, refusing_runtime, row,
    runtime_with, unreachable_runtime,
};
use tokio::time::Instant;
use uuid::Uuid;

const A: &str = "worker:test-a:1:aaaaaaaa";
const B: &str = "worker:test-b:2:bbbbbbbb";

/// Fails with the provider error `make` builds.
struct FailWith(fn() -> AgentError);

#[courier_runs::async_trait]
impl Agent for FailWith {
    async fn run(&self, cx: &mut RunContext) -> Result<AgentOutcome, AgentError> {
        cx.checkpoint(Step::new("call", json!(null))).await?;
        Err((self.0)())
    }
}

/// Three steps 10 s apart; after each boundary records (claimed_by, lease_expires, now).
/// (claimed_by, lease_expires, now) after each boundary.
type Seen = Arc<Mutex<Vec<(Option<String>, i64, i64)>>>;

struct Probe(MemoryRunStore, Seen);

#[courier_runs::async_trait]
impl Agent for Probe {
    async fn run(&self, cx: &mut RunContext) -> Result<AgentOutcome, AgentError> {
        for i in 0..3 {
            tokio::time::sleep(Duration::from_secs(10)).await;
            cx.checkpoint(Step::new("step", json!(i))).await?;
            let row = self.0.find(cx.run().id).await.unwrap().unwrap();
            let now = self.0.now_ms().await.unwrap();
            self.1
                .lock()
                .unwrap()
                .push((row.claimed_by, row.lease_expires, now));
        }
        Ok(AgentOutcome::Completed(json!("probed")))
    }
}

/// Moves its own claim to another worker, then fails retryably.
struct MoveLeaseThenFail(MemoryRunStore);

#[courier_runs::async_trait]
impl Agent for MoveLeaseThenFail {
    async fn run(&self, cx: &mut RunContext) -> Result<AgentOutcome, AgentError> {
        self.0
            .rewrite(cx.run().id, |r| r.claimed_by = Some(B.into()));
        Err(ProviderError::http(503).into())
    }
}

struct StopsAtMaxSteps;

#[courier_runs::async_trait]
impl Agent for StopsAtMaxSteps {
    async fn run(&self, _: &mut RunContext) -> Result<AgentOutcome, AgentError> {
        Ok(AgentOutcome::Stopped(TerminationReason::MaxSteps))
    }
}

#[tokio::test(start_paused = true)]
async fn two_workers_race_for_one_run_and_the_loser_runs_nothing() {
    let store = MemoryRunStore::new();
    let (a, _bus_a, queue) = queued_runtime(Arc::new(store.clone()), A, RuntimeOptions::default());
    let (b, _bus_b, _) = queued_runtime(Arc::new(store.clone()), B, RuntimeOptions::default());
    let id = a
        .enqueue(
            "scripted",
            json!({"steps": [{"sleep_ms": 10}, {"output": "done"}]}),
        )
        .await
        .unwrap();
    assert_eq!(dispatched(&queue), [(id, None)]);
    let (ra, rb) = tokio::join!(a.run_queued(id), b.run_queued(id));
    let mut outcomes = [ra.unwrap(), rb.unwrap()];
    outcomes.sort_by_key(|o| matches!(o, Outcome::NotClaimed));
    assert_eq!(
        outcomes,
        [
            Outcome::Completed {
                output: json!("done")
            },
            Outcome::NotClaimed
        ]
    );
    assert_eq!(
        store.events(id).await.unwrap().len(),
        2,
        "only the winner's steps"
    );
    assert_eq!(
        a.run_queued(id).await.unwrap(),
        Outcome::NotClaimed,
        "a stale duplicate message is harmless"
    );
}

#[tokio::test(start_paused = true)]
async fn worker_run_renews_once_per_boundary_under_its_identity() {
    let store = MemoryRunStore::new();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let options = RuntimeOptions {
        lease: Duration::from_secs(60),
        lease_check_every: None,
        ..RuntimeOptions::default()
    };
    let (rt, _bus, queue) = runtime_with(&store, A, |b| {
        b.agent("probe", Probe(store.clone(), seen.clone()))
            .options(options)
    });
    let id = rt.enqueue("probe", json!({})).await.unwrap();
    assert_eq!(dispatched(&queue).len(), 1);
    assert!(matches!(
        rt.run_queued(id).await.unwrap(),
        Outcome::Completed { .. }
    ));
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 3);
    for (claimed_by, lease_expires, now) in &seen {
        assert_eq!(claimed_by.as_deref(), Some(A));
        assert_eq!(
            *lease_expires,
            now + 60_000,
            "renewed at this boundary, expiry in the future"
        );
    }
    assert!(
        seen[1].1 > seen[0].1 && seen[2].1 > seen[1].1,
        "each boundary pushed the lease out"
    );
    let done = row(&store, id).await;
    assert_eq!((done.status, done.lease_expires), (RunStatus::Completed, 0));
}

#[tokio::test(start_paused = true)]
async fn interactive_run_never_renews_and_holds_no_lease() {
    let store = MemoryRunStore::new();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (rt, _bus, queue) = runtime_with(&store, A, |b| {
        b.agent("probe", Probe(store.clone(), seen.clone()))
    });
    let (id, outcome) = rt.run("probe", json!({})).await.unwrap();
    assert_eq!(
        outcome,
        Outcome::Completed {
            output: json!("probed")
        }
    );
    for (claimed_by, lease_expires, _) in seen.lock().unwrap().iter() {
        assert_eq!((claimed_by.as_deref(), *lease_expires), (None, 0));
    }
    assert_eq!(row(&store, id).await.status, RunStatus::Completed);
    assert!(queue.sent().is_empty(), "no message for an interactive run");
}

#[tokio::test(start_paused = true)]
async fn lease_lost_stops_without_settling_or_persisting_and_the_new_owner_continues() {
    let store = MemoryRunStore::new();
    let options = RuntimeOptions {
        lease_check_every: None,
        ..RuntimeOptions::default()
    };
    let (a, _bus_a, _) = runtime_with(&store, A, |b| b.options(options.clone()));
    let (b, _bus_b, _) = runtime_with(&store, B, |b| b.options(options));
    let steps = json!({"steps": [{"sleep_ms": 1000}, {"sleep_ms": 1000}, {"sleep_ms": 1000}]});
    let id = a.enqueue("scripted", steps).await.unwrap();
    let task = tokio::spawn({
        let a = a.clone();
        async move { a.run_queued(id).await }
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(store.events(id).await.unwrap().len(), 1);
    store.rewrite(id, |r| r.claimed_by = Some(B.into())); // another identity now owns the row
    assert_eq!(task.await.unwrap().unwrap(), Outcome::LeaseLost);
    let now = row(&store, id).await;
    assert_eq!(
        (
            now.status,
            now.claimed_by.as_deref(),
            now.termination_reason
        ),
        (RunStatus::Running, Some(B), None)
    );
    assert_eq!(
        store.events(id).await.unwrap().len(),
        1,
        "the refused boundary persisted nothing"
    );

    // The new owner executes it again (as after a requeue) and continues the stream.
    store.rewrite(id, |r| {
        r.status = RunStatus::Queued;
        r.claimed_by = None;
    });
    assert!(matches!(
        b.run_queued(id).await.unwrap(),
        Outcome::Completed { .. }
    ));
    let seqs: Vec<i64> = store
        .events(id)
        .await
        .unwrap()
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(seqs, [1, 2, 3, 4], "MAX(seq)+1, no duplicate");
}

#[tokio::test(start_paused = true)]
async fn hung_agent_is_cancelled_promptly_when_its_lease_is_lost() {
    let store = MemoryRunStore::new();
    let options = RuntimeOptions {
        lease_check_every: Some(Duration::from_secs(1)),
        ..RuntimeOptions::default()
    };
    let (a, _bus, _) = runtime_with(&store, A, |b| b.options(options));
    let id = a
        .enqueue(
            "scripted",
            json!({"steps": [{"hang_ms": 3_600_000}, {"output": "never"}]}),
        )
        .await
        .unwrap();
    let started = Instant::now();
    let task = tokio::spawn({
        let a = a.clone();
        async move { a.run_queued(id).await }
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    store.rewrite(id, |r| r.claimed_by = Some(B.into()));
    assert_eq!(task.await.unwrap().unwrap(), Outcome::LeaseLost);
    assert!(
        started.elapsed() <= Duration::from_secs(3),
        "stopped within one check interval"
    );
    assert!(store.events(id).await.unwrap().is_empty());
    assert_eq!(row(&store, id).await.claimed_by.as_deref(), Some(B));
}

/// The runs a worker holds are checked together: one read per interval for all of them, not
/// one per run, and the one an operator cancels (and only that one) is stopped.
#[tokio::test(start_paused = true)]
async fn held_runs_are_probed_in_one_read_per_interval() {
    let memory = MemoryRunStore::new();
    let store = Arc::new(Tweaked {
        inner: memory.clone(),
        ..Tweaked::default()
    });
    let options = RuntimeOptions {
        lease_check_every: Some(Duration::from_secs(1)),
        ..RuntimeOptions::default()
    };
    let (rt, _bus, _queue) = queued_runtime(store.clone(), A, options);
    let mut ids = Vec::new();
    for _ in 0..8 {
        let run = NewRun::new(
            "scripted",
            json!({"steps": [{"hang_ms": 10_000}, {"output": "done"}]}),
        );
        memory.insert_queued(&run).await.unwrap();
        ids.push(run.id);
    }
    let tasks: Vec<_> = ids
        .iter()
        .map(|&id| {
            let rt = rt.clone();
            tokio::spawn(async move { rt.run_queued(id).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(4_500)).await;
    assert!(memory.cancel(ids[5]).await.unwrap());
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.unwrap().unwrap());
    }
    for (i, outcome) in outcomes.iter().enumerate() {
        let expected = if i == 5 {
            Outcome::Cancelled
        } else {
            Outcome::Completed {
                output: json!("done"),
            }
        };
        assert_eq!(*outcome, expected, "run {i}");
    }
    let finds = store.finds.load(std::sync::atomic::Ordering::Relaxed);
    let probes = store.probes.load(std::sync::atomic::Ordering::Relaxed);
    // 10 s of hanging steps, checked every second: about 10 probes for all 8 runs (one read
    // per run per second would be about 80 reads).
    assert_eq!(finds, 0, "no run was read on its own");
    assert!((8..=12).contains(&probes), "{probes} probes");
}

#[tokio::test(start_paused = true)]
async fn cancelled_mid_flight_stops_at_the_next_boundary_which_is_persisted() {
    let store = MemoryRunStore::new();
    // The boundary's own probe, without the watcher between boundaries (tests/step_watch.rs).
    let options = RuntimeOptions {
        lease_check_every: None,
        ..RuntimeOptions::default()
    };
    let (rt, _bus, _) = runtime_with(&store, A, |b| b.options(options));
    let steps = json!({"steps": [{"sleep_ms": 1000}, {"sleep_ms": 1000}, {"sleep_ms": 1000}, {"output": "x"}]});
    let id = rt.enqueue("scripted", steps).await.unwrap();
    let task = tokio::spawn({
        let rt = rt.clone();
        async move { rt.run_queued(id).await }
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(rt.cancel(id).await.unwrap());
    assert_eq!(task.await.unwrap().unwrap(), Outcome::Cancelled);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        store.events(id).await.unwrap().len(),
        2,
        "that boundary's step persisted, nothing after"
    );
    let now = row(&store, id).await;
    assert_eq!(
        (now.status, now.termination_reason),
        (RunStatus::Cancelled, Some(TerminationReason::Cancelled))
    );
    assert!(!rt.cancel(id).await.unwrap(), "already terminal");
}

#[tokio::test(start_paused = true)]
async fn cancelled_queued_run_is_not_claimed() {
    let store = MemoryRunStore::new();
    let (rt, _bus, _) = runtime_with(&store, A, |b| b);
    let id = rt
        .enqueue("scripted", json!({"steps": [{"output": 1}]}))
        .await
        .unwrap();
    assert!(rt.cancel(id).await.unwrap());
    assert_eq!(rt.run_queued(id).await.unwrap(), Outcome::NotClaimed);
    assert!(store.events(id).await.unwrap().is_empty());
}

fn server_503() -> AgentError {
    ProviderError::http(503).into()
}
fn connection() -> AgentError {
    ProviderError::Connection(None).into()
}
fn rate_limited() -> AgentError {
    ProviderError::http(429).into()
}
fn chain_ending_in_503() -> AgentError {
    ProviderError::FallbackChainExhausted(vec![ProviderError::http(401), ProviderError::http(503)])
        .into()
}
fn unauthorized() -> AgentError {
    ProviderError::http(401).into()
}
fn bad_request() -> AgentError {
    ProviderError::http(400).into()
}
fn misconfigured() -> AgentError {
    ProviderError::Configuration("no api key".into()).into()
}
fn unknown() -> AgentError {
    AgentError::other(std::io::Error::other("boom"))
}

#[tokio::test(start_paused = true)]
async fn retryable_failures_requeue_with_doubling_delays_then_exhaust() {
    let cases: [(fn() -> AgentError, FailureClass); 4] = [
        (server_503, FailureClass::ServerError),
        (connection, FailureClass::Connection),
        (rate_limited, FailureClass::RateLimit),
        (chain_ending_in_503, FailureClass::ServerError),
    ];
    for (make, class) in cases {
        let store = MemoryRunStore::new();
        let (rt, _bus, queue) = runtime_with(&store, A, |b| b.agent("failing", FailWith(make)));
        let id = rt.enqueue("failing", json!({})).await.unwrap();
        for (n, secs) in [30, 60, 120].into_iter().enumerate() {
            let delay = Duration::from_secs(secs);
            assert_eq!(
                rt.run_queued(id).await.unwrap(),
                Outcome::Requeued { delay },
                "{class}"
            );
            let now = row(&store, id).await;
            assert_eq!(
                (now.status, now.requeue_count),
                (RunStatus::Queued, u32::try_from(n).unwrap() + 1)
            );
            assert_eq!(now.claimed_by, None);
            let sent = dispatched(&queue);
            assert_eq!(sent.len(), n + 2, "exactly one RunAgent per requeue");
            assert_eq!(sent.last(), Some(&(id, Some(delay))));
        }
        let outcome = rt.run_queued(id).await.unwrap();
        assert_eq!(
            outcome,
            Outcome::Failed {
                reason: TerminationReason::RetriesExhausted,
                class: Some(class)
            }
        );
        let now = row(&store, id).await;
        assert_eq!(
            (now.status, now.termination_reason),
            (RunStatus::Failed, Some(TerminationReason::RetriesExhausted))
        );
        assert_eq!(now.error_class, Some(class));
        assert_eq!(
            dispatched(&queue).len(),
            4,
            "no message after the dead letter"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn non_retryable_failures_dead_letter_at_once() {
    let cases: [(fn() -> AgentError, FailureClass); 4] = [
        (unauthorized, FailureClass::Auth),
        (bad_request, FailureClass::ClientError),
        (misconfigured, FailureClass::Configuration),
        (unknown, FailureClass::Unknown),
    ];
    for (make, class) in cases {
        let store = MemoryRunStore::new();
        let (rt, _bus, queue) = runtime_with(&store, A, |b| b.agent("failing", FailWith(make)));
        let id = rt.enqueue("failing", json!({})).await.unwrap();
        let outcome = rt.run_queued(id).await.unwrap();
        assert_eq!(
            outcome,
            Outcome::Failed {
                reason: TerminationReason::NotRetryable,
                class: Some(class)
            }
        );
        let now = row(&store, id).await;
        assert_eq!(
            (now.status, now.requeue_count, now.error_class),
            (RunStatus::Failed, 0, Some(class))
        );
        assert_eq!(dispatched(&queue).len(), 1, "never requeued");
    }
}

fn retry_after_7s() -> AgentError {
    ProviderError::RateLimited {
        retry_after: Some(Duration::from_secs(7)),
    }
    .into()
}

#[tokio::test(start_paused = true)]
async fn a_retry_after_is_the_requeue_delay_and_a_broken_protocol_is_not_retried() {
    let store = MemoryRunStore::new();
    let (rt, _bus, queue) =
        runtime_with(&store, A, |b| b.agent("limited", FailWith(retry_after_7s)));
    let id = rt.enqueue("limited", json!({})).await.unwrap();
    let delay = Duration::from_secs(7);
    assert_eq!(
        rt.run_queued(id).await.unwrap(),
        Outcome::Requeued { delay },
        "the provider's Retry-After, not the 30 s backoff"
    );
    assert_eq!(dispatched(&queue).last(), Some(&(id, Some(delay))));

    fn broken() -> AgentError {
        ProviderError::Protocol("truncated JSON".into()).into()
    }
    let store = MemoryRunStore::new();
    let (rt, _bus, _queue) = runtime_with(&store, A, |b| b.agent("broken", FailWith(broken)));
    let id = rt.enqueue("broken", json!({})).await.unwrap();
    assert_eq!(
        rt.run_queued(id).await.unwrap(),
        Outcome::Failed {
            reason: TerminationReason::NotRetryable,
            class: Some(FailureClass::Protocol)
        }
    );
}

#[tokio::test(start_paused = true)]
async fn agent_stop_reasons_are_never_retried() {
    let store = MemoryRunStore::new();
    let (rt, _bus, queue) = runtime_with(&store, A, |b| b.agent("stops", StopsAtMaxSteps));
    let id = rt.enqueue("stops", json!({})).await.unwrap();
    let outcome = rt.run_queued(id).await.unwrap();
    assert_eq!(
        outcome,
        Outcome::Failed {
            reason: TerminationReason::MaxSteps,
            class: None
        }
    );
    assert!(!TerminationReason::MaxSteps.is_retryable());
    assert_eq!(dispatched(&queue).len(), 1);
}

#[tokio::test(start_paused = true)]
async fn requeue_refused_because_the_lease_moved_is_lease_lost() {
    let store = MemoryRunStore::new();
    let (rt, _bus, queue) = runtime_with(&store, A, |b| {
        b.agent("mover", MoveLeaseThenFail(store.clone()))
    });
    let id = rt.enqueue("mover", json!({})).await.unwrap();
    assert_eq!(rt.run_queued(id).await.unwrap(), Outcome::LeaseLost);
    let now = row(&store, id).await;
    assert_eq!(
        (now.status, now.claimed_by.as_deref(), now.requeue_count),
        (RunStatus::Running, Some(B), 0)
    );
    assert_eq!(now.termination_reason, None, "no settle");
    assert_eq!(dispatched(&queue).len(), 1, "no dispatch");
}

#[tokio::test(start_paused = true)]
async fn a_pending_non_idempotent_effect_is_never_requeued() {
    let store = MemoryRunStore::new();
    let (rt, _bus, queue) = runtime_with(&store, A, |b| b);
    let fenced = rt
        .enqueue(
            "scripted",
            json!({"steps": [{"effect": "non_idempotent"}, {"fail": "server_error"}]}),
        )
        .await
        .unwrap();
    let outcome = rt.run_queued(fenced).await.unwrap();
    assert_eq!(
        outcome,
        Outcome::Failed {
            reason: TerminationReason::NotRetryable,
            class: Some(FailureClass::ServerError)
        }
    );
    let idempotent = rt
        .enqueue(
            "scripted",
            json!({"steps": [{"effect": "idempotent"}, {"fail": "server_error"}]}),
        )
        .await
        .unwrap();
    assert_eq!(
        rt.run_queued(idempotent).await.unwrap(),
        Outcome::Requeued {
            delay: Duration::from_secs(30)
        }
    );
    assert_eq!(dispatched(&queue).len(), 3);
}

#[tokio::test(start_paused = true)]
async fn enqueue_dispatch_failure_settles_the_run_and_returns_the_error() {
    let store = MemoryRunStore::new();
    let (rt, _bus) = refusing_runtime(Arc::new(store.clone()), A);
    let err = rt.enqueue("scripted", json!({})).await.unwrap_err();
    let RunError::Dispatch { run_id, .. } = err else {
        panic!("expected a dispatch error, got {err}")
    };
    let now = row(&store, run_id).await;
    assert_eq!(
        (now.status, now.termination_reason),
        (RunStatus::Failed, Some(TerminationReason::DispatchFailed))
    );
    assert!(!TerminationReason::DispatchFailed.is_retryable());
}

#[tokio::test(start_paused = true)]
async fn dispatch_failure_after_a_requeue_settles_the_queued_row() {
    let store = MemoryRunStore::new();
    let (rt, _bus) = refusing_runtime(Arc::new(store.clone()), A);
    let run = courier_runs::NewRun {
        id: Uuid::new_v4(),
        agent: "scripted".into(),
        input: json!({"steps": [{"fail": "server_error"}]}),
        budget: None,
        concurrency_key: None,
    };
    store.insert_queued(&run).await.unwrap();
    let outcome = rt.run_queued(run.id).await.unwrap();
    assert_eq!(
        outcome,
        Outcome::Failed {
            reason: TerminationReason::DispatchFailed,
            class: Some(FailureClass::ServerError)
        }
    );
    let now = row(&store, run.id).await;
    assert_eq!(
        (now.status, now.termination_reason),
        (RunStatus::Failed, Some(TerminationReason::DispatchFailed))
    );
    assert_eq!(
        now.requeue_count, 1,
        "it had been requeued; no orphan queued row is left"
    );
}

#[tokio::test(start_paused = true)]
async fn interactive_failure_surfaces_unchanged_without_recovery() {
    let store = MemoryRunStore::new();
    let (rt, _bus, queue) = runtime_with(&store, A, |b| b.agent("failing", FailWith(server_503)));
    let err = rt.run("failing", json!({})).await.unwrap_err();
    let RunError::Agent {
        run_id,
        error: AgentError::Provider(ProviderError::Http { status: 503 }),
    } = err
    else {
        panic!("expected the provider error unchanged, got {err:?}")
    };
    let now = row(&store, run_id).await;
    assert_eq!(
        (now.status, now.termination_reason),
        (RunStatus::Failed, Some(TerminationReason::ProviderFailed))
    );
    assert_eq!(
        (now.requeue_count, now.lease_expires, now.claimed_by),
        (0, 0, None)
    );
    assert!(queue.sent().is_empty(), "no recovery for interactive runs");
}

#[tokio::test(start_paused = true)]
async fn approval_pauses_and_approve_resumes_interactively() {
    let store = MemoryRunStore::new();
    let (rt, _bus, _) = runtime_with(&store, A, |b| b);
    let (id, outcome) = rt
        .run(
            "scripted",
            json!({"steps": [{"await_approval": true}, {"output": "ok"}]}),
        )
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::AwaitingApproval);
    assert_eq!(row(&store, id).await.status, RunStatus::WaitingForApproval);
    assert_eq!(
        rt.approve(id).await.unwrap(),
        Outcome::Completed {
            output: json!("ok")
        }
    );
    assert!(matches!(
        rt.approve(id).await,
        Err(RunError::WrongStatus { .. })
    ));
}

/// A run that waits for input is resumed by `provide_input`: the input is recorded as an event
/// and the agent sees it; a run that is not waiting for input is refused.
async fn input_pauses_and_provide_input_resumes(store: Arc<dyn RunStore>) {
    let rt = Runtime::builder(store.clone())
        .agent("scripted", ScriptedAgent)
        .worker_identity(A)
        .build();
    let script = json!({"steps": [{"await_input": "which city?"}, {"output": "ok"}]});
    let (id, outcome) = rt.run("scripted", script).await.unwrap();
    assert_eq!(outcome, Outcome::AwaitingInput);
    let waiting = store.find(id).await.unwrap().unwrap();
    assert_eq!(waiting.status, RunStatus::WaitingForInput);
    assert!(matches!(
        rt.approve(id).await,
        Err(RunError::WrongStatus {
            expected: RunStatus::WaitingForApproval,
            ..
        })
    ));

    let given = json!({"city": "Lyon"});
    assert_eq!(
        rt.provide_input(id, given.clone()).await.unwrap(),
        Outcome::Completed {
            output: json!("ok")
        }
    );
    let events: Vec<(i64, String, serde_json::Value)> = store
        .events(id)
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.seq, e.kind, e.payload))
        .collect();
    assert_eq!(
        events,
        vec![
            (1, "input_requested".to_owned(), json!("which city?")),
            (2, "input".to_owned(), given.clone()),
            (3, "input_received".to_owned(), given.clone()),
            (4, "output".to_owned(), json!("ok")),
        ]
    );
    assert!(matches!(
        rt.provide_input(id, given).await,
        Err(RunError::WrongStatus {
            status: RunStatus::Completed,
            expected: RunStatus::WaitingForInput,
            ..
        })
    ));
    assert!(matches!(
        rt.provide_input(Uuid::new_v4(), json!(1)).await,
        Err(RunError::NotFound(_))
    ));
}

#[tokio::test(start_paused = true)]
async fn input_pauses_and_provide_input_resumes_in_memory() {
    input_pauses_and_provide_input_resumes(Arc::new(MemoryRunStore::new())).await;
}

#[tokio::test]
async fn input_pauses_and_provide_input_resumes_on_sqlite() {
    let fx = support::sqlite().await;
    input_pauses_and_provide_input_resumes(fx.store.clone()).await;
}

#[tokio::test(start_paused = true)]
async fn unknown_agent_is_dead_lettered_as_configuration() {
    let store = MemoryRunStore::new();
    let (rt, _bus, _) = runtime_with(&store, A, |b| b);
    let id = rt.enqueue("nobody", json!({})).await.unwrap();
    let outcome = rt.run_queued(id).await.unwrap();
    assert_eq!(
        outcome,
        Outcome::Failed {
            reason: TerminationReason::NotRetryable,
            class: Some(FailureClass::Configuration)
        }
    );
}

#[tokio::test(start_paused = true)]
async fn handler_never_fails_for_a_run_outcome_and_duplicates_are_harmless() {
    let store = MemoryRunStore::new();
    let runtime = Runtime::builder(Arc::new(store.clone()))
        .agent("failing", FailWith(unauthorized))
        .worker_identity(A)
        .build();
    // RunAgent not routed: the bus handles it in-process with the RunAgentHandler.
    let bus = runtime.register(MessageBus::builder()).build();
    let run = courier_runs::NewRun {
        id: Uuid::new_v4(),
        agent: "failing".into(),
        input: json!({}),
        budget: None,
        concurrency_key: None,
    };
    store.insert_queued(&run).await.unwrap();
    bus.dispatch(courier_runs::RunAgent { run_id: run.id })
        .await
        .expect("a failed run is not a handler error");
    bus.dispatch(courier_runs::RunAgent { run_id: run.id })
        .await
        .expect("a duplicate is harmless");
    bus.dispatch(courier_runs::RunAgent {
        run_id: Uuid::new_v4(),
    })
    .await
    .expect("an unknown run is harmless");
    assert_eq!(
        row(&store, run.id).await.termination_reason,
        Some(TerminationReason::NotRetryable)
    );
}

/// A memory store where, when `heartbeat_after_select`, a heartbeat lands right after the
/// reaper's SELECT, and when `silent_renews` (`silent_appends`, `silent_settles`), a renew (a
/// step's append, a settle) never answers (a connection black-holed by a failover); with
/// `silent_claims`, a claim lands and its answer never comes back.
#[derive(Debug, Default)]
struct Tweaked {
    inner: MemoryRunStore,
    heartbeat_after_select: bool,
    silent_renews: bool,
    silent_appends: bool,
    silent_settles: bool,
    silent_claims: bool,
    /// Reads of one run (`find`) and batched reads (`probe`) so far.
    finds: std::sync::atomic::AtomicU64,
    probes: std::sync::atomic::AtomicU64,
}

#[courier_runs::async_trait]
impl RunStore for Tweaked {
    async fn setup(&self) -> Result<(), StoreError> {
        self.inner.setup().await
    }
    async fn now_ms(&self) -> Result<i64, StoreError> {
        self.inner.now_ms().await
    }
    async fn insert_queued(&self, run: &NewRun) -> Result<Run, StoreError> {
        self.inner.insert_queued(run).await
    }
    async fn insert_queued_unique(
        &self,
        run: &NewRun,
        unique: &courier_runs::UniqueKey,
    ) -> Result<courier_runs::Inserted, StoreError> {
        self.inner.insert_queued_unique(run, unique).await
    }
    async fn insert_interactive(&self, run: &NewRun) -> Result<Run, StoreError> {
        self.inner.insert_interactive(run).await
    }
    async fn find(&self, id: Uuid) -> Result<Option<Run>, StoreError> {
        self.finds
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.find(id).await
    }
    async fn probe(&self, ids: &[Uuid]) -> Result<Vec<courier_runs::RunProbe>, StoreError> {
        self.probes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.probe(ids).await
    }
    async fn list(&self, status: Option<RunStatus>, limit: usize) -> Result<Vec<Run>, StoreError> {
        self.inner.list(status, limit).await
    }
    async fn claim(
        &self,
        id: Uuid,
        worker: &str,
        lease: Duration,
    ) -> Result<Option<Run>, StoreError> {
        let claimed = self.inner.claim(id, worker, lease).await;
        if self.silent_claims {
            std::future::pending::<()>().await;
        }
        claimed
    }
    async fn renew(&self, id: Uuid, worker: &str, lease: Duration) -> Result<bool, StoreError> {
        if self.silent_renews {
            std::future::pending::<()>().await;
        }
        self.inner.renew(id, worker, lease).await
    }
    async fn requeue_owned(
        &self,
        id: Uuid,
        worker: &str,
        due_in: Duration,
    ) -> Result<bool, StoreError> {
        self.inner.requeue_owned(id, worker, due_in).await
    }
    async fn select_overdue(&self, after: Duration, limit: usize) -> Result<Vec<Run>, StoreError> {
        self.inner.select_overdue(after, limit).await
    }
    async fn redispatch_overdue(&self, id: Uuid, after: Duration) -> Result<bool, StoreError> {
        self.inner.redispatch_overdue(id, after).await
    }
    async fn redispatch_queued(&self, id: Uuid) -> Result<bool, StoreError> {
        self.inner.redispatch_queued(id).await
    }
    async fn select_stale(&self, limit: usize) -> Result<Vec<Run>, StoreError> {
        let runs = self.inner.select_stale(limit).await?;
        for run in runs.iter().filter(|_| self.heartbeat_after_select) {
            let owner = run.claimed_by.as_deref().unwrap_or_default();
            assert!(
                self.inner
                    .renew(run.id, owner, Duration::from_secs(900))
                    .await?
            );
        }
        Ok(runs)
    }
    async fn requeue_stale(&self, id: Uuid) -> Result<bool, StoreError> {
        self.inner.requeue_stale(id).await
    }
    async fn dead_letter_stale(
        &self,
        id: Uuid,
        reason: TerminationReason,
    ) -> Result<bool, StoreError> {
        self.inner.dead_letter_stale(id, reason).await
    }
    async fn settle(
        &self,
        id: Uuid,
        owner: Option<&str>,
        s: &Settlement,
    ) -> Result<bool, StoreError> {
        if self.silent_settles {
            std::future::pending::<()>().await;
        }
        self.inner.settle(id, owner, s).await
    }
    async fn fail_queued(&self, id: Uuid, reason: TerminationReason) -> Result<bool, StoreError> {
        self.inner.fail_queued(id, reason).await
    }
    async fn resume(&self, id: Uuid, from: RunStatus) -> Result<bool, StoreError> {
        self.inner.resume(id, from).await
    }
    async fn cancel(&self, id: Uuid) -> Result<bool, StoreError> {
        self.inner.cancel(id).await
    }
    async fn set_pending_effect(
        &self,
        id: Uuid,
        owner: Option<&str>,
        effect: Option<&str>,
    ) -> Result<bool, StoreError> {
        self.inner.set_pending_effect(id, owner, effect).await
    }
    async fn append_event(
        &self,
        id: Uuid,
        kind: &str,
        payload: &serde_json::Value,
    ) -> Result<i64, StoreError> {
        if self.silent_appends {
            std::future::pending::<()>().await;
        }
        self.inner.append_event(id, kind, payload).await
    }
    async fn events(&self, id: Uuid) -> Result<Vec<RunEvent>, StoreError> {
        self.inner.events(id).await
    }
    async fn steps(&self, id: Uuid) -> Result<Vec<courier_runs::StepRecord>, StoreError> {
        self.inner.steps(id).await
    }
    async fn journal(
        &self,
        id: Uuid,
        owner: Option<&str>,
        lease: Duration,
        write: &courier_runs::StepWrite,
    ) -> Result<bool, StoreError> {
        self.inner.journal(id, owner, lease, write).await
    }
    async fn suspend(
        &self,
        id: Uuid,
        owner: Option<&str>,
        until: i64,
        signal: Option<&str>,
    ) -> Result<bool, StoreError> {
        self.inner.suspend(id, owner, until, signal).await
    }
    async fn select_due_waits(&self, limit: usize) -> Result<Vec<Run>, StoreError> {
        self.inner.select_due_waits(limit).await
    }
    async fn wake(&self, id: Uuid, signal: Option<&str>) -> Result<bool, StoreError> {
        self.inner.wake(id, signal).await
    }
    async fn release_parked(&self, id: Uuid) -> Result<bool, StoreError> {
        self.inner.release_parked(id).await
    }
    async fn resolve_step(
        &self,
        id: Uuid,
        index: i64,
        status: courier_runs::StepStatus,
        output: Option<&serde_json::Value>,
    ) -> Result<bool, StoreError> {
        self.inner.resolve_step(id, index, status, output).await
    }
    async fn copy_steps(&self, from: Uuid, to: Uuid, before: i64) -> Result<u64, StoreError> {
        self.inner.copy_steps(from, to, before).await
    }
    async fn prune(
        &self,
        older_than: Duration,
        statuses: &[RunStatus],
        limit: usize,
    ) -> Result<u64, StoreError> {
        self.inner.prune(older_than, statuses, limit).await
    }
}

#[tokio::test(start_paused = true)]
async fn reaper_counts_a_run_whose_heartbeat_won_as_skipped() {
    let memory = MemoryRunStore::new();
    let store = Arc::new(Tweaked {
        inner: memory.clone(),
        heartbeat_after_select: true,
        ..Tweaked::default()
    });
    let (rt, _bus, queue) = queued_runtime(store.clone(), A, RuntimeOptions::default());
    let run = NewRun {
        id: Uuid::new_v4(),
        agent: "scripted".into(),
        input: json!({}),
        budget: None,
        concurrency_key: None,
    };
    memory.insert_queued(&run).await.unwrap();
    assert!(
        memory
            .claim(run.id, A, Duration::from_secs(900))
            .await
            .unwrap()
            .is_some()
    );
    memory.rewrite(run.id, |r| r.lease_expires = 1);
    let report = rt.reaper().reap(ReapOptions::default()).await.unwrap();
    assert_eq!(
        report.to_string(),
        "Reaped 1 stale run(s): 0 requeued, 0 dead-lettered, 1 skipped."
    );
    assert_eq!(row(&memory, run.id).await.status, RunStatus::Running);
    assert!(queue.sent().is_empty());
}

#[tokio::test(start_paused = true)]
async fn reaper_runs_every_interval_until_shutdown() {
    let store = MemoryRunStore::new();
    let (rt, _bus, queue) = runtime_with(&store, A, |b| b);
    let id = rt.enqueue("scripted", json!({})).await.unwrap();
    assert!(
        store
            .claim(id, A, Duration::from_secs(900))
            .await
            .unwrap()
            .is_some()
    );
    store.rewrite(id, |r| r.lease_expires = 1);
    let shutdown = courier_runs::CancellationToken::new();
    let task = tokio::spawn({
        let reaper = rt.reaper();
        let shutdown = shutdown.clone();
        async move {
            reaper
                .run_every(Duration::from_secs(30), ReapOptions::default(), shutdown)
                .await
        }
    });
    tokio::time::sleep(Duration::from_secs(29)).await;
    assert_eq!(
        row(&store, id).await.status,
        RunStatus::Running,
        "not before the first interval"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(row(&store, id).await.status, RunStatus::Queued);
    assert_eq!(dispatched(&queue).last(), Some(&(id, None)));
    shutdown.cancel();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_transport_outage_after_a_requeue_leaves_the_run_queued_for_the_reaper() {
    let store = MemoryRunStore::new();
    let (rt, _bus) = unreachable_runtime(Arc::new(store.clone()), A);
    let run = courier_runs::NewRun {
        id: Uuid::new_v4(),
        agent: "scripted".into(),
        input: json!({"steps": [{"fail": "server_error"}]}),
        budget: None,
        concurrency_key: None,
    };
    store.insert_queued(&run).await.unwrap();
    let outcome = rt.run_queued(run.id).await.unwrap();
    assert_eq!(
        outcome,
        Outcome::Requeued {
            delay: Duration::from_secs(30)
        }
    );
    let now = row(&store, run.id).await;
    assert_eq!(
        (now.status, now.requeue_count, now.termination_reason),
        (RunStatus::Queued, 1, None),
        "an outage dead-letters nothing: the run waits for the reaper's overdue pass"
    );
}

/// A reaper's dispatch that fails for an outage is tried again on the next pass once the broker
/// is back, not only `redispatch_after` later: for the stale requeue and for the overdue pass.
#[tokio::test(start_paused = true)]
async fn a_dispatch_lost_to_an_outage_is_retried_on_the_next_pass() {
    let store = MemoryRunStore::new();
    let broker = OutageTransport::default();
    let (rt, _bus) = outage_runtime(Arc::new(store.clone()), A, &broker);
    let insert = |steps: serde_json::Value| courier_runs::NewRun {
        id: Uuid::new_v4(),
        agent: "scripted".into(),
        input: json!({ "steps": steps }),
        budget: None,
        concurrency_key: None,
    };
    let (stale, overdue) = (insert(json!([])), insert(json!([])));
    store.insert_queued(&stale).await.unwrap();
    store.insert_queued(&overdue).await.unwrap();
    assert!(
        store
            .claim(stale.id, B, Duration::from_secs(1))
            .await
            .unwrap()
            .is_some()
    );
    // The default redispatch_after is the lease (15 min): well past this test's clock.
    tokio::time::advance(Duration::from_secs(2)).await;
    broker.set_down(true);
    let reaper = rt.reaper().redispatch_after(Duration::from_secs(1));
    let report = reaper.reap(ReapOptions::default()).await.unwrap();
    assert_eq!(
        (report.requeued, report.redispatched, report.dead_lettered),
        (1, 0, 0),
        "the stale run is requeued, the overdue one selected, neither dispatched"
    );
    assert_eq!(row(&store, stale.id).await.status, RunStatus::Queued);
    assert!(broker.queue.sent().is_empty());

    // Still down: owed again, nothing lost from the list.
    let report = rt.reaper().reap(ReapOptions::default()).await.unwrap();
    assert_eq!(report.redispatched, 0);

    broker.set_down(false);
    tokio::time::advance(Duration::from_millis(100)).await;
    // A reaper of the same runtime, whose overdue threshold (15 min) is far off: only the
    // owed list can dispatch them now.
    let report = rt.reaper().reap(ReapOptions::default()).await.unwrap();
    assert_eq!(
        report.redispatched, 2,
        "both owed runs dispatched once the broker is back"
    );
    let mut sent: Vec<Uuid> = dispatched(&broker.queue)
        .iter()
        .map(|(id, _)| *id)
        .collect();
    sent.sort();
    let mut want = vec![stale.id, overdue.id];
    want.sort();
    assert_eq!(sent, want);

    let report = rt.reaper().reap(ReapOptions::default()).await.unwrap();
    assert_eq!(report.redispatched, 0, "nothing is owed twice");
    assert_eq!(broker.queue.sent().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_transport_outage_after_a_stale_requeue_leaves_the_run_queued() {
    let store = MemoryRunStore::new();
    let (rt, _bus) = unreachable_runtime(Arc::new(store.clone()), A);
    let run = courier_runs::NewRun {
        id: Uuid::new_v4(),
        agent: "scripted".into(),
        input: json!({"steps": []}),
        budget: None,
        concurrency_key: None,
    };
    store.insert_queued(&run).await.unwrap();
    assert!(
        store
            .claim(run.id, B, Duration::from_secs(1))
            .await
            .unwrap()
            .is_some()
    );
    tokio::time::advance(Duration::from_secs(2)).await;
    let report = rt
        .reaper()
        .reap(courier_runs::ReapOptions::default())
        .await
        .unwrap();
    assert_eq!((report.requeued, report.dead_lettered), (1, 0));
    let now = row(&store, run.id).await;
    assert_eq!(
        (now.status, now.termination_reason),
        (RunStatus::Queued, None)
    );
}

/// A heartbeat the store never answers (a connection black-holed by a failover) does not hold
/// the run's worker forever: after a whole lease the lease is over, so the run stops as for a
/// lost lease, persisting and settling nothing, and the reaper gives it to a worker again.
#[tokio::test(start_paused = true)]
async fn a_heartbeat_unanswered_for_a_whole_lease_stops_the_run_as_a_lost_lease() {
    stops_after_a_lease(
        |inner| Tweaked {
            inner,
            silent_renews: true,
            ..Tweaked::default()
        },
        0,
        lease_lost,
    )
    .await;
}

/// The same when the lease was renewed but the step's append is what never answers.
#[tokio::test(start_paused = true)]
async fn a_step_unanswered_for_a_whole_lease_stops_the_run_as_a_lost_lease() {
    stops_after_a_lease(
        |inner| Tweaked {
            inner,
            silent_appends: true,
            ..Tweaked::default()
        },
        0,
        lease_lost,
    )
    .await;
}

/// The same when the steps went through and the settle is what never answers: the persisted
/// step (the first; the second is the run's output) stays for the next owner.
#[tokio::test(start_paused = true)]
async fn a_settle_unanswered_for_a_whole_lease_leaves_the_run_to_the_reaper() {
    stops_after_a_lease(
        |inner| Tweaked {
            inner,
            silent_settles: true,
            ..Tweaked::default()
        },
        1,
        lease_lost,
    )
    .await;
}

/// A claim the store never answers, though it landed (the run is `running`, owned by A), is
/// given up after a lease as a store error, so the `RunAgent` message is retried; the run, its
/// lease run out, goes back to the queue through the reaper. Nothing runs meanwhile.
#[tokio::test(start_paused = true)]
async fn a_claim_unanswered_for_a_whole_lease_is_given_up_and_the_run_left_to_the_reaper() {
    stops_after_a_lease(
        |inner| Tweaked {
            inner,
            silent_claims: true,
            ..Tweaked::default()
        },
        0,
        |outcome| {
            let e = outcome.expect_err("a claim given up is an error: the message is retried");
            assert!(
                matches!(e, RunError::Store(_)) && e.to_string().contains("claiming a run"),
                "{e}"
            );
        },
    )
    .await;
}

fn lease_lost(outcome: Result<Outcome, RunError>) {
    assert_eq!(outcome.unwrap(), Outcome::LeaseLost);
}

/// Runs a two-step run over the store `tweak` makes of a memory store, with a lease of 30 s:
/// it stops after one lease (`stopped` checks how) with `persisted` steps persisted and nothing
/// settled, then the reaper requeues it.
async fn stops_after_a_lease(
    tweak: impl FnOnce(MemoryRunStore) -> Tweaked,
    persisted: usize,
    stopped: impl FnOnce(Result<Outcome, RunError>),
) {
    let memory = MemoryRunStore::new();
    let store = Arc::new(tweak(memory.clone()));
    let lease = Duration::from_secs(30);
    let options = RuntimeOptions {
        lease,
        lease_check_every: None,
        ..RuntimeOptions::default()
    };
    let (rt, _bus, queue) = queued_runtime(store, A, options);
    let id = rt
        .enqueue("scripted", json!({"steps": [{"output": 1}, {"output": 2}]}))
        .await
        .unwrap();
    let started = Instant::now();
    let outcome = tokio::time::timeout(Duration::from_secs(600), rt.run_queued(id))
        .await
        .expect("the worker waited on a store that never answers");
    stopped(outcome);
    let waited = started.elapsed();
    assert!(
        (lease..lease + Duration::from_secs(1)).contains(&waited),
        "{waited:?}"
    );
    assert_eq!(memory.events(id).await.unwrap().len(), persisted);
    let now = row(&memory, id).await;
    assert_eq!(
        (now.status, now.claimed_by.as_deref()),
        (RunStatus::Running, Some(A)),
        "nothing settled: the row is the reaper's"
    );
    // The memory store keeps the wall clock, not the paused one: its lease ends by hand.
    memory.rewrite(id, |r| r.lease_expires = 1);
    let report = rt.reaper().reap(ReapOptions::default()).await.unwrap();
    assert_eq!(
        report.to_string(),
        "Reaped 1 stale run(s): 1 requeued, 0 dead-lettered, 0 skipped."
    );
    assert_eq!(row(&memory, id).await.status, RunStatus::Queued);
    assert_eq!(dispatched(&queue).last(), Some(&(id, None)));
}
