//! `GatewayPool`: a warm pool of single-use sandbox pods for one harness image.
// Each `printcolumn(...)` in the kube derive repeats `type_ = ...`; that is the API, not a mistake.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{PrepareStep, SandboxTemplate, UpstreamSpec};

/// Keeps `replicas` sandbox pods READY (gateway healthy, prepare steps done) so that a
/// RolloutJob can claim one in milliseconds instead of waiting for a cold pod start.
#[derive(CustomResource, Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[kube(
    group = "floe.dev",
    version = "v1alpha1",
    kind = "GatewayPool",
    namespaced,
    shortname = "gp",
    category = "floe",
    status = "GatewayPoolStatus",
    cel,
    doc = "A warm pool of READY sandbox pods with the floe gateway injected.",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.readyReplicas"),
    printcolumn(name = "Desired", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(
        name = "Claimed",
        type_ = "integer",
        json_path = ".status.claimedReplicas"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type=="Ready")].reason"#
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct GatewayPoolSpec {
    /// How many READY (unclaimed) pods to keep. Driven by `kubectl scale`, HPA or KEDA.
    #[schemars(range(min = 0, max = 10000))]
    pub replicas: i32,
    /// The sandbox pod every replica is made from.
    pub template: SandboxTemplate,
    /// Commands run in each new pod before it counts as READY (clone, install, warm caches).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub prepare: Vec<PrepareStep>,
    /// The gateway sidecar.
    #[serde(default)]
    pub gateway: GatewaySettings,
    /// How READY pods are replaced when the template changes.
    #[serde(default)]
    pub update_strategy: PoolUpdateStrategy,
    /// Limits on how fast the pool creates pods.
    #[serde(default)]
    pub refill: RefillPolicy,
    /// Where the pods may connect: the agent is untrusted code and shares the pod's network
    /// with the gateway.
    #[serde(default, skip_serializing_if = "EgressSpec::is_default")]
    pub egress: EgressSpec,
}

/// The sandbox pods' egress: a NetworkPolicy the operator keeps, and a check each pod makes at
/// start that it is enforced.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EgressSpec {
    /// `Managed` (default): the operator keeps a NetworkPolicy `<pool>-egress`, owned by the
    /// pool, that lets its pods reach only TCP/UDP 53 on the cluster's DNS pods (`dns`) and
    /// `allow`; each job keeps one, `<job>-job-egress`, that adds TCP 8000 and 8100 of its own
    /// trainer or dataset collector to the pods running its sessions. `Unmanaged`: neither;
    /// the cluster's own policies apply.
    #[serde(default)]
    pub policy: EgressPolicy,
    /// More egress rules for that NetworkPolicy: a teacher or vLLM elsewhere, an API the task
    /// needs. Everything else is refused where the cluster's CNI enforces NetworkPolicy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[schemars(
        schema_with = "crate::schema::k8s::<Vec<k8s_openapi::api::networking::v1::NetworkPolicyEgressRule>>"
    )]
    pub allow: Vec<k8s_openapi::api::networking::v1::NetworkPolicyEgressRule>,
    /// Where the pods may resolve names (TCP and UDP 53). Default: the pods labelled
    /// `k8s-app: kube-dns` in namespace `kube-system` (CoreDNS and kube-dns both carry it).
    /// Set it for a DNS elsewhere, e.g. a NodeLocal DNSCache (`ipBlock: {cidr:
    /// 169.254.20.10/32}`); `[]` allows no DNS at all. Port 53 anywhere else is refused: a
    /// resolver on the internet is a way out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    #[schemars(
        schema_with = "crate::schema::k8s::<Option<Vec<k8s_openapi::api::networking::v1::NetworkPolicyPeer>>>"
    )]
    pub dns: Option<Vec<k8s_openapi::api::networking::v1::NetworkPolicyPeer>>,
    /// What a pod does when its grader reaches the Kubernetes API at start, which no sandbox
    /// egress rule allows (the CNI does not enforce NetworkPolicy, or `allow` opens it):
    /// `Warn` (default: it logs, counts `floe_gateway_egress_unrestricted` and serves) or
    /// `Refuse` (it ends before READY, and the pool says why).
    #[serde(default)]
    pub unrestricted: UnrestrictedEgress,
}

impl EgressSpec {
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum EgressPolicy {
    #[default]
    Managed,
    Unmanaged,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum UnrestrictedEgress {
    #[default]
    Warn,
    Refuse,
}

/// The gateway sidecar injected into every sandbox pod.
#[derive(KubeSchema, Clone, Debug, Deserialize, Serialize, PartialEq)]
#[x_kube(validation = kube::core::Rule::new("self.port != self.controlPort")
    .message("gateway.port and gateway.controlPort must differ"))]
#[x_kube(validation = kube::core::Rule::new("self.port != 8379 && self.controlPort != 8379")
    .message("port 8379 is the sandbox pod's agent link: gateway.port and gateway.controlPort must not use it"))]
#[serde(rename_all = "camelCase")]
pub struct GatewaySettings {
    /// Loopback port the harness calls (its provider base URL points here).
    #[serde(default = "default_gateway_port")]
    #[schemars(range(min = 1024, max = 65535))]
    pub port: i32,
    /// Port of the control API the operator delivers assignments to.
    #[serde(default = "default_control_port")]
    #[schemars(range(min = 1024, max = 65535))]
    pub control_port: i32,
    /// Model server used when a job brings none (a job in `train` mode always uses its trainer's vLLM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<UpstreamSpec>,
    /// Largest request body the gateway accepts, in bytes.
    #[serde(default = "default_max_body_bytes")]
    #[schemars(range(min = 1024, max = 1073741824))]
    pub max_body_bytes: i64,
    /// Resources of the gateway sidecar container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::k8s::<Option<ResourceRequirements>>")]
    pub resources: Option<ResourceRequirements>,
}

impl Default for GatewaySettings {
    fn default() -> Self {
        Self {
            port: default_gateway_port(),
            control_port: default_control_port(),
            upstream: None,
            max_body_bytes: default_max_body_bytes(),
            resources: None,
        }
    }
}

fn default_gateway_port() -> i32 {
    8370
}
fn default_control_port() -> i32 {
    8371
}
fn default_max_body_bytes() -> i64 {
    32 * 1024 * 1024
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
pub struct PoolUpdateStrategy {
    /// `OnReplenish` (default) or `Recreate`.
    #[serde(default, rename = "type")]
    pub type_: PoolUpdateStrategyType,
}

/// What happens to READY pods when the template changes.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum PoolUpdateStrategyType {
    /// Stale pods stay usable; each is replaced by a current one when claimed or deleted.
    #[default]
    OnReplenish,
    /// Stale unclaimed pods are deleted and recreated at once (claimed pods finish their session).
    Recreate,
}

/// Limits on how fast the pool creates pods, so a large claim burst cannot stampede the apiserver
/// or the image registry.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RefillPolicy {
    /// Most pods created in one reconcile.
    #[serde(default = "default_batch_size")]
    #[schemars(range(min = 1, max = 1000))]
    pub batch_size: i32,
    /// Most pods created per minute.
    #[serde(default = "default_max_per_minute")]
    #[schemars(range(min = 1, max = 100000))]
    pub max_pods_per_minute: i32,
    /// A pod not READY this long after creation is replaced.
    #[serde(default = "default_unready_timeout")]
    #[schemars(range(min = 10, max = 86400))]
    pub unready_timeout_seconds: i32,
}

impl Default for RefillPolicy {
    fn default() -> Self {
        Self {
            batch_size: default_batch_size(),
            max_pods_per_minute: default_max_per_minute(),
            unready_timeout_seconds: default_unready_timeout(),
        }
    }
}

fn default_batch_size() -> i32 {
    10
}
fn default_max_per_minute() -> i32 {
    120
}
fn default_unready_timeout() -> i32 {
    600
}

/// Observed state of the pool.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GatewayPoolStatus {
    /// Unclaimed pods (warming + READY); the scale subresource's status replicas.
    #[serde(default)]
    pub replicas: i32,
    /// Unclaimed pods whose gateway is healthy and prepare steps are done.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Pods claimed by a RolloutJob and not finished yet.
    #[serde(default)]
    pub claimed_replicas: i32,
    /// Label selector of the pool's unclaimed pods, for the scale subresource (HPA/KEDA).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// Hash of the current template; pods with another hash are stale.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_hash: Option<String>,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready` (all desired replicas READY), and kstatus `Reconciling` (pods warming) and
    /// `Stalled` (pods cannot become READY as the template stands; or the spec cannot run as
    /// written, reason InvalidSpec or CrdOutdated, and then no pod is made and `Reconciling`
    /// is false; Argo CD and Flux show the pool Degraded), each with the reason and the pod's
    /// or the spec's problem.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::k8s::<Vec<Condition>>")]
    pub conditions: Vec<Condition>,
}
