//! A stand-in for the trainer's ingest endpoint that records every delivery and can be made
//! to fail (503), to test the gateway's spool and retries. It is idempotent the way the real
//! trainer must be: a repeated session id is acknowledged (409) and not stored again. Snapshots
//! of running sessions (`POST /v1/partial`) are recorded apart, in the order they came.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use serde_json::Value;

#[derive(Default)]
struct Inner {
    down: AtomicBool,
    /// session → every body delivered for it (accepted or not).
    posts: Mutex<BTreeMap<String, Vec<Value>>>,
    /// session → every snapshot posted for it.
    partials: Mutex<BTreeMap<String, Vec<Value>>>,
    /// How long a snapshot's post takes before it is recorded and answered (ms).
    partial_delay_ms: AtomicU64,
}

#[derive(Clone)]
pub struct TestIngest {
    pub url: String,
    inner: Arc<Inner>,
}

impl TestIngest {
    pub async fn start() -> anyhow::Result<Self> {
        let inner = Arc::new(Inner::default());
        let app = Router::new()
            .route("/v1/trajectories", post(ingest))
            .route("/v1/partial", post(partial))
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}/v1/trajectories", listener.local_addr()?);
        tokio::spawn(async move { axum::serve(listener, app).await });
        Ok(Self { url, inner })
    }

    /// While down, every delivery gets 503 (and is still counted).
    pub fn set_down(&self, down: bool) {
        self.inner.down.store(down, Ordering::SeqCst);
    }

    /// Deliveries that reached the endpoint while it was up, per session.
    pub fn accepted(&self) -> BTreeMap<String, Vec<Value>> {
        self.inner
            .posts
            .lock()
            .map(|p| p.clone())
            .unwrap_or_default()
    }

    /// Each snapshot's post is recorded and answered only after `delay` (a slow trainer).
    pub fn set_partial_delay(&self, delay: std::time::Duration) {
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.inner.partial_delay_ms.store(ms, Ordering::SeqCst);
    }

    /// Snapshots of running sessions that reached `/v1/partial`, per session.
    pub fn partials(&self) -> BTreeMap<String, Vec<Value>> {
        self.inner
            .partials
            .lock()
            .map(|p| p.clone())
            .unwrap_or_default()
    }
}

async fn partial(State(inner): State<Arc<Inner>>, Json(body): Json<Value>) -> StatusCode {
    if inner.down.load(Ordering::SeqCst) {
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    let delay = inner.partial_delay_ms.load(Ordering::SeqCst);
    tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
    let session = body["session"].as_str().unwrap_or_default().to_string();
    let mut partials = inner.partials.lock().unwrap_or_else(|e| e.into_inner());
    partials.entry(session).or_default().push(body);
    StatusCode::OK
}

async fn ingest(State(inner): State<Arc<Inner>>, Json(body): Json<Value>) -> StatusCode {
    if inner.down.load(Ordering::SeqCst) {
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    let session = body["session"].as_str().unwrap_or_default().to_string();
    let mut posts = inner.posts.lock().unwrap_or_else(|e| e.into_inner());
    let seen = posts.entry(session).or_default();
    seen.push(body);
    if seen.len() > 1 {
        StatusCode::CONFLICT
    } else {
        StatusCode::OK
    }
}
