//! The `scripted` agent: plays a list of steps from its input, to try the machinery
//! end to end without a model.

use std::time::Duration;

use serde_json::{Value, json};

use crate::agent::{Agent, AgentError, AgentOutcome, RunContext, Step, StepError};
use crate::{FailureClass, ProviderError};

/// Plays `{"steps": [...]}`, one step boundary per step:
///
/// - `{"sleep_ms": N}`: waits N ms, then checkpoints;
/// - `{"fail": "<failure class>", "attempts": k}`: fails with that class on the first k
///   executions of the run (executions are counted by the run's requeue count; no `attempts`:
///   always), later executions checkpoint and go on;
/// - `{"hang_ms": N}`: blocks N ms without checkpointing (a hung worker; stops early when the
///   lease is lost);
/// - `{"effect": "non_idempotent" | "idempotent"}`: performs an effect; a non-idempotent one stays
///   pending (the write fence) for the rest of the execution;
/// - `{"await_approval": true}`: stops `waiting_for_approval` unless this execution was approved;
/// - `{"await_input": PROMPT}`: stops `waiting_for_input` (step `input_requested` with the prompt)
///   unless this execution was given input, which it records as step `input_received`;
/// - `{"output": V}`: completes with V (steps after it are not played);
/// - `{"step": NAME, "effect": E, "ms": N, "tokens_out": T, "result": V}`: a durable step
///   ([`RunContext::step`]): journaled once, replayed on every later execution. E is `pure`
///   (default), `idempotent`, `guarded` (retry with the same key), `guarded_park` or
///   `guarded_fail`; it works N ms, reports T completion tokens and returns V (default: its
///   name);
/// - `{"durable_sleep_ms": N}`: a durable sleep ([`RunContext::sleep`]): the worker is freed;
/// - `{"wait_signal": NAME, "timeout_ms": N}`: a durable wait for a signal
///   ([`RunContext::wait_for_signal`]); its data (or `"timeout"`) is checkpointed as step
///   `signal`.
///
/// With no `output` step the run completes with `null`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ScriptedAgent;

fn failure(class: &str) -> Result<ProviderError, AgentError> {
    let class: FailureClass = class.parse().map_err(|e| {
        AgentError::Provider(ProviderError::Configuration(format!("scripted fail: {e}")))
    })?;
    Ok(match class {
        FailureClass::CircuitOpen => ProviderError::CircuitOpen,
        FailureClass::Connection => ProviderError::Connection(None),
        FailureClass::Auth => ProviderError::http(401),
        FailureClass::RateLimit => ProviderError::http(429),
        FailureClass::ServerError => ProviderError::http(503),
        FailureClass::ClientError => ProviderError::http(400),
        FailureClass::Configuration => {
            ProviderError::Configuration("scripted configuration failure".into())
        }
        other => ProviderError::Other(format!("scripted {other} failure")),
    })
}

async fn wait(cx: &RunContext, ms: u64) -> Result<(), AgentError> {
    tokio::select! {
        () = tokio::time::sleep(Duration::from_millis(ms)) => Ok(()),
        () = cx.cancellation().cancelled() => Err(StepError::LeaseLost.into()),
    }
}

fn bad(step: &Value) -> AgentError {
    AgentError::Provider(ProviderError::Configuration(format!(
        "scripted: unknown step {step}"
    )))
}

#[async_trait::async_trait]
impl Agent for ScriptedAgent {
    async fn run(&self, cx: &mut RunContext) -> Result<AgentOutcome, AgentError> {
        let steps = cx
            .input()
            .get("steps")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for step in &steps {
            let Some(obj) = step.as_object() else {
                return Err(bad(step));
            };
            if let Some(name) = obj.get("step").and_then(Value::as_str) {
                // First: a durable step's `effect` is its kind, not the effect step below.
                durable_step(cx, name, obj).await?;
            } else if let Some(ms) = obj.get("sleep_ms").and_then(Value::as_u64) {
                wait(cx, ms).await?;
                cx.checkpoint(Step::new("sleep", json!({ "ms": ms })))
                    .await?;
            } else if let Some(class) = obj.get("fail").and_then(Value::as_str) {
                let attempts = obj
                    .get("attempts")
                    .and_then(Value::as_u64)
                    .unwrap_or(u64::MAX);
                if u64::from(cx.execution()) <= attempts {
                    return Err(failure(class)?.into());
                }
                cx.checkpoint(Step::new(
                    "attempt",
                    json!({ "class": class, "execution": cx.execution() }),
                ))
                .await?;
            } else if let Some(ms) = obj.get("hang_ms").and_then(Value::as_u64) {
                wait(cx, ms).await?;
            } else if let Some(kind) = obj.get("effect").and_then(Value::as_str) {
                match kind {
                    "non_idempotent" => cx.begin_effect("scripted").await?,
                    "idempotent" => {}
                    _ => return Err(bad(step)),
                }
                cx.checkpoint(Step::new("effect", json!({ "effect": kind })))
                    .await?;
            } else if obj.get("await_approval").and_then(Value::as_bool) == Some(true) {
                if !cx.approved() {
                    cx.checkpoint(Step::new("approval_requested", Value::Null))
                        .await?;
                    return Ok(AgentOutcome::AwaitingApproval);
                }
            } else if let Some(prompt) = obj.get("await_input") {
                match cx.provided_input().cloned() {
                    Some(input) => {
                        cx.checkpoint(Step::new("input_received", input)).await?;
                    }
                    None => {
                        cx.checkpoint(Step::new("input_requested", prompt.clone()))
                            .await?;
                        return Ok(AgentOutcome::AwaitingInput);
                    }
                }
            } else if let Some(ms) = obj.get("durable_sleep_ms").and_then(Value::as_u64) {
                cx.sleep(Duration::from_millis(ms)).await?;
            } else if let Some(name) = obj.get("wait_signal").and_then(Value::as_str) {
                let timeout = obj
                    .get("timeout_ms")
                    .and_then(Value::as_u64)
                    .map(Duration::from_millis);
                let got = match cx.wait_for_signal(name, timeout).await? {
                    crate::Signal::Received { data, .. } => data,
                    _ => json!("timeout"),
                };
                cx.checkpoint(Step::new("signal", got)).await?;
            } else if let Some(output) = obj.get("output") {
                cx.checkpoint(Step::new("output", output.clone())).await?;
                return Ok(AgentOutcome::Completed(output.clone()));
            } else {
                return Err(bad(step));
            }
        }
        Ok(AgentOutcome::Completed(Value::Null))
    }
}

/// A scripted durable step (see [`ScriptedAgent`]).
async fn durable_step(
    cx: &mut RunContext,
    name: &str,
    obj: &serde_json::Map<String, Value>,
) -> Result<(), AgentError> {
    use crate::{Effect, OnAmbiguous, Usage};
    let effect = match obj.get("effect").and_then(Value::as_str).unwrap_or("pure") {
        "pure" => Effect::Pure,
        "idempotent" => Effect::Idempotent,
        "guarded" => Effect::Guarded(OnAmbiguous::Retry),
        "guarded_park" => Effect::Guarded(OnAmbiguous::Park),
        "guarded_fail" => Effect::Guarded(OnAmbiguous::Fail),
        other => {
            return Err(AgentError::Provider(ProviderError::Configuration(format!(
                "scripted: unknown effect `{other}`"
            ))));
        }
    };
    let ms = obj.get("ms").and_then(Value::as_u64).unwrap_or(0);
    let tokens_out = obj.get("tokens_out").and_then(Value::as_u64).unwrap_or(0);
    let result = obj.get("result").cloned().unwrap_or_else(|| json!(name));
    let token = cx.cancellation().clone();
    let _: Value = cx
        .step(name, effect, |scope| async move {
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(ms)) => {}
                () = token.cancelled() => return Err(StepError::LeaseLost.into()),
            }
            if tokens_out > 0 {
                scope.report(Usage::tokens(0, tokens_out));
            }
            Ok(result)
        })
        .await?;
    Ok(())
}
