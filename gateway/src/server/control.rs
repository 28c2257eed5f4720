//! The control API the operator (or `floe run`) uses: create, inspect, close and forget
//! sessions. Authenticated with the gateway's control token; sessions exist only through it.

use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::reply::error;
use super::session_store::shipment;
use super::sessions::SessionError;
use super::Gateway;
use crate::capture::SessionMeta;

/// Layer on every control route: the operator's bearer token, or 401.
pub async fn require_control_token(
    State(gateway): State<Arc<Gateway>>,
    request: Request,
    next: Next,
) -> Response {
    if crate::bearer::carries(request.headers(), &gateway.config.control_token) {
        crate::serve_limited::Vouch::for_request(&request);
        next.run(request).await
    } else {
        error(
            StatusCode::UNAUTHORIZED,
            "control API needs `Authorization: Bearer <control token>`",
        )
    }
}

pub async fn readyz(State(gateway): State<Arc<Gateway>>) -> Response {
    let runner_ready = !gateway.config.require_runner_ready
        || gateway
            .runner_ready
            .load(std::sync::atomic::Ordering::SeqCst);
    match std::fs::metadata(&gateway.config.capture_dir) {
        Ok(m) if m.is_dir() && runner_ready => "ok".into_response(),
        Ok(m) if m.is_dir() => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the sandbox runner has not finished preparing",
        ),
        _ => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "capture directory is missing",
        ),
    }
}

/// The sandbox runner finished the pool's prepare steps: the pod may count as READY.
/// `POST /floe/v1/runner/ready`, with what the runner found at start: `egressUnrestricted`
/// says what it reached that the pod's egress policy should refuse.
#[derive(Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunnerReady {
    #[serde(default)]
    egress_unrestricted: Option<String>,
}

pub async fn runner_ready(
    State(gateway): State<Arc<Gateway>>,
    body: Option<Json<RunnerReady>>,
) -> Response {
    let found = body.map(|Json(b)| b).unwrap_or_default();
    if let Some(what) = &found.egress_unrestricted {
        tracing::warn!("this pod's egress is not restricted: {what}");
    }
    gateway
        .metrics
        .set_egress_unrestricted(found.egress_unrestricted.is_some());
    gateway
        .runner_ready
        .store(true, std::sync::atomic::Ordering::SeqCst);
    Json(json!({"ready": true})).into_response()
}

pub async fn metrics(State(gateway): State<Arc<Gateway>>) -> Response {
    gateway
        .metrics
        .set_sessions_open(gateway.sessions.open_count());
    let page = gateway.metrics.render();
    *crate::sync::lock(&gateway.last_scrape) = Some(page.clone());
    gateway.scraped.notify_waiters();
    ([("content-type", "text/plain; version=0.0.4")], page).into_response()
}

/// `POST /floe/v1/sessions`: the session's identity, and optionally its upstream settings (what
/// an assignment's `upstream` would set).
#[derive(serde::Deserialize)]
struct CreateSession {
    #[serde(flatten)]
    meta: SessionMeta,
    #[serde(default)]
    upstream: Option<crate::ship::UpstreamOverride>,
}

pub async fn create_session(
    State(gateway): State<Arc<Gateway>>,
    body: axum::body::Bytes,
) -> Response {
    let CreateSession { meta, upstream } = match serde_json::from_slice(&body) {
        Ok(m) => m,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("body must be {{\"session\": ID, \"task\": …}}: {e}"),
            )
        }
    };
    let gw = gateway.clone();
    let created = tokio::task::spawn_blocking(move || {
        gw.sessions.create(
            &gw.config.capture_dir,
            meta,
            gw.config.durability,
            gw.upstream_for(upstream.as_ref()),
        )
    })
    .await;
    match created {
        Ok(Ok((session, fresh))) => {
            let status = if fresh {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            (
                status,
                Json(json!({"session": session.meta.session, "token": session.token})),
            )
                .into_response()
        }
        Ok(Err(e @ SessionError::BadId(_))) => error(StatusCode::BAD_REQUEST, e.to_string()),
        Ok(Err(e)) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

pub async fn get_session(State(gateway): State<Arc<Gateway>>, Path(id): Path<String>) -> Response {
    match gateway.sessions.get(&id) {
        Some(s) => {
            let mut value = json!({
                "session": s.meta.session, "task": s.meta.task, "group": s.meta.group, "sample": s.meta.sample,
                "calls": s.calls(), "open": s.is_open(), "capture_dir": s.dir,
                "shipment": shipment(&gateway, &id),
            });
            // Why a trajectory still waits (or was refused): the last failed delivery's cause.
            if let Some(error) = gateway.delivery_error(&id) {
                value["shipmentError"] = json!(error);
            }
            Json(value).into_response()
        }
        None => error(StatusCode::NOT_FOUND, format!("no session {id:?}")),
    }
}

async fn close(gateway: &Arc<Gateway>, id: &str, forget: bool) -> Response {
    let session = if forget {
        gateway.sessions.remove(id)
    } else {
        gateway.sessions.get(id)
    };
    let Some(session) = session else {
        return error(StatusCode::NOT_FOUND, format!("no session {id:?}"));
    };
    let calls = session.calls();
    let s = session.clone();
    match tokio::task::spawn_blocking(move || s.close()).await {
        Ok(Ok(())) => Json(json!({"session": id, "calls": calls, "sealed": true})).into_response(),
        Ok(Err(e)) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// Seal the capture; the session's token stops working.
pub async fn close_session(
    State(gateway): State<Arc<Gateway>>,
    Path(id): Path<String>,
) -> Response {
    close(&gateway, &id, false).await
}

/// Seal and forget the session (its capture stays on disk).
pub async fn delete_session(
    State(gateway): State<Arc<Gateway>>,
    Path(id): Path<String>,
) -> Response {
    close(&gateway, &id, true).await
}
