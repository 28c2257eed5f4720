//! The gateway and the trajectory builders against a genuine vLLM OpenAI server on CPU
//! (SmolLM2-135M-Instruct, real tokenizer and chat template). See `floe_tests::vllm`.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use floe_gateway::capture::{read_session, Api, CompletionRecord, SessionCapture};
use floe_gateway::trajectory::{build_traces, BuildOptions, Builder, ChainStart, Trace};
use floe_tests::{floe_bin, tokenize, vllm, workspace_root, TestGateway};
use serde_json::{json, Value};

async fn post(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    body: &Value,
) -> Result<reqwest::Response> {
    Ok(http.post(url).bearer_auth(token).json(body).send().await?)
}

async fn chat(
    http: &reqwest::Client,
    gw: &TestGateway,
    token: &str,
    body: &Value,
) -> Result<Value> {
    let resp = post(
        http,
        &format!("{}/v1/chat/completions", gw.url),
        token,
        body,
    )
    .await?;
    let status = resp.status();
    let json: Value = resp.json().await?;
    anyhow::ensure!(status.is_success(), "chat: {status} {json}");
    Ok(json)
}

fn check_token_alignment(r: &CompletionRecord, cap: usize) {
    let lp = r.logprobs.as_ref().expect("vLLM returned logprobs");
    assert_eq!(
        lp.len(),
        r.completion_token_ids.len(),
        "one logprob per sampled token (seq {})",
        r.seq
    );
    assert!(
        lp.iter().all(|x| x.is_finite() && *x <= 0.0),
        "logprobs are log-probabilities"
    );
    assert!(
        !r.completion_token_ids.is_empty() && r.completion_token_ids.len() <= cap,
        "response cap enforced"
    );
}

/// Close the session and check its capture: `calls` records from `api`, each prompt exactly
/// vLLM's tokenization of what was sent upstream, each sample aligned with its logprobs.
async fn checked_capture(
    gw: &TestGateway,
    http: &reqwest::Client,
    id: &str,
    api: Api,
    calls: usize,
    cap: usize,
) -> Result<SessionCapture> {
    gw.close(id).await?;
    let capture = read_session(&gw.session_dir(id))?;
    assert!(capture.sealed);
    assert_eq!(capture.records.len(), calls);
    for r in &capture.records {
        assert_eq!(r.api, api);
        let expected = tokenize(http, &r.normalized_request["messages"]).await?;
        assert_eq!(
            r.prompt_token_ids, expected,
            "seq {}: captured prompt ids = vLLM /tokenize",
            r.seq
        );
        check_token_alignment(r, cap);
    }
    Ok(capture)
}

/// A single agent's session merges into one chain; the only breaks allowed are real
/// re-renderings of sampled text.
fn assert_one_agent_merges(label: &str, records: &[CompletionRecord]) {
    let (traces, stats) = build_traces(records, &BuildOptions::default());
    let by_seq: BTreeMap<u64, &CompletionRecord> = records.iter().map(|r| (r.seq, r)).collect();
    eprintln!(
        "{label}: {} calls -> {} traces, starts {:?}",
        records.len(),
        stats.traces,
        stats.starts
    );
    for t in &traces {
        assert!(
            matches!(t.start, ChainStart::First | ChainStart::TemplateRewrite),
            "{label}: {:?}",
            t.start
        );
        if t.start == ChainStart::TemplateRewrite {
            assert!(
                rewrite_is_real(t, &by_seq),
                "{label}: template_rewrite at {:?} is not real",
                t.completions
            );
        }
    }
    assert_eq!(stats.trainable_tokens, stats.sampled_tokens);
}

#[tokio::test]
async fn captured_prompt_ids_are_the_servers_tokenization_and_samples_line_up() -> Result<()> {
    let gw = TestGateway::start(&vllm().url, 16).await?;
    let http = reqwest::Client::new();
    let token = gw.session("tok-1", "t", 0).await?;
    let bodies = [
        json!({"model": "gpt-5", "max_tokens": 64, "messages": [{"role": "user", "content": "What is 2+2?"}]}),
        json!({"model": "gpt-5", "messages": [
            {"role": "user", "content": "List the files."},
            {"role": "developer", "content": "Answer briefly."},
            {"role": "assistant", "content": "Let me look.", "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "a.py b.py"}]}]}),
    ];
    for body in &bodies {
        let reply = chat(&http, &gw, &token, body).await?;
        assert_eq!(
            reply["model"], "gpt-5",
            "the client sees the model it asked for"
        );
        assert!(
            reply.get("prompt_token_ids").is_none(),
            "capture fields stay in the gateway"
        );
    }
    // Streaming: the SSE content equals what was captured.
    let stream_body = json!({"model": "gpt-5", "stream": true, "messages": [{"role": "user", "content": "Say hello."}]});
    let text = post(
        &http,
        &format!("{}/v1/chat/completions", gw.url),
        &token,
        &stream_body,
    )
    .await?
    .text()
    .await?;
    let mut streamed = String::new();
    for data in text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
    {
        let chunk: Value = serde_json::from_str(data)?;
        streamed.push_str(
            chunk["choices"][0]["delta"]["content"]
                .as_str()
                .unwrap_or_default(),
        );
    }
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");

    let capture = checked_capture(&gw, &http, "tok-1", Api::OpenaiChat, 3, 16).await?;
    // The developer message was merged into the one leading system message.
    assert_eq!(
        capture.records[1].normalized_request["messages"][0]["role"],
        "system"
    );
    assert_eq!(
        capture.records[2].response["choices"][0]["message"]["content"].as_str(),
        Some(streamed.as_str())
    );
    // A closed session's token is refused, in OpenAI's error shape.
    let after = post(
        &http,
        &format!("{}/v1/chat/completions", gw.url),
        &token,
        &bodies[0],
    )
    .await?;
    assert_eq!(after.status(), 401);
    let err: Value = after.json().await?;
    assert_eq!(err["error"]["code"], "invalid_api_key");
    Ok(())
}

/// How many times `body` was asked, at most 10, until an answer was cut (`length`).
async fn calls_until_cut(
    http: &reqwest::Client,
    gw: &TestGateway,
    token: &str,
    body: Value,
) -> Result<usize> {
    for calls in 1..=10 {
        let reply = chat(http, gw, token, &body).await?;
        if reply["choices"][0]["finish_reason"] == "length" {
            return Ok(calls);
        }
    }
    anyhow::bail!("no answer to {body} was cut in 10 calls")
}

#[tokio::test]
async fn a_call_cut_at_the_jobs_cap_is_overlong_and_one_cut_at_the_callers_is_not() -> Result<()> {
    // The job's cap is 16 tokens. Counting to 100 runs over it; Claude Code's one-token checks
    // (`max_tokens: 1`, Anthropic's API) and a Chat call asking for 3 stop at their own cap.
    let gw = TestGateway::start(&vllm().url, 16).await?;
    let http = reqwest::Client::new();
    let token = gw.session("overlong-1", "t", 0).await?;
    let count = json!([{"role": "user", "content": "Count from 1 to 100, one number per line."}]);
    // Sampled: the model may stop early (5 tokens once in CI); asked again until one is cut.
    let calls =
        calls_until_cut(&http, &gw, &token, json!({"model": "m", "messages": count})).await?;
    // The same for the caller's own cap: the model may end its answer within 3 tokens (seen
    // once in CI), which cuts nothing.
    let short_calls = calls_until_cut(
        &http,
        &gw,
        &token,
        json!({"model": "m", "max_tokens": 3, "messages": count}),
    )
    .await?;
    let quota = http
        .post(format!("{}/v1/messages", gw.url))
        .header("x-api-key", &token)
        .header("anthropic-version", "2023-06-01")
        .json(&json!({"model": "claude-haiku-4-5", "max_tokens": 1,
            "messages": [{"role": "user", "content": "quota"}]}))
        .send()
        .await?;
    anyhow::ensure!(quota.status().is_success(), "{}", quota.text().await?);
    gw.close("overlong-1").await?;
    let capture = read_session(&gw.session_dir("overlong-1"))?;
    // The cut answer at the job's cap, the one at the caller's, the one-token check.
    let last_short = calls - 1 + short_calls;
    let picked: Vec<CompletionRecord> = [calls - 1, last_short, last_short + 1]
        .into_iter()
        .map(|i| capture.records.get(i).cloned().context("a record"))
        .collect::<Result<_>>()?;
    let cut: Vec<(usize, Option<&str>, bool)> = picked
        .iter()
        .map(|r| {
            let n = r.completion_token_ids.len();
            (n, r.finish_reason.as_deref(), r.short_cap)
        })
        .collect();
    assert_eq!(
        cut,
        [
            (16, Some("length"), false),
            (3, Some("length"), true),
            (1, Some("length"), true)
        ]
    );
    for builder in [Builder::PrefixMerging, Builder::PerRequest] {
        let options = BuildOptions {
            builder,
            ..BuildOptions::default()
        };
        let (_, stats) = build_traces(&picked, &options);
        assert_eq!(
            (stats.truncated_turns, stats.overlong_turns),
            (3, 1),
            "{builder:?}"
        );
    }
    Ok(())
}

/// A harness-shaped session: a main agent that calls tools for 24 turns (with one history
/// rewrite), and a sub-agent interleaved with it.
async fn agentic_session(gw: &TestGateway, http: &reqwest::Client, id: &str) -> Result<usize> {
    let token = gw.session(id, "fix-calc", 0).await?;
    let system = "You are a coding agent in a repository. Tools: read_file(path), run_tests(). Think briefly, then act.";
    let mut main = vec![
        json!({"role": "system", "content": system}),
        json!({"role": "user", "content": "The test test_add in test_calc.py fails. Fix calc.py."}),
    ];
    let mut sub = vec![
        json!({"role": "system", "content": "You are a search sub-agent. Report file locations only."}),
        json!({"role": "user", "content": "Where is add() defined?"}),
    ];
    let tools = ["read_file", "run_tests"];
    let mut calls = 0;
    for turn in 0..24usize {
        if turn == 16 {
            // History rewrite (like a harness trimming old tool output): keep the first exchange,
            // replace the middle with a summary.
            main.truncate(4);
            main.push(json!({"role": "user", "content": "Summary of the work so far: calc.py read, add() found, tests still failing."}));
        }
        let reply = chat(
            http,
            gw,
            &token,
            &json!({"model": "gpt-5", "messages": main, "temperature": 1.0, "seed": turn}),
        )
        .await?;
        calls += 1;
        let content = reply["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let call_id = format!("call_{turn}");
        let name = tools[turn % 2];
        main.push(json!({"role": "assistant", "content": content,
            "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": "{\"path\": \"calc.py\"}"}}]}));
        main.push(json!({"role": "tool", "tool_call_id": call_id, "content": format!("{name} output #{turn}: 1 failed, 3 passed")}));
        if turn % 3 == 1 {
            let reply = chat(
                http,
                gw,
                &token,
                &json!({"model": "gpt-5", "messages": sub, "temperature": 1.0, "seed": 100 + turn}),
            )
            .await?;
            calls += 1;
            let content = reply["choices"][0]["message"]["content"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            sub.push(json!({"role": "assistant", "content": content}));
            sub.push(json!({"role": "user", "content": "Keep looking."}));
        }
    }
    gw.close(id).await?;
    Ok(calls)
}

/// Recheck a TemplateRewrite start from the raw records: the chain's previous call's sampled
/// tokens really do not reappear right after its prompt in this call's prompt.
fn rewrite_is_real(trace: &Trace, records: &BTreeMap<u64, &CompletionRecord>) -> bool {
    let this = records[&trace.completions[0]];
    records.values().filter(|r| r.seq < this.seq).any(|prev| {
        this.prompt_token_ids.starts_with(&prev.prompt_token_ids)
            && !this.prompt_token_ids[prev.prompt_token_ids.len()..]
                .starts_with(&prev.completion_token_ids)
    })
}

#[tokio::test]
async fn multi_turn_tool_sessions_merge_on_real_tokenization() -> Result<()> {
    let gw = TestGateway::start(&vllm().url, 24).await?;
    let http = reqwest::Client::new();
    let calls = agentic_session(&gw, &http, "agentic-1").await?;
    let capture = read_session(&gw.session_dir("agentic-1"))?;
    if let Some(keep) = std::env::var_os("FLOE_KEEP_CAPTURE") {
        std::fs::create_dir_all(&keep)?;
        for f in ["completions.jsonl", "session.json", "sealed"] {
            std::fs::copy(
                gw.session_dir("agentic-1").join(f),
                std::path::Path::new(&keep).join(f),
            )?;
        }
    }
    assert_eq!(capture.records.len(), calls);
    assert!(calls >= 30, "{calls} calls");
    for r in &capture.records {
        check_token_alignment(r, 24);
    }
    let by_seq: BTreeMap<u64, &CompletionRecord> =
        capture.records.iter().map(|r| (r.seq, r)).collect();
    let per_request = build_traces(
        &capture.records,
        &BuildOptions {
            builder: Builder::PerRequest,
            ..Default::default()
        },
    );
    let merged = build_traces(
        &capture.records,
        &BuildOptions {
            builder: Builder::PrefixMerging,
            ..Default::default()
        },
    );
    let (traces, stats) = &merged;
    eprintln!(
        "real session: {} calls; per_request {} samples / {} tokens; prefix_merging {} samples / {} tokens; starts {:?}",
        calls, per_request.1.traces, per_request.1.total_tokens, stats.traces, stats.total_tokens, stats.starts
    );
    for t in traces {
        eprintln!(
            "  trace start={:?} calls={:?} tokens={}",
            t.start,
            t.completions,
            t.prompt_token_ids.len() + t.response_token_ids.len()
        );
    }
    assert_eq!(stats.sampled_tokens, per_request.1.sampled_tokens);
    assert_eq!(
        stats.trainable_tokens, stats.sampled_tokens,
        "every sampled token trained once"
    );
    // The sub-agent is its own chain; the rewrite breaks the main chain exactly once.
    assert_eq!(stats.starts.get(&ChainStart::First), Some(&1));
    assert_eq!(stats.starts.get(&ChainStart::NewContext), Some(&1));
    assert_eq!(stats.starts.get(&ChainStart::PrefixChanged), Some(&1));
    // Any template rewrite (re-tokenization of sampled text differing from the sampled ids)
    // must be a real mismatch, never a silent merge or a false alarm.
    for t in traces
        .iter()
        .filter(|t| t.start == ChainStart::TemplateRewrite)
    {
        assert!(
            rewrite_is_real(t, &by_seq),
            "template_rewrite at seq {:?} is not a real mismatch",
            t.completions
        );
    }
    let rewrites = stats
        .starts
        .get(&ChainStart::TemplateRewrite)
        .copied()
        .unwrap_or(0);
    assert_eq!(stats.traces, 3 + rewrites);
    assert!(
        per_request.1.traces >= 5 * stats.traces,
        "prefix merging: {} samples vs {}",
        stats.traces,
        per_request.1.traces
    );
    assert!(stats.total_tokens * 3 < per_request.1.total_tokens);
    Ok(())
}

#[tokio::test]
async fn the_floe_binary_serves_captures_and_builds_trajectories() -> Result<()> {
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("token"), "bin-control\n")?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut child = std::process::Command::new(floe_bin()?)
        .args([
            "gateway",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--upstream",
            &vllm().url,
        ])
        .args([
            "--capture-dir",
            dir.path().join("cap").to_str().context("utf-8")?,
        ])
        .args([
            "--control-token-file",
            dir.path().join("token").to_str().context("utf-8")?,
            "--max-response-tokens",
            "8",
        ])
        .spawn()?;
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let mut up = false;
    for _ in 0..100 {
        if http.get(format!("{base}/healthz")).send().await.is_ok() {
            up = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let result = async {
        anyhow::ensure!(up, "floe gateway did not come up");
        let created: Value = post(
            &http,
            &format!("{base}/floe/v1/sessions"),
            "bin-control",
            &json!({"session": "bin-1", "task": "t"}),
        )
        .await?
        .json()
        .await?;
        let token = created["token"].as_str().context("token")?.to_string();
        // Unknown sessions are never created implicitly.
        let denied = post(
            &http,
            &format!("{base}/v1/chat/completions"),
            "floe-made-up",
            &json!({"messages": [{"role": "user", "content": "hi"}]}),
        )
        .await?;
        anyhow::ensure!(
            denied.status() == 401,
            "unknown token got {}",
            denied.status()
        );
        let ok = post(
            &http,
            &format!("{base}/v1/chat/completions"),
            &token,
            &json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await?;
        anyhow::ensure!(ok.status() == 200, "call got {}", ok.status());
        post(
            &http,
            &format!("{base}/floe/v1/sessions/bin-1/close"),
            "bin-control",
            &json!({}),
        )
        .await?;
        let metrics = http
            .get(format!("{base}/metrics"))
            .send()
            .await?
            .text()
            .await?;
        anyhow::ensure!(
            metrics.contains("floe_gateway_requests_total{api=\"openai_chat\",status=\"200\"} 1"),
            "{metrics}"
        );
        anyhow::ensure!(
            metrics.contains("floe_gateway_errors_total{kind=\"unauthorized\"} 1"),
            "{metrics}"
        );
        Ok(())
    }
    .await;
    let _ = child.kill();
    let _ = child.wait();
    result?;

    let out = std::process::Command::new(floe_bin()?)
        .args(["trajectories", "build", "--builder", "per_request"])
        .arg(dir.path().join("cap"))
        .output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let schema: Value = serde_json::from_str(&std::fs::read_to_string(
        workspace_root().join("docs/trajectory.schema.json"),
    )?)?;
    let validator = jsonschema::validator_for(&schema)?;
    let lines: Vec<Value> = String::from_utf8(out.stdout)?
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    assert_eq!(lines.len(), 1);
    assert!(validator.is_valid(&lines[0]), "{}", lines[0]);
    assert_eq!(lines[0]["session"], "bin-1");
    assert_eq!(
        lines[0]["traces"][0]["loss_mask"].as_array().map(Vec::len),
        lines[0]["traces"][0]["logprobs"].as_array().map(Vec::len)
    );
    Ok(())
}

/// A hosted tool refused before any upstream call: 400 in the provider's own error shape
/// (`error.<field>` = value), naming the tool and the job setting that drops it instead.
async fn assert_hosted_tool_refused(
    resp: reqwest::Response,
    (field, value): (&str, &str),
    tool: &str,
) -> Result<()> {
    assert_eq!(resp.status(), 400);
    let err: Value = resp.json().await?;
    assert_eq!(err["error"][field], value, "{err}");
    assert!(
        err["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains(tool) && m.contains("hostedTools: Drop")),
        "{err}"
    );
    Ok(())
}

/// Parse an SSE body into (event name, data) pairs.
fn sse_events(body: &str) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let mut name = String::new();
    for line in body.lines() {
        if let Some(n) = line.strip_prefix("event: ") {
            name = n.to_string();
        } else if let Some(d) = line.strip_prefix("data: ") {
            out.push((
                std::mem::take(&mut name),
                serde_json::from_str(d).unwrap_or(Value::Null),
            ));
        }
    }
    out
}

#[tokio::test]
async fn anthropic_messages_round_trip_through_vllm_with_capture() -> Result<()> {
    let gw = TestGateway::start(&vllm().url, 16).await?;
    let http = reqwest::Client::new();
    let token = gw.session_dropping_hosted_tools("anthropic-1").await?;
    let url = format!("{}/v1/messages?beta=true", gw.url);
    let request = |messages: &Vec<Value>, stream: bool| {
        json!({"model": "claude-sonnet-4-5", "max_tokens": 64, "stream": stream, "temperature": 1.0,
            "system": [{"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}}],
            "messages": messages,
            "tools": [{"name": "Bash", "description": "Run a command", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}},
                      {"type": "web_search_20250305", "name": "web_search"}]})
    };
    let mut messages = vec![
        json!({"role": "user", "content": [{"type": "text", "text": "List the files, then fix the bug."}]}),
    ];
    // By default a hosted tool is refused in Anthropic's own error shape, before any upstream call.
    let refused = http
        .post(&url)
        .header("x-api-key", gw.session("anthropic-refused", "t", 0).await?)
        .json(&request(&messages, false))
        .send()
        .await?;
    assert_hosted_tool_refused(
        refused,
        ("type", "invalid_request_error"),
        "web_search_20250305",
    )
    .await?;
    for turn in 0..4 {
        // Claude Code authenticates with x-api-key.
        let resp = http
            .post(&url)
            .header("x-api-key", &token)
            .header("anthropic-version", "2023-06-01")
            .json(&request(&messages, false))
            .send()
            .await?;
        assert_eq!(resp.status(), 200);
        let msg: Value = resp.json().await?;
        assert_eq!(
            (
                msg["type"].as_str(),
                msg["role"].as_str(),
                msg["model"].as_str()
            ),
            (
                Some("message"),
                Some("assistant"),
                Some("claude-sonnet-4-5")
            )
        );
        assert!(
            matches!(msg["stop_reason"].as_str(), Some("end_turn" | "max_tokens")),
            "{msg}"
        );
        assert!(msg["usage"]["input_tokens"].as_u64().is_some_and(|n| n > 0));
        let text: String = msg["content"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|b| b["text"].as_str())
            .collect();
        let id = format!("toolu_{turn}");
        messages.push(json!({"role": "assistant", "content": [{"type": "text", "text": text}, {"type": "tool_use", "id": id, "name": "Bash", "input": {"command": "ls"}}]}));
        messages.push(json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": [{"type": "text", "text": "calc.py\ntest_calc.py"}]}]}));
    }
    let body = http
        .post(&url)
        .header("x-api-key", &token)
        .json(&request(&messages, true))
        .send()
        .await?
        .text()
        .await?;
    let events = sse_events(&body);
    // Anthropic's own keep-alive, `ping`, may come while vLLM works; the SDKs skip it.
    let (pings, events): (Vec<_>, Vec<_>) = events.into_iter().partition(|(n, _)| n == "ping");
    assert!(
        pings.iter().all(|(_, d)| *d == json!({"type": "ping"})),
        "{body}"
    );
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.first(), Some(&"message_start"), "{body}");
    assert_eq!(names.last(), Some(&"message_stop"), "{body}");
    assert!(names.contains(&"message_delta"));
    let streamed: String = events
        .iter()
        .filter_map(|(_, d)| d["delta"]["text"].as_str())
        .collect();

    // count_tokens (no max_tokens): vLLM's own count of the prompt the streamed call was given.
    let counted = count_tokens(&http, &gw, &token, request(&messages, false)).await?;

    // Wrong key: Anthropic's error shape.
    let denied = http
        .post(&url)
        .header("x-api-key", "sk-ant-nope")
        .json(&request(&messages, false))
        .send()
        .await?;
    assert_eq!(denied.status(), 401);
    let err: Value = denied.json().await?;
    assert_eq!(
        (err["type"].as_str(), err["error"]["type"].as_str()),
        (Some("error"), Some("authentication_error"))
    );

    let capture = checked_capture(&gw, &http, "anthropic-1", Api::Anthropic, 5, 16).await?;
    for r in &capture.records {
        // The hosted tool was dropped (the session's choice) and counted; the custom one went
        // upstream as a function.
        assert_eq!(
            r.normalized_request["tools"].as_array().map(Vec::len),
            Some(1)
        );
        assert_eq!(r.dropped, ["hosted_tool:web_search_20250305"]);
    }
    assert_eq!(
        capture.records[4].response["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default(),
        streamed
    );
    let metrics = gw.gateway.metrics.render();
    assert!(metrics.contains(r#"floe_gateway_dropped_total{api="anthropic",what="hosted_tool:web_search_20250305"} 5"#), "{metrics}");

    // Anthropic-shaped history (tool_use / tool_result blocks) merges like any other.
    assert_eq!(
        counted["input_tokens"].as_u64(),
        Some(capture.records[4].prompt_token_ids.len() as u64),
        "{counted}"
    );
    assert_one_agent_merges("anthropic session", &capture.records);
    Ok(())
}

/// The gateway's Messages `count_tokens` of `body` (its `max_tokens` left out, as the SDKs send).
async fn count_tokens(
    http: &reqwest::Client,
    gw: &TestGateway,
    token: &str,
    mut body: Value,
) -> Result<Value> {
    body.as_object_mut().map(|m| m.remove("max_tokens"));
    Ok(http
        .post(format!("{}/v1/messages/count_tokens", gw.url))
        .header("x-api-key", token)
        .json(&body)
        .send()
        .await?
        .json()
        .await?)
}

/// A Messages call ending in the assistant's words (a prefill) is continued, as Anthropic
/// does: the prompt vLLM sampled from is the conversation rendered with that turn left open,
/// not closed and followed by a new assistant turn (another question); count_tokens agrees.
#[tokio::test]
async fn an_anthropic_prefill_is_continued_by_the_real_vllm() -> Result<()> {
    let gw = TestGateway::start(&vllm().url, 16).await?;
    let http = reqwest::Client::new();
    let token = gw.session("anthropic-prefill", "t", 0).await?;
    let messages = json!([{"role": "user", "content": "What is 2+2?"},
                          {"role": "assistant", "content": "The answer is"}]);
    let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 8, "temperature": 1.0,
                      "messages": messages});
    let resp = http
        .post(format!("{}/v1/messages", gw.url))
        .header("x-api-key", &token)
        .json(&body)
        .send()
        .await?;
    assert_eq!(resp.status(), 200);
    let counted = count_tokens(&http, &gw, &token, body.clone()).await?;
    gw.close("anthropic-prefill").await?;
    let capture = read_session(&gw.session_dir("anthropic-prefill"))?;
    let record = capture.records.first().context("the call's record")?;
    let rendered = |continued: bool| {
        let body = json!({"model": "policy", "messages": messages,
                          "add_generation_prompt": !continued, "continue_final_message": continued});
        let http = http.clone();
        async move {
            let r: Value = http
                .post(format!("{}/tokenize", vllm().url))
                .json(&body)
                .send()
                .await?
                .json()
                .await?;
            serde_json::from_value::<Vec<u32>>(r["tokens"].clone())
                .with_context(|| format!("tokenize answered {r}"))
        }
    };
    let (open, answered_anew) = (rendered(true).await?, rendered(false).await?);
    assert_ne!(open, answered_anew);
    assert_eq!(
        record.prompt_token_ids, open,
        "the prefill's turn left open"
    );
    assert_eq!(
        counted["input_tokens"].as_u64(),
        Some(open.len() as u64),
        "{counted}"
    );
    check_token_alignment(record, 16);
    Ok(())
}

#[tokio::test]
async fn openai_responses_round_trip_through_vllm_with_capture() -> Result<()> {
    let gw = TestGateway::start(&vllm().url, 16).await?;
    let http = reqwest::Client::new();
    let token = gw.session_dropping_hosted_tools("responses-1").await?;
    let url = format!("{}/v1/responses", gw.url);
    let request = |input: &Vec<Value>, stream: bool| {
        json!({"model": "gpt-5-codex", "instructions": "You are Codex, a coding agent.", "input": input, "stream": stream,
            "store": false, "include": ["reasoning.encrypted_content"], "tool_choice": "auto", "parallel_tool_calls": false,
            "prompt_cache_key": "k", "temperature": 1.0,
            "tools": [{"type": "function", "name": "shell", "description": "Run a command",
                       "parameters": {"type": "object", "properties": {"command": {"type": "array", "items": {"type": "string"}}}}},
                      {"type": "custom", "name": "apply_patch", "description": "Edit files", "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}},
                      {"type": "web_search"}]})
    };
    let mut input = vec![
        json!({"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "<permissions>workspace-write</permissions>"}]}),
        json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Make test_calc.py pass."}]}),
    ];
    for turn in 0..3 {
        let resp = post(&http, &url, &token, &request(&input, false)).await?;
        assert_eq!(resp.status(), 200);
        let r: Value = resp.json().await?;
        assert_eq!(
            (r["object"].as_str(), r["model"].as_str()),
            (Some("response"), Some("gpt-5-codex"))
        );
        assert!(
            matches!(r["status"].as_str(), Some("completed" | "incomplete")),
            "{r}"
        );
        let text: String = r["output"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|o| o["type"] == "message")
            .flat_map(|o| o["content"].as_array().cloned().unwrap_or_default())
            .filter_map(|c| c["text"].as_str().map(str::to_owned))
            .collect();
        let call_id = format!("call_{turn}");
        input.push(json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}));
        input.push(json!({"type": "function_call", "call_id": call_id, "name": "shell", "arguments": "{\"command\":[\"ls\"]}"}));
        input.push(json!({"type": "function_call_output", "call_id": call_id, "output": "calc.py\ntest_calc.py"}));
    }
    let body = post(&http, &url, &token, &request(&input, true))
        .await?
        .text()
        .await?;
    let events = sse_events(&body);
    assert_eq!(
        events.first().map(|e| e.0.as_str()),
        Some("response.created"),
        "{body}"
    );
    assert!(
        matches!(
            events.last().map(|e| e.0.as_str()),
            Some("response.completed" | "response.incomplete")
        ),
        "{body}"
    );
    assert!(events
        .iter()
        .enumerate()
        .all(|(i, (_, d))| d["sequence_number"] == i));
    let streamed: String = events
        .iter()
        .filter(|(n, _)| n == "response.output_text.delta")
        .filter_map(|(_, d)| d["delta"].as_str())
        .collect();

    // The gateway keeps no state: a stateful request is refused in OpenAI's shape.
    let mut stateful = request(&input, false);
    stateful["previous_response_id"] = json!("resp_123");
    let refused = post(&http, &url, &token, &stateful).await?;
    assert_eq!(refused.status(), 400);
    let err: Value = refused.json().await?;
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("stateless"),
        "{err}"
    );

    // A default session refuses the hosted tool in OpenAI's error shape.
    let refused = post(
        &http,
        &url,
        &gw.session("responses-refused", "t", 0).await?,
        &request(&input, false),
    )
    .await?;
    assert_hosted_tool_refused(refused, ("type", "invalid_request_error"), "web_search").await?;

    let capture = checked_capture(&gw, &http, "responses-1", Api::OpenaiResponses, 4, 16).await?;
    for r in &capture.records {
        assert_eq!(
            r.normalized_request["tools"].as_array().map(Vec::len),
            Some(2),
            "web_search dropped"
        );
    }
    assert_eq!(
        capture.records[3].response["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default(),
        streamed
    );
    assert_one_agent_merges("responses session", &capture.records);
    Ok(())
}

#[tokio::test]
async fn gemini_generate_content_round_trips_through_vllm_with_capture() -> Result<()> {
    let gw = TestGateway::start(&vllm().url, 16).await?;
    let http = reqwest::Client::new();
    let token = gw.session_dropping_hosted_tools("gemini-1").await?;
    let base = format!("{}/v1beta/models/gemini-2.5-pro", gw.url);
    let request = |contents: &Vec<Value>| {
        json!({"systemInstruction": {"role": "user", "parts": [{"text": "You are Gemini CLI, a coding agent."}]},
            "contents": contents,
            "tools": [{"functionDeclarations": [{"name": "list_directory", "description": "List files",
                "parametersJsonSchema": {"type": "object", "properties": {"path": {"type": "string"}}}}]}, {"googleSearch": {}}],
            "generationConfig": {"temperature": 1.0, "topP": 1.0}})
    };
    let mut contents =
        vec![json!({"role": "user", "parts": [{"text": "What is in this folder?"}]})];
    // A default session refuses `googleSearch` in Google's error shape.
    let refused = http
        .post(format!("{base}:generateContent"))
        .header(
            "x-goog-api-key",
            gw.session("gemini-refused", "t", 0).await?,
        )
        .json(&request(&contents))
        .send()
        .await?;
    assert_hosted_tool_refused(refused, ("status", "INVALID_ARGUMENT"), "googleSearch").await?;
    for _ in 0..2 {
        let resp = http
            .post(format!("{base}:generateContent"))
            .header("x-goog-api-key", &token)
            .json(&request(&contents))
            .send()
            .await?;
        assert_eq!(resp.status(), 200);
        let r: Value = resp.json().await?;
        let cand = &r["candidates"][0];
        assert!(
            matches!(cand["finishReason"].as_str(), Some("STOP" | "MAX_TOKENS")),
            "{r}"
        );
        assert!(r["usageMetadata"]["promptTokenCount"]
            .as_u64()
            .is_some_and(|n| n > 0));
        let text: String = cand["content"]["parts"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p["text"].as_str())
            .collect();
        // Gemini CLI's history: the model turn with a call (no id), then the function's response.
        contents.push(json!({"role": "model", "parts": [{"text": text}, {"functionCall": {"name": "list_directory", "args": {"path": "."}}}]}));
        contents.push(json!({"role": "user", "parts": [{"functionResponse": {"name": "list_directory", "response": {"output": "calc.py"}}}]}));
    }
    // Streaming with alt=sse, the key in the query string.
    let body = http
        .post(format!("{base}:streamGenerateContent?alt=sse&key={token}"))
        .json(&request(&contents))
        .send()
        .await?
        .text()
        .await?;
    let chunks: Vec<Value> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    assert_eq!(chunks.len(), 1, "{body}");
    // Streaming without alt=sse: a JSON array.
    let array: Value = http
        .post(format!("{base}:streamGenerateContent"))
        .header("x-goog-api-key", &token)
        .json(&request(&contents))
        .send()
        .await?
        .json()
        .await?;
    assert!(
        array
            .as_array()
            .is_some_and(|a| a.len() == 1 && a[0]["candidates"].is_array()),
        "{array}"
    );
    // countTokens, in both of its body shapes, counts exactly the prompt the model sees.
    let counted: Value = http
        .post(format!("{base}:countTokens"))
        .header("x-goog-api-key", &token)
        .json(&request(&contents))
        .send()
        .await?
        .json()
        .await?;
    let wrapped: Value = http
        .post(format!("{base}:countTokens"))
        .header("x-goog-api-key", &token)
        .json(&json!({"generateContentRequest": request(&contents)}))
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(counted["totalTokens"], wrapped["totalTokens"]);
    // An unknown method is a 404 in Google's shape.
    let nope = http
        .post(format!("{base}:predictFuture"))
        .header("x-goog-api-key", &token)
        .json(&request(&contents))
        .send()
        .await?;
    assert_eq!(nope.status(), 404);
    assert_eq!(nope.json::<Value>().await?["error"]["status"], "NOT_FOUND");

    let capture = checked_capture(&gw, &http, "gemini-1", Api::Gemini, 4, 16).await?;
    // The last call repeats the third's prompt (a fork), so merge the first three.
    assert_one_agent_merges("gemini session", &capture.records[..3]);
    assert_eq!(
        counted["totalTokens"].as_u64(),
        Some(capture.records[3].prompt_token_ids.len() as u64),
        "{counted}"
    );
    Ok(())
}
