//! Gemini (`/v1beta/models/{model}:generateContent` and `:streamGenerateContent`): what Gemini
//! CLI sends, translated to Chat Completions for vLLM and back.
//!
//! Request rules:
//! - `systemInstruction` → the leading system message.
//! - `user` contents: `text` → user message, `functionResponse` → `tool` message (its
//!   `response` serialized), `inlineData` → `image_url` data URL.
//! - `model` contents: `text` → assistant content, `thought: true` text → `reasoning_content`,
//!   `functionCall` → `tool_calls`; `thoughtSignature` is opaque and not sent upstream.
//!   Gemini calls often carry no id: the gateway invents one and matches the following
//!   `functionResponse` by name, in order.
//! - `functionDeclarations` → functions (`parameters` or `parametersJsonSchema`); built-in tools
//!   (`googleSearch`, `codeExecution`, `urlContext`, …) are dropped and counted.
//! - `generationConfig`: `maxOutputTokens`, `temperature`, `topP`, `topK`, `stopSequences`;
//!   `thinkingConfig` → `chat_template_kwargs.enable_thinking`; `candidateCount` > 1 refused.

use std::collections::{HashMap, VecDeque};

use serde_json::{json, Map, Value};

use super::{
    assistant_message, call_arguments, call_as_text, reasoning_of, Normalized, ProtocolError,
};

fn invalid(msg: impl Into<String>) -> ProtocolError {
    ProtocolError::InvalidRequest(msg.into())
}

/// Split `gemini-2.5-pro:streamGenerateContent` into model and method.
pub fn model_and_method(segment: &str) -> Option<(&str, &str)> {
    segment.rsplit_once(':')
}

pub fn normalize(body: &[u8], model: &str, stream: bool) -> Result<Normalized, ProtocolError> {
    normalize_value(super::parse_body(body)?, model, stream)
}

/// Normalize a parsed request body.
pub fn normalize_value(
    value: Value,
    model: &str,
    stream: bool,
) -> Result<Normalized, ProtocolError> {
    let Value::Object(req) = value else {
        return Err(invalid("body must be a JSON object"));
    };
    let Some(Value::Array(contents)) = req.get("contents") else {
        return Err(invalid("contents must be an array"));
    };
    let mut out = Vec::new();
    let mut dropped = Vec::new();
    let system: String = req
        .get("systemInstruction")
        .and_then(|s| s["parts"].as_array())
        .into_iter()
        .flatten()
        .filter_map(|p| p["text"].as_str())
        .collect::<Vec<_>>()
        .join("\n");
    if !system.is_empty() {
        out.push(json!({"role": "system", "content": system}));
    }
    // Invented call ids waiting for their response, by function name.
    let mut pending: HashMap<String, VecDeque<String>> = HashMap::new();
    for (i, c) in contents.iter().enumerate() {
        let parts = c["parts"]
            .as_array()
            .ok_or_else(|| invalid(format!("contents[{i}].parts must be an array")))?;
        match c["role"].as_str().unwrap_or("user") {
            "user" | "function" => {
                let mut texts = Vec::new();
                let mut images = Vec::new();
                for (k, p) in parts.iter().enumerate() {
                    if let Some(fr) = p.get("functionResponse") {
                        let name = fr["name"].as_str().ok_or_else(|| {
                            invalid(format!(
                                "contents[{i}].parts[{k}].functionResponse.name is required"
                            ))
                        })?;
                        let id = match fr["id"].as_str() {
                            Some(id) => id.to_string(),
                            None => pending
                                .get_mut(name)
                                .and_then(VecDeque::pop_front)
                                .unwrap_or_else(|| format!("call_{name}_{i}_{k}")),
                        };
                        out.push(json!({"role": "tool", "tool_call_id": id, "content": fr["response"].to_string()}));
                    } else if let Some(t) = p["text"].as_str() {
                        texts.push(t.to_string());
                    } else if let Some(d) = p.get("inlineData") {
                        images.push(json!({"type": "image_url", "image_url": {"url": format!("data:{};base64,{}",
                            d["mimeType"].as_str().unwrap_or("application/octet-stream"), d["data"].as_str().unwrap_or_default())}}));
                    } else {
                        dropped.push("unsupported_part".to_string());
                    }
                }
                if !images.is_empty() {
                    let mut content: Vec<Value> = texts
                        .iter()
                        .map(|t| json!({"type": "text", "text": t}))
                        .collect();
                    content.extend(images);
                    out.push(json!({"role": "user", "content": content}));
                } else if !texts.is_empty() {
                    out.push(json!({"role": "user", "content": texts.concat()}));
                }
            }
            "model" => {
                let mut text = String::new();
                let mut reasoning = String::new();
                let mut calls = Vec::new();
                for (k, p) in parts.iter().enumerate() {
                    if let Some(fc) = p.get("functionCall") {
                        let name = fc["name"].as_str().ok_or_else(|| {
                            invalid(format!(
                                "contents[{i}].parts[{k}].functionCall.name is required"
                            ))
                        })?;
                        let id = match fc["id"].as_str() {
                            Some(id) => id.to_string(),
                            None => {
                                let id = format!("call_{name}_{i}_{k}");
                                pending
                                    .entry(name.to_string())
                                    .or_default()
                                    .push_back(id.clone());
                                id
                            }
                        };
                        let args = if fc["args"].is_null() {
                            json!({})
                        } else {
                            fc["args"].clone()
                        };
                        calls.push(json!({"id": id, "type": "function", "function": {"name": name, "arguments": args.to_string()}}));
                    } else if let Some(t) = p["text"].as_str() {
                        if p["thought"] == json!(true) {
                            reasoning.push_str(t);
                        } else {
                            text.push_str(t);
                        }
                    }
                }
                out.push(assistant_message(text, reasoning, calls));
            }
            other => {
                return Err(invalid(format!(
                    "contents[{i}].role {other:?} must be user or model"
                )))
            }
        }
    }
    if out.iter().all(|m| m["role"] == "system") {
        return Err(invalid("contents must hold at least one message"));
    }
    let mut request = Map::new();
    request.insert("messages".into(), Value::Array(out));
    let mut functions = Vec::new();
    for t in req
        .get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let Some(obj) = t.as_object() else { continue };
        for (kind, v) in obj {
            if kind == "functionDeclarations" {
                for f in v.as_array().into_iter().flatten() {
                    let params = f
                        .get("parametersJsonSchema")
                        .or(f.get("parameters"))
                        .cloned()
                        .unwrap_or(json!({"type": "object", "properties": {}}));
                    functions.push(json!({"type": "function", "function": {"name": f["name"], "description": f.get("description").cloned().unwrap_or(Value::Null), "parameters": params}}));
                }
            } else {
                dropped.push(format!("hosted_tool:{kind}"));
            }
        }
    }
    if !functions.is_empty() {
        request.insert("tools".into(), Value::Array(functions));
        match req
            .get("toolConfig")
            .and_then(|c| c["functionCallingConfig"]["mode"].as_str())
        {
            Some("ANY") => request.insert("tool_choice".into(), "required".into()),
            Some("NONE") => request.insert("tool_choice".into(), "none".into()),
            _ => None,
        };
    }
    let g = req.get("generationConfig").cloned().unwrap_or(Value::Null);
    if g["candidateCount"].as_u64().is_some_and(|n| n > 1) {
        return Err(invalid(
            "candidateCount must be 1: floe captures one sample per call",
        ));
    }
    for (from, to) in [
        ("maxOutputTokens", "max_tokens"),
        ("temperature", "temperature"),
        ("topP", "top_p"),
        ("topK", "top_k"),
        ("stopSequences", "stop"),
        ("seed", "seed"),
    ] {
        if let Some(v) = g.get(from).filter(|v| !v.is_null()) {
            request.insert(to.into(), v.clone());
        }
    }
    if let Some(t) = g.get("thinkingConfig").filter(|t| t.is_object()) {
        let on = t["thinkingBudget"].as_i64().is_none_or(|b| b != 0);
        request.insert(
            "chat_template_kwargs".into(),
            json!({"enable_thinking": on}),
        );
    }
    Ok(Normalized {
        request,
        stream,
        model: model.to_string(),
        dropped,
        ..Default::default()
    })
}

/// A `:countTokens` request: `{contents}` or `{generateContentRequest: {contents, …}}`.
pub fn normalize_count(body: &[u8], model: &str) -> Result<Normalized, ProtocolError> {
    let mut value = super::parse_body(body)?;
    match value.get_mut("generateContentRequest") {
        Some(inner) => normalize_value(inner.take(), model, false),
        None => normalize_value(value, model, false),
    }
}

fn finish_reason(finish: Option<&str>) -> &'static str {
    match finish {
        Some("length") => "MAX_TOKENS",
        _ => "STOP",
    }
}

/// A `GenerateContentResponse` for an upstream Chat Completions response.
pub fn response(upstream: &Value, model: &str) -> Value {
    let choice = &upstream["choices"][0];
    let message = &choice["message"];
    let mut parts = Vec::new();
    if let Some(r) = reasoning_of(message) {
        parts.push(json!({"text": r, "thought": true}));
    }
    if let Some(t) = message["content"].as_str().filter(|t| !t.is_empty()) {
        parts.push(json!({"text": t}));
    }
    for call in message["tool_calls"].as_array().into_iter().flatten() {
        match call_arguments(call) {
            Some(args) => parts.push(json!({"functionCall": {"id": call["id"], "name": call["function"]["name"], "args": args}})),
            None => parts.push(json!({"text": call_as_text(call)})),
        }
    }
    if parts.is_empty() {
        parts.push(json!({"text": ""}));
    }
    let usage = &upstream["usage"];
    json!({
        "candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": finish_reason(choice["finish_reason"].as_str()), "index": 0}],
        "usageMetadata": {"promptTokenCount": usage["prompt_tokens"], "candidatesTokenCount": usage["completion_tokens"], "totalTokenCount": usage["total_tokens"]},
        "modelVersion": model,
        "responseId": upstream["id"],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gemini_cli_shaped_request_maps_to_chat() {
        let body = json!({
            "systemInstruction": {"parts": [{"text": "You are Gemini CLI."}]},
            "contents": [
                {"role": "user", "parts": [{"text": "list files"}]},
                {"role": "model", "parts": [{"text": "plan", "thought": true}, {"functionCall": {"name": "ls", "args": {"path": "."}}, "thoughtSignature": "sig"}]},
                {"role": "user", "parts": [{"functionResponse": {"name": "ls", "response": {"output": "a.py"}}}]}],
            "tools": [{"functionDeclarations": [{"name": "ls", "description": "list", "parametersJsonSchema": {"type": "object"}}]}, {"googleSearch": {}}],
            "toolConfig": {"functionCallingConfig": {"mode": "ANY"}},
            "generationConfig": {"maxOutputTokens": 100, "temperature": 0.5, "topK": 40, "thinkingConfig": {"thinkingBudget": 0}}
        });
        let n = normalize(body.to_string().as_bytes(), "gemini-2.5-pro", true).expect("valid");
        assert!(n.stream);
        assert_eq!(n.dropped, ["hosted_tool:googleSearch"]);
        let m = &n.request["messages"];
        assert_eq!(m[0]["content"], "You are Gemini CLI.");
        assert_eq!(m[2]["reasoning_content"], "plan");
        let id = m[2]["tool_calls"][0]["id"].as_str().expect("invented id");
        assert_eq!(
            m[3],
            json!({"role": "tool", "tool_call_id": id, "content": "{\"output\":\"a.py\"}"})
        );
        assert_eq!(n.request["tool_choice"], "required");
        assert_eq!(n.request["max_tokens"], 100);
        assert_eq!(n.request["top_k"], 40);
        assert_eq!(
            n.request["chat_template_kwargs"],
            json!({"enable_thinking": false})
        );
    }

    #[test]
    fn bad_requests_name_the_problem() {
        for (body, needle) in [
            (json!({}), "contents must be an array"),
            (
                json!({"contents": [{"role": "model", "parts": "x"}]}),
                "parts must be an array",
            ),
            (
                json!({"contents": [{"role": "oracle", "parts": []}]}),
                "\"oracle\"",
            ),
            (
                json!({"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"candidateCount": 2}}),
                "candidateCount",
            ),
            (json!({"contents": []}), "at least one message"),
        ] {
            let err = normalize(body.to_string().as_bytes(), "m", false).expect_err("invalid");
            assert!(err.to_string().contains(needle), "{body}: {err}");
            assert_eq!(
                err.body(crate::capture::Api::Gemini)["error"]["status"],
                "INVALID_ARGUMENT"
            );
        }
    }

    #[test]
    fn responses_carry_parts_finish_and_usage() {
        let upstream = json!({"id": "chatcmpl-1", "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
            "choices": [{"finish_reason": "tool_calls", "message": {"content": "ok", "tool_calls": [{"id": "c1", "function": {"name": "ls", "arguments": "{\"path\": \".\"}"}}]}}]});
        let r = response(&upstream, "gemini-2.5-pro");
        assert_eq!(
            r["candidates"][0]["content"]["parts"][1]["functionCall"]["args"],
            json!({"path": "."})
        );
        assert_eq!(r["candidates"][0]["finishReason"], "STOP");
        assert_eq!(r["usageMetadata"]["totalTokenCount"], 8);
        let cut = json!({"choices": [{"finish_reason": "length", "message": {"content": "a"}}]});
        assert_eq!(
            response(&cut, "m")["candidates"][0]["finishReason"],
            "MAX_TOKENS"
        );
    }
}
