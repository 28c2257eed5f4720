//! One sandbox session per harness preset against the real vLLM on CPU: real `floe gateway`,
//! `floe sandbox` and the unmodified harness from npm. Harness prompts are 5k-20k tokens, so
//! the model is the long-context tiny Qwen3 (random weights, real Qwen3 tokenizer and chat
//! template): it will not fix the bug, so each session must complete, be graded 0 by the
//! hidden test, and ship a trainable trajectory whose tokens are the ones vLLM sampled.

use anyhow::{Context, Result};
use floe_tests::toy_task::{check_tokens, default_evaluator, run_session};
use floe_tests::vllm_long;
use serde_json::{json, Value};

/// Runs the session and checks it; returns its trajectory.
async fn preset_session(preset: &str, harness: Value) -> Result<Value> {
    let name = format!("vllm-{preset}");
    let run = run_session(&name, &harness, &vllm_long().url, &default_evaluator()).await?;
    // The harness may exit non-zero on nonsense (1 = agent failure): either way it was scored.
    assert!(
        matches!(run.exit, 0 | 1),
        "{preset}: exit {} {}",
        run.exit,
        run.summary
    );
    assert_eq!(
        run.summary["shipment"], "shipped",
        "{preset}: {}",
        run.summary
    );
    assert_eq!(run.summary["reward"], 0.0, "{preset}: {}", run.summary);
    let t = run.trajectory.context("trajectory")?;
    assert_eq!(t["trainable"], true);
    assert_eq!(t["reward"], 0.0);
    let calls = t["stats"]["completions"].as_u64().unwrap_or(0);
    assert!(calls >= 1, "{preset}: no model call captured");
    check_tokens(&t);
    // Harness prompts really are long: beyond SmolLM2's 8k for all but the leanest harness.
    let longest = t["traces"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|tr| tr["prompt_token_ids"].as_array().map(Vec::len))
        .max()
        .unwrap_or(0);
    eprintln!(
        "{preset} on real vLLM: exit {}, agent {:.1} s, {calls} calls, longest prompt {longest} tokens, {} sampled",
        run.exit,
        run.summary["agentSeconds"].as_f64().unwrap_or(0.0),
        t["stats"]["sampled_tokens"]
    );
    Ok(t)
}

#[tokio::test]
async fn codex_session_on_real_vllm() -> Result<()> {
    preset_session("codex", json!({"preset": "codex"})).await?;
    Ok(())
}

#[tokio::test]
async fn claude_code_session_on_real_vllm() -> Result<()> {
    let t = preset_session("claude-code", json!({"preset": "claude-code"})).await?;
    // The preset turns on Claude Code's request-class header: its own turns say `main`.
    let by_class = &t["stats"]["calls_by_class"];
    assert!(
        by_class["main"].as_u64().is_some_and(|n| n >= 1),
        "calls by class: {by_class}"
    );
    Ok(())
}

#[tokio::test]
async fn qwen_code_session_on_real_vllm() -> Result<()> {
    preset_session("qwen-code", json!({"preset": "qwen-code"})).await?;
    Ok(())
}

#[tokio::test]
async fn gemini_cli_session_on_real_vllm() -> Result<()> {
    preset_session("gemini-cli", json!({"preset": "gemini-cli"})).await?;
    Ok(())
}

#[tokio::test]
async fn pi_session_on_real_vllm() -> Result<()> {
    preset_session(
        "pi",
        json!({"preset": "pi", "settings": {"contextWindow": 40960}}),
    )
    .await?;
    Ok(())
}
