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
    pub const SCHEMES: &'static [&'static str] = crate::connect::SCHEMES;
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

/// Builds [`SqlTransport`]s on pools handed over in code, for a configuration file: a transport
/// whose DSN is `pool://NAME?queue_name=...` runs on the pool registered as `NAME`
/// ([`SqlTransport::from_pool`]), with the Courier options of the DSN's query (`table_name`,
/// `queue_name`, `auto_setup`, `listen`, ...). Register it with
/// `courier_cli::App::transport_factory` so that a TOML-configured worker shares the
/// application's pool.
///
/// ```
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use courier_core::{MessageRegistry, TransportRegistry, config::Config};
/// use courier_sql::SqlPoolFactory;
///
/// let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// let factories =
///     TransportRegistry::new().with(Arc::new(SqlPoolFactory::new().pool("main", pool)));
/// let config: Config = "[transports.async]\ndsn = \"pool://main?queue_name=emails\"\n".parse()?;
/// let transports = config.connect(&factories, Arc::new(MessageRegistry::new())).await?;
/// assert!(transports.get("async").is_some());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct SqlPoolFactory {
    pools: std::collections::BTreeMap<String, crate::SqlPool>,
}

impl SqlPoolFactory {
    /// The scheme it handles.
    pub const SCHEMES: &'static [&'static str] = &["pool"];

    /// No pool yet.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `pool` as `pool://NAME` (replacing one of the same name).
    #[must_use]
    pub fn pool(mut self, name: impl Into<String>, pool: impl Into<crate::SqlPool>) -> Self {
        self.pools.insert(name.into(), pool.into());
        self
    }
}

#[async_trait]
impl TransportFactory for SqlPoolFactory {
    fn schemes(&self) -> &'static [&'static str] {
        Self::SCHEMES
    }

    async fn create(&self, ctx: FactoryContext) -> Result<Arc<dyn Transport>, TransportError> {
        ctx.dsn
            .check_options(crate::options::COURIER_OPTIONS)
            .map_err(|e| ctx.config_error(e.reason))?;
        let name = ctx.dsn.host().unwrap_or_default();
        let Some(pool) = self.pools.get(name) else {
            let known: Vec<&str> = self.pools.keys().map(String::as_str).collect();
            return Err(ctx.config_error(format!(
                "no pool `{name}` was handed over in code (registered: {})",
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                }
            )));
        };
        let options = SqlOptions::from_dsn(&ctx.dsn).map_err(|e| ctx.config_error(e.reason))?;
        let transport = SqlTransport::from_pool(
            ctx.name.clone(),
            pool.clone(),
            options,
            ctx.registry.clone(),
        )
        .await?;
        Ok(Arc::new(transport))
    }
}
