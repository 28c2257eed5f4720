//! Real, unmodified coding-agent harness CLIs (from npm) against the floe gateway and the
//! real vLLM: Pi (`@mariozechner/pi-coding-agent`), once per provider API it speaks, and Codex
//! CLI (`@openai/codex`, Responses API), with an MCP server's tool too.

use std::process::Command;

use anyhow::Result;
use floe_gateway::capture::{read_session, Api};
use floe_tests::{harness_bin_dir, tokenize, vllm, ScriptedUpstream, Step, TestGateway};
use serde_json::json;

/// The harness's executable, installed (once, cached) from npm.
fn install(harness: &str, bin: &str) -> Result<String> {
    Ok(harness_bin_dir(harness)?.join(bin).display().to_string())
}

/// Close the session and check what the harness did: calls captured from `api`, each prompt
/// exactly the server's tokenization and each sample aligned with its logprobs, and what the
/// harness printed is exactly one of the captured completions. Returns the number of calls.
async fn check_harness_capture(
    gw: &TestGateway,
    http: &reqwest::Client,
    id: &str,
    api: Api,
    label: &str,
    printed: Option<&str>,
) -> Result<usize> {
    gw.close(id).await?;
    let capture = read_session(&gw.session_dir(id))?;
    assert!(!capture.records.is_empty(), "{label}: no call captured");
    let mut answers = Vec::new();
    for r in &capture.records {
        assert_eq!(r.api, api, "{label}");
        assert_eq!(
            r.prompt_token_ids,
            tokenize(http, &r.normalized_request["messages"]).await?,
            "{label}: seq {}",
            r.seq
        );
        assert_eq!(
            r.logprobs.as_ref().map(Vec::len),
            Some(r.completion_token_ids.len()),
            "{label}: seq {}",
            r.seq
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
    if let Some(printed) = printed {
        assert!(
            answers.iter().any(|a| a == printed),
            "{label} printed {printed:?}, captured {answers:?}"
        );
    }
    Ok(capture.records.len())
}

#[tokio::test]
async fn pi_runs_headless_through_the_gateway_on_each_api() -> Result<()> {
    let pi = install("pi", "pi")?;
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
            // 300 s: on a CI machine at a load of 16 (the real node beside it), one run
            // once outlasted 180 s.
            Command::new("timeout")
                .args([
                    "300",
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

        let label = format!("pi over {api_name}");
        let calls = check_harness_capture(&gw, &http, &id, api, &label, Some(&stdout)).await?;
        eprintln!("{label}: exit 0, {calls} calls captured, answer {stdout:?}");
    }
    Ok(())
}

/// What floe's codex preset writes: a custom provider on the Responses wire API, outside
/// lookups (plugins, apps) and hosted web search off. The harness binary is untouched.
fn codex_config(gateway: &str) -> String {
    format!(
        "model = \"policy\"\nmodel_provider = \"floe\"\nweb_search = \"disabled\"\n\n[model_providers.floe]\nname = \"floe\"\nbase_url = \"{gateway}/v1\"\n\
         wire_api = \"responses\"\nenv_key = \"FLOE_API_KEY\"\n\n[features]\nplugins = false\napps = false\nremote_plugin = false\n"
    )
}

/// `codex exec <prompt>` with its home at `home`, in a working directory of its own.
async fn codex_exec(
    codex: String,
    home: &std::path::Path,
    token: String,
    prompt: &'static str,
) -> Result<std::process::Output> {
    let work = tempfile::tempdir()?;
    let (home, work_dir) = (home.to_path_buf(), work.path().to_path_buf());
    let out = tokio::task::spawn_blocking(move || {
        Command::new("timeout")
            .args([
                "240",
                "node",
                &codex,
                "exec",
                "--skip-git-repo-check",
                prompt,
            ])
            .env("CODEX_HOME", home)
            .env("FLOE_API_KEY", token)
            .current_dir(work_dir)
            .stdin(std::process::Stdio::null())
            .output()
    })
    .await??;
    Ok(out)
}

#[tokio::test]
async fn codex_exec_runs_through_the_gateway_on_the_responses_api() -> Result<()> {
    let codex = install("codex", "codex")?;
    let gw = TestGateway::start(&vllm().url, 48).await?;
    let http = reqwest::Client::new();
    let token = gw.session("codex-1", "hello", 0).await?;
    let home = tempfile::tempdir()?;
    std::fs::write(home.path().join("config.toml"), codex_config(&gw.url))?;
    let out = codex_exec(
        codex,
        home.path(),
        token,
        "Say hello in one short sentence.",
    )
    .await?;
    let stdout = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // SmolLM2 sometimes runs into the 48-token cap; the gateway then answers an incomplete
    // Responses result (`max_output_tokens`), and Codex exits 1 saying so. That is the
    // faithful outcome, not a failure of the path; anything else is.
    let truncated = !out.status.success() && stderr.contains("reason: max_output_tokens");
    assert!(
        out.status.success() || truncated,
        "codex exec: {}\n{stderr}",
        out.status
    );
    let label = "codex over openai-responses";
    let printed = (!truncated).then_some(stdout.as_str());
    let calls =
        check_harness_capture(&gw, &http, "codex-1", Api::OpenaiResponses, label, printed).await?;
    if truncated {
        let capture = read_session(&gw.session_dir("codex-1"))?;
        assert!(capture
            .records
            .iter()
            .any(|r| r.finish_reason.as_deref() == Some("length")));
    }
    eprintln!(
        "{label}: exit {}, {calls} calls captured, answer {stdout:?}",
        out.status
    );
    Ok(())
}

/// A Model Context Protocol server on stdio with one read-only tool, `lookup`, whose calls it
/// writes to the file named by its argument.
const MCP_SERVER: &str = r#"
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if "id" not in m:
        continue
    method = m.get("method")
    if method == "initialize":
        result = {"protocolVersion": m["params"]["protocolVersion"], "capabilities": {"tools": {}},
                  "serverInfo": {"name": "docs", "version": "1"}}
    elif method == "tools/list":
        result = {"tools": [{"name": "lookup", "description": "Look a word up.",
                  "inputSchema": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
                  "annotations": {"readOnlyHint": True}}]}
    elif method == "tools/call":
        with open(sys.argv[1], "a") as f:
            f.write(json.dumps(m["params"]["arguments"]) + "\n")
        result = {"content": [{"type": "text", "text": "MCP-ANSWER-42"}], "isError": False}
    else:
        result = {}
    print(json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": result}), flush=True)
"#;

/// Codex sends an MCP server's tools (and its own sub-agents' tools) as Responses `namespace`
/// tools (`{"type": "namespace", "name": "mcp__docs", "tools": [{"name": "lookup", …}]}`) and
/// routes a call by its namespace and name. Calls went back without their namespace, and
/// Codex itself answered them `unsupported call: lookup` (0.169): no MCP tool could be used
/// through the gateway.
#[tokio::test]
async fn codex_calls_an_mcp_servers_tool_through_the_gateway() -> Result<()> {
    let codex = install("codex", "codex")?;
    let model = ScriptedUpstream::start(vec![
        Step::Call("lookup".into(), json!({"q": "floe"})),
        Step::Say("Looked it up.".into()),
    ])
    .await?;
    let gw = TestGateway::start(&model.url, 256).await?;
    let token = gw.session("codex-mcp", "lookup", 0).await?;
    let home = tempfile::tempdir()?;
    let (server, called) = (home.path().join("docs.py"), home.path().join("called"));
    std::fs::write(&server, MCP_SERVER)?;
    let config = format!(
        "{}\n[mcp_servers.docs]\ncommand = \"python3\"\nargs = [{:?}, {:?}]\n",
        codex_config(&gw.url),
        server.display().to_string(),
        called.display().to_string()
    );
    std::fs::write(home.path().join("config.toml"), config)?;
    let out = codex_exec(codex, home.path(), token, "Look up floe.").await?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "codex exec: {}\n{stderr}", out.status);
    let requests = model.requests();
    let shown: Vec<&str> = requests
        .first()
        .and_then(|r| r["tools"].as_array())
        .into_iter()
        .flatten()
        .filter_map(|t| t["function"]["name"].as_str())
        .collect();
    assert!(shown.contains(&"lookup"), "tools shown: {shown:?}");
    let results: Vec<String> = model.tool_results().iter().map(|c| c.to_string()).collect();
    assert!(
        results.iter().any(|r| r.contains("MCP-ANSWER-42")),
        "the MCP tool's answer did not reach the model: {results:?}"
    );
    let calls = std::fs::read_to_string(&called).unwrap_or_default();
    assert_eq!(calls.trim(), r#"{"q": "floe"}"#, "the MCP server's calls");
    gw.close("codex-mcp").await?;
    Ok(())
}
