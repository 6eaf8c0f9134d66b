//! The recovery hook (worker runs only): dead-letter, or requeue with backoff.

use uuid::Uuid;

use super::{RunError, Runtime};
use crate::agent::within_lease;
use crate::{FailureClass, Outcome, Settlement, TerminationReason};

/// The recovery hook, in order: not retryable -> `not_retryable`; a non-idempotent effect
/// in flight -> `not_retryable`; budget spent -> `retries_exhausted`; else owner requeue (refused:
/// lease lost, no settle) and dispatch `RunAgent` with `DelayStamp(min(base * 2^count, cap))`,
/// count taken before the increment, or the delay the provider asked for (`retry_after`, a
/// 429's `Retry-After`) when it gave one. A dispatch that fails because the transport is unreachable
/// leaves the run queued (the reaper dispatches overdue queued runs again, so an outage
/// dead-letters nothing); any other dispatch failure settles the queued row
/// `failed`/`dispatch_failed`.
pub(crate) async fn recover(
    runtime: &Runtime,
    run_id: Uuid,
    reason: TerminationReason,
    class: FailureClass,
    retry_after: Option<std::time::Duration>,
) -> Result<Outcome, RunError> {
    let inner = &runtime.inner;
    let me = inner.worker.as_str();
    let dead = |reason: TerminationReason| {
        (
            Settlement::failed(reason, Some(class)),
            Outcome::Failed {
                reason,
                class: Some(class),
            },
        )
    };

    if !(reason.is_retryable() && class.is_retryable()) {
        let (s, o) = dead(TerminationReason::NotRetryable);
        return runtime.settle(run_id, Some(me), s, o).await;
    }
    // Each call unanswered for a whole lease is a lost lease (`within_lease`).
    let lease = Some(inner.options.lease);
    let find = inner.store.find(run_id);
    let Some(run) = within_lease(lease, run_id, "reading the run", find)
        .await?
        .flatten()
    else {
        return Ok(Outcome::LeaseLost);
    };
    if run.pending_effect.is_some() {
        let (s, o) = dead(TerminationReason::NotRetryable);
        return runtime.settle(run_id, Some(me), s, o).await;
    }
    if run.requeue_count >= inner.options.max_requeues {
        let (s, o) = dead(TerminationReason::RetriesExhausted);
        return runtime.settle(run_id, Some(me), s, o).await;
    }
    let delay = retry_after.unwrap_or_else(|| inner.options.backoff.delay(run.requeue_count));
    let requeue = inner.store.requeue_owned(run_id, me, delay);
    if within_lease(lease, run_id, "requeueing", requeue).await? != Some(true) {
        return Ok(Outcome::LeaseLost);
    }
    metrics::counter!(courier_core::metrics::RUN_REQUEUES, "class" => class.as_str()).increment(1);
    tracing::info!(courier.run.id = %run_id, courier.run.error_class = %class, delay_ms = delay.as_millis() as u64, "run requeued");
    if let Err(e) = runtime
        .dispatch(run_id, run.concurrency_key.as_deref(), Some(delay))
        .await
    {
        if e.is_transient_dispatch() {
            tracing::warn!(courier.run.id = %run_id, error = %e, "dispatch after requeue failed; the run stays queued and the reaper dispatches it again");
            return Ok(Outcome::Requeued { delay });
        }
        tracing::error!(courier.run.id = %run_id, error = %e, "dispatch after requeue failed; run dead-lettered");
        inner
            .store
            .fail_queued(run_id, TerminationReason::DispatchFailed)
            .await?;
        return Ok(Outcome::Failed {
            reason: TerminationReason::DispatchFailed,
            class: Some(class),
        });
    }
    Ok(Outcome::Requeued { delay })
}
