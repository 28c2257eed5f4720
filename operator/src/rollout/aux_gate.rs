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

use k8s_openapi::api::core::v1::Pod;

/// Where the job's own pod is, as far as its sessions care.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuxPhase {
    /// The job has no pod of its own (nothing to wait for), or it is Ready.
    Ready,
    /// Running (containers started) but not Ready yet, and not being deleted.
    Starting,
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
    let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
    if running && pod.metadata.deletion_timestamp.is_none() {
        AuxPhase::Starting
    } else {
        AuxPhase::NotRunning
    }
}

/// What a round may do for its sessions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gate {
    /// Claim READY pool pods for the next sessions.
    pub claim: bool,
    /// Send assignments (sessions start).
    pub deliver: bool,
}

/// `claim_while_starting`: the operator's `--claim-while-starting`.
pub fn gate(phase: AuxPhase, claim_while_starting: bool) -> Gate {
    match phase {
        AuxPhase::Ready => Gate {
            claim: true,
            deliver: true,
        },
        AuxPhase::Starting => Gate {
            claim: claim_while_starting,
            deliver: false,
        },
        AuxPhase::NotRunning => Gate {
            claim: false,
            deliver: false,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
            gate(AuxPhase::Ready, false),
            Gate {
                claim: true,
                deliver: true
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
            gate(phase, true),
            Gate {
                claim: true,
                deliver: false
            }
        );
        assert_eq!(
            gate(phase, false),
            Gate {
                claim: false,
                deliver: false
            },
            "with --claim-while-starting=false a starting pod holds the claims back too"
        );
    }

    #[test]
    fn a_pending_pod_holds_claims_back() {
        // Unschedulable, or pulling its image: it may stay so for hours.
        let phase = aux_phase(Some(&pod(json!({"phase": "Pending"}))));
        assert_eq!(phase, AuxPhase::NotRunning);
        assert_eq!(
            gate(phase, true),
            Gate {
                claim: false,
                deliver: false
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
            AuxPhase::NotRunning
        );
    }
}
