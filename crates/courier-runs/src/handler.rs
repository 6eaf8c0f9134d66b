//! The bus handler of `RunAgent`.

use courier_core::{Envelope, Handler, HandlerError};

use crate::{RunAgent, Runtime};

/// Executes `RunAgent` messages through [`Runtime::run_queued`]. It never fails for a run
/// outcome (failed, requeued, not claimed... are all handled), so the messenger-level retry is
/// not used for runs: only a store failure before or during the run is returned, and a
/// redelivered copy is harmless because the claim decides.
#[derive(Debug, Clone)]
pub struct RunAgentHandler {
    runtime: Runtime,
}

impl RunAgentHandler {
    /// A handler for `runtime`. It dispatches requeues on the bus handling the message, so it
    /// holds no bus (the bus holds it).
    #[must_use]
    pub fn new(runtime: Runtime) -> Self {
        Self {
            runtime: runtime.handling(),
        }
    }
}

#[courier_core::async_trait]
impl Handler<RunAgent> for RunAgentHandler {
    async fn handle(&self, message: &RunAgent, _envelope: &Envelope) -> Result<(), HandlerError> {
        match self.runtime.run_queued(message.run_id).await {
            Ok(outcome) => {
                tracing::debug!(courier.run.id = %message.run_id, ?outcome, "run agent handled");
                Ok(())
            }
            Err(e) => Err(HandlerError::recoverable(e, None)),
        }
    }
}
