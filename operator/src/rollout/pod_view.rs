//! Reading a claimed sandbox pod (sans-IO): which session attempt it holds (labels and
//! annotations written by the claim) and what its runner reported (the sandbox container's
//! exit code and termination message, `docs/sandbox-contract.md`).

use k8s_openapi::api::core::v1::{ContainerStateTerminated, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::Deserialize;

use floe_gateway::capture::upstream_errors::UpstreamErrors;

use super::plan::{PodProgress, PodResult, SessionPod};

use crate::pods::names::{
    AGENT_CONTAINER, AGENT_ENDED_ANNOTATION, AGENT_VOLUMES, ASSIGNED_ANNOTATION,
    ATTEMPT_ANNOTATION, GRADER_CONTAINER, GRADER_ROOM_ANNOTATION, INDEX_ANNOTATION,
};

/// The part of the runner's summary the operator needs.
#[derive(Debug, Deserialize)]
struct Summary {
    status: Option<String>,
    reward: Option<f64>,
    error: Option<String>,
    #[serde(default, rename = "upstreamErrors")]
    upstream_errors: Option<UpstreamErrors>,
    #[serde(default, rename = "policyVersions")]
    policy_versions: Option<[u64; 2]>,
}

/// A pod the job let go of (`floe.dev/state: done`) that is not being deleted: its release's
/// DELETE never landed.
pub fn left_done(pod: &Pod) -> bool {
    crate::pods::view::state(pod) == Some(crate::pods::PodState::Done.label())
        && pod.metadata.deletion_timestamp.is_none()
}

/// `None` for a pod that is not a session pod (no or unreadable claim annotations), or that
/// the job let go of (`floe.dev/state: done`: its result folded, or given back before its
/// session started). A released pod can take a while to go (its gateway's drain); seen in
/// that while it would read as lost, and a session given back unused would count a retry.
pub fn session_pod(pod: &Pod) -> Option<SessionPod> {
    if crate::pods::view::state(pod) == Some(crate::pods::PodState::Done.label()) {
        return None;
    }
    let annotations = pod.metadata.annotations.as_ref()?;
    let index = annotations.get(INDEX_ANNOTATION)?.parse().ok()?;
    let attempt = annotations
        .get(ATTEMPT_ANNOTATION)
        .and_then(|a| a.parse().ok())
        .unwrap_or(0);
    let assigned = annotations.contains_key(ASSIGNED_ANNOTATION);
    let progress = match result(pod) {
        // Before its session: a pod the node let go of is no failure of the session's, to be
        // replaced as if deleted (not an attempt). Not one whose runner scored the session: the
        // score proves it ran (its mark lost), and its trajectory was shipped; run again, the
        // job would fold the rerun's reward beside the first run's trained one.
        Some(r) if !assigned && disrupted(pod) && !matches!(r, PodResult::Scored { .. }) => {
            PodProgress::Lost
        }
        Some(r) => PodProgress::Finished(r),
        None if pod.metadata.deletion_timestamp.is_some() => PodProgress::Lost,
        None => PodProgress::Active,
    };
    Some(SessionPod {
        name: pod.metadata.name.clone().unwrap_or_default(),
        index,
        attempt,
        assigned,
        ready: crate::pods::view::is_ready(pod),
        progress,
        upstream: upstream_errors(pod),
        policy_versions: sandbox_summary(pod).and_then(|s| s.policy_versions),
        // Read against the clock by the round ([`start_failure`]).
        start_failed: None,
    })
}

/// A session pod still running whose agent container has ended, not yet marked so
/// ([`AGENT_ENDED_ANNOTATION`]): the round marks it, for an eviction's status that may say
/// nothing of its containers.
pub fn agent_ended_unmarked(pod: &Pod) -> bool {
    !marked_agent_ended(pod)
        && ended(pod, AGENT_CONTAINER).is_some()
        && session_pod(pod).is_some_and(|s| s.progress == PodProgress::Active)
}

/// When the agent container ended, as its status says (RFC 3339), if it has.
pub fn agent_finished_at(pod: &Pod) -> Option<String> {
    ended(pod, AGENT_CONTAINER)?
        .finished_at
        .as_ref()
        .map(|t| t.0.to_string())
}

/// The agent ended while the pod ran: its container's status says so, or the operator saw it
/// and marked the pod ([`agent_ended_unmarked`]).
fn agent_ended(pod: &Pod) -> bool {
    ended(pod, AGENT_CONTAINER).is_some() || marked_agent_ended(pod)
}

fn marked_agent_ended(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(AGENT_ENDED_ANNOTATION))
}

/// A pod claimed for a session that has not started: no assignment acknowledged, nothing
/// ended, not being deleted. Given back unused, it is no attempt of the session's.
pub fn unstarted_claim(pod: &Pod) -> bool {
    session_pod(pod).is_some_and(|s| !s.assigned && s.progress == PodProgress::Active)
}

/// How the kubelet's eviction messages begin (`pkg/kubelet/eviction/helpers.go`).
mod evicted_for {
    pub const NODE_PRESSURE: &str = "The node was low on resource";
    pub const NODE_CONDITION: &str = "The node had condition";
    pub const POD_SUM: &str =
        "Pod ephemeral local storage usage exceeds the total limit of containers";

    pub fn container(name: &str) -> String {
        format!("Container {name} exceeded its local ephemeral storage limit")
    }

    pub fn volume(name: &str) -> String {
        format!("Usage of EmptyDir volume \"{name}\" exceeds the limit")
    }
}

/// Ended by its node, not by anything it ran: evicted under node pressure, preempted, or
/// stopped by a node shutdown. (An eviction for a limit of its own, or a refusal at
/// admission, would happen again to the pod made in its place: a failed attempt, so that it
/// ends.)
fn disrupted(pod: &Pod) -> bool {
    let Some(status) = pod.status.as_ref() else {
        return false;
    };
    if status.phase.as_deref() != Some("Failed") {
        return false;
    }
    match status.reason.as_deref() {
        Some("Preempting" | "Shutdown" | "NodeShutdown" | "Terminated") => true,
        Some("Evicted") => status.message.as_deref().is_some_and(|m| {
            m.starts_with(evicted_for::NODE_PRESSURE) || m.starts_with(evicted_for::NODE_CONDITION)
        }),
        _ => false,
    }
}

/// How container `name` ended (`None` while it runs, or if the pod has none of that name).
fn ended<'a>(pod: &'a Pod, name: &str) -> Option<&'a ContainerStateTerminated> {
    pod.status
        .as_ref()?
        .container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == name)?
        .state
        .as_ref()?
        .terminated
        .as_ref()
}

fn sandbox_summary(pod: &Pod) -> Option<Summary> {
    ended(pod, GRADER_CONTAINER)?
        .message
        .as_deref()
        .and_then(|m| serde_json::from_str(m.trim()).ok())
}

/// The model-server failures the runner's summary reports (none before it ended).
pub fn upstream_errors(pod: &Pod) -> UpstreamErrors {
    sandbox_summary(pod)
        .and_then(|s| s.upstream_errors)
        .unwrap_or_default()
}

/// The session's result once the sandbox container (or the whole pod) has ended.
pub fn result(pod: &Pod) -> Option<PodResult> {
    let status = pod.status.as_ref()?;
    let terminated = ended(pod, GRADER_CONTAINER);
    let summary = sandbox_summary(pod);
    // 0: scored; 1: agent failure, still scored — a valid sample (whatever ended the pod
    // after the runner reported it).
    if let (
        Some(0 | 1),
        Some(Summary {
            reward: Some(reward),
            ..
        }),
    ) = (terminated.map(|t| t.exit_code), &summary)
    {
        return Some(PodResult::Scored { reward: *reward });
    }
    // Ended before the runner reported: the pod's own words say why (an eviction kills the
    // containers, whose exit code alone says nothing).
    if status.phase.as_deref() == Some("Failed") && status.reason.as_deref() == Some("Evicted") {
        if let Some(reason) = agent_outgrew_its_disk(pod, status) {
            return Some(PodResult::AgentFault { reason });
        }
        return Some(PodResult::Infra {
            reason: format!(
                "pod evicted: {}",
                status
                    .message
                    .as_deref()
                    .map_or("no reason given", str::trim)
            ),
        });
    }
    let Some(t) = terminated else {
        // Failed without the container ever reporting (image pull, node lost).
        return (status.phase.as_deref() == Some("Failed")).then(|| PodResult::Infra {
            reason: format!(
                "pod failed: {}",
                status
                    .message
                    .as_deref()
                    .or(status.reason.as_deref())
                    .unwrap_or("no reason given")
            ),
        });
    };
    if let Some(reason) = grader_out_of_memory(pod, t) {
        return Some(PodResult::AgentFault { reason });
    }
    let code = t.exit_code;
    let why = summary
        .as_ref()
        .and_then(|s| s.error.clone().or_else(|| s.status.clone()))
        .unwrap_or_else(|| match code {
            0 | 1 => "the runner left no reward in its termination message".into(),
            2 => "the runner was started wrongly (exit 2)".into(),
            3 => "infrastructure failure (exit 3)".into(),
            c => format!("the sandbox container exited with {c}"),
        });
    Some(PodResult::Infra {
        reason: format!("exit {code}: {why}"),
    })
}

/// A pod the kubelet evicted for what the agent wrote: its container's ephemeral-storage limit
/// or the `sizeLimit` of a volume only the agent fills (the backstops of its disk budget,
/// `pods::sandbox`), or the pod's sum of limits past both. The grader was stopped with it, so
/// there is nothing to score; but it was the agent's doing, and retrying it would turn the
/// agent's loss into another chance. So is one for the grader's own limit once the agent has
/// ended. Every other eviction (node pressure, a preemption, a limit of floe's own volumes) is
/// infrastructure.
fn agent_outgrew_its_disk(
    pod: &Pod,
    status: &k8s_openapi::api::core::v1::PodStatus,
) -> Option<String> {
    let message = status.message.as_deref()?.trim();
    // The kubelet checks the pod's whole use against the sum of its containers' limits before
    // each container's own: an agent that writes past the sum between two of its checks (a
    // `fallocate` does at once) is evicted in words that name no container. The sum is the
    // agent's backstop and the grader's room (`pods::sandbox`), far above anything honest
    // grading holds: past it is the agent's doing (or the code of its that the evaluator ran).
    let past_the_sum = message.starts_with(evicted_for::POD_SUM) && grader_has_room(pod);
    // The grader's own layer past floe's room for it, the agent having ended before the
    // eviction (the kubelet kills every container of an evicted pod, so an agent that ended
    // then says nothing): what the evaluator ran wrote it (`/tmp`, the code under test
    // unconfined there), as with the grader's memory ([`grader_out_of_memory`]); the grader
    // itself writes next to nothing.
    let grader_filled = message.starts_with(&evicted_for::container(GRADER_CONTAINER))
        && grader_has_room(pod)
        && agent_ended_before_the_grader(pod);
    let agents = message.starts_with(&evicted_for::container(AGENT_CONTAINER))
        || past_the_sum
        || grader_filled
        || AGENT_VOLUMES
            .iter()
            .any(|v| message.starts_with(&evicted_for::volume(v)));
    agents.then(|| format!("the agent outgrew its disk backstop (evicted: {message})"))
}

/// The runner killed with the code it evaluated: on cgroup v2, Kubernetes 1.28 and later kill
/// every process of a container when one outgrows its memory (`memory.oom.group`, unless the
/// kubelet's `singleProcessOOMKill`), so the agent's code that the evaluator runs takes the
/// runner with it and leaves no verdict. Local mode scores an evaluator out of memory 0;
/// retried, it would turn the agent's loss into another chance (and at `backoffLimit` into
/// "not scored"). Only once the agent has ended (the grader only waits before). A SWE-bench
/// grader runs the untouched repository's tests first, and nothing tells the operator which
/// run died: an instance whose honest tests outgrow the limit fails every session alike, a
/// group that trains nothing (and a held-out instance counted unsolved), where an exception
/// would let every SWE-bench agent make its loss a retry.
fn grader_out_of_memory(pod: &Pod, grader: &ContainerStateTerminated) -> Option<String> {
    (grader.reason.as_deref() == Some("OOMKilled") && agent_ended(pod)).then(|| {
        "the grader ran out of memory evaluating the agent's code (OOMKilled, the runner with \
         it): scored as the agent's"
            .to_string()
    })
}

/// The agent container ended before the grader did: the operator saw it ended while the pod
/// ran (the kubelet's status of an evicted pod may keep no container statuses: Kubernetes
/// 1.20's keeps none, and on the real node this rule never applied until the mark), or the
/// statuses say so, a second or more apart (the kubelet kills an evicted pod's containers at
/// once, within the second its statuses are stamped with).
fn agent_ended_before_the_grader(pod: &Pod) -> bool {
    let finished = |name| ended(pod, name)?.finished_at.as_ref().map(|t| t.0);
    marked_agent_ended(pod)
        || matches!(
            (finished(AGENT_CONTAINER), finished(GRADER_CONTAINER)),
            (Some(agent), Some(grader)) if agent < grader
        )
}

/// The grader has floe's room on disk beside the agent's backstop (the pod says so in an
/// annotation: the job's pod cache keeps no spec).
fn grader_has_room(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(GRADER_ROOM_ANNOTATION))
}

/// Why a session's pod, not Ready, will not start as it is (`None` while it may still):
/// what the kubelet reports about it (an image it cannot pull, a container config it
/// refuses, a crash loop), once `timeout_seconds` have passed since it was placed on a node
/// (time spent waiting for room is not time spent failing to start) and it has been down a
/// minute (or the timeout, if shorter) since it last was Ready. A pod the scheduler has no
/// room for yet is waiting for running sessions to end, not failing.
pub fn start_failure(pod: &Pod, now: &Time, timeout_seconds: i64) -> Option<String> {
    if crate::pods::view::is_ready(pod) {
        return None;
    }
    let problem = crate::pod_problem::problem(pod).filter(|p| p.reason != "Unschedulable")?;
    let since = |type_: &str, status: &str| {
        pod.status
            .as_ref()?
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == type_ && c.status == status)?
            .last_transition_time
            .as_ref()
            .map(|t| t.0)
    };
    let placed = [
        pod.metadata.creation_timestamp.as_ref().map(|t| t.0),
        since("PodScheduled", "True"),
    ]
    .into_iter()
    .flatten()
    .max()?;
    let seconds = |from: k8s_openapi::jiff::Timestamp| now.0.duration_since(from).as_secs();
    // Not Ready now for a while too: a pod Ready a long time that restarts once is Ready again
    // within seconds; a crash loop, whose pod is Ready a moment each time, soon stays down
    // longer than this between its runs.
    let down = since("Ready", "False").is_none_or(|t| seconds(t) >= timeout_seconds.min(60));
    (seconds(placed) >= timeout_seconds && down).then(|| {
        format!(
            "its pod did not start within {timeout_seconds}s: {}",
            problem.describe()
        )
    })
}

/// Why a long-running pod's (first) container keeps failing: it ended with a non-zero exit,
/// now or before its last restart — with its termination message or reason.
pub fn crashed(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?.container_statuses.as_ref()?.first()?;
    let ended = |s: Option<&k8s_openapi::api::core::v1::ContainerState>| {
        s.and_then(|s| s.terminated.as_ref())
            .filter(|t| t.exit_code != 0)
            .map(|t| {
                let why = t.message.as_deref().or(t.reason.as_deref()).unwrap_or("");
                format!("exited {}: {}", t.exit_code, why.trim())
            })
    };
    ended(status.state.as_ref()).or_else(|| ended(status.last_state.as_ref()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(status: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "annotations": {INDEX_ANNOTATION: "5", ATTEMPT_ANNOTATION: "1"}},
            "status": status,
        }))
        .unwrap_or_default()
    }

    fn terminated(code: i32, message: &str) -> Pod {
        pod(
            json!({"phase": if code == 0 {"Succeeded"} else {"Failed"}, "containerStatuses": [
            {"name": "floe-gateway", "ready": false, "restartCount": 0, "image": "f", "imageID": "",
             "state": {"terminated": {"exitCode": 0}}},
            {"name": "sandbox", "ready": false, "restartCount": 0, "image": "s", "imageID": "",
             "state": {"terminated": {"exitCode": code, "message": message}}}]}),
        )
    }

    /// The agent ended, then the grader's container was OOM-killed with its runner.
    fn oom_killed(extra: Option<&str>) -> Pod {
        let mut statuses = vec![
            json!({"name": "floe-gateway", "ready": true, "restartCount": 0, "image": "f",
                "imageID": "", "state": {"running": {}}}),
            json!({"name": AGENT_CONTAINER, "ready": false, "restartCount": 0, "image": "a",
                "imageID": "", "state": {"terminated": {"exitCode": 0}}}),
            json!({"name": GRADER_CONTAINER, "ready": false, "restartCount": 0, "image": "s",
                "imageID": "", "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}),
        ];
        if let Some(name) = extra {
            statuses.push(
                json!({"name": name, "ready": true, "restartCount": 0, "image": "b",
                "imageID": "", "state": {"running": {}}}),
            );
        }
        pod(json!({"phase": "Running", "containerStatuses": statuses}))
    }

    #[test]
    fn a_grader_killed_for_memory_after_the_agent_ended_is_the_agents_loss() {
        assert!(
            matches!(result(&oom_killed(None)), Some(PodResult::AgentFault { reason }) if reason.contains("OOMKilled")),
            "{:?}",
            result(&oom_killed(None))
        );
        // A SWE-bench grader too (its untouched repository's tests ran first).
        let swebench = oom_killed(Some(crate::pods::swebench::BRIDGE_CONTAINER));
        assert!(matches!(
            result(&swebench),
            Some(PodResult::AgentFault { .. })
        ));
        // Killed another way, or while the agent still ran: infrastructure, as before.
        let mut other = oom_killed(None);
        let mut running = oom_killed(None);
        if let Some(st) = other
            .status
            .as_mut()
            .and_then(|s| s.container_statuses.as_mut())
        {
            st[2] = serde_json::from_value(json!({"name": GRADER_CONTAINER, "ready": false,
                "restartCount": 0, "image": "s", "imageID": "",
                "state": {"terminated": {"exitCode": 137, "reason": "Error"}}}))
            .unwrap_or_default();
        }
        if let Some(st) = running
            .status
            .as_mut()
            .and_then(|s| s.container_statuses.as_mut())
        {
            st[1].state = serde_json::from_value(json!({"running": {}})).ok();
        }
        assert!(matches!(result(&other), Some(PodResult::Infra { .. })));
        assert!(matches!(result(&running), Some(PodResult::Infra { .. })));
    }

    #[test]
    fn only_a_claim_whose_session_never_started_is_unstarted() {
        let claimed = pod(json!({"phase": "Running"}));
        assert!(unstarted_claim(&claimed));
        let mut assigned = claimed.clone();
        assigned
            .metadata
            .annotations
            .get_or_insert_default()
            .insert(ASSIGNED_ANNOTATION.to_string(), "1".to_string());
        assert!(!unstarted_claim(&assigned), "its session runs");
        assert!(
            !unstarted_claim(&terminated(0, "")),
            "ended: a result to fold"
        );
        let mut going = claimed.clone();
        going.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert!(!unstarted_claim(&going), "lost: replaced by the plan");
        let mut done = claimed;
        done.metadata.labels = Some(
            [(
                crate::pods::names::STATE_LABEL.to_string(),
                "done".to_string(),
            )]
            .into(),
        );
        assert!(!unstarted_claim(&done), "already let go of");
    }

    #[test]
    fn a_pod_the_job_let_go_of_is_no_longer_a_session_pod() {
        let mut released = pod(json!({"phase": "Running"}));
        released.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert_eq!(
            session_pod(&released).map(|s| s.progress),
            Some(PodProgress::Lost),
            "terminating, before the release's label"
        );
        released.metadata.labels = Some(
            [(
                crate::pods::names::STATE_LABEL.to_string(),
                "done".to_string(),
            )]
            .into(),
        );
        assert_eq!(session_pod(&released), None);
    }

    #[test]
    fn a_scored_summary_is_a_reward_for_exit_0_and_1() {
        for code in [0, 1] {
            let p = terminated(code, r#"{"status":"completed","reward":0.25}"#);
            assert_eq!(result(&p), Some(PodResult::Scored { reward: 0.25 }));
        }
    }

    #[test]
    fn the_summary_s_upstream_failures_are_read() {
        let p = terminated(
            3,
            r#"{"status":"infra_error","error":"1 model call(s) failed","upstreamErrors":{"retried":{"connect":4},"failed":{"http_503":1}}}"#,
        );
        let u = upstream_errors(&p);
        assert_eq!((u.retries(), u.failed_calls()), (4, 1));
        assert!(upstream_errors(&terminated(0, "{}")).is_empty());
    }

    #[test]
    fn exit_3_is_infrastructure_with_the_runner_s_reason() {
        let p = terminated(
            3,
            r#"{"status":"infra_error","reward":null,"error":"evaluator exited 127"}"#,
        );
        assert_eq!(
            result(&p),
            Some(PodResult::Infra {
                reason: "exit 3: evaluator exited 127".into()
            })
        );
    }

    #[test]
    fn exit_0_without_a_readable_summary_is_not_a_reward_of_0() {
        let p = terminated(0, "not json");
        assert!(matches!(result(&p), Some(PodResult::Infra { .. })));
    }

    #[test]
    fn an_evicted_pod_is_an_infrastructure_failure() {
        let p = pod(json!({"phase": "Failed", "reason": "Evicted", "message": "low on memory"}));
        assert_eq!(
            result(&p),
            Some(PodResult::Infra {
                reason: "pod evicted: low on memory".into()
            })
        );
        // Its containers killed with it: the eviction's words, not their exit code.
        let killed = pod(json!({"phase": "Failed", "reason": "Evicted",
            "message": "The node was low on resource: memory. ",
            "containerStatuses": [
                {"name": "sandbox", "ready": false, "restartCount": 0, "image": "s", "imageID": "",
                 "state": {"terminated": {"exitCode": 137, "reason": "Error"}}}]}));
        assert_eq!(
            result(&killed),
            Some(PodResult::Infra {
                reason: "pod evicted: The node was low on resource: memory.".into()
            })
        );
        // Evicted after its runner reported a score: the score stands.
        let mut scored = terminated(1, r#"{"status":"agent_failed","reward":0.0}"#);
        if let Some(st) = scored.status.as_mut() {
            st.reason = Some("Evicted".into());
            st.message = Some("Container agent exceeded its local ephemeral storage limit".into());
        }
        assert_eq!(result(&scored), Some(PodResult::Scored { reward: 0.0 }));
    }

    /// Evicted for what the agent wrote past its backstops, or what the evaluator ran wrote
    /// past the grader's room: the agent's doing. Any other eviction is infrastructure.
    #[test]
    fn an_eviction_for_the_agents_own_disk_is_its_fault_any_other_infrastructure() {
        let evicted = |message: &str| {
            result(&pod(
                json!({"phase": "Failed", "reason": "Evicted", "message": message,
                "containerStatuses": [
                    {"name": "sandbox", "ready": false, "restartCount": 0, "image": "s", "imageID": "",
                     "state": {"terminated": {"exitCode": 137, "reason": "Error"}}}]}),
            ))
        };
        for message in [
            "Container agent exceeded its local ephemeral storage limit \"32Gi\". ",
            "Usage of EmptyDir volume \"floe-workspace\" exceeds the limit \"32Gi\". ",
            "Usage of EmptyDir volume \"floe-agent\" exceeds the limit \"32Gi\". ",
            // A SWE-bench pod's evaluation copy, filled by the agent's code its tests import.
            "Usage of EmptyDir volume \"floe-eval\" exceeds the limit \"32Gi\". ",
        ] {
            assert!(
                matches!(evicted(message), Some(PodResult::AgentFault { reason }) if reason.contains(message.trim())),
                "{message}"
            );
        }
        for message in [
            "The node was low on resource: ephemeral-storage. Container agent was using 20Gi, which exceeds its request of 0. ",
            "Container sandbox exceeded its local ephemeral storage limit \"1Gi\". ",
            "Usage of EmptyDir volume \"floe-state\" exceeds the limit \"1Gi\". ",
            "Pod ephemeral local storage usage exceeds the total limit of containers 2Gi. ",
        ] {
            assert!(
                matches!(evicted(message), Some(PodResult::Infra { .. })),
                "{message}"
            );
        }
        // Past the pod's sum of limits when floe set the grader's room beside the agent's
        // backstop: the agent's doing (it wrote past both between two of the kubelet's checks).
        let mut roomy = pod(json!({"phase": "Failed", "reason": "Evicted",
            "message": "Pod ephemeral local storage usage exceeds the total limit of containers 167772160. "}));
        if let Some(a) = roomy.metadata.annotations.as_mut() {
            a.insert(GRADER_ROOM_ANNOTATION.into(), "134217728".into());
        }
        assert!(matches!(
            result(&roomy),
            Some(PodResult::AgentFault { reason }) if reason.contains("total limit of containers")
        ));
        // The grader's own layer past floe's room for it, the agent having ended before: what
        // the evaluator ran (the agent's code, unconfined there) wrote it. The agent killed
        // with it, or a limit of the template's own, is infrastructure (the loop above).
        let grader_filled = |agent_finished: &str| {
            let killed = "2026-12-06T10:00:30Z";
            let mut p = pod(json!({"phase": "Failed", "reason": "Evicted",
                "message": "Container sandbox exceeded its local ephemeral storage limit \"128Mi\". ",
                "containerStatuses": [
                    {"name": "agent", "ready": false, "restartCount": 0, "image": "a",
                     "imageID": "", "state": {"terminated": {"exitCode": 0,
                                                             "finishedAt": agent_finished}}},
                    {"name": "sandbox", "ready": false, "restartCount": 0, "image": "s",
                     "imageID": "", "state": {"terminated": {"exitCode": 137, "reason": "Error",
                                                             "finishedAt": killed}}}]}));
            if let Some(a) = p.metadata.annotations.as_mut() {
                a.insert(GRADER_ROOM_ANNOTATION.into(), "134217728".into());
            }
            result(&p)
        };
        assert!(matches!(
            grader_filled("2026-12-06T10:00:12Z"),
            Some(PodResult::AgentFault { reason }) if reason.contains("Container sandbox exceeded")
        ));
        // Killed with the grader by the eviction: the agent was still at work.
        assert!(matches!(
            grader_filled("2026-12-06T10:00:30Z"),
            Some(PodResult::Infra { .. })
        ));
    }

    /// Kubernetes 1.20's kubelet writes an evicted pod's status with no container statuses
    /// (seen on the real node): only the operator's mark, made while the pod ran, says the
    /// agent had ended before the grader filled its disk.
    #[test]
    fn the_operators_mark_tells_an_agent_that_ended_before_an_eviction_said_nothing_of() {
        let running_after_the_agent = json!({"phase": "Running", "containerStatuses": [
            {"name": "agent", "ready": false, "restartCount": 0, "image": "a", "imageID": "",
             "state": {"terminated": {"exitCode": 0, "finishedAt": "2026-12-06T10:00:12Z"}}},
            {"name": "sandbox", "ready": true, "restartCount": 0, "image": "s", "imageID": "",
             "state": {"running": {}}}]});
        let seen = pod(running_after_the_agent);
        assert!(agent_ended_unmarked(&seen), "marked by the round");
        // With when it ended: a round behind the mark writes the same again.
        assert_eq!(
            agent_finished_at(&seen).as_deref(),
            Some("2026-12-06T10:00:12Z")
        );
        let mut marked = seen.clone();
        if let Some(a) = marked.metadata.annotations.as_mut() {
            a.insert(AGENT_ENDED_ANNOTATION.into(), "2026-12-06T10:00:13Z".into());
        }
        assert!(!agent_ended_unmarked(&marked), "once");
        // Still at work: nothing to mark.
        assert!(!agent_ended_unmarked(&pod(json!({"phase": "Running"}))));
        let evicted = |mark: bool| {
            let mut p = pod(json!({"phase": "Failed", "reason": "Evicted",
                "message": "Container sandbox exceeded its local ephemeral storage limit \"134217728\". "}));
            if let Some(a) = p.metadata.annotations.as_mut() {
                a.insert(GRADER_ROOM_ANNOTATION.into(), "134217728".into());
                if mark {
                    a.insert(AGENT_ENDED_ANNOTATION.into(), "2026-12-06T10:00:13Z".into());
                }
            }
            result(&p)
        };
        assert!(matches!(evicted(true), Some(PodResult::AgentFault { .. })));
        assert!(matches!(evicted(false), Some(PodResult::Infra { .. })));
    }

    /// A pre-warmed pod its node let go of before its session started is replaced as if
    /// deleted; one whose own start failed, or that held a session, ended as it ended.
    #[test]
    fn a_pod_evicted_before_its_session_is_lost_not_failed() {
        let evicted = json!({"phase": "Failed", "reason": "Evicted",
                             "message": "The node was low on resource: ephemeral-storage. "});
        assert_eq!(
            session_pod(&pod(evicted.clone())).map(|s| s.progress),
            Some(PodProgress::Lost)
        );
        let mut started = pod(evicted);
        if let Some(a) = started.metadata.annotations.as_mut() {
            a.insert(ASSIGNED_ANNOTATION.into(), "t".into());
        }
        assert!(matches!(
            session_pod(&started).map(|s| s.progress),
            Some(PodProgress::Finished(PodResult::Infra { .. }))
        ));
        // Evicted for a limit of its own: it would be again, so it is a failed attempt.
        let own_limit = json!({"phase": "Failed", "reason": "Evicted",
            "message": "Usage of EmptyDir volume \"floe-run\" exceeds the limit \"1Gi\". "});
        assert!(matches!(
            session_pod(&pod(own_limit)).map(|s| s.progress),
            Some(PodProgress::Finished(PodResult::Infra { .. }))
        ));
        // Scored, then evicted before the result was folded, its assignment's mark lost: the
        // session ran (a review, session 85: it ran again under the same id).
        let mut scored = terminated(0, r#"{"status":"completed","reward":1.0}"#);
        if let Some(st) = scored.status.as_mut() {
            st.phase = Some("Failed".into());
            st.reason = Some("Evicted".into());
            st.message = Some("The node was low on resource: memory. ".into());
        }
        assert_eq!(
            session_pod(&scored).map(|s| s.progress),
            Some(PodProgress::Finished(PodResult::Scored { reward: 1.0 }))
        );
        let crashed = terminated(3, r#"{"status":"infra_error","error":"egress is open"}"#);
        assert!(matches!(
            session_pod(&crashed).map(|s| s.progress),
            Some(PodProgress::Finished(PodResult::Infra { .. }))
        ));
    }

    #[test]
    fn a_running_pod_is_active_and_a_deleted_one_lost() {
        let mut p = pod(json!({"phase": "Running"}));
        let s = session_pod(&p).expect("session pod");
        assert_eq!(
            (s.index, s.attempt, s.progress),
            (5, 1, PodProgress::Active)
        );
        p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        assert_eq!(session_pod(&p).map(|s| s.progress), Some(PodProgress::Lost));
    }

    #[test]
    fn a_pod_that_cannot_start_fails_its_start_only_past_the_timeout() {
        let at = |secs: i64| {
            Time(k8s_openapi::jiff::Timestamp::from_second(1_000_000 + secs).unwrap_or_default())
        };
        let with = |status: serde_json::Value| {
            let mut p = pod(status);
            p.metadata.creation_timestamp = Some(at(0));
            p
        };
        let pull = with(json!({"phase": "Pending", "containerStatuses": [
            {"name": "sandbox", "ready": false, "restartCount": 0, "image": "missing/x:1", "imageID": "",
             "state": {"waiting": {"reason": "ErrImagePull", "message": "pull access denied"}}}]}));
        assert_eq!(start_failure(&pull, &at(599), 600), None, "not yet");
        assert_eq!(
            start_failure(&pull, &at(600), 600).as_deref(),
            Some("its pod did not start within 600s: pod p container sandbox: ErrImagePull: pull access denied")
        );
        // No room yet: it waits for running sessions to end, whatever its age.
        let unschedulable = with(json!({"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
             "message": "0/1 nodes are available: 1 Insufficient cpu."}]}));
        assert_eq!(start_failure(&unschedulable, &at(86_400), 600), None);
        // Pulling (no problem reported) is progress, however long.
        let pulling = with(json!({"phase": "Pending", "containerStatuses": [
            {"name": "sandbox", "ready": false, "restartCount": 0, "image": "big:1", "imageID": "",
             "state": {"waiting": {"reason": "ContainerCreating"}}}]}));
        assert_eq!(start_failure(&pulling, &at(86_400), 600), None);
        // Counted from when it was placed on a node (after waiting for room), or from when it
        // last stopped being Ready: not from its creation.
        let mut late = pull.clone();
        if let Some(st) = late.status.as_mut() {
            st.conditions = Some(vec![serde_json::from_value(json!(
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": at(3_000)}))
            .unwrap_or_default()]);
        }
        assert_eq!(start_failure(&late, &at(3_599), 600), None);
        assert!(start_failure(&late, &at(3_600), 600).is_some());
        // Ready until a moment ago (a restart): not yet; down a minute: yes.
        let mut dropped = pull.clone();
        if let Some(st) = dropped.status.as_mut() {
            st.conditions = Some(vec![serde_json::from_value(json!(
                {"type": "Ready", "status": "False", "lastTransitionTime": at(5_000)}))
            .unwrap_or_default()]);
        }
        assert_eq!(start_failure(&dropped, &at(5_059), 600), None);
        assert!(start_failure(&dropped, &at(5_060), 600).is_some());
    }

    #[test]
    fn a_crashing_loader_says_why() {
        let crashing = pod(json!({"containerStatuses": [
            {"name": "tasks", "ready": false, "restartCount": 2, "image": "f", "imageID": "",
             "state": {"waiting": {"reason": "CrashLoopBackOff"}},
             "lastState": {"terminated": {"exitCode": 1,
                "message": "floe: cannot read the task file /tasks-volume/x.jsonl: No such file or directory\n"}}}]}));
        assert_eq!(
            crashed(&crashing).as_deref(),
            Some("exited 1: floe: cannot read the task file /tasks-volume/x.jsonl: No such file or directory")
        );
        let fine = pod(json!({"containerStatuses": [
            {"name": "tasks", "ready": true, "restartCount": 0, "image": "f", "imageID": "",
             "state": {"running": {}}}]}));
        assert_eq!(crashed(&fine), None);
    }
}
