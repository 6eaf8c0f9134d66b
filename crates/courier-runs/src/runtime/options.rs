//! The runtime's settings and their defaults.

use std::time::Duration;

use crate::Backoff;

/// The default requeue backoff: 30 s doubling up to 10 min, no jitter.
pub(crate) const REQUEUE_BACKOFF: Backoff =
    Backoff::new(Duration::from_secs(30), Duration::from_secs(600));

/// The longest wait, between step boundaries, before a worker run notices that it was cancelled
/// or that another worker owns it.
pub const CANCEL_CHECK_EVERY: Duration = Duration::from_millis(500);

/// Runtime settings (see [`RunsConfig`](crate::RunsConfig) for the file form).
#[derive(Debug, Clone)]
pub struct RuntimeOptions {
    /// Lease of a claimed run (default 900 s). Every step boundary checks the claim, and renews
    /// the lease once less than three quarters of it is left; the lease watch renews it too.
    pub lease: Duration,
    /// Requeues allowed, failure retries and stale reclaims together (default 3).
    pub max_requeues: u32,
    /// Requeue delays: attempt `n` is the requeue of a run requeued `n` times before (default
    /// 30 s doubling up to 10 min, no jitter).
    pub backoff: Backoff,
    /// How often a worker run checks, between step boundaries, that it still owns its row and
    /// was not cancelled, so the agent is stopped promptly when another worker took it or an
    /// operator cancelled it (`courier runs cancel`, on any host): default the shorter of lease / 4
    /// and [`CANCEL_CHECK_EVERY`] (500 ms), one read for all the runs the runtime holds
    /// ([`RunStore::probe`](crate::RunStore::probe)); None: only at step boundaries.
    pub lease_check_every: Option<Duration>,
    /// The longest a step may take, from the run's start or its last step boundary to the next
    /// one: a step that takes longer is cancelled and fails the execution as a retryable
    /// timeout ([`AgentError::StepTimeout`](crate::AgentError::StepTimeout), class `connection`, like every timeout). None
    /// (default): no limit.
    pub step_timeout: Option<Duration>,
    /// How long past its due time a queued run waits before the reaper dispatches it again
    /// (None: the lease).
    pub redispatch_after: Option<Duration>,
    /// The largest result a step may journal, in bytes of JSON (default 1 MiB): a larger one
    /// fails the run with class `result_too_large`.
    pub max_step_result: usize,
    /// How long finished runs are kept before the reaper deletes them, with their events and
    /// steps (None, the default: forever).
    pub retention: Option<Duration>,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(900),
            max_requeues: 3,
            backoff: REQUEUE_BACKOFF,
            lease_check_every: Some(CANCEL_CHECK_EVERY),
            step_timeout: None,
            redispatch_after: None,
            max_step_result: crate::DEFAULT_MAX_STEP_RESULT,
            retention: None,
        }
    }
}
