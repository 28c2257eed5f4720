//! The attacks on the grade of `tests/hostile_grading.rs`, in real pods: the agent runs them in
//! its container, the grader (its runner the container's init) grades them. Each session is
//! scored as the outcome table says, none is retried as infrastructure, and a straggler in the
//! grader voids its verdict.

use super::*;
use floe_tests::grading_attacks::{self, attacks};

/// The harness: one honest call, then the task's instruction as a shell script.
const SHELL_AGENT: &str = r#"
import json, os, urllib.request
body = {"model": "policy", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
req = urllib.request.Request(os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions",
                             data=json.dumps(body).encode(),
                             headers={"content-type": "application/json",
                                      "authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
urllib.request.urlopen(req, timeout=120).read()
os.execvp("sh", ["sh", "-c", os.environ["FLOE_INSTRUCTION"]])
"#;

/// The shell agent's ConfigMap, an operator, and a pool `python` of two pods that run it with
/// `disk_budget`.
async fn shell_agent_pool(work: &Work, disk_budget: &str) -> Result<Operator> {
    let (client, ns) = (&work.client, &work.ns.name);
    apply(
        client,
        ns,
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "shell-agent"},
               "data": {"agent.py": SHELL_AGENT}}),
    )
    .await?;
    let operator = Operator::start_on(&work.n.cluster, &work.images.floe, ns, &[], &[])?;
    let mut template = agent_template(&work.images.python, "shell-agent");
    template["diskBudget"] = disk_budget.into();
    apply(
        client,
        ns,
        json!({"apiVersion": "floe.dev/v1alpha1", "kind": "GatewayPool",
               "metadata": {"name": "python"},
               "spec": {"replicas": 2, "template": template}}),
    )
    .await?;
    Ok(operator)
}

/// The attacks whose effect a pod shows as local mode does (the sibling ones are the
/// containers' resources there).
const IN_PODS: &[&str] = &[
    "fix",
    "link-ancestor",
    "odd-name",
    "exit-before-verdict",
    "hang",
    "report-link",
    "straggler",
    "disk-fill",
    "held-open",
    "conftest",
    "stdlib-shadow",
];

/// Pod-only: the kubelet's termination-message file, writable for all in every container and
/// counted by no storage limit, filled past its 1 MiB limit by the agent after a fix, and by
/// its code under test in the grader (a correct `add`, the file filled at import). Each would
/// otherwise write the node's disk unbounded.
fn termination_log_tasks() -> Vec<(&'static str, String)> {
    vec![
        (
            "termlog",
            format!(
                "{} && dd if=/dev/zero of=/dev/termination-log bs=1M count=4 2>/dev/null; \
                 echo filled > filled.txt; sleep 50",
                grading_attacks::FIX
            ),
        ),
        (
            "eval-termlog",
            "cat > calc.py <<'EOF'\nimport time\nwith open('/dev/termination-log', 'wb') as f:\n    \
             f.write(bytes(4 << 20))\ntime.sleep(3)\ndef add(a, b):\n    return a + b\nEOF"
                .into(),
        ),
    ]
}

#[tokio::test]
async fn attacks_on_the_grade_in_real_pods_are_scored_never_retried() -> Result<()> {
    let work = prepare("grading").await?;
    let _operator = shell_agent_pool(&work, grading_attacks::DISK_BUDGET).await?;
    let (n, client, ns) = (work.n, work.client.clone(), work.ns.name.clone());
    let mut tasks = grading_attacks::tasks(IN_PODS);
    for (id, commands) in termination_log_tasks() {
        let mut task = tasks[0].clone();
        task["id"] = id.into();
        task["instruction"] = commands.into();
        tasks.push(task);
    }
    let sessions = tasks.len();
    let mut job = sft_job("grading", &ns, 1, "/grading", json!(tasks));
    job["spec"]["evaluator"] = grading_attacks::evaluator();
    // 20 s: an honest evaluator in a pod must finish on a node loaded by its siblings' disk
    // fills (at 5 s, `fix` once timed out in CI); `hang` sleeps 600 s.
    job["spec"]["timeouts"] = json!({"agentSeconds": 120, "evaluatorSeconds": 20});
    job["spec"]["backoffLimit"] = 0.into();
    job["spec"]["sft"]["minReward"] = 0.into();
    apply(&client, &ns, job).await?;
    let status = finished(n, &client, &ns, "grading").await?;
    assert_eq!(
        status.sessions.succeeded as usize, sessions,
        "every session scored, none failed as infrastructure: {status:?}"
    );
    let lines = dataset(&work.data.path().join("grading"), sessions).await?;
    for (task, _, reward, failure) in attacks()
        .into_iter()
        .filter(|(id, ..)| IN_PODS.contains(id))
    {
        let session = format!("grading-{task}-0");
        let t = lines
            .iter()
            .find(|t| t["session"] == session.as_str())
            .with_context(|| format!("no trajectory for {session}"))?;
        assert_eq!(t["reward"].as_f64(), Some(reward), "{task}: {t}");
        assert_eq!(
            t["evaluation"]["detail"]["failure"].as_str(),
            failure,
            "{task}: {}",
            t["evaluation"]
        );
    }
    // The termination log filled, in the agent's container and in the grader's: stopped at
    // its limit and scored 0, with or without a disk budget.
    for task in ["termlog", "eval-termlog"] {
        let t = lines
            .iter()
            .find(|t| t["session"] == format!("grading-{task}-0").as_str())
            .with_context(|| format!("no trajectory for {task}"))?;
        assert_eq!(t["reward"].as_f64(), Some(0.0), "{task}: {t}");
        let detail = &t["evaluation"]["detail"];
        assert_eq!(
            detail["failure"].as_str(),
            Some("disk_limit"),
            "{task}: {detail}"
        );
        assert!(
            detail["failureMessage"]
                .as_str()
                .is_some_and(|w| w.contains("/dev/termination-log")),
            "{task}: {detail}"
        );
    }
    // The file deleted but held open, which neither the grader's walk nor the kubelet sees,
    // counted by the agent container's supervisor.
    let held = lines
        .iter()
        .find(|t| t["session"] == "grading-held-open-0")
        .context("no trajectory for held-open")?;
    let why = held["evaluation"]["detail"]["failureMessage"].as_str();
    assert!(
        why.is_some_and(|w| w.contains("deleted but still open")),
        "{}",
        held["evaluation"]
    );

    // Code under test that slips a process of its own among the children of a two-step
    // evaluator's shell (`clone` with `CLONE_PARENT`), which reaps it unseen by the grader's
    // init: it rewrote the verdict of the step after. In a pod the init's scan for the run's
    // tag caught it once it outlived the shell (`evaluator_straggler`, measured), a race the
    // process can win; since session 85 the evaluator's filter refuses the `clone`, and the
    // session is the plain failure of its tests.
    let tasks = grading_attacks::sibling_tasks();
    let mut job = sft_job("sibling", &ns, 1, "/sibling", json!(tasks));
    job["spec"]["evaluator"] = grading_attacks::two_step_evaluator();
    job["spec"]["timeouts"] = json!({"agentSeconds": 120, "evaluatorSeconds": 20});
    job["spec"]["backoffLimit"] = 0.into();
    job["spec"]["sft"]["minReward"] = 0.into();
    apply(&client, &ns, job).await?;
    let status = finished(n, &client, &ns, "sibling").await?;
    assert_eq!(status.sessions.succeeded, 2, "{status:?}");
    let lines = dataset(&work.data.path().join("sibling"), 2).await?;
    for (task, reward) in [("fix", 1.0), ("sibling", 0.0)] {
        let t = lines
            .iter()
            .find(|t| t["session"] == format!("sibling-{task}-0").as_str())
            .with_context(|| format!("no trajectory for {task}"))?;
        assert_eq!(t["reward"].as_f64(), Some(reward), "{task}: {t}");
        assert!(
            t["evaluation"]["detail"]["failure"].is_null(),
            "{task}: {t}"
        );
    }
    Ok(())
}

/// An agent that fills its own container's layer (`/tmp`: no volume, no walk of the grader's
/// sees it) past its backstop, four times the pool's `diskBudget`: the real kubelet evicts the
/// pod for the agent container's `ephemeral-storage` limit, and the job fails that session at
/// once, naming the eviction, without a retry — while a sibling scores 1. Before, every
/// eviction was infrastructure (retried: another chance at a loss), and that layer unbounded.
/// So is code of the agent's that the evaluator runs filling the grader's own layer once the
/// agent ended (retried before session 81: this kubelet says nothing of an evicted pod's
/// containers, and only the operator's `floe.dev/agent-ended` mark tells that the agent ended).
#[tokio::test]
async fn an_agent_that_fills_its_own_layer_is_evicted_and_its_session_failed_not_retried(
) -> Result<()> {
    let work = prepare("evict").await?;
    // The backstop: 4 × 32Mi = 128Mi for the agent's own layer; the grader's room 16 × 32Mi =
    // 512Mi; the pod's sum 640Mi (the pod's other usage, its volumes' copy of floe among them,
    // is some 50MiB: a grader past its room by less than the rest is evicted for its own limit).
    let _operator = shell_agent_pool(&work, "32Mi").await?;
    let (n, client, ns) = (work.n, work.client.clone(), work.ns.name.clone());
    let fill = json!({"id": "fill-layer", "files": {"calc.py": grading_attacks::BUGGY},
        "instruction": "dd if=/dev/zero of=/tmp/fill bs=1M count=200 2>/dev/null; sleep 110",
        "evaluation": {"hiddenFiles": {"test_hidden.py": "from calc import add\nassert add(2, 3) == 5\n"}}});
    // Code under test that fills the grader's own layer when the evaluator imports it, after
    // the agent ended: past floe's room for the grader (512Mi) and well within the pod's sum,
    // the grader (container `sandbox`) is
    // evicted for its own limit, and that is the agent's doing: the operator's mark tells it,
    // since this kubelet's status of an evicted pod keeps no container statuses (before the
    // mark, retried as infrastructure).
    let fill_grader = json!({"id": "fill-grader", "files": {"calc.py": grading_attacks::BUGGY},
        "instruction": "printf '%s\\n' 'f = open(\"/tmp/fill\", \"wb\")' 'for _ in range(530): f.write(bytes(1 << 20))' 'f.flush()' 'import time; time.sleep(80)' 'def add(a, b): return a + b' > calc.py",
        "evaluation": {"hiddenFiles": {"test_hidden.py": "from calc import add\nassert add(2, 3) == 5\n"}}});
    let mut fix = fix_add();
    fix["instruction"] = grading_attacks::FIX.into();
    let mut job = sft_job("evict", &ns, 1, "/evict", json!([fix, fill, fill_grader]));
    // Time for the kubelet's checks (every 10 s) while the evaluator fills and waits.
    job["spec"]["timeouts"]["evaluatorSeconds"] = 90.into();
    job["spec"]["backoffLimit"] = 2.into();
    job["spec"]["sft"]["minReward"] = 0.into();
    apply(&client, &ns, job).await?;
    let status = finished(n, &client, &ns, "evict").await?;
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), &ns);
    let notes = |reason: &'static str| {
        let events = events.clone();
        async move {
            anyhow::Ok(
                events
                    .list(&ListParams::default())
                    .await?
                    .items
                    .into_iter()
                    .filter(|e| e.reason.as_deref() == Some(reason))
                    .filter_map(|e| e.note)
                    .collect::<Vec<String>>(),
            )
        }
    };
    // Events are published beside the status write, not before it.
    let failed = eventually_within(60, "two SessionFailed events", async || {
        let n = notes("SessionFailed").await?;
        Ok((n.len() >= 2).then_some(n))
    })
    .await
    .unwrap_or_default();
    let retried = notes("SessionRetried").await?;
    assert_eq!(
        (
            status.sessions.succeeded,
            status.sessions.failed,
            status.sessions.retried
        ),
        (1, 2, 0),
        "{status:?}\nretried: {retried:?}\nfailed: {failed:?}"
    );
    assert_eq!(status.failed_indexes.as_deref(), Some("1-2"));
    // The container's own check, or (written past it and the grader's room between two of
    // the kubelet's checks) the pod's sum of limits.
    let evicted_for = |failed: &str, container: &str| {
        failed.contains("as the agent's own doing")
            && (failed.contains(&format!(
                "Container {container} exceeded its local ephemeral storage limit"
            )) || failed.contains("exceeds the total limit of containers"))
    };
    assert!(
        failed.len() == 2
            && failed
                .iter()
                .any(|f| f.starts_with("session 1 (") && evicted_for(f, "agent"))
            && failed.iter().any(|f| {
                f.starts_with("session 2 (")
                    && f.contains("as the agent's own doing")
                    && f.contains("Container sandbox exceeded its local ephemeral storage limit")
            }),
        "{failed:?}"
    );
    Ok(())
}
