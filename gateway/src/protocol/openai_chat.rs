//! OpenAI Chat Completions (`/v1/chat/completions`): what Qwen Code, Pi and most tools send.
//! vLLM speaks it too, so normalization is small: system/developer messages merged into one
//! leading system message, content parts flattened where the model's template needs strings.

use serde_json::{json, Value};

use super::answer::{CAPTURE_FIELDS, CHOICE_CAPTURE_FIELDS};
use super::{reasoning_of, Normalized, ProtocolError};

/// Parse and normalize a request body.
pub fn normalize(body: &[u8]) -> Result<Normalized, ProtocolError> {
    normalize_value(super::parse_body(body)?)
}

/// Normalize a parsed request body.
pub fn normalize_value(value: Value) -> Result<Normalized, ProtocolError> {
    let Value::Object(mut req) = value else {
        return Err(ProtocolError::InvalidRequest(
            "body must be a JSON object".into(),
        ));
    };
    let stream = match req.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(ProtocolError::InvalidRequest(
                "stream must be a boolean".into(),
            ))
        }
    };
    let Some(Value::Array(messages)) = req.remove("messages") else {
        return Err(ProtocolError::InvalidRequest(
            "messages must be an array".into(),
        ));
    };
    if messages.is_empty() {
        return Err(ProtocolError::InvalidRequest(
            "messages must not be empty".into(),
        ));
    }
    req.insert("messages".into(), Value::Array(merge_system(messages)?));
    allowed_tools(&mut req)?;
    // OpenAI's hosted web search, asked for by a parameter rather than a tool: vLLM has none.
    let mut dropped = Vec::new();
    if req
        .remove("web_search_options")
        .is_some_and(|o| !o.is_null())
    {
        dropped.push(format!("{}web_search_options", super::HOSTED_TOOL));
    }
    Ok(Normalized {
        dropped,
        model: req
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or("policy")
            .to_string(),
        wants_logprobs: req.get("logprobs") == Some(&Value::Bool(true)),
        include_usage: req
            .get("stream_options")
            .and_then(|o| o.get("include_usage"))
            == Some(&Value::Bool(true)),
        request: req,
        stream,
        ..Default::default()
    })
}

/// `tool_choice: {"type": "allowed_tools", "allowed_tools": {"mode": "auto" | "required",
/// "tools": [{"type": "function", "function": {"name": …}}, …]}}`, which vLLM does not take:
/// the model is shown those tools only, with the choice's mode.
fn allowed_tools(req: &mut serde_json::Map<String, Value>) -> Result<(), ProtocolError> {
    let Some(choice) = req
        .get("tool_choice")
        .filter(|c| c["type"] == "allowed_tools")
    else {
        return Ok(());
    };
    let allowed = &choice["allowed_tools"];
    let names: Vec<String> = allowed["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| {
            let kind = t["type"].as_str()?;
            t[kind]["name"].as_str().map(str::to_string)
        })
        .collect();
    let mode = if allowed["mode"] == "required" {
        "required"
    } else {
        "auto"
    };
    let functions = match req.remove("tools") {
        Some(Value::Array(tools)) => tools,
        _ => Vec::new(),
    };
    let kept = super::only_allowed(
        functions,
        names.iter().map(String::as_str),
        "tool_choice.allowed_tools.tools",
    )?;
    if kept.is_empty() {
        // It names no function (a custom tool only, say): none may be called.
        req.remove("tool_choice");
    } else {
        req.insert("tools".into(), Value::Array(kept));
        req.insert("tool_choice".into(), mode.into());
    }
    Ok(())
}

/// All `system` and `developer` messages, wherever they appear, become one leading system
/// message (in order); the other messages keep their order. Chat templates of open models
/// accept a system message only first.
fn merge_system(messages: Vec<Value>) -> Result<Vec<Value>, ProtocolError> {
    let mut system = Vec::new();
    let mut rest = Vec::with_capacity(messages.len());
    for (i, m) in messages.into_iter().enumerate() {
        let Some(role) = m.get("role").and_then(Value::as_str) else {
            return Err(ProtocolError::InvalidRequest(format!(
                "messages[{i}].role must be a string"
            )));
        };
        match role {
            "system" | "developer" => system.push(text_of(&m["content"]).ok_or_else(|| {
                ProtocolError::InvalidRequest(format!(
                    "messages[{i}].content must be a string or text parts"
                ))
            })?),
            "user" | "assistant" | "tool" => rest.push(m),
            other => {
                return Err(ProtocolError::InvalidRequest(format!(
                    "messages[{i}].role {other:?} is not supported"
                )))
            }
        }
    }
    if !system.is_empty() {
        rest.insert(0, json!({"role": "system", "content": system.join("\n\n")}));
    }
    Ok(rest)
}

/// A string, or an array of `{"type": "text", "text": ...}` parts joined a line apart (as
/// vLLM joins them).
fn text_of(content: &Value) -> Option<String> {
    match content {
        Value::String(s) => Some(s.clone()),
        Value::Array(parts) => parts
            .iter()
            .map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Option<Vec<_>>>()
            .map(|texts| super::join_texts(texts.into_iter())),
        _ => None,
    }
}

/// The upstream response as the client sees it: vLLM's and SGLang's capture fields removed,
/// the model name the client asked for, logprobs only if it asked for them.
pub fn response(mut upstream: Value, client_model: &str, client_wants_logprobs: bool) -> Value {
    // (An answer read by `answer::read_answer` has none of them already.)
    if let Some(obj) = upstream.as_object_mut() {
        for capture_field in CAPTURE_FIELDS {
            obj.remove(capture_field);
        }
        obj.insert("model".into(), client_model.into());
    }
    if let Some(choices) = upstream["choices"].as_array_mut() {
        for c in choices.iter_mut().filter_map(Value::as_object_mut) {
            for capture_field in CHOICE_CAPTURE_FIELDS {
                c.remove(capture_field);
            }
            if !client_wants_logprobs {
                c.insert("logprobs".into(), Value::Null);
            }
        }
    }
    upstream
}

/// The same answer as a Chat Completions SSE stream (`data:` payloads, then `[DONE]`). The
/// upstream call was not streamed, so the whole answer goes out in a few chunks.
pub fn stream_events(response: &Value, include_usage: bool) -> Vec<String> {
    let base = |choices: Value| {
        json!({"id": response["id"], "object": "chat.completion.chunk", "created": response["created"],
               "model": response["model"], "choices": choices})
    };
    let choice = &response["choices"][0];
    let message = &choice["message"];
    let mut delta = json!({"role": "assistant", "content": message["content"]});
    if let Some(reasoning) = reasoning_of(message) {
        delta["reasoning_content"] = reasoning.into();
    }
    if let Some(calls) = message["tool_calls"].as_array().filter(|c| !c.is_empty()) {
        let indexed: Vec<Value> = calls
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let mut c = c.clone();
                c["index"] = i.into();
                c
            })
            .collect();
        delta["tool_calls"] = Value::Array(indexed);
    }
    let mut events = vec![
        base(json!([{"index": 0, "delta": delta, "logprobs": choice["logprobs"], "finish_reason": null}])).to_string(),
        base(json!([{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}])).to_string(),
    ];
    if include_usage {
        let mut usage = base(json!([]));
        usage["usage"] = response["usage"].clone();
        events.push(usage.to_string());
    }
    events.push("[DONE]".to_string());
    events
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_and_developer_messages_merge_into_one_leading_system_message() {
        let body = json!({"model": "x", "messages": [
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": "hi"},
            {"role": "system", "content": [{"type": "text", "text": "reminder: "}, {"type": "text", "text": "tests"}]},
            {"role": "assistant", "content": "ok"}
        ]});
        let n = normalize(body.to_string().as_bytes()).expect("ok");
        assert!(!n.stream);
        assert_eq!(n.model, "x");
        let req = n.request;
        let roles: Vec<&str> = req["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| m["role"].as_str())
            .collect();
        assert_eq!(roles, ["system", "user", "assistant"]);
        assert_eq!(
            req["messages"][0]["content"],
            "be brief\n\nreminder: \ntests"
        );
    }

    #[test]
    fn an_allowed_tools_choice_shows_the_model_those_tools_only() {
        let tool =
            |name: &str| json!({"type": "function", "function": {"name": name, "parameters": {}}});
        let body = |names: Value| {
            json!({"messages": [{"role": "user", "content": "go"}],
                "tools": [tool("read"), tool("write"), tool("shell")],
                "tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": "required",
                    "tools": names}}})
        };
        let n = normalize(
            body(json!([{"type": "function", "function": {"name": "shell"}},
                        {"type": "function", "function": {"name": "read"}},
                        {"type": "function", "function": {"name": "undeclared"}}]))
            .to_string()
            .as_bytes(),
        )
        .expect("valid");
        assert_eq!(n.request["tools"], json!([tool("read"), tool("shell")]));
        assert_eq!(n.request["tool_choice"], "required");
        let none = normalize(
            body(json!([{"type": "function", "function": {"name": "undeclared"}}]))
                .to_string()
                .as_bytes(),
        );
        assert!(
            matches!(&none, Err(ProtocolError::InvalidRequest(m)) if m.contains("tool_choice.allowed_tools.tools")),
            "{none:?}"
        );
        // A custom tool is named under its own type.
        let custom = json!({"type": "custom", "custom": {"name": "patch"}});
        let mut with_custom = body(json!([{"type": "custom", "custom": {"name": "patch"}}]));
        with_custom["tools"] = json!([tool("read"), custom]);
        let n = normalize(with_custom.to_string().as_bytes()).expect("valid");
        assert_eq!(n.request["tools"], json!([custom]));
    }

    #[test]
    fn web_search_options_is_a_hosted_tool() {
        let body = json!({"messages": [{"role": "user", "content": "news?"}],
            "web_search_options": {"search_context_size": "low"}});
        let n = normalize(body.to_string().as_bytes()).expect("ok");
        assert_eq!(n.hosted_tools(), ["web_search_options"]);
        assert!(!n.request.contains_key("web_search_options"));
        let plain = json!({"messages": [{"role": "user", "content": "hi"}]});
        assert!(normalize(plain.to_string().as_bytes())
            .expect("ok")
            .dropped
            .is_empty());
    }

    #[test]
    fn bad_requests_name_the_problem() {
        for (body, needle) in [
            ("{", "not JSON"),
            ("[]", "JSON object"),
            (r#"{"messages": "hi"}"#, "messages must be an array"),
            (r#"{"messages": []}"#, "must not be empty"),
            (r#"{"messages": [{"content": "x"}]}"#, "messages[0].role"),
            (
                r#"{"messages": [{"role": "wizard", "content": "x"}]}"#,
                "\"wizard\"",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "stream": "yes"}"#,
                "stream must be a boolean",
            ),
        ] {
            let err = normalize(body.as_bytes()).expect_err(body);
            assert!(err.to_string().contains(needle), "{body}: {err}");
            assert_eq!(err.status(), 400);
        }
    }

    #[test]
    fn capture_fields_never_reach_the_client() {
        let upstream = json!({"id": "c1", "model": "policy", "prompt_token_ids": [1],
            "choices": [{"index": 0, "token_ids": [2], "logprobs": {"content": []}, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]});
        let out = response(upstream, "gpt-5", false);
        assert_eq!(out["model"], "gpt-5");
        assert!(
            out.get("prompt_token_ids").is_none() && out["choices"][0].get("token_ids").is_none()
        );
        assert!(out["choices"][0]["logprobs"].is_null());
    }

    #[test]
    fn stream_carries_content_tool_calls_finish_and_done() {
        let resp = json!({"id": "c1", "created": 1, "model": "gpt-5", "usage": {"prompt_tokens": 3},
            "choices": [{"message": {"role": "assistant", "content": null,
                "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]},
                "finish_reason": "tool_calls"}]});
        let events = stream_events(&resp, true);
        assert_eq!(events.len(), 4);
        let first: Value = serde_json::from_str(&events[0]).expect("json");
        assert_eq!(first["choices"][0]["delta"]["tool_calls"][0]["index"], 0);
        assert_eq!(
            first["choices"][0]["delta"]["tool_calls"][0]["function"]["name"],
            "ls"
        );
        let second: Value = serde_json::from_str(&events[1]).expect("json");
        assert_eq!(second["choices"][0]["finish_reason"], "tool_calls");
        let usage: Value = serde_json::from_str(&events[2]).expect("json");
        assert_eq!(usage["usage"]["prompt_tokens"], 3);
        assert_eq!(events[3], "[DONE]");
    }
}
