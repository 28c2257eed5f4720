//! Sandbox sessions end to end with real processes: `floe gateway` (the sidecar), `floe
//! sandbox` (the runner) and an unmodified harness from npm (Pi), driven by the deterministic
//! scripted upstream so the agent's edits — and therefore the grade — are known in advance.
//! The test plays the operator: it posts the assignment to the gateway's control API and reads
//! the termination summary. Trajectories land in a dataset directory (the SFT sink).

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use floe_tests::{
    harness_bin_dir, spawn_sandbox, wait_child, GatewayProcess, ScriptedUpstream, Step,
};
use serde_json::{json, Value};

const BUGGY: &str = "def add(a, b):\n    return a - b\n";
const FIX: &str = "printf 'def add(a, b):\\n    return a + b\\n' > calc.py";
const WRONG: &str = "printf 'def add(a, b):\\n    return a * b\\n' > calc.py";
const HIDDEN_TEST: &str = "from calc import add\nassert add(2, 3) == 5\nassert add(-1, 1) == 0\nprint('hidden tests passed')\n";

fn pi() -> Value {
    json!({"preset": "pi", "api": "openai-chat", "settings": {"contextWindow": 200000}})
}

fn assignment(session: &str, dataset: &Path, harness: &Value, evaluator: Value) -> Value {
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

fn default_evaluator() -> Value {
    json!({"command": ["python3", "test_hidden.py"], "protectedPaths": ["test_*.py", "**/conftest.py"]})
}

struct Outcome {
    exit: i32,
    summary: Value,
    trajectory: Option<Value>,
    upstream_calls: usize,
}

/// One whole session: scripted model, real gateway + runner + Pi; returns what the operator
/// and the dataset would see.
async fn session(name: &str, script: Vec<Step>, evaluator: Value) -> Result<Outcome> {
    session_with(name, &pi(), script, evaluator).await
}

async fn session_with(
    name: &str,
    harness: &Value,
    script: Vec<Step>,
    evaluator: Value,
) -> Result<Outcome> {
    let preset = harness["preset"].as_str().context("preset")?;
    let bin = harness_bin_dir(preset)?;
    let upstream = ScriptedUpstream::start(script).await?;
    let tmp = tempfile::tempdir()?;
    // FLOE_TEST_KEEP=1 keeps the sandbox's state (harness logs, evaluation copy).
    let (root, _cleanup) = if std::env::var_os("FLOE_TEST_KEEP").is_some() {
        let kept = tmp.keep();
        eprintln!("{name}: keeping {}", kept.display());
        (kept, None)
    } else {
        (tmp.path().to_path_buf(), Some(tmp))
    };
    let dataset = root.join("dataset");
    let gateway =
        GatewayProcess::start(&root.join("gw"), &upstream.url, &["--require-runner-ready"]).await?;
    anyhow::ensure!(!gateway.ready().await, "ready before the runner prepared");
    let mut runner = spawn_sandbox(&gateway, &root, &[bin])?;
    for _ in 0..100 {
        if gateway.ready().await {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    anyhow::ensure!(gateway.ready().await, "the runner never reported ready");
    gateway
        .assign(&assignment(name, &dataset, harness, evaluator))
        .await?;
    let status = wait_child(&mut runner, Duration::from_secs(240)).await?;
    let log = std::fs::read_to_string(&root.join("sandbox.log")).unwrap_or_default();
    let summary: Value = serde_json::from_str(
        &std::fs::read_to_string(&root.join("summary.json"))
            .with_context(|| format!("no summary; runner log:\n{log}"))?,
    )?;
    let find =
        |sub: &str| std::fs::read_to_string(dataset.join(sub).join(format!("{name}.json"))).ok();
    let trajectory = find("accepted")
        .or_else(|| find("rejected"))
        .map(|t| serde_json::from_str(&t))
        .transpose()?;
    eprintln!("{name}: exit {:?}, summary {summary}", status.code());
    Ok(Outcome {
        exit: status.code().unwrap_or(-1),
        summary,
        trajectory,
        upstream_calls: upstream.calls(),
    })
}

fn check_tokens(trajectory: &Value) {
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

#[tokio::test]
async fn a_correct_edit_passes_the_hidden_tests_and_ships_reward_1() -> Result<()> {
    let run = session(
        "fix-1",
        vec![Step::Shell(FIX.into()), Step::Say("Fixed add().".into())],
        default_evaluator(),
    )
    .await?;
    assert_eq!(run.exit, 0, "{}", run.summary);
    assert_eq!(run.summary["status"], "completed");
    assert_eq!(run.summary["reward"], 1.0);
    assert_eq!(run.summary["passed"], true);
    assert_eq!(run.summary["shipment"], "shipped");
    let t = run.trajectory.context("trajectory in the dataset")?;
    assert_eq!(t["reward"], 1.0);
    assert_eq!(t["trainable"], true);
    assert_eq!(t["group"], "job-1/fix-add");
    // Pi made both scripted calls (tool call, then the final answer), all captured.
    assert_eq!(run.upstream_calls, 2);
    assert_eq!(t["stats"]["completions"], 2);
    assert_eq!(run.summary["completions"], 2);
    check_tokens(&t);
    Ok(())
}

#[tokio::test]
async fn a_wrong_edit_fails_the_hidden_tests_and_ships_reward_0() -> Result<()> {
    let run = session(
        "wrong-1",
        vec![Step::Shell(WRONG.into()), Step::Say("Done.".into())],
        default_evaluator(),
    )
    .await?;
    assert_eq!(
        run.exit, 0,
        "a scored session is a success for the runner: {}",
        run.summary
    );
    assert_eq!(run.summary["reward"], 0.0);
    assert_eq!(run.summary["passed"], false);
    let t = run.trajectory.context("trajectory")?;
    assert_eq!(
        (t["reward"].as_f64(), t["trainable"].as_bool()),
        (Some(0.0), Some(true))
    );
    check_tokens(&t);
    Ok(())
}

#[tokio::test]
async fn tampering_with_tests_cannot_change_the_grade() -> Result<()> {
    // Wrong code, plus every trick: gut the visible test, plant a fake hidden test, plant a
    // conftest. The grade stays 0.
    let tamper = format!(
        "{WRONG} && echo pass > test_visible.py && echo 'print(\"fake pass\")' > test_hidden.py && echo 'import sys; sys.exit(0)' > conftest.py"
    );
    let run = session(
        "tamper-1",
        vec![Step::Shell(tamper), Step::Say("All tests pass.".into())],
        default_evaluator(),
    )
    .await?;
    assert_eq!(run.summary["reward"], 0.0, "{}", run.summary);
    let t = run.trajectory.context("trajectory")?;
    let discarded = &t["evaluation"]["detail"]["changes"]["discarded"];
    assert_eq!(
        discarded,
        &json!(["conftest.py", "test_hidden.py", "test_visible.py"])
    );
    // And the right fix still passes when the agent also deletes the visible test.
    let run = session(
        "fix-and-delete",
        vec![
            Step::Shell(format!("{FIX} && rm test_visible.py")),
            Step::Say("ok".into()),
        ],
        default_evaluator(),
    )
    .await?;
    assert_eq!(run.summary["reward"], 1.0, "{}", run.summary);
    Ok(())
}

#[tokio::test]
async fn a_broken_evaluator_is_an_infrastructure_failure_never_reward_0() -> Result<()> {
    let run = session(
        "broken-eval",
        vec![Step::Shell(FIX.into()), Step::Say("ok".into())],
        json!({"command": ["/nonexistent/grader"]}),
    )
    .await?;
    assert_eq!(run.exit, 3, "{}", run.summary);
    assert_eq!(run.summary["status"], "infra_error");
    assert!(run.summary["reward"].is_null());
    // The captured calls still ship — untrainable, in the dataset's rejected side.
    let t = run.trajectory.context("trajectory kept")?;
    assert_eq!(t["trainable"], false);
    assert!(t["reward"].is_null());
    assert_eq!(t["stats"]["completions"], 2);
    Ok(())
}

/// The full agent loop through each preset: the harness gets the scripted fix as a call to
/// its own shell tool, runs it, sends the result back, and the hidden tests pass.
async fn preset_fixes_the_bug(preset: &str, harness: Value) -> Result<()> {
    let name = format!("preset-{preset}");
    let run = session_with(
        &name,
        &harness,
        vec![Step::Shell(FIX.into()), Step::Say("Fixed add().".into())],
        default_evaluator(),
    )
    .await?;
    assert_eq!(run.exit, 0, "{preset}: {}", run.summary);
    assert_eq!(run.summary["reward"], 1.0, "{preset}: {}", run.summary);
    let t = run.trajectory.context("trajectory")?;
    assert_eq!(t["trainable"], true);
    assert!(
        t["stats"]["completions"].as_u64().is_some_and(|n| n >= 2),
        "{preset}: {}",
        t["stats"]
    );
    check_tokens(&t);
    eprintln!(
        "{preset}: agent {:.1} s, {} calls, {} upstream calls",
        run.summary["agentSeconds"].as_f64().unwrap_or(0.0),
        t["stats"]["completions"],
        run.upstream_calls
    );
    Ok(())
}

#[tokio::test]
async fn codex_preset_fixes_the_bug() -> Result<()> {
    preset_fixes_the_bug("codex", json!({"preset": "codex"})).await
}

#[tokio::test]
async fn claude_code_preset_fixes_the_bug() -> Result<()> {
    preset_fixes_the_bug("claude-code", json!({"preset": "claude-code"})).await
}

#[tokio::test]
async fn qwen_code_preset_fixes_the_bug() -> Result<()> {
    preset_fixes_the_bug("qwen-code", json!({"preset": "qwen-code"})).await
}

#[tokio::test]
async fn gemini_cli_preset_fixes_the_bug() -> Result<()> {
    preset_fixes_the_bug("gemini-cli", json!({"preset": "gemini-cli"})).await
}

#[tokio::test]
async fn pi_preset_fixes_the_bug_over_each_api() -> Result<()> {
    for api in ["anthropic", "openai-responses", "gemini"] {
        preset_fixes_the_bug(
            "pi",
            json!({"preset": "pi", "api": api, "settings": {"contextWindow": 200000}}),
        )
        .await
        .with_context(|| format!("pi over {api}"))?;
    }
    Ok(())
}
