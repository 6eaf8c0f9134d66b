//! The bus a runtime dispatches `RunAgent` on, and the dispatch itself.

use std::time::Duration;

use courier_core::{DelayStamp, Dispatcher, Envelope, MessageBus};
use uuid::Uuid;

use super::RunError;
use crate::RunAgent;

/// The bus a [`Runtime`](crate::Runtime) dispatches `RunAgent` on.
#[derive(Clone, Debug)]
pub(crate) enum Via {
    /// The bus its [`Dispatcher`] holds once built (the runtime keeps it alive).
    Dispatcher(Dispatcher),
    /// The bus handling the current message ([`MessageBus::current`]): the runtime inside a
    /// [`RunAgentHandler`](crate::RunAgentHandler), which the bus holds, so it must not hold the bus back.
    Handling,
}

pub(crate) async fn dispatch_run(
    via: &Via,
    run_id: Uuid,
    delay: Option<Duration>,
) -> Result<(), RunError> {
    let bus: MessageBus = match via {
        Via::Dispatcher(d) => d.bus().cloned(),
        Via::Handling => MessageBus::current(),
    }
    .ok_or(RunError::NotRegistered)?;
    let mut envelope = Envelope::new(RunAgent { run_id });
    if let Some(delay) = delay {
        envelope = envelope.with(DelayStamp(delay));
    }
    bus.dispatch(envelope)
        .await
        .map(drop)
        .map_err(|source| RunError::Dispatch { run_id, source })
}
