//! The core of every model call, whatever the provider API: send the normalized request to
//! the upstream, read the sampled tokens, append the capture record durably, and only then
//! hand the answer back for the reply.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::sessions::Session;
use super::Gateway;
use crate::capture::upstream_errors::{self, UpstreamErrorRecord};
use crate::capture::{
    encode_line, Api, CaptureWriteError, CompletionRecord, CAPTURE_FORMAT_VERSION,
};
use crate::protocol::answer::read_answer;
use crate::protocol::retry::{parse_retry_after, Failure};
use crate::protocol::upstream::{finalize_request, upstream_error};
use crate::protocol::ProtocolError;

/// The upstream answer (without its capture fields) and how long the upstream took.
pub struct Completed {
    pub response: Value,
    pub upstream: Duration,
}

pub(super) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Run one call to completion in its own task, so that a client disconnecting mid-call cannot
/// cancel the capture of tokens the model already sampled; its place among the session's calls
/// in flight is given back when the task ends. A call whose caller is gone (this future
/// dropped: the harness gave up waiting, or exited) before the answer came is captured as
/// `abandoned`, which keeps it out of the trajectory: nobody acted on it. One whose caller
/// leaves after its record was written (a train job's reply waits for the session's snapshot
/// to reach the trainer) is noted beside the capture to the same effect
/// ([`crate::capture::left`]).
pub async fn complete(
    gateway: Arc<Gateway>,
    session: Arc<Session>,
    call: Call,
) -> Result<Completed, ProtocolError> {
    let (mut answer, answered) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let captured = call_and_capture(&gateway, &session, call, &|| answer.is_closed()).await;
        let (completed, mut captured) = match captured {
            Ok((completed, captured)) => (Ok(completed), captured),
            Err(e) => (Err(e), None),
        };
        if completed.is_ok() {
            // Before the reply: what the agent does with it comes after the call left the pod.
            let ship = super::snapshot::ship(&gateway, &session);
            tokio::pin!(ship);
            tokio::select! {
                // The caller's leaving first: one gone already is noted before the snapshot
                // reads the capture, which then leaves the call out.
                biased;
                () = answer.closed(), if captured.is_some() => {
                    // Noted as the caller leaves, not once the post is done: a harness that
                    // exited has its session closed meanwhile, and a note after that is late.
                    if let Some(call) = captured.take() {
                        left_after_capture(&gateway, &session, call);
                    }
                    ship.await;
                }
                () = &mut ship => {}
            }
        }
        if answer.send(completed).is_err() {
            if let Some(call) = captured {
                left_after_capture(&gateway, &session, call);
            }
        }
    });
    answered
        .await
        .unwrap_or_else(|e| Err(ProtocolError::Capture(format!("call task failed: {e}"))))
}

/// A call captured as answered: its API and its place in the session.
struct Captured {
    api: Api,
    seq: u64,
}

/// The caller of a call captured as answered left before its reply went out.
fn left_after_capture(gateway: &Gateway, session: &Session, call: Captured) {
    let Captured { api, seq } = call;
    gateway.metrics.request(api, "abandoned");
    let id = &session.meta.session;
    match session.note_left(seq, now_ms()) {
        Ok(true) => {
            tracing::info!(session = %id, seq, "the caller left after the call was captured, before its reply: noted as abandoned")
        }
        Ok(false) => {
            tracing::warn!(session = %id, seq, "the caller left after the call was captured, and the session was closed first: its trajectory has the call as answered")
        }
        Err(e) => {
            tracing::warn!(session = %id, seq, "the caller left after the call was captured; noting it failed, so its trajectory has the call as answered: {e}")
        }
    }
}

/// One model call as the harness made it.
pub struct Call {
    pub api: Api,
    pub original: Value,
    pub normalized: Map<String, Value>,
    pub keep_logprobs: bool,
    /// What the request asked for that could not go upstream (kept in the capture).
    pub dropped: Vec<String>,
    /// What the harness said the call is for (its request-class header), when it says.
    pub class: Option<String>,
    /// Its place among the session's calls in flight, held while the call runs.
    pub place: super::sessions::InFlight,
}

async fn call_and_capture(
    gateway: &Gateway,
    session: &Arc<Session>,
    call: Call,
    caller_gone: &(dyn Fn() -> bool + Sync),
) -> Result<(Completed, Option<Captured>), ProtocolError> {
    let Call {
        api,
        original,
        normalized,
        keep_logprobs,
        dropped,
        class,
        place: _place,
    } = call;
    let seq = session.admit_call().inspect_err(|spent| {
        tracing::warn!(session = %session.meta.session, "{spent}");
    })?;
    let started_at_ms = now_ms();
    let finalized = finalize_request(normalized, &session.upstream.limits)?;
    let upstream_request = finalized.request;
    let short_cap = finalized.short_cap;
    let mut dropped = dropped;
    for name in finalized.dropped_sampling {
        gateway.metrics.dropped(api, &format!("sampling:{name}"));
        dropped.push(format!("sampling:{name}"));
    }
    let t0 = Instant::now();
    let (header_version, text) = call_upstream(gateway, session, seq, &upstream_request).await?;
    let upstream = t0.elapsed();
    gateway.metrics.upstream_call(api, upstream);
    let answer = match read_answer(&text, session.upstream.limits.kind, keep_logprobs) {
        Ok(a) => a,
        Err(e) => {
            record_failure(gateway, session, seq, 1, &Failure::Malformed, None, &e);
            return Err(e);
        }
    };
    let sampled = answer.sampled;
    session.spend(sampled.prompt_token_ids.len() + sampled.token_ids.len());
    let response = as_received(text)?;
    let abandoned = caller_gone();
    if abandoned {
        tracing::info!(session = %session.meta.session, seq, "the caller left before the answer: captured as abandoned");
        gateway.metrics.request(api, "abandoned");
    }
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
        short_cap,
        abandoned,
        dropped,
        request_class: class,
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
    gateway.metrics.capture_written(api, t_capture.elapsed());
    let completed = Completed {
        response: answer.reply,
        upstream,
    };
    Ok((completed, (!abandoned).then_some(Captured { api, seq })))
}

/// One attempt's end: the answer, the request's own error (a 4xx: not retried, not the
/// infrastructure's), or a failure of the infrastructure.
enum Attempt {
    Answered {
        policy_version: Option<u64>,
        text: String,
    },
    Refused(ProtocolError),
    Failed {
        failure: Failure,
        retry_after: Option<Duration>,
        error: ProtocolError,
    },
}

/// Send the request upstream, retrying what the infrastructure failed (see
/// [`crate::protocol::retry`]) within the session's per-call deadline. Every failed attempt is
/// counted and written beside the capture; the last one is what the harness gets.
async fn call_upstream(
    gateway: &Gateway,
    session: &Session,
    seq: u64,
    request: &Value,
) -> Result<(Option<u64>, String), ProtocolError> {
    let deadline = Instant::now() + session.upstream.limits.call_deadline;
    let url = format!(
        "{}/v1/chat/completions",
        session.upstream.url.trim_end_matches('/')
    );
    let policy = session.upstream.limits.retry;
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        let remaining = deadline.saturating_duration_since(Instant::now());
        let (failure, retry_after, error) = match attempt_once(
            &gateway.http,
            &url,
            session.upstream.api_key.as_deref(),
            request,
            remaining,
        )
        .await
        {
            Attempt::Answered {
                policy_version,
                text,
            } => return Ok((policy_version, text)),
            Attempt::Refused(error) => return Err(error),
            Attempt::Failed {
                failure,
                retry_after,
                error,
            } => (failure, retry_after, error),
        };
        let remaining = deadline.saturating_duration_since(Instant::now());
        let delay = policy.next_delay(&failure, attempt, retry_after, remaining);
        record_failure(gateway, session, seq, attempt, &failure, delay, &error);
        match delay {
            Some(delay) => tokio::time::sleep(delay).await,
            None => return Err(error),
        }
    }
}

async fn attempt_once(
    http: &reqwest::Client,
    url: &str,
    api_key: Option<&str>,
    request: &Value,
    remaining: Duration,
) -> Attempt {
    let failed = |e: reqwest::Error| {
        let (failure, error) = if e.is_timeout() {
            (Failure::Timeout, ProtocolError::UpstreamTimeout)
        } else if e.is_connect() {
            (Failure::Connect, ProtocolError::Upstream(e.to_string()))
        } else {
            (Failure::Broken, ProtocolError::Upstream(e.to_string()))
        };
        Attempt::Failed {
            failure,
            retry_after: None,
            error,
        }
    };
    let mut post = http.post(url).timeout(remaining).json(request);
    if let Some(key) = api_key {
        post = post.bearer_auth(key);
    }
    let answer = match post.send().await {
        Ok(r) => r,
        Err(e) => return failed(e),
    };
    let status = answer.status().as_u16();
    let header = |name: &str| {
        answer
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let policy_version = header("x-floe-policy-version").and_then(|v| v.parse().ok());
    let retry_after = header("retry-after").and_then(|v| parse_retry_after(&v));
    let text = match answer.text().await {
        Ok(t) => t,
        Err(e) => return failed(e),
    };
    if status == 200 {
        return Attempt::Answered {
            policy_version,
            text,
        };
    }
    let error = upstream_error(status, &text);
    match Failure::from_status(status) {
        Some(failure) => Attempt::Failed {
            failure,
            retry_after,
            error,
        },
        None => Attempt::Refused(error),
    }
}

/// Count a failed attempt (metric, the session's `upstream-errors.jsonl`, a log line).
fn record_failure(
    gateway: &Gateway,
    session: &Session,
    seq: u64,
    attempt: u32,
    failure: &Failure,
    retry_in: Option<Duration>,
    error: &ProtocolError,
) {
    let kind = failure.kind();
    let retried = retry_in.is_some();
    let result = if retried { "retried" } else { "failed" };
    gateway.metrics.upstream_error(kind.as_str(), retried);
    tracing::warn!(session = %session.meta.session, seq, attempt, %kind, result, %error, "upstream call failed");
    let record = UpstreamErrorRecord {
        seq,
        attempt,
        kind,
        result: result.into(),
        message: error.to_string().chars().take(500).collect(),
        at_ms: now_ms(),
        retry_in_ms: retry_in.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
    };
    if let Err(e) = upstream_errors::append(&session.dir, &record) {
        tracing::error!(session = %session.meta.session, "cannot record an upstream failure: {e}");
    }
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
