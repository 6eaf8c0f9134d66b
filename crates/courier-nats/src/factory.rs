//! [`NatsTransportFactory`]: builds [`NatsTransport`]s for `nats://` DSNs.

use std::sync::Arc;

use courier_core::{FactoryContext, Transport, TransportError, TransportFactory, async_trait};

use crate::{NatsOptions, NatsTransport};

/// Registers the NATS JetStream transport with a
/// [`TransportRegistry`](courier_core::TransportRegistry) for `nats://`.
#[derive(Debug, Clone, Copy, Default)]
pub struct NatsTransportFactory;

#[async_trait]
impl TransportFactory for NatsTransportFactory {
    fn schemes(&self) -> &'static [&'static str] {
        &["nats"]
    }

    async fn create(&self, ctx: FactoryContext) -> Result<Arc<dyn Transport>, TransportError> {
        let options = NatsOptions::from_dsn(&ctx.name, &ctx.dsn)
            .map_err(|reason| ctx.config_error(reason))?;
        let transport =
            NatsTransport::new(ctx.name.clone(), &ctx.dsn, options, ctx.registry.clone())?;
        Ok(Arc::new(transport))
    }
}

#[cfg(test)]
mod tests {
    use courier_core::{Dsn, TransportErrorKind};

    use super::*;

    async fn create(dsn: &str) -> Result<Arc<dyn Transport>, TransportError> {
        let dsn = Dsn::parse(dsn)
            .map_err(|e| TransportError::new(TransportErrorKind::Config, "t").with_source(e))?;
        NatsTransportFactory
            .create(FactoryContext::new("async", dsn))
            .await
    }

    #[tokio::test]
    async fn a_bad_dsn_is_a_config_error_that_shows_no_secret() {
        for dsn in [
            "nats://app:hunter2@localhost/a.b",
            "nats://app:hunter2@localhost?colour=red",
            "nats://localhost/ok?token=hunter2&subject=a..b",
            "nats://hunter2@localhost/ok",
        ] {
            let e = create(dsn).await.err().map(|e| {
                let mut shown = format!("{e} {e:?}");
                let mut cur = std::error::Error::source(&e);
                while let Some(c) = cur {
                    shown.push_str(&c.to_string());
                    cur = c.source();
                }
                (e.kind(), shown)
            });
            let Some((kind, shown)) = e else {
                panic!("{dsn} was accepted")
            };
            assert_eq!(kind, TransportErrorKind::Config, "{dsn}: {shown}");
            assert!(!shown.contains("hunter2"), "{dsn}: {shown}");
        }
    }

    #[tokio::test]
    async fn a_good_dsn_builds_a_transport_without_connecting_and_debug_shows_no_password() {
        let t = create("nats://app:hunter2@127.0.0.1:1/orders?ack_wait=5s")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let shown = format!("{t:?}");
        assert!(shown.contains("orders"), "{shown}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert_eq!(
            t.capabilities().redeliver_after,
            Some(std::time::Duration::from_secs(5))
        );
        assert!(t.capabilities().delay);
    }
}
