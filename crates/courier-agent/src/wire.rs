//! The OpenAI chat completions wire format: what a model step sends and what it journals.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// A tool call the model asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call's id, echoed in the tool's answer.
    pub id: String,
    /// The tool's name.
    pub name: String,
    /// Its arguments, as the model wrote them (JSON text, maybe invalid).
    pub arguments: String,
}

/// What a model step journals: the answer of the provider that gave it, and what it cost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelTurn {
    /// The provider that answered.
    pub provider: String,
    /// The model asked for.
    pub model: String,
    /// The assistant's text.
    pub content: Option<String>,
    /// The tools it asked for (empty: a final answer).
    #[serde(default)]
    pub tool_calls: Vec<ToolCall>,
    /// Why it stopped (`stop`, `tool_calls`, `length`...).
    pub finish_reason: Option<String>,
    /// Prompt tokens.
    pub tokens_in: u64,
    /// Completion tokens.
    pub tokens_out: u64,
    /// Their cost, micro-units.
    pub cost_micros: u64,
}

impl ModelTurn {
    /// The assistant message sent back to the model on the next turn.
    pub(crate) fn message(&self) -> Value {
        let mut message = json!({ "role": "assistant", "content": self.content });
        if !self.tool_calls.is_empty() {
            message["tool_calls"] = self
                .tool_calls
                .iter()
                .map(|c| {
                    json!({
                        "id": c.id,
                        "type": "function",
                        "function": { "name": c.name, "arguments": c.arguments },
                    })
                })
                .collect();
        }
        message
    }
}

#[derive(Deserialize)]
struct Completion {
    choices: Vec<Choice>,
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct Choice {
    message: WireMessage,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct WireMessage {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<WireToolCall>>,
}

#[derive(Deserialize)]
struct WireToolCall {
    id: String,
    function: WireFunction,
}

#[derive(Deserialize)]
struct WireFunction {
    name: String,
    #[serde(default)]
    arguments: Option<String>,
}

#[derive(Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
}

/// What a provider answered, parsed; `Err` names what breaks the protocol (never the body,
/// which may hold the user's data).
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) content: Option<String>,
    pub(crate) tool_calls: Vec<ToolCall>,
    pub(crate) finish_reason: Option<String>,
    pub(crate) tokens_in: u64,
    pub(crate) tokens_out: u64,
}

pub(crate) fn parse_reply(body: &[u8]) -> Result<Reply, String> {
    let completion: Completion = serde_json::from_slice(body)
        .map_err(|e| format!("the answer is not a chat completion: {e}"))?;
    let choice = completion
        .choices
        .into_iter()
        .next()
        .ok_or_else(|| "the answer has no choices".to_owned())?;
    let usage = completion.usage.unwrap_or(WireUsage {
        prompt_tokens: 0,
        completion_tokens: 0,
    });
    let tool_calls = choice
        .message
        .tool_calls
        .unwrap_or_default()
        .into_iter()
        .map(|c| ToolCall {
            id: c.id,
            name: c.function.name,
            arguments: c.function.arguments.unwrap_or_else(|| "{}".to_owned()),
        })
        .collect::<Vec<_>>();
    if choice.message.content.is_none() && tool_calls.is_empty() {
        return Err("the answer's message has neither content nor tool calls".to_owned());
    }
    Ok(Reply {
        content: choice.message.content,
        tool_calls,
        finish_reason: choice.finish_reason,
        tokens_in: usage.prompt_tokens,
        tokens_out: usage.completion_tokens,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_tool_calls_and_usage_and_refuses_broken_answers() {
        let body = br#"{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":null,
            "tool_calls":[{"id":"c1","type":"function","function":{"name":"add","arguments":"{\"a\":1}"}}]},
            "finish_reason":"tool_calls"}],"usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17}}"#;
        let reply = parse_reply(body).expect("parses");
        assert_eq!(reply.tool_calls[0].name, "add");
        assert_eq!(reply.tool_calls[0].arguments, "{\"a\":1}");
        assert_eq!((reply.tokens_in, reply.tokens_out), (12, 5));
        assert!(parse_reply(&body[..40]).is_err(), "truncated");
        assert!(
            parse_reply(b"{\"choices\":[]}")
                .expect_err("refused")
                .contains("no choices")
        );
        assert!(
            parse_reply(b"{\"usage\":{}}")
                .expect_err("refused")
                .contains("choices")
        );
        assert!(parse_reply(b"{\"choices\":[{\"message\":{}}]}").is_err());
    }
}
