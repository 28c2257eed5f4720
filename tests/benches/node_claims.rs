//! Warm claims on the real node (`floe_tests::node`: a real kubelet, containerd and runc), each
//! figure printed beside the node's own baseline measured in the same run:
//!
//! 1. **Claim → harness started**: a RolloutJob against a warm pool; per session, from the
//!    pod's `floe.dev/claimed-at` (the operator's claim) to the runner's
//!    `harnessStartedUnixMs` (its termination message): the assignment's delivery to the pod's
//!    gateway, the runner taking it, the task files, and the harness process's start. p50/p99,
//!    split at the runner's `assignmentReceivedUnixMs`, the slowest three, and the operator's
//!    own PATCH and delivery means (`floe_claim_phase_seconds`).
//! 2. **Refill**: while the job runs, the pool's replacement pods, created → READY (the
//!    gateway's readiness probe passed and the pool marked it), p50/p99, and the rate at which
//!    pods reached READY; split at the kubelet's Ready as the watch saw it, and the kubelet's
//!    own record on each pod (its conditions' and containers' timestamps, whole seconds).
//!
//! Baseline for both: the node starting a bare pod of the same image (created → Ready, no
//! init container, no sidecar), what a claim would cost without a warm pool.
//!
//! Sessions run a `custom` harness that makes one model call of one token (a session without a
//! model call is not scored: it never reached the policy) and the evaluator `true`: the
//! figures are floe's and the node's, not an agent's. The model is the scripted upstream
//! (`floe_tests::scripted_upstream`, on the bridge address) unless `FLOE_BENCH_MODEL=vllm`:
//! on a cluster the model server has GPU nodes of its own, and here the real vLLM's engine
//! took a quarter of the two cores the claims are measured on (session 38). `--quick`: 20
//! sessions; full: 120. Root only (the node). `FLOE_BIN_PROFILE=release` builds the operator
//! and the images' `floe` in release mode. Also printed: how busy the machine's CPUs were
//! while the job ran, and the pods' share.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use floe_crds::rollout_job::{RolloutJob, RolloutJobPhase};
use floe_tests::kubelet::pod_ready;
use floe_tests::node::{host_dns, host_services, node};
use floe_tests::operator::{eventually_within, metric_value, pool_ready, Operator};
use floe_tests::proc_cpu::MachineCpu;
use floe_tests::scripted_upstream::{ScriptedUpstream, Step};
use floe_tests::{percentile, TestNamespace};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::watcher;
use kube::ResourceExt;
use serde_json::json;

/// One model call of one token through the pod's gateway, then done: busybox's `wget` (a Python
/// agent spent ~0.4 CPU-s a session starting up, 15 % of the machine during the job: an
/// agent's cost, not the claim's).
const AGENT: &str = r#"wget -q -O /dev/null --header "content-type: application/json" \
  --header "authorization: Bearer $OPENAI_API_KEY" \
  --post-data '{"model": "policy", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}' \
  "${OPENAI_BASE_URL%/}/chat/completions"
"#;

/// What the watch saw of each pod, by name, in the bench's time (`Instant`s).
#[derive(Default)]
struct Seen {
    first: HashMap<String, Instant>,
    ready: HashMap<String, Instant>,
    pool_ready: HashMap<String, Instant>,
    /// Each pool pod's own record when it was marked READY: (what, seconds after creation).
    timeline: HashMap<String, Vec<(String, f64)>>,
    /// Claimed-at, assignment received by the runner, harness started: Unix milliseconds.
    started: HashMap<String, [i64; 3]>,
}

/// The claim, the runner's receipt of the assignment and the harness's start, once the
/// runner's summary is on the pod.
fn claim_to_start(p: &Pod) -> Option<[i64; 3]> {
    let claimed: k8s_openapi::jiff::Timestamp =
        p.annotations().get("floe.dev/claimed-at")?.parse().ok()?;
    let message = p
        .status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find_map(|c| c.state.as_ref()?.terminated.as_ref()?.message.clone())?;
    let summary: serde_json::Value = serde_json::from_str(&message).ok()?;
    Some([
        claimed.as_millisecond(),
        summary["assignmentReceivedUnixMs"].as_i64()?,
        summary["harnessStartedUnixMs"].as_i64()?,
    ])
}

/// What the kubelet recorded on a pod, in seconds after its creation (the API's timestamps
/// have whole seconds): each condition's last transition and each container's start.
fn timeline(p: &Pod) -> Vec<(String, f64)> {
    let Some(created) = p.metadata.creation_timestamp.as_ref() else {
        return Vec::new();
    };
    let after = |t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time| {
        (t.0.as_millisecond() - created.0.as_millisecond()) as f64 / 1000.0
    };
    let Some(status) = p.status.as_ref() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for c in status.conditions.iter().flatten() {
        if let Some(t) = &c.last_transition_time {
            out.push((format!("condition {}", c.type_), after(t)));
        }
    }
    let containers = status
        .init_container_statuses
        .iter()
        .flatten()
        .map(|c| ("init", c));
    for (kind, c) in containers.chain(
        status
            .container_statuses
            .iter()
            .flatten()
            .map(|c| ("container", c)),
    ) {
        let state = c.state.as_ref();
        if let Some(t) = state.and_then(|s| s.running.as_ref()?.started_at.as_ref()) {
            out.push((format!("{kind} {} started", c.name), after(t)));
        }
        if let Some(t) = state.and_then(|s| s.terminated.as_ref()) {
            if let Some(at) = &t.started_at {
                out.push((format!("{kind} {} started", c.name), after(at)));
            }
            if let Some(at) = &t.finished_at {
                out.push((format!("{kind} {} finished", c.name), after(at)));
            }
        }
    }
    out
}

fn watch(api: Api<Pod>, seen: Arc<Mutex<Seen>>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut events = watcher(api, watcher::Config::default()).boxed();
        while let Some(event) = events.next().await {
            let now = Instant::now();
            let pods = match event {
                Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => vec![p],
                _ => continue,
            };
            let mut s = seen.lock().unwrap_or_else(|e| e.into_inner());
            for p in pods {
                let name = p.name_any();
                s.first.entry(name.clone()).or_insert(now);
                if pod_ready(&p) {
                    s.ready.entry(name.clone()).or_insert(now);
                }
                if p.labels().get("floe.dev/state").map(String::as_str) == Some("ready") {
                    s.pool_ready.entry(name.clone()).or_insert(now);
                    s.timeline
                        .entry(name.clone())
                        .or_insert_with(|| timeline(&p));
                }
                if let Some(t) = claim_to_start(&p) {
                    s.started.entry(name).or_insert(t);
                }
            }
        }
    })
}

/// One table row: p50, p99 and the count of `values` (milliseconds).
fn row(label: &str, values: &[f64]) {
    println!(
        "| {label} | {:.0} ms | {:.0} ms | {} |",
        percentile(values.to_vec(), 0.5),
        percentile(values.to_vec(), 0.99),
        values.len()
    );
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[tokio::main]
async fn main() -> Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let sessions: usize = if quick { 20 } else { 120 };
    let warm = 4;
    let n = node();
    let images = n.images()?;
    let client = n.cluster.client().await?;
    n.cluster.install_crds(&client).await?;
    let real_model = match std::env::var("FLOE_BENCH_MODEL").as_deref() {
        Ok("vllm") => true,
        Ok("stub") | Err(_) => false,
        Ok(other) => bail!("FLOE_BENCH_MODEL={other}: stub (the default) or vllm"),
    };
    // Cluster DNS: the sessions' gateways ship to the collector's Service by name.
    if real_model {
        host_services(n)?;
    } else {
        host_dns(n)?;
    }
    let ns = TestNamespace::create(&n.cluster, &client, "bench-node").await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let seen = Arc::new(Mutex::new(Seen::default()));
    let watching = watch(pods.clone(), seen.clone());
    let data = tempfile::Builder::new()
        .prefix("floe-bench-node")
        .tempdir()?;
    n.dataset_volume(&client, &ns.name, data.path()).await?;
    // The Service `teacher`: the host's vLLM, or the scripted upstream on the node's spare port.
    let _stub = if real_model {
        n.model_service(&client, &ns.name).await?;
        None
    } else {
        let (port, held) = n.spare_port().await?;
        let stub = ScriptedUpstream::start_on(
            std::net::SocketAddr::new(n.host_ip.into(), port),
            vec![Step::Say("ok".into())],
        )
        .await?;
        n.host_service(&client, &ns.name, "teacher", port).await?;
        Some((stub, held))
    };
    n.apply(
        &client,
        &ns.name,
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "agent"},
               "data": {"agent.sh": AGENT}}),
    )
    .await?;

    // Baseline: bare pods of the sandbox image, one at a time (the node is otherwise idle).
    let mut bare = Vec::new();
    for i in 0..5 {
        let name = format!("bare-{i}");
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"automountServiceAccountToken": false, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "c", "image": images.python, "imagePullPolicy": "Never",
                                     "command": ["sleep", "3600"]}]}}))?;
        let sent = Instant::now();
        pods.create(&PostParams::default(), &pod).await?;
        let ready = eventually_within(60, "a bare pod Ready", async || {
            Ok(seen
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .ready
                .get(&name)
                .copied())
        })
        .await?;
        bare.push(ms(ready.duration_since(sent)));
        pods.delete(&name, &DeleteParams::default()).await?;
    }

    // Claims only once the job's collector is Ready: a claim made while it starts waits for it
    // on purpose (`--claim-while-starting`), which is not a warm claim's latency.
    let operator = Operator::start_on(
        &n.cluster,
        &images.floe,
        &ns.name,
        &["--claim-while-starting=false"],
        &[],
    )?;
    n.apply(
        &client,
        &ns.name,
        json!({"apiVersion": "floe.dev/v1alpha1", "kind": "GatewayPool",
               "metadata": {"name": "warm"},
               "spec": {"replicas": warm,
                        "template": {"image": images.python, "imagePullPolicy": "Never",
                                     "volumes": [{"name": "agent", "configMap": {"name": "agent"}}],
                                     "volumeMounts": [{"name": "agent", "mountPath": "/opt/agent",
                                                       "readOnly": true}]}}}),
    )
    .await?;
    let pools: Api<floe_crds::GatewayPool> = Api::namespaced(client.clone(), &ns.name);
    pool_ready(&pools, "warm", warm, 180).await?;

    let tasks: Vec<_> = (0..sessions / 4)
        .map(|i| json!({"id": format!("t{i}"), "instruction": "nothing to do"}))
        .collect();
    let job_started = Instant::now();
    let cpu_before = MachineCpu::read();
    n.apply(
        &client,
        &ns.name,
        json!({"apiVersion": "floe.dev/v1alpha1", "kind": "RolloutJob", "metadata": {"name": "claims"},
               "spec": {"numSamples": 4, "concurrency": warm, "poolRef": {"name": "warm"},
                        "harness": {"preset": "custom", "command": ["sh", "/opt/agent/agent.sh"]},
                        "evaluator": {"command": ["true"]},
                        "sampling": {"maxResponseTokens": 1},
                        "timeouts": {"agentSeconds": 60, "evaluatorSeconds": 30},
                        "sft": {"upstream": {"url": format!("http://teacher.{}.svc:8000", ns.name), "model": "policy"},
                                "output": {"claimName": "data", "path": "/claims"}},
                        "tasks": {"inline": tasks}}}),
    )
    .await?;
    let jobs: Api<RolloutJob> = Api::namespaced(client.clone(), &ns.name);
    // Each slot runs a session, lets its pod go and waits for the pool's replacement.
    let budget = 120 + 10 * sessions as u64;
    let status = eventually_within(budget, "the job to finish", async || {
        let j = jobs.get("claims").await?;
        Ok(j.status.filter(|s| {
            matches!(
                s.phase,
                Some(RolloutJobPhase::Succeeded | RolloutJobPhase::Failed)
            )
        }))
    })
    .await?;
    let job_seconds = job_started.elapsed().as_secs_f64();
    let cpu = cpu_before.and_then(|before| MachineCpu::read()?.since(&before));
    if status.sessions.succeeded as usize != sessions {
        let events: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(client.clone(), &ns.name);
        let why: Vec<String> = events
            .list(&Default::default())
            .await?
            .items
            .into_iter()
            .filter(|e| e.type_.as_deref() == Some("Warning"))
            .filter_map(|e| e.note)
            .take(3)
            .collect();
        bail!(
            "the job did not score every session: {:?}\n{}",
            status.sessions,
            why.join("\n")
        );
    }
    watching.abort();
    // The operator's own view of the claim (its histogram: means only).
    let metrics = operator.metrics().await?;
    let phase_mean = |phase: &str| {
        let read = |series: &str| {
            metric_value(
                &metrics,
                &format!("floe_claim_phase_seconds_{series}{{phase=\"{phase}\"}}"),
            )
        };
        Some(1000.0 * read("sum")? / read("count")?.max(1.0))
    };

    let s = seen.lock().unwrap_or_else(|e| e.into_inner());
    // Each claim in two parts: the operator's PATCH and the assignment's delivery through the
    // pod's gateway to the runner's long poll, then the runner's own work (task files, harness
    // config) up to the harness's start. Milliseconds.
    let mut parts: Vec<([i64; 2], &str)> = s
        .started
        .iter()
        .map(|(pod, [claimed, received, started])| {
            ([received - claimed, started - received], pod.as_str())
        })
        .collect();
    let claims: Vec<f64> = parts
        .iter()
        .map(|([to, inside], _)| (to + inside) as f64)
        .collect();
    let to_runner: Vec<f64> = parts.iter().map(|([to, _], _)| *to as f64).collect();
    let in_runner: Vec<f64> = parts
        .iter()
        .map(|([_, inside], _)| *inside as f64)
        .collect();
    if claims.len() < sessions {
        bail!(
            "saw {} sessions' start of {sessions} (pods released before the watch saw them?)",
            claims.len()
        );
    }
    // Replacement pods: created by the pool after the job began, READY while it ran.
    let refills: Vec<(Instant, f64)> = s
        .pool_ready
        .iter()
        .filter_map(|(name, ready)| {
            let first = *s.first.get(name)?;
            (first > job_started).then(|| (*ready, ms(ready.duration_since(first))))
        })
        .collect();
    let refill_window = refills
        .iter()
        .map(|(at, _)| at.duration_since(job_started).as_secs_f64())
        .fold(0.0, f64::max);
    let refill_ms: Vec<f64> = refills.iter().map(|(_, d)| *d).collect();
    // The same pods in two parts: created → the kubelet's Ready condition (its readiness probe
    // of the gateway), then Ready → the pool's READY label (the operator's part).
    let (to_ready, to_label): (Vec<f64>, Vec<f64>) = s
        .pool_ready
        .iter()
        .filter_map(|(name, labelled)| {
            let (first, ready) = (*s.first.get(name)?, *s.ready.get(name)?);
            (first > job_started).then(|| {
                (
                    ms(ready.duration_since(first)),
                    ms(labelled.saturating_duration_since(ready)),
                )
            })
        })
        .unzip();
    let (b50, b99) = (percentile(bare.clone(), 0.5), percentile(bare, 0.99));
    let (c50, c99) = (
        percentile(claims.clone(), 0.5),
        percentile(claims.clone(), 0.99),
    );
    println!(
        "node claims: {sessions} sessions, warm pool {warm}, job {job_seconds:.1} s ({:.1} sessions/s)",
        sessions as f64 / job_seconds
    );
    println!(
        "model: {}",
        if real_model {
            "the host's vLLM"
        } else {
            "the scripted upstream"
        }
    );
    if let Ok(cpu) = cpu {
        println!("CPU while the job ran: {cpu}");
    }
    println!("| | p50 | p99 | n |\n|---|---|---|---|");
    println!("| baseline: bare pod created → Ready (same image, same node) | {b50:.0} ms | {b99:.0} ms | 5 |");
    row(
        "claim → harness process started in the claimed pod",
        &claims,
    );
    row("claim → the runner has the assignment", &to_runner);
    row("the runner has it → harness started", &in_runner);
    // The tail, claim by claim: (to the runner, in the runner), the slowest three, by pod (the
    // operator logs each claim's PATCH and delivery as "claim timings" with the pod).
    parts.sort_by_key(|([to, inside], _)| std::cmp::Reverse(to + inside));
    println!(
        "slowest claims (ms to the runner + ms in it, pod): {:?}",
        &parts[..parts.len().min(3)]
    );
    if let (Some(patch), Some(deliver)) = (phase_mean("patch"), phase_mean("deliver")) {
        println!("operator's means: claim PATCH {patch:.0} ms, delivery to the pod's gateway {deliver:.0} ms");
    }
    if !refill_ms.is_empty() {
        row("refill: pool pod created → READY", &refill_ms);
        for (part, values) in [
            ("created → kubelet Ready", to_ready),
            ("kubelet Ready → READY (the operator)", to_label),
        ] {
            if !values.is_empty() {
                row(&format!("refill, {part}"), &values);
            }
        }
    }
    // Where a refill's time goes, by the kubelet's own record (medians, whole seconds).
    let mut events: std::collections::BTreeMap<&str, Vec<f64>> = Default::default();
    for (name, at) in &s.timeline {
        if s.first.get(name).is_some_and(|first| *first > job_started) {
            for (what, secs) in at {
                events.entry(what.as_str()).or_default().push(*secs);
            }
        }
    }
    let mut ordered: Vec<(f64, &str, usize)> = events
        .iter()
        .map(|(what, v)| (percentile(v.clone(), 0.5), *what, v.len()))
        .collect();
    ordered.sort_by(|a, b| a.0.total_cmp(&b.0));
    for (median, what, count) in ordered {
        println!("refill pod, {what}: {median:.0} s after creation (median of {count})");
    }
    println!(
        "claim → harness start is {:.1}× faster than a bare pod's start at p50 ({:.1}× at p99)",
        b50 / c50.max(1.0),
        b99 / c99.max(1.0)
    );
    println!(
        "refill rate: {} pods READY in {refill_window:.1} s = {:.2} pods/s",
        refill_ms.len(),
        refill_ms.len() as f64 / refill_window.max(0.001)
    );
    Ok(())
}
