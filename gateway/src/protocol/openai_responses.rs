//! OpenAI Responses (`/v1/responses`): what Codex CLI sends, translated to Chat Completions
//! for vLLM and back.
//!
//! Request rules:
//! - `instructions` and `system`/`developer` messages → one leading system message.
//! - `message` items → user/assistant messages (`input_text`/`output_text` parts joined,
//!   `input_image` → `image_url`, inline only: a `file_id` is refused; `input_file` → a note,
//!   counted); consecutive assistant text, `reasoning` and
//!   `function_call` / `custom_tool_call` items fold into one assistant message (reasoning →
//!   `reasoning_content`; `encrypted_content` is opaque and not sent upstream);
//!   `function_call_output` / `custom_tool_call_output` → `tool` messages.
//! - `function` tools → functions; `namespace` tools are flattened to their inner functions
//!   (qualified `<namespace>__<name>` only where names clash), whose calls go back with their
//!   `namespace` (Codex routes an MCP tool's call by it);
//!   `custom` (freeform, e.g. Codex's `apply_patch`) → a function with one string parameter
//!   `input` — vLLM cannot enforce their grammar — and its calls come back as
//!   `custom_tool_call`; hosted tools (`web_search`, `file_search`, `code_interpreter`,
//!   `image_generation`, `local_shell`, …) are dropped and counted.
//! - `previous_response_id` is refused: the gateway keeps no conversation state.
//! - `reasoning.effort` → `chat_template_kwargs.enable_thinking` (false for `minimal`/`none`),
//!   `text.format` json_schema / json_object → `response_format`, `max_output_tokens` → `max_tokens`.

use serde_json::{json, Map, Value};

use super::responses_tools::{name_shown, tools, Tools};
use super::{assistant_message, reasoning_of, Normalized, ProtocolError};

/// What a file the user (or a system message) attached becomes.
const DOC: &str = super::media::DOCUMENT_NOTE;

fn invalid(msg: impl Into<String>) -> ProtocolError {
    ProtocolError::InvalidRequest(msg.into())
}

/// Text of a message's content: a string, or parts with `text` (an image or a file as a note:
/// where this is read, a tool's output among them, Chat Completions holds text only; `file_note`
/// says which), a line apart as the other APIs' parts are ([`super::join_texts`]): Codex sends
/// its developer and context messages as several `input_text` parts, which ran together
/// (`…</permissions instructions><collaboration_mode>…`).
fn parts_text(content: &Value, file_note: &'static str) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => {
            super::join_texts(parts.iter().filter_map(|p| match p["type"].as_str() {
                Some("input_image") => Some(super::media::TOOL_RESULT_IMAGE_NOTE),
                Some("input_file") => Some(file_note),
                _ => p["text"].as_str(),
            }))
        }
        _ => String::new(),
    }
}

/// How many parts of `content` are of type `kind`.
fn count_parts(content: &Value, kind: &str) -> usize {
    content.as_array().map_or(0, |parts| {
        parts.iter().filter(|p| p["type"] == kind).count()
    })
}

/// A user message's parts for Chat Completions, images kept (inline ones: a `file_id` names a
/// file uploaded to OpenAI, which the gateway has no copy of) and files as a note.
fn chat_parts(content: &Value, at: usize) -> Result<Value, ProtocolError> {
    let mut parts = Vec::new();
    for p in content.as_array().into_iter().flatten() {
        match p["type"].as_str() {
            Some("input_text" | "output_text" | "text") => {
                parts.push(json!({"type": "text", "text": p["text"]}))
            }
            Some("input_image") => {
                let url = p["image_url"].as_str().ok_or_else(|| {
                    invalid(format!(
                        "input[{at}]: input_image needs an image_url (a data: URL); a file_id \
                         is not supported: the floe gateway has no Files API"
                    ))
                })?;
                parts.push(json!({"type": "image_url", "image_url": {"url": url}}));
            }
            Some("input_file") => {
                parts.push(json!({"type": "text", "text": super::media::DOCUMENT_NOTE}))
            }
            _ => {}
        }
    }
    Ok(Value::Array(parts))
}

/// The assistant message being assembled from consecutive output items.
#[derive(Default)]
struct Assistant {
    text: String,
    reasoning: String,
    calls: Vec<Value>,
}

impl Assistant {
    fn is_empty(&self) -> bool {
        self.text.is_empty() && self.reasoning.is_empty() && self.calls.is_empty()
    }

    fn flush(&mut self, out: &mut Vec<Value>) {
        if self.is_empty() {
            return;
        }
        out.push(assistant_message(
            std::mem::take(&mut self.text),
            std::mem::take(&mut self.reasoning),
            std::mem::take(&mut self.calls),
        ));
    }
}

pub fn normalize(body: &[u8]) -> Result<Normalized, ProtocolError> {
    normalize_value(super::parse_body(body)?)
}

/// Normalize a parsed request body.
pub fn normalize_value(value: Value) -> Result<Normalized, ProtocolError> {
    let Value::Object(req) = value else {
        return Err(invalid("body must be a JSON object"));
    };
    if req
        .get("previous_response_id")
        .is_some_and(|v| !v.is_null())
    {
        return Err(invalid("previous_response_id is not supported: the floe gateway is stateless, send the whole input (store: false)"));
    }
    let stream = match req.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(invalid("stream must be a boolean")),
    };
    let model = req
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("policy")
        .to_string();
    let items: Vec<Value> = match req.get("input") {
        Some(Value::String(s)) => vec![json!({"type": "message", "role": "user", "content": s})],
        Some(Value::Array(items)) => items.clone(),
        _ => return Err(invalid("input must be a string or an array of items")),
    };
    let mut dropped = Vec::new();
    let mut system = Vec::new();
    if let Some(i) = req
        .get("instructions")
        .and_then(Value::as_str)
        .filter(|i| !i.is_empty())
    {
        system.push(i.to_string());
    }
    let Tools {
        functions,
        custom,
        namespaced,
        shown,
    } = tools(req.get("tools"), &mut dropped)?;
    let mut out = Vec::new();
    let mut assistant = Assistant::default();
    for (i, item) in items.iter().enumerate() {
        let kind = item["type"]
            .as_str()
            .unwrap_or(if item.get("role").is_some() {
                "message"
            } else {
                ""
            });
        match kind {
            "message" => {
                let role = item["role"]
                    .as_str()
                    .ok_or_else(|| invalid(format!("input[{i}].role must be a string")))?;
                // A file is told as a note, not left to be thought read (as Anthropic's
                // documents), and counted.
                let files = count_parts(&item["content"], "input_file");
                dropped.extend(std::iter::repeat_n("document".to_string(), files));
                match role {
                    "system" | "developer" => system.push(parts_text(&item["content"], DOC)),
                    "assistant" => assistant.text.push_str(&parts_text(&item["content"], DOC)),
                    "user" => {
                        assistant.flush(&mut out);
                        let content = if count_parts(&item["content"], "input_image") > 0 {
                            chat_parts(&item["content"], i)?
                        } else {
                            parts_text(&item["content"], DOC).into()
                        };
                        out.push(json!({"role": "user", "content": content}));
                    }
                    other => {
                        return Err(invalid(format!(
                            "input[{i}].role {other:?} is not supported"
                        )))
                    }
                }
            }
            "reasoning" => {
                let texts = item["content"].as_array().or(item["summary"].as_array());
                let text: String = texts
                    .into_iter()
                    .flatten()
                    .filter_map(|p| p["text"].as_str())
                    .collect::<Vec<_>>()
                    .join("\n");
                assistant.reasoning.push_str(&text);
            }
            "function_call" | "custom_tool_call" => {
                let call_id = item["call_id"]
                    .as_str()
                    .ok_or_else(|| invalid(format!("input[{i}]: {kind} without call_id")))?;
                let name = item["name"]
                    .as_str()
                    .ok_or_else(|| invalid(format!("input[{i}]: {kind} without name")))?;
                let name = name_shown(&shown, item["namespace"].as_str(), name);
                let arguments = if kind == "custom_tool_call" {
                    json!({"input": item["input"]}).to_string()
                } else {
                    item["arguments"].as_str().unwrap_or("{}").to_string()
                };
                assistant.calls.push(json!({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}));
            }
            "function_call_output" | "custom_tool_call_output" => {
                assistant.flush(&mut out);
                let call_id = item["call_id"]
                    .as_str()
                    .ok_or_else(|| invalid(format!("input[{i}]: {kind} without call_id")))?;
                for (kind, what) in [
                    ("input_image", "tool_result_image"),
                    ("input_file", "tool_result_file"),
                ] {
                    let n = count_parts(&item["output"], kind);
                    dropped.extend(std::iter::repeat_n(what.to_string(), n));
                }
                let text = parts_text(&item["output"], super::media::TOOL_RESULT_FILE_NOTE);
                out.push(json!({"role": "tool", "tool_call_id": call_id, "content": text}));
            }
            other => {
                return Err(invalid(format!(
                    "input[{i}]: item type {other:?} is not supported"
                )))
            }
        }
    }
    assistant.flush(&mut out);
    if out.is_empty() {
        return Err(invalid("input must contain at least one message"));
    }
    if !system.is_empty() {
        out.insert(0, json!({"role": "system", "content": system.join("\n\n")}));
    }
    let mut request = Map::new();
    request.insert("messages".into(), Value::Array(out));
    if let Some(n) = req.get("max_output_tokens").and_then(Value::as_u64) {
        request.insert("max_tokens".into(), n.into());
    }
    for key in ["temperature", "top_p", "parallel_tool_calls"] {
        if let Some(v) = req.get(key).filter(|v| !v.is_null()) {
            request.insert(key.into(), v.clone());
        }
    }
    if !functions.is_empty() {
        let mut functions = functions;
        if let Some(choice) = req.get("tool_choice").filter(|c| !c.is_null()) {
            let mapped = match (choice.as_str(), choice["type"].as_str()) {
                (Some(c @ ("auto" | "required" | "none")), _) => json!(c),
                (None, Some("function" | "custom")) => {
                    let name = choice["name"]
                        .as_str()
                        .ok_or_else(|| invalid("tool_choice.name must be a string"))?;
                    let forced = name_shown(&shown, choice["namespace"].as_str(), name);
                    json!({"type": "function", "function": {"name": forced}})
                }
                // `{"type": "allowed_tools", "mode": "auto" | "required", "tools": [{"type":
                // "function", "name": …}, …]}`: the model is shown those tools only.
                (None, Some("allowed_tools")) => {
                    let names: Vec<String> = choice["tools"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter(|t| matches!(t["type"].as_str(), Some("function" | "custom")))
                        .filter_map(|t| {
                            let name = t["name"].as_str()?;
                            Some(name_shown(&shown, t["namespace"].as_str(), name))
                        })
                        .collect();
                    let names = names.iter().map(String::as_str);
                    functions = super::only_allowed(functions, names, "tool_choice.tools")?;
                    json!(if choice["mode"] == "required" {
                        "required"
                    } else {
                        "auto"
                    })
                }
                _ => json!("auto"),
            };
            request.insert("tool_choice".into(), mapped);
        }
        if functions.is_empty() {
            // An allowed-tools choice of hosted tools only: no function may be called.
            request.remove("tool_choice");
        } else {
            request.insert("tools".into(), Value::Array(functions));
        }
    }
    if let Some(effort) = req.get("reasoning").and_then(|r| r["effort"].as_str()) {
        request.insert(
            "chat_template_kwargs".into(),
            json!({"enable_thinking": !matches!(effort, "minimal" | "none")}),
        );
    }
    let format = req
        .get("text")
        .map(|t| &t["format"])
        .unwrap_or(&Value::Null);
    match format["type"].as_str() {
        Some("json_schema") => {
            request.insert(
                "response_format".into(),
                super::json_schema_of_format(format, "text.format", "response")?,
            );
        }
        Some("json_object") => {
            request.insert("response_format".into(), json!({"type": "json_object"}));
        }
        _ => {}
    }
    Ok(Normalized {
        request,
        stream,
        model,
        dropped,
        custom_tools: custom,
        namespaced_tools: namespaced,
        ..Default::default()
    })
}

/// The Responses object for an upstream Chat Completions response.
pub fn response(upstream: &Value, n: &Normalized) -> Value {
    let choice = &upstream["choices"][0];
    let message = &choice["message"];
    let id = upstream["id"]
        .as_str()
        .unwrap_or("floe")
        .trim_start_matches("chatcmpl-")
        .to_string();
    let mut output = Vec::new();
    if let Some(r) = reasoning_of(message) {
        output.push(json!({"type": "reasoning", "id": format!("rs_{id}"), "summary": [], "content": [{"type": "reasoning_text", "text": r}]}));
    }
    if let Some(t) = message["content"].as_str().filter(|t| !t.is_empty()) {
        output.push(json!({"type": "message", "id": format!("msg_{id}"), "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": t, "annotations": []}]}));
    }
    for (k, call) in message["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let shown = call["function"]["name"].as_str().unwrap_or_default();
        let args = call["function"]["arguments"].as_str().unwrap_or("{}");
        let item_id = format!("fc_{id}_{k}");
        // A namespaced tool's call names it as the caller declared it, with its namespace.
        let (namespace, name) = match n.namespaced_tools.get(shown) {
            Some((namespace, own)) => (Some(namespace.as_str()), own.as_str()),
            None => (None, shown),
        };
        let mut item = if n.custom_tools.contains(shown) {
            let input = serde_json::from_str::<Value>(args)
                .ok()
                .and_then(|v| v["input"].as_str().map(str::to_owned))
                .unwrap_or_else(|| args.to_string());
            json!({"type": "custom_tool_call", "id": item_id, "status": "completed", "call_id": call["id"], "name": name, "input": input})
        } else if super::call_arguments(call).is_none() {
            // Arguments that are no JSON object cannot be a call the harness runs (nor go
            // back upstream in its history): the text the model meant, as the other APIs give.
            output.push(json!({"type": "message", "id": format!("msg_{id}_{k}"), "status": "completed", "role": "assistant",
                "content": [{"type": "output_text", "text": super::call_as_text(call), "annotations": []}]}));
            continue;
        } else {
            json!({"type": "function_call", "id": item_id, "status": "completed", "call_id": call["id"], "name": name, "arguments": args})
        };
        if let Some(namespace) = namespace {
            item["namespace"] = namespace.into();
        }
        output.push(item);
    }
    let truncated = choice["finish_reason"] == "length";
    let (input, out_tokens) = (
        upstream["usage"]["prompt_tokens"].as_u64().unwrap_or(0),
        upstream["usage"]["completion_tokens"].as_u64().unwrap_or(0),
    );
    json!({
        "id": format!("resp_{id}"), "object": "response", "created_at": upstream["created"],
        "status": if truncated { "incomplete" } else { "completed" },
        "incomplete_details": if truncated { json!({"reason": "max_output_tokens"}) } else { Value::Null },
        "error": null, "model": n.model, "output": output, "parallel_tool_calls": true, "tool_choice": "auto", "tools": [],
        "usage": {"input_tokens": input, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": out_tokens,
                  "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": input + out_tokens},
    })
}

/// The response as Responses SSE events: `(event name, data)`, ending in `response.completed`
/// (or `response.incomplete`), which Codex waits for.
pub fn stream_events(response: &Value) -> Vec<(String, Value)> {
    let mut events: Vec<(String, Value)> = Vec::new();
    let mut push = |name: &str, mut data: Value| {
        data["type"] = name.into();
        data["sequence_number"] = events.len().into();
        events.push((name.to_string(), data));
    };
    let mut pending = response.clone();
    pending["status"] = "in_progress".into();
    pending["output"] = json!([]);
    push("response.created", json!({"response": pending}));
    push("response.in_progress", json!({"response": pending}));
    for (index, item) in response["output"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let mut start = item.clone();
        start["status"] = "in_progress".into();
        match item["type"].as_str() {
            Some("message") => {
                start["content"] = json!([]);
                push(
                    "response.output_item.added",
                    json!({"output_index": index, "item": start}),
                );
                let text = &item["content"][0]["text"];
                let at = json!({"item_id": item["id"], "output_index": index, "content_index": 0});
                let with = |extra: Value| {
                    let mut v = at.clone();
                    if let (Some(v), Some(extra)) = (v.as_object_mut(), extra.as_object()) {
                        v.extend(extra.clone());
                    }
                    v
                };
                push(
                    "response.content_part.added",
                    with(json!({"part": {"type": "output_text", "text": "", "annotations": []}})),
                );
                push("response.output_text.delta", with(json!({"delta": text})));
                push("response.output_text.done", with(json!({"text": text})));
                push(
                    "response.content_part.done",
                    with(json!({"part": item["content"][0]})),
                );
            }
            Some("function_call") => {
                start["arguments"] = "".into();
                push(
                    "response.output_item.added",
                    json!({"output_index": index, "item": start}),
                );
                push(
                    "response.function_call_arguments.delta",
                    json!({"item_id": item["id"], "output_index": index, "delta": item["arguments"]}),
                );
                push(
                    "response.function_call_arguments.done",
                    json!({"item_id": item["id"], "output_index": index, "arguments": item["arguments"]}),
                );
            }
            Some("custom_tool_call") => {
                start["input"] = "".into();
                push(
                    "response.output_item.added",
                    json!({"output_index": index, "item": start}),
                );
                push(
                    "response.custom_tool_call_input.delta",
                    json!({"item_id": item["id"], "output_index": index, "delta": item["input"]}),
                );
                push(
                    "response.custom_tool_call_input.done",
                    json!({"item_id": item["id"], "output_index": index, "input": item["input"]}),
                );
            }
            _ => push(
                "response.output_item.added",
                json!({"output_index": index, "item": start}),
            ),
        }
        push(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        );
    }
    let last = if response["status"] == "incomplete" {
        "response.incomplete"
    } else {
        "response.completed"
    };
    push(last, json!({"response": response}));
    events
}

/// A call that failed after its stream began, as the Responses API says it: a
/// `response.failed` event whose response carries the error's `code` and `message`. Codex
/// reads only typed events (a bare `{"error"}` was dropped as unparsable, and the stream read
/// as cut, retried with backoff), and acts on the code: `context_length_exceeded` ends the
/// turn as a full context window.
pub fn failed_event(error: &Value, model: &str, created_at: u64) -> Value {
    json!({"type": "response.failed", "sequence_number": 0, "response": {
        "id": format!("resp_failed_{created_at}"), "object": "response", "created_at": created_at,
        "status": "failed", "incomplete_details": null, "model": model, "output": [],
        "parallel_tool_calls": true, "tool_choice": "auto", "tools": [], "usage": null,
        "error": {"code": error["error"]["code"], "message": error["error"]["message"]},
    }})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_stream_ends_in_response_failed_with_the_errors_code() {
        let error = json!({"error": {"message": "past the budget", "type": "invalid_request_error",
            "param": null, "code": "session_budget_exceeded"}});
        let event = failed_event(&error, "gpt-5", 1_700_000_000);
        assert_eq!(event["type"], "response.failed");
        assert_eq!(event["response"]["status"], "failed");
        assert_eq!(
            event["response"]["error"],
            json!({"code": "session_budget_exceeded", "message": "past the budget"})
        );
        assert_eq!(event["response"]["model"], "gpt-5");
    }

    fn norm(v: Value) -> Normalized {
        normalize(v.to_string().as_bytes()).expect("valid request")
    }

    #[test]
    fn an_allowed_tools_choice_shows_the_model_those_tools_only() {
        let request = |mode: &str| {
            json!({"input": "go", "tools": [
                {"type": "function", "name": "read", "parameters": {"type": "object"}},
                {"type": "custom", "name": "apply_patch"},
                {"type": "function", "name": "shell", "parameters": {"type": "object"}}],
                "tool_choice": {"type": "allowed_tools", "mode": mode, "tools": [
                    {"type": "custom", "name": "apply_patch"}, {"type": "function", "name": "shell"},
                    {"type": "mcp", "server_label": "docs"}]}})
        };
        let n = norm(request("auto"));
        let names = crate::protocol::tool_names(&n.request);
        assert_eq!(names, ["apply_patch", "shell"]);
        assert_eq!(n.request["tool_choice"], "auto");
        assert_eq!(norm(request("required")).request["tool_choice"], "required");
        let mut none = request("auto");
        none["tool_choice"]["tools"] = json!([{"type": "function", "name": "gone"}]);
        let refused = normalize(none.to_string().as_bytes());
        assert!(
            matches!(&refused, Err(ProtocolError::InvalidRequest(m)) if m.contains("tool_choice.tools")),
            "{refused:?}"
        );
    }

    #[test]
    fn a_codex_shaped_request_maps_to_chat() {
        let n = norm(json!({
            "model": "gpt-5-codex", "instructions": "You are Codex.", "stream": true, "store": false,
            "include": ["reasoning.encrypted_content"], "reasoning": {"effort": "medium", "summary": "auto"},
            "input": [
                {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "<permissions>"},
                                                                      {"type": "input_text", "text": "<collaboration_mode>"}]},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix it"}]},
                {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "plan"}], "encrypted_content": "gAAA"},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Running tests."}]},
                {"type": "function_call", "call_id": "call_1", "name": "shell", "arguments": "{\"command\":[\"ls\"]}"},
                {"type": "custom_tool_call", "call_id": "call_2", "name": "apply_patch", "input": "*** Begin Patch"},
                {"type": "function_call_output", "call_id": "call_1", "output": [{"type": "input_text", "text": "a.py"},
                                                                                  {"type": "input_text", "text": "b.py"}]},
                {"type": "custom_tool_call_output", "call_id": "call_2", "output": "Done"}],
            "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}},
                      {"type": "custom", "name": "apply_patch", "format": {"type": "grammar"}},
                      {"type": "namespace", "name": "mcp", "tools": [{"type": "function", "name": "mcp__docs__search", "parameters": {"type": "object"}}]},
                      {"type": "web_search"}],
            "tool_choice": "auto", "parallel_tool_calls": false, "prompt_cache_key": "k"
        }));
        assert!(n.stream);
        assert_eq!(n.dropped, ["hosted_tool:web_search"]);
        let m = &n.request["messages"];
        assert_eq!(
            m[0],
            json!({"role": "system", "content": "You are Codex.\n\n<permissions>\n<collaboration_mode>"})
        );
        assert_eq!(m[1], json!({"role": "user", "content": "fix it"}));
        assert_eq!(m[2]["content"], "Running tests.");
        assert_eq!(m[2]["reasoning_content"], "plan");
        assert_eq!(
            m[2]["tool_calls"][1]["function"],
            json!({"name": "apply_patch", "arguments": "{\"input\":\"*** Begin Patch\"}"})
        );
        assert_eq!(
            m[3],
            json!({"role": "tool", "tool_call_id": "call_1", "content": "a.py\nb.py"})
        );
        assert_eq!(m[4]["tool_call_id"], "call_2");
        let names = crate::protocol::tool_names(&n.request);
        assert_eq!(names, ["shell", "apply_patch", "mcp__docs__search"]);
        assert!(n.custom_tools.contains("apply_patch"));
        assert_eq!(
            n.request["chat_template_kwargs"],
            json!({"enable_thinking": true})
        );
        assert_eq!(n.request["parallel_tool_calls"], false);
    }

    #[test]
    fn an_image_in_a_tool_output_becomes_a_note_and_is_counted() {
        let n = norm(json!({"input": [
            {"type": "function_call", "call_id": "c", "name": "view_image", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c", "output": [
                {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}]}));
        let tool = &n.request["messages"][1];
        assert_eq!(tool["role"], "tool");
        assert_eq!(
            tool["content"],
            crate::protocol::media::TOOL_RESULT_IMAGE_NOTE
        );
        assert_eq!(n.dropped, ["tool_result_image"]);
    }

    #[test]
    fn files_become_notes_and_are_counted_and_an_image_by_file_id_is_refused() {
        let pdf = json!({"type": "input_file", "filename": "a.pdf", "file_data": "data:application/pdf;base64,AA=="});
        let png = json!({"type": "input_image", "image_url": "data:image/png;base64,AAAA"});
        let n = norm(json!({"input": [
            {"role": "user", "content": [{"type": "input_text", "text": "read"}, pdf, png]},
            {"type": "function_call", "call_id": "c", "name": "read_file", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c", "output": [
                {"type": "input_text", "text": "here"}, pdf, png]}]}));
        let media = crate::protocol::media::TOOL_RESULT_IMAGE_NOTE;
        let m = &n.request["messages"];
        assert_eq!(
            m[0]["content"],
            json!([{"type": "text", "text": "read"},
                   {"type": "text", "text": crate::protocol::media::DOCUMENT_NOTE},
                   {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}])
        );
        let note = crate::protocol::media::TOOL_RESULT_FILE_NOTE;
        assert_eq!(m[2]["content"], format!("here\n{note}\n{media}"));
        assert_eq!(
            n.dropped,
            ["document", "tool_result_image", "tool_result_file"]
        );
        // A user's file alone (no image): the text form, the note in it.
        let alone = norm(json!({"input": [{"role": "user", "content": [pdf]}]}));
        assert_eq!(
            alone.request["messages"][0]["content"],
            crate::protocol::media::DOCUMENT_NOTE
        );
        let by_id = normalize(
            json!({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}]})
                .to_string()
                .as_bytes(),
        );
        assert!(
            matches!(&by_id, Err(ProtocolError::InvalidRequest(m)) if m.contains("file_id")),
            "{by_id:?}"
        );
    }

    #[test]
    fn stateful_and_malformed_requests_are_refused_with_a_reason() {
        for (body, needle) in [
            (
                json!({"input": "hi", "previous_response_id": "resp_1"}),
                "stateless",
            ),
            (json!({"input": 5}), "input must be"),
            (json!({"input": [{"type": "hologram"}]}), "\"hologram\""),
            (
                json!({"input": [{"type": "function_call", "name": "x"}]}),
                "without call_id",
            ),
            (
                json!({"input": "x", "tools": [{"name": "t"}]}),
                "needs a type",
            ),
            (json!({"input": []}), "at least one message"),
        ] {
            let err = normalize(body.to_string().as_bytes()).expect_err("invalid");
            assert!(err.to_string().contains(needle), "{body}: {err}");
        }
    }

    #[test]
    fn a_namespaced_tools_calls_go_back_with_its_namespace_and_own_name() {
        // Two MCP servers each with a `search`, and a `read` of one server's only: the model
        // is shown unique names (qualified only where they clash); calls go back as declared.
        let f = |name: &str| json!({"type": "function", "name": name, "parameters": {"type": "object"}});
        let n = norm(json!({"model": "m", "input": [
                {"role": "user", "content": "find"},
                {"type": "function_call", "call_id": "c0", "namespace": "docs", "name": "search", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c0", "output": "none"}],
            "tools": [f("shell"),
                {"type": "namespace", "name": "docs", "description": "Docs", "tools": [f("search"), f("read")]},
                {"type": "namespace", "name": "code", "tools": [f("search")]}]}));
        let names = crate::protocol::tool_names(&n.request);
        assert_eq!(names, ["shell", "docs__search", "read", "code__search"]);
        // The history's call is named as the model was shown it.
        assert_eq!(
            n.request["messages"][1]["tool_calls"][0]["function"]["name"],
            "docs__search"
        );
        let upstream = json!({"id": "chatcmpl-9", "created": 1,
            "choices": [{"finish_reason": "tool_calls", "message": {"content": null, "tool_calls": [
                {"id": "a", "function": {"name": "code__search", "arguments": "{}"}},
                {"id": "b", "function": {"name": "read", "arguments": "{}"}},
                {"id": "c", "function": {"name": "shell", "arguments": "{}"}}]}}]});
        let r = response(&upstream, &n);
        let calls: Vec<(&str, Option<&str>)> = r["output"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|o| (o["name"].as_str().unwrap_or(""), o["namespace"].as_str()))
            .collect();
        assert_eq!(
            calls,
            [
                ("search", Some("code")),
                ("read", Some("docs")),
                ("shell", None)
            ]
        );
        // The stream's items carry it too.
        let added: Vec<Value> = stream_events(&r)
            .into_iter()
            .filter(|(name, _)| name == "response.output_item.added")
            .map(|(_, data)| data["item"]["namespace"].clone())
            .collect();
        assert_eq!(added, [json!("code"), json!("docs"), Value::Null]);
    }

    #[test]
    fn every_name_the_model_sees_is_one_tools_and_a_forced_choice_names_it_so() {
        // `docs__search` declared at the top level, and `search` in two namespaces, one of
        // them `docs`: qualifying `docs`'s would take the top-level tool's name.
        let f = |name: &str| json!({"type": "function", "name": name, "parameters": {"type": "object"}});
        let n = norm(json!({"model": "m", "input": "x",
            "tools": [f("docs__search"),
                {"type": "namespace", "name": "docs", "tools": [f("search")]},
                {"type": "namespace", "name": "code", "tools": [
                    {"type": "namespace", "name": "deep", "tools": [f("search")]}]}],
            "tool_choice": {"type": "function", "name": "search", "namespace": "deep"}}));
        let names = crate::protocol::tool_names(&n.request);
        assert_eq!(names, ["docs__search", "docs__search_2", "deep__search"]);
        assert_eq!(
            n.namespaced_tools.get("docs__search_2"),
            Some(&("docs".to_string(), "search".to_string()))
        );
        assert_eq!(
            n.request["tool_choice"],
            json!({"type": "function", "function": {"name": "deep__search"}})
        );
        // A function without a name is the caller's error, in its own shape.
        let nameless = normalize(
            json!({"input": "x", "tools": [{"type": "namespace", "name": "a", "tools": [{"type": "function"}]}]})
                .to_string()
                .as_bytes(),
        );
        assert!(
            matches!(&nameless, Err(ProtocolError::InvalidRequest(m)) if m.contains("function tool without name")),
            "{nameless:?}"
        );
        // An allowed-tools choice of hosted tools only leaves no function to call.
        let hosted = norm(
            json!({"input": "x", "tools": [f("shell"), {"type": "web_search"}],
            "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "web_search"}]}}),
        );
        assert!(
            hosted.request.get("tools").is_none(),
            "{:?}",
            hosted.request
        );
        assert!(hosted.request.get("tool_choice").is_none());
        // A file in a developer message is counted too.
        let dev = norm(json!({"input": [
            {"role": "developer", "content": [{"type": "input_file", "file_data": "data:application/pdf;base64,AA=="}]},
            {"role": "user", "content": "hi"}]}));
        assert_eq!(dev.dropped, ["document"]);
    }

    #[test]
    fn a_call_whose_arguments_are_no_object_comes_back_as_the_text_meant() {
        let n = norm(json!({"model": "m", "input": "x"}));
        let upstream = json!({"id": "chatcmpl-8", "created": 1,
            "choices": [{"finish_reason": "tool_calls", "message": {"content": null, "tool_calls": [
                {"id": "call_a", "function": {"name": "shell", "arguments": "ls -la"}},
                {"id": "call_b", "function": {"name": "shell", "arguments": "{\"command\": [\"ls\"]}"}}]}}]});
        let r = response(&upstream, &n);
        let output = r["output"].as_array().cloned().unwrap_or_default();
        assert_eq!(output.len(), 2, "{r}");
        assert_eq!(output[0]["type"], "message");
        assert_eq!(output[0]["content"][0]["text"], "shell(ls -la)");
        assert_eq!(output[1]["type"], "function_call");
    }

    #[test]
    fn replies_and_stream_end_in_response_completed() {
        let n = norm(
            json!({"model": "gpt-5-codex", "input": "x", "tools": [{"type": "custom", "name": "apply_patch"}]}),
        );
        let upstream = json!({"id": "chatcmpl-7", "created": 1, "usage": {"prompt_tokens": 10, "completion_tokens": 4},
            "choices": [{"finish_reason": "tool_calls", "message": {"content": "Patching.", "tool_calls": [
                {"id": "call_a", "function": {"name": "apply_patch", "arguments": "{\"input\": \"*** Begin Patch\"}"}},
                {"id": "call_b", "function": {"name": "shell", "arguments": "{\"command\": [\"ls\"]}"}}]}}]});
        let r = response(&upstream, &n);
        assert_eq!(
            (
                r["object"].as_str(),
                r["status"].as_str(),
                r["model"].as_str()
            ),
            (Some("response"), Some("completed"), Some("gpt-5-codex"))
        );
        let types: Vec<&str> = r["output"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|o| o["type"].as_str())
            .collect();
        assert_eq!(types, ["message", "custom_tool_call", "function_call"]);
        assert_eq!(r["output"][1]["input"], "*** Begin Patch");
        assert_eq!(r["usage"]["total_tokens"], 14);
        let events = stream_events(&r);
        assert_eq!(
            events.first().map(|e| e.0.as_str()),
            Some("response.created")
        );
        assert_eq!(
            events.last().map(|e| e.0.as_str()),
            Some("response.completed")
        );
        assert!(events
            .iter()
            .enumerate()
            .all(|(i, (_, d))| d["sequence_number"] == i));
        let done: Vec<&Value> = events
            .iter()
            .filter(|(n, _)| n == "response.output_item.done")
            .map(|(_, d)| &d["item"])
            .collect();
        assert_eq!(done.len(), 3);
        let truncated = json!({"id": "x", "choices": [{"finish_reason": "length", "message": {"content": "abc"}}]});
        let r = response(&truncated, &n);
        assert_eq!(r["incomplete_details"]["reason"], "max_output_tokens");
        assert_eq!(
            stream_events(&r).last().map(|e| e.0.as_str()),
            Some("response.incomplete")
        );
    }
}
