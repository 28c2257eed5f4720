//! Gemini (`/v1beta/models/{model}:generateContent` and `:streamGenerateContent`): what Gemini
//! CLI sends, translated to Chat Completions for vLLM and back.
//!
//! Request rules:
//! - `systemInstruction` → the leading system message.
//! - `user` contents: `text` → user message, `functionResponse` → `tool` message (Gemini
//!   CLI's `{"output": text}` as that text, `{"error": text}` as `Error: text`, as the other
//!   APIs' tool results read; any other `response` serialized), `inlineData` → `image_url`
//!   data URL.
//! - `model` contents: `text` → assistant content, `thought: true` text → `reasoning_content`,
//!   `functionCall` → `tool_calls`; `thoughtSignature` is opaque and not sent upstream.
//!   Gemini pairs a `functionResponse` with its call by id when it has one, else by name in
//!   call order (what the SDKs' `Part.from_function_response(name=…)` sends, even for a call
//!   that came back with an id): calls without an id get an invented one, and a response
//!   without an id answers the earliest unanswered call of its name.
//! - `functionDeclarations` → functions (`parameters` or `parametersJsonSchema`; strict under
//!   `toolConfig` modes ANY and VALIDATED, whose calls Gemini guarantees to follow the schema); built-in tools
//!   (`googleSearch`, `codeExecution`, `urlContext`, …) are dropped and counted.
//! - `generationConfig`: `maxOutputTokens`, `temperature`, `topP`, `topK`, `stopSequences`;
//!   `thinkingConfig` → `chat_template_kwargs.enable_thinking`; `candidateCount` > 1 refused.
//! - Structured output → vLLM's guided decoding: `responseMimeType: application/json` with
//!   `responseJsonSchema` (JSON Schema) or `responseSchema` (Gemini's OpenAPI subset, turned
//!   into JSON Schema) → `response_format` json_schema, without a schema → json_object;
//!   `text/x.enum` with an enum schema → `structured_outputs.choice`.

use std::collections::{HashMap, HashSet, VecDeque};

use serde_json::{json, Map, Value};

use super::{
    assistant_message, call_arguments, call_as_text, json_schema_format, reasoning_of, Normalized,
    ProtocolError,
};

/// Call ids (given or invented) waiting for their response, by function name, in order. A
/// response naming its id answers that call: marked, and skipped when a response without one
/// takes the earliest (taking it out of the queue would cost the queue's length each time, and
/// a request may hold 100k calls of one name).
#[derive(Default)]
struct PendingCalls {
    waiting: HashMap<String, VecDeque<String>>,
    answered: HashSet<(String, String)>,
}

impl PendingCalls {
    fn call(&mut self, name: &str, id: &str) {
        let key = (name.to_string(), id.to_string());
        // A call id used again (after its answer) is waiting again.
        self.answered.remove(&key);
        self.waiting.entry(key.0).or_default().push_back(key.1);
    }

    fn answer(&mut self, name: &str, id: &str) {
        self.answered.insert((name.to_string(), id.to_string()));
    }

    /// The earliest call of `name` not answered yet, now answered.
    fn earliest(&mut self, name: &str) -> Option<String> {
        let queue = self.waiting.get_mut(name)?;
        while let Some(id) = queue.pop_front() {
            if !self.answered.contains(&(name.to_string(), id.clone())) {
                return Some(id);
            }
        }
        None
    }
}

fn invalid(msg: impl Into<String>) -> ProtocolError {
    ProtocolError::InvalidRequest(msg.into())
}

/// Split `gemini-2.5-pro:streamGenerateContent` into model and method.
pub fn model_and_method(segment: &str) -> Option<(&str, &str)> {
    segment.rsplit_once(':')
}

/// A `functionResponse`'s `response` as the model reads it: Gemini CLI's `{"output": text}`
/// is that text and `{"error": text}` is `Error: text` (as a failed tool result of the other
/// APIs reads), not a JSON line with every newline and quote escaped (a file's contents would
/// read `line one\nline two`); any other response is its JSON.
fn response_text(response: &Value) -> String {
    let only = response
        .as_object()
        .filter(|o| o.len() == 1)
        .and_then(|o| o.iter().next())
        .and_then(|(k, v)| Some((k.as_str(), v.as_str()?)));
    match only {
        Some(("output", text)) => text.to_string(),
        Some(("error", text)) => format!("Error: {text}"),
        _ => response.to_string(),
    }
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
    let Value::Object(req) = camel_case_keys(value) else {
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
    let mut pending = PendingCalls::default();
    for (i, c) in contents.iter().enumerate() {
        let parts = c["parts"]
            .as_array()
            .ok_or_else(|| invalid(format!("contents[{i}].parts must be an array")))?;
        match c["role"].as_str().unwrap_or("user") {
            "user" | "function" => {
                let mut texts = Vec::new();
                // Text and images in the order given ("describe this" after its image reads
                // otherwise than before it), for a message with images.
                let mut ordered = Vec::new();
                let mut images = 0;
                for (k, p) in parts.iter().enumerate() {
                    if let Some(fr) = p.get("functionResponse") {
                        let name = fr["name"].as_str().ok_or_else(|| {
                            invalid(format!(
                                "contents[{i}].parts[{k}].functionResponse.name is required"
                            ))
                        })?;
                        let id = match fr["id"].as_str().filter(|id| !id.is_empty()) {
                            Some(id) => {
                                pending.answer(name, id);
                                id.to_string()
                            }
                            None => pending
                                .earliest(name)
                                .unwrap_or_else(|| format!("call_{name}_{i}_{k}")),
                        };
                        // A multimodal response's files (Gemini CLI's read of an image, for a
                        // gemini-3 model) ride in its `parts`: told, and counted, as the other
                        // APIs' are.
                        let mut content = vec![response_text(&fr["response"])];
                        for part in fr["parts"].as_array().into_iter().flatten() {
                            let image = part["inlineData"]["mimeType"]
                                .as_str()
                                .or_else(|| part["fileData"]["mimeType"].as_str())
                                .is_some_and(|m| m.starts_with("image/"));
                            let (note, what) = if image {
                                (super::media::TOOL_RESULT_IMAGE_NOTE, "tool_result_image")
                            } else {
                                (super::media::TOOL_RESULT_FILE_NOTE, "tool_result_file")
                            };
                            content.push(note.to_string());
                            dropped.push(what.to_string());
                        }
                        let content = super::join_texts(content.iter().map(String::as_str));
                        out.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
                    } else if let Some(t) = p["text"].as_str() {
                        texts.push(t.to_string());
                        // An empty part adds nothing (joined, it is left out too).
                        if !t.is_empty() {
                            ordered.push(json!({"type": "text", "text": t}));
                        }
                    } else if let Some(d) = p.get("inlineData") {
                        images += 1;
                        ordered.push(json!({"type": "image_url", "image_url": {"url": format!("data:{};base64,{}",
                            d["mimeType"].as_str().unwrap_or("application/octet-stream"), d["data"].as_str().unwrap_or_default())}}));
                    } else {
                        dropped.push("unsupported_part".to_string());
                    }
                }
                if images > 0 {
                    out.push(json!({"role": "user", "content": ordered}));
                } else if !texts.is_empty() {
                    let text = super::join_texts(texts.iter().map(String::as_str));
                    out.push(json!({"role": "user", "content": text}));
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
                        let id = match fc["id"].as_str().filter(|id| !id.is_empty()) {
                            Some(id) => id.to_string(),
                            None => format!("call_{name}_{i}_{k}"),
                        };
                        pending.call(name, &id);
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
    // Gemini's ANY and VALIDATED modes guarantee calls that follow the declared schema.
    let mode = req
        .get("toolConfig")
        .and_then(|c| c["functionCallingConfig"]["mode"].as_str());
    let strict = matches!(mode, Some("ANY" | "VALIDATED")).then_some(true);
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
                    // `parameters` is Gemini's own Schema (upper-case types): JSON Schema
                    // for vLLM, like a structured-output schema.
                    let params = match (f.get("parametersJsonSchema"), f.get("parameters")) {
                        (Some(json_schema), _) if !json_schema.is_null() => json_schema.clone(),
                        (_, Some(openapi)) if !openapi.is_null() => json_schema_of(openapi)?,
                        _ => json!({"type": "object", "properties": {}}),
                    };
                    functions.push(super::function_tool(
                        &f["name"],
                        f.get("description"),
                        params,
                        strict,
                    ));
                }
            } else {
                dropped.push(format!("hosted_tool:{kind}"));
            }
        }
    }
    if !functions.is_empty() {
        // Gemini's ANY and VALIDATED modes may name the functions the model may call.
        if let Some(names) = req
            .get("toolConfig")
            .and_then(|c| c["functionCallingConfig"]["allowedFunctionNames"].as_array())
            .filter(|names| !names.is_empty())
        {
            let names = names.iter().filter_map(Value::as_str);
            functions = super::only_allowed(
                functions,
                names,
                "toolConfig.functionCallingConfig.allowedFunctionNames",
            )?;
        }
        request.insert("tools".into(), Value::Array(functions));
        match mode {
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
    structured_output(&g, &mut request)?;
    Ok(Normalized {
        request,
        stream,
        model: model.to_string(),
        dropped,
        ..Default::default()
    })
}

/// Fields whose values are the caller's own data (function arguments and results, JSON
/// Schemas, labels): their keys are kept as written.
const FREE_FORM: [&str; 7] = [
    "args",
    "response",
    "parametersJsonSchema",
    "responseJsonSchema",
    "default",
    "example",
    "labels",
];

/// The request with every field name in lowerCamelCase. Gemini's API is protobuf JSON, whose
/// parsers take a field's proto name too (`parameters_json_schema`, `inline_data`): google-genai
/// for Python sends some fields that way. Only field names change: the caller's own data
/// ([`FREE_FORM`], and the property names of a `Schema`'s `properties`) stays as written.
fn camel_case_keys(value: Value) -> Value {
    let Value::Object(fields) = value else {
        return match value {
            Value::Array(items) => Value::Array(items.into_iter().map(camel_case_keys).collect()),
            other => other,
        };
    };
    let mut out = Map::new();
    for (key, value) in fields {
        let key = lower_camel(&key);
        let value = if FREE_FORM.contains(&key.as_str()) {
            value
        } else if key == "properties" {
            match value {
                Value::Object(props) => Value::Object(
                    props
                        .into_iter()
                        .map(|(name, schema)| (name, camel_case_keys(schema)))
                        .collect(),
                ),
                other => other,
            }
        } else {
            camel_case_keys(value)
        };
        out.insert(key, value);
    }
    Value::Object(out)
}

fn lower_camel(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut upper = false;
    for c in name.chars() {
        if c == '_' && !out.is_empty() {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// `generationConfig`'s structured output, as vLLM's guided decoding.
fn structured_output(g: &Value, request: &mut Map<String, Value>) -> Result<(), ProtocolError> {
    let schema = match (g.get("responseJsonSchema"), g.get("responseSchema")) {
        (Some(json_schema), _) if !json_schema.is_null() => Some(json_schema.clone()),
        (_, Some(openapi)) if !openapi.is_null() => Some(json_schema_of(openapi)?),
        _ => None,
    };
    match g["responseMimeType"].as_str() {
        None | Some("text/plain") => {
            if schema.is_some() {
                return Err(invalid(
                    "generationConfig.responseSchema needs responseMimeType application/json or text/x.enum",
                ));
            }
        }
        Some("application/json") => {
            let format = match schema {
                Some(schema) => json_schema_format("response", schema, None),
                None => json!({"type": "json_object"}),
            };
            request.insert("response_format".into(), format);
        }
        Some("text/x.enum") => {
            let choices = schema
                .as_ref()
                .and_then(|s| s["enum"].as_array())
                .filter(|e| !e.is_empty() && e.iter().all(Value::is_string))
                .ok_or_else(|| {
                    invalid("responseMimeType text/x.enum needs a responseSchema with a string enum")
                })?;
            request.insert(
                "structured_outputs".into(),
                json!({"choice": choices.clone()}),
            );
        }
        Some(other) => {
            return Err(invalid(format!(
                "generationConfig.responseMimeType {other:?} is not supported: use text/plain, application/json or text/x.enum"
            )))
        }
    }
    Ok(())
}

/// JSON Schema for a Gemini `Schema` (the OpenAPI 3.0 subset): types are upper case there,
/// `nullable` is a flag, `propertyOrdering` and `example` have no JSON Schema meaning.
fn json_schema_of(schema: &Value) -> Result<Value, ProtocolError> {
    let Value::Object(fields) = schema else {
        return Err(invalid(
            "a Schema (responseSchema, parameters) must be an object",
        ));
    };
    let mut out = Map::new();
    for (key, value) in fields {
        match key.as_str() {
            "type" => {
                let t = value
                    .as_str()
                    .ok_or_else(|| invalid("Schema type must be a string"))?
                    .to_ascii_lowercase();
                if t != "type_unspecified" {
                    out.insert("type".into(), t.into());
                }
            }
            "properties" => {
                let props = value
                    .as_object()
                    .ok_or_else(|| invalid("Schema properties must be an object"))?
                    .iter()
                    .map(|(name, s)| Ok((name.clone(), json_schema_of(s)?)))
                    .collect::<Result<Map<_, _>, ProtocolError>>()?;
                out.insert(key.clone(), Value::Object(props));
            }
            "items" => {
                out.insert(key.clone(), json_schema_of(value)?);
            }
            "anyOf" => {
                let any = value
                    .as_array()
                    .ok_or_else(|| invalid("Schema anyOf must be an array"))?
                    .iter()
                    .map(json_schema_of)
                    .collect::<Result<Vec<_>, _>>()?;
                out.insert(key.clone(), Value::Array(any));
            }
            "nullable" | "propertyOrdering" | "example" => {}
            _ => {
                out.insert(key.clone(), value.clone());
            }
        }
    }
    if fields.get("nullable") == Some(&Value::Bool(true)) {
        if let Some(Value::String(t)) = out.get("type").cloned() {
            out.insert("type".into(), json!([t, "null"]));
        }
    }
    Ok(Value::Object(out))
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
    fn gemini_clis_tool_results_reach_the_model_as_text() {
        use super::response_text;
        assert_eq!(
            response_text(&json!({"output": "line one\nline \"two\""})),
            "line one\nline \"two\""
        );
        assert_eq!(
            response_text(&json!({"error": "No such file"})),
            "Error: No such file"
        );
        // Anything else is the tool's own structure.
        assert_eq!(response_text(&json!({"t": "noon"})), "{\"t\":\"noon\"}");
        assert_eq!(
            response_text(&json!({"output": "a", "extra": 1})),
            "{\"output\":\"a\",\"extra\":1}"
        );
        assert_eq!(response_text(&json!({"output": 3})), "{\"output\":3}");
    }

    #[test]
    fn a_users_text_parts_are_a_line_apart_as_vllm_joins_a_chat_messages() {
        let body = json!({"contents": [{"role": "user", "parts": [
            {"text": "<session_context>cwd: /w</session_context>"}, {"text": "fix the test"}]}]});
        let n = normalize(body.to_string().as_bytes(), "m", false).expect("valid");
        assert_eq!(
            n.request["messages"][0]["content"],
            "<session_context>cwd: /w</session_context>\nfix the test"
        );
    }

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
            json!({"role": "tool", "tool_call_id": id, "content": "a.py"})
        );
        assert_eq!(n.request["tool_choice"], "required");
        assert_eq!(n.request["max_tokens"], 100);
        assert_eq!(n.request["top_k"], 40);
        assert_eq!(
            n.request["chat_template_kwargs"],
            json!({"enable_thinking": false})
        );
    }

    /// Gemini CLI puts a file it read in the `functionResponse`'s own `parts` for a gemini-3
    /// model, its `response` saying only "Binary content provided": the file vanished without
    /// a word or a count.
    #[test]
    fn files_in_a_function_response_become_notes_and_are_counted() {
        use crate::protocol::media::{TOOL_RESULT_FILE_NOTE, TOOL_RESULT_IMAGE_NOTE};
        let body = json!({"contents": [
            {"role": "user", "parts": [{"text": "look"}]},
            {"role": "model", "parts": [{"functionCall": {"name": "read_file", "args": {}}}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "read_file",
                "response": {"output": "Binary content provided (2 item(s))."},
                "parts": [{"inlineData": {"mimeType": "image/png", "data": "AAAA"}},
                          {"inlineData": {"mimeType": "application/pdf", "data": "JVBERi0="}}]}}]}]});
        let n =
            normalize(body.to_string().as_bytes(), "gemini-3-pro-preview", false).expect("valid");
        assert_eq!(
            n.request["messages"][2]["content"],
            format!(
                "Binary content provided (2 item(s)).\n{TOOL_RESULT_IMAGE_NOTE}\n{TOOL_RESULT_FILE_NOTE}"
            )
        );
        assert_eq!(n.dropped, ["tool_result_image", "tool_result_file"]);
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

    #[test]
    fn a_call_answered_by_its_id_is_skipped_when_the_earliest_is_taken() {
        let mut p = PendingCalls::default();
        for id in ["a", "b", "c"] {
            p.call("f", id);
        }
        p.answer("f", "a");
        p.answer("f", "c");
        assert_eq!(p.earliest("f").as_deref(), Some("b"));
        assert_eq!(p.earliest("f"), None);
        // An id called again after its answer waits again.
        p.call("f", "a");
        assert_eq!(p.earliest("f").as_deref(), Some("a"));
        assert_eq!(p.earliest("g"), None);
    }

    #[test]
    fn responses_without_ids_answer_their_calls_by_name_in_order() {
        // The gateway's reply gave the calls ids; the SDK's helper sends responses without.
        let body = json!({"contents": [
            {"role": "user", "parts": [{"text": "weather in two towns"}]},
            {"role": "model", "parts": [
                {"functionCall": {"id": "call_a", "name": "weather", "args": {"town": "A"}}},
                {"functionCall": {"id": "call_b", "name": "weather", "args": {"town": "B"}}},
                {"functionCall": {"name": "time", "args": {}}}]},
            {"role": "user", "parts": [
                {"functionResponse": {"name": "time", "response": {"t": "noon"}}},
                {"functionResponse": {"name": "weather", "response": {"sky": "rain"}}},
                {"functionResponse": {"name": "weather", "response": {"sky": "sun"}}}]},
            {"role": "model", "parts": [{"functionCall": {"id": "call_c", "name": "weather", "args": {"town": "C"}}},
                                        {"functionCall": {"id": "call_d", "name": "weather", "args": {"town": "D"}}}]},
            {"role": "user", "parts": [
                {"functionResponse": {"id": "call_d", "name": "weather", "response": {"sky": "fog"}}},
                {"functionResponse": {"name": "weather", "response": {"sky": "snow"}}}]}]});
        let n = normalize(body.to_string().as_bytes(), "m", false).expect("valid");
        let m = n.request["messages"].as_array().expect("messages");
        let time_id = m[1]["tool_calls"][2]["id"].clone();
        let answered: Vec<(&Value, &Value)> = m
            .iter()
            .filter(|x| x["role"] == "tool")
            .map(|x| (&x["tool_call_id"], &x["content"]))
            .collect();
        assert_eq!(
            answered,
            [
                (&time_id, &json!("{\"t\":\"noon\"}")),
                (&json!("call_a"), &json!("{\"sky\":\"rain\"}")),
                (&json!("call_b"), &json!("{\"sky\":\"sun\"}")),
                // An id answers its own call; the one without answers the other.
                (&json!("call_d"), &json!("{\"sky\":\"fog\"}")),
                (&json!("call_c"), &json!("{\"sky\":\"snow\"}")),
            ]
        );
    }

    #[test]
    fn structured_output_reaches_guided_decoding() {
        let ask = |g: Value| {
            normalize(
                json!({"contents": [{"parts": [{"text": "x"}]}], "generationConfig": g})
                    .to_string()
                    .as_bytes(),
                "m",
                false,
            )
        };
        let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}}});
        let n = ask(json!({"responseMimeType": "application/json", "responseJsonSchema": schema}))
            .expect("valid");
        assert_eq!(
            n.request["response_format"],
            json!({"type": "json_schema", "json_schema": {"name": "response", "schema": schema}})
        );
        // Gemini's own Schema: upper-case types, nullable, propertyOrdering.
        let openapi = json!({"type": "OBJECT", "propertyOrdering": ["name", "tags"],
            "properties": {"name": {"type": "STRING", "nullable": true},
                           "tags": {"type": "ARRAY", "items": {"type": "STRING", "enum": ["a", "b"]}}},
            "required": ["name"]});
        let n = ask(json!({"responseMimeType": "application/json", "responseSchema": openapi}))
            .expect("valid");
        assert_eq!(
            n.request["response_format"]["json_schema"]["schema"],
            json!({"type": "object", "required": ["name"],
                "properties": {"name": {"type": ["string", "null"]},
                               "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}}}})
        );
        let n = ask(json!({"responseMimeType": "application/json"})).expect("valid");
        assert_eq!(n.request["response_format"], json!({"type": "json_object"}));
        let n = ask(json!({"responseMimeType": "text/x.enum",
            "responseSchema": {"type": "STRING", "enum": ["red", "blue"]}}))
        .expect("valid");
        assert_eq!(
            n.request["structured_outputs"],
            json!({"choice": ["red", "blue"]})
        );
        assert!(!ask(json!({"temperature": 0.1}))
            .expect("valid")
            .request
            .contains_key("response_format"));
        for (g, needle) in [
            (json!({"responseMimeType": "text/x.enum"}), "string enum"),
            (json!({"responseMimeType": "image/png"}), "image/png"),
            (
                json!({"responseSchema": {"type": "STRING"}}),
                "responseMimeType",
            ),
            (
                json!({"responseMimeType": "application/json", "responseSchema": {"type": 3}}),
                "type must be a string",
            ),
        ] {
            let err = ask(g.clone()).expect_err("refused");
            assert!(err.to_string().contains(needle), "{g}: {err}");
        }
    }

    #[test]
    fn declared_functions_follow_the_schema_under_any_and_validated() {
        let ask = |mode: &str| {
            let body = json!({"contents": [{"parts": [{"text": "x"}]}],
                "tools": [{"functionDeclarations": [{"name": "f",
                    "parameters": {"type": "OBJECT", "properties": {"city": {"type": "STRING"}}}}]}],
                "toolConfig": {"functionCallingConfig": {"mode": mode}}});
            normalize(body.to_string().as_bytes(), "m", false).expect("valid")
        };
        for (mode, strict) in [
            ("ANY", json!(true)),
            ("VALIDATED", json!(true)),
            ("AUTO", Value::Null),
        ] {
            let n = ask(mode);
            let f = &n.request["tools"][0]["function"];
            assert_eq!(f["strict"], strict, "{mode}");
            assert_eq!(
                f["parameters"],
                json!({"type": "object", "properties": {"city": {"type": "string"}}})
            );
        }
    }

    #[test]
    fn an_image_before_its_question_stays_before_it() {
        let body = json!({"contents": [{"role": "user", "parts": [
            {"inlineData": {"mimeType": "image/png", "data": "AA=="}},
            {"text": "describe this"},
            {"inlineData": {"mimeType": "image/png", "data": "BB=="}}]}]});
        let n = normalize(body.to_string().as_bytes(), "m", false).expect("valid");
        let kinds: Vec<&str> = n.request["messages"][0]["content"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p["type"].as_str())
            .collect();
        assert_eq!(kinds, ["image_url", "text", "image_url"]);
    }

    #[test]
    fn allowed_function_names_show_the_model_those_functions_only() {
        let body = |names: Value| {
            json!({"contents": [{"role": "user", "parts": [{"text": "go"}]}],
                "tools": [{"functionDeclarations": [{"name": "ls"}, {"name": "cat"}, {"name": "rm"}]}],
                "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": names}}})
        };
        let n =
            normalize(body(json!(["rm", "ls"])).to_string().as_bytes(), "m", false).expect("valid");
        let names = crate::protocol::tool_names(&n.request);
        assert_eq!(names, ["ls", "rm"]);
        assert_eq!(n.request["tool_choice"], "required");
        // Empty: no restriction.
        let all = normalize(body(json!([])).to_string().as_bytes(), "m", false).expect("valid");
        assert_eq!(all.request["tools"].as_array().map(Vec::len), Some(3));
        let refused = normalize(body(json!(["mv"])).to_string().as_bytes(), "m", false);
        assert!(
            matches!(&refused, Err(ProtocolError::InvalidRequest(m)) if m.contains("allowedFunctionNames")),
            "{refused:?}"
        );
    }

    #[test]
    fn proto_field_names_are_read_like_their_json_names() {
        // As google-genai for Python sends a declaration's JSON Schema; the schema's own
        // property names and a call's arguments keep their spelling.
        let body = json!({"contents": [
            {"role": "user", "parts": [{"text": "x"}, {"inline_data": {"mime_type": "image/png", "data": "AA=="}}]},
            {"role": "model", "parts": [{"function_call": {"name": "f", "args": {"city_name": "Oslo"}}}]},
            {"role": "user", "parts": [{"function_response": {"name": "f", "response": {"sky_state": "rain"}}}]}],
            "tools": [{"function_declarations": [{"name": "f",
                "parameters_json_schema": {"type": "object", "properties": {"city_name": {"type": "string"}}}}]}],
            "tool_config": {"function_calling_config": {"mode": "ANY"}},
            "generation_config": {"max_output_tokens": 7, "response_mime_type": "application/json",
                "response_schema": {"type": "OBJECT", "properties": {"max_items": {"type": "STRING"}}, "property_ordering": ["max_items"]}}});
        let n = normalize(body.to_string().as_bytes(), "m", false).expect("valid");
        let m = &n.request["messages"];
        assert_eq!(
            m[0]["content"][1]["image_url"]["url"],
            "data:image/png;base64,AA=="
        );
        assert_eq!(
            m[1]["tool_calls"][0]["function"]["arguments"],
            "{\"city_name\":\"Oslo\"}"
        );
        assert_eq!(m[2]["content"], "{\"sky_state\":\"rain\"}");
        let f = &n.request["tools"][0]["function"];
        assert_eq!(
            (&f["parameters"]["properties"]["city_name"], &f["strict"]),
            (&json!({"type": "string"}), &json!(true))
        );
        assert_eq!(n.request["max_tokens"], 7);
        assert_eq!(
            n.request["response_format"]["json_schema"]["schema"],
            json!({"type": "object", "properties": {"max_items": {"type": "string"}}})
        );
        assert_eq!(lower_camel("a_b_c"), "aBC");
        assert_eq!(lower_camel("_x"), "_x");
    }
}
