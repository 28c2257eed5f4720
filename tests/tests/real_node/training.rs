//! A `train` job on the real node: the operator's trainer pods run on the kubelet — the first
//! with the real vLLM serving the policy behind `floe policy-proxy` and the real
//! `floe-trainer`, the second (`train.nodes: 2`) joining it by torchrun's static rendezvous at
//! its pod IP over the node's bridge, the model sharded over the two (FSDP2, gloo). Sessions in
//! pool pods sample the policy through the job's Service, ship their trajectories to the
//! ingest, and the trainer takes real steps that the job's status shows. The first pod is
//! deleted after a step: its successor resumes from the checkpoint it wrote on the job's claim
//! and trains every acknowledged trajectory once over both. One task's agent fills its own
//! layer after its call: the kubelet evicts its pod with no grace period, and the trainer
//! stores that session as a loss (reward 0) from the snapshot its gateway posted before the
//! reply, on the operator's word that the eviction was the agent's doing.
//!
//! The trainer image runs the tests' vLLM venv from the pod's model volume (a read-only
//! hostPath PersistentVolume of the cache holding it and the models): torch's CUDA build is
//! ~6 GB with its CUDA libraries, too much to import into the node on every run
//! (`scripts/kube-test-cluster/images.sh`).

use super::*;
use floe_tests::processes::KillOnDrop;
use std::path::Path;

/// The learning agent: one model call through the gateway, its reply kept for the grader. Told
/// to fill its disk, it then writes 200 MiB into its own layer (`/tmp`), past its backstop of
/// four times the pool's `diskBudget`, and waits to be evicted.
const LEARN_AGENT: &str = r#"
import json, os, pathlib, time, urllib.request
base = os.environ["OPENAI_BASE_URL"].rstrip("/")
body = {"model": "policy", "max_tokens": 12,
        "messages": [{"role": "user", "content": os.environ["FLOE_INSTRUCTION"]}]}
req = urllib.request.Request(base + "/chat/completions", data=json.dumps(body).encode(),
                             headers={"content-type": "application/json",
                                      "authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
reply = json.load(urllib.request.urlopen(req, timeout=120))
pathlib.Path("reply.txt").write_text(reply["choices"][0]["message"]["content"] or "")
if "fill your disk" in os.environ["FLOE_INSTRUCTION"]:
    with open("/tmp/fill", "wb") as f:
        for _ in range(200):
            f.write(b"\0" * (1 << 20))
    time.sleep(150)
"#;

/// The pool's disk budget: the agent container's own layer may hold four times it (32 MiB).
const DISK_BUDGET: &str = "8Mi";

/// The grader (a hidden file): shorter replies score higher, so the rewards of a group differ
/// and each group trains (a group whose rewards are all equal has no advantage to learn from).
const GRADE: &str = r#"
import json, pathlib
reply = pathlib.Path("reply.txt").read_text() if pathlib.Path("reply.txt").exists() else ""
pathlib.Path("reward.json").write_text(json.dumps({"reward": max(0.0, 1.0 - len(reply) / 60)}))
"#;

fn task(id: &str, question: &str) -> Value {
    json!({"id": id, "instruction": question,
           "evaluation": {"hiddenFiles": {"grade.py": GRADE}}})
}

/// How the test loses the first trainer pod after a step.
#[derive(Clone, Copy)]
enum Loss {
    /// Deleted as `kubectl delete`, a drain or an eviction do: the trainer gets SIGTERM and
    /// writes a stop checkpoint.
    Deleted,
    /// Force-deleted (grace 0, as `kubectl delete --force --grace-period=0` or a lost node's
    /// pod removed): the object goes at once, the kubelet kills the containers, and the new
    /// pod of the same name may start while the old process still dies. The successor
    /// resumes from the last periodic checkpoint (every step here).
    ForceDeleted,
}

#[tokio::test]
async fn a_train_job_takes_real_steps_in_real_trainer_pods_and_outlives_losing_one() -> Result<()> {
    train_job_outlives_losing_its_trainer_pod(Loss::Deleted).await
}

#[tokio::test]
#[ignore = "FLOE_TEST_FULL=1 only; in CI: the deleted-pod variant above (same resume and \
            trained-once checks) and test_checkpoint.py (a trainer killed mid-checkpoint)"]
async fn a_train_job_outlives_its_trainer_pod_force_deleted() -> Result<()> {
    train_job_outlives_losing_its_trainer_pod(Loss::ForceDeleted).await
}

async fn train_job_outlives_losing_its_trainer_pod(loss: Loss) -> Result<()> {
    // Alone on the node: vLLM and a training step in pods, beside the other tests' pods and
    // the two host vLLMs, would starve this 2-core machine and their time limits. And alone
    // on the machine's memory: never beside another test binary's own vLLM and trainers
    // (`scripts/test.sh` runs this suite beside `local_train`'s).
    let node_use = NodeUse::Alone(NODE_USE.write().await);
    let _memory = memory_lease("the real node's train job", Share::Exclusive)?;
    let work = prepare_as("train", node_use).await?;
    let (n, images, client, ns) = (
        work.n,
        work.images,
        work.client.clone(),
        work.ns.name.clone(),
    );
    let (Some(trainer_image), Some(volume)) = (&images.trainer, &images.trainer_volume) else {
        bail!("no trainer image: FLOE_TEST_PYTHON must name the vLLM venv's python (scripts/test.sh sets it)");
    };
    let (_, models) = floe_tests::vllm::setup()?;
    let model = models.join("smollm2-135m-instruct");
    let in_volume = model
        .strip_prefix(volume)
        .with_context(|| format!("{} is not under {}", model.display(), volume.display()))?;
    // The model volume, read-only (the venv rides on it).
    n.host_path_claim(&client, &ns, "models", volume, "ReadOnlyMany", "Retain")
        .await?;
    // The checkpoint claim: a hostPath the trainer pods' group may write (root-owned, mode
    // 0775, group 1000: the operator's fsGroup; hostPath volumes are not chowned to it).
    let checkpoints = tempfile::Builder::new()
        .prefix("floe-node-checkpoints")
        .tempdir()?;
    owned_dir(checkpoints.path(), "0:1000")?;
    std::fs::set_permissions(
        checkpoints.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o775),
    )?;
    n.host_path_claim(
        &client,
        &ns,
        "checkpoints",
        checkpoints.path(),
        "ReadWriteOnce",
        "Retain",
    )
    .await?;
    apply(
        &client,
        &ns,
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "agent"},
               "data": {"agent.py": AGENT, "learn.py": LEARN_AGENT}}),
    )
    .await?;
    let _operator = Operator::start_on(&n.cluster, &images.floe, &ns, &[], &[])?;
    warm_pool_of(n, &client, &ns, "python", &images.python, Some(DISK_BUDGET)).await?;
    let checkpoint = match loss {
        Loss::Deleted => json!({"claimName": "checkpoints"}),
        Loss::ForceDeleted => json!({"claimName": "checkpoints", "everySteps": 1}),
    };
    let job = json!({"apiVersion": "floe.dev/v1alpha1", "kind": "RolloutJob",
        "metadata": {"name": "learn"},
        "spec": {"numSamples": 2, "concurrency": 2, "poolRef": {"name": "python"},
                 "harness": {"preset": "custom", "command": ["python3", "/opt/agent/learn.py"]},
                 "evaluator": {"command": ["python3", "grade.py"],
                               "reward": {"source": "RewardFile", "path": "reward.json",
                                          "passThreshold": 0.5}},
                 "sampling": {"maxResponseTokens": 12},
                 "timeouts": {"agentSeconds": 180, "evaluatorSeconds": 30},
                 "tasks": {"inline": [task("fruit", "Name a fruit."),
                                      task("colour", "Name a colour."),
                                      task("tree", "Name a tree, then fill your disk.")]},
                 "train": {"image": trainer_image, "model": in_volume.display().to_string(),
                           "modelClaimName": "models", "gpus": 0, "nodes": 2, "epochs": 2,
                           // The checkpoints and every acknowledged trajectory outlive
                           // the pods.
                           "checkpoint": checkpoint,
                           "memoryPlan": "Warn",
                           "maxStaleness": 4,
                           // Held-out rounds: the base policy, before any session of the
                           // job's own, and the final one, once the trainer finished.
                           "heldOut": {"tasks": {"inline": [task("animal", "Name an animal.")]},
                                       "everySteps": 100, "samples": 2},
                           "vllm": {"gpus": 0, "args": ["--dtype", "float32", "--enforce-eager",
                                                        "--max-model-len", "2048"]},
                           "grpo": {"groupsPerStep": 1, "learningRate": 1e-5,
                                    "microBatchSize": 4}}}});
    apply(&client, &ns, job).await?;
    // What the first trainer pod logs, once the test follows it before deleting it: its logs
    // go with it, and its rulings explain an evicted session missing from the claim.
    let first_log = tempfile::NamedTempFile::new()?;
    // The second trainer pod, made once the first has an IP, pointed at it.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let leader_ip = eventually_within(
        240,
        "the second trainer pod, joined to the first",
        async || {
            let (Some(first), Some(second)) = (
                pods.get_opt("learn-trainer").await?,
                pods.get_opt("learn-trainer-1").await?,
            ) else {
                return Ok(None);
            };
            let ip = first.status.and_then(|s| s.pod_ip).unwrap_or_default();
            let args = second
                .spec
                .map(|s| s.containers[0].args.clone().unwrap_or_default());
            let joined = args.is_some_and(|a| a.contains(&format!("--master-addr={ip}")));
            Ok((joined && !ip.is_empty()).then_some(ip))
        },
    )
    .await
    .with_context(|| trainer_logs(n, &ns, first_log.path()))?;
    // The first's trainer planned its step for a sharded world: each process holds half the
    // state plus the layers it gathers.
    let http = reqwest::Client::new();
    let plan = eventually_within(300, "the trainer's status", async || {
        let url = format!("http://{leader_ip}:8100/v1/status");
        let Ok(reply) = http.get(&url).send().await else {
            return Ok(None);
        };
        let status: Value = reply.json().await?;
        Ok(status.get("memoryPlan").cloned())
    })
    .await
    .with_context(|| trainer_logs(n, &ns, first_log.path()))?;
    assert!(
        plan["items"]["gathered layers"]
            .as_f64()
            .is_some_and(|b| b > 0.0),
        "{plan}"
    );
    // Lost mid-job, once it has taken a step: the first trainer pod deleted (as `kubectl
    // delete`, a drain or an eviction do). Stopping, it writes a checkpoint on the claim with
    // the second pod's half of the state; the operator makes a new first pod (and a new second
    // one, joined to it), which resumes from that checkpoint and replays the acknowledged
    // trajectories it had not trained.
    let status_of = |ip: String| {
        let http = http.clone();
        async move {
            let Ok(reply) = http.get(format!("http://{ip}:8100/v1/status")).send().await else {
                return Ok::<_, anyhow::Error>(None);
            };
            Ok(reply.json::<Value>().await.ok())
        }
    };
    let step_then = eventually_within(300, "the trainer's first step", async || {
        Ok(status_of(leader_ip.clone())
            .await?
            .and_then(|s| s["step"].as_u64())
            .filter(|step| *step >= 1))
    })
    .await
    .with_context(|| trainer_logs(n, &ns, first_log.path()))?;
    let first_uid = pods
        .get("learn-trainer")
        .await?
        .metadata
        .uid
        .context("the first trainer pod's uid")?;
    let params = match loss {
        Loss::Deleted => kube::api::DeleteParams::default(),
        Loss::ForceDeleted => {
            // Killed with no warning, no stop checkpoint: the successor resumes from the last
            // periodic one, which must be whole on the claim first (the step shows in the
            // status before its checkpoint is renamed into place).
            eventually_within(120, "the step's checkpoint on the claim", async || {
                Ok(latest_checkpoint(checkpoints.path())?.filter(|s| *s >= step_then))
            })
            .await?;
            kube::api::DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            }
        }
    };
    let _follow = KillOnDrop(
        std::process::Command::new(&n.cluster.kubectl)
            .args(["logs", "-f", "-n", &ns, "learn-trainer", "-c", "trainer"])
            .env("KUBECONFIG", &n.cluster.kubeconfig)
            .stdout(first_log.reopen()?)
            .stderr(std::process::Stdio::null())
            .spawn()?,
    );
    // Following before the pod goes (a force-deleted one may be gone before kubectl asks).
    eventually_within(30, "the first trainer pod's log followed", async || {
        Ok((std::fs::metadata(first_log.path())?.len() > 0).then_some(()))
    })
    .await?;
    eprintln!("[test] deleting the first trainer pod after step {step_then} ({params:?})");
    pods.delete("learn-trainer", &params).await?;
    let resumed = eventually_within(
        480,
        "a new first trainer pod, resumed from the checkpoint",
        async || {
            let Some(pod) = pods.get_opt("learn-trainer").await? else {
                return Ok(None);
            };
            if pod.metadata.uid.as_deref() == Some(first_uid.as_str()) {
                return Ok(None);
            }
            let Some(ip) = pod.status.and_then(|s| s.pod_ip) else {
                return Ok(None);
            };
            Ok(status_of(ip)
                .await?
                .and_then(|s| s["resumedFromStep"].as_u64()))
        },
    )
    .await
    .with_context(|| trainer_logs(n, &ns, first_log.path()))?;
    assert!(
        resumed >= step_then,
        "resumed from step {resumed}, after step {step_then}"
    );
    let jobs: Api<RolloutJob> = Api::namespaced(client.clone(), &ns);
    // The trainer pod loads vLLM and the model on this 2-core node (~1-2 min) before any
    // session starts; then 12 sessions (three tasks, two epochs) and up to four steps.
    let done = eventually_within(600, "the train job to finish", async || {
        let job = jobs.get("learn").await?;
        let phase = job.status.as_ref().and_then(|s| s.phase);
        Ok(matches!(
            phase,
            Some(RolloutJobPhase::Succeeded | RolloutJobPhase::Failed)
        )
        .then_some(job))
    })
    .await
    .with_context(|| trainer_logs(n, &ns, first_log.path()))?;
    let status = done.status.context("status")?;
    if status.phase != Some(RolloutJobPhase::Succeeded) {
        bail!(
            "{status:?}\n{}\n{}",
            pod_logs(n, &ns)?,
            trainer_logs(n, &ns, first_log.path())
        );
    }
    assert_eq!(status.sessions.total, 12, "{status:?}");
    assert_eq!(
        (status.sessions.succeeded, status.sessions.failed),
        (8, 4),
        "the tree task's four sessions evicted, failed without a retry: {status:?}"
    );
    // The held-out rounds, in real pods against the real trainer's vLLM: version 0, and the
    // final version once the trainer finished, each sampled by the weights it names (the
    // gateways read vLLM's version header).
    let held_out = status.held_out.clone().context("status.heldOut")?;
    let rounds: Vec<(i64, bool, i32, Vec<i64>)> = held_out
        .rounds
        .iter()
        .map(|r| (r.step, r.last, r.scored, r.policy_versions.clone()))
        .collect();
    let last = status.trainer.as_ref().map_or(0, |t| t.policy_version);
    assert_eq!(
        rounds,
        [(0, false, 2, vec![0, 0]), (last, true, 2, vec![last, last])],
        "{held_out:?}"
    );
    // The trainer's own figures, read from its /v1/status by the operator: real steps, each
    // pushed into the pod's vLLM as the next policy version.
    let trainer = status
        .trainer
        .clone()
        .context("the trainer's progress in the status")?;
    assert!(trainer.finished, "{trainer:?}");
    assert!(
        trainer.step >= 1 && trainer.policy_version >= 1,
        "{trainer:?}\n{}",
        trainer_logs(n, &ns, first_log.path())
    );
    assert!(trainer.final_model.is_some(), "{trainer:?}");
    assert!(trainer.step as u64 >= resumed, "{trainer:?}");
    // Each acknowledged trajectory trained once over both pods: the checkpoint the second
    // trainer wrote when it finished lists every session its steps and its predecessor's
    // trained (a group whose samples scored alike trains in no step).
    let last = latest_checkpoint(checkpoints.path())?.context("no checkpoint on the claim")?;
    assert_eq!(last, trainer.step as u64, "{trainer:?}");
    let state: Value = serde_json::from_str(&std::fs::read_to_string(
        checkpoints.path().join(format!("ckpt-{last}/state.json")),
    )?)?;
    // By session, without the attempt suffix of a retry (`-r<n>`).
    let mut trained: Vec<&str> = state["trained_sessions"]
        .as_array()
        .context("trained_sessions")?
        .iter()
        .filter_map(Value::as_str)
        .map(|s| match s.rsplit_once("-r") {
            Some((base, n)) if n.chars().all(|c| c.is_ascii_digit()) => base,
            _ => s,
        })
        .collect();
    trained.sort_unstable();
    let count = trained.len();
    trained.dedup();
    assert_eq!(
        (count, trained.len()),
        (2 * last as usize, 2 * last as usize),
        "two samples a step, each once: {state}"
    );
    // The first pod as the kubelet ran it: its three containers up, none restarted. The
    // second's process ended when the first's finished; the job's end deletes its pod.
    let pod = pods.get("learn-trainer").await?;
    let containers = pod
        .status
        .and_then(|s| s.container_statuses)
        .unwrap_or_default();
    for c in &containers {
        assert_eq!(c.restart_count, 0, "{} restarted: {:?}", c.name, c);
    }
    assert_eq!(containers.len(), 3, "{containers:?}");
    // Each evicted session is on the claim as a trajectory of its own: its last snapshot
    // (posted before the reply the agent acted on), scored 0 on the operator's ruling. None is
    // left out of its group as a sample that vanished. (An attempt whose call failed while the
    // trainer pod was gone was retried: it shipped untrainable, as infrastructure.)
    let mut trees = Vec::new();
    for entry in std::fs::read_dir(checkpoints.path().join("ingest"))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "json") {
            let t: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
            if t["task"] == "tree" {
                trees.push(t);
            }
        }
    }
    let (evicted, retried): (Vec<Value>, Vec<Value>) = trees
        .into_iter()
        .partition(|t| t["status"] == "interrupted");
    let brief = |ts: &[Value]| -> Vec<String> {
        ts.iter()
            .map(|t| format!("{} {} {}", t["session"], t["status"], t["trainable"]))
            .collect()
    };
    assert_eq!(
        evicted.len(),
        4,
        "every evicted session scored from its snapshot: {:?} (others: {:?})\n{}",
        brief(&evicted),
        brief(&retried),
        trainer_logs(n, &ns, first_log.path())
    );
    assert!(
        retried
            .iter()
            .all(|t| t["trainable"] == false && t["status"] == "error"),
        "{:?}",
        brief(&retried)
    );
    for t in &evicted {
        assert_eq!(
            (&t["status"], &t["trainable"], &t["reward"]),
            (&json!("interrupted"), &json!(true), &json!(0.0)),
            "{t}"
        );
        assert!(
            t["evaluation"]["detail"]["agent_fault"]
                .as_str()
                .is_some_and(|why| why.contains("ephemeral")),
            "{}",
            t["evaluation"]
        );
        assert!(
            t["stats"]["sampled_tokens"].as_u64().is_some_and(|n| n > 0),
            "the agent's call, as sampled: {}",
            t["stats"]
        );
    }
    eventually_within(120, "the second trainer pod gone", async || {
        Ok(pods
            .get_opt("learn-trainer-1")
            .await?
            .is_none()
            .then_some(()))
    })
    .await?;
    Ok(())
}

/// The step of the newest whole checkpoint on the claim (`ckpt-<step>`; one being written has
/// another name until it is renamed).
fn latest_checkpoint(dir: &std::path::Path) -> Result<Option<u64>> {
    Ok(std::fs::read_dir(dir)?
        .filter_map(|e| {
            e.ok()?
                .file_name()
                .to_str()?
                .strip_prefix("ckpt-")?
                .parse::<u64>()
                .ok()
        })
        .max())
}

/// The trainer pod's containers' last lines.
fn trainer_logs(n: &TestNode, ns: &str, first_log: &Path) -> String {
    [
        ("learn-trainer", "vllm"),
        ("learn-trainer", "trainer"),
        ("learn-trainer", "policy"),
        ("learn-trainer-1", "trainer"),
    ]
    .iter()
    .map(|(pod, c)| {
        let out = n
            .cluster
            .kubectl(&["logs", "-n", ns, pod, "-c", c, "--tail", "30"], None)
            .map_or_else(
                |e| e.to_string(),
                |o| String::from_utf8_lossy(&o.stdout).into_owned(),
            );
        format!("--- {pod} {c}\n{out}")
    })
    .chain(std::iter::once(rulings_and_snapshots(n, ns, first_log)))
    .collect::<Vec<_>>()
    .join("\n")
}

/// What the trainer made of each ruling, and every snapshot a session pod's gateway could not
/// ship: what an evicted session missing from the claim needs explained.
fn rulings_and_snapshots(n: &TestNode, ns: &str, first_log: &Path) -> String {
    let lines = |args: &[&str], keep: &dyn Fn(&str) -> bool| {
        n.cluster.kubectl(args, None).map_or_else(
            |e| e.to_string(),
            |o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .filter(|l| keep(l))
                    .collect::<Vec<_>>()
                    .join("\n")
            },
        )
    };
    let rulings = lines(
        &["logs", "-n", ns, "learn-trainer", "-c", "trainer"],
        &|l| l.contains("the agent's"),
    );
    let snapshots = lines(
        &[
            "logs",
            "-n",
            ns,
            "--prefix",
            "--all-containers",
            "--tail=-1",
            "-l",
            "app.kubernetes.io/managed-by=floe",
        ],
        &|l| l.contains("snapshot"),
    );
    // The deleted first pod's, as the test followed them: its rulings, and what it made of
    // each snapshot it was posted (a refusal logs; a kept one does not).
    let deleted = std::fs::read_to_string(first_log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("the agent's") || l.contains("snapshot") || l.contains("step"))
        .collect::<Vec<_>>()
        .join("\n");
    format!(
        "--- rulings (learn-trainer)\n{rulings}\n--- the deleted learn-trainer's rulings, \
         snapshots and steps\n{deleted}\n--- snapshots not shipped (session pods)\n{snapshots}"
    )
}
