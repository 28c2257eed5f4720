//! The gateway's SGLang upstream variant (`--upstream-kind sglang`): SGLang's capture switches
//! go out, and the token ids come back from SGLang's fields. SGLang itself does not run on these
//! machines, so `floe_tests::SglangShim` answers in SGLang 0.5's shape in front of the genuine
//! vLLM: the tokens are a real model's, only their place in the answer is SGLang's.

use anyhow::{Context, Result};
use floe_gateway::capture::{read_session, Api};
use floe_gateway::protocol::upstream::UpstreamKind;
use floe_tests::{tokenize, vllm, SglangShim, TestGateway, SHIM_WEIGHT_VERSION};
use serde_json::{json, Value};

#[tokio::test]
async fn an_sglang_upstream_is_captured_token_exact_through_two_apis() -> Result<()> {
    let shim = SglangShim::start(&vllm().url).await?;
    let gw = TestGateway::start_with_kind(&shim.url, 16, UpstreamKind::Sglang).await?;
    let http = reqwest::Client::new();
    let token = gw.session("sgl-1", "t", 0).await?;

    let chat: Value = http
        .post(format!("{}/v1/chat/completions", gw.url))
        .bearer_auth(&token)
        .json(&json!({"model": "gpt-5", "logprobs": true,
            "messages": [{"role": "user", "content": "What is 2+2?"}]}))
        .send()
        .await?
        .json()
        .await?;
    let choice = &chat["choices"][0];
    assert!(choice["message"]["content"].is_string(), "{chat}");
    // SGLang's capture fields stay between the gateway and the server.
    for field in ["prompt_token_ids", "meta_info", "token_ids"] {
        assert!(choice.get(field).is_none(), "{field} leaked: {chat}");
    }
    assert!(
        choice["logprobs"]["content"].is_array(),
        "asked-for logprobs kept"
    );

    let reply = http
        .post(format!("{}/v1/messages", gw.url))
        .bearer_auth(&token)
        .json(&json!({"model": "claude-sonnet-4-5", "max_tokens": 16,
            "messages": [{"role": "user", "content": "Name a colour."}]}))
        .send()
        .await?;
    assert!(reply.status().is_success(), "{}", reply.text().await?);

    gw.close("sgl-1").await?;
    let capture = read_session(&gw.session_dir("sgl-1"))?;
    assert_eq!(capture.records.len(), 2);
    for (r, api) in capture
        .records
        .iter()
        .zip([Api::OpenaiChat, Api::Anthropic])
    {
        assert_eq!(r.api, api);
        assert_eq!(r.normalized_request["return_prompt_token_ids"], true);
        assert_eq!(r.normalized_request["return_meta_info"], true);
        let expected = tokenize(&http, &r.normalized_request["messages"]).await?;
        assert_eq!(
            r.prompt_token_ids, expected,
            "captured prompt ids = the model's tokenization"
        );
        let logprobs = r.logprobs.as_ref().context("logprobs from meta_info")?;
        assert!(!r.completion_token_ids.is_empty() && r.completion_token_ids.len() <= 16);
        assert_eq!(logprobs.len(), r.completion_token_ids.len());
        assert!(logprobs.iter().all(|l| l.is_finite() && *l <= 0.0));
        assert_eq!(r.policy_version, Some(SHIM_WEIGHT_VERSION));
    }
    Ok(())
}

/// A gateway left on vLLM's kind in front of an SGLang server gets no token ids back: the
/// harness sees a provider-shaped error naming the switches, never a silent empty capture.
#[tokio::test]
async fn a_kind_mismatch_is_a_clear_error() -> Result<()> {
    let shim = SglangShim::start(&vllm().url).await?;
    let gw = TestGateway::start(&shim.url, 16).await?;
    let token = gw.session("sgl-2", "t", 0).await?;
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/messages", gw.url))
        .bearer_auth(&token)
        .json(&json!({"model": "claude", "max_tokens": 8,
            "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await?;
    let status = resp.status();
    let body: Value = resp.json().await?;
    assert!(
        status.is_client_error() || status.is_server_error(),
        "{status}"
    );
    assert_eq!(body["type"], "error", "Anthropic's error shape: {body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("return_prompt_token_ids"), "{body}");
    Ok(())
}
