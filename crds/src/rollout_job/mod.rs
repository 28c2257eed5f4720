//! `RolloutJob`: tasks × samples → sessions on sandbox pods → trajectories → GRPO or a dataset.
// Each `printcolumn(...)` in the kube derive repeats `type_ = ...`; that is the API, not a mistake.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::api::core::v1::{EnvVar, LocalObjectReference};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{ProviderApi, SandboxTemplate};

mod evaluator;
pub mod numbering;
mod rules;
mod status;
mod tasks;
mod train;

pub use evaluator::*;
pub use numbering::SessionPlace;
pub use status::*;
pub use tasks::*;
pub use train::*;

/// Runs every task `numSamples` times with an unmodified coding-agent harness, captures the
/// model calls at the gateway, scores each session with the evaluator and ships the
/// trajectories to a GRPO trainer (`train`) or writes them as a dataset (`sft`).
#[derive(CustomResource, KubeSchema, Clone, Debug, Deserialize, Serialize, PartialEq)]
#[kube(
    group = "floe.dev",
    version = "v1alpha1",
    kind = "RolloutJob",
    namespaced,
    shortname = "rj",
    category = "floe",
    status = "RolloutJobStatus",
    doc = "Rollouts of a coding-agent harness over a task set, for GRPO training or SFT data.",
    cel,
    validation = rules::tasks_immutable_once_started(),
    validation = rules::name_fits_its_services(),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Done/Total", type_ = "string", json_path = ".status.progress"),
    printcolumn(name = "Pass", type_ = "number", json_path = ".status.rewards.passRate"),
    printcolumn(name = "Step", type_ = "integer", json_path = ".status.trainer.step"),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type=="Ready")].reason"#
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[x_kube(
    validation = kube::core::Rule::new("has(self.train) != has(self.sft)")
        .message("exactly one of spec.train or spec.sft must be set"),
    validation = kube::core::Rule::new("has(self.poolRef) != has(self.poolTemplate)")
        .message("exactly one of spec.poolRef or spec.poolTemplate must be set"),
    validation = kube::core::Rule::new("!has(self.lookahead) || has(self.poolTemplate)")
        .message("spec.lookahead applies only with spec.poolTemplate"),
    validation = kube::core::Rule::new("!has(self.egress) || has(self.poolTemplate)")
        .message("spec.egress applies only with spec.poolTemplate (a pool's pods follow the pool's spec.egress)"),
    validation = kube::core::Rule::new(
        "!has(self.train) || !has(self.sampling) || !has(self.sampling.temperature) || self.sampling.temperature > 0.0"
    ).message("a train job samples with sampling.temperature > 0: greedy decoding gives every sample of a group the same answer, and the trainer trains the tempered policy the tokens were drawn from"),
    validation = kube::core::Rule::new(
        "!has(self.train) || !has(self.sampling) || !has(self.sampling.topP) || self.sampling.topP == 1.0"
    ).message("a train job samples with sampling.topP 1: the trainer models the tempered full-vocabulary distribution, and nucleus sampling would make every sampled token's log-prob disagree with it"),
    validation = kube::core::Rule::new(
        "!has(self.train) || !has(self.train.grpo) || !has(self.train.grpo.overlongPenalty) || self.train.grpo.overlongPenalty.bufferTokens <= (has(self.sampling) && has(self.sampling.maxResponseTokens) ? self.sampling.maxResponseTokens : 16384)"
    ).message("train.grpo.overlongPenalty.bufferTokens is at most sampling.maxResponseTokens: the buffer is the last stretch before the cap"),
    validation = kube::core::Rule::new(
        "!has(self.tasks.swebench) || (has(self.evaluator.reward) && has(self.evaluator.reward.source) && self.evaluator.reward.source == 'SWEBench')"
    ).message("SWE-bench instances (tasks.swebench) are graded with evaluator.reward.source SWEBench"),
    validation = kube::core::Rule::new(
        "!has(self.train) || !has(self.train.heldOut) || !has(self.train.heldOut.tasks.swebench) || (has(self.evaluator.reward) && has(self.evaluator.reward.source) && self.evaluator.reward.source == 'SWEBench')"
    ).message("held-out SWE-bench instances (train.heldOut.tasks.swebench) are graded with evaluator.reward.source SWEBench"),
    validation = kube::core::Rule::new(
        "!has(self.tasks.inline) || !has(self.evaluator.reward) || !has(self.evaluator.reward.source) || self.evaluator.reward.source != 'SWEBench' || self.tasks.inline.all(t, has(t.evaluation) && has(t.evaluation.swebench))"
    ).message("evaluator.reward.source SWEBench grades tasks that carry evaluation.swebench (tasks.swebench makes them from SWE-bench instances)"),
    validation = kube::core::Rule::new(
        "(has(self.evaluator.command) && size(self.evaluator.command) > 0) || (has(self.evaluator.reward) && has(self.evaluator.reward.source) && self.evaluator.reward.source == 'SWEBench')"
    ).message("evaluator.command is required (with reward.source SWEBench it may be left out: each instance's eval script runs)")
)]
#[serde(rename_all = "camelCase")]
pub struct RolloutJobSpec {
    /// The task set.
    pub tasks: TaskSource,
    /// Sessions per task: the GRPO group size.
    #[schemars(range(min = 1, max = 1024))]
    pub num_samples: i32,
    /// The coding-agent harness and how it is configured.
    pub harness: HarnessSpec,
    /// Claim sandbox pods from this GatewayPool (same namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::k8s::<Option<LocalObjectReference>>")]
    pub pool_ref: Option<LocalObjectReference>,
    /// Or run without a shared pool: the job creates a pod per session from this template
    /// (a task's `image` replaces the template's), `lookahead` sessions ahead of the running
    /// ones so they start warm. At most `concurrency` sessions run (8 when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_template: Option<SandboxTemplate>,
    /// With `poolTemplate`: pods kept warming for the next pending sessions, beyond the running
    /// ones (default: the concurrency). Larger hides slow image pulls; 0 creates each pod only
    /// when its session may run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 10000))]
    pub lookahead: Option<i32>,
    /// With `poolTemplate`: where the job's own sandbox pods may connect, as a pool's
    /// `spec.egress`. `Managed` (default): the operator keeps a NetworkPolicy `<job>-job-egress`
    /// owned by the job: TCP 8000 and 8100 of its own trainer or dataset collector, TCP/UDP 53
    /// on the cluster's DNS pods (`dns`), and `allow`; each pod checks at start it is enforced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<crate::gateway_pool::EgressSpec>,
    /// Scores each session after the harness exits.
    pub evaluator: EvaluatorSpec,
    /// How captured model calls become training samples.
    #[serde(default)]
    pub trajectory: TrajectorySpec,
    /// Generation limits the gateway enforces on every model call.
    #[serde(default)]
    pub sampling: SamplingSpec,
    /// GRPO training with a trainer pod (vLLM + trainer). Exclusive with `sft`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub train: Option<TrainSpec>,
    /// Collect accepted trajectories as a supervised fine-tuning dataset. Exclusive with `train`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sft: Option<SftSpec>,
    /// Most sessions running at once (default: as many as the pool can serve).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000))]
    pub concurrency: Option<i32>,
    /// Per-session time budgets.
    #[serde(default)]
    pub timeouts: Timeouts,
    /// How the gateway retries a model call the infrastructure failed.
    #[serde(default)]
    pub model_call_retry: ModelCallRetry,
    /// Wall-clock limit for the whole job, like a Job's; running sessions are stopped at the deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub active_deadline_seconds: Option<i64>,
    /// Retries of a session after an infrastructure failure (pod lost, evaluator crash), each on
    /// a fresh pod; one that still fails counts as failed, never as scored.
    #[serde(default = "default_backoff_limit")]
    #[schemars(range(min = 0, max = 100))]
    pub backoff_limit: i32,
    /// Stop claiming new pods; running sessions finish, then a trainer with `train.checkpoint`
    /// stops (GPUs free) until resumed, from its checkpoint. Kueue sets and clears this.
    #[serde(default)]
    pub suspend: bool,
    /// Delete the job this long after it finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub ttl_seconds_after_finished: Option<i32>,
}

/// The job/session contract every reader of a spec shares (the operator, `floe run`, the
/// runner): one place for its defaults and numbering.
impl RolloutJobSpec {
    /// Sessions per task (the GRPO group size), at least 1.
    pub fn samples(&self) -> u32 {
        u32::try_from(self.num_samples.max(1)).unwrap_or(1)
    }

    /// Passes over the task set (`train.epochs`; 1 for other jobs).
    pub fn epochs(&self) -> u32 {
        self.train
            .as_ref()
            .and_then(|t| u32::try_from(t.epochs).ok())
            .unwrap_or(1)
            .max(1)
    }

    /// The job's sessions over `tasks` tasks: tasks × samples × epochs.
    pub fn session_count(&self, tasks: usize) -> u64 {
        numbering::session_count(tasks, self.samples(), self.epochs())
    }

    /// The epoch, task (its position) and sample of session `index` of a job over `tasks`
    /// tasks ([`numbering::session_at`]); `None` past the last.
    pub fn session_at(&self, index: u64, tasks: usize) -> Option<SessionPlace> {
        numbering::session_at(index, self.samples(), tasks, self.epochs())
    }

    /// An `sft` job's dataset keeps trajectories with reward at least this: `sft.minReward`,
    /// else the evaluator's pass threshold. `None` without `sft`.
    pub fn sft_min_reward(&self) -> Option<f64> {
        self.sft.as_ref().map(|sft| {
            sft.min_reward
                .unwrap_or(self.evaluator.reward.pass_threshold)
        })
    }
}

fn default_backoff_limit() -> i32 {
    3
}

/// The coding-agent harness, run unmodified.
#[derive(KubeSchema, Clone, Debug, Deserialize, Serialize, PartialEq)]
#[x_kube(
    validation = kube::core::Rule::new("self.preset != 'custom' || (has(self.command) && size(self.command) > 0)")
        .message("harness.command is required for the custom preset"),
    validation = kube::core::Rule::new(
        "!has(self.api) || (self.preset == 'codex' ? self.api == 'openai-responses' : self.preset == 'claude-code' ? self.api == 'anthropic' : self.preset == 'gemini-cli' ? self.api == 'gemini' : self.preset == 'qwen-code' ? self.api != 'gemini' : true)"
    ).message("harness.api is not an API this preset speaks (codex: openai-responses; claude-code: anthropic; gemini-cli: gemini; qwen-code: anthropic, openai-chat or openai-responses)"),
    validation = kube::core::Rule::new("!has(self.env) || self.env.all(e, !has(e.valueFrom))")
        .message("harness.env takes plain values only: a session's environment travels in its assignment, where nothing resolves valueFrom; put Secret or ConfigMap references in the pool template's env or envFrom, which the kubelet resolves")
)]
#[serde(rename_all = "camelCase")]
pub struct HarnessSpec {
    /// Which harness: `codex`, `claude-code`, `qwen-code`, `pi`, `gemini-cli` or `custom`.
    pub preset: HarnessPreset,
    /// API the harness speaks to the gateway, for presets that speak several (`pi`, `qwen-code`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api: Option<ProviderApi>,
    /// Model name the harness asks for; the gateway maps it to the policy.
    #[serde(default = "default_model_name")]
    #[schemars(length(min = 1, max = 253))]
    pub model: String,
    /// Replaces the preset's headless command (required for `custom`). The instruction is in
    /// `$FLOE_INSTRUCTION` and the file `$FLOE_INSTRUCTION_FILE`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub command: Vec<String>,
    /// Appended to the preset's command.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub args: Vec<String>,
    /// Extra environment of the harness process.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    #[schemars(schema_with = "crate::schema::k8s::<Vec<EnvVar>>")]
    pub env: Vec<EnvVar>,
    /// Preset-specific settings merged into the harness's config file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::preserve_unknown_object")]
    pub settings: Option<serde_json::Value>,
    /// Provider-hosted tools in the harness's requests (web search, file search, code
    /// execution, computer use): the policy runs on vLLM, which cannot run them. `Reject`
    /// (default) answers such a request with the provider's 400, so the gap shows at once;
    /// `Drop` removes them and counts them in each trajectory (`stats.dropped_hosted_tools`).
    #[serde(default)]
    pub hosted_tools: HostedTools,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum HostedTools {
    #[default]
    Reject,
    Drop,
}

fn default_model_name() -> String {
    "policy".to_string()
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum HarnessPreset {
    /// OpenAI Codex CLI (`@openai/codex`), Responses API.
    Codex,
    /// Claude Code (`@anthropic-ai/claude-code`), Anthropic Messages API.
    ClaudeCode,
    /// Qwen Code (`@qwen-code/qwen-code`), Chat, Responses or Anthropic API.
    QwenCode,
    /// Pi coding agent (`@mariozechner/pi-coding-agent`), any of the four APIs.
    Pi,
    /// Gemini CLI (`@google/gemini-cli`), Gemini API.
    GeminiCli,
    /// Any command; floe sets the provider base-URL variables and the session token.
    Custom,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TrajectorySpec {
    /// `prefixMerging` (default) or `perRequest`.
    #[serde(default)]
    pub builder: TrajectoryBuilder,
    /// Request classes whose calls are not trained on (nor written to an sft job's dataset):
    /// what the harness says a call is for, today Claude Code's `main`, `subagent`,
    /// `workflow`, `compaction`, `auxiliary` and `side_reply`. `[auxiliary]` leaves out its
    /// side calls (a session's title, a summary of a tool's use or of a fetched page, memories
    /// to keep), whose tokens would carry the session's reward though the outcome says nothing
    /// of them. The capture keeps every call; the trajectory counts those left out
    /// (`stats.excluded_calls`). Default none: every call is trained, as Polar does. Calls
    /// that say no class are always trained.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(regex(pattern = r"^[a-z0-9_-]{1,32}$")))]
    pub exclude_request_classes: Vec<String>,
}

/// How captured model calls become training samples.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum TrajectoryBuilder {
    /// Join calls whose prompt extends the previous call's prompt + response into one sample.
    #[default]
    PrefixMerging,
    /// One sample per model call.
    PerRequest,
}

/// Generation limits the gateway enforces on every upstream call.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SamplingSpec {
    /// Cap on sampled tokens per model call (the harness's own limit is lowered to this).
    #[serde(default = "default_max_response_tokens")]
    #[schemars(range(min = 1, max = 1048576))]
    pub max_response_tokens: i32,
    /// Sampling temperature sent upstream (overrides the harness's own).
    #[serde(default = "default_temperature")]
    #[schemars(range(min = 0.0, max = 10.0))]
    pub temperature: f64,
    /// Nucleus sampling threshold sent upstream. A train job keeps it at 1: the trainer models
    /// the tempered full-vocabulary distribution.
    #[serde(default = "default_top_p")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub top_p: f64,
    /// A train job's calls go upstream with the complete policy sampling set (the temperature
    /// and `topP` above, `top_k` -1, `min_p` 0, neutral penalties), whatever the model's
    /// `generation_config.json` says. A parameter from the harness that would change the
    /// distribution (`top_k`, `min_p`, penalties, `logit_bias`, `ignore_eos`, `min_tokens`,
    /// guided decoding, a forced `tool_choice`, a `seed`, which makes a group's samples alike,
    /// anything not known to leave it alone) is `Drop`ped (default; counted in
    /// `floe_gateway_dropped_total{what="sampling:<name>"}` and the capture's `dropped`) or
    /// `Refuse`d (the call gets a 400 in its API's shape). Media parts, which the trainer cannot
    /// condition on, become a text note under `Drop`. An sft job passes them through.
    #[serde(default, skip_serializing_if = "CallerParams::is_default")]
    pub caller_params: CallerParams,
    /// Tokens one session's model calls may capture, prompts and sampled tokens summed over its
    /// calls (default 6,000,000). Past it the gateway refuses the session's further calls with
    /// a 400 in the caller's API shape (`session_budget_exceeded`), the harness stops, and the
    /// session is graded as it stands: the agent's doing, scored like any other. It bounds what
    /// a session ships — a trajectory too large for its trainer or collector (256 MiB) would be
    /// an infrastructure failure, retried, so an agent could otherwise turn a loss into a retry
    /// by growing it. The default fits that limit with sampled tokens at their largest (34
    /// bytes each measured, with their log-prob and mask; floe allows for 40). Above about
    /// 6,700,000 a session can outgrow it again: a prefix-merging job ships less than the sum,
    /// but only a job whose calls share their prefixes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000_000))]
    pub max_session_tokens: Option<i64>,
    /// Model calls one session may make (unset: no limit but `maxSessionTokens`): a turn
    /// limit, as verl's `max_assistant_turns` or SWE-agent's step limit. Past it, calls are
    /// refused as above.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub max_calls_per_session: Option<i32>,
    /// Bytes one session's capture may hold (default 1 GiB): its calls' requests as the
    /// harness sent them and as they went upstream, the answers, the token ids. Past it, calls
    /// are refused as above (calls already in flight still land: a few hundred MiB at most).
    /// The token budget does not bound it: parts of a request that never become tokens (a
    /// `metadata` the gateway drops) are captured as sent, so without it an agent could fill
    /// its gateway's disk (the pod's, or `floe run`'s `--out`) and turn its session into an
    /// infrastructure failure. An honest text-only session at 6,000,000 tokens
    /// captures about 100 MB; raise it for jobs that send many inline images.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1_048_576, max = 1_099_511_627_776_i64))]
    pub max_session_bytes: Option<i64>,
}

/// `sampling.maxSessionBytes` when unset.
pub const DEFAULT_MAX_SESSION_BYTES: i64 = 1 << 30;

/// `sampling.maxSessionTokens` when unset ([`SamplingSpec::max_session_tokens`]).
pub const DEFAULT_MAX_SESSION_TOKENS: i64 = 6_000_000;

/// What a train job does with a harness's distribution-changing sampling parameters.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum CallerParams {
    #[default]
    Drop,
    Refuse,
}

impl CallerParams {
    fn is_default(&self) -> bool {
        *self == Self::Drop
    }
}

impl Default for SamplingSpec {
    fn default() -> Self {
        Self {
            max_response_tokens: default_max_response_tokens(),
            temperature: default_temperature(),
            top_p: default_top_p(),
            caller_params: CallerParams::default(),
            max_session_tokens: None,
            max_calls_per_session: None,
            max_session_bytes: None,
        }
    }
}

/// `sampling.maxResponseTokens` when unset: what each model call may generate.
pub const DEFAULT_MAX_RESPONSE_TOKENS: i32 = 16384;

fn default_max_response_tokens() -> i32 {
    DEFAULT_MAX_RESPONSE_TOKENS
}
fn default_temperature() -> f64 {
    1.0
}
fn default_top_p() -> f64 {
    1.0
}

#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Timeouts {
    /// Budget of the harness run; on expiry the process group is killed and the session gets
    /// `evaluator.reward.failureReward` (default 0) with its traces trainable (the evaluator
    /// still runs; its verdict is recorded).
    #[serde(default = "default_agent_timeout")]
    #[schemars(range(min = 1, max = 604800))]
    pub agent_seconds: i32,
    /// Budget of the evaluator; on expiry the session scores `evaluator.reward.failureReward`
    /// (`evaluator_timeout`: the code under test can hang its tests), not retried. For a
    /// SWE-bench instance, the untouched repository's tests timing out too make it an
    /// infrastructure failure instead (swebench's own harness allows 1800 s).
    #[serde(default = "default_evaluator_timeout")]
    #[schemars(range(min = 1, max = 86400))]
    pub evaluator_seconds: i32,
    /// Deadline of one model call at the gateway, its retries included. Connection errors,
    /// 429, 500 (twice at most) and 502/503/504 from the model server are retried with backoff
    /// within it; a call that still fails (or is still unanswered at the deadline) makes the
    /// session an infrastructure failure: retried, never scored. This is what tells a hung
    /// model server from a slow policy, so keep it above the longest generation you expect.
    #[serde(default = "default_model_call_timeout")]
    #[schemars(range(min = 1, max = 86400))]
    pub model_call_seconds: i32,
    /// With `poolTemplate`: a session's pod that reports a problem it will not get past on its
    /// own (its image cannot be pulled, a container's config is refused, a container crash
    /// loops) and has not been Ready for this long since it was placed on a node (and for a
    /// minute at least since it last was) counts as a failed attempt
    /// of its session, like an infrastructure failure: retried on a fresh pod up to
    /// `backoffLimit`, then failed with the pod's reason. A pod the scheduler has no room for
    /// yet (`Unschedulable`) waits, whatever its age. (A pool's pods follow the pool's
    /// `refill.unreadyTimeoutSeconds`.) Any job: a claimed pod whose gateway has not taken its
    /// session's assignment for this long (every delivery failing: unreachable from the
    /// operator, or refusing it) is a failed attempt too.
    #[serde(default = "default_pod_start_timeout")]
    #[schemars(range(min = 10, max = 86400))]
    pub pod_start_seconds: i32,
}

/// How the gateway retries a model call the infrastructure failed — connection errors, 429,
/// 502/503/504, and a 500 a few times — with exponential backoff, within
/// `timeouts.modelCallSeconds` and never past it (a retry that could only time out is not
/// made). A server's `Retry-After` is honoured when it asks for longer.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ModelCallRetry {
    /// Wait before the first retry; doubled after each.
    #[serde(default = "default_first_backoff_millis")]
    #[schemars(range(min = 10, max = 60000))]
    pub first_backoff_millis: i32,
    /// Longest wait between two attempts.
    #[serde(default = "default_max_backoff_seconds")]
    #[schemars(range(min = 1, max = 600))]
    pub max_backoff_seconds: i32,
    /// Retries of an HTTP 500, which is often deterministic (a request the server crashes on):
    /// 0 fails the call at the first one.
    #[serde(default = "default_http500_retries")]
    #[schemars(range(min = 0, max = 10))]
    pub http500_retries: i32,
}

impl Default for ModelCallRetry {
    fn default() -> Self {
        Self {
            first_backoff_millis: default_first_backoff_millis(),
            max_backoff_seconds: default_max_backoff_seconds(),
            http500_retries: default_http500_retries(),
        }
    }
}

fn default_first_backoff_millis() -> i32 {
    250
}
fn default_max_backoff_seconds() -> i32 {
    8
}
fn default_http500_retries() -> i32 {
    2
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            agent_seconds: default_agent_timeout(),
            evaluator_seconds: default_evaluator_timeout(),
            model_call_seconds: default_model_call_timeout(),
            pod_start_seconds: default_pod_start_timeout(),
        }
    }
}

fn default_agent_timeout() -> i32 {
    1800
}
fn default_evaluator_timeout() -> i32 {
    600
}
fn default_pod_start_timeout() -> i32 {
    600
}
fn default_model_call_timeout() -> i32 {
    600
}

#[cfg(test)]
mod defaults {
    use super::*;

    #[test]
    fn an_omitted_reward_spec_has_the_documented_pass_threshold() {
        let evaluator: EvaluatorSpec =
            serde_json::from_value(serde_json::json!({"command": ["true"]})).expect("evaluator");
        assert_eq!(evaluator.reward.pass_threshold, 1.0);
        assert_eq!(RewardSpec::default().pass_threshold, 1.0);
    }
}
