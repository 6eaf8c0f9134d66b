//! The agent `courier demo --agent llm` configures, and the tools it gets: what the demo
//! ([`super::llm`]) and the CLI's agent builder (`crate::agents`) both use, below them.

use std::time::Duration;

use courier_agent::{LlmAgentBuilder, Tool};
use courier_runs::Effect;
use serde_json::json;

/// The agent the demo configures (it gets [`tools`]).
pub(crate) const AGENT: &str = "courier-demo-llm";
/// How long the `wait_for_courier` tool takes: the window in which the worker is killed.
const SLOW_TOOL: Duration = Duration::from_secs(2);

/// The demo's tools: `order_status` (pure, at once) and `wait_for_courier` (idempotent, slow).
pub(crate) fn tools(builder: LlmAgentBuilder) -> LlmAgentBuilder {
    let order = json!({"type": "object", "properties": {"order": {"type": "string"}}, "required": ["order"]});
    builder
        .tool(Tool::new(
            "order_status",
            "The shipping status of an order",
            order.clone(),
            Effect::Pure,
            |args, _step| async move { Ok(json!({"order": args["order"], "status": "shipped"})) },
        ))
        .tool(Tool::new(
            "wait_for_courier",
            "Waits until the courier has picked up an order",
            order,
            Effect::Idempotent,
            |args, _step| async move {
                tokio::time::sleep(SLOW_TOOL).await;
                Ok(json!({"order": args["order"], "courier": "picked it up"}))
            },
        ))
}
