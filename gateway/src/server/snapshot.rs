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
//! waits for nothing more. Each snapshot is the whole session so far, so a session posts
//! about its number of calls times its size in all (what `per_request` ships once).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::sessions::{Session, Shipped};
use super::Gateway;
use crate::ship::Sink;
use crate::trajectory::SessionOutcome;

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
    if !session.is_open() || shipped.calls >= mine {
        // It has its outcome (its trajectory is on its way), or a snapshot carried this call.
        return;
    }
    if shipped
        .failed_at
        .is_some_and(|at| at.elapsed() < SNAPSHOT_BACKOFF)
    {
        return failed(gateway, &id, "the last snapshot failed moments ago");
    }
    let (gw, dir, sid) = (gateway.clone(), session.dir.clone(), id.clone());
    let built = tokio::task::spawn_blocking(move || {
        let outcome = SessionOutcome::Interrupted {
            message: "a snapshot of the session while it ran".into(),
        };
        super::session_store::trajectory_of(&gw, &dir, &sid, &outcome)
    })
    .await;
    let entry = match built {
        Ok(Ok(entry)) => entry,
        Ok(Err(e)) => return failed(gateway, &id, &e.to_string()),
        Err(e) => return failed(gateway, &id, &e.to_string()),
    };
    let calls = entry.trajectory.stats.completions as u64;
    let mut request = gateway
        .http
        .post(&partial)
        .timeout(SNAPSHOT_TIMEOUT)
        // What the trainer keeps it by, without parsing it (it parses one only to score it).
        .header("floe-session", &id)
        .header("floe-calls", calls)
        .json(&entry.trajectory);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let why = match request.send().await {
        Ok(resp) if resp.status().is_success() => {
            gateway.metrics.snapshot(true);
            *shipped = Shipped {
                calls,
                failed_at: None,
            };
            return;
        }
        Ok(resp) => format!("POST {partial}: {}", resp.status()),
        Err(e) => format!("POST {partial}: {}", crate::net_error::describe(&e).1),
    };
    shipped.failed_at = Some(Instant::now());
    failed(gateway, &id, &why);
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
