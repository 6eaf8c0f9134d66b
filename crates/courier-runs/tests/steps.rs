//! Durable steps on every store: a finished step is replayed, never run again; guarded steps
//! follow their policy; budgets survive a crash; durable waits free the worker; bad input (a
//! changed agent, an oversized result, a corrupted journal row, an unknown signal) gets a class
//! and a message, and nothing is stuck.
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use courier_core::{InMemoryTransport, MessageBus};
use courier_runs::{
    Agent, AgentError, AgentOutcome, Budget, Dialect, Effect, FailureClass, NewRun, OnAmbiguous,
    Outcome, ReapOptions, Resolution, RunContext, RunError, RunStatus, Runtime, RuntimeOptions,
    Settlement, Signal, SignalSent, StepError, StepStatus, TerminationReason, Usage,
};
use serde_json::json;
use support::Fixture;
use uuid::Uuid;

/// How often each (run, step) closure ran, and the keys it was given.
#[derive(Debug, Default, Clone)]
struct Effects {
    runs: Arc<Mutex<HashMap<(Uuid, i64), u32>>>,
    keys: Arc<Mutex<Vec<(i64, String)>>>,
}

impl Effects {
    fn count(&self, id: Uuid, step: i64) -> u32 {
        self.runs
            .lock()
            .unwrap()
            .get(&(id, step))
            .copied()
            .unwrap_or(0)
    }

    fn keys_of(&self, step: i64) -> Vec<String> {
        self.keys
            .lock()
            .unwrap()
            .iter()
            .filter(|(i, _)| *i == step)
            .map(|(_, k)| k.clone())
            .collect()
    }
}

/// `steps` steps named `step<i>`; step `hang_at` never returns (a worker killed mid-step);
/// step 6 has `effect6`; each reports `tokens_out` completion tokens and returns `i * 10`;
/// step `rename_at` is named `renamed` instead; step `big_at` returns `big` bytes.
#[derive(Clone)]
struct Numbered {
    effects: Effects,
    steps: i64,
    hang_at: Arc<AtomicI64>,
    effect6: Effect,
    tokens_out: u64,
    rename_at: i64,
    big_at: i64,
}

impl Numbered {
    fn new(effects: &Effects) -> Self {
        Self {
            effects: effects.clone(),
            steps: 10,
            hang_at: Arc::new(AtomicI64::new(0)),
            effect6: Effect::Pure,
            tokens_out: 0,
            rename_at: 0,
            big_at: 0,
        }
    }
}

#[courier_runs::async_trait]
impl Agent for Numbered {
    async fn run(&self, cx: &mut RunContext) -> Result<AgentOutcome, AgentError> {
        let id = cx.run().id;
        let mut sum = 0;
        for i in 1..=self.steps {
            let effects = self.effects.clone();
            let hang = self.hang_at.load(Ordering::SeqCst) == i;
            let effect = if i == 6 { self.effect6 } else { Effect::Pure };
            let name = if i == self.rename_at {
                "renamed".to_owned()
            } else {
                format!("step{i}")
            };
            let (tokens_out, big) = (self.tokens_out, i == self.big_at);
            let v: Out = cx
                .step(&name, effect, |s| async move {
                    *effects.runs.lock().unwrap().entry((id, i)).or_default() += 1;
                    effects.keys.lock().unwrap().push((i, s.key().to_owned()));
                    if hang {
                        std::future::pending::<()>().await;
                    }
                    s.report(Usage::tokens(0, tokens_out));
                    let pad = if big {
                        "x".repeat(2_000)
                    } else {
                        String::new()
                    };
                    Ok(Out { n: i * 10, pad })
                })
                .await?;
            sum += v.n;
        }
        Ok(AgentOutcome::Completed(json!(sum)))
    }
}

/// A step's result.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Out {
    n: i64,
    #[serde(default)]
    pad: String,
}

/// A runtime of `worker` over the fixture's store running `agent` as "numbered"; its `RunAgent`
/// messages are recorded in an in-memory queue, not run.
fn runtime(
    fx: &Fixture,
    worker: &str,
    agent: Numbered,
    options: RuntimeOptions,
) -> (Runtime, MessageBus, InMemoryTransport) {
    let queue = InMemoryTransport::new();
    let runtime = Runtime::builder(fx.store.clone())
        .agent("numbered", agent)
        .worker_identity(worker)
        .options(options)
        .build();
    let bus = runtime
        .register(
            MessageBus::builder()
                .transport("async", Arc::new(queue.clone()))
                .route("courier.run_agent", ["async"]),
        )
        .build();
    (runtime, bus, queue)
}

/// Runs `id` on `runtime` until its closure for step `step` has run `times` times, then drops
/// the execution (the worker is killed mid-step), and lets its lease expire.
async fn kill_in_step(
    fx: &Fixture,
    runtime: &Runtime,
    effects: &Effects,
    id: Uuid,
    step: i64,
    times: u32,
) {
    let rt = runtime.clone();
    let task = tokio::spawn(async move { rt.run_queued(id).await });
    while effects.count(id, step) < times {
        assert!(
            !task.is_finished(),
            "the execution ended before step {step}: {:?}",
            task.await
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    task.abort();
    let _ = task.await;
    fx.set_lease(id, 1).await;
}

/// The reaper of `runtime` requeues the killed run.
async fn reap(runtime: &Runtime) {
    let report = runtime.reaper().reap(ReapOptions::default()).await.unwrap();
    assert_eq!(report.requeued, 1, "{report:?}");
}

fn options() -> RuntimeOptions {
    RuntimeOptions {
        lease: Duration::from_secs(30),
        ..RuntimeOptions::default()
    }
}

async fn crashed_run_replays_finished_steps(fx: &Fixture) {
    let effects = Effects::default();
    let first = Numbered::new(&effects);
    first.hang_at.store(6, Ordering::SeqCst);
    let (a, _bus_a, _q) = runtime(fx, "worker:a", first, options());
    let (b, _bus_b, _q) = runtime(fx, "worker:b", Numbered::new(&effects), options());
    let id = a.submit(NewRun::new("numbered", json!({}))).await.unwrap();
    kill_in_step(fx, &a, &effects, id, 6, 1).await;
    reap(&b).await;
    let outcome = b.run_queued(id).await.unwrap();
    assert_eq!(outcome, Outcome::Completed { output: json!(550) });
    for step in 1..=10 {
        let expected = if step == 6 { 2 } else { 1 };
        assert_eq!(effects.count(id, step), expected, "step {step}");
    }
    let journal = fx.store.steps(id).await.unwrap();
    assert_eq!(journal.len(), 10);
    assert!(journal.iter().all(|s| s.status == StepStatus::Done));
    assert_eq!(journal[5].output, Some(json!({"n": 60, "pad": ""})));
    assert_eq!(journal[5].effect, "pure");
    let run = fx.run(id).await;
    assert_eq!(run.steps_replayed, 5, "steps 1-5 were replayed");
}

async fn guarded_retry_runs_again_with_the_same_key(fx: &Fixture) {
    let effects = Effects::default();
    let mut first = Numbered::new(&effects);
    first.effect6 = Effect::Guarded(OnAmbiguous::Retry);
    first.hang_at.store(6, Ordering::SeqCst);
    let mut second = Numbered::new(&effects);
    second.effect6 = Effect::Guarded(OnAmbiguous::Retry);
    let (a, _bus_a, _q) = runtime(fx, "worker:a", first, options());
    let (b, _bus_b, _q) = runtime(fx, "worker:b", second, options());
    let id = a.submit(NewRun::new("numbered", json!({}))).await.unwrap();
    kill_in_step(fx, &a, &effects, id, 6, 1).await;
    let intent = fx.store.steps(id).await.unwrap();
    assert_eq!(
        intent.last().map(|s| s.status),
        Some(StepStatus::Intent),
        "the intent is journaled before the closure"
    );
    reap(&b).await;
    assert_eq!(
        b.run_queued(id).await.unwrap(),
        Outcome::Completed { output: json!(550) }
    );
    assert_eq!(effects.count(id, 6), 2);
    let keys = effects.keys_of(6);
    assert_eq!(keys.len(), 2);
    assert_eq!(
        keys[0], keys[1],
        "the same idempotency key on both attempts"
    );
    assert_eq!(keys[0], format!("{id}:6"));
    let journal = fx.store.steps(id).await.unwrap();
    assert_eq!(journal[5].effect, "guarded");
    assert_eq!(journal[5].status, StepStatus::Done);
}

async fn guarded_park_parks_and_an_operator_skips(fx: &Fixture) {
    let effects = Effects::default();
    let mut first = Numbered::new(&effects);
    first.effect6 = Effect::Guarded(OnAmbiguous::Park);
    first.hang_at.store(6, Ordering::SeqCst);
    let mut second = Numbered::new(&effects);
    second.effect6 = Effect::Guarded(OnAmbiguous::Park);
    let (a, _bus_a, _q) = runtime(fx, "worker:a", first, options());
    let (b, _bus_b, queue) = runtime(fx, "worker:b", second, options());
    let id = a.submit(NewRun::new("numbered", json!({}))).await.unwrap();
    kill_in_step(fx, &a, &effects, id, 6, 1).await;
    reap(&b).await;
    assert_eq!(b.run_queued(id).await.unwrap(), Outcome::AwaitingApproval);
    let run = fx.run(id).await;
    assert_eq!(run.status, RunStatus::WaitingForApproval);
    assert_eq!(run.pending_effect.as_deref(), Some("step 6: step6"));
    assert_eq!(effects.count(id, 6), 1, "a parked step does not run again");
    let before = queue.sent().len();
    b.resolve_step(id, Resolution::Skip(json!({"n": 600})))
        .await
        .unwrap();
    assert_eq!(
        queue.sent().len(),
        before + 1,
        "the released run is dispatched"
    );
    assert_eq!(
        b.run_queued(id).await.unwrap(),
        Outcome::Completed {
            output: json!(1090)
        }
    );
    assert_eq!(effects.count(id, 6), 1, "a skipped step never ran again");
    assert_eq!(effects.count(id, 7), 1);
}

async fn guarded_fail_dead_letters_ambiguous_effect(fx: &Fixture) {
    let effects = Effects::default();
    let mut first = Numbered::new(&effects);
    first.effect6 = Effect::Guarded(OnAmbiguous::Fail);
    first.hang_at.store(6, Ordering::SeqCst);
    let mut second = Numbered::new(&effects);
    second.effect6 = Effect::Guarded(OnAmbiguous::Fail);
    let (a, _bus_a, _q) = runtime(fx, "worker:a", first, options());
    let (b, _bus_b, _q) = runtime(fx, "worker:b", second, options());
    let id = a.submit(NewRun::new("numbered", json!({}))).await.unwrap();
    kill_in_step(fx, &a, &effects, id, 6, 1).await;
    reap(&b).await;
    let outcome = b.run_queued(id).await.unwrap();
    assert_eq!(
        outcome,
        Outcome::Failed {
            reason: TerminationReason::NotRetryable,
            class: Some(FailureClass::AmbiguousEffect)
        }
    );
    assert_eq!(effects.count(id, 6), 1);
    assert_eq!(
        fx.run(id).await.error_class,
        Some(FailureClass::AmbiguousEffect)
    );
}

async fn budget_survives_a_crash(fx: &Fixture) {
    let effects = Effects::default();
    let mut first = Numbered::new(&effects);
    first.tokens_out = 300;
    first.hang_at.store(4, Ordering::SeqCst);
    let mut second = Numbered::new(&effects);
    second.tokens_out = 300;
    let (a, _bus_a, _q) = runtime(fx, "worker:a", first, options());
    let (b, _bus_b, _q) = runtime(fx, "worker:b", second, options());
    let mut run = NewRun::new("numbered", json!({}));
    run.budget = Some(Budget::new().tokens_out(1_000));
    let id = a.submit(run).await.unwrap();
    // Killed after step 3, in step 4: 900 tokens journaled.
    kill_in_step(fx, &a, &effects, id, 4, 1).await;
    assert_eq!(
        fx.run(id).await.usage.tokens_out,
        900,
        "usage is journaled with each step"
    );
    reap(&b).await;
    let outcome = b.run_queued(id).await.unwrap();
    assert_eq!(
        outcome,
        Outcome::Failed {
            reason: TerminationReason::BudgetExhausted,
            class: Some(FailureClass::BudgetExhausted)
        }
    );
    assert_eq!(effects.count(id, 5), 0, "the 5th step never ran");
    let run = fx.run(id).await;
    assert_eq!(run.usage.tokens_out, 1_200);
    assert_eq!(run.status, RunStatus::Failed);
    assert_eq!(
        run.termination_reason,
        Some(TerminationReason::BudgetExhausted)
    );
    assert_eq!(run.budget, Some(Budget::new().tokens_out(1_000)));
}

async fn nondeterminism_names_both_steps(fx: &Fixture) {
    let effects = Effects::default();
    let first = Numbered::new(&effects);
    first.hang_at.store(4, Ordering::SeqCst);
    let mut changed = Numbered::new(&effects);
    changed.rename_at = 2;
    let (a, _bus_a, _q) = runtime(fx, "worker:a", first, options());
    let (b, _bus_b, _q) = runtime(fx, "worker:b", changed, options());
    let id = a.submit(NewRun::new("numbered", json!({}))).await.unwrap();
    kill_in_step(fx, &a, &effects, id, 4, 1).await;
    reap(&b).await;
    let outcome = b.run_queued(id).await.unwrap();
    assert_eq!(
        outcome,
        Outcome::Failed {
            reason: TerminationReason::NotRetryable,
            class: Some(FailureClass::Nondeterminism)
        }
    );
    assert_eq!(effects.count(id, 2), 1, "the renamed step did not run");
    let message = StepError::Nondeterminism {
        index: 2,
        journaled: "step2".into(),
        requested: "renamed".into(),
    }
    .to_string();
    assert!(
        message.contains("`step2`") && message.contains("`renamed`"),
        "{message}"
    );
}

async fn oversized_result_fails_the_run(fx: &Fixture) {
    let effects = Effects::default();
    let mut agent = Numbered::new(&effects);
    agent.big_at = 3;
    let options = RuntimeOptions {
        max_step_result: 1_024,
        ..options()
    };
    let (a, _bus_a, _q) = runtime(fx, "worker:a", agent, options);
    let id = a.submit(NewRun::new("numbered", json!({}))).await.unwrap();
    let outcome = a.run_queued(id).await.unwrap();
    assert_eq!(
        outcome,
        Outcome::Failed {
            reason: TerminationReason::NotRetryable,
            class: Some(FailureClass::ResultTooLarge)
        }
    );
    assert_eq!(
        fx.store.steps(id).await.unwrap().len(),
        2,
        "the oversized result was not journaled"
    );
    assert_eq!(effects.count(id, 4), 0);
}

async fn corrupt_journal_row_dead_letters(fx: &Fixture) {
    let Some(sql) = fx.sql() else {
        panic!("this test runs on SQL stores, where a row can be corrupted by hand");
    };
    let effects = Effects::default();
    let first = Numbered::new(&effects);
    first.hang_at.store(4, Ordering::SeqCst);
    let (a, _bus_a, _q) = runtime(fx, "worker:a", first, options());
    let (b, _bus_b, _q) = runtime(fx, "worker:b", Numbered::new(&effects), options());
    let id = a.submit(NewRun::new("numbered", json!({}))).await.unwrap();
    kill_in_step(fx, &a, &effects, id, 4, 1).await;
    // PostgreSQL keeps JSONB (bad JSON cannot be stored): a value of the wrong shape instead.
    let bad = match sql.dialect() {
        courier_runs::Dialect::Postgres => "'{\"not\": \"a number\"}'::jsonb",
        _ => "'{not json'",
    };
    let steps = format!("{}_steps", sql.runs_table());
    let id_value = match sql.dialect() {
        courier_runs::Dialect::Postgres => format!("'{id}'::uuid"),
        _ => format!("'{id}'"),
    };
    sql.execute(&format!(
        "UPDATE {steps} SET output = {bad} WHERE run_id = {id_value} AND idx = 2"
    ))
    .await
    .unwrap();
    reap(&b).await;
    let outcome = b.run_queued(id).await.unwrap();
    assert_eq!(
        outcome,
        Outcome::Failed {
            reason: TerminationReason::NotRetryable,
            class: Some(FailureClass::CorruptJournal)
        }
    );
    assert_eq!(effects.count(id, 2), 1, "a corrupt step is not run again");
    // Nothing else is stuck: another run completes.
    let other = b.submit(NewRun::new("numbered", json!({}))).await.unwrap();
    assert_eq!(
        b.run_queued(other).await.unwrap(),
        Outcome::Completed { output: json!(550) }
    );
}

/// step1, a wait, step2: the wait is `sleep` (ms) or a signal `go` (with a timeout in ms).
struct Waiting {
    effects: Effects,
    wait: &'static str,
    ms: Option<u64>,
}

#[courier_runs::async_trait]
impl Agent for Waiting {
    async fn run(&self, cx: &mut RunContext) -> Result<AgentOutcome, AgentError> {
        let id = cx.run().id;
        let counted = |i: i64| {
            let effects = self.effects.clone();
            move |_| async move {
                *effects.runs.lock().unwrap().entry((id, i)).or_default() += 1;
                Ok(i)
            }
        };
        cx.step("before", Effect::Pure, counted(1)).await?;
        let got = if self.wait == "sleep" {
            cx.sleep(Duration::from_millis(self.ms.unwrap_or(0)))
                .await?;
            json!("slept")
        } else {
            match cx
                .wait_for_signal("go", self.ms.map(Duration::from_millis))
                .await?
            {
                Signal::Received { data, by, .. } => json!({"data": data, "by": by}),
                _ => json!("timeout"),
            }
        };
        cx.step("after", Effect::Pure, counted(2)).await?;
        Ok(AgentOutcome::Completed(got))
    }
}

fn waiting_runtime(fx: &Fixture, agent: Waiting) -> (Runtime, MessageBus, InMemoryTransport) {
    let queue = InMemoryTransport::new();
    let runtime = Runtime::builder(fx.store.clone())
        .agent("waiting", agent)
        .worker_identity("worker:w")
        .options(options())
        .build();
    let bus = runtime
        .register(
            MessageBus::builder()
                .transport("async", Arc::new(queue.clone()))
                .route("courier.run_agent", ["async"]),
        )
        .build();
    (runtime, bus, queue)
}

async fn signal_wakes_a_waiting_run_once(fx: &Fixture) {
    let effects = Effects::default();
    let agent = Waiting {
        effects: effects.clone(),
        wait: "signal",
        ms: None,
    };
    let (rt, _bus, queue) = waiting_runtime(fx, agent);
    let id = rt.submit(NewRun::new("waiting", json!({}))).await.unwrap();
    assert_eq!(rt.run_queued(id).await.unwrap(), Outcome::Waiting);
    let run = fx.run(id).await;
    assert_eq!(run.status, RunStatus::Waiting);
    assert_eq!(run.wait_signal.as_deref(), Some("go"));
    assert_eq!(
        (run.claimed_by.as_deref(), run.lease_expires),
        (None, 0),
        "no worker holds a waiting run"
    );
    // An unknown signal is refused and records nothing.
    let refused = rt.signal(id, "stop", json!(null), None).await;
    assert!(
        matches!(&refused, Err(RunError::UnknownSignal { waiting_for: Some(w), .. }) if w == "go"),
        "{refused:?}"
    );
    assert!(refused.unwrap_err().to_string().contains("`stop`"));
    let before = queue.sent().len();
    let sent = rt
        .signal(id, "go", json!({"ok": true}), Some("ops"))
        .await
        .unwrap();
    assert_eq!(sent, SignalSent::Woken);
    assert_eq!(
        queue.sent().len(),
        before + 1,
        "the woken run is dispatched"
    );
    let outcome = rt.run_queued(id).await.unwrap();
    assert_eq!(
        outcome,
        Outcome::Completed {
            output: json!({"data": {"ok": true}, "by": "ops"})
        }
    );
    assert_eq!(effects.count(id, 1), 1, "the step before the wait ran once");
    assert_eq!(effects.count(id, 2), 1);
    let journal = fx.store.steps(id).await.unwrap();
    assert_eq!(journal[1].name, "signal:go");
    assert_eq!(
        journal[1].output.as_ref().unwrap()["received"]["data"],
        json!({"ok": true})
    );
    // A finished run takes no more signals.
    assert!(matches!(
        rt.signal(id, "go", json!(1), None).await,
        Err(RunError::WrongStatus { .. })
    ));
}

async fn sleep_and_timeout_are_woken_by_the_reaper(fx: &Fixture) {
    for (wait, expected) in [("sleep", json!("slept")), ("signal", json!("timeout"))] {
        let effects = Effects::default();
        let agent = Waiting {
            effects: effects.clone(),
            wait,
            ms: Some(300),
        };
        let (rt, _bus, _queue) = waiting_runtime(fx, agent);
        let id = rt.submit(NewRun::new("waiting", json!({}))).await.unwrap();
        assert_eq!(rt.run_queued(id).await.unwrap(), Outcome::Waiting, "{wait}");
        let early = rt.reaper().reap(ReapOptions::default()).await.unwrap();
        assert_eq!(early.woken, 0, "{wait}: not due yet");
        assert_eq!(fx.run(id).await.status, RunStatus::Waiting);
        tokio::time::sleep(Duration::from_millis(400)).await;
        let due = rt.reaper().reap(ReapOptions::default()).await.unwrap();
        assert_eq!(due.woken, 1, "{wait}: {due:?}");
        assert_eq!(fx.run(id).await.status, RunStatus::Queued);
        assert_eq!(
            rt.run_queued(id).await.unwrap(),
            Outcome::Completed { output: expected },
            "{wait}"
        );
        assert_eq!(effects.count(id, 1), 1, "{wait}");
        assert_eq!(effects.count(id, 2), 1, "{wait}");
    }
}

async fn a_signal_sent_before_the_wait_is_buffered(fx: &Fixture) {
    let effects = Effects::default();
    let agent = Waiting {
        effects: effects.clone(),
        wait: "signal",
        ms: None,
    };
    let (rt, _bus, _queue) = waiting_runtime(fx, agent);
    let id = rt.submit(NewRun::new("waiting", json!({}))).await.unwrap();
    assert_eq!(
        rt.signal(id, "go", json!(7), None).await.unwrap(),
        SignalSent::Buffered
    );
    assert_eq!(
        rt.run_queued(id).await.unwrap(),
        Outcome::Completed {
            output: json!({"data": 7, "by": null})
        }
    );
}

/// A step row written with `usage` (and one replay) at `index`.
fn write_at(index: i64, usage: Usage) -> courier_runs::StepWrite {
    courier_runs::StepWrite {
        mode: courier_runs::JournalMode::Insert,
        index,
        name: format!("step{index}"),
        effect: "pure",
        status: StepStatus::Done,
        output: Some(json!(index)),
        error: None,
        error_class: None,
        usage,
        duration_ms: 1,
        replayed: 1,
    }
}

/// Many runs' claims, steps and settles at once (on PostgreSQL they ride shared statements):
/// each write gets its own answer. 40 runs are claimed by 40 tasks while 10 more tasks race for
/// 10 of them (one winner each); then every run journals step 1 at once, where one run was
/// cancelled and one taken over by another worker (both refused); then step 2 at once, where
/// one run writes step 1 again (that write alone fails, as a duplicate); then every run settles
/// at once, the two refused runs refused again. Nothing a refused or failed write carried is
/// stored.
async fn concurrent_writes_of_many_runs_get_their_own_answers(fx: &Fixture) {
    let store = fx.store.clone();
    let lease = Duration::from_secs(900);
    let mut ids = Vec::new();
    for _ in 0..40 {
        let run = store
            .insert_queued(&NewRun::new("numbered", json!({})))
            .await
            .unwrap();
        ids.push(run.id);
    }
    let barrier = Arc::new(tokio::sync::Barrier::new(50));
    let claims: Vec<_> = (0..50)
        .map(|i| {
            let (store, id, barrier) = (store.clone(), ids[i % 40], barrier.clone());
            let worker = format!("w{i}");
            tokio::spawn(async move {
                barrier.wait().await;
                let claimed = store.claim(id, &worker, lease).await;
                (id, worker, claimed)
            })
        })
        .collect();
    let mut owners: HashMap<Uuid, String> = HashMap::new();
    for claim in claims {
        let (id, worker, claimed) = claim.await.unwrap();
        if let Some(run) = claimed.unwrap() {
            assert_eq!(run.id, id);
            assert_eq!(run.claimed_by.as_deref(), Some(worker.as_str()));
            assert!(owners.insert(id, worker).is_none(), "{id} claimed twice");
        }
    }
    assert_eq!(owners.len(), 40, "every run claimed exactly once");

    let (cancelled, taken, dup) = (ids[3], ids[17], ids[29]);
    assert!(store.cancel(cancelled).await.unwrap());
    assert!(
        store
            .requeue_owned(taken, &owners[&taken], Duration::ZERO)
            .await
            .unwrap()
    );
    assert!(store.claim(taken, "thief", lease).await.unwrap().is_some());
    // Step 1 of every run at once; then step 2, where `dup` writes step 1 again.
    for round in 1..=2 {
        let barrier = Arc::new(tokio::sync::Barrier::new(ids.len()));
        let journals: Vec<_> = ids
            .iter()
            .map(|&id| {
                let (store, owner, barrier) = (store.clone(), owners[&id].clone(), barrier.clone());
                let index = if id == dup { 1 } else { round };
                tokio::spawn(async move {
                    let w = write_at(index, Usage::tokens(0, 100));
                    barrier.wait().await;
                    (id, store.journal(id, Some(&owner), lease, &w).await)
                })
            })
            .collect();
        for journal in journals {
            let (id, done) = journal.await.unwrap();
            match id {
                id if id == cancelled || id == taken => {
                    assert!(
                        !done.unwrap(),
                        "{id}: a write without the lease went through"
                    );
                }
                id if id == dup && round == 2 => {
                    assert!(done.is_err(), "a second row at index 1: {done:?}");
                }
                id => assert!(done.unwrap(), "{id}: refused in round {round}"),
            }
        }
    }
    for &id in &ids {
        let run = store.find(id).await.unwrap().unwrap();
        let steps = store.steps(id).await.unwrap();
        let (tokens, rows) = match id {
            id if id == cancelled || id == taken => (0, 0),
            id if id == dup => (100, 1),
            _ => (200, 2),
        };
        assert_eq!((run.usage.tokens_out, steps.len()), (tokens, rows), "{id}");
    }

    let barrier = Arc::new(tokio::sync::Barrier::new(ids.len()));
    let settles: Vec<_> = ids
        .iter()
        .map(|&id| {
            let (store, owner, barrier) = (store.clone(), owners[&id].clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                let done = Settlement {
                    status: RunStatus::Completed,
                    reason: Some(TerminationReason::Completed),
                    class: None,
                    output: Some(json!({"run": id.to_string()})),
                };
                (id, store.settle(id, Some(&owner), &done).await.unwrap())
            })
        })
        .collect();
    for settle in settles {
        let (id, settled) = settle.await.unwrap();
        assert_eq!(settled, id != cancelled && id != taken, "{id}");
    }
    for &id in &ids {
        let run = store.find(id).await.unwrap().unwrap();
        let expected = match id {
            id if id == cancelled => (RunStatus::Cancelled, None),
            id if id == taken => (RunStatus::Running, None),
            id => (RunStatus::Completed, Some(json!({"run": id.to_string()}))),
        };
        assert_eq!((run.status, run.output), expected, "{id}");
    }
    assert_eq!(
        store
            .find(taken)
            .await
            .unwrap()
            .unwrap()
            .claimed_by
            .as_deref(),
        Some("thief")
    );
}

/// A journal write is all or nothing, and a failed one leaves every pooled connection usable:
/// a step row that cannot be written (its index taken) adds no usage, renews nothing, and the
/// next writes, on whichever connection the pool hands out, go through; a write by a worker
/// that lost the lease writes nothing.
async fn a_failed_journal_write_leaves_nothing_behind(fx: &Fixture) {
    let store = &fx.store;
    let lease = Duration::from_secs(30);
    let run = store
        .insert_queued(&NewRun::new("numbered", json!({})))
        .await
        .unwrap();
    store.claim(run.id, "w1", lease).await.unwrap().unwrap();
    assert!(
        store
            .journal(
                run.id,
                Some("w1"),
                lease,
                &write_at(1, Usage::tokens(0, 100))
            )
            .await
            .unwrap()
    );
    let before = store.find(run.id).await.unwrap().unwrap();
    assert_eq!(before.usage.tokens_out, 100);

    let taken = store
        .journal(
            run.id,
            Some("w1"),
            lease,
            &write_at(1, Usage::tokens(0, 50)),
        )
        .await;
    assert!(taken.is_err(), "a second row at index 1: {taken:?}");
    let after = store.find(run.id).await.unwrap().unwrap();
    assert_eq!(
        after.usage, before.usage,
        "the failed write added its usage"
    );
    assert_eq!(after.steps_replayed, before.steps_replayed);

    // More writes than the pool has connections: one left inside a transaction would refuse
    // its next BEGIN, or hold the write lock against the others.
    for index in 2..=12 {
        assert!(
            store
                .journal(
                    run.id,
                    Some("w1"),
                    lease,
                    &write_at(index, Usage::tokens(0, 1))
                )
                .await
                .unwrap(),
            "write {index}"
        );
    }
    assert!(
        !store
            .journal(
                run.id,
                Some("w2"),
                lease,
                &write_at(13, Usage::tokens(0, 1000))
            )
            .await
            .unwrap(),
        "a worker without the lease journaled"
    );
    let last = store.find(run.id).await.unwrap().unwrap();
    assert_eq!(last.usage.tokens_out, 111);
    assert_eq!(last.steps_replayed, before.steps_replayed + 11);
    let steps = store.steps(run.id).await.unwrap();
    assert_eq!(
        steps.iter().map(|s| s.index).collect::<Vec<_>>(),
        (1..=12).collect::<Vec<_>>()
    );
}

/// A step row at `index` that adds no usage and replays nothing.
fn plain_at(index: i64) -> courier_runs::StepWrite {
    courier_runs::StepWrite {
        replayed: 0,
        ..write_at(index, Usage::default())
    }
}

/// A step writes the run's row only when it must: while more than three quarters of the lease
/// is surely left and the step adds no usage, the step's row is all it writes (one statement on
/// SQLite and MySQL; PostgreSQL's CTE leaves the lease as it is); once a quarter of the lease has
/// passed, the step renews it; a step that adds usage writes the run's row too.
async fn a_step_renews_the_lease_only_when_it_runs_low(fx: &Fixture) {
    let (store, sql) = (&fx.store, fx.sql().expect("a SQL store"));
    let dialect = sql.dialect();
    let lease = Duration::from_secs(6);
    let run = store
        .insert_queued(&NewRun::new("numbered", json!({})))
        .await
        .unwrap();
    let claimed = store.claim(run.id, "w1", lease).await.unwrap().unwrap();
    let plain = plain_at;
    let journal = |w: courier_runs::StepWrite| async move {
        let before = sql.shared_writes().journal_statements;
        assert!(store.journal(run.id, Some("w1"), lease, &w).await.unwrap());
        let row = store.find(run.id).await.unwrap().unwrap();
        (row, sql.shared_writes().journal_statements - before)
    };
    let (row, statements) = journal(plain(1)).await;
    assert_eq!(row.lease_expires, claimed.lease_expires, "renewed at once");
    assert_eq!(statements, 1, "a step with a fresh lease on {dialect:?}");

    // More than a quarter of the lease has passed: the next step renews it.
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    let (row, statements) = journal(plain(2)).await;
    let renewed = row.lease_expires;
    assert!(
        renewed >= claimed.lease_expires + 1_500,
        "not renewed: {renewed} against {} claimed",
        claimed.lease_expires
    );
    let with_run_row = match dialect {
        Dialect::Postgres => 1,
        Dialect::Sqlite => 2,
        _ => 4,
    };
    assert_eq!(statements, with_run_row, "a renewing step on {dialect:?}");

    let (row, statements) = journal(plain(3)).await;
    assert_eq!(
        (row.lease_expires, statements),
        (renewed, 1),
        "the renewed lease is fresh"
    );
    let (row, statements) = journal(write_at(4, Usage::tokens(0, 7))).await;
    assert_eq!(
        (row.lease_expires, row.usage.tokens_out, statements),
        (renewed, 7, with_run_row),
        "a step adding usage writes the run's row, not its lease"
    );
    // The single statement keeps the guard and the journal's answers: another worker's step is
    // refused, a step written twice fails as a duplicate, and neither leaves anything behind.
    assert!(
        !store
            .journal(run.id, Some("w2"), lease, &plain(5))
            .await
            .unwrap(),
        "a worker without the claim journaled"
    );
    let twice = store.journal(run.id, Some("w1"), lease, &plain(3)).await;
    assert!(
        matches!(
            twice,
            Err(courier_runs::StoreError::DuplicateSequence { seq: 3, .. })
        ),
        "{twice:?}"
    );
    let (_, statements) = journal(plain(5)).await;
    assert_eq!(statements, 1);
    let steps = store.steps(run.id).await.unwrap();
    assert_eq!(
        steps.iter().map(|s| s.index).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5]
    );
}

/// A step whose lease is fresh is one statement, and it still cannot slip past a takeover being
/// committed: another connection hands the run to worker w2 and holds its transaction open; the
/// step of w1 waits for it, then finds the run taken and writes nothing. On MySQL the store runs
/// on a pool of READ COMMITTED sessions (an application's pool may be), where a plain read of
/// the run's row would be a snapshot that does not wait.
async fn a_step_racing_a_takeover_waits_for_it_and_is_refused(fx: &Fixture) {
    let sql = fx.sql().expect("a SQL store");
    let dsn = fx.dsn.clone().expect("a DSN");
    let store: Arc<dyn courier_runs::RunStore> = match sql.dialect() {
        #[cfg(feature = "mysql")]
        Dialect::Mysql => {
            let pool = sqlx::mysql::MySqlPoolOptions::new()
                .after_connect(|conn, _| {
                    Box::pin(async move {
                        sqlx::Executor::execute(
                            conn,
                            "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
                        )
                        .await
                        .map(drop)
                    })
                })
                .connect(&dsn)
                .await
                .unwrap();
            let prefix = sql.runs_table().trim_end_matches("_runs");
            Arc::new(
                courier_runs::SqlRunStore::from_pool(
                    pool,
                    courier_runs::SqlRunStoreOptions::default().table_prefix(prefix),
                )
                .unwrap(),
            )
        }
        _ => fx.store.clone(),
    };
    let lease = Duration::from_secs(60);
    let run = store
        .insert_queued(&NewRun::new("numbered", json!({})))
        .await
        .unwrap();
    store.claim(run.id, "w1", lease).await.unwrap().unwrap();
    let takeover = format!(
        "UPDATE {} SET claimed_by = 'w2' WHERE id = '{}'",
        sql.runs_table(),
        run.id
    );
    let step = {
        let store = store.clone();
        move || {
            tokio::spawn(
                async move { store.journal(run.id, Some("w1"), lease, &plain_at(1)).await },
            )
        }
    };
    // Holds the takeover uncommitted while the step is sent, then commits it.
    macro_rules! race {
        ($pool:expr, $begin:expr) => {{
            let pool = $pool.await.unwrap();
            let mut conn = pool.acquire().await.unwrap();
            let mut tx = sqlx::Connection::begin_with(&mut *conn, $begin)
                .await
                .unwrap();
            sqlx::query(&takeover).execute(&mut *tx).await.unwrap();
            let step = step();
            tokio::time::sleep(Duration::from_millis(300)).await;
            let waited = !step.is_finished();
            tx.commit().await.unwrap();
            (waited, step.await.unwrap())
        }};
    }
    let (waited, written) = match sql.dialect() {
        #[cfg(feature = "postgres")]
        Dialect::Postgres => race!(sqlx::PgPool::connect(&dsn), "BEGIN"),
        #[cfg(feature = "mysql")]
        Dialect::Mysql => race!(sqlx::MySqlPool::connect(&dsn), "BEGIN"),
        #[cfg(feature = "sqlite")]
        Dialect::Sqlite => race!(sqlx::SqlitePool::connect(&dsn), "BEGIN IMMEDIATE"),
        other => panic!("no race for {other:?}"),
    };
    assert!(
        waited,
        "the step did not wait for the takeover being committed"
    );
    assert!(!written.unwrap(), "w1 journaled a step of a run w2 took");
    assert!(store.steps(run.id).await.unwrap().is_empty());
}

macro_rules! step_tests {
    ($fixture:path, $attr:meta, [$($name:ident),* $(,)?]) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            #[$attr]
            async fn $name() {
                let fx = $fixture().await;
                let test = tokio::time::timeout(Duration::from_secs(60), crate::$name(&fx));
                let result = futures_util::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(test)).await;
                fx.cleanup().await;
                match result {
                    Ok(done) => done.expect("test timed out"),
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            }
        )*
    };
}

macro_rules! all_step_tests {
    ($fixture:path, $attr:meta) => {
        step_tests!(
            $fixture,
            $attr,
            [
                crashed_run_replays_finished_steps,
                guarded_retry_runs_again_with_the_same_key,
                guarded_park_parks_and_an_operator_skips,
                guarded_fail_dead_letters_ambiguous_effect,
                budget_survives_a_crash,
                nondeterminism_names_both_steps,
                oversized_result_fails_the_run,
                signal_wakes_a_waiting_run_once,
                sleep_and_timeout_are_woken_by_the_reaper,
                a_signal_sent_before_the_wait_is_buffered,
            ]
        );
    };
}

async fn memory_fixture() -> Fixture {
    support::memory()
}

mod memory {
    use super::*;
    all_step_tests!(memory_fixture, allow(unused));
}

mod sqlite {
    use super::*;
    all_step_tests!(support::sqlite, allow(unused));
    step_tests!(
        support::sqlite,
        allow(unused),
        [
            corrupt_journal_row_dead_letters,
            a_failed_journal_write_leaves_nothing_behind,
            concurrent_writes_of_many_runs_get_their_own_answers,
            a_step_renews_the_lease_only_when_it_runs_low,
            a_step_racing_a_takeover_waits_for_it_and_is_refused
        ]
    );
}

mod postgres {
    use super::*;
    all_step_tests!(
        support::postgres,
        ignore = "needs PostgreSQL (scripts/services)"
    );
    step_tests!(
        support::postgres,
        ignore = "needs PostgreSQL (scripts/services)",
        [
            corrupt_journal_row_dead_letters,
            a_failed_journal_write_leaves_nothing_behind,
            concurrent_writes_of_many_runs_get_their_own_answers,
            a_step_renews_the_lease_only_when_it_runs_low,
            a_step_racing_a_takeover_waits_for_it_and_is_refused
        ]
    );
}

mod mysql {
    use super::*;
    all_step_tests!(support::mysql, ignore = "needs MariaDB (scripts/services)");
    step_tests!(
        support::mysql,
        ignore = "needs MariaDB (scripts/services)",
        [
            corrupt_journal_row_dead_letters,
            a_failed_journal_write_leaves_nothing_behind,
            concurrent_writes_of_many_runs_get_their_own_answers,
            a_step_renews_the_lease_only_when_it_runs_low,
            a_step_racing_a_takeover_waits_for_it_and_is_refused
        ]
    );
}

async fn fork_replays_the_steps_before_its_start(fx: &Fixture) {
    let effects = Effects::default();
    let (a, _bus_a, _q) = runtime(fx, "worker:a", Numbered::new(&effects), options());
    let id = a.submit(NewRun::new("numbered", json!({}))).await.unwrap();
    assert_eq!(
        a.run_queued(id).await.unwrap(),
        Outcome::Completed { output: json!(550) }
    );
    let fork = a.fork(id, 4).await.unwrap();
    assert_ne!(fork, id);
    assert_eq!(
        fx.store.steps(fork).await.unwrap().len(),
        3,
        "steps 1-3 copied"
    );
    assert_eq!(
        a.run_queued(fork).await.unwrap(),
        Outcome::Completed { output: json!(550) }
    );
    for step in 1..=3 {
        assert_eq!(
            effects.count(fork, step),
            0,
            "step {step} of the fork was replayed"
        );
    }
    for step in 4..=10 {
        assert_eq!(effects.count(fork, step), 1, "step {step} of the fork ran");
    }
    assert_eq!(fx.run(fork).await.steps_replayed, 3);
    assert_eq!(
        fx.store.steps(id).await.unwrap().len(),
        10,
        "the original is untouched"
    );
}

async fn prune_deletes_old_finished_runs_with_their_steps(fx: &Fixture) {
    let effects = Effects::default();
    let mut agent = Numbered::new(&effects);
    agent.steps = 2;
    let mut options = options();
    options.retention = Some(Duration::from_secs(30 * 86_400));
    let (a, _bus, _q) = runtime(fx, "worker:a", agent, options);
    let mut ids = Vec::new();
    for _ in 0..4 {
        let id = a.submit(NewRun::new("numbered", json!({}))).await.unwrap();
        assert!(matches!(
            a.run_queued(id).await.unwrap(),
            Outcome::Completed { .. }
        ));
        fx.store.append_event(id, "note", &json!(1)).await.unwrap();
        ids.push(id);
    }
    let cancelled = a.submit(NewRun::new("numbered", json!({}))).await.unwrap();
    assert!(a.cancel(cancelled).await.unwrap());
    let queued = a.submit(NewRun::new("numbered", json!({}))).await.unwrap();
    // Three old completed runs, one recent; an old cancelled one; a queued one.
    for id in &ids[..3] {
        fx.set_finished_at(*id, 1_000).await;
    }
    fx.set_finished_at(cancelled, 1_000).await;
    let month = Duration::from_secs(30 * 86_400);
    let only_completed = [RunStatus::Completed];
    assert_eq!(
        fx.store.prune(month, &only_completed, 2).await.unwrap(),
        2,
        "bounded by the limit"
    );
    assert_eq!(fx.store.prune(month, &only_completed, 2).await.unwrap(), 1);
    assert_eq!(fx.store.prune(month, &only_completed, 2).await.unwrap(), 0);
    for id in &ids[..3] {
        assert!(fx.store.find(*id).await.unwrap().is_none());
        assert!(
            fx.store.steps(*id).await.unwrap().is_empty(),
            "steps go with their run"
        );
        assert!(
            fx.store.events(*id).await.unwrap().is_empty(),
            "events go with their run"
        );
    }
    assert!(
        fx.store.find(ids[3]).await.unwrap().is_some(),
        "a recent run is kept"
    );
    assert_eq!(fx.store.steps(ids[3]).await.unwrap().len(), 2);
    assert!(
        fx.store.find(cancelled).await.unwrap().is_some(),
        "a status not asked for is kept"
    );
    assert_eq!(fx.run(queued).await.status, RunStatus::Queued);
    // The reaper applies `runs.retention` to every terminal status.
    let report = a.reaper().reap(ReapOptions::default()).await.unwrap();
    assert_eq!(report.pruned, 1, "{report:?}");
    assert!(fx.store.find(cancelled).await.unwrap().is_none());
    assert!(
        fx.store.find(queued).await.unwrap().is_some(),
        "a queued run is never pruned"
    );
}

mod prune {
    use super::*;
    step_tests!(
        crate::memory_fixture,
        allow(unused),
        [prune_deletes_old_finished_runs_with_their_steps]
    );
    mod sqlite {
        use super::*;
        step_tests!(
            support::sqlite,
            allow(unused),
            [prune_deletes_old_finished_runs_with_their_steps]
        );
    }
    mod postgres {
        use super::*;
        step_tests!(
            support::postgres,
            ignore = "needs PostgreSQL (scripts/services)",
            [prune_deletes_old_finished_runs_with_their_steps]
        );
    }
    mod mysql {
        use super::*;
        step_tests!(
            support::mysql,
            ignore = "needs MariaDB (scripts/services)",
            [prune_deletes_old_finished_runs_with_their_steps]
        );
    }
}

mod fork {
    use super::*;
    step_tests!(
        memory_fixture,
        allow(unused),
        [fork_replays_the_steps_before_its_start]
    );
    mod sqlite {
        use super::*;
        step_tests!(
            support::sqlite,
            allow(unused),
            [fork_replays_the_steps_before_its_start]
        );
    }
    mod postgres {
        use super::*;
        step_tests!(
            support::postgres,
            ignore = "needs PostgreSQL (scripts/services)",
            [fork_replays_the_steps_before_its_start]
        );
    }
    mod mysql {
        use super::*;
        step_tests!(
            support::mysql,
            ignore = "needs MariaDB (scripts/services)",
            [fork_replays_the_steps_before_its_start]
        );
    }
}
