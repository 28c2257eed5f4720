//! What floe asks of the model server on every call, and what it reads back (sans-IO).
//!
//! Every call goes upstream as a non-streaming OpenAI Chat Completions request with the
//! server's capture switches on, so the gateway sees the server's own prompt token ids and the
//! sampled token ids with their logprobs:
//! - vLLM: `return_token_ids`, `logprobs`, `top_logprobs` (0 unless the caller asked); the prompt ids come back at the
//!   top level, the sampled ids in `choices[0].token_ids`, the logprobs in OpenAI's shape.
//! - SGLang: `return_prompt_token_ids`, `return_meta_info`, `logprobs`, `top_logprobs: 0`; the
//!   prompt ids come back in `choices[0].prompt_token_ids`, the sampled ids with their
//!   logprobs in `choices[0].meta_info.output_token_logprobs` (`[logprob, token id, text]`
//!   each), and `meta_info.weight_version` names the weights that sampled them.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::ProtocolError;

/// Which OpenAI-compatible server the upstream is: each asks for, and returns, the token ids
/// in its own fields.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UpstreamKind {
    #[default]
    Vllm,
    Sglang,
}

impl std::str::FromStr for UpstreamKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "vllm" => Ok(Self::Vllm),
            "sglang" => Ok(Self::Sglang),
            other => Err(format!(
                "unknown upstream kind {other:?} (expected vllm or sglang)"
            )),
        }
    }
}

/// Limits the gateway applies to every call of a session.
#[derive(Clone, Debug)]
pub struct CallLimits {
    /// The upstream server's kind.
    pub kind: UpstreamKind,
    /// Model name sent upstream (the server's served model name).
    pub upstream_model: String,
    /// Cap on sampled tokens per call (the job's response-length cap).
    pub max_response_tokens: u32,
    /// The job's sampling temperature and nucleus threshold: they replace the harness's own.
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// The caller's other sampling parameters: passed through (sft) or, in a train job, the
    /// policy's own sampling set ([`super::sampling`]).
    pub caller_sampling: super::sampling::CallerSampling,
    /// Deadline of one call, its retries included (the job's `timeouts.modelCallSeconds`).
    pub call_deadline: std::time::Duration,
    /// Provider-hosted tools in a request: refused (default) or dropped.
    pub hosted_tools: super::HostedTools,
    /// How failed attempts are retried within the deadline (the job's `modelCallRetry`).
    pub retry: super::retry::RetryPolicy,
    /// What one session may spend over all its calls.
    pub session_budget: SessionBudget,
}

/// What one session's calls may capture in all: past it, its further calls are refused
/// ([`super::ProtocolError::SessionBudget`]). Unset parts: no limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionBudget {
    /// Prompt and sampled tokens summed over the session's calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calls: Option<u64>,
    /// Bytes of the session's capture (its calls' requests as received and as sent upstream,
    /// the answers, the token ids): what bounds the disk a session's calls take, and the
    /// parts of a request that never become tokens (a `metadata` the gateway drops).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
}

impl SessionBudget {
    /// `Err` when a session that made `calls` calls capturing `tokens` tokens in `bytes` bytes
    /// may make no more.
    pub fn admit(&self, calls: u64, tokens: u64, bytes: u64) -> Result<(), super::ProtocolError> {
        let spent = |what: &str, used: u64, limit: u64| {
            Err(super::ProtocolError::SessionBudget(format!(
                "this session has used its budget of {limit} {what} ({used} so far): no more model calls"
            )))
        };
        if let Some(limit) = self.calls.filter(|l| calls >= *l) {
            return spent("model calls", calls, limit);
        }
        if let Some(limit) = self.tokens.filter(|l| tokens >= *l) {
            return spent("captured tokens", tokens, limit);
        }
        if let Some(limit) = self.bytes.filter(|l| bytes >= *l) {
            return spent("captured bytes", bytes, limit);
        }
        Ok(())
    }
}

/// Parameters that have no meaning for, or are refused by, the upstream call and are removed.
pub const DROPPED_PARAMS: &[&str] = &[
    "stream",
    "stream_options",
    "store",
    "metadata",
    "user",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
    "prediction",
    "audio",
    "modalities",
    "web_search_options",
    "max_completion_tokens",
];

/// A caller's cap below this many tokens (and below the job's) asks for a short answer: a
/// side call's, not an agent turn's, whose caps run to thousands (Claude Code's main calls ask
/// for 32,000). A `length` stop at a cap of an agent turn's size is overlong, whoever set it.
pub const SHORT_CAP_TOKENS: u32 = 1024;

/// An upstream request, and the caller's sampling parameters the job's contract removed.
#[derive(Debug)]
pub struct Finalized {
    pub request: Value,
    pub dropped_sampling: Vec<String>,
    /// The caller asked for a short answer (a cap below both the job's and
    /// [`SHORT_CAP_TOKENS`]): a `length` stop there is by design (Claude Code's one-token
    /// checks, a title of a few words), not an overlong response of the policy's.
    pub short_cap: bool,
}

/// Turn a Chat Completions body into the upstream request: capture switches on, streaming
/// off, one choice, the response-length cap enforced, the job's sampling contract applied.
pub fn finalize_request(
    mut body: Map<String, Value>,
    limits: &CallLimits,
) -> Result<Finalized, ProtocolError> {
    if let Some(why) = super::media::remote_media(&body) {
        return Err(ProtocolError::InvalidRequest(why));
    }
    super::sampling::check_values(&body)?;
    if body
        .get("n")
        .and_then(Value::as_u64)
        .is_some_and(|n| n != 1)
    {
        return Err(ProtocolError::InvalidRequest(
            "n must be 1: floe captures one sample per call".into(),
        ));
    }
    let job_cap = limits.max_response_tokens;
    let callers_cap = ["max_completion_tokens", "max_tokens"]
        .iter()
        .find_map(|k| body.get(*k).and_then(Value::as_u64));
    let asked = callers_cap.map_or(job_cap, |n| n.min(u64::from(job_cap)) as u32);
    for key in DROPPED_PARAMS {
        body.remove(*key);
    }
    body.remove("n");
    body.insert("model".into(), limits.upstream_model.clone().into());
    let dropped_sampling = super::sampling::apply(
        &mut body,
        limits.caller_sampling,
        limits.temperature,
        limits.top_p,
    )?;
    body.insert("max_tokens".into(), asked.into());
    body.insert("stream".into(), false.into());
    match limits.kind {
        UpstreamKind::Vllm => {
            body.insert("return_token_ids".into(), true.into());
        }
        UpstreamKind::Sglang => {
            body.insert("return_prompt_token_ids".into(), true.into());
            body.insert("return_meta_info".into(), true.into());
        }
    }
    // A Chat caller's own alternatives (`top_logprobs` with `logprobs: true`, at most 20, as
    // OpenAI takes) change nothing sampled: passed on, not answered with empty lists.
    let callers_top = body
        .get("top_logprobs")
        .and_then(Value::as_u64)
        .filter(|n| (1..=20).contains(n) && body.get("logprobs") == Some(&Value::Bool(true)))
        .unwrap_or(0);
    body.insert("logprobs".into(), true.into());
    body.insert("top_logprobs".into(), callers_top.into());
    Ok(Finalized {
        request: Value::Object(body),
        dropped_sampling,
        short_cap: callers_cap.is_some_and(|n| n < u64::from(job_cap.min(SHORT_CAP_TOKENS))),
    })
}

/// Map an upstream error answer to the caller's error: context overflow becomes each
/// provider's own "too long" error, other 4xx stay invalid requests.
pub fn upstream_error(status: u16, body: &str) -> ProtocolError {
    let message = serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| {
            v["error"]["message"]
                .as_str()
                .or(v["message"].as_str())
                .map(str::to_owned)
        })
        .unwrap_or_else(|| body.chars().take(500).collect());
    let lower = message.to_lowercase();
    // vLLM's renderer says "maximum context length", its engine "longer than the maximum
    // model length" (a prompt the renderer let through).
    if lower.contains("context length")
        || lower.contains("maximum context")
        || lower.contains("maximum model length")
        || lower.contains("too long")
    {
        ProtocolError::ContextTooLong(message)
    } else if matches!(status, 401 | 403) {
        ProtocolError::Upstream(format!(
            "HTTP {status}: the model server refused the gateway's credential: {message}"
        ))
    } else if matches!(status, 408 | 429) {
        // The server's load or patience, not the request: still failing once the call's
        // retries are spent, it is an upstream failure (a 400 would blame the harness, and
        // its SDK would not retry).
        ProtocolError::Upstream(format!("HTTP {status}: {message}"))
    } else if (400..500).contains(&status) {
        ProtocolError::InvalidRequest(message)
    } else {
        ProtocolError::Upstream(format!("HTTP {status}: {message}"))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_session_budget_admits_calls_until_any_part_is_spent() {
        let budget = SessionBudget {
            tokens: Some(100),
            calls: Some(3),
            bytes: Some(1000),
        };
        assert!(budget.admit(2, 99, 999).is_ok());
        let calls = budget.admit(3, 0, 0).expect_err("3 calls made");
        assert_eq!(calls.status(), 400);
        assert!(calls
            .to_string()
            .contains("budget of 3 model calls (3 so far)"));
        let tokens = budget.admit(1, 100, 0).expect_err("100 tokens spent");
        assert!(tokens.to_string().contains("budget of 100 captured tokens"));
        let bytes = budget.admit(1, 0, 1000).expect_err("1000 bytes captured");
        assert!(bytes.to_string().contains("budget of 1000 captured bytes"));
        assert!(SessionBudget::default()
            .admit(u64::MAX, u64::MAX, u64::MAX)
            .is_ok());
    }

    use super::*;
    use serde_json::json;

    #[test]
    fn the_job_sampling_replaces_the_harness_own() {
        let mut l = limits();
        l.temperature = Some(0.7);
        l.top_p = Some(0.9);
        let body = serde_json::json!({"messages": [], "temperature": 0.0, "top_p": 0.1});
        let out = finalize_request(body.as_object().cloned().unwrap_or_default(), &l)
            .expect("ok")
            .request;
        assert_eq!(
            (out["temperature"].as_f64(), out["top_p"].as_f64()),
            (Some(0.7), Some(0.9))
        );
        let kept = finalize_request(body.as_object().cloned().unwrap_or_default(), &limits())
            .expect("ok")
            .request;
        assert_eq!(kept["temperature"].as_f64(), Some(0.0));
    }

    fn limits() -> CallLimits {
        CallLimits {
            kind: UpstreamKind::Vllm,
            upstream_model: "policy".into(),
            max_response_tokens: 512,
            temperature: None,
            top_p: None,
            caller_sampling: Default::default(),
            call_deadline: std::time::Duration::from_secs(60),
            hosted_tools: Default::default(),
            retry: Default::default(),
            session_budget: Default::default(),
        }
    }

    #[test]
    fn capture_switches_are_forced_and_the_cap_applies() {
        let body = json!({"model": "gpt-5", "messages": [], "stream": true, "max_completion_tokens": 4096,
            "stream_options": {"include_usage": true}, "store": true, "temperature": 0.3});
        let out = finalize_request(body.as_object().cloned().unwrap_or_default(), &limits())
            .expect("ok")
            .request;
        assert_eq!(out["model"], "policy");
        assert_eq!(out["max_tokens"], 512);
        assert_eq!(
            (
                out["stream"].clone(),
                out["return_token_ids"].clone(),
                out["logprobs"].clone()
            ),
            (json!(false), json!(true), json!(true))
        );
        assert_eq!(out["top_logprobs"], 0);
        assert_eq!(out["temperature"], 0.3);
        assert!(out.get("stream_options").is_none() && out.get("store").is_none());
        let small = finalize_request(
            json!({"max_tokens": 7})
                .as_object()
                .cloned()
                .unwrap_or_default(),
            &limits(),
        )
        .expect("ok");
        assert_eq!(small.request["max_tokens"], 7);
        assert!(
            small.short_cap,
            "7 < the job's 512: a short answer asked for"
        );
    }

    #[test]
    fn a_cap_of_an_agent_turns_size_is_no_short_answer_whoever_set_it() {
        let mut big_job = limits();
        big_job.max_response_tokens = 65_536;
        let capped = |n: u64| {
            finalize_request(
                json!({"max_tokens": n})
                    .as_object()
                    .cloned()
                    .unwrap_or_default(),
                &big_job,
            )
            .expect("ok")
        };
        // Claude Code's main calls ask for 32,000: below this job's cap, but a turn's cap.
        let turn = capped(32_000);
        assert_eq!(turn.request["max_tokens"], 32_000);
        assert!(!turn.short_cap);
        assert!(capped(512).short_cap, "a title's few words");
    }

    #[test]
    fn a_cap_at_or_above_the_jobs_is_the_jobs() {
        for body in [
            json!({}),
            json!({"max_tokens": 512}),
            json!({"max_completion_tokens": 9000}),
        ] {
            let out = finalize_request(body.as_object().cloned().unwrap_or_default(), &limits())
                .expect("ok");
            assert_eq!(out.request["max_tokens"], 512, "{body}");
            assert!(!out.short_cap, "{body}");
        }
    }

    #[test]
    fn several_choices_are_refused() {
        let err = finalize_request(
            json!({"n": 4}).as_object().cloned().unwrap_or_default(),
            &limits(),
        )
        .expect_err("n");
        assert_eq!(err.status(), 400);
    }

    #[test]
    fn sglang_is_asked_for_its_own_capture_fields() {
        let mut l = limits();
        l.kind = UpstreamKind::Sglang;
        let out = finalize_request(
            json!({"messages": []})
                .as_object()
                .cloned()
                .unwrap_or_default(),
            &l,
        )
        .expect("ok")
        .request;
        assert_eq!(
            (
                &out["return_prompt_token_ids"],
                &out["return_meta_info"],
                &out["logprobs"],
                &out["top_logprobs"]
            ),
            (&json!(true), &json!(true), &json!(true), &json!(0))
        );
        // A caller's own `top_logprobs` goes on with its `logprobs`, never alone or past 20.
        for (asked, sent) in [
            (json!({"logprobs": true, "top_logprobs": 5}), 5),
            (json!({"top_logprobs": 5}), 0),
            (json!({"logprobs": true, "top_logprobs": 50}), 0),
        ] {
            let mut body = asked.as_object().cloned().unwrap_or_default();
            body.insert("messages".into(), json!([]));
            let out = finalize_request(body, &l).expect("ok").request;
            assert_eq!(out["top_logprobs"], sent, "{asked}");
        }
        // vLLM's spelling is not sent to SGLang.
        assert!(out.get("return_token_ids").is_none());
        assert_eq!("SGLang".parse(), Ok(UpstreamKind::Sglang));
        assert!("tgi".parse::<UpstreamKind>().is_err());
    }

    #[test]
    fn context_overflow_is_recognized() {
        let body = r#"{"error":{"message":"This model's maximum context length is 4096 tokens. However, you requested 5000 tokens","type":"BadRequestError","code":400}}"#;
        assert!(matches!(
            upstream_error(400, body),
            ProtocolError::ContextTooLong(_)
        ));
        let engine = r#"{"error":{"message":"The decoder prompt (length 9000) is longer than the maximum model length of 8192. Make sure that `max_model_len` is no smaller than the number of text tokens."}}"#;
        assert!(matches!(
            upstream_error(400, engine),
            ProtocolError::ContextTooLong(_)
        ));
        assert!(matches!(
            upstream_error(400, r#"{"error":{"message":"bad tool"}}"#),
            ProtocolError::InvalidRequest(_)
        ));
        // Load and patience are the server's: once retries are spent, an upstream failure.
        for status in [503, 429, 408] {
            assert!(
                matches!(
                    upstream_error(status, "overloaded"),
                    ProtocolError::Upstream(_)
                ),
                "{status}"
            );
        }
        // A refused key is the gateway's problem, never the request's.
        let refused = upstream_error(401, r#"{"error":{"message":"Unauthorized"}}"#);
        assert!(
            matches!(&refused, ProtocolError::Upstream(m) if m.contains("credential")),
            "{refused:?}"
        );
    }
}
