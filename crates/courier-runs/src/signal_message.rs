//! The `RunSignal` message: a signal for a run sent over the bus (a webhook's handler, another
//! service), handled by [`RunSignalHandler`] through [`Runtime::signal`].

use courier_core::{Envelope, Handler, HandlerError, Message};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::{RunError, Runtime};

/// Sends the signal `name` to a run, as [`Runtime::signal`] does. [`Runtime::register`] adds its
/// handler to the bus, so a message routed to a worker's transport wakes the run there.
///
/// ```
/// use courier_core::MessageBus;
/// use courier_runs::{MemoryRunStore, RunSignal, RunStatus, Runtime, ScriptedAgent};
/// use serde_json::json;
/// use std::sync::Arc;
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let runtime = Runtime::builder(Arc::new(MemoryRunStore::new())).agent("scripted", ScriptedAgent).build();
/// let bus = runtime
///     .register(
///         MessageBus::builder()
///             .sync_transport("sync")
///             .route("courier.run_agent", ["sync"])
///             .route("courier.run_signal", ["sync"]),
///     )
///     .build();
/// let script = json!({"steps": [{"wait_signal": "go"}, {"output": "went"}]});
/// let id = runtime.enqueue("scripted", script).await?;
/// assert_eq!(runtime.store().find(id).await?.unwrap().status, RunStatus::Waiting);
/// bus.dispatch(RunSignal { run_id: id, name: "go".into(), data: json!(1), by: Some("ops".into()) }).await?;
/// assert_eq!(runtime.store().find(id).await?.unwrap().status, RunStatus::Completed);
/// # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSignal {
    /// The run.
    pub run_id: Uuid,
    /// The signal's name (the one the run waits for, or will).
    pub name: String,
    /// Its data, given to the run's wait.
    #[serde(default)]
    pub data: serde_json::Value,
    /// Who sent it.
    #[serde(default)]
    pub by: Option<String>,
}

impl Message for RunSignal {
    const NAME: &'static str = "courier.run_signal";
}

/// Handles [`RunSignal`] through [`Runtime::signal`]. A signal that can never be delivered (no
/// such run, a finished run, a run waiting for another signal) fails unrecoverably, to the
/// failure transport, naming why; a store or dispatch failure is retried.
#[derive(Debug, Clone)]
pub struct RunSignalHandler {
    runtime: Runtime,
}

impl RunSignalHandler {
    /// A handler for `runtime`; it dispatches woken runs on the bus handling the message.
    #[must_use]
    pub fn new(runtime: Runtime) -> Self {
        Self {
            runtime: runtime.handling(),
        }
    }
}

#[courier_core::async_trait]
impl Handler<RunSignal> for RunSignalHandler {
    async fn handle(&self, message: &RunSignal, _envelope: &Envelope) -> Result<(), HandlerError> {
        let sent = self
            .runtime
            .signal(
                message.run_id,
                &message.name,
                message.data.clone(),
                message.by.as_deref(),
            )
            .await;
        match sent {
            Ok(sent) => {
                tracing::debug!(courier.run.id = %message.run_id, signal = %message.name, ?sent, "run signal handled");
                Ok(())
            }
            Err(
                e @ (RunError::NotFound(_)
                | RunError::UnknownSignal { .. }
                | RunError::WrongStatus { .. }),
            ) => Err(HandlerError::unrecoverable(e)),
            Err(e) => Err(HandlerError::recoverable(e, None)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use courier_core::MessageBus;
    use serde_json::json;

    use super::*;
    use crate::{MemoryRunStore, RunAgent, RunStatus, ScriptedAgent};

    #[tokio::test]
    async fn a_signal_that_cannot_be_delivered_fails_unrecoverably_naming_why() {
        let runtime = Runtime::builder(Arc::new(MemoryRunStore::new()))
            .agent("scripted", ScriptedAgent)
            .build();
        let _bus = runtime
            .register(
                MessageBus::builder()
                    .sync_transport("sync")
                    .route("courier.run_agent", ["sync"]),
            )
            .build();
        let script = json!({"steps": [{"wait_signal": "go"}, {"output": "went"}]});
        let id = runtime.enqueue("scripted", script).await.expect("queued");
        let handler = RunSignalHandler::new(runtime.clone());
        let envelope = Envelope::new(RunAgent { run_id: id });
        let wrong = RunSignal {
            run_id: id,
            name: "stop".into(),
            data: json!(null),
            by: None,
        };
        let err = handler
            .handle(&wrong, &envelope)
            .await
            .expect_err("refused");
        assert!(matches!(err, HandlerError::Unrecoverable(_)), "{err:?}");
        assert!(err.to_string().contains("waits for `go`"), "{err}");
        let run = runtime
            .store()
            .find(id)
            .await
            .expect("found")
            .expect("stored");
        assert_eq!(run.status, RunStatus::Waiting, "nothing was delivered");
        let nobody = RunSignal {
            run_id: Uuid::new_v4(),
            ..wrong
        };
        let err = handler
            .handle(&nobody, &envelope)
            .await
            .expect_err("refused");
        assert!(matches!(err, HandlerError::Unrecoverable(_)), "{err:?}");
        assert!(err.to_string().contains("not found"), "{err}");
    }
}
