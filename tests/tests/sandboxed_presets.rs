//! The legitimate path inside local mode's sandbox: every harness preset (Codex, Claude Code,
//! Qwen Code, Gemini CLI, Pi), unmodified from npm, run by `floe run` in bubblewrap — its own
//! network namespace with only the relay to the gateway, the host read-only, `/tmp` its own —
//! fixes the toy bug with its own shell tool (the scripted upstream drives it) and scores 1.
//! What the sandbox refuses is `hostile_agent.rs`'s part.

use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};
use floe_tests::toy_task::{BUGGY, FIX, HIDDEN_TEST};
use floe_tests::{floe_bin, harness_bin_dir, wait_child, ScriptedUpstream, Step};
use serde_json::{json, Value};

async fn preset_fixes_the_bug_in_the_sandbox(preset: &str, harness: Value) -> Result<()> {
    let bin = harness_bin_dir(preset)?;
    let model = ScriptedUpstream::start(vec![
        Step::Shell(FIX.into()),
        Step::Say("Fixed add().".into()),
    ])
    .await?;
    let dir = tempfile::tempdir()?;
    let out = dir.path().join("out");
    let job = dir.path().join("job.yaml");
    let job_name = format!("sandboxed-{preset}");
    std::fs::write(
        &job,
        serde_json::to_string_pretty(&json!({
            "apiVersion": "floe.dev/v1alpha1",
            "kind": "RolloutJob",
            "metadata": {"name": job_name},
            "spec": {
                "numSamples": 1,
                "poolRef": {"name": "local"},
                "harness": harness,
                "evaluator": {"command": ["python3", "test_hidden.py"], "protectedPaths": ["test_*.py"]},
                "timeouts": {"agentSeconds": 240, "evaluatorSeconds": 30},
                "sampling": {"maxResponseTokens": 256},
                "sft": {"upstream": {"url": model.url}, "output": {"claimName": "unused"}},
                "tasks": {"inline": [{
                    "id": "fix-add",
                    "instruction": "calc.py has a bug: add() subtracts. Fix it.",
                    "files": {"calc.py": BUGGY},
                    "evaluation": {"hiddenFiles": {"test_hidden.py": HIDDEN_TEST}},
                }]},
            },
        }))?,
    )?;
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut child = Command::new(floe_bin()?)
        .arg("run")
        .arg(&job)
        .arg("--out")
        .arg(&out)
        .env("PATH", path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()?;
    let status = wait_child(&mut child, Duration::from_secs(300)).await?;
    let summary: Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("summary.json")).context("summary.json")?,
    )?;
    let logs = || {
        let state = out.join(format!("sessions/{job_name}-fix-add-0/state/logs"));
        std::fs::read_to_string(state.join("harness.stderr")).unwrap_or_default()
    };
    assert_eq!(status.code(), Some(0), "{preset}: {summary}\n{}", logs());
    assert!(
        summary["sandbox"]
            .as_str()
            .is_some_and(|s| s.starts_with("bubblewrap")),
        "{summary}"
    );
    assert_eq!(
        summary["reward"]["passRate"],
        1.0,
        "{preset} did not fix the bug in the sandbox: {summary}\n{}",
        logs()
    );
    assert!(
        summary["tokens"]["completions"].as_u64() >= Some(2),
        "{summary}"
    );
    // The shell's output reaches the model as the text it is, whatever the harness's API
    // wraps it in (Gemini CLI's `{"output": …}` was passed on as one escaped JSON line).
    let tool_results = model.tool_results();
    assert!(
        !tool_results.is_empty(),
        "{preset}: no tool result reached the model"
    );
    assert!(
        tool_results
            .iter()
            .all(|t| !t.as_str().is_some_and(|t| t.starts_with("{\"output\""))),
        "{preset}: {tool_results:?}"
    );
    Ok(())
}

#[tokio::test]
async fn codex_fixes_the_bug_in_the_sandbox() -> Result<()> {
    preset_fixes_the_bug_in_the_sandbox("codex", json!({"preset": "codex"})).await
}

#[tokio::test]
async fn claude_code_fixes_the_bug_in_the_sandbox() -> Result<()> {
    preset_fixes_the_bug_in_the_sandbox("claude-code", json!({"preset": "claude-code"})).await
}

#[tokio::test]
async fn qwen_code_fixes_the_bug_in_the_sandbox() -> Result<()> {
    preset_fixes_the_bug_in_the_sandbox("qwen-code", json!({"preset": "qwen-code"})).await
}

#[tokio::test]
async fn gemini_cli_fixes_the_bug_in_the_sandbox() -> Result<()> {
    preset_fixes_the_bug_in_the_sandbox("gemini-cli", json!({"preset": "gemini-cli"})).await
}

#[tokio::test]
async fn pi_fixes_the_bug_in_the_sandbox() -> Result<()> {
    preset_fixes_the_bug_in_the_sandbox(
        "pi",
        json!({"preset": "pi", "api": "openai-chat", "settings": {"contextWindow": 200000}}),
    )
    .await
}

/// The relay (`floe sandbox-exec`, a real process here, outside bubblewrap) holds at most its
/// cap of connections from its sandbox at once: `floe run`'s gateway serves every session, and
/// an agent opening connections without end would otherwise take the slots its siblings' calls
/// need. The next connection waits, and is relayed once one ends.
#[tokio::test]
async fn the_relay_holds_no_more_connections_from_its_sandbox_than_its_cap() -> Result<()> {
    use tokio::io::AsyncReadExt;
    const CAP: usize = floe_sandbox::relay::MAX_CONNECTIONS;
    let dir = tempfile::tempdir()?;
    let socket = dir.path().join("gateway.sock");
    let gateway = tokio::net::UnixListener::bind(&socket)?;
    let relayed = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    {
        let relayed = relayed.clone();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = gateway.accept().await {
                relayed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                // Held until the sandbox's side ends, as a gateway holds a call.
                tokio::spawn(async move {
                    let mut sink = Vec::new();
                    let _ = conn.read_to_end(&mut sink).await;
                });
            }
        });
    }
    let listen = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let mut relay = tokio::process::Command::new(floe_bin()?)
        .args(["sandbox-exec", "--listen", &listen.to_string(), "--socket"])
        .arg(&socket)
        .args(["--", "sleep", "60"])
        .kill_on_drop(true)
        .spawn()
        .context("floe sandbox-exec")?;
    let mut held = Vec::new();
    for _ in 0..100 {
        if let Ok(c) = tokio::net::TcpStream::connect(listen).await {
            held.push(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    anyhow::ensure!(!held.is_empty(), "the relay never listened on {listen}");
    for _ in 1..CAP + 8 {
        held.push(tokio::net::TcpStream::connect(listen).await?);
    }
    let count = || relayed.load(std::sync::atomic::Ordering::SeqCst);
    let settled = |want: usize| async move {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while count() < want && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Past the cap, nothing more may come: give it time to.
        tokio::time::sleep(Duration::from_millis(500)).await;
        count()
    };
    assert_eq!(
        settled(CAP).await,
        CAP,
        "the relay passed more than its cap"
    );
    drop(held.swap_remove(0));
    assert_eq!(
        settled(CAP + 1).await,
        CAP + 1,
        "a waiting connection was not relayed once one ended"
    );
    relay.start_kill()?;
    let _ = relay.wait().await;
    Ok(())
}
