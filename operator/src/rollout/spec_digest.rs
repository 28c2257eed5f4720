//! What the job's own pod was made from (sans-IO). A train job's trainer has its config baked
//! in when its pod is made (the GRPO settings, the temperature, `maxStaleness`, the reward's
//! threshold, vLLM's arguments), while each session's assignment is built from the spec as it
//! is: a GitOps commit that changed `spec.sampling.temperature` under a running job had new
//! sessions sample at the new temperature while the trainer weighed their tokens at the old,
//! a gradient of a policy nothing samples. The pod carries a digest of what its containers
//! run with (their commands, arguments and plain environment: the trainer's config is one of
//! them); a spec that would make them run otherwise stalls the job until it is restored or
//! the pod is made again. What the operator reads each round (`train.epochs`, the reward's
//! source, the fidelity check, held-out rounds) and what only places the pod (its image, its
//! resources, its node) are free to change.

use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

/// The pod annotation holding [`digest`] as the pod was made.
pub const ANNOTATION: &str = "floe.dev/spec-digest";

/// On the pod while the spec stands changed from what it was made with ([`Drift::Changed`]):
/// kept across an upgrade that computes the digest otherwise ([`Drift::UnknownWhileStalled`]).
pub const CHANGED_ANNOTATION: &str = "floe.dev/spec-changed";

/// How the digest's material is built. A release that builds a job's own pod otherwise (a new
/// argument, a new key in the trainer's config) bumps it: a digest of another version is not
/// compared, only recorded again, so an upgrade never stalls a running job. The test
/// `the_material_is_pinned` fails until it is bumped.
const MATERIAL: u32 = 4;

/// The digest of what `pod`'s containers run with, tagged with [`MATERIAL`].
pub fn digest(pod: &Pod) -> String {
    let containers: Vec<_> = pod
        .spec
        .iter()
        .flat_map(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
        })
        .map(|c| {
            let env: Vec<_> = c
                .env
                .iter()
                .flatten()
                .filter_map(|e| Some((e.name.as_str(), e.value.as_deref()?)))
                .collect();
            json!({"name": c.name, "command": c.command, "args": c.args, "env": env})
        })
        .collect();
    // The claims it writes to (an sft collector's dataset, a trainer's checkpoints): an edit
    // of `sft.output.claimName` left the collector writing to the old claim, unsaid.
    let claims: Vec<&str> = pod
        .spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| Some(v.persistent_volume_claim.as_ref()?.claim_name.as_str()))
        .collect();
    format!(
        "{MATERIAL}/{}",
        crate::stable_hash::of_json(&json!({"containers": containers, "claims": claims}))
    )
}

/// How the spec stands against the digest its pod was made with.
#[derive(Debug, PartialEq)]
pub enum Drift {
    Same,
    /// The pod would be made otherwise now.
    Changed,
    /// Not comparable: no digest on the pod (an older operator made it) or one of another
    /// [`MATERIAL`]. Recorded again, as the spec is now.
    Unknown,
    /// Not comparable, while the job stands stalled for a change an operator of another
    /// [`MATERIAL`] found: whether the spec was restored since cannot be told, and recording
    /// the spec as it is would let that change through (an upgrade lifting the stall).
    UnknownWhileStalled,
}

/// `stalled_for_it`: the spec was found changed and not restored since ([`CHANGED_ANNOTATION`]
/// on the pod, or the job's `Stalled` condition).
pub fn drift(recorded: Option<&str>, now: &str, stalled_for_it: bool) -> Drift {
    let material = |d: &str| d.split_once('/').map(|(v, _)| v.to_string());
    match recorded {
        Some(r) if r == now => Drift::Same,
        Some(r) if material(r).is_some() && material(r) == material(now) => Drift::Changed,
        _ if stalled_for_it => Drift::UnknownWhileStalled,
        _ => Drift::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::aux_pods;
    use floe_crds::rollout_job::RolloutJob;

    fn job(mode: serde_json::Value) -> RolloutJob {
        let mut spec = json!({"tasks": {"inline": [{"id": "a", "instruction": "x"}]},
            "numSamples": 4, "harness": {"preset": "pi"}, "poolRef": {"name": "p"},
            "evaluator": {"command": ["true"]}});
        if let (Some(s), Some(m)) = (spec.as_object_mut(), mode.as_object()) {
            s.extend(m.clone());
        }
        serde_json::from_value(json!({
            "apiVersion": "floe.dev/v1alpha1", "kind": "RolloutJob",
            "metadata": {"name": "j", "namespace": "ns", "uid": "u-1"}, "spec": spec,
        }))
        .expect("a job")
    }

    fn train_job() -> RolloutJob {
        job(json!({"train": {"image": "t", "model": "/m", "nodes": 2,
            "checkpoint": {"claimName": "c"}, "lora": {"rank": 8},
            "vllm": {"args": ["--max-model-len", "4096"]}}}))
    }

    fn made(job: &RolloutJob) -> String {
        let built = match (&job.spec.train, &job.spec.sft) {
            (Some(_), _) => aux_pods::trainer(job, "floe:1"),
            _ => aux_pods::collector(job, "floe:1"),
        };
        digest(&built.expect("built").expect("a pod").pod)
    }

    #[test]
    fn what_the_pod_runs_with_changes_the_digest_and_nothing_else_does() {
        let trainer = train_job();
        let first = made(&trainer);
        assert_eq!(made(&trainer), first, "a pod is built the same way twice");
        let edited = |edit: &dyn Fn(&mut RolloutJob)| {
            let mut j = trainer.clone();
            edit(&mut j);
            drift(Some(&first), &made(&j), false)
        };
        let train = |edit: &dyn Fn(&mut floe_crds::rollout_job::TrainSpec)| {
            edited(&|j| {
                if let Some(t) = j.spec.train.as_mut() {
                    edit(t);
                }
            })
        };
        for changed in [
            edited(&|j| j.spec.sampling.temperature = 0.7),
            edited(&|j| j.spec.num_samples = 8),
            edited(&|j| j.spec.evaluator.reward.pass_threshold = 0.5),
            train(&|t| t.max_staleness = 3),
            train(&|t| t.nodes = 1),
            train(&|t| t.vllm.args = vec!["--max-model-len".into(), "8192".into()]),
        ] {
            assert_eq!(changed, Drift::Changed);
        }
        // Read each round, or only where the pod runs: free to change.
        for same in [
            edited(&|j| j.spec.suspend = true),
            edited(&|j| j.spec.concurrency = Some(2)),
            train(&|t| t.fidelity_check.max_mismatch = 0.5),
            train(&|t| t.epochs = 3),
            train(&|t| t.image = "t:2".into()),
        ] {
            assert_eq!(same, Drift::Same);
        }
        // An sft job's collector: its minimum reward (the threshold, when unset) is its own.
        let sft = job(json!({"sft": {"upstream": {"url": "http://teacher:8000"},
            "output": {"claimName": "d"}}}));
        let mut stricter = sft.clone();
        stricter.spec.evaluator.reward.pass_threshold = 0.5;
        assert_eq!(
            drift(Some(&made(&sft)), &made(&stricter), false),
            Drift::Changed
        );
        // Its dataset's claim, or a trainer's checkpoint claim: written to by the pod as made.
        let mut elsewhere = sft.clone();
        if let Some(s) = elsewhere.spec.sft.as_mut() {
            s.output.claim_name = "d2".into();
        }
        assert_eq!(
            drift(Some(&made(&sft)), &made(&elsewhere), false),
            Drift::Changed
        );
        // Its teacher: new sessions would sample another model into the same dataset.
        let mut other_teacher = sft.clone();
        if let Some(s) = other_teacher.spec.sft.as_mut() {
            s.upstream.model = Some("a-larger-teacher".into());
        }
        assert_eq!(
            drift(Some(&made(&sft)), &made(&other_teacher), false),
            Drift::Changed
        );
        assert_eq!(
            train(&|t| {
                if let Some(c) = t.checkpoint.as_mut() {
                    c.claim_name = "c2".into();
                }
            }),
            Drift::Changed
        );
        // A pod an older operator made, or one of another material: recorded again.
        assert_eq!(drift(None, &first, false), Drift::Unknown);
        assert_eq!(
            drift(Some("0/0123456789abcdef"), &first, false),
            Drift::Unknown
        );
    }

    /// An operator of a new material, met with a job stalled for a change an earlier one found,
    /// keeps the stall: it cannot tell whether the spec was restored. A spec restored under the
    /// same material lifts it.
    #[test]
    fn a_stall_for_a_change_survives_an_upgrade_of_the_material() {
        let first = made(&train_job());
        let older = "2/0123456789abcdef";
        assert_eq!(drift(Some(older), &first, true), Drift::UnknownWhileStalled);
        assert_eq!(drift(None, &first, true), Drift::UnknownWhileStalled);
        assert_eq!(drift(Some(older), &first, false), Drift::Unknown);
        assert_eq!(drift(Some(&first), &first, true), Drift::Same);
        let mut hotter = train_job();
        hotter.spec.sampling.temperature = 0.7;
        assert_eq!(drift(Some(&first), &made(&hotter), true), Drift::Changed);
    }

    /// A release that builds these pods otherwise must bump [`MATERIAL`] (then update the
    /// digests below): running jobs' pods, made by the release before, would read as changed.
    #[test]
    fn the_material_is_pinned() {
        let sft = job(json!({"sft": {"upstream": {"url": "http://teacher:8000"},
            "output": {"claimName": "d"}}}));
        assert_eq!(
            [made(&train_job()), made(&sft)],
            [
                "4/9a802c74b4ee58b9".to_string(),
                "4/d8e71aeafb6d9056".to_string()
            ],
            "the pods are built otherwise: bump MATERIAL in spec_digest.rs and pin the new digests"
        );
    }
}
