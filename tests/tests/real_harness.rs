//! Real, unmodified coding-agent harness CLIs (from npm) against the floe gateway and the
//! real vLLM: Pi (`@mariozechner/pi-coding-agent`), once per provider API it speaks, and Codex
//! CLI (`@openai/codex`, Responses API).

use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};
use floe_gateway::capture::{read_session, Api};
use floe_tests::{vllm, workspace_root, TestGateway};
use serde_json::{json, Value};

fn install(harness: &str) -> Result<String> {
    let out = Command::new(workspace_root().join("scripts/harnesses/install.sh"))
        .arg(harness)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "installing {harness}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?.trim().to_string())
}

async fn tokenize(http: &reqwest::Client, messages: &Value) -> Result<Vec<u32>> {
    let body = json!({"model": "policy", "messages": messages, "add_generation_prompt": true});
    let r: Value = http
        .post(format!("{}/tokenize", vllm().url))
        .json(&body)
        .send()
        .await?
        .json()
        .await?;
    serde_json::from_value(r["tokens"].clone()).with_context(|| format!("tokenize answered {r}"))
}

#[tokio::test]
async fn pi_runs_headless_through_the_gateway_on_each_api() -> Result<()> {
    let pi = install("pi")?;
    let gw = TestGateway::start(&vllm().url, 48).await?;
    let http = reqwest::Client::new();
    // (pi's api name, base URL it appends its paths to, the API the gateway must see)
    let cases = [
        (
            "openai-completions",
            format!("{}/v1", gw.url),
            Api::OpenaiChat,
        ),
        ("anthropic-messages", gw.url.clone(), Api::Anthropic),
        (
            "openai-responses",
            format!("{}/v1", gw.url),
            Api::OpenaiResponses,
        ),
        (
            "google-generative-ai",
            format!("{}/v1beta", gw.url),
            Api::Gemini,
        ),
    ];
    for (api_name, base_url, api) in cases {
        let id = format!("pi-{api_name}");
        let token = gw.session(&id, "hello", 0).await?;
        let home = tempfile::tempdir()?;
        let work = tempfile::tempdir()?;
        std::fs::create_dir_all(home.path().join(".pi/agent"))?;
        let models = json!({"providers": {"floe": {"baseUrl": base_url, "api": api_name, "apiKey": token,
            "compat": {"supportsReasoningEffort": false},
            "models": [{"id": "policy", "contextWindow": 4096, "maxTokens": 48}]}}});
        std::fs::write(
            home.path().join(".pi/agent/models.json"),
            models.to_string(),
        )?;
        let pi = pi.clone();
        let (home_dir, work_dir) = (home.path().to_path_buf(), work.path().to_path_buf());
        let out = tokio::task::spawn_blocking(move || {
            Command::new("timeout")
                .args([
                    "180",
                    "node",
                    &pi,
                    "--provider",
                    "floe",
                    "--model",
                    "policy",
                    "-p",
                    "--offline",
                    "--no-session",
                ])
                .arg("Say hello in one short sentence.")
                .env("HOME", home_dir)
                .env("PI_OFFLINE", "1")
                .current_dir(work_dir)
                .output()
        })
        .await??;
        let stdout = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(
            out.status.success(),
            "pi over {api_name}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!stdout.is_empty(), "pi over {api_name} printed nothing");

        gw.close(&id).await?;
        let capture = read_session(&gw.session_dir(&id))?;
        assert!(
            !capture.records.is_empty(),
            "pi over {api_name}: no call captured"
        );
        let mut answers = Vec::new();
        for r in &capture.records {
            assert_eq!(r.api, api, "pi over {api_name}");
            assert_eq!(
                r.prompt_token_ids,
                tokenize(&http, &r.normalized_request["messages"]).await?,
                "pi over {api_name}: seq {}",
                r.seq
            );
            assert_eq!(
                r.logprobs.as_ref().map(Vec::len),
                Some(r.completion_token_ids.len())
            );
            answers.push(
                r.response["choices"][0]["message"]["content"]
                    .as_str()
                    .unwrap_or_default()
                    .trim()
                    .to_string(),
            );
        }
        // What the harness printed is exactly what the model sampled and the gateway captured.
        assert!(
            answers.contains(&stdout),
            "pi over {api_name} printed {stdout:?}, captured {answers:?}"
        );
        eprintln!(
            "pi over {api_name}: exit 0, {} calls captured, answer {stdout:?}",
            capture.records.len()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

#[tokio::test]
async fn codex_exec_runs_through_the_gateway_on_the_responses_api() -> Result<()> {
    let codex = install("codex")?;
    let gw = TestGateway::start(&vllm().url, 48).await?;
    let http = reqwest::Client::new();
    let token = gw.session("codex-1", "hello", 0).await?;
    let home = tempfile::tempdir()?;
    let work = tempfile::tempdir()?;
    // What floe's codex preset writes: a custom provider on the Responses wire API, outside
    // lookups (plugins, apps) off. The harness binary is untouched.
    let config = format!(
        "model = \"policy\"\nmodel_provider = \"floe\"\n\n[model_providers.floe]\nname = \"floe\"\nbase_url = \"{}/v1\"\n\
         wire_api = \"responses\"\nenv_key = \"FLOE_API_KEY\"\n\n[features]\nplugins = false\napps = false\nremote_plugin = false\n",
        gw.url
    );
    std::fs::write(home.path().join("config.toml"), config)?;
    let (home_dir, work_dir) = (home.path().to_path_buf(), work.path().to_path_buf());
    let out = tokio::task::spawn_blocking(move || {
        Command::new("timeout")
            .args([
                "240",
                "node",
                &codex,
                "exec",
                "--skip-git-repo-check",
                "Say hello in one short sentence.",
            ])
            .env("CODEX_HOME", home_dir)
            .env("FLOE_API_KEY", token)
            .current_dir(work_dir)
            .stdin(std::process::Stdio::null())
            .output()
    })
    .await??;
    let stdout = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        out.status.success(),
        "codex exec: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    gw.close("codex-1").await?;
    let capture = read_session(&gw.session_dir("codex-1"))?;
    assert!(!capture.records.is_empty(), "codex: no call captured");
    let mut answers = Vec::new();
    for r in &capture.records {
        assert_eq!(r.api, Api::OpenaiResponses);
        assert_eq!(
            r.prompt_token_ids,
            tokenize(&http, &r.normalized_request["messages"]).await?,
            "codex: seq {}",
            r.seq
        );
        assert_eq!(
            r.logprobs.as_ref().map(Vec::len),
            Some(r.completion_token_ids.len())
        );
        answers.push(
            r.response["choices"][0]["message"]["content"]
                .as_str()
                .unwrap_or_default()
                .trim()
                .to_string(),
        );
    }
    assert!(
        answers.contains(&stdout),
        "codex printed {stdout:?}, captured {answers:?}"
    );
    eprintln!(
        "codex over openai-responses: exit 0, {} calls captured ({} prompt tokens), answer {stdout:?}",
        capture.records.len(),
        capture.records[0].prompt_token_ids.len()
    );
    Ok(())
}
