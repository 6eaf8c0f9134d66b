//! `[agents.NAME]` tables (feature `agent`): LLM agents built from the configuration, added to
//! the app's agents so that `consume`, `runs submit` and the dashboard run them. Their keys are
//! remembered as secrets (scrubbed from every error); their breakers, when a table has a
//! `breaker`, live in the run store's database.

use std::sync::Arc;

use courier_agent::{AgentConfig, LazySqlBreakers, LlmAgent};

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
pub(crate) fn build(name: &str, table: &toml::Table, store_dsn: &str) -> CliResult<LlmAgent> {
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
    if name == crate::commands::demo::llm::AGENT {
        builder = crate::commands::demo::llm::tools(builder);
    }
    builder
        .build()
        .map_err(|e| CliError::usage(format!("agents.{name}: {e}")))
}
