//! `[agents.NAME]`: an [`LlmAgent`] from TOML.
//!
//! ```toml
//! [agents.support]
//! system = "You answer customers of ACME."
//! max_turns = 8
//! budget = { tokens_out = 20000, cost_micros = 500000, tool_calls = 20, wall_time = "10m" }
//! breaker = { failures = 5, window = "60s", cooldown = "30s" }
//!
//! [[agents.support.providers]]
//! name = "openai"
//! base_url = "https://api.openai.com/v1"
//! model = "gpt-4o-mini"
//! api_key = "${OPENAI_API_KEY}"
//! timeout = "60s"
//!
//! [[agents.support.providers]]
//! name = "local"
//! base_url = "http://127.0.0.1:8000/v1"
//! model = "llama3"
//!
//! [agents.support.prices."gpt-4o-mini"]
//! input = 150000   # micro-units per million prompt tokens
//! output = 600000
//! ```

use std::collections::HashMap;
use std::time::Duration;

use courier_core::config::Table;
use courier_runs::Budget;
use serde::{Deserialize, Deserializer};

use crate::agent::{BuildError, LlmAgentBuilder};
use crate::breaker::BreakerPolicy;
use crate::provider::{ApiKey, DEFAULT_TIMEOUT, Price, Provider};

impl<'de> Deserialize<'de> for ApiKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(ApiKey::new)
    }
}

fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let text = String::deserialize(d)?;
    humantime::parse_duration(&text)
        .map(Some)
        .map_err(|e| serde::de::Error::custom(format!("not a duration: {e}")))
}

/// One `[[agents.NAME.providers]]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    /// Its name (default `provider<N>`).
    pub name: Option<String>,
    /// The base URL, up to `/v1`.
    pub base_url: String,
    /// The model (default: the agent's `model`).
    pub model: Option<String>,
    /// The key, usually `"${ENV_VAR}"` (interpolated when the file is read; never shown).
    pub api_key: Option<ApiKey>,
    /// The call timeout (default 60 s).
    #[serde(default, deserialize_with = "duration")]
    pub timeout: Option<Duration>,
    /// Stream the answers (SSE), folded into the same turn (default false).
    pub stream: Option<bool>,
}

/// `budget = {...}` of an agent.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetConfig {
    /// Prompt tokens.
    pub tokens_in: Option<u64>,
    /// Completion tokens.
    pub tokens_out: Option<u64>,
    /// Cost, micro-units.
    pub cost_micros: Option<u64>,
    /// Tool calls.
    pub tool_calls: Option<u64>,
    /// Model turns.
    pub turns: Option<u64>,
    /// Time from the run's first start.
    #[serde(default, deserialize_with = "duration")]
    pub wall_time: Option<Duration>,
}

/// One of `Budget`'s setters.
type SetLimit = fn(Budget, u64) -> Budget;

impl BudgetConfig {
    fn budget(&self) -> Budget {
        let mut b = Budget::new();
        let limits: [(Option<u64>, SetLimit); 5] = [
            (self.tokens_in, Budget::tokens_in),
            (self.tokens_out, Budget::tokens_out),
            (self.cost_micros, Budget::cost_micros),
            (self.tool_calls, Budget::tool_calls),
            (self.turns, Budget::turns),
        ];
        for (limit, set) in limits {
            if let Some(n) = limit {
                b = set(b, n);
            }
        }
        if let Some(t) = self.wall_time {
            b = b.wall_time(t);
        }
        b
    }
}

/// `breaker = {...}` of an agent.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BreakerConfig {
    /// Failures in the window that open a breaker (default 5).
    pub failures: Option<u32>,
    /// The window (default 60 s).
    #[serde(default, deserialize_with = "duration")]
    pub window: Option<Duration>,
    /// How long it stays open (default 30 s).
    #[serde(default, deserialize_with = "duration")]
    pub cooldown: Option<Duration>,
    /// How long a probe may take (default 120 s).
    #[serde(default, deserialize_with = "duration")]
    pub probe_timeout: Option<Duration>,
}

impl BreakerConfig {
    /// The policy, defaults filled in.
    #[must_use]
    pub fn policy(&self) -> BreakerPolicy {
        let d = BreakerPolicy::default();
        BreakerPolicy {
            failures: self.failures.unwrap_or(d.failures).max(1),
            window: self.window.unwrap_or(d.window),
            cooldown: self.cooldown.unwrap_or(d.cooldown),
            probe_timeout: self.probe_timeout.unwrap_or(d.probe_timeout),
        }
    }
}

/// One `[agents.NAME]` table. `Debug` never shows a key ([`ApiKey`]).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// The providers, primary first.
    pub providers: Vec<ProviderConfig>,
    /// The model of providers that name none.
    pub model: Option<String>,
    /// The system prompt.
    pub system: Option<String>,
    /// The most model turns of a run.
    pub max_turns: Option<u32>,
    /// The sampling temperature.
    pub temperature: Option<f64>,
    /// The agent's budget.
    #[serde(default)]
    pub budget: BudgetConfig,
    /// Prices by model.
    #[serde(default)]
    pub prices: HashMap<String, Price>,
    /// The breakers' policy; breakers are on when the application gives them a store (the CLI:
    /// the run store's database).
    pub breaker: Option<BreakerConfig>,
}

impl AgentConfig {
    /// Reads `[agents.NAME]` from its table. The error names the agent and the key at fault, and
    /// never shows a key's value.
    ///
    /// # Errors
    /// Unknown keys, wrong types, no provider.
    pub fn from_table(name: &str, table: &Table) -> Result<Self, BuildError> {
        let config: Self = table.deserialize().map_err(|e| {
            let mut message = e.to_string();
            for key in secrets_of(table) {
                message = message.replace(&key, "***");
            }
            BuildError(format!("agents.{name}: {message}"))
        })?;
        if config.providers.is_empty() {
            return Err(BuildError(format!("agents.{name}: `providers` is empty")));
        }
        Ok(config)
    }

    /// The keys of its providers (for a caller that scrubs them from its output).
    #[must_use]
    pub fn api_keys(&self) -> Vec<&str> {
        self.providers
            .iter()
            .filter_map(|p| p.api_key.as_ref().map(ApiKey::expose))
            .filter(|k| !k.is_empty())
            .collect()
    }

    /// A builder with everything configured (add tools and breakers, then build).
    ///
    /// # Errors
    /// A provider without a model (and no agent `model`).
    pub fn builder(&self, name: &str) -> Result<LlmAgentBuilder, BuildError> {
        let mut builder = LlmAgentBuilder::default().budget(self.budget.budget());
        for (i, p) in self.providers.iter().enumerate() {
            let pname = p
                .name
                .clone()
                .unwrap_or_else(|| format!("provider{}", i + 1));
            let model = p
                .model
                .clone()
                .or_else(|| self.model.clone())
                .ok_or_else(|| {
                    BuildError(format!(
                        "agents.{name}: provider `{pname}` has no model (and the agent no `model`)"
                    ))
                })?;
            let mut provider = Provider::new(pname, p.base_url.clone(), model)
                .timeout(p.timeout.unwrap_or(DEFAULT_TIMEOUT))
                .stream(p.stream.unwrap_or(false));
            if let Some(key) = p.api_key.clone().filter(|k| !k.expose().is_empty()) {
                provider = provider.api_key(key);
            }
            builder = builder.provider(provider);
        }
        if let Some(system) = &self.system {
            builder = builder.system(system.clone());
        }
        if let Some(n) = self.max_turns {
            builder = builder.max_turns(n);
        }
        if let Some(t) = self.temperature {
            builder = builder.temperature(t);
        }
        for (model, price) in &self.prices {
            builder = builder.price(model.clone(), *price);
        }
        Ok(builder)
    }
}

/// Every `api_key` string under a raw agent table.
fn secrets_of(table: &Table) -> Vec<String> {
    let mut keys = Vec::new();
    if let Some(serde_json::Value::Array(providers)) = table.get("providers") {
        for p in providers {
            if let Some(serde_json::Value::String(k)) = p.get("api_key")
                && !k.is_empty()
            {
                keys.push(k.clone());
            }
        }
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(text: &str) -> Table {
        text.parse().expect("toml")
    }

    #[test]
    fn reads_an_agent_and_never_shows_its_key() {
        let t = table(
            r#"
            system = "be brief"
            model = "m1"
            max_turns = 4
            budget = { tokens_out = 100, wall_time = "10m" }
            breaker = { failures = 2, cooldown = "5s" }
            [[providers]]
            name = "main"
            base_url = "http://127.0.0.1:1/v1"
            api_key = "sk-very-secret"
            timeout = "2s"
            [[providers]]
            base_url = "http://127.0.0.1:2/v1"
            model = "m2"
            [prices.m1]
            input = 10
            output = 20
            "#,
        );
        let c = AgentConfig::from_table("a", &t).expect("parses");
        assert!(!format!("{c:?}").contains("sk-very-secret"));
        assert_eq!(c.api_keys(), ["sk-very-secret"]);
        assert_eq!(c.breaker.map(|b| b.policy().failures), Some(2));
        let agent = c.builder("a").expect("builder").build().expect("agent");
        let names: Vec<_> = agent
            .providers()
            .iter()
            .map(|p| (p.name.as_str(), p.model.as_str()))
            .collect();
        assert_eq!(names, [("main", "m1"), ("provider2", "m2")]);
        assert_eq!(agent.providers()[0].timeout, Duration::from_secs(2));
        assert!(!format!("{agent:?}").contains("sk-very-secret"));
    }

    #[test]
    fn errors_name_the_key_and_hide_secrets() {
        let t = table(
            "[[providers]]\nbase_url = \"x\"\napi_key = \"sk-hidden-1\"\ntimeout = \"sk-hidden-1\"",
        );
        let e = AgentConfig::from_table("a", &t)
            .expect_err("bad timeout")
            .to_string();
        assert!(e.contains("agents.a") && !e.contains("sk-hidden-1"), "{e}");
        let t = table("[[providers]]\nbase_url = \"x\"\nmodle = \"m\"");
        let e = AgentConfig::from_table("a", &t)
            .expect_err("typo")
            .to_string();
        assert!(e.contains("modle"), "{e}");
        let t = table("[[providers]]\nbase_url = \"x\"");
        let e = AgentConfig::from_table("a", &t)
            .expect("parses")
            .builder("a")
            .expect_err("no model")
            .to_string();
        assert!(e.contains("no model"), "{e}");
    }
}
