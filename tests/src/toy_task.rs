//! The toy task used by the sandbox end-to-end tests (fix `add()` in `calc.py`; graded by a
//! hidden test) and one whole sandbox session as a pod would run it: real `floe gateway` and
//! `floe sandbox` processes and an unmodified harness from npm, against any upstream. The
//! caller plays the operator: it posts the assignment and reads the termination summary.
//! Trajectories land in a dataset directory (the SFT sink).

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::{json, Value};

use crate::processes::{harness_bin_dir, spawn_sandbox, wait_child, GatewayProcess};

pub const BUGGY: &str = "def add(a, b):\n    return a - b\n";
/// A shell command that fixes the bug.
pub const FIX: &str = "printf 'def add(a, b):\\n    return a + b\\n' > calc.py";
/// A shell command that "fixes" it wrongly.
pub const WRONG: &str = "printf 'def add(a, b):\\n    return a * b\\n' > calc.py";
pub const HIDDEN_TEST: &str = "from calc import add\nassert add(2, 3) == 5\nassert add(-1, 1) == 0\nprint('hidden tests passed')\n";

/// The assignment the operator would post for the toy task.
pub fn assignment(session: &str, dataset: &Path, harness: &Value, evaluator: &Value) -> Value {
    json!({
        "session": session, "task": "fix-add", "group": "job-1/fix-add", "sample": 0,
        "builder": "prefix_merging",
        "sink": {"kind": "dataset", "dir": dataset},
        "run": {
            "task": {
                "id": "fix-add",
                "instruction": "calc.py has a bug: add() subtracts. Fix it.",
                "files": {"calc.py": BUGGY, "test_visible.py": "from calc import add\nassert add(1, 1) == 2\n"},
                "evaluation": {"hiddenFiles": {"test_hidden.py": HIDDEN_TEST}},
            },
            "harness": harness,
            "evaluator": evaluator,
            "timeouts": {"agentSeconds": 120, "evaluatorSeconds": 30},
            "maxResponseTokens": 256,
        },
    })
}

/// Runs the hidden test; the visible test and any conftest are protected.
pub fn default_evaluator() -> Value {
    json!({"command": ["python3", "test_hidden.py"], "protectedPaths": ["test_*.py", "**/conftest.py"]})
}

/// What the operator and the dataset see after a session.
pub struct SessionRun {
    pub exit: i32,
    pub summary: Value,
    pub trajectory: Option<Value>,
}

/// One whole session of the toy task with `harness` against `upstream_url`.
pub async fn run_session(
    name: &str,
    harness: &Value,
    upstream_url: &str,
    evaluator: &Value,
) -> Result<SessionRun> {
    run_session_to(name, harness, upstream_url, evaluator, None).await
}

/// [`run_session`] shipping to `sink` instead of a dataset directory (`trajectory` is then
/// `None`: it went to the sink).
pub async fn run_session_to(
    name: &str,
    harness: &Value,
    upstream_url: &str,
    evaluator: &Value,
    sink: Option<Value>,
) -> Result<SessionRun> {
    run_session_edited(name, harness, upstream_url, evaluator, |a| {
        if let Some(sink) = sink {
            a["sink"] = sink;
        }
    })
    .await
}

/// [`run_session`] with the assignment as `edit` leaves it (the operator's other settings:
/// the session's upstream override, its sink).
pub async fn run_session_edited(
    name: &str,
    harness: &Value,
    upstream_url: &str,
    evaluator: &Value,
    edit: impl FnOnce(&mut Value),
) -> Result<SessionRun> {
    let preset = harness["preset"].as_str().context("preset")?;
    let bin = harness_bin_dir(preset)?;
    // FLOE_TEST_KEEP=1 keeps the sandbox's state (harness logs, evaluation copy).
    let (root, _cleanup) = crate::scratch_dir(name)?;
    let dataset = root.join("dataset");
    let gateway = GatewayProcess::start(
        &root.join("gw"),
        upstream_url,
        &["--require-runner-ready", "--max-response-tokens", "256"],
    )
    .await?;
    anyhow::ensure!(!gateway.ready().await, "ready before the runner prepared");
    let mut runner = spawn_sandbox(&gateway, &root, &[bin])?;
    // A debug build's runner can take seconds to prepare on a busy machine.
    crate::operator::eventually_every(
        Duration::from_millis(50),
        30,
        "the runner to report ready",
        async || Ok(gateway.ready().await.then_some(())),
    )
    .await?;
    let mut assigned = assignment(name, &dataset, harness, evaluator);
    edit(&mut assigned);
    gateway.assign(&assigned).await?;
    let status = wait_child(&mut runner, Duration::from_secs(240)).await?;
    let log = std::fs::read_to_string(root.join("sandbox.log")).unwrap_or_default();
    let summary: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("summary.json"))
            .with_context(|| format!("no summary; runner log:\n{log}"))?,
    )?;
    let find =
        |sub: &str| std::fs::read_to_string(dataset.join(sub).join(format!("{name}.json"))).ok();
    let trajectory = find("accepted")
        .or_else(|| find("rejected"))
        .map(|t| serde_json::from_str(&t))
        .transpose()?;
    eprintln!("{name}: exit {:?}, summary {summary}", status.code());
    Ok(SessionRun {
        exit: status.code().unwrap_or(-1),
        summary,
        trajectory,
    })
}

/// Every trace has prompt and response tokens with aligned masks and logprobs.
pub fn check_tokens(trajectory: &Value) {
    let traces = trajectory["traces"].as_array().expect("traces");
    assert!(!traces.is_empty());
    for t in traces {
        let n = t["response_token_ids"].as_array().map_or(0, Vec::len);
        assert!(
            n > 0
                && t["prompt_token_ids"]
                    .as_array()
                    .is_some_and(|p| !p.is_empty())
        );
        assert_eq!(t["loss_mask"].as_array().map(Vec::len), Some(n));
        assert_eq!(t["logprobs"].as_array().map(Vec::len), Some(n));
    }
}
