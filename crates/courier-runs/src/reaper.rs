//! The stale-run reaper.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use courier_core::Dispatcher;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::runtime::{RunError, Via, dispatch_run};
use crate::{RunStatus, RunStore, TerminationReason};
use uuid::Uuid;

/// The default of [`Reaper::redispatch_after`]: the default lease.
pub const DEFAULT_REDISPATCH_AFTER: Duration = Duration::from_secs(900);

/// What one reap did (or, in a dry run, would do).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ReapReport {
    /// Stale runs selected.
    pub selected: usize,
    /// Requeued and dispatched.
    pub requeued: usize,
    /// Dead-lettered (`failed` with a reason), including dispatch failures after a requeue.
    pub dead_lettered: usize,
    /// Skipped: a heartbeat (or another reaper) won the race.
    pub skipped: usize,
    /// Queued runs overdue past [`Reaper::redispatch_after`] whose `RunAgent` was dispatched
    /// again (their message was presumably lost). Not counted in `selected`.
    pub redispatched: usize,
    /// Runs in a durable wait whose due time passed (a sleep's end, a signal's timeout), woken
    /// and dispatched. Not counted in `selected`.
    pub woken: usize,
    /// Finished runs older than the retention, deleted with their events and steps.
    pub pruned: u64,
}

impl fmt::Display for ReapReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Reaped {} stale run(s): {} requeued, {} dead-lettered, {} skipped",
            self.selected, self.requeued, self.dead_lettered, self.skipped
        )?;
        if self.redispatched > 0 {
            write!(f, ", {} re-dispatched", self.redispatched)?;
        }
        if self.woken > 0 {
            write!(f, ", {} woken from a durable wait", self.woken)?;
        }
        if self.pruned > 0 {
            write!(f, ", {} finished run(s) pruned", self.pruned)?;
        }
        f.write_str(".")
    }
}

/// Options of one reap.
#[derive(Debug, Clone, Copy)]
pub struct ReapOptions {
    /// Most stale runs handled (default 50).
    pub limit: usize,
    /// Decide but change nothing.
    pub dry_run: bool,
}

impl Default for ReapOptions {
    fn default() -> Self {
        Self {
            limit: 50,
            dry_run: false,
        }
    }
}

/// What [`Reaper::requeue`] (`courier runs requeue ID`) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ManualRequeue {
    /// The run was queued: its `RunAgent` message was dispatched again.
    Redispatched,
    /// The run was running under an expired lease: it was requeued and dispatched.
    Requeued,
}

/// Finds runs whose lease expired (their worker died or hung) and requeues or dead-letters them,
/// and runs queued far past their due time (their message was lost: a transport that lost its
/// data, a message stranded with a dead worker) and dispatches them again. Safe to run in
/// several processes at once: every write re-checks its condition and moves it forward.
///
/// A queued run has no trace of its message in the store, so "lost" means "still queued
/// [`redispatch_after`](Self::redispatch_after) past its due time": a run that merely waits
/// behind a long backlog may get a second `RunAgent`, which is harmless (the claim is guarded,
/// the second message finds the run claimed or finished and is acked as a non-event).
///
/// A dispatch the transport could not take for now (its broker restarting) leaves the run queued
/// and owed: the next pass of the same reaper (or of any reaper from the same
/// [`Runtime`](crate::Runtime)) dispatches it again, so a run waits one reap interval past the
/// outage, not [`redispatch_after`](Self::redispatch_after) more. A process that dies owing runs
/// loses only the shortcut: they are overdue in the store like any other.
#[derive(Clone)]
pub struct Reaper {
    store: Arc<dyn RunStore>,
    bus: Via,
    max_requeues: u32,
    redispatch_after: Duration,
    owed: Owed,
    retention: Option<Duration>,
}

/// The statuses a retention prunes: every terminal one.
pub const PRUNABLE: [RunStatus; 3] = [
    RunStatus::Completed,
    RunStatus::Failed,
    RunStatus::Cancelled,
];

/// Runs queued by a reaper whose dispatch failed transiently, to dispatch on the next pass.
pub(crate) type Owed = Arc<Mutex<Vec<Uuid>>>;

impl fmt::Debug for Reaper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reaper")
            .field("max_requeues", &self.max_requeues)
            .field("redispatch_after", &self.redispatch_after)
            .finish_non_exhaustive()
    }
}

impl Reaper {
    /// A reaper over `store` dispatching `RunAgent` on the bus `bus` holds (or will once built).
    #[must_use]
    pub fn new(store: Arc<dyn RunStore>, bus: Dispatcher, max_requeues: u32) -> Self {
        Self::with_via(store, Via::Dispatcher(bus), max_requeues, Owed::default())
    }

    pub(crate) fn with_via(
        store: Arc<dyn RunStore>,
        bus: Via,
        max_requeues: u32,
        owed: Owed,
    ) -> Self {
        Self {
            store,
            bus,
            max_requeues,
            redispatch_after: DEFAULT_REDISPATCH_AFTER,
            owed,
            retention: None,
        }
    }

    /// Deletes, at each pass, up to the pass's limit of finished runs (completed, failed,
    /// cancelled) that finished more than `retention` ago, with their events and steps (None:
    /// none; `runs.retention`).
    #[must_use]
    pub fn retention(mut self, retention: Option<Duration>) -> Self {
        self.retention = retention;
        self
    }

    /// How long past its due time a queued run waits before it is dispatched again (default
    /// [`DEFAULT_REDISPATCH_AFTER`]; a runtime's reaper uses `[runs] redispatch_after`, else the
    /// lease).
    #[must_use]
    pub fn redispatch_after(mut self, after: Duration) -> Self {
        self.redispatch_after = after;
        self
    }

    /// One pass, in this order for each stale run: a non-idempotent effect in flight ->
    /// dead-letter `not_retryable`; budget spent -> dead-letter `retries_exhausted`; else stale
    /// requeue (refused = skipped) and dispatch with no delay; a dispatch the transport could not
    /// take for now (connection, timeout) leaves the run queued for the overdue pass, any other
    /// dispatch failure settles it `failed`/`dispatch_failed`. Then each queued run overdue by more than
    /// [`redispatch_after`](Self::redispatch_after): the guarded re-dispatch (refused: another
    /// reaper or a worker won) and a `RunAgent` with no delay; a dispatch failure leaves the run
    /// queued for the next pass. Runs owed by an earlier pass (their dispatch failed
    /// transiently) are dispatched again first, guarded by their still being queued.
    ///
    /// # Errors
    /// Store failures.
    pub async fn reap(&self, options: ReapOptions) -> Result<ReapReport, RunError> {
        let owed = if options.dry_run {
            0
        } else {
            self.redispatch_owed().await?
        };
        let mut report = self.reap_stale(options).await?;
        report.redispatched = owed + self.redispatch_overdue(options).await?;
        report.woken = self.wake_due(options).await?;
        if let (Some(retention), false) = (self.retention, options.dry_run) {
            report.pruned = self
                .store
                .prune(retention, &PRUNABLE, options.limit)
                .await?;
        }
        if !options.dry_run {
            use courier_core::metrics as m;
            metrics::counter!(m::REAPER_REQUEUED).increment(report.requeued as u64);
            metrics::counter!(m::REAPER_DEAD_LETTERED).increment(report.dead_lettered as u64);
            metrics::counter!(m::REAPER_REDISPATCHED).increment(report.redispatched as u64);
        }
        Ok(report)
    }

    fn owe(&self, run_id: Uuid) {
        let mut owed = self.owed.lock().unwrap_or_else(PoisonError::into_inner);
        if !owed.contains(&run_id) {
            owed.push(run_id);
        }
    }

    /// Dispatches again the runs an earlier pass left queued after a transient dispatch failure.
    async fn redispatch_owed(&self) -> Result<usize, RunError> {
        let owed = std::mem::take(&mut *self.owed.lock().unwrap_or_else(PoisonError::into_inner));
        let mut redispatched = 0;
        for (i, &run_id) in owed.iter().enumerate() {
            match self.store.redispatch_queued(run_id).await {
                Ok(true) => {}
                Ok(false) => continue, // claimed or settled meanwhile: nothing owed
                Err(e) => {
                    owed[i..].iter().for_each(|&id| self.owe(id));
                    return Err(e.into());
                }
            }
            // Rare (after a transport outage): the run is read again for its concurrency key.
            let key = match self.store.find(run_id).await {
                Ok(run) => run.and_then(|r| r.concurrency_key),
                Err(e) => {
                    owed[i..].iter().for_each(|&id| self.owe(id));
                    return Err(e.into());
                }
            };
            match dispatch_run(&self.bus, run_id, key.as_deref(), None).await {
                Ok(()) => {
                    tracing::info!(courier.run.id = %run_id, "queued run re-dispatched after a transport outage");
                    redispatched += 1;
                }
                Err(e) if e.is_transient_dispatch() => {
                    tracing::debug!(courier.run.id = %run_id, error = %e, "re-dispatch failed again; owed to the next pass");
                    self.owe(run_id);
                }
                Err(e) => {
                    tracing::warn!(courier.run.id = %run_id, error = %e, "re-dispatch failed; the run stays queued until overdue");
                }
            }
        }
        Ok(redispatched)
    }

    /// Wakes the runs whose durable wait is due (one guarded UPDATE each, so two reapers never
    /// both dispatch) and dispatches them; a failed dispatch leaves the run queued, for the
    /// overdue pass.
    async fn wake_due(&self, options: ReapOptions) -> Result<usize, RunError> {
        let due = self.store.select_due_waits(options.limit).await?;
        if options.dry_run {
            return Ok(due.len());
        }
        let mut woken = 0;
        for run in due {
            if !self.store.wake(run.id, None).await? {
                continue;
            }
            match dispatch_run(&self.bus, run.id, run.concurrency_key.as_deref(), None).await {
                Ok(()) => woken += 1,
                Err(e) => {
                    if e.is_transient_dispatch() {
                        self.owe(run.id);
                    }
                    tracing::warn!(courier.run.id = %run.id, error = %e, "dispatch of a woken run failed; it stays queued");
                }
            }
        }
        Ok(woken)
    }

    async fn redispatch_overdue(&self, options: ReapOptions) -> Result<usize, RunError> {
        let overdue = self
            .store
            .select_overdue(self.redispatch_after, options.limit)
            .await?;
        if options.dry_run {
            return Ok(overdue.len());
        }
        let mut redispatched = 0;
        for run in overdue {
            if !self
                .store
                .redispatch_overdue(run.id, self.redispatch_after)
                .await?
            {
                tracing::debug!(courier.run.id = %run.id, "overdue run taken by another reaper or a worker");
                continue;
            }
            match dispatch_run(&self.bus, run.id, run.concurrency_key.as_deref(), None).await {
                Ok(()) => {
                    tracing::info!(courier.run.id = %run.id, due_at = run.due_at, "overdue queued run re-dispatched");
                    redispatched += 1;
                }
                Err(e) => {
                    if e.is_transient_dispatch() {
                        self.owe(run.id);
                    }
                    tracing::warn!(courier.run.id = %run.id, error = %e, "re-dispatch of an overdue run failed; it stays queued");
                }
            }
        }
        Ok(redispatched)
    }

    /// An operator's requeue of one run (`courier runs requeue ID`): a `queued` run gets its
    /// `RunAgent` dispatched again (guarded: still queued); a `running` run whose lease expired
    /// is requeued (the stale requeue, guarded) and dispatched with no delay. Anything else is
    /// refused with [`RunError::NotRequeued`], naming why.
    ///
    /// # Errors
    /// [`RunError::NotFound`], [`RunError::NotRequeued`], [`RunError::Dispatch`] (a queued run
    /// stays queued, and so does a requeued one when the transport is unreachable for now;
    /// otherwise a requeued one is settled `failed`/`dispatch_failed`), store failures.
    pub async fn requeue(&self, run_id: Uuid) -> Result<ManualRequeue, RunError> {
        let run = self
            .store
            .find(run_id)
            .await?
            .ok_or(RunError::NotFound(run_id))?;
        let refused = |reason: String| Err(RunError::NotRequeued { run_id, reason });
        match run.status {
            RunStatus::Queued => {
                if !self.store.redispatch_queued(run_id).await? {
                    return refused("it was claimed or settled meanwhile".into());
                }
                dispatch_run(&self.bus, run_id, run.concurrency_key.as_deref(), None).await?;
                tracing::info!(courier.run.id = %run_id, "queued run re-dispatched by an operator");
                Ok(ManualRequeue::Redispatched)
            }
            RunStatus::Running => {
                if run.lease_expires == 0 {
                    return refused("it is running interactively (no lease)".into());
                }
                let now = self.store.now_ms().await?;
                if run.lease_expires >= now {
                    return refused(format!(
                        "it is running under a live lease held by {} (expires in {}s)",
                        run.claimed_by.as_deref().unwrap_or("?"),
                        (run.lease_expires - now + 999) / 1000
                    ));
                }
                if let Some(effect) = &run.pending_effect {
                    return refused(format!(
                        "a non-idempotent effect (`{effect}`) is in flight; `courier reap` dead-letters it"
                    ));
                }
                if !self.store.requeue_stale(run_id).await? {
                    return refused("its lease was renewed or it was settled meanwhile".into());
                }
                if let Err(e) =
                    dispatch_run(&self.bus, run_id, run.concurrency_key.as_deref(), None).await
                {
                    if !e.is_transient_dispatch() {
                        self.store
                            .fail_queued(run_id, TerminationReason::DispatchFailed)
                            .await?;
                    }
                    return Err(e);
                }
                tracing::info!(courier.run.id = %run_id, "stale run requeued by an operator");
                Ok(ManualRequeue::Requeued)
            }
            status => refused(format!(
                "it is {status}; only a queued run (re-dispatched) or a running run whose lease \
                 expired (requeued) can be requeued"
            )),
        }
    }

    async fn reap_stale(&self, options: ReapOptions) -> Result<ReapReport, RunError> {
        let stale = self.store.select_stale(options.limit).await?;
        let mut report = ReapReport {
            selected: stale.len(),
            ..ReapReport::default()
        };
        for run in stale {
            let dead = if run.pending_effect.is_some() {
                Some(TerminationReason::NotRetryable)
            } else if run.requeue_count >= self.max_requeues {
                Some(TerminationReason::RetriesExhausted)
            } else {
                None
            };
            if options.dry_run {
                if dead.is_some() {
                    report.dead_lettered += 1;
                } else {
                    report.requeued += 1;
                }
                continue;
            }
            if let Some(reason) = dead {
                if self.store.dead_letter_stale(run.id, reason).await? {
                    tracing::info!(courier.run.id = %run.id, %reason, "stale run dead-lettered");
                    report.dead_lettered += 1;
                } else {
                    report.skipped += 1;
                }
                continue;
            }
            if !self.store.requeue_stale(run.id).await? {
                report.skipped += 1;
                continue;
            }
            match dispatch_run(&self.bus, run.id, run.concurrency_key.as_deref(), None).await {
                Ok(()) => {
                    tracing::info!(courier.run.id = %run.id, "stale run requeued");
                    report.requeued += 1;
                }
                Err(e) if e.is_transient_dispatch() => {
                    tracing::warn!(courier.run.id = %run.id, error = %e, "dispatch after stale requeue failed; the run stays queued and is dispatched again on the next pass");
                    self.owe(run.id);
                    report.requeued += 1;
                }
                Err(e) => {
                    tracing::error!(courier.run.id = %run.id, error = %e, "dispatch after stale requeue failed");
                    self.store
                        .fail_queued(run.id, TerminationReason::DispatchFailed)
                        .await?;
                    report.dead_lettered += 1;
                }
            }
        }
        Ok(report)
    }

    /// Reaps every `every` until `shutdown` is cancelled (first pass after one interval). Store
    /// failures are logged and the loop goes on.
    pub async fn run_every(
        &self,
        every: Duration,
        options: ReapOptions,
        shutdown: CancellationToken,
    ) {
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(every) => {}
            }
            match self.reap(options).await {
                Ok(report) if report.selected > 0 || report.redispatched > 0 => {
                    tracing::info!(%report, "reaped");
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "reap failed"),
            }
        }
    }
}
