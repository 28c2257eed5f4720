//! `spec.train` (the trainer pod: vLLM serving the policy, and GRPO) and `spec.sft` (a
//! dataset of accepted trajectories).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ResourceRequirements, Toleration};
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::UpstreamSpec;

/// The trainer pod: vLLM serving the policy to every gateway, and the GRPO trainer.
#[derive(KubeSchema, Clone, Debug, Deserialize, Serialize, PartialEq)]
#[x_kube(validation = kube::core::Rule::new(
    "!has(self.grpo) || !has(self.grpo.weightSync) || self.grpo.weightSync != 'NCCL' || ((!has(self.gpus) || self.gpus == 1) && (!has(self.nodes) || self.nodes == 1))")
    .message("grpo.weightSync NCCL broadcasts from one training GPU: train.gpus must be 1 and train.nodes 1 (or use File)"))]
#[x_kube(validation = kube::core::Rule::new(
    "!has(self.lora) || !has(self.grpo) || !has(self.grpo.weightSync) || self.grpo.weightSync != 'NCCL'")
    .message("train.lora pushes the adapter as a file: grpo.weightSync must be File"))]
#[x_kube(validation = kube::core::Rule::new(
    "!has(self.grpo) || !has(self.grpo.maxGradNorm) || self.grpo.maxGradNorm > 0.0")
    .message("grpo.maxGradNorm must be above 0: clipping to 0 zeroes every update"))]
#[x_kube(validation = kube::core::Rule::new(
    "!has(self.lora) || !has(self.lora.alpha) || self.lora.alpha > 0.0")
    .message("train.lora.alpha must be above 0: the adapter's update is scaled by alpha / rank, and 0 trains nothing"))]
#[x_kube(validation = kube::core::Rule::new(
    "!has(self.grpo) || !has(self.grpo.dualClip) || self.grpo.dualClip > 1.0")
    .message("grpo.dualClip must be above 1: it bounds a negative advantage's cost past the clip's own"))]
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
    /// GPUs for training (`nvidia.com/gpu`): 0 trains on CPU, 1 on a GPU; more starts one
    /// trainer process per GPU under `torchrun` (FSDP2: parameters, gradients and AdamW state
    /// sharded over them), all in the trainer pod.
    #[serde(default = "default_one")]
    #[schemars(range(min = 0, max = 8))]
    pub gpus: i32,
    /// Trainer pods, one per node, for a model that one node's GPUs cannot train: `torchrun`
    /// joins `gpus` processes (one if 0) on each into one FSDP2 world of nodes × gpus, with a
    /// static rendezvous at the first pod's IP (no DNS needed). The first pod (`<job>-trainer`)
    /// also runs vLLM and the ingest and writes the checkpoints; the others
    /// (`<job>-trainer-1`, …) only train, created once the first has an IP and replaced with
    /// it. Each pod mounts `modelClaimName` read-only (a ReadOnlyMany volume when they land on
    /// several nodes); a restarted world resumes from the first pod's checkpoint by
    /// broadcast, so only it mounts `checkpoint.claimName`.
    #[serde(default = "default_one")]
    #[schemars(range(min = 1, max = 64))]
    pub nodes: i32,
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
    /// Passes over the task set: every task's group is sampled once per epoch, the first
    /// epoch in the task list's order and each later one in a shuffled order of its own (the
    /// same in `floe run` and on the cluster). Sessions: tasks × numSamples × epochs.
    #[serde(default = "default_one")]
    #[schemars(range(min = 1, max = 10000))]
    pub epochs: i32,
    /// Periodic checkpoints; the trainer resumes from the latest after a restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<CheckpointSpec>,
    /// The trainer's memory plan, made before it loads the model: what one step needs on
    /// each training device (weights, gradients and AdamW state, activations of a micro-batch
    /// of traces as long as vLLM's `--max-model-len`, logits) against what the device has.
    /// `Enforce` refuses a step that cannot fit, in one line naming a change that fits (the
    /// job's condition carries it); `Warn` logs that line and starts anyway.
    #[serde(default)]
    pub memory_plan: MemoryPlanMode,
    /// Train a LoRA adapter instead of every weight (PEFT): the base stays frozen, vLLM serves
    /// it with the adapter loaded, and each step's push moves only the adapter. Unset: full
    /// training.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora: Option<LoraSpec>,
    /// Before the first session: a few completions sampled from the policy server with the
    /// requests sessions make, scored by the trainer; their mean per-token log-prob mismatch
    /// against vLLM's must be within `maxMismatch`, or the trainer would train a distribution
    /// nothing samples (a model's sampling defaults, a tokenizer or dtype apart).
    #[serde(default)]
    pub fidelity_check: FidelityCheckSpec,
    /// Tasks the policy is measured on and never trained on: a round of sessions over them
    /// before the first step, every `everySteps` steps and at the final version, their pass
    /// rate reported beside the reward curve (as verl's `test_freq` and TRL's `eval_steps`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_out: Option<HeldOutSpec>,
}

/// `train.heldOut`.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HeldOutSpec {
    /// The held-out tasks, in `spec.tasks`' shape: inline, a ConfigMap (in a cluster), or a
    /// JSONL file (on a claim in a cluster, served by the job's task loader pod; relative to
    /// the job with `floe run`); SWE-bench instances with `swebench`. Graded by the job's
    /// evaluator; their trajectories go to no trainer. Rounds are recorded in `status.heldOut`.
    pub tasks: crate::rollout_job::TaskSource,
    /// A round every this many optimizer steps (policy versions): one at version 0 before
    /// training, one at each multiple the trainer reaches, one at the final version.
    #[serde(default = "default_every_steps")]
    #[schemars(range(min = 1, max = 100000))]
    pub every_steps: i32,
    /// Sessions per held-out task in each round.
    #[serde(default = "default_one")]
    #[schemars(range(min = 1, max = 64))]
    pub samples: i32,
}

fn default_every_steps() -> i32 {
    5
}

/// `train.fidelityCheck`.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FidelityCheckSpec {
    /// `Fail` (default): beyond `maxMismatch` the run stops before any session, saying so in
    /// one line; `Warn`: the line is logged and the run goes on; `Off`: no check (quoted in
    /// YAML, `"Off"`: kubectl reads a bare `Off` as `false`, which the schema refuses).
    #[serde(default)]
    pub action: FidelityAction,
    /// Mean absolute difference per sampled token between the trainer's log-probs and vLLM's,
    /// in nats (the step's `logprobMismatch`, and its alert's threshold).
    #[serde(default = "default_max_mismatch")]
    #[schemars(range(min = 0.0, max = 100.0))]
    pub max_mismatch: f64,
    /// Completions sampled (each from one of the job's first tasks' instructions).
    #[serde(default = "default_fidelity_samples")]
    #[schemars(range(min = 1, max = 16))]
    pub samples: i32,
}

impl Default for FidelityCheckSpec {
    fn default() -> Self {
        Self {
            action: FidelityAction::default(),
            max_mismatch: default_max_mismatch(),
            samples: default_fidelity_samples(),
        }
    }
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum FidelityAction {
    #[default]
    Fail,
    Warn,
    Off,
}

fn default_max_mismatch() -> f64 {
    0.05
}

fn default_fidelity_samples() -> i32 {
    4
}

/// `train.lora`: the adapter.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LoraSpec {
    /// The adapter's rank (vLLM serves up to 512).
    #[serde(default = "default_lora_rank")]
    #[schemars(range(min = 1, max = 512))]
    pub rank: i32,
    /// LoRA's scale numerator (the update is scaled by alpha / rank). Unset: 2 × rank.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 100000.0))]
    pub alpha: Option<f64>,
    /// The modules that get an adapter, by their own name in the model. Unset: every
    /// projection of attention and MLP (`q_proj`, `k_proj`, `v_proj`, `o_proj`, `gate_proj`,
    /// `up_proj`, `down_proj`). A name the model lacks is refused before the trainer loads it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub target_modules: Vec<String>,
    /// The final checkpoint holds the merged model (servable as the next job's model, with
    /// the adapter beside it in `adapter/`); false: the adapter alone.
    #[serde(default = "default_true")]
    pub merge_final: bool,
}

fn default_lora_rank() -> i32 {
    16
}

fn default_true() -> bool {
    true
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum MemoryPlanMode {
    /// A step that cannot fit is refused before the model loads.
    #[default]
    Enforce,
    /// The refusal is logged and the trainer starts anyway.
    Warn,
}

fn default_one() -> i32 {
    1
}

/// What a trainer says of itself (`GET /v1/status`), as far as starting sessions goes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrainerState {
    /// The policy version the job's vLLM serves.
    pub policy_version: u64,
    /// No step in progress and no group partly arrived: only ready groups can make the next
    /// step, and only once there are a step's worth of them ([`StalenessGate::may_start`]).
    pub idle: bool,
    /// Groups complete and waiting for a step.
    pub ready_groups: u64,
    /// Groups gone for good: trained, or dropped whole (every sample scored alike, or too few).
    pub groups_done: u64,
}

impl TrainerState {
    pub fn from_status(status: &serde_json::Value) -> Self {
        Self {
            policy_version: status["policyVersion"].as_u64().unwrap_or(0),
            idle: status["pendingGroups"].as_u64() == Some(0)
                && status["training"].as_bool() == Some(false),
            ready_groups: status["readyGroups"].as_u64().unwrap_or(u64::MAX),
            groups_done: status["groupsDone"].as_u64().unwrap_or(0),
        }
    }
}

/// When a train job's sessions may start, in `floe run` and on the cluster alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StalenessGate {
    /// Sessions per optimizer step: `numSamples × groupsPerStep` (sessions are numbered
    /// task-major, so these are the step's whole groups).
    pub batch_size: u64,
    /// Groups one optimizer step takes (`grpo.groupsPerStep`).
    pub groups_per_step: u64,
    pub max_staleness: u64,
    pub trainer: TrainerState,
}

impl StalenessGate {
    pub fn new(train: &TrainSpec, samples: u32, trainer: TrainerState) -> Self {
        let groups = u64::try_from(train.grpo.groups_per_step)
            .unwrap_or(1)
            .max(1);
        Self {
            batch_size: u64::from(samples.max(1)) * groups,
            groups_per_step: groups,
            max_staleness: u64::try_from(train.max_staleness).unwrap_or(0),
            trainer,
        }
    }

    /// May the session at `index` start now, with `running` sessions running? Its batch —
    /// the groups one step trains on — may run at most `maxStaleness` policy versions ahead of
    /// the trainer, or its completions would be dropped as stale when trained; a trainer that
    /// cannot step while no session runs never holds sessions back: groups dropped for zero
    /// advantage make no step, so with fewer than a step's groups ready no version would come
    /// (with binary rewards, a group where every sample fails is common, and waiting for a
    /// version stalled the job for good).
    pub fn may_start(&self, index: u64, running: u64) -> bool {
        self.in_reach(index) || (running == 0 && self.trainer_cannot_step())
    }

    fn trainer_cannot_step(&self) -> bool {
        self.trainer.idle && self.trainer.ready_groups < self.groups_per_step
    }

    /// Is the session at `index` within `maxStaleness` versions of the trainer's policy?
    /// Its batch is, or its group is among the `maxStaleness + 1` steps' worth of groups after
    /// those the trainer is done with: a dropped group makes no step, and the groups after it
    /// then join the step the current policy's samples go to. (When it is not, only an idle
    /// trainer lets it start: a caller whose trainer state may predate a session that just
    /// ended reads it again before relying on that.)
    pub fn in_reach(&self, index: u64) -> bool {
        let batch = index / self.batch_size.max(1);
        let groups = self.groups_per_step.max(1);
        let group = index / (self.batch_size / groups).max(1);
        let open = (self.max_staleness + 1).saturating_mul(groups);
        self.trainer.policy_version + self.max_staleness >= batch
            || group < self.trainer.groups_done.saturating_add(open)
    }
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
    /// Dual clip (Ye et al. 2020; verl's `clip_ratio_c`): a token with a negative advantage
    /// costs at most `dualClip` × |advantage| (times its importance weight), however far the
    /// PPO ratio has moved. The clip (`epsilonLow`/`epsilonHigh`) leaves that side unbounded,
    /// so one token the policy has made many times likelier since the step began could drive a
    /// whole update. Acts only from the second update of a step on (with one update the ratio
    /// is 1). Must be above 1 (the rule refuses 1 itself).
    #[serde(default = "default_dual_clip")]
    #[schemars(range(min = 1.0, max = 100.0))]
    pub dual_clip: f64,
    /// Cap of the truncated importance-sampling ratio against the behaviour logprobs.
    #[serde(default = "default_tis_cap")]
    #[schemars(range(min = 1.0, max = 100.0))]
    pub tis_cap: f64,
    /// KL penalty to the reference model, the policy the job started from (0 = off, no
    /// reference model loaded; with `train.lora` the reference is the policy with its adapter
    /// off, never a second copy).
    #[serde(default)]
    #[schemars(range(min = 0.0, max = 10.0))]
    pub kl_coef: f64,
    /// How token losses are averaged: `TokenMean`, `SequenceMean` or `TokenSumNorm`.
    #[serde(default)]
    pub loss_aggregation: LossAggregation,
    /// Sessions with a call cut at its token cap (`sampling.maxResponseTokens`, or the
    /// harness's own if lower; not a short answer the harness asked for, under 1,024 tokens):
    /// `Train` them like any other, or `Mask` their loss (DAPO's overlong filtering): their
    /// reward stays in their group's baseline, their tokens train nothing, and a group of such
    /// sessions only is dropped (`overlong`).
    #[serde(default)]
    pub overlong: OverlongSessions,
    /// DAPO's soft overlong punishment: a session whose longest call (calls with a short cap
    /// the harness asked for aside) sampled into the last `bufferTokens` before
    /// `sampling.maxResponseTokens` has its reward lowered, for its advantage only, by
    /// `factor` × how far into that buffer it went (a call cut at the cap: `factor`). Its
    /// evaluation, pass rate and reward curves keep the reward it earned. Unset: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlong_penalty: Option<OverlongPenalty>,
    /// Groups (tasks) per optimizer step.
    #[serde(default = "default_groups_per_step")]
    #[schemars(range(min = 1, max = 4096))]
    pub groups_per_step: i32,
    /// Sequences per forward/backward pass (gradient accumulation covers the rest).
    #[serde(default = "default_micro_batch")]
    #[schemars(range(min = 1, max = 4096))]
    pub micro_batch_size: i32,
    /// At most this many tokens (traces × the longest one's length, padding included; in
    /// shared rows, the tokens the rows hold) in a forward/backward pass: short traces are
    /// gathered up to `microBatchSize` a pass, a long one goes alone. Traces are sorted by
    /// length within a mini-batch first (like lengths share a pass and pad least), or, where
    /// the trainer's prompt sharing is cheaper, by their tokens (traces that begin alike share
    /// a row). Unset: every pass holds `microBatchSize` traces. The memory plan is made for
    /// this many tokens (or one trace of vLLM's context length, if longer) instead of
    /// `microBatchSize` traces of the whole context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_tokens_per_micro_batch: Option<i64>,
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
            dual_clip: default_dual_clip(),
            tis_cap: default_tis_cap(),
            kl_coef: 0.0,
            loss_aggregation: LossAggregation::default(),
            overlong: OverlongSessions::default(),
            overlong_penalty: None,
            groups_per_step: default_groups_per_step(),
            micro_batch_size: default_micro_batch(),
            max_tokens_per_micro_batch: None,
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
fn default_dual_clip() -> f64 {
    3.0
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
    /// Mean over all trainable tokens of the mini-batch (DAPO).
    #[default]
    TokenMean,
    /// Mean over each trajectory's tokens (all its traces), then over trajectories (GRPO).
    SequenceMean,
    /// Sum over tokens divided by trajectories × `sampling.maxResponseTokens` (Dr. GRPO).
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
pub enum OverlongSessions {
    /// Trained like any other session: a response the cap cut off is a sample of the policy's,
    /// and its reward says what running over cost.
    #[default]
    Train,
    /// Kept out of the loss (DAPO's overlong filtering, TRL's `mask_truncated_completions`):
    /// a reward the cap decided is noise about the response itself.
    Mask,
}

/// `grpo.overlongPenalty` (DAPO, "soft overlong punishment"; verl's `overlong_buffer`).
#[derive(Clone, Copy, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct OverlongPenalty {
    /// The buffer before `sampling.maxResponseTokens` where the penalty grows from 0 to
    /// `factor` (DAPO's L_cache; at most `maxResponseTokens`).
    #[schemars(range(min = 1, max = 1048576))]
    pub buffer_tokens: i32,
    /// The penalty of a call that reached the cap.
    #[serde(default = "default_penalty_factor")]
    #[schemars(range(min = 0.0, max = 100.0))]
    pub factor: f64,
}

fn default_penalty_factor() -> f64 {
    1.0
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

#[cfg(test)]
mod staleness_tests {
    use super::*;

    fn gate(version: u64, max_staleness: u64, idle: bool) -> StalenessGate {
        // 2 samples, 2 groups per step: sessions 0-3 are batch 0, 4-7 batch 1, 8-11 batch 2.
        StalenessGate {
            batch_size: 4,
            groups_per_step: 2,
            max_staleness,
            trainer: TrainerState {
                policy_version: version,
                idle,
                ready_groups: 0,
                groups_done: 0,
            },
        }
    }

    #[test]
    fn a_batch_waits_until_the_trainer_is_within_max_staleness() {
        assert!(gate(0, 0, false).may_start(3, 4));
        assert!(!gate(0, 0, false).may_start(4, 4));
        assert!(gate(1, 0, false).may_start(4, 4));
        assert!(gate(1, 1, false).may_start(8, 4));
        assert!(!gate(1, 0, false).may_start(8, 4));
    }

    #[test]
    fn an_idle_trainer_never_holds_sessions_back() {
        assert!(gate(0, 0, true).may_start(8, 0));
        assert!(
            !gate(0, 0, true).may_start(8, 1),
            "a running session may still complete a group"
        );
        assert!(
            !gate(0, 0, false).may_start(8, 0),
            "a step in progress will move the version"
        );
        assert!(
            !gate(0, 0, true).in_reach(8),
            "what only idleness lets start is not in reach"
        );
    }

    #[test]
    fn a_trainer_with_fewer_ready_groups_than_a_step_takes_never_holds_sessions_back() {
        // Batch 0 ended with one group trainable and one dropped (every sample scored 0): the
        // trainer holds 1 of the 2 groups a step takes, and no version is coming.
        let mut g = gate(0, 0, true);
        g.trainer.ready_groups = 1;
        assert!(g.may_start(4, 0), "batch 1 completes the step");
        assert!(
            !g.may_start(4, 1),
            "a running session may still complete a group"
        );
        g.trainer.ready_groups = 2;
        assert!(
            !g.may_start(4, 0),
            "a step's worth ready: its version is coming"
        );
    }

    #[test]
    fn groups_the_trainer_dropped_open_the_next_ones_while_sessions_run() {
        // 2 samples a group, 2 groups a step. Groups 0 and 1 ended; group 0 was dropped (all
        // scored 0), group 1 waits as ready: group 2 (sessions 4, 5) may run, all at once,
        // and join group 1 in the step policy version 0's samples go to; group 3 may not.
        let mut g = gate(0, 0, false);
        g.trainer.groups_done = 1;
        g.trainer.ready_groups = 1;
        assert!(g.in_reach(4) && g.in_reach(5) && g.may_start(5, 1));
        assert!(
            !g.in_reach(6),
            "group 3 would be trained a version after it was sampled"
        );
        g.max_staleness = 1;
        assert!(
            g.in_reach(9) && !g.in_reach(10),
            "one more step's worth of groups"
        );
    }

    #[test]
    fn the_gate_reads_the_spec_and_the_trainers_status() {
        let train: TrainSpec = serde_json::from_value(serde_json::json!({
            "image": "t", "model": "m", "maxStaleness": 2, "grpo": {"groupsPerStep": 3}}))
        .expect("train spec");
        let status = serde_json::json!({"policyVersion": 5, "pendingGroups": 0,
                                        "readyGroups": 0, "training": false});
        let g = StalenessGate::new(&train, 4, TrainerState::from_status(&status));
        assert_eq!(g.batch_size, 12);
        assert_eq!(g.groups_per_step, 3);
        assert_eq!(g.max_staleness, 2);
        assert_eq!(
            g.trainer,
            TrainerState {
                policy_version: 5,
                idle: true,
                ready_groups: 0,
                groups_done: 0
            }
        );
        let busy =
            TrainerState::from_status(&serde_json::json!({"policyVersion": 1, "training": true}));
        assert!(!busy.idle);
    }
}
