//! Types shared by both resources: the sandbox pod template and prepare steps.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, EnvFromSource, EnvVar, LocalObjectReference, ResourceRequirements, SecurityContext,
    Toleration, Volume, VolumeMount,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What every sandbox pod runs: the harness image plus the pod-level settings a platform team
/// controls. Two containers: the `agent` (the harness image, the harness under `floe agent`)
/// and the `sandbox` grader (`floe sandbox` runs the prepare steps and the evaluator, in
/// `graderImage`, by default the harness image too). The operator adds floe's init container
/// (copies the `floe` binary) and the gateway sidecar; the images are never modified.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SandboxTemplate {
    /// Labels and annotations added to every sandbox pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateMetadata>,
    /// The harness image (it must contain the harness CLI, e.g. `codex` or `claude`, and bash
    /// for Claude Code, Qwen Code and Gemini CLI, whose shell tools run it).
    #[schemars(length(min = 1, max = 1024))]
    pub image: String,
    /// Image of the grader container, where the workspace is set up, the pool's prepare steps
    /// run and the evaluator runs (default: `image`). A job whose `evaluator.image` is set runs
    /// only on a pool whose grader image is that image. Any libc: the `floe` image's binary,
    /// copied in, is static (a `floe` built for glibc, as the tests build it, needs glibc and
    /// `libgcc_s` here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub grader_image: Option<String>,
    /// Image pull policy of the harness and grader containers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<ImagePullPolicy>,
    /// Secrets for pulling the harness image from a private registry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[schemars(schema_with = "crate::schema::k8s::<Vec<LocalObjectReference>>")]
    pub image_pull_secrets: Vec<LocalObjectReference>,
    /// Working directory of the harness; the task workspace is created here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    pub working_dir: Option<String>,
    /// Resources of the harness (`agent`) container. The grader gets the same CPU and memory
    /// limits with requests of 10m CPU and 32Mi memory; the gateway sidecar has its own (see
    /// `gateway`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::k8s::<Option<ResourceRequirements>>")]
    pub resources: Option<ResourceRequirements>,
    /// Environment of the agent and grader containers (floe adds the provider base URLs and the
    /// session token to the harness).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    #[schemars(schema_with = "crate::schema::k8s::<Vec<EnvVar>>")]
    pub env: Vec<EnvVar>,
    /// Environment from ConfigMaps or Secrets.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    #[schemars(schema_with = "crate::schema::k8s::<Vec<EnvFromSource>>")]
    pub env_from: Vec<EnvFromSource>,
    /// Pod volumes (floe adds its own emptyDir for the `floe` binary and the workspace).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[schemars(schema_with = "crate::schema::k8s::<Vec<Volume>>")]
    pub volumes: Vec<Volume>,
    /// Mounts of the agent and grader containers (both: mount read-only what the evaluator
    /// reads, or the agent can change it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[schemars(schema_with = "crate::schema::k8s::<Vec<VolumeMount>>")]
    pub volume_mounts: Vec<VolumeMount>,
    /// Nodes the sandbox pods may run on.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Taints the sandbox pods tolerate (e.g. a dedicated sandbox node pool).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[schemars(schema_with = "crate::schema::k8s::<Vec<Toleration>>")]
    pub tolerations: Vec<Toleration>,
    /// Scheduling affinity of the sandbox pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::k8s::<Option<Affinity>>")]
    pub affinity: Option<Affinity>,
    /// e.g. `gvisor` or `kata` for stronger isolation of untrusted agent code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub runtime_class_name: Option<String>,
    /// PriorityClass of the sandbox pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub priority_class_name: Option<String>,
    /// Service account of the sandbox pod; its token is never mounted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub service_account_name: Option<String>,
    /// Security context of the agent and grader containers. When unset, floe applies the restricted
    /// profile (uid and gid 1000, non-root, no privilege escalation, all capabilities dropped,
    /// the runtime's seccomp profile). When set, the grader runs with it as given and the agent
    /// with it less any capability and privilege escalation; one that would run the agent as
    /// root (`runAsUser: 0`, `runAsNonRoot: false`) is refused: root could rewrite the pod's
    /// shared `/etc/hosts`, by which its gateway finds the trainer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::k8s::<Option<SecurityContext>>")]
    pub security_context: Option<SecurityContext>,
    /// Disk the agent's workspace and harness home may fill together: bytes, or with `Ki`,
    /// `Mi`, `Gi`, `Ti` (default `8Gi`; `"0"`: none). The grader measures it every 2 s while
    /// the harness runs, with the files the agent's processes deleted but keep open on any
    /// file system on disk (counted in the agent container by its supervisor: no walk, nor the
    /// kubelet's measure, sees them); past it the harness is stopped and the session scores
    /// the job's `failureReward` (`disk_limit`), as `floe run --session-disk` does. Both
    /// volumes also get four times
    /// this as their emptyDir `sizeLimit`, and the agent container as its `ephemeral-storage`
    /// limit (what it writes to its own layer, `/tmp`; unless `resources` sets one): backstops
    /// the kubelet enforces by evicting the pod, which fails the session without a retry (the
    /// agent's doing, nothing to score).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 24), regex(pattern = r"^[0-9]+(Ki|Mi|Gi|Ti)?$"))]
    pub disk_budget: Option<String>,
    /// Whether a volume that outlives the pod (a PersistentVolumeClaim, hostPath, NFS, CSI…)
    /// may be mounted writable: `Refuse` (default: the pool or job stalls with
    /// `InvalidSpec`) or `Allow`. Every session of the pool shares such a volume, so a
    /// writable one is a channel between them: an agent could leave its answer there for a
    /// later sample of its task, and the code the evaluator runs, with the hidden tests in
    /// place, could copy them there for the next agent. Mount shared caches `readOnly: true`.
    #[serde(default, skip_serializing_if = "SharedWritableVolumes::is_default")]
    pub shared_writable_volumes: SharedWritableVolumes,
}

/// [`SandboxTemplate::shared_writable_volumes`].
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum SharedWritableVolumes {
    #[default]
    Refuse,
    Allow,
}

impl SharedWritableVolumes {
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// [`SandboxTemplate::disk_budget`] when unset.
pub const DEFAULT_DISK_BUDGET: &str = "8Gi";

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TemplateMetadata {
    /// Labels added to the pod.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations added to the pod.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum ImagePullPolicy {
    Always,
    IfNotPresent,
    Never,
}

/// A command run in the sandbox before it counts as READY (pool) or before the harness starts
/// (task), e.g. cloning a repository or installing dependencies. Retried on failure.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PrepareStep {
    /// Shown in logs, Events and the session result.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// Argument vector; use `["sh", "-c", "..."]` for a shell script.
    #[schemars(length(min = 1, max = 256))]
    pub command: Vec<String>,
    /// Limit of one attempt.
    #[serde(default = "default_prepare_timeout")]
    #[schemars(range(min = 1, max = 86400))]
    pub timeout_seconds: i32,
    /// Extra attempts after the first failure.
    #[serde(default = "default_prepare_retries")]
    #[schemars(range(min = 0, max = 10))]
    pub retries: i32,
}

fn default_prepare_timeout() -> i32 {
    300
}
fn default_prepare_retries() -> i32 {
    2
}

/// The model API a harness speaks to the gateway.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum ProviderApi {
    /// Anthropic Messages (`/v1/messages`).
    Anthropic,
    /// OpenAI Chat Completions (`/v1/chat/completions`).
    OpenaiChat,
    /// OpenAI Responses (`/v1/responses`).
    OpenaiResponses,
    /// Gemini (`/v1beta/models/{model}:generateContent`).
    Gemini,
}

/// Where a sandbox's gateway sends normalized model calls.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct UpstreamSpec {
    /// Base URL of an OpenAI-compatible server, e.g. `http://policy-vllm:8000`.
    #[schemars(length(min = 1, max = 2048))]
    pub url: String,
    /// Server type, which decides how token ids are requested.
    #[serde(default)]
    pub kind: UpstreamKind,
    /// Model name sent upstream (vLLM's `--served-model-name`; unset: `policy`), whatever name
    /// the harness asks for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub model: Option<String>,
    /// Secret (same namespace) holding the model server's API key. Only the gateway has it and
    /// sends it as `Authorization: Bearer`; the agent shares the pod's network but never the
    /// key, so a server that demands it cannot be called past the gateway's capture.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_secret: Option<SecretKeyRef>,
}

/// The inference server behind the gateway; decides how token ids are requested.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum UpstreamKind {
    #[default]
    #[serde(rename = "vLLM")]
    Vllm,
    #[serde(rename = "SGLang")]
    Sglang,
}

/// One key of a Secret in the resource's namespace.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// The Secret's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The key within it.
    #[serde(default = "default_api_key_key")]
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

fn default_api_key_key() -> String {
    "apiKey".into()
}
