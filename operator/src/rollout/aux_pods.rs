//! Names and ports of a job's own pods and Services: the trainer pod (vLLM serving the policy,
//! and the GRPO trainer's ingest) in `train` mode, the dataset collector in `sft` mode.

/// vLLM itself, on the trainer pod's loopback only: its dev-mode weight and pause endpoints
/// are for the trainer container, never for sandbox pods (`floe policy-proxy`).
pub const VLLM_LOOPBACK_PORT: u16 = 8001;
/// Shared by the trainer pod's two containers: ingest spool, the weights vLLM reloads.
pub const TRAINER_STATE_DIR: &str = "/var/lib/floe-trainer";
/// The trainer pods' `fsGroup`: the floe-trainer image's group. Every container of the pod
/// runs with it as a supplementary group, and the kubelet gives a claim that supports
/// ownership (most provisioned volumes, not hostPath) to it, so a fresh root-owned checkpoint
/// claim is writable by whichever user the trainer image runs as.
pub const TRAINER_FS_GROUP: i64 = 1000;
pub use super::trainer_launch::{SERVED_MODEL, TRAINER_STOP_GRACE_SECONDS};
pub use crate::pods::names::{INGEST_PORT, OWNER_JOB_LABEL, ROLE_LABEL, VLLM_PORT};

/// Service in front of the trainer pod's vLLM.
pub fn policy_service(job: &str) -> String {
    format!("{job}-policy")
}

/// Service in front of the trainer's ingest and status endpoints.
pub fn trainer_service(job: &str) -> String {
    format!("{job}-trainer")
}

/// Service in front of the sft dataset collector.
pub fn dataset_service(job: &str) -> String {
    format!("{job}-dataset")
}

use std::collections::BTreeMap;

use floe_crds::rollout_job::{FileTasks, RolloutJob, TrainSpec};
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use kube::{Resource, ResourceExt};
use serde_json::{json, Value};

use super::trainer_launch::{self, Layout};

/// The Kubernetes objects a job needs besides its sessions.
pub struct AuxObjects {
    pub pod: Pod,
    pub services: Vec<Service>,
    /// Created before the pod: the job's token ([`job_token_secret`]) and, for a trainer,
    /// its control token ([`trainer_control_secret`]).
    pub secrets: Vec<Secret>,
}

/// The Secret holding a job's token (key [`crate::pods::names::CONTROL_TOKEN_KEY`]): what the
/// job's gateways present to its trainer's or collector's ingest (`POST /v1/trajectories`)
/// and to its policy server. The operator gives it to the gateways in each assignment; the
/// agent, which shares its pod's network with the gateway and so reaches those ports too,
/// never has it.
pub fn job_token_secret(job: &str) -> String {
    format!("{job}-token")
}

fn job_token_secret_object(job: &RolloutJob, role: &str) -> Result<Secret, serde_json::Error> {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": meta(job, &job_token_secret(&job.name_any()), role),
        "stringData": {crate::pods::names::CONTROL_TOKEN_KEY: crate::pods::sandbox::new_control_token()},
    }))
}

/// An env var read from the job's token Secret.
fn job_token_env(job: &RolloutJob, var: &str) -> Value {
    json!({"name": var, "valueFrom": {"secretKeyRef": {
        "name": job_token_secret(&job.name_any()), "key": crate::pods::names::CONTROL_TOKEN_KEY}}})
}

/// The Secret holding a train job's trainer control token (key
/// [`crate::pods::names::CONTROL_TOKEN_KEY`]): the operator's, to tell the trainer the job's
/// sessions are done. Sandbox pods, which reach the trainer's port, never see it.
pub fn trainer_control_secret(job: &str) -> String {
    format!("{}-control", trainer_service(job))
}

pub(super) fn meta(job: &RolloutJob, name: &str, role: &str) -> Value {
    json!({
        "name": name,
        "namespace": job.namespace(),
        "labels": {
            "app.kubernetes.io/managed-by": "floe",
            "app.kubernetes.io/component": role,
            ROLE_LABEL: role,
            OWNER_JOB_LABEL: job.name_any(),
        },
        "ownerReferences": job.controller_owner_ref(&()).map(|o| vec![o]),
    })
}

fn selector(job: &RolloutJob, role: &str) -> Value {
    json!({ROLE_LABEL: role, OWNER_JOB_LABEL: job.name_any()})
}

fn service(
    job: &RolloutJob,
    name: &str,
    role: &str,
    port: i32,
) -> Result<Service, serde_json::Error> {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": meta(job, name, role),
        "spec": {"selector": selector(job, role),
                 "ports": [{"name": "http", "port": port, "targetPort": port}]},
    }))
}

pub(super) fn restricted() -> Value {
    json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]},
           "seccompProfile": {"type": "RuntimeDefault"}})
}

/// `sft`: `floe collect` with the dataset volume, and its Service.
pub fn collector(
    job: &RolloutJob,
    floe_image: &str,
) -> Result<Option<AuxObjects>, serde_json::Error> {
    let (Some(sft), Some(min_reward)) = (&job.spec.sft, job.spec.sft_min_reward()) else {
        return Ok(None);
    };
    let name = dataset_service(&job.name_any());
    let dir = format!("/data/{}", sft.output.path.trim_start_matches('/'));
    let user = sft
        .output
        .run_as_user
        .unwrap_or(crate::pods::sandbox::FLOE_UID);
    let group = sft
        .output
        .run_as_group
        .unwrap_or(crate::pods::sandbox::FLOE_UID);
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": meta(job, &name, "dataset"),
        "spec": {
            "automountServiceAccountToken": false,
            "restartPolicy": "Always",
            "securityContext": {"runAsNonRoot": true, "runAsUser": user, "runAsGroup": group,
                                "fsGroup": group},
            "containers": [{
                "name": "collector", "image": floe_image, "command": ["floe"],
                // A dataset directory it cannot write ends it with the reason as its message.
                "terminationMessagePolicy": "FallbackToLogsOnError",
                "args": ["collect", "--listen", format!("0.0.0.0:{INGEST_PORT}"), "--dir", dir,
                         "--min-reward", min_reward.to_string(),
                         "--job", job.name_any(), "--job-uid", job.uid().unwrap_or_default()],
                "ports": [{"name": "http", "containerPort": INGEST_PORT}],
                "readinessProbe": {"httpGet": {"path": "/healthz", "port": INGEST_PORT}, "periodSeconds": 2},
                // The teacher as the pod was made: in its spec digest, so a teacher edited
                // mid-job stalls the job rather than mixing two teachers in one dataset.
                "env": [job_token_env(job, "FLOE_INGEST_TOKEN"),
                        {"name": "FLOE_TEACHER", "value": teacher(&sft.upstream)?}],
                "volumeMounts": [{"name": "dataset", "mountPath": "/data"}],
                "securityContext": restricted(),
            }],
            "volumes": [{"name": "dataset", "persistentVolumeClaim": {"claimName": sft.output.claim_name}}],
        },
    }))?;
    Ok(Some(AuxObjects {
        pod,
        secrets: vec![job_token_secret_object(job, "dataset")?],
        services: vec![service(job, &name, "dataset", INGEST_PORT)?],
    }))
}

/// The job's teacher as the collector names it: its upstream, without credentials a URL may
/// carry (`https://user:key@host`), which would otherwise be in the pod and the dataset's
/// `summary.json`.
fn teacher(upstream: &floe_crds::common::UpstreamSpec) -> Result<String, serde_json::Error> {
    let mut shown = upstream.clone();
    if let Some((scheme, rest)) = shown.url.split_once("://") {
        let authority_end = rest.find('/').unwrap_or(rest.len());
        if let Some(at) = rest[..authority_end].rfind('@') {
            shown.url = format!("{scheme}://{}", &rest[at + 1..]);
        }
    }
    serde_json::to_string(&shown)
}

fn model_path(train: &TrainSpec) -> String {
    if train.model_claim_name.is_some() && !train.model.starts_with('/') {
        format!("/models/{}", train.model)
    } else {
        train.model.clone()
    }
}

fn gpus(n: i32) -> Value {
    if n > 0 {
        json!({"limits": {"nvidia.com/gpu": n.to_string()}})
    } else {
        json!({})
    }
}

/// The trainer's config in a job's pods: with this run's uid, which the trainer records on its
/// checkpoint claim and checks at every start (a job made again under its name on the same
/// claim is refused, not fed the earlier run's state).
pub(super) fn pod_trainer_config(job: &RolloutJob, train: &TrainSpec, layout: &Layout) -> String {
    let mut config =
        trainer_launch::trainer_config(&job.name_any(), job.namespace(), &job.spec, train, layout);
    config["jobUid"] = json!(job.uid());
    config.to_string()
}

/// Where a `train` job's processes find each other and keep their files in its pods.
pub(super) fn trainer_layout(train: &TrainSpec) -> Layout {
    Layout {
        model: model_path(train),
        vllm_port: VLLM_LOOPBACK_PORT,
        ingest_listen: format!("0.0.0.0:{INGEST_PORT}"),
        checkpoint_dir: None,
        final_dir: None,
        // With a checkpoint claim, the acknowledged trajectories are kept on it too: a
        // trainer pod that is lost (deleted, evicted, its node gone) loses none of them, and
        // its successor replays those its checkpoint has not trained. Without one, they live
        // on the pod's emptyDir (kept across container restarts, not across pods).
        ingest_dir: train
            .checkpoint
            .as_ref()
            .map(|_| format!("{}/ingest", trainer_launch::CHECKPOINT_MOUNT)),
    }
}

/// The trainer container's resources: the job's, with its GPUs.
pub(super) fn trainer_resources(train: &TrainSpec) -> Result<Value, serde_json::Error> {
    let mut resources = serde_json::to_value(&train.resources)?;
    if resources.is_null() {
        resources = json!({});
    }
    if train.gpus > 0 {
        resources["limits"]["nvidia.com/gpu"] = json!(train.gpus.to_string());
    }
    Ok(resources)
}

/// The volumes every trainer pod has, with their mounts: shared memory, the state directory
/// (the trainer writes new weights there and tells vLLM to reload them: the model volume is
/// read-only) and the model claim.
pub(super) fn trainer_volumes(train: &TrainSpec) -> (Vec<Value>, Vec<Value>) {
    let mut mounts = vec![
        json!({"name": "shm", "mountPath": "/dev/shm"}),
        json!({"name": "trainer-state", "mountPath": TRAINER_STATE_DIR}),
    ];
    let mut volumes = vec![
        json!({"name": "shm", "emptyDir": {"medium": "Memory"}}),
        json!({"name": "trainer-state", "emptyDir": {}}),
    ];
    if let Some(claim) = &train.model_claim_name {
        mounts.push(json!({"name": "models", "mountPath": "/models", "readOnly": true}));
        volumes.push(json!({"name": "models", "persistentVolumeClaim": {"claimName": claim, "readOnly": true}}));
    }
    (mounts, volumes)
}

/// `train`: the trainer pod (vLLM serving the policy behind `floe policy-proxy`, and the GRPO
/// trainer) and its Services. With `train.nodes` > 1 it is the first of the trainer's pods
/// (the others: [`super::trainer_workers`]).
pub fn trainer(
    job: &RolloutJob,
    floe_image: &str,
) -> Result<Option<AuxObjects>, serde_json::Error> {
    let Some(train) = &job.spec.train else {
        return Ok(None);
    };
    let name = trainer_service(&job.name_any());
    let layout = trainer_layout(train);
    let mut vllm_args: Vec<String> = vec!["serve".into(), layout.model.clone()];
    vllm_args.extend(trainer_launch::vllm_args(train, &layout));
    let vllm_env: Vec<Value> = trainer_launch::vllm_env(train)
        .into_iter()
        .map(|(k, v)| json!({"name": k, "value": v}))
        .collect();
    let trainer_resources = trainer_resources(train)?;
    let (mounts, mut volumes) = trainer_volumes(train);
    let mut trainer_mounts = mounts.clone();
    if let Some(c) = &train.checkpoint {
        trainer_mounts
            .push(json!({"name": "checkpoints", "mountPath": trainer_launch::CHECKPOINT_MOUNT}));
        volumes.push(
            json!({"name": "checkpoints", "persistentVolumeClaim": {"claimName": c.claim_name}}),
        );
    }
    let config = pod_trainer_config(job, train, &layout);
    // Several nodes: the first pod's own IP (the kubelet expands `$(FLOE_POD_IP)` in its
    // arguments) is where torchrun's rendezvous store listens.
    let node = trainer_launch::TrainerNode {
        rank: 0,
        leader_addr: "$(FLOE_POD_IP)",
    };
    let trainer_command = trainer_launch::trainer_command(train, None, Some(node));
    let control = trainer_control_secret(&job.name_any());
    let mut trainer_env = vec![
        json!({"name": "FLOE_TRAINER_CONFIG", "value": config}),
        json!({"name": "FLOE_TRAINER_STATE", "value": TRAINER_STATE_DIR}),
        json!({"name": "FLOE_TRAINER_CONTROL_TOKEN", "valueFrom": {"secretKeyRef": {
            "name": control, "key": crate::pods::names::CONTROL_TOKEN_KEY}}}),
        job_token_env(job, "FLOE_TRAINER_INGEST_TOKEN"),
    ];
    if train.nodes > 1 || train.gpus > 1 {
        // torchrun waits out the pod's grace for the leader's last checkpoint.
        trainer_env.push(json!({"name": "TORCH_ELASTIC_SHUTDOWN_TIMEOUT",
                                "value": trainer_launch::torch_shutdown_timeout()}));
    }
    let mut trainer_ports = vec![json!({"name": "ingest", "containerPort": INGEST_PORT})];
    if train.nodes > 1 {
        trainer_env.insert(0, pod_ip_env());
        trainer_ports
            .push(json!({"name": "rendezvous", "containerPort": trainer_launch::RENDEZVOUS_PORT}));
    }
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": meta(job, &control, "trainer"),
        "stringData": {crate::pods::names::CONTROL_TOKEN_KEY: crate::pods::sandbox::new_control_token()},
    }))?;
    let node_selector: BTreeMap<String, String> = train.node_selector.clone();
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": meta(job, &name, "trainer"),
        "spec": {
            "automountServiceAccountToken": false,
            "securityContext": {"fsGroup": TRAINER_FS_GROUP},
            "restartPolicy": "Always",
            // A stopped trainer writes a checkpoint of the steps since its last periodic one
            // (the optimizer state too: minutes for a large model), so a restart need not
            // train their trajectories again.
            "terminationGracePeriodSeconds": TRAINER_STOP_GRACE_SECONDS,
            "nodeSelector": node_selector,
            "tolerations": train.tolerations,
            "containers": [
                {
                    "name": "vllm", "image": train.image, "command": ["vllm"], "args": vllm_args,
                    "env": vllm_env,
                    "resources": gpus(train.vllm.gpus),
                    "volumeMounts": mounts,
                },
                {
                    // vLLM's readiness too: /health is forwarded to it.
                    "name": "policy", "image": floe_image, "command": ["floe"],
                    "args": trainer_launch::policy_proxy_args(&format!("0.0.0.0:{VLLM_PORT}"), &layout),
                    "env": [job_token_env(job, "FLOE_POLICY_TOKEN")],
                    "ports": [{"name": "policy", "containerPort": VLLM_PORT}],
                    "readinessProbe": {"httpGet": {"path": "/health", "port": VLLM_PORT}, "periodSeconds": 5},
                    "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                    "securityContext": restricted(),
                },
                {
                    "name": "trainer", "image": train.image,
                    "command": &trainer_command[..1], "args": &trainer_command[1..],
                    "env": trainer_env,
                    "ports": trainer_ports,
                    "readinessProbe": {"httpGet": {"path": "/healthz", "port": INGEST_PORT}, "periodSeconds": 5},
                    "resources": trainer_resources,
                    "volumeMounts": trainer_mounts,
                },
            ],
            "volumes": volumes,
        },
    }))?;
    Ok(Some(AuxObjects {
        pod,
        secrets: vec![secret, job_token_secret_object(job, "trainer")?],
        services: vec![
            service(job, &policy_service(&job.name_any()), "trainer", VLLM_PORT)?,
            service(job, &name, "trainer", INGEST_PORT)?,
        ],
    }))
}

/// `FLOE_POD_IP`: the pod's own IP, from the downward API.
pub(super) fn pod_ip_env() -> Value {
    json!({"name": "FLOE_POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
}

/// Where a job's task loader mounts the claim of its `tasks.file`, and (when it is another
/// claim) that of its `train.heldOut.tasks.file`.
pub const TASKS_MOUNT: &str = "/tasks-volume";
pub const HELD_OUT_MOUNT: &str = "/held-out-volume";

pub fn task_loader_name(job: &str) -> String {
    format!("{job}-tasks")
}

/// Where the task loader reads the token the operator shows it (a Secret's key, never an
/// argument).
pub const TASKS_TOKEN_ENV: &str = "FLOE_TASKS_TOKEN";

/// The Secret holding the token a job's task loader serves its files for (key
/// [`crate::pods::names::CONTROL_TOKEN_KEY`]): the operator's alone. The files hold every
/// task's hidden tests, and the loader's port is in reach of any pod where the cluster's CNI
/// does not enforce the sandboxes' NetworkPolicy (`egress.unrestricted: Warn` lets them run):
/// an agent that read them would pass what it was meant to solve.
pub fn task_loader_secret(job: &str) -> String {
    // Not `-tasks-token`: the job token Secret of a job named `<job>-tasks`.
    format!("{job}-tasks-key")
}

/// A new token for a job's task loader, in its Secret.
pub fn task_loader_secret_object(job: &RolloutJob) -> Result<Secret, serde_json::Error> {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": meta(job, &task_loader_secret(&job.name_any()), "tasks"),
        "stringData": {crate::pods::names::CONTROL_TOKEN_KEY: crate::pods::sandbox::new_control_token()},
    }))
}

/// The task files of a job that a loader pod serves: its own and its held-out set's.
pub fn task_files(job: &RolloutJob) -> [Option<&FileTasks>; 2] {
    let held_out = job.spec.train.as_ref().and_then(|t| t.held_out.as_ref());
    [
        job.spec.tasks.file.as_ref(),
        held_out.and_then(|h| h.tasks.file.as_ref()),
    ]
}

/// A job's task files in a cluster: a pod that mounts their claims read-only and serves them
/// to the operator (`floe serve-tasks`, `GET :8100/tasks` and `/held-out`); `None` without a
/// file, or when a file names no claim.
pub fn task_loader(job: &RolloutJob, floe_image: &str) -> Result<Option<Pod>, serde_json::Error> {
    let files = task_files(job);
    if files.iter().all(Option::is_none) || files.iter().flatten().any(|f| f.claim_name.is_none()) {
        return Ok(None);
    }
    let mut args = vec!["serve-tasks".to_string()];
    let mut volumes: Vec<Value> = Vec::new();
    let mut mounts: Vec<Value> = Vec::new();
    let mut claims: Vec<(&str, &str)> = Vec::new();
    for ((flag, volume, mount), file) in [
        ("--file", "tasks", TASKS_MOUNT),
        ("--held-out", "held-out", HELD_OUT_MOUNT),
    ]
    .into_iter()
    .zip(files)
    {
        let Some((file, claim)) = file.and_then(|f| Some((f, f.claim_name.as_deref()?))) else {
            continue;
        };
        // Both files on one claim: mounted once.
        let mount = match claims.iter().find(|(c, _)| *c == claim) {
            Some((_, at)) => *at,
            None => {
                claims.push((claim, mount));
                volumes.push(json!({"name": volume,
                    "persistentVolumeClaim": {"claimName": claim, "readOnly": true}}));
                mounts.push(json!({"name": volume, "mountPath": mount, "readOnly": true}));
                mount
            }
        };
        args.push(flag.into());
        args.push(format!("{mount}/{}", file.path.trim_start_matches('/')));
    }
    args.extend(["--listen".into(), format!("0.0.0.0:{INGEST_PORT}")]);
    let name = task_loader_name(&job.name_any());
    Ok(Some(serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": meta(job, &name, "tasks"),
        "spec": {
            "automountServiceAccountToken": false,
            "restartPolicy": "Always",
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "fsGroup": 65532},
            "containers": [{
                "name": "tasks", "image": floe_image, "command": ["floe"],
                "args": args,
                "env": [{"name": TASKS_TOKEN_ENV, "valueFrom": {"secretKeyRef": {
                    "name": task_loader_secret(&job.name_any()),
                    "key": crate::pods::names::CONTROL_TOKEN_KEY}}}],
                "ports": [{"name": "http", "containerPort": INGEST_PORT}],
                "readinessProbe": {"httpGet": {"path": "/healthz", "port": INGEST_PORT}, "periodSeconds": 2},
                // A file that cannot be read ends the container with the reason as its message.
                "terminationMessagePolicy": "FallbackToLogsOnError",
                "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
                "volumeMounts": mounts,
                "securityContext": restricted(),
            }],
            "volumes": volumes,
        },
    }))?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(mode: Value) -> RolloutJob {
        let mut spec = json!({
            "tasks": {"inline": [{"id": "a", "instruction": "x"}]}, "numSamples": 4,
            "harness": {"preset": "pi"}, "poolRef": {"name": "p"},
            "evaluator": {"command": ["true"], "reward": {"passThreshold": 0.5}},
        });
        if let (Some(s), Some(m)) = (spec.as_object_mut(), mode.as_object()) {
            s.extend(m.clone());
        }
        serde_json::from_value(
            json!({"apiVersion": "floe.dev/v1alpha1", "kind": "RolloutJob",
            "metadata": {"name": "j", "namespace": "ns", "uid": "u-1"}, "spec": spec}),
        )
        .unwrap_or_else(|e| panic!("job: {e}"))
    }

    #[test]
    fn sft_gets_a_collector_on_the_dataset_volume_owned_by_the_job() -> Result<(), serde_json::Error>
    {
        let j = job(
            json!({"sft": {"upstream": {"url": "http://t:8000"}, "output": {"claimName": "data", "path": "/runs/1"}}}),
        );
        let aux = collector(&j, "floe:1")?.expect("sft has a collector");
        let pod = serde_json::to_value(&aux.pod)?;
        assert_eq!(pod["metadata"]["name"], "j-dataset");
        assert_eq!(pod["metadata"]["ownerReferences"][0]["uid"], "u-1");
        assert!(
            pod["metadata"]["labels"].get("floe.dev/job").is_none(),
            "not a session pod"
        );
        let args = &pod["spec"]["containers"][0]["args"];
        assert_eq!(args[4], "/data/runs/1");
        assert_eq!(args[6], "0.5", "minReward defaults to the pass threshold");
        // The directory is this run's: a job made again under its name is told, not dropped.
        assert_eq!((&args[8], &args[10]), (&json!("j"), &json!("u-1")));
        assert_eq!(
            pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"],
            "data"
        );
        assert_eq!(aux.services[0].metadata.name.as_deref(), Some("j-dataset"));
        // Posts need the job's token, from its own Secret (made with the pod).
        let teacher = &pod["spec"]["containers"][0]["env"][1];
        assert_eq!(
            (&teacher["name"], &teacher["value"]),
            (
                &json!("FLOE_TEACHER"),
                &json!(r#"{"url":"http://t:8000","kind":"vLLM"}"#)
            )
        );
        let env = &pod["spec"]["containers"][0]["env"][0];
        assert_eq!(env["name"], "FLOE_INGEST_TOKEN");
        assert_eq!(env["valueFrom"]["secretKeyRef"]["name"], "j-token");
        assert_eq!(aux.secrets.len(), 1);
        assert_eq!(aux.secrets[0].metadata.name.as_deref(), Some("j-token"));
        assert!(trainer(&j, "floe:1")?.is_none());
        Ok(())
    }

    #[test]
    fn the_teacher_named_carries_no_credentials() -> Result<(), serde_json::Error> {
        let upstream = |url: &str| -> floe_crds::common::UpstreamSpec {
            serde_json::from_value(json!({"url": url})).expect("upstream")
        };
        assert!(teacher(&upstream("https://user:k3y@api.example/v1"))?
            .contains(r#""url":"https://api.example/v1""#));
        assert!(teacher(&upstream("http://t:8000/a@b"))?.contains(r#""url":"http://t:8000/a@b""#));
        Ok(())
    }

    #[test]
    fn a_task_file_on_a_claim_gets_a_read_only_loader() -> Result<(), serde_json::Error> {
        let mut j = job(json!({}));
        j.spec.tasks = serde_json::from_value(
            json!({"file": {"claimName": "swe", "path": "/sets/verified.jsonl"}}),
        )?;
        let pod = serde_json::to_value(task_loader(&j, "floe:1")?.expect("a loader"))?;
        assert_eq!(pod["metadata"]["name"], "j-tasks");
        assert_eq!(pod["metadata"]["labels"]["floe.dev/job-role"], "tasks");
        let c = &pod["spec"]["containers"][0];
        assert_eq!(
            c["args"],
            json!([
                "serve-tasks",
                "--file",
                "/tasks-volume/sets/verified.jsonl",
                "--listen",
                "0.0.0.0:8100"
            ])
        );
        assert_eq!(c["volumeMounts"][0]["readOnly"], true);
        // It serves only the operator, by a token of the job's own Secret.
        assert_eq!(c["env"][0]["name"], TASKS_TOKEN_ENV);
        assert_eq!(
            c["env"][0]["valueFrom"]["secretKeyRef"]["name"],
            "j-tasks-key"
        );
        let secret = task_loader_secret_object(&j)?;
        assert_eq!(secret.metadata.name.as_deref(), Some("j-tasks-key"));
        assert!(secret
            .string_data
            .is_some_and(|d| d.values().all(|t| t.len() >= 32)));
        assert_eq!(
            pod["spec"]["volumes"][0]["persistentVolumeClaim"],
            json!({"claimName": "swe", "readOnly": true})
        );
        assert!(
            task_loader(&job(json!({})), "floe:1")?.is_none(),
            "inline tasks"
        );
        Ok(())
    }

    #[test]
    fn held_out_files_are_served_beside_the_jobs_own_one_mount_per_claim(
    ) -> Result<(), serde_json::Error> {
        let train = |held: Value| json!({"train": {"image": "t", "model": "m", "heldOut": {"tasks": {"file": held}}}});
        let args = |j: &RolloutJob| -> Result<(Value, usize), serde_json::Error> {
            let pod = serde_json::to_value(task_loader(j, "floe:1")?.expect("a loader"))?;
            let c = &pod["spec"]["containers"][0];
            let mounts = c["volumeMounts"].as_array().map_or(0, Vec::len);
            Ok((c["args"].clone(), mounts))
        };
        // Inline tasks, held-out ones in a file: the loader serves that alone.
        let j = job(train(json!({"claimName": "sets", "path": "held.jsonl"})));
        assert_eq!(
            args(&j)?,
            (
                json!([
                    "serve-tasks",
                    "--held-out",
                    "/held-out-volume/held.jsonl",
                    "--listen",
                    "0.0.0.0:8100"
                ]),
                1
            )
        );
        // Both on one claim: one mount.
        let mut j = job(train(json!({"claimName": "sets", "path": "/h.jsonl"})));
        j.spec.tasks =
            serde_json::from_value(json!({"file": {"claimName": "sets", "path": "t.jsonl"}}))?;
        assert_eq!(
            args(&j)?,
            (
                json!([
                    "serve-tasks",
                    "--file",
                    "/tasks-volume/t.jsonl",
                    "--held-out",
                    "/tasks-volume/h.jsonl",
                    "--listen",
                    "0.0.0.0:8100"
                ]),
                1
            )
        );
        // On two claims: two.
        let mut j = job(train(json!({"claimName": "held", "path": "/h.jsonl"})));
        j.spec.tasks =
            serde_json::from_value(json!({"file": {"claimName": "sets", "path": "t.jsonl"}}))?;
        assert_eq!(args(&j)?.1, 2);
        // A held-out file without a claim (`floe run`'s, beside the job file): no loader.
        let j = job(train(json!({"path": "held.jsonl"})));
        assert!(task_loader(&j, "floe:1")?.is_none());
        Ok(())
    }

    /// The pod's container called `name` (null when there is none).
    fn container(pod: &Value, name: &str) -> Value {
        pod["spec"]["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["name"] == name)
            .cloned()
            .unwrap_or_default()
    }

    fn args(container: &Value) -> Vec<&str> {
        container["args"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect()
    }

    #[test]
    fn nccl_weight_sync_starts_vllm_with_its_weight_transfer_engine(
    ) -> Result<(), serde_json::Error> {
        let j = job(
            json!({"train": {"image": "floe-trainer:1", "model": "m", "modelClaimName": "models",
            "gpus": 1, "grpo": {"weightSync": "NCCL"}, "vllm": {"args": ["--enforce-eager"]}}}),
        );
        let aux = trainer(&j, "floe:1")?.expect("train has a trainer");
        let pod = serde_json::to_value(&aux.pod)?;
        let vllm = container(&pod, "vllm");
        let args = args(&vllm);
        assert_eq!(vllm["name"], "vllm");
        assert!(args
            .windows(2)
            .any(|w| w == ["--weight-transfer-config", r#"{"backend":"nccl"}"#]));
        assert!(
            args.ends_with(&["--enforce-eager"]),
            "the job's own args come last"
        );
        Ok(())
    }

    #[test]
    fn several_training_gpus_get_one_trainer_process_each() -> Result<(), serde_json::Error> {
        let j = job(json!({"train": {"image": "floe-trainer:1", "model": "m", "gpus": 4}}));
        let aux = trainer(&j, "floe:1")?.expect("train has a trainer");
        let pod = serde_json::to_value(&aux.pod)?;
        let trainer = &container(&pod, "trainer");
        assert_eq!(trainer["resources"]["limits"]["nvidia.com/gpu"], "4");
        assert_eq!(trainer["command"], json!(["torchrun"]));
        assert_eq!(
            trainer["args"],
            json!([
                "--standalone",
                "--nproc-per-node=4",
                "-m",
                "floe_trainer.cli",
                "serve"
            ])
        );
        // The processes exchange shards through shared memory: /dev/shm is memory-backed.
        assert!(trainer["volumeMounts"]
            .as_array()
            .is_some_and(|m| m.iter().any(|v| v["mountPath"] == "/dev/shm")));
        // A deleted pod's torchrun waits for the last checkpoint within the pod's grace.
        let wait = trainer["env"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["name"] == "TORCH_ELASTIC_SHUTDOWN_TIMEOUT")
            .and_then(|e| e["value"].as_str()?.parse::<i64>().ok());
        assert!(
            wait.is_some_and(|w| w > 30
                && w < pod["spec"]["terminationGracePeriodSeconds"]
                    .as_i64()
                    .unwrap_or(0)),
            "{trainer}"
        );
        assert_eq!(pod["spec"]["securityContext"]["fsGroup"], TRAINER_FS_GROUP);
        Ok(())
    }

    #[test]
    fn train_gets_vllm_and_the_trainer_with_gpus_and_a_tool_parser() -> Result<(), serde_json::Error>
    {
        let j = job(
            json!({"train": {"image": "floe-trainer:1", "model": "Qwen3-1.7B", "modelClaimName": "models",
            "gpus": 1, "vllm": {"gpus": 2, "args": ["--max-model-len", "32768"]},
            "nodeSelector": {"gpu": "h100"}, "checkpoint": {"claimName": "ckpt"}}}),
        );
        let aux = trainer(&j, "floe:1")?.expect("train has a trainer");
        let pod = serde_json::to_value(&aux.pod)?;
        let vllm = &container(&pod, "vllm");
        let args = args(vllm);
        assert_eq!(args[1], "/models/Qwen3-1.7B");
        // vLLM (dev mode) only on loopback; the policy Service reaches it through the proxy.
        assert!(args.windows(2).any(|w| w == ["--host", "127.0.0.1"]));
        assert!(vllm["ports"].is_null(), "vLLM publishes no port");
        let proxy = &container(&pod, "policy");
        assert_eq!(proxy["image"], "floe:1");
        assert_eq!(proxy["args"][0], "policy-proxy");
        assert_eq!(
            proxy["env"][0]["valueFrom"]["secretKeyRef"]["name"], "j-token",
            "inference needs the job's token"
        );
        assert_eq!(proxy["ports"][0]["containerPort"], VLLM_PORT);
        assert!(args
            .windows(2)
            .any(|w| w == ["--served-model-name", "policy"]));
        assert!(args
            .windows(2)
            .any(|w| w == ["--tool-call-parser", "hermes"]));
        assert!(args.ends_with(&["--max-model-len", "32768"]));
        assert_eq!(vllm["resources"]["limits"]["nvidia.com/gpu"], "2");
        assert!(args
            .windows(2)
            .any(|w| w == ["--tensor-parallel-size", "2"]));
        let trainer = &container(&pod, "trainer");
        assert_eq!(trainer["resources"]["limits"]["nvidia.com/gpu"], "1");
        assert_eq!(trainer["command"], json!(["floe-trainer"]));
        assert_eq!(trainer["args"], json!(["serve"]));
        assert_eq!(
            pod["spec"]["terminationGracePeriodSeconds"], TRAINER_STOP_GRACE_SECONDS,
            "time for the last checkpoint"
        );
        let config: Value =
            serde_json::from_str(trainer["env"][0]["value"].as_str().unwrap_or("{}"))
                .unwrap_or_default();
        assert_eq!(config["numSamples"], 4);
        assert_eq!(config["checkpoint"]["dir"], "/checkpoints");
        // This run's uid, which the trainer records on the claim and checks at each start.
        assert_eq!(config["jobUid"], "u-1");
        assert_eq!(
            config["ingestDir"], "/checkpoints/ingest",
            "acknowledged trajectories outlive the pod on the checkpoint claim"
        );
        assert_eq!(config["policyUrl"], "http://127.0.0.1:8001");
        assert_eq!(config["vllmGpus"], 2);
        assert_eq!(config["grpo"]["weightSync"], "File");
        assert_eq!(
            trainer["env"][2]["valueFrom"]["secretKeyRef"]["name"], "j-trainer-control",
            "the finish token comes from the job's own Secret"
        );
        assert_eq!(
            trainer["env"][3]["valueFrom"]["secretKeyRef"]["name"], "j-token",
            "ingest needs the job's token"
        );
        assert_eq!(aux.secrets[1].metadata.name.as_deref(), Some("j-token"));
        let secret = aux.secrets.first().expect("a control-token Secret");
        assert_eq!(secret.metadata.name.as_deref(), Some("j-trainer-control"));
        assert!(
            secret.metadata.owner_references.is_some(),
            "goes with the job"
        );
        assert!(!args.contains(&"--weight-transfer-config"));
        let mounts = |c: &Value| -> Vec<String> {
            c["volumeMounts"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|m| m["mountPath"].as_str().map(String::from))
                .collect()
        };
        assert!(
            mounts(vllm).contains(&TRAINER_STATE_DIR.to_string()),
            "vLLM reads the pushed weights"
        );
        assert!(mounts(trainer).contains(&TRAINER_STATE_DIR.to_string()));
        assert_eq!(pod["spec"]["nodeSelector"]["gpu"], "h100");
        let names: Vec<_> = aux
            .services
            .iter()
            .filter_map(|s| s.metadata.name.clone())
            .collect();
        assert_eq!(names, ["j-policy", "j-trainer"]);
        Ok(())
    }
}
