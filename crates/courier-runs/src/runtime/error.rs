//! The runtime's errors (a run's own outcome is an [`Outcome`](crate::Outcome), not an error).

use courier_core::BusError;
use uuid::Uuid;

use crate::agent::AgentError;
use crate::{RunStatus, StoreError};

/// The runtime failed (not a run outcome: those are [`Outcome`](crate::Outcome)s).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Dispatching `RunAgent` failed; the run was settled `failed`/`dispatch_failed`.
    #[error("could not dispatch run {run_id}")]
    Dispatch {
        /// The run.
        run_id: Uuid,
        /// The bus error.
        #[source]
        source: BusError,
    },
    /// The runtime was never registered on a bus that was built (see [`Runtime::register`](crate::Runtime::register)),
    /// or a [`RunAgentHandler`](crate::RunAgentHandler) ran outside its bus.
    #[error(
        "the run runtime has no bus to dispatch on: register it on a bus builder (Runtime::register) and build the bus"
    )]
    NotRegistered,
    /// A run with a concurrency key would be dispatched to a transport that cannot limit per
    /// key, where the key would do nothing: nothing was stored or sent.
    #[error(
        "run {run_id} has a concurrency key, but transport `{transport}` (where `courier.run_agent` is routed) \
         cannot limit runs per key: give it `concurrency_max` (SQL or Redis DSN), or submit the run without a key"
    )]
    NotKeyed {
        /// The run.
        run_id: Uuid,
        /// The transport `RunAgent` is routed to.
        transport: String,
    },
    /// No agent of that name is registered.
    #[error("unknown agent `{0}`")]
    UnknownAgent(String),
    /// The run waits for another signal than the one sent (nothing was recorded).
    #[error("run {run_id} is not waiting for signal `{name}`{}", match waiting_for { Some(w) => format!(" (it waits for `{w}`)"), None => String::new() })]
    UnknownSignal {
        /// The run.
        run_id: Uuid,
        /// The signal sent.
        name: String,
        /// The signal it waits for.
        waiting_for: Option<String>,
    },
    /// The run does not exist.
    #[error("run {0} not found")]
    NotFound(Uuid),
    /// An operator's requeue was refused.
    #[error("run {run_id} was not requeued: {reason}")]
    NotRequeued {
        /// The run.
        run_id: Uuid,
        /// Why (its status, a live lease...).
        reason: String,
    },
    /// The run is not in the status the operation needs.
    #[error("run {run_id} is {status}, not {expected}")]
    WrongStatus {
        /// The run.
        run_id: Uuid,
        /// Its status.
        status: RunStatus,
        /// The status needed.
        expected: RunStatus,
    },
    /// An interactive run's agent failed: the failure, unchanged (the run is `failed`).
    #[error("run {run_id} failed")]
    Agent {
        /// The run.
        run_id: Uuid,
        /// The agent's error.
        #[source]
        error: AgentError,
    },
}

impl RunError {
    /// Whether this is a dispatch that failed because its transport is unreachable for now
    /// (connection lost, timed out): the message may be sent later, so a run already requeued
    /// stays queued for the reaper to dispatch again instead of being dead-lettered.
    #[must_use]
    pub fn is_transient_dispatch(&self) -> bool {
        matches!(
            self,
            Self::Dispatch {
                source: BusError::Send { source, .. },
                ..
            } if source.is_transient()
        )
    }
}
