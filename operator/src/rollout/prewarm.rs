//! `poolTemplate` jobs: the job's own sandbox pod for one session attempt (sans-IO), built
//! like a pool pod from the job's template — with the task's image when it names one — and
//! born claimed: the job's labels and annotations, the job as controller, the session
//! finalizer. Its name says which attempt it holds plus a random suffix: a replacement for
//! a pod still terminating must not collide with it (or with its control-token Secret). An
//! operator that dies right after creating one sees it on its next (uncached) list.

use std::collections::BTreeMap;

use floe_crds::common::SandboxTemplate;
use floe_crds::gateway_pool::{EgressSpec, GatewayPoolSpec};
use floe_crds::rollout_job::{RolloutJob, Task};
use k8s_openapi::api::core::v1::Pod;
use kube::{Resource, ResourceExt};

use crate::pods::names::{
    ATTEMPT_ANNOTATION, INDEX_ANNOTATION, JOB_LABEL, POOL_LABEL, SESSION_ANNOTATION,
    SESSION_FINALIZER, STATE_LABEL,
};
use crate::pods::sandbox::{self, SandboxPod};
use crate::pods::PodState;

/// What one pre-warmed session pod is for.
pub struct SessionPodFor<'a> {
    pub job: &'a RolloutJob,
    pub template: &'a SandboxTemplate,
    pub task: &'a Task,
    pub index: u32,
    pub attempt: u32,
    pub session: &'a str,
    /// Random, lowercase alphanumeric.
    pub suffix: &'a str,
    pub floe_image: &'a str,
    pub native_sidecars: bool,
}

/// `<job>-s<index>-a<attempt>-<suffix>`.
pub fn pod_name(job: &str, index: u32, attempt: u32, suffix: &str) -> String {
    format!("{job}-s{index}-a{attempt}-{suffix}")
}

/// The pool spec a `poolTemplate` job's pods are built from: its template with the task's
/// image, the evaluator's image as the grader's, the job's egress, default gateway settings.
pub fn pool_spec(
    template: &SandboxTemplate,
    task: &Task,
    evaluator_image: Option<&String>,
    egress: Option<&EgressSpec>,
) -> GatewayPoolSpec {
    let mut template = template.clone();
    if let Some(image) = &task.image {
        template.image = image.clone();
    }
    if let Some(image) = evaluator_image {
        template.grader_image = Some(image.clone());
    }
    GatewayPoolSpec {
        replicas: 0,
        template,
        prepare: Vec::new(),
        gateway: Default::default(),
        update_strategy: Default::default(),
        refill: Default::default(),
        egress: egress.cloned().unwrap_or_default(),
    }
}

pub fn build(p: &SessionPodFor) -> Result<Pod, serde_json::Error> {
    let job = p.job.name_any();
    let name = pod_name(&job, p.index, p.attempt, p.suffix);
    let namespace = p.job.namespace().unwrap_or_default();
    let spec = pool_spec(
        p.template,
        p.task,
        p.job.spec.evaluator.image.as_ref(),
        p.job.spec.egress.as_ref(),
    );
    let secret = sandbox::control_secret_name(&name);
    let mut pod = sandbox::build(&SandboxPod {
        name: &name,
        namespace: &namespace,
        pool: &job,
        spec: &spec,
        floe_image: p.floe_image,
        secret: &secret,
        native_sidecars: p.native_sidecars,
    })?;
    if let Some(settings) = &p.job.spec.tasks.swebench {
        let own_security = spec.template.security_context.is_some();
        pod = crate::pods::swebench::adapt(pod, settings, own_security)?;
    }
    let meta = &mut pod.metadata;
    let labels = meta.labels.get_or_insert_with(BTreeMap::new);
    // Not a pool's pod: no pool controller may count or adopt it.
    labels.remove(POOL_LABEL);
    labels.insert(STATE_LABEL.into(), PodState::Claimed.label().into());
    labels.insert(JOB_LABEL.into(), job.clone());
    let annotations = meta.annotations.get_or_insert_with(BTreeMap::new);
    annotations.insert(INDEX_ANNOTATION.into(), p.index.to_string());
    annotations.insert(ATTEMPT_ANNOTATION.into(), p.attempt.to_string());
    annotations.insert(SESSION_ANNOTATION.into(), p.session.to_string());
    meta.owner_references = p.job.controller_owner_ref(&()).map(|o| vec![o]);
    meta.finalizers = Some(vec![SESSION_FINALIZER.into()]);
    Ok(pod)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn job() -> RolloutJob {
        serde_json::from_value(json!({
            "apiVersion": "floe.dev/v1alpha1", "kind": "RolloutJob",
            "metadata": {"name": "swe", "namespace": "ml", "uid": "u-1"},
            "spec": {"tasks": {"inline": [{"id": "a", "instruction": "x"}]}, "numSamples": 2,
                     "harness": {"preset": "pi"},
                     "poolTemplate": {"image": "harness:1", "workingDir": "/testbed"},
                     "evaluator": {"command": ["true"]},
                     "sft": {"upstream": {"url": "http://m:8000", "model": "m"},
                             "output": {"claimName": "d"}}},
        }))
        .expect("job")
    }

    fn task(image: Option<&str>) -> Task {
        serde_json::from_value(json!({"id": "a", "instruction": "x", "image": image}))
            .expect("task")
    }

    fn built(image: Option<&str>) -> Pod {
        built_for(&job(), image)
    }

    fn built_for(job: &RolloutJob, image: Option<&str>) -> Pod {
        let template = job.spec.pool_template.clone().expect("template");
        build(&SessionPodFor {
            job,
            template: &template,
            task: &task(image),
            index: 3,
            attempt: 1,
            session: "swe-a-1-r1",
            suffix: "x7k2q",
            floe_image: "floe:1",
            native_sidecars: false,
        })
        .expect("pod")
    }

    fn main_image(pod: &Pod) -> String {
        let spec = pod.spec.as_ref().expect("spec");
        spec.containers
            .iter()
            .find(|c| c.name != "floe-gateway")
            .and_then(|c| c.image.clone())
            .expect("image")
    }

    #[test]
    fn the_pod_is_born_claimed_by_its_job_for_one_attempt() {
        let pod = built(None);
        assert_eq!(pod.name_any(), "swe-s3-a1-x7k2q");
        let labels = pod.labels();
        assert_eq!(labels.get(JOB_LABEL).map(String::as_str), Some("swe"));
        assert_eq!(labels.get(STATE_LABEL).map(String::as_str), Some("claimed"));
        assert!(!labels.contains_key(POOL_LABEL), "{labels:?}");
        // Still a sandbox pod to every NetworkPolicy.
        assert_eq!(
            labels
                .get(crate::pods::names::SANDBOX_LABEL)
                .map(String::as_str),
            Some("true")
        );
        let a = pod.annotations();
        assert_eq!(a[INDEX_ANNOTATION], "3");
        assert_eq!(a[ATTEMPT_ANNOTATION], "1");
        assert_eq!(a[SESSION_ANNOTATION], "swe-a-1-r1");
        let owner = &pod.owner_references()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            ("RolloutJob", Some(true))
        );
        assert_eq!(pod.finalizers(), [SESSION_FINALIZER.to_string()]);
        let view = super::super::pod_view::session_pod(&pod).expect("a session pod");
        assert_eq!((view.index, view.attempt, view.assigned), (3, 1, false));
    }

    #[test]
    fn a_task_image_replaces_the_templates() {
        assert_eq!(main_image(&built(None)), "harness:1");
        assert_eq!(main_image(&built(Some("swe/django:42"))), "swe/django:42");
    }

    #[test]
    fn the_evaluator_image_is_the_graders_and_only_the_graders() {
        let mut job = job();
        job.spec.evaluator.image = Some("graders/pytest:3".into());
        let pod = built_for(&job, Some("swe/django:42"));
        let image = |name: &str| {
            pod.spec
                .as_ref()
                .expect("spec")
                .containers
                .iter()
                .find(|c| c.name == name)
                .and_then(|c| c.image.clone())
                .expect("container")
        };
        assert_eq!(image("sandbox"), "graders/pytest:3");
        assert_eq!(image(crate::pods::names::AGENT_CONTAINER), "swe/django:42");
    }
}
