//! One captured model call.

use serde::{Deserialize, Serialize};

/// Version of the capture record format; bumped on any incompatible change.
pub const CAPTURE_FORMAT_VERSION: u32 = 1;

/// The provider API the harness used for a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Api {
    Anthropic,
    OpenaiChat,
    OpenaiResponses,
    Gemini,
}

impl Api {
    pub const ALL: [Api; 4] = [
        Api::Anthropic,
        Api::OpenaiChat,
        Api::OpenaiResponses,
        Api::Gemini,
    ];
}

/// Everything the gateway knows about one model call. Token ids are the server's own: the
/// prompt as vLLM tokenized the rendered chat template, and the tokens it sampled.
///
/// `R` is how the upstream's response is held: a `Value` when read back, the answer's own
/// text (`&RawValue`) when the gateway writes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CompletionRecord<R = serde_json::Value> {
    /// [`CAPTURE_FORMAT_VERSION`].
    pub v: u32,
    pub session: String,
    /// Order of the call within the session (0, 1, …), assigned when the request arrives.
    pub seq: u64,
    pub api: Api,
    /// Unix milliseconds: request received, upstream answered.
    pub started_at_ms: u64,
    pub finished_at_ms: u64,
    /// Time spent waiting for the upstream, in milliseconds.
    pub upstream_ms: u64,
    /// Model the upstream reports.
    pub model: String,
    /// Policy (weights) version that served the call, when the upstream reports one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_version: Option<u64>,
    pub prompt_token_ids: Vec<u32>,
    pub completion_token_ids: Vec<u32>,
    /// Behaviour logprob of each sampled token; `None` when the upstream returned none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Vec<f64>>,
    /// `stop`, `length`, `tool_calls`, … as the upstream reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<String>,
    /// The tool call in the response could not be parsed (the harness got plain text).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unparsed_tool_call: bool,
    /// The caller asked for a short answer (a cap below the job's `sampling.maxResponseTokens`
    /// and below 1,024 tokens), so a `length` stop there is by design, not an overlong response.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub short_cap: bool,
    /// The harness was gone before the answer came (it gave up on the call, or exited): no
    /// one saw this reply, so no trajectory trains it. Kept here: the tokens were sampled.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub abandoned: bool,
    /// What the request held that could not go upstream, e.g. `hosted_tool:web_search` when
    /// the job drops hosted tools.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dropped: Vec<String>,
    /// What the harness said the call is for, when it says: Claude Code's request class
    /// (`main`, `subagent`, `compaction`, `auxiliary`, …). Counted in the trajectory's stats.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_class: Option<String>,
    /// The harness's request as received.
    #[serde(default)]
    pub request: serde_json::Value,
    /// The OpenAI Chat Completions request sent upstream.
    #[serde(default)]
    pub normalized_request: serde_json::Value,
    /// The upstream's response as received.
    #[serde(default)]
    pub response: R,
}

impl CompletionRecord {
    /// The record with what building a trajectory reads of it: its bodies dropped, but for
    /// the cap the request sent upstream put on the answer (an overlong answer is one cut at
    /// its cap).
    pub fn slimmed(mut self) -> Self {
        let cap = self.normalized_request.get("max_tokens").cloned();
        self.request = serde_json::Value::Null;
        self.response = serde_json::Value::Null;
        self.normalized_request = match cap {
            Some(cap) => serde_json::json!({ "max_tokens": cap }),
            None => serde_json::Value::Null,
        };
        self
    }

    /// A record with only the token-level facts (no request or response bodies, finish reason
    /// `stop`, time = `seq`): what tests, benchmarks and session synthesizers need. Set the
    /// other fields with struct update syntax.
    pub fn from_tokens(
        seq: u64,
        prompt_token_ids: Vec<u32>,
        completion_token_ids: Vec<u32>,
    ) -> Self {
        Self {
            v: CAPTURE_FORMAT_VERSION,
            session: String::new(),
            seq,
            api: Api::OpenaiChat,
            started_at_ms: seq,
            finished_at_ms: seq,
            upstream_ms: 0,
            model: "policy".into(),
            policy_version: None,
            prompt_token_ids,
            completion_token_ids,
            logprobs: None,
            finish_reason: Some("stop".into()),
            unparsed_tool_call: false,
            short_cap: false,
            abandoned: false,
            dropped: Vec::new(),
            request_class: None,
            request: serde_json::Value::Null,
            normalized_request: serde_json::Value::Null,
            response: serde_json::Value::Null,
        }
    }
}
