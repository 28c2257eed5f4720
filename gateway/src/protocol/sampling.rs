//! The sampling contract of a train job's calls (sans-IO): every token the trainer trains on
//! must have been drawn from the distribution it models, `softmax(logits / temperature)` over
//! the whole vocabulary. So a train job's call goes upstream with the complete sampling set
//! (the job's temperature and `top_p`, every other knob neutral: vLLM fills a knob a request
//! leaves out from the model's `generation_config.json`, Qwen3's `top_k` 20 among them), and a
//! parameter from the caller that would change the distribution (`top_k`, `min_p`, penalties,
//! `logit_bias`, `ignore_eos`, `min_tokens`, guided decoding, a forced `tool_choice`) is dropped
//! and counted, or refused, as the job says; a tool's `strict` (grammar-constrained calls) is
//! always dropped and counted. What the request may carry is an allow-list: a
//! parameter not on it is treated alike, so one vLLM adds later cannot slip through.
//!
//! `seed` is foreign too, though each sample alone is still drawn from the policy: a group's
//! samples must be independent draws, and a seed the harness pins makes every sample of a task
//! begin alike (vLLM seeds a generator per request), so its group has no advantage to learn.
//!
//! An sft job's calls pass the caller's parameters through (its data is judged by reward, not
//! trained as the sampler's policy); only temperature and `top_p` are the job's.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::ProtocolError;

/// What the gateway does with a caller's sampling parameters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum CallerSampling {
    /// sft: the caller's parameters go upstream (temperature and `top_p` are the job's).
    #[default]
    PassThrough,
    /// train: the complete policy sampling set; a parameter that would change it is removed
    /// and counted (`floe_gateway_dropped_total{what="sampling:<name>"}`, the capture's
    /// `dropped`).
    Drop,
    /// train: as `Drop`, but such a call is answered with a 400 in its API's shape.
    Refuse,
}

/// Parameters of an upstream Chat Completions request that leave the sampled distribution
/// alone: the conversation and its rendering (the prompt's token ids are captured as the server
/// rendered them), where sampling stops, and the capture switches the gateway sets.
const ALLOWED: &[&str] = &[
    "model",
    "messages",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "max_tokens",
    "stop",
    "stop_token_ids",
    "stream",
    "n",
    "temperature",
    "top_p",
    "logprobs",
    "top_logprobs",
    "return_token_ids",
    "return_prompt_token_ids",
    "return_meta_info",
    "chat_template_kwargs",
    "add_generation_prompt",
    "continue_final_message",
    "add_special_tokens",
    "documents",
    "reasoning_effort",
    "include_stop_str_in_output",
    "skip_special_tokens",
    "spaces_between_special_tokens",
];

/// Values of parameters that go upstream as the caller wrote them, checked to be what the
/// server takes, and refused here, a 400 in the caller's shape. A server that failed on one
/// (a 500) would make the call infrastructure, the session unscored and retried: an agent
/// losing its task could send it on purpose, a loss turned into "not scored" (a read-only
/// review's worry, session 85: a stop token id of 2^64, read as a float on the way). vLLM 0.32
/// answers each of these 400 itself (measured); refused first, no server version decides.
pub fn check_values(body: &Map<String, Value>) -> Result<(), ProtocolError> {
    let given = |key: &str| body.get(key).filter(|v| !v.is_null());
    let token_id = |v: &Value| v.as_u64().is_some_and(|n| n <= u64::from(u32::MAX));
    if given("stop_token_ids")
        .is_some_and(|v| !v.as_array().is_some_and(|a| a.iter().all(token_id)))
    {
        return Err(ProtocolError::InvalidRequest(
            "stop_token_ids must be a list of token ids (integers from 0 to 4294967295)".into(),
        ));
    }
    let strings =
        |v: &Value| v.is_string() || v.as_array().is_some_and(|a| a.iter().all(Value::is_string));
    if given("stop").is_some_and(|v| !strings(v)) {
        return Err(ProtocolError::InvalidRequest(
            "stop must be a string or a list of strings".into(),
        ));
    }
    if given("chat_template_kwargs").is_some_and(|v| !v.is_object()) {
        return Err(ProtocolError::InvalidRequest(
            "chat_template_kwargs must be an object".into(),
        ));
    }
    Ok(())
}

/// The knobs a train job's call sets to neutral, whatever the model's generation config says.
fn neutral() -> [(&'static str, Value); 5] {
    [
        ("top_k", Value::from(-1)),
        ("min_p", Value::from(0.0)),
        ("repetition_penalty", Value::from(1.0)),
        ("presence_penalty", Value::from(0.0)),
        ("frequency_penalty", Value::from(0.0)),
    ]
}

/// Whether an allowed parameter's value still leaves the distribution alone: `tool_choice`
/// forcing a call (`required`, a named function) and a structured `response_format` are
/// guided decoding, which masks tokens.
fn neutral_value(key: &str, value: &Value) -> bool {
    match key {
        "tool_choice" => matches!(value.as_str(), Some("auto" | "none")) || value.is_null(),
        _ => true,
    }
}

/// Applies the contract to `body` (a normalized Chat Completions request). Returns the names
/// of the parameters removed and of the media kinds replaced by a note (the trainer takes
/// text only: [`super::media::to_text`]); `Err` when the job refuses them.
pub fn apply(
    body: &mut Map<String, Value>,
    mode: CallerSampling,
    temperature: Option<f64>,
    top_p: Option<f64>,
) -> Result<Vec<String>, ProtocolError> {
    if let Some(t) = temperature {
        body.insert("temperature".into(), t.into());
    }
    if let Some(p) = top_p {
        body.insert("top_p".into(), p.into());
    }
    // `parallel_tool_calls: false` leaves sampling alone, but vLLM then cuts the answer's tool
    // calls to the first *after* sampling, and its token ids keep the rest: the trainer (or an
    // sft dataset) would learn calls the harness never ran. Every call goes without it (never
    // refused: Codex and Claude Code's Messages requests carry it), and the harness gets every
    // call the model made, so the tokens are what the harness saw. Anything but `true` goes:
    // vLLM's request model coerces `0` and `"false"` to `false` too.
    let one_call = body
        .get("parallel_tool_calls")
        .is_some_and(|v| v != &Value::Bool(true));
    if one_call {
        body.remove("parallel_tool_calls");
    }
    let cut = one_call.then(|| "parallel_tool_calls".to_string());
    if mode == CallerSampling::PassThrough {
        return Ok(cut.into_iter().collect());
    }
    let strict = unstrict_tools(body);
    let foreign: Vec<String> = body
        .iter()
        .filter(|(k, v)| {
            let format_text = k.as_str() == "response_format" && v["type"] == "text";
            !format_text && (!ALLOWED.contains(&k.as_str()) || !neutral_value(k, v))
        })
        .map(|(k, _)| k.clone())
        .collect();
    // Under `Drop` the media become notes here; under `Refuse` they are only named.
    let media = super::media::to_text(body, mode == CallerSampling::Drop);
    if mode == CallerSampling::Refuse && !(foreign.is_empty() && media.is_empty()) {
        let mut why = Vec::new();
        if !foreign.is_empty() {
            why.push(format!("this train job samples only the policy's own distribution (temperature, full vocabulary), and {} would change it", foreign.join(", ")));
        }
        if !media.is_empty() {
            why.push(format!(
                "this train job's model is trained on text only, and the call carries media ({})",
                media.join(", ")
            ));
        }
        return Err(ProtocolError::InvalidRequest(format!(
            "{}: leave it out (spec.sampling.callerParams: Refuse)",
            why.join("; ")
        )));
    }
    for key in &foreign {
        body.remove(key);
    }
    for (key, value) in neutral() {
        body.insert(key.into(), value);
    }
    let strict = strict.then(|| "strict".to_string());
    Ok(foreign
        .into_iter()
        .chain(media)
        .chain(cut)
        .chain(strict)
        .collect())
}

/// Takes `strict` off every function tool; whether one had it. A strict tool makes vLLM
/// (`--tool-strict-level auto`, its default) decode the answer under a grammar: every tool
/// call's envelope and the strict tools' arguments are masked to their schema, a
/// distribution the trainer does not model. Like `parallel_tool_calls`, never refused: the
/// harnesses' own tools carry it (and a Gemini `ANY` mode implies it), and without it the
/// call is only unconstrained, the policy's own.
fn unstrict_tools(body: &mut Map<String, Value>) -> bool {
    let Some(tools) = body.get_mut("tools").and_then(Value::as_array_mut) else {
        return false;
    };
    let mut any = false;
    for function in tools.iter_mut().filter_map(|t| t.get_mut("function")) {
        if let Some(f) = function.as_object_mut() {
            // Shifted out: the function's other keys keep the harness's order.
            any |= f.shift_remove("strict") == Some(Value::Bool(true));
        }
    }
    any
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_the_server_cannot_take_are_refused_before_it() {
        let body = |v: Value| v.as_object().cloned().unwrap_or_default();
        for fine in [
            json!({"stop_token_ids": [2, 151645], "stop": ["\n\n"], "chat_template_kwargs": {"enable_thinking": false}}),
            json!({"stop": "END", "stop_token_ids": null}),
            json!({}),
        ] {
            assert!(check_values(&body(fine.clone())).is_ok(), "{fine}");
        }
        // 2^64 reaches serde_json as a float, sent on as one.
        let huge: Value = serde_json::from_str(r#"{"stop_token_ids": [18446744073709551616]}"#)
            .unwrap_or_default();
        for bad in [
            huge,
            json!({"stop_token_ids": [4294967296u64]}),
            json!({"stop_token_ids": [-1]}),
            json!({"stop_token_ids": [1.5]}),
            json!({"stop_token_ids": 7}),
            json!({"stop": [1, 2]}),
            json!({"chat_template_kwargs": "x"}),
        ] {
            assert!(
                matches!(
                    check_values(&body(bad.clone())),
                    Err(ProtocolError::InvalidRequest(_))
                ),
                "{bad}"
            );
        }
    }
    use serde_json::json;

    fn body(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    /// What an agent once got through to the model server in a train job.
    fn hostile() -> Map<String, Value> {
        body(
            json!({"model": "x", "messages": [], "tools": [], "tool_choice": "auto",
            "logit_bias": {"42": 100}, "ignore_eos": true, "min_tokens": 50, "top_k": 5,
            "min_p": 0.3, "repetition_penalty": 1.3, "presence_penalty": 1.0,
            "guided_json": {"type": "object"}, "structured_outputs": {"regex": "a+"},
            "response_format": {"type": "json_object"}, "allowed_token_ids": [1, 2],
            "temperature": 0.0, "top_p": 0.1, "stop": ["\n"], "seed": 7,
            "chat_template_kwargs": {"enable_thinking": false}}),
        )
    }

    #[test]
    fn no_call_asks_vllm_to_cut_its_tool_calls_after_sampling() {
        for mode in [CallerSampling::Drop, CallerSampling::Refuse] {
            // vLLM reads `0` and `"false"` as `false` (pydantic's lax bool).
            for value in [
                json!(false),
                json!(0),
                json!("false"),
                json!("0"),
                json!(null),
            ] {
                let mut b =
                    body(json!({"model": "x", "messages": [], "parallel_tool_calls": value}));
                let dropped = apply(&mut b, mode, Some(1.0), Some(1.0)).expect("not refused");
                assert_eq!(dropped, ["parallel_tool_calls"], "{mode:?} {value}");
                assert!(!b.contains_key("parallel_tool_calls"), "{mode:?} {value}");
            }
            // Allowing them is what vLLM does anyway.
            let mut b = body(json!({"model": "x", "messages": [], "parallel_tool_calls": true}));
            assert!(apply(&mut b, mode, Some(1.0), Some(1.0))
                .expect("kept")
                .is_empty());
            assert_eq!(b["parallel_tool_calls"], true);
        }
        // Nor an sft job's: its dataset would teach calls the harness never ran.
        let mut b = body(json!({"model": "x", "messages": [], "parallel_tool_calls": "false"}));
        let dropped = apply(&mut b, CallerSampling::PassThrough, None, None).expect("passed");
        assert_eq!(dropped, ["parallel_tool_calls"]);
        assert!(!b.contains_key("parallel_tool_calls"));
    }

    #[test]
    fn a_train_call_samples_the_policy_and_drops_the_rest() {
        let mut b = hostile();
        let mut dropped = apply(&mut b, CallerSampling::Drop, Some(0.7), Some(1.0)).expect("drop");
        dropped.sort();
        assert_eq!(
            dropped,
            [
                "allowed_token_ids",
                "guided_json",
                "ignore_eos",
                "logit_bias",
                "min_p",
                "min_tokens",
                "presence_penalty",
                "repetition_penalty",
                "response_format",
                "seed",
                "structured_outputs",
                "top_k"
            ]
        );
        assert_eq!(
            (
                &b["temperature"],
                &b["top_p"],
                &b["top_k"],
                &b["min_p"],
                &b["repetition_penalty"],
                &b["presence_penalty"],
                &b["frequency_penalty"]
            ),
            (
                &json!(0.7),
                &json!(1.0),
                &json!(-1),
                &json!(0.0),
                &json!(1.0),
                &json!(0.0),
                &json!(0.0)
            )
        );
        // What shapes the prompt or where sampling stops stays.
        for kept in ["stop", "chat_template_kwargs", "tools", "tool_choice"] {
            assert!(b.contains_key(kept), "{kept}");
        }
        assert!(!b.contains_key("logit_bias") && !b.contains_key("ignore_eos"));
    }

    #[test]
    fn a_train_call_never_decodes_under_a_strict_tools_grammar() {
        let tools = json!([
            {"type": "function", "function": {"name": "a", "parameters": {}, "strict": true}},
            {"type": "function", "function": {"name": "b", "parameters": {}, "strict": false}},
            {"type": "function", "function": {"name": "c", "parameters": {}}}]);
        for mode in [CallerSampling::Drop, CallerSampling::Refuse] {
            let mut b = body(json!({"model": "x", "messages": [], "tools": tools}));
            let dropped = apply(&mut b, mode, Some(1.0), None).expect("never refused");
            assert_eq!(dropped, ["strict"], "{mode:?}");
            let functions = b["tools"].as_array().expect("tools kept");
            assert_eq!(functions.len(), 3);
            assert!(functions
                .iter()
                .all(|t| t["function"].get("strict").is_none()));
            assert_eq!(functions[0]["function"]["name"], "a");
            // Non-strict tools alone: nothing to count.
            let mut b = body(json!({"model": "x", "messages": [], "tools": functions}));
            assert!(apply(&mut b, mode, Some(1.0), None)
                .expect("kept")
                .is_empty());
        }
        // An sft job's teacher is asked as the harness asked.
        let mut b = body(json!({"model": "x", "messages": [], "tools": tools}));
        assert!(apply(&mut b, CallerSampling::PassThrough, None, None)
            .expect("passed")
            .is_empty());
        assert_eq!(b["tools"][0]["function"]["strict"], true);
    }

    #[test]
    fn a_forced_tool_call_or_an_unknown_parameter_is_foreign_too() {
        for (v, name) in [
            (json!({"tool_choice": "required"}), "tool_choice"),
            (
                json!({"tool_choice": {"type": "function", "function": {"name": "f"}}}),
                "tool_choice",
            ),
            (json!({"vllm_xargs": {"a": 1}}), "vllm_xargs"),
            (json!({"use_beam_search": true}), "use_beam_search"),
        ] {
            let mut b = body(v);
            let dropped = apply(&mut b, CallerSampling::Drop, Some(1.0), None).expect("drop");
            assert_eq!(dropped, [name]);
        }
        let mut text = body(json!({"response_format": {"type": "text"}, "tool_choice": "none"}));
        assert!(apply(&mut text, CallerSampling::Drop, None, None)
            .expect("text")
            .is_empty());
    }

    #[test]
    fn refuse_names_every_foreign_parameter_and_sft_passes_them_through() {
        let err = apply(&mut hostile(), CallerSampling::Refuse, Some(1.0), Some(1.0))
            .expect_err("refused");
        assert_eq!(err.status(), 400);
        let message = err.to_string();
        assert!(
            message.contains("logit_bias") && message.contains("top_k"),
            "{message}"
        );
        let mut sft = hostile();
        let dropped =
            apply(&mut sft, CallerSampling::PassThrough, Some(0.8), Some(0.9)).expect("sft");
        assert!(dropped.is_empty());
        assert_eq!(
            (&sft["top_k"], &sft["temperature"]),
            (&json!(5), &json!(0.8))
        );
    }
}
