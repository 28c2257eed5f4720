//! The RolloutJob controller on the genuine kube-apiserver: the real `floe operator` claims
//! READY pool pods, delivers assignments to each pod's real `floe gateway`, folds the results
//! into the job's status and lets the pods go. There is no kubelet or container runtime here,
//! so `floe_tests::kubelet::FakeKubelet` plays both, openly: it starts each pod's gateway on a
//! loopback address of its own (the pod IP), marks the pod Ready, takes the assignment as the
//! runner would and ends the sandbox container with a runner-shaped termination message.

use std::collections::BTreeSet;
use std::sync::Arc;

use anyhow::{Context, Result};
use floe_crds::gateway_pool::GatewayPool;
use floe_crds::rollout_job::{RolloutJob, RolloutJobPhase, RolloutJobStatus};
use floe_tests::kubelet::{pod_ready, FakeKubelet, NodeOptions, Verdict};
use floe_tests::namespace::with_crds;
use floe_tests::operator::{eventually, eventually_within, metric_value, pool_ready, Operator};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{json, Value};

async fn create_pool(client: &Client, ns: &str, name: &str, replicas: i32) -> Result<()> {
    let pool: GatewayPool = serde_json::from_value(json!({
        "apiVersion": "floe.dev/v1alpha1", "kind": "GatewayPool",
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "template": {"image": "ghcr.io/acme/sandbox-pi:1"},
                 "refill": {"batchSize": 8, "maxPodsPerMinute": 600}},
    }))?;
    Api::<GatewayPool>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pool)
        .await?;
    Ok(())
}

fn job(name: &str, tasks: &[&str], samples: i32, extra: Value) -> Result<RolloutJob> {
    let tasks: Vec<Value> = tasks
        .iter()
        .map(|t| json!({"id": t, "instruction": format!("solve {t}")}))
        .collect();
    let mut spec = json!({
        "tasks": {"inline": tasks}, "numSamples": samples,
        "harness": {"preset": "pi"}, "poolRef": {"name": "warm"},
        "evaluator": {"command": ["python", "-m", "pytest", "-q"]},
        "sft": {"upstream": {"url": "http://teacher.models.svc:8000", "model": "teacher"},
                "output": {"claimName": "sft-data"}},
    });
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    Ok(serde_json::from_value(json!({
        "apiVersion": "floe.dev/v1alpha1", "kind": "RolloutJob",
        "metadata": {"name": name}, "spec": spec,
    }))?)
}

/// ConfigMap `tasks` holding the tasks `ids` (`solve <id>` each) as JSON lines under
/// `tasks.jsonl`.
fn tasks_config_map(ids: &[&str]) -> Result<k8s_openapi::api::core::v1::ConfigMap> {
    let lines: String = ids
        .iter()
        .map(|t| {
            format!(
                "{}\n",
                json!({"id": t, "instruction": format!("solve {t}")})
            )
        })
        .collect();
    Ok(serde_json::from_value(
        json!({"metadata": {"name": "tasks"}, "data": {"tasks.jsonl": lines}}),
    )?)
}

/// A played node on loopback block `block` whose every session scores 1.
fn scoring_node(client: &Client, ns: &str, block: u8) -> Result<FakeKubelet> {
    FakeKubelet::start(
        client.clone(),
        ns,
        block,
        Arc::new(|_: &Value| Verdict::Scored {
            exit: 0,
            reward: 1.0,
        }),
    )
}

async fn status(jobs: &Api<RolloutJob>, name: &str) -> Result<RolloutJobStatus> {
    Ok(jobs.get(name).await?.status.unwrap_or_default())
}

fn condition<'a>(s: &'a RolloutJobStatus, type_: &str) -> Option<(&'a str, &'a str)> {
    s.conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.as_str(), c.reason.as_str()))
}

/// What a stand-in recorded: each request's bearer credential and body.
type Recorded = Arc<std::sync::Mutex<Vec<(String, Value)>>>;

/// The IP of a train job's trainer pod, once the played kubelet gave it one.
async fn trainer_ip(pods: &Api<Pod>, job: &str) -> Result<String> {
    eventually("the trainer pod running", async || {
        Ok(pods
            .get_opt(&format!("{job}-trainer"))
            .await?
            .and_then(|p| p.status)
            .and_then(|s| s.pod_ip))
    })
    .await
}

/// A train job's control token, from its trainer's Secret.
async fn control_token(client: &Client, ns: &str, job: &str) -> Result<String> {
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), ns)
        .get(&format!("{job}-trainer-control"))
        .await?
        .data
        .and_then(|d| {
            d.get("control-token")
                .map(|b| String::from_utf8_lossy(&b.0).to_string())
        })
        .context("the control token")
}

/// The `authorization` header a stand-in was sent ("" without one).
fn bearer(headers: &axum::http::HeaderMap) -> String {
    headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

/// A stand-in for the trainer pod's policy server: every chat completion answered with the
/// same two sampled tokens, as vLLM shapes them, each request kept in `record`.
fn policy_stand_in(record: Recorded) -> axum::Router {
    axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(
            move |headers: axum::http::HeaderMap, axum::Json(body): axum::Json<Value>| async move {
                record.lock().map(|mut p| p.push((bearer(&headers), body))).ok();
                axum::Json(json!({"model": "policy", "prompt_token_ids": [1, 2, 3],
                    "choices": [{"index": 0, "finish_reason": "length",
                                 "message": {"role": "assistant", "content": "ok"},
                                 "token_ids": [7, 8],
                                 "logprobs": {"content": [{"logprob": -0.5}, {"logprob": -1.5}]}}]}))
            },
        ),
    )
}

/// Serve `router` on `ip:port` (a played pod's address) for the rest of the test.
async fn serve_at(ip: &str, port: u16, router: axum::Router) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(format!("{ip}:{port}")).await?;
    tokio::spawn(async move { axum::serve(listener, router).await });
    Ok(())
}

async fn job_pods(pods: &Api<Pod>, job: &str) -> Result<Vec<Pod>> {
    Ok(pods
        .list(&ListParams::default().labels(&format!("floe.dev/job={job}")))
        .await?
        .items)
}

async fn event_notes(client: &Client, ns: &str, reason: &str) -> Result<Vec<String>> {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), ns);
    Ok(events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .map(|e| e.note.unwrap_or_default())
        .collect())
}

/// The notes of the Events of `reason`, once there is one: they are published beside the
/// status write that a test waits for, not before it.
async fn noted(client: &Client, ns: &str, reason: &str) -> Result<Vec<String>> {
    noted_until(client, ns, reason, |n| !n.is_empty()).await
}

/// The notes of the Events of `reason` once `enough` holds of them (as [`noted`]), or as they
/// are when it never does, for the caller's assertion to show.
async fn noted_until(
    client: &Client,
    ns: &str,
    reason: &str,
    enough: impl Fn(&[String]) -> bool,
) -> Result<Vec<String>> {
    let waited = eventually(&format!("the {reason} events"), async || {
        let n = event_notes(client, ns, reason).await?;
        Ok(enough(&n).then_some(n))
    })
    .await;
    match waited {
        Ok(notes) => Ok(notes),
        Err(_) => event_notes(client, ns, reason).await,
    }
}

/// Delete every job while the operator still runs (it takes the finalizers off), so the
/// test namespace can go.
/// Once job `name` is Stalled for `reason`: the notes of the job's Events of that reason.
async fn stalled_for(
    client: &Client,
    jobs: &Api<RolloutJob>,
    ns: &str,
    name: &str,
    reason: &str,
) -> Result<Vec<String>> {
    let s = eventually(&format!("{name} stalled"), async || {
        let s = status(jobs, name).await?;
        Ok(condition(&s, "Stalled").is_some().then_some(s))
    })
    .await?;
    assert_eq!(condition(&s, "Stalled"), Some(("True", reason)), "{name}");
    assert_eq!(s.phase, Some(RolloutJobPhase::Pending), "{name}");
    eventually(&format!("a {reason} event"), async || {
        let n = event_notes(client, ns, reason).await?;
        Ok((!n.is_empty()).then_some(n))
    })
    .await
}

async fn delete_jobs(jobs: &Api<RolloutJob>) -> Result<()> {
    jobs.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await?;
    eventually("the jobs deleted", async || {
        Ok(jobs
            .list(&ListParams::default())
            .await?
            .items
            .is_empty()
            .then_some(()))
    })
    .await
}

/// `floe_job_pod_reads_total{source}` from an operator's metrics page.
fn pod_reads(metrics: &str, source: &str) -> u64 {
    let series = format!("floe_job_pod_reads_total{{source=\"{source}\"}}");
    metric_value(metrics, &series).unwrap_or(0.0) as u64
}

/// The session ids the node's runners took, in the order they took them.
fn taken_sessions(kubelet: &FakeKubelet) -> Vec<String> {
    kubelet
        .taken()
        .iter()
        .map(|a| a["session"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// The job's status once it succeeded (within `secs`).
async fn succeeded(jobs: &Api<RolloutJob>, name: &str, secs: u64) -> Result<RolloutJobStatus> {
    eventually_within(secs, &format!("job {name} succeeded"), async || {
        let s = status(jobs, name).await?;
        Ok((s.phase == Some(RolloutJobPhase::Succeeded)).then_some(s))
    })
    .await
}

fn attempt(a: &Value) -> u64 {
    a["metadata"]["attempt"].as_u64().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_session_runs_exactly_once_through_retries_and_an_operator_crash() -> Result<()> {
    let (client, ns) = with_crds("job").await?;
    let mut operator = Operator::start(&ns.name, &[])?;
    create_pool(&client, &ns.name, "warm", 4).await?;
    // t6's first attempts fail in the infrastructure (retried, then scored); t7's sample 0
    // always does (failed after backoffLimit, never a reward). Even samples pass; sample 3 is
    // an agent failure (exit 1), still scored.
    let kubelet = FakeKubelet::start(
        client.clone(),
        &ns.name,
        10,
        Arc::new(|a: &Value| {
            let task = a["task"].as_str().unwrap_or_default();
            let sample = a["sample"].as_u64().unwrap_or(0);
            if (task == "t6" && attempt(a) == 0) || (task == "t7" && sample == 0) {
                return Verdict::Infra {
                    error: "evaluator exited 127".into(),
                };
            }
            Verdict::Scored {
                exit: if sample == 3 { 1 } else { 0 },
                reward: if sample.is_multiple_of(2) { 1.0 } else { 0.0 },
            }
        }),
    )?;
    let jobs: Api<RolloutJob> = Api::namespaced(client.clone(), &ns.name);
    let tasks = ["t0", "t1", "t2", "t3", "t4", "t5", "t6", "t7"];
    let spec = job(
        "big",
        &tasks,
        4,
        json!({"concurrency": 6, "backoffLimit": 2}),
    )?;
    jobs.create(&PostParams::default(), &spec).await?;

    // Mid-job, the operator dies without warning and a new one starts.
    eventually_within(120, "10 sessions scored", async || {
        Ok((status(&jobs, "big").await?.sessions.succeeded >= 10).then_some(()))
    })
    .await?;
    operator.kill();
    let mid = status(&jobs, "big").await?;
    assert!(mid.sessions.succeeded < 32, "the crash must land mid-job");
    let operator = Operator::start(&ns.name, &[])?;

    let done = succeeded(&jobs, "big", 180).await?;
    let s = &done.sessions;
    assert_eq!(
        (s.total, s.succeeded, s.failed, s.running, s.pending),
        (32, 31, 1, 0, 0)
    );
    // t6: 4 sessions retried once; t7-0: retried twice, then failed (backoffLimit 2).
    assert_eq!(s.retried, 6);
    // Every folded attempt's model-server failures, once each (an operator SIGKILL between a
    // pod's result and its release folds nothing twice): 31 scored attempts, 7 failed ones.
    let upstream = done.upstream_errors.clone().context("upstreamErrors")?;
    assert_eq!(upstream.retried.get("http_503"), Some(&31), "{upstream:?}");
    assert_eq!(upstream.failed.get("connect"), Some(&7), "{upstream:?}");
    assert_eq!(done.completed_indexes.as_deref(), Some("0-27,29-31"));
    assert_eq!(done.failed_indexes.as_deref(), Some("28"));
    let r = done.rewards.clone().context("rewards")?;
    // Passing: samples 0 and 2 of t0..t6 (14) and t7's sample 2; t7-0 has no reward at all.
    assert_eq!((r.scored, r.passed, r.sum), (31, 15, 15.0));
    assert!((r.mean - 15.0 / 31.0).abs() < 1e-12);
    assert_eq!(done.progress.as_deref(), Some("32/32"));
    assert_eq!(
        condition(&done, "Complete"),
        Some(("True", "SessionsFinished"))
    );
    assert_eq!(
        condition(&done, "Ready"),
        Some(("True", "SessionsFinished"))
    );
    assert!(done.start_time.is_some() && done.completion_time.is_some());

    // No session ran twice and none was lost, across the crash: every attempt exactly once.
    let taken = kubelet.taken();
    let ids = taken_sessions(&kubelet);
    let unique: BTreeSet<&String> = ids.iter().collect();
    assert_eq!(
        unique.len(),
        ids.len(),
        "a session was assigned twice: {ids:?}"
    );
    let mut expected = BTreeSet::new();
    for t in tasks {
        for sample in 0..4 {
            expected.insert(format!("big-{t}-{sample}"));
        }
    }
    for sample in 0..4 {
        expected.insert(format!("big-t6-{sample}-r1"));
    }
    expected.insert("big-t7-0-r1".into());
    expected.insert("big-t7-0-r2".into());
    assert_eq!(ids.iter().cloned().collect::<BTreeSet<_>>(), expected);
    // What each pod's gateway received: the job's group, the sft wiring, the run spec.
    let first = &taken[0];
    assert_eq!(
        first["group"],
        format!("big/{}", first["task"].as_str().unwrap_or(""))
    );
    assert_eq!(first["upstream"]["url"], "http://teacher.models.svc:8000");
    assert_eq!(first["upstream"]["model"], "teacher");
    assert_eq!(
        first["upstream"]["kind"], "vllm",
        "the sft upstream's kind (vLLM by default)"
    );
    assert_eq!(first["sink"]["kind"], "trainer");
    assert!(
        first["sink"].get("snapshots").is_none(),
        "an sft job's sessions post none"
    );
    assert_eq!(
        first["sink"]["url"],
        format!("http://big-dataset.{}.svc:8100/v1/trajectories", ns.name)
    );
    assert_eq!(first["run"]["harness"]["preset"], "pi");

    // Every pod was released (finalizer off, deleted); the failure was announced.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    eventually("all session pods gone", async || {
        Ok(job_pods(&pods, "big").await?.is_empty().then_some(()))
    })
    .await?;
    let told = |n: &String| n.contains("session 28") && n.contains("evaluator exited 127");
    let failed = noted_until(&client, &ns.name, "SessionFailed", |n| n.iter().any(told)).await?;
    assert!(failed.iter().any(told), "{failed:?}");
    // The job's end is announced too (the last fold finishes it: no later status write).
    eventually("the Completed event", async || {
        let notes = event_notes(&client, &ns.name, "Completed").await?;
        Ok((!notes.is_empty()).then_some(notes))
    })
    .await?;
    let metrics = eventually("job metrics", async || {
        let m = operator.metrics().await?;
        Ok(m.contains("floe_session_reward_count").then_some(m))
    })
    .await?;
    let line = format!(
        "floe_session_reward_count{{namespace=\"{}\",rolloutjob=\"big\"}} 31",
        ns.name
    );
    assert!(metrics.contains(&line), "{line} not in:\n{metrics}");
    assert!(metrics.contains("floe_claims_total{kind="));
    assert!(metrics.contains("floe_claim_latency_seconds_count"));
    // The restarted operator listed the job's pods from the apiserver at first, then read them
    // from its watch cache once that had caught up with its writes — and, checked above, no
    // session was assigned twice either way.
    let (cached, listed) = (
        pod_reads(&metrics, "cache"),
        pod_reads(&metrics, "apiserver"),
    );
    println!("job pod reads after the restart: {cached} from the cache, {listed} listed");
    assert!(listed >= 1, "the first round lists from the apiserver");
    assert!(
        cached > listed,
        "most rounds should read the cache: {cached} from the cache, {listed} listed"
    );

    // sft: the job's dataset collector and its Service, owned by the job.
    let collector = pods.get("big-dataset").await?;
    assert_eq!(
        collector
            .metadata
            .owner_references
            .as_ref()
            .map(|o| o[0].kind.as_str()),
        Some("RolloutJob")
    );
    let args = collector
        .spec
        .as_ref()
        .and_then(|s| s.containers[0].args.clone())
        .unwrap_or_default();
    assert_eq!(args[0], "collect");
    Api::<k8s_openapi::api::core::v1::Service>::namespaced(client.clone(), &ns.name)
        .get("big-dataset")
        .await?;
    // The pods it claimed reach its collector, and no other job's, through the job's own
    // egress policy (the pool's allows no trainer or collector).
    let policy = Api::<k8s_openapi::api::networking::v1::NetworkPolicy>::namespaced(
        client.clone(),
        &ns.name,
    )
    .get("big-job-egress")
    .await?;
    assert_eq!(
        policy.metadata.owner_references.clone().unwrap_or_default()[0].name,
        "big"
    );
    let spec = serde_json::to_value(policy.spec)?;
    assert_eq!(
        spec["podSelector"],
        json!({"matchLabels": {"floe.dev/job": "big", "floe.dev/sandbox": "true"}})
    );
    assert_eq!(
        spec["egress"][0]["to"][0]["podSelector"]["matchLabels"],
        json!({"floe.dev/owner-job": "big"}),
        "{spec}"
    );

    // Deleting the job takes its finalizer off (its pods are gone already).
    delete_jobs(&jobs).await?;
    kubelet.stop().await?;
    Ok(())
}

/// The operator reads a job's pods from its watch cache once the cache has caught up with the
/// operator's own writes. Here the cache lags the apiserver by 600 ms (fault injection), so
/// rounds often start before the cache has seen the last round's claims and releases: they
/// must list from the apiserver instead, and no session may ever be assigned twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_pod_cache_never_assigns_a_session_twice() -> Result<()> {
    let (client, ns) = with_crds("joblag").await?;
    let operator =
        Operator::start_with_env(&ns.name, &[], &[("FLOE_FAULT_POD_WATCH_LAG_MS", "600")])?;
    // More READY pods than the job runs at once: a round that missed the last claims would find
    // free pods for the same sessions (the compare-and-swap stops it only when it happens to
    // pick the very pods claimed before).
    create_pool(&client, &ns.name, "warm", 8).await?;
    let kubelet = FakeKubelet::start(
        client.clone(),
        &ns.name,
        14,
        // Sample 0's first attempt fails in the infrastructure: its retry is a lower index
        // than the sessions claimed meanwhile, which shifts which READY pod each claim picks.
        Arc::new(|a: &Value| {
            if a["sample"].as_u64() == Some(0) && attempt(a) == 0 {
                return Verdict::Infra {
                    error: "node lost".into(),
                };
            }
            Verdict::Scored {
                exit: 0,
                reward: 1.0,
            }
        }),
    )?;
    let jobs: Api<RolloutJob> = Api::namespaced(client.clone(), &ns.name);
    let tasks = ["a", "b", "c", "d"];
    jobs.create(
        &PostParams::default(),
        &job("lag", &tasks, 3, json!({"concurrency": 2}))?,
    )
    .await?;
    let done = succeeded(&jobs, "lag", 180).await?;
    let s = &done.sessions;
    assert_eq!((s.total, s.succeeded, s.failed, s.retried), (12, 12, 0, 4));
    let mut ids = taken_sessions(&kubelet);
    ids.sort();
    let mut expected: Vec<String> = tasks
        .iter()
        .flat_map(|t| (0..3).map(move |sample| format!("lag-{t}-{sample}")))
        .chain(tasks.iter().map(|t| format!("lag-{t}-0-r1")))
        .collect();
    expected.sort();
    assert_eq!(ids, expected, "every session assigned exactly once");
    let metrics = operator.metrics().await?;
    let (cached, listed) = (
        pod_reads(&metrics, "cache"),
        pod_reads(&metrics, "apiserver"),
    );
    println!("job pod reads with a lagging cache: {cached} from the cache, {listed} listed");
    assert!(
        listed > 1,
        "rounds ahead of the cache list from the apiserver: {cached} from the cache, {listed} listed"
    );
    delete_jobs(&jobs).await?;
    kubelet.stop().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suspend_deadline_ttl_and_a_missing_pool_each_behave() -> Result<()> {
    let (client, ns) = with_crds("jobctl").await?;
    let _operator = Operator::start(&ns.name, &[])?;
    let jobs: Api<RolloutJob> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);

    // A job naming a pool that does not exist: a condition and an Event that say which.
    let mut orphan = job("orphan", &["a"], 1, json!({}))?;
    orphan.spec.pool_ref = Some(k8s_openapi::api::core::v1::LocalObjectReference {
        name: "nope".into(),
    });
    jobs.create(&PostParams::default(), &orphan).await?;
    let notes = stalled_for(&client, &jobs, &ns.name, "orphan", "PoolNotFound").await?;
    assert!(notes[0].contains("\"nope\""), "{notes:?}");

    create_pool(&client, &ns.name, "warm", 2).await?;
    // A hidden file the runner would refuse after the agent ran: refused before any claim.
    let bad = job(
        "badpath",
        &[],
        1,
        json!({"tasks": {"inline": [{"id": "a", "instruction": "x",
                                      "evaluation": {"hiddenFiles": {"../x.py": "x"}}}]}}),
    )?;
    jobs.create(&PostParams::default(), &bad).await?;
    let notes = stalled_for(&client, &jobs, &ns.name, "badpath", "InvalidTasks").await?;
    assert!(
        notes[0].contains("spec.tasks.inline[0].evaluation.hiddenFiles"),
        "{notes:?}"
    );
    jobs.delete("badpath", &Default::default()).await?;
    // A misspelled field. `kubectl apply` refuses it itself, from the schema the CRD publishes;
    // with `--validate=false` (or a client that does not check) the apiserver prunes it (this
    // one, 1.20, has no strict field validation), and the operator reads it back from the
    // last-applied annotation and refuses the job, naming the field and the name it meant.
    // Re-applied without it (the spec and generation unchanged), the job goes on.
    let mut typo = serde_json::to_value(job("typo", &["a"], 1, json!({}))?)?;
    typo["spec"]["timeouts"] = json!({"agentSecond": 5});
    let kubectl_apply = |object: &Value, validate: bool| -> Result<std::process::Output> {
        let validate = format!("--validate={validate}");
        floe_tests::cluster::cluster().kubectl(
            &["apply", &validate, "-n", &ns.name, "-f", "-"],
            Some(object.to_string().as_bytes()),
        )
    };
    let refused = kubectl_apply(&typo, true)?;
    assert!(
        !refused.status.success()
            && String::from_utf8_lossy(&refused.stderr).contains("unknown field \"agentSecond\""),
        "{refused:?}"
    );
    let applied = kubectl_apply(&typo, false)?;
    anyhow::ensure!(applied.status.success(), "kubectl apply: {applied:?}");
    let notes = stalled_for(&client, &jobs, &ns.name, "typo", "InvalidSpec").await?;
    assert!(
        notes[0]
            .contains("spec.timeouts.agentSecond: unknown field (did you mean `agentSeconds`?)"),
        "{notes:?}"
    );
    typo["spec"]
        .as_object_mut()
        .context("spec")?
        .remove("timeouts");
    let applied = kubectl_apply(&typo, false)?;
    anyhow::ensure!(applied.status.success(), "kubectl apply: {applied:?}");
    eventually("the typo job to go on", async || {
        let s = status(&jobs, "typo").await?;
        Ok(condition(&s, "Stalled")
            .is_none_or(|(v, _)| v == "False")
            .then_some(()))
    })
    .await?;
    // Held-out tasks in a file with no claim (`floe run`'s, beside the job file): in a
    // cluster the job says which claim it needs, not run without its rounds.
    let held_out = job(
        "heldout",
        &["a"],
        1,
        json!({"sft": null, "train": {"image": "trainer", "model": "m", "heldOut":
               {"tasks": {"file": {"path": "held.jsonl"}}}}}),
    )?;
    jobs.create(&PostParams::default(), &held_out).await?;
    let notes = stalled_for(&client, &jobs, &ns.name, "heldout", "TaskFileNeedsClaim").await?;
    assert!(
        notes
            .iter()
            .any(|n| n.contains("spec.train.heldOut.tasks.file.claimName")),
        "{notes:?}"
    );
    jobs.delete("heldout", &Default::default()).await?;
    // A held-out ConfigMap of blank lines (no schema refuses one): rounds of no task would
    // never open, and the job's own sessions would wait for the first for ever.
    let config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), &ns.name);
    config_maps
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "blank"},
                                           "data": {"tasks.jsonl": "\n\n"}}))?,
        )
        .await?;
    let blank = job(
        "blankheld",
        &["a"],
        1,
        json!({"sft": null, "train": {"image": "trainer", "model": "m", "heldOut":
               {"tasks": {"configMap": {"name": "blank"}}}}}),
    )?;
    jobs.create(&PostParams::default(), &blank).await?;
    let notes = stalled_for(&client, &jobs, &ns.name, "blankheld", "InvalidTasks").await?;
    assert!(
        notes
            .iter()
            .any(|n| n.contains("spec.train.heldOut.tasks: holds no task")),
        "{notes:?}"
    );
    jobs.delete("blankheld", &Default::default()).await?;
    jobs.delete("typo", &Default::default()).await?;
    // An evaluator image the pool does not grade in: refused before any claim.
    let other = job(
        "otherimage",
        &["a"],
        1,
        json!({"evaluator": {"command": ["pytest"], "image": "graders/pytest:3"}}),
    )?;
    jobs.create(&PostParams::default(), &other).await?;
    let notes = stalled_for(
        &client,
        &jobs,
        &ns.name,
        "otherimage",
        "EvaluatorImageMismatch",
    )
    .await?;
    assert!(
        notes[0].contains("graders/pytest:3") && notes[0].contains("graderImage"),
        "{notes:?}"
    );
    assert!(job_pods(&pods, "otherimage").await?.is_empty());
    jobs.delete("otherimage", &Default::default()).await?;
    // The teacher's key from a Secret that is not there yet: the job waits and says so; the
    // Secret's key then reaches the gateways in the assignment.
    let keyed = job(
        "keyed",
        &["k"],
        1,
        json!({"sft": {"upstream": {"url": "http://teacher.models.svc:8000", "model": "teacher",
                                    "apiKeySecret": {"name": "teacher-key"}},
                       "output": {"claimName": "sft-data"}}}),
    )?;
    jobs.create(&PostParams::default(), &keyed).await?;
    let notes = stalled_for(&client, &jobs, &ns.name, "keyed", "UpstreamKeyNotFound").await?;
    assert!(notes[0].contains("\"teacher-key\""), "{notes:?}");
    let trainer_up = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let up = trainer_up.clone();
    let kubelet = FakeKubelet::start(
        client.clone(),
        &ns.name,
        11,
        Arc::new(move |a: &Value| {
            let waiting = a["task"] == "learn" && !up.load(std::sync::atomic::Ordering::SeqCst);
            if a["task"] == "slow" || waiting {
                Verdict::Hang
            } else {
                Verdict::Scored {
                    exit: 0,
                    reward: 1.0,
                }
            }
        }),
    )?;

    // Suspended from the start: nothing is claimed until it is resumed; then it completes
    // and, with ttlSecondsAfterFinished, goes away.
    let paused = job(
        "paused",
        &["p", "q"],
        2,
        json!({"suspend": true, "ttlSecondsAfterFinished": 3}),
    )?;
    jobs.create(&PostParams::default(), &paused).await?;
    eventually("suspended", async || {
        let s = status(&jobs, "paused").await?;
        Ok((s.phase == Some(RolloutJobPhase::Suspended)).then_some(()))
    })
    .await?;
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert!(
        job_pods(&pods, "paused").await?.is_empty(),
        "a suspended job claims nothing"
    );
    assert!(
        pods.get_opt("paused-dataset").await?.is_none(),
        "nor starts its collector (Kueue admits by resuming)"
    );
    assert_eq!(status(&jobs, "paused").await?.sessions.pending, 4);
    jobs.patch(
        "paused",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"suspend": false}})),
    )
    .await?;
    let done = eventually("resumed and finished", async || {
        let s = status(&jobs, "paused").await?;
        Ok((s.phase == Some(RolloutJobPhase::Succeeded)).then_some(s))
    })
    .await?;
    assert_eq!(done.sessions.succeeded, 4);
    eventually("deleted after its TTL", async || {
        Ok(jobs.get_opt("paused").await?.is_none().then_some(()))
    })
    .await?;

    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), &ns.name)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "teacher-key"},
                                            "stringData": {"apiKey": "t3acher"}}))?,
        )
        .await?;
    succeeded(&jobs, "keyed", 60).await?;
    let taken = kubelet.taken();
    let a = taken
        .iter()
        .find(|a| a["task"] == "k")
        .context("the keyed session")?;
    // The key went to the pod's gateway (the real node's suite samples a teacher that demands
    // it); the runner, which grades the agent's code, never holds it.
    assert_eq!(
        a["upstream"]["url"], "http://teacher.models.svc:8000",
        "{a}"
    );
    assert!(a["upstream"].get("apiKey").is_none(), "{a}");

    // A deadline stops sessions that never finish: the job fails and says why. Its clock starts
    // at the first session's start, so both pods must be READY to claim at once: the keyed
    // job's pod is still being replaced, and building it on a busy machine can take most of
    // the 4 s.
    let pools: Api<GatewayPool> = Api::namespaced(client.clone(), &ns.name);
    pool_ready(&pools, "warm", 2, 60).await?;
    let late = job("late", &["slow"], 2, json!({"activeDeadlineSeconds": 4}))?;
    jobs.create(&PostParams::default(), &late).await?;
    eventually("both slow sessions running", async || {
        Ok((status(&jobs, "late").await?.sessions.running == 2).then_some(()))
    })
    .await?;
    let failed = eventually("the deadline", async || {
        let s = status(&jobs, "late").await?;
        Ok((s.phase == Some(RolloutJobPhase::Failed)).then_some(s))
    })
    .await?;
    assert_eq!(
        condition(&failed, "Failed"),
        Some(("True", "DeadlineExceeded"))
    );
    assert_eq!(
        failed.rewards, None,
        "stopped sessions are not rewards of 0"
    );
    assert_eq!(
        (failed.sessions.running, failed.sessions.pending),
        (0, 2),
        "stopped at the deadline, they run no more"
    );
    eventually("the Failed event", async || {
        let notes = event_notes(&client, &ns.name, "Failed").await?;
        Ok((!notes.is_empty()).then_some(notes))
    })
    .await?;
    eventually("the slow pods stopped", async || {
        Ok(job_pods(&pods, "late").await?.is_empty().then_some(()))
    })
    .await?;
    // train: sessions wait for the trainer pod, call its vLLM, ship to its ingest, and the
    // trainer's progress shows in the job's status. Two epochs over one task, one group per
    // step, maxStaleness 0: the second epoch's group (batch 1) waits until the trainer has
    // stepped past the first's.
    let mut trained = job("trained", &["learn"], 2, json!({}))?;
    trained.spec.sft = None;
    trained.spec.train = Some(serde_json::from_value(json!({
        "image": "floe-trainer:test", "model": "/models/m", "gpus": 0, "vllm": {"gpus": 0},
        "maxStaleness": 0, "grpo": {"groupsPerStep": 1}, "epochs": 2,
        "checkpoint": {"claimName": "trained-state"}}))?);
    jobs.create(&PostParams::default(), &trained).await?;
    let ip = trainer_ip(&pods, "trained").await?;
    // As the apiserver holds it: the checkpoint claim mounted, and the acknowledged
    // trajectories kept on it (a lost trainer pod loses none).
    let pod = serde_json::to_value(pods.get("trained-trainer").await?)?;
    let claims: Vec<&Value> = pod["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["persistentVolumeClaim"].get("claimName"))
        .collect();
    assert_eq!(claims, [&json!("trained-state")], "{pod}");
    // A fresh root-owned claim is the trainer's to write: the kubelet gives it to the group.
    assert_eq!(pod["spec"]["securityContext"]["fsGroup"], 1000, "{pod}");
    let trainer_container = pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == "trainer")
        .context("the trainer container")?;
    let config: Value = serde_json::from_str(
        trainer_container["env"][0]["value"]
            .as_str()
            .context("FLOE_TRAINER_CONFIG")?,
    )?;
    assert_eq!(config["ingestDir"], "/checkpoints/ingest", "{config}");
    assert_eq!(pod["spec"]["terminationGracePeriodSeconds"], 300);
    // A stand-in for the trainer's HTTP face: it finishes only when told so with the token of
    // the job's control Secret, as `floe-trainer serve` does.
    let token = control_token(&client, &ns.name, "trained").await?;
    let finished = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (said_done, told) = (finished.clone(), finished.clone());
    // Version 0 with a group pending (not idle) until the test moves it.
    let version = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let serving = version.clone();
    let trainer = axum::Router::new()
        .route(
            "/v1/status",
            axum::routing::get(move || async move {
                let done = said_done.load(std::sync::atomic::Ordering::SeqCst);
                let v = serving.load(std::sync::atomic::Ordering::SeqCst);
                axum::Json(json!({"step": v, "policyVersion": v,
                    "pendingGroups": 1, "readyGroups": 0, "training": false,
                    "lastStepTime": "2026-11-22T10:00:00Z", "finished": done,
                    "finalCheckpoint": done.then_some("/checkpoints/final")}))
            }),
        )
        .route(
            "/v1/finish",
            axum::routing::post(move |headers: axum::http::HeaderMap| async move {
                if bearer(&headers) != format!("Bearer {token}") {
                    return axum::http::StatusCode::UNAUTHORIZED;
                }
                told.store(true, std::sync::atomic::Ordering::SeqCst);
                axum::http::StatusCode::ACCEPTED
            }),
        );
    // The fidelity check before the first session: the policy server (here a stand-in for
    // the trainer pod's policy proxy) samples, the trainer scores. What they were sent is kept.
    let probes: Recorded = Arc::default();
    let (sampled, scored) = (probes.clone(), probes.clone());
    let trainer = trainer.route(
        "/v1/fidelity",
        axum::routing::post(move |axum::Json(body): axum::Json<Value>| async move {
            scored
                .lock()
                .map(|mut p| p.push(("fidelity".into(), body)))
                .ok();
            axum::Json(json!({"tokens": 4, "mismatch": 0.002, "max": 0.004}))
        }),
    );
    serve_at(&ip, 8100, trainer).await?;
    serve_at(&ip, 8000, policy_stand_in(sampled)).await?;
    trainer_up.store(true, std::sync::atomic::Ordering::SeqCst);
    // The first epoch's group scored; the second's not claimed while the trainer is at
    // version 0 (the round that folds the first sessions is the one that would claim it).
    eventually("the learn group scored", async || {
        let s = status(&jobs, "trained").await?;
        Ok((s.sessions.succeeded == 2).then_some(()))
    })
    .await?;
    for _ in 0..2 {
        let s = status(&jobs, "trained").await?;
        assert_eq!(
            (s.sessions.running, s.sessions.pending),
            (0, 2),
            "batch 1 waits for the trainer: {:?}",
            s.sessions
        );
        assert!(
            !kubelet
                .taken()
                .iter()
                .any(|a| a["group"] == "trained/learn/e1"),
            "no session of batch 1 started"
        );
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    }
    version.store(3, std::sync::atomic::Ordering::SeqCst);
    let done = eventually("the train job finished with trainer progress", async || {
        let s = status(&jobs, "trained").await?;
        Ok((s.phase == Some(RolloutJobPhase::Succeeded) && s.trainer.is_some()).then_some(s))
    })
    .await?;
    let progress = done.trainer.context("trainer")?;
    assert_eq!((progress.step, progress.policy_version), (3, 3));
    // Checked once, before the first session, and kept in the status.
    let fidelity = done.fidelity.context("status.fidelity")?;
    assert_eq!((fidelity.tokens, fidelity.mismatch), (4, 0.002));
    let probes = probes.lock().map(|p| p.clone()).unwrap_or_default();
    let (samples, scores): (Vec<_>, Vec<_>) = probes.iter().partition(|(k, _)| k != "fidelity");
    assert_eq!((samples.len(), scores.len()), (4, 1), "{probes:?}");
    // Each probe is a session's request: the job's token, its model, the complete sampling set.
    let (bearer, request) = &samples[0];
    assert!(
        bearer.starts_with("Bearer ") && bearer.len() > 20,
        "{bearer}"
    );
    assert_eq!(request["model"], "policy");
    assert_eq!(
        (&request["top_k"], &request["min_p"], &request["logprobs"]),
        (&json!(-1), &json!(0.0), &json!(true)),
        "{request}"
    );
    assert_eq!(
        scores[0].1["traces"][0],
        json!({"prompt_token_ids": [1, 2, 3], "response_token_ids": [7, 8], "logprobs": [-0.5, -1.5]})
    );
    assert!(
        finished.load(std::sync::atomic::Ordering::SeqCst) && progress.finished,
        "the job succeeds only once its trainer was told the sessions are done and finished"
    );
    assert_eq!(progress.final_model.as_deref(), Some("/checkpoints/final"));
    let taken = kubelet.taken();
    // Each epoch's sessions: ids and a group of their own.
    let mut epochs: Vec<(String, String)> = taken
        .iter()
        .filter(|a| a["task"] == "learn")
        .map(|a| (a["session"].to_string(), a["group"].to_string()))
        .collect();
    epochs.sort();
    assert_eq!(
        epochs,
        [
            ("\"trained-learn-0\"", "\"trained/learn\""),
            ("\"trained-learn-0.e1\"", "\"trained/learn/e1\""),
            ("\"trained-learn-1\"", "\"trained/learn\""),
            ("\"trained-learn-1.e1\"", "\"trained/learn/e1\""),
        ]
        .map(|(s, g)| (s.to_string(), g.to_string())),
        "{taken:?}"
    );
    let a = taken
        .iter()
        .find(|a| a["task"] == "learn")
        .context("a train session")?;
    assert_eq!(
        a["upstream"]["url"],
        format!("http://trained-policy.{}.svc:8000", ns.name)
    );
    assert_eq!(a["upstream"]["model"], "policy");
    assert_eq!(
        a["sink"]["url"],
        format!(
            "http://trained-trainer.{}.svc:8100/v1/trajectories",
            ns.name
        )
    );
    for svc in ["trained-policy", "trained-trainer"] {
        Api::<k8s_openapi::api::core::v1::Service>::namespaced(client.clone(), &ns.name)
            .get(svc)
            .await?;
    }
    delete_jobs(&jobs).await?;
    kubelet.stop().await?;
    Ok(())
}

/// A ResourceQuota of `pods` pods named `name`, once in force. Quota admission reads quotas
/// from the apiserver's own cache, so a pod created right after the quota can slip through
/// (CI saw it once); the controller-manager's status on the quota comes after the cache has it.
async fn pod_quota(
    client: &Client,
    ns: &str,
    name: &str,
    pods: u32,
) -> Result<Api<k8s_openapi::api::core::v1::ResourceQuota>> {
    let quotas: Api<k8s_openapi::api::core::v1::ResourceQuota> =
        Api::namespaced(client.clone(), ns);
    quotas
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "ResourceQuota",
                "metadata": {"name": name}, "spec": {"hard": {"pods": pods.to_string()}},
            }))?,
        )
        .await?;
    eventually("the quota in force", async || {
        let q = quotas.get(name).await?;
        Ok(q.status
            .and_then(|s| s.hard)
            .is_some_and(|h| h.contains_key("pods"))
            .then_some(()))
    })
    .await?;
    Ok(quotas)
}

/// The job's own pod (here the sft dataset collector) refused by the apiserver (a quota of no
/// pods): the job stalls naming the pod and the apiserver's words, with a Warning and its
/// blocker metric, instead of failing every reconcile in the operator's log only; once the
/// quota allows it, the pod is made and the job goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_pod_the_apiserver_refuses_stalls_the_job_saying_why() -> Result<()> {
    let (client, ns) = with_crds("jobrefused").await?;
    let operator = Operator::start(&ns.name, &[])?;
    let jobs: Api<RolloutJob> = Api::namespaced(client.clone(), &ns.name);
    let quotas = pod_quota(&client, &ns.name, "no-pods", 0).await?;
    create_pool(&client, &ns.name, "warm", 0).await?;
    jobs.create(
        &PostParams::default(),
        &job("capped", &["a"], 1, json!({}))?,
    )
    .await?;
    let notes = stalled_for(&client, &jobs, &ns.name, "capped", "PodCreateRejected").await?;
    assert!(
        notes[0].contains("the apiserver refused the job's pod capped-dataset")
            && notes[0].contains("quota"),
        "{notes:?}"
    );
    let page = operator.metrics().await?;
    let series = format!(
        "floe_rolloutjob_blocked{{namespace=\"{}\",reason=\"PodCreateRejected\",rolloutjob=\"capped\"}}",
        ns.name
    );
    assert_eq!(metric_value(&page, &series), Some(1.0), "{page}");
    // The quota lifted: the collector is created and the job no longer stalls.
    quotas.delete("no-pods", &Default::default()).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    eventually("the collector pod", async || {
        Ok(pods.get_opt("capped-dataset").await?)
    })
    .await?;
    eventually("the job no longer stalled", async || {
        let s = status(&jobs, "capped").await?;
        Ok(condition(&s, "Stalled").is_none().then_some(()))
    })
    .await?;
    let page = operator.metrics().await?;
    assert_eq!(metric_value(&page, &series), None, "{page}");
    delete_jobs(&jobs).await?;
    Ok(())
}

/// `poolTemplate` session pods the apiserver refuses for good (here a quota the job's own
/// collector fills; in a cluster, Pod Security `restricted` refusing a SWE-bench job's root
/// grader) while the job has no pod: the job stalls naming the pod and the apiserver's words,
/// instead of failing every round in the operator's log only; once the quota allows them, the
/// pods are made and the job runs to its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_pods_the_apiserver_refuses_stall_the_job_saying_why() -> Result<()> {
    let (client, ns) = with_crds("podrefused").await?;
    let _operator = Operator::start(&ns.name, &[])?;
    let kubelet = scoring_node(&client, &ns.name, 58)?;
    let jobs: Api<RolloutJob> = Api::namespaced(client.clone(), &ns.name);
    let quotas = pod_quota(&client, &ns.name, "one-pod", 1).await?;
    let mut spec = job("refused", &["a"], 1, json!({"lookahead": 0}))?;
    spec.spec.pool_ref = None;
    spec.spec.pool_template = Some(serde_json::from_value(
        json!({"image": "ghcr.io/acme/harness:1", "workingDir": "/testbed"}),
    )?);
    jobs.create(&PostParams::default(), &spec).await?;
    let notes = stalled_for(&client, &jobs, &ns.name, "refused", "PodCreateRejected").await?;
    assert!(
        notes[0].contains("the apiserver refused the job's session pods (1 this round)")
            && notes[0].contains("session 0 attempt 0: pods \"<pod>\" is forbidden")
            && notes[0].contains("quota"),
        "{notes:?}"
    );
    quotas.delete("one-pod", &Default::default()).await?;
    let done = succeeded(&jobs, "refused", 120).await?;
    assert_eq!(done.sessions.succeeded, 1, "{done:?}");
    assert!(condition(&done, "Stalled").is_none(), "{done:?}");
    delete_jobs(&jobs).await?;
    kubelet.stop().await?;
    Ok(())
}

/// A NetworkPolicy under the name the job's own would take (`<job>-job-egress`) that is not
/// the job's (here a user's, with no controller): its pods would run without the job's
/// policy, so the job stalls before making any and leaves the policy as it is; once the name
/// is free, it makes its policy and its pods. (No kubelet: no pod is to run.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_network_policy_under_the_jobs_name_that_is_not_its_own_stalls_it() -> Result<()> {
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    let (client, ns) = with_crds("egressjob").await?;
    let _operator = Operator::start(&ns.name, &[])?;
    let jobs: Api<RolloutJob> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), &ns.name);
    let own = json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "squat-job-egress"},
        "spec": {"podSelector": {"matchLabels": {"app": "other"}}, "policyTypes": ["Egress"]}});
    policies
        .create(&PostParams::default(), &serde_json::from_value(own)?)
        .await?;
    let mut spec = job("squat", &["a"], 1, json!({"lookahead": 0}))?;
    spec.spec.pool_ref = None;
    spec.spec.pool_template = Some(serde_json::from_value(
        json!({"image": "ghcr.io/acme/harness:1"}),
    )?);
    jobs.create(&PostParams::default(), &spec).await?;
    let notes = stalled_for(&client, &jobs, &ns.name, "squat", "EgressPolicyNotOurs").await?;
    assert!(
        notes[0].contains("squat-job-egress exists and is not this rolloutjob's")
            && notes[0].contains("no controller"),
        "{notes:?}"
    );
    assert!(
        job_pods(&pods, "squat").await?.is_empty(),
        "a pod without the job's policy"
    );
    let kept = policies.get("squat-job-egress").await?;
    assert!(kept.metadata.owner_references.is_none(), "taken: {kept:?}");
    policies
        .delete("squat-job-egress", &Default::default())
        .await?;
    eventually("the job's policy and its first pod", async || {
        let mine = policies
            .get_opt("squat-job-egress")
            .await?
            .is_some_and(|p| {
                p.owner_references()
                    .first()
                    .is_some_and(|o| o.name == "squat")
            });
        Ok((mine && !job_pods(&pods, "squat").await?.is_empty()).then_some(()))
    })
    .await?;
    delete_jobs(&jobs).await?;
    Ok(())
}

/// The job's tasks from a ConfigMap, edited after its first session: sessions are numbered by
/// task order, so the job stalls (`TasksChanged`) instead of taking scored sessions for other
/// tasks'; restored, it goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_configmap_edited_after_the_first_session_stalls_the_job() -> Result<()> {
    let (client, ns) = with_crds("taskedit").await?;
    let _operator = Operator::start(&ns.name, &[])?;
    let kubelet = FakeKubelet::start(
        client.clone(),
        &ns.name,
        53,
        Arc::new(|_: &Value| Verdict::Hang),
    )?;
    create_pool(&client, &ns.name, "warm", 1).await?;
    let config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), &ns.name);
    config_maps
        .create(&PostParams::default(), &tasks_config_map(&["a", "b", "c"])?)
        .await?;
    let jobs: Api<RolloutJob> = Api::namespaced(client.clone(), &ns.name);
    jobs.create(
        &PostParams::default(),
        &job(
            "edited",
            &[],
            1,
            json!({"tasks": {"configMap": {"name": "tasks", "key": "tasks.jsonl"}}}),
        )?,
    )
    .await?;
    let begun = eventually(
        "the first session running, the tasks recorded",
        async || {
            let s = status(&jobs, "edited").await?;
            Ok((s.sessions.running == 1 && s.tasks_digest.is_some()).then_some(s))
        },
    )
    .await?;
    // Task "a" dropped from the source: "b" would be numbered as "a" was.
    config_maps
        .replace(
            "tasks",
            &PostParams::default(),
            &tasks_config_map(&["b", "c"])?,
        )
        .await?;
    let notes = stalled_for(&client, &jobs, &ns.name, "edited", "TasksChanged").await?;
    assert!(
        notes
            .iter()
            .any(|n| n.contains("sessions are numbered by task order")),
        "{notes:?}"
    );
    config_maps
        .replace(
            "tasks",
            &PostParams::default(),
            &tasks_config_map(&["a", "b", "c"])?,
        )
        .await?;
    let back = eventually("the job going on", async || {
        let s = status(&jobs, "edited").await?;
        Ok(condition(&s, "Stalled").is_none().then_some(s))
    })
    .await?;
    assert_eq!(back.tasks_digest, begun.tasks_digest);
    kubelet.stop().await?;
    delete_jobs(&jobs).await?;
    Ok(())
}

/// A job that stalls after it started (here its pool deleted under it) still meets its
/// deadline: it fails saying what it waited for, and its pods end. It used to wait, holding
/// them (and a trainer's GPUs), for good. And a pod let go of whose DELETE never landed is
/// deleted by a later round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_job_meets_its_deadline_and_no_pod_let_go_of_lingers() -> Result<()> {
    let (client, ns) = with_crds("stalllate").await?;
    let operator = Operator::start(&ns.name, &[])?;
    let kubelet = FakeKubelet::start(
        client.clone(),
        &ns.name,
        52,
        Arc::new(|_: &Value| Verdict::Hang),
    )?;
    create_pool(&client, &ns.name, "warm", 1).await?;
    let pools: Api<GatewayPool> = Api::namespaced(client.clone(), &ns.name);
    pool_ready(&pools, "warm", 1, 60).await?;
    let jobs: Api<RolloutJob> = Api::namespaced(client.clone(), &ns.name);
    jobs.create(
        &PostParams::default(),
        &job("stuck", &["slow"], 1, json!({"activeDeadlineSeconds": 15}))?,
    )
    .await?;
    eventually("the session running", async || {
        Ok((status(&jobs, "stuck").await?.sessions.running == 1).then_some(()))
    })
    .await?;
    pools.delete("warm", &Default::default()).await?;
    eventually("stalled for its pool", async || {
        let s = status(&jobs, "stuck").await?;
        Ok((condition(&s, "Stalled") == Some(("True", "PoolNotFound"))).then_some(()))
    })
    .await?;
    let failed = eventually("the deadline", async || {
        let s = status(&jobs, "stuck").await?;
        Ok((s.phase == Some(RolloutJobPhase::Failed)).then_some(s))
    })
    .await?;
    let reason = failed
        .conditions
        .iter()
        .find(|c| c.type_ == "Failed")
        .context("a Failed condition")?;
    assert_eq!(reason.reason, "DeadlineExceeded");
    assert!(reason.message.contains("PoolNotFound"), "{reason:?}");
    assert!(failed.completion_time.is_some());
    // Ended, it blocks nothing and runs nothing: the blocked gauge and the running sessions it
    // had stalled with stayed for good (FloeRolloutJobBlocked, the trainer alerts paged).
    assert_eq!(failed.sessions.running, 0, "{:?}", failed.sessions);
    let series = "rolloutjob=\"stuck\"";
    eventually("the ended job's series", async || {
        let page = operator.metrics().await?;
        let blocked = page
            .lines()
            .any(|l| l.starts_with("floe_rolloutjob_blocked{") && l.contains(series));
        let running = format!(
            "floe_sessions{{namespace=\"{}\",rolloutjob=\"stuck\",state=\"running\"}} 0",
            ns.name
        );
        Ok((!blocked && page.contains(&running)).then_some(()))
    })
    .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    eventually("its pod ended", async || {
        Ok(job_pods(&pods, "stuck").await?.is_empty().then_some(()))
    })
    .await?;
    // A pod let go of whose DELETE never landed (the operator died between its two writes):
    // a later round deletes it, where it used to stay until the job ended.
    create_pool(&client, &ns.name, "warm", 1).await?;
    pool_ready(&pools, "warm", 1, 60).await?;
    jobs.create(
        &PostParams::default(),
        &job("dropped", &["slow"], 1, json!({}))?,
    )
    .await?;
    let claimed = eventually("a session running", async || {
        Ok(job_pods(&pods, "dropped").await?.into_iter().next())
    })
    .await?;
    let name = claimed.name_any();
    pods.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null,
                                          "labels": {"floe.dev/state": "done"}}})),
    )
    .await?;
    eventually("the pod let go of deleted", async || {
        let left = pods.get_opt(&name).await?;
        Ok(left
            .is_none_or(|p| p.metadata.deletion_timestamp.is_some())
            .then_some(()))
    })
    .await?;
    kubelet.stop().await?;
    delete_jobs(&jobs).await?;
    Ok(())
}

/// The job's own pod ended for good (evicted under node pressure: its containers restart
/// `Always`, the pod itself never does): deleted and made again, said in a Warning, where the
/// operator used to wait for it until the job's deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_pod_that_ended_for_good_is_made_again() -> Result<()> {
    let (client, ns) = with_crds("jobpodended").await?;
    let _operator = Operator::start(&ns.name, &[])?;
    let kubelet = scoring_node(&client, &ns.name, 51)?;
    create_pool(&client, &ns.name, "warm", 0).await?;
    let jobs: Api<RolloutJob> = Api::namespaced(client.clone(), &ns.name);
    jobs.create(
        &PostParams::default(),
        &job("evicted", &["a"], 1, json!({}))?,
    )
    .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let first = eventually("the collector Ready", async || {
        Ok(pods.get_opt("evicted-dataset").await?.filter(pod_ready))
    })
    .await?;
    // As a kubelet reports an eviction.
    pods.patch_status(
        "evicted-dataset",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {
            "phase": "Failed", "reason": "Evicted",
            "message": "The node was low on resource: memory.",
            "conditions": [{"type": "Ready", "status": "False"}],
        }})),
    )
    .await?;
    let second = eventually("a new collector Ready", async || {
        Ok(pods
            .get_opt("evicted-dataset")
            .await?
            .filter(|p| p.metadata.uid != first.metadata.uid && pod_ready(p)))
    })
    .await?;
    assert_ne!(second.metadata.uid, first.metadata.uid);
    let told = |n: &String| {
        n.contains("evicted-dataset ended (Failed, Evicted: The node was low on resource: memory.)")
    };
    let notes = noted_until(&client, &ns.name, "JobPodReplaced", |n| n.iter().any(told)).await?;
    assert!(notes.iter().any(told), "{notes:?}");
    kubelet.stop().await?;
    delete_jobs(&jobs).await?;
    Ok(())
}

/// `train.nodes: 2`: the first trainer pod, then (once it has an IP) the second, ranked and
/// pointed at it; the first replaced, the second is replaced with it and joins the new one;
/// the second failing, it is made again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trainer_over_two_nodes_is_two_ranked_pods_that_follow_the_first() -> Result<()> {
    let (client, ns) = with_crds("jobnodes").await?;
    let _operator = Operator::start(&ns.name, &[])?;
    let jobs: Api<RolloutJob> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    create_pool(&client, &ns.name, "warm", 0).await?;
    // Plays the trainer pods (Running, an IP each); no session ever starts (an empty pool).
    let kubelet = FakeKubelet::start(
        client.clone(),
        &ns.name,
        12,
        Arc::new(|_: &Value| Verdict::Hang),
    )?;
    let mut sharded = job("sharded", &["a"], 2, json!({}))?;
    sharded.spec.sft = None;
    sharded.spec.train = Some(serde_json::from_value(json!({
        "image": "floe-trainer:test", "model": "m", "modelClaimName": "models",
        "gpus": 0, "nodes": 2, "checkpoint": {"claimName": "sharded-state"},
        "fidelityCheck": {"action": "Off"}}))?);
    jobs.create(&PostParams::default(), &sharded).await?;
    let first_ip_uid = async || -> Result<Option<(String, String)>> {
        let Some(p) = pods.get_opt("sharded-trainer").await? else {
            return Ok(None);
        };
        let ip = p.status.and_then(|s| s.pod_ip);
        Ok(ip.zip(p.metadata.uid))
    };
    // Joined to `uid` at `ip`, with the second node's rank (as the apiserver holds it).
    let second_joined = async |ip: &str, uid: &str| -> Result<Option<Value>> {
        let Some(p) = pods.get_opt("sharded-trainer-1").await? else {
            return Ok(None);
        };
        let p = serde_json::to_value(p)?;
        let joined = p["metadata"]["annotations"]["floe.dev/trainer-leader-uid"] == uid
            && p["metadata"]["deletionTimestamp"].is_null()
            && p["spec"]["containers"][0]["args"]
                .as_array()
                .is_some_and(|a| a.contains(&json!(format!("--master-addr={ip}"))));
        Ok(joined.then_some(p))
    };
    let (ip, uid) = eventually("the first trainer pod with an IP", first_ip_uid).await?;
    let second = eventually("the second trainer pod, joined to the first", async || {
        second_joined(&ip, &uid).await
    })
    .await?;
    let args = &second["spec"]["containers"][0]["args"];
    for a in [
        "--nnodes=2",
        "--node-rank=1",
        "--master-port=29500",
        "--nproc-per-node=1",
    ] {
        assert!(
            args.as_array().is_some_and(|v| v.contains(&json!(a))),
            "{a}: {args}"
        );
    }
    assert_eq!(
        second["metadata"]["labels"]["floe.dev/job-role"],
        "trainer-worker"
    );
    assert_eq!(second["metadata"]["ownerReferences"][0]["name"], "sharded");
    let claims = second["spec"]["volumes"].to_string();
    assert!(
        claims.contains("\"models\"") && !claims.contains("sharded-state"),
        "{claims}"
    );
    // The first pod's trainer: rank 0, its own IP as the rendezvous; the job's Services
    // select it alone.
    let first = serde_json::to_value(pods.get("sharded-trainer").await?)?;
    let first_args = first["spec"]["containers"].to_string();
    assert!(first_args.contains("--node-rank=0") && first_args.contains("$(FLOE_POD_IP)"));
    let services: Api<k8s_openapi::api::core::v1::Service> =
        Api::namespaced(client.clone(), &ns.name);
    let ingest = services.get("sharded-trainer").await?;
    let selector = ingest.spec.and_then(|s| s.selector).unwrap_or_default();
    assert_eq!(
        selector.get("floe.dev/job-role").map(String::as_str),
        Some("trainer")
    );

    // The first pod replaced (deleted at once, as after its node was lost): a new one with a
    // new IP, and the second made again for it. The old second is deleted by the operator;
    // the kubelet's part (removing it after its grace period) is the test's, here.
    let at_once = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    let remove_if_deleted = async || -> Result<()> {
        let second = pods.get_opt("sharded-trainer-1").await?;
        if second.is_some_and(|p| p.metadata.deletion_timestamp.is_some()) {
            let _ = pods.delete("sharded-trainer-1", &at_once).await;
        }
        Ok(())
    };
    pods.delete("sharded-trainer", &at_once).await?;
    let (ip2, uid2) = eventually("a new first trainer pod", async || {
        Ok(first_ip_uid().await?.filter(|(_, u)| *u != uid))
    })
    .await?;
    eventually("the second pod, made again for the new first", async || {
        remove_if_deleted().await?;
        second_joined(&ip2, &uid2).await
    })
    .await?;
    // The second fails for good (evicted): made again.
    let failed_uid = pods.get("sharded-trainer-1").await?.metadata.uid;
    pods.patch_status(
        "sharded-trainer-1",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Failed", "reason": "Evicted"}})),
    )
    .await?;
    eventually("the failed second pod made again", async || {
        remove_if_deleted().await?;
        let again = second_joined(&ip2, &uid2).await?;
        let p = pods.get_opt("sharded-trainer-1").await?;
        Ok(again.filter(|_| p.is_some_and(|p| p.metadata.uid != failed_uid)))
    })
    .await?;
    // Suspended (Kueue's preemption), no session running: the first pod stops (it checkpoints
    // on the claim as it does), then the second, which has nothing left to join.
    let suspend = json!({"spec": {"suspend": true}});
    jobs.patch("sharded", &PatchParams::default(), &Patch::Merge(&suspend))
        .await?;
    eventually("both trainer pods stopped", async || {
        for name in ["sharded-trainer", "sharded-trainer-1"] {
            if let Some(p) = pods.get_opt(name).await? {
                if p.metadata.deletion_timestamp.is_some() {
                    let _ = pods.delete(name, &at_once).await;
                }
                return Ok(None);
            }
        }
        Ok(Some(()))
    })
    .await?;
    delete_jobs(&jobs).await?;
    kubelet.stop().await?;
    Ok(())
}

/// `poolTemplate`: no GatewayPool; the job creates a pod per session attempt from its
/// template, with the task's own image where it names one, never more than `concurrency +
/// lookahead` alive; a failed attempt is retried on a fresh pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_template_job_prewarms_its_own_pods_with_each_tasks_image() -> Result<()> {
    let (client, ns) = with_crds("tmpl").await?;
    let _operator = Operator::start(&ns.name, &[])?;
    let kubelet = FakeKubelet::start(
        client.clone(),
        &ns.name,
        20,
        Arc::new(|a: &Value| {
            if a["task"] == "t1" && a["sample"] == 0 && attempt(a) == 0 {
                return Verdict::Infra {
                    error: "image pull flaked mid-session".into(),
                };
            }
            Verdict::Scored {
                exit: 0,
                reward: 1.0,
            }
        }),
    )?;
    let jobs: Api<RolloutJob> = Api::namespaced(client.clone(), &ns.name);
    let mut spec = job(
        "tmpl",
        &["t0", "t1", "t2"],
        2,
        json!({"concurrency": 2, "lookahead": 1}),
    )?;
    spec.spec.pool_ref = None;
    spec.spec.pool_template = Some(serde_json::from_value(
        json!({"image": "ghcr.io/acme/harness:1", "workingDir": "/testbed"}),
    )?);
    if let Some(tasks) = spec.spec.tasks.inline.as_mut() {
        tasks[0].image = Some("swe/t0:1".into());
        tasks[2].image = Some("swe/t2:1".into());
    }
    jobs.create(&PostParams::default(), &spec).await?;

    // Watch the job's pods while it runs: how many at once, and which image each session got.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let mut most_alive = 0usize;
    let mut images: std::collections::BTreeMap<String, String> = Default::default();
    let mut cleared = 0usize;
    let done = eventually_within(180, "the template job finished", async || {
        let alive: Vec<Pod> = job_pods(&pods, "tmpl")
            .await?
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        most_alive = most_alive.max(alive.len());
        for p in &alive {
            let annotations = p.metadata.annotations.clone().unwrap_or_default();
            let session = annotations
                .get("floe.dev/session")
                .cloned()
                .unwrap_or_default();
            let image = p
                .spec
                .as_ref()
                .and_then(|s| s.containers.iter().find(|c| c.name == "sandbox"))
                .and_then(|c| c.image.clone())
                .unwrap_or_default();
            assert!(
                !p.metadata
                    .labels
                    .clone()
                    .unwrap_or_default()
                    .contains_key("floe.dev/pool"),
                "a template pod must not look like a pool's"
            );
            // Once assigned, the pod's field-ownership record is cleared and stays so.
            if annotations.contains_key("floe.dev/assigned") {
                let tracked = p.metadata.managed_fields.as_ref().map_or(0, Vec::len);
                assert_eq!(
                    tracked,
                    0,
                    "{} still tracked",
                    p.metadata.name.as_deref().unwrap_or_default()
                );
                cleared += 1;
            }
            images.insert(session, image);
        }
        let s = status(&jobs, "tmpl").await?;
        Ok((s.phase == Some(RolloutJobPhase::Succeeded)).then_some(s))
    })
    .await?;
    assert_eq!((done.sessions.succeeded, done.sessions.failed), (6, 0));
    assert_eq!(done.sessions.retried, 1);
    assert!(
        most_alive <= 3,
        "{most_alive} pods alive > concurrency 2 + lookahead 1"
    );
    assert!(most_alive >= 2, "the window was never used: {most_alive}");
    let expected = [
        ("tmpl-t0-0", "swe/t0:1"),
        ("tmpl-t0-1", "swe/t0:1"),
        ("tmpl-t1-0", "ghcr.io/acme/harness:1"),
        ("tmpl-t1-0-r1", "ghcr.io/acme/harness:1"),
        ("tmpl-t1-1", "ghcr.io/acme/harness:1"),
        ("tmpl-t2-0", "swe/t2:1"),
        ("tmpl-t2-1", "swe/t2:1"),
    ];
    for (session, image) in expected {
        if let Some(seen) = images.get(session) {
            assert_eq!(seen, image, "{session}");
        }
    }
    assert!(images.len() >= 5, "saw too few pods to judge: {images:?}");
    assert!(cleared > 0, "saw no assigned pod to judge");
    // The job's own pods have an egress NetworkPolicy, as a pool's do: owned by the job,
    // selecting its sandbox pods, with the pool's rules (DNS, the job's trainer or collector).
    let policy = Api::<k8s_openapi::api::networking::v1::NetworkPolicy>::namespaced(
        client.clone(),
        &ns.name,
    )
    .get("tmpl-job-egress")
    .await?;
    let owner = &policy.metadata.owner_references.clone().unwrap_or_default()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("RolloutJob", "tmpl")
    );
    let spec = serde_json::to_value(policy.spec)?;
    assert_eq!(
        spec["podSelector"],
        json!({"matchLabels": {"floe.dev/job": "tmpl", "floe.dev/sandbox": "true"}})
    );
    assert_eq!(spec["policyTypes"], json!(["Egress"]));
    // DNS only to the cluster's DNS pods, as the apiserver stored it.
    assert_eq!(
        spec["egress"][1]["to"][0]["podSelector"],
        json!({"matchLabels": {"k8s-app": "kube-dns"}}),
        "{spec}"
    );
    // Every attempt ran exactly once.
    let ids = taken_sessions(&kubelet);
    let unique: BTreeSet<&String> = ids.iter().collect();
    assert_eq!(unique.len(), ids.len(), "{ids:?}");
    assert_eq!(
        unique.into_iter().cloned().collect::<BTreeSet<_>>(),
        expected.iter().map(|(s, _)| s.to_string()).collect()
    );
    eventually("all session pods gone", async || {
        Ok(job_pods(&pods, "tmpl").await?.is_empty().then_some(()))
    })
    .await?;
    delete_jobs(&jobs).await?;
    kubelet.stop().await?;
    Ok(())
}

/// The operator killed between a `poolTemplate` pod and its control Secret: the pod waits for
/// the Secret's volume for ever (`ContainerCreating` is progress, never a start failure), and
/// holds its session's place. The next operator makes it a Secret, says so, and the session
/// runs on that pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_template_pod_left_without_its_control_secret_gets_one() -> Result<()> {
    let (client, ns) = with_crds("nosecret").await?;
    let mut operator = Operator::start(&ns.name, &[])?;
    let jobs: Api<RolloutJob> = Api::namespaced(client.clone(), &ns.name);
    let mut spec = job(
        "nosecret",
        &["t0"],
        1,
        json!({"concurrency": 1, "lookahead": 0}),
    )?;
    spec.spec.pool_ref = None;
    spec.spec.pool_template = Some(serde_json::from_value(json!({"image": "harness:1"}))?);
    jobs.create(&PostParams::default(), &spec).await?;
    // No kubelet yet: the pod stays unstarted. Its Secret is deleted while no operator runs,
    // which is what an operator killed between the two writes leaves.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), &ns.name);
    let pod = eventually("the session's pod and its Secret", async || {
        let Some(pod) = job_pods(&pods, "nosecret").await?.into_iter().next() else {
            return Ok(None);
        };
        let secret = format!("{}-control", pod.name_any());
        Ok(secrets.get_opt(&secret).await?.map(|_| pod.name_any()))
    })
    .await?;
    operator.kill();
    secrets
        .delete(&format!("{pod}-control"), &DeleteParams::default())
        .await?;
    let _operator = Operator::start(&ns.name, &[])?;
    let kubelet = scoring_node(&client, &ns.name, 56)?;
    let done = succeeded(&jobs, "nosecret", 120).await?;
    assert_eq!(
        (done.sessions.succeeded, done.sessions.retried),
        (1, 0),
        "the session ran once, on its first pod"
    );
    assert_eq!(taken_sessions(&kubelet), ["nosecret-t0-0"]);
    let told = noted(&client, &ns.name, "ControlSecretRestored").await?;
    assert!(
        told.iter().any(|n| n.contains(&pod)),
        "an Event names the pod: {told:?}"
    );
    delete_jobs(&jobs).await?;
    kubelet.stop().await?;
    Ok(())
}

/// `poolTemplate` with a task image no registry has: its pods stay Pending (`ErrImagePull`).
/// The job says so (an Event naming the pod's reason), counts each pod still stuck past
/// `timeouts.podStartSeconds` as a failed attempt, and ends that task's sessions failed at
/// `backoffLimit` with the pod's reason, while the other task's sessions run. It used to wait
/// on them for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_image_that_cannot_be_pulled_fails_its_sessions_instead_of_holding_the_job(
) -> Result<()> {
    let (client, ns) = with_crds("nopull").await?;
    let _operator = Operator::start(&ns.name, &[])?;
    let kubelet = scoring_node(&client, &ns.name, 54)?;
    let jobs: Api<RolloutJob> = Api::namespaced(client.clone(), &ns.name);
    let mut spec = job(
        "nopull",
        &["good", "gone"],
        1,
        json!({"concurrency": 2, "lookahead": 0, "backoffLimit": 1,
               "timeouts": {"podStartSeconds": 10}}),
    )?;
    spec.spec.pool_ref = None;
    spec.spec.pool_template = Some(serde_json::from_value(
        json!({"image": "ghcr.io/acme/harness:1", "workingDir": "/testbed"}),
    )?);
    if let Some(tasks) = spec.spec.tasks.inline.as_mut() {
        tasks[1].image = Some(format!(
            "{}gone:1",
            floe_tests::kubelet::UNPULLABLE_REGISTRY
        ));
    }
    jobs.create(&PostParams::default(), &spec).await?;
    let warned = noted(&client, &ns.name, "SessionPodNotStarting").await?;
    assert!(
        warned[0].starts_with("session 1 attempt 0: pod nopull-s1-a0-")
            && warned[0].contains("container sandbox: ErrImagePull")
            && warned[0].contains("timeouts.podStartSeconds"),
        "{warned:?}"
    );
    let done = succeeded(&jobs, "nopull", 120).await?;
    assert_eq!(
        (
            done.sessions.succeeded,
            done.sessions.failed,
            done.sessions.retried
        ),
        (1, 1, 1),
        "{done:?}"
    );
    assert_eq!(done.failed_indexes.as_deref(), Some("1"));
    let failed = noted(&client, &ns.name, "SessionFailed").await?;
    assert!(
        failed.len() == 1
            && failed[0].contains("session 1 (pod nopull-s1-a1-")
            && failed[0].contains("its pod did not start within 10s")
            && failed[0].contains("ErrImagePull"),
        "{failed:?}"
    );
    // Only the task that could run took an assignment.
    let taken = taken_sessions(&kubelet);
    assert!(taken.len() == 1 && taken[0].contains("good"), "{taken:?}");
    eventually("all session pods gone", async || {
        Ok(job_pods(&pods_api(&client, &ns.name), "nopull")
            .await?
            .is_empty()
            .then_some(()))
    })
    .await?;
    delete_jobs(&jobs).await?;
    kubelet.stop().await?;
    Ok(())
}

/// Evictions on the real apiserver: one for what the agent wrote past its disk backstop (its
/// container's ephemeral-storage limit) fails its session at once, without a retry — a retry
/// would give the agent another chance at a loss — and the trainer-side record says so; one
/// for node pressure is infrastructure, retried on a fresh pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eviction_for_the_agents_own_disk_fails_its_session_without_a_retry() -> Result<()> {
    let (client, ns) = with_crds("evict").await?;
    let _operator = Operator::start(&ns.name, &[])?;
    create_pool(&client, &ns.name, "warm", 3).await?;
    let kubelet = FakeKubelet::start(
        client.clone(),
        &ns.name,
        55,
        Arc::new(|a: &Value| match (a["sample"].as_u64(), attempt(a)) {
            (Some(0), _) => Verdict::Evicted {
                message: "Container agent exceeded its local ephemeral storage limit \"32Gi\". "
                    .into(),
            },
            (Some(1), 0) => Verdict::Evicted {
                message: "The node was low on resource: ephemeral-storage. ".into(),
            },
            _ => Verdict::Scored {
                exit: 0,
                reward: 1.0,
            },
        }),
    )?;
    let jobs: Api<RolloutJob> = Api::namespaced(client.clone(), &ns.name);
    jobs.create(
        &PostParams::default(),
        &job("evict", &["t"], 3, json!({"backoffLimit": 2}))?,
    )
    .await?;
    let done = succeeded(&jobs, "evict", 120).await?;
    assert_eq!(
        (
            done.sessions.succeeded,
            done.sessions.failed,
            done.sessions.retried
        ),
        (2, 1, 1),
        "{done:?}"
    );
    assert_eq!(done.failed_indexes.as_deref(), Some("0"));
    // The evicted session is scored as the agent's failure (failureReward 0), as its trainer
    // trains it: the pass rate counts it (it read 2 of 2).
    let rewards = done.rewards.as_ref().context("rewards")?;
    assert_eq!((rewards.scored, rewards.passed), (3, 2), "{rewards:?}");
    // Every session is done, so the status keeps no count per session (it grew with every
    // session a long job had ever retried); the total above still counts sample 1's retry.
    assert!(done.retries.is_empty(), "{:?}", done.retries);
    let failed = noted(&client, &ns.name, "SessionFailed").await?;
    assert!(
        failed.len() == 1
            && failed[0].contains("failed without a retry, as the agent's own doing")
            && failed[0].contains("exceeded its local ephemeral storage limit"),
        "{failed:?}"
    );
    let retried = noted(&client, &ns.name, "SessionRetried").await?;
    assert!(
        retried.len() == 1 && retried[0].contains("The node was low on resource"),
        "{retried:?}"
    );
    delete_jobs(&jobs).await?;
    kubelet.stop().await?;
    Ok(())
}

fn pods_api(client: &Client, ns: &str) -> Api<Pod> {
    Api::namespaced(client.clone(), ns)
}

/// `tasks.file` in a cluster: the job's task loader pod mounts the claim (here the fake
/// kubelet really runs its `floe serve-tasks` on a local directory standing in for the PVC)
/// and the operator reads the tasks from it; a missing file stalls the job with the loader's
/// own error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_from_a_file_on_a_claim_are_read_through_the_loader_pod() -> Result<()> {
    let (client, ns) = with_crds("tfile").await?;
    let _operator = Operator::start(&ns.name, &[])?;
    let volume = tempfile::tempdir()?;
    std::fs::create_dir_all(volume.path().join("sets"))?;
    let lines: Vec<String> = ["f0", "f1", "f2"]
        .iter()
        .map(|t| {
            json!({"id": t, "instruction": format!("fix {t}"), "image": format!("swe/{t}:1")})
                .to_string()
        })
        .collect();
    std::fs::write(
        volume.path().join("sets/tasks.jsonl"),
        lines.join("\n") + "\n",
    )?;
    let kubelet = FakeKubelet::start_with(
        client.clone(),
        &ns.name,
        13,
        Arc::new(|_: &Value| Verdict::Scored {
            exit: 0,
            reward: 1.0,
        }),
        NodeOptions {
            volumes: std::collections::HashMap::from([(
                "swe-tasks".to_string(),
                volume.path().to_path_buf(),
            )]),
            ..Default::default()
        },
    )?;
    let jobs: Api<RolloutJob> = Api::namespaced(client.clone(), &ns.name);
    let with_file = |name: &str, path: &str| -> Result<RolloutJob> {
        let mut spec = job(name, &["unused"], 1, json!({"concurrency": 2}))?;
        spec.spec.tasks =
            serde_json::from_value(json!({"file": {"claimName": "swe-tasks", "path": path}}))?;
        spec.spec.pool_ref = None;
        spec.spec.pool_template = Some(serde_json::from_value(
            json!({"image": "ghcr.io/acme/harness:1"}),
        )?);
        Ok(spec)
    };
    jobs.create(
        &PostParams::default(),
        &with_file("filed", "/sets/tasks.jsonl")?,
    )
    .await?;
    jobs.create(
        &PostParams::default(),
        &with_file("missing", "/sets/nope.jsonl")?,
    )
    .await?;

    let done = succeeded(&jobs, "filed", 120).await?;
    assert_eq!((done.sessions.total, done.sessions.succeeded), (3, 3));
    let tasks: BTreeSet<String> = kubelet
        .taken()
        .iter()
        .filter(|a| {
            a["session"]
                .as_str()
                .is_some_and(|s| s.starts_with("filed-"))
        })
        .map(|a| {
            format!(
                "{}:{}",
                a["task"].as_str().unwrap_or(""),
                a["run"]["task"]["instruction"].as_str().unwrap_or("")
            )
        })
        .collect();
    assert_eq!(
        tasks,
        ["f0:fix f0", "f1:fix f1", "f2:fix f2"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    );

    let stalled = eventually("the missing-file job stalled", async || {
        let s = status(&jobs, "missing").await?;
        Ok(condition(&s, "Stalled")
            .filter(|(st, _)| *st == "True")
            .map(|_| s.clone()))
    })
    .await?;
    let c = stalled
        .conditions
        .iter()
        .find(|c| c.type_ == "Stalled")
        .context("Stalled")?;
    assert_eq!(c.reason, "TaskFileUnreadable");
    assert!(c.message.contains("No such file"), "{}", c.message);
    delete_jobs(&jobs).await?;
    kubelet.stop().await?;
    Ok(())
}

/// The number of pods a job holds (claimed for its sessions), from the apiserver.
async fn held(pods: &Api<Pod>, job: &str) -> Result<usize> {
    Ok(job_pods(pods, job).await?.len())
}

/// A pool "warm" of `replicas` READY pods, on a node whose job pods (the collector) run at once
/// and get Ready `collector_start` later; every session scores 1.
async fn warm_pool_and_slow_collector(
    client: &Client,
    ns: &str,
    block: u8,
    replicas: i32,
    collector_start: std::time::Duration,
) -> Result<FakeKubelet> {
    create_pool(client, ns, "warm", replicas).await?;
    let kubelet = FakeKubelet::start_with(
        client.clone(),
        ns,
        block,
        Arc::new(|_: &Value| Verdict::Scored {
            exit: 0,
            reward: 1.0,
        }),
        NodeOptions {
            job_pod_start: collector_start,
            ..Default::default()
        },
    )?;
    let pools: Api<GatewayPool> = Api::namespaced(client.clone(), ns);
    pool_ready(&pools, "warm", replicas, 60).await?;
    Ok(kubelet)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_pods_are_claimed_while_the_collector_starts_and_sessions_start_once_it_is_ready(
) -> Result<()> {
    let (client, ns) = with_crds("early").await?;
    let operator = Operator::start(&ns.name, &[])?;
    // The collector's container runs at once and it gets Ready 15 s later (a trainer loading
    // its model would take minutes; the claims must come before, on a busy machine too).
    let start = std::time::Duration::from_secs(15);
    let kubelet = warm_pool_and_slow_collector(&client, &ns.name, 15, 4, start).await?;
    let jobs: Api<RolloutJob> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let created = std::time::Instant::now();
    jobs.create(
        &PostParams::default(),
        &job(
            "early",
            &["a", "b"],
            2,
            json!({"concurrency": 4, "backoffLimit": 0}),
        )?,
    )
    .await?;

    // Claimed while the collector is still starting; nothing assigned yet.
    eventually("4 pods claimed", async || {
        Ok((held(&pods, "early").await? == 4).then_some(()))
    })
    .await?;
    // One of them deleted before its session started (a node drained, a `kubectl delete`):
    // no attempt of its session's, which is claimed again at the same attempt (with
    // `backoffLimit: 0` a failed attempt would fail it).
    let first = job_pods(&pods, "early").await?;
    let gone = first
        .first()
        .map(|p| p.name_any())
        .context("a claimed pod")?;
    pods.delete(&gone, &Default::default()).await?;
    let collector = pods.get("early-dataset").await?;
    let phase = collector.status.as_ref().and_then(|s| s.phase.clone());
    assert_eq!(phase.as_deref(), Some("Running"));
    assert!(
        !pod_ready(&collector),
        "the claims came {:?} after the job, before its collector was Ready",
        created.elapsed()
    );
    assert_eq!(
        kubelet.taken_count(),
        0,
        "no session starts before the collector is Ready"
    );
    let waiting = eventually("the wait in the job's conditions", async || {
        let s = status(&jobs, "early").await?;
        Ok(s.conditions
            .iter()
            .find(|c| c.type_ == "Progressing")
            .map(|c| c.message.clone())
            .filter(|m| m.contains("hold their pods")))
    })
    .await?;
    assert!(waiting.contains("early-dataset"), "{waiting}");
    assert_eq!(kubelet.taken_count(), 0);

    let done = succeeded(&jobs, "early", 120).await?;
    assert!(
        created.elapsed() >= start,
        "the sessions waited for the collector"
    );
    assert_eq!(
        (
            done.sessions.total,
            done.sessions.succeeded,
            done.sessions.failed
        ),
        (4, 4, 0),
        "{done:?}"
    );
    let mut ids = taken_sessions(&kubelet);
    ids.sort();
    assert_eq!(ids, ["early-a-0", "early-a-1", "early-b-0", "early-b-1"]);
    // Each claim's latency is recorded once its delivery is acknowledged, from the round that
    // found the collector Ready: far below the 15 s the claims waited for it (a mean under
    // 3 s, loose for a busy machine; measured from the claim, each would be over 15 s).
    let metrics = operator.metrics().await?;
    let count = metric_value(&metrics, "floe_claim_latency_seconds_count").unwrap_or(0.0);
    let sum = metric_value(&metrics, "floe_claim_latency_seconds_sum").unwrap_or(f64::MAX);
    assert_eq!(count, 4.0, "{metrics}");
    assert!(sum < 4.0 * 3.0, "claim latencies summed to {sum} s");
    delete_jobs(&jobs).await?;
    kubelet.stop().await?;

    // `--claim-while-starting=false`: no claim before the collector is Ready.
    let (client, ns) = with_crds("late").await?;
    let _operator = Operator::start(&ns.name, &["--claim-while-starting=false"])?;
    let kubelet =
        warm_pool_and_slow_collector(&client, &ns.name, 16, 2, std::time::Duration::from_secs(5))
            .await?;
    let jobs: Api<RolloutJob> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    jobs.create(&PostParams::default(), &job("late", &["a"], 2, json!({}))?)
        .await?;
    let mut claimed_before_ready = 0;
    loop {
        let collector = pods.get_opt("late-dataset").await?;
        if collector.as_ref().is_some_and(pod_ready) {
            break;
        }
        claimed_before_ready = claimed_before_ready.max(held(&pods, "late").await?);
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert_eq!(claimed_before_ready, 0, "claims waited for the collector");
    let done = succeeded(&jobs, "late", 120).await?;
    assert_eq!((done.sessions.total, done.sessions.succeeded), (2, 2));
    delete_jobs(&jobs).await?;
    kubelet.stop().await?;
    Ok(())
}

/// A job that stalls while it holds pool pods it has not started a session on (claimed while
/// its collector starts) gives them back: the pool is others' meanwhile, and a stall lasts
/// until the job's deadline, or for good without one. It used to keep them. None counts as an
/// attempt: once the job goes on, it claims again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_job_gives_back_the_pool_pods_it_has_not_started_a_session_on() -> Result<()> {
    let (client, ns) = with_crds("giveback").await?;
    let operator = Operator::start(&ns.name, &[])?;
    // A collector that gets Ready only after the test: every claim stays unstarted.
    let never = std::time::Duration::from_secs(3600);
    let kubelet = warm_pool_and_slow_collector(&client, &ns.name, 57, 2, never).await?;
    let config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), &ns.name);
    config_maps
        .create(&PostParams::default(), &tasks_config_map(&["a", "b"])?)
        .await?;
    let jobs: Api<RolloutJob> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    jobs.create(
        &PostParams::default(),
        &job(
            "held",
            &[],
            2,
            json!({"concurrency": 4,
                   "tasks": {"configMap": {"name": "tasks", "key": "tasks.jsonl"}}}),
        )?,
    )
    .await?;
    eventually("2 pods claimed, the tasks recorded", async || {
        let s = status(&jobs, "held").await?;
        Ok((held(&pods, "held").await? == 2 && s.tasks_digest.is_some()).then_some(()))
    })
    .await?;
    // Four sessions may run, two pods are there: two wait for a pod.
    let waiting = async || -> Result<Option<f64>> {
        let page = operator.metrics().await?;
        Ok(page
            .lines()
            .find(|l| l.starts_with("floe_sessions_waiting_for_pod{") && l.contains("job=\"held\""))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok()))
    };
    eventually("two sessions waiting for a pod", async || {
        Ok((waiting().await? == Some(2.0)).then_some(()))
    })
    .await?;
    // Task "a" dropped from the source: the job cannot go on as its sessions are numbered.
    config_maps
        .replace("tasks", &PostParams::default(), &tasks_config_map(&["b"])?)
        .await?;
    stalled_for(&client, &jobs, &ns.name, "held", "TasksChanged").await?;
    eventually("the unstarted claims given back", async || {
        Ok((held(&pods, "held").await? == 0).then_some(()))
    })
    .await?;
    // Stalled, it claims nothing: none of its sessions waits for a pod (the gauge kept 2, and
    // FloePoolEmpty fired whenever the pool ran empty).
    eventually("no session waiting for a pod", async || {
        Ok((waiting().await? == Some(0.0)).then_some(()))
    })
    .await?;
    let notes = noted(&client, &ns.name, "PodsGivenBack").await?;
    assert!(
        notes.iter().any(|n| n.contains("gave back 2 pool pod(s)")),
        "{notes:?}"
    );
    assert_eq!(kubelet.taken_count(), 0, "no session started");
    // The pool made fresh ones, for anyone to claim.
    let pools: Api<GatewayPool> = Api::namespaced(client.clone(), &ns.name);
    pool_ready(&pools, "warm", 2, 60).await?;
    // The source mended: the job claims again, its sessions at their first attempt.
    config_maps
        .replace(
            "tasks",
            &PostParams::default(),
            &tasks_config_map(&["a", "b"])?,
        )
        .await?;
    let back = eventually("the job holding its 2 sessions again", async || {
        let s = status(&jobs, "held").await?;
        let going = condition(&s, "Stalled").is_none();
        Ok((going && held(&pods, "held").await? == 2).then_some(s))
    })
    .await?;
    assert!(back.retries.is_empty(), "{:?}", back.retries);
    assert_eq!(back.sessions.failed, 0, "{:?}", back.sessions);
    delete_jobs(&jobs).await?;
    kubelet.stop().await?;
    Ok(())
}

/// A train job's sample whose retries are spent will never reach the trainer: the operator
/// says so (`POST /v1/failed` with the job's control token), until the trainer takes it and
/// then never again, so that its group completes without it instead of waiting until the
/// job's end. A sample evicted for what its agent wrote
/// is said so with its session, so that the trainer scores its gateway's last snapshot as 0.
/// What is not taken yet is in the job's status: an operator restarted meanwhile tells it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sample_that_failed_for_good_is_reported_to_the_trainer() -> Result<()> {
    let (client, ns) = with_crds("jobfailed").await?;
    let mut operator = Operator::start(&ns.name, &[])?;
    create_pool(&client, &ns.name, "warm", 3).await?;
    // Sample 1 of every group fails in the infrastructure, every attempt; sample 2's agent
    // fills its container's layer.
    let kubelet = FakeKubelet::start(
        client.clone(),
        &ns.name,
        17,
        Arc::new(|a: &Value| match a["sample"].as_u64() {
            Some(1) => Verdict::Infra {
                error: "node lost".into(),
            },
            Some(2) => Verdict::Evicted {
                message: "Container agent exceeded its local ephemeral storage limit \"32Mi\". "
                    .into(),
            },
            _ => Verdict::Scored {
                exit: 0,
                reward: 1.0,
            },
        }),
    )?;
    let jobs: Api<RolloutJob> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let mut spec = job("lossy", &["t"], 3, json!({"backoffLimit": 1}))?;
    spec.spec.sft = None;
    spec.spec.train = Some(serde_json::from_value(json!({
        "image": "floe-trainer:test", "model": "/models/m", "gpus": 0, "vllm": {"gpus": 0},
        "fidelityCheck": {"action": "Off"}}))?);
    jobs.create(&PostParams::default(), &spec).await?;
    let ip = trainer_ip(&pods, "lossy").await?;
    let token = control_token(&client, &ns.name, "lossy").await?;
    // A stand-in for the trainer's HTTP face: what it was told, with which credential. It is
    // down at first (its pod lost and not back yet): the operator tells it again until it
    // answers.
    let told: Recorded = Arc::default();
    let record = told.clone();
    let up = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let refused = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (is_up, refusing) = (up.clone(), refused.clone());
    // Each /v1/finish, with whether the trainer was up (taking reports) by then.
    let finishes: Arc<std::sync::Mutex<Vec<bool>>> = Arc::default();
    let (finish_up, finish_log) = (up.clone(), finishes.clone());
    let trainer = axum::Router::new()
        .route(
            "/v1/status",
            axum::routing::get(|| async {
                axum::Json(json!({"step": 0, "policyVersion": 0, "pendingGroups": 1,
                                  "readyGroups": 0, "training": false, "finished": false}))
            }),
        )
        .route(
            "/v1/finish",
            axum::routing::post(move || async move {
                let up = finish_up.load(std::sync::atomic::Ordering::SeqCst);
                finish_log.lock().map(|mut f| f.push(up)).ok();
                axum::http::StatusCode::ACCEPTED
            }),
        )
        .route(
            "/v1/failed",
            axum::routing::post(
                move |headers: axum::http::HeaderMap, axum::Json(body): axum::Json<Value>| async move {
                    if !is_up.load(std::sync::atomic::Ordering::SeqCst) {
                        refusing.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        return axum::http::StatusCode::SERVICE_UNAVAILABLE;
                    }
                    record.lock().map(|mut t| t.push((bearer(&headers), body))).ok();
                    axum::http::StatusCode::ACCEPTED
                },
            ),
        );
    serve_at(&ip, 8100, trainer).await?;
    let failed = eventually("the samples failed for good", async || {
        let s = status(&jobs, "lossy").await?;
        Ok((s.sessions.failed >= 2 && s.sessions.succeeded >= 1).then_some(s))
    })
    .await?;
    assert_eq!(failed.sessions.failed, 2, "{:?}", failed.sessions);
    eventually("a report the trainer could not take", async || {
        Ok((refused.load(std::sync::atomic::Ordering::SeqCst) >= 1).then_some(()))
    })
    .await?;
    // Not taken, so kept in the status, which is all a restarted operator knows of them.
    let untold = status(&jobs, "lossy").await?.untold_failures;
    let sessions: Vec<_> = untold.values().map(|f| f.session.as_str()).collect();
    assert_eq!(untold.len(), 2, "{untold:?}");
    assert!(sessions.contains(&"lossy-t-2"), "{sessions:?}");
    operator.kill();
    drop(operator);
    let _operator = Operator::start(&ns.name, &[])?;
    // Down a few rounds more, the sessions all done: no finish may come before the reports.
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    up.store(true, std::sync::atomic::Ordering::SeqCst);
    eventually("the trainer told", async || {
        let t = told.lock().map(|t| t.len()).unwrap_or_default();
        Ok((t >= 2).then_some(()))
    })
    .await?;
    // A few more rounds: each is said once it was taken.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let mut reported = told.lock().map(|t| t.clone()).unwrap_or_default();
    reported.sort_by_key(|(_, body)| body["sample"].as_u64());
    assert_eq!(reported.len(), 2, "{reported:?}");
    assert!(reported
        .iter()
        .all(|(auth, _)| *auth == format!("Bearer {token}")));
    let infra = &reported[0].1;
    assert_eq!(
        (&infra["group"], &infra["sample"]),
        (&json!("lossy/t"), &json!(1))
    );
    // Its last attempt's session, whose snapshot the trainer drops; no fault of the agent's.
    assert!(
        infra["session"]
            .as_str()
            .is_some_and(|s| s.starts_with("lossy-t-1")),
        "{infra}"
    );
    assert!(infra.get("agentFault").is_none(), "{infra}");
    // The trainer is told to finish (the sessions are done), but only once it took them.
    eventually("the trainer told to finish", async || {
        Ok((!finishes.lock().map(|f| f.is_empty()).unwrap_or(true)).then_some(()))
    })
    .await?;
    let finished_when = finishes.lock().map(|f| f.clone()).unwrap_or_default();
    assert!(finished_when.iter().all(|up| *up), "{finished_when:?}");
    let left = status(&jobs, "lossy").await?.untold_failures;
    assert!(left.is_empty(), "taken, so gone from the status: {left:?}");
    let fault = &reported[1].1;
    assert_eq!(
        (&fault["group"], &fault["sample"], &fault["session"]),
        (&json!("lossy/t"), &json!(2), &json!("lossy-t-2")),
        "{fault}"
    );
    assert!(
        fault["agentFault"]
            .as_str()
            .is_some_and(|why| why.contains("Container agent exceeded")),
        "{fault}"
    );
    delete_jobs(&jobs).await?;
    kubelet.stop().await?;
    Ok(())
}

/// A train job whose trainer and policy server disagree (the check's figure beyond
/// `maxMismatch`) stops before any session, saying so; once its spec allows what was
/// measured (`action: Warn`), it goes on without a second probe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_train_job_whose_trainer_disagrees_with_its_policy_server_starts_no_session() -> Result<()>
{
    let (client, ns) = with_crds("jobfidelity").await?;
    let _operator = Operator::start(&ns.name, &[])?;
    create_pool(&client, &ns.name, "warm", 2).await?;
    let kubelet = scoring_node(&client, &ns.name, 18)?;
    let jobs: Api<RolloutJob> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let mut spec = job("apart", &["t"], 2, json!({}))?;
    spec.spec.sft = None;
    spec.spec.train = Some(serde_json::from_value(json!({
        "image": "floe-trainer:test", "model": "/models/m", "gpus": 0, "vllm": {"gpus": 0}}))?);
    jobs.create(&PostParams::default(), &spec).await?;
    let ip = trainer_ip(&pods, "apart").await?;
    // The policy server samples; the trainer finds its own log-probs 0.4 nats apart (Qwen3's
    // top_k 20 left to vLLM measured so).
    let scored = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = scored.clone();
    let trainer = axum::Router::new()
        .route(
            "/v1/status",
            axum::routing::get(|| async {
                axum::Json(json!({"step": 0, "policyVersion": 0, "pendingGroups": 0,
                                  "readyGroups": 0, "training": false, "finished": false}))
            }),
        )
        .route(
            "/v1/fidelity",
            axum::routing::post(move || async move {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                axum::Json(json!({"tokens": 8, "mismatch": 0.4, "max": 1.2}))
            }),
        );
    serve_at(&ip, 8100, trainer).await?;
    serve_at(&ip, 8000, policy_stand_in(Arc::default())).await?;

    let notes = stalled_for(&client, &jobs, &ns.name, "apart", "FidelityCheckFailed").await?;
    let s = status(&jobs, "apart").await?;
    let (_, message) = s
        .conditions
        .iter()
        .find(|c| c.type_ == "Stalled")
        .map(|c| (c.reason.clone(), c.message.clone()))
        .context("Stalled")?;
    assert!(
        message.contains("0.4000 nats apart") && message.contains("generation_config.json"),
        "{message}"
    );
    assert!(!notes.is_empty());
    assert_eq!(s.fidelity.as_ref().map(|f| f.mismatch), Some(0.4));
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert!(kubelet.taken().is_empty(), "a session started");
    // Allowed by the spec now: the job goes on with what was measured.
    jobs.patch(
        "apart",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"train": {"fidelityCheck": {"action": "Warn"}}}})),
    )
    .await?;
    eventually("sessions ran", async || {
        Ok((!kubelet.taken().is_empty()).then_some(()))
    })
    .await?;
    assert_eq!(
        scored.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "probed once"
    );
    delete_jobs(&jobs).await?;
    kubelet.stop().await?;
    Ok(())
}

/// A train job's held-out rounds on a cluster: a round at version 0 whose sessions go ahead of
/// the job's own, one when the trainer reaches `everySteps`, and a final one once the trainer
/// has finished, before the job completes. Each round is recorded in the status (sampled
/// versions included), said by an Event and the gauge; held-out sessions ship their
/// trajectories nowhere and are never reported to the trainer. The held-out tasks are a file
/// on a claim, which the job's loader pod serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_train_jobs_held_out_rounds_measure_the_policy_and_the_job_waits_for_the_last(
) -> Result<()> {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
    let (client, ns) = with_crds("jobheldout").await?;
    let operator = Operator::start(&ns.name, &[])?;
    // Two READY pods: the first round's claims are the held-out round's two sessions.
    create_pool(&client, &ns.name, "warm", 2).await?;
    // What the stand-in trainer says: its version and whether it finished.
    let version = Arc::new(AtomicU64::new(0));
    let finished = Arc::new(AtomicBool::new(false));
    // A held-out session passes once the policy it measures has trained (step ≥ 2); its
    // calls were sampled by the version the trainer is at now.
    let now = version.clone();
    // The held-out tasks in a file on a claim: the job's loader pod (really run here) serves it.
    let volume = tempfile::tempdir()?;
    std::fs::write(
        volume.path().join("held.jsonl"),
        "{\"id\": \"h\", \"instruction\": \"solve h\"}\n",
    )?;
    let kubelet = FakeKubelet::start_with(
        client.clone(),
        &ns.name,
        19,
        Arc::new(
            move |a: &Value| match a["metadata"]["heldOutStep"].as_u64() {
                Some(step) => Verdict::Sampled {
                    reward: if step >= 2 { 1.0 } else { 0.0 },
                    versions: [step, now.load(SeqCst)],
                },
                None => Verdict::Scored {
                    exit: 0,
                    reward: 1.0,
                },
            },
        ),
        NodeOptions {
            volumes: std::collections::HashMap::from([(
                "sets".to_string(),
                volume.path().to_path_buf(),
            )]),
            ..Default::default()
        },
    )?;
    let pools: Api<GatewayPool> = Api::namespaced(client.clone(), &ns.name);
    pool_ready(&pools, "warm", 2, 60).await?;
    let jobs: Api<RolloutJob> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let mut spec = job("measured", &["a", "b"], 2, json!({}))?;
    spec.spec.sft = None;
    spec.spec.train = Some(serde_json::from_value(json!({
        "image": "floe-trainer:test", "model": "/models/m", "gpus": 0, "vllm": {"gpus": 0},
        "maxStaleness": 4, "fidelityCheck": {"action": "Off"},
        "heldOut": {"tasks": {"file": {"claimName": "sets", "path": "held.jsonl"}},
                    "everySteps": 2, "samples": 2}}))?);
    jobs.create(&PostParams::default(), &spec).await?;
    let ip = trainer_ip(&pods, "measured").await?;
    let told: Recorded = Arc::default();
    let (record, at, done) = (told.clone(), version.clone(), finished.clone());
    let trainer = axum::Router::new()
        .route(
            "/v1/status",
            axum::routing::get(move || {
                let (at, done) = (at.clone(), done.clone());
                async move {
                    axum::Json(
                        json!({"step": at.load(SeqCst), "policyVersion": at.load(SeqCst),
                                      "pendingGroups": 0, "readyGroups": 0, "training": false,
                                      "finished": done.load(SeqCst)}),
                    )
                }
            }),
        )
        .route(
            "/v1/{call}",
            axum::routing::post(
                move |axum::extract::Path(call): axum::extract::Path<String>,
                      headers: axum::http::HeaderMap| async move {
                    record
                        .lock()
                        .map(|mut t| t.push((bearer(&headers), json!(call))))
                        .ok();
                    axum::http::StatusCode::ACCEPTED
                },
            ),
        );
    serve_at(&ip, 8100, trainer).await?;
    let rounds = |s: &RolloutJobStatus| -> Vec<(i64, bool, i32, Option<f64>)> {
        s.held_out
            .iter()
            .flat_map(|h| h.rounds.iter())
            .map(|r| (r.step, r.last, r.scored, r.pass_rate))
            .collect()
    };
    // Round 0 measures the base policy: its two sessions were the first taken.
    let first = eventually("round 0 scored", async || {
        let s = status(&jobs, "measured").await?;
        Ok((rounds(&s).first().is_some_and(|r| r.2 == 2)).then_some(s))
    })
    .await?;
    assert_eq!(rounds(&first)[0], (0, false, 2, Some(0.0)));
    let taken: Vec<String> = kubelet
        .taken()
        .iter()
        .map(|a| a["session"].as_str().unwrap_or_default().to_string())
        .collect();
    let mut first_two = taken[..2.min(taken.len())].to_vec();
    first_two.sort();
    assert_eq!(
        first_two,
        ["measured-h-0.h0", "measured-h-1.h0"],
        "{taken:?}"
    );
    // Samples changed after the first round would move every later round's sessions: the job
    // stalls, saying so, until they are restored.
    let samples = |n: u32| json!({"spec": {"train": {"heldOut": {"samples": n}}}});
    jobs.patch(
        "measured",
        &PatchParams::default(),
        &Patch::Merge(&samples(3)),
    )
    .await?;
    let notes = stalled_for(&client, &jobs, &ns.name, "measured", "HeldOutTasksChanged").await?;
    assert!(
        notes.iter().any(|n| n.contains("makes 3 sessions a round")),
        "{notes:?}"
    );
    jobs.patch(
        "measured",
        &PatchParams::default(),
        &Patch::Merge(&samples(2)),
    )
    .await?;
    // The same task from another source is the same set: the job goes on with it inline.
    let held = |instruction: &str| {
        json!({"spec": {"train": {"heldOut": {"tasks": {
            "file": null, "inline": [{"id": "h", "instruction": instruction}]}}}}})
    };
    let digest = |s: &RolloutJobStatus| s.held_out.as_ref().and_then(|h| h.tasks_digest.clone());
    let before = digest(&status(&jobs, "measured").await?).context("a recorded digest")?;
    let moved = jobs
        .patch(
            "measured",
            &PatchParams::default(),
            &Patch::Merge(&held("solve h")),
        )
        .await?;
    let seen = eventually("the move observed", async || {
        let s = status(&jobs, "measured").await?;
        Ok((s.observed_generation == moved.metadata.generation).then_some(s))
    })
    .await?;
    assert_ne!(
        condition(&seen, "Stalled").map(|c| c.0),
        Some("True"),
        "{seen:?}"
    );
    // New contents of the same size would make later rounds measure another set: stalled.
    jobs.patch(
        "measured",
        &PatchParams::default(),
        &Patch::Merge(&held("solve h, another way")),
    )
    .await?;
    eventually("stalled for the held-out set's contents", async || {
        let s = status(&jobs, "measured").await?;
        Ok(s.conditions
            .iter()
            .any(|c| {
                c.type_ == "Stalled"
                    && c.status == "True"
                    && c.reason == "HeldOutTasksChanged"
                    && c.message.contains("tasks changed after the first round")
            })
            .then_some(()))
    })
    .await?;
    // Kept knowingly: the recorded digest removed, the job goes on and records the new one.
    jobs.patch_status(
        "measured",
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": {"heldOut": {"tasksDigest": null}}})),
    )
    .await?;
    let after = eventually("the new set's digest recorded", async || {
        let s = status(&jobs, "measured").await?;
        let stalled = condition(&s, "Stalled").is_some_and(|(v, _)| v == "True");
        Ok(digest(&s).filter(|_| !stalled))
    })
    .await?;
    assert_ne!(after, before);
    // The trainer reaches step 2: a round opens at it.
    version.store(2, SeqCst);
    eventually("round 2 scored", async || {
        let s = status(&jobs, "measured").await?;
        Ok((rounds(&s).get(1).is_some_and(|r| r.2 == 2)).then_some(()))
    })
    .await?;
    // The job's own sessions are done: the job waits for its trainer, then for the final round.
    let waiting = eventually("the trainer told to finish", async || {
        let s = status(&jobs, "measured").await?;
        let told_finish = told
            .lock()
            .map(|t| t.iter().any(|(_, c)| c == "finish"))
            .unwrap_or(false);
        Ok((told_finish && s.sessions.succeeded == 4).then_some(s))
    })
    .await?;
    assert_eq!(waiting.phase, Some(RolloutJobPhase::Running));
    assert_eq!(
        rounds(&waiting).len(),
        2,
        "no final round before the trainer finished"
    );
    version.store(3, SeqCst);
    finished.store(true, SeqCst);
    let end = succeeded(&jobs, "measured", 60).await?;
    assert_eq!(
        rounds(&end),
        [
            (0, false, 2, Some(0.0)),
            (2, false, 2, Some(1.0)),
            (3, true, 2, Some(1.0))
        ]
    );
    let held_out = end.held_out.clone().unwrap_or_default();
    assert_eq!(held_out.rounds[2].policy_versions, [3, 3]);
    assert_eq!(held_out.completed_indexes.as_deref(), Some("4-9"));
    // The job's own counts and rewards are its own sessions'.
    assert_eq!((end.sessions.total, end.sessions.succeeded), (4, 4));
    assert_eq!(end.rewards.map(|r| r.scored), Some(4));
    // Held-out assignments: ids and groups of their own, trajectories to nobody.
    for a in kubelet.taken() {
        let session = a["session"].as_str().unwrap_or_default();
        if a["metadata"]["heldOutStep"].is_u64() {
            assert_eq!(a["sink"], json!({"kind": "none"}), "{a}");
            assert!(
                a["group"]
                    .as_str()
                    .is_some_and(|g| g.starts_with("measured/h/h")),
                "{a}"
            );
        } else {
            assert!(!session.contains(".h"), "{session}");
            assert_eq!(a["sink"]["kind"], "trainer", "{a}");
            // Each call's snapshot leaves the pod first (an eviction leaves no grace period).
            assert_eq!(a["sink"]["snapshots"], true, "{a}");
        }
    }
    let wants = [
        "step 0: pass rate 0.000 · reward 0.000 over 2 of 2 sessions (sampled by v0)",
        "step 2: pass rate 1.000",
        "step 3 (final): pass rate 1.000 · reward 1.000 over 2 of 2 sessions (sampled by v3)",
    ];
    let all = |n: &[String]| wants.iter().all(|w| n.iter().any(|x| x.contains(w)));
    let notes = noted_until(&client, &ns.name, "HeldOutRound", all).await?;
    for want in wants {
        assert!(notes.iter().any(|n| n.contains(want)), "{want}: {notes:?}");
    }
    let page = operator.metrics().await?;
    let series = |stat: &str| {
        format!(
            "floe_job_held_out{{namespace=\"{}\",rolloutjob=\"measured\",stat=\"{stat}\"}}",
            ns.name
        )
    };
    assert_eq!(metric_value(&page, &series("step")), Some(3.0), "{page}");
    assert_eq!(
        metric_value(&page, &series("pass_rate")),
        Some(1.0),
        "{page}"
    );
    delete_jobs(&jobs).await?;
    kubelet.stop().await?;
    Ok(())
}

/// An operator newer than the RolloutJob CRD on its cluster (the CRD of the release before
/// `status.heldOut`, which prunes it): the first round cannot be recorded, so none of its
/// sessions is claimed (else each reconcile would open round 0 again, its sessions without
/// end), and the job says why and how to fix it. Once the new CRD is applied, the round is
/// recorded and runs. And CRDs from before `failureReward` and `egress.unrestricted`: a job
/// and a pool `kubectl apply`d with them stall, naming the field, until applied again after
/// the new CRDs; one written with no such record (server-side apply), or whose spec another
/// writer changed since its record, stalls while the CRDs are old. On a control plane of its
/// own: CRDs are the whole cluster's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_newer_than_its_crds_stalls_what_they_prune_until_they_are_applied(
) -> Result<()> {
    let private = floe_tests::cluster::PrivateCluster::start()?;
    let cluster = &private.cluster;
    let client = cluster.client().await?;
    cluster
        .install_crds_edited(&client, |crd| {
            if crd.spec.names.kind == "GatewayPool" {
                // A GatewayPool CRD from before `egress.unrestricted`.
                let mut v = serde_json::to_value(&*crd)?;
                anyhow::ensure!(strip_field(&mut v, "unrestricted"), "no unrestricted");
                *crd = serde_json::from_value(v)?;
                return Ok(());
            }
            remove_status_field(crd, "heldOut")?;
            // And one without `evaluator.reward.failureReward` (its property, its defaults and
            // any rule naming it), as the CRDs before it were.
            let mut v = serde_json::to_value(&*crd)?;
            anyhow::ensure!(strip_field(&mut v, "failureReward"), "no failureReward");
            *crd = serde_json::from_value(v)?;
            Ok(())
        })
        .await?;
    let ns = floe_tests::namespace::TestNamespace::create(cluster, &client, "oldcrd").await?;
    let operator = Operator::start_on(cluster, "floe:test", &ns.name, &[], &[])?;
    // `kubectl apply`, which records what it sent: the operator checks such an object field by
    // field. (`--validate=false`: this kubectl, 1.20's, refuses a field the CRD lacks itself; a
    // newer one only warns, as the apiserver's field validation does, and Argo CD applies.)
    let kubectl_apply = |doc: &Value| -> Result<()> {
        let done = cluster.kubectl(
            &["apply", "--validate=false", "-n", &ns.name, "-f", "-"],
            Some(serde_json::to_string(doc)?.as_bytes()),
        )?;
        anyhow::ensure!(done.status.success(), "{done:?}");
        Ok(())
    };
    kubectl_apply(
        &json!({"apiVersion": "floe.dev/v1alpha1", "kind": "GatewayPool",
        "metadata": {"name": "warm"},
        "spec": {"replicas": 1, "template": {"image": "ghcr.io/acme/sandbox-pi:1"}}}),
    )?;
    let kubelet = scoring_node(&client, &ns.name, 27)?;
    let pools: Api<GatewayPool> = Api::namespaced(client.clone(), &ns.name);
    pool_ready(&pools, "warm", 1, 60).await?;
    let jobs: Api<RolloutJob> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let mut spec = job("measured", &["a"], 1, json!({}))?;
    spec.spec.sft = None;
    spec.spec.train = Some(serde_json::from_value(json!({
        "image": "floe-trainer:test", "model": "/models/m", "gpus": 0, "vllm": {"gpus": 0},
        "fidelityCheck": {"action": "Off"},
        "heldOut": {"tasks": {"inline": [{"id": "h", "instruction": "solve h"}]}}}))?);
    // (Without `failureReward`, which the typed job writes out at its default: this CRD lacks
    // it, and it is the next case's.)
    let mut measured = serde_json::to_value(&spec)?;
    if let Some(reward) = measured["spec"]["evaluator"]["reward"].as_object_mut() {
        reward.remove("failureReward");
    }
    kubectl_apply(&measured)?;
    let ip = trainer_ip(&pods, "measured").await?;
    let trainer = axum::Router::new().route(
        "/v1/status",
        axum::routing::get(|| async {
            axum::Json(json!({"step": 0, "policyVersion": 0, "pendingGroups": 0,
                              "readyGroups": 0, "training": false, "finished": false}))
        }),
    );
    serve_at(&ip, 8100, trainer).await?;
    let notes = stalled_for(&client, &jobs, &ns.name, "measured", "CrdOutdated").await?;
    assert!(
        notes
            .iter()
            .any(|n| n.contains("status.heldOut") && n.contains("floe crds | kubectl apply -f -")),
        "{notes:?}"
    );
    // Stalled, the job is left alone: its status is not cleared and stalled again, each write
    // the next reconcile's trigger (a storm of writes and Events until the CRD was applied,
    // which once outlasted this test's wait for the recovery in CI).
    let quiet = std::time::Duration::from_secs(4);
    let (mut rv, mut since) = (String::new(), std::time::Instant::now());
    eventually_within(30, "the stalled job no longer written", async || {
        let now = jobs
            .get("measured")
            .await?
            .resource_version()
            .unwrap_or_default();
        if now != rv {
            (rv, since) = (now, std::time::Instant::now());
        }
        Ok((since.elapsed() >= quiet).then_some(()))
    })
    .await?;
    assert!(
        kubelet.taken().is_empty(),
        "nothing claimed: {:?}",
        kubelet.taken()
    );
    // A job whose `kubectl apply` sets a field that CRD prunes: it would run with the default
    // (failures scored 0, not -1), so it stalls saying which field went, before any claim.
    let mut pruned = job("pruned", &["a"], 1, json!({"suspend": true}))?;
    pruned.spec.evaluator.reward.failure_reward = -1.0;
    let pruned = serde_json::to_value(&pruned)?;
    kubectl_apply(&pruned)?;
    stalled_for(&client, &jobs, &ns.name, "pruned", "CrdOutdated").await?;
    let said = |n: &String| n.contains("dropped spec.evaluator.reward.failureReward from the job");
    let notes = noted_until(&client, &ns.name, "CrdOutdated", |n| n.iter().any(said)).await?;
    assert!(notes.iter().any(said), "{notes:?}");
    // A pool likewise: with `egress.unrestricted: Refuse` pruned, its pods would serve with
    // open egress, warning only. It makes no pod, and says which field went.
    let refusing = json!({"apiVersion": "floe.dev/v1alpha1", "kind": "GatewayPool",
        "metadata": {"name": "refusing"},
        "spec": {"replicas": 1, "template": {"image": "sandbox:1"},
                 "egress": {"unrestricted": "Refuse"}}});
    kubectl_apply(&refusing)?;
    // A pool's `Stalled` reason and message, if it is stalled.
    let stall_of = async |name: &str| {
        let s = pools.get(name).await?.status.unwrap_or_default();
        anyhow::Ok(
            s.conditions
                .into_iter()
                .find(|c| c.type_ == "Stalled" && c.status == "True")
                .map(|c| (c.reason, c.message)),
        )
    };
    let pool_stall = async || stall_of("refusing").await;
    let (reason, message) = eventually_within(60, "the pool stalled", pool_stall).await?;
    assert_eq!(reason, "CrdOutdated", "{message}");
    assert!(
        message.contains("dropped spec.egress.unrestricted from the pool"),
        "{message}"
    );
    let pool_pods = ListParams::default().labels("floe.dev/pool=refusing");
    assert!(pods.list(&pool_pods).await?.items.is_empty());
    // Written with no record of what was sent (server-side apply, as Flux does): nothing on
    // the objects says what went, but the operator reads the served CRDs, exports what they
    // lack and stalls what was written through them, job and pool alike.
    let flux = PatchParams::apply("flux-like");
    let mut unrecorded = job("unrecorded", &["a"], 1, json!({"suspend": true}))?;
    unrecorded.spec.evaluator.reward.failure_reward = -1.0;
    jobs.patch("unrecorded", &flux, &Patch::Apply(&unrecorded))
        .await?;
    let unrecorded_pool = json!({"apiVersion": "floe.dev/v1alpha1", "kind": "GatewayPool",
        "metadata": {"name": "unrecorded"},
        "spec": {"replicas": 1, "template": {"image": "sandbox:1"},
                 "egress": {"unrestricted": "Refuse"}}});
    pools
        .patch("unrecorded", &flux, &Patch::Apply(&unrecorded_pool))
        .await?;
    let lacking = |crd: &str| format!("floe_crd_missing_fields{{crd=\"{crd}\"}}");
    let page = eventually_within(60, "the served CRDs' gaps exported", async || {
        let Ok(page) = operator.metrics().await else {
            return Ok(None);
        };
        let seen = |crd| metric_value(&page, &lacking(crd)).is_some_and(|n| n >= 1.0);
        Ok((seen("rolloutjobs.floe.dev") && seen("gatewaypools.floe.dev")).then_some(page))
    })
    .await?;
    let (reason, message) = eventually_within(60, "the unrecorded job stalled", async || {
        let s = status(&jobs, "unrecorded").await?;
        Ok(s.conditions
            .into_iter()
            .find(|c| c.type_ == "Stalled" && c.status == "True")
            .map(|c| (c.reason, c.message)))
    })
    .await?;
    assert_eq!(reason, "CrdOutdated", "{message}");
    assert!(
        message.contains("spec.evaluator.reward.failureReward")
            && message.contains("no `kubectl apply` record"),
        "{message} {page}"
    );
    let unrecorded_stall = async || stall_of("unrecorded").await;
    let (reason, message) =
        eventually_within(60, "the unrecorded pool stalled", unrecorded_stall).await?;
    assert_eq!(reason, "CrdOutdated", "{message}");
    assert!(message.contains("spec.egress.unrestricted"), "{message}");
    let unrecorded_pods = ListParams::default().labels("floe.dev/pool=unrecorded");
    assert!(pods.list(&unrecorded_pods).await?.items.is_empty());
    // A record that no longer tells all: `kubectl apply`d at 0 replicas, then scaled up with
    // `egress.unrestricted: Refuse` by server-side apply, which the CRD pruned as well. The
    // pool stalls naming that writer, and makes no pod with open egress.
    kubectl_apply(
        &json!({"apiVersion": "floe.dev/v1alpha1", "kind": "GatewayPool",
        "metadata": {"name": "edited"},
        "spec": {"replicas": 0, "template": {"image": "sandbox:1"}}}),
    )?;
    let mut edited = unrecorded_pool.clone();
    edited["metadata"]["name"] = json!("edited");
    pools
        .patch("edited", &flux.clone().force(), &Patch::Apply(&edited))
        .await?;
    let edited_stall = async || stall_of("edited").await;
    let (reason, message) = eventually_within(60, "the edited pool stalled", edited_stall).await?;
    assert_eq!(reason, "CrdOutdated", "{message}");
    assert!(
        message.contains("spec.egress.unrestricted")
            && message.contains("`flux-like` wrote its spec besides its `kubectl apply` record"),
        "{message}"
    );
    let edited_pods = ListParams::default().labels("floe.dev/pool=edited");
    assert!(pods.list(&edited_pods).await?.items.is_empty());
    // The new CRD: round 0 is recorded, its session runs, and the job is no longer stalled.
    cluster.install_crds(&client).await?;
    // A stalled job is looked at again every 15 s, then claims, runs and folds its session:
    // 60 s was once too short beside the trainer's suite in CI (18 s alone).
    eventually_within(120, "round 0 recorded and scored", async || {
        let s = status(&jobs, "measured").await?;
        let scored = s
            .held_out
            .as_ref()
            .and_then(|h| h.rounds.first())
            .is_some_and(|r| r.step == 0 && r.scored == 1);
        let stalled = condition(&s, "Stalled").is_some_and(|(v, _)| v == "True");
        Ok((scored && !stalled).then_some(()))
    })
    .await?;
    // Served up to date, the gaps read 0 and the unrecorded objects go on (the stall holds
    // while the CRDs are old, not after: nothing on them tells a lost field from a default).
    eventually_within(60, "the served CRDs up to date", async || {
        let Ok(page) = operator.metrics().await else {
            return Ok(None);
        };
        let none = |crd| metric_value(&page, &lacking(crd)) == Some(0.0);
        Ok((none("rolloutjobs.floe.dev") && none("gatewaypools.floe.dev")).then_some(()))
    })
    .await?;
    eventually_within(60, "the unrecorded pool makes its pod", async || {
        let made = pods.list(&unrecorded_pods).await?.items.len();
        Ok((made == 1 && unrecorded_stall().await?.is_none()).then_some(()))
    })
    .await?;
    eventually_within(60, "the edited pool makes its pod", async || {
        let made = pods.list(&edited_pods).await?.items.len();
        Ok((made == 1 && edited_stall().await?.is_none()).then_some(()))
    })
    .await?;
    eventually_within(60, "the unrecorded job no longer stalled", async || {
        let s = status(&jobs, "unrecorded").await?;
        Ok(condition(&s, "Stalled")
            .is_none_or(|(v, _)| v != "True")
            .then_some(()))
    })
    .await?;
    // The pruned job and pool stay stalled until they are applied again: the stored objects
    // never got the field. Read now, they hold its default (the new CRD fills it in), which
    // nobody wrote: an operator that starts afresh (a restart, a chart upgrade's rollout: no
    // verdict remembered) sees the field lost too. Applied again, they keep it and go on.
    drop(operator);
    let operator = Operator::start_on(cluster, "floe:test", &ns.name, &[], &[])?;
    // Its own verdicts, not the status the first one wrote: what it exports.
    let series = [
        format!(
            "floe_rolloutjob_blocked{{namespace=\"{}\",reason=\"CrdOutdated\",rolloutjob=\"pruned\"}}",
            ns.name
        ),
        format!(
            "floe_pool_blocked{{namespace=\"{}\",pool=\"refusing\",reason=\"CrdOutdated\"}}",
            ns.name
        ),
    ];
    eventually_within(60, "the restarted operator stalls both again", async || {
        // (Refused until it listens.)
        let Ok(page) = operator.metrics().await else {
            return Ok(None);
        };
        Ok(series
            .iter()
            .all(|s| metric_value(&page, s) == Some(1.0))
            .then_some(()))
    })
    .await?;
    let s = status(&jobs, "pruned").await?;
    assert_eq!(condition(&s, "Stalled"), Some(("True", "CrdOutdated")));
    assert!(pool_stall().await?.is_some_and(|(r, _)| r == "CrdOutdated"));
    assert!(pods.list(&pool_pods).await?.items.is_empty());
    kubectl_apply(&refusing)?;
    eventually_within(60, "the pool applied again makes its pod", async || {
        let made = pods.list(&pool_pods).await?.items.len();
        Ok((made == 1 && pool_stall().await?.is_none()).then_some(()))
    })
    .await?;
    kubectl_apply(&pruned)?;
    eventually_within(
        60,
        "the pruned job applied again, no longer stalled",
        async || {
            let job = jobs.get("pruned").await?;
            let stalled = job
                .status
                .as_ref()
                .and_then(|s| condition(s, "Stalled"))
                .is_some();
            Ok((!stalled && job.spec.evaluator.reward.failure_reward == -1.0).then_some(()))
        },
    )
    .await?;
    // Resumed by a patch, as Kueue admits a job: `suspend` now holds its default against the
    // record's `true`, but the patch wrote it, so nothing was lost and the job runs.
    jobs.patch(
        "pruned",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"suspend": false}})),
    )
    .await?;
    // (Its collector, then a claim from the one-pod pool the held-out job shares.)
    eventually_within(120, "the resumed job's session scored", async || {
        let s = status(&jobs, "pruned").await?;
        let lost = condition(&s, "Stalled") == Some(("True", "CrdOutdated"));
        anyhow::ensure!(!lost, "stalled as if a field were lost: {s:?}");
        Ok((s.sessions.succeeded == 1).then_some(()))
    })
    .await?;
    delete_jobs(&jobs).await?;
    kubelet.stop().await?;
    Ok(())
}

/// A RolloutJob CRD from before `status.untoldFailures` prunes the failures the operator has
/// still to tell the trainer from every status it writes: the round after one whose telling
/// failed would never tell it, and the trainer would finish without it. Every job stalls
/// before its first write, naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crd_without_the_status_the_operator_reads_back_stalls_jobs_before_any_write(
) -> Result<()> {
    let private = floe_tests::cluster::PrivateCluster::start()?;
    let cluster = &private.cluster;
    let client = cluster.client().await?;
    cluster
        .install_crds_edited(&client, |crd| {
            if crd.spec.names.kind != "RolloutJob" {
                return Ok(());
            }
            remove_status_field(crd, "untoldFailures")
        })
        .await?;
    let ns = floe_tests::namespace::TestNamespace::create(cluster, &client, "oldstatus").await?;
    let _operator = Operator::start_on(cluster, "floe:test", &ns.name, &[], &[])?;
    let jobs: Api<RolloutJob> = Api::namespaced(client.clone(), &ns.name);
    jobs.create(&PostParams::default(), &job("told", &["a"], 1, json!({}))?)
        .await?;
    let notes = stalled_for(&client, &jobs, &ns.name, "told", "CrdOutdated").await?;
    assert!(
        notes
            .iter()
            .any(|n| n.contains("status.untoldFailures") && n.contains("floe crds | kubectl apply")),
        "{notes:?}"
    );
    Ok(())
}

/// A CRD from before `status.<field>`: the field gone from every version's status schema.
fn remove_status_field(
    crd: &mut k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    field: &str,
) -> Result<()> {
    for version in &mut crd.spec.versions {
        let status = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
            .and_then(|s| s.properties.as_mut())
            .and_then(|p| p.get_mut("status"))
            .and_then(|s| s.properties.as_mut())
            .context("the CRD's status schema")?;
        anyhow::ensure!(status.remove(field).is_some(), "no status.{field}");
    }
    Ok(())
}

/// Remove every key `name` from a JSON document, however deep (a CRD's property, the defaults
/// that name it); and every CEL rule whose text names it. Whether any was there.
fn strip_field(v: &mut Value, name: &str) -> bool {
    match v {
        Value::Object(map) => {
            let mut found = map.remove(name).is_some();
            if let Some(Value::Array(rules)) = map.get_mut("x-kubernetes-validations") {
                let before = rules.len();
                rules.retain(|r| !r["rule"].as_str().is_some_and(|t| t.contains(name)));
                found |= rules.len() != before;
            }
            for child in map.values_mut() {
                found |= strip_field(child, name);
            }
            found
        }
        Value::Array(items) => items
            .iter_mut()
            .fold(false, |found, i| strip_field(i, name) | found),
        _ => false,
    }
}

/// A job deleted and made again under its name (a GitOps tool re-creating what a TTL deleted,
/// `kubectl delete` then `apply`) meets the earlier job's collector pod and token Secret until
/// garbage collection deletes them (held here by a finalizer, as a slow collection would). It
/// took them as its own: its sessions went to the earlier collector, which garbage collection
/// then deleted, and the operator sent the earlier token (remembered by the job's name). Now it
/// deletes them, waits, and makes its own: its collector (really run here, its token read from
/// its Secret as a kubelet reads it) takes the job's finish with the new token. Objects an
/// orphaning delete left under its names stall it, saying which (its egress NetworkPolicy
/// last, as its claims are about to start); deleted, it goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_made_again_under_its_name_makes_its_own_pods_and_uses_its_own_token() -> Result<()> {
    let (client, ns) = with_crds("again").await?;
    let _operator = Operator::start(&ns.name, &[])?;
    let volume = tempfile::tempdir()?;
    let kubelet = FakeKubelet::start_with(
        client.clone(),
        &ns.name,
        22,
        Arc::new(|_: &Value| Verdict::Scored {
            exit: 0,
            reward: 1.0,
        }),
        NodeOptions {
            volumes: std::collections::HashMap::from([(
                "sft-data".to_string(),
                volume.path().to_path_buf(),
            )]),
            ..Default::default()
        },
    )?;
    create_pool(&client, &ns.name, "warm", 1).await?;
    let jobs: Api<RolloutJob> = Api::namespaced(client.clone(), &ns.name);
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), &ns.name);
    let services: Api<k8s_openapi::api::core::v1::Service> =
        Api::namespaced(client.clone(), &ns.name);
    // Each job writes its dataset (and its summary, once its finish is taken) under `path`.
    let again = |path: &str| -> Result<RolloutJob> {
        let mut j = job("again", &["a"], 1, json!({}))?;
        let mut sft = serde_json::to_value(&j.spec.sft)?;
        sft["output"]["path"] = path.into();
        j.spec.sft = serde_json::from_value(sft)?;
        Ok(j)
    };
    let summary_of = |path: &str| volume.path().join(path).join("summary.json");
    let token = async || -> Result<String> {
        let s = secrets.get("again-token").await?;
        let data = s.data.unwrap_or_default();
        let t = data.get("control-token").context("the job's token")?;
        Ok(String::from_utf8_lossy(&t.0).into_owned())
    };
    let gone = async |name: &str| -> Result<()> {
        eventually(&format!("job {name} gone"), async || {
            Ok(jobs.get_opt(name).await?.is_none().then_some(()))
        })
        .await
    };
    let reason_of = async |type_: &str| -> Result<(String, String)> {
        eventually(&format!("a {type_} condition"), async || {
            let s = status(&jobs, "again").await?;
            Ok(s.conditions
                .iter()
                .find(|c| c.type_ == type_ && c.status == "True")
                .map(|c| (c.reason.clone(), c.message.clone())))
        })
        .await
    };

    jobs.create(&PostParams::default(), &again("first")?)
        .await?;
    succeeded(&jobs, "again", 120).await?;
    eventually("the first job's summary", async || {
        Ok(summary_of("first").is_file().then_some(()))
    })
    .await?;
    let first_token = token().await?;

    // Garbage collection held back on the collector's Service and the token Secret (the
    // finished job's collector is gone: it stopped once it wrote the summary).
    let hold = json!({"metadata": {"finalizers": ["floe.test/hold"]}});
    services
        .patch(
            "again-dataset",
            &PatchParams::default(),
            &Patch::Merge(&hold),
        )
        .await?;
    secrets
        .patch("again-token", &PatchParams::default(), &Patch::Merge(&hold))
        .await?;
    jobs.delete("again", &DeleteParams::default()).await?;
    gone("again").await?;
    jobs.create(&PostParams::default(), &again("second")?)
        .await?;
    let (reason, message) = reason_of("Progressing").await?;
    assert_eq!(reason, "EarlierJobObjects", "{message}");
    assert!(message.contains("again-dataset"), "{message}");
    assert_eq!(
        kubelet.taken_count(),
        1,
        "no session before its own collector"
    );
    let release = json!({"metadata": {"finalizers": null}});
    services
        .patch(
            "again-dataset",
            &PatchParams::default(),
            &Patch::Merge(&release),
        )
        .await?;
    secrets
        .patch(
            "again-token",
            &PatchParams::default(),
            &Patch::Merge(&release),
        )
        .await?;
    let done = succeeded(&jobs, "again", 120).await?;
    assert_eq!((done.sessions.total, done.sessions.succeeded), (1, 1));
    assert_eq!(kubelet.taken_count(), 2);
    assert_ne!(token().await?, first_token, "the new job's own token");
    // Its finish, with its own token, taken by its own collector.
    eventually("the second job's summary", async || {
        Ok(summary_of("second").is_file().then_some(()))
    })
    .await?;

    // An orphaning delete leaves the collector's Service and the Secret with no owner at all.
    let orphan = DeleteParams {
        propagation_policy: Some(kube::api::PropagationPolicy::Orphan),
        ..DeleteParams::default()
    };
    jobs.delete("again", &orphan).await?;
    gone("again").await?;
    jobs.create(&PostParams::default(), &again("third")?)
        .await?;
    let (reason, message) = reason_of("Stalled").await?;
    assert_eq!(reason, "NameTaken", "{message}");
    assert!(message.contains("Service again-dataset"), "{message}");
    services
        .delete("again-dataset", &DeleteParams::default())
        .await?;
    secrets
        .delete("again-token", &DeleteParams::default())
        .await?;
    // The orphaned egress policy too: with no owner, it may be anyone's, so the job makes no
    // claim without its own policy until it is gone.
    let said = eventually("the egress policy's stall", async || {
        let s = status(&jobs, "again").await?;
        Ok(s.conditions
            .iter()
            .find(|c| c.type_ == "Stalled" && c.reason == "EgressPolicyNotOurs")
            .map(|c| c.message.clone()))
    })
    .await?;
    assert!(said.contains("again-job-egress"), "{said}");
    Api::<k8s_openapi::api::networking::v1::NetworkPolicy>::namespaced(client.clone(), &ns.name)
        .delete("again-job-egress", &DeleteParams::default())
        .await?;
    let done = succeeded(&jobs, "again", 120).await?;
    assert_eq!((done.sessions.total, done.sessions.succeeded), (1, 1));
    eventually("the third job's summary", async || {
        Ok(summary_of("third").is_file().then_some(()))
    })
    .await?;
    delete_jobs(&jobs).await?;
    kubelet.stop().await?;
    Ok(())
}

/// A finished job's spec edited (a kustomize patch or an image bump applied to every job in
/// Git): the edit is observed and changes nothing. `observedGeneration` stayed behind for
/// good, so Argo CD's health check and kstatus read the job as progressing for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_jobs_spec_edit_is_observed_and_changes_nothing() -> Result<()> {
    let (client, ns) = with_crds("edited").await?;
    let _operator = Operator::start(&ns.name, &[])?;
    let kubelet = scoring_node(&client, &ns.name, 23)?;
    create_pool(&client, &ns.name, "warm", 1).await?;
    let jobs: Api<RolloutJob> = Api::namespaced(client.clone(), &ns.name);
    jobs.create(
        &PostParams::default(),
        &job("edited", &["a"], 1, json!({}))?,
    )
    .await?;
    let done = succeeded(&jobs, "edited", 120).await?;
    let edited = jobs
        .patch(
            "edited",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"concurrency": 3}})),
        )
        .await?;
    let generation = edited.metadata.generation.context("generation")?;
    assert!(done.observed_generation < Some(generation));
    let seen = eventually("the edit observed", async || {
        let s = status(&jobs, "edited").await?;
        Ok((s.observed_generation == Some(generation)).then_some(s))
    })
    .await?;
    assert_eq!(seen.phase, Some(RolloutJobPhase::Succeeded));
    assert_eq!(seen.sessions, done.sessions);
    assert_eq!(seen.completion_time, done.completion_time);
    let notes = noted(&client, &ns.name, "FinishedSpecChanged").await?;
    assert!(
        notes.iter().any(|n| n.contains("changes nothing")),
        "{notes:?}"
    );
    assert_eq!(kubelet.taken_count(), 1);
    delete_jobs(&jobs).await?;
    kubelet.stop().await?;
    Ok(())
}

/// A train job's trainer has its config baked in when its pod is made, while each session's
/// assignment is built from the spec as it is: a GitOps commit that changed
/// `spec.sampling.temperature` had new sessions sample at the new temperature and the trainer
/// weigh them at the old. Such an edit stalls the job, naming the pod; restored, it goes on;
/// an edit of what is read each round (the fidelity check) does not stall it; an operator
/// upgraded to another digest material keeps the stall; the pod deleted, it is made again
/// from the new spec.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spec_edit_the_trainer_was_not_made_with_stalls_the_job_until_restored_or_remade(
) -> Result<()> {
    let (client, ns) = with_crds("drift").await?;
    let _operator = Operator::start(&ns.name, &[])?;
    let kubelet = scoring_node(&client, &ns.name, 24)?;
    create_pool(&client, &ns.name, "warm", 0).await?;
    let jobs: Api<RolloutJob> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let mut spec = job("drift", &["a"], 2, json!({}))?;
    spec.spec.sft = None;
    spec.spec.train = Some(serde_json::from_value(json!({
        "image": "floe-trainer:test", "model": "/models/m", "gpus": 0, "vllm": {"gpus": 0},
        "fidelityCheck": {"action": "Off"}}))?);
    jobs.create(&PostParams::default(), &spec).await?;
    let first = trainer_ip(&pods, "drift").await?;
    let made = pods.get("drift-trainer").await?;
    assert!(
        made.annotations().contains_key("floe.dev/spec-digest"),
        "{:?}",
        made.annotations()
    );
    let edit = async |patch: Value| -> Result<i64> {
        let j = jobs
            .patch("drift", &PatchParams::default(), &Patch::Merge(patch))
            .await?;
        j.metadata.generation.context("generation")
    };
    // Once the operator has seen `generation`: whether the job is stalled, and why.
    let seen = async |generation: i64| -> Result<Option<(String, String)>> {
        eventually("the edit observed", async || {
            let s = status(&jobs, "drift").await?;
            let stalled = s
                .conditions
                .iter()
                .find(|c| c.type_ == "Stalled" && c.status == "True")
                .map(|c| (c.reason.clone(), c.message.clone()));
            Ok((s.observed_generation >= Some(generation)).then_some(stalled))
        })
        .await
    };
    let stalled = seen(edit(json!({"spec": {"sampling": {"temperature": 0.7}}})).await?).await?;
    let (reason, message) = stalled.context("stalled by the temperature's edit")?;
    assert_eq!(reason, "OwnPodSpecChanged", "{message}");
    assert!(message.contains("drift-trainer"), "{message}");
    // Restored: it goes on.
    let back = seen(edit(json!({"spec": {"sampling": {"temperature": 1.0}}})).await?).await?;
    assert_eq!(back, None);
    // The fidelity check is read each round: free to change.
    let free = edit(json!({"spec": {"train": {"fidelityCheck": {"maxMismatch": 0.5}}}})).await?;
    assert_eq!(seen(free).await?, None);
    // Edited again, and the trainer pod deleted: made again from the new spec.
    let again = seen(edit(json!({"spec": {"sampling": {"temperature": 0.7}}})).await?).await?;
    assert!(again.is_some_and(|(r, _)| r == "OwnPodSpecChanged"));
    let marked = pods.get("drift-trainer").await?;
    assert!(
        marked.annotations().contains_key("floe.dev/spec-changed"),
        "{:?}",
        marked.annotations()
    );
    // An upgrade that builds pods otherwise (another digest material, as the pod's digest
    // of an earlier one reads) cannot tell whether the spec was restored: the stall stays,
    // even when another stall found first (here its pool deleted; an outdated CRD during the
    // upgrade itself) took the job's condition meanwhile.
    let pools: Api<GatewayPool> = Api::namespaced(client.clone(), &ns.name);
    pools.delete("warm", &DeleteParams::default()).await?;
    eventually("the job stalled for its pool", async || {
        let s = status(&jobs, "drift").await?;
        Ok((condition(&s, "Stalled") == Some(("True", "PoolNotFound"))).then_some(()))
    })
    .await?;
    let older =
        json!({"metadata": {"annotations": {"floe.dev/spec-digest": "0/0123456789abcdef"}}});
    pods.patch(
        "drift-trainer",
        &PatchParams::default(),
        &Patch::Merge(older),
    )
    .await?;
    create_pool(&client, &ns.name, "warm", 0).await?;
    eventually("the stall kept across the digest's material", async || {
        let s = status(&jobs, "drift").await?;
        let stalled = s
            .conditions
            .iter()
            .find(|c| c.type_ == "Stalled" && c.status == "True");
        let pod = pods.get("drift-trainer").await?;
        let digest = pod.annotations().get("floe.dev/spec-digest").cloned();
        anyhow::ensure!(
            stalled.is_some() && digest.as_deref() == Some("0/0123456789abcdef"),
            "the stall was lifted, the pod's digest recorded again: {digest:?}"
        );
        Ok(stalled
            .filter(|c| c.reason == "OwnPodSpecChanged" && c.message.contains("cannot tell"))
            .map(|_| ()))
    })
    .await?;
    pods.delete("drift-trainer", &DeleteParams::default())
        .await?;
    eventually("a new trainer pod, the job going on", async || {
        let pod = pods.get_opt("drift-trainer").await?;
        let remade = pod.is_some_and(|p| p.metadata.uid != made.metadata.uid);
        let s = status(&jobs, "drift").await?;
        Ok((remade && condition(&s, "Stalled").is_none_or(|(st, _)| st != "True")).then_some(()))
    })
    .await?;
    assert_ne!(trainer_ip(&pods, "drift").await?, first);
    delete_jobs(&jobs).await?;
    kubelet.stop().await?;
    Ok(())
}

/// A train job suspended after it started (Kueue preempts so, and gives its quota to another
/// job): once none of its sessions runs, its trainer pod ends and its GPUs go free; resumed,
/// the job makes it again (it goes on from its checkpoint). A trainer with no checkpoint
/// volume keeps running: its steps live only in the pod.
#[tokio::test]
async fn a_train_job_suspended_after_it_started_frees_its_trainer_and_makes_it_again_resumed(
) -> Result<()> {
    let (client, ns) = with_crds("preempted").await?;
    // The pod cache behind the apiserver (fault injection): a round after the trainer's delete
    // still sees it alive.
    let _operator =
        Operator::start_with_env(&ns.name, &[], &[("FLOE_FAULT_POD_WATCH_LAG_MS", "1500")])?;
    let kubelet = scoring_node(&client, &ns.name, 28)?;
    create_pool(&client, &ns.name, "warm", 0).await?;
    let jobs: Api<RolloutJob> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    for (name, checkpoint) in [
        ("kept", None),
        ("freed", Some(json!({"claimName": "freed-state"}))),
        ("stuck", Some(json!({"claimName": "stuck-state"}))),
    ] {
        let mut spec = job(name, &["a"], 2, json!({}))?;
        spec.spec.sft = None;
        let mut train = json!({
            "image": "floe-trainer:test", "model": "/models/m", "gpus": 0, "vllm": {"gpus": 0},
            "fidelityCheck": {"action": "Off"}});
        if let Some(c) = checkpoint {
            train["checkpoint"] = c;
        }
        spec.spec.train = Some(serde_json::from_value(train)?);
        jobs.create(&PostParams::default(), &spec).await?;
        trainer_ip(&pods, name).await?;
    }
    let made = pods.get("freed-trainer").await?;
    let suspend = async |name: &str, suspend: bool| -> Result<()> {
        let patch = json!({"spec": {"suspend": suspend}});
        jobs.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    };
    // One that cannot go on (a spec edit its trainer was not made with) is preempted too.
    let edit = json!({"spec": {"sampling": {"temperature": 0.7}}});
    jobs.patch("stuck", &PatchParams::default(), &Patch::Merge(&edit))
        .await?;
    eventually("the edited job stalled", async || {
        let s = status(&jobs, "stuck").await?;
        let stalled = condition(&s, "Stalled").is_some_and(|(st, _)| st == "True");
        Ok(stalled.then_some(()))
    })
    .await?;
    suspend("kept", true).await?;
    suspend("freed", true).await?;
    suspend("stuck", true).await?;
    eventually("the checkpointed trainers stopped", async || {
        let freed = pods.get_opt("freed-trainer").await?.is_none();
        let stuck = pods.get_opt("stuck-trainer").await?.is_none();
        Ok((freed && stuck).then_some(()))
    })
    .await?;
    let notes = noted(&client, &ns.name, "TrainerStopped").await?;
    assert!(
        notes
            .iter()
            .any(|n| n.contains("freed-trainer") && n.contains("freed-state")),
        "{notes:?}"
    );
    assert!(
        notes.iter().all(|n| !n.contains("kept-trainer")),
        "{notes:?}"
    );
    // Once: a round whose pod cache is behind the delete does not stop it (and say so) again.
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(client.clone(), &ns.name);
    let stopped: Vec<_> = events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("TrainerStopped"))
        .map(|e| (e.note.unwrap_or_default(), e.series.map(|s| s.count)))
        .collect();
    assert!(
        stopped.len() == 2 && stopped.iter().all(|(_, series)| series.is_none()),
        "{stopped:?}"
    );
    let s = status(&jobs, "freed").await?;
    assert_eq!(s.phase, Some(RolloutJobPhase::Suspended));
    // Without a checkpoint volume the trainer stays (suspended a while now, as long as the
    // other took to stop).
    let kept = pods.get("kept-trainer").await?;
    assert!(kept.metadata.deletion_timestamp.is_none());
    suspend("freed", false).await?;
    eventually("the trainer made again", async || {
        let pod = pods.get_opt("freed-trainer").await?;
        Ok(pod
            .filter(|p| p.metadata.uid != made.metadata.uid)
            .map(|_| ()))
    })
    .await?;
    delete_jobs(&jobs).await?;
    kubelet.stop().await?;
    Ok(())
}

/// A pod's assignment mark was lost (the operator stopped between the gateway's
/// acknowledgment and the mark's write) and what the assignment is made from changed since
/// (here the job's model-call timeout): the operator delivers again, and the pod's gateway,
/// running the session with what it was first given, answers 409 `AssignedDifferently`. That
/// is the session running: taken as delivered, said in an `AssignmentChanged` Event, the mark
/// written again. It used to be counted undelivered (an `AssignmentConflict`), and the running
/// session failed once its delivery had failed long enough.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_its_pod_runs_with_an_earlier_assignment_is_taken_as_delivered() -> Result<()> {
    let (client, ns) = with_crds("reassign").await?;
    let _operator = Operator::start(&ns.name, &[])?;
    let kubelet = FakeKubelet::start(
        client.clone(),
        &ns.name,
        71,
        Arc::new(|_: &Value| Verdict::Hang),
    )?;
    create_pool(&client, &ns.name, "warm", 1).await?;
    let jobs: Api<RolloutJob> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    jobs.create(
        &PostParams::default(),
        &job("reassign", &["a"], 1, json!({}))?,
    )
    .await?;
    let assigned = async || -> Result<Option<Pod>> {
        Ok(job_pods(&pods, "reassign")
            .await?
            .into_iter()
            .find(|p| p.annotations().contains_key("floe.dev/assigned")))
    };
    let pod = eventually("the session's pod marked assigned", assigned).await?;
    let name = pod.name_any();
    assert_eq!(kubelet.taken_count(), 1);
    let edited = jobs
        .patch(
            "reassign",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"timeouts": {"modelCallSeconds": 77}}})),
        )
        .await?
        .metadata
        .generation;
    eventually("the edit observed", async || {
        Ok((status(&jobs, "reassign").await?.observed_generation >= edited).then_some(()))
    })
    .await?;
    let lost = json!({"metadata": {"annotations": {"floe.dev/assigned": null}}});
    pods.patch(&name, &PatchParams::default(), &Patch::Merge(lost))
        .await?;
    let notes = noted(&client, &ns.name, "AssignmentChanged").await?;
    assert!(notes.iter().any(|n| n.contains(&name)), "{notes:?}");
    eventually("the mark written again", assigned).await?;
    assert_eq!(
        event_notes(&client, &ns.name, "AssignmentConflict").await?,
        Vec::<String>::new()
    );
    let s = status(&jobs, "reassign").await?;
    assert_eq!((s.sessions.running, s.sessions.failed), (1, 0), "{s:?}");
    assert_eq!(kubelet.taken_count(), 1, "the session ran once");
    kubelet.stop().await?;
    delete_jobs(&jobs).await?;
    Ok(())
}

/// A pool's `gateway.controlPort` changed (in Git) after its pods were made: their gateways
/// still listen where they were made to, and a claim of one is delivered there (read from
/// the pod). Delivered to the pool's new port, the claims of those pods were never taken,
/// and the job ran for ever with no word of why. A gateway that never takes an assignment
/// at all (here: stopped once up, as for an operator that cannot reach the pods) fails its
/// session's attempt after `timeouts.podStartSeconds`, retried on another pod, then failed
/// with the reason, instead of holding the job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_are_delivered_where_the_pod_listens_and_never_held_undelivered_for_good(
) -> Result<()> {
    let (client, ns) = with_crds("deliver").await?;
    let _operator = Operator::start(&ns.name, &[])?;
    let scored = Arc::new(|_: &Value| Verdict::Scored {
        exit: 0,
        reward: 1.0,
    });
    let kubelet = FakeKubelet::start(client.clone(), &ns.name, 25, scored.clone())?;
    create_pool(&client, &ns.name, "warm", 1).await?;
    let pools: Api<GatewayPool> = Api::namespaced(client.clone(), &ns.name);
    pool_ready(&pools, "warm", 1, 60).await?;
    let moved = json!({"spec": {"gateway": {"controlPort": 9555}}});
    pools
        .patch("warm", &PatchParams::default(), &Patch::Merge(&moved))
        .await?;
    let jobs: Api<RolloutJob> = Api::namespaced(client.clone(), &ns.name);
    jobs.create(&PostParams::default(), &job("moved", &["a"], 1, json!({}))?)
        .await?;
    let done = succeeded(&jobs, "moved", 120).await?;
    assert_eq!((done.sessions.succeeded, done.sessions.retried), (1, 0));
    delete_jobs(&jobs).await?;
    kubelet.stop().await?;

    let (client, ns) = with_crds("undelivered").await?;
    let _operator = Operator::start(&ns.name, &[])?;
    let kubelet = FakeKubelet::start_with(
        client.clone(),
        &ns.name,
        26,
        scored,
        NodeOptions {
            dead_gateways: true,
            ..Default::default()
        },
    )?;
    create_pool(&client, &ns.name, "warm", 2).await?;
    let jobs: Api<RolloutJob> = Api::namespaced(client.clone(), &ns.name);
    jobs.create(
        &PostParams::default(),
        &job(
            "unheard",
            &["a"],
            1,
            json!({"backoffLimit": 1, "timeouts": {"podStartSeconds": 10}}),
        )?,
    )
    .await?;
    let failed = eventually_within(120, "the job failed", async || {
        let s = status(&jobs, "unheard").await?;
        Ok((s.phase == Some(RolloutJobPhase::Failed)).then_some(s))
    })
    .await?;
    assert_eq!((failed.sessions.failed, failed.sessions.retried), (1, 1));
    let told =
        |n: &String| n.contains("its gateway did not take the session's assignment within 10s");
    let retried = noted(&client, &ns.name, "SessionRetried").await?;
    assert!(retried.iter().any(told), "{retried:?}");
    let ended = noted(&client, &ns.name, "SessionFailed").await?;
    assert!(ended.iter().any(told), "{ended:?}");
    assert_eq!(kubelet.taken_count(), 0);
    delete_jobs(&jobs).await?;
    kubelet.stop().await?;
    Ok(())
}
