//! Tools: Rust async functions the model may call, each registered with a JSON schema of its
//! arguments and the [`Effect`] its call has. Each call is one durable step.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use courier_runs::{AgentError, Effect, StepScope};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// What a tool's function returns.
pub type ToolFuture = Pin<Box<dyn Future<Output = Result<Value, AgentError>> + Send>>;

type ToolFn = Arc<dyn Fn(Value, StepScope) -> ToolFuture + Send + Sync>;

/// A tool: name, description, the JSON schema of its arguments, its effect and its function.
///
/// The function gets the arguments the model wrote and the step's [`StepScope`], whose
/// [`key`](StepScope::key) is the idempotency key to pass to the outside system (the same on
/// every attempt, so that a [`Guarded`](Effect::Guarded) call with
/// [`OnAmbiguous::Retry`](courier_runs::OnAmbiguous::Retry) run again after a crash is
/// deduplicated there). Its `Ok` value goes back to the model; an `Err` fails the step and is
/// classified like any agent error (return `Ok(json!({"error": ...}))` to let the model see a
/// failure instead).
#[derive(Clone)]
pub struct Tool {
    pub(crate) name: String,
    pub(crate) description: String,
    pub(crate) parameters: Value,
    pub(crate) effect: Effect,
    pub(crate) call: ToolFn,
}

impl fmt::Debug for Tool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tool")
            .field("name", &self.name)
            .field("effect", &self.effect)
            .finish_non_exhaustive()
    }
}

impl Tool {
    /// A tool taking its arguments as JSON, with a hand-written `parameters` schema.
    ///
    /// ```
    /// use courier_agent::Tool;
    /// use courier_runs::Effect;
    /// use serde_json::json;
    ///
    /// let add = Tool::new(
    ///     "add",
    ///     "Adds two numbers",
    ///     json!({"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}),
    ///     Effect::Pure,
    ///     |args, _step| async move { Ok(json!(args["a"].as_f64().unwrap_or(0.0) + args["b"].as_f64().unwrap_or(0.0))) },
    /// );
    /// assert_eq!(add.name(), "add");
    /// ```
    pub fn new<F, Fut>(
        name: impl Into<String>,
        description: impl Into<String>,
        parameters: Value,
        effect: Effect,
        f: F,
    ) -> Self
    where
        F: Fn(Value, StepScope) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Value, AgentError>> + Send + 'static,
    {
        Self {
            name: name.into(),
            description: description.into(),
            parameters,
            effect,
            call: Arc::new(move |args, scope| Box::pin(f(args, scope))),
        }
    }

    /// A tool whose arguments are deserialised into `A` (arguments that do not fit are
    /// answered to the model as an error, without calling `f`) and whose result `R` is
    /// serialised, with a hand-written `parameters` schema.
    pub fn typed<A, R, F, Fut>(
        name: impl Into<String>,
        description: impl Into<String>,
        parameters: Value,
        effect: Effect,
        f: F,
    ) -> Self
    where
        A: DeserializeOwned + Send + 'static,
        R: Serialize + Send + 'static,
        F: Fn(A, StepScope) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, AgentError>> + Send + 'static,
    {
        let f = Arc::new(f);
        Self::new(name, description, parameters, effect, move |args, scope| {
            let f = f.clone();
            async move {
                let args: A = match serde_json::from_value(args) {
                    Ok(a) => a,
                    Err(e) => return Ok(json!({ "error": format!("invalid arguments: {e}") })),
                };
                let out = f(args, scope).await?;
                serde_json::to_value(out).map_err(AgentError::other)
            }
        })
    }

    /// [`Tool::typed`] with the schema derived from `A` by `schemars`.
    #[cfg(feature = "schemars")]
    pub fn derived<A, R, F, Fut>(
        name: impl Into<String>,
        description: impl Into<String>,
        effect: Effect,
        f: F,
    ) -> Self
    where
        A: schemars::JsonSchema + DeserializeOwned + Send + 'static,
        R: Serialize + Send + 'static,
        F: Fn(A, StepScope) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, AgentError>> + Send + 'static,
    {
        let mut schema = serde_json::to_value(schemars::schema_for!(A))
            .unwrap_or_else(|_| json!({"type": "object"}));
        if let Some(map) = schema.as_object_mut() {
            map.remove("$schema");
            map.remove("title");
        }
        Self::typed(name, description, schema, effect, f)
    }

    /// Its name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its effect.
    #[must_use]
    pub fn effect(&self) -> Effect {
        self.effect
    }

    /// The `tools` entry of a request.
    pub(crate) fn spec(&self) -> Value {
        json!({
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            }
        })
    }
}

#[cfg(all(test, feature = "schemars"))]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, schemars::JsonSchema)]
    struct Refund {
        /// The order.
        order: String,
        cents: u32,
    }

    #[test]
    fn a_derived_schema_describes_the_arguments() {
        let tool = Tool::derived(
            "refund",
            "Refunds",
            Effect::Pure,
            |a: Refund, _s| async move { Ok(json!({"order": a.order, "cents": a.cents})) },
        );
        let spec = tool.spec();
        let params = &spec["function"]["parameters"];
        assert_eq!(params["type"], "object");
        assert_eq!(params["properties"]["cents"]["type"], "integer");
        assert_eq!(params["required"], json!(["order", "cents"]));
        assert!(params.get("$schema").is_none());
    }
}
