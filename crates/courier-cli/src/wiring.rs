//! What the commands use of an [`App`](crate::App): its handlers and bus customisations, its
//! messages, its transport factories and its agents. The app fills a [`Wiring`] and hands it to
//! the commands, which never see the app itself (`app -> dispatch -> commands -> wiring`).

use std::sync::Arc;

use std::collections::BTreeMap;

use courier_core::{MessageBusBuilder, MessageRegistry, Middleware, TransportRegistry};

/// A bus customisation: a handler registration, middleware, routes.
pub(crate) type BusHook = Arc<dyn Fn(MessageBusBuilder) -> MessageBusBuilder + Send + Sync>;

/// A customisation of the options `courier relay` builds from its flags.
pub(crate) type RelayHook = Arc<
    dyn Fn(courier_core::relay::RelayOptions) -> courier_core::relay::RelayOptions + Send + Sync,
>;

/// An application's handlers, messages, transports and agents.
#[derive(Clone)]
pub(crate) struct Wiring {
    /// Applied, in order, to every bus the CLI builds.
    pub(crate) bus_hooks: Vec<BusHook>,
    /// Applied, in order, to the options of `courier relay`.
    pub(crate) relay_hooks: Vec<RelayHook>,
    /// The messages of the application (handled or only decoded).
    pub(crate) registry: MessageRegistry,
    /// The transport factories, by DSN scheme.
    pub(crate) factories: TransportRegistry,
    /// Middleware by name, for `[buses.NAME] middleware = [...]`.
    pub(crate) middleware: BTreeMap<String, Arc<dyn Middleware>>,
    /// The agents `runs submit` and the run worker can execute.
    #[cfg(feature = "runs")]
    pub(crate) agents: crate::runs::Agents,
}

impl std::fmt::Debug for Wiring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wiring")
            .field("registry", &self.registry)
            .field("factories", &self.factories)
            .finish_non_exhaustive()
    }
}

impl Wiring {
    /// The transports of the enabled features ([`courier::transport_registry`]) and, with
    /// `runs`, the built-in `scripted` agent; no handler yet.
    pub(crate) fn new() -> Self {
        Self {
            bus_hooks: Vec::new(),
            relay_hooks: Vec::new(),
            registry: MessageRegistry::new(),
            factories: courier::transport_registry(),
            middleware: BTreeMap::new(),
            #[cfg(feature = "runs")]
            agents: crate::runs::Agents::with_builtin(),
        }
    }

    /// Applies the registered handlers and customisations to a bus builder.
    pub(crate) fn apply(&self, mut builder: MessageBusBuilder) -> MessageBusBuilder {
        builder = builder.registry(&self.registry);
        for hook in &self.bus_hooks {
            builder = hook(builder);
        }
        builder
    }
}
