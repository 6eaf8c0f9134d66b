//! [`SqlTransportFactory`]: builds a [`SqlTransport`] from a DSN for the CLI and config files.

use std::sync::Arc;

use courier_core::{FactoryContext, Transport, TransportError, TransportFactory, async_trait};

use crate::{SqlOptions, SqlTransport};

/// Builds [`SqlTransport`]s for the schemes enabled by this crate's features: `sqlite`,
/// `postgres` / `postgresql`, `mysql` / `mariadb`.
///
/// ```
/// use std::sync::Arc;
/// use courier_core::TransportRegistry;
/// use courier_sql::SqlTransportFactory;
///
/// let registry = TransportRegistry::new().with(Arc::new(SqlTransportFactory));
/// assert!(registry.schemes().any(|s| s == "sqlite"));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct SqlTransportFactory;

impl SqlTransportFactory {
    /// The schemes this build handles.
    pub const SCHEMES: &'static [&'static str] = &[
        #[cfg(feature = "sqlite")]
        "sqlite",
        #[cfg(feature = "postgres")]
        "postgres",
        #[cfg(feature = "postgres")]
        "postgresql",
        #[cfg(feature = "mysql")]
        "mysql",
        #[cfg(feature = "mysql")]
        "mariadb",
    ];
}

#[async_trait]
impl TransportFactory for SqlTransportFactory {
    fn schemes(&self) -> &'static [&'static str] {
        Self::SCHEMES
    }

    async fn create(&self, ctx: FactoryContext) -> Result<Arc<dyn Transport>, TransportError> {
        let options = SqlOptions::from_dsn(&ctx.dsn).map_err(|e| ctx.config_error(e.reason))?;
        let transport =
            SqlTransport::connect_with(ctx.name.clone(), &ctx.dsn, options, ctx.registry.clone())
                .await?;
        Ok(Arc::new(transport))
    }
}
