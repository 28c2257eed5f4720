//! A model server that breaks on command: a proxy in front of a real test upstream that can be
//! taken down (its port closed: connections refused, calls in flight cut) and brought back on
//! the same port, made to answer HTTP errors, or made to hang. What the fault-injection tests
//! put between `floe run` and the model.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;

#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// Forward every call.
    None,
    /// Answer this status to the next `n` chat completions (then forward).
    Status { status: u16, next: usize },
    /// Answer this status to every `k`-th chat completion.
    StatusEvery { status: u16, every: usize },
    /// Hold every chat completion this long before forwarding it.
    Hang(Duration),
}

struct Shared {
    target: String,
    fault: Mutex<Fault>,
    /// Chat completions that reached the proxy (answered or not).
    calls: AtomicUsize,
    http: reqwest::Client,
}

pub struct FaultProxy {
    pub url: String,
    addr: SocketAddr,
    shared: Arc<Shared>,
    server: Option<tokio::task::JoinHandle<()>>,
}

impl FaultProxy {
    pub async fn start(target: &str) -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            target: target.trim_end_matches('/').to_string(),
            fault: Mutex::new(Fault::None),
            calls: AtomicUsize::new(0),
            http: reqwest::Client::new(),
        });
        let mut proxy = Self {
            url: format!("http://{addr}"),
            addr,
            shared,
            server: None,
        };
        proxy.serve(listener);
        Ok(proxy)
    }

    fn serve(&mut self, listener: tokio::net::TcpListener) {
        let app = Router::new()
            .fallback(forward)
            .with_state(self.shared.clone());
        self.server = Some(tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        }));
    }

    pub fn set(&self, fault: Fault) {
        if let Ok(mut f) = self.shared.fault.lock() {
            *f = fault;
        }
    }

    pub fn calls(&self) -> usize {
        self.shared.calls.load(Ordering::SeqCst)
    }

    /// Kill the server: the port refuses connections, calls in flight are cut.
    /// (Every answer says `Connection: close`, so no pooled connection outlives this.)
    pub fn down(&mut self) {
        if let Some(server) = self.server.take() {
            server.abort();
        }
    }

    /// Start it again on the same port.
    pub async fn up(&mut self) -> anyhow::Result<()> {
        // The aborted task drops its listener asynchronously: retry the bind briefly.
        let mut last = None;
        for _ in 0..50 {
            match tokio::net::TcpListener::bind(self.addr).await {
                Ok(listener) => {
                    self.serve(listener);
                    return Ok(());
                }
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(anyhow::anyhow!("cannot rebind {}: {last:?}", self.addr))
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.down();
    }
}

/// Every answer closes its connection: a client reconnects for each call, as it must after a
/// real server was killed, so [`FaultProxy::down`] is seen by the next call.
async fn forward(
    state: State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let mut response = answer(state, method, uri, headers, body).await;
    response.headers_mut().insert(
        axum::http::header::CONNECTION,
        axum::http::HeaderValue::from_static("close"),
    );
    response
}

async fn answer(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if uri.path().ends_with("/chat/completions") {
        let n = shared.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let fault = shared
            .fault
            .lock()
            .map(|mut f| {
                let now = f.clone();
                if let Fault::Status { status, next } = &*f {
                    *f = if *next > 1 {
                        Fault::Status {
                            status: *status,
                            next: next - 1,
                        }
                    } else {
                        Fault::None
                    };
                }
                now
            })
            .unwrap_or(Fault::None);
        let failing = match fault {
            Fault::Status { status, .. } => Some(status),
            Fault::StatusEvery { status, every } if n % every.max(1) == 0 => Some(status),
            Fault::Hang(d) => {
                tokio::time::sleep(d).await;
                None
            }
            _ => None,
        };
        if let Some(status) = failing {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let body = serde_json::json!({"error": {"message": "injected fault", "code": status.as_u16()}});
            return (status, axum::Json(body)).into_response();
        }
    }
    let url = format!(
        "{}{}",
        shared.target,
        uri.path_and_query().map(|p| p.as_str()).unwrap_or("/")
    );
    let mut request = shared.http.request(method, url).body(body);
    if let Some(ct) = headers.get("content-type") {
        request = request.header("content-type", ct);
    }
    match request.send().await {
        Ok(answer) => {
            let status = answer.status();
            let ct = answer.headers().get("content-type").cloned();
            let bytes = answer.bytes().await.unwrap_or_default();
            let mut response = (status, bytes).into_response();
            if let Some(ct) = ct {
                response.headers_mut().insert("content-type", ct);
            }
            response
        }
        Err(e) => (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    }
}
