//! A session's life beyond its model calls, without HTTP: the assignment arrives (operator →
//! gateway), the sandbox runner takes it, reports the outcome, and the gateway builds, spools
//! and ships the trajectory. Also what a gateway does when it starts (recover from disk) and
//! stops (give unfinished sessions an outcome so their captured calls are not lost).
//!
//! On disk, beside each session's capture:
//! `assignment.json` (assignment + token), `taken` (a runner took it), `outcome.json`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::sessions::SessionError;
use super::Gateway;
use crate::capture::upstream_errors::tally;
use crate::capture::{read_meta, read_session_slim, CompletionRecord, SessionMeta};
use crate::ship::{shipper, Assignment, Delivered, Sink, SpoolEntry};
use crate::trajectory::outcome::account_for_calls;
use crate::trajectory::{build_trajectory, BuildOptions, SessionInfo, SessionOutcome};

const ASSIGNMENT_FILE: &str = "assignment.json";
const TAKEN_FILE: &str = "taken";
const OUTCOME_FILE: &str = "outcome.json";

/// Why a session's assignment or outcome was not taken.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("no session {0:?}")]
    NoSession(String),
    #[error("session {0:?} was already assigned with different content")]
    AssignedDifferently(String),
    #[error("session {0:?} already has a different outcome")]
    DifferentOutcome(String),
    #[error(transparent)]
    BadSession(SessionError),
    #[error("{0}")]
    Queue(#[from] crate::ship::AssignmentError),
    /// Disk, or a record on it that cannot be read.
    #[error("{0}")]
    Storage(String),
}

fn storage(e: impl std::fmt::Display) -> StoreError {
    StoreError::Storage(e.to_string())
}

/// Create the session and queue its assignment for the runner: `(delivered, true)` when new,
/// `false` for a repeat of the same assignment (idempotent by session id). Blocking.
pub fn assign(gw: &Gateway, assignment: Assignment) -> Result<(Delivered, bool), StoreError> {
    if let Some(known) = gw.assignments.get(&assignment.session) {
        return if known.assignment == assignment {
            Ok((known, false))
        } else {
            Err(StoreError::AssignedDifferently(assignment.session))
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
            e @ SessionError::BadId(_) => StoreError::BadSession(e),
            other => storage(other),
        })?;
    let delivered = Delivered {
        assignment,
        token: session.token.clone(),
    };
    let bytes = serde_json::to_vec(&delivered).map_err(storage)?;
    crate::ship::write_durably(&session.dir.join(ASSIGNMENT_FILE), &bytes).map_err(storage)?;
    let fresh = gw.assignments.offer(delivered.clone(), false)?;
    Ok((delivered, fresh))
}

/// A runner took the session's assignment: remembered on disk, so a restarted gateway does
/// not offer it again.
pub fn mark_taken(gw: &Gateway, session: &str) -> Result<(), StoreError> {
    let dir = gw.config.capture_dir.join(session);
    std::fs::write(dir.join(TAKEN_FILE), b"").map_err(storage)
}

/// Record the outcome (once), build and spool the trajectory, start shipping it: the
/// session's summary, and whether the outcome is new. Blocking.
pub fn finish(
    gateway: &Arc<Gateway>,
    id: &str,
    outcome: SessionOutcome,
) -> Result<(serde_json::Value, bool), StoreError> {
    let this = gateway.finishing.of(id);
    let _guard = crate::sync::lock(&this);
    let session = gateway
        .sessions
        .get(id)
        .ok_or_else(|| StoreError::NoSession(id.to_string()))?;
    let path = session.dir.join(OUTCOME_FILE);
    if let Ok(bytes) = std::fs::read(&path) {
        let recorded: Option<SessionOutcome> = serde_json::from_slice(&bytes).ok();
        if recorded.as_ref() != Some(&outcome) {
            return Err(StoreError::DifferentOutcome(id.to_string()));
        }
        // Recorded, but its trajectory never reached the spool (the write failed: a full
        // disk, say): spooled now, as a restart's `recover` would, or a scored session would
        // never ship while its retry did the work again.
        if shipment(gateway, id) == "none" {
            let entry = spool_trajectory(gateway, &session.dir, id, &outcome)?;
            let summary = summary(gateway, id, Some(&entry));
            shipper::spawn(gateway.clone(), entry);
            return Ok((summary, false));
        }
        return Ok((summary(gateway, id, None), false));
    }
    session.close().map_err(storage)?;
    let bytes = serde_json::to_vec(&outcome).map_err(storage)?;
    crate::ship::write_durably(&path, &bytes).map_err(storage)?;
    let entry = spool_trajectory(gateway, &session.dir, id, &outcome)?;
    let summary = summary(gateway, id, Some(&entry));
    shipper::spawn(gateway.clone(), entry);
    Ok((summary, true))
}

/// Build the session's trajectory from its capture and put it in the spool.
fn spool_trajectory(
    gateway: &Gateway,
    dir: &Path,
    id: &str,
    outcome: &SessionOutcome,
) -> Result<SpoolEntry, StoreError> {
    let entry = trajectory_of(gateway, dir, id, outcome)?;
    gateway.spool.put(&entry).map_err(storage)?;
    Ok(entry)
}

/// The session's trajectory as its capture stands, with `outcome`, and where it goes (the
/// assignment's sink). Blocking: reads the capture.
pub(super) fn trajectory_of(
    gateway: &Gateway,
    dir: &Path,
    id: &str,
    outcome: &SessionOutcome,
) -> Result<SpoolEntry, StoreError> {
    let capture = read_session_slim(dir).map_err(storage)?;
    trajectory_from(gateway, dir, id, capture.meta, &capture.records, outcome)
}

/// The session's trajectory from `records` (its capture's, read already), with `outcome`.
pub(super) fn trajectory_from(
    gateway: &Gateway,
    dir: &Path,
    id: &str,
    meta: Option<SessionMeta>,
    records: &[CompletionRecord],
    outcome: &SessionOutcome,
) -> Result<SpoolEntry, StoreError> {
    let delivered = gateway.assignments.get(id);
    let meta = meta.unwrap_or_default();
    let info = SessionInfo {
        session: id.to_string(),
        task: meta.task,
        group: meta.group,
        sample: meta.sample,
        metadata: meta.metadata,
    };
    let (options, sink) = delivered
        .map(|d| {
            let options = BuildOptions {
                builder: d.assignment.builder,
                exclude_classes: d.assignment.exclude_classes,
                imitation: d.assignment.imitation,
                ..Default::default()
            };
            (options, d.assignment.sink)
        })
        .unwrap_or((BuildOptions::default(), Sink::None));
    let upstream = tally(dir).map_err(|e| storage(format!("{}: {e}", dir.display())))?;
    let outcome = account_for_calls(outcome.clone(), records.len(), &upstream);
    Ok(SpoolEntry {
        sink,
        trajectory: build_trajectory(&info, records, &options, &outcome),
        rejected: None,
    })
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
        if t.stats.abandoned_calls > 0 {
            value["abandonedCalls"] = json!(t.stats.abandoned_calls);
        }
        if t.stats.excluded_calls > 0 {
            value["excludedCalls"] = json!(t.stats.excluded_calls);
        }
        if !t.stats.calls_by_class.is_empty() {
            value["callsByClass"] = json!(t.stats.calls_by_class);
        }
        // The first and last policy version that sampled it (held-out rounds report them).
        if let (Some(first), Some(last)) = (t.policy_versions.first(), t.policy_versions.last()) {
            value["policyVersions"] = json!([first, last]);
        }
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

/// After a (re)start: bring back every assigned session from disk (open ones keep taking
/// calls with their old token), spool any outcome that was recorded but not spooled, and
/// resume shipping everything pending. Must run inside the runtime.
pub fn recover(gateway: &Arc<Gateway>) -> Result<usize, StoreError> {
    let root = &gateway.config.capture_dir;
    let mut restored = 0;
    for item in std::fs::read_dir(root).map_err(|e| storage(format!("{}: {e}", root.display())))? {
        let Ok(item) = item else { continue };
        let dir = item.path();
        let Ok(bytes) = std::fs::read(dir.join(ASSIGNMENT_FILE)) else {
            continue;
        };
        let delivered: Delivered = serde_json::from_slice(&bytes)
            .map_err(|e| storage(format!("{}: {e}", dir.join(ASSIGNMENT_FILE).display())))?;
        let id = delivered.assignment.session.clone();
        let meta = read_meta(&dir)
            .ok()
            .flatten()
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
            .map_err(storage)?;
        let taken = dir.join(TAKEN_FILE).exists();
        gateway.assignments.offer(delivered, taken)?;
        if let Ok(bytes) = std::fs::read(dir.join(OUTCOME_FILE)) {
            let outcome: SessionOutcome = serde_json::from_slice(&bytes)
                .map_err(|e| storage(format!("{}: {e}", dir.join(OUTCOME_FILE).display())))?;
            if shipment(gateway, &id) == "none" {
                spool_trajectory(gateway, &dir, &id, &outcome)?;
            }
        }
        restored += 1;
    }
    for entry in gateway.spool.pending().map_err(storage)? {
        shipper::spawn(gateway.clone(), entry);
    }
    Ok(restored)
}

/// Before [`recover`] in a resumed local run: every recorded assignment and pending
/// trajectory bound for a trainer goes to `to`, the trainer the resumed run started (a new
/// address and token; the interrupted run's trainer is gone). Returns how many were changed.
pub fn redirect_trainer(gateway: &Gateway, to: &Sink) -> Result<usize, StoreError> {
    let root = &gateway.config.capture_dir;
    let mut changed = 0;
    for item in std::fs::read_dir(root).map_err(|e| storage(format!("{}: {e}", root.display())))? {
        let Ok(item) = item else { continue };
        let path = item.path().join(ASSIGNMENT_FILE);
        let Ok(bytes) = std::fs::read(&path) else {
            continue;
        };
        let mut delivered: Delivered = serde_json::from_slice(&bytes)
            .map_err(|e| storage(format!("{}: {e}", path.display())))?;
        if matches!(delivered.assignment.sink, Sink::Trainer { .. })
            && delivered.assignment.sink != *to
        {
            delivered.assignment.sink = to.clone();
            let bytes = serde_json::to_vec(&delivered).map_err(storage)?;
            crate::ship::write_durably(&path, &bytes).map_err(storage)?;
            changed += 1;
        }
    }
    Ok(changed + gateway.spool.redirect_pending(to).map_err(storage)?)
}

/// On shutdown: every assigned session without an outcome gets an infrastructure-error
/// outcome (untrainable; its captured calls are kept and shipped, never as reward 0), then
/// wait up to `deadline` for the spool to drain. Returns how many are still pending.
pub async fn drain(gateway: &Arc<Gateway>, deadline: Duration) -> usize {
    abandon_unfinished(gateway, "the sandbox stopped before the session finished").await;
    let until = tokio::time::Instant::now() + deadline;
    loop {
        // Unreadable, the spool is taken as still holding one: the drain waits out its
        // deadline rather than leaving at once.
        let pending = gateway.spool.pending_count().unwrap_or(1);
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
