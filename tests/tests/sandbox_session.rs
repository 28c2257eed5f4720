//! Sandbox sessions end to end with real processes: `floe gateway` (the sidecar), `floe
//! sandbox` (the runner) and unmodified harnesses from npm, driven by the deterministic
//! scripted upstream so the agent's edits — and therefore the grade — are known in advance.

use anyhow::{Context, Result};
use floe_tests::toy_task::{check_tokens, default_evaluator, run_session, SessionRun, FIX, WRONG};
use floe_tests::{ScriptedUpstream, Step};
use serde_json::{json, Value};

fn pi() -> Value {
    json!({"preset": "pi", "api": "openai-chat", "settings": {"contextWindow": 200000}})
}

struct Outcome {
    exit: i32,
    summary: Value,
    trajectory: Option<Value>,
    upstream_calls: usize,
}

/// One whole session of the toy task, the scripted model playing `script`.
async fn session(name: &str, script: Vec<Step>, evaluator: Value) -> Result<Outcome> {
    session_with(name, &pi(), script, evaluator).await
}

async fn session_with(
    name: &str,
    harness: &Value,
    script: Vec<Step>,
    evaluator: Value,
) -> Result<Outcome> {
    let upstream = ScriptedUpstream::start(script).await?;
    let SessionRun {
        exit,
        summary,
        trajectory,
    } = run_session(name, harness, &upstream.url, &evaluator).await?;
    Ok(Outcome {
        exit,
        summary,
        trajectory,
        upstream_calls: upstream.calls(),
    })
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

/// A session past its budget (here one model call): the gateway refuses the harness's next
/// call, the harness stops, and the session is graded as it stands — scored and shipped, with
/// the calls it made. Never an infrastructure failure: an agent that could grow its session
/// until something gave way would turn a loss into a retry.
#[tokio::test]
async fn a_session_past_its_budget_is_graded_as_it_stands_not_retried() -> Result<()> {
    let upstream = ScriptedUpstream::start(vec![
        Step::Shell(FIX.into()),
        Step::Say("Fixed add().".into()),
    ])
    .await?;
    let SessionRun {
        exit,
        summary,
        trajectory,
    } = floe_tests::toy_task::run_session_edited(
        "budget-1",
        &pi(),
        &upstream.url,
        &default_evaluator(),
        |a| a["upstream"] = json!({"sessionBudget": {"calls": 1}}),
    )
    .await?;
    assert_ne!(exit, 3, "not an infrastructure failure: {summary}");
    assert_eq!(summary["reward"], 1.0, "{summary}");
    assert_eq!(summary["shipment"], "shipped", "{summary}");
    assert_eq!(
        upstream.calls(),
        1,
        "the second call never reached the model"
    );
    let t = trajectory.context("trajectory in the dataset")?;
    assert_eq!(
        (&t["trainable"], &t["stats"]["completions"]),
        (&json!(true), &json!(1))
    );
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

/// calc.py, unfixed, that rewrites the evaluator's log as the evaluator exits: the runner's
/// open log file (found through its parent's descriptors, as a pod's runner is the grader's
/// init and the evaluator runs as its user) gets "passed" for "failed", same length, once the
/// real summary is in it. One summary, no test reported both ways, no process left behind.
const LOG_REWRITE: &str = r#"import atexit, os, sys, time
def _rewrite():
    sys.stdout.flush()
    time.sleep(0.5)
    d = "/proc/%d/fd" % os.getppid()
    for fd in os.listdir(d):
        try:
            path = os.readlink(os.path.join(d, fd))
            if path.endswith("evaluator.stdout"):
                text = open(path).read()
                with open(path, "r+") as f:
                    f.write(text.replace("failed", "passed"))
        except OSError:
            pass
atexit.register(_rewrite)
def add(a, b):
    return a - b
"#;

#[tokio::test]
async fn a_verdict_is_read_off_the_pipe_not_from_a_log_the_code_under_test_rewrites() -> Result<()>
{
    // Graded from stdout: the hidden test's outcome in pytest's summary form.
    let evaluator = json!({
        "command": ["python3", "-c", "import runpy\ntry:\n    runpy.run_path('test_hidden.py')\n    print('1 passed in 0.01s')\nexcept AssertionError:\n    print('1 failed in 0.01s')\n"],
        "protectedPaths": ["test_*.py"],
        "reward": {"source": "TestOutput", "format": "PytestSummary"},
    });
    let plant = format!("cat > calc.py <<'EOF'\n{LOG_REWRITE}EOF");
    let run = session(
        "log-rewrite",
        vec![Step::Shell(plant), Step::Say("Fixed.".into())],
        evaluator.clone(),
    )
    .await?;
    assert_eq!(run.summary["reward"], 0.0, "{}", run.summary);
    // The same evaluator passes a real fix.
    let run = session(
        "log-honest",
        vec![Step::Shell(FIX.into()), Step::Say("Fixed.".into())],
        evaluator,
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

/// A pod's session whose model server fails: the gateway process retries the 500s, the calls
/// still fail, Pi gives up and the evaluator even passes on the untouched workspace's files —
/// and still the runner reports an infrastructure failure (exit 3, what the operator retries),
/// never a reward, with the failures counted by kind.
#[tokio::test]
async fn a_failing_model_server_is_an_infrastructure_failure_of_the_pod_never_a_reward(
) -> Result<()> {
    let upstream = ScriptedUpstream::start(vec![Step::Say("never answered".into())]).await?;
    let proxy = floe_tests::FaultProxy::start(&upstream.url).await?;
    proxy.set(floe_tests::Fault::Status {
        status: 500,
        next: 1000,
    });
    let run = run_session("outage-1", &pi(), &proxy.url, &json!({"command": ["true"]})).await?;
    assert_eq!(run.exit, 3, "{}", run.summary);
    assert_eq!(run.summary["status"], "infra_error", "{}", run.summary);
    assert!(run.summary["reward"].is_null(), "{}", run.summary);
    let error = run.summary["error"].as_str().unwrap_or_default();
    assert!(error.contains("failed at the model server"), "{error}");
    let errors = &run.summary["upstreamErrors"];
    assert!(
        errors["retried"]["http_500"].as_u64() >= Some(2),
        "{errors}"
    );
    assert!(errors["failed"]["http_500"].as_u64() >= Some(1), "{errors}");
    let t = run.trajectory.context("the trajectory is kept")?;
    assert_eq!(
        (t["trainable"].as_bool(), t["reward"].is_null()),
        (Some(false), true)
    );
    assert_eq!(upstream.calls(), 0, "no call got through");
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

/// Why the presets set the harnesses' own stream guards to a day: they count the events their
/// SDK yields, and the gateway's keep-alive (an SSE comment, every 5 s) is none. Qwen Code told
/// to give up after 6 s of silence abandons a call its model server answers in 7 s, though a
/// keep-alive went out at 5 s, and samples it again: the session fails for a slow server. The
/// replies it gave up on are captured as abandoned and none is trained.
#[tokio::test]
async fn a_harness_stream_guard_does_not_count_the_gateways_keep_alive() -> Result<()> {
    let upstream = ScriptedUpstream::start(vec![
        Step::Shell(FIX.into()),
        Step::Say("Fixed add().".into()),
    ])
    .await?;
    let proxy = floe_tests::FaultProxy::start(&upstream.url).await?;
    proxy.set(floe_tests::Fault::Hang(std::time::Duration::from_secs(7)));
    let harness = json!({"preset": "qwen-code",
        "env": [{"name": "QWEN_STREAM_IDLE_TIMEOUT_MS", "value": "6000"}]});
    let run = run_session("guard-1", &harness, &proxy.url, &default_evaluator()).await?;
    assert_eq!(run.summary["reward"], 0.0, "{}", run.summary);
    assert!(
        proxy.calls() >= 2,
        "not sampled again: {} calls",
        proxy.calls()
    );
    let trajectory = run.trajectory.context("no trajectory")?;
    let stats = &trajectory["stats"];
    // The last call may still be at the model server when the trajectory is built.
    let abandoned = stats["abandoned_calls"].as_u64().unwrap_or(0);
    assert!(abandoned + 1 >= proxy.calls() as u64, "{stats}");
    assert_eq!(
        stats["completions"], 0,
        "a reply the harness gave up on trained: {stats}"
    );
    assert_eq!(trajectory["traces"], json!([]), "{stats}");
    assert_eq!(
        run.summary["abandonedCalls"], stats["abandoned_calls"],
        "{}",
        run.summary
    );
    Ok(())
}

/// The pod as the operator builds it: the gateway's own upstream is unusable, the operator
/// reaches the gateway on its separate control address, and the assignment names the upstream
/// (the job's trainer vLLM in train mode) and the job's sampling, which replace the harness's.
#[tokio::test]
async fn the_assignment_names_the_upstream_and_the_job_sampling() -> Result<()> {
    use floe_tests::toy_task::assignment;
    use floe_tests::{harness_bin_dir, spawn_sandbox, wait_child, GatewayProcess};
    let upstream =
        ScriptedUpstream::start(vec![Step::Shell(FIX.into()), Step::Say("Fixed.".into())]).await?;
    let root = tempfile::tempdir()?;
    let control_port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let control = format!("127.0.0.1:{control_port}");
    let gateway = GatewayProcess::start(
        &root.path().join("gw"),
        "http://upstream.invalid",
        &["--require-runner-ready", "--control-listen", &control],
    )
    .await?;
    let mut runner = spawn_sandbox(&gateway, root.path(), &[harness_bin_dir("pi")?])?;
    let mut a = assignment(
        "routed-1",
        &root.path().join("dataset"),
        &pi(),
        &default_evaluator(),
    );
    a["upstream"] =
        json!({"url": upstream.url, "maxResponseTokens": 77, "temperature": 0.25, "topP": 0.5});
    gateway.assign_at(&format!("http://{control}"), &a).await?;
    let status = wait_child(&mut runner, std::time::Duration::from_secs(120)).await?;
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(root.path().join("summary.json"))?)?;
    assert_eq!(status.code(), Some(0), "{summary}");
    assert_eq!(summary["reward"], 1.0);
    let requests = upstream.requests();
    assert_eq!(requests.len(), 2);
    for r in &requests {
        assert_eq!(r["temperature"], 0.25);
        assert_eq!(r["top_p"], 0.5);
        assert!(
            r["max_tokens"].as_u64().is_some_and(|m| m <= 77),
            "{}",
            r["max_tokens"]
        );
    }
    Ok(())
}
