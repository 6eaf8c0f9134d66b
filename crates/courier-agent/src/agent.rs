//! [`LlmAgent`]: the tool-calling loop on durable steps.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use courier_runs::{
    Agent, AgentError, AgentOutcome, Budget, Effect, ProviderError, RunContext, StepError,
    TerminationReason, Usage,
};
use serde_json::{Value, json};

use crate::breaker::{BreakerPolicy, BreakerStore};
use crate::call::{Chain, http_client};
use crate::provider::{Price, Provider};
use crate::streams::StreamStore;
use crate::tool::Tool;
use crate::wire::ModelTurn;

/// The default most model turns of one run.
pub const DEFAULT_MAX_TURNS: u32 = 10;

/// The name of a model call's step.
pub const MODEL_STEP: &str = "model";

/// An agent for durable runs that talks to any OpenAI-compatible `/v1/chat/completions`
/// endpoint (OpenAI, vLLM, Ollama, llama.cpp's server), built with [`LlmAgent::builder`] or
/// from an `[agents.NAME]` table ([`AgentConfig`](crate::AgentConfig)).
///
/// The loop: a model call, then the tool calls it asked for, their results back to the model,
/// until it answers without tool calls (the run completes with `{"answer": TEXT, "turns": N}`),
/// until [`max_turns`](LlmAgentBuilder::max_turns) (the run stops `max_steps`), or until the
/// agent's [`budget`](LlmAgentBuilder::budget) or the run's own is spent (`budget_exhausted`).
///
/// **Durable steps.** Each model call is a step named `model`, each tool call a step named
/// `tool:NAME` with the tool's [`Effect`]. A resumed run replays finished steps from its journal
/// and rebuilds the conversation from them: no model is called again for a finished step. A
/// model call is [`Effect::Idempotent`]: repeating it after a crash costs tokens and has no
/// effect outside the run, and its step key goes out as `Idempotency-Key` for a gateway that
/// deduplicates; it is not guarded, because parking a run for an operator over a lost model
/// answer would only stop it.
///
/// **Usage.** The answer's `usage` (prompt and completion tokens), one turn, and the cost from
/// the price table ([`price`](LlmAgentBuilder::price), per model) are journaled with the model
/// step and added to the run's durable usage; each tool call counts one `tool_calls`.
///
/// **Input.** `{"prompt": TEXT}`, `{"messages": [...]}` (OpenAI messages) or a JSON string.
#[derive(Debug, Clone)]
pub struct LlmAgent {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    chain: Chain,
    system: Option<String>,
    tools: Vec<Tool>,
    max_turns: u32,
    budget: Budget,
    temperature: Option<f64>,
}

/// Builds an [`LlmAgent`].
#[derive(Debug, Default)]
#[must_use]
pub struct LlmAgentBuilder {
    providers: Vec<Provider>,
    system: Option<String>,
    tools: Vec<Tool>,
    max_turns: Option<u32>,
    budget: Budget,
    prices: HashMap<String, Price>,
    breakers: Option<Arc<dyn BreakerStore>>,
    policy: BreakerPolicy,
    temperature: Option<f64>,
    streams: Option<(Arc<dyn StreamStore>, std::time::Duration)>,
}

/// An agent cannot be built as configured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BuildError(pub(crate) String);

impl LlmAgent {
    /// A builder.
    pub fn builder() -> LlmAgentBuilder {
        LlmAgentBuilder::default()
    }

    /// Its providers, in chain order.
    #[must_use]
    pub fn providers(&self) -> &[Provider] {
        &self.inner.chain.providers
    }

    /// Its breakers, if any.
    #[must_use]
    pub fn breakers(&self) -> Option<&Arc<dyn BreakerStore>> {
        self.inner.chain.breakers.as_ref()
    }
}

impl LlmAgentBuilder {
    /// Adds a provider at the end of the chain (the first is the primary).
    pub fn provider(mut self, provider: Provider) -> Self {
        self.providers.push(provider);
        self
    }

    /// The system prompt.
    pub fn system(mut self, prompt: impl Into<String>) -> Self {
        self.system = Some(prompt.into());
        self
    }

    /// Registers a tool.
    pub fn tool(mut self, tool: Tool) -> Self {
        self.tools.retain(|t| t.name != tool.name);
        self.tools.push(tool);
        self
    }

    /// The most model turns of a run (default [`DEFAULT_MAX_TURNS`]).
    pub fn max_turns(mut self, n: u32) -> Self {
        self.max_turns = Some(n);
        self
    }

    /// The agent's own budget, checked against the run's durable usage before each model call.
    pub fn budget(mut self, budget: Budget) -> Self {
        self.budget = budget;
        self
    }

    /// The price of `model`.
    pub fn price(mut self, model: impl Into<String>, price: Price) -> Self {
        self.prices.insert(model.into(), price);
        self
    }

    /// The sampling temperature sent (none: the provider's default).
    pub fn temperature(mut self, t: f64) -> Self {
        self.temperature = Some(t);
        self
    }

    /// The providers' circuit breakers, in `store` (shared by every worker using it).
    pub fn breakers(mut self, store: Arc<dyn BreakerStore>, policy: BreakerPolicy) -> Self {
        self.breakers = Some(store);
        self.policy = policy;
        self
    }

    /// Where streaming providers' chunks go ([`streams`](crate::streams)): each event kept
    /// for `ttl`.
    pub fn streams(mut self, store: Arc<dyn StreamStore>, ttl: std::time::Duration) -> Self {
        self.streams = Some((store, ttl));
        self
    }

    /// The agent.
    ///
    /// # Errors
    /// No provider, a provider without a base URL or model, two providers of one name, a
    /// `max_turns` of 0, or an HTTP client that cannot be built.
    pub fn build(self) -> Result<LlmAgent, BuildError> {
        if self.providers.is_empty() {
            return Err(BuildError(
                "an LLM agent needs at least one provider".into(),
            ));
        }
        for (i, p) in self.providers.iter().enumerate() {
            if p.base_url.is_empty() || p.model.is_empty() {
                return Err(BuildError(format!(
                    "provider `{}` needs a base_url and a model",
                    p.name
                )));
            }
            if self.providers[..i].iter().any(|q| q.name == p.name) {
                return Err(BuildError(format!("two providers are named `{}`", p.name)));
            }
        }
        let max_turns = self.max_turns.unwrap_or(DEFAULT_MAX_TURNS);
        if max_turns == 0 {
            return Err(BuildError("max_turns must be at least 1".into()));
        }
        let client = http_client().map_err(|e| BuildError(e.to_string()))?;
        Ok(LlmAgent {
            inner: Arc::new(Inner {
                chain: Chain {
                    providers: self.providers,
                    client,
                    breakers: self.breakers,
                    policy: self.policy,
                    prices: self.prices,
                    streams: self.streams,
                },
                system: self.system,
                tools: self.tools,
                max_turns,
                budget: self.budget,
                temperature: self.temperature,
            }),
        })
    }
}

fn bad_input(detail: &str) -> AgentError {
    AgentError::Provider(ProviderError::Configuration(format!(
        "LLM agent input: {detail} (expected {{\"prompt\": TEXT}}, {{\"messages\": [...]}} or a string)"
    )))
}

impl Inner {
    fn first_messages(&self, input: &Value) -> Result<Vec<Value>, AgentError> {
        let mut messages = Vec::new();
        if let Some(system) = &self.system {
            messages.push(json!({ "role": "system", "content": system }));
        }
        match input {
            Value::String(prompt) => messages.push(json!({ "role": "user", "content": prompt })),
            Value::Object(map) => match (map.get("prompt"), map.get("messages")) {
                (Some(Value::String(prompt)), _) => {
                    messages.push(json!({ "role": "user", "content": prompt }));
                }
                (_, Some(Value::Array(given))) if !given.is_empty() => {
                    messages.extend(given.iter().cloned())
                }
                _ => return Err(bad_input("no `prompt` string and no `messages` list")),
            },
            _ => return Err(bad_input("not an object or a string")),
        }
        Ok(messages)
    }

    fn request(&self, messages: &[Value]) -> Value {
        let mut body = json!({ "messages": messages });
        if !self.tools.is_empty() {
            body["tools"] = self.tools.iter().map(Tool::spec).collect();
        }
        if let Some(t) = self.temperature {
            body["temperature"] = json!(t);
        }
        body
    }
}

fn elapsed_ms(cx: &RunContext) -> u64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    let started = cx.run().started_at.unwrap_or(now);
    u64::try_from(now - started).unwrap_or(0)
}

#[async_trait::async_trait]
impl Agent for LlmAgent {
    async fn run(&self, cx: &mut RunContext) -> Result<AgentOutcome, AgentError> {
        let inner = &self.inner;
        let mut messages = inner.first_messages(cx.input())?;
        let mut turns = 0u32;
        loop {
            if turns >= inner.max_turns {
                tracing::info!(courier.run.id = %cx.run().id, turns, "LLM agent stopped at max_turns");
                return Ok(AgentOutcome::Stopped(TerminationReason::MaxSteps));
            }
            if let Some((what, used, limit)) = inner.budget.exhausted(&cx.usage(), elapsed_ms(cx)) {
                tracing::info!(courier.run.id = %cx.run().id, what, used, limit, "LLM agent stopped: its budget is spent");
                return Ok(AgentOutcome::Stopped(TerminationReason::BudgetExhausted));
            }
            turns += 1;
            let body = inner.request(&messages);
            let chain = inner.chain.clone();
            let token = cx.cancellation().clone();
            let turn: ModelTurn = cx
                .step(MODEL_STEP, Effect::Idempotent, move |scope| async move {
                    tokio::select! {
                        done = chain.complete(&body, &scope) => done.map_err(AgentError::from),
                        () = token.cancelled() => Err(StepError::LeaseLost.into()),
                    }
                })
                .await?;
            messages.push(turn.message());
            if turn.tool_calls.is_empty() {
                return Ok(AgentOutcome::Completed(json!({
                    "answer": turn.content.unwrap_or_default(),
                    "turns": turns,
                })));
            }
            for call in turn.tool_calls {
                let tool = inner.tools.iter().find(|t| t.name == call.name).cloned();
                let effect = tool.as_ref().map_or(Effect::Pure, Tool::effect);
                let name = format!("tool:{}", call.name);
                let (wanted, arguments) = (call.name.clone(), call.arguments);
                let out: Value = cx
                    .step(&name, effect, move |scope| async move {
                        scope.report(Usage::tool_call());
                        let Some(tool) = tool else {
                            return Ok(
                                json!({ "error": format!("there is no tool named `{wanted}`") }),
                            );
                        };
                        let args: Value = match serde_json::from_str(&arguments) {
                            Ok(args) => args,
                            Err(e) => {
                                return Ok(
                                    json!({ "error": format!("the arguments are not JSON: {e}") }),
                                );
                            }
                        };
                        (tool.call)(args, scope).await
                    })
                    .await?;
                let content = match out {
                    Value::String(s) => s,
                    other => other.to_string(),
                };
                messages
                    .push(json!({ "role": "tool", "tool_call_id": call.id, "content": content }));
            }
        }
    }
}
