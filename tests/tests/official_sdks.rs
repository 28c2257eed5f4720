//! The official provider SDKs as clients of the gateway, in front of the genuine CPU vLLM:
//! Python `openai`, `anthropic`, `google-genai` and Node `openai`, `@anthropic-ai/sdk`,
//! `@google/genai` (pinned in `scripts/sdks/install.sh`), each through its own typed client
//! and documented helpers (`tests/sdk/python_cases.py`, `tests/sdk/node_cases.cjs`). Every
//! case of every SDK passes; each usage the SDK reports equals the capture; every tool result
//! the model was shown answers a call it made; and `docs/gateway.md`'s compatibility table is
//! this suite's own output (`FLOE_UPDATE_DOCS=1` rewrites it).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use floe_gateway::capture::read_session;
use floe_tests::{vllm, workspace_root, Fault, FaultProxy, TestGateway};
use serde_json::{json, Value};

/// Each SDK and the API it speaks, as the drivers name them.
const COMBOS: [&str; 8] = [
    "python-openai/chat",
    "python-openai/responses",
    "python-anthropic/messages",
    "python-google-genai/gemini",
    "node-openai/chat",
    "node-openai/responses",
    "node-anthropic/messages",
    "node-google-genai/gemini",
];

/// Per SDK and API, the sessions its cases use: `main`, `usage` (one call, compared with the
/// capture), `slow` (an upstream that thinks 2.5 s: keep-alives flow), `fail429`/`fail5xx`
/// (an upstream that answers only that status: the gateway retries, then gives up).
const SESSION_KINDS: [&str; 5] = ["main", "usage", "slow", "fail429", "fail5xx"];

/// Cases an API has no counterpart for (the Responses API has no stop sequences; only the
/// Anthropic and Gemini APIs count tokens).
fn not_in_api(api: &str, case: &str) -> bool {
    matches!(
        (api, case),
        ("responses", "stop_sequence") | ("chat" | "responses", "count_tokens")
    )
}

fn sdk_dir() -> Result<PathBuf> {
    if let Ok(dir) = std::env::var("FLOE_SDK_DIR") {
        return Ok(dir.into());
    }
    let out = Command::new(workspace_root().join("scripts/sdks/install.sh")).output()?;
    anyhow::ensure!(
        out.status.success(),
        "installing the SDKs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?.trim().into())
}

/// `sdk==version` / `sdk@version` pins of the install script, by SDK name as the drivers use.
fn pinned_versions() -> Result<BTreeMap<String, String>> {
    let script = std::fs::read_to_string(workspace_root().join("scripts/sdks/install.sh"))?;
    let mut versions = BTreeMap::new();
    for (var, sep, lang) in [("PY_PINS=", "==", "python"), ("NODE_PINS=", "@", "node")] {
        let line = script
            .lines()
            .find(|l| l.starts_with(var))
            .with_context(|| format!("{var} in install.sh"))?;
        for pin in line[var.len()..].trim_matches('"').split_whitespace() {
            let (name, version) = pin.rsplit_once(sep).context("a pinned version")?;
            let short = name
                .trim_start_matches("@anthropic-ai/")
                .replace("@google/", "google-");
            let short = if short == "sdk" {
                "anthropic".into()
            } else {
                short
            };
            versions.insert(format!("{lang}-{short}"), version.to_string());
        }
    }
    Ok(versions)
}

/// Run a driver; its case lines, keyed by (sdk/api, case).
fn run_driver(mut cmd: Command) -> Result<Vec<Value>> {
    let out = cmd.output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<Value> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    if !out.status.success() || lines.is_empty() {
        bail!(
            "{cmd:?} exited {}:\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(lines)
}

/// The compatibility table: a row per case, a column per SDK and API (with its version).
fn compatibility_table(results: &[Value], versions: &BTreeMap<String, String>) -> String {
    let mut cases: Vec<&str> = Vec::new();
    for r in results {
        let case = r["case"].as_str().unwrap_or_default();
        if !cases.contains(&case) {
            cases.push(case);
        }
    }
    let mut table = String::from("| case |");
    for combo in COMBOS {
        let (sdk, api) = combo.split_once('/').unwrap_or((combo, ""));
        let version = versions.get(sdk).map(String::as_str).unwrap_or("?");
        table.push_str(&format!(" {sdk} {version} ({api}) |"));
    }
    table.push_str("\n|---|");
    table.push_str(&"---|".repeat(COMBOS.len()));
    for case in cases {
        table.push_str(&format!("\n| {case} |"));
        for combo in COMBOS {
            let (sdk, api) = combo.split_once('/').unwrap_or((combo, ""));
            let cell = results
                .iter()
                .find(|r| r["sdk"] == sdk && r["api"] == api && r["case"] == case)
                .map(|r| if r["ok"] == true { "pass" } else { "FAIL" })
                .unwrap_or(if not_in_api(api, case) {
                    "n/a"
                } else {
                    "missing"
                });
            table.push_str(&format!(" {cell} |"));
        }
    }
    table.push('\n');
    table
}

const TABLE_START: &str = "<!-- sdk-compatibility: generated by tests/tests/official_sdks.rs -->";
const TABLE_END: &str = "<!-- /sdk-compatibility -->";

/// `docs/gateway.md` holds `table` between its markers (rewritten with `FLOE_UPDATE_DOCS=1`).
fn check_docs(table: &str) -> Result<()> {
    let path = workspace_root().join("docs/gateway.md");
    let doc = std::fs::read_to_string(&path)?;
    let (head, rest) = doc.split_once(TABLE_START).context("table start marker")?;
    let (_, tail) = rest.split_once(TABLE_END).context("table end marker")?;
    let expected = format!("{head}{TABLE_START}\n{table}{TABLE_END}{tail}");
    if std::env::var("FLOE_UPDATE_DOCS").is_ok_and(|v| v == "1") {
        std::fs::write(&path, expected)?;
    } else {
        assert!(
            doc == expected,
            "docs/gateway.md's SDK table is not this suite's result; run with FLOE_UPDATE_DOCS=1:\n{table}"
        );
    }
    Ok(())
}

/// Every `tool` message sent upstream answers a call of an earlier assistant message.
fn orphan_tool_results(capture_dir: &Path, session: &str) -> Result<Vec<String>> {
    let capture = read_session(&capture_dir.join(session))?;
    let mut orphans = Vec::new();
    for r in &capture.records {
        let mut calls = Vec::new();
        for m in r.normalized_request["messages"]
            .as_array()
            .into_iter()
            .flatten()
        {
            for c in m["tool_calls"].as_array().into_iter().flatten() {
                calls.push(c["id"].clone());
            }
            if m["role"] == "tool" && !calls.contains(&m["tool_call_id"]) {
                orphans.push(format!("{session} seq {}: {m}", r.seq));
            }
        }
    }
    Ok(orphans)
}

#[tokio::test]
async fn every_official_sdk_path_works_through_the_gateway() -> Result<()> {
    let sdks = sdk_dir()?;
    let gw = TestGateway::start(&vllm().url, 64).await?;
    let slow = FaultProxy::start(&vllm().url).await?;
    slow.set(Fault::Hang(Duration::from_millis(2500)));
    let (busy, broken) = (
        FaultProxy::start(&vllm().url).await?,
        FaultProxy::start(&vllm().url).await?,
    );
    busy.set(Fault::Status {
        status: 429,
        next: usize::MAX,
    });
    broken.set(Fault::Status {
        status: 503,
        next: usize::MAX,
    });
    let mut sessions = serde_json::Map::new();
    let mut ids = BTreeMap::new();
    for combo in COMBOS {
        let mut tokens = serde_json::Map::new();
        for kind in SESSION_KINDS {
            let id = format!("{}-{kind}", combo.replace('/', "-"));
            let upstream = match kind {
                "slow" => json!({"url": slow.url}),
                "fail429" => json!({"url": busy.url, "callTimeoutSeconds": 2}),
                "fail5xx" => json!({"url": broken.url, "callTimeoutSeconds": 2}),
                _ => json!({}),
            };
            tokens.insert(
                kind.into(),
                gw.session_with(&id, "sdk", 0, upstream).await?.into(),
            );
            ids.insert((combo, kind), id);
        }
        sessions.insert(combo.into(), Value::Object(tokens));
    }
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("config.json");
    std::fs::write(
        &config,
        json!({"url": gw.url, "sessions": sessions}).to_string(),
    )?;

    // The two drivers run side by side (vLLM batches their calls; the slow and failing
    // upstreams' waits overlap), each blocking on its SDK's calls off the gateway's runtime.
    let here = workspace_root().join("tests/sdk");
    let mut python = Command::new(sdks.join("venv/bin/python"));
    python.arg(here.join("python_cases.py")).arg(&config);
    let mut js = Command::new("node");
    js.arg(here.join("node_cases.cjs")).arg(&sdks).arg(&config);
    let (py_results, js_results) = tokio::join!(
        tokio::task::spawn_blocking(move || run_driver(python)),
        tokio::task::spawn_blocking(move || run_driver(js)),
    );
    let mut results = py_results??;
    results.extend(js_results??);

    let failed: Vec<String> = results
        .iter()
        .filter(|r| r["ok"] != true)
        .map(|r| format!("{} {} {}: {}", r["sdk"], r["api"], r["case"], r["detail"]))
        .collect();
    assert!(
        failed.is_empty(),
        "failing SDK cases:\n{}",
        failed.join("\n\n")
    );
    for r in &results {
        eprintln!("{} {} {}: {}", r["sdk"], r["api"], r["case"], r["detail"]);
    }

    // The usage each SDK reports is the capture's token count of that call.
    for combo in COMBOS {
        let (sdk, api) = combo.split_once('/').unwrap_or((combo, ""));
        let reported = results
            .iter()
            .find(|r| r["sdk"] == sdk && r["api"] == api && r["case"] == "usage")
            .map(|r| r["usage"].clone())
            .with_context(|| format!("{combo}: a usage case"))?;
        let id = &ids[&(combo, "usage")];
        gw.close(id).await?;
        let capture = read_session(&gw.session_dir(id))?;
        assert_eq!(capture.records.len(), 1, "{combo}");
        let r = &capture.records[0];
        assert_eq!(
            reported,
            json!({"input": r.prompt_token_ids.len(), "output": r.completion_token_ids.len()}),
            "{combo}: usage = the capture"
        );
    }
    // What the model was shown pairs every tool result with its call, whatever the SDK's
    // helper sent (google-genai's Python helper sends no call id).
    let mut orphans = Vec::new();
    for combo in COMBOS {
        let id = &ids[&(combo, "main")];
        gw.close(id).await?;
        orphans.extend(orphan_tool_results(&gw.capture_dir, id)?);
    }
    assert!(
        orphans.is_empty(),
        "tool results answering no call: {orphans:#?}"
    );
    // The slow upstream was slow: the keep-alive cases outlived several keep-alive intervals.
    assert!(slow.calls() >= COMBOS.len(), "{} slow calls", slow.calls());

    check_docs(&compatibility_table(&results, &pinned_versions()?))
}
