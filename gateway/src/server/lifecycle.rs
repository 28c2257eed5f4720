//! A session's life beyond its model calls: the assignment arrives (operator → gateway), the
//! sandbox runner takes it (long poll), reports the outcome, and the gateway builds, spools and
//! ships the trajectory. Also what a gateway does when it starts (recover from disk) and stops
//! (give unfinished sessions an outcome so their captured calls are not lost).
//!
//! On disk, beside each session's capture:
//! `assignment.json` (assignment + token), `taken` (a runner took it), `outcome.json`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;

use super::control::error;
use super::Gateway;
use crate::capture::upstream_errors::tally;
use crate::capture::{read_session, SessionMeta};
use crate::ship::{deliver, Assignment, Delivered, DeliveryError, Sink, SpoolEntry};
use crate::trajectory::outcome::account_for_calls;
use crate::trajectory::{build_trajectory, BuildOptions, SessionInfo, SessionOutcome};

const ASSIGNMENT_FILE: &str = "assignment.json";
const TAKEN_FILE: &str = "taken";
const OUTCOME_FILE: &str = "outcome.json";

/// An error answer, decided in blocking code and rendered by the handler.
struct Refusal(StatusCode, String);

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        error(self.0, self.1)
    }
}

fn io_error(e: impl std::fmt::Display) -> Refusal {
    Refusal(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
}

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
    let created = tokio::task::spawn_blocking(move || -> Result<(Delivered, bool), Refusal> {
        if let Some(known) = gw.assignments.get(&assignment.session) {
            return if known.assignment == assignment {
                Ok((known, false))
            } else {
                Err(Refusal(
                    StatusCode::CONFLICT,
                    format!(
                        "session {:?} was already assigned with different content",
                        assignment.session
                    ),
                ))
            };
        }
        let meta = SessionMeta {
            session: assignment.session.clone(),
            task: assignment.task.clone(),
            group: assignment.group.clone(),
            sample: assignment.sample,
            metadata: assignment.metadata.clone(),
        };
        let (session, _) = gw
            .sessions
            .create(
                &gw.config.capture_dir,
                meta,
                gw.config.durability,
                gw.upstream_for(assignment.upstream.as_ref()),
            )
            .map_err(|e| match e {
                super::sessions::SessionError::BadId(_) => {
                    Refusal(StatusCode::BAD_REQUEST, e.to_string())
                }
                other => io_error(other),
            })?;
        let delivered = Delivered {
            assignment,
            token: session.token.clone(),
        };
        let bytes = serde_json::to_vec(&delivered).map_err(io_error)?;
        crate::ship::write_durably(&session.dir.join(ASSIGNMENT_FILE), &bytes).map_err(io_error)?;
        let fresh = gw
            .assignments
            .offer(delivered.clone(), false)
            .map_err(|e| Refusal(StatusCode::CONFLICT, e.to_string()))?;
        Ok((delivered, fresh))
    })
    .await;
    match created {
        Ok(Ok((delivered, fresh))) => (
            if fresh {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            },
            Json(json!({"session": delivered.assignment.session, "accepted": true})),
        )
            .into_response(),
        Ok(Err(refusal)) => refusal.into_response(),
        Err(e) => io_error(e).into_response(),
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
        Some(delivered) => {
            let dir = gateway
                .config
                .capture_dir
                .join(&delivered.assignment.session);
            if let Err(e) = std::fs::write(dir.join(TAKEN_FILE), b"") {
                return io_error(e).into_response();
            }
            Json(delivered).into_response()
        }
        None => StatusCode::NO_CONTENT.into_response(),
    }
}

/// `POST /floe/v1/sessions/{id}/result` with a [`SessionOutcome`]: seal the capture, build the
/// trajectory with the assignment's builder, spool it and ship it. 202 with a summary; the
/// same outcome again is 200, a different one 409.
pub async fn post_result(
    State(gateway): State<Arc<Gateway>>,
    UrlPath(id): UrlPath<String>,
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
    let finished = tokio::task::spawn_blocking(move || finish(&gw, &id, outcome)).await;
    match finished {
        Ok(Ok((summary, fresh))) => (
            if fresh {
                StatusCode::ACCEPTED
            } else {
                StatusCode::OK
            },
            Json(summary),
        )
            .into_response(),
        Ok(Err(refusal)) => refusal.into_response(),
        Err(e) => io_error(e).into_response(),
    }
}

/// Record the outcome (once), build and spool the trajectory, start shipping it. Blocking.
fn finish(
    gateway: &Arc<Gateway>,
    id: &str,
    outcome: SessionOutcome,
) -> Result<(serde_json::Value, bool), Refusal> {
    let _guard = gateway.finishing.lock().unwrap_or_else(|e| e.into_inner());
    let session = gateway
        .sessions
        .get(id)
        .ok_or_else(|| Refusal(StatusCode::NOT_FOUND, format!("no session {id:?}")))?;
    let path = session.dir.join(OUTCOME_FILE);
    if let Ok(bytes) = std::fs::read(&path) {
        let recorded: Option<SessionOutcome> = serde_json::from_slice(&bytes).ok();
        if recorded.as_ref() != Some(&outcome) {
            return Err(Refusal(
                StatusCode::CONFLICT,
                format!("session {id:?} already has a different outcome"),
            ));
        }
        return Ok((summary(gateway, id, None), false));
    }
    session.close().map_err(io_error)?;
    let bytes = serde_json::to_vec(&outcome).map_err(io_error)?;
    crate::ship::write_durably(&path, &bytes).map_err(io_error)?;
    let entry = spool_trajectory(gateway, &session.dir, id, &outcome).map_err(io_error)?;
    let summary = summary(gateway, id, Some(&entry));
    spawn_shipping(gateway.clone(), entry);
    Ok((summary, true))
}

/// Build the session's trajectory from its capture and put it in the spool.
fn spool_trajectory(
    gateway: &Gateway,
    dir: &Path,
    id: &str,
    outcome: &SessionOutcome,
) -> Result<SpoolEntry, String> {
    let capture = read_session(dir).map_err(|e| e.to_string())?;
    let delivered = gateway.assignments.get(id);
    let meta = capture.meta.unwrap_or_default();
    let info = SessionInfo {
        session: id.to_string(),
        task: meta.task,
        group: meta.group,
        sample: meta.sample,
        metadata: meta.metadata,
    };
    let (builder, sink) = delivered
        .map(|d| (d.assignment.builder, d.assignment.sink))
        .unwrap_or((Default::default(), Sink::None));
    let options = BuildOptions {
        builder,
        ..Default::default()
    };
    let upstream = tally(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let outcome = account_for_calls(outcome.clone(), capture.records.len(), &upstream);
    let entry = SpoolEntry {
        sink,
        trajectory: build_trajectory(&info, &capture.records, &options, &outcome),
        rejected: None,
    };
    gateway.spool.put(&entry).map_err(|e| e.to_string())?;
    Ok(entry)
}

fn summary(gateway: &Gateway, id: &str, entry: Option<&SpoolEntry>) -> serde_json::Value {
    let mut value = json!({"session": id, "shipment": shipment(gateway, id)});
    if let Some(entry) = entry {
        let t = &entry.trajectory;
        value["status"] = json!(t.status);
        value["reward"] = json!(t.reward);
        value["trainable"] = json!(t.trainable);
        value["completions"] = json!(t.stats.completions);
        value["traces"] = json!(t.stats.traces);
        value["sampledTokens"] = json!(t.stats.sampled_tokens);
        value["trainableTokens"] = json!(t.stats.trainable_tokens);
        if let Some(error) = t
            .evaluation
            .as_ref()
            .and_then(|e| e.detail["error"].as_str())
        {
            value["error"] = json!(error);
        }
    }
    if let Some(session) = gateway.sessions.get(id) {
        match tally(&session.dir) {
            Ok(upstream) if !upstream.is_empty() => value["upstreamErrors"] = json!(upstream),
            Ok(_) => {}
            Err(e) => tracing::warn!(session = %id, "upstream errors unreadable: {e}"),
        }
    }
    value
}

/// `pending`, `shipped`, `rejected` or `none` (no outcome yet).
pub fn shipment(gateway: &Gateway, id: &str) -> &'static str {
    if gateway.spool.is_shipped(id) {
        "shipped"
    } else if gateway.spool.is_pending(id) {
        "pending"
    } else if gateway.spool.is_rejected(id) {
        "rejected"
    } else {
        "none"
    }
}

/// Deliver a spooled trajectory, retrying with backoff until the sink accepts or refuses it.
/// One shipper per session at a time.
pub fn spawn_shipping(gateway: Arc<Gateway>, entry: SpoolEntry) {
    let id = entry.trajectory.session.clone();
    {
        let mut shipping = gateway.shipping.lock().unwrap_or_else(|e| e.into_inner());
        if !shipping.insert(id.clone()) {
            return;
        }
    }
    gateway.metrics.spool_pending.inc();
    tokio::spawn(async move {
        let mut backoff = Duration::from_millis(200);
        loop {
            match deliver(&gateway.http, &entry).await {
                Ok(target) => {
                    gateway.forget_delivery_error(&id);
                    match gateway.spool.mark_shipped(&id) {
                        Ok(_) => tracing::info!(session = %id, %target, "trajectory shipped"),
                        Err(e) => tracing::error!(session = %id, "shipped but not marked: {e}"),
                    }
                    gateway
                        .metrics
                        .trajectories
                        .with_label_values(&["shipped"])
                        .inc();
                    break;
                }
                Err(DeliveryError::Permanent(reason)) => {
                    tracing::error!(session = %id, %reason, "sink refused the trajectory; kept in the spool's rejected/");
                    gateway.note_delivery_error(&id, &reason);
                    if let Err(e) = gateway.spool.mark_rejected(entry.clone(), &reason) {
                        tracing::error!(session = %id, "cannot move to rejected/: {e}");
                    }
                    gateway
                        .metrics
                        .trajectories
                        .with_label_values(&["rejected"])
                        .inc();
                    break;
                }
                Err(DeliveryError::Retry(failure)) => {
                    tracing::warn!(session = %id, kind = %failure.kind, reason = %failure.message, retry_in = ?backoff, "delivery failed");
                    gateway
                        .metrics
                        .delivery_errors
                        .with_label_values(&[&failure.kind])
                        .inc();
                    gateway.note_delivery_error(&id, &failure.message);
                    gateway
                        .metrics
                        .trajectories
                        .with_label_values(&["retried"])
                        .inc();
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                }
            }
        }
        gateway.metrics.spool_pending.dec();
        gateway
            .shipping
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
    });
}

/// After a (re)start: bring back every assigned session from disk (open ones keep taking
/// calls with their old token), spool any outcome that was recorded but not spooled, and
/// resume shipping everything pending. Must run inside the runtime.
pub fn recover(gateway: &Arc<Gateway>) -> Result<usize, String> {
    let root = &gateway.config.capture_dir;
    let mut restored = 0;
    for item in std::fs::read_dir(root).map_err(|e| format!("{}: {e}", root.display()))? {
        let Ok(item) = item else { continue };
        let dir = item.path();
        let Ok(bytes) = std::fs::read(dir.join(ASSIGNMENT_FILE)) else {
            continue;
        };
        let delivered: Delivered = serde_json::from_slice(&bytes)
            .map_err(|e| format!("{}: {e}", dir.join(ASSIGNMENT_FILE).display()))?;
        let id = delivered.assignment.session.clone();
        let meta = read_session(&dir)
            .ok()
            .and_then(|c| c.meta)
            .unwrap_or_else(|| SessionMeta {
                session: id.clone(),
                ..Default::default()
            });
        gateway
            .sessions
            .restore(
                root,
                meta,
                gateway.config.durability,
                delivered.token.clone(),
                gateway.upstream_for(delivered.assignment.upstream.as_ref()),
            )
            .map_err(|e| e.to_string())?;
        let taken = dir.join(TAKEN_FILE).exists();
        gateway
            .assignments
            .offer(delivered, taken)
            .map_err(|e| e.to_string())?;
        if let Ok(bytes) = std::fs::read(dir.join(OUTCOME_FILE)) {
            let outcome: SessionOutcome = serde_json::from_slice(&bytes)
                .map_err(|e| format!("{}: {e}", dir.join(OUTCOME_FILE).display()))?;
            if shipment(gateway, &id) == "none" {
                spool_trajectory(gateway, &dir, &id, &outcome)?;
            }
        }
        restored += 1;
    }
    for entry in gateway.spool.pending().map_err(|e| e.to_string())? {
        spawn_shipping(gateway.clone(), entry);
    }
    Ok(restored)
}

/// On shutdown: every assigned session without an outcome gets an infrastructure-error
/// outcome (untrainable; its captured calls are kept and shipped, never as reward 0), then
/// wait up to `deadline` for the spool to drain. Returns how many are still pending.
pub async fn drain(gateway: &Arc<Gateway>, deadline: Duration) -> usize {
    abandon_unfinished(gateway, "the sandbox stopped before the session finished").await;
    let until = tokio::time::Instant::now() + deadline;
    loop {
        let pending = gateway.spool.pending().map(|p| p.len()).unwrap_or(0);
        if pending == 0 || tokio::time::Instant::now() >= until {
            if pending > 0 {
                tracing::warn!(pending, "stopping with trajectories still in the spool");
            }
            return pending;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Give every session without an outcome an infrastructure outcome (its captured calls are
/// shipped untrainable) and take its assignment out of the queue. Returns their ids.
pub async fn abandon_unfinished(gateway: &Arc<Gateway>, why: &str) -> Vec<String> {
    let unfinished: Vec<String> = gateway
        .assignments
        .all()
        .into_iter()
        .map(|(d, _)| d.assignment.session)
        .filter(|id| {
            !gateway
                .config
                .capture_dir
                .join(id)
                .join(OUTCOME_FILE)
                .exists()
        })
        .collect();
    for id in &unfinished {
        gateway.assignments.withdraw(id);
        let outcome = SessionOutcome::InfraError {
            message: why.to_string(),
        };
        let (gw, session) = (gateway.clone(), id.clone());
        let done =
            tokio::task::spawn_blocking(move || finish(&gw, &session, outcome).map(|_| ())).await;
        if !matches!(done, Ok(Ok(()))) {
            tracing::error!(session = %id, "could not record an outcome for an unfinished session");
        }
    }
    unfinished
}
