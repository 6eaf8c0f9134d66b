//! [`SymfonyTransportFactory`]: Symfony's Doctrine table or Redis stream from a DSN in the
//! configuration (`symfony+postgres://...`, `symfony+sqlite://...`, `symfony+mysql://...`,
//! `symfony+redis://...`).

use std::sync::Arc;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
use std::time::Duration;

use async_trait::async_trait;
use courier_core::config::{Config, ConfigError};
use courier_core::{Dsn, FactoryContext, Transport, TransportError, TransportFactory, error_chain};

#[cfg(any(
    feature = "postgres",
    feature = "sqlite",
    feature = "mysql",
    feature = "redis"
))]
use crate::SymfonySerializer;
use crate::SymfonyTypes;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
use crate::{DoctrineOptions, DoctrineTransport};

/// The options a `symfony+...` DSN takes in its query, as Symfony's Doctrine transport names
/// them.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
const OPTIONS: &[&str] = &[
    "table_name",
    "queue_name",
    "redeliver_timeout",
    "timezone",
    "auto_setup",
];

/// Builds Symfony-layout transports from DSNs: `DoctrineTransport`s from `symfony+` and the
/// database's URL, with Symfony's Doctrine options in the query (features `postgres`, `sqlite`,
/// `mysql`), and `RedisTransport`s from `symfony+redis://[user:password@]host[:port][/stream[/group[/consumer]]]`
/// with Symfony's Redis options in the query (feature `redis`).
///
/// ```toml
/// [transports.async]
/// dsn = "symfony+postgres://app:secret@db/app?queue_name=default&timezone=Europe/Paris"
///
/// [transports.failed]
/// dsn = "symfony+postgres://app:secret@db/app?queue_name=failed"
///
/// [symfony.types]
/// "App\\Message\\SendEmail" = "mail.send"
/// ```
///
/// Doctrine options (unknown ones are refused, naming the key): `table_name` (default
/// `messenger_messages`), `queue_name` (`default`), `redeliver_timeout` (seconds as PHP writes
/// it, `3600`, or a duration, `1h`), `timezone` (PHP's `date.timezone`, an IANA zone, default
/// `UTC`), `auto_setup` (PHP's booleans: `true`/`false`, `1`/`0`, `on`/`off`, `yes`/`no`;
/// default on). Redis options: see `RedisOptions` (`stream`, `group`,
/// `consumer`, `auto_setup`, `delete_after_ack`, `delete_after_reject`, `stream_max_entries`,
/// `dbindex`, `redeliver_timeout` in seconds, `claim_interval` in milliseconds, `serializer`
/// 1 or 0, `lazy`). Errors and `Debug` never show the password.
///
/// A factory has no access to the configuration, so the PHP class map is the factory's: the
/// application registers `SymfonyTransportFactory::new(SymfonyTypes::from_config(&config)?)`
/// (or [`SymfonyTransportFactory::from_config`]) in its [`TransportRegistry`](courier_core::TransportRegistry),
/// replacing the one without types that `courier::transport_registry()` holds (with which
/// every PHP class keeps its name as the message's type: enough to list, retry and remove
/// failed messages, not to handle them).
///
/// ```
/// use std::sync::Arc;
/// use courier_core::{TransportRegistry, config::Config};
/// use courier_symfony::SymfonyTransportFactory;
///
/// let config: Config = "[symfony.types]\n\"App\\\\Message\\\\SendEmail\" = \"mail.send\"\n".parse()?;
/// let registry = TransportRegistry::new().with(Arc::new(SymfonyTransportFactory::from_config(&config)?));
/// assert!(registry.schemes().any(|s| s.starts_with("symfony+")));
/// # Ok::<(), courier_core::config::ConfigError>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct SymfonyTransportFactory {
    types: SymfonyTypes,
}

impl SymfonyTransportFactory {
    /// The schemes this build handles (by the features `postgres`, `sqlite`, `mysql`, `redis`).
    pub const SCHEMES: &'static [&'static str] = &[
        #[cfg(feature = "postgres")]
        "symfony+postgres",
        #[cfg(feature = "postgres")]
        "symfony+postgresql",
        #[cfg(feature = "sqlite")]
        "symfony+sqlite",
        #[cfg(feature = "mysql")]
        "symfony+mysql",
        #[cfg(feature = "mysql")]
        "symfony+mariadb",
        #[cfg(feature = "redis")]
        "symfony+redis",
        #[cfg(feature = "amqp")]
        "symfony+amqp",
    ];

    /// A factory whose transports map PHP classes with `types`.
    #[must_use]
    pub fn new(types: SymfonyTypes) -> Self {
        Self { types }
    }

    /// A factory with the `[symfony.types]` of `config`.
    ///
    /// # Errors
    /// As [`SymfonyTypes::from_config`].
    pub fn from_config(config: &Config) -> Result<Self, ConfigError> {
        SymfonyTypes::from_config(config).map(Self::new)
    }
}

/// Symfony's Doctrine options from the DSN's query.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
fn options(dsn: &Dsn) -> Result<DoctrineOptions, String> {
    dsn.check_options(OPTIONS).map_err(|e| e.reason)?;
    let mut options = DoctrineOptions::default();
    if let Some(table) = dsn.option("table_name") {
        options = options.table_name(table);
    }
    if let Some(queue) = dsn.option("queue_name") {
        options = options.queue_name(queue);
    }
    if let Some(timeout) = dsn.option("redeliver_timeout") {
        let timeout = match timeout.parse::<u64>() {
            Ok(seconds) => Duration::from_secs(seconds),
            Err(_) => humantime::parse_duration(timeout).map_err(|e| {
                format!("invalid value `{timeout}` for option `redeliver_timeout`: {e}")
            })?,
        };
        options = options.redeliver_timeout(timeout);
    }
    if let Some(zone) = dsn.option("timezone") {
        let zone = zone.parse::<chrono_tz::Tz>().map_err(|_| {
            format!("invalid value `{zone}` for option `timezone` (an IANA zone: Europe/Paris)")
        })?;
        options = options.zone(zone);
    }
    if let Some(on) = dsn.option("auto_setup") {
        // PHP's FILTER_VALIDATE_BOOLEAN.
        let on = match on.to_ascii_lowercase().as_str() {
            "1" | "true" | "on" | "yes" => true,
            "0" | "false" | "off" | "no" | "" => false,
            _ => {
                return Err(format!(
                    "invalid value `{on}` for option `auto_setup` (true or false)"
                ));
            }
        };
        options = options.auto_setup(on);
    }
    Ok(options)
}

/// `err` with every secret of `dsn` replaced by `***` in its text (a driver's error may quote
/// the URL it was given): rebuilt from its text when one shows.
fn scrub(err: TransportError, dsn: &Dsn) -> TransportError {
    let secrets = dsn.secrets();
    if !secrets
        .iter()
        .any(|s| error_chain(&err).to_string().contains(s))
    {
        return err;
    }
    let mut parts: Vec<String> = err.context().map(str::to_owned).into_iter().collect();
    let mut source = std::error::Error::source(&err);
    while let Some(cause) = source {
        parts.push(cause.to_string());
        source = cause.source();
    }
    let scrubbed = secrets
        .iter()
        .fold(parts.join(": "), |text, secret| text.replace(secret, "***"));
    TransportError::new(err.kind(), err.transport().to_owned()).with_context(scrubbed)
}

#[async_trait]
impl TransportFactory for SymfonyTransportFactory {
    fn schemes(&self) -> &'static [&'static str] {
        Self::SCHEMES
    }

    async fn create(&self, ctx: FactoryContext) -> Result<Arc<dyn Transport>, TransportError> {
        #[cfg(feature = "amqp")]
        if ctx.dsn.scheme() == "symfony+amqp" {
            return crate::amqp::create(&ctx, &self.types)
                .await
                .map_err(|e| scrub(e, &ctx.dsn));
        }
        #[cfg(feature = "redis")]
        if ctx.dsn.scheme() == "symfony+redis" {
            let (options, server) =
                crate::redis::from_dsn(&ctx.dsn).map_err(|reason| ctx.config_error(reason))?;
            let transport = crate::RedisTransport::connect_to(
                ctx.name.clone(),
                &server,
                options,
                SymfonySerializer::new(self.types.clone()),
                ctx.registry.clone(),
            )
            .await
            .map_err(|e| scrub(e, &ctx.dsn))?;
            return Ok(Arc::new(transport));
        }
        self.create_doctrine(ctx).await
    }
}

impl SymfonyTransportFactory {
    #[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
    async fn create_doctrine(
        &self,
        ctx: FactoryContext,
    ) -> Result<Arc<dyn Transport>, TransportError> {
        let options = options(&ctx.dsn).map_err(|reason| ctx.config_error(reason))?;
        // The database's URL: the DSN after `symfony+`, without the options (Courier's).
        let exposed = ctx.dsn.expose_without_query();
        let url = exposed
            .split_once('+')
            .map_or(exposed, |(_, url)| url)
            .replacen("postgresql:", "postgres:", 1)
            .replacen("mariadb:", "mysql:", 1);
        let serializer = SymfonySerializer::new(self.types.clone());
        let transport = DoctrineTransport::connect(
            ctx.name.clone(),
            &url,
            options,
            serializer,
            ctx.registry.clone(),
        )
        .await
        .map_err(|e| scrub(e, &ctx.dsn))?;
        Ok(Arc::new(transport))
    }
}

#[cfg(not(any(feature = "postgres", feature = "sqlite", feature = "mysql")))]
impl SymfonyTransportFactory {
    #[allow(clippy::unused_async, reason = "the twin of the `sql` build's")]
    async fn create_doctrine(
        &self,
        ctx: FactoryContext,
    ) -> Result<Arc<dyn Transport>, TransportError> {
        Err(ctx.config_error(format!(
            "scheme `{}` needs courier-symfony's features `postgres`, `sqlite` or `mysql`",
            ctx.dsn.scheme()
        )))
    }
}

#[cfg(all(test, any(feature = "postgres", feature = "sqlite", feature = "mysql")))]
mod tests {
    use super::*;

    fn dsn(raw: &str) -> Dsn {
        Dsn::parse(raw).expect("dsn")
    }

    #[test]
    fn options_come_from_the_query_with_symfonys_names() {
        let o = options(&dsn(
            "symfony+sqlite:///tmp/x.db?table_name=mm&queue_name=q&redeliver_timeout=600&timezone=Europe/Paris&auto_setup=false",
        ))
        .expect("options");
        assert_eq!(
            o,
            DoctrineOptions::default()
                .table_name("mm")
                .queue_name("q")
                .redeliver_timeout(Duration::from_secs(600))
                .zone(chrono_tz::Europe::Paris)
                .auto_setup(false)
        );
        let o = options(&dsn(
            "symfony+sqlite:///tmp/x.db?redeliver_timeout=2m&auto_setup=on",
        ))
        .expect("options");
        assert_eq!(o.redeliver_timeout, Duration::from_secs(120));
        assert!(o.auto_setup);
        assert_eq!(
            options(&dsn("symfony+sqlite:///tmp/x.db")).expect("defaults"),
            DoctrineOptions::default()
        );
    }

    #[test]
    fn a_bad_option_is_named() {
        let err = options(&dsn("symfony+sqlite:///x.db?queue=q")).expect_err("unknown");
        assert!(err.contains("unknown option `queue`"), "{err}");
        let err = options(&dsn("symfony+sqlite:///x.db?timezone=Mars/Base")).expect_err("zone");
        assert!(
            err.contains("`timezone`") && err.contains("Mars/Base"),
            "{err}"
        );
        let err = options(&dsn("symfony+sqlite:///x.db?auto_setup=maybe")).expect_err("bool");
        assert!(err.contains("`auto_setup`"), "{err}");
        let err = options(&dsn("symfony+sqlite:///x.db?redeliver_timeout=soon")).expect_err("t");
        assert!(err.contains("`redeliver_timeout`"), "{err}");
    }
}
