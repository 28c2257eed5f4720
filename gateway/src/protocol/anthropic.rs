//! Anthropic Messages (`/v1/messages`): what Claude Code sends (and Pi / Qwen Code in
//! Anthropic mode), translated to OpenAI Chat Completions for vLLM and back.
//!
//! Request rules:
//! - `system` (string or text blocks, `cache_control` ignored) → one leading system message.
//! - user `tool_result` blocks → `tool` messages (first, right after the assistant's tool
//!   calls), the user's other blocks → one user message after them; `is_error` results are
//!   prefixed with `Error: `.
//! - assistant `text` → content, `tool_use` → `tool_calls` (a missing id gets a stable invented
//!   one), `thinking` → `reasoning_content` (its opaque `signature` is not sent upstream),
//!   `redacted_thinking` → dropped (nothing readable in it).
//! - `image` blocks (base64 or URL) → `image_url` parts.
//! - custom tools → functions (`input_schema` → `parameters`, `strict` kept; `cache_control`,
//!   `defer_loading` ignored); Anthropic-hosted tools (`web_search_*`, `bash_*`, …, anything
//!   with a `type` other than `custom`) are dropped and counted in [`Normalized::dropped`].
//! - `thinking.type` enabled/disabled → `chat_template_kwargs.enable_thinking`.
//! - `output_config.format` (`json_schema`) → `response_format`: vLLM's guided decoding.
//!
//! Reply: a stop on one of the caller's `stop_sequences` is `stop_reason: "stop_sequence"`
//! with the matched string, as Anthropic reports it.

use serde_json::{json, Map, Value};

use super::{
    assistant_message, call_arguments, call_as_text, json_schema_of_format, matched_stop_sequence,
    reasoning_of, Normalized, ProtocolError,
};

fn invalid(msg: impl Into<String>) -> ProtocolError {
    ProtocolError::InvalidRequest(msg.into())
}

fn text_blocks(content: &Value, what: &str) -> Result<String, ProtocolError> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => blocks
            .iter()
            .map(|b| match b["type"].as_str() {
                Some("text") => b["text"]
                    .as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| invalid(format!("{what}: text block without text"))),
                Some("image") => Ok(super::media::TOOL_RESULT_IMAGE_NOTE.to_string()),
                Some("document") => Ok(super::media::TOOL_RESULT_FILE_NOTE.to_string()),
                _ => Ok(String::new()),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(|t| super::join_texts(t.iter().map(String::as_str))),
        Value::Null => Ok(String::new()),
        _ => Err(invalid(format!(
            "{what} must be a string or an array of blocks"
        ))),
    }
}

fn image_part(block: &Value) -> Option<Value> {
    let src = &block["source"];
    let url = match src["type"].as_str()? {
        "base64" => format!(
            "data:{};base64,{}",
            src["media_type"].as_str()?,
            src["data"].as_str()?
        ),
        "url" => src["url"].as_str()?.to_string(),
        _ => return None,
    };
    Some(json!({"type": "image_url", "image_url": {"url": url}}))
}

/// A `/v1/messages` request.
pub fn normalize(body: &[u8]) -> Result<Normalized, ProtocolError> {
    normalize_value(super::parse_body(body)?)
}

/// A parsed `/v1/messages` request.
pub fn normalize_value(value: Value) -> Result<Normalized, ProtocolError> {
    translate(value, true)
}

/// A `/v1/messages/count_tokens` request: the same body without `max_tokens`.
pub fn normalize_count(body: &[u8]) -> Result<Normalized, ProtocolError> {
    translate(super::parse_body(body)?, false)
}

fn translate(value: Value, generate: bool) -> Result<Normalized, ProtocolError> {
    let Value::Object(req) = value else {
        return Err(invalid("body must be a JSON object"));
    };
    let model = req
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("claude")
        .to_string();
    let stream = match req.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(invalid("stream must be a boolean")),
    };
    let Some(Value::Array(messages)) = req.get("messages") else {
        return Err(invalid("messages must be an array"));
    };
    let mut dropped = Vec::new();
    let mut out = Vec::new();
    // The top-level `system` and any `system` message inside `messages` (Claude Code sends
    // those mid-conversation) become one leading system message, in order: chat templates
    // accept a system message only first.
    let mut system = Vec::new();
    let top = text_blocks(req.get("system").unwrap_or(&Value::Null), "system")?;
    if !top.is_empty() {
        system.push(top);
    }
    let mut invented = 0usize;
    for (i, m) in messages.iter().enumerate() {
        let role = m["role"]
            .as_str()
            .ok_or_else(|| invalid(format!("messages[{i}].role must be a string")))?;
        let blocks: Vec<Value> = match &m["content"] {
            Value::String(s) => vec![json!({"type": "text", "text": s})],
            Value::Array(b) => b.clone(),
            _ => {
                return Err(invalid(format!(
                    "messages[{i}].content must be a string or an array of blocks"
                )))
            }
        };
        match role {
            "user" => {
                let mut parts = Vec::new();
                for b in &blocks {
                    match b["type"].as_str() {
                        Some("tool_result") => {
                            let id = b["tool_use_id"].as_str().ok_or_else(|| {
                                invalid(format!("messages[{i}]: tool_result without tool_use_id"))
                            })?;
                            for c in b["content"].as_array().into_iter().flatten() {
                                match c["type"].as_str() {
                                    Some("image") => dropped.push("tool_result_image".to_string()),
                                    Some("document") => {
                                        dropped.push("tool_result_file".to_string())
                                    }
                                    Some("text") => {}
                                    // Not passed to the model (`tool_reference`,
                                    // `search_result`, …): counted, as every drop is.
                                    other => dropped.push(format!(
                                        "tool_result_block:{}",
                                        other.unwrap_or("untyped")
                                    )),
                                }
                            }
                            let mut text = text_blocks(
                                &b["content"],
                                &format!("messages[{i}] tool_result content"),
                            )?;
                            if b["is_error"] == json!(true) {
                                text = format!("Error: {text}");
                            }
                            out.push(json!({"role": "tool", "tool_call_id": id, "content": text}));
                        }
                        Some("text") => parts.push(json!({"type": "text", "text": b["text"]})),
                        Some("image") => match image_part(b) {
                            Some(p) => parts.push(p),
                            None => {
                                return Err(invalid(format!(
                                    "messages[{i}]: image source must be base64 or url"
                                )))
                            }
                        },
                        // Told, not left to think it read the file.
                        Some("document") => {
                            dropped.push("document".to_string());
                            parts
                                .push(json!({"type": "text", "text": super::media::DOCUMENT_NOTE}));
                        }
                        other => {
                            return Err(invalid(format!(
                                "messages[{i}]: user block type {other:?} is not supported"
                            )))
                        }
                    }
                }
                if parts.iter().all(|p| p["type"] == "text") {
                    let text = super::join_texts(parts.iter().filter_map(|p| p["text"].as_str()));
                    if !text.is_empty() {
                        out.push(json!({"role": "user", "content": text}));
                    }
                } else {
                    out.push(json!({"role": "user", "content": parts}));
                }
            }
            "assistant" => {
                let mut text = String::new();
                let mut reasoning = String::new();
                let mut calls = Vec::new();
                for b in &blocks {
                    match b["type"].as_str() {
                        Some("text") => text.push_str(b["text"].as_str().unwrap_or_default()),
                        Some("thinking") => {
                            reasoning.push_str(b["thinking"].as_str().unwrap_or_default())
                        }
                        Some("redacted_thinking") => dropped.push("redacted_thinking".to_string()),
                        Some("tool_use") => {
                            let id = match b["id"].as_str() {
                                Some(id) if !id.is_empty() => id.to_string(),
                                _ => {
                                    invented += 1;
                                    format!("toolu_floe_{i}_{invented}")
                                }
                            };
                            let name = b["name"].as_str().ok_or_else(|| {
                                invalid(format!("messages[{i}]: tool_use without name"))
                            })?;
                            let input = if b["input"].is_null() {
                                json!({})
                            } else {
                                b["input"].clone()
                            };
                            calls.push(json!({"id": id, "type": "function", "function": {"name": name, "arguments": input.to_string()}}));
                        }
                        other => {
                            return Err(invalid(format!(
                                "messages[{i}]: assistant block type {other:?} is not supported"
                            )))
                        }
                    }
                }
                out.push(assistant_message(text, reasoning, calls));
            }
            "system" => {
                let text = text_blocks(&m["content"], &format!("messages[{i}] system content"))?;
                if !text.is_empty() {
                    system.push(text);
                }
            }
            other => {
                return Err(invalid(format!(
                    "messages[{i}].role {other:?} must be user, assistant or system"
                )))
            }
        }
    }
    if out.is_empty() {
        return Err(invalid("messages must not be empty"));
    }
    if !system.is_empty() {
        out.insert(0, json!({"role": "system", "content": system.join("\n\n")}));
    }
    // A conversation that ends in the assistant's words is a prefill: Anthropic continues it.
    // vLLM's default closes that turn and opens a new one, answering another question.
    let prefill = out
        .last()
        .is_some_and(|m| m["role"] == "assistant" && m.get("tool_calls").is_none());
    let mut request = Map::new();
    request.insert("messages".into(), Value::Array(out));
    if prefill {
        request.insert("continue_final_message".into(), true.into());
        request.insert("add_generation_prompt".into(), false.into());
    }
    match req.get("max_tokens").and_then(Value::as_u64) {
        Some(max_tokens) => {
            request.insert("max_tokens".into(), max_tokens.into());
        }
        None if generate => return Err(invalid("max_tokens is required")),
        None => {}
    }
    for (from, to) in [
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("top_k", "top_k"),
        ("stop_sequences", "stop"),
    ] {
        if let Some(v) = req.get(from).filter(|v| !v.is_null()) {
            request.insert(to.into(), v.clone());
        }
    }
    if let Some(Value::Array(tools)) = req.get("tools") {
        let mut functions = Vec::new();
        for t in tools {
            match t["type"].as_str() {
                None | Some("custom") => functions.push(super::function_tool(
                    &t["name"],
                    t.get("description"),
                    t.get("input_schema")
                        .cloned()
                        .unwrap_or(json!({"type": "object"})),
                    t["strict"].as_bool(),
                )),
                Some(hosted) => dropped.push(format!("hosted_tool:{hosted}")),
            }
        }
        if !functions.is_empty() {
            request.insert("tools".into(), Value::Array(functions));
        }
    }
    if let Some(choice) = req.get("tool_choice").filter(|c| !c.is_null()) {
        let mapped = match choice["type"].as_str() {
            Some("auto") => json!("auto"),
            Some("any") => json!("required"),
            Some("none") => json!("none"),
            Some("tool") => json!({"type": "function", "function": {"name": choice["name"]}}),
            other => {
                return Err(invalid(format!(
                    "tool_choice.type {other:?} is not supported"
                )))
            }
        };
        if request.contains_key("tools") || mapped == json!("none") {
            request.insert("tool_choice".into(), mapped);
        }
        if choice["disable_parallel_tool_use"] == json!(true) {
            request.insert("parallel_tool_calls".into(), false.into());
        }
    }
    match req.get("thinking").and_then(|t| t["type"].as_str()) {
        Some("enabled") | Some("adaptive") => {
            request.insert(
                "chat_template_kwargs".into(),
                json!({"enable_thinking": true}),
            );
        }
        Some("disabled") => {
            request.insert(
                "chat_template_kwargs".into(),
                json!({"enable_thinking": false}),
            );
        }
        _ => {}
    }
    if let Some(format) = req
        .get("output_config")
        .and_then(|c| c.get("format"))
        .filter(|f| !f.is_null())
    {
        match format["type"].as_str() {
            Some("json_schema") => {
                request.insert(
                    "response_format".into(),
                    json_schema_of_format(format, "output_config.format", "output")?,
                );
            }
            other => {
                return Err(invalid(format!(
                    "output_config.format.type {other:?} is not supported: use json_schema"
                )))
            }
        }
    }
    Ok(Normalized {
        request,
        stream,
        model,
        dropped,
        ..Default::default()
    })
}

fn stop_reason(finish: Option<&str>) -> &'static str {
    match finish {
        Some("length") => "max_tokens",
        Some("tool_calls") => "tool_use",
        _ => "end_turn",
    }
}

/// Anthropic content blocks from a Chat Completions message. A tool call whose arguments are
/// not a JSON object cannot be a `tool_use`: it is returned as text.
fn content_blocks(message: &Value) -> Vec<Value> {
    let mut blocks = Vec::new();
    if let Some(r) = reasoning_of(message) {
        // floe's signature: an opaque marker, round-tripped by the harness and ignored on return.
        blocks.push(json!({"type": "thinking", "thinking": r, "signature": "floe"}));
    }
    if let Some(t) = message["content"].as_str().filter(|t| !t.is_empty()) {
        blocks.push(json!({"type": "text", "text": t}));
    }
    for call in message["tool_calls"].as_array().into_iter().flatten() {
        match call_arguments(call) {
            Some(input) => blocks.push(json!({"type": "tool_use", "id": call["id"], "name": call["function"]["name"], "input": input})),
            None => blocks.push(json!({"type": "text", "text": call_as_text(call)})),
        }
    }
    blocks
}

/// The Anthropic message for an upstream Chat Completions response.
pub fn response(upstream: &Value, model: &str) -> Value {
    let choice = &upstream["choices"][0];
    let content = content_blocks(&choice["message"]);
    let has_tool_use = content.iter().any(|b| b["type"] == "tool_use");
    let finish = choice["finish_reason"].as_str();
    let stop_sequence = matched_stop_sequence(choice);
    // A message that ends in tool calls is `tool_use` whatever vLLM's finish reason: a call
    // forced by name (`tool_choice: tool`) finishes with "stop" there.
    let reason = if stop_sequence.is_some() {
        "stop_sequence"
    } else if has_tool_use && finish != Some("length") {
        "tool_use"
    } else if finish == Some("tool_calls") {
        "end_turn"
    } else {
        stop_reason(finish)
    };
    let id = upstream["id"]
        .as_str()
        .unwrap_or("floe")
        .trim_start_matches("chatcmpl-");
    json!({
        "id": format!("msg_{id}"), "type": "message", "role": "assistant", "model": model,
        "content": content, "stop_reason": reason, "stop_sequence": stop_sequence,
        "usage": {"input_tokens": upstream["usage"]["prompt_tokens"], "output_tokens": upstream["usage"]["completion_tokens"],
                  "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
    })
}

/// The message as Anthropic SSE events: `(event name, data)`.
pub fn stream_events(message: &Value) -> Vec<(String, Value)> {
    let mut start = message.clone();
    start["content"] = json!([]);
    start["stop_reason"] = Value::Null;
    start["stop_sequence"] = Value::Null;
    start["usage"]["output_tokens"] = 0.into();
    let mut events = vec![(
        "message_start".to_string(),
        json!({"type": "message_start", "message": start}),
    )];
    for (index, block) in message["content"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let (empty, deltas) = match block["type"].as_str() {
            Some("thinking") => (
                json!({"type": "thinking", "thinking": "", "signature": ""}),
                vec![
                    json!({"type": "thinking_delta", "thinking": block["thinking"]}),
                    json!({"type": "signature_delta", "signature": block["signature"]}),
                ],
            ),
            Some("tool_use") => (
                json!({"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}),
                vec![
                    json!({"type": "input_json_delta", "partial_json": block["input"].to_string()}),
                ],
            ),
            _ => (
                json!({"type": "text", "text": ""}),
                vec![json!({"type": "text_delta", "text": block["text"]})],
            ),
        };
        events.push((
            "content_block_start".into(),
            json!({"type": "content_block_start", "index": index, "content_block": empty}),
        ));
        for delta in deltas {
            events.push((
                "content_block_delta".into(),
                json!({"type": "content_block_delta", "index": index, "delta": delta}),
            ));
        }
        events.push((
            "content_block_stop".into(),
            json!({"type": "content_block_stop", "index": index}),
        ));
    }
    events.push((
        "message_delta".into(),
        json!({"type": "message_delta", "delta": {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]},
               "usage": {"output_tokens": message["usage"]["output_tokens"]}}),
    ));
    events.push(("message_stop".into(), json!({"type": "message_stop"})));
    events
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(v: Value) -> Normalized {
        normalize(v.to_string().as_bytes()).expect("valid request")
    }

    #[test]
    fn a_users_text_blocks_are_a_line_apart_as_vllm_joins_a_chat_messages() {
        // Claude Code's reminder block and the prompt: not "</system-reminder>fix the test".
        let body = json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "<system-reminder>x</system-reminder>"},
            {"type": "text", "text": "fix the test"}]}]});
        let n = normalize(body.to_string().as_bytes()).expect("valid");
        assert_eq!(
            n.request["messages"][0]["content"],
            "<system-reminder>x</system-reminder>\nfix the test"
        );
    }

    #[test]
    fn a_claude_code_shaped_request_maps_to_chat() {
        let n = norm(json!({
            "model": "claude-sonnet-4-5", "max_tokens": 32000, "stream": true,
            "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
                       {"type": "text", "text": " Be concise."}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "fix the test"}]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "look first", "signature": "abc"},
                    {"type": "text", "text": "Reading."},
                    {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"path": "a.py"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "print(1)"}]},
                    {"type": "text", "text": "go on"}]}],
            "tools": [{"name": "Read", "description": "read", "input_schema": {"type": "object"}, "cache_control": {"type": "ephemeral"}},
                      {"type": "web_search_20250305", "name": "web_search"}],
            "tool_choice": {"type": "auto"}, "thinking": {"type": "enabled", "budget_tokens": 1024},
            "metadata": {"user_id": "u"}, "temperature": 1
        }));
        assert!(n.stream);
        assert_eq!(n.model, "claude-sonnet-4-5");
        assert_eq!(n.dropped, ["hosted_tool:web_search_20250305"]);
        let m = &n.request["messages"];
        assert_eq!(
            m[0],
            // Blocks a line apart, as vLLM joins a Chat message's text parts.
            json!({"role": "system", "content": "You are Claude Code.\n Be concise."})
        );
        assert_eq!(m[1], json!({"role": "user", "content": "fix the test"}));
        assert_eq!(m[2]["reasoning_content"], "look first");
        assert_eq!(m[2]["content"], "Reading.");
        assert_eq!(
            m[2]["tool_calls"][0]["function"],
            json!({"name": "Read", "arguments": "{\"path\":\"a.py\"}"})
        );
        assert_eq!(
            m[3],
            json!({"role": "tool", "tool_call_id": "toolu_1", "content": "print(1)"})
        );
        assert_eq!(m[4], json!({"role": "user", "content": "go on"}));
        assert_eq!(n.request["tools"].as_array().map(Vec::len), Some(1));
        assert_eq!(n.request["tool_choice"], "auto");
        assert_eq!(
            n.request["chat_template_kwargs"],
            json!({"enable_thinking": true})
        );
        assert_eq!(n.request["max_tokens"], 32000);
        assert!(n.request.get("metadata").is_none());
    }

    #[test]
    fn system_messages_inside_messages_join_the_leading_system_message() {
        let n = norm(
            json!({"max_tokens": 10, "system": [{"type": "text", "text": "You are Claude Code."}],
            "messages": [
                {"role": "user", "content": "fix it"},
                {"role": "system", "content": "Reminder: be brief."},
                {"role": "assistant", "content": "ok"}]}),
        );
        let m = &n.request["messages"];
        assert_eq!(
            m[0],
            json!({"role": "system", "content": "You are Claude Code.\n\nReminder: be brief."})
        );
        let roles: Vec<_> = m
            .as_array()
            .into_iter()
            .flatten()
            .map(|m| m["role"].clone())
            .collect();
        assert_eq!(roles, [json!("system"), json!("user"), json!("assistant")]);
    }

    #[test]
    fn missing_tool_ids_are_invented_and_errors_marked() {
        let n = norm(json!({"max_tokens": 10, "messages": [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": [{"type": "tool_use", "name": "ls", "input": null}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "is_error": true, "content": "boom"}]}]}));
        let m = &n.request["messages"];
        assert_eq!(m[1]["tool_calls"][0]["id"], "toolu_floe_1_1");
        assert_eq!(m[1]["tool_calls"][0]["function"]["arguments"], "{}");
        assert_eq!(m[2]["content"], "Error: boom");
    }

    #[test]
    fn a_tool_result_block_not_passed_on_is_counted() {
        let n = norm(json!({"max_tokens": 10, "messages": [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "find", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
                {"type": "text", "text": "found"},
                {"type": "tool_reference", "tool_name": "Grep"}]}]}]}));
        assert_eq!(n.request["messages"][2]["content"], "found");
        assert_eq!(n.dropped, ["tool_result_block:tool_reference"]);
    }

    /// Claude Code reading a PNG: the tool result's image cannot ride in a Chat tool message,
    /// so the agent is told (not handed an empty result) and the drop is counted.
    #[test]
    fn an_image_in_a_tool_result_becomes_a_note_and_is_counted() {
        let n = norm(json!({"max_tokens": 10, "messages": [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "Read", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
                {"type": "text", "text": "a.png: "},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}]}]}));
        let text = n.request["messages"][2]["content"]
            .as_str()
            .unwrap_or_default();
        assert_eq!(
            text,
            format!(
                "a.png: \n{}",
                crate::protocol::media::TOOL_RESULT_IMAGE_NOTE
            )
        );
        assert_eq!(n.dropped, ["tool_result_image"]);
    }

    /// A last assistant message is a prefill, continued, not closed and answered anew.
    #[test]
    fn a_prefill_is_continued() {
        let n = norm(json!({"max_tokens": 10, "messages": [
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "The answer is"}]}));
        assert_eq!(n.request["continue_final_message"], true);
        assert_eq!(n.request["add_generation_prompt"], false);
        let n = norm(json!({"max_tokens": 10, "messages": [{"role": "user", "content": "2+2?"}]}));
        assert!(n.request.get("continue_final_message").is_none());
        assert!(n.request.get("add_generation_prompt").is_none());
    }

    /// Claude Code answers a Read of a PDF with a text block and a `document` block: the model
    /// was told the read worked and saw none of it, and nothing was counted.
    #[test]
    fn a_document_in_a_tool_result_or_from_the_user_becomes_a_note_and_is_counted() {
        use crate::protocol::media::{DOCUMENT_NOTE, TOOL_RESULT_FILE_NOTE};
        let pdf = json!({"type": "document", "source": {"type": "base64",
                         "media_type": "application/pdf", "data": "JVBERi0="}});
        let n = norm(json!({"max_tokens": 10, "messages": [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "Read", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
                {"type": "text", "text": "PDF file read: a.pdf (12 KB)"}, pdf.clone()]},
                pdf, {"type": "text", "text": "and this one?"}]}]}));
        let m = &n.request["messages"];
        assert_eq!(
            m[2]["content"],
            format!("PDF file read: a.pdf (12 KB)\n{TOOL_RESULT_FILE_NOTE}")
        );
        assert_eq!(m[3]["content"], format!("{DOCUMENT_NOTE}\nand this one?"));
        assert_eq!(n.dropped, ["tool_result_file", "document"]);
    }

    #[test]
    fn bad_requests_name_the_problem() {
        for (body, needle) in [
            (
                json!({"messages": [{"role": "user", "content": "x"}]}),
                "max_tokens is required",
            ),
            (
                json!({"max_tokens": 1, "messages": {}}),
                "messages must be an array",
            ),
            (
                json!({"max_tokens": 1, "messages": [{"role": "tool", "content": "x"}]}),
                "must be user, assistant or system",
            ),
            (
                json!({"max_tokens": 1, "messages": [{"role": "system", "content": "x"}]}),
                "must not be empty",
            ),
            (
                json!({"max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "hologram"}]}]}),
                "\"hologram\"",
            ),
            (
                json!({"max_tokens": 1, "messages": []}),
                "must not be empty",
            ),
        ] {
            let err = normalize(body.to_string().as_bytes()).expect_err("invalid");
            assert!(err.to_string().contains(needle), "{body}: {err}");
            assert_eq!(err.body(crate::capture::Api::Anthropic)["type"], "error");
        }
    }

    #[test]
    fn responses_and_stream_events_follow_the_messages_api() {
        let upstream = json!({"id": "chatcmpl-42", "usage": {"prompt_tokens": 7, "completion_tokens": 5},
            "choices": [{"finish_reason": "tool_calls", "message": {"content": "Let me run it.", "reasoning_content": "hmm",
                "tool_calls": [{"id": "call_9", "function": {"name": "Bash", "arguments": "{\"command\": \"ls\"}"}}]}}]});
        let msg = response(&upstream, "claude-x");
        assert_eq!(msg["id"], "msg_42");
        assert_eq!(msg["stop_reason"], "tool_use");
        let types: Vec<&str> = msg["content"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|b| b["type"].as_str())
            .collect();
        assert_eq!(types, ["thinking", "text", "tool_use"]);
        assert_eq!(msg["content"][2]["input"], json!({"command": "ls"}));
        assert_eq!(msg["usage"]["input_tokens"], 7);
        let events = stream_events(&msg);
        let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names.first(), Some(&"message_start"));
        assert_eq!(names.last(), Some(&"message_stop"));
        assert_eq!(
            names
                .iter()
                .filter(|n| **n == "content_block_start")
                .count(),
            3
        );
        let json_delta = events
            .iter()
            .find(|(_, d)| d["delta"]["type"] == "input_json_delta")
            .expect("tool delta");
        assert_eq!(
            serde_json::from_str::<Value>(
                json_delta.1["delta"]["partial_json"].as_str().unwrap_or("")
            )
            .ok(),
            Some(json!({"command": "ls"}))
        );
        assert_eq!(
            events[events.len() - 2].1["delta"]["stop_reason"],
            "tool_use"
        );
    }

    #[test]
    fn a_forced_tool_call_is_tool_use() {
        let upstream = json!({"choices": [{"finish_reason": "stop", "message": {"content": "",
            "tool_calls": [{"id": "c", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}}]});
        assert_eq!(response(&upstream, "m")["stop_reason"], "tool_use");
    }

    /// The keys of a call's input in the order the model sampled them, both ways: the chat
    /// template renders the next turn's history with them as they come, so a sorted copy
    /// (`file_path, new_string, old_string` where Claude Code's Edit was sampled
    /// `file_path, old_string, new_string`) re-renders the model's own tokens and splits the
    /// session's prefix-merged chain at every such call.
    #[test]
    fn a_tool_calls_input_keeps_the_order_the_model_sampled() {
        let sampled = r#"{"file_path": "a.py", "old_string": "x", "new_string": "y"}"#;
        let upstream = json!({"choices": [{"finish_reason": "tool_calls", "message": {"content": null,
            "tool_calls": [{"id": "c", "function": {"name": "Edit", "arguments": sampled}}]}}]});
        let input = &response(&upstream, "m")["content"][0]["input"];
        assert_eq!(
            input.to_string(),
            r#"{"file_path":"a.py","old_string":"x","new_string":"y"}"#
        );
        let next = json!({"model": "m", "max_tokens": 8, "messages": [
            {"role": "user", "content": "fix it"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "c", "name": "Edit", "input": input}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c", "content": "done"}]}],
            "tools": [{"name": "Edit", "input_schema": {"type": "object", "properties": {
                "file_path": {"type": "string"}, "old_string": {"type": "string"},
                "new_string": {"type": "string"}}}}]});
        let n = normalize(next.to_string().as_bytes()).expect("valid");
        assert_eq!(
            n.request["messages"][1]["tool_calls"][0]["function"]["arguments"],
            r#"{"file_path":"a.py","old_string":"x","new_string":"y"}"#
        );
        // The tool's schema reaches the template in the harness's order too.
        let properties: Vec<&String> = n.request["tools"][0]["function"]["parameters"]
            ["properties"]
            .as_object()
            .expect("properties")
            .keys()
            .collect();
        assert_eq!(properties, ["file_path", "old_string", "new_string"]);
    }

    #[test]
    fn an_unparsable_tool_call_comes_back_as_text() {
        let upstream = json!({"choices": [{"finish_reason": "tool_calls", "message": {"content": null,
            "tool_calls": [{"id": "c", "function": {"name": "Bash", "arguments": "{not json"}}]}}]});
        let msg = response(&upstream, "m");
        assert_eq!(
            msg["content"][0],
            json!({"type": "text", "text": "Bash({not json)"})
        );
        assert_eq!(msg["stop_reason"], "end_turn");
    }

    #[test]
    fn a_stop_on_a_callers_sequence_is_reported_with_the_sequence() {
        // vLLM names the matched string in `stop_reason`; a number there is a stop token.
        let upstream = json!({"choices": [{"finish_reason": "stop", "stop_reason": "END",
            "message": {"content": "one two"}}]});
        let msg = response(&upstream, "m");
        assert_eq!(msg["stop_reason"], "stop_sequence");
        assert_eq!(msg["stop_sequence"], "END");
        let events = stream_events(&msg);
        assert_eq!(events[0].1["message"]["stop_sequence"], Value::Null);
        let delta = &events[events.len() - 2].1["delta"];
        assert_eq!(
            (&delta["stop_reason"], &delta["stop_sequence"]),
            (&json!("stop_sequence"), &json!("END"))
        );
        for eos in [json!(2), Value::Null] {
            let upstream = json!({"choices": [{"finish_reason": "stop", "stop_reason": eos,
                "message": {"content": "done"}}]});
            let msg = response(&upstream, "m");
            assert_eq!(
                (&msg["stop_reason"], &msg["stop_sequence"]),
                (&json!("end_turn"), &Value::Null)
            );
        }
        // SGLang's field.
        let sglang = json!({"choices": [{"finish_reason": "stop", "matched_stop": "\n\n",
            "message": {"content": "x"}}]});
        assert_eq!(response(&sglang, "m")["stop_sequence"], "\n\n");
    }

    #[test]
    fn structured_output_reaches_guided_decoding() {
        let schema =
            json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]});
        let n = norm(json!({"model": "m", "max_tokens": 8,
            "messages": [{"role": "user", "content": "n?"}],
            "output_config": {"format": {"type": "json_schema", "schema": schema}}}));
        assert_eq!(
            n.request["response_format"],
            json!({"type": "json_schema", "json_schema": {"name": "output", "schema": schema}})
        );
        for bad in [
            json!({"type": "json_schema"}),
            json!({"type": "regex", "schema": {}}),
        ] {
            let body = json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "n?"}],
                "output_config": {"format": bad}});
            let err = normalize(body.to_string().as_bytes()).expect_err("refused");
            assert!(err.to_string().contains("output_config.format"), "{err}");
        }
    }
}
