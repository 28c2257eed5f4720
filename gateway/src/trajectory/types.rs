//! The trajectory wire format (`floe.trajectory/v1`), shared by the gateway, the trainer and
//! SFT datasets. The JSON Schema in `docs/trajectory.schema.json` is generated from these types.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::capture::CompletionRecord;

/// Value of [`Trajectory::format`].
pub const TRAJECTORY_FORMAT: &str = "floe.trajectory/v1";

/// Which builder made the traces.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Builder {
    #[default]
    PrefixMerging,
    PerRequest,
}

impl std::str::FromStr for Builder {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "prefix_merging" | "prefixMerging" => Ok(Builder::PrefixMerging),
            "per_request" | "perRequest" => Ok(Builder::PerRequest),
            other => Err(format!(
                "unknown builder {other:?} (prefix_merging or per_request)"
            )),
        }
    }
}

/// How the session ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SessionStatus {
    /// The harness finished and the evaluator scored it.
    Completed,
    /// The agent budget ran out: traces stay trainable, reward 0.
    Timeout,
    /// Infrastructure failure or evaluator timeout: untrainable (all masks 0), never a reward of 0.
    Error,
    /// A snapshot of a session that has not finished (shipped to a train job's trainer after
    /// each call): untrainable, no reward, masks as built. The trainer scores it 0 and trains
    /// it only when the operator rules that the session failed by the agent's own doing (its
    /// pod evicted for what it wrote, with no grace period to ship anything else); otherwise a
    /// later trajectory of the session replaces it, or it stays out.
    Interrupted,
}

/// Why a trace (a chain of merged calls) starts where it does. The first four are not breaks:
/// the call simply does not continue an earlier one. The rest are breaks of a chain that would
/// otherwise have continued; the earlier part is kept as its own trace, nothing is dropped.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum ChainStart {
    /// The session's first call.
    First,
    /// A prompt unrelated to every earlier chain past its first prompt: a sub-agent, a
    /// background request (title, memory extraction), a parallel agent.
    NewContext,
    /// Another sample from a point an earlier chain passed through (the same prompt again, or
    /// a different continuation after a completed turn) while that chain also goes on:
    /// retried or parallel calls.
    Fork,
    /// One trace per call (`per_request`).
    PerRequest,
    /// The history after some point was changed and the old version was never continued
    /// (compaction, trimmed tool output, a dropped turn). Decided in hindsight: a branch whose
    /// parent chain never continues is a rewrite, not a fork.
    PrefixChanged,
    /// The previous prompt is a prefix and the previous turn is still there (at least half of
    /// its sampled tokens reappear), but not verbatim: thinking stripped by the chat template,
    /// tool-call JSON re-serialized, or sampled text re-tokenized differently. Merging would
    /// train on a context the model never saw.
    TemplateRewrite,
    /// The previous turn stopped on its own, yet no end-of-turn token follows its sampled tokens.
    NoEndOfTurn,
    /// Behaviour logprobs are present on one side of the merge and missing on the other.
    MissingLogprobs,
    /// Merging would exceed the configured maximum trace length.
    MaxLength,
}

impl ChainStart {
    /// Whether this start interrupts a chain that would otherwise have continued.
    pub fn is_break(self) -> bool {
        !matches!(
            self,
            Self::First | Self::NewContext | Self::Fork | Self::PerRequest
        )
    }
}

/// One training sample: a prompt and a response whose tokens carry a loss mask and the
/// behaviour logprobs they were sampled with.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Trace {
    /// Context before the first sampled token (at least one); never trained on.
    #[schemars(length(min = 1))]
    pub prompt_token_ids: Vec<u32>,
    /// Sampled tokens and, in merged traces, the interstitial tokens between turns.
    pub response_token_ids: Vec<u32>,
    /// Same length as `response_token_ids`: 1 = sampled by the policy (trainable), 0 = context.
    #[schemars(inner(range(min = 0, max = 1)))]
    pub loss_mask: Vec<u8>,
    /// Same length as `response_token_ids`: the behaviour logprob of each sampled token; `null`
    /// where unknown (interstitial tokens, or an upstream that returned none) — never a fake 0.
    pub logprobs: Vec<Option<f64>>,
    /// Finish reason of the trace's last call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<String>,
    /// Capture `seq` of each call merged into this trace, in order.
    pub completions: Vec<u64>,
    /// Why this trace starts here.
    pub start: ChainStart,
}

/// How the traces were reconstructed, for the trainer's logs and `floe trajectories stats`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ReconstructionStats {
    /// Calls the traces were built from (abandoned ones aside).
    pub completions: u64,
    pub traces: u64,
    /// Tokens sampled by the policy over those calls.
    pub sampled_tokens: u64,
    /// Tokens with mask 1 (equals `sampled_tokens` unless the session is untrainable).
    pub trainable_tokens: u64,
    /// Prompt + response tokens over all traces: what the trainer processes.
    pub total_tokens: u64,
    /// Traces by the reason they start (`first`, `new_context`, `prefix_changed`, …).
    pub starts: BTreeMap<ChainStart, u64>,
    /// Traces that start because a chain broke (every reason where `is_break`).
    pub breaks: u64,
    /// Calls cut by a token limit (`finish_reason: length`), whoever set it.
    pub truncated_turns: u64,
    /// Calls cut at their token cap (the job's `sampling.maxResponseTokens` or the harness's
    /// own, if lower) unless the harness asked for a short answer (`short_cap`): the policy's
    /// overlong responses, which a train job may keep out of the loss (`grpo.overlong: Mask`).
    /// A call that sampled its whole cap counts even when the server reports its tool call
    /// (`tool_calls`) rather than the cut.
    #[serde(default)]
    pub overlong_turns: u64,
    /// The most tokens one call sampled, calls with a short cap the harness asked for aside:
    /// what a train job's `grpo.overlongPenalty` measures against `sampling.maxResponseTokens`.
    #[serde(default)]
    pub longest_turn_tokens: u64,
    /// Calls whose tool call could not be parsed (kept: a trainable negative).
    pub unparsed_tool_calls: u64,
    /// Calls an imitation dataset (an sft job's) trains no token of: tool calls the harness
    /// could not parse.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub not_imitated_calls: u64,
    /// Sampled tokens without a behaviour logprob.
    pub tokens_missing_logprobs: u64,
    /// Provider-hosted tools the harness asked for and the gateway dropped (the job's
    /// `harness.hostedTools: Drop`): the policy acted without tools its prompt offered.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dropped_hosted_tools: u64,
    /// Calls whose caller was gone before the answer came (the harness gave up waiting, or
    /// exited): left out of the traces and of every count above, since nobody acted on them.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub abandoned_calls: u64,
    /// The tokens those calls sampled.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub abandoned_tokens: u64,
    /// Calls of a request class the job does not train on (`trajectory.excludeRequestClasses`):
    /// left out of the traces and of every count above but `calls_by_class`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub excluded_calls: u64,
    /// The tokens those calls sampled.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub excluded_tokens: u64,
    /// The calls above, and the excluded ones, by what the harness said each is for (Claude
    /// Code's request class: `main`, `subagent`, `compaction`, `auxiliary`, …); calls that said
    /// nothing are not counted here. Shows how much of a trajectory is not the agent's own
    /// turns.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub calls_by_class: BTreeMap<String, u64>,
}

/// Claude Code's request classes (2.1.330), each always counted apart.
pub const KNOWN_REQUEST_CLASSES: &[&str] = &[
    "main",
    "subagent",
    "workflow",
    "compaction",
    "auxiliary",
    "side_reply",
];
/// Classes not in [`KNOWN_REQUEST_CLASSES`] counted apart, the first to come; the agent can
/// send any header, so further ones are counted together under [`OTHER_CLASSES`].
pub const MAX_UNKNOWN_REQUEST_CLASSES: usize = 4;
/// Where calls of classes past [`MAX_UNKNOWN_REQUEST_CLASSES`] are counted.
pub const OTHER_CLASSES: &str = "other";

/// Add `calls` calls of `class` to a count by class, within its bounds (at most
/// [`KNOWN_REQUEST_CLASSES`], [`MAX_UNKNOWN_REQUEST_CLASSES`] others and [`OTHER_CLASSES`]).
pub fn count_calls_of_class(counts: &mut BTreeMap<String, u64>, class: &str, calls: u64) {
    let known = |c: &str| KNOWN_REQUEST_CLASSES.contains(&c) || c == OTHER_CLASSES;
    let unknown = counts.keys().filter(|c| !known(c)).count();
    let apart = known(class) || counts.contains_key(class) || unknown < MAX_UNKNOWN_REQUEST_CLASSES;
    let key = if apart { class } else { OTHER_CLASSES };
    *counts.entry(key.to_owned()).or_insert(0) += calls;
}

/// Cut at its cap: `length`, or its whole cap sampled (vLLM reports `tool_calls` for a
/// response with a tool call whatever ended it); never a short answer the caller asked for.
fn overlong(r: &CompletionRecord) -> bool {
    let cap = r
        .normalized_request
        .get("max_tokens")
        .and_then(serde_json::Value::as_u64);
    let whole_cap = cap.is_some_and(|cap| r.completion_token_ids.len() as u64 >= cap);
    (r.finish_reason.as_deref() == Some("length") || whole_cap) && !r.short_cap
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl ReconstructionStats {
    pub fn of(records: &[&CompletionRecord], traces: &[Trace]) -> Self {
        let mut starts = BTreeMap::new();
        for t in traces {
            *starts.entry(t.start).or_insert(0) += 1;
        }
        let mut calls_by_class = BTreeMap::new();
        for class in records.iter().filter_map(|r| r.request_class.as_ref()) {
            count_calls_of_class(&mut calls_by_class, class, 1);
        }
        let count =
            |f: &dyn Fn(&CompletionRecord) -> u64| records.iter().map(|r| f(r)).sum::<u64>();
        Self {
            completions: records.len() as u64,
            traces: traces.len() as u64,
            sampled_tokens: sampled(records),
            trainable_tokens: traces
                .iter()
                .flat_map(|t| &t.loss_mask)
                .filter(|m| **m == 1)
                .count() as u64,
            total_tokens: traces
                .iter()
                .map(|t| (t.prompt_token_ids.len() + t.response_token_ids.len()) as u64)
                .sum(),
            breaks: starts
                .iter()
                .filter(|(s, _)| s.is_break())
                .map(|(_, n)| n)
                .sum(),
            starts,
            truncated_turns: count(&|r| u64::from(r.finish_reason.as_deref() == Some("length"))),
            overlong_turns: count(&|r| u64::from(overlong(r))),
            longest_turn_tokens: records
                .iter()
                .filter(|r| !r.short_cap)
                .map(|r| r.completion_token_ids.len() as u64)
                .max()
                .unwrap_or(0),
            unparsed_tool_calls: count(&|r| u64::from(r.unparsed_tool_call)),
            not_imitated_calls: 0,
            dropped_hosted_tools: count(&|r| {
                r.dropped
                    .iter()
                    .filter(|d| d.starts_with(crate::protocol::HOSTED_TOOL))
                    .count() as u64
            }),
            tokens_missing_logprobs: count(&|r| {
                if r.logprobs.is_none() {
                    r.completion_token_ids.len() as u64
                } else {
                    0
                }
            }),
            abandoned_calls: 0,
            abandoned_tokens: 0,
            excluded_calls: 0,
            excluded_tokens: 0,
            calls_by_class,
        }
    }

    /// Count the calls left out because nobody saw their reply.
    pub fn with_abandoned(self, abandoned: &[&CompletionRecord]) -> Self {
        Self {
            abandoned_calls: abandoned.len() as u64,
            abandoned_tokens: sampled(abandoned),
            ..self
        }
    }

    /// Count the calls left out for their request class, and add them to `calls_by_class`.
    pub fn with_excluded(mut self, excluded: &[&CompletionRecord]) -> Self {
        for class in excluded.iter().filter_map(|r| r.request_class.as_ref()) {
            count_calls_of_class(&mut self.calls_by_class, class, 1);
        }
        Self {
            excluded_calls: excluded.len() as u64,
            excluded_tokens: sampled(excluded),
            ..self
        }
    }
}

fn sampled(records: &[&CompletionRecord]) -> u64 {
    records
        .iter()
        .map(|r| r.completion_token_ids.len() as u64)
        .sum()
}

/// The evaluator's verdict.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Evaluation {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passed: Option<bool>,
    /// Free-form detail (test counts, evaluator exit code, error message).
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub detail: serde_json::Value,
}

/// Who the session was: the GRPO group is the task within one job.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SessionInfo {
    pub session: String,
    pub task: String,
    pub group: String,
    pub sample: u32,
    pub metadata: BTreeMap<String, serde_json::Value>,
}

/// A session, ready for the trainer or a dataset.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Trajectory {
    /// Always `floe.trajectory/v1`.
    pub format: String,
    /// Unique session id (the trainer's idempotency key).
    pub session: String,
    pub task: String,
    /// GRPO group id: the sessions of one task in one job share it.
    pub group: String,
    /// Sample index within the group (0 ≤ sample < numSamples).
    pub sample: u32,
    pub status: SessionStatus,
    /// False for infrastructure failures: the trainer must not count the session at all.
    pub trainable: bool,
    /// `null` when the session has no reward (untrainable).
    pub reward: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evaluation: Option<Evaluation>,
    pub builder: Builder,
    /// Distinct policy versions that served the session's calls (staleness bound input).
    pub policy_versions: Vec<u64>,
    pub traces: Vec<Trace>,
    pub stats: ReconstructionStats,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, serde_json::Value>,
}
