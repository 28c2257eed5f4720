//! Operator benchmarks on the genuine kube-apiserver (the test control plane), each printed
//! with a baseline measured in the same run:
//!
//! 1. **Claim latency**: a RolloutJob against a warm pool; from the reconcile round that found
//!    a session claimable until the pod's real `floe gateway` acknowledged its assignment
//!    (the operator's `floe_claim_latency_seconds`), p50/p99 — against the floor of one bare
//!    apiserver PATCH round trip measured here.
//! 2. **Operator memory**: RSS while it manages a pool of N pods (each with its Secret),
//!    against its RSS with nothing to manage.
//!
//! `--quick` (CI): 40 sessions, 500 pods. Full: 200 sessions, 5,000 pods.
//! For experiments: `FLOE_BENCH_REFILL_PER_MINUTE` paces the claim bench pool's refill
//! (unpaced by default), `FLOE_BENCH_SESSION_SECONDS` how long sessions hold their pods
//! (`MIN-MAX`, default 2-6; `0`: done at once), `FLOE_BENCH_OPERATOR_ARGS` adds operator flags (e.g.
//! `--kube-qps 1000`), `FLOE_BENCH_COLLECTOR_SECONDS` how long the job's collector takes to get
//! Ready (default 2), `FLOE_BENCH_SKIP_CLAIMS` / `FLOE_BENCH_SKIP_MEMORY` skip a part.
//! The fake kubelet (`floe_tests::kubelet`) plays the nodes: see its docs.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use floe_crds::gateway_pool::GatewayPool;
use floe_crds::rollout_job::{RolloutJob, RolloutJobPhase};
use floe_tests::kubelet::{pod_ready, FakeKubelet, NodeOptions, Verdict};
use floe_tests::operator::{eventually_every, eventually_within, metric_value, Operator};
use floe_tests::proc_cpu::{self, Snapshot};
use floe_tests::{cluster, percentile, TestNamespace};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

fn pool(name: &str, replicas: i32, per_minute: i32) -> Result<GatewayPool> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "floe.dev/v1alpha1", "kind": "GatewayPool", "metadata": {"name": name},
        "spec": {"replicas": replicas, "template": {"image": "ghcr.io/acme/sandbox:1"},
                 "refill": {"batchSize": 500, "maxPodsPerMinute": per_minute, "unreadyTimeoutSeconds": 86400}},
    }))?)
}

/// Refill pace of the claim bench's pool: unpaced unless `FLOE_BENCH_REFILL_PER_MINUTE` says.
fn refill_per_minute() -> i32 {
    std::env::var("FLOE_BENCH_REFILL_PER_MINUTE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000)
}

/// How long each session holds its pod, in seconds: `FLOE_BENCH_SESSION_SECONDS` as `MIN-MAX`
/// (default 2-6), or `0`: done the moment its runner takes the assignment. A real agent runs
/// for minutes; with `0` the first round's sessions finish, and are folded and refilled,
/// while their siblings are still being claimed: a storm no real job makes.
fn session_hold() -> (f64, f64) {
    let spec = std::env::var("FLOE_BENCH_SESSION_SECONDS").unwrap_or_else(|_| "2-6".into());
    let (lo, hi) = spec.split_once('-').unwrap_or((&spec, &spec));
    let lo: f64 = lo.trim().parse().unwrap_or(0.0);
    (lo, hi.trim().parse().unwrap_or(lo).max(lo))
}

/// How long the job's dataset collector takes from created to Ready (running, not Ready, in
/// between): `FLOE_BENCH_COLLECTOR_SECONDS`, default 2. A real trainer loads a model for
/// minutes.
fn collector_start() -> Duration {
    std::env::var("FLOE_BENCH_COLLECTOR_SECONDS")
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map_or(Duration::from_secs(2), Duration::from_secs_f64)
}

/// The fake kubelet's sessions: each holds its pod for a time spread evenly over `hold` by
/// its session id (the same in every run), then scores 1.
fn holding_sessions((lo, hi): (f64, f64)) -> floe_tests::kubelet::Decide {
    use std::collections::HashMap;
    use std::hash::{Hash, Hasher};
    let taken: std::sync::Mutex<HashMap<String, Instant>> = Default::default();
    Arc::new(move |a: &serde_json::Value| {
        let id = a["session"].as_str().unwrap_or_default();
        let mut h = std::collections::hash_map::DefaultHasher::new();
        id.hash(&mut h);
        let hold = lo + (hi - lo) * (h.finish() % 1001) as f64 / 1000.0;
        let mut taken = taken.lock().unwrap_or_else(|e| e.into_inner());
        let since = *taken.entry(id.to_string()).or_insert_with(Instant::now);
        if since.elapsed().as_secs_f64() < hold {
            return Verdict::Hang;
        }
        Verdict::Scored {
            exit: 0,
            reward: 1.0,
        }
    })
}

/// Cumulative buckets `(le, count)` of a Prometheus histogram series.
fn buckets(metrics: &str, name: &str) -> Vec<(f64, f64)> {
    // `name` may carry leading labels: `floe_claim_phase_seconds{phase="patch",`.
    let prefix = match name.strip_suffix(',') {
        Some(labelled) => {
            let (metric, labels) = labelled.split_once('{').unwrap_or((labelled, ""));
            format!("{metric}_bucket{{{labels},le=\"")
        }
        None => format!("{name}_bucket{{le=\""),
    };
    metrics
        .lines()
        .filter_map(|line| {
            let (le, count) = line.strip_prefix(&prefix)?.split_once("\"} ")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, count.trim().parse::<f64>().ok()?))
        })
        .collect()
}

/// The observations of `later` that `earlier` did not have yet (same series).
fn since(later: &[(f64, f64)], earlier: &[(f64, f64)]) -> Vec<(f64, f64)> {
    later
        .iter()
        .map(|(le, c)| {
            let before = earlier
                .iter()
                .find(|(l, _)| l == le)
                .map_or(0.0, |(_, c)| *c);
            (*le, c - before)
        })
        .collect()
}

/// p-quantile of cumulative buckets: the upper bound of the first bucket holding it.
fn bucket_quantile(buckets: &[(f64, f64)], q: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    buckets
        .iter()
        .find(|(_, c)| *c >= q * total)
        .map(|(le, _)| *le)
}

fn quantile(metrics: &str, name: &str, q: f64) -> Option<f64> {
    bucket_quantile(&buckets(metrics, name), q)
}

/// The apiserver's writes so far (`apiserver_request_total`, mutating verbs, every client and
/// namespace), by `VERB resource[/subresource]`.
async fn apiserver_writes(client: &Client) -> Result<BTreeMap<String, f64>> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    let text = client.request_text(request).await?;
    let mut writes = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, count)) = rest.split_once("} ") else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split(',')
                .find_map(|kv| {
                    kv.strip_prefix(name)?
                        .strip_prefix("=\"")?
                        .strip_suffix('"')
                })
                .unwrap_or_default()
        };
        let verb = label("verb");
        if !matches!(verb, "POST" | "PUT" | "PATCH" | "DELETE") {
            continue;
        }
        let key = match label("subresource") {
            "" => format!("{verb} {}", label("resource")),
            sub => format!("{verb} {}/{sub}", label("resource")),
        };
        *writes.entry(key).or_insert(0.0) += count.trim().parse::<f64>().unwrap_or(0.0);
    }
    Ok(writes)
}

/// `later - earlier`, the non-zero entries, as `VERB resource N` items.
fn writes_between(earlier: &BTreeMap<String, f64>, later: &BTreeMap<String, f64>) -> String {
    let items: Vec<String> = later
        .iter()
        .filter_map(|(k, v)| {
            let d = v - earlier.get(k).copied().unwrap_or(0.0);
            (d > 0.0).then(|| format!("{k} {d}"))
        })
        .collect();
    items.join(", ")
}

/// CPU by part of this one-machine cluster: the control plane, the operator, the gateways the
/// fake kubelet started (the pods' sidecars) and this process (the fake kubelet and the bench).
fn cpu_now(operator: u32) -> Snapshot {
    let kubeconfig = &cluster().kubeconfig;
    let part = |name: &str| {
        proc_cpu::control_plane_pid(kubeconfig, name)
            .into_iter()
            .collect()
    };
    let me = std::process::id();
    let gateways: Vec<u32> = proc_cpu::children(me)
        .into_iter()
        .filter(|p| *p != operator)
        .collect();
    Snapshot::take(&[
        ("apiserver", part("apiserver")),
        ("etcd", part("etcd")),
        ("controller-manager", part("kcm")),
        ("operator", vec![operator]),
        ("gateways", gateways),
        ("fake kubelet + bench", vec![me]),
    ])
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

async fn claim_latency(client: &Client, sessions: usize, warm: i32) -> Result<()> {
    let c = cluster();
    let ns = TestNamespace::create(c, client, "bench-claim").await?;
    let extra = std::env::var("FLOE_BENCH_OPERATOR_ARGS").unwrap_or_default();
    let mut args = vec!["--concurrency", "4"];
    args.extend(extra.split_whitespace());
    let operator = Operator::start(&ns.name, &args)?;
    let hold = session_hold();
    // The job's dataset collector takes a while to start, as a real pod does. Reported Ready
    // at once, it was Ready by the time the operator's round that created it read it back,
    // and that round went on to claim: the first round's claims then counted the collector's
    // creation (about 100 ms) as claim latency, which no real cluster would show.
    let node = NodeOptions {
        job_pod_start: collector_start(),
        ..Default::default()
    };
    let kubelet =
        FakeKubelet::start_with(client.clone(), &ns.name, 20, holding_sessions(hold), node)?;
    let pools: Api<GatewayPool> = Api::namespaced(client.clone(), &ns.name);
    pools
        .create(
            &PostParams::default(),
            &pool("warm", warm, refill_per_minute())?,
        )
        .await?;
    eventually_within(300, "the pool READY", async || {
        let s = pools.get("warm").await?.status.unwrap_or_default();
        Ok((s.ready_replicas >= warm).then_some(()))
    })
    .await?;

    // Baseline: one bare PATCH round trip on this apiserver (the floor of any claim).
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    configmaps
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "probe"}}))?,
        )
        .await?;
    let mut bare = Vec::new();
    for i in 0..50 {
        let t = Instant::now();
        configmaps
            .patch(
                "probe",
                &PatchParams::default(),
                &Patch::Merge(&json!({"data": {"i": i.to_string()}})),
            )
            .await?;
        bare.push(t.elapsed().as_secs_f64());
    }

    let floor = claim_burst_floor(client, &ns.name, warm).await?;

    let samples = 4;
    let tasks: Vec<_> = (0..sessions / samples)
        .map(|i| json!({"id": format!("t{i}"), "instruction": "x"}))
        .collect();
    let job: RolloutJob = serde_json::from_value(json!({
        "apiVersion": "floe.dev/v1alpha1", "kind": "RolloutJob", "metadata": {"name": "bench"},
        "spec": {"tasks": {"inline": tasks}, "numSamples": samples, "harness": {"preset": "pi"},
                 "poolRef": {"name": "warm"}, "evaluator": {"command": ["true"]},
                 "concurrency": warm, "sft": {"upstream": {"url": "http://t:8000"}, "output": {"claimName": "d"}}},
    }))?;
    let jobs: Api<RolloutJob> = Api::namespaced(client.clone(), &ns.name);
    let writes_before = apiserver_writes(client).await?;
    let started = Instant::now();
    jobs.create(&PostParams::default(), &job).await?;
    // The first round starts once the collector is Ready: from then on, where the CPU goes.
    let all_pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), &ns.name);
    let collector_ready = async || {
        let ready = all_pods
            .get_opt("bench-dataset")
            .await?
            .is_some_and(|p| pod_ready(&p));
        Ok(ready.then_some(()))
    };
    // Polled finely, so the round has not begun when the snapshot is taken.
    let fine = Duration::from_millis(10);
    eventually_every(fine, 60, "the job's collector Ready", collector_ready).await?;
    let operator_pid = operator.child.id();
    // The window starts before the snapshot is read: reading ~100 processes' threads takes a
    // while, and the CPU used meanwhile is in the tally.
    let round_start = Instant::now();
    let cpu_round_start = cpu_now(operator_pid);
    // The CPU tally ends when the runners have taken the round's 50 assignments: read from
    // the fake kubelet in this process every 5 ms, which costs the cluster nothing (polling
    // the operator's metrics that often slowed the round it measured). A runner takes its
    // assignment as its gateway accepts it, a moment before the operator hears the answer.
    eventually_every(
        Duration::from_millis(5),
        120,
        "the first round taken",
        async || Ok((kubelet.taken_count() >= usize::try_from(warm)?).then_some(())),
    )
    .await?;
    let cpu_first_round = cpu_now(operator_pid).since(&cpu_round_start);
    let round_wall = round_start.elapsed().as_secs_f64();
    let writes_first_round = apiserver_writes(client).await?;
    // The first round claims the whole warm pool at once: a burst, unlike the claims that
    // follow one by one as sessions finish. Snapshot the histogram when it is done, to report
    // the two apart.
    let first_round = eventually_within(120, "the first round's claims", async || {
        let m = operator.metrics().await?;
        let done = buckets(&m, "floe_claim_latency_seconds")
            .last()
            .is_some_and(|(_, c)| *c >= f64::from(warm));
        Ok(done.then_some(m))
    })
    .await?;
    eventually_within(900, "the bench job finished", async || {
        let s = jobs.get("bench").await?.status.unwrap_or_default();
        Ok((s.phase == Some(RolloutJobPhase::Succeeded)).then_some(()))
    })
    .await?;
    let wall = started.elapsed().as_secs_f64();
    let writes_after = apiserver_writes(client).await?;
    let metrics = operator.metrics().await?;
    let p50 = quantile(&metrics, "floe_claim_latency_seconds", 0.5).context("p50")?;
    let p99 = quantile(&metrics, "floe_claim_latency_seconds", 0.99).context("p99")?;
    let bare50 = percentile(bare.clone(), 0.5);
    println!("claim latency, {sessions} sessions, warm pool of {warm} (concurrency {warm}, refill {} pods/min, each session holding its pod {}–{} s):", refill_per_minute(), hold.0, hold.1);
    println!(
        "  baseline: bare apiserver PATCH p50 {:.1} ms, p99 {:.1} ms",
        bare50 * 1e3,
        percentile(bare, 0.99) * 1e3
    );
    let floor_mean = floor.each.iter().sum::<f64>() / floor.each.len().max(1) as f64;
    println!(
        "  baseline: {} claim-shaped pod PATCHes at once ({} in flight) on copies of the pool's pods, watched as they are, nothing else running: answered after p50 {:.1} ms, p99 {:.1} ms, mean {:.1} ms (from the burst's start); all in {:.1} ms",
        floor.each.len(),
        floor.in_flight,
        percentile(floor.each.clone(), 0.5) * 1e3,
        percentile(floor.each.clone(), 0.99) * 1e3,
        floor_mean * 1e3,
        floor.all * 1e3
    );
    println!("  claim → assignment acknowledged: p50 ≤ {:.1} ms ({:.1}× a bare PATCH), p99 ≤ {:.1} ms (target ≤ 100 ms)",
        p50 * 1e3, p50 / bare50, p99 * 1e3);
    let all = buckets(&metrics, "floe_claim_latency_seconds");
    let first = buckets(&first_round, "floe_claim_latency_seconds");
    let rest = since(&all, &first);
    for (what, b) in [
        ("first round (the pool's burst)", &first),
        ("every later claim", &rest),
    ] {
        println!(
            "    {what}: {} claims, p50 ≤ {:.1} ms, p99 ≤ {:.1} ms",
            b.last().map_or(0.0, |(_, c)| *c),
            bucket_quantile(b, 0.5).unwrap_or(f64::NAN) * 1e3,
            bucket_quantile(b, 0.99).unwrap_or(f64::NAN) * 1e3
        );
    }
    // A page's claim-latency `sum` or `count`.
    let total = |m: &str, what: &str| {
        metric_value(m, &format!("floe_claim_latency_seconds_{what}")).unwrap_or(f64::NAN)
    };
    let mean = |m: &str| total(m, "sum") / total(m, "count");
    println!(
        "    first round: mean {:.1} ms ({:.2}× the PATCH-only burst's mean)",
        mean(&first_round) * 1e3,
        mean(&first_round) / floor_mean
    );
    // The later claims' mean: steadier than their p99 (a bucket bound over 150 claims).
    let later_mean = (total(&metrics, "sum") - total(&first_round, "sum"))
        / (total(&metrics, "count") - total(&first_round, "count"));
    println!("    every later claim: mean {:.1} ms", later_mean * 1e3);
    println!(
        "    refills waited for claims: {:.2} s in all",
        metric_value(&metrics, "floe_pool_refill_yield_seconds_total").unwrap_or(f64::NAN)
    );
    // Each phase in the first round and after it: the burst queues for PATCH slots
    // ("observe"); a later claim's time shows where the apiserver was busy with other work.
    for phase in ["observe", "patch", "deliver"] {
        let series = format!("floe_claim_phase_seconds{{phase=\"{phase}\",");
        let first = buckets(&first_round, &series);
        let later = since(&buckets(&metrics, &series), &first);
        let q = |b: &[(f64, f64)], q: f64| bucket_quantile(b, q).unwrap_or(f64::NAN) * 1e3;
        println!(
            "    phase {phase:8}: first round p50 ≤ {:.1} ms, p99 ≤ {:.1} ms; later p50 ≤ {:.1} ms, p99 ≤ {:.1} ms",
            q(&first, 0.5),
            q(&first, 0.99),
            q(&later, 0.5),
            q(&later, 0.99)
        );
    }
    // What competed with the burst at the apiserver, and what the whole job wrote.
    println!(
        "  apiserver writes from the job's creation to the first round's last acknowledgement: {}",
        writes_between(&writes_before, &writes_first_round)
    );
    println!(
        "  apiserver writes over the whole job: {}",
        writes_between(&writes_before, &writes_after)
    );
    // On these shared cores the node side (gateways, kubelet) competes with the control plane,
    // as it would not on a real cluster.
    let cpu_total: f64 = cpu_first_round.values().sum();
    println!(
        "  CPU from the collector's Ready (the first round's start) until its runners took the round's assignments, {:.0} ms: {} — {:.0} ms in all, {:.2} of the machine's {} cores",
        round_wall * 1e3,
        cpu_first_round
            .iter()
            .map(|(k, v)| format!("{k} {:.0} ms", v * 1e3))
            .collect::<Vec<_>>()
            .join(", "),
        cpu_total * 1e3,
        cpu_total / round_wall / cores() as f64,
        cores()
    );
    let reads = |source: &str| {
        let series = format!("floe_job_pod_reads_total{{source=\"{source}\"}}");
        metric_value(&metrics, &series).unwrap_or(f64::NAN)
    };
    println!(
        "  rounds reading the job's pods: {} from the watch cache, {} listed from the apiserver",
        reads("cache"),
        reads("apiserver")
    );
    // The least the job can take: every session's hold, `warm` at a time.
    let held = sessions as f64 * (hold.0 + hold.1) / 2.0 / f64::from(warm);
    println!(
        "  whole job: {wall:.1} s, {:.1} sessions/s (the sessions' own holds alone: {held:.1} s)",
        sessions as f64 / wall
    );
    kubelet.stop().await?;
    jobs.delete("bench", &Default::default()).await?;
    eventually_within(120, "the bench job deleted", async || {
        Ok(jobs.get_opt("bench").await?.is_none().then_some(()))
    })
    .await?;
    drop(operator);
    Ok(())
}

/// What the apiserver alone gives for a burst like the first round's claims.
struct BurstFloor {
    in_flight: usize,
    /// When each PATCH was answered, seconds from the burst's start.
    each: Vec<f64>,
    /// The whole burst, seconds.
    all: f64,
}

/// The operator's round parallelism, as the bench starts it (`--round-parallelism`, else 16).
fn round_parallelism() -> usize {
    let extra = std::env::var("FLOE_BENCH_OPERATOR_ARGS").unwrap_or_default();
    let mut args = extra.split_whitespace();
    while let Some(a) = args.next() {
        if let Some(v) = a.strip_prefix("--round-parallelism=") {
            return v.parse().unwrap_or(16);
        }
        if a == "--round-parallelism" {
            return args.next().and_then(|v| v.parse().ok()).unwrap_or(16);
        }
    }
    16
}

/// Baseline for the first round: `n` pods with the pool's own spec and status, in the state
/// the pool's READY mark leaves its pods (no field-ownership record, the floe label, so the
/// operator's and the fake kubelet's watches carry every write to them, as they carry a
/// claim), that nobody acts on (no pool, no job, already Running), then `n` PATCHes shaped
/// like claims (resourceVersion precondition, labels, annotations, an ownerReference, the
/// record cleared) with the operator's round parallelism in flight. The pods are deleted
/// afterwards.
async fn claim_burst_floor(client: &Client, ns: &str, n: i32) -> Result<BurstFloor> {
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{DeleteParams, ListParams};
    use kube::ResourceExt;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let model = pods
        .list(&ListParams::default().labels("floe.dev/pool=warm"))
        .await?
        .items
        .into_iter()
        .next()
        .context("a pool pod to copy")?;
    let owner = Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get("probe")
        .await?;
    let owner_ref = json!({"apiVersion": "v1", "kind": "ConfigMap", "name": "probe",
                           "uid": owner.uid(), "controller": true});
    let mut copies = Vec::new();
    for i in 0..n {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("burst-probe-{i}"), "labels": {"bench": "burst-probe"},
                         "annotations": model.annotations()},
            "spec": model.spec,
        }))?;
        let created = pods.create(&PostParams::default(), &pod).await?;
        let status = json!({"status": model.status});
        pods.patch_status(
            &created.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&status),
        )
        .await?;
        // As the pool's READY mark leaves its pods. Only now the floe label: a Pending pod
        // with it would be started by the fake kubelet.
        let cleared = json!({"metadata": {"managedFields": [{}],
                                          "labels": {"app.kubernetes.io/managed-by": "floe"}}});
        let ready = pods
            .patch(
                &created.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&cleared),
            )
            .await?;
        copies.push(ready);
    }
    let in_flight = round_parallelism();
    let started = Instant::now();
    let pods_ref = &pods;
    let owner_ref = &owner_ref;
    let each: Vec<Result<f64>> = futures::stream::iter(copies)
        .map(|pod: Pod| async move {
            let patch = json!({"metadata": {
                "resourceVersion": pod.resource_version(),
                "labels": {"floe.dev/state": "claimed", "floe.dev/job": "bench"},
                "annotations": {"floe.dev/session-index": "0", "floe.dev/attempt": "0",
                                "floe.dev/session": format!("bench-{}", pod.name_any()),
                                "floe.dev/claimed-at": "2026-11-23T00:00:00Z"},
                "ownerReferences": [owner_ref],
                "managedFields": [{}],
            }});
            pods_ref
                .patch(
                    &pod.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await?;
            // From the burst's start, as a claim's latency counts from its round's start.
            Ok(started.elapsed().as_secs_f64())
        })
        .buffer_unordered(in_flight)
        .collect()
        .await;
    let all = started.elapsed().as_secs_f64();
    let each = each.into_iter().collect::<Result<Vec<_>>>()?;
    let probes = ListParams::default().labels("bench=burst-probe");
    pods.delete_collection(&DeleteParams::default(), &probes)
        .await?;
    // The job's first round is measured against this floor: it must not start in the
    // aftermath of the copies (their deletions through every watcher and the garbage
    // collector), as nothing runs beside the floor's own burst either.
    eventually_within(60, "the burst's copies gone", async || {
        Ok(pods.list(&probes).await?.items.is_empty().then_some(()))
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    Ok(BurstFloor {
        in_flight,
        each,
        all,
    })
}

async fn operator_memory(client: &Client, pods: i32) -> Result<()> {
    let c = cluster();
    let ns = TestNamespace::create(c, client, "bench-rss").await?;
    let operator = Operator::start(&ns.name, &[])?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (idle, _) = proc_cpu::rss_kib(operator.child.id()).context("operator RSS")?;
    // No kubelet here: the pods stay Pending (warming), which is all the operator needs to
    // manage them (list, watch, status).
    let pools: Api<GatewayPool> = Api::namespaced(client.clone(), &ns.name);
    let started = Instant::now();
    pools
        .create(&PostParams::default(), &pool("big", pods, 100_000)?)
        .await?;
    eventually_within(1800, "the pool's pods created", async || {
        let s = pools.get("big").await?.status.unwrap_or_default();
        Ok((s.replicas >= pods).then_some(()))
    })
    .await?;
    let fill = started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (rss, peak) = proc_cpu::rss_kib(operator.child.id()).context("operator RSS")?;
    println!("operator memory managing {pods} pods (+{pods} Secrets):");
    println!(
        "  baseline: {:.1} MiB RSS with nothing to manage",
        idle as f64 / 1024.0
    );
    println!("  RSS {:.1} MiB ({:.2}× idle), peak {:.1} MiB (target ≤ 150 MiB); pool filled in {fill:.0} s",
        rss as f64 / 1024.0, rss as f64 / idle.max(1) as f64, peak as f64 / 1024.0);
    // Deleting the namespace lets garbage collection take the pods.
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let (sessions, warm, pods) = if quick {
        (40, 10, 500)
    } else {
        (200, 50, 5000)
    };
    let client = cluster().client().await?;
    cluster().install_crds(&client).await?;
    if std::env::var_os("FLOE_BENCH_SKIP_CLAIMS").is_none() {
        claim_latency(&client, sessions, warm).await?;
    }
    if std::env::var_os("FLOE_BENCH_SKIP_MEMORY").is_none() {
        operator_memory(&client, pods).await?;
    }
    Ok(())
}
