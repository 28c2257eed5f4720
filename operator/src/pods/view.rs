//! Reading a pod and its Secret (sans-IO): readiness, floe's state label, whether it ended,
//! its grader's image, its address, its control token.

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::ResourceExt;

use super::names::{CONTROL_TOKEN_KEY, GRADER_CONTAINER, STATE_LABEL};

/// `ip:port`, with an IPv6 pod IP in brackets.
pub fn join_host_port(ip: &str, port: i32) -> String {
    if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    }
}

/// Not started: not being deleted, `Pending` (or no phase yet), and no container running or
/// ended (each waiting, or no status yet): a pod whose volumes never mounted, say.
pub fn unstarted(pod: &Pod) -> bool {
    let Some(status) = pod.status.as_ref() else {
        return pod.metadata.deletion_timestamp.is_none();
    };
    pod.metadata.deletion_timestamp.is_none()
        && status.phase.as_deref().is_none_or(|p| p == "Pending")
        && status
            .init_container_statuses
            .iter()
            .flatten()
            .chain(status.container_statuses.iter().flatten())
            .all(|c| {
                c.state
                    .as_ref()
                    .is_none_or(|s| s.running.is_none() && s.terminated.is_none())
            })
}

/// The pod's `Ready` condition is `True`.
pub fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The pod's `floe.dev/state` label.
pub fn state(pod: &Pod) -> Option<&str> {
    pod.labels().get(STATE_LABEL).map(String::as_str)
}

/// An unclaimed pod that can never serve: it ended, or one of its containers did. They never
/// restart (`restartPolicy: Never`), and the grader waits for an agent container that failed
/// to start (a kubelet restarted mid-start says `StartError`) until its dial timeout.
pub fn finished(pod: &Pod) -> bool {
    let status = pod.status.as_ref();
    matches!(
        status.and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    ) || status
        .and_then(|s| s.container_statuses.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.state.as_ref().is_some_and(|s| s.terminated.is_some()))
        })
}

/// Whether a [`finished`] pod has told how it ended: it ended whole, or its grader container
/// did, or its first container ended 10 s ago. The agent's supervisor ends because the grader
/// did, with a bare exit code, and the kubelet may report it a status update before the
/// grader's own words: a pool that described the pod then named the agent's exit code
/// instead of why the grader refused to serve.
pub fn ending_told(pod: &Pod, now: k8s_openapi::jiff::Timestamp) -> bool {
    let Some(status) = pod.status.as_ref() else {
        return true;
    };
    if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return true;
    }
    let ended = |name: Option<&str>| {
        status
            .container_statuses
            .iter()
            .flatten()
            .filter(|c| name.is_none_or(|n| c.name == n))
            .filter_map(|c| c.state.as_ref()?.terminated.as_ref())
            .map(|t| t.finished_at.as_ref().map(|at| at.0))
            .collect::<Vec<_>>()
    };
    if !ended(Some(GRADER_CONTAINER)).is_empty() {
        return true;
    }
    // Without a time (a status that does not say), as told as it will be.
    ended(None)
        .iter()
        .any(|at| at.is_none_or(|at| now.duration_since(at).as_secs() >= 10))
}

/// The image of a sandbox pod's grader container (where its evaluator runs).
pub fn grader_image(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == GRADER_CONTAINER)?
        .image
        .as_deref()
}

/// The port the pod's gateway takes assignments on, as the pod was made (its container's
/// port [`crate::pods::sandbox::CONTROL_PORT_NAME`], a native sidecar's too): a pool's
/// `gateway.controlPort` changed since does not move the gateways of pods already made, and
/// delivering to the pool's new port left their claims undelivered for good.
pub fn control_port(pod: &Pod) -> Option<i32> {
    let spec = pod.spec.as_ref()?;
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some(crate::pods::sandbox::CONTROL_PORT_NAME))
        .map(|p| p.container_port)
}

/// The control token a control-token Secret holds (sandbox pods' and a train job's trainer's).
pub fn control_token_of(secret: &Secret) -> Option<String> {
    secret_value(secret, CONTROL_TOKEN_KEY)
}

/// A Secret's `key`, trimmed; `None` when absent or blank.
pub fn secret_value(secret: &Secret, key: &str) -> Option<String> {
    secret
        .data
        .as_ref()?
        .get(key)
        .map(|b| String::from_utf8_lossy(&b.0).trim().to_string())
        .filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {

    #[test]
    fn an_ended_pod_is_described_once_its_grader_has_said_how_it_ended() {
        let pod = |phase: &str, agent: serde_json::Value, grader: serde_json::Value| -> Pod {
            serde_json::from_value(serde_json::json!({"status": {"phase": phase,
                "containerStatuses": [
                    {"name": "agent", "ready": false, "restartCount": 0, "image": "", "imageID": "", "state": agent},
                    {"name": "sandbox", "ready": false, "restartCount": 0, "image": "", "imageID": "", "state": grader}]}}))
            .expect("a pod")
        };
        let now: k8s_openapi::jiff::Timestamp = "2026-12-06T00:00:30Z".parse().expect("time");
        let ended_at =
            |at: &str| serde_json::json!({"terminated": {"exitCode": 3, "finishedAt": at}});
        let running = serde_json::json!({"running": {}});
        // The agent's supervisor ended a moment ago, the grader not yet said: wait.
        let early = pod("Running", ended_at("2026-12-06T00:00:25Z"), running.clone());
        assert!(finished(&early) && !ending_told(&early, now));
        // The grader has ended, or the whole pod: told.
        let grader = pod(
            "Running",
            ended_at("2026-12-06T00:00:25Z"),
            ended_at("2026-12-06T00:00:26Z"),
        );
        assert!(ending_told(&grader, now));
        let failed = pod("Failed", ended_at("2026-12-06T00:00:25Z"), running.clone());
        assert!(ending_told(&failed, now));
        // 10 s on, the grader still running: as told as it will be.
        let late = pod("Running", ended_at("2026-12-06T00:00:19Z"), running);
        assert!(ending_told(&late, now));
    }

    use super::*;

    fn pod(phase: &str, agent_state: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "status": {"phase": phase, "containerStatuses": [
                {"name": "sandbox", "ready": false, "restartCount": 0, "image": "", "imageID": "",
                 "state": {"running": {}}},
                {"name": "agent", "ready": false, "restartCount": 0, "image": "", "imageID": "",
                 "state": agent_state}]}
        }))
        .expect("pod")
    }

    #[test]
    fn a_pod_whose_agent_container_ended_is_finished() {
        let start_error =
            serde_json::json!({"terminated": {"exitCode": 128, "reason": "StartError"}});
        assert!(finished(&pod("Running", start_error)));
        assert!(!finished(&pod(
            "Running",
            serde_json::json!({"running": {}})
        )));
        assert!(!finished(&pod(
            "Pending",
            serde_json::json!({"waiting": {"reason": "ContainerCreating"}})
        )));
        assert!(finished(&pod("Failed", serde_json::json!({"running": {}}))));
    }

    #[test]
    fn a_pod_that_ran_no_container_is_unstarted() {
        let creating = serde_json::json!({"waiting": {"reason": "ContainerCreating"}});
        let each = |phase: &str, state: serde_json::Value| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p"},
                "status": {"phase": phase, "containerStatuses": [
                    {"name": "sandbox", "ready": false, "restartCount": 0, "image": "", "imageID": "",
                     "state": creating},
                    {"name": "agent", "ready": false, "restartCount": 0, "image": "", "imageID": "",
                     "state": state}]}
            }))
            .expect("pod")
        };
        assert!(unstarted(&each("Pending", creating.clone())));
        assert!(unstarted(&Pod::default()), "no status yet");
        assert!(
            !unstarted(&pod("Pending", creating.clone())),
            "one container runs"
        );
        assert!(!unstarted(&each(
            "Pending",
            serde_json::json!({"terminated": {"exitCode": 1}})
        )));
        assert!(!unstarted(&each("Failed", creating.clone())));
        let mut going = each("Pending", creating.clone());
        going.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert!(!unstarted(&going));
    }
}
