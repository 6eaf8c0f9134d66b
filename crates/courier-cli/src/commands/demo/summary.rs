//! What the demo reports: a progress line while it runs, and the summary read back from the store.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use courier_runs::{RunStatus, RunStore};
use uuid::Uuid;

use crate::error::{CliError, CliResult, chain};

/// The worker process the demo killed, and what became of its run.
#[derive(Debug, Clone, serde::Serialize)]
pub(super) struct KilledWorker {
    /// Its pid (a child of the demo process).
    pub(super) pid: u32,
    /// The signal it died of, from its exit status (9: SIGKILL).
    pub(super) signal: Option<i32>,
    /// Its worker identity, as `claimed_by` stored it.
    pub(super) worker_id: String,
    /// The run it was executing.
    pub(super) run_id: Uuid,
    /// Steps the run had journaled when the worker was killed.
    pub(super) steps_before_kill: usize,
    /// Steps the worker that resumed it replayed from the journal (the store's count).
    pub(super) steps_replayed: u64,
    /// Steps journaled after the crash: those that ran again or for the first time.
    pub(super) steps_ran_after: u64,
    /// Seconds from the start of the demo.
    pub(super) killed_at_s: f64,
    /// When the demo saw the run requeued by a reaper.
    pub(super) reaped_at_s: Option<f64>,
    /// The worker process whose reaper reported requeueing it.
    pub(super) reaped_by_pid: Option<u32>,
    /// When the demo saw the run finished.
    pub(super) finished_at_s: Option<f64>,
    /// The run's final status.
    pub(super) finished_status: Option<String>,
    /// The worker process that finished it (from `claimed_by`).
    pub(super) finished_by_pid: Option<u32>,
}

/// What the summary reports, read back from the store (the crash as the demo saw it).
#[derive(Debug, Default, serde::Serialize)]
pub(super) struct Summary {
    runs: usize,
    workers: u16,
    completed: usize,
    completed_first_try: usize,
    dead_lettered: usize,
    dead_lettered_by_reason: BTreeMap<String, usize>,
    other: BTreeMap<String, usize>,
    requeued: u64,
    /// Runs requeued or dead-lettered by the workers' reapers (their own reports).
    pub(super) reaped: usize,
    workers_killed: usize,
    duration_s: f64,
    runs_per_s: f64,
    /// The demo process.
    pub(super) demo_pid: u32,
    /// The worker processes, in start order.
    pub(super) worker_pids: Vec<u32>,
    /// The killed worker.
    pub(super) killed_worker: Option<KilledWorker>,
}

/// The runs' statuses, re-read only while they are not terminal.
pub(super) struct Tally {
    pending: Vec<Uuid>,
    finished: BTreeMap<&'static str, (RunStatus, usize)>,
}

impl Tally {
    pub(super) fn new(ids: &[Uuid]) -> Self {
        Self {
            pending: ids.to_vec(),
            finished: BTreeMap::new(),
        }
    }

    /// Reads the pending runs again; returns the counts per status and how many are terminal.
    pub(super) async fn refresh(
        &mut self,
        store: &Arc<dyn RunStore>,
    ) -> CliResult<(Vec<(RunStatus, usize)>, usize)> {
        let mut counts = self.finished.clone();
        let mut still = Vec::with_capacity(self.pending.len());
        for id in &self.pending {
            let Some(run) = store
                .find(*id)
                .await
                .map_err(|e| CliError::runtime(chain(&e)))?
            else {
                return Err(CliError::runtime(format!("run {id} vanished")));
            };
            if run.status.is_terminal() {
                self.finished
                    .entry(run.status.as_str())
                    .or_insert((run.status, 0))
                    .1 += 1;
            } else {
                still.push(*id);
            }
            counts
                .entry(run.status.as_str())
                .or_insert((run.status, 0))
                .1 += 1;
        }
        self.pending = still;
        let done = self.finished.values().map(|(_, n)| n).sum();
        Ok((counts.into_values().collect(), done))
    }
}

pub(super) fn progress_line(
    counts: &[(RunStatus, usize)],
    total: usize,
    elapsed: Duration,
) -> String {
    let get = |s: RunStatus| counts.iter().find(|(k, _)| *k == s).map_or(0, |(_, n)| *n);
    format!(
        "{:>5.1}s  completed {}  failed {}  running {}  queued {}  of {total}",
        elapsed.as_secs_f64(),
        get(RunStatus::Completed),
        get(RunStatus::Failed),
        get(RunStatus::Running),
        get(RunStatus::Queued),
    )
}

/// The summary of runs `ids`, read back from the store.
pub(super) async fn summarise(
    store: &Arc<dyn RunStore>,
    ids: &[Uuid],
    workers: u16,
    elapsed: Duration,
) -> CliResult<Summary> {
    let mut s = Summary {
        runs: ids.len(),
        workers,
        ..Summary::default()
    };
    for id in ids {
        let run = store
            .find(*id)
            .await
            .map_err(|e| CliError::runtime(chain(&e)))?
            .ok_or_else(|| CliError::runtime(format!("run {id} vanished")))?;
        s.requeued += u64::from(run.requeue_count);
        match run.status {
            RunStatus::Completed => {
                s.completed += 1;
                if run.requeue_count == 0 {
                    s.completed_first_try += 1;
                }
            }
            RunStatus::Failed => {
                s.dead_lettered += 1;
                let reason = run.termination_reason.map_or("unknown", |r| r.as_str());
                let key = match (run.pending_effect.is_some(), run.error_class) {
                    (true, _) => format!("{reason} (effect in flight)"),
                    (false, Some(c)) => format!("{reason} ({c})"),
                    (false, None) => reason.to_owned(),
                };
                *s.dead_lettered_by_reason.entry(key).or_default() += 1;
            }
            other => *s.other.entry(other.as_str().to_owned()).or_default() += 1,
        }
    }
    s.duration_s = elapsed.as_secs_f64();
    s.runs_per_s = ids.len() as f64 / s.duration_s.max(1e-9);
    Ok(s)
}

impl Summary {
    /// Reads back from the store how the killed worker's run resumed: the steps replayed and
    /// those journaled after the crash.
    pub(super) async fn resumed(store: &Arc<dyn RunStore>, worker: &mut KilledWorker) -> CliResult {
        let fail = |e: courier_runs::StoreError| CliError::runtime(chain(&e));
        let run = store.find(worker.run_id).await.map_err(fail)?;
        let journaled = store.steps(worker.run_id).await.map_err(fail)?.len() as u64;
        worker.steps_replayed = run.map_or(0, |r| r.steps_replayed);
        worker.steps_ran_after = journaled.saturating_sub(worker.steps_replayed);
        Ok(())
    }

    /// Records the killed worker.
    pub(super) fn killed(&mut self, worker: KilledWorker) {
        self.workers_killed = 1;
        self.killed_worker = Some(worker);
    }
}

fn pid(p: Option<u32>) -> String {
    p.map_or_else(|| "?".to_owned(), |p| p.to_string())
}

pub(super) fn render(s: &Summary, db: &str) -> String {
    let mut out = String::new();
    let mut line =
        |label: &str, value: String| out.push_str(&format!("  {label:<48}{value:>10}\n"));
    line("runs submitted", s.runs.to_string());
    line("completed", s.completed.to_string());
    line("  on the first try", s.completed_first_try.to_string());
    line(
        "  after requeues",
        (s.completed - s.completed_first_try).to_string(),
    );
    line("dead-lettered (failed)", s.dead_lettered.to_string());
    for (reason, n) in &s.dead_lettered_by_reason {
        line(&format!("  {reason}"), n.to_string());
    }
    for (status, n) in &s.other {
        line(status, n.to_string());
    }
    line(
        "requeued along the way (sum of requeue_count)",
        s.requeued.to_string(),
    );
    line("reaped by the workers' reapers", s.reaped.to_string());
    line(
        "worker processes (killed with SIGKILL)",
        format!("{} ({})", s.workers, s.workers_killed),
    );
    line("duration", format!("{:.2} s", s.duration_s));
    line("throughput", format!("{:.1} runs/s", s.runs_per_s));
    let mut crash = String::new();
    let mut explore = "courier runs list | courier runs show ID".to_owned();
    if let Some(k) = &s.killed_worker {
        let signal = k
            .signal
            .map_or_else(|| "no signal".to_owned(), |n| format!("signal {n}"));
        crash = format!(
            "\nWorker process {} (of demo process {}) died of {signal} at {:.1} s,\n\
             {} steps into run {}.\n\
             Its lease ran out; process {} reaped the run at {:.1} s\n\
             and process {} finished it ({}) at {:.1} s:\n\
             {} steps replayed from the journal, {} ran after the crash (counted in the store).\n",
            k.pid,
            s.demo_pid,
            k.killed_at_s,
            k.steps_before_kill,
            k.run_id,
            pid(k.reaped_by_pid),
            k.reaped_at_s.unwrap_or(f64::NAN),
            pid(k.finished_by_pid),
            k.finished_status.as_deref().unwrap_or("?"),
            k.finished_at_s.unwrap_or(f64::NAN),
            k.steps_replayed,
            k.steps_ran_after,
        );
        explore = format!("courier runs show {}", k.run_id);
    }
    format!(
        "\nCourier demo: scripted runs on SQLite `{db}`, read back from the store\n\n{out}{crash}\nExplore: {explore}\n"
    )
}
