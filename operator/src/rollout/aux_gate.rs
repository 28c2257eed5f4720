//! What a job's own pod (trainer or dataset collector) allows its sessions (sans-IO).
//!
//! A session starts — its assignment goes to its pod's gateway — only once its trajectories
//! have somewhere to go: that pod is Ready. Claiming a pool's pod for it need not wait that
//! long. Once the job's pod runs (its image pulled, its containers started) what is left is
//! its own start-up: a trainer loading a model takes minutes, a collector a moment. Claiming
//! meanwhile puts the claims' apiserver writes, and the pool's refill behind them, into that
//! wait, so when the pod turns Ready the sessions wait only for their deliveries. It waits for
//! the pod to run, not just to exist, so a job whose trainer is unschedulable or cannot pull
//! its image does not hold a pool's pods while it waits.
//!
//! Claimed pods are held for a bounded time only: when the job's pod fails (a crash loop, an
//! image that cannot start), stops running, or has been starting for longer than the early-claim
//! limit, the pods claimed for sessions that have not started go back (they are deleted
//! unused, never counted as an attempt, and the pool warms fresh ones for whoever needs them).

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

/// Where the job's own pod is, as far as its sessions care.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuxPhase {
    /// The job has no pod of its own (nothing to wait for), or it is Ready.
    Ready,
    /// Running (containers started) but not Ready yet, and not being deleted.
    Starting,
    /// A container cannot start or keeps crashing (`pod_problem` says why).
    Failing,
    /// Not running yet (pending, being deleted, or failed).
    NotRunning,
}

pub fn aux_phase(aux: Option<&Pod>) -> AuxPhase {
    let Some(pod) = aux else {
        return AuxPhase::Ready;
    };
    if crate::pool_controller::is_ready(pod) {
        return AuxPhase::Ready;
    }
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if pod.metadata.deletion_timestamp.is_some() {
        AuxPhase::NotRunning
    } else if phase == Some("Failed")
        // A container that cannot start or keeps crashing; an unschedulable pod only waits.
        || crate::pod_problem::problem(pod).is_some_and(|p| p.container.is_some())
    {
        AuxPhase::Failing
    } else if phase == Some("Running") {
        AuxPhase::Starting
    } else {
        AuxPhase::NotRunning
    }
}

/// How long the job's pod has not been Ready: since its `Ready` condition last changed (or,
/// before it has one, since the pod started).
pub fn unready_for(pod: &Pod, now: k8s_openapi::jiff::Timestamp) -> Duration {
    let status = pod.status.as_ref();
    let since = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .and_then(|c| c.last_transition_time.as_ref())
        .or_else(|| status.and_then(|s| s.start_time.as_ref()))
        .or(pod.metadata.creation_timestamp.as_ref());
    since.map_or(Duration::ZERO, |t| {
        now.duration_since(t.0).try_into().unwrap_or(Duration::ZERO)
    })
}

/// What a round may do for its sessions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gate {
    /// Claim READY pool pods for the next sessions.
    pub claim: bool,
    /// Send assignments (sessions start).
    pub deliver: bool,
    /// Let go of pods claimed for sessions that have not started.
    pub give_back: bool,
}

/// `early_claims`: the operator's `--claim-while-starting` (`None` when off) with its limit;
/// `unready_for`: how long the job's pod has not been Ready.
pub fn gate(phase: AuxPhase, early_claims: Option<Duration>, unready_for: Duration) -> Gate {
    let closed = Gate {
        claim: false,
        deliver: false,
        give_back: true,
    };
    match phase {
        AuxPhase::Ready => Gate {
            claim: true,
            deliver: true,
            give_back: false,
        },
        AuxPhase::Starting if early_claims.is_some_and(|limit| unready_for < limit) => Gate {
            claim: true,
            deliver: false,
            give_back: false,
        },
        AuxPhase::Starting | AuxPhase::Failing | AuxPhase::NotRunning => closed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const LIMIT: Option<Duration> = Some(Duration::from_secs(600));

    fn pod(status: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "job-trainer"}, "status": status}))
            .expect("a pod")
    }

    fn ready(ready: bool) -> serde_json::Value {
        json!({"phase": "Running", "conditions": [
            {"type": "Ready", "status": if ready { "True" } else { "False" }}]})
    }

    #[test]
    fn a_job_without_its_own_pod_claims_and_delivers() {
        assert_eq!(aux_phase(None), AuxPhase::Ready);
        assert_eq!(
            gate(AuxPhase::Ready, None, Duration::ZERO),
            Gate {
                claim: true,
                deliver: true,
                give_back: false,
            }
        );
    }

    #[test]
    fn a_ready_pod_lets_sessions_start() {
        assert_eq!(aux_phase(Some(&pod(ready(true)))), AuxPhase::Ready);
    }

    #[test]
    fn a_running_pod_not_yet_ready_is_starting_and_allows_claims_only() {
        let phase = aux_phase(Some(&pod(ready(false))));
        assert_eq!(phase, AuxPhase::Starting);
        assert_eq!(
            gate(phase, LIMIT, Duration::from_secs(30)),
            Gate {
                claim: true,
                deliver: false,
                give_back: false,
            }
        );
        assert_eq!(
            gate(phase, None, Duration::from_secs(30)),
            Gate {
                claim: false,
                deliver: false,
                give_back: true,
            },
            "with --claim-while-starting=false a starting pod holds the claims back too"
        );
    }

    #[test]
    fn a_pod_starting_past_the_limit_gets_its_claims_given_back() {
        assert_eq!(
            gate(AuxPhase::Starting, LIMIT, Duration::from_secs(601)),
            Gate {
                claim: false,
                deliver: false,
                give_back: true,
            }
        );
    }

    #[test]
    fn a_crash_looping_pod_is_failing_and_gives_its_claims_back() {
        let looping = pod(json!({"phase": "Running", "conditions": [
            {"type": "Ready", "status": "False"}],
            "containerStatuses": [{"name": "collector", "ready": false, "restartCount": 2,
                "image": "", "imageID": "",
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"exitCode": 1}}}]}));
        let phase = aux_phase(Some(&looping));
        assert_eq!(phase, AuxPhase::Failing);
        assert!(gate(phase, LIMIT, Duration::ZERO).give_back);
    }

    #[test]
    fn unready_time_counts_from_the_ready_conditions_last_change() {
        let p = pod(
            json!({"phase": "Running", "startTime": "2026-01-01T00:00:00Z",
            "conditions": [{"type": "Ready", "status": "False",
                            "lastTransitionTime": "2026-01-01T00:05:00Z"}]}),
        );
        let now: k8s_openapi::jiff::Timestamp = "2026-01-01T00:06:00Z".parse().expect("time");
        assert_eq!(unready_for(&p, now), Duration::from_secs(60));
        let fresh = pod(json!({"phase": "Pending", "startTime": "2026-01-01T00:05:30Z"}));
        assert_eq!(unready_for(&fresh, now), Duration::from_secs(30));
    }

    #[test]
    fn a_pending_pod_holds_claims_back() {
        // Unschedulable, or pulling its image: it may stay so for hours.
        let phase = aux_phase(Some(&pod(json!({"phase": "Pending"}))));
        assert_eq!(phase, AuxPhase::NotRunning);
        assert_eq!(
            gate(phase, LIMIT, Duration::ZERO),
            Gate {
                claim: false,
                deliver: false,
                give_back: true,
            }
        );
        assert_eq!(aux_phase(Some(&pod(json!({})))), AuxPhase::NotRunning);
    }

    #[test]
    fn a_pod_being_deleted_or_failed_holds_claims_back() {
        let mut deleting = pod(ready(false));
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert_eq!(aux_phase(Some(&deleting)), AuxPhase::NotRunning);
        assert_eq!(
            aux_phase(Some(&pod(json!({"phase": "Failed"})))),
            AuxPhase::Failing
        );
    }
}
