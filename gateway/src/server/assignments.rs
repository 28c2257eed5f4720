//! The assignment routes: the operator posts a session's assignment, the sandbox runner takes
//! it (long poll) and posts the outcome. Thin: the work is in [`super::session_store`].

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;

use super::reply::{error, task_failed};
use super::session_store;
use super::Gateway;
use crate::ship::Assignment;
use crate::trajectory::SessionOutcome;

/// The largest assignment the control port takes. Past axum's default (2 MiB): a SWE-bench
/// instance carries its test patch twice (in the instance and in its eval script), and hidden
/// files can be large; the route needs the control token, so the agent cannot use it.
pub const ASSIGNMENT_BODY_LIMIT: usize = 64 << 20;

/// `POST /floe/v1/assignments`: create the session and queue its assignment for the runner.
/// Idempotent by session id (200 for a repeat, 201 when new, 409 for different content).
pub async fn post_assignment(
    State(gateway): State<Arc<Gateway>>,
    body: axum::body::Bytes,
) -> Response {
    let assignment: Assignment = match serde_json::from_slice(&body) {
        Ok(a) => a,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("invalid assignment: {e}")),
    };
    let gw = gateway.clone();
    match tokio::task::spawn_blocking(move || session_store::assign(&gw, assignment)).await {
        Ok(Ok((delivered, fresh))) => (
            if fresh {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            },
            Json(json!({"session": delivered.assignment.session, "accepted": true})),
        )
            .into_response(),
        Ok(Err(refused)) => refused.into_response(),
        Err(e) => task_failed(e),
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NextQuery {
    #[serde(default = "default_wait")]
    wait_seconds: u64,
    /// Only this session's assignment (a local run starts one runner per session).
    #[serde(default)]
    session: Option<String>,
}

fn default_wait() -> u64 {
    30
}

/// `GET /floe/v1/assignments/next?waitSeconds=N[&session=ID]`: the runner's long poll. 200 with
/// `{"assignment": ..., "token": ...}`, or 204 when none arrived within N seconds (≤ 300).
pub async fn next_assignment(
    State(gateway): State<Arc<Gateway>>,
    Query(query): Query<NextQuery>,
) -> Response {
    let wait = Duration::from_secs(query.wait_seconds.min(300));
    let mut stopping = gateway.stopping.subscribe();
    let taken = tokio::select! {
        taken = gateway.assignments.take(wait, query.session.as_deref()) => taken,
        _ = stopping.wait_for(|s| *s) => {
            return error(StatusCode::SERVICE_UNAVAILABLE, "the gateway is stopping");
        }
    };
    match taken {
        Some(delivered) => match session_store::mark_taken(&gateway, &delivered.assignment.session)
        {
            Ok(()) => Json(delivered.for_the_runner()).into_response(),
            Err(e) => e.into_response(),
        },
        None => StatusCode::NO_CONTENT.into_response(),
    }
}

/// `POST /floe/v1/sessions/{id}/result` with a [`SessionOutcome`]: seal the capture, build the
/// trajectory with the assignment's builder, spool it and ship it. 202 with a summary; the
/// same outcome again is 200, a different one 409.
pub async fn post_result(
    State(gateway): State<Arc<Gateway>>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let outcome: SessionOutcome = match serde_json::from_slice(&body) {
        Ok(o) => o,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("invalid outcome: {e}")),
    };
    if gateway.sessions.get(&id).is_none() {
        return error(StatusCode::NOT_FOUND, format!("no session {id:?}"));
    }
    let gw = gateway.clone();
    match tokio::task::spawn_blocking(move || session_store::finish(&gw, &id, outcome)).await {
        Ok(Ok((summary, fresh))) => (
            if fresh {
                StatusCode::ACCEPTED
            } else {
                StatusCode::OK
            },
            Json(summary),
        )
            .into_response(),
        Ok(Err(refused)) => refused.into_response(),
        Err(e) => task_failed(e),
    }
}
