//! Why a pool pod is not becoming READY, read from what the scheduler and the kubelet wrote on
//! it (sans-IO). The pool's condition and Events carry it, so the cause shows where users look
//! (`kubectl describe gatewaypool`) instead of only in the kubelet's Event on one pod.

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};

/// A pod that cannot become READY as it is: waiting on something retrying will not fix soon.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodProblem {
    pub pod: String,
    /// The container, or `None` for the pod as a whole (not scheduled).
    pub container: Option<String>,
    /// The kubelet's or the scheduler's reason (`CreateContainerConfigError`, `Unschedulable`, …).
    pub reason: String,
    pub message: String,
}

impl PodProblem {
    /// One line: `pod p container c: Reason: message`.
    pub fn describe(&self) -> String {
        let at = match &self.container {
            Some(c) => format!("pod {} container {c}", self.pod),
            None => format!("pod {}", self.pod),
        };
        if self.message.is_empty() {
            format!("{at}: {}", self.reason)
        } else {
            format!("{at}: {}: {}", self.reason, self.message)
        }
    }
}

/// Waiting reasons that mean the container will not start as configured. (`ContainerCreating`
/// and `PodInitializing` are progress, not problems.)
const STUCK: &[&str] = &[
    "CreateContainerConfigError",
    "CreateContainerError",
    "ErrImagePull",
    "ImagePullBackOff",
    "ErrImageNeverPull",
    "InvalidImageName",
    "CrashLoopBackOff",
    "RunContainerError",
];

pub fn problem(pod: &Pod) -> Option<PodProblem> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let status = pod.status.as_ref()?;
    if let Some(c) = status.conditions.iter().flatten().find(|c| {
        c.type_ == "PodScheduled"
            && c.status == "False"
            && c.reason.as_deref() == Some("Unschedulable")
    }) {
        return Some(PodProblem {
            pod: name,
            container: None,
            reason: "Unschedulable".into(),
            message: c.message.clone().unwrap_or_default(),
        });
    }
    let containers = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten());
    containers
        .filter_map(|c| container_problem(c).map(|(reason, message)| (c, reason, message)))
        .map(|(c, reason, message)| PodProblem {
            pod: name.clone(),
            container: Some(c.name.clone()),
            reason,
            message,
        })
        .next()
}

fn container_problem(c: &ContainerStatus) -> Option<(String, String)> {
    let state = c.state.as_ref()?;
    // Why it crashed last time: a crash loop's waiting message says only "back-off 10s
    // restarting failed container"; the cause is in the last termination.
    let last_crash = c
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .filter(|t| t.exit_code != 0)
        .map(|t| format!("last exit {}: {}", t.exit_code, termination_words(t)));
    if let Some(w) = &state.waiting {
        let reason = w.reason.clone().unwrap_or_default();
        if STUCK.contains(&reason.as_str()) {
            let message = match (reason.as_str(), &last_crash) {
                ("CrashLoopBackOff", Some(crash)) => crash.clone(),
                _ => w.message.clone().unwrap_or_default(),
            };
            return Some((reason, message));
        }
    }
    // A container that already failed (an init container's copy, a crashed gateway).
    if let Some(t) = &state.terminated {
        if t.exit_code != 0 {
            let reason = t.reason.clone().unwrap_or_else(|| "Error".into());
            return Some((reason, termination_words(t)));
        }
    }
    // Restarted after a crash and not ready again (yet): between two crashes of a loop.
    if state.running.is_some() && !c.ready && c.restart_count > 0 {
        if let Some(crash) = last_crash {
            return Some(("Restarted".into(), crash));
        }
    }
    None
}

/// A termination's own message (the termination-message file, or the log tail with
/// `FallbackToLogsOnError`), or its exit code.
fn termination_words(t: &k8s_openapi::api::core::v1::ContainerStateTerminated) -> String {
    t.message
        .as_deref()
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .map_or_else(|| format!("exit code {}", t.exit_code), str::to_string)
}

/// How long a pool waits before replacing a pod after `in_a_row` of its pods ended before they
/// were claimed (a grader that refuses to serve, a harness image whose `floe` cannot run): 5 s,
/// doubled each time up to 5 minutes, so a template that cannot serve is not recreated at the
/// pool's full refill rate.
pub fn ended_backoff(in_a_row: u32) -> std::time::Duration {
    let doubled = 5u64.saturating_mul(1 << in_a_row.saturating_sub(1).min(6));
    std::time::Duration::from_secs(doubled.min(300))
}

/// An unclaimed pod that ended, as the pool tells it: its container's own words, the grader's
/// first (the agent's supervisor only says its link closed when the grader ended).
pub fn ended(pod: &Pod) -> PodProblem {
    let grader = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| {
            cs.iter()
                .find(|c| c.name == crate::pods::names::GRADER_CONTAINER)
        })
        .and_then(|c| Some((c, container_problem(c)?)))
        .map(|(c, (reason, message))| PodProblem {
            pod: String::new(),
            container: Some(c.name.clone()),
            reason,
            message,
        });
    let found = grader.or_else(|| problem(pod));
    let (container, words) = match found {
        Some(p) => (p.container, format!("{}: {}", p.reason, p.message)),
        None => (None, "it ended".to_string()),
    };
    PodProblem {
        pod: pod.metadata.name.clone().unwrap_or_default(),
        container,
        reason: "PodFailed".into(),
        message: format!("{words} (before it was claimed)"),
    }
}

/// The unready timeout after `failures` pods of a pool in a row were replaced for not becoming
/// READY: doubled each time, up to 32×, so a template that cannot start is retried ever more
/// slowly instead of in a tight loop. A pod that becomes READY resets the count.
pub fn backed_off_timeout(base_seconds: i32, failures: u32) -> i32 {
    base_seconds.saturating_mul(1 << failures.min(5))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pods_that_end_unclaimed_are_replaced_ever_more_slowly() {
        let secs: Vec<u64> = (1..=8).map(|n| ended_backoff(n).as_secs()).collect();
        assert_eq!(secs, [5, 10, 20, 40, 80, 160, 300, 300]);
        assert_eq!(ended_backoff(0).as_secs(), 5);
    }

    #[test]
    fn an_ended_pod_says_why_in_its_graders_words() {
        let p = pod(json!({"phase": "Failed", "containerStatuses": [{
            "name": "agent", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
            "state": {"terminated": {"exitCode": 3, "reason": "Error"}}}, {
            "name": "sandbox", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
            "state": {"terminated": {"exitCode": 3, "reason": "Error",
                                     "message": "egress is not restricted"}}}]}));
        let e = ended(&pod_named(p, "pool-x"));
        assert_eq!(e.reason, "PodFailed");
        assert_eq!(
            e.describe(),
            "pod pool-x container sandbox: PodFailed: Error: egress is not restricted (before it was claimed)"
        );
    }

    fn pod_named(mut p: Pod, name: &str) -> Pod {
        p.metadata.name = Some(name.into());
        p
    }

    fn pod(status: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p"}, "status": status})).expect("pod")
    }

    #[test]
    fn a_container_that_cannot_start_is_named_with_the_kubelets_words() {
        let p = pod(json!({"containerStatuses": [
            {"name": "floe-gateway", "ready": true, "restartCount": 0, "image": "", "imageID": "",
             "state": {"running": {}}},
            {"name": "sandbox", "ready": false, "restartCount": 0, "image": "", "imageID": "",
             "state": {"waiting": {"reason": "CreateContainerConfigError",
                                   "message": "container has runAsNonRoot and image will run as root"}}}]}));
        let got = problem(&p).expect("a problem");
        assert_eq!(
            got.describe(),
            "pod p container sandbox: CreateContainerConfigError: container has runAsNonRoot and image will run as root"
        );
    }

    #[test]
    fn progress_is_not_a_problem_and_a_failed_init_container_is() {
        let creating = pod(json!({"containerStatuses": [
            {"name": "sandbox", "ready": false, "restartCount": 0, "image": "", "imageID": "",
             "state": {"waiting": {"reason": "ContainerCreating"}}}]}));
        assert_eq!(problem(&creating), None);
        let init = pod(json!({"initContainerStatuses": [
            {"name": "floe-init", "ready": false, "restartCount": 0, "image": "", "imageID": "",
             "state": {"terminated": {"exitCode": 127, "reason": "Error"}}}]}));
        assert_eq!(
            problem(&init).expect("problem").describe(),
            "pod p container floe-init: Error: exit code 127"
        );
    }

    #[test]
    fn a_crash_loop_is_named_with_its_last_exit_not_the_back_off() {
        let looping = pod(json!({"containerStatuses": [
            {"name": "collector", "ready": false, "restartCount": 3, "image": "", "imageID": "",
             "state": {"waiting": {"reason": "CrashLoopBackOff",
                                   "message": "back-off 40s restarting failed container=collector"}},
             "lastState": {"terminated": {"exitCode": 1, "reason": "Error",
                                          "message": "dataset directory /data: Permission denied\n"}}}]}));
        assert_eq!(
            problem(&looping).expect("problem").describe(),
            "pod p container collector: CrashLoopBackOff: last exit 1: dataset directory /data: Permission denied"
        );
        // Between two crashes the container runs again for a moment, not ready.
        let between = pod(json!({"containerStatuses": [
            {"name": "collector", "ready": false, "restartCount": 4, "image": "", "imageID": "",
             "state": {"running": {}},
             "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}));
        assert_eq!(
            problem(&between).expect("problem").describe(),
            "pod p container collector: Restarted: last exit 1: exit code 1"
        );
        // Ready again after a restart: no problem.
        let recovered = pod(json!({"containerStatuses": [
            {"name": "collector", "ready": true, "restartCount": 4, "image": "", "imageID": "",
             "state": {"running": {}},
             "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}));
        assert_eq!(problem(&recovered), None);
    }

    #[test]
    fn a_pod_the_scheduler_cannot_place_says_why() {
        let p = pod(
            json!({"conditions": [{"type": "PodScheduled", "status": "False",
            "reason": "Unschedulable", "message": "0/1 nodes are available: 1 Insufficient cpu."}]}),
        );
        let got = problem(&p).expect("problem");
        assert_eq!(got.container, None);
        assert_eq!(got.reason, "Unschedulable");
        assert!(got.describe().contains("Insufficient cpu"));
    }

    #[test]
    fn the_unready_timeout_backs_off_and_is_capped() {
        assert_eq!(backed_off_timeout(120, 0), 120);
        assert_eq!(backed_off_timeout(120, 1), 240);
        assert_eq!(backed_off_timeout(120, 5), 3840);
        assert_eq!(backed_off_timeout(120, 40), 3840);
        assert_eq!(backed_off_timeout(i32::MAX, 3), i32::MAX);
    }
}
