//! The stale-run reaper.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use courier_core::BusLink;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::runtime::{RunError, dispatch_run};
use crate::{RunStore, TerminationReason};

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
}

impl fmt::Display for ReapReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Reaped {} stale run(s): {} requeued, {} dead-lettered, {} skipped.",
            self.selected, self.requeued, self.dead_lettered, self.skipped
        )
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

/// Finds runs whose lease expired (their worker died or hung) and requeues or dead-letters them.
/// Safe to run in several processes at once: every write re-checks staleness.
#[derive(Clone)]
pub struct Reaper {
    store: Arc<dyn RunStore>,
    bus: BusLink,
    max_requeues: u32,
}

impl fmt::Debug for Reaper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reaper")
            .field("max_requeues", &self.max_requeues)
            .finish_non_exhaustive()
    }
}

impl Reaper {
    /// A reaper over `store` dispatching `RunAgent` on the bus `bus` is bound to.
    #[must_use]
    pub fn new(store: Arc<dyn RunStore>, bus: BusLink, max_requeues: u32) -> Self {
        Self {
            store,
            bus,
            max_requeues,
        }
    }

    /// One pass, DESIGN §5's order for each stale run: a non-idempotent effect in flight ->
    /// dead-letter `not_retryable`; budget spent -> dead-letter `retries_exhausted`; else stale
    /// requeue (refused = skipped) and dispatch with no delay; a dispatch failure settles the run
    /// `failed`/`dispatch_failed`.
    ///
    /// # Errors
    /// Store failures.
    pub async fn reap(&self, options: ReapOptions) -> Result<ReapReport, RunError> {
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
            match dispatch_run(&self.bus, run.id, None).await {
                Ok(()) => {
                    tracing::info!(courier.run.id = %run.id, "stale run requeued");
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
                Ok(report) if report.selected > 0 => tracing::info!(%report, "reaped"),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "reap failed"),
            }
        }
    }
}
