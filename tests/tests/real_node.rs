//! The operator on a genuine node: a real kubelet (containerd + runc) runs the sandbox pods,
//! the gateway sidecar's real readiness probe marks them READY, the runner in the harness image
//! runs a session through the gateway to the real vLLM, the kubelet writes the termination
//! message the operator reads, and the sft collector writes the dataset on a real volume. Pods
//! reach the job's Services by name through the node's cluster DNS (`floe_tests::cluster_dns`)
//! and the model server through a Service in front of the host, as on a real cluster. A pod
//! deleted mid-session (the kubelet stops it) is retried on a fresh pod and scored once.

use std::net::SocketAddr;

use anyhow::{bail, Context, Result};
use floe_crds::gateway_pool::GatewayPool;
use floe_crds::rollout_job::{RolloutJob, RolloutJobPhase};
use floe_tests::cluster_dns::ClusterDns;
use floe_tests::node::{node, tail, Forward, TestNode};
use floe_tests::operator::{eventually_within, Operator};
use floe_tests::{vllm, TestNamespace};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{json, Value};

/// The custom harness: one model call through the gateway, then a fix for the task it knows
/// (`fix-add`); any other task is left unsolved, so its hidden test fails (reward 0). Asked to
/// work "slowly", it sleeps 20 s first (a pod to delete mid-session).
const AGENT: &str = r#"
import json, os, pathlib, time, urllib.request
base = os.environ["OPENAI_BASE_URL"].rstrip("/")
body = {"model": "policy", "max_tokens": 16,
        "messages": [{"role": "user", "content": os.environ["FLOE_INSTRUCTION"]}]}
req = urllib.request.Request(base + "/chat/completions", data=json.dumps(body).encode(),
                             headers={"content-type": "application/json",
                                      "authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
reply = json.load(urllib.request.urlopen(req, timeout=120))
print("model said:", reply["choices"][0]["message"]["content"])
if "slowly" in os.environ["FLOE_INSTRUCTION"]:
    time.sleep(20)
if pathlib.Path("calc.py").exists():
    pathlib.Path("calc.py").write_text("def add(a, b):\n    return a + b\n")
"#;

async fn apply(client: &Client, ns: &str, object: Value) -> Result<()> {
    let kind = object["kind"].as_str().unwrap_or_default().to_string();
    match kind.as_str() {
        "GatewayPool" => {
            Api::<GatewayPool>::namespaced(client.clone(), ns)
                .create(&PostParams::default(), &serde_json::from_value(object)?)
                .await?;
        }
        "RolloutJob" => {
            Api::<RolloutJob>::namespaced(client.clone(), ns)
                .create(&PostParams::default(), &serde_json::from_value(object)?)
                .await?;
        }
        _ => {
            let yaml = serde_yaml::to_string(&object)?;
            let out = node()
                .cluster
                .kubectl(&["apply", "-n", ns, "-f", "-"], Some(yaml.as_bytes()))?;
            if !out.status.success() {
                bail!(
                    "kubectl apply {kind}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }
    Ok(())
}

/// The model server as pods see it: a Service without selector whose endpoint is the host's
/// bridge address, where a relay forwards to the real vLLM on loopback.
async fn model_service(n: &TestNode, client: &Client, ns: &str) -> Result<Forward> {
    let port = n.host_port(0)?;
    let vllm: SocketAddr = vllm()
        .url
        .trim_start_matches("http://")
        .parse()
        .context("vLLM URL")?;
    let forward = Forward::start(SocketAddr::new(n.host_ip.into(), port), vllm).await?;
    apply(
        client,
        ns,
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "teacher"},
               "spec": {"ports": [{"port": 8000, "targetPort": port}]}}),
    )
    .await?;
    apply(
        client,
        ns,
        json!({"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "teacher"},
               "subsets": [{"addresses": [{"ip": n.host_ip.to_string()}],
                            "ports": [{"port": port}]}]}),
    )
    .await?;
    Ok(forward)
}

/// A hostPath volume for the dataset, owned by the collector's user (hostPath ignores
/// `fsGroup`), bound to the job's claim.
async fn dataset_volume(client: &Client, ns: &str, dir: &std::path::Path) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    std::process::Command::new("chown")
        .args(["65532:65532"])
        .arg(dir)
        .status()?;
    let pv = format!("{ns}-data");
    apply(
        client,
        ns,
        json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
               "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                        "persistentVolumeReclaimPolicy": "Delete", "storageClassName": "",
                        "hostPath": {"path": dir.display().to_string(), "type": "Directory"},
                        "claimRef": {"namespace": ns, "name": "data"}}}),
    )
    .await?;
    apply(
        client,
        ns,
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "data"},
               "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": pv,
                        "resources": {"requests": {"storage": "1Gi"}}}}),
    )
    .await
}

fn ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// What the kubelet applied to the harness container, seen from inside it.
fn security_facts(n: &TestNode, ns: &str, pod: &str) -> Result<String> {
    let out = n.cluster.kubectl(
        &[
            "exec",
            "-n",
            ns,
            pod,
            "-c",
            "sandbox",
            "--",
            "sh",
            "-c",
            "id -u; grep -E '^(CapEff|NoNewPrivs):' /proc/self/status; \
             ls /var/run/secrets/kubernetes.io/serviceaccount 2>&1 || true",
        ],
        None,
    )?;
    if !out.status.success() {
        bail!("kubectl exec: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8(out.stdout)?)
}

/// The sandbox pods' logs (every container), for a failure message.
fn pod_logs(n: &TestNode, ns: &str) -> Result<String> {
    let out = n.cluster.kubectl(
        &[
            "logs",
            "-n",
            ns,
            "-l",
            "floe.dev/pool",
            "--all-containers",
            "--prefix",
            "--tail=20",
        ],
        None,
    )?;
    Ok(format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}

#[tokio::test]
async fn real_pods_warm_run_sft_jobs_to_a_dataset_and_survive_a_deleted_pod() -> Result<()> {
    let n = node();
    let images = n.images()?;
    let client = n.cluster.client().await?;
    n.cluster.install_crds(&client).await?;
    let ns = TestNamespace::create(&n.cluster, &client, "node").await?;
    let ns = ns.name.clone();
    let _dns = ClusterDns::start(client.clone(), SocketAddr::new(n.host_ip.into(), 53)).await?;
    let _model = model_service(n, &client, &ns).await?;
    let data = tempfile::Builder::new()
        .prefix("floe-node-data")
        .tempdir()?;
    dataset_volume(&client, &ns, data.path()).await?;
    apply(
        &client,
        &ns,
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "agent"},
               "data": {"agent.py": AGENT}}),
    )
    .await?;
    let _operator = Operator::start_on(&n.cluster, &images.floe, &ns, &[], &[])?;

    apply(
        &client,
        &ns,
        json!({"apiVersion": "floe.dev/v1alpha1", "kind": "GatewayPool",
               "metadata": {"name": "python"},
               "spec": {"replicas": 2,
                        "template": {"image": images.python, "imagePullPolicy": "Never",
                                     "volumes": [{"name": "agent", "configMap": {"name": "agent"}}],
                                     "volumeMounts": [{"name": "agent", "mountPath": "/opt/agent",
                                                       "readOnly": true}]},
                        "prepare": [{"name": "interpreter",
                                     "command": ["python3", "-c", "import json, sqlite3"]}]}}),
    )
    .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pools: Api<GatewayPool> = Api::namespaced(client.clone(), &ns);
    let warm = eventually_within(120, "two READY pods from the real kubelet", async || {
        let pool = pools.get("python").await?;
        let ready_replicas = pool.status.as_ref().map_or(0, |s| s.ready_replicas);
        let listed = pods
            .list(&ListParams::default().labels("floe.dev/pool=python"))
            .await?;
        let running: Vec<Pod> = listed.items.into_iter().filter(ready).collect();
        Ok((ready_replicas == 2 && running.len() >= 2).then_some(running))
    })
    .await
    .with_context(|| tail(&n.log("kubelet"), 20))?;
    let facts = security_facts(n, &ns, &warm[0].name_any())?;
    let lines: Vec<&str> = facts.lines().collect();
    assert_eq!(lines.first(), Some(&"1000"), "the image's user: {facts}");
    assert!(facts.contains("CapEff:\t0000000000000000"), "{facts}");
    assert!(facts.contains("NoNewPrivs:\t1"), "{facts}");
    assert!(
        facts.contains("No such file or directory"),
        "no service-account token: {facts}"
    );

    let fix_add = json!({"id": "fix-add", "instruction": "calc.py: add() subtracts. Fix it.",
        "files": {"calc.py": "def add(a, b):\n    return a - b\n"},
        "evaluation": {"hiddenFiles": {"test_hidden.py": "from calc import add\nassert add(2, 3) == 5\n"}}});
    let fix_max = json!({"id": "fix-max", "instruction": "biggest() returns the smallest. Fix it.",
        "files": {"listmax.py": "def biggest(xs):\n    return min(xs)\n"},
        "evaluation": {"hiddenFiles": {"test_hidden.py":
            "from listmax import biggest\nassert biggest([3, 9, 2]) == 9\n"}}});
    apply(
        &client,
        &ns,
        sft_job("fix", &ns, 2, "/run", json!([fix_add, fix_max])),
    )
    .await?;
    let status = finished(n, &client, &ns, "fix").await?;
    assert_eq!(status.sessions.total, 4, "{status:?}");
    assert_eq!(status.sessions.succeeded, 4, "{status:?}");
    assert_eq!(status.sessions.failed, 0, "{status:?}");
    // The collector wrote the two solved sessions (reward 1) and only those.
    let lines = dataset(&data.path().join("run"), 2).await?;
    for t in &lines {
        assert_eq!(t["task"], "fix-add", "{t}");
        assert_eq!(t["reward"], 1.0, "{t}");
        let traces = t["traces"].as_array().context("traces")?;
        assert!(
            traces.iter().any(|tr| tr["response_token_ids"]
                .as_array()
                .is_some_and(|ids| !ids.is_empty())),
            "sampled token ids captured in the pod: {t}"
        );
    }

    // A sandbox pod deleted while its harness runs (the kubelet stops its containers): the
    // session runs again on a fresh pod and is scored once, never as the policy's 0.
    let mut slow = fix_add.clone();
    slow["id"] = "fix-add-slowly".into();
    slow["instruction"] = "calc.py: add() subtracts. Fix it, slowly.".into();
    apply(
        &client,
        &ns,
        sft_job("slow", &ns, 1, "/slow", json!([slow])),
    )
    .await?;
    let victim = eventually_within(120, "the slow session's harness to start", async || {
        let listed = pods
            .list(&ListParams::default().labels("floe.dev/job=slow"))
            .await?;
        Ok(listed.items.into_iter().next().map(|p| p.name_any()))
    })
    .await?;
    // The agent has made its model call and sleeps (20 s) when the pod goes.
    tokio::time::sleep(std::time::Duration::from_secs(6)).await;
    pods.delete(&victim, &Default::default()).await?;
    let status = finished(n, &client, &ns, "slow").await?;
    assert_eq!(status.sessions.succeeded, 1, "{status:?}");
    assert_eq!(status.sessions.failed, 0, "{status:?}");
    assert!(status.sessions.retried >= 1, "{status:?}");
    let lines = dataset(&data.path().join("slow"), 1).await?;
    assert_eq!(lines[0]["reward"], 1.0, "scored by the retry: {}", lines[0]);
    Ok(())
}

/// An sft job of the custom agent on the pool, its dataset under `path` of the claim.
fn sft_job(name: &str, ns: &str, samples: i32, path: &str, tasks: Value) -> Value {
    json!({"apiVersion": "floe.dev/v1alpha1", "kind": "RolloutJob",
           "metadata": {"name": name},
           "spec": {"numSamples": samples, "concurrency": 2, "poolRef": {"name": "python"},
                    "harness": {"preset": "custom", "command": ["python3", "/opt/agent/agent.py"]},
                    "evaluator": {"command": ["python3", "test_hidden.py"]},
                    "sampling": {"maxResponseTokens": 16},
                    "timeouts": {"agentSeconds": 120, "evaluatorSeconds": 30},
                    "sft": {"upstream": {"url": format!("http://teacher.{ns}.svc:8000"), "model": "policy"},
                            "output": {"claimName": "data", "path": path}, "minReward": 1},
                    "tasks": {"inline": tasks}}})
}

/// The job's status once it finished; an error with the pods' logs unless it succeeded.
async fn finished(
    n: &TestNode,
    client: &Client,
    ns: &str,
    name: &str,
) -> Result<floe_crds::rollout_job::RolloutJobStatus> {
    let jobs: Api<RolloutJob> = Api::namespaced(client.clone(), ns);
    let done = eventually_within(300, "the job to finish", async || {
        let job = jobs.get(name).await?;
        let phase = job.status.as_ref().and_then(|s| s.phase);
        Ok(matches!(
            phase,
            Some(RolloutJobPhase::Succeeded | RolloutJobPhase::Failed)
        )
        .then_some(job))
    })
    .await?;
    let status = done.status.context("status")?;
    if status.phase != Some(RolloutJobPhase::Succeeded) {
        bail!("{status:?}\n{}", pod_logs(n, ns)?);
    }
    Ok(status)
}

/// The `lines` trajectories of `dir/dataset.jsonl`, once the collector wrote them (no more).
async fn dataset(dir: &std::path::Path, lines: usize) -> Result<Vec<Value>> {
    let file = dir.join("dataset.jsonl");
    let got = eventually_within(30, "the dataset", async || {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let got: Vec<Value> = text
            .lines()
            .map(serde_json::from_str)
            .collect::<Result<_, _>>()?;
        Ok((got.len() >= lines).then_some(got))
    })
    .await?;
    assert_eq!(got.len(), lines, "{got:?}");
    Ok(got)
}
