//! The operator on a genuine node: a real kubelet (containerd + runc) runs the sandbox pods,
//! the gateway sidecar's real readiness probe marks them READY, the runner in the harness image
//! runs a session through the gateway to the real vLLM, the kubelet writes the termination
//! message the operator reads, and the sft collector writes the dataset on a real volume. Pods
//! reach the job's Services by name through the node's cluster DNS (`floe_tests::cluster_dns`)
//! and the model server through a Service in front of the host, as on a real cluster. A pod
//! deleted mid-session (the kubelet stops it) is retried on a fresh pod and scored once.

use anyhow::{bail, Context, Result};
use floe_crds::gateway_pool::GatewayPool;
use floe_crds::rollout_job::{RolloutJob, RolloutJobPhase};
use floe_tests::kubelet::pod_ready;
use floe_tests::node::{host_services, node, tail, NodeImages, TestNode};
use floe_tests::operator::{eventually_within, pool_ready, Operator};
use floe_tests::{chart, memory_lease, Share, TestNamespace};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use serde_json::{json, Value};

#[path = "real_node/grading.rs"]
mod grading;
#[path = "real_node/prometheus.rs"]
mod prometheus;
#[path = "real_node/swebench.rs"]
mod swebench;
#[path = "real_node/training.rs"]
mod training;

/// The custom harness: one model call through the gateway, then a fix for the task it knows
/// (`fix-add`); any other task is left unsolved, so its hidden test fails (reward 0). Asked to
/// work "slowly", it sleeps 20 s after its model call (a pod to delete mid-session), or after
/// that call failed (a pod that lives long enough for Prometheus to scrape the failure).
const AGENT: &str = r#"
import json, os, pathlib, time, urllib.request
slowly = "slowly" in os.environ["FLOE_INSTRUCTION"]
base = os.environ["OPENAI_BASE_URL"].rstrip("/")
body = {"model": "policy", "max_tokens": 16,
        "messages": [{"role": "user", "content": os.environ["FLOE_INSTRUCTION"]}]}
req = urllib.request.Request(base + "/chat/completions", data=json.dumps(body).encode(),
                             headers={"content-type": "application/json",
                                      "authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
try:
    reply = json.load(urllib.request.urlopen(req, timeout=120))
except Exception:
    if slowly:
        time.sleep(20)
    raise
print("model said:", reply["choices"][0]["message"]["content"])
if slowly:
    time.sleep(20)
if pathlib.Path("calc.py").exists():
    pathlib.Path("calc.py").write_text("def add(a, b):\n    return a + b\n")
"#;

async fn apply(client: &Client, ns: &str, object: Value) -> Result<()> {
    node().apply(client, ns, object).await
}

async fn model_service(n: &TestNode, client: &Client, ns: &str) -> Result<()> {
    n.model_service(client, ns).await
}

async fn dataset_volume(client: &Client, ns: &str, dir: &std::path::Path) -> Result<()> {
    node().dataset_volume(client, ns, dir).await
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

/// The tests share the node; the one that restarts its kubelet has it alone.
static NODE_USE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// How a test uses the node: beside the others, or alone.
enum NodeUse {
    Shared(#[allow(dead_code)] tokio::sync::RwLockReadGuard<'static, ()>),
    Alone(#[allow(dead_code)] tokio::sync::RwLockWriteGuard<'static, ()>),
}

/// The node, its images, a client, and a namespace where sessions can run: the model Service,
/// the dataset claim (on `data`), the agent's ConfigMap.
struct Work {
    _node_use: NodeUse,
    n: &'static TestNode,
    images: &'static NodeImages,
    client: Client,
    ns: TestNamespace,
    data: tempfile::TempDir,
}

async fn prepare(label: &str) -> Result<Work> {
    prepare_as(label, NodeUse::Shared(NODE_USE.read().await)).await
}

async fn prepare_as(label: &str, node_use: NodeUse) -> Result<Work> {
    let n = node();
    let images = n.images()?;
    let client = n.cluster.client().await?;
    n.cluster.install_crds(&client).await?;
    host_services(n)?;
    let ns = TestNamespace::create(&n.cluster, &client, label).await?;
    let client = &client;
    model_service(n, client, &ns.name).await?;
    let data = tempfile::Builder::new()
        .prefix("floe-node-data")
        .tempdir()?;
    dataset_volume(client, &ns.name, data.path()).await?;
    apply(
        client,
        &ns.name,
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "agent"},
               "data": {"agent.py": AGENT}}),
    )
    .await?;
    Ok(Work {
        _node_use: node_use,
        n,
        images,
        client: client.clone(),
        ns,
        data,
    })
}

/// The GatewayPool `python` of two pods, once both are READY (the operator must run).
async fn warm_pool(n: &TestNode, client: &Client, ns: &str, python: &str) -> Result<Vec<Pod>> {
    warm_pool_of(n, client, ns, "python", python, None).await
}

/// A sandbox template of `image` (imported, never pulled) with the ConfigMap `agent` at
/// `/opt/agent`, where the tests' custom harnesses run from.
fn agent_template(image: &str, agent: &str) -> Value {
    json!({"image": image, "imagePullPolicy": "Never",
           "volumes": [{"name": "agent", "configMap": {"name": agent}}],
           "volumeMounts": [{"name": "agent", "mountPath": "/opt/agent", "readOnly": true}]})
}

/// The GatewayPool `name` of two pods of `image`, once both are READY.
async fn warm_pool_of(
    n: &TestNode,
    client: &Client,
    ns: &str,
    name: &str,
    image: &str,
    disk_budget: Option<&str>,
) -> Result<Vec<Pod>> {
    let mut template = agent_template(image, "agent");
    if let Some(budget) = disk_budget {
        template["diskBudget"] = budget.into();
    }
    apply(
        client,
        ns,
        json!({"apiVersion": "floe.dev/v1alpha1", "kind": "GatewayPool",
               "metadata": {"name": name},
               "spec": {"replicas": 2,
                        "template": template,
                        "prepare": [{"name": "interpreter",
                                     "command": ["python3", "-c", "import json, sqlite3"]}]}}),
    )
    .await?;
    warm_pods(n, client, ns, name, 2).await
}

/// Pool `name`'s pods, once `count` are READY (the operator must run).
async fn warm_pods(
    n: &TestNode,
    client: &Client,
    ns: &str,
    name: &str,
    count: usize,
) -> Result<Vec<Pod>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pools: Api<GatewayPool> = Api::namespaced(client.clone(), ns);
    eventually_within(180, &format!("{count} READY pods of {name}"), async || {
        let pool = pools.get(name).await?;
        let ready_replicas = pool.status.as_ref().map_or(0, |s| s.ready_replicas);
        let listed = pods
            .list(&ListParams::default().labels(&format!("floe.dev/pool={name}")))
            .await?;
        let running: Vec<Pod> = listed.items.into_iter().filter(pod_ready).collect();
        Ok((ready_replicas as usize >= count && running.len() >= count).then_some(running))
    })
    .await
    .with_context(|| tail(&n.log("kubelet"), 20))
}

fn fix_add() -> Value {
    json!({"id": "fix-add", "instruction": "calc.py: add() subtracts. Fix it.",
        "files": {"calc.py": "def add(a, b):\n    return a - b\n"},
        "evaluation": {"hiddenFiles": {"test_hidden.py": "from calc import add\nassert add(2, 3) == 5\n"}}})
}

/// `fix_add`, which the agent solves after sleeping 20 s: a session to disturb while it runs.
fn fix_add_slowly() -> Value {
    let mut slow = fix_add();
    slow["id"] = "fix-add-slowly".into();
    slow["instruction"] = "calc.py: add() subtracts. Fix it, slowly.".into();
    slow
}

fn fix_max() -> Value {
    json!({"id": "fix-max", "instruction": "biggest() returns the smallest. Fix it.",
        "files": {"listmax.py": "def biggest(xs):\n    return min(xs)\n"},
        "evaluation": {"hiddenFiles": {"test_hidden.py":
            "from listmax import biggest\nassert biggest([3, 9, 2]) == 9\n"}}})
}

#[tokio::test]
async fn real_pods_warm_run_sft_jobs_to_a_dataset_and_survive_a_deleted_pod() -> Result<()> {
    let work = prepare("node").await?;
    let (n, images, client, ns) = (
        work.n,
        work.images,
        work.client.clone(),
        work.ns.name.clone(),
    );
    let data = &work.data;
    let _operator = Operator::start_on(&n.cluster, &images.floe, &ns, &[], &[])?;
    let warm = warm_pool(n, &client, &ns, &images.python).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let facts = security_facts(n, &ns, &warm[0].name_any())?;
    let lines: Vec<&str> = facts.lines().collect();
    assert_eq!(
        lines.first(),
        Some(&"1000"),
        "the default non-root user: {facts}"
    );
    assert!(facts.contains("CapEff:\t0000000000000000"), "{facts}");
    assert!(facts.contains("NoNewPrivs:\t1"), "{facts}");
    assert!(
        facts.contains("No such file or directory"),
        "no service-account token: {facts}"
    );

    // The collector writes as the directory's owner (hostPath ignores fsGroup).
    owned_dir(&data.path().join("run"), "1000:1000")?;
    let mut fix = sft_job("fix", &ns, 2, "/run", json!([fix_add(), fix_max()]));
    fix["spec"]["sft"]["output"]["runAsUser"] = 1000.into();
    fix["spec"]["sft"]["output"]["runAsGroup"] = 1000.into();
    apply(&client, &ns, fix).await?;
    let status = finished(n, &client, &ns, "fix").await?;
    eventually_within(30, "the job's Completed event", async || {
        let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), &ns);
        let listed = events.list(&ListParams::default()).await?.items;
        Ok(listed
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("Completed")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("fix")
            })
            .then_some(()))
    })
    .await?;
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

    // The job's summary beside its dataset; then the collector ends with the job.
    let summary: Value = eventually_within(60, "summary.json", async || {
        let text = std::fs::read_to_string(data.path().join("run/summary.json")).ok();
        Ok(text.and_then(|t| serde_json::from_str(&t).ok()))
    })
    .await?;
    assert_eq!(summary["job"], "fix", "{summary}");
    assert_eq!(summary["phase"], "Succeeded", "{summary}");
    assert_eq!(
        summary["sessions"],
        json!({"total": 4, "completed": 4, "failed": 0, "retries": 0})
    );
    assert_eq!(summary["reward"]["passRate"], 0.5, "{summary}");
    assert_eq!(
        summary["dataset"],
        json!({"file": "dataset.jsonl", "accepted": 2, "rejected": 2, "acceptanceRate": 0.5})
    );
    // The operator deletes it once the job ended; the kubelet then stops it (up to the 30 s
    // grace period) and the apiserver removes it. Over 60 s once, on a CI machine loaded by
    // the rest of the suite (session 28's second CI run).
    eventually_within(120, "the collector pod gone", async || {
        Ok(pods.get_opt("fix-dataset").await?.is_none().then_some(()))
    })
    .await?;

    // A sandbox pod deleted while its harness runs (the kubelet stops its containers): the
    // session runs again on a fresh pod and is scored once, never as the policy's 0.
    apply(
        &client,
        &ns,
        sft_job("slow", &ns, 1, "/slow", json!([fix_add_slowly()])),
    )
    .await?;
    // Assigned, not just claimed: a pod lost before its assignment was delivered is given back
    // unstarted, not a session to retry.
    let victim = eventually_within(120, "the slow session's harness to start", async || {
        let listed = pods
            .list(&ListParams::default().labels("floe.dev/job=slow"))
            .await?;
        Ok(listed
            .items
            .into_iter()
            .find(|p| p.annotations().contains_key("floe.dev/assigned"))
            .map(|p| p.name_any()))
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

    // A dataset directory the collector cannot write (root's, on a volume that ignores
    // fsGroup): the collector crash-loops, the job says why where users look, and holds no
    // pool pods meanwhile. Fixed on the volume, the job goes on by itself.
    let locked = data.path().join("locked");
    owned_dir(&locked, "0:0")?;
    apply(
        &client,
        &ns,
        sft_job("locked", &ns, 1, "/locked", json!([fix_add()])),
    )
    .await?;
    let jobs: Api<RolloutJob> = Api::namespaced(client.clone(), &ns);
    let why = eventually_within(120, "the job to say its collector fails", async || {
        let job = jobs.get("locked").await?;
        let message = job
            .status
            .iter()
            .flat_map(|s| s.conditions.iter())
            .find(|c| c.type_ == "Progressing")
            .map(|c| c.message.clone())
            .unwrap_or_default();
        Ok(message.contains("is failing").then_some(message))
    })
    .await?;
    assert!(
        why.contains("not writable by uid 65532 gid 65532") && why.contains("runAsUser"),
        "the collector's own words: {why}"
    );
    eventually_within(60, "no pool pod held for the locked job", async || {
        let held = pods
            .list(&ListParams::default().labels("floe.dev/job=locked"))
            .await?;
        Ok(held.items.is_empty().then_some(()))
    })
    .await?;
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), &ns);
    let listed = events.list(&ListParams::default()).await?.items;
    assert!(
        listed
            .iter()
            .any(|e| e.reason.as_deref() == Some("JobPodFailing")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("locked")),
        "a Warning Event names it"
    );
    owned_dir(&locked, "65532:65532")?;
    let status = finished(n, &client, &ns, "locked").await?;
    assert_eq!(status.sessions.succeeded, 1, "{status:?}");
    assert_eq!(status.sessions.retried, 0, "given back unused, not retried");
    Ok(())
}

/// `dir` on the node's disk, owned by `owner` (`uid:gid`), mode 0755.
fn owned_dir(dir: &std::path::Path, owner: &str) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    let chown = std::process::Command::new("chown")
        .arg(owner)
        .arg(dir)
        .status()?;
    anyhow::ensure!(chown.success(), "chown {owner} {}", dir.display());
    Ok(())
}

/// Pi, the unmodified harness CLI from npm, in real pods: its image (Node.js + Pi + python for
/// the task's test) warms to READY, Pi calls the real vLLM through the pod's gateway sidecar,
/// and its calls reach the dataset as token-level trajectories.
#[tokio::test]
async fn pi_runs_in_real_pods_against_the_real_vllm() -> Result<()> {
    let work = prepare("pi").await?;
    let (n, images, client, ns) = (
        work.n,
        work.images,
        work.client.clone(),
        work.ns.name.clone(),
    );
    let _operator = Operator::start_on(&n.cluster, &images.floe, &ns, &[], &[])?;
    warm_pool_of(n, &client, &ns, "pi", &images.harnesses, None).await?;
    let mut job = sft_job("pi-fix", &ns, 2, "/pi", json!([fix_add()]));
    job["spec"]["poolRef"]["name"] = "pi".into();
    job["spec"]["harness"] = json!({"preset": "pi", "api": "openai-chat",
                                    "settings": {"contextWindow": 8192}});
    // Every scored session in the dataset: a 135M model rarely fixes the bug.
    job["spec"]["sft"]["minReward"] = 0.into();
    apply(&client, &ns, job).await?;
    let status = finished(n, &client, &ns, "pi-fix").await?;
    assert_eq!(status.sessions.total, 2, "{status:?}");
    assert_eq!(status.sessions.succeeded, 2, "{status:?}");
    let lines = dataset(&work.data.path().join("pi"), 2).await?;
    for t in &lines {
        assert_eq!(t["task"], "fix-add", "{t}");
        let traces = t["traces"].as_array().context("traces")?;
        assert!(!traces.is_empty(), "Pi's calls captured: {t}");
        for tr in traces {
            let sampled = tr["response_token_ids"].as_array().map_or(0, Vec::len);
            assert!(
                (1..=16).contains(&sampled),
                "sampled tokens under the job's maxResponseTokens: {tr}"
            );
        }
        // Pi's own system prompt and tool definitions went through the gateway (the custom
        // agent's prompt is the instruction alone, a few dozen tokens).
        let prompt = traces[0]["prompt_token_ids"].as_array().map_or(0, Vec::len);
        assert!(prompt > 300, "Pi's prompt is {prompt} tokens");
    }
    Ok(())
}

/// The other four harness presets, unmodified from npm, in real pods: Codex CLI, Claude Code,
/// Qwen Code and Gemini CLI, each in the harness image's restricted sandbox container with what
/// its preset injects (base URL, key, config files, flags) pointing it at the pod's gateway
/// sidecar. A scripted model on the bridge address (the jobs' teacher) has each CLI call its
/// own shell tool to fix the bug; every session scores 1 and its calls reach the dataset. (A
/// stub model because these CLIs' own prompts, 10-25 K tokens, do not fit the 135M model's
/// context; Pi runs against the real vLLM above.)
#[tokio::test]
async fn every_harness_preset_fixes_the_bug_in_real_pods() -> Result<()> {
    use floe_tests::scripted_upstream::{ScriptedUpstream, Step};
    use floe_tests::toy_task::FIX;
    const PRESETS: [&str; 4] = ["codex", "claude-code", "qwen-code", "gemini-cli"];
    let work = prepare("presets").await?;
    let (n, images, client, ns) = (
        work.n,
        work.images,
        work.client.clone(),
        work.ns.name.clone(),
    );
    let (spare, _spare_held) = n.spare_port().await?;
    let _model = ScriptedUpstream::start_on(
        std::net::SocketAddr::new(n.host_ip.into(), spare),
        vec![Step::Shell(FIX.into()), Step::Say("Fixed add().".into())],
    )
    .await?;
    n.host_service(&client, &ns, "scripted", spare).await?;
    let _operator = Operator::start_on(&n.cluster, &images.floe, &ns, &[], &[])?;
    apply(
        &client,
        &ns,
        json!({"apiVersion": "floe.dev/v1alpha1", "kind": "GatewayPool",
               "metadata": {"name": "harnesses"},
               "spec": {"replicas": PRESETS.len(),
                        "template": {"image": images.harnesses, "imagePullPolicy": "Never"}}}),
    )
    .await?;
    warm_pods(n, &client, &ns, "harnesses", PRESETS.len()).await?;
    for preset in PRESETS {
        let mut job = sft_job(preset, &ns, 1, &format!("/{preset}"), json!([fix_add()]));
        job["spec"]["poolRef"]["name"] = "harnesses".into();
        job["spec"]["harness"] = json!({"preset": preset});
        job["spec"]["sft"]["upstream"]["url"] = format!("http://scripted.{ns}.svc:8000").into();
        job["spec"]["sampling"]["maxResponseTokens"] = 256.into();
        job["spec"]["timeouts"]["agentSeconds"] = 240.into();
        // Every scored session in the dataset, to say what a failed one did.
        job["spec"]["sft"]["minReward"] = 0.into();
        apply(&client, &ns, job).await?;
    }
    let mut failures = Vec::new();
    for preset in PRESETS {
        let status = finished(n, &client, &ns, preset).await?;
        if status.sessions.succeeded != 1 {
            failures.push(format!("{preset}: {:?}", status.sessions));
            continue;
        }
        let lines = dataset(&work.data.path().join(preset), 1).await?;
        let line = &lines[0];
        let traces = line["traces"].as_array().map_or(0, Vec::len);
        if line["reward"] != 1.0 || traces < 2 {
            failures.push(format!(
                "{preset}: reward {}, {traces} calls: {line}",
                line["reward"]
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    Ok(())
}

/// The kubelet restarted while sessions run (an upgrade, a crash, a config change): containerd
/// keeps the containers, the new kubelet takes the pods back, and every session finishes on its
/// first pod, scored once — a kubelet restart is not a lost pod. The pool is READY again after.
#[tokio::test]
async fn a_kubelet_restarted_mid_job_loses_no_session() -> Result<()> {
    let work = prepare_as("restart", NodeUse::Alone(NODE_USE.write().await)).await?;
    let (n, images, client, ns) = (
        work.n,
        work.images,
        work.client.clone(),
        work.ns.name.clone(),
    );
    let _operator = Operator::start_on(&n.cluster, &images.floe, &ns, &[], &[])?;
    warm_pool(n, &client, &ns, &images.python).await?;
    apply(
        &client,
        &ns,
        sft_job("restart", &ns, 2, "/restart", json!([fix_add_slowly()])),
    )
    .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    eventually_within(120, "both sessions' harnesses started", async || {
        let listed = pods
            .list(&ListParams::default().labels("floe.dev/job=restart"))
            .await?;
        let assigned = listed
            .items
            .iter()
            .filter(|p| p.annotations().contains_key("floe.dev/assigned"))
            .count();
        Ok((assigned == 2).then_some(()))
    })
    .await?;
    // The agents have called the model and sleep 20 s; the kubelet is gone for part of it.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let took = n.restart_kubelet()?;
    println!("kubelet restarted, node Ready again in {took:?}");
    let status = finished(n, &client, &ns, "restart").await?;
    assert_eq!(status.sessions.succeeded, 2, "{status:?}");
    assert_eq!(
        (status.sessions.failed, status.sessions.retried),
        (0, 0),
        "no session lost to the restart: {status:?}"
    );
    let lines = dataset(&work.data.path().join("restart"), 2).await?;
    for t in &lines {
        assert_eq!(t["reward"], 1.0, "{t}");
    }
    let pools: Api<GatewayPool> = Api::namespaced(client.clone(), &ns);
    pool_ready(&pools, "python", 2, 120)
        .await
        .with_context(|| pod_logs(n, &ns).unwrap_or_default())?;
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

/// Helm against the node's cluster.
fn helm(n: &TestNode, args: &[&str]) -> Result<String> {
    let out = std::process::Command::new(chart::tools().join("helm"))
        .args(args)
        .env("KUBECONFIG", &n.cluster.kubeconfig)
        .output()?;
    chart::stdout_of("helm", args, out)
}

/// `helm install floe` of `charts/floe` into `system`: the image built here, the CRDs the
/// fixture already applied, `replicas` operators watching `watched`; once it is up. Returns
/// the release's `--set` arguments (to render its other objects with the same values).
fn install_chart(
    n: &TestNode,
    images: &NodeImages,
    system: &str,
    watched: &str,
    replicas: u32,
) -> Result<Vec<String>> {
    let (repository, tag) = images.floe.rsplit_once(':').context("image tag")?;
    let mut release: Vec<String> = [
        "crds.install=false".to_string(),
        format!("operator.replicas={replicas}"),
        format!("operator.watchNamespace={watched}"),
        format!("image.repository={repository}"),
        "image.pullPolicy=Never".into(),
    ]
    .into_iter()
    .flat_map(|v| ["--set".to_string(), v])
    .collect();
    // The tag is a hash prefix: `--set` reads one of digits only (1 in ~280 builds) as a number,
    // which the chart's schema refuses (a CI run lost both chart tests to `368351696377`).
    release.extend(["--set-string".to_string(), format!("image.tag={tag}")]);
    let chart_dir = chart::chart_dir();
    let mut install = vec![
        "install",
        "floe",
        chart_dir.to_str().context("chart path")?,
        "--namespace",
        system,
        "--wait",
        "--timeout",
        "3m",
    ];
    install.extend(release.iter().map(String::as_str));
    helm(n, &install).with_context(|| operator_logs(n, system))?;
    Ok(release)
}

/// The logs of every pod in `ns` (the chart's operator pods), for a failure message.
fn operator_logs(n: &TestNode, ns: &str) -> String {
    n.cluster
        .kubectl(
            &[
                "logs",
                "-n",
                ns,
                "-l",
                "app.kubernetes.io/name=floe",
                "--tail=30",
            ],
            None,
        )
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

#[tokio::test]
async fn the_chart_runs_the_operator_in_pods_and_a_job_outlives_them() -> Result<()> {
    let work = prepare("chart-work").await?;
    let (n, images, client, ns) = (
        work.n,
        work.images,
        work.client.clone(),
        work.ns.name.clone(),
    );
    let system = TestNamespace::create(&n.cluster, &client, "chart-sys").await?;
    // README's install, with the image built here and the CRDs the fixture already applied:
    // two replicas with leader election, in-cluster config, the chart's RBAC for one namespace.
    install_chart(n, images, &system.name, &ns, 2)?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &system.name);
    let operators = pods.list(&ListParams::default()).await?.items;
    assert_eq!(operators.len(), 2, "two operator replicas");
    assert!(operators.iter().all(pod_ready));
    // With the operator's NetworkPolicy on, Helm reads the apiserver's endpoints from this
    // cluster (whose apiserver advertises the node's address) and the policy names exactly
    // them: what an install does, rendered against the cluster without changing the release.
    let chart_dir = chart::chart_dir();
    let rendered = helm(
        n,
        &[
            "template",
            "floe",
            chart_dir.to_str().context("chart path")?,
            "--namespace",
            &system.name,
            "--dry-run=server",
            "--set",
            "networkPolicy.operator.enabled=true",
        ],
    )?;
    let docs = chart::documents(&rendered)?;
    let policy = docs
        .iter()
        .find(|d| d["kind"] == "NetworkPolicy")
        .context("the operator's NetworkPolicy")?;
    let endpoints =
        Api::<k8s_openapi::api::core::v1::Endpoints>::namespaced(client.clone(), "default")
            .get("kubernetes")
            .await?;
    let read = chart::apiserver_rule_for(Some(&endpoints));
    assert!(!read.0.is_empty(), "{endpoints:?}");
    assert_eq!(chart::apiserver_rule(policy), read, "{policy}");

    warm_pool(n, &client, &ns, &images.python)
        .await
        .with_context(|| operator_logs(n, &system.name))?;
    // The chart's RBAC lets the operator keep the pool's egress NetworkPolicy.
    Api::<k8s_openapi::api::networking::v1::NetworkPolicy>::namespaced(client.clone(), &ns)
        .get("python-egress")
        .await
        .with_context(|| operator_logs(n, &system.name))?;
    apply(
        &client,
        &ns,
        sft_job(
            "both",
            &ns,
            2,
            "/both",
            json!([fix_add(), fix_add_slowly()]),
        ),
    )
    .await?;
    // Every operator pod deleted while sessions run: the Deployment's new pods take over.
    let jobs: Api<RolloutJob> = Api::namespaced(client.clone(), &ns);
    eventually_within(120, "sessions running", async || {
        let job = jobs.get("both").await?;
        Ok(job
            .status
            .is_some_and(|s| s.sessions.running > 0)
            .then_some(()))
    })
    .await?;
    // Killed, not stopped: no grace period, the objects go at once.
    let kill = kube::api::DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    for pod in &operators {
        pods.delete(&pod.name_any(), &kill).await?;
    }
    let status = finished(n, &client, &ns, "both")
        .await
        .with_context(|| operator_logs(n, &system.name))?;
    assert_eq!(status.sessions.total, 4, "{status:?}");
    assert_eq!(status.sessions.succeeded, 4, "{status:?}");
    assert_eq!(status.sessions.failed, 0, "{status:?}");
    let lines = dataset(&work.data.path().join("both"), 4).await?;
    let sessions: std::collections::BTreeSet<&str> =
        lines.iter().filter_map(|t| t["session"].as_str()).collect();
    assert_eq!(sessions.len(), 4, "each session once: {sessions:?}");
    let now: Vec<String> = pods
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|p| p.name_any())
        .collect();
    assert!(
        !now.is_empty()
            && now
                .iter()
                .all(|p| !operators.iter().any(|o| o.name_any() == *p)),
        "the job was finished by new operator pods: {now:?}"
    );
    helm(n, &["uninstall", "floe", "--namespace", &system.name])?;
    Ok(())
}

/// The pool's Ready condition, once its reason is `reason`.
async fn pool_condition(client: &Client, ns: &str, pool: &str, reason: &str) -> Result<String> {
    let pools: Api<GatewayPool> = Api::namespaced(client.clone(), ns);
    eventually_within(
        90,
        &format!("pool {pool}'s condition {reason}"),
        async || {
            let p = pools.get(pool).await?;
            Ok(p.status
                .iter()
                .flat_map(|s| s.conditions.iter())
                .find(|c| c.type_ == "Ready" && c.reason == reason)
                .map(|c| c.message.clone()))
        },
    )
    .await
}

#[tokio::test]
async fn pools_whose_pods_cannot_start_say_why_on_the_pool() -> Result<()> {
    let _shared = NODE_USE.read().await;
    let n = node();
    let images = n.images()?;
    let client = n.cluster.client().await?;
    n.cluster.install_crds(&client).await?;
    let ns = TestNamespace::create(&n.cluster, &client, "node-stuck").await?;
    let _operator = Operator::start_on(&n.cluster, &images.floe, &ns.name, &[], &[])?;
    let pool = |name: &str, template: Value| {
        json!({"apiVersion": "floe.dev/v1alpha1", "kind": "GatewayPool",
               "metadata": {"name": name}, "spec": {"replicas": 1, "template": template}})
    };
    // More CPU than the node has: the scheduler's words, not a silent "0/1 pods READY".
    apply(
        &client,
        &ns.name,
        pool(
            "huge",
            json!({"image": images.python, "imagePullPolicy": "Never",
                   "resources": {"requests": {"cpu": "64"}}}),
        ),
    )
    .await?;
    // An image the node does not have and may not pull: the kubelet's words.
    apply(
        &client,
        &ns.name,
        pool(
            "missing",
            json!({"image": "floe.local/no-such-image:1", "imagePullPolicy": "Never"}),
        ),
    )
    .await?;
    // Egress the test node's CNI does not restrict (it enforces no NetworkPolicy): a pool that
    // refuses to serve then ends its pods before READY and says why; one that warns serves
    // and counts it.
    apply(
        &client,
        &ns.name,
        json!({"apiVersion": "floe.dev/v1alpha1", "kind": "GatewayPool",
               "metadata": {"name": "refuses"},
               "spec": {"replicas": 1, "egress": {"unrestricted": "Refuse"},
                        "template": {"image": images.python, "imagePullPolicy": "Never"}}}),
    )
    .await?;
    apply(
        &client,
        &ns.name,
        pool(
            "warns",
            json!({"image": images.python, "imagePullPolicy": "Never"}),
        ),
    )
    .await?;
    let huge = pool_condition(&client, &ns.name, "huge", "Unschedulable").await?;
    assert!(huge.contains("Insufficient cpu"), "{huge}");
    let missing = pool_condition(&client, &ns.name, "missing", "ErrImageNeverPull").await?;
    // kstatus: Stalled, which Argo CD shows as Degraded with the kubelet's words.
    let stuck = serde_json::to_value(
        Api::<GatewayPool>::namespaced(client.clone(), &ns.name)
            .get("missing")
            .await?,
    )?;
    let script = floe_tests::workspace_root().join("docs/argocd/gatewaypool-health.lua");
    let (health, said) = chart::argocd_health(&script, &stuck)?;
    assert_eq!(health, "Degraded", "{said}");
    assert!(said.contains("no-such-image"), "{said}");
    // And `kubectl get` shows why.
    let listed = n.cluster.kubectl(&["get", "gp", "-n", &ns.name], None)?;
    let table = String::from_utf8_lossy(&listed.stdout);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("missing") && l.contains("ErrImageNeverPull")),
        "{table}"
    );
    // Both the agent and the grader run the template's image: either may be named.
    assert!(
        (missing.contains("container sandbox") || missing.contains("container agent"))
            && missing.contains("no-such-image"),
        "{missing}"
    );
    // Announced once as a Warning on the pool.
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(client.clone(), &ns.name);
    eventually_within(30, "the Warning events", async || {
        let listed = events.list(&ListParams::default()).await?.items;
        let warned = |reason: &str| {
            listed.iter().any(|e| {
                e.reason.as_deref() == Some(reason) && e.type_.as_deref() == Some("Warning")
            })
        };
        Ok(
            (warned("Unschedulable") && warned("ErrImageNeverPull") && warned("PodFailed"))
                .then_some(()),
        )
    })
    .await?;

    let refused = pool_condition(&client, &ns.name, "refuses", "PodFailed").await?;
    assert!(
        refused.contains("container sandbox")
            && refused.contains("egress is not restricted")
            && refused.contains("reached the Kubernetes API"),
        "{refused}"
    );
    // Each pool has its egress NetworkPolicy, owned by it (accepted here, not enforced).
    let policies: Api<k8s_openapi::api::networking::v1::NetworkPolicy> =
        Api::namespaced(client.clone(), &ns.name);
    for pool in ["refuses", "warns"] {
        let policy = policies.get(&format!("{pool}-egress")).await?;
        let owner = &policy.owner_references()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str()),
            ("GatewayPool", pool)
        );
    }
    let warned = warm_pods(n, &client, &ns.name, "warns", 1).await?;
    let ip = warned[0]
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .context("pod IP")?;
    let page = reqwest::get(format!("http://{ip}:8371/metrics"))
        .await?
        .text()
        .await?;
    assert_eq!(
        floe_tests::operator::metric_value(&page, "floe_gateway_egress_unrestricted"),
        Some(1.0),
        "{page}"
    );
    Ok(())
}

/// The job's Ready condition once its reason is one of `reasons`: (reason, message).
async fn job_condition(
    client: &Client,
    ns: &str,
    job: &str,
    reasons: &[&str],
) -> Result<(String, String)> {
    let jobs: Api<RolloutJob> = Api::namespaced(client.clone(), ns);
    eventually_within(
        90,
        &format!("job {job}'s condition one of {reasons:?}"),
        async || {
            let j = jobs.get(job).await?;
            Ok(j.status
                .iter()
                .flat_map(|s| s.conditions.iter())
                .find(|c| c.type_ == "Ready" && reasons.contains(&c.reason.as_str()))
                .map(|c| (c.reason.clone(), c.message.clone())))
        },
    )
    .await
}

/// Every file of `examples/` applied as README says (`kubectl apply -f examples/`) to this
/// plain cluster, which has none of their prerequisites (a gVisor RuntimeClass, GPUs, PVCs,
/// Secrets, ConfigMaps, the images): each object names what it lacks in its `Ready` condition,
/// and nothing is pulled or started for them (their images are not on the node, and no pod
/// of theirs gets past the scheduler or the apiserver).
#[tokio::test]
async fn every_example_names_its_missing_prerequisite_on_a_plain_cluster() -> Result<()> {
    let _shared = NODE_USE.read().await;
    let n = node();
    let images = n.images()?;
    let client = n.cluster.client().await?;
    n.cluster.install_crds(&client).await?;
    let ns = TestNamespace::create(&n.cluster, &client, "node-examples").await?;
    let operator = Operator::start_on(&n.cluster, &images.floe, &ns.name, &[], &[])?;
    let examples = floe_tests::workspace_root().join("examples");
    let mut applied = 0;
    for entry in std::fs::read_dir(&examples)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let file = path.to_str().context("example path")?;
            let out = n
                .cluster
                .kubectl(&["apply", "-n", &ns.name, "-f", file], None)?;
            anyhow::ensure!(
                out.status.success(),
                "kubectl apply -f {file}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            applied += 1;
        }
    }
    assert_eq!(applied, 4, "examples/*.yaml: a pool and a job per mode");

    // The pool: no gVisor RuntimeClass here, so the apiserver refuses its pods.
    let pool = pool_condition(&client, &ns.name, "codex", "PodCreateRejected").await?;
    assert!(pool.contains("RuntimeClass \"gvisor\" not found"), "{pool}");
    // The train job: its trainer pod asks for a GPU node and PVCs this cluster lacks.
    let (_, train) = job_condition(&client, &ns.name, "fizzbuzz-grpo", &["Unschedulable"]).await?;
    assert!(
        train.contains("trainer") && train.contains("fizzbuzz-grpo-trainer"),
        "{train}"
    );
    // The sft job: its pool (a Claude Code one) does not exist here.
    let (_, sft) = job_condition(&client, &ns.name, "repo-fixes-sft", &["PoolNotFound"]).await?;
    assert!(sft.contains("claude-code"), "{sft}");
    // The lookahead job is applied suspended: it says so and creates nothing, not even the
    // pod that would read its task file.
    let (_, suspended) =
        job_condition(&client, &ns.name, "swe-lookahead-grpo", &["JobSuspended"]).await?;
    assert!(suspended.contains("suspended"), "{suspended}");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let theirs = pods
        .list(&ListParams::default().labels("floe.dev/job=swe-lookahead-grpo"))
        .await?;
    assert!(theirs.items.is_empty(), "a suspended job made pods");
    // Resumed, it starts the pod that reads its task file, which cannot be scheduled without
    // the PVC: the job stalls with the scheduler's words.
    Api::<RolloutJob>::namespaced(client.clone(), &ns.name)
        .patch(
            "swe-lookahead-grpo",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"suspend": false}})),
        )
        .await?;
    let (_, loader) =
        job_condition(&client, &ns.name, "swe-lookahead-grpo", &["Unschedulable"]).await?;
    assert!(
        loader.contains("task loader") && loader.contains("swe-tasks"),
        "{loader}"
    );
    // Nothing of theirs reached a container runtime: every pod there is unscheduled.
    for pod in pods.list(&ListParams::default()).await?.items {
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        assert_eq!(node, None, "pod {} was scheduled", pod.name_any());
    }
    // And each blocker is a metric an alert reads.
    let metrics = operator.metrics().await?;
    for line in [
        format!("floe_pool_blocked{{namespace=\"{}\",pool=\"codex\",reason=\"PodCreateRejected\"}} 1", ns.name),
        format!("floe_rolloutjob_blocked{{namespace=\"{}\",reason=\"Unschedulable\",rolloutjob=\"fizzbuzz-grpo\"}} 1", ns.name),
        format!("floe_rolloutjob_blocked{{namespace=\"{}\",reason=\"PoolNotFound\",rolloutjob=\"repo-fixes-sft\"}} 1", ns.name),
        format!("floe_rolloutjob_blocked{{namespace=\"{}\",reason=\"Unschedulable\",rolloutjob=\"swe-lookahead-grpo\"}} 1", ns.name),
    ] {
        assert!(metrics.contains(&line), "{line} not in {metrics}");
    }
    Ok(())
}

/// The hostile agent of `tests/hostile/pod_agent.py` in real pods: it tries every attack of
/// `docs/security.md` from the agent container (the control token, the hidden test anywhere
/// it can read, the assignment and a forged result through the gateway, the grader's state,
/// floe's processes, its supervisor's memory and life, the agent link, a reward file for a
/// sloppy evaluator, a process left behind to rewrite the evaluation copy, sampling the
/// teacher directly) and leaves the bug unfixed. Every attack is refused, the leftover process
/// is dead before grading starts, and both sessions score 0.
#[tokio::test]
async fn a_hostile_agent_in_a_real_pod_cannot_forge_its_reward() -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let work = prepare("hostile").await?;
    let (n, images, client, ns) = (
        work.n,
        work.images,
        work.client.clone(),
        work.ns.name.clone(),
    );
    let results = tempfile::Builder::new().prefix("floe-hostile").tempdir()?;
    std::fs::set_permissions(results.path(), std::fs::Permissions::from_mode(0o777))?;
    apply(
        &client,
        &ns,
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "hostile"},
               "data": {"agent.py": include_str!("../hostile/pod_agent.py")}}),
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
                                     "volumes": [
                                        {"name": "agent", "configMap": {"name": "hostile"}},
                                        {"name": "results", "hostPath": {
                                            "path": results.path().display().to_string(),
                                            "type": "Directory"}}],
                                     "volumeMounts": [
                                        {"name": "agent", "mountPath": "/opt/agent", "readOnly": true},
                                        {"name": "results", "mountPath": "/results"}],
                                     // The probe's findings: a channel between sessions, which
                                     // a pool must ask for.
                                     "sharedWritableVolumes": "Allow"}}}),
    )
    .await?;
    // The teacher demands a key (floe's policy proxy in front of the real vLLM stands in for a
    // server started with `--api-key`), which the job names in a Secret: only gateways get it.
    const TEACHER_KEY: &str = "the-teachers-key";
    let (spare, _spare_held) = n.spare_port().await?;
    let _teacher = floe_tests::processes::PolicyProxy::start(
        std::net::SocketAddr::new(n.host_ip.into(), spare),
        &floe_tests::vllm::vllm().url,
        TEACHER_KEY,
    )
    .await?;
    n.host_service(&client, &ns, "keyed-teacher", spare).await?;
    apply(
        &client,
        &ns,
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "teacher-key"},
               "stringData": {"apiKey": TEACHER_KEY}}),
    )
    .await?;
    let teacher = format!("http://keyed-teacher.{ns}.svc:8000");
    let mut job = sft_job("hostile", &ns, 2, "/hostile", json!([fix_add()]));
    job["spec"]["sft"]["upstream"] = json!({"url": teacher, "model": "policy",
                                            "apiKeySecret": {"name": "teacher-key"}});
    job["spec"]["harness"]["env"] = json!([
        {"name": "HOSTILE_RESULTS", "value": "/results"},
        {"name": "HOSTILE_MODEL", "value": teacher},
        {"name": "HOSTILE_INGEST", "value": format!("http://hostile-dataset.{ns}.svc:8100")}]);
    // A sloppy evaluator: it keeps a reward.json it finds (only floe's discarding of the
    // agent's one stops a forged 1), and stamps when grading starts.
    job["spec"]["evaluator"] = json!({
        "command": ["sh", "-c", "python3 -c 'import time; print(repr(time.time()))' \
                     > /results/$(hostname).graded; \
                     if [ ! -f reward.json ]; then \
                       if python3 test_hidden.py; then r=1; else r=0; fi; \
                       echo \"{\\\"reward\\\": $r}\" > reward.json; fi"],
        "reward": {"source": "RewardFile", "path": "reward.json"}});
    job["spec"]["sft"]["minReward"] = 0.into();
    apply(&client, &ns, job).await?;
    let status = finished(n, &client, &ns, "hostile").await?;
    assert_eq!(status.sessions.succeeded, 2, "{status:?}");
    let lines = dataset(&work.data.path().join("hostile"), 2).await?;
    for t in &lines {
        assert_eq!(t["reward"], 0.0, "a forged reward: {t}");
        let discarded = t["evaluation"]["detail"]["changes"]["discarded"].to_string();
        assert!(discarded.contains("reward.json"), "{discarded}");
        // The agent's calc.py left a process in the grader that rewrote the verdict: the
        // runner (the grader's init) found it, and scored the session as the policy's failure.
        assert_eq!(
            t["evaluation"]["detail"]["failure"], "evaluator_straggler",
            "{t}"
        );
    }
    // The agent's code the evaluator ran found no control token: no file, not in its own
    // environment, not in any process's it could read (the runner is not dumpable).
    let mut evaluated = 0;
    for entry in std::fs::read_dir(results.path())? {
        let path = entry?.path();
        if path.extension().and_then(|e| e.to_str()) != Some("evaluation") {
            continue;
        }
        evaluated += 1;
        let found: std::collections::BTreeMap<String, bool> =
            serde_json::from_str(&std::fs::read_to_string(&path)?)?;
        let reached: Vec<&String> = found
            .iter()
            .filter(|(_, hit)| **hit)
            .map(|(k, _)| k)
            .collect();
        assert!(
            reached.is_empty(),
            "the evaluated code reached the token: {reached:?}"
        );
    }
    assert_eq!(
        evaluated, 2,
        "the evaluator ran the agent's code in each session"
    );

    let mut reports = 0;
    for entry in std::fs::read_dir(results.path())? {
        let path = entry?.path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        reports += 1;
        let report: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
        let succeeded = |attack: &str| report[attack]["succeeded"].as_bool();
        assert_eq!(
            succeeded("honest_model_call_through_gateway"),
            Some(true),
            "{report}"
        );
        for attack in [
            "read_control_token",
            "read_hidden_tests_anywhere",
            "take_the_assignment_with_the_session_token",
            "report_own_result_to_gateway",
            "post_a_forged_trajectory_to_the_ingest",
            "write_grader_state",
            "see_floe_processes",
            "read_supervisor_memory",
            "kill_the_supervisor",
            "starve_the_supervisor",
            "steal_the_agent_link",
            // The harness shares the pod's network with the gateway, but not the key.
            "call_model_server_directly",
        ] {
            assert_eq!(succeeded(attack), Some(false), "{attack} in {report}");
        }
        // The process it left stamped its life until its namespace was emptied, before the
        // grader started: its last stamp is older than the grading's first.
        let pod = path
            .file_stem()
            .and_then(|s| s.to_str())
            .context("pod name")?;
        let stamp = |suffix: &str| -> Result<f64> {
            let text = std::fs::read_to_string(results.path().join(format!("{pod}.{suffix}")))
                .with_context(|| format!("{pod}.{suffix}"))?;
            Ok(text.trim().parse()?)
        };
        let (alive, graded) = (stamp("alive")?, stamp("graded")?);
        assert!(
            alive < graded,
            "the leftover lived {:.3}s into grading",
            alive - graded
        );
    }
    assert_eq!(reports, 2, "one report per session");
    Ok(())
}
