//! Building transports from DSNs: each transport crate registers a factory for its schemes.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;

use super::{InMemoryOptions, InMemoryTransport, SyncTransport, Transport};
use crate::retry::{MultiplierRetryStrategy, RetryStrategy};
use crate::{BusLink, Dsn, MessageRegistry, TransportError, TransportErrorKind};

/// What a factory gets to build one transport.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct FactoryContext {
    /// The transport's name (the key in `[transports.NAME]`).
    pub name: String,
    /// Its DSN, with config `options` merged into the query.
    pub dsn: Dsn,
    /// The messages the application knows, for decoding.
    pub registry: Arc<MessageRegistry>,
    /// The bus, once built (for in-process transports).
    pub bus: BusLink,
    /// The transport's retry strategy (used in-process by `sync://`).
    pub retry: Arc<dyn RetryStrategy>,
    /// The failure transport's name, if any (used in-process by `sync://`).
    pub failure_transport: Option<String>,
}

impl FactoryContext {
    /// A context with defaults: empty registry, unbound bus, default retry strategy.
    #[must_use]
    pub fn new(name: impl Into<String>, dsn: Dsn) -> Self {
        Self {
            name: name.into(),
            dsn,
            registry: Arc::new(MessageRegistry::new()),
            bus: BusLink::new(),
            retry: Arc::new(MultiplierRetryStrategy::default()),
            failure_transport: None,
        }
    }

    /// Sets the registry.
    #[must_use]
    pub fn registry(mut self, registry: Arc<MessageRegistry>) -> Self {
        self.registry = registry;
        self
    }

    /// Sets the bus link.
    #[must_use]
    pub fn bus(mut self, bus: BusLink) -> Self {
        self.bus = bus;
        self
    }

    /// Sets the retry strategy.
    #[must_use]
    pub fn retry(mut self, retry: Arc<dyn RetryStrategy>) -> Self {
        self.retry = retry;
        self
    }

    /// Sets the failure transport's name.
    #[must_use]
    pub fn failure_transport(mut self, name: Option<String>) -> Self {
        self.failure_transport = name;
        self
    }

    /// A configuration error about this transport's DSN.
    #[must_use]
    pub fn config_error(&self, reason: impl Into<String>) -> TransportError {
        TransportError::new(TransportErrorKind::Config, self.name.clone()).with_context(format!(
            "DSN `{}`: {}",
            self.dsn,
            reason.into()
        ))
    }
}

/// Builds transports for some DSN schemes.
#[async_trait]
pub trait TransportFactory: Send + Sync {
    /// The schemes handled, e.g. `&["postgres", "postgresql"]`.
    fn schemes(&self) -> &'static [&'static str];
    /// Builds (and connects) a transport.
    async fn create(&self, ctx: FactoryContext) -> Result<Arc<dyn Transport>, TransportError>;
}

const _: () = {
    fn _obj_safe(_: &dyn TransportFactory) {}
};

/// The factories known to an application, by scheme.
///
/// ```
/// use courier_core::{Dsn, FactoryContext, TransportRegistry};
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let registry = TransportRegistry::new(); // sync:// and in-memory://
/// let transport = registry.create(FactoryContext::new("test", Dsn::parse("in-memory://")?)).await?;
/// assert!(transport.capabilities().delay);
/// let err = registry.create(FactoryContext::new("x", Dsn::parse("nats://localhost")?)).await.unwrap_err();
/// assert!(err.to_string().contains("unknown scheme `nats`"));
/// # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
/// ```
#[derive(Clone)]
pub struct TransportRegistry {
    factories: BTreeMap<&'static str, Arc<dyn TransportFactory>>,
}

impl std::fmt::Debug for TransportRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransportRegistry")
            .field("schemes", &self.factories.keys())
            .finish()
    }
}

impl Default for TransportRegistry {
    fn default() -> Self {
        Self::new()
    }
}

impl TransportRegistry {
    /// A registry with `sync://` and `in-memory://`.
    #[must_use]
    pub fn new() -> Self {
        let mut r = Self {
            factories: BTreeMap::new(),
        };
        r.register(Arc::new(SyncFactory));
        r.register(Arc::new(InMemoryFactory));
        r
    }

    /// Registers a factory for its schemes (replacing earlier ones).
    pub fn register(&mut self, factory: Arc<dyn TransportFactory>) -> &mut Self {
        for scheme in factory.schemes() {
            self.factories.insert(scheme, Arc::clone(&factory));
        }
        self
    }

    /// Builder form of [`TransportRegistry::register`].
    #[must_use]
    pub fn with(mut self, factory: Arc<dyn TransportFactory>) -> Self {
        self.register(factory);
        self
    }

    /// The known schemes.
    pub fn schemes(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.factories.keys().copied()
    }

    /// Builds the transport for `ctx.dsn`.
    ///
    /// # Errors
    /// A [`TransportErrorKind::Config`] error naming an unknown scheme, or the factory's error.
    pub async fn create(&self, ctx: FactoryContext) -> Result<Arc<dyn Transport>, TransportError> {
        match self.factories.get(ctx.dsn.scheme()) {
            Some(f) => f.create(ctx).await,
            None => {
                let known: Vec<&str> = self.schemes().collect();
                Err(ctx.config_error(format!(
                    "unknown scheme `{}` (known: {}; is the crate feature enabled?)",
                    ctx.dsn.scheme(),
                    known.join(", ")
                )))
            }
        }
    }
}

struct SyncFactory;

#[async_trait]
impl TransportFactory for SyncFactory {
    fn schemes(&self) -> &'static [&'static str] {
        &["sync"]
    }

    async fn create(&self, ctx: FactoryContext) -> Result<Arc<dyn Transport>, TransportError> {
        ctx.dsn
            .check_options(&[])
            .map_err(|e| ctx.config_error(e.reason))?;
        Ok(Arc::new(
            SyncTransport::new(ctx.name.clone(), ctx.bus.clone())
                .retry_strategy(ctx.retry.clone())
                .failure_transport(ctx.failure_transport.clone()),
        ))
    }
}

struct InMemoryFactory;

#[async_trait]
impl TransportFactory for InMemoryFactory {
    fn schemes(&self) -> &'static [&'static str] {
        &["in-memory"]
    }

    async fn create(&self, ctx: FactoryContext) -> Result<Arc<dyn Transport>, TransportError> {
        let dsn = &ctx.dsn;
        dsn.check_options(&["redeliver_timeout", "serialize", "serializer"])
            .map_err(|e| ctx.config_error(e.reason))?;
        let mut options = InMemoryOptions::default().name(ctx.name.clone());
        if let Some(t) = dsn
            .duration_option("redeliver_timeout")
            .map_err(|e| ctx.config_error(e.reason))?
        {
            options = options.redeliver_timeout(t);
        }
        if let Some(s) = dsn
            .parse_option::<bool>("serialize")
            .map_err(|e| ctx.config_error(e.reason))?
        {
            options = options.serialize(s);
        }
        if let Some(s) = dsn
            .parse_option::<crate::Serializer>("serializer")
            .map_err(|e| ctx.config_error(e.reason))?
        {
            // A body serializer only means something when messages are encoded.
            options = options.serialize(true).serializer(s);
        }
        Ok(Arc::new(InMemoryTransport::with_options(
            options,
            ctx.registry.clone(),
        )))
    }
}
