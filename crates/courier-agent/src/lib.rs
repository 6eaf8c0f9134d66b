//! A real agent on Courier's durable steps: [`LlmAgent`] talks to any OpenAI-compatible
//! `/v1/chat/completions` endpoint (OpenAI, vLLM, Ollama, llama.cpp's server) and calls Rust
//! [`Tool`]s; each model call and each tool call is a durable step, so a crash never pays for a
//! finished model call twice.
//!
//! - **Failures** are classified as the runs layer defines them: 401/403 `auth` (not retried),
//!   400/422 and other 4xx `client_error`, 429 `rate_limit` (its `Retry-After` becomes the
//!   run's requeue delay), 5xx `server_error`, timeouts and refused or reset connections
//!   `connection`, malformed or truncated JSON and missing fields `protocol`.
//! - **Fallback.** A chain of [`Provider`]s: on a retryable class (or `protocol`), the same step
//!   tries the next provider; the chain's failure is classified by its last attempt.
//! - **Circuit breakers** per provider ([`breaker`]), shared by every worker through the run
//!   store's database ([`SqlBreakers`]) or one process's memory ([`MemoryBreakers`]).
//! - **Keys** ([`ApiKey`]) are sent in a sensitive header and never shown by `Debug`, errors or
//!   logs.
//! - **HTTP**: reqwest over HTTP/1 with rustls on the ring provider (no native TLS, no aws-lc).
//!
//! ```no_run
//! use courier_agent::{ApiKey, LlmAgent, Price, Provider, Tool};
//! use courier_runs::{Effect, OnAmbiguous};
//! use serde_json::json;
//!
//! let agent = LlmAgent::builder()
//!     .provider(Provider::new("openai", "https://api.openai.com/v1", "gpt-4o-mini")
//!         .api_key(ApiKey::new(std::env::var("OPENAI_API_KEY").unwrap_or_default())))
//!     .provider(Provider::new("local", "http://127.0.0.1:8000/v1", "llama3"))
//!     .system("You are a refund assistant.")
//!     .price("gpt-4o-mini", Price::per_million(150_000, 600_000))
//!     .tool(Tool::new(
//!         "refund",
//!         "Refunds an order",
//!         json!({"type": "object", "properties": {"order": {"type": "string"}}, "required": ["order"]}),
//!         Effect::Guarded(OnAmbiguous::Park),
//!         // The payment API deduplicates on the step's key.
//!         |args, step| async move { Ok(json!({"refunded": args["order"], "key": step.key()})) },
//!     ))
//!     .max_turns(6)
//!     .build()?;
//! # let _ = agent;
//! # Ok::<(), courier_agent::BuildError>(())
//! ```

mod agent;
pub mod breaker;
mod call;
mod config;
mod provider;
mod sql;
pub mod streams;
#[cfg(feature = "test-server")]
pub mod testing;
mod tool;
mod wire;

pub use agent::{BuildError, DEFAULT_MAX_TURNS, LlmAgent, LlmAgentBuilder, MODEL_STEP};
pub use breaker::{BreakerPolicy, BreakerStore, LazySqlBreakers, MemoryBreakers, SqlBreakers};
pub use call::{IDEMPOTENCY_HEADER, install_crypto_provider};
pub use config::{AgentConfig, BreakerConfig, BudgetConfig, ProviderConfig};
pub use provider::{ApiKey, DEFAULT_TIMEOUT, Price, Provider};
pub use streams::{
    DEFAULT_STREAM_TTL, LazySqlStreams, MemoryStreams, SqlStreams, StreamEvent, StreamKind,
    StreamStore,
};
pub use tool::{Tool, ToolFuture};
pub use wire::{ModelTurn, ToolCall};
