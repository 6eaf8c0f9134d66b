//! What every command needs: the configuration (and where it came from), the output format, the
//! connected transports and the bus.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use courier_core::config::{Config, Transports};
use courier_core::{MessageBus, MessageRegistry};
use serde::Serialize;

use crate::cli::{Cli, Format};
use crate::connect::Failure;
use crate::error::{CliError, CliResult, chain, remember_secret};
use crate::wiring::Wiring;

/// The configuration used when there is no `--config`, `COURIER_CONFIG` or `./courier.toml`:
/// SQLite `courier.db` in the working directory.
pub const EMBEDDED_CONFIG: &str = r#"# courier's embedded default: everything in ./courier.db
[transports.async]
dsn = "sqlite://courier.db"
failure_transport = "failed"

[transports.failed]
dsn = "sqlite://courier.db?queue_name=failed"

[routing]
"courier.run_agent" = "async"

[runs]
store = "sqlite://courier.db"
"#;

/// The messages the application knows: its own and the runs message.
fn registry(app: &Wiring) -> MessageRegistry {
    let mut registry = MessageRegistry::new();
    registry.extend(&app.registry);
    #[cfg(feature = "runs")]
    crate::wiring::register_run_messages(&mut registry);
    registry
}

/// Every middleware a `[buses.NAME]` table lists is one the application registered.
fn check_middleware(app: &Wiring, config: &Config) -> CliResult {
    for (bus, table) in &config.buses {
        for name in &table.middleware {
            if !app.middleware.contains_key(name) {
                let known: Vec<&str> = app.middleware.keys().map(String::as_str).collect();
                return Err(CliError::usage(format!(
                    "buses.{bus}.middleware: unknown middleware `{name}` (registered: {})",
                    if known.is_empty() {
                        "none; register one with App::middleware".to_owned()
                    } else {
                        known.join(", ")
                    }
                )));
            }
        }
    }
    Ok(())
}

/// Where the configuration came from.
#[derive(Debug, Clone)]
pub(crate) enum Source {
    /// A file.
    File(PathBuf),
    /// [`EMBEDDED_CONFIG`].
    Embedded,
}

/// The loaded configuration and global flags.
pub(crate) struct Ctx<'a> {
    pub(crate) app: &'a Wiring,
    pub(crate) config: Config,
    pub(crate) source: Source,
    pub(crate) format: Format,
    pub(crate) quiet: bool,
    pub(crate) verbose: u8,
    /// The messages the application knows (its own and the runs message): the one registry
    /// every transport and the bus decode with.
    pub(crate) registry: Arc<MessageRegistry>,
}

impl<'a> Ctx<'a> {
    /// Loads the configuration named by the flags (else `./courier.toml`, else the embedded one).
    pub(crate) fn load(app: &'a Wiring, cli: &Cli) -> CliResult<Self> {
        let (config, source) = match &cli.config {
            Some(path) => (Config::load(path)?, Source::File(path.clone())),
            None if Path::new("courier.toml").is_file() => {
                let path = PathBuf::from("courier.toml");
                (Config::load(&path)?, Source::File(path))
            }
            None => (EMBEDDED_CONFIG.parse::<Config>()?, Source::Embedded),
        };
        for t in config.transports.values() {
            for secret in t.dsn.secrets() {
                remember_secret(secret);
            }
        }
        check_middleware(app, &config)?;
        Ok(Self {
            app,
            config,
            source,
            format: cli.format,
            quiet: cli.quiet,
            verbose: cli.verbose,
            registry: Arc::new(registry(app)),
        })
    }

    /// The same context over another wiring (the app's, with the configured agents).
    #[cfg(feature = "agent")]
    pub(crate) fn with_app<'b>(self, app: &'b Wiring) -> Ctx<'b>
    where
        'a: 'b,
    {
        Ctx {
            app,
            config: self.config,
            source: self.source,
            format: self.format,
            quiet: self.quiet,
            verbose: self.verbose,
            registry: self.registry,
        }
    }

    /// Whether JSON output was asked for.
    pub(crate) fn json(&self) -> bool {
        self.format == Format::Json
    }

    /// The application's transport factories and, with the feature `symfony`, when the
    /// configuration has a `[symfony]` table, the Symfony one with its `[symfony.types]`.
    fn factories(
        &self,
    ) -> Result<
        std::borrow::Cow<'_, courier_core::TransportRegistry>,
        courier_core::config::ConfigError,
    > {
        #[cfg(all(
            feature = "symfony",
            any(
                feature = "sqlite",
                feature = "postgres",
                feature = "mysql",
                feature = "redis",
                feature = "amqp"
            )
        ))]
        if self.config.symfony.is_some() {
            let mut factories = self.app.factories.clone();
            factories.register(Arc::new(
                courier::symfony::SymfonyTransportFactory::from_config(&self.config)?,
            ));
            return Ok(std::borrow::Cow::Owned(factories));
        }
        Ok(std::borrow::Cow::Borrowed(&self.app.factories))
    }

    /// Connects every configured transport.
    pub(crate) async fn connect(&self) -> CliResult<Transports> {
        Ok(self
            .config
            .connect(&*self.factories()?, self.registry.clone())
            .await?)
    }

    /// Connects every configured transport, telling a server that is down (worth retrying:
    /// see [`crate::connect`]) from a transport that cannot work.
    pub(crate) async fn try_connect(&self) -> Result<Transports, Failure> {
        let factories = self.factories().map_err(|e| Failure::Fatal(e.into()))?;
        self.config
            .connect(&factories, self.registry.clone())
            .await
            .map_err(|e| {
                if !e.is_transient() {
                    return Failure::Fatal(e.into());
                }
                let name = e.transport().to_owned();
                let dsn = self
                    .config
                    .effective_dsn(&name)
                    .map(|d| format!(" ({d})"))
                    .unwrap_or_default();
                Failure::Down {
                    what: format!("transport `{name}`{dsn}"),
                    error: chain(&e),
                }
            })
    }

    /// The default bus over `transports` with the application's handlers and the bus's
    /// `[buses.NAME]` middleware, plus `extra`.
    pub(crate) fn bus(
        &self,
        transports: &Transports,
        extra: impl FnOnce(courier_core::MessageBusBuilder) -> courier_core::MessageBusBuilder,
    ) -> MessageBus {
        let name = self.config.default_bus_name().to_owned();
        extra(self.bus_builder(transports, &name)).build()
    }

    /// The declared buses other than the default one (a worker dispatches to the bus a
    /// message's `BusNameStamp` names).
    pub(crate) fn other_buses(&self, transports: &Transports) -> Vec<MessageBus> {
        let default = self.config.default_bus_name();
        self.config
            .buses
            .keys()
            .filter(|name| name.as_str() != default)
            .map(|name| self.bus_builder(transports, name).build())
            .collect()
    }

    /// A bus named `name` over `transports`: the application's handlers, then the middleware
    /// its `[buses.NAME]` table lists.
    fn bus_builder(&self, transports: &Transports, name: &str) -> courier_core::MessageBusBuilder {
        // The bus decodes with the transports' registry (`Ctx::registry`), which already knows
        // every handler's message.
        let mut builder = self.app.apply(transports.bus_builder()).name(name);
        if let Some(bus) = self.config.buses.get(name) {
            builder = builder.allow_no_handlers(bus.allow_no_handlers);
            for m in &bus.middleware {
                if let Some(middleware) = self.app.middleware.get(m) {
                    builder = builder.middleware_shared(middleware.clone());
                }
            }
        }
        builder
    }

    /// Checks that every name is a configured transport.
    pub(crate) fn check_transports(&self, names: &[String]) -> CliResult {
        for name in names {
            if !self.config.transports.contains_key(name) {
                return Err(CliError::usage(format!(
                    "unknown transport `{name}` (configured: {})",
                    self.config
                        .transports
                        .keys()
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
        }
        Ok(())
    }

    /// The file `stop-workers` touches and `consume` watches: next to the configuration file
    /// (`courier.toml` -> `courier.toml.stop-workers`), or `./courier.stop-workers` for the
    /// embedded configuration.
    pub(crate) fn stop_file(&self) -> PathBuf {
        match &self.source {
            Source::File(path) => {
                let mut name = path
                    .file_name()
                    .map(std::ffi::OsStr::to_os_string)
                    .unwrap_or_default();
                name.push(".stop-workers");
                path.with_file_name(name)
            }
            Source::Embedded => PathBuf::from("courier.stop-workers"),
        }
    }

    /// Prints a value as pretty JSON on stdout.
    pub(crate) fn print_json(&self, value: &impl Serialize) -> CliResult {
        let text = serde_json::to_string_pretty(value)
            .map_err(|e| CliError::runtime(format!("cannot print JSON: {e}")))?;
        println!("{text}");
        Ok(())
    }

    /// Prints a line of progress or information on stderr unless `--quiet`.
    pub(crate) fn note(&self, text: impl std::fmt::Display) {
        if !self.quiet {
            eprintln!("{text}");
        }
    }
}
