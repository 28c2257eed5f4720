//! `floe policy-proxy`: the only door into a trainer pod's vLLM. vLLM runs in dev mode there
//! (the trainer needs `/pause`, `/collective_rpc`, `/reset_prefix_cache`, `/resume` to push
//! weights), and those endpoints must not be reachable from sandbox pods, which run untrusted
//! agent code. So vLLM listens on the pod's loopback, and this proxy publishes an allow-list
//! of inference and read-only paths on the policy Service; anything else is 403.
//!
//! It also says which policy sampled each completion: before forwarding a completion it reads
//! the weight version vLLM serves (`/weight_info`, dev mode; the trainer sets it while
//! generation is paused for each push) and returns it as `x-floe-policy-version`, which the
//! gateways record. Read before the call, the label is never newer than the weights that
//! sampled it: a completion held in vLLM's queue during a push is labelled one version older
//! than it is (conservative for `maxStaleness`); none is labelled newer. A read that fails
//! falls back on the last version read, which a vLLM restarted since would make newer than
//! its weights: such a completion is asked about again after it ([`label`]).
//!
//! With a token (`FLOE_POLICY_TOKEN`, the job's: only its gateways have it), inference needs it
//! as a bearer token. An agent shares its pod's network with its gateway, so it reaches this
//! port too; without the token it cannot sample the policy past the gateway's capture.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{to_bytes, Body};
use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use clap::Args;
use serde_json::json;

#[derive(Args)]
pub struct PolicyProxyArgs {
    #[arg(long, default_value = "0.0.0.0:8000")]
    listen: SocketAddr,
    /// vLLM on the pod's loopback.
    #[arg(long, default_value = "http://127.0.0.1:8001")]
    upstream: String,
    /// Largest request body forwarded (harness prompts with long histories are large).
    #[arg(long, default_value_t = 64 << 20)]
    max_body_bytes: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum PolicyProxyError {
    #[error(transparent)]
    Serve(#[from] crate::serve_http::ServeError),
    #[error("cannot build the HTTP client: {0}")]
    Client(reqwest::Error),
}

/// What the gateways, the operator and Prometheus need from the policy server; everything
/// else vLLM serves (weights, pause, sleep, profiling, LoRA loading, aborts) stays in the pod.
pub fn allowed(method: &Method, path: &str) -> bool {
    match *method {
        Method::POST => matches!(
            path,
            "/v1/chat/completions" | "/v1/completions" | "/tokenize" | "/detokenize"
        ),
        Method::GET | Method::HEAD => {
            matches!(
                path,
                "/v1/models" | "/health" | "/ping" | "/version" | "/metrics"
            )
        }
        _ => false,
    }
}

struct Proxy {
    upstream: String,
    /// Demanded on every POST (inference, tokenization) when set.
    token: Option<String>,
    client: reqwest::Client,
    max_body_bytes: usize,
    /// Set once the upstream answered 404 to `/weight_info` (not vLLM in dev mode): no label.
    no_versions: AtomicBool,
    /// The last version `/weight_info` reported (`u64::MAX`: none yet).
    last_version: AtomicU64,
}

/// The job's token; inference without it is refused.
pub const POLICY_TOKEN_ENV: &str = "FLOE_POLICY_TOKEN";

/// The header the gateways read the policy version of a completion from.
pub const POLICY_VERSION_HEADER: &str = "x-floe-policy-version";

/// vLLM's weight version label as floe's policy version: `"default"` (nothing pushed yet: the
/// weights it loaded) is 0, a decimal label its number, anything else unknown.
pub fn policy_version(label: &str) -> Option<u64> {
    if label == "default" {
        return Some(0);
    }
    label.parse().ok()
}

fn samples(method: &Method, path: &str) -> bool {
    *method == Method::POST && matches!(path, "/v1/chat/completions" | "/v1/completions")
}

/// The weight version vLLM serves now, and whether it was read now (`false`: [`last`]).
/// When `/weight_info` does not answer in time (a loaded vLLM), the last version it reported:
/// versions only grow while it runs, so that label is never newer than the weights (the
/// module's promise); without it the completion would carry no version and escape
/// `maxStaleness`.
async fn served_version(proxy: &Proxy, wait: Duration) -> (Option<u64>, bool) {
    if proxy.no_versions.load(Ordering::Relaxed) {
        return (None, true);
    }
    let resp = match proxy
        .client
        .get(format!("{}/weight_info", proxy.upstream))
        .timeout(wait)
        .send()
        .await
    {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(last = ?last(proxy), "/weight_info did not answer ({e}): labelled with the last version read");
            return (last(proxy), false);
        }
    };
    if resp.status() == StatusCode::NOT_FOUND {
        tracing::warn!("the policy server has no /weight_info (not vLLM in dev mode): completions carry no policy version");
        proxy.no_versions.store(true, Ordering::Relaxed);
        return (None, true);
    }
    let read = match resp.json::<serde_json::Value>().await {
        Ok(body) => body["weight_version"].as_str().and_then(policy_version),
        Err(e) => {
            tracing::warn!(
                "/weight_info answer unreadable ({e}): labelled with the last version read"
            );
            None
        }
    };
    match read {
        Some(v) => {
            proxy.last_version.store(v, Ordering::Relaxed);
            (Some(v), true)
        }
        None => (last(proxy), false),
    }
}

/// The last version `/weight_info` reported.
fn last(proxy: &Proxy) -> Option<u64> {
    Some(proxy.last_version.load(Ordering::Relaxed)).filter(|v| *v != u64::MAX)
}

/// How long the read before a completion waits for `/weight_info`.
const READ_BEFORE: Duration = Duration::from_secs(5);
/// How long the read after one does: vLLM has just answered, so a short wait, and a loaded
/// vLLM's calls are not held much longer for it.
const READ_AFTER: Duration = Duration::from_secs(1);

/// The label of a completion whose version before it was `before` (`read`: read then). The
/// last version reported is never newer than the weights only while vLLM runs: one restarted
/// (its container, in the pod this proxy outlives it in) serves the weights it loaded,
/// `default`, and does not answer while it loads them. So a completion labelled so is asked
/// about again once vLLM has answered it, and keeps the older of the two. Only ever older:
/// read after the completion, a version may be newer than the weights that sampled it (a push
/// since), so a completion that had no label keeps none.
async fn label(proxy: &Proxy, before: Option<u64>, read: bool) -> Option<u64> {
    let Some(before) = before.filter(|_| !read) else {
        return before;
    };
    match served_version(proxy, READ_AFTER).await {
        (Some(after), true) => Some(before.min(after)),
        _ => Some(before),
    }
}

fn error(status: StatusCode, kind: &str, message: String) -> Response {
    // OpenAI's error shape: what vLLM's own clients (the gateways) already parse.
    let body = json!({"error": {"message": message, "type": kind, "code": status.as_u16()}});
    (status, axum::Json(body)).into_response()
}

async fn forward(State(proxy): State<Arc<Proxy>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path();
    if !allowed(&parts.method, path) {
        tracing::warn!(method = %parts.method, path, "refused: not served outside the trainer pod");
        return error(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!(
                "{} {path} is not served outside the trainer pod",
                parts.method
            ),
        );
    }
    if let Some(token) = &proxy.token {
        if floe_gateway::bearer::carries(&parts.headers, token) {
            // A gateway's: the agent's connections from its pod cannot crowd it out.
            floe_gateway::serve_limited::Vouch::for_extensions(&parts.extensions);
        } else if parts.method == Method::POST {
            return error(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "the policy server takes calls from the job's gateways only".into(),
            );
        }
    }
    let bytes = match to_bytes(body, proxy.max_body_bytes).await {
        Ok(b) => b,
        Err(_) => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "request_too_large",
                format!("request body over {} bytes", proxy.max_body_bytes),
            )
        }
    };
    let query = parts
        .uri
        .query()
        .map(|q| format!("?{q}"))
        .unwrap_or_default();
    let (version, read) = if samples(&parts.method, path) {
        served_version(&proxy, READ_BEFORE).await
    } else {
        (None, true)
    };
    let mut upstream = proxy
        .client
        .request(
            parts.method.clone(),
            format!("{}{path}{query}", proxy.upstream),
        )
        .body(bytes);
    if let Some(ct) = parts.headers.get(header::CONTENT_TYPE) {
        upstream = upstream.header(header::CONTENT_TYPE, ct);
    }
    let resp = match upstream.send().await {
        Ok(r) => r,
        Err(e) => {
            return error(
                StatusCode::BAD_GATEWAY,
                "upstream_unavailable",
                format!("the policy server did not answer: {e}"),
            )
        }
    };
    let status = resp.status();
    let content_type = resp.headers().get(header::CONTENT_TYPE).cloned();
    match resp.bytes().await {
        Ok(b) => {
            let version = label(&proxy, version, read).await;
            let mut out = Response::new(Body::from(b));
            *out.status_mut() = status;
            if let Some(ct) = content_type {
                out.headers_mut().insert(header::CONTENT_TYPE, ct);
            }
            if let Some(v) = version {
                out.headers_mut()
                    .insert(POLICY_VERSION_HEADER, header::HeaderValue::from(v));
            }
            out
        }
        Err(e) => error(
            StatusCode::BAD_GATEWAY,
            "upstream_unavailable",
            format!("the policy server's answer broke off: {e}"),
        ),
    }
}

pub fn router(
    upstream: &str,
    max_body_bytes: usize,
    token: Option<String>,
) -> Result<axum::Router, PolicyProxyError> {
    let client = reqwest::Client::builder()
        .pool_idle_timeout(Duration::from_secs(90))
        .build()
        .map_err(PolicyProxyError::Client)?;
    let proxy = Arc::new(Proxy {
        upstream: upstream.trim_end_matches('/').to_string(),
        token,
        client,
        max_body_bytes,
        no_versions: AtomicBool::new(false),
        last_version: AtomicU64::new(u64::MAX),
    });
    Ok(axum::Router::new().fallback(forward).with_state(proxy))
}

pub fn run(args: PolicyProxyArgs) -> Result<(), PolicyProxyError> {
    let token = floe_gateway::bearer::token_from_env(POLICY_TOKEN_ENV, "sample the policy");
    let app = router(&args.upstream, args.max_body_bytes, token)?;
    let what = format!("policy proxy to {}", args.upstream);
    Ok(crate::serve_http::serve_blocking(
        app,
        args.listen,
        floe_gateway::serve_limited::Limits::SHARED,
        2,
        &what,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use floe_gateway::serve_limited::{serve, Limits};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    /// The agent's pod shares its address with its gateway: connections it leaves half-sent
    /// on the policy proxy cannot keep out the gateway's calls (its session would fail as
    /// infrastructure, its loss unscored), nor close the gateway's connection once a call
    /// carried the job's token.
    #[tokio::test]
    async fn connections_left_half_sent_cannot_keep_out_the_gateways_calls() {
        let model = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let model_url = format!("http://{}", model.local_addr().expect("addr"));
        let tokenize = axum::Router::new().route(
            "/tokenize",
            axum::routing::post(|| async { axum::Json(json!({"tokens": [1, 2]})) }),
        );
        tokio::spawn(async move { axum::serve(model, tokenize).await });
        let proxy = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = proxy.local_addr().expect("addr");
        let app = router(&model_url, 1 << 20, Some("job-token".into())).expect("router");
        // Every connection here is this host's, as the agent's and its gateway's are one
        // peer's on a real proxy.
        let limits = Limits {
            this_host_share: 2,
            max_per_peer: 2,
            ..Limits::SHARED
        };
        tokio::spawn(serve(proxy, app, limits, std::future::pending()));
        let half_sent = || async move {
            let mut c = TcpStream::connect(addr).await.expect("connect");
            c.write_all(b"POST /tokenize HTTP/1.1\r\nHost: policy\r\n")
                .await
                .expect("write");
            tokio::time::sleep(Duration::from_millis(50)).await;
            c
        };
        async fn answered(c: &mut TcpStream) -> String {
            let call =
                "POST /tokenize HTTP/1.1\r\nHost: policy\r\nAuthorization: Bearer job-token\r\n\
                        Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}";
            c.write_all(call.as_bytes()).await.expect("write");
            // Until the answer's JSON is in, it closes, or 5 s pass.
            let mut got = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(5), async {
                let mut buf = [0u8; 4096];
                while !String::from_utf8_lossy(&got).contains("tokens") {
                    match c.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
            })
            .await;
            String::from_utf8_lossy(&got).into_owned()
        }
        let agent = [half_sent().await, half_sent().await];
        let mut gateway = TcpStream::connect(addr).await.expect("connect");
        let first = answered(&mut gateway).await;
        assert!(
            first.starts_with("HTTP/1.1 200") && first.contains("tokens"),
            "the gateway's call was kept out: {first:?}"
        );
        let more = [half_sent().await, half_sent().await, half_sent().await];
        // Past the grace a peer over its share is given (half a second): its oldest
        // connections not vouched for are closed by then.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let second = answered(&mut gateway).await;
        assert!(
            second.starts_with("HTTP/1.1 200") && second.contains("tokens"),
            "the gateway's vouched connection was closed: {second:?}"
        );
        drop((agent, more));
    }

    #[test]
    fn inference_and_read_only_paths_pass_and_weight_control_does_not() {
        for (m, p) in [
            (Method::POST, "/v1/chat/completions"),
            (Method::POST, "/v1/completions"),
            (Method::POST, "/tokenize"),
            (Method::GET, "/v1/models"),
            (Method::GET, "/health"),
            (Method::GET, "/metrics"),
        ] {
            assert!(allowed(&m, p), "{m} {p} should pass");
        }
        for (m, p) in [
            (Method::POST, "/pause"),
            (Method::POST, "/resume"),
            (Method::POST, "/collective_rpc"),
            (Method::POST, "/reset_prefix_cache"),
            (Method::POST, "/sleep"),
            (Method::POST, "/update_weights"),
            (Method::POST, "/init_weight_transfer_engine"),
            (Method::POST, "/v1/load_lora_adapter"),
            (Method::POST, "/start_profile"),
            (Method::POST, "/abort_requests"),
            (Method::GET, "/is_paused"),
            (Method::DELETE, "/v1/models"),
            (Method::GET, "/v1/chat/completions/../../pause"),
            (Method::POST, "/V1/chat/completions"),
        ] {
            assert!(!allowed(&m, p), "{m} {p} should be refused");
        }
    }

    #[test]
    fn vllm_weight_labels_are_policy_versions() {
        assert_eq!(policy_version("default"), Some(0));
        assert_eq!(policy_version("12"), Some(12));
        assert_eq!(policy_version("step-3"), None);
        assert_eq!(policy_version("-1"), None);
    }
}
