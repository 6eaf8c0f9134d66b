//! [`MessageBusBuilder`]: handlers, middleware, transports and routes, built into a
//! [`MessageBus`].

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use super::handler::{ErasedHandler, FnHandler, HandlerEntry, Typed};
use super::middleware::{Prelude, Terminal};
use super::{
    BatchHandler, BatchOptions, BusInner, BusLink, DEFAULT_BUS, Dispatcher, Handler,
    HandlerOptions, MessageBus, Middleware, QueryHandler, Router, SendHook, Sending, batch, dedup,
    query,
};
use crate::{HandlerError, Message, MessageRegistry, Transport};

/// Builds a [`MessageBus`].
#[derive(Default)]
pub struct MessageBusBuilder {
    name: Option<String>,
    middleware: Vec<Arc<dyn Middleware>>,
    handlers: HashMap<String, Vec<HandlerEntry>>,
    transports: HashMap<String, Arc<dyn Transport>>,
    router: Router,
    registry: Arc<MessageRegistry>,
    links: Vec<BusLink>,
    dispatchers: Vec<Dispatcher>,
    on_send: Vec<SendHook>,
    allow_no_handlers: bool,
    dedup_store: Option<dedup::Store>,
    signing: Option<crate::Signing>,
    batchers: Vec<Arc<dyn batch::Flush>>,
}

impl MessageBusBuilder {
    /// Names the bus (default [`DEFAULT_BUS`]).
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Adds a hook that sees every message this bus sends to transports, before it is sent,
    /// and may add stamps to it (Messenger's `SendMessageToTransportsEvent`; see [`Sending`]).
    #[must_use]
    pub fn on_send(mut self, hook: impl Fn(&mut Sending<'_>) + Send + Sync + 'static) -> Self {
        self.on_send.push(Arc::new(hook));
        self
    }

    /// Registers a handler for `M`, named after its Rust type.
    #[must_use]
    pub fn handler<M: Message, H: Handler<M>>(self, handler: H) -> Self {
        let name = std::any::type_name::<H>();
        self.handler_named::<M, H>(name, handler)
    }

    /// Registers a named handler for `M`. The name goes into
    /// [`HandledStamp`](crate::HandledStamp): keep it stable across deployments.
    #[must_use]
    pub fn handler_named<M: Message, H: Handler<M>>(
        self,
        name: impl Into<String>,
        handler: H,
    ) -> Self {
        self.handler_with::<M, H>(HandlerOptions::new(name), handler)
    }

    /// Registers a handler for `M` with its options: name, the transport it handles messages
    /// from, priority (see [`HandlerOptions`]).
    #[must_use]
    pub fn handler_with<M: Message, H: Handler<M>>(
        self,
        options: HandlerOptions,
        handler: H,
    ) -> Self {
        self.entry::<M>(options, Arc::new(Typed::<M, H>::new(handler)), None)
    }

    /// Registers a [`BatchHandler`] for `M` with its options (name, transport, priority) and
    /// how it gathers batches (see [`BatchOptions`]).
    ///
    /// ```
    /// use courier_core::{BatchOptions, HandlerError, HandlerOptions, Message, MessageBus};
    /// use serde::{Deserialize, Serialize};
    /// use std::sync::Arc;
    /// use std::time::Duration;
    ///
    /// #[derive(Serialize, Deserialize)]
    /// struct Row { id: u32 }
    /// impl Message for Row { const NAME: &'static str = "app.row"; }
    ///
    /// let bus = MessageBus::builder()
    ///     .batch_handler_fn(
    ///         HandlerOptions::new("bulk_insert"),
    ///         BatchOptions::new(50, Duration::from_secs(1)),
    ///         |rows: Vec<Arc<Row>>| async move {
    ///             rows.iter().map(|_| Ok::<(), HandlerError>(())).collect()
    ///         },
    ///     )
    ///     .build();
    /// assert_eq!(bus.batch_size("app.row"), Some(50));
    /// ```
    #[must_use]
    pub fn batch_handler<M: Message, H: BatchHandler<M>>(
        mut self,
        options: HandlerOptions,
        batch: BatchOptions,
        handler: H,
    ) -> Self {
        let batcher = Arc::new(batch::Batcher::<M, H>::new(handler, batch));
        self.batchers.push(batcher.clone());
        self.entry::<M>(options, batcher, Some(batch.size()))
    }

    /// Registers a closure batch handler for `M`: it gets the batch's messages and returns one
    /// result per message, in order.
    #[must_use]
    pub fn batch_handler_fn<M, F, Fut>(
        self,
        options: HandlerOptions,
        batch: BatchOptions,
        f: F,
    ) -> Self
    where
        M: Message,
        F: Fn(Vec<Arc<M>>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<Result<(), HandlerError>>> + Send + 'static,
    {
        self.batch_handler::<M, batch::FnBatchHandler<F>>(options, batch, batch::FnBatchHandler(f))
    }

    fn entry<M: Message>(
        mut self,
        options: HandlerOptions,
        handler: Arc<dyn ErasedHandler>,
        batch_size: Option<usize>,
    ) -> Self {
        self.know::<M>();
        let HandlerOptions {
            name,
            from_transport,
            priority,
            timeout,
        } = options;
        let entry = HandlerEntry {
            handled: Arc::new(crate::HandledStamp {
                handler: name.clone(),
            }),
            name: Arc::from(name),
            from_transport: from_transport.map(Arc::from),
            priority,
            timeout,
            handler,
            batch_size,
        };
        let entries = self.handlers.entry(M::NAME.to_owned()).or_default();
        // Highest priority first; equal priorities keep their registration order.
        let at = entries.partition_point(|e| e.priority >= priority);
        entries.insert(at, entry);
        self
    }

    /// Registers a [`QueryHandler`] for `M`, named after its Rust type: its answer is what
    /// [`MessageBus::query`] returns.
    #[must_use]
    pub fn query_handler<M: Message, H: QueryHandler<M>>(self, handler: H) -> Self {
        let name = std::any::type_name::<H>();
        self.query_handler_named::<M, H>(name, handler)
    }

    /// Registers a named [`QueryHandler`] for `M`.
    #[must_use]
    pub fn query_handler_named<M: Message, H: QueryHandler<M>>(
        self,
        name: impl Into<String>,
        handler: H,
    ) -> Self {
        self.entry::<M>(
            HandlerOptions::new(name),
            Arc::new(query::QueryTyped::<M, H>::new(handler)),
            None,
        )
    }

    /// Registers a closure query handler for `M`: its `Ok` value is what [`MessageBus::query`]
    /// returns.
    ///
    /// ```
    /// # use courier_core::{HandlerError, Message, MessageBus};
    /// # use std::sync::Arc;
    /// # #[derive(serde::Serialize, serde::Deserialize)] struct Count;
    /// # impl Message for Count { const NAME: &'static str = "app.count"; }
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let bus = MessageBus::builder()
    ///     .query_fn("count", |_: Arc<Count>| async { Ok::<_, HandlerError>(3_u64) })
    ///     .build();
    /// assert_eq!(bus.query::<u64>(Count).await?, 3);
    /// # Ok::<(), courier_core::BusError>(()) }).unwrap();
    /// ```
    #[must_use]
    pub fn query_fn<M, F, Fut, R>(self, name: impl Into<String>, f: F) -> Self
    where
        M: Message,
        F: Fn(Arc<M>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, HandlerError>> + Send + 'static,
        R: Send + 'static,
    {
        self.query_handler_named::<M, query::FnQueryHandler<F, R>>(
            name,
            query::FnQueryHandler(f, std::marker::PhantomData),
        )
    }

    /// Registers a closure handler for `M` with its options (see [`HandlerOptions`]).
    #[must_use]
    pub fn handler_fn_with<M, F, Fut>(self, options: HandlerOptions, f: F) -> Self
    where
        M: Message,
        F: Fn(Arc<M>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
    {
        self.handler_with::<M, FnHandler<F>>(options, FnHandler(f))
    }

    /// Whether a message with no handler (none registered, or none for the transport it came
    /// from) is handled successfully by doing nothing, instead of failing with
    /// [`BusError::NoHandler`](crate::BusError::NoHandler) (Messenger's `allow_no_handlers`; default false).
    #[must_use]
    pub fn allow_no_handlers(mut self, allow: bool) -> Self {
        self.allow_no_handlers = allow;
        self
    }

    /// Registers a closure handler for `M`.
    #[must_use]
    pub fn handler_fn<M, F, Fut>(self, name: impl Into<String>, f: F) -> Self
    where
        M: Message,
        F: Fn(Arc<M>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
    {
        self.handler_named::<M, FnHandler<F>>(name, FnHandler(f))
    }

    /// Registers a message type without a handler (so transports can decode it).
    #[must_use]
    pub fn message<M: Message>(mut self) -> Self {
        self.know::<M>();
        self
    }

    /// Adds `M` to the bus's registry unless it is there (a shared registry stays shared).
    fn know<M: Message>(&mut self) {
        if !self.registry.contains(M::NAME) {
            Arc::make_mut(&mut self.registry).register::<M>();
        }
    }

    /// Adds every message of a registry (a shared registry that has them all stays shared;
    /// otherwise the bus gets its own copy).
    #[must_use]
    pub fn registry(mut self, registry: &MessageRegistry) -> Self {
        if !self.registry.covers(registry) {
            Arc::make_mut(&mut self.registry).extend(registry);
        }
        self
    }

    /// Makes `messages` the bus's registry: the one the application also hands its transports
    /// (through [`FactoryContext::registry`](crate::FactoryContext::registry)), so the bus and
    /// every transport decode with the same types. Register every message in it before: a
    /// handler for a type it lacks gives the bus a copy the transports do not see.
    #[must_use]
    pub fn messages(mut self, messages: Arc<MessageRegistry>) -> Self {
        self.registry = messages;
        self
    }

    /// Adds a transport the bus can send to.
    #[must_use]
    pub fn transport(mut self, name: impl Into<String>, transport: Arc<dyn Transport>) -> Self {
        self.transports.insert(name.into(), transport);
        self
    }

    /// Adds a [`SyncTransport`](crate::SyncTransport) with default options under `name`.
    #[must_use]
    pub fn sync_transport(self, name: impl Into<String>) -> Self {
        let name = name.into();
        let link = BusLink::new();
        let sync = crate::SyncTransport::new(name.clone(), link.clone());
        self.transport(name, Arc::new(sync)).link(link)
    }

    /// Binds `link` to the bus when it is built.
    #[must_use]
    pub fn link(mut self, link: BusLink) -> Self {
        self.links.push(link);
        self
    }

    /// Fills `dispatcher` with the bus when it is built: from then on the dispatcher holds it.
    #[must_use]
    pub fn dispatcher(mut self, dispatcher: &Dispatcher) -> Self {
        self.dispatchers.push(dispatcher.clone());
        self
    }

    /// Routes `pattern` to transports (see [`Router::route`]).
    #[must_use]
    pub fn route<I, S>(mut self, pattern: &str, transports: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.router = self.router.route(pattern, transports);
        self
    }

    /// Replaces the router.
    #[must_use]
    pub fn router(mut self, router: Router) -> Self {
        self.router = router;
        self
    }

    /// Appends a middleware (after the earlier ones, before send and handle).
    #[must_use]
    pub fn middleware(mut self, middleware: impl Middleware) -> Self {
        self.middleware.push(Arc::new(middleware));
        self
    }

    /// Adds a shared middleware (one instance on several buses).
    #[must_use]
    pub fn middleware_shared(mut self, middleware: Arc<dyn Middleware>) -> Self {
        self.middleware.push(middleware);
        self
    }

    /// The deduplication store for transports without one of their own (AMQP, `sync://`)
    /// and for messages handled here: see [`DeduplicateStamp`](crate::DeduplicateStamp).
    /// Without it, such a transport refuses the stamp with an `Unsupported` error.
    #[must_use]
    pub fn deduplicate_store(mut self, store: Arc<dyn crate::Deduplicate>) -> Self {
        self.dedup_store = Some(store);
        self
    }

    /// Signs outgoing messages and checks received ones (see [`signing`](crate::signing)); the
    /// step runs after every middleware, so the stamps they add are signed.
    #[must_use]
    pub fn signing(mut self, signing: crate::Signing) -> Self {
        self.signing = Some(signing);
        self
    }

    /// Builds the bus, binds its links and fills its dispatchers.
    #[must_use]
    pub fn build(self) -> MessageBus {
        let mut chain: Vec<Arc<dyn Middleware>> = vec![Arc::new(Prelude)];
        chain.extend(self.middleware);
        if let Some(signing) = self.signing {
            chain.push(Arc::new(signing));
        }
        chain.push(Arc::new(dedup::Deduplication));
        chain.push(Arc::new(Terminal));
        let name = self.name.unwrap_or_else(|| DEFAULT_BUS.to_owned());
        let bus = MessageBus {
            inner: Arc::new(BusInner {
                name_stamp: Arc::new(crate::BusNameStamp(name.clone())),
                name,
                chain,
                handlers: self.handlers,
                transports: self.transports,
                router: self.router,
                registry: self.registry,
                on_send: self.on_send,
                allow_no_handlers: self.allow_no_handlers,
                dedup_store: self.dedup_store,
                batchers: self.batchers,
            }),
        };
        for link in &self.links {
            link.bind(&bus);
        }
        for dispatcher in &self.dispatchers {
            dispatcher.fill(&bus);
        }
        bus
    }
}
