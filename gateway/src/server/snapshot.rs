//! A train job's session leaves the pod call by call. The kubelet kills a pod it evicts for
//! local storage with no grace period (SIGKILL), so a session whose agent filled its disk
//! would otherwise leave nothing behind: its group trains without it, and a policy that fills
//! its disk when it is losing would see its losses vanish instead of being pushed down.
//!
//! So after each call of a session whose sink is a trainer is captured, and before its reply
//! goes back to the harness, the gateway posts the session as it stands (status
//! `interrupted`: untrainable, no reward, masks as built) to the trainer's `POST /v1/partial`,
//! beside the ingest URL. Whatever the agent does with a reply, it does after the call that
//! reply answers left the pod. The trainer keeps the latest snapshot of each session without
//! a trajectory and trains it as a loss (reward 0) only when the operator reports that the
//! session failed by the agent's own doing; the session's own trajectory replaces it otherwise.
//!
//! Best effort: a snapshot not delivered within [`SNAPSHOT_TIMEOUT`] is counted
//! (`floe_gateway_snapshots_total{result="failed"}`) and the reply goes on; for
//! [`SNAPSHOT_BACKOFF`] after that the session's calls do not wait for another try (a slow or
//! lost trainer must not turn into sessions that time out, which would train as losses). A
//! call whose record an earlier call's snapshot already carried (calls in flight at once)
//! waits for nothing more.
//!
//! Each snapshot reads only the calls captured since the last ([`crate::capture::CaptureTail`],
//! their bodies dropped), so building it costs the session's records, not its whole capture
//! file again.
//!
//! A trainer that says it takes deltas (`"deltas": true` in its answer) is sent each next
//! snapshot as the change to the last one it took (`POST /v1/partial/delta`,
//! [`snapshot_delta`]), so a session posts about its own size in all, not its calls times its
//! size; one that holds another base answers 409, and one that takes none 404, and is sent
//! the whole snapshot, within the same deadline. A call that added nothing to the snapshot
//! taken (its session's new calls abandoned: in no trace) posts nothing.

use std::collections::hash_map::RandomState;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::sessions::{Session, Shipped};
use super::Gateway;
use crate::capture::read_meta;
use crate::ship::Sink;
use crate::trajectory::snapshot_delta::{self, SnapshotDelta, TraceMark};
use crate::trajectory::{SessionOutcome, Trajectory};

/// How long a call's reply may wait for its snapshot to reach the trainer.
pub const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(5);

/// After a snapshot that failed, how long the session's calls go on without trying again.
pub const SNAPSHOT_BACKOFF: Duration = Duration::from_secs(10);

/// The trainer's snapshot endpoint beside its ingest URL (`…/v1/trajectories`), or `None`
/// for a sink at another path (it is not floe's trainer).
pub fn partial_url(trajectories_url: &str) -> Option<String> {
    trajectories_url
        .strip_suffix("/v1/trajectories")
        .map(|base| format!("{base}/v1/partial"))
}

/// Post the session as it stands to its trainer, if its sink is one that takes snapshots (a
/// train job's, on a cluster) and it is still open.
pub async fn ship(gateway: &Arc<Gateway>, session: &Arc<Session>) {
    let id = session.meta.session.clone();
    let Some(delivered) = gateway.assignments.get(&id) else {
        return;
    };
    let Sink::Trainer {
        url,
        token,
        snapshots: true,
    } = delivered.assignment.sink
    else {
        return;
    };
    let Some(partial) = partial_url(&url) else {
        return;
    };
    // This call's record is written: a snapshot from now on carries it.
    let mine = session.captured_calls();
    let mut shipped = session.snapshot.lock().await;
    if !session.is_open() || shipped.captured >= mine {
        // It has its outcome (its trajectory is on its way), or a snapshot carried this call.
        return;
    }
    if shipped
        .failed_at
        .is_some_and(|at| at.elapsed() < SNAPSHOT_BACKOFF)
    {
        return failed(gateway, &id, "the last snapshot failed moments ago");
    }
    // Read before the capture: every record it counts is in what the build reads.
    let captured = session.captured_calls();
    let (gw, dir, sid) = (gateway.clone(), session.dir.clone(), id.clone());
    let (base, key) = (shipped.marks.clone(), shipped.key.clone());
    let base_calls = shipped.calls;
    let mut tail = std::mem::take(&mut shipped.tail);
    // Reading the new calls, then building, hashing and writing the session: CPU work.
    let prepared = tokio::task::spawn_blocking(move || {
        let outcome = SessionOutcome::Interrupted {
            message: "a snapshot of the session while it ran".into(),
        };
        let prepared = tail
            .read_more(&dir)
            .map_err(|e| e.to_string())
            .and_then(|()| read_meta(&dir).map_err(|e| e.to_string()))
            .and_then(|meta| {
                super::session_store::trajectory_from(
                    &gw,
                    &dir,
                    &sid,
                    meta,
                    tail.records(),
                    &outcome,
                )
                .map_err(|e| e.to_string())
            })
            .map(|entry| prepare(entry.trajectory, base.as_deref(), base_calls, &key));
        (tail, prepared)
    })
    .await;
    let mut prepared = match prepared {
        Ok((tail, prepared)) => {
            shipped.tail = tail;
            match prepared {
                Ok(prepared) => prepared,
                Err(e) => return failed(gateway, &id, &e),
            }
        }
        // Its records read so far are lost with the task: the next snapshot reads them again.
        Err(e) => return failed(gateway, &id, &e.to_string()),
    };
    if prepared.calls <= shipped.calls {
        // No call the trainer's snapshot lacks (the new ones were abandoned: in no trace).
        shipped.captured = captured;
        return;
    }
    let post = Post {
        gateway,
        url: &partial,
        token: token.as_deref(),
        session: &id,
        calls: prepared.calls,
        snapshot: &prepared.id,
        deadline: Instant::now() + SNAPSHOT_TIMEOUT,
    };
    let mut taken = None;
    if let Some((delta, base)) = prepared.delta.take() {
        let bytes = delta.len();
        match post.send(Some(&base), delta).await {
            Ok(Answer::Taken { deltas }) => taken = Some((true, bytes, deltas)),
            // The trainer holds another snapshot (it restarted, or took one whose answer never
            // came here), or does not take deltas after all: it is sent the whole one.
            Ok(Answer::Refused) => shipped.marks = None,
            Err(why) => return failed_now(gateway, &id, &mut shipped, &why),
        }
    }
    if taken.is_none() {
        let whole = match serde_json::to_vec(&prepared.trajectory) {
            Ok(whole) => whole,
            Err(e) => return failed(gateway, &id, &e.to_string()),
        };
        let bytes = whole.len();
        match post.send(None, whole).await {
            Ok(Answer::Taken { deltas }) => taken = Some((false, bytes, deltas)),
            Ok(Answer::Refused) => {
                let why = format!("POST {partial}: the whole snapshot refused");
                return failed_now(gateway, &id, &mut shipped, &why);
            }
            Err(why) => return failed_now(gateway, &id, &mut shipped, &why),
        }
    }
    if let Some((delta, bytes, deltas)) = taken {
        gateway.metrics.snapshot(true);
        gateway.metrics.snapshot_taken(delta, bytes);
        *shipped = Shipped {
            calls: prepared.calls,
            captured,
            failed_at: None,
            // A trainer that does not say it takes deltas (an older one) is sent whole ones.
            marks: deltas.then_some(prepared.marks),
            key: std::mem::take(&mut shipped.key),
            tail: std::mem::take(&mut shipped.tail),
        };
    }
}

/// A snapshot ready to post: its id, and its delta against the last one taken with that
/// one's id, when there is one to plan against; the trajectory, sent whole without one or
/// when the trainer asks.
struct Prepared {
    calls: u64,
    id: String,
    trajectory: Trajectory,
    delta: Option<(Vec<u8>, String)>,
    marks: Vec<TraceMark>,
}

fn prepare(
    mut trajectory: Trajectory,
    base: Option<&[TraceMark]>,
    base_calls: u64,
    key: &RandomState,
) -> Prepared {
    let calls = trajectory.stats.completions;
    let traces = std::mem::take(&mut trajectory.traces);
    let (delta, marks) = match base {
        Some(base) => {
            let (deltas, marks) = snapshot_delta::plan(base, &traces, key);
            let body = SnapshotDelta {
                format: snapshot_delta::DELTA_FORMAT,
                base_calls,
                trajectory: &trajectory,
                traces: deltas,
            };
            // Serializing these types cannot fail; were it to, the whole one is sent.
            let delta = serde_json::to_vec(&body)
                .ok()
                .map(|body| (body, snapshot_delta::id(base, base_calls, key)));
            (delta, marks)
        }
        None => (None, snapshot_delta::marks(&traces, key)),
    };
    trajectory.traces = traces;
    Prepared {
        calls,
        id: snapshot_delta::id(&marks, calls, key),
        trajectory,
        delta,
        marks,
    }
}

/// How the trainer answered a snapshot.
enum Answer {
    /// Taken (or not needed: the session has its trajectory); `deltas`: it takes deltas.
    Taken { deltas: bool },
    /// A delta's 4xx: its base is not what the trainer holds (409), or the trainer does not
    /// take deltas (one rolled back since: 404 for the route).
    Refused,
}

/// One session's snapshot posts, all within one deadline.
struct Post<'a> {
    gateway: &'a Gateway,
    url: &'a str,
    token: Option<&'a str>,
    session: &'a str,
    calls: u64,
    /// This snapshot's id: what a delta on it names as its base.
    snapshot: &'a str,
    deadline: Instant,
}

impl Post<'_> {
    /// Post a whole snapshot (`base: None`), or a delta on the snapshot whose id is `base`
    /// (to `…/v1/partial/delta`, which a trainer that takes none does not have).
    async fn send(&self, base: Option<&str>, body: Vec<u8>) -> Result<Answer, String> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!("POST {}: no time left", self.url));
        }
        let url = match base {
            Some(_) => format!("{}/delta", self.url),
            None => self.url.to_string(),
        };
        let mut request = self
            .gateway
            .http
            .post(&url)
            .timeout(left)
            // What the trainer keeps it by, without parsing it (it parses one only to score it).
            .header("floe-session", self.session)
            .header("floe-calls", self.calls)
            .header("floe-snapshot", self.snapshot)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body);
        if let Some(base) = base {
            request = request.header("floe-base-snapshot", base);
        }
        if let Some(token) = self.token {
            request = request.bearer_auth(token);
        }
        let resp = request
            .send()
            .await
            .map_err(|e| format!("POST {url}: {}", crate::net_error::describe(&e).1))?;
        let status = resp.status();
        if base.is_some() && status.is_client_error() {
            return Ok(Answer::Refused);
        }
        if !status.is_success() {
            return Err(format!("POST {url}: {status}"));
        }
        let said: serde_json::Value = resp.json().await.unwrap_or_default();
        Ok(Answer::Taken {
            deltas: said["deltas"] == true,
        })
    }
}

fn failed_now(gateway: &Gateway, session: &str, shipped: &mut Shipped, why: &str) {
    shipped.failed_at = Some(Instant::now());
    failed(gateway, session, why);
}

fn failed(gateway: &Gateway, session: &str, why: &str) {
    tracing::warn!(%session, "snapshot not shipped: {why}");
    gateway.metrics.snapshot(false);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_partial_endpoint_sits_beside_the_ingest() {
        assert_eq!(
            partial_url("http://job-trainer.ns.svc:8100/v1/trajectories").as_deref(),
            Some("http://job-trainer.ns.svc:8100/v1/partial")
        );
        assert_eq!(partial_url("http://elsewhere:9000/ingest"), None);
    }
}
