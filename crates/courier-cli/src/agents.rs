//! `[agents.NAME]` tables (feature `agent`): LLM agents built from the configuration, added to
//! the app's agents so that `consume`, `runs submit` and the dashboard run them. Their keys are
//! remembered as secrets (scrubbed from every error); their breakers, when a table has a
//! `breaker`, live in the run store's database.

use std::sync::Arc;

use courier_agent::breaker::BreakerRow;
use courier_agent::{AgentConfig, BreakerStore, LazySqlBreakers, LazySqlStreams, LlmAgent};

use crate::context::Ctx;
use crate::error::{CliError, CliResult, remember_secret};
use crate::wiring::Wiring;

/// The app's wiring with the configured agents added (a configured name replaces an app's
/// agent of that name); `None` when the configuration has no `[agents]`.
pub(crate) fn wiring(ctx: &Ctx<'_>) -> CliResult<Option<Wiring>> {
    if ctx.config.agents.0.is_empty() {
        return Ok(None);
    }
    let mut wiring = ctx.app.clone();
    let runs = crate::runs::settings(ctx)?;
    let dsn = crate::runs::store_dsn(runs.store.as_deref());
    for (name, table) in &ctx.config.agents.0 {
        let agent = build(name, table, &dsn)?;
        wiring.agents.insert(name, Arc::new(agent));
    }
    Ok(Some(wiring))
}

/// The agent of table `[agents.NAME]`, its breakers (when it has a `breaker`) in the database
/// of `store_dsn`. The agent `courier demo --agent llm` writes gets the demo's tools.
pub(crate) fn build(
    name: &str,
    table: &courier_core::config::Table,
    store_dsn: &str,
) -> CliResult<LlmAgent> {
    let config =
        AgentConfig::from_table(name, table).map_err(|e| CliError::usage(e.to_string()))?;
    for key in config.api_keys() {
        remember_secret(key);
    }
    let mut builder = config
        .builder(name)
        .map_err(|e| CliError::usage(e.to_string()))?;
    if let Some(breaker) = &config.breaker {
        builder = builder.breakers(
            Arc::new(LazySqlBreakers::new(store_dsn.to_owned(), None)),
            breaker.policy(),
        );
    }
    if config.providers.iter().any(|p| p.stream == Some(true)) {
        builder = builder.streams(
            Arc::new(LazySqlStreams::new(store_dsn.to_owned(), None)),
            courier_agent::DEFAULT_STREAM_TTL,
        );
    }
    if name == crate::commands::demo::llm_tools::AGENT {
        builder = crate::commands::demo::llm_tools::tools(builder);
    }
    builder
        .build()
        .map_err(|e| CliError::usage(format!("agents.{name}: {e}")))
}

/// The breakers of the configured agents (in the run store's database) when one of them has a
/// `breaker`; `None` otherwise.
pub(crate) fn breaker_store(ctx: &Ctx<'_>) -> CliResult<Option<Arc<dyn BreakerStore>>> {
    if !ctx
        .config
        .agents
        .0
        .values()
        .any(|table| table.get("breaker").is_some())
    {
        return Ok(None);
    }
    let runs = crate::runs::settings(ctx)?;
    let dsn = crate::runs::store_dsn(runs.store.as_deref());
    Ok(Some(Arc::new(LazySqlBreakers::new(dsn, None))))
}

/// Every breaker of the configured agents, read (and sampled into the breaker gauges); empty
/// when no agent has a `breaker`.
pub(crate) async fn breakers(ctx: &Ctx<'_>) -> CliResult<Vec<BreakerRow>> {
    let Some(store) = breaker_store(ctx)? else {
        return Ok(Vec::new());
    };
    courier_agent::breaker::record_gauges(store.as_ref())
        .await
        .map_err(|e| CliError::runtime(format!("reading the agents' circuit breakers: {e}")))
}

/// The agents' breakers for the dashboard's workers page.
#[cfg(feature = "dashboard")]
pub(crate) struct DashboardBreakers(pub(crate) Arc<dyn BreakerStore>);

#[cfg(feature = "dashboard")]
#[async_trait::async_trait]
impl courier_dashboard::BreakerSource for DashboardBreakers {
    async fn breakers(&self) -> Result<Vec<courier_dashboard::BreakerView>, String> {
        let rows = courier_agent::breaker::record_gauges(self.0.as_ref())
            .await
            .map_err(|e| e.to_string())?;
        Ok(rows
            .into_iter()
            .map(|r| courier_dashboard::BreakerView {
                provider: r.provider,
                state: r.state.as_str().to_owned(),
                failures: r.failures,
                opened_at_ms: r.opened_at,
            })
            .collect())
    }
}

/// The runs' token streams (in the run store's database) when a configured agent has a
/// streaming provider; `None` otherwise.
#[cfg(feature = "dashboard")]
pub(crate) fn stream_store(
    ctx: &Ctx<'_>,
) -> CliResult<Option<Arc<dyn courier_agent::StreamStore>>> {
    let streams = ctx.config.agents.0.values().any(|table| {
        table
            .get("providers")
            .as_ref()
            .and_then(serde_json::Value::as_array)
            .is_some_and(|ps| {
                ps.iter()
                    .any(|p| p.get("stream").and_then(serde_json::Value::as_bool) == Some(true))
            })
    });
    if !streams {
        return Ok(None);
    }
    let runs = crate::runs::settings(ctx)?;
    let dsn = crate::runs::store_dsn(runs.store.as_deref());
    Ok(Some(Arc::new(LazySqlStreams::new(dsn, None))))
}

/// The runs' token streams for the dashboard's `GET /runs/ID/stream`.
#[cfg(feature = "dashboard")]
pub(crate) struct DashboardStreams(pub(crate) Arc<dyn courier_agent::StreamStore>);

#[cfg(feature = "dashboard")]
#[async_trait::async_trait]
impl courier_dashboard::StreamSource for DashboardStreams {
    async fn read(
        &self,
        run: &str,
        after: i64,
        limit: usize,
    ) -> Result<Vec<courier_dashboard::StreamEventView>, String> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let events = self
            .0
            .read(run, after, limit, now)
            .await
            .map_err(|e| e.to_string())?;
        Ok(events
            .into_iter()
            .map(|e| courier_dashboard::StreamEventView {
                offset: e.offset,
                kind: e.kind.as_str().to_owned(),
                data: e.data,
            })
            .collect())
    }
}
