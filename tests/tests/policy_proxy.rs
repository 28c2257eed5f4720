//! `floe policy-proxy` (the trainer pod's door to its dev-mode vLLM) in front of the genuine
//! CPU vLLM, which runs with `VLLM_SERVER_DEV_MODE=1` exactly as in the trainer pod: a
//! gateway's calls go through with their token ids and logprobs, and the weight and pause
//! endpoints that really exist upstream are refused without reaching it. Inference needs the
//! job's token, which only the gateways get (in the assignment's upstream): an agent in the same
//! pod network is refused.

use anyhow::Result;
use floe_gateway::capture::read_session;
use floe_tests::processes::PolicyProxy;
use floe_tests::{vllm, TestGateway};
use serde_json::{json, Value};

/// The job's token (the operator's `<job>-token` Secret).
const JOB_TOKEN: &str = "the-jobs-token";

#[tokio::test]
async fn the_policy_proxy_serves_inference_and_fences_vllms_dev_endpoints() -> Result<()> {
    let upstream = &vllm().url;
    let proxy = PolicyProxy::start("127.0.0.1:0".parse()?, upstream, JOB_TOKEN).await?;
    let http = reqwest::Client::new();

    // A gateway session through the proxy: captured like a direct call.
    let gw = TestGateway::start(&proxy.url, 8).await?;
    let token = gw
        .session_with("proxied", "t", 0, json!({"apiKey": JOB_TOKEN}))
        .await?;
    let resp = http
        .post(format!("{}/v1/chat/completions", gw.url))
        .bearer_auth(&token)
        .json(&json!({"model": "policy", "max_tokens": 8,
                      "messages": [{"role": "user", "content": "Say hi."}]}))
        .send()
        .await?;
    assert_eq!(resp.status(), 200, "{}", resp.text().await?);
    gw.close("proxied").await?;
    let capture = read_session(&gw.capture_dir.join("proxied"))?;
    let call = capture.records.first().expect("one captured call");
    assert!(!call.prompt_token_ids.is_empty());
    assert_eq!(
        call.logprobs.as_ref().map(Vec::len),
        Some(call.completion_token_ids.len())
    );
    // The proxy labels the completion with the weights vLLM serves: nothing pushed to this
    // server, so its base weights, version 0 (the trainer's pushes are in local_train.rs).
    assert_eq!(call.policy_version, Some(0));

    // An agent sharing the pod's network, calling the policy past its gateway: without the
    // job's token, or with its own session token, it is refused in OpenAI's shape.
    for bearer in [None, Some(token.as_str())] {
        let mut call = http
            .post(format!("{}/v1/chat/completions", proxy.url))
            .json(&json!({"model": "policy", "max_tokens": 4,
                          "messages": [{"role": "user", "content": "hi"}]}));
        if let Some(b) = bearer {
            call = call.bearer_auth(b);
        }
        let refused = call.send().await?;
        assert_eq!(refused.status(), 401);
        let err: Value = refused.json().await?;
        assert_eq!(err["error"]["type"], "authentication_error", "{err}");
    }

    // Read-only paths pass without it; the tokenizer with it.
    for path in ["/v1/models", "/version", "/metrics"] {
        let r = http.get(format!("{}{path}", proxy.url)).send().await?;
        assert_eq!(r.status(), 200, "GET {path}");
    }
    let tok: Value = http
        .post(format!("{}/tokenize", proxy.url))
        .bearer_auth(JOB_TOKEN)
        .json(&json!({"model": "policy", "prompt": "hello"}))
        .send()
        .await?
        .json()
        .await?;
    assert!(
        tok["tokens"].as_array().is_some_and(|t| !t.is_empty()),
        "{tok}"
    );

    // The dev endpoints exist upstream (dev mode)...
    let is_paused = async || -> Result<Value> {
        let answer: Value = http
            .get(format!("{upstream}/is_paused"))
            .send()
            .await?
            .json()
            .await?;
        Ok(answer["is_paused"].clone())
    };
    assert_eq!(is_paused().await?, false);
    // ...and are refused at the proxy, in OpenAI's error shape, without reaching vLLM.
    for (path, body) in [
        ("/pause", json!({})),
        ("/collective_rpc", json!({"method": "reload_weights"})),
        ("/reset_prefix_cache", json!({})),
        ("/sleep", json!({})),
        ("/update_weights", json!({})),
    ] {
        let r = http
            .post(format!("{}{path}", proxy.url))
            .json(&body)
            .send()
            .await?;
        assert_eq!(r.status(), 403, "POST {path}");
        let err: Value = r.json().await?;
        assert!(
            err["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(path)),
            "{err}"
        );
    }
    assert_eq!(is_paused().await?, false, "the refused /pause reached vLLM");
    let still = http
        .post(format!("{}/v1/completions", proxy.url))
        .bearer_auth(JOB_TOKEN)
        .json(&json!({"model": "policy", "prompt": "1, 2, 3,", "max_tokens": 4}))
        .send()
        .await?;
    assert_eq!(still.status(), 200);
    Ok(())
}

/// A vLLM too loaded to answer `/weight_info` within the proxy's 5 s: the completion is
/// labelled with the last version it reported (never newer than the weights), not left
/// without a version that `maxStaleness` could judge. Unless vLLM, asked again once it has
/// answered the completion, says otherwise: one restarted behind the proxy (its container,
/// in the trainer pod the proxy outlives it in) serves the weights it loaded, `default`, and
/// does not answer while it loads them, so the last version read would label base-weight
/// samples as the trained policy's.
#[tokio::test]
async fn a_slow_weight_info_labels_with_the_last_version_read_unless_vllm_restarted() -> Result<()>
{
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let asked = Arc::new(AtomicUsize::new(0));
    let counter = asked.clone();
    let app = axum::Router::new()
        .route(
            "/weight_info",
            axum::routing::get(move || {
                let n = counter.fetch_add(1, Ordering::SeqCst);
                async move {
                    // 0: read at once; 1, 2: loaded; 3: restarted, loading; then the
                    // weights it loaded.
                    if (1..=3).contains(&n) {
                        tokio::time::sleep(std::time::Duration::from_secs(8)).await;
                    }
                    let label = if n >= 4 { "default" } else { "3" };
                    axum::Json(json!({"weight_version": label}))
                }
            }),
        )
        .route("/health", axum::routing::get(|| async { "ok" }))
        .route(
            "/v1/chat/completions",
            axum::routing::post(|| async { axum::Json(json!({"choices": []})) }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let upstream = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    let proxy = PolicyProxy::start("127.0.0.1:0".parse()?, &upstream, JOB_TOKEN).await?;
    let http = reqwest::Client::new();
    for (call, label) in [(1, "3"), (2, "3"), (3, "0")] {
        let resp = http
            .post(format!("{}/v1/chat/completions", proxy.url))
            .bearer_auth(JOB_TOKEN)
            .json(&json!({"model": "policy", "messages": []}))
            .send()
            .await?;
        assert_eq!(resp.status(), 200);
        assert_eq!(
            resp.headers()
                .get("x-floe-policy-version")
                .and_then(|v| v.to_str().ok()),
            Some(label),
            "completion {call}"
        );
    }
    assert_eq!(
        asked.load(Ordering::SeqCst),
        5,
        "one read for the first completion, two for each later one (both reads of the \
         second timed out, the first of the third)"
    );
    Ok(())
}
