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
    "conftest",
];

#[tokio::test]
async fn attacks_on_the_grade_in_real_pods_are_scored_never_retried() -> Result<()> {
    let work = prepare("grading").await?;
    let (n, images, client, ns) = (
        work.n,
        work.images,
        work.client.clone(),
        work.ns.name.clone(),
    );
    apply(
        &client,
        &ns,
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "shell-agent"},
               "data": {"agent.py": SHELL_AGENT}}),
    )
    .await?;
    let _operator = Operator::start_on(&n.cluster, &images.floe, &ns, &[], &[])?;
    let mut template = agent_template(&images.python, "shell-agent");
    template["diskBudget"] = grading_attacks::DISK_BUDGET.into();
    apply(
        &client,
        &ns,
        json!({"apiVersion": "floe.dev/v1alpha1", "kind": "GatewayPool",
               "metadata": {"name": "python"},
               "spec": {"replicas": 2,
                        "template": template}}),
    )
    .await?;
    let mut job = sft_job(
        "grading",
        &ns,
        1,
        "/grading",
        json!(grading_attacks::tasks(IN_PODS)),
    );
    job["spec"]["evaluator"] = grading_attacks::evaluator();
    job["spec"]["timeouts"] = json!({"agentSeconds": 120, "evaluatorSeconds": 5});
    job["spec"]["backoffLimit"] = 0.into();
    job["spec"]["sft"]["minReward"] = 0.into();
    apply(&client, &ns, job).await?;
    let status = finished(n, &client, &ns, "grading").await?;
    assert_eq!(
        status.sessions.succeeded as usize,
        IN_PODS.len(),
        "every session scored, none failed as infrastructure: {status:?}"
    );
    let lines = dataset(&work.data.path().join("grading"), IN_PODS.len()).await?;
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
    Ok(())
}
