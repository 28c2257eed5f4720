//! A trainer over several nodes (`train.nodes` > 1): the pods besides the first that only
//! train (sans-IO).
//!
//! The first pod (`<job>-trainer`, [`super::aux_pods::trainer`]) runs vLLM, the ingest and the
//! world's rank 0; each other pod runs `torchrun` with its fixed node rank, joining by a
//! static rendezvous at the first pod's IP. So they are made only once the first pod has an
//! IP, and they belong to that pod: each records its UID, and when the first pod is replaced
//! (a new IP, a new rendezvous) the old ones are deleted and made again. A static rendezvous,
//! not a dynamic one (etcd/c10d with elastic membership): the first pod must be rank 0, and a
//! world that loses a member restarts whole from the last checkpoint anyway.
//!
//! Why plain pods and not JobSet or Kubeflow Trainer: neither is part of Kubernetes, so the
//! operator would need one installed for the one job shape it already runs itself; the only
//! things they would add here (ranked pods, a restart when one fails) are what this file
//! does.

use floe_crds::rollout_job::RolloutJob;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use serde_json::json;

use super::aux_pods::{
    meta, pod_ip_env, trainer_layout, trainer_resources, trainer_service, trainer_volumes,
    TRAINER_FS_GROUP, TRAINER_STATE_DIR,
};
use super::trainer_launch::{self, TrainerNode};

/// The role label of the pods that only train (not `trainer`: the job's Services select that
/// one, and must never send the gateways' traffic to these).
pub const WORKER_ROLE: &str = "trainer-worker";
/// On each such pod: the UID of the first pod it joined.
pub const LEADER_UID_ANNOTATION: &str = "floe.dev/trainer-leader-uid";

/// The pod of node rank `rank` (1…).
pub fn worker_name(job: &str, rank: i32) -> String {
    format!("{}-{rank}", trainer_service(job))
}

/// The names of every pod besides the first, in rank order (none for one node).
pub fn worker_names(job: &RolloutJob) -> Vec<String> {
    let nodes = job.spec.train.as_ref().map_or(1, |t| t.nodes);
    (1..nodes)
        .map(|rank| worker_name(&job.name_any(), rank))
        .collect()
}

/// The first pod's IP and UID, once it has both (a pod being deleted has no successor yet).
pub fn leader_identity(leader: &Pod) -> Option<(&str, &str)> {
    if leader.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let ip = leader.status.as_ref()?.pod_ip.as_deref()?;
    Some((ip, leader.metadata.uid.as_deref()?))
}

/// What to do with one of the other pods, as it is now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WorkerAction {
    /// Missing: create it (for the first pod as it is now).
    Create,
    /// Joined a first pod that is gone, or failed for good (evicted, its node lost): delete
    /// it, and the next round makes it again.
    Replace(&'static str),
    /// Running, starting, or done (its process ended cleanly when the leader stopped it).
    Keep,
}

pub fn action(existing: Option<&Pod>, leader_uid: &str) -> WorkerAction {
    let Some(pod) = existing else {
        return WorkerAction::Create;
    };
    if pod.metadata.deletion_timestamp.is_some() {
        return WorkerAction::Keep;
    }
    let joined = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(LEADER_UID_ANNOTATION));
    if joined.map(String::as_str) != Some(leader_uid) {
        return WorkerAction::Replace("it joined a trainer pod that was replaced");
    }
    if pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed") {
        return WorkerAction::Replace("it failed");
    }
    WorkerAction::Keep
}

/// The pod of node rank `rank` (1…) of a several-node trainer whose first pod is at
/// `leader_ip` with `leader_uid`: the trainer container alone, started the way the first
/// pod's is, with its own rank.
pub fn worker(
    job: &RolloutJob,
    rank: i32,
    leader_ip: &str,
    leader_uid: &str,
) -> Result<Option<Pod>, serde_json::Error> {
    let Some(train) = &job.spec.train else {
        return Ok(None);
    };
    if rank < 1 || rank >= train.nodes {
        return Ok(None);
    }
    let layout = trainer_layout(train);
    let config = super::aux_pods::pod_trainer_config(job, train, &layout);
    let node = TrainerNode {
        rank,
        leader_addr: leader_ip,
    };
    let command = trainer_launch::trainer_command(train, None, Some(node));
    let (mounts, volumes) = trainer_volumes(train);
    let mut metadata = meta(job, &worker_name(&job.name_any(), rank), WORKER_ROLE);
    metadata["annotations"] = json!({ LEADER_UID_ANNOTATION: leader_uid });
    let pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": metadata,
        "spec": {
            "automountServiceAccountToken": false,
            "securityContext": {"fsGroup": TRAINER_FS_GROUP},
            // A process that ends cleanly was stopped by the leader at the job's end; one that
            // fails (its world broke: the first pod's trainer restarted) starts again and
            // joins the rendezvous anew.
            "restartPolicy": "OnFailure",
            "nodeSelector": train.node_selector,
            "tolerations": train.tolerations,
            // One pod per node where the scheduler can: the point of several pods.
            "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                "weight": 100,
                "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname", "labelSelector": {
                    "matchLabels": {crate::pods::names::OWNER_JOB_LABEL: job.name_any()},
                    "matchExpressions": [{"key": crate::pods::names::ROLE_LABEL, "operator": "In",
                                          "values": ["trainer", WORKER_ROLE]}]}},
            }]}},
            "containers": [{
                "name": "trainer", "image": train.image,
                "command": &command[..1], "args": &command[1..],
                // No control or ingest token: only the first pod serves.
                "env": [pod_ip_env(),
                        {"name": "FLOE_TRAINER_CONFIG", "value": config},
                        {"name": "FLOE_TRAINER_STATE", "value": TRAINER_STATE_DIR}],
                "resources": trainer_resources(train)?,
                "volumeMounts": mounts,
            }],
            "volumes": volumes,
        },
    }))?;
    Ok(Some(pod))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    /// The env var `name`'s plain value in `container`, for tests.
    fn env_value<'a>(container: &'a Value, name: &str) -> Option<&'a str> {
        container["env"]
            .as_array()?
            .iter()
            .find(|e| e["name"] == name)?["value"]
            .as_str()
    }

    fn job(train: Value) -> RolloutJob {
        serde_json::from_value(json!({
            "apiVersion": "floe.dev/v1alpha1", "kind": "RolloutJob",
            "metadata": {"name": "j", "namespace": "ns", "uid": "job-uid"},
            "spec": {"numSamples": 2, "tasks": {"inline": []}, "harness": {"preset": "pi"},
                     "evaluator": {"command": ["true"]}, "train": train},
        }))
        .expect("a valid job")
    }

    fn pod(annotations: Value, phase: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "j-trainer-1", "annotations": annotations},
            "status": {"phase": phase},
        }))
        .expect("a pod")
    }

    #[test]
    fn each_other_node_gets_a_ranked_pod_that_joins_the_first() -> Result<(), serde_json::Error> {
        let j = job(
            json!({"image": "t:1", "model": "m", "modelClaimName": "models",
                           "gpus": 8, "nodes": 3, "checkpoint": {"claimName": "ck"}}),
        );
        assert_eq!(worker_names(&j), ["j-trainer-1", "j-trainer-2"]);
        let p = serde_json::to_value(worker(&j, 2, "10.1.0.5", "uid-0")?.expect("rank 2"))?;
        assert_eq!(p["metadata"]["name"], "j-trainer-2");
        assert_eq!(
            p["metadata"]["labels"][crate::pods::names::ROLE_LABEL],
            WORKER_ROLE
        );
        assert_eq!(p["metadata"]["annotations"][LEADER_UID_ANNOTATION], "uid-0");
        assert_eq!(p["metadata"]["ownerReferences"][0]["uid"], "job-uid");
        let containers = p["spec"]["containers"].as_array().expect("containers");
        assert_eq!(containers.len(), 1, "no vLLM, no policy proxy");
        let c = &containers[0];
        let args: Vec<&str> = c["args"]
            .as_array()
            .expect("args")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert_eq!(c["command"][0], "torchrun");
        for a in [
            "--nnodes=3",
            "--node-rank=2",
            "--master-addr=10.1.0.5",
            "--master-port=29500",
            "--nproc-per-node=8",
        ] {
            assert!(args.contains(&a), "{a} in {args:?}");
        }
        assert_eq!(c["resources"]["limits"]["nvidia.com/gpu"], "8");
        // The same configuration as the first pod's trainer; no token of any kind.
        let config: Value =
            serde_json::from_str(env_value(c, "FLOE_TRAINER_CONFIG").expect("config"))
                .expect("JSON");
        assert_eq!(config["nodes"], 3);
        assert_eq!(config["gpus"], 8);
        let env = c["env"].to_string();
        assert!(!env.contains("TOKEN"), "{env}");
        // The model read-only; the checkpoints are the first pod's alone.
        let claims: Vec<&str> = p["spec"]["volumes"]
            .as_array()
            .expect("volumes")
            .iter()
            .filter_map(|v| v["persistentVolumeClaim"]["claimName"].as_str())
            .collect();
        assert_eq!(claims, ["models"]);
        assert_eq!(p["spec"]["restartPolicy"], "OnFailure");
        assert_eq!(p["spec"]["automountServiceAccountToken"], false);
        // Ranks outside the world are not pods.
        assert!(worker(&j, 0, "10.1.0.5", "uid-0")?.is_none());
        assert!(worker(&j, 3, "10.1.0.5", "uid-0")?.is_none());
        Ok(())
    }

    #[test]
    fn the_first_pod_listens_for_the_rendezvous_at_its_own_ip() -> Result<(), serde_json::Error> {
        let j = job(json!({"image": "t:1", "model": "m", "gpus": 2, "nodes": 2}));
        let aux = super::super::aux_pods::trainer(&j, "floe:1")?.expect("a trainer");
        let p = serde_json::to_value(&aux.pod)?;
        let c = p["spec"]["containers"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["name"] == "trainer"))
            .expect("the trainer container")
            .clone();
        let args = c["args"].to_string();
        assert!(args.contains("--node-rank=0"), "{args}");
        assert!(args.contains("--master-addr=$(FLOE_POD_IP)"), "{args}");
        assert_eq!(
            c["env"][0]["valueFrom"]["fieldRef"]["fieldPath"],
            "status.podIP"
        );
        assert!(c["ports"].to_string().contains("29500"));
        // One node: no rendezvous of its own.
        let one = job(json!({"image": "t:1", "model": "m", "gpus": 2}));
        let p = serde_json::to_value(
            super::super::aux_pods::trainer(&one, "floe:1")?
                .expect("a trainer")
                .pod,
        )?;
        assert!(p.to_string().contains("--standalone"));
        assert!(!p.to_string().contains("FLOE_POD_IP"));
        assert!(worker_names(&one).is_empty());
        Ok(())
    }

    #[test]
    fn a_pod_of_a_replaced_leader_or_a_failed_one_is_replaced() {
        assert_eq!(action(None, "u1"), WorkerAction::Create);
        let joined = json!({LEADER_UID_ANNOTATION: "u1"});
        assert_eq!(
            action(Some(&pod(joined.clone(), "Running")), "u1"),
            WorkerAction::Keep
        );
        assert_eq!(
            action(Some(&pod(joined.clone(), "Succeeded")), "u1"),
            WorkerAction::Keep
        );
        assert!(matches!(
            action(Some(&pod(joined.clone(), "Running")), "u2"),
            WorkerAction::Replace(_)
        ));
        assert!(matches!(
            action(Some(&pod(joined, "Failed")), "u1"),
            WorkerAction::Replace(_)
        ));
        assert!(matches!(
            action(Some(&pod(json!({}), "Running")), "u1"),
            WorkerAction::Replace(_)
        ));
    }

    #[test]
    fn a_leader_without_an_ip_or_being_deleted_has_no_workers_yet() {
        let mut p: Pod = serde_json::from_value(json!({
            "metadata": {"name": "j-trainer", "uid": "u1"}, "status": {"phase": "Pending"}}))
        .expect("a pod");
        assert_eq!(leader_identity(&p), None);
        p.status.get_or_insert_with(Default::default).pod_ip = Some("10.0.0.2".into());
        assert_eq!(leader_identity(&p), Some(("10.0.0.2", "u1")));
        p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        assert_eq!(leader_identity(&p), None);
    }
}
