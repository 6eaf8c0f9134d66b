//! [`RedisTransportFactory`]: builds a [`RedisTransport`] for `redis://` and `rediss://` DSNs.

use std::sync::Arc;

use courier_core::{FactoryContext, Transport, TransportError, TransportFactory, async_trait};

use crate::{RedisOptions, RedisTransport};

/// Builds [`RedisTransport`]s from DSNs such as
/// `redis://:password@127.0.0.1:6379/0?stream=emails&redeliver_timeout=10min`; register it with
/// `TransportRegistry::register`.
#[derive(Debug, Clone, Copy, Default)]
pub struct RedisTransportFactory;

#[async_trait]
impl TransportFactory for RedisTransportFactory {
    fn schemes(&self) -> &'static [&'static str] {
        &["redis", "rediss"]
    }

    async fn create(&self, ctx: FactoryContext) -> Result<Arc<dyn Transport>, TransportError> {
        if ctx.dsn.scheme() == "rediss" && !cfg!(feature = "tls") {
            return Err(ctx.config_error("`rediss://` needs the `tls` feature of courier-redis"));
        }
        let options = RedisOptions::default()
            .name(ctx.name.clone())
            .from_dsn(&ctx.dsn)
            .map_err(|e| ctx.config_error(e))?;
        let transport = RedisTransport::connect(
            ctx.dsn.expose_without_query(),
            options,
            ctx.registry.clone(),
        )
        .await?;
        Ok(Arc::new(transport))
    }
}
