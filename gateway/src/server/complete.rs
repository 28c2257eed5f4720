//! The core of every model call, whatever the provider API: send the normalized request to
//! the upstream, read the sampled tokens, append the capture record durably, and only then
//! hand the answer back for the reply.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::sessions::Session;
use super::Gateway;
use crate::capture::{
    encode_line, Api, CaptureWriteError, CompletionRecord, CAPTURE_FORMAT_VERSION,
};
use crate::protocol::answer::read_answer;
use crate::protocol::upstream::{finalize_request, upstream_error};
use crate::protocol::ProtocolError;

/// The upstream answer (without its capture fields) and how long the upstream took.
pub struct Completed {
    pub response: Value,
    pub upstream: Duration,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Run one call to completion in its own task, so that a client disconnecting mid-call cannot
/// cancel the capture of tokens the model already sampled.
pub async fn complete(
    gateway: Arc<Gateway>,
    session: Arc<Session>,
    api: Api,
    original: Value,
    normalized: Map<String, Value>,
    keep_logprobs: bool,
) -> Result<Completed, ProtocolError> {
    let task = tokio::spawn(async move {
        call_and_capture(&gateway, &session, api, original, normalized, keep_logprobs).await
    });
    task.await
        .unwrap_or_else(|e| Err(ProtocolError::Capture(format!("call task failed: {e}"))))
}

async fn call_and_capture(
    gateway: &Gateway,
    session: &Arc<Session>,
    api: Api,
    original: Value,
    normalized: Map<String, Value>,
    keep_logprobs: bool,
) -> Result<Completed, ProtocolError> {
    let seq = session.next_seq();
    let started_at_ms = now_ms();
    let upstream_request = finalize_request(normalized, &session.upstream.limits)?;
    let t0 = Instant::now();
    let sent = gateway
        .http
        .post(format!(
            "{}/v1/chat/completions",
            session.upstream.url.trim_end_matches('/')
        ))
        .json(&upstream_request)
        .send()
        .await;
    let answer = match sent {
        Ok(r) => r,
        Err(e) if e.is_timeout() => return Err(ProtocolError::UpstreamTimeout),
        Err(e) => return Err(ProtocolError::Upstream(e.to_string())),
    };
    let status = answer.status().as_u16();
    let header_version: Option<u64> = answer
        .headers()
        .get("x-floe-policy-version")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let text = answer.text().await.map_err(|e| {
        if e.is_timeout() {
            ProtocolError::UpstreamTimeout
        } else {
            ProtocolError::Upstream(e.to_string())
        }
    })?;
    let upstream = t0.elapsed();
    gateway
        .metrics
        .upstream_seconds
        .with_label_values(&[api_label(api)])
        .observe(upstream.as_secs_f64());
    if status != 200 {
        return Err(upstream_error(status, &text));
    }
    let answer = read_answer(&text, session.upstream.limits.kind, keep_logprobs)?;
    let sampled = answer.sampled;
    let response = as_received(text)?;
    let record = CompletionRecord {
        v: CAPTURE_FORMAT_VERSION,
        session: session.meta.session.clone(),
        seq,
        api,
        started_at_ms,
        finished_at_ms: now_ms(),
        upstream_ms: upstream.as_millis() as u64,
        model: sampled.model,
        policy_version: header_version.or(sampled.policy_version),
        prompt_token_ids: sampled.prompt_token_ids,
        completion_token_ids: sampled.token_ids,
        logprobs: sampled.logprobs,
        finish_reason: sampled.finish_reason,
        unparsed_tool_call: sampled.unparsed_tool_call,
        request: original,
        normalized_request: upstream_request,
        response: &*response,
    };
    let t_capture = Instant::now();
    let capture_err = |e: CaptureWriteError| ProtocolError::Capture(e.to_string());
    let line = encode_line(&record).map_err(capture_err)?;
    if session.capture_blocks() {
        let writer = session.clone();
        tokio::task::spawn_blocking(move || writer.capture_line(&line))
            .await
            .map_err(|e| ProtocolError::Capture(e.to_string()))?
            .map_err(capture_err)?;
    } else {
        session.capture_line(&line).map_err(capture_err)?;
    }
    gateway
        .metrics
        .capture_write_seconds
        .with_label_values(&[api_label(api)])
        .observe(t_capture.elapsed().as_secs_f64());
    Ok(Completed {
        response: answer.reply,
        upstream,
    })
}

/// The answer's own text for the capture record, written as it came (no re-encoding), unless
/// it has line breaks between its tokens: the capture is one record per line.
fn as_received(text: String) -> Result<Box<RawValue>, ProtocolError> {
    let malformed =
        |e: serde_json::Error| ProtocolError::Upstream(format!("answer is not JSON: {e}"));
    if text.bytes().any(|b| b == b'\n' || b == b'\r') {
        let value: Value = serde_json::from_str(&text).map_err(malformed)?;
        serde_json::value::to_raw_value(&value).map_err(malformed)
    } else {
        RawValue::from_string(text).map_err(malformed)
    }
}

pub fn api_label(api: Api) -> &'static str {
    match api {
        Api::Anthropic => "anthropic",
        Api::OpenaiChat => "openai_chat",
        Api::OpenaiResponses => "openai_responses",
        Api::Gemini => "gemini",
    }
}
