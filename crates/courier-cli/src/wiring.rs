//! What the commands use of an [`App`](crate::App): its handlers and bus customisations, its
//! messages, its transport factories and its agents. The app fills a [`Wiring`] and hands it to
//! the commands, which never see the app itself (`app -> dispatch -> commands -> wiring`).
//! With `runs`, the agents ([`Agents`]) and the runs messages the context registers: below
//! `runs.rs` (the run store and runtime), which builds its runtimes from them.

use std::sync::Arc;

use std::collections::BTreeMap;

use courier_core::{MessageBusBuilder, MessageRegistry, Middleware, TransportRegistry};
#[cfg(feature = "runs")]
use courier_runs::{Agent, RunAgent, RunSignal, ScriptedAgent};

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
    pub(crate) agents: Agents,
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
            agents: Agents::with_builtin(),
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

/// The agents an app registered, by name.
#[cfg(feature = "runs")]
#[derive(Clone, Default)]
pub(crate) struct Agents(Vec<(String, Arc<dyn Agent>)>);

#[cfg(feature = "runs")]
impl Agents {
    /// The built-in `scripted` agent.
    pub(crate) fn with_builtin() -> Self {
        let mut agents = Self::default();
        agents.insert("scripted", Arc::new(ScriptedAgent));
        agents
    }

    /// Adds or replaces an agent.
    pub(crate) fn insert(&mut self, name: &str, agent: Arc<dyn Agent>) {
        self.0.retain(|(n, _)| n != name);
        self.0.push((name.to_owned(), agent));
    }

    /// Whether an agent of that name exists.
    pub(crate) fn contains(&self, name: &str) -> bool {
        self.0.iter().any(|(n, _)| n == name)
    }

    /// The names, for error messages.
    pub(crate) fn names(&self) -> String {
        self.0
            .iter()
            .map(|(n, _)| n.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Each agent with its name, in the order they were added.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, &Arc<dyn Agent>)> {
        self.0.iter().map(|(n, a)| (n.as_str(), a))
    }
}

/// Registers the runs messages for decoding.
#[cfg(feature = "runs")]
pub(crate) fn register_run_messages(registry: &mut MessageRegistry) {
    registry.register::<RunAgent>();
    registry.register::<RunSignal>();
}
