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

/// Folds an OpenAI-compatible SSE stream (`stream: true`: `data: {chunk}` lines, then `data:
/// [DONE]`) into the [`Reply`] the same answer would have been without streaming: content
/// deltas concatenated, tool call deltas joined by index, the last `finish_reason`, the `usage`
/// of the last chunk that has one (`stream_options.include_usage`).
#[derive(Debug, Default)]
pub(crate) struct StreamFold {
    /// Bytes of an unfinished line.
    pending: Vec<u8>,
    content: Option<String>,
    /// (id, name, arguments) by index.
    tool_calls: Vec<(String, String, String)>,
    finish_reason: Option<String>,
    tokens_in: u64,
    tokens_out: u64,
    done: bool,
}

impl StreamFold {
    /// Feeds bytes of the body; returns the content text they added (what a reader would see).
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> Result<String, String> {
        self.pending.extend_from_slice(bytes);
        let mut added = String::new();
        while let Some(end) = self.pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            added.push_str(&self.line(line.trim_end_matches(['\r', '\n']))?);
        }
        Ok(added)
    }

    fn line(&mut self, line: &str) -> Result<String, String> {
        let Some(data) = line.strip_prefix("data:") else {
            // Comments, `event:`, `id:`, blank separators.
            return Ok(String::new());
        };
        let data = data.trim_start();
        if data == "[DONE]" {
            self.done = true;
            return Ok(String::new());
        }
        if self.done {
            return Err("a chunk after [DONE]".to_owned());
        }
        let chunk: Value =
            serde_json::from_str(data).map_err(|e| format!("a stream chunk is not JSON: {e}"))?;
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
            self.tokens_in = usage["prompt_tokens"].as_u64().unwrap_or(self.tokens_in);
            self.tokens_out = usage["completion_tokens"]
                .as_u64()
                .unwrap_or(self.tokens_out);
        }
        let Some(choice) = chunk["choices"].as_array().and_then(|c| c.first()) else {
            return Ok(String::new());
        };
        if let Some(reason) = choice["finish_reason"].as_str() {
            self.finish_reason = Some(reason.to_owned());
        }
        let delta = &choice["delta"];
        let mut added = String::new();
        if let Some(text) = delta["content"].as_str() {
            self.content.get_or_insert_with(String::new).push_str(text);
            added.push_str(text);
        }
        for call in delta["tool_calls"]
            .as_array()
            .map_or(&[][..], Vec::as_slice)
        {
            let index = call["index"]
                .as_u64()
                .and_then(|i| usize::try_from(i).ok())
                .unwrap_or(self.tool_calls.len().saturating_sub(1));
            if index > 64 {
                return Err(format!("a tool call index of {index}"));
            }
            while self.tool_calls.len() <= index {
                self.tool_calls.push(Default::default());
            }
            let slot = &mut self.tool_calls[index];
            if let Some(id) = call["id"].as_str() {
                slot.0 = id.to_owned();
            }
            if let Some(name) = call["function"]["name"].as_str() {
                slot.1.push_str(name);
            }
            if let Some(args) = call["function"]["arguments"].as_str() {
                slot.2.push_str(args);
            }
        }
        Ok(added)
    }

    /// Whether `[DONE]` arrived.
    pub(crate) fn is_complete(&self) -> bool {
        self.done
    }

    /// The folded answer; `Err(true)` when the stream ended before `[DONE]` (cut mid-way),
    /// `Err(false)` with a detail when what came breaks the protocol.
    pub(crate) fn finish(mut self) -> Result<Reply, Result<String, String>> {
        if !self.done && !self.pending.is_empty() {
            // A last line without its newline: complete only if it is the `[DONE]`.
            let rest = String::from_utf8_lossy(&std::mem::take(&mut self.pending)).into_owned();
            if rest
                .trim_end_matches('\r')
                .strip_prefix("data:")
                .map(str::trim)
                == Some("[DONE]")
            {
                self.done = true;
            }
        }
        if !self.done {
            // Cut mid-way (maybe mid-line): the connection failed, not the protocol.
            return Err(Err("the stream ended before `data: [DONE]`".to_owned()));
        }
        let tool_calls: Vec<ToolCall> = self
            .tool_calls
            .into_iter()
            .map(|(id, name, arguments)| ToolCall {
                id,
                name,
                arguments: if arguments.is_empty() {
                    "{}".to_owned()
                } else {
                    arguments
                },
            })
            .collect();
        if tool_calls.iter().any(|c| c.name.is_empty()) {
            return Err(Ok("a streamed tool call has no name".to_owned()));
        }
        if self.content.is_none() && tool_calls.is_empty() {
            return Err(Ok(
                "the stream has neither content nor tool calls".to_owned()
            ));
        }
        Ok(Reply {
            content: self.content,
            tool_calls,
            finish_reason: self.finish_reason,
            tokens_in: self.tokens_in,
            tokens_out: self.tokens_out,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folds_a_stream_of_content_and_tool_call_deltas() {
        let stream = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hel\"}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"}}]}\r\n\r\n",
            ": keep-alive\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c1\",\"function\":{\"name\":\"add\",\"arguments\":\"{\\\"a\\\"\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\":1}\"}}]},\"finish_reason\":\"tool_calls\"}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3}}\n\n",
            "data: [DONE]\n\n",
        );
        // Fed in awkward pieces: lines cut anywhere.
        let mut fold = StreamFold::default();
        let mut seen = String::new();
        for piece in stream.as_bytes().chunks(7) {
            seen.push_str(&fold.feed(piece).expect("fed"));
        }
        assert_eq!(seen, "Hello");
        let reply = fold.finish().expect("folded");
        assert_eq!(reply.content.as_deref(), Some("Hello"));
        assert_eq!(reply.tool_calls[0].name, "add");
        assert_eq!(reply.tool_calls[0].arguments, "{\"a\":1}");
        assert_eq!(reply.finish_reason.as_deref(), Some("tool_calls"));
        assert_eq!((reply.tokens_in, reply.tokens_out), (7, 3));

        // Cut before [DONE]: a connection failure, not a protocol one.
        let mut cut = StreamFold::default();
        cut.feed(&stream.as_bytes()[..90]).expect("fed");
        assert!(matches!(cut.finish(), Err(Err(_))));
        // A chunk that is not JSON breaks the protocol.
        let mut bad = StreamFold::default();
        assert!(bad.feed(b"data: {nope\n").is_err());
    }

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
