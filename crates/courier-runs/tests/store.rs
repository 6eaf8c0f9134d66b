//! Store-level rules, against the in-memory store, SQLite, PostgreSQL and MariaDB.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use courier_runs::{
    Enqueued, FailureClass, ManualRequeue, NewRun, ReapOptions, RunError, RunStatus, RunStore,
    Settlement, StoreError, TerminationReason, UniqueKey, new_worker_identity,
};
use uuid::Uuid;

use support::{Fixture, dispatched, queued_runtime, refusing_runtime};

const LEASE: Duration = Duration::from_secs(900);

async fn claim_exactly_once(fx: &Fixture) {
    let run = fx.queued("scripted").await;
    let (a, b) = (new_worker_identity(), new_worker_identity());
    let (ra, rb) = tokio::join!(
        fx.store.claim(run.id, &a, LEASE),
        fx.store.claim(run.id, &b, LEASE)
    );
    assert!(
        ra.unwrap().is_some() ^ rb.unwrap().is_some(),
        "exactly one claim wins"
    );
    let row = fx.run(run.id).await;
    assert_eq!(row.status, RunStatus::Running);
    let winner = if row.claimed_by.as_deref() == Some(a.as_str()) {
        a
    } else {
        b
    };
    assert!(
        fx.store
            .claim(run.id, &winner, LEASE)
            .await
            .unwrap()
            .is_none(),
        "a running run cannot be claimed again"
    );
    assert!(row.started_at.is_some());
}

async fn claim_sets_a_lease_from_the_store_clock(fx: &Fixture) {
    let run = fx.queued("scripted").await;
    let me = new_worker_identity();
    let before = fx.store.now_ms().await.unwrap();
    assert!(fx.store.claim(run.id, &me, LEASE).await.unwrap().is_some());
    let after = fx.store.now_ms().await.unwrap();
    let row = fx.run(run.id).await;
    assert_eq!(row.claimed_by.as_deref(), Some(me.as_str()));
    assert!(
        row.lease_expires >= before + 900_000 && row.lease_expires <= after + 900_000,
        "{row:?}"
    );
}

/// The claim and the inserts return the row as stored (read in the same statement where the
/// database has RETURNING), so the runtime never reads a run it just claimed or inserted.
async fn claim_and_inserts_return_the_row_as_stored(fx: &Fixture) {
    let queued = fx.queued("scripted").await;
    assert_eq!(queued, fx.run(queued.id).await);
    assert_eq!(queued.status, RunStatus::Queued);
    assert_eq!(queued.input, serde_json::json!({"n": 1}));
    let interactive = fx
        .store
        .insert_interactive(&NewRun {
            id: Uuid::new_v4(),
            agent: "scripted".into(),
            input: serde_json::json!({"x": [1, 2]}),
            budget: None,
            concurrency_key: None,
        })
        .await
        .unwrap();
    assert_eq!(interactive, fx.run(interactive.id).await);
    assert_eq!(interactive.status, RunStatus::Running);
    let me = new_worker_identity();
    let claimed = fx.store.claim(queued.id, &me, LEASE).await.unwrap();
    let claimed = claimed.expect("the queued run is claimed");
    // As stored, plus what only the claim says: whether the run has journaled steps (read in
    // the claim's own statement; on MySQL in the read of the row it claimed).
    assert_eq!(claimed.journaled, Some(false));
    assert_eq!(
        courier_runs::Run {
            journaled: None,
            ..claimed.clone()
        },
        fx.run(queued.id).await
    );
    assert_eq!(claimed.status, RunStatus::Running);
    assert_eq!(claimed.claimed_by.as_deref(), Some(me.as_str()));
    assert!(claimed.lease_expires > 0 && claimed.started_at.is_some());
    assert_eq!(fx.store.claim(queued.id, &me, LEASE).await.unwrap(), None);
    // A run claimed again after a step was journaled says so: its journal is read.
    let step = courier_runs::StepWrite {
        mode: courier_runs::JournalMode::Insert,
        index: 1,
        name: "one".into(),
        effect: "pure",
        status: courier_runs::StepStatus::Done,
        output: Some(serde_json::json!(1)),
        error: None,
        error_class: None,
        usage: courier_runs::Usage::default(),
        duration_ms: 0,
        replayed: 0,
    };
    assert!(
        fx.store
            .journal(queued.id, Some(&me), LEASE, &step)
            .await
            .unwrap()
    );
    assert!(
        fx.store
            .requeue_owned(queued.id, &me, Duration::ZERO)
            .await
            .unwrap()
    );
    let again = fx.store.claim(queued.id, &me, LEASE).await.unwrap();
    assert_eq!(again.expect("claimed again").journaled, Some(true));
    assert_eq!(
        fx.store.claim(Uuid::new_v4(), &me, LEASE).await.unwrap(),
        None
    );
}

async fn renew_needs_the_owner_and_same_millisecond_renewal_still_holds(fx: &Fixture) {
    let run = fx.queued("scripted").await;
    let me = new_worker_identity();
    assert!(fx.store.claim(run.id, &me, LEASE).await.unwrap().is_some());
    // Two renewals in a row (often in the same millisecond): both match (rows matched, not changed).
    assert!(fx.store.renew(run.id, &me, LEASE).await.unwrap());
    assert!(fx.store.renew(run.id, &me, LEASE).await.unwrap());
    assert!(
        !fx.store
            .renew(run.id, "worker:other:1:0", LEASE)
            .await
            .unwrap()
    );
    let now = fx.store.now_ms().await.unwrap();
    assert!(
        fx.run(run.id).await.lease_expires > now,
        "the renewed lease lies in the future"
    );
}

async fn owner_requeue_clears_claim_and_keeps_input(fx: &Fixture) {
    let run = fx.queued("scripted").await;
    let me = new_worker_identity();
    assert!(fx.store.claim(run.id, &me, LEASE).await.unwrap().is_some());
    assert!(
        !fx.store
            .requeue_owned(run.id, "worker:other:1:0", Duration::ZERO)
            .await
            .unwrap(),
        "only the owner requeues"
    );
    assert!(
        fx.store
            .requeue_owned(run.id, &me, Duration::ZERO)
            .await
            .unwrap()
    );
    let row = fx.run(run.id).await;
    assert_eq!(
        (
            row.status,
            row.requeue_count,
            row.claimed_by.clone(),
            row.lease_expires
        ),
        (RunStatus::Queued, 1, None, 0)
    );
    assert_eq!(row.input, run.input);
    assert!(
        !fx.store
            .requeue_owned(run.id, &me, Duration::ZERO)
            .await
            .unwrap(),
        "a queued run is not requeued twice"
    );
}

async fn stale_select_sees_only_expired_worker_leases(fx: &Fixture) {
    let me = new_worker_identity();
    let fresh = fx.queued("scripted").await;
    let stale = fx.queued("scripted").await;
    let older = fx.queued("scripted").await;
    let queued = fx.queued("scripted").await;
    for id in [fresh.id, stale.id, older.id] {
        assert!(fx.store.claim(id, &me, LEASE).await.unwrap().is_some());
    }
    fx.set_lease(stale.id, 2).await;
    fx.set_lease(older.id, 1).await;
    let interactive = courier_runs::NewRun {
        id: uuid::Uuid::new_v4(),
        agent: "scripted".into(),
        input: serde_json::json!({}),
        budget: None,
        concurrency_key: None,
    };
    let interactive = fx.store.insert_interactive(&interactive).await.unwrap();
    assert_eq!(
        interactive.lease_expires, 0,
        "an interactive run holds no lease"
    );
    let found: Vec<_> = fx
        .store
        .select_stale(50)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(
        found,
        [older.id, stale.id],
        "expired leases only, oldest first"
    );
    assert_eq!(fx.store.select_stale(1).await.unwrap().len(), 1, "limit");
    assert!(
        !fx.store.requeue_stale(fresh.id).await.unwrap(),
        "a fresh lease is never touched"
    );
    assert!(
        !fx.store.requeue_stale(interactive.id).await.unwrap(),
        "an interactive run is never touched"
    );
    assert!(!fx.store.requeue_stale(queued.id).await.unwrap());
    assert!(
        !fx.store
            .dead_letter_stale(fresh.id, TerminationReason::RetriesExhausted)
            .await
            .unwrap()
    );
}

async fn heartbeat_between_select_and_update_wins(fx: &Fixture) {
    let me = new_worker_identity();
    let run = fx.queued("scripted").await;
    assert!(fx.store.claim(run.id, &me, LEASE).await.unwrap().is_some());
    fx.set_lease(run.id, 1).await;
    assert_eq!(fx.store.select_stale(50).await.unwrap().len(), 1);
    assert!(
        fx.store.renew(run.id, &me, LEASE).await.unwrap(),
        "the heartbeat lands after the select"
    );
    assert!(
        !fx.store.requeue_stale(run.id).await.unwrap(),
        "staleness is re-checked inside the update"
    );
    assert!(
        !fx.store
            .dead_letter_stale(run.id, TerminationReason::RetriesExhausted)
            .await
            .unwrap()
    );
    assert_eq!(fx.run(run.id).await.status, RunStatus::Running);
}

async fn stale_requeue_and_dead_letter(fx: &Fixture) {
    let me = new_worker_identity();
    let a = fx.queued("scripted").await;
    let b = fx.queued("scripted").await;
    for id in [a.id, b.id] {
        assert!(fx.store.claim(id, &me, LEASE).await.unwrap().is_some());
        fx.set_lease(id, 1).await;
    }
    assert!(fx.store.requeue_stale(a.id).await.unwrap());
    let row = fx.run(a.id).await;
    assert_eq!(
        (
            row.status,
            row.requeue_count,
            row.claimed_by,
            row.lease_expires
        ),
        (RunStatus::Queued, 1, None, 0)
    );
    assert!(
        !fx.store.requeue_stale(a.id).await.unwrap(),
        "a second reaper is refused"
    );
    assert!(
        fx.store
            .dead_letter_stale(b.id, TerminationReason::RetriesExhausted)
            .await
            .unwrap()
    );
    let row = fx.run(b.id).await;
    assert_eq!(
        (row.status, row.termination_reason),
        (RunStatus::Failed, Some(TerminationReason::RetriesExhausted))
    );
    assert!(row.finished_at.is_some());
}

async fn settle_is_owner_guarded_and_first_outcome_stands(fx: &Fixture) {
    let me = new_worker_identity();
    let run = fx.queued("scripted").await;
    assert!(fx.store.claim(run.id, &me, LEASE).await.unwrap().is_some());
    let failed = Settlement::failed(TerminationReason::NotRetryable, Some(FailureClass::Auth));
    assert!(
        !fx.store
            .settle(run.id, Some("worker:other:1:0"), &failed)
            .await
            .unwrap(),
        "not the owner"
    );
    assert!(
        !fx.store.settle(run.id, None, &failed).await.unwrap(),
        "the interactive guard needs no claim"
    );
    let done = Settlement {
        status: RunStatus::Completed,
        reason: Some(TerminationReason::Completed),
        class: None,
        output: Some(serde_json::json!({"answer": 42, "text": "ünïcode"})),
    };
    assert!(fx.store.settle(run.id, Some(&me), &done).await.unwrap());
    assert!(
        !fx.store.settle(run.id, Some(&me), &failed).await.unwrap(),
        "a terminal run is not settled again"
    );
    assert!(!fx.store.cancel(run.id).await.unwrap(), "nor cancelled");
    let row = fx.run(run.id).await;
    assert_eq!(row.status, RunStatus::Completed);
    assert_eq!(row.termination_reason, Some(TerminationReason::Completed));
    assert_eq!(row.error_class, None);
    assert_eq!(row.output, done.output);
    assert_eq!(row.lease_expires, 0);
    assert!(row.finished_at.is_some());
}

async fn cancelled_queued_run_cannot_be_claimed(fx: &Fixture) {
    let run = fx.queued("scripted").await;
    assert!(fx.store.cancel(run.id).await.unwrap());
    assert!(
        fx.store
            .claim(run.id, &new_worker_identity(), LEASE)
            .await
            .unwrap()
            .is_none()
    );
    let row = fx.run(run.id).await;
    assert_eq!(
        (row.status, row.termination_reason),
        (RunStatus::Cancelled, Some(TerminationReason::Cancelled))
    );
    assert!(
        !fx.store
            .fail_queued(run.id, TerminationReason::DispatchFailed)
            .await
            .unwrap()
    );
}

async fn fail_queued_matches_only_the_queued_row(fx: &Fixture) {
    let me = new_worker_identity();
    let run = fx.queued("scripted").await;
    assert!(fx.store.claim(run.id, &me, LEASE).await.unwrap().is_some());
    assert!(
        !fx.store
            .fail_queued(run.id, TerminationReason::DispatchFailed)
            .await
            .unwrap(),
        "running: not matched"
    );
    assert!(
        fx.store
            .requeue_owned(run.id, &me, Duration::ZERO)
            .await
            .unwrap()
    );
    assert!(
        fx.store
            .fail_queued(run.id, TerminationReason::DispatchFailed)
            .await
            .unwrap()
    );
    let row = fx.run(run.id).await;
    assert_eq!(
        (row.status, row.termination_reason),
        (RunStatus::Failed, Some(TerminationReason::DispatchFailed))
    );
}

async fn pending_effect_is_owner_guarded(fx: &Fixture) {
    let me = new_worker_identity();
    let run = fx.queued("scripted").await;
    assert!(
        !fx.store
            .set_pending_effect(run.id, Some(&me), Some("charge"))
            .await
            .unwrap(),
        "not running"
    );
    assert!(fx.store.claim(run.id, &me, LEASE).await.unwrap().is_some());
    assert!(
        !fx.store
            .set_pending_effect(run.id, Some("worker:other:1:0"), Some("charge"))
            .await
            .unwrap()
    );
    assert!(
        fx.store
            .set_pending_effect(run.id, Some(&me), Some("charge"))
            .await
            .unwrap()
    );
    assert_eq!(
        fx.run(run.id).await.pending_effect.as_deref(),
        Some("charge")
    );
    assert!(
        fx.store
            .set_pending_effect(run.id, Some(&me), None)
            .await
            .unwrap()
    );
    assert_eq!(fx.run(run.id).await.pending_effect, None);
}

async fn events_continue_at_max_seq_and_never_duplicate(fx: &Fixture) {
    let run = fx.queued("scripted").await;
    for i in 0..3 {
        let seq = fx
            .store
            .append_event(run.id, "step", &serde_json::json!({"i": i}))
            .await
            .unwrap();
        assert_eq!(seq, i + 1);
    }
    let other = fx.queued("scripted").await;
    assert_eq!(
        fx.store
            .append_event(other.id, "step", &serde_json::json!(null))
            .await
            .unwrap(),
        1,
        "per run"
    );
    // Concurrent appends: every one gets its own sequence or fails on the UNIQUE index; never a duplicate.
    let store = fx.store.clone();
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .append_event(run.id, "step", &serde_json::json!({}))
                    .await
            })
        })
        .collect();
    for t in tasks {
        match t.await.unwrap() {
            Ok(_) | Err(StoreError::DuplicateSequence { .. }) => {}
            Err(e) => panic!("unexpected {e}: {:?}", std::error::Error::source(&e)),
        }
    }
    let events = fx.store.events(run.id).await.unwrap();
    let seqs: Vec<i64> = events.iter().map(|e| e.seq).collect();
    let expected: Vec<i64> = (1..=i64::try_from(seqs.len()).unwrap()).collect();
    assert_eq!(seqs, expected, "gapless, ordered, unique");
    assert_eq!(events[0].payload, serde_json::json!({"i": 0}));
    if let Some(sql) = fx.sql() {
        let dup = format!(
            "INSERT INTO {} (run_id, seq, kind, payload, created_at) VALUES ('{}', 1, 'x', 'null', 0)",
            sql.events_table(),
            run.id
        );
        assert!(
            sql.execute(&dup).await.is_err(),
            "UNIQUE (run_id, seq) holds"
        );
    }
}

async fn reaper_follows_design_order(fx: &Fixture) {
    let me = new_worker_identity();
    let (runtime, _bus, queue) = queued_runtime(fx.store.clone(), &me, Default::default());
    let under = fx.queued("scripted").await;
    let at_budget = fx.queued("scripted").await;
    let fenced = fx.queued("scripted").await;
    let fresh = fx.queued("scripted").await;
    for id in [under.id, at_budget.id, fenced.id, fresh.id] {
        assert!(fx.store.claim(id, &me, LEASE).await.unwrap().is_some());
    }
    assert!(
        fx.store
            .set_pending_effect(fenced.id, Some(&me), Some("charge"))
            .await
            .unwrap()
    );
    fx.set_requeue_count(at_budget.id, 3).await;
    fx.set_requeue_count(under.id, 2).await;
    for id in [under.id, at_budget.id, fenced.id] {
        fx.set_lease(id, 1).await;
    }
    let reaper = runtime.reaper();
    let dry = reaper
        .reap(ReapOptions {
            dry_run: true,
            ..ReapOptions::default()
        })
        .await
        .unwrap();
    assert_eq!(
        (dry.selected, dry.requeued, dry.dead_lettered, dry.skipped),
        (3, 1, 2, 0)
    );
    assert_eq!(
        fx.run(under.id).await.status,
        RunStatus::Running,
        "a dry run changes nothing"
    );
    assert!(queue.sent().is_empty());

    let report = reaper.reap(ReapOptions::default()).await.unwrap();
    assert_eq!(
        report.to_string(),
        "Reaped 3 stale run(s): 1 requeued, 2 dead-lettered, 0 skipped."
    );
    let row = fx.run(under.id).await;
    assert_eq!((row.status, row.requeue_count), (RunStatus::Queued, 3));
    assert_eq!(
        dispatched(&queue),
        [(under.id, None)],
        "exactly one message, with no delay"
    );
    let row = fx.run(at_budget.id).await;
    assert_eq!(
        (row.status, row.termination_reason),
        (RunStatus::Failed, Some(TerminationReason::RetriesExhausted))
    );
    let row = fx.run(fenced.id).await;
    assert_eq!(
        (row.status, row.termination_reason),
        (RunStatus::Failed, Some(TerminationReason::NotRetryable))
    );
    assert_eq!(
        fx.run(fresh.id).await.status,
        RunStatus::Running,
        "a fresh lease is never touched"
    );
    let again = reaper.reap(ReapOptions::default()).await.unwrap();
    assert_eq!(again.selected, 0);
}

async fn reaper_dispatch_failure_settles_the_run(fx: &Fixture) {
    let me = new_worker_identity();
    let (runtime, _bus) = refusing_runtime(fx.store.clone(), &me);
    let run = fx.queued("scripted").await;
    assert!(fx.store.claim(run.id, &me, LEASE).await.unwrap().is_some());
    fx.set_lease(run.id, 1).await;
    let report = runtime.reaper().reap(ReapOptions::default()).await.unwrap();
    assert_eq!((report.requeued, report.dead_lettered), (0, 1));
    let row = fx.run(run.id).await;
    assert_eq!(
        (row.status, row.termination_reason),
        (RunStatus::Failed, Some(TerminationReason::DispatchFailed))
    );
    assert_eq!(
        fx.store
            .list(Some(RunStatus::Queued), 10)
            .await
            .unwrap()
            .len(),
        0,
        "no orphan queued row"
    );
}

async fn concurrent_reapers_never_double_requeue(fx: &Fixture) {
    let me = new_worker_identity();
    let (runtime, _bus, queue) = queued_runtime(fx.store.clone(), &me, Default::default());
    let mut ids = Vec::new();
    for _ in 0..10 {
        let run = fx.queued("scripted").await;
        assert!(fx.store.claim(run.id, &me, LEASE).await.unwrap().is_some());
        fx.set_lease(run.id, 1).await;
        ids.push(run.id);
    }
    let (a, b) = (runtime.reaper(), runtime.reaper());
    let (ra, rb) = tokio::join!(
        a.reap(ReapOptions::default()),
        b.reap(ReapOptions::default())
    );
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    assert_eq!(ra.requeued + rb.requeued, 10, "{ra} / {rb}");
    assert_eq!(ra.skipped + rb.skipped, ra.selected + rb.selected - 10);
    let mut sent: Vec<_> = dispatched(&queue).into_iter().map(|(id, _)| id).collect();
    sent.sort();
    ids.sort();
    assert_eq!(sent, ids, "one message per run");
    for id in ids {
        assert_eq!(fx.run(id).await.requeue_count, 1);
    }
}

async fn list_is_newest_first_and_filters(fx: &Fixture) {
    let a = fx.queued("scripted").await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let b = fx.queued("scripted").await;
    assert!(fx.store.cancel(a.id).await.unwrap());
    let all: Vec<_> = fx
        .store
        .list(None, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(all, [b.id, a.id]);
    let cancelled: Vec<_> = fx
        .store
        .list(Some(RunStatus::Cancelled), 10)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(cancelled, [a.id]);
}

async fn stale_select_uses_the_status_lease_index(fx: &Fixture) {
    let Some(sql) = fx.sql() else { return };
    let plan = sql.explain_stale(50).await.unwrap().join("\n");
    let index = format!("{}_status_lease_idx", sql.runs_table());
    if sql.dialect() == courier_runs::Dialect::Sqlite {
        assert!(
            plan.contains(&index),
            "the stale select must use the index:\n{plan}"
        );
    } else {
        println!("plan on a near-empty table:\n{plan}");
    }
}

async fn a_queued_run_is_due_when_queued_or_after_its_backoff(fx: &Fixture) {
    let me = new_worker_identity();
    let fresh = fx.queued("scripted").await;
    assert_eq!(fresh.due_at, fresh.created_at, "due at once when enqueued");
    let later = fx.queued("scripted").await;
    assert!(
        fx.store
            .claim(later.id, &me, LEASE)
            .await
            .unwrap()
            .is_some()
    );
    let delay = Duration::from_secs(600);
    assert!(fx.store.requeue_owned(later.id, &me, delay).await.unwrap());
    let row = fx.run(later.id).await;
    assert_eq!(
        row.due_at - row.updated_at,
        600_000,
        "due after the backoff"
    );
    let stale = fx.queued("scripted").await;
    assert!(
        fx.store
            .claim(stale.id, &me, LEASE)
            .await
            .unwrap()
            .is_some()
    );
    fx.set_lease(stale.id, 1).await;
    assert!(fx.store.requeue_stale(stale.id).await.unwrap());
    let row = fx.run(stale.id).await;
    assert_eq!(row.due_at, row.updated_at, "a stale requeue is due at once");
    let after = Duration::from_secs(60);
    assert!(
        fx.store.select_overdue(after, 50).await.unwrap().is_empty(),
        "nothing is overdue yet"
    );
}

async fn overdue_queued_run_is_redispatched_once(fx: &Fixture) {
    let me = new_worker_identity();
    let (runtime, _bus, queue) = queued_runtime(fx.store.clone(), &me, Default::default());
    let lost = fx.queued("scripted").await;
    let backoff = fx.queued("scripted").await;
    let fresh = fx.queued("scripted").await;
    let running = fx.queued("scripted").await;
    assert!(
        fx.store
            .claim(backoff.id, &me, LEASE)
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        fx.store
            .requeue_owned(backoff.id, &me, Duration::from_secs(600))
            .await
            .unwrap()
    );
    assert!(
        fx.store
            .claim(running.id, &me, LEASE)
            .await
            .unwrap()
            .is_some()
    );
    // The lost message's run became due long ago; the one in backoff is due in the future even
    // though it was queued long ago; the running one's due_at is old but it is not queued.
    fx.set_due_at(lost.id, 1).await;
    fx.set_due_at(running.id, 1).await;
    let now = fx.store.now_ms().await.unwrap();
    fx.set_due_at(backoff.id, now + 1_000).await;

    let reaper = runtime.reaper();
    let dry = reaper
        .reap(ReapOptions {
            dry_run: true,
            ..ReapOptions::default()
        })
        .await
        .unwrap();
    assert_eq!((dry.selected, dry.redispatched), (0, 1));
    assert!(queue.sent().is_empty(), "a dry run dispatches nothing");

    let report = reaper.reap(ReapOptions::default()).await.unwrap();
    assert_eq!(report.redispatched, 1);
    assert_eq!(
        report.to_string(),
        "Reaped 0 stale run(s): 0 requeued, 0 dead-lettered, 0 skipped, 1 re-dispatched."
    );
    assert_eq!(
        dispatched(&queue),
        [(lost.id, None)],
        "one message, no delay"
    );
    let row = fx.run(lost.id).await;
    assert_eq!(row.status, RunStatus::Queued);
    assert_eq!(row.requeue_count, 0, "a re-dispatch is not a requeue");
    assert!(row.due_at >= now, "due again from now");
    for id in [backoff.id, fresh.id] {
        assert_eq!(fx.run(id).await.status, RunStatus::Queued);
    }
    let again = reaper.reap(ReapOptions::default()).await.unwrap();
    assert_eq!(again.redispatched, 0, "the guard moved forward");
    assert_eq!(queue.sent().len(), 1);
}

async fn concurrent_reapers_redispatch_an_overdue_run_once(fx: &Fixture) {
    let me = new_worker_identity();
    let (runtime, _bus, queue) = queued_runtime(fx.store.clone(), &me, Default::default());
    let mut ids = Vec::new();
    for _ in 0..10 {
        let run = fx.queued("scripted").await;
        fx.set_due_at(run.id, 1).await;
        ids.push(run.id);
    }
    let (a, b) = (runtime.reaper(), runtime.reaper());
    let (ra, rb) = tokio::join!(
        a.reap(ReapOptions::default()),
        b.reap(ReapOptions::default())
    );
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    assert_eq!(ra.redispatched + rb.redispatched, 10, "{ra} / {rb}");
    let mut sent: Vec<_> = dispatched(&queue).into_iter().map(|(id, _)| id).collect();
    sent.sort();
    ids.sort();
    assert_eq!(sent, ids, "one message per run");
}

async fn operator_requeue_redispatches_queued_and_requeues_stale(fx: &Fixture) {
    let me = new_worker_identity();
    let (runtime, _bus, queue) = queued_runtime(fx.store.clone(), &me, Default::default());
    let reaper = runtime.reaper();
    let queued = fx.queued("scripted").await;
    assert_eq!(
        reaper.requeue(queued.id).await.unwrap(),
        ManualRequeue::Redispatched
    );
    assert_eq!(dispatched(&queue), [(queued.id, None)]);

    let running = fx.queued("scripted").await;
    assert!(
        fx.store
            .claim(running.id, &me, LEASE)
            .await
            .unwrap()
            .is_some()
    );
    let refused = reaper.requeue(running.id).await.unwrap_err();
    assert!(
        matches!(&refused, RunError::NotRequeued { reason, .. } if reason.contains("live lease")),
        "{refused}"
    );
    fx.set_lease(running.id, 1).await;
    assert_eq!(
        reaper.requeue(running.id).await.unwrap(),
        ManualRequeue::Requeued
    );
    let row = fx.run(running.id).await;
    assert_eq!((row.status, row.requeue_count), (RunStatus::Queued, 1));
    assert_eq!(dispatched(&queue).len(), 2);

    let cancelled = fx.queued("scripted").await;
    assert!(fx.store.cancel(cancelled.id).await.unwrap());
    let refused = reaper.requeue(cancelled.id).await.unwrap_err();
    assert!(
        matches!(&refused, RunError::NotRequeued { reason, .. } if reason.contains("cancelled")),
        "{refused}"
    );
    let missing = uuid::Uuid::new_v4();
    assert!(matches!(
        reaper.requeue(missing).await,
        Err(RunError::NotFound(id)) if id == missing
    ));
    assert_eq!(dispatched(&queue).len(), 2, "refusals dispatch nothing");
}

/// A stored input or payload that is not JSON is a corrupt row, never read as a JSON string.
/// (PostgreSQL's JSONB refuses to store it at all.)
async fn corrupt_stored_json_is_an_error_not_a_string(fx: &Fixture) {
    let Some(sql) = fx.sql() else {
        return;
    };
    let run = fx.queued("scripted").await;
    fx.store
        .append_event(run.id, "step", &serde_json::json!({"ok": true}))
        .await
        .unwrap();
    let corrupt_input = format!(
        "UPDATE {} SET input = 'not json' WHERE id = '{}'",
        sql.runs_table(),
        run.id
    );
    let corrupt_payload = format!(
        "UPDATE {} SET payload = '{{broken' WHERE run_id = '{}'",
        sql.events_table(),
        run.id
    );
    if sql.dialect() == courier_runs::Dialect::Postgres {
        assert!(
            sql.execute(&corrupt_input).await.is_err(),
            "JSONB refuses it"
        );
        assert!(
            sql.execute(&corrupt_payload).await.is_err(),
            "JSONB refuses it"
        );
        return;
    }
    sql.execute(&corrupt_input).await.unwrap();
    sql.execute(&corrupt_payload).await.unwrap();
    let found = fx.store.find(run.id).await;
    assert!(
        matches!(found, Err(StoreError::Corrupt(ref e)) if e.contains("input")),
        "{found:?}"
    );
    let listed = fx.store.list(None, 10).await;
    assert!(matches!(listed, Err(StoreError::Corrupt(_))), "{listed:?}");
    let events = fx.store.events(run.id).await;
    assert!(
        matches!(events, Err(StoreError::Corrupt(ref e)) if e.contains("payload")),
        "{events:?}"
    );
}

/// 100 concurrent enqueues of one unique key queue exactly one run and dispatch it once; the
/// 99 others learn the id of the run that holds the key.
async fn concurrent_unique_enqueues_create_exactly_one_run(fx: &Fixture) {
    let (runtime, _bus, queue) =
        queued_runtime(fx.store.clone(), "worker:u:1:0", Default::default());
    let key = format!("report-{}", Uuid::new_v4().simple());
    let unique = UniqueKey::new(&key, Duration::from_secs(3600)).unwrap();
    let enqueues = (0..100).map(|i| {
        let (runtime, unique) = (runtime.clone(), unique.clone());
        tokio::spawn(async move {
            runtime
                .enqueue_unique("scripted", serde_json::json!({ "i": i }), unique)
                .await
        })
    });
    let outcomes: Vec<Enqueued> = futures_util::future::join_all(enqueues)
        .await
        .into_iter()
        .map(|r| r.unwrap().unwrap())
        .collect();
    let queued: Vec<Uuid> = outcomes
        .iter()
        .filter(|o| !o.is_duplicate())
        .map(|o| o.id())
        .collect();
    assert_eq!(queued.len(), 1, "exactly one queued: {outcomes:?}");
    assert!(
        outcomes.iter().all(|o| o.id() == queued[0]),
        "every duplicate names the run holding the key"
    );
    let runs = fx.store.list(None, 1000).await.unwrap();
    assert_eq!(runs.len(), 1, "one row: {runs:?}");
    assert_eq!(runs[0].id, queued[0]);
    assert_eq!(runs[0].status, RunStatus::Queued);
    assert_eq!(dispatched(&queue), [(queued[0], None)], "dispatched once");
    // Runs without a key, and with other keys, are not affected.
    runtime
        .enqueue("scripted", serde_json::json!({}))
        .await
        .unwrap();
    let other = UniqueKey::new(format!("{key}-other"), Duration::from_secs(3600)).unwrap();
    let other = runtime
        .enqueue_unique("scripted", serde_json::json!({}), other)
        .await
        .unwrap();
    assert!(!other.is_duplicate());
}

/// Once the period has passed the key is free: the next enqueue queues a new run, which holds
/// the key in turn.
async fn an_expired_unique_period_allows_a_new_run(fx: &Fixture) {
    let (runtime, _bus, _queue) =
        queued_runtime(fx.store.clone(), "worker:u:1:0", Default::default());
    let key = format!("sync-{}", Uuid::new_v4().simple());
    let unique = UniqueKey::new(&key, Duration::from_secs(3600)).unwrap();
    let enqueue = || runtime.enqueue_unique("scripted", serde_json::json!({}), unique.clone());
    let first = enqueue().await.unwrap();
    assert!(matches!(first, Enqueued::Queued(_)), "{first:?}");
    assert_eq!(enqueue().await.unwrap(), Enqueued::Duplicate(first.id()));
    fx.expire_unique(&key).await;
    let second = enqueue().await.unwrap();
    assert!(
        matches!(second, Enqueued::Queued(id) if id != first.id()),
        "{second:?}"
    );
    assert_eq!(enqueue().await.unwrap(), Enqueued::Duplicate(second.id()));
    assert_eq!(fx.store.list(None, 10).await.unwrap().len(), 2);
}

/// A run whose dispatch failed is settled failed and gives its key back at once, so the caller
/// can enqueue again.
async fn a_unique_run_whose_dispatch_failed_frees_its_key(fx: &Fixture) {
    let (refusing, _bus) = refusing_runtime(fx.store.clone(), "worker:u:1:0");
    let key = format!("retry-{}", Uuid::new_v4().simple());
    let unique = UniqueKey::new(&key, Duration::from_secs(3600)).unwrap();
    let failed = refusing
        .enqueue_unique("scripted", serde_json::json!({}), unique.clone())
        .await;
    assert!(
        matches!(failed, Err(RunError::Dispatch { .. })),
        "{failed:?}"
    );
    let (runtime, _bus2, _queue) =
        queued_runtime(fx.store.clone(), "worker:u:1:0", Default::default());
    let again = runtime
        .enqueue_unique("scripted", serde_json::json!({}), unique)
        .await
        .unwrap();
    assert!(matches!(again, Enqueued::Queued(_)), "{again:?}");
}

/// A batched renewal renews every run the worker holds in one call and reports exactly the
/// ones it lost: one stolen by another worker after its lease expired, one cancelled, one that
/// does not exist; a batched probe reads each held run's status and owner.
async fn a_batched_renewal_reports_exactly_the_lost_runs(fx: &Fixture) {
    let me = new_worker_identity();
    let mut held = Vec::new();
    for _ in 0..5 {
        let run = fx.queued("scripted").await;
        assert!(fx.store.claim(run.id, &me, LEASE).await.unwrap().is_some());
        held.push(run.id);
    }
    // The second is stolen: its lease expired, the reaper requeued it, another worker claimed it.
    let (stolen, cancelled, gone) = (held[1], held[3], Uuid::new_v4());
    fx.set_lease(stolen, 1).await;
    assert!(fx.store.requeue_stale(stolen).await.unwrap());
    let thief = new_worker_identity();
    assert!(
        fx.store
            .claim(stolen, &thief, LEASE)
            .await
            .unwrap()
            .is_some()
    );
    assert!(fx.store.cancel(cancelled).await.unwrap());
    let before = fx.run(held[0]).await.lease_expires;
    let mut asked = held.clone();
    asked.push(gone);

    let lost = fx
        .store
        .renew_many(&asked, &me, LEASE + Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(lost, vec![stolen, cancelled, gone]);
    for id in [held[0], held[2], held[4]] {
        let run = fx.run(id).await;
        assert!(run.lease_expires > before, "{id} was not renewed");
        assert_eq!(run.claimed_by.as_deref(), Some(me.as_str()));
    }
    assert_eq!(
        fx.run(stolen).await.claimed_by.as_deref(),
        Some(thief.as_str()),
        "the thief keeps the stolen run"
    );

    let mut probed = fx.store.probe(&asked).await.unwrap();
    probed.sort_by_key(|p| asked.iter().position(|id| *id == p.id));
    let seen: Vec<(Uuid, RunStatus, Option<String>)> = probed
        .into_iter()
        .map(|p| (p.id, p.status, p.claimed_by))
        .collect();
    assert_eq!(seen.len(), 5, "the missing run is left out: {seen:?}");
    assert_eq!(seen[1], (stolen, RunStatus::Running, Some(thief.clone())));
    assert_eq!(seen[3].1, RunStatus::Cancelled);
    assert_eq!(seen[4], (held[4], RunStatus::Running, Some(me.clone())));
}

macro_rules! store_tests {
    ($fixture:path, $ignore:tt, [$($name:ident),* $(,)?]) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            #[ignore = $ignore]
            async fn $name() {
                let fx = $fixture().await;
                let test = tokio::time::timeout(Duration::from_secs(60), super::$name(&fx));
                // Drop the test's tables even when it fails, then fail.
                let result = futures_util::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(test)).await;
                fx.cleanup().await;
                match result {
                    Ok(done) => done.expect("test timed out"),
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            }
        )*
    };
    ($fixture:path, [$($name:ident),* $(,)?]) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let fx = $fixture().await;
                let test = tokio::time::timeout(Duration::from_secs(60), super::$name(&fx));
                // Drop the test's tables even when it fails, then fail.
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

macro_rules! all_store_tests {
    ($($args:tt)*) => {
        store_tests!($($args)* [
            corrupt_stored_json_is_an_error_not_a_string,
            claim_exactly_once,
            claim_sets_a_lease_from_the_store_clock,
            claim_and_inserts_return_the_row_as_stored,
            a_batched_renewal_reports_exactly_the_lost_runs,
            renew_needs_the_owner_and_same_millisecond_renewal_still_holds,
            owner_requeue_clears_claim_and_keeps_input,
            stale_select_sees_only_expired_worker_leases,
            heartbeat_between_select_and_update_wins,
            stale_requeue_and_dead_letter,
            settle_is_owner_guarded_and_first_outcome_stands,
            cancelled_queued_run_cannot_be_claimed,
            fail_queued_matches_only_the_queued_row,
            pending_effect_is_owner_guarded,
            events_continue_at_max_seq_and_never_duplicate,
            reaper_follows_design_order,
            reaper_dispatch_failure_settles_the_run,
            concurrent_reapers_never_double_requeue,
            list_is_newest_first_and_filters,
            stale_select_uses_the_status_lease_index,
            a_queued_run_is_due_when_queued_or_after_its_backoff,
            overdue_queued_run_is_redispatched_once,
            concurrent_reapers_redispatch_an_overdue_run_once,
            operator_requeue_redispatches_queued_and_requeues_stale,
            concurrent_unique_enqueues_create_exactly_one_run,
            an_expired_unique_period_allows_a_new_run,
            a_unique_run_whose_dispatch_failed_frees_its_key,
        ]);
    };
}

mod memory {
    use super::*;
    async fn fixture() -> Fixture {
        support::memory()
    }
    all_store_tests!(fixture,);
}

#[cfg(feature = "sqlite")]
mod sqlite {
    use super::*;
    all_store_tests!(support::sqlite,);
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;
    all_store_tests!(
        support::postgres,
        "needs postgres: set COURIER_TEST_POSTGRES_URL",
    );
}

#[cfg(feature = "mysql")]
mod mysql {
    use super::*;
    all_store_tests!(support::mysql, "needs mysql: set COURIER_TEST_MYSQL_URL",);
}

#[allow(dead_code)]
fn _unused(_: Arc<dyn RunStore>) {}

/// A database server that is down is named at once by the driver's error (connection refused),
/// not after the pool's acquire timeout, and the password stays out of the error.
#[cfg(all(feature = "postgres", feature = "mysql"))]
#[tokio::test]
async fn a_run_store_on_a_server_that_is_down_fails_at_once() {
    use std::error::Error as _;
    // A port nothing listens on: bound, then released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    for scheme in ["postgres", "mysql"] {
        let dsn = format!("{scheme}://app:hunter2@127.0.0.1:{port}/test");
        let connecting =
            courier_runs::SqlRunStore::connect(&dsn, courier_runs::SqlRunStoreOptions::default());
        let Err(err) = tokio::time::timeout(Duration::from_secs(8), connecting)
            .await
            .unwrap_or_else(|_| panic!("{scheme}: still waiting for the pool"))
        else {
            panic!("{scheme}: connected to a closed port");
        };
        let shown = format!(
            "{err}: {} {err:?}",
            err.source().map(ToString::to_string).unwrap_or_default()
        );
        assert!(
            matches!(err, StoreError::Database { .. }),
            "{scheme}: {shown}"
        );
        assert!(shown.contains("refused"), "{scheme}: {shown}");
        assert!(
            err.is_transient(),
            "{scheme}: a closed port is worth retrying"
        );
        assert!(!err.is_config(), "{scheme}: {shown}");
        assert!(!shown.contains("hunter2"), "{scheme}: {shown}");
    }
}

/// A DSN the driver cannot parse is a configuration error, never worth retrying.
#[cfg(feature = "postgres")]
#[tokio::test]
async fn a_run_store_dsn_that_does_not_parse_is_a_config_error() {
    let dsn = "postgres://app:ab/cd+ef==@127.0.0.1:5432/test";
    let connecting =
        courier_runs::SqlRunStore::connect(dsn, courier_runs::SqlRunStoreOptions::default());
    let Err(err) = tokio::time::timeout(Duration::from_secs(8), connecting)
        .await
        .expect("a bad DSN fails at once")
    else {
        panic!("connected with a DSN that does not parse");
    };
    assert!(err.is_config(), "{err:?}");
    assert!(!err.is_transient(), "{err:?}");
}
