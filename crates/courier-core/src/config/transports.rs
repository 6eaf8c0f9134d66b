//! The connected transports of a configuration: the bus and the worker built over them.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{Config, ConfigError};
use crate::{
    BusLink, FactoryContext, MessageBus, MessageBusBuilder, MessageRegistry, Transport,
    TransportError, TransportRegistry, Worker, WorkerBuilder,
};

impl Config {
    /// Connects every transport through `factories`.
    ///
    /// # Errors
    /// The first transport that fails to build, named.
    pub async fn connect(
        &self,
        factories: &TransportRegistry,
        messages: Arc<MessageRegistry>,
    ) -> Result<Transports, TransportError> {
        let link = BusLink::new();
        let mut map = BTreeMap::new();
        for (name, t) in &self.transports {
            let dsn = self.effective_dsn(name).unwrap_or_else(|| t.dsn.clone());
            let ctx = FactoryContext::new(name.clone(), dsn)
                .registry(messages.clone())
                .bus(link.clone())
                .retry(Arc::new(t.retry.strategy()))
                .failure_transport(self.failure_transport_of(name).map(str::to_owned));
            map.insert(name.clone(), factories.create(ctx).await?);
        }
        Ok(Transports {
            config: self.clone(),
            transports: map,
            link,
            messages,
        })
    }
}

/// The connected transports of a [`Config`], ready to build a bus and a worker.
#[derive(Debug, Clone)]
pub struct Transports {
    config: Config,
    transports: BTreeMap<String, Arc<dyn Transport>>,
    link: BusLink,
    messages: Arc<MessageRegistry>,
}

impl Transports {
    /// The configuration the transports were connected from.
    #[must_use]
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The registry every transport was built with.
    #[must_use]
    pub fn messages(&self) -> &Arc<MessageRegistry> {
        &self.messages
    }

    /// A transport by name.
    #[must_use]
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Transport>> {
        self.transports.get(name)
    }

    /// Every transport, by name.
    #[must_use]
    pub fn all(&self) -> &BTreeMap<String, Arc<dyn Transport>> {
        &self.transports
    }

    /// The message count of every transport by name (`None` where the transport cannot count):
    /// the shape of `courier stats --format json`. `names` selects some (all when empty).
    ///
    /// # Errors
    /// The first count that failed.
    pub async fn message_counts(
        &self,
        names: &[String],
    ) -> Result<BTreeMap<String, Option<u64>>, TransportError> {
        let mut counts = BTreeMap::new();
        for (name, transport) in &self.transports {
            if !names.is_empty() && !names.contains(name) {
                continue;
            }
            let count = match transport.as_message_count() {
                Some(c) => Some(c.message_count().await?),
                None => None,
            };
            counts.insert(name.clone(), count);
        }
        Ok(counts)
    }

    /// A bus builder with every transport, the routing, the link `sync://` transports need and
    /// the registry the transports decode with (the same one, see
    /// [`MessageBusBuilder::messages`]); add handlers and build.
    #[must_use]
    pub fn bus_builder(&self) -> MessageBusBuilder {
        let mut builder = MessageBus::builder()
            .router(self.config.router())
            .messages(self.messages.clone())
            .link(self.link.clone());
        for (name, t) in &self.transports {
            builder = builder.transport(name.clone(), t.clone());
        }
        if let Some(signing) = &self.config.signing {
            builder = builder.signing(signing.signing().clone());
        }
        // Validated when the configuration was parsed.
        if let Ok(Some(keys)) = self.config.limits.keys() {
            builder = builder.middleware(keys);
        }
        builder
    }

    /// A worker consuming `receivers` (all transports when empty) with each one's retry strategy,
    /// failure transport, handler timeout, rate limit and pause flag (see
    /// [`Transports::worker_on`]).
    ///
    /// # Errors
    /// [`ConfigError`] naming an unknown transport or a bad `rate_limit`.
    pub fn worker(
        &self,
        bus: MessageBus,
        receivers: &[String],
    ) -> Result<WorkerBuilder, ConfigError> {
        let mut chosen = Vec::new();
        for name in self.receiver_names(receivers) {
            let transport = self.transports.get(&name).ok_or_else(|| {
                ConfigError::new(format!(
                    "unknown transport `{name}` (configured: {})",
                    self.transports
                        .keys()
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })?;
            chosen.push((name, transport.clone()));
        }
        self.worker_on(bus, chosen)
    }

    /// The transports a worker consumes for `receivers`: those, or, when empty, every transport
    /// that is no transport's failure transport.
    #[must_use]
    pub fn receiver_names(&self, receivers: &[String]) -> Vec<String> {
        if !receivers.is_empty() {
            return receivers.to_vec();
        }
        let failure: Vec<&str> = self
            .config
            .transports
            .keys()
            .filter_map(|n| self.config.failure_transport_of(n))
            .collect();
        self.transports
            .keys()
            .filter(|n| !failure.contains(&n.as_str()))
            .cloned()
            .collect()
    }

    /// A worker consuming these receivers in order, each `(transport name, transport)` with the
    /// named transport's retry strategy, failure transport and `handler_timeout`. The transport
    /// may be a view of the named one (one of its queues: [`Queues`](crate::Queues)).
    ///
    /// Each receiver is gated as `courier consume` gates it: one with a `rate_limit` fetches
    /// only what its bucket grants ([`RateLimitGate`](crate::RateLimitGate)), and one that can
    /// be paused fetches nothing while `courier pause` says so
    /// ([`PauseGate`](crate::PauseGate), outside the rate limit: a paused queue spends no
    /// tokens). Do not hand it receivers gated already.
    ///
    /// # Errors
    /// [`ConfigError`] naming a bad `rate_limit` (one [`Config::validate`] let through: the
    /// configuration was changed after it was parsed).
    pub fn worker_on(
        &self,
        bus: MessageBus,
        receivers: Vec<(String, Arc<dyn Transport>)>,
    ) -> Result<WorkerBuilder, ConfigError> {
        let mut builder = Worker::builder(bus);
        for (name, transport) in receivers {
            let config = self.config.transports.get(&name);
            let retry = config.map(|t| t.retry.strategy()).unwrap_or_default();
            let transport = match config.and_then(|t| t.rate_limit.as_ref()) {
                Some(limit) => crate::RateLimitGate::wrap(transport, limit.rate_limit(&name)?),
                None => transport,
            };
            // The gate's watcher ends with the gate, when the worker is dropped.
            let transport = crate::PauseGate::wrap(
                transport.clone(),
                tokio_util::sync::CancellationToken::new(),
            )
            .unwrap_or(transport);
            builder = builder
                .receiver(name.clone(), transport)
                .retry_strategy(Arc::new(retry))
                .handler_timeout(config.and_then(|t| t.handler_timeout));
            if let Some(f) = self.config.failure_transport_of(&name)
                && let Some(ft) = self.transports.get(f)
            {
                builder = builder.failure_transport(f.to_owned(), ft.clone());
            }
        }
        Ok(builder)
    }
}
