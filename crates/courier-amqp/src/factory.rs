//! [`AmqpTransportFactory`]: builds [`AmqpTransport`]s for `amqp://` and `amqps://` DSNs.

use std::sync::Arc;

use courier_core::{FactoryContext, Transport, TransportError, TransportFactory, async_trait};

use crate::{AmqpOptions, AmqpTransport};

/// Registers the AMQP transport with a
/// [`TransportRegistry`](courier_core::TransportRegistry) for `amqp://` and `amqps://`
/// (`amqps` needs the crate's `tls` feature).
#[derive(Debug, Clone, Copy, Default)]
pub struct AmqpTransportFactory;

#[async_trait]
impl TransportFactory for AmqpTransportFactory {
    fn schemes(&self) -> &'static [&'static str] {
        &["amqp", "amqps"]
    }

    async fn create(&self, ctx: FactoryContext) -> Result<Arc<dyn Transport>, TransportError> {
        let options = AmqpOptions::from_dsn(&ctx.name, &ctx.dsn)
            .map_err(|reason| ctx.config_error(reason))?;
        if ctx.dsn.scheme() == "amqps" && !cfg!(feature = "tls") {
            return Err(ctx.config_error("amqps:// needs courier-amqp's `tls` feature"));
        }
        let transport = AmqpTransport::new(
            ctx.name.clone(),
            ctx.dsn.expose_without_query(),
            options,
            ctx.registry.clone(),
        );
        Ok(Arc::new(transport))
    }
}
