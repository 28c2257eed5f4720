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

use floe_crds::rollout_job::{RolloutJob, RolloutJobStatus};
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
    if crate::pods::view::is_ready(pod) {
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

/// Why the job's own pod will never run again, when it will not: it ended (evicted under node
/// pressure, stopped by a graceful node shutdown, its node lost) although its containers
/// restart `Always`. The kubelet restarts a container that exits, never a pod that ended, so
/// such a pod must be deleted and made again (a trainer resumes from its checkpoint); waiting
/// for it held the job's sessions until its deadline.
pub fn ended_for_good(pod: &Pod) -> Option<String> {
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    // floe makes its job pods `Always`; the operator's pod cache keeps no spec.
    let restart = pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref());
    if restart.is_some_and(|r| r != "Always") {
        return None;
    }
    let status = pod.status.as_ref()?;
    let phase = status.phase.as_deref()?;
    if phase != "Failed" && phase != "Succeeded" {
        return None;
    }
    let why = [status.reason.as_deref(), status.message.as_deref()]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join(": ");
    Some(if why.is_empty() {
        format!("ended ({phase})")
    } else {
        format!("ended ({phase}, {why})")
    })
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

impl Gate {
    /// The job has no pod of its own, or it is Ready.
    pub const OPEN: Gate = Gate {
        claim: true,
        deliver: true,
        give_back: false,
    };
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
        AuxPhase::Ready => Gate::OPEN,
        AuxPhase::Starting if early_claims.is_some_and(|limit| unready_for < limit) => Gate {
            claim: true,
            deliver: false,
            give_back: false,
        },
        AuxPhase::Starting | AuxPhase::Failing | AuxPhase::NotRunning => closed,
    }
}

/// What a round makes of the job's own pod: what its sessions may do, and what the job's
/// conditions say while it is not Ready.
#[derive(Clone, Debug, PartialEq)]
pub struct JobPodRound {
    pub phase: AuxPhase,
    pub gate: Gate,
    /// `None` while the pod is Ready, or when the job has none.
    pub wait: Option<Wait>,
}

/// What the job's conditions say while its own pod is not Ready.
#[derive(Clone, Debug, PartialEq)]
pub struct Wait {
    /// Which pod, why, and what that means for the pool pods the job holds.
    pub message: String,
    /// The pod's problem ([`crate::pod_problem`]) as a reason: the job's reason too, where
    /// users look first.
    pub problem: Option<String>,
    /// The pod is failing: the job warns once, when it starts to.
    pub failing: bool,
}

/// Words in the job's condition while its own pod fails (how the next round knows it said so).
pub const FAILING: &str = "is failing";

/// `early_claims`: the operator's `--claim-while-starting` (`None` when off) with its limit.
pub fn read(
    job: &RolloutJob,
    pod: Option<&Pod>,
    early_claims: Option<Duration>,
    now: k8s_openapi::jiff::Timestamp,
) -> JobPodRound {
    let phase = aux_phase(pod);
    let unready = pod.map_or(Duration::ZERO, |p| unready_for(p, now));
    let wait = pod.filter(|_| phase != AuxPhase::Ready).map(|pod| Wait {
        message: waiting_message(job, pod, phase, early_claims, unready),
        problem: crate::pod_problem::problem(pod).map(|p| p.reason),
        failing: phase == AuxPhase::Failing,
    });
    JobPodRound {
        phase,
        gate: gate(phase, early_claims, unready),
        wait,
    }
}

/// Whether the job's last status said its own pod was failing.
pub fn said_failing(previous: Option<&RolloutJobStatus>) -> bool {
    previous
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Progressing"))
        .is_some_and(|c| c.message.contains(FAILING))
}

fn waiting_message(
    job: &RolloutJob,
    pod: &Pod,
    phase: AuxPhase,
    early_claims: Option<Duration>,
    unready_for: Duration,
) -> String {
    let role = if job.spec.train.is_some() {
        "trainer"
    } else {
        "dataset collector"
    };
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let problem = crate::pod_problem::problem(pod).map(|p| p.describe());
    match (phase, problem) {
        (AuxPhase::Failing, Some(why)) => format!(
            "the job's {role} {FAILING}: {why}; no session starts and the job holds no pool pods until it is Ready"
        ),
        (AuxPhase::Failing, None) => format!(
            "the job's {role} {FAILING}: pod {name} failed; no session starts and the job holds no pool pods until it is Ready"
        ),
        (AuxPhase::NotRunning, Some(why)) => {
            format!("waiting for pod {name} (the job's {role}) to run: {why}")
        }
        (AuxPhase::Starting, _) if early_claims.is_some_and(|limit| unready_for >= limit) => {
            format!(
                "waiting for pod {name} (the job's {role}) to be ready; not ready for {} s, past the {} s early-claim limit: the job holds no pool pods until it is",
                unready_for.as_secs(),
                early_claims.map_or(0, |l| l.as_secs())
            )
        }
        _ => format!("waiting for pod {name} (the job's {role}) to be ready"),
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
    fn a_pod_that_ended_although_it_restarts_always_is_made_again() {
        let with = |restart: Option<&str>, status: serde_json::Value| -> Pod {
            let mut p = pod(status);
            p.spec = Some(k8s_openapi::api::core::v1::PodSpec {
                restart_policy: restart.map(str::to_string),
                ..Default::default()
            });
            p
        };
        let evicted = json!({"phase": "Failed", "reason": "Evicted",
                             "message": "The node was low on resource: memory."});
        assert_eq!(
            ended_for_good(&with(Some("Always"), evicted.clone())).as_deref(),
            Some("ended (Failed, Evicted: The node was low on resource: memory.)")
        );
        // A graceful node shutdown: every container exited 0; as the operator's cache keeps
        // a pod, without its spec.
        assert_eq!(
            ended_for_good(&pod(json!({"phase": "Succeeded"}))).as_deref(),
            Some("ended (Succeeded)")
        );
        assert!(ended_for_good(&with(None, json!({"phase": "Succeeded"}))).is_some());
        // Running, pending, crash-looping (the kubelet restarts it), another restart policy,
        // or already being deleted: not this.
        assert_eq!(ended_for_good(&with(Some("Always"), ready(false))), None);
        assert_eq!(
            ended_for_good(&with(Some("Always"), json!({"phase": "Pending"}))),
            None
        );
        assert_eq!(
            ended_for_good(&with(Some("OnFailure"), evicted.clone())),
            None
        );
        let mut deleting = with(Some("Always"), evicted);
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert_eq!(ended_for_good(&deleting), None);
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

    fn train_job() -> RolloutJob {
        serde_json::from_value(json!({
            "apiVersion": "floe.dev/v1alpha1", "kind": "RolloutJob",
            "metadata": {"name": "j", "namespace": "ns"},
            "spec": {"poolRef": {"name": "p"}, "harness": {"preset": "pi"},
                     "tasks": {"inline": [{"id": "t", "instruction": "p"}]}, "numSamples": 2,
                     "evaluator": {"command": ["true"]},
                     "train": {"image": "floe-trainer:1", "model": "m"}}}))
        .expect("a job")
    }

    #[test]
    fn a_round_reads_the_job_pods_gate_and_what_the_job_says_meanwhile() {
        let now: k8s_openapi::jiff::Timestamp = "2026-01-01T00:06:00Z".parse().expect("time");
        let job = train_job();
        let none = read(&job, None, LIMIT, now);
        assert_eq!((none.phase, none.wait), (AuxPhase::Ready, None));
        let starting = read(&job, Some(&pod(ready(false))), LIMIT, now);
        let wait = starting.wait.expect("a starting pod is waited for");
        assert_eq!(
            wait.message,
            "waiting for pod job-trainer (the job's trainer) to be ready"
        );
        assert!(!wait.failing && wait.problem.is_none());
        assert!(starting.gate.claim && !starting.gate.deliver);
        let looping = pod(json!({"phase": "Running", "conditions": [
            {"type": "Ready", "status": "False"}],
            "containerStatuses": [{"name": "trainer", "ready": false, "restartCount": 2,
                "image": "", "imageID": "",
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"exitCode": 1}}}]}));
        let failing = read(&job, Some(&looping), LIMIT, now)
            .wait
            .expect("a failing pod is waited for");
        assert!(failing.failing);
        assert_eq!(failing.problem.as_deref(), Some("CrashLoopBackOff"));
        assert!(
            failing
                .message
                .starts_with("the job's trainer is failing: "),
            "{}",
            failing.message
        );
    }
}
