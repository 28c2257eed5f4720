//! The sandbox pod a GatewayPool makes from its template (sans-IO): the harness image twice —
//! once as the agent container (`floe agent` runs the harness and nothing survives it), once as
//! the grader (`floe sandbox`: prepare steps, the assignment, the evaluator) — the `floe`
//! binary copied in by an init container, the gateway as a sidecar, the per-pod control token
//! from a Secret that only the grader and the gateway mount, state in labels. This is the
//! operator's half of `docs/sandbox-contract.md`.

use std::collections::BTreeMap;

use floe_crds::gateway_pool::GatewayPoolSpec;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{json, Value};

use super::names::*;
use super::PodState;

/// `metadata.managedFields` in a merge patch that clears a pod's field-ownership record.
///
/// Why: on every write the apiserver's field manager converts the old and new pod to typed
/// trees and diffs them, and a sandbox pod's record (≈ 4.5 KiB, half the pod) rides along in
/// etcd, every watch event and every cache. An update to an object whose record is empty
/// skips tracking altogether (apimachinery's `skipNonAppliedManager`, in every version since
/// 1.18), so every later write to the pod (the claim, the kubelet's status, the release) costs
/// the apiserver about half (`docs/benchmarks.md`, session 10). These pods are the operator's
/// alone and live minutes; a server-side apply to one starts tracking again. `[{}]`, not `[]`:
/// an empty list means "leave it as it is".
pub fn cleared_managed_fields() -> Value {
    json!([{}])
}

/// The compare-and-swap patch that moves a pod to `to` (the pool's warming → ready mark),
/// clearing its field-ownership record on the way ([`cleared_managed_fields`]).
pub fn state_mark_patch(resource_version: Option<String>, to: PodState) -> Value {
    json!({"metadata": {
        "resourceVersion": resource_version,
        "labels": {STATE_LABEL: to.label()},
        "managedFields": cleared_managed_fields(),
    }})
}

const BIN_DIR: &str = "/floe-bin";
const CONTROL_DIR: &str = "/floe-control";
/// The gateway container's port that its control API listens on: where the operator
/// delivers, read from the pod ([`crate::pods::view::control_port`]).
pub const CONTROL_PORT_NAME: &str = "floe-control";
const STATE_DIR: &str = "/floe-state";
const RUN_DIR: &str = "/floe-run";
const DEFAULT_WORKDIR: &str = "/workspace";
/// The volume the agent and the grader share besides the workspace: the harness's home,
/// instruction and logs.
const AGENT_DIR: &str = "/floe-agent";
/// Loopback port of the grader's agent link; the gateway's ports may not take it.
pub const AGENT_LINK_PORT: i32 = 8379;

pub struct SandboxPod<'a> {
    pub name: &'a str,
    pub namespace: &'a str,
    pub pool: &'a str,
    pub spec: &'a GatewayPoolSpec,
    /// The image with the `floe` binary (the operator's own).
    pub floe_image: &'a str,
    /// The per-pod Secret holding [`CONTROL_TOKEN_KEY`].
    pub secret: &'a str,
    /// Kubernetes ≥ 1.29: the gateway as a native sidecar (an init container that keeps
    /// running and stops after the main container); older: a plain second container.
    pub native_sidecars: bool,
}

/// A fresh per-pod control token (256 random bits, hex).
pub fn new_control_token() -> String {
    use rand::RngExt;
    hex::encode(rand::rng().random::<[u8; 32]>())
}

/// The name of a sandbox pod's control-token Secret.
pub fn control_secret_name(pod: &str) -> String {
    format!("{pod}-control")
}

/// A sandbox pod's control-token Secret ([`control_secret_name`]), owned by the created pod so
/// it goes when the pod goes, labelled with `label`.
pub fn control_secret(
    pod: &Pod,
    label: (&str, &str),
    token: &str,
) -> k8s_openapi::api::core::v1::Secret {
    use kube::{Resource, ResourceExt};
    k8s_openapi::api::core::v1::Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(control_secret_name(&pod.name_any())),
            namespace: pod.namespace(),
            labels: Some(BTreeMap::from([(label.0.to_string(), label.1.to_string())])),
            owner_references: pod.controller_owner_ref(&()).map(|mut o| {
                o.controller = Some(false);
                vec![o]
            }),
            ..Default::default()
        },
        string_data: Some(BTreeMap::from([(
            CONTROL_TOKEN_KEY.to_string(),
            token.to_string(),
        )])),
        ..Default::default()
    }
}

/// Five random lowercase alphanumerics, for pod names (as a ReplicaSet's pods get).
pub fn random_suffix() -> String {
    use rand::RngExt;
    let mut rng = rand::rng();
    (0..5)
        .map(|_| {
            let i = rng.random_range(0..36u8);
            char::from(if i < 10 { b'0' + i } else { b'a' + i - 10 })
        })
        .collect()
}

/// A stable hash of what makes pods of this pool differ (template, prepare steps, gateway):
/// pods with another hash are stale.
pub fn template_hash(spec: &GatewayPoolSpec) -> String {
    let mut material = json!([spec.template, spec.prepare, spec.gateway]);
    // Only when set: pods made before the field existed keep their hash.
    if !spec.egress.is_default() {
        if let Some(parts) = material.as_array_mut() {
            parts.push(json!(spec.egress));
        }
    }
    crate::stable_hash::of_json(&material)
}

/// The user a sandbox container runs as when its template sets no security context: most
/// public images (node, python, debian) declare no numeric non-root `USER`, and the kubelet
/// refuses `runAsNonRoot` without one (`CreateContainerConfigError`). 1000 is the first
/// regular user of Debian-based images (`node` in the node images). A template's own
/// `securityContext` replaces this (`docs/crds.md`).
pub const SANDBOX_UID: i64 = 1000;
/// floe's own containers (the image's `USER`, set here too for a rebuilt image without one).
pub const FLOE_UID: i64 = 65532;

fn restricted(uid: i64) -> Value {
    json!({
        "runAsNonRoot": true, "runAsUser": uid, "runAsGroup": uid, "allowPrivilegeEscalation": false,
        "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"},
    })
}

/// A template's security context for the agent: as given, less any capability and privilege
/// escalation (a setuid or file-capability program, `ping`'s raw sockets among them, could
/// read the gateway's plaintext traffic to the trainer, the job's token in it). Root is
/// refused before a pod is made ([`floe_crds::root_agent`]).
fn without_privileges(context: &Value) -> Value {
    let mut context = context.clone();
    if let Some(fields) = context.as_object_mut() {
        fields.remove("privileged");
        fields.insert("allowPrivilegeEscalation".into(), false.into());
        fields.insert("capabilities".into(), json!({"drop": ["ALL"]}));
    }
    context
}

/// The grader's resources, from the harness container's: the same CPU and memory limits (an
/// evaluator is held to what the harness was), but requests of its own that are small, so a
/// pool's pods do not ask the scheduler for twice the harness's share. Extended resources
/// (GPUs) stay the agent's. `None` when the template limits neither.
fn grader_resources(harness: &k8s_openapi::api::core::v1::ResourceRequirements) -> Option<Value> {
    let limits: BTreeMap<&str, &k8s_openapi::apimachinery::pkg::api::resource::Quantity> = harness
        .limits
        .iter()
        .flatten()
        .filter(|(k, _)| matches!(k.as_str(), "cpu" | "memory"))
        .map(|(k, v)| (k.as_str(), v))
        .collect();
    if limits.is_empty() {
        return None;
    }
    let requests: BTreeMap<&str, &str> = limits
        .keys()
        .map(|k| (*k, if *k == "cpu" { "10m" } else { "32Mi" }))
        .collect();
    Some(json!({"limits": limits, "requests": requests}))
}

/// A container's `ephemeral-storage` limit, with a request of 0 unless it has one: a limit
/// alone would be its request too, reserving that much of the node's disk for every pod.
fn set_ephemeral_storage_limit(container: &mut Value, limit: String) {
    if !container["resources"].is_object() {
        container["resources"] = json!({});
    }
    for part in ["limits", "requests"] {
        if !container["resources"][part].is_object() {
            container["resources"][part] = json!({});
        }
    }
    container["resources"]["limits"]["ephemeral-storage"] = limit.into();
    if container["resources"]["requests"]["ephemeral-storage"].is_null() {
        container["resources"]["requests"]["ephemeral-storage"] = "0".into();
    }
}

/// [`EGRESS_CHECK_ENV`]'s value for a pool's pods.
fn egress_check_mode(mode: floe_crds::gateway_pool::UnrestrictedEgress) -> &'static str {
    match mode {
        floe_crds::gateway_pool::UnrestrictedEgress::Warn => "warn",
        floe_crds::gateway_pool::UnrestrictedEgress::Refuse => "refuse",
    }
}

pub fn build(p: &SandboxPod) -> Result<Pod, serde_json::Error> {
    let t = &p.spec.template;
    let g = &p.spec.gateway;
    let workdir = t
        .working_dir
        .clone()
        .unwrap_or_else(|| DEFAULT_WORKDIR.into());
    let gateway_url = format!("http://127.0.0.1:{}", g.port);
    let token_file = format!("{CONTROL_DIR}/{CONTROL_TOKEN_KEY}");

    let mut labels: BTreeMap<String, String> = t
        .metadata
        .as_ref()
        .map(|m| m.labels.clone())
        .unwrap_or_default();
    labels.insert(POOL_LABEL.into(), p.pool.into());
    labels.insert(STATE_LABEL.into(), PodState::Warming.label().into());
    labels.insert(SANDBOX_LABEL.into(), "true".into());
    labels.insert("app.kubernetes.io/managed-by".into(), "floe".into());
    let mut annotations: BTreeMap<String, String> = t
        .metadata
        .as_ref()
        .map(|m| m.annotations.clone())
        .unwrap_or_default();
    annotations.insert(TEMPLATE_HASH_ANNOTATION.into(), template_hash(p.spec));

    let mut gateway_args = vec![
        "gateway".to_string(),
        "--listen".into(),
        format!("127.0.0.1:{}", g.port),
        "--control-listen".into(),
        format!("0.0.0.0:{}", g.control_port),
        "--capture-dir".into(),
        format!("{STATE_DIR}/captures"),
        "--control-token-file".into(),
        token_file.clone(),
        "--max-body-bytes".into(),
        g.max_body_bytes.to_string(),
        "--require-runner-ready".into(),
        // A job without its own upstream uses the pool's; with none at all, every
        // assignment must carry one.
        "--upstream".into(),
        g.upstream
            .as_ref()
            .map_or("http://upstream.invalid".into(), |u| u.url.clone()),
    ];
    if let Some(model) = g.upstream.as_ref().and_then(|u| u.model.clone()) {
        gateway_args.extend(["--upstream-model".into(), model]);
    }
    if let Some(u) = g.upstream.as_ref() {
        if u.kind == floe_crds::common::UpstreamKind::Sglang {
            gateway_args.extend(["--upstream-kind".into(), "sglang".into()]);
        }
    }
    // A node with transparent huge pages set to `always` backs each heap thread's first
    // touch with a 2 MB page: ~9 MiB more RSS per sidecar and milliseconds of page
    // zeroing on its first requests. The binary never asks for them (mimalloc's `no_thp`);
    // this has mimalloc turn them off for the process (`prctl`) where the node would
    // give them unasked. Only the gateway: the runner's children (the harness) inherit it.
    let mut gateway_env = vec![json!({"name": "MIMALLOC_ALLOW_THP", "value": "0"})];
    // The model server's key: in the gateway's container only, never the agent's.
    if let Some(secret) = g.upstream.as_ref().and_then(|u| u.api_key_secret.as_ref()) {
        gateway_env.push(
            json!({"name": floe_gateway::bearer::UPSTREAM_KEY_ENV, "valueFrom":
            {"secretKeyRef": {"name": secret.name, "key": secret.key}}}),
        );
    }
    let mut gateway = json!({
        "name": "floe-gateway",
        "image": p.floe_image,
        "command": ["floe"],
        "args": gateway_args,
        "env": gateway_env,
        "ports": [{"name": CONTROL_PORT_NAME, "containerPort": g.control_port}],
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": g.control_port}, "periodSeconds": 2},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": g.control_port}, "periodSeconds": 10},
        "volumeMounts": [
            {"name": "floe-control", "mountPath": CONTROL_DIR, "readOnly": true},
            {"name": "floe-state", "mountPath": STATE_DIR},
        ],
        "securityContext": restricted(FLOE_UID),
    });
    if let Some(r) = &g.resources {
        gateway["resources"] = serde_json::to_value(r)?;
    }
    let copy = json!({
        "name": "floe-init",
        "image": p.floe_image,
        "command": ["floe", "install-binary", format!("{BIN_DIR}/floe")],
        "volumeMounts": [{"name": "floe-bin", "mountPath": BIN_DIR}],
        "securityContext": restricted(FLOE_UID),
    });

    let template_env = t
        .env
        .iter()
        .map(serde_json::to_value)
        .collect::<Result<Vec<_>, _>>()?;
    let template_mounts = t
        .volume_mounts
        .iter()
        .map(serde_json::to_value)
        .collect::<Result<Vec<_>, _>>()?;
    let link = format!("127.0.0.1:{AGENT_LINK_PORT}");
    let security = match &t.security_context {
        Some(sc) => serde_json::to_value(sc)?,
        None => restricted(SANDBOX_UID),
    };
    // The grader: the only container of the harness image with the control token (in the
    // runner's memory only), the assignment (hidden files) and the evaluation copy. The agent
    // never ran in it.
    let disk_budget = t
        .disk_budget
        .as_deref()
        .unwrap_or(floe_crds::common::DEFAULT_DISK_BUDGET);
    let mut grader_env = vec![
        json!({"name": "FLOE_GATEWAY_URL", "value": gateway_url}),
        // The token as a variable, never a file: the evaluator runs code the agent wrote, as
        // the same user, and could read a file the grader can. The runner keeps the variable
        // from its children and is not dumpable, so its environment is not readable either.
        json!({"name": "FLOE_CONTROL_TOKEN", "valueFrom": {"secretKeyRef": {
            "name": p.secret, "key": CONTROL_TOKEN_KEY}}}),
        json!({"name": "FLOE_POOL_PREPARE", "value": serde_json::to_string(&p.spec.prepare)?}),
        json!({"name": EGRESS_CHECK_ENV,
               "value": egress_check_mode(p.spec.egress.unrestricted)}),
        json!({"name": DISK_BUDGET_ENV, "value": disk_budget}),
    ];
    grader_env.extend(template_env.iter().cloned());
    let mut grader_mounts = vec![
        json!({"name": "floe-bin", "mountPath": BIN_DIR, "readOnly": true}),
        json!({"name": "floe-run", "mountPath": RUN_DIR}),
        json!({"name": "floe-workspace", "mountPath": workdir}),
        json!({"name": "floe-agent", "mountPath": AGENT_DIR}),
    ];
    grader_mounts.extend(template_mounts.iter().cloned());
    let mut main = json!({
        "name": GRADER_CONTAINER,
        "image": t.grader_image.as_deref().unwrap_or(&t.image),
        "command": [format!("{BIN_DIR}/floe"), "sandbox"],
        "args": ["--workspace", workdir, "--state-dir", format!("{RUN_DIR}/state"),
                 "--agent-listen", link, "--agent-dir", AGENT_DIR],
        "workingDir": workdir,
        "env": grader_env,
        "envFrom": t.env_from,
        "volumeMounts": grader_mounts,
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": security,
    });
    // The agent: the harness under `floe agent` (PID 1 of the container's own PID namespace),
    // the workspace and its home; no token, no floe state.
    let mut agent_env = vec![
        json!({"name": "FLOE_GATEWAY_URL", "value": gateway_url}),
        json!({"name": "OPENAI_BASE_URL", "value": format!("{gateway_url}/v1")}),
        json!({"name": "ANTHROPIC_BASE_URL", "value": gateway_url}),
        json!({"name": "GOOGLE_GEMINI_BASE_URL", "value": gateway_url}),
    ];
    agent_env.extend(template_env);
    let mut agent_mounts = vec![
        json!({"name": "floe-bin", "mountPath": BIN_DIR, "readOnly": true}),
        json!({"name": "floe-workspace", "mountPath": workdir}),
        json!({"name": "floe-agent", "mountPath": AGENT_DIR}),
    ];
    agent_mounts.extend(template_mounts);
    let mut agent = json!({
        "name": AGENT_CONTAINER,
        "image": t.image,
        "command": [format!("{BIN_DIR}/floe"), "agent"],
        "args": ["--grader", link],
        "workingDir": workdir,
        "env": agent_env,
        "envFrom": t.env_from,
        "volumeMounts": agent_mounts,
        "securityContext": without_privileges(&main["securityContext"]),
    });
    if let Some(policy) = t.image_pull_policy {
        main["imagePullPolicy"] = serde_json::to_value(policy)?;
        agent["imagePullPolicy"] = serde_json::to_value(policy)?;
    }
    if let Some(r) = &t.resources {
        agent["resources"] = serde_json::to_value(r)?;
        if let Some(g) = grader_resources(r) {
            main["resources"] = g;
        }
    }

    // What the agent writes: its budget is checked by the grader; the kubelet's backstop is
    // four times that (a write must outrun the check by that much to be evicted). What it
    // writes outside its volumes (its container's own layer: `/tmp`, a `pip install` into the
    // image's environment) has the same backstop as the agent container's ephemeral-storage
    // limit, unless the template sets one. An eviction for either is the agent's doing: its
    // session fails without a retry (`rollout::pod_view`), never an attempt made again.
    let budget = floe_sandbox::limits::parse_bytes(disk_budget)
        .ok()
        .filter(|b| *b > 0);
    let backstop = budget.map(|b| b.saturating_mul(4));
    let agent_volume = match backstop {
        Some(limit) => json!({"emptyDir": {"sizeLimit": limit.to_string()}}),
        None => json!({"emptyDir": {}}),
    };
    if let Some(limit) = backstop {
        if agent["resources"]["limits"]["ephemeral-storage"].is_null() {
            set_ephemeral_storage_limit(&mut agent, limit.to_string());
        }
        // The kubelet checks a pod's usage (every container's layer, every emptyDir) against
        // the sum of its containers' limits *before* each container's own: with the agent's
        // alone, that sum is the agent's, and the pod check would fire first, in words that
        // name no one (infrastructure, retried). The grader's room, four times the agent's
        // backstop, keeps the sum above anything honest, so the agent's own check names it.
        if main["resources"]["limits"]["ephemeral-storage"].is_null() {
            set_ephemeral_storage_limit(&mut main, limit.saturating_mul(4).to_string());
        }
    } else if let Some(theirs) = agent["resources"]["limits"]["ephemeral-storage"]
        .as_str()
        .and_then(|l| floe_sandbox::limits::parse_bytes(l).ok())
        .filter(|b| *b > 0)
    {
        // No budget, but the template limits the agent: the same room for the same reason.
        if main["resources"]["limits"]["ephemeral-storage"].is_null() {
            set_ephemeral_storage_limit(&mut main, theirs.saturating_mul(4).to_string());
        }
    }
    // The job reads an eviction for the pod's sum of limits by it (its pod cache keeps no spec).
    if let Some(room) = main["resources"]["limits"]["ephemeral-storage"].as_str() {
        annotations.insert(GRADER_ROOM_ANNOTATION.into(), room.to_string());
    }
    let named = |name: &str| {
        let mut v = agent_volume.clone();
        v["name"] = name.into();
        v
    };
    let mut volumes = vec![
        json!({"name": "floe-bin", "emptyDir": {}}),
        json!({"name": "floe-state", "emptyDir": {}}),
        json!({"name": "floe-run", "emptyDir": {}}),
        named("floe-workspace"),
        named("floe-agent"),
        json!({"name": "floe-control", "secret": {"secretName": p.secret, "defaultMode": 0o440}}),
    ];
    volumes.extend(
        t.volumes
            .iter()
            .map(serde_json::to_value)
            .collect::<Result<Vec<_>, _>>()?,
    );

    let (init, containers) = if p.native_sidecars {
        gateway["restartPolicy"] = "Always".into();
        (vec![copy, gateway], vec![main, agent])
    } else {
        (vec![copy], vec![main, agent, gateway])
    };
    let mut spec = json!({
        "restartPolicy": "Never",
        "automountServiceAccountToken": false,
        "enableServiceLinks": false,
        "initContainers": init,
        "containers": containers,
        "volumes": volumes,
        "imagePullSecrets": t.image_pull_secrets,
        "nodeSelector": t.node_selector,
        "tolerations": t.tolerations,
        // The restricted profile's pod-level half: the grader and the gateway share the
        // mounted Secret through the group.
        "securityContext": {"runAsNonRoot": true, "fsGroup": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
    });
    if let Some(a) = &t.affinity {
        spec["affinity"] = serde_json::to_value(a)?;
    }
    for (key, value) in [
        ("runtimeClassName", &t.runtime_class_name),
        ("priorityClassName", &t.priority_class_name),
        ("serviceAccountName", &t.service_account_name),
    ] {
        if let Some(v) = value {
            spec[key] = v.clone().into();
        }
    }
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": p.name, "namespace": p.namespace, "labels": labels, "annotations": annotations},
        "spec": spec,
    }))
}

#[cfg(test)]
mod tests;
