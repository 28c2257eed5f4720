//! Wire formats of the provider APIs, one module each, as pure functions between the
//! provider's JSON and OpenAI Chat Completions (what vLLM serves). No IO here.

pub mod answer;
pub mod anthropic;
pub mod errors;
pub mod fuzz_inputs;
pub mod gemini;
pub mod media;
pub mod openai_chat;
pub mod openai_responses;
mod responses_tools;
pub mod retry;
pub mod sampling;
pub mod upstream;

pub use errors::ProtocolError;

use serde_json::{Map, Value};

/// What the gateway does with a provider-hosted tool (web search, file search, code execution,
/// computer use, …) in a request: vLLM cannot run one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HostedTools {
    /// Answer the request with the provider's 400 (the default: nothing is silently lost).
    #[default]
    Reject,
    /// Remove them from the request and count them in the trajectory.
    Drop,
}

/// The prefix of [`Normalized::dropped`] entries that name a hosted tool.
pub const HOSTED_TOOL: &str = "hosted_tool:";

impl Normalized {
    /// The hosted tools this request asked for, as the provider names them.
    pub fn hosted_tools(&self) -> Vec<&str> {
        self.dropped
            .iter()
            .filter_map(|d| d.strip_prefix(HOSTED_TOOL))
            .collect()
    }
}

/// A provider request translated for the upstream (OpenAI Chat Completions), with what the
/// reply needs to know about the original.
#[derive(Debug, Default, PartialEq)]
pub struct Normalized {
    pub request: Map<String, Value>,
    pub stream: bool,
    /// The model name the harness asked for (echoed in the reply).
    pub model: String,
    /// What could not be expressed upstream and was dropped, e.g. `hosted_tool:web_search`.
    pub dropped: Vec<String>,
    /// OpenAI: the client asked for logprobs in the reply.
    pub wants_logprobs: bool,
    /// OpenAI: `stream_options.include_usage`.
    pub include_usage: bool,
    /// Gemini `streamGenerateContent` without `alt=sse`: the reply is a JSON array of chunks.
    pub reply_as_array: bool,
    /// Responses: freeform `custom` tools, whose calls go back as `custom_tool_call`.
    pub custom_tools: std::collections::BTreeSet<String>,
    /// Responses: tools declared in a `namespace`, by the name the model is shown → their
    /// namespace and own name, which their calls go back with.
    pub namespaced_tools: std::collections::BTreeMap<String, (String, String)>,
}

/// A request body as JSON: parsed once per call, by the server, and handed to a protocol's
/// `normalize_value` (the capture keeps the same value as the original request).
pub fn parse_body(body: &[u8]) -> Result<Value, ProtocolError> {
    let shape = json_shape(body);
    if shape.values > MAX_JSON_VALUES {
        return Err(ProtocolError::InvalidRequest(format!(
            "the body holds about {} JSON values, over the {MAX_JSON_VALUES} a model call may carry",
            shape.values
        )));
    }
    if shape.depth > MAX_JSON_DEPTH {
        return Err(ProtocolError::InvalidRequest(format!(
            "the body nests {} levels deep, over the {MAX_JSON_DEPTH} a model call may carry",
            shape.depth
        )));
    }
    serde_json::from_slice(body)
        .map_err(|e| ProtocolError::InvalidRequest(format!("body is not JSON: {e}")))
}

/// JSON values one request body may hold. Parsed, each costs a `Value` (32 bytes, up to twice
/// that in a growing array) whatever its text: a body of 16 million `0,` (32 MiB, within the
/// body limit) took about a gigabyte, and a session has 16 calls in flight, so an agent could
/// run its gateway (`floe run` itself, in local mode) out of memory and every session down
/// with it. An honest call holds thousands (messages, parts, tool schemas; text and media are
/// one string each), the longest agent conversations tens of thousands.
pub const MAX_JSON_VALUES: usize = 1_000_000;

/// How deep one request body may nest. The capture keeps the body inside its record (a level
/// more, the upstream request a level or two more again) and reads it back with serde_json,
/// whose limit is 128 levels: a body of 127 parsed here, but its record did not read back, so
/// one call of the agent's own made its session's capture unreadable and the session an
/// infrastructure failure, retried (a loss re-rolled at will). An honest call nests a dozen
/// levels, its deepest tool schemas a few dozen.
pub const MAX_JSON_DEPTH: usize = 64;

/// What [`json_shape`] reads of a body.
struct JsonShape {
    /// An upper bound on its values: one more than its commas, colons and opening brackets.
    values: usize,
    /// Its deepest nesting of arrays and objects.
    depth: usize,
}

/// The values and nesting of `body`, read without parsing it (brackets and commas inside
/// strings are text).
fn json_shape(body: &[u8]) -> JsonShape {
    let (mut values, mut in_string, mut escaped) = (1usize, false, false);
    let (mut depth, mut deepest) = (0usize, 0usize);
    for &b in body {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
        } else {
            match b {
                b'"' => in_string = true,
                b'[' | b'{' => {
                    values += 1;
                    depth += 1;
                    deepest = deepest.max(depth);
                }
                b']' | b'}' => depth = depth.saturating_sub(1),
                b',' | b':' => values += 1,
                _ => {}
            }
        }
    }
    JsonShape {
        values,
        depth: deepest,
    }
}

/// The Chat Completions assistant message for a turn's text, reasoning and tool calls (the
/// shape every provider's history folds into).
/// Text blocks as one text, a line apart: what vLLM makes of the same parts sent as a Chat
/// message's content array (`"\n".join`), so a call renders alike whichever API it came by
/// (a `<system-reminder>` block and the prompt after it stay on lines of their own).
pub(crate) fn join_texts<'a>(texts: impl Iterator<Item = &'a str>) -> String {
    texts
        .filter(|t| !t.is_empty())
        .collect::<Vec<_>>()
        .join("\n")
}

pub(crate) fn assistant_message(text: String, reasoning: String, calls: Vec<Value>) -> Value {
    let mut m = serde_json::json!({"role": "assistant", "content": text});
    if !reasoning.is_empty() {
        m["reasoning_content"] = reasoning.into();
    }
    if !calls.is_empty() {
        m["tool_calls"] = Value::Array(calls);
    }
    m
}

/// The reasoning text of an upstream message (`reasoning_content`, or vLLM's newer `reasoning`).
pub(crate) fn reasoning_of(message: &Value) -> Option<&str> {
    message
        .get("reasoning_content")
        .filter(|r| !r.is_null())
        .or(message.get("reasoning"))
        .and_then(Value::as_str)
        .filter(|r| !r.is_empty())
}

/// A tool call's arguments as a JSON object, or `None` when they are not one (such a call
/// cannot become a provider's structured call and is returned as text).
pub(crate) fn call_arguments(call: &Value) -> Option<Value> {
    let args = call["function"]["arguments"].as_str().unwrap_or("{}");
    serde_json::from_str::<Value>(args)
        .ok()
        .filter(Value::is_object)
}

/// A call that cannot be a structured call, as the text the model meant: `name(arguments)`.
pub(crate) fn call_as_text(call: &Value) -> String {
    let name = call["function"]["name"].as_str().unwrap_or("tool");
    format!(
        "{name}({})",
        call["function"]["arguments"].as_str().unwrap_or_default()
    )
}

/// The stop sequence an upstream choice ended on, when it ended on one: vLLM's `stop_reason`
/// or SGLang's `matched_stop` holds the matched string (a number there is a stop token id,
/// the model's own end of turn, not a caller's sequence).
pub(crate) fn matched_stop_sequence(choice: &Value) -> Option<&str> {
    if choice["finish_reason"] != "stop" {
        return None;
    }
    ["stop_reason", "matched_stop"]
        .iter()
        .find_map(|k| choice.get(*k).and_then(Value::as_str))
}

/// `response_format` for a provider's `{"type": "json_schema", "schema", "name"?, "strict"?}`
/// (Anthropic's `output_config.format`, Responses' `text.format`); `what` names it in errors.
pub(crate) fn json_schema_of_format(
    format: &Value,
    what: &str,
    default_name: &str,
) -> Result<Value, ProtocolError> {
    let schema = format
        .get("schema")
        .filter(|s| s.is_object())
        .ok_or_else(|| ProtocolError::InvalidRequest(format!("{what}.schema must be an object")))?;
    Ok(json_schema_format(
        format["name"].as_str().unwrap_or(default_name),
        schema.clone(),
        format["strict"].as_bool(),
    ))
}

/// Chat Completions' `response_format` for a JSON schema (what vLLM turns into guided
/// decoding), from any provider's structured-output request.
pub(crate) fn json_schema_format(name: &str, schema: Value, strict: Option<bool>) -> Value {
    let mut spec = serde_json::json!({"name": name, "schema": schema});
    if let Some(strict) = strict {
        spec["strict"] = strict.into();
    }
    serde_json::json!({"type": "json_schema", "json_schema": spec})
}

/// A Chat Completions function tool. `strict` (the caller's, or implied by its API) makes vLLM
/// constrain the call's arguments to `parameters`; without it a small model may emit
/// arguments that are no JSON object at all.
pub(crate) fn function_tool(
    name: &Value,
    description: Option<&Value>,
    parameters: Value,
    strict: Option<bool>,
) -> Value {
    let mut function = serde_json::json!({"name": name,
        "description": description.cloned().unwrap_or(Value::Null), "parameters": parameters});
    if let Some(strict) = strict {
        function["strict"] = strict.into();
    }
    serde_json::json!({"type": "function", "function": function})
}

/// The chat functions a caller's allowed-tools choice leaves (OpenAI's `allowed_tools`,
/// Gemini's `allowedFunctionNames`). vLLM has no such choice, and constraining its decoding to
/// them would sample a distribution the trainer does not model: the model is shown only those
/// (and the captured prompt is what it was shown). A name not declared is ignored; a choice that
/// names functions but none declared is the caller's error, named by `field`; one that names
/// none (only hosted tools, which the gateway drops or refuses anyway) leaves no function.
pub(crate) fn only_allowed<'a>(
    functions: Vec<Value>,
    allowed: impl IntoIterator<Item = &'a str>,
    field: &str,
) -> Result<Vec<Value>, ProtocolError> {
    let allowed: std::collections::BTreeSet<&str> = allowed.into_iter().collect();
    if allowed.is_empty() {
        return Ok(Vec::new());
    }
    let kept: Vec<Value> = functions
        .into_iter()
        .filter(|f| {
            // A chat tool is `{"type": "function", "function": {"name": …}}` (or `custom`).
            let kind = f["type"].as_str().unwrap_or("function");
            f[kind]["name"]
                .as_str()
                .is_some_and(|n| allowed.contains(n))
        })
        .collect();
    if kept.is_empty() {
        return Err(ProtocolError::InvalidRequest(format!(
            "{field} names none of the declared tools"
        )));
    }
    Ok(kept)
}

/// The names of a normalized request's tools, in order (for tests).
#[cfg(test)]
pub(crate) fn tool_names(request: &Map<String, Value>) -> Vec<&str> {
    request
        .get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|t| t["function"]["name"].as_str())
        .collect()
}

#[cfg(test)]
mod body_tests {
    use super::*;

    #[test]
    fn values_and_depth_are_counted_outside_strings_only() {
        let shape = |b: &[u8]| {
            let s = json_shape(b);
            (s.values, s.depth)
        };
        assert_eq!(shape(br#"{"a":[1,2]}"#), (5, 2));
        // Commas, colons and brackets in text (escaped quotes too) are text.
        assert_eq!(shape(br#"{"t":"a,b:[{\",\\"}"#), (3, 1));
        assert_eq!(shape(b"3"), (1, 0));
        assert_eq!(shape(br#"[[],[[]],{}]"#), (8, 3));
    }

    /// `depth` arrays around a `0`, under `metadata` (a key every API drops before upstream).
    fn nested(depth: usize) -> Vec<u8> {
        format!(
            r#"{{"model":"m","messages":[],"metadata":{}0{}}}"#,
            "[".repeat(depth - 1),
            "]".repeat(depth - 1)
        )
        .into_bytes()
    }

    #[test]
    fn a_body_nested_deeper_than_its_capture_reads_back_is_refused() {
        let deepest = nested(MAX_JSON_DEPTH);
        assert_eq!(json_shape(&deepest).depth, MAX_JSON_DEPTH);
        let taken = parse_body(&deepest).expect("the deepest body taken");
        let refused = parse_body(&nested(MAX_JSON_DEPTH + 1)).expect_err("one level more");
        assert!(refused.to_string().contains("levels deep"), "{refused}");
        // serde_json parses 127 levels: without the limit this one was taken.
        assert!(serde_json::from_slice::<Value>(&nested(127)).is_ok());
        assert!(parse_body(&nested(127)).is_err());
        // The deepest body taken reads back inside a capture record, its upstream request a
        // few levels deeper still, with room to spare under serde_json's 128.
        let record = serde_json::json!({"request": taken.clone(),
            "normalized_request": {"tools": [{"function": {"parameters": taken}}]}});
        let line = serde_json::to_vec(&record).expect("a record");
        assert!(json_shape(&line).depth < 100);
        assert!(serde_json::from_slice::<Value>(&line).is_ok());
    }

    #[test]
    fn a_body_of_a_million_tiny_values_is_refused_and_long_text_is_not() {
        let mut padded = br#"{"model":"m","messages":[],"metadata":{"pad":["#.to_vec();
        padded.extend(b"0,".repeat(MAX_JSON_VALUES));
        padded.extend(b"0]}}");
        let refused = parse_body(&padded).expect_err("a million values");
        assert!(refused.to_string().contains("JSON values"), "{refused}");
        // The same bytes as one string: a single value.
        let text = format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":"{}"}}]}}"#,
            "0,".repeat(MAX_JSON_VALUES)
        );
        assert!(parse_body(text.as_bytes()).is_ok());
    }
}
