//! The `RunAgent` message: carries only the run id; the row is the state.

use courier_core::Message;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Asks a worker to execute a queued run. Duplicates and stale copies are harmless: the claim
/// decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunAgent {
    /// The run.
    pub run_id: Uuid,
}

impl Message for RunAgent {
    const NAME: &'static str = "courier.run_agent";
}
