//! Durable steps across real crashes (issue 38), on SQLite, PostgreSQL and MariaDB: the
//! `steps-worker` process runs the `steps` agent, whose every step adds one to a counter of
//! its own in the database (`<prefix>_effects`, with the idempotency key it was given), and is
//! killed with SIGKILL.
//!
//! - `steps_crash_*`: five 10-step runs, one per kind of step 6 (pure, idempotent, guarded
//!   with retry, park and fail); a worker is killed while all five are inside step 6 (after its
//!   effect), another worker finishes them. Steps 1-5 ran once; step 6 ran twice with the same
//!   key when it may run again (pure, idempotent, retry); a parked run waits for approval
//!   naming step 6, which ran once (and runs again, with the same key, once an operator says
//!   retry); a run whose step 6 fails on ambiguity fails `ambiguous_effect`, step 6 ran once.
//! - `steps_kill_loop_*`: 200 runs of 10 steps, two workers of four runs each, one of them
//!   SIGKILLed every 2 s and restarted; every run ends terminal, no finished step ran again (a
//!   run's extra executions of steps are at most its reclaims, only of steps that may run
//!   again), the guarded step without retry never ran twice, and no budget was exceeded by more
//!   than one step's usage. `max_requeues` is 1,000 here: every kill reclaims the runs in
//!   flight, and the default of 3 would dead-letter a run reclaimed a fourth time.
//!
//! Run with `cargo test -p courier-chaos --all-features --test steps_crash -- --include-ignored`
//! (the services of `scripts/services`); the tests run one at a time.

#![allow(clippy::unwrap_used, clippy::too_many_lines, reason = "tests")]

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use courier_chaos::steps::{
    CONCURRENCY_ENV, EffectRow, Effects, LEASE_ENV, MAX_REQUEUES_ENV, PREFIX_ENV, QUEUE_ENV,
    REAP_ENV, STALL_DIR_ENV, STALL_STEP_ENV, STEPS_AGENT, STORE_ENV, StepKind, StepsPlan,
};
use courier_core::{Dsn, MessageBus, MessageRegistry};
use courier_runs::{
    Budget, FailureClass, NewRun, Resolution, Run, RunAgent, RunStatus, RunStore, Runtime,
    SqlRunStore, SqlRunStoreOptions, StepStatus,
};
use courier_sql::SqlTransport;
use courier_test::Cleanup;
use courier_test::env::{mysql_url, postgres_url, unique_name};
use tokio::process::{Child, Command};
use uuid::Uuid;

const WORKER: &str = env!("CARGO_BIN_EXE_steps-worker");
/// The runs' lease in the workers: a killed worker's runs come back after it.
const LEASE_MS: u64 = 3_000;
/// The workers' reaper interval.
const REAP_MS: u64 = 500;

/// The tests run one at a time: each kills and times processes on two cores.
static SERIAL: Mutex<()> = Mutex::new(());

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// A temporary directory (SQLite files, worker logs, stall markers), removed when the test
/// passes and kept (its path printed) when it fails.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Self {
        let path = std::env::temp_dir().join(unique_name(name));
        std::fs::create_dir_all(&path).unwrap();
        Self(path)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("kept {} (worker logs)", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// One database's tables for a test: the run store `<prefix>_runs...`, the queue
/// `<prefix>_queue`, the effects `<prefix>_effects`, and a runtime that submits runs on it.
struct Place {
    name: &'static str,
    dir: PathBuf,
    store_dsn: String,
    prefix: String,
    queue_dsn: String,
    store: SqlRunStore,
    effects: Effects,
    runtime: Runtime,
    _bus: MessageBus,
}

impl Place {
    /// SQLite files in `dir`.
    async fn sqlite(dir: &Path) -> Self {
        let store = format!("sqlite://{}", dir.join("runs.db").display());
        let queue = format!(
            "sqlite://{}?poll_window=50ms&redeliver_timeout=5s",
            dir.join("queue.db").display()
        );
        Self::open("sqlite", dir, store, unique_name("steps"), queue).await
    }

    /// Tables of this test's own on the server at `url`, dropped by `cleanup`.
    async fn server(name: &'static str, url: String, dir: &Path, cleanup: &Cleanup) -> Self {
        let prefix = unique_name("steps");
        cleanup.sql_tables(&url, &prefix);
        let sep = if url.contains('?') { '&' } else { '?' };
        let queue =
            format!("{url}{sep}table_name={prefix}_queue&poll_window=50ms&redeliver_timeout=5s");
        Self::open(name, dir, url, prefix, queue).await
    }

    async fn open(
        name: &'static str,
        dir: &Path,
        store_dsn: String,
        prefix: String,
        queue_dsn: String,
    ) -> Self {
        let store = SqlRunStore::connect(
            &store_dsn,
            SqlRunStoreOptions::default().table_prefix(&prefix),
        )
        .await
        .unwrap();
        store.setup().await.unwrap();
        let effects = Effects::connect(&store_dsn, &prefix).await.unwrap();
        effects.create().await.unwrap();
        let mut registry = MessageRegistry::new();
        registry.register::<RunAgent>();
        let queue = SqlTransport::connect(
            "async",
            &Dsn::parse(&queue_dsn).unwrap(),
            Arc::new(registry),
        )
        .await
        .unwrap();
        let runtime = Runtime::builder(Arc::new(store.clone())).build();
        let bus = runtime
            .register(
                MessageBus::builder()
                    .transport("async", Arc::new(queue))
                    .route("courier.run_agent", ["async"]),
            )
            .build();
        Self {
            name,
            dir: dir.to_owned(),
            store_dsn,
            prefix,
            queue_dsn,
            store,
            effects,
            runtime,
            _bus: bus,
        }
    }

    /// Starts a worker process, its output in `<dir>/<label>.log`.
    fn spawn(&self, label: &str, env: &[(&str, String)]) -> Child {
        let log = std::fs::File::create(self.dir.join(format!("{label}.log"))).unwrap();
        let mut cmd = Command::new(WORKER);
        cmd.env(STORE_ENV, &self.store_dsn)
            .env(PREFIX_ENV, &self.prefix)
            .env(QUEUE_ENV, &self.queue_dsn)
            .env(LEASE_ENV, LEASE_MS.to_string())
            .env(REAP_ENV, REAP_MS.to_string())
            .env_remove(STALL_DIR_ENV)
            .env_remove(STALL_STEP_ENV)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .kill_on_drop(true);
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.spawn().unwrap()
    }

    async fn submit(&self, plan: &StepsPlan, budget: Option<Budget>) -> Uuid {
        let mut run = NewRun::new(STEPS_AGENT, plan.to_input());
        run.budget = budget;
        self.runtime.submit(run).await.unwrap()
    }

    async fn run(&self, id: Uuid) -> Run {
        self.store.find(id).await.unwrap().unwrap()
    }

    /// Every effect row, by run and step.
    async fn effects(&self) -> HashMap<Uuid, BTreeMap<i64, EffectRow>> {
        let mut by_run: HashMap<Uuid, BTreeMap<i64, EffectRow>> = HashMap::new();
        for row in self.effects.rows().await.unwrap() {
            by_run.entry(row.run_id).or_default().insert(row.step, row);
        }
        by_run
    }

    /// Waits until every run of `ids` is settled (`done` says when), at most `limit`.
    async fn wait_until(&self, ids: &[Uuid], limit: Duration, done: impl Fn(&Run) -> bool) {
        let deadline = Instant::now() + limit;
        loop {
            let mut pending = Vec::new();
            for &id in ids {
                let run = self.run(id).await;
                if !done(&run) {
                    pending.push(format!("{id} {}", run.status.as_str()));
                }
            }
            if pending.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "[{}] runs not settled within {limit:?}: {}",
                self.name,
                pending.join(", ")
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn log(&self, label: &str) -> String {
        std::fs::read_to_string(self.dir.join(format!("{label}.log"))).unwrap_or_default()
    }
}

/// Counts of each step's effect for one run, steps 1..=10 (0: never ran).
fn counts(rows: Option<&BTreeMap<i64, EffectRow>>) -> Vec<i64> {
    (1..=10)
        .map(|i| rows.and_then(|r| r.get(&i)).map_or(0, |r| r.n))
        .collect()
}

/// Steps 1-5 of every crash run: each kind once, all finished before the kill.
const FIRST_FIVE: [StepKind; 5] = [
    StepKind::Pure,
    StepKind::Idempotent,
    StepKind::Retry,
    StepKind::Fail,
    StepKind::Park,
];

fn crash_plan(six: StepKind) -> StepsPlan {
    let mut kinds = FIRST_FIVE.to_vec();
    kinds.push(six);
    kinds.extend([
        StepKind::Pure,
        StepKind::Idempotent,
        StepKind::Retry,
        StepKind::Pure,
    ]);
    StepsPlan {
        kinds,
        ms: vec![5; 10],
        tokens_out: 7,
    }
}

/// The crash test on `place`: see the module docs.
async fn crash_in_step_six(place: &Place) {
    let t0 = Instant::now();
    let stall = place.dir.join("stall");
    std::fs::create_dir_all(&stall).unwrap();
    let mut first = place.spawn(
        "first",
        &[
            (STALL_DIR_ENV, stall.display().to_string()),
            (STALL_STEP_ENV, "6".into()),
            (CONCURRENCY_ENV, "5".into()),
        ],
    );
    let mut runs: Vec<(StepKind, Uuid, StepsPlan)> = Vec::new();
    for six in StepKind::ALL {
        let plan = crash_plan(six);
        runs.push((six, place.submit(&plan, None).await, plan));
    }
    let ids: Vec<Uuid> = runs.iter().map(|(_, id, _)| *id).collect();

    // Every run inside step 6, its effect done: kill the worker.
    let deadline = Instant::now() + Duration::from_secs(60);
    while ids.iter().any(|id| !stall.join(id.to_string()).exists()) {
        if let Ok(Some(status)) = first.try_wait() {
            panic!(
                "[{}] the first worker exited ({status}) before step 6:\n{}",
                place.name,
                place.log("first")
            );
        }
        assert!(
            Instant::now() < deadline,
            "[{}] the runs never reached step 6:\n{}",
            place.name,
            place.log("first")
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pid = first.id().unwrap();
    first.kill().await.unwrap(); // SIGKILL
    let killed_at = t0.elapsed();

    let effects = place.effects().await;
    for (six, id, _) in &runs {
        let run = place.run(*id).await;
        assert_eq!(
            run.status,
            RunStatus::Running,
            "[{six:?}] the dead worker settled nothing"
        );
        let owner = run.claimed_by.clone().unwrap_or_default();
        assert!(
            owner.contains(&format!(":{pid}:")),
            "[{six:?}] claimed by the killed worker: {owner}"
        );
        let journal: Vec<(i64, StepStatus)> = place
            .store
            .steps(*id)
            .await
            .unwrap()
            .iter()
            .map(|s| (s.index, s.status))
            .collect();
        let mut want: Vec<(i64, StepStatus)> = (1..=5).map(|i| (i, StepStatus::Done)).collect();
        if matches!(six, StepKind::Retry | StepKind::Park | StepKind::Fail) {
            want.push((6, StepStatus::Intent));
        }
        assert_eq!(journal, want, "[{six:?}] journal at the kill");
        assert_eq!(
            counts(effects.get(id)),
            [1, 1, 1, 1, 1, 1, 0, 0, 0, 0],
            "[{six:?}] effects at the kill"
        );
    }

    // Another worker finishes them (its reaper reclaims them once the lease has run out).
    let mut second = place.spawn("second", &[(CONCURRENCY_ENV, "5".into())]);
    place
        .wait_until(&ids, Duration::from_secs(60), |r| {
            r.status.is_terminal() || r.status == RunStatus::WaitingForApproval
        })
        .await;
    let recovered_at = t0.elapsed();
    let effects = place.effects().await;
    let mut parked = None;
    for (six, id, plan) in &runs {
        let run = place.run(*id).await;
        let rows = effects.get(id);
        let key6 = rows.and_then(|r| r.get(&6)).map(|r| r.key.clone());
        assert_eq!(key6, Some(format!("{id}:6")), "[{six:?}] step 6's key");
        assert_eq!(run.requeue_count, 1, "[{six:?}] one reclaim");
        match six {
            StepKind::Pure | StepKind::Idempotent | StepKind::Retry => {
                assert_eq!(
                    (run.status, run.output.clone()),
                    (RunStatus::Completed, Some(plan.expected_output())),
                    "[{six:?}] completed with every step's result"
                );
                assert_eq!(
                    counts(rows),
                    [1, 1, 1, 1, 1, 2, 1, 1, 1, 1],
                    "[{six:?}] steps 1-5 ran once, step 6 twice (same key), the rest once"
                );
                assert_eq!(run.steps_replayed, 5, "[{six:?}] steps 1-5 replayed");
                assert_eq!(run.usage.tokens_out, 70, "[{six:?}] usage of 10 steps");
            }
            StepKind::Park => {
                assert_eq!(run.status, RunStatus::WaitingForApproval, "[park] parked");
                assert_eq!(run.pending_effect.as_deref(), Some("step 6: s6"));
                assert_eq!(
                    counts(rows),
                    [1, 1, 1, 1, 1, 1, 0, 0, 0, 0],
                    "[park] step 6 ran once, nothing after it"
                );
                parked = Some((*id, plan.clone()));
            }
            StepKind::Fail => {
                assert_eq!(
                    (run.status, run.error_class),
                    (RunStatus::Failed, Some(FailureClass::AmbiguousEffect)),
                    "[fail] failed as ambiguous"
                );
                assert_eq!(
                    counts(rows),
                    [1, 1, 1, 1, 1, 1, 0, 0, 0, 0],
                    "[fail] step 6 ran once, nothing after it"
                );
            }
        }
        for (step, row) in rows.into_iter().flatten() {
            assert_eq!(
                row.key,
                format!("{id}:{step}"),
                "[{six:?}] step {step}'s key"
            );
        }
    }

    // The operator retries the parked step: it runs again with the same key.
    let (id, plan) = parked.unwrap();
    place
        .runtime
        .resolve_step(id, Resolution::Retry)
        .await
        .unwrap();
    place
        .wait_until(&[id], Duration::from_secs(30), |r| r.status.is_terminal())
        .await;
    let run = place.run(id).await;
    assert_eq!(
        (run.status, run.output),
        (RunStatus::Completed, Some(plan.expected_output())),
        "[park] completed once retried"
    );
    let effects = place.effects().await;
    assert_eq!(
        counts(effects.get(&id)),
        [1, 1, 1, 1, 1, 2, 1, 1, 1, 1],
        "[park] step 6 ran again once retried, the rest once"
    );
    assert_eq!(effects[&id][&6].key, format!("{id}:6"), "[park] same key");
    second.kill().await.unwrap();
    println!(
        "steps crash [{}]: 5 runs killed in step 6 at {:.1}s, recovered by another worker at {:.1}s; \
         step 6 ran twice (same key) for pure, idempotent, retry, once for park (then twice once \
         retried) and fail; steps 1-5 once each",
        place.name,
        killed_at.as_secs_f64(),
        recovered_at.as_secs_f64()
    );
}

/// The kill loop's plan for run `r`: guarded steps with retry at 3, 6 and 10, without (fail
/// on ambiguity) at 7, which is the longest so that kills land in it.
fn loop_plan() -> StepsPlan {
    use StepKind::{Fail, Idempotent, Pure, Retry};
    let kinds = vec![
        Pure, Idempotent, Retry, Pure, Idempotent, Retry, Fail, Pure, Idempotent, Retry,
    ];
    let ms = kinds
        .iter()
        .map(|k| {
            if *k == Fail {
                250
            } else {
                fastrand::u64(30..120)
            }
        })
        .collect();
    StepsPlan {
        kinds,
        ms,
        tokens_out: 10,
    }
}

/// The budget of one run in four: 65 completion tokens, reached after step 7 (10 each).
const BUDGET_TOKENS: u64 = 65;

/// The kill loop on `place`: see the module docs.
async fn kill_loop(place: &Place, runs: usize) {
    let t0 = Instant::now();
    let env = [
        (CONCURRENCY_ENV, "4".to_owned()),
        (MAX_REQUEUES_ENV, "1000".to_owned()),
    ];
    let mut started = 0;
    let mut slots: Vec<Child> = (0..2)
        .map(|_| {
            started += 1;
            place.spawn(&format!("worker-{started}"), &env)
        })
        .collect();
    let mut plans = HashMap::new();
    for r in 0..runs {
        let plan = loop_plan();
        let budget = (r % 4 == 0).then(|| Budget::new().tokens_out(BUDGET_TOKENS));
        let id = place.submit(&plan, budget).await;
        plans.insert(id, (plan, budget));
    }
    let ids: Vec<Uuid> = plans.keys().copied().collect();

    // One of the two workers killed every 2 s and restarted, while runs remain, for 80 s at most.
    let mut kills = 0;
    let chaos_until = t0 + Duration::from_secs(80);
    let mut next_kill = Instant::now() + Duration::from_secs(2);
    let mut last_kill = Instant::now();
    loop {
        let mut open = 0;
        for &id in &ids {
            if !place.run(id).await.status.is_terminal() {
                open += 1;
            }
        }
        if open == 0 {
            break;
        }
        let now = Instant::now();
        if now >= chaos_until {
            break;
        }
        if now >= next_kill {
            let slot = fastrand::usize(..slots.len());
            slots[slot].kill().await.unwrap(); // SIGKILL
            kills += 1;
            started += 1;
            slots[slot] = place.spawn(&format!("worker-{started}"), &env);
            last_kill = Instant::now();
            next_kill += Duration::from_secs(2);
            eprintln!(
                "[{} +{:.1}s] kill {kills}: {open} run(s) open",
                place.name,
                t0.elapsed().as_secs_f64()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Every run terminal within lease + reap + slack of the last kill.
    place
        .wait_until(&ids, Duration::from_secs(30), |r| r.status.is_terminal())
        .await;
    let settled_after_last_kill = last_kill.elapsed();
    for mut child in slots {
        child.kill().await.unwrap();
    }

    let effects = place.effects().await;
    let mut failures = Vec::new();
    let mut statuses: BTreeMap<String, usize> = BTreeMap::new();
    let (mut replays, mut reruns, mut requeues, mut in_flight_unjournaled) = (0, 0, 0, 0);
    for &id in &ids {
        let (plan, budget) = &plans[&id];
        let run = place.run(id).await;
        let label = match (run.status, run.error_class) {
            (RunStatus::Failed, Some(class)) => format!("failed:{}", class.as_str()),
            (status, _) => status.as_str().to_owned(),
        };
        *statuses.entry(label.clone()).or_default() += 1;
        replays += run.steps_replayed;
        requeues += u64::from(run.requeue_count);
        let journal = place.store.steps(id).await.unwrap();
        let done: Vec<i64> = journal
            .iter()
            .filter(|s| s.status == StepStatus::Done)
            .map(|s| s.index)
            .collect();
        let d = i64::try_from(done.len()).unwrap();
        if done != (1..=d).collect::<Vec<_>>() {
            failures.push(format!("{id}: finished steps not a prefix: {done:?}"));
        }
        let rows = effects.get(&id);
        let n = counts(rows);
        let extra: i64 = n.iter().map(|c| (c - 1).max(0)).sum();
        reruns += extra;
        // Each extra execution of a step needs a reclaim (the claim takes queued runs only),
        // and a reclaimed execution runs again at most the one step that was in flight.
        if extra > i64::from(run.requeue_count) {
            failures.push(format!(
                "{id}: {extra} extra step execution(s) for {} reclaim(s): {n:?}",
                run.requeue_count
            ));
        }
        for (i, (count, kind)) in (1_i64..).zip(n.iter().zip(&plan.kinds)) {
            if *count > 1 && !kind.may_rerun() {
                failures.push(format!(
                    "{id}: step {i} ({}) ran {count} times: {n:?}",
                    kind.as_str()
                ));
            }
            if i <= d && *count < 1 {
                failures.push(format!("{id}: step {i} finished without its effect: {n:?}"));
            }
            if i > d + 1 && *count > 0 {
                failures.push(format!(
                    "{id}: step {i} ran although step {} never finished: {n:?}",
                    d + 1
                ));
            }
            if i == d + 1 && *count > 0 {
                in_flight_unjournaled += 1;
            }
        }
        for (step, row) in rows.into_iter().flatten() {
            if row.key != format!("{id}:{step}") {
                failures.push(format!("{id}: step {step} was given key {}", row.key));
            }
        }
        let tokens = run.usage.tokens_out;
        if tokens != 10 * u64::try_from(d).unwrap() {
            failures.push(format!(
                "{id}: usage {tokens} tokens for {d} finished steps of 10"
            ));
        }
        match (run.status, run.error_class) {
            (RunStatus::Completed, _) => {
                if run.output != Some(plan.expected_output()) || d != 10 {
                    failures.push(format!("{id}: completed with {:?}, {d} steps", run.output));
                }
                if budget.is_some() {
                    failures.push(format!("{id}: completed past its budget ({tokens} tokens)"));
                }
            }
            (RunStatus::Failed, Some(FailureClass::BudgetExhausted)) => {
                if budget.is_none() || tokens > BUDGET_TOKENS + 10 || d != 7 {
                    failures.push(format!(
                        "{id}: budget exhausted at {tokens} tokens after {d} steps (budget {budget:?})"
                    ));
                }
            }
            (RunStatus::Failed, Some(FailureClass::AmbiguousEffect)) => {
                // Killed inside step 7 (guarded, fail on ambiguity) after its intent was
                // journaled: its effect ran at most once (not at all when the kill came between
                // the intent and the effect: that is what makes it ambiguous).
                let intent = journal
                    .iter()
                    .any(|s| s.index == 7 && s.status == StepStatus::Intent);
                if d != 6 || !intent || n[6] > 1 {
                    failures.push(format!(
                        "{id}: ambiguous failure after {d} steps, step 7 ran {} time(s)",
                        n[6]
                    ));
                }
            }
            _ => failures.push(format!(
                "{id}: ended {label} (reason {:?}, {} requeue(s)): {n:?}",
                run.termination_reason, run.requeue_count
            )),
        }
        if run.status == RunStatus::Failed && run.termination_reason.is_none() {
            failures.push(format!("{id}: failed without a termination reason"));
        }
        if let Some(b) = budget
            && tokens > b.tokens_out.unwrap_or(u64::MAX) + 10
        {
            failures.push(format!("{id}: {tokens} tokens, budget {b:?} + one step"));
        }
    }
    let statuses: Vec<String> = statuses.iter().map(|(s, n)| format!("{s} {n}")).collect();
    println!(
        "steps kill loop [{}]: {runs} runs of 10 steps, {kills} worker kills (SIGKILL every 2 s, \
         2 workers x 4 runs), all terminal {:.1}s after the last kill, {:.1}s in all; {requeues} \
         reclaims, {replays} steps replayed from the journal, {reruns} steps run again \
         (in flight at a kill), {in_flight_unjournaled} runs ended with an effect done and no \
         result; {}",
        place.name,
        settled_after_last_kill.as_secs_f64(),
        t0.elapsed().as_secs_f64(),
        statuses.join(", ")
    );
    assert!(kills >= 5, "[{}] only {kills} kill(s)", place.name);
    assert!(
        failures.is_empty(),
        "[{}] {} failure(s), the first 40:\n{}",
        place.name,
        failures.len(),
        failures[..failures.len().min(40)].join("\n")
    );
    assert!(
        requeues > 0 && replays > 0,
        "[{}] the kills interrupted no run",
        place.name
    );
}

const RUNS: usize = 200;

#[test]
#[ignore = "real worker processes killed: run with --include-ignored"]
fn steps_crash_sqlite() {
    let dir = Dir::new("steps_crash");
    block_on(async {
        let place = Place::sqlite(&dir.0).await;
        crash_in_step_six(&place).await;
    });
}

#[test]
#[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
fn steps_crash_postgres() {
    let cleanup = Cleanup::new();
    let dir = Dir::new("steps_crash");
    block_on(async {
        let place = Place::server("postgres", postgres_url(), &dir.0, &cleanup).await;
        crash_in_step_six(&place).await;
    });
}

#[test]
#[ignore = "needs mysql: set COURIER_TEST_MYSQL_URL"]
fn steps_crash_mariadb() {
    let cleanup = Cleanup::new();
    let dir = Dir::new("steps_crash");
    block_on(async {
        let place = Place::server("mariadb", mysql_url(), &dir.0, &cleanup).await;
        crash_in_step_six(&place).await;
    });
}

#[test]
#[ignore = "real worker processes killed for a minute: run with --include-ignored"]
fn steps_kill_loop_sqlite() {
    let dir = Dir::new("steps_loop");
    block_on(async {
        let place = Place::sqlite(&dir.0).await;
        kill_loop(&place, RUNS).await;
    });
}

#[test]
#[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
fn steps_kill_loop_postgres() {
    let cleanup = Cleanup::new();
    let dir = Dir::new("steps_loop");
    block_on(async {
        let place = Place::server("postgres", postgres_url(), &dir.0, &cleanup).await;
        kill_loop(&place, RUNS).await;
    });
}

#[test]
#[ignore = "needs mysql: set COURIER_TEST_MYSQL_URL"]
fn steps_kill_loop_mariadb() {
    let cleanup = Cleanup::new();
    let dir = Dir::new("steps_loop");
    block_on(async {
        let place = Place::server("mariadb", mysql_url(), &dir.0, &cleanup).await;
        kill_loop(&place, RUNS).await;
    });
}
