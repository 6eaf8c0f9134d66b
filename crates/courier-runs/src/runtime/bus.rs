//! A runtime on a bus: registering its handlers on a bus builder, and the bus it dispatches on.

use courier_core::{Dispatcher, MessageBusBuilder};

use super::{Runtime, Via};
use crate::{RunAgent, RunAgentHandler};

impl Runtime {
    /// Registers the [`RunAgentHandler`] on a bus builder and gives it this runtime's
    /// [`Dispatcher`]: once built, the bus is the one the runtime (and its reapers) dispatch
    /// `RunAgent` on, and they keep it alive; the handler dispatches its requeues on the bus
    /// handling the message.
    #[must_use]
    pub fn register(&self, builder: MessageBusBuilder) -> MessageBusBuilder {
        let builder = builder
            .handler_named::<RunAgent, _>("courier.runs", RunAgentHandler::new(self.clone()))
            .handler_named::<crate::RunSignal, _>(
                "courier.runs.signal",
                crate::RunSignalHandler::new(self.clone()),
            );
        match &self.bus {
            Via::Dispatcher(d) => builder.dispatcher(d),
            Via::Handling => builder,
        }
    }

    /// The dispatcher this runtime dispatches through (`None` for the runtime inside a
    /// [`RunAgentHandler`], which uses the bus handling the message).
    #[must_use]
    pub fn dispatcher(&self) -> Option<&Dispatcher> {
        match &self.bus {
            Via::Dispatcher(d) => Some(d),
            Via::Handling => None,
        }
    }

    /// This runtime dispatching on the bus handling the current message: the form a handler
    /// inside the bus holds.
    pub(crate) fn handling(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            bus: Via::Handling,
        }
    }
}
