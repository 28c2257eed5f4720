//! Images through the gateway into a genuine vLLM vision-language model on CPU: a random tiny
//! Qwen2-VL (`scripts/vllm-cpu/prepare_models.py tiny-qwen2vl`: Qwen's tokenizer, Qwen2-VL's
//! chat template and image processor). Its words mean nothing; what is checked is that each
//! provider's image shape reaches the model as an image (vLLM expands it to the image's patch
//! tokens) and that the capture records exactly the tokens the model saw and sampled.

use anyhow::{Context, Result};
use floe_gateway::capture::{read_session, Api};
use floe_tests::{tokenize_at, vllm_vision, workspace_root, TestGateway};
use serde_json::{json, Value};

/// Qwen2-VL's `<|image_pad|>`: one per 2x2 block of 14-pixel patches.
const IMAGE_PAD: u32 = 151_655;

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// A checkered `side`x`side` PNG (tests/fixtures/images), base64.
fn image(side: u32) -> Result<String> {
    let path = workspace_root().join(format!("tests/fixtures/images/checks-{side}.png"));
    Ok(base64(
        &std::fs::read(&path).with_context(|| path.display().to_string())?,
    ))
}

/// Image tokens vLLM's Qwen2-VL processor gives a `side`x`side` image (14-pixel patches,
/// merged 2x2).
fn image_tokens(side: u32) -> usize {
    let patches = (side / 14) as usize;
    patches * patches / 4
}

#[test]
fn the_base64_encoder_is_standard() {
    assert_eq!(base64(b""), "");
    assert_eq!(base64(b"f"), "Zg==");
    assert_eq!(base64(b"fo"), "Zm8=");
    assert_eq!(base64(b"foo"), "Zm9v");
    assert_eq!(base64(b"foobar"), "Zm9vYmFy");
}

#[tokio::test]
async fn images_from_every_api_reach_the_vision_model_and_are_captured_token_exact() -> Result<()> {
    let vision = vllm_vision();
    let gw = TestGateway::start(&vision.url, 8).await?;
    let http = reqwest::Client::new();
    let token = gw.session("img-1", "t", 0).await?;
    let (small, large) = (image(56)?, image(112)?);
    let small_url = format!("data:image/png;base64,{small}");
    let large_url = format!("data:image/png;base64,{large}");
    // (path, body, images sent, the API the capture must name)
    let calls: Vec<(String, Value, Vec<u32>, Api)> = vec![
        (
            "/v1/chat/completions".into(),
            json!({"model": "gpt-5", "max_tokens": 8, "messages": [{"role": "user", "content": [
                {"type": "text", "text": "What is in this picture?"},
                {"type": "image_url", "image_url": {"url": small_url}}]}]}),
            vec![56],
            Api::OpenaiChat,
        ),
        (
            "/v1/messages".into(),
            json!({"model": "claude-sonnet-4-5", "max_tokens": 8, "system": "Describe images.",
                   "messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": small}},
                {"type": "text", "text": "And this one?"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": large}}]}]}),
            vec![56, 112],
            Api::Anthropic,
        ),
        (
            "/v1/responses".into(),
            json!({"model": "gpt-5", "max_output_tokens": 8, "input": [{"role": "user", "content": [
                {"type": "input_text", "text": "What is in this picture?"},
                {"type": "input_image", "image_url": large_url}]}]}),
            vec![112],
            Api::OpenaiResponses,
        ),
        (
            "/v1beta/models/gemini-2.5-pro:generateContent".into(),
            json!({"contents": [{"role": "user", "parts": [
                {"text": "What is in this picture?"},
                {"inlineData": {"mimeType": "image/png", "data": small}}]}],
                   "generationConfig": {"maxOutputTokens": 8}}),
            vec![56],
            Api::Gemini,
        ),
    ];
    for (path, body, _, _) in &calls {
        let resp = http
            .post(format!("{}{path}", gw.url))
            .bearer_auth(&token)
            .json(body)
            .send()
            .await?;
        let status = resp.status();
        let text = resp.text().await?;
        assert!(status.is_success(), "{path}: {status} {text}");
    }

    gw.close("img-1").await?;
    let capture = read_session(&gw.session_dir("img-1"))?;
    assert!(capture.sealed);
    assert_eq!(capture.records.len(), calls.len());
    for (r, (path, _, images, api)) in capture.records.iter().zip(&calls) {
        assert_eq!(r.api, *api, "{path}");
        // The model saw each image as its patch tokens, in order, and nothing else as one.
        let expected_pads: usize = images.iter().map(|s| image_tokens(*s)).sum();
        let pads = r
            .prompt_token_ids
            .iter()
            .filter(|t| **t == IMAGE_PAD)
            .count();
        assert_eq!(pads, expected_pads, "{path}: image tokens in the prompt");
        // ... and the captured prompt is exactly vLLM's own rendering of what went upstream.
        let rendered = tokenize_at(&http, &vision.url, &r.normalized_request["messages"]).await?;
        assert_eq!(
            r.prompt_token_ids, rendered,
            "{path}: captured prompt ids = vLLM /tokenize"
        );
        let logprobs = r.logprobs.as_ref().context("vLLM returned logprobs")?;
        assert!(!r.completion_token_ids.is_empty() && r.completion_token_ids.len() <= 8);
        assert_eq!(logprobs.len(), r.completion_token_ids.len(), "{path}");
    }
    Ok(())
}
