//! Where a job's tasks come from and what one task is.

use std::collections::BTreeMap;

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::PrepareStep;

/// Where the tasks come from: exactly one of `inline`, `configMap` or `file`.
#[derive(KubeSchema, Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[x_kube(
    validation = kube::core::Rule::new(
        "(has(self.inline) ? 1 : 0) + (has(self.configMap) ? 1 : 0) + (has(self.file) ? 1 : 0) == 1"
    ).message("exactly one of tasks.inline, tasks.configMap or tasks.file must be set"),
    validation = kube::core::Rule::new("!has(self.swebench) || !has(self.inline)")
        .message("tasks.swebench reads SWE-bench instances from tasks.file or tasks.configMap; inline tasks are floe tasks")
)]
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
    /// The file or ConfigMap holds SWE-bench instances (one JSON object per line, as the
    /// `swebench` package's datasets write them), not floe tasks: each becomes a task whose
    /// workspace is the instance's repository at `base_commit` and whose grader is SWE-bench's
    /// own (`evaluator.reward.source: SWEBench`). See docs/swebench.md.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swebench: Option<SweBenchTasks>,
}

/// How SWE-bench instances become tasks.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SweBenchTasks {
    /// Image of an instance whose line names none (`image`). `{id}` is the instance id as the
    /// public images spell it (lower case, `__` written `_1776_`), `{instance_id}` as written.
    #[serde(default = "default_swebench_image")]
    #[schemars(length(min = 1, max = 1024))]
    pub image: String,
    /// Where the image holds the repository at `base_commit` (absolute); the instances' eval
    /// scripts run there.
    #[serde(default = "default_repository_directory")]
    #[schemars(length(min = 2, max = 4096), regex(pattern = r"^/.*[^/]$"))]
    pub repository_directory: String,
    /// Local mode (`floe run`): where each instance's repository is a git checkout, relative to
    /// the job file; `{repo}` is the instance's `owner/name`, `{name}` the name alone.
    #[serde(default = "default_local_checkouts")]
    #[schemars(length(min = 1, max = 4096))]
    pub local_checkouts: String,
    /// Pods: the image of the grading sidecar, which has the `swebench` package and a `python3`
    /// (an instance's image has neither); `deploy/swebench-grader/Dockerfile` builds it.
    #[serde(default = "default_grader_image")]
    #[schemars(length(min = 1, max = 1024))]
    pub grader_image: String,
    /// The instruction each instance's sessions get, with `{problem_statement}` (required),
    /// `{repo}`, `{instance_id}` and `{hints_text}` (the issue's comments, which most RL setups
    /// leave out) replaced. Default: the problem statement alone, verbatim. Agent scaffolds
    /// frame it, e.g. `"Resolve this issue in the repository in your working directory; the
    /// tests that check it are hidden.\n\n{problem_statement}"`.
    #[serde(default = "default_swebench_instruction")]
    #[schemars(length(min = 1, max = 65536))]
    pub instruction: String,
}

impl Default for SweBenchTasks {
    fn default() -> Self {
        Self {
            image: default_swebench_image(),
            repository_directory: default_repository_directory(),
            local_checkouts: default_local_checkouts(),
            grader_image: default_grader_image(),
            instruction: default_swebench_instruction(),
        }
    }
}

fn default_swebench_instruction() -> String {
    "{problem_statement}".to_string()
}
fn default_swebench_image() -> String {
    "swebench/sweb.eval.x86_64.{id}:latest".to_string()
}
fn default_repository_directory() -> String {
    "/testbed".to_string()
}
fn default_grader_image() -> String {
    "ghcr.io/floe-dev/swebench-grader:5.0.2".to_string()
}
fn default_local_checkouts() -> String {
    "repos/{repo}".to_string()
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
    /// Path of the JSONL file inside the claim (in local mode, where `claimName` is ignored:
    /// relative to the job file).
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
    /// The workspace starts as this git repository's tree at one commit (before `files` and
    /// `prepare`), with no history beyond that commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repository: Option<TaskRepository>,
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
    /// Workspace paths (globs) of this task whose changes by the agent are discarded before the
    /// evaluator runs, added to `evaluator.protectedPaths` and read as they are (a path with no
    /// wildcard protects what is in it too; absolute or `..` patterns are refused).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4096))]
    #[schemars(inner(length(min = 1, max = 4096)))]
    pub protected_paths: Vec<String>,
    /// `TestOutput`: the skips this task's tests have on a correct solution (platform-dependent
    /// ones), instead of `evaluator.reward.allowedSkips`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_skips: Option<u32>,
    /// What SWE-bench's grading needs (`evaluator.reward.source: SWEBench`); filled from an
    /// instance by `tasks.swebench`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swebench: Option<SweBenchGrading>,
}

/// A git repository's tree at one commit.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TaskRepository {
    /// The repository's directory: in the sandbox image on a cluster, relative to the job file
    /// in local mode.
    #[schemars(length(min = 1, max = 4096))]
    pub path: String,
    /// The commit (a hash or a ref the repository has).
    #[schemars(length(min = 1, max = 256), regex(pattern = r"^[^-\s][^\s]*$"))]
    pub commit: String,
}

/// One SWE-bench instance's grading: the instance's own test lists and log parser, read by the
/// `swebench` package.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SweBenchGrading {
    /// The instance's id, as swebench's report names it.
    #[schemars(length(min = 1, max = 256))]
    pub instance_id: String,
    /// `owner/name`.
    #[schemars(length(min = 1, max = 256))]
    pub repo: String,
    /// The instance's `version` (the environment it was validated in; may be empty).
    #[schemars(length(max = 64))]
    pub version: String,
    /// A parser of `swebench`'s registry (e.g. `parse_log_pytest`).
    #[schemars(length(min = 1, max = 128))]
    pub log_parser: String,
    /// `pass_and_fail` (default) or `fail_only`.
    #[serde(default = "default_eval_type")]
    #[schemars(length(min = 1, max = 64))]
    pub eval_type: String,
    /// Tests the fix must make pass.
    pub fail_to_pass: Vec<String>,
    /// Tests that must still pass (may be empty).
    pub pass_to_pass: Vec<String>,
    /// The patch adding the instance's tests: floe checks it applies to the untouched
    /// repository, which tells a broken instance (infrastructure) from a failed one.
    #[schemars(length(min = 1))]
    pub test_patch: String,
    /// Where the eval script expects the repository (`tasks.swebench.repositoryDirectory`); a
    /// local evaluation copy elsewhere has the script's paths moved to it.
    #[schemars(length(min = 1, max = 4096))]
    pub repository_directory: String,
}

fn default_eval_type() -> String {
    "pass_and_fail".to_string()
}
