//! Wiring of `courier-runs`: the `[runs]` table, the run store, the runtime with the app's agents.

use std::sync::Arc;
use std::time::Duration;

use courier_core::{CancellationToken, MessageBusBuilder};
use courier_runs::{
    Agent, AgentError, AgentOutcome, RunContext, RunStore, RunsConfig, Runtime, SqlRunStore,
    SqlRunStoreOptions, StoreError, async_trait,
};

use crate::connect::{Failure, until_up};
use crate::context::Ctx;
use crate::error::{CliError, CliResult, chain, remember_secret};
use crate::wiring::Agents;

/// The run store used when `[runs] store` is not set.
pub(crate) const DEFAULT_STORE: &str = "sqlite://courier.db";

/// An agent shared between runtimes.
struct Shared(Arc<dyn Agent>);

#[async_trait]
impl Agent for Shared {
    async fn run(&self, cx: &mut RunContext) -> Result<AgentOutcome, AgentError> {
        self.0.run(cx).await
    }
}

/// The validated `[runs]` table (defaults when absent).
pub(crate) fn settings(ctx: &Ctx<'_>) -> CliResult<RunsConfig> {
    let config: RunsConfig = match &ctx.config.runs {
        Some(table) => table
            .deserialize()
            .map_err(|e| CliError::usage(format!("[runs]: {e}")))?,
        None => RunsConfig::default(),
    };
    config
        .validate()
        .map_err(|e| CliError::usage(e.to_string()))?;
    Ok(config)
}

/// The store DSN as sqlx wants it: SQLite files are created when missing.
pub(crate) fn store_dsn(configured: Option<&str>) -> String {
    let dsn = configured.unwrap_or(DEFAULT_STORE);
    if let Ok(parsed) = courier_core::Dsn::parse(dsn) {
        for secret in parsed.secrets() {
            remember_secret(secret);
        }
    }
    if dsn.starts_with("sqlite:") && !dsn.contains("mode=") {
        let sep = if dsn.contains('?') { '&' } else { '?' };
        return format!("{dsn}{sep}mode=rwc");
    }
    dsn.to_owned()
}

/// Connects the run store and creates its tables if missing, or only checks them with
/// `runs.auto_setup` off (no retrying: a store that is
/// down fails the command, exit 1; a DSN that does not parse is a configuration error, exit 2).
pub(crate) async fn open_store(config: &RunsConfig) -> CliResult<Arc<dyn RunStore>> {
    try_open_store(config).await.map_err(Failure::into_error)
}

/// [`open_store`], telling a store that is down (worth retrying) from one that cannot work.
pub(crate) async fn try_open_store(config: &RunsConfig) -> Result<Arc<dyn RunStore>, Failure> {
    try_open_store_reporting(config, false)
        .await
        .map(|(store, _)| store)
}

/// [`try_open_store`], naming the migrations it applied.
/// With `migrate` (`courier setup`) the tables are always migrated; otherwise only when
/// `runs.auto_setup` is on, and checked when it is off.
async fn try_open_store_reporting(
    config: &RunsConfig,
    migrate: bool,
) -> Result<(Arc<dyn RunStore>, Vec<String>), Failure> {
    let dsn = store_dsn(config.store.as_deref());
    let shown = courier_core::redact(&dsn);
    let classify = |doing: &str, e: StoreError| {
        if e.is_config() {
            return Failure::Fatal(CliError::usage(match e {
                StoreError::UnsupportedDsn(_) => format!(
                    "runs.store: unsupported run store DSN `{shown}` (sqlite://, postgres://, mysql://)"
                ),
                other => format!("runs.store: invalid DSN `{shown}`: {}", chain(&other)),
            }));
        }
        if e.is_transient() {
            return Failure::Down {
                what: format!("the run store `{shown}`"),
                error: chain(&e),
            };
        }
        Failure::Fatal(CliError::runtime(format!(
            "cannot {doing} the run store `{shown}`: {}",
            chain(&e)
        )))
    };
    let store = SqlRunStore::connect(&dsn, SqlRunStoreOptions::default())
        .await
        .map_err(|e| classify("open", e))?;
    if !(migrate || config.auto_setup) {
        let missing = store
            .missing_migrations()
            .await
            .map_err(|e| classify("check", e))?;
        if let Some(first) = missing.first() {
            let more = match missing.len() {
                1 => String::new(),
                n => format!(", and {} more", n - 1),
            };
            return Err(Failure::Fatal(CliError::usage(format!(
                "the run store `{shown}` has a missing or older schema and runs.auto_setup is off: \
                 {first}{more} (run `courier setup`, or apply the SQL of `courier setup --print-sql` \
                 with your migration tool)"
            ))));
        }
        return Ok((Arc::new(store), Vec::new()));
    }
    let applied = store.migrate().await.map_err(|e| classify("set up", e))?;
    Ok((
        Arc::new(store),
        applied.iter().map(ToString::to_string).collect(),
    ))
}

/// A runtime over `store` with the app's agents and the `[runs]` options.
pub(crate) fn runtime(ctx: &Ctx<'_>, config: &RunsConfig, store: Arc<dyn RunStore>) -> Runtime {
    build_runtime(&ctx.app.agents, config, store)
}

/// A runtime over `store` with these agents.
pub(crate) fn build_runtime(
    agents: &Agents,
    config: &RunsConfig,
    store: Arc<dyn RunStore>,
) -> Runtime {
    build_runtime_as(agents, config, store, None)
}

/// A runtime with these agents and, for simulated processes, a worker identity of its own.
pub(crate) fn build_runtime_as(
    agents: &Agents,
    config: &RunsConfig,
    store: Arc<dyn RunStore>,
    identity: Option<String>,
) -> Runtime {
    let mut builder = Runtime::builder(store).options(config.runtime_options());
    if let Some(id) = identity {
        builder = builder.worker_identity(id);
    }
    for (name, agent) in agents.iter() {
        builder = builder.agent(name.to_owned(), Shared(agent.clone()));
    }
    builder.build()
}

/// Whether `setup` and `consume` wire runs: with the embedded configuration, a `[runs]` table,
/// or a route for `courier.run_agent`. Otherwise an application's configuration gets no run
/// store it did not ask for (the `runs` and `reap` commands still use the default one).
pub(crate) fn enabled(ctx: &Ctx<'_>) -> bool {
    matches!(ctx.source, crate::context::Source::Embedded)
        || ctx.config.runs.is_some()
        || ctx
            .config
            .routing
            .keys()
            .any(|k| k == "courier.run_agent" || k == "courier.*" || k == "*")
}

/// `courier setup`'s part: the run store's tables. Returns the store shown redacted.
pub(crate) async fn setup(ctx: &Ctx<'_>) -> CliResult<Option<(String, Vec<String>)>> {
    if !enabled(ctx) {
        return Ok(None);
    }
    let config = settings(ctx)?;
    let (_, applied) = try_open_store_reporting(&config, true)
        .await
        .map_err(Failure::into_error)?;
    Ok(Some((
        courier_core::redact(config.store.as_deref().unwrap_or(DEFAULT_STORE)),
        applied,
    )))
}

/// What `consume` adds for runs: the `RunAgent` handler and the reaper.
pub(crate) struct WorkerParts {
    runtime: Option<Runtime>,
    config: RunsConfig,
    reap_every: Option<Duration>,
}

impl WorkerParts {
    /// Validates the `[runs]` table and `--reap-every` (against the lease, like
    /// `runs.reap_every`) before anything connects.
    pub(crate) fn prepare(ctx: &Ctx<'_>, reap_every: Option<Duration>) -> CliResult<Self> {
        let config = settings(ctx)?;
        if let Some(every) = reap_every {
            config
                .check_reap_every(every)
                .map_err(|message| CliError::usage(format!("--reap-every: {message}")))?;
        }
        if !enabled(ctx) {
            if reap_every.is_some() {
                return Err(CliError::usage(
                    "--reap-every: this configuration has no [runs] table and routes no `courier.run_agent`",
                ));
            }
            return Ok(Self {
                runtime: None,
                config,
                reap_every: None,
            });
        }
        let reap_every = reap_every.or(config.reap_every);
        Ok(Self {
            runtime: None,
            config,
            reap_every,
        })
    }

    /// Opens the run store (when runs are wired), retrying while it is down; `false` when
    /// `shutdown` came first.
    pub(crate) async fn connect(
        &mut self,
        ctx: &Ctx<'_>,
        shutdown: &courier_core::CancellationToken,
    ) -> CliResult<bool> {
        if !enabled(ctx) {
            return Ok(true);
        }
        let config = &self.config;
        let Some(store) = until_up(shutdown, || try_open_store(config)).await? else {
            return Ok(false);
        };
        self.runtime = Some(runtime(ctx, &self.config, store));
        Ok(true)
    }

    /// The runtime, once connected (when runs are wired).
    pub(crate) fn runtime(&self) -> Option<Runtime> {
        self.runtime.clone()
    }

    /// Registers the `RunAgent` handler and links the runtime to the bus.
    pub(crate) fn bus_hook(&self, builder: MessageBusBuilder) -> MessageBusBuilder {
        match &self.runtime {
            Some(runtime) => runtime.register(builder),
            None => builder,
        }
    }

    /// Starts the reaper when `--reap-every` or `[runs] reap_every` asks for it.
    pub(crate) fn spawn_reaper(
        &self,
        done: CancellationToken,
        quiet: bool,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let every = self.reap_every?;
        let reaper = self.runtime.as_ref()?.reaper();
        let options = self.config.reap_options();
        Some(tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = done.cancelled() => return,
                    () = tokio::time::sleep(every) => {}
                }
                match reaper.reap(options).await {
                    Ok(report) if (report.selected > 0 || report.redispatched > 0) && !quiet => {
                        eprintln!("{report}");
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(error = %crate::error::scrub(&chain(&e)), "reap failed")
                    }
                }
            }
        }))
    }
}
