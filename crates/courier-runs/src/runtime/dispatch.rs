//! The bus a runtime dispatches `RunAgent` on, and the dispatch itself.

use std::time::Duration;

use courier_core::{ConcurrencyKeyStamp, DelayStamp, Dispatcher, Envelope, MessageBus};
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

fn bus_of(via: &Via) -> Result<MessageBus, RunError> {
    match via {
        Via::Dispatcher(d) => d.bus().cloned(),
        Via::Handling => MessageBus::current(),
    }
    .ok_or(RunError::NotRegistered)
}

/// Checks that every transport `RunAgent` is routed to limits per key ([`RunError::NotKeyed`]
/// names the first that does not): a run's key must never be dropped silently.
pub(crate) fn check_keyed(via: &Via, run_id: Uuid) -> Result<(), RunError> {
    keyed_routes(&bus_of(via)?, run_id)
}

fn keyed_routes(bus: &MessageBus, run_id: Uuid) -> Result<(), RunError> {
    let routes = bus
        .router()
        .resolve(<RunAgent as courier_core::Message>::NAME);
    if routes.is_empty() {
        return Err(RunError::NotKeyed {
            run_id,
            transport: "(none: handled in the dispatching process)".to_owned(),
        });
    }
    for name in routes {
        if bus
            .transport(name)
            .is_some_and(|t| t.as_keyed_queue().is_none())
        {
            return Err(RunError::NotKeyed {
                run_id,
                transport: name.clone(),
            });
        }
    }
    Ok(())
}

/// Dispatches `RunAgent` for `run_id`, carrying the run's concurrency key (if it has one) as a
/// [`ConcurrencyKeyStamp`], so that a keyed runs transport counts it against the key's slots.
pub(crate) async fn dispatch_run(
    via: &Via,
    run_id: Uuid,
    key: Option<&str>,
    delay: Option<Duration>,
) -> Result<(), RunError> {
    let bus = bus_of(via)?;
    if key.is_some() {
        keyed_routes(&bus, run_id)?;
    }
    let mut envelope = Envelope::new(RunAgent { run_id });
    if let Some(delay) = delay {
        envelope = envelope.with(DelayStamp(delay));
    }
    if let Some(key) = key {
        // Checked when the run was made (`NewRun::with_concurrency_key`); a key that fails the
        // check here was written to the store some other way, and is refused, naming the run.
        let stamp = ConcurrencyKeyStamp::new(key).map_err(|e| RunError::Dispatch {
            run_id,
            source: courier_core::BusError::Middleware(Box::new(e)),
        })?;
        envelope = envelope.with(stamp);
    }
    bus.dispatch(envelope)
        .await
        .map(drop)
        .map_err(|source| RunError::Dispatch { run_id, source })
}
