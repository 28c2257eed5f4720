//! `RolloutJob`: tasks × samples → sessions on sandbox pods → trajectories → GRPO or a dataset.
// Each `printcolumn(...)` in the kube derive repeats `type_ = ...`; that is the API, not a mistake.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EnvVar, LocalObjectReference, ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{PrepareStep, ProviderApi, SandboxTemplate, UpstreamSpec};

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
    validation = kube::core::Rule::new(
        "!has(oldSelf.status) || !has(oldSelf.status.startTime) || (self.spec.tasks == oldSelf.spec.tasks && self.spec.numSamples == oldSelf.spec.numSamples)"
    ).message("spec.tasks and spec.numSamples are immutable once the job has started"),
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
        .message("spec.egress applies only with spec.poolTemplate (a pool's pods follow the pool's spec.egress)")
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
    /// With `poolTemplate`: where the job's own sandbox pods may connect, as a GatewayPool's
    /// `spec.egress`. `Managed` (default): the operator keeps a NetworkPolicy
    /// `<job>-job-egress`, owned by the job, that lets them reach only DNS, the job's trainer
    /// pod or dataset collector, and `allow`; each pod checks at start that it is enforced.
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
    /// Wall-clock limit for the whole job, like a Job's; running sessions are stopped at the deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub active_deadline_seconds: Option<i64>,
    /// Retries of a session after an infrastructure failure (pod lost, evaluator crash), each on a
    /// fresh pod. A session that still fails counts as failed, never as reward 0.
    #[serde(default = "default_backoff_limit")]
    #[schemars(range(min = 0, max = 100))]
    pub backoff_limit: i32,
    /// Stop claiming new pods; running sessions finish. Kueue sets and clears this.
    #[serde(default)]
    pub suspend: bool,
    /// Delete the job this long after it finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub ttl_seconds_after_finished: Option<i32>,
}

/// Session `index` of a job with `samples` per task is sample `index % samples` of task
/// `index / samples`: task-major, so each GRPO group's samples are neighbours and are claimed
/// together.
pub fn session_at(index: u32, samples: u32) -> (usize, u32) {
    let samples = samples.max(1);
    ((index / samples) as usize, index % samples)
}

/// The job/session contract every reader of a spec shares (the operator, `floe run`, the
/// runner): one place for its defaults and numbering.
impl RolloutJobSpec {
    /// Sessions per task (the GRPO group size), at least 1.
    pub fn samples(&self) -> u32 {
        u32::try_from(self.num_samples.max(1)).unwrap_or(1)
    }

    /// The task (its position) and sample of session `index` ([`session_at`]).
    pub fn session_at(&self, index: u32) -> (usize, u32) {
        session_at(index, self.samples())
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

/// Where the tasks come from: exactly one of `inline`, `configMap` or `file`.
#[derive(KubeSchema, Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[x_kube(validation = kube::core::Rule::new(
    "(has(self.inline) ? 1 : 0) + (has(self.configMap) ? 1 : 0) + (has(self.file) ? 1 : 0) == 1"
).message("exactly one of tasks.inline, tasks.configMap or tasks.file must be set"))]
#[serde(rename_all = "camelCase")]
pub struct TaskSource {
    /// Tasks written in the job itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 10000))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["id"]))]
    pub inline: Option<Vec<Task>>,
    /// A ConfigMap whose key holds one JSON task per line (JSONL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<ConfigMapTasks>,
    /// A JSONL file: on a PersistentVolumeClaim in a cluster (a small loader pod of the job
    /// mounts it read-only and serves it to the operator), relative to the job file in local
    /// mode (`floe run`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<FileTasks>,
}

#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ConfigMapTasks {
    /// ConfigMap name (same namespace).
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key holding the JSONL.
    #[serde(default = "default_tasks_key")]
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

fn default_tasks_key() -> String {
    "tasks.jsonl".to_string()
}

#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FileTasks {
    /// Path of the JSONL file inside the claim (or, in local mode without a claim, relative to
    /// the job file).
    #[schemars(length(min = 1, max = 4096))]
    pub path: String,
    /// PersistentVolumeClaim holding the file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub claim_name: Option<String>,
}

/// One task. The same fields appear in each line of a JSONL task file.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Task {
    /// Unique within the job; part of every session id and the GRPO group id.
    #[schemars(
        length(min = 1, max = 128),
        regex(pattern = r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
    )]
    pub id: String,
    /// The prompt given to the harness.
    #[schemars(length(min = 1, max = 262144))]
    pub instruction: String,
    /// Image for this task's sandbox instead of the pool's (lookahead pre-warming).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub image: Option<String>,
    /// Commands run in the sandbox before the harness starts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub prepare: Vec<PrepareStep>,
    /// Files written into the workspace before the harness starts (path → content).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub files: BTreeMap<String, String>,
    /// What the evaluator gets for this task; never visible while the agent runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evaluation: Option<TaskEvaluation>,
    /// Free-form labels copied into every trajectory of the task.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TaskEvaluation {
    /// Files added to the evaluation copy of the workspace only (hidden tests), path → content.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub hidden_files: BTreeMap<String, String>,
    /// Extra environment for the evaluator command.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Extra arguments appended to the evaluator command.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub args: Vec<String>,
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

/// Scores a session after the harness exits. Runs in a fresh copy of the task workspace with the
/// agent's changes applied, plus the task's hidden files.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EvaluatorSpec {
    /// Argument vector, e.g. `["python", "-m", "pytest", "-q", "tests/"]`.
    #[schemars(length(min = 1, max = 256))]
    pub command: Vec<String>,
    /// Image for the evaluator (default: the sandbox image).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub image: Option<String>,
    /// How the evaluator's result becomes a reward.
    #[serde(default)]
    pub reward: RewardSpec,
    /// Hidden files for every task (merged under each task's `evaluation.hiddenFiles`),
    /// from a ConfigMap whose keys are file paths with `/` written as `__`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::k8s::<Option<LocalObjectReference>>")]
    pub hidden_files_from: Option<LocalObjectReference>,
    /// Workspace paths (globs; `*` within a directory, `**` across directories) whose changes by
    /// the agent are discarded before the evaluator runs, e.g. `tests/**` or `**/conftest.py`.
    /// Hidden files are always protected.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[schemars(inner(length(min = 1, max = 1024)))]
    pub protected_paths: Vec<String>,
}

#[derive(KubeSchema, Clone, Debug, Deserialize, Serialize, PartialEq)]
#[x_kube(
    validation = kube::core::Rule::new("self.source != 'RewardFile' || has(self.path)")
        .message("evaluator.reward.path is required when source is RewardFile"),
    validation = kube::core::Rule::new("self.source != 'TestOutput' || has(self.format)")
        .message("evaluator.reward.format is required when source is TestOutput")
)]
#[serde(rename_all = "camelCase")]
pub struct RewardSpec {
    /// Where the reward comes from: `ExitCode` (default), `RewardFile` or `TestOutput`.
    #[serde(default)]
    pub source: RewardSource,
    /// `RewardFile`: JSON file `{"reward": <number>}` written by the evaluator; `TestOutput`:
    /// the report file (default: the evaluator's stdout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    pub path: Option<String>,
    /// `TestOutput` format.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<TestOutputFormat>,
    /// `TestOutput`: 1 only when every test passed (`AllPass`) or the passed fraction (`Fraction`).
    #[serde(default)]
    pub scoring: TestScoring,
    /// Reward at or above which a session counts as passed (pass rate, SFT acceptance default).
    #[serde(default = "default_pass_threshold")]
    pub pass_threshold: f64,
}

fn default_pass_threshold() -> f64 {
    1.0
}

// Not derived: an omitted `reward` must get the same pass threshold as an omitted field.
impl Default for RewardSpec {
    fn default() -> Self {
        Self {
            source: RewardSource::default(),
            path: None,
            format: None,
            scoring: TestScoring::default(),
            pass_threshold: default_pass_threshold(),
        }
    }
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum RewardSource {
    /// 1 when the evaluator exits 0, else 0.
    #[default]
    ExitCode,
    RewardFile,
    TestOutput,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum TestOutputFormat {
    JUnitXml,
    Tap,
    /// pytest's final `N passed, M failed` line.
    PytestSummary,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum TestScoring {
    #[default]
    AllPass,
    Fraction,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TrajectorySpec {
    /// `prefixMerging` (default) or `perRequest`.
    #[serde(default)]
    pub builder: TrajectoryBuilder,
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
    /// Nucleus sampling threshold sent upstream.
    #[serde(default = "default_top_p")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub top_p: f64,
}

impl Default for SamplingSpec {
    fn default() -> Self {
        Self {
            max_response_tokens: default_max_response_tokens(),
            temperature: default_temperature(),
            top_p: default_top_p(),
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
    /// reward 0 with its traces trainable (the evaluator still runs; its verdict is recorded).
    #[serde(default = "default_agent_timeout")]
    #[schemars(range(min = 1, max = 604800))]
    pub agent_seconds: i32,
    /// Budget of the evaluator; on expiry the session is an infrastructure failure (retried).
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
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            agent_seconds: default_agent_timeout(),
            evaluator_seconds: default_evaluator_timeout(),
            model_call_seconds: default_model_call_timeout(),
        }
    }
}

fn default_agent_timeout() -> i32 {
    1800
}
fn default_evaluator_timeout() -> i32 {
    600
}
fn default_model_call_timeout() -> i32 {
    600
}

/// The trainer pod: vLLM serving the policy to every gateway, and the GRPO trainer.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TrainSpec {
    /// Trainer image (vLLM + `floe-trainer`).
    #[schemars(length(min = 1, max = 1024))]
    pub image: String,
    /// Model path (on `modelClaimName`'s volume) or name that vLLM and the trainer load.
    #[schemars(length(min = 1, max = 4096))]
    pub model: String,
    /// PersistentVolumeClaim holding the model weights, mounted read-only at `/models`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub model_claim_name: Option<String>,
    /// GPUs for training (`nvidia.com/gpu`): 0 trains on CPU, 1 on a GPU. Data-parallel
    /// training over several GPUs is not implemented yet.
    #[serde(default = "default_one")]
    #[schemars(range(min = 0, max = 1))]
    pub gpus: i32,
    /// The vLLM server in the trainer pod.
    #[serde(default)]
    pub vllm: VllmSpec,
    /// Resources of the trainer container beyond its GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::k8s::<Option<ResourceRequirements>>")]
    pub resources: Option<ResourceRequirements>,
    /// Nodes the trainer pod may run on (GPU nodes).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Taints the trainer pod tolerates (e.g. `nvidia.com/gpu`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[schemars(schema_with = "crate::schema::k8s::<Vec<Toleration>>")]
    pub tolerations: Vec<Toleration>,
    /// GRPO hyper-parameters.
    #[serde(default)]
    pub grpo: GrpoSpec,
    /// Trajectories sampled more than this many policy versions ago are dropped (and counted).
    #[serde(default = "default_one")]
    #[schemars(range(min = 0, max = 1000))]
    pub max_staleness: i32,
    /// Periodic checkpoints; the trainer resumes from the latest after a restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<CheckpointSpec>,
}

fn default_one() -> i32 {
    1
}

#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VllmSpec {
    /// GPUs for the vLLM server (tensor parallel size).
    #[serde(default = "default_one")]
    #[schemars(range(min = 0, max = 64))]
    pub gpus: i32,
    /// Extra `vllm` server arguments, e.g. `["--max-model-len", "32768"]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 128))]
    pub args: Vec<String>,
}

impl Default for VllmSpec {
    fn default() -> Self {
        Self {
            gpus: 1,
            args: Vec::new(),
        }
    }
}

/// GRPO hyper-parameters. Defaults follow DAPO-style clip-higher with truncated importance sampling.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GrpoSpec {
    /// AdamW learning rate.
    #[serde(default = "default_learning_rate")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub learning_rate: f64,
    /// Advantage estimator: `MeanStd` (GRPO), `MeanOnly` (Dr. GRPO) or `LeaveOneOut` (RLOO).
    #[serde(default)]
    pub advantage: AdvantageEstimator,
    /// Lower clip range of the PPO ratio (1 − ε_low).
    #[serde(default = "default_epsilon_low")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub epsilon_low: f64,
    /// Upper clip range of the PPO ratio (1 + ε_high, clip-higher).
    #[serde(default = "default_epsilon_high")]
    #[schemars(range(min = 0.0, max = 10.0))]
    pub epsilon_high: f64,
    /// Cap of the truncated importance-sampling ratio against the behaviour logprobs.
    #[serde(default = "default_tis_cap")]
    #[schemars(range(min = 1.0, max = 100.0))]
    pub tis_cap: f64,
    /// KL penalty to the reference model (0 = off, no reference model loaded).
    #[serde(default)]
    #[schemars(range(min = 0.0, max = 10.0))]
    pub kl_coef: f64,
    /// How token losses are averaged: `TokenMean`, `SequenceMean` or `TokenSumNorm`.
    #[serde(default)]
    pub loss_aggregation: LossAggregation,
    /// Groups (tasks) per optimizer step.
    #[serde(default = "default_groups_per_step")]
    #[schemars(range(min = 1, max = 4096))]
    pub groups_per_step: i32,
    /// Sequences per forward/backward pass (gradient accumulation covers the rest).
    #[serde(default = "default_micro_batch")]
    #[schemars(range(min = 1, max = 4096))]
    pub micro_batch_size: i32,
    /// Optimizer updates per pass over a step's rollout batch. The batch's old log-probs are
    /// taken once before the first update, so from the second update on the PPO ratio moves
    /// away from 1 and the clip (`epsilonLow`/`epsilonHigh`) bounds each update.
    #[serde(default = "default_one")]
    #[schemars(range(min = 1, max = 4096))]
    pub mini_batches: i32,
    /// Passes over a step's rollout batch (PPO epochs), each of `miniBatches` updates.
    #[serde(default = "default_one")]
    #[schemars(range(min = 1, max = 100))]
    pub ppo_epochs: i32,
    /// Gradient-norm clipping threshold.
    #[serde(default = "default_max_grad_norm")]
    #[schemars(range(min = 0.0, max = 1000.0))]
    pub max_grad_norm: f64,
    /// Recompute activations in the backward pass to save GPU memory.
    #[serde(default)]
    pub gradient_checkpointing: bool,
    /// Training precision: `Auto` (BF16 on a GPU, FP32 on CPU), `BF16` (bf16 autocast over
    /// fp32 master weights and optimizer state) or `FP32`.
    #[serde(default)]
    pub precision: TrainingPrecision,
    /// How each step's weights reach the pod's vLLM: `File` (safetensors on the pod's shared
    /// volume, then vLLM reloads them; works on CPU and GPU) or `NCCL` (broadcast from the
    /// trainer's GPU to vLLM's, vLLM's weight-transfer API; needs `gpus: 1`).
    #[serde(default)]
    pub weight_sync: WeightSync,
    /// A group is trained once this fraction of its samples arrived and `groupGraceSeconds` passed.
    #[serde(default = "default_min_group_fraction")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub min_group_fraction: f64,
    /// How long to wait for the rest of a group once `minGroupFraction` arrived.
    #[serde(default = "default_group_grace")]
    #[schemars(range(min = 0, max = 86400))]
    pub group_grace_seconds: i32,
}

impl Default for GrpoSpec {
    fn default() -> Self {
        Self {
            learning_rate: default_learning_rate(),
            advantage: AdvantageEstimator::default(),
            epsilon_low: default_epsilon_low(),
            epsilon_high: default_epsilon_high(),
            tis_cap: default_tis_cap(),
            kl_coef: 0.0,
            loss_aggregation: LossAggregation::default(),
            groups_per_step: default_groups_per_step(),
            micro_batch_size: default_micro_batch(),
            mini_batches: 1,
            ppo_epochs: 1,
            max_grad_norm: default_max_grad_norm(),
            gradient_checkpointing: false,
            precision: TrainingPrecision::default(),
            weight_sync: WeightSync::default(),
            min_group_fraction: default_min_group_fraction(),
            group_grace_seconds: default_group_grace(),
        }
    }
}

fn default_learning_rate() -> f64 {
    1e-6
}
fn default_epsilon_low() -> f64 {
    0.2
}
fn default_epsilon_high() -> f64 {
    0.28
}
fn default_tis_cap() -> f64 {
    2.0
}
fn default_groups_per_step() -> i32 {
    8
}
fn default_micro_batch() -> i32 {
    4
}
fn default_max_grad_norm() -> f64 {
    1.0
}
fn default_min_group_fraction() -> f64 {
    1.0
}
fn default_group_grace() -> i32 {
    300
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum AdvantageEstimator {
    /// (r − mean) / std within the group (GRPO).
    #[default]
    MeanStd,
    /// r − mean, no std normalization (Dr. GRPO).
    MeanOnly,
    /// r − mean of the other samples (RLOO).
    LeaveOneOut,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum LossAggregation {
    /// Mean over all trainable tokens of the batch (DAPO).
    #[default]
    TokenMean,
    /// Mean over tokens per sequence, then over sequences (original GRPO).
    SequenceMean,
    /// Sum over tokens divided by a constant (Dr. GRPO).
    TokenSumNorm,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum TrainingPrecision {
    /// BF16 where the trainer has a GPU, FP32 on CPU.
    #[default]
    Auto,
    /// bf16 autocast; weights and AdamW state stay fp32.
    BF16,
    /// Plain fp32.
    FP32,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum WeightSync {
    /// Save safetensors, vLLM reloads them from disk.
    #[default]
    File,
    /// GPU-to-GPU broadcast over NCCL (vLLM `--weight-transfer-config {"backend":"nccl"}`).
    NCCL,
}

#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointSpec {
    /// PersistentVolumeClaim for checkpoints (model, optimizer, step, policy version).
    #[schemars(length(min = 1, max = 253))]
    pub claim_name: String,
    /// Write a checkpoint every this many optimizer steps.
    #[serde(default = "default_checkpoint_every")]
    #[schemars(range(min = 1, max = 1000000))]
    pub every_steps: i32,
    /// Checkpoints kept; older ones are deleted.
    #[serde(default = "default_checkpoint_keep")]
    #[schemars(range(min = 1, max = 1000))]
    pub keep: i32,
}

fn default_checkpoint_every() -> i32 {
    50
}
fn default_checkpoint_keep() -> i32 {
    3
}

/// Supervised fine-tuning data collection: accepted trajectories go to a JSONL dataset.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SftSpec {
    /// Model server the gateways call (a teacher model, or any OpenAI-compatible vLLM).
    pub upstream: UpstreamSpec,
    /// Where the dataset is written.
    pub output: DatasetOutput,
    /// Trajectories with reward ≥ this are written (default: `evaluator.reward.passThreshold`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_reward: Option<f64>,
}

#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DatasetOutput {
    /// PersistentVolumeClaim the dataset is written to.
    #[schemars(length(min = 1, max = 253))]
    pub claim_name: String,
    /// Directory inside the claim; `dataset.jsonl` and `summary.json` are written there.
    #[serde(default = "default_dataset_path")]
    #[schemars(length(min = 1, max = 4096))]
    pub path: String,
    /// User the dataset collector runs as and writes the dataset as (default 65532). On a
    /// volume that does not apply the pod's `fsGroup` (hostPath, some NFS exports), set it to
    /// the directory's owner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub run_as_user: Option<i64>,
    /// Group the dataset collector runs as, also its `fsGroup` (default 65532).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub run_as_group: Option<i64>,
}

fn default_dataset_path() -> String {
    "/".to_string()
}

/// Observed state of the job.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RolloutJobStatus {
    /// `Pending`, `Running`, `Suspended`, `Succeeded` or `Failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<RolloutJobPhase>,
    /// `finished/total` sessions, for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
    /// Sessions by state.
    #[serde(default)]
    pub sessions: SessionCounts,
    /// Rewards of the scored sessions so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rewards: Option<RewardStats>,
    /// Progress of the trainer pod (`train` mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trainer: Option<TrainerProgress>,
    /// `Ready`, `Progressing`, `Complete`, `Failed`, `Suspended`, and kstatus `Reconciling`/`Stalled`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::k8s::<Vec<Condition>>")]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Sessions that finished with a reward, by index (task `i`, sample `s` → `i × numSamples + s`),
    /// as sorted ranges like `0-7,9` — the record that makes counting each session exactly once
    /// survive operator restarts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_indexes: Option<String>,
    /// Sessions that exhausted `backoffLimit` (no reward recorded), by index, as ranges.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_indexes: Option<String>,
    /// Infrastructure failures so far, by session index (only sessions that had one); the next
    /// attempt of a session is this number.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub retries: BTreeMap<String, i32>,
    /// Failed model-server attempts of the job's sessions by kind (`connect`, `timeout`,
    /// `http_503`, …): `retried` by the gateways within a call's deadline, and `failed` (the
    /// call failed for the harness; its session was an infrastructure failure, never scored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_errors: Option<UpstreamErrorCounts>,
    /// When the first session was claimed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::k8s::<Option<Time>>")]
    pub start_time: Option<Time>,
    /// When the job succeeded or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::k8s::<Option<Time>>")]
    pub completion_time: Option<Time>,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum RolloutJobPhase {
    Pending,
    Running,
    Suspended,
    Succeeded,
    Failed,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SessionCounts {
    /// Tasks × numSamples.
    #[serde(default)]
    pub total: i32,
    /// Waiting for a sandbox pod.
    #[serde(default)]
    pub pending: i32,
    /// Assigned to a pod and not finished.
    #[serde(default)]
    pub running: i32,
    /// Finished with a reward.
    #[serde(default)]
    pub succeeded: i32,
    /// Sessions that exhausted `backoffLimit` on infrastructure failures (no reward recorded).
    #[serde(default)]
    pub failed: i32,
    /// Infrastructure retries so far.
    #[serde(default)]
    pub retried: i32,
}

/// Upstream failures by kind.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct UpstreamErrorCounts {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub retried: BTreeMap<String, i64>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub failed: BTreeMap<String, i64>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RewardStats {
    /// Sessions with a reward.
    pub scored: i32,
    /// Mean reward.
    pub mean: f64,
    /// Sum of the rewards (kept so that folding results in is exact).
    #[serde(default)]
    pub sum: f64,
    /// Scored sessions with reward ≥ `passThreshold`.
    #[serde(default)]
    pub passed: i32,
    /// Fraction of scored sessions with reward ≥ `passThreshold`.
    pub pass_rate: f64,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TrainerProgress {
    /// Optimizer steps taken.
    pub step: i64,
    /// Version of the weights vLLM serves (bumped on every weight push).
    pub policy_version: i64,
    /// When the last optimizer step finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::k8s::<Option<Time>>")]
    pub last_step_time: Option<Time>,
    /// The job's sessions are done and the trainer trained what was left and wrote its final
    /// model; until then a job whose sessions are done stays `Running`.
    #[serde(default)]
    pub finished: bool,
    /// The final model directory (a servable model: weights, config, tokenizer), in the
    /// trainer pod's filesystem (on the checkpoint volume when `train.checkpoint` is set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_model: Option<String>,
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
