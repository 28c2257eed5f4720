//! The harness-facing model APIs. Each handler: authenticate the session token, read the body
//! within the size limit, normalize with its protocol module, run the shared call path, and
//! answer in the provider's own JSON or SSE shape. Errors are provider-shaped too.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::stream::{self, StreamExt};
use serde_json::{json, Value};

use super::complete::{complete, Call};
use super::metrics::api_label;
use super::sessions::Session;
use super::Gateway;
use crate::capture::Api;
use crate::protocol::{
    self, anthropic, gemini, openai_chat, openai_responses, HostedTools, Normalized, ProtocolError,
};

/// The session token, from whichever header the harness's SDK uses.
fn token(headers: &HeaderMap) -> Option<&str> {
    let header = |name| headers.get(name).and_then(|v| v.to_str().ok());
    header("x-api-key")
        .or_else(|| header("authorization").and_then(|v| v.strip_prefix("Bearer ")))
        .or_else(|| header("x-goog-api-key"))
        .map(str::trim)
}

/// The header Claude Code marks each request's purpose with (`main`, `subagent`,
/// `compaction`, `auxiliary`, …) when `CLAUDE_CODE_GATEWAY_HINT_HEADERS=1`, as its preset sets.
pub const REQUEST_CLASS_HEADER: &str = "x-claude-code-request-class";

/// The harness's own name for what a call is for, kept when it is a short lowercase word: the
/// agent can send any header, and the value becomes a count's key in every trajectory.
fn request_class(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(REQUEST_CLASS_HEADER)?.to_str().ok()?.trim();
    let word = (1..=32).contains(&value.len())
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    word.then(|| value.to_owned())
}

/// Google's SDKs may also send the key as `?key=`.
fn query_key(uri: &Uri) -> Option<&str> {
    uri.query()?
        .split('&')
        .find_map(|kv| kv.strip_prefix("key="))
}

fn fail(gateway: &Gateway, api: Api, error: &ProtocolError) -> Response {
    gateway.metrics.error(error.kind());
    let status = StatusCode::from_u16(error.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    gateway.metrics.request(api, status.as_str());
    (status, Json(error.body(api))).into_response()
}

/// A call admitted: its session, its body, and its place among the session's calls in flight
/// (held until the call is done, even after its client went).
struct Admitted {
    session: Arc<Session>,
    body: axum::body::Bytes,
    permit: super::sessions::InFlight,
}

/// Authenticate, take a place among the session's calls in flight, and read the body within
/// the limit (a place first, and the body's share of the bytes in flight by its
/// `Content-Length`: a session over either bound reads no more bodies).
async fn admit(gateway: &Gateway, api: Api, request: Request) -> Result<Admitted, ProtocolError> {
    let session = token(request.headers())
        .or_else(|| query_key(request.uri()))
        .and_then(|t| gateway.sessions.by_token(t))
        .ok_or(ProtocolError::Unauthorized)?;
    let permit =
        session
            .in_flight
            .clone()
            .try_acquire_owned()
            .map_err(|_| ProtocolError::TooManyCalls {
                limit: super::sessions::MAX_CALLS_IN_FLIGHT,
            })?;
    let limit = gateway.config.max_body_bytes;
    let declared = request
        .headers()
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if let Some(size) = declared.filter(|s| *s > limit) {
        return Err(ProtocolError::TooLarge { size, limit });
    }
    // Its share of the session's bytes in flight, by what it says it holds, before it is read.
    let in_flight = limit.saturating_mul(super::sessions::BODY_LIMITS_IN_FLIGHT);
    let mut permit = session.take_place(permit, declared.unwrap_or(0), in_flight)?;
    let body = read_charged(request.into_body(), limit, declared, &mut permit, in_flight).await?;
    gateway.metrics.bytes_in(api, body.len());
    Ok(Admitted {
        session,
        body,
        permit,
    })
}

/// Read a body within `limit`, charging the memory it takes to the session's bytes in flight
/// as it arrives: a body without a `Content-Length` (chunked) declares nothing up front, and charged
/// only once whole, sixteen of them could each hold up to the limit unfinished.
async fn read_charged(
    body: axum::body::Body,
    limit: usize,
    declared: Option<usize>,
    permit: &mut super::sessions::InFlight,
    in_flight: usize,
) -> Result<axum::body::Bytes, ProtocolError> {
    let mut read = Vec::with_capacity(declared.unwrap_or(0).min(limit));
    let mut pieces = body.into_data_stream();
    while let Some(piece) = pieces.next().await {
        let piece = piece.map_err(|e| {
            ProtocolError::InvalidRequest(format!("the request body could not be read: {e}"))
        })?;
        let size = read.len().saturating_add(piece.len());
        if size > limit {
            return Err(ProtocolError::TooLarge { size, limit });
        }
        if size > read.capacity() {
            // Grown as a Vec grows (doubling) but never past the limit; charged for what it
            // takes, not what it holds so far.
            let room = size.max(read.capacity().saturating_mul(2)).min(limit);
            permit.holds(room, in_flight)?;
            read.reserve_exact(room - read.len());
        }
        read.extend_from_slice(&piece);
    }
    Ok(read.into())
}

/// What differs between provider APIs on the call path; everything else is shared.
trait Wire {
    const API: Api;
    /// `uri` carries what some APIs put in the URL (Gemini's model, method and `alt`).
    fn normalize(body: Value, uri: &Uri) -> Result<Normalized, ProtocolError>;
    /// The provider-shaped JSON reply for an upstream Chat Completions response.
    fn reply(upstream: Value, n: &Normalized) -> Value;
    /// The same reply as SSE events: (event name, data).
    fn events(reply: &Value, n: &Normalized) -> Vec<(Option<String>, String)>;
}

struct OpenaiChat;

impl Wire for OpenaiChat {
    const API: Api = Api::OpenaiChat;
    fn normalize(body: Value, _: &Uri) -> Result<Normalized, ProtocolError> {
        openai_chat::normalize_value(body)
    }
    fn reply(upstream: Value, n: &Normalized) -> Value {
        openai_chat::response(upstream, &n.model, n.wants_logprobs)
    }
    fn events(reply: &Value, n: &Normalized) -> Vec<(Option<String>, String)> {
        openai_chat::stream_events(reply, n.include_usage)
            .into_iter()
            .map(|d| (None, d))
            .collect()
    }
}

struct Anthropic;

impl Wire for Anthropic {
    const API: Api = Api::Anthropic;
    fn normalize(body: Value, _: &Uri) -> Result<Normalized, ProtocolError> {
        anthropic::normalize_value(body)
    }
    fn reply(upstream: Value, n: &Normalized) -> Value {
        anthropic::response(&upstream, &n.model)
    }
    fn events(reply: &Value, _: &Normalized) -> Vec<(Option<String>, String)> {
        named_events(anthropic::stream_events(reply))
    }
}

struct OpenaiResponses;

impl Wire for OpenaiResponses {
    const API: Api = Api::OpenaiResponses;
    fn normalize(body: Value, _: &Uri) -> Result<Normalized, ProtocolError> {
        openai_responses::normalize_value(body)
    }
    fn reply(upstream: Value, n: &Normalized) -> Value {
        openai_responses::response(&upstream, n)
    }
    fn events(reply: &Value, _: &Normalized) -> Vec<(Option<String>, String)> {
        named_events(openai_responses::stream_events(reply))
    }
}

fn named_events(events: Vec<(String, Value)>) -> Vec<(Option<String>, String)> {
    events
        .into_iter()
        .map(|(name, data)| (Some(name), data.to_string()))
        .collect()
}

pub async fn responses(State(gateway): State<Arc<Gateway>>, request: Request) -> Response {
    handle::<OpenaiResponses>(gateway, request).await
}

struct Gemini;

impl Wire for Gemini {
    const API: Api = Api::Gemini;
    fn normalize(body: Value, uri: &Uri) -> Result<Normalized, ProtocolError> {
        let segment = uri.path().rsplit('/').next().unwrap_or_default();
        let not_found = || ProtocolError::NotFound(uri.path().to_string());
        let (model, method) = gemini::model_and_method(segment).ok_or_else(not_found)?;
        let sse = uri
            .query()
            .is_some_and(|q| q.split('&').any(|kv| kv == "alt=sse"));
        let mut n = match method {
            "generateContent" => gemini::normalize_value(body, model, false)?,
            "streamGenerateContent" => gemini::normalize_value(body, model, sse)?,
            _ => return Err(not_found()),
        };
        n.reply_as_array = method == "streamGenerateContent" && !sse;
        Ok(n)
    }
    fn reply(upstream: Value, n: &Normalized) -> Value {
        let reply = gemini::response(&upstream, &n.model);
        if n.reply_as_array {
            Value::Array(vec![reply])
        } else {
            reply
        }
    }
    fn events(reply: &Value, _: &Normalized) -> Vec<(Option<String>, String)> {
        vec![(None, reply.to_string())]
    }
}

pub async fn gemini(State(gateway): State<Arc<Gateway>>, request: Request) -> Response {
    let segment = request.uri().path().rsplit('/').next().unwrap_or_default();
    if let Some((model, "countTokens")) = gemini::model_and_method(segment) {
        let model = model.to_string();
        return count_tokens(
            &gateway,
            Api::Gemini,
            request,
            |body| gemini::normalize_count(body, &model),
            |n| json!({"totalTokens": n}),
        )
        .await;
    }
    handle::<Gemini>(gateway, request).await
}

pub async fn anthropic_count_tokens(
    State(gateway): State<Arc<Gateway>>,
    request: Request,
) -> Response {
    count_tokens(
        &gateway,
        Api::Anthropic,
        request,
        anthropic::normalize_count,
        |n| json!({"input_tokens": n}),
    )
    .await
}

/// Token counting: the upstream's own tokenization of the rendered prompt (`/tokenize`), so the
/// harness's context bookkeeping matches what the model will see. Nothing is sampled or captured.
async fn count_tokens(
    gateway: &Gateway,
    api: Api,
    request: Request,
    normalize: impl FnOnce(&[u8]) -> Result<Normalized, ProtocolError>,
    reply: impl FnOnce(u64) -> Value,
) -> Response {
    let counted = async {
        // Its place held until it is counted: `..` would drop it here, and any number of
        // counts would hold their bodies at once.
        let Admitted {
            session,
            body,
            permit: _place,
        } = admit(gateway, api, request).await?;
        let upstream = &session.upstream;
        // Counted as the call would send it: refused, or its media made a note, as there.
        let request = crate::protocol::upstream::finalize_request(normalize(&body)?.request, &upstream.limits)?.request;
        // A prefill (continued, not answered anew) renders without a new turn's prompt.
        let continued = request["continue_final_message"] == json!(true);
        let mut tokenize = json!({"model": upstream.limits.upstream_model, "messages": request["messages"],
                                  "add_generation_prompt": !continued, "continue_final_message": continued});
        // The template's switches too: Qwen3's with thinking off adds an empty think block.
        for key in ["tools", "chat_template_kwargs"] {
            if let Some(value) = request.get(key) {
                tokenize[key] = value.clone();
            }
        }
        let url = format!("{}/tokenize", upstream.url.trim_end_matches('/'));
        // Not retried (a count is advisory, and nothing is sampled), but bounded like a call.
        let mut post = gateway
            .http
            .post(url)
            .timeout(upstream.limits.call_deadline)
            .json(&tokenize);
        if let Some(key) = &upstream.api_key {
            post = post.bearer_auth(key);
        }
        let answer = post
            .send()
            .await
            .map_err(|e| ProtocolError::Upstream(e.to_string()))?;
        let status = answer.status().as_u16();
        let text = answer.text().await.map_err(|e| ProtocolError::Upstream(e.to_string()))?;
        if status != 200 {
            return Err(crate::protocol::upstream::upstream_error(status, &text));
        }
        serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v["count"].as_u64())
            .ok_or_else(|| ProtocolError::Upstream("tokenize answered without a count".into()))
    }
    .await;
    match counted {
        Ok(count) => {
            gateway.metrics.request(api, "200");
            Json(reply(count)).into_response()
        }
        Err(e) => fail(gateway, api, &e),
    }
}

/// `HEAD|GET /api/hello`: a connectivity probe some harnesses send before starting.
pub async fn hello() -> Response {
    Json(json!({"ok": true, "server": "floe-gateway"})).into_response()
}

pub async fn chat_completions(State(gateway): State<Arc<Gateway>>, request: Request) -> Response {
    handle::<OpenaiChat>(gateway, request).await
}

pub async fn messages(State(gateway): State<Arc<Gateway>>, request: Request) -> Response {
    handle::<Anthropic>(gateway, request).await
}

async fn handle<W: Wire>(gateway: Arc<Gateway>, request: Request) -> Response {
    let api = W::API;
    let t0 = Instant::now();
    let uri = request.uri().clone();
    let class = request_class(request.headers());
    let Admitted {
        session,
        body,
        permit,
    } = match admit(&gateway, api, request).await {
        Ok(ok) => ok,
        Err(e) => return fail(&gateway, api, &e),
    };
    // Parsed once: the normalizer takes a copy, the capture keeps the original.
    let original = match protocol::parse_body(&body) {
        Ok(v) => v,
        Err(e) => return fail(&gateway, api, &e),
    };
    let mut normalized = match W::normalize(original.clone(), &uri) {
        Ok(n) => n,
        Err(e) => return fail(&gateway, api, &e),
    };
    let hosted = normalized.hosted_tools();
    if !hosted.is_empty() && session.upstream.limits.hosted_tools == HostedTools::Reject {
        let refused = ProtocolError::InvalidRequest(format!(
            "hosted tool(s) {} cannot run here: the model is served by vLLM behind floe's gateway, which runs no provider-side tools. Turn them off in the harness's configuration, or set the job's spec.harness.hostedTools: Drop to drop them (counted in each trajectory as stats.dropped_hosted_tools)",
            hosted.join(", ")
        ));
        return fail(&gateway, api, &refused);
    }
    for what in &normalized.dropped {
        tracing::debug!(api = api_label(api), what, "dropped from the request");
        gateway.metrics.dropped(api, what);
    }
    let upstream_request = std::mem::take(&mut normalized.request);
    let call = complete(
        gateway.clone(),
        session,
        Call {
            api,
            original,
            normalized: upstream_request,
            keep_logprobs: normalized.wants_logprobs,
            dropped: normalized.dropped.clone(),
            class,
            place: permit,
        },
    );
    if !normalized.stream {
        return match call.await {
            Ok(done) => {
                // Serialized once: the same bytes are counted and sent.
                let body =
                    serde_json::to_vec(&W::reply(done.response, &normalized)).unwrap_or_default();
                finish(&gateway, api, t0, done.upstream, body.len());
                (
                    [(axum::http::header::CONTENT_TYPE, "application/json")],
                    body,
                )
                    .into_response()
            }
            Err(e) => fail(&gateway, api, &e),
        };
    }
    // Streaming: headers go out now; keep-alive comments flow until the answer is captured.
    let gw = gateway.clone();
    let events = stream::once(async move {
        let events: Vec<Event> = match call.await {
            Ok(done) => {
                let events = W::events(&W::reply(done.response, &normalized), &normalized);
                finish(
                    &gw,
                    api,
                    t0,
                    done.upstream,
                    events.iter().map(|(_, d)| d.len()).sum(),
                );
                events
                    .into_iter()
                    .map(|(name, data)| match name {
                        Some(name) => Event::default().event(name).data(data),
                        None => Event::default().data(data),
                    })
                    .collect()
            }
            Err(e) => {
                gw.metrics.error(e.kind());
                gw.metrics.request(api, "stream_error");
                let body = e.body(api);
                vec![match api {
                    Api::Anthropic => Event::default().event("error").data(body.to_string()),
                    Api::OpenaiResponses => {
                        let failed = crate::protocol::openai_responses::failed_event(
                            &body,
                            &normalized.model,
                            super::complete::now_ms() / 1000,
                        );
                        Event::default()
                            .event("response.failed")
                            .data(failed.to_string())
                    }
                    _ => Event::default().data(body.to_string()),
                }]
            }
        };
        stream::iter(events.into_iter().map(Ok::<_, Infallible>))
    })
    .flatten();
    Sse::new(events)
        .keep_alive(keep_alive(api).interval(gateway.config.keepalive))
        .into_response()
}

/// What keeps a stream alive while the upstream works, in a shape every official SDK of the
/// API skips: Anthropic's own `ping` event; for Gemini a bare blank line (google-genai for
/// Python parses every line that is not `data:` as JSON, so an SSE comment breaks it); an
/// SSE comment for OpenAI's APIs.
fn keep_alive(api: Api) -> KeepAlive {
    match api {
        Api::Anthropic => {
            KeepAlive::new().event(Event::default().event("ping").data(r#"{"type": "ping"}"#))
        }
        Api::Gemini => KeepAlive::new().event(Event::default()),
        Api::OpenaiChat | Api::OpenaiResponses => KeepAlive::new().text("keep-alive"),
    }
}

/// Count a successful call; `out_bytes` is the size of what goes back to the harness.
fn finish(
    gateway: &Gateway,
    api: Api,
    t0: Instant,
    upstream: std::time::Duration,
    out_bytes: usize,
) {
    let added = t0.elapsed().saturating_sub(upstream);
    gateway.metrics.answered(api, added, out_bytes);
}

/// `GET /v1/models`: the one model a session can call, under the name the harness expects.
pub async fn models(State(gateway): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    let Some(session) = token(&headers).and_then(|t| gateway.sessions.by_token(t)) else {
        return fail(&gateway, Api::OpenaiChat, &ProtocolError::Unauthorized);
    };
    let id = session.upstream.limits.upstream_model.clone();
    Json(json!({"object": "list", "data": [{"id": id, "object": "model", "created": 0, "owned_by": "floe"}]})).into_response()
}

/// Unknown paths get a 404 in the shape of the API the path looks like.
pub async fn not_found(State(gateway): State<Arc<Gateway>>, uri: Uri) -> Response {
    let path = uri.path();
    let api = if path.starts_with("/v1/messages") {
        Api::Anthropic
    } else if path.starts_with("/v1beta") {
        Api::Gemini
    } else {
        Api::OpenaiChat
    };
    fail(&gateway, api, &ProtocolError::NotFound(path.to_string()))
}
