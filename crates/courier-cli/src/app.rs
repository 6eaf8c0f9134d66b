//! [`App`]: the `courier` command line with an application's own handlers, agents and transports.

use std::ffi::OsString;
use std::process::ExitCode;
use std::sync::Arc;

use courier_core::{
    Envelope, Handler, HandlerError, Message, MessageBusBuilder, TransportFactory, async_trait,
};

use crate::wiring::Wiring;

/// The `courier` command line, configured with an application's handlers, agents and transports.
///
/// Build your own binary with it and every command (`consume`, `failed`, `runs`, ...) knows your
/// messages:
///
/// ```no_run
/// use courier_core::{HandlerError, Message};
/// use serde::{Deserialize, Serialize};
/// use std::sync::Arc;
///
/// #[derive(Serialize, Deserialize)]
/// struct Welcome { user: String }
/// impl Message for Welcome { const NAME: &'static str = "mail.welcome"; }
///
/// fn main() -> std::process::ExitCode {
///     courier_cli::App::new()
///         .handler_fn("send_welcome", |m: Arc<Welcome>| async move {
///             println!("welcome, {}", m.user);
///             Ok::<(), HandlerError>(())
///         })
///         .run()
/// }
/// ```
#[must_use]
#[derive(Debug)]
pub struct App {
    /// What the commands use: the app only fills it.
    wiring: Wiring,
}

impl Default for App {
    fn default() -> Self {
        Self::new()
    }
}

impl App {
    /// The command line with the transports of the enabled features (`sql`, `redis`, `amqp`, `nats`),
    /// and, with `runs`, the built-in `scripted` agent.
    pub fn new() -> Self {
        Self {
            wiring: Wiring::new(),
        }
    }

    /// Registers a handler for `M` (named after its Rust type).
    pub fn handler<M: Message, H: Handler<M>>(self, handler: H) -> Self {
        let name = std::any::type_name::<H>();
        self.handler_named::<M, H>(name, handler)
    }

    /// Registers a named handler for `M`; the name goes into `HandledStamp`.
    pub fn handler_named<M: Message, H: Handler<M>>(self, name: &str, handler: H) -> Self {
        self.handler_with::<M, H>(courier_core::HandlerOptions::new(name), handler)
    }

    /// Registers a handler for `M` with its options: name, the transport it handles messages
    /// from, priority (see [`HandlerOptions`](courier_core::HandlerOptions)).
    pub fn handler_with<M: Message, H: Handler<M>>(
        mut self,
        options: courier_core::HandlerOptions,
        handler: H,
    ) -> Self {
        let shared = Shared(Arc::new(handler));
        self.wiring.registry.register::<M>();
        self.wiring
            .bus_hooks
            .push(Arc::new(move |b: MessageBusBuilder| {
                b.handler_with::<M, _>(options.clone(), shared.clone())
            }));
        self
    }

    /// Registers a middleware under `name`, for the buses whose `[buses.NAME] middleware` list
    /// names it (in that list's order).
    pub fn middleware(mut self, name: &str, middleware: impl courier_core::Middleware) -> Self {
        self.wiring
            .middleware
            .insert(name.to_owned(), Arc::new(middleware));
        self
    }

    /// Registers a closure handler for `M`.
    pub fn handler_fn<M, F, Fut>(self, name: &str, f: F) -> Self
    where
        M: Message,
        F: Fn(Arc<M>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
    {
        self.handler_named::<M, _>(name, FnAdapter(f))
    }

    /// Registers a message type without a handler, so transports can decode it.
    pub fn message<M: Message>(mut self) -> Self {
        self.wiring.registry.register::<M>();
        self
    }

    /// Adds a transport factory for more DSN schemes.
    pub fn transport_factory(mut self, factory: Arc<dyn TransportFactory>) -> Self {
        self.wiring.factories.register(factory);
        self
    }

    /// Adds a bus customisation (middleware, routes) applied whenever the CLI builds the bus.
    pub fn configure_bus(
        mut self,
        f: impl Fn(MessageBusBuilder) -> MessageBusBuilder + Send + Sync + 'static,
    ) -> Self {
        self.wiring.bus_hooks.push(Arc::new(f));
        self
    }

    /// Adds a customisation of the relay's options, applied whenever `courier relay` builds
    /// them from its flags (e.g. a fault-injection probe,
    /// [`RelayOptions::on_point`](courier_core::relay::RelayOptions::on_point), in a crash
    /// test's own binary).
    pub fn configure_relay(
        mut self,
        f: impl Fn(courier_core::relay::RelayOptions) -> courier_core::relay::RelayOptions
        + Send
        + Sync
        + 'static,
    ) -> Self {
        self.wiring.relay_hooks.push(Arc::new(f));
        self
    }

    /// Registers an agent that `runs submit NAME` and the run worker can execute.
    #[cfg(feature = "runs")]
    pub fn agent(mut self, name: &str, agent: impl courier_runs::Agent + 'static) -> Self {
        self.wiring.agents.insert(name, Arc::new(agent));
        self
    }

    /// Parses the process's arguments and runs the command.
    pub fn run(self) -> ExitCode {
        self.run_from(std::env::args_os())
    }

    /// Parses `args` (the first is the program name) and runs the command; returns the exit
    /// code: 0 ok, 1 runtime failure, 2 usage or configuration error.
    pub fn run_from<I, T>(self, args: I) -> ExitCode
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        ExitCode::from(crate::dispatch::run(self.wiring, args))
    }
}

/// A handler shared between the buses the CLI builds.
struct Shared<H>(Arc<H>);

impl<H> Clone for Shared<H> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

#[async_trait]
impl<M: Message, H: Handler<M>> Handler<M> for Shared<H> {
    async fn handle(&self, message: &M, envelope: &Envelope) -> Result<(), HandlerError> {
        self.0.handle(message, envelope).await
    }
}

struct FnAdapter<F>(F);

#[async_trait]
impl<M, F, Fut> Handler<M> for FnAdapter<F>
where
    M: Message,
    F: Fn(Arc<M>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    async fn handle(&self, _message: &M, envelope: &Envelope) -> Result<(), HandlerError> {
        match envelope.message_arc::<M>() {
            Some(m) => (self.0)(m).await,
            None => Err(HandlerError::unrecoverable(format!(
                "not a `{}` message",
                M::NAME
            ))),
        }
    }
}
