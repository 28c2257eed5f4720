//! What the job's own pod was made from (sans-IO). A train job's trainer has its config baked
//! in when its pod is made (the GRPO settings, the temperature, `maxStaleness`, the reward's
//! threshold), while each session's assignment is built from the spec as it is: a GitOps
//! commit that changed `spec.sampling.temperature` under a running job had new sessions
//! sample at the new temperature while the trainer weighed their tokens at the old, a
//! gradient of a policy nothing samples. The pod carries a digest of those parts of the spec;
//! a spec that no longer matches it stalls the job until it is restored or the pod is made
//! again.

use floe_crds::rollout_job::RolloutJobSpec;
use serde_json::json;

/// The pod annotation holding [`digest`] as the pod was made.
pub const ANNOTATION: &str = "floe.dev/spec-digest";

/// The digest of the spec a job's own pod runs with, tagged with this operator's version: a
/// digest of another version is not compared (a release may write the same spec otherwise),
/// only recorded again. `None` for a job with no own pod.
pub fn digest(spec: &RolloutJobSpec) -> Option<String> {
    let material = match (&spec.train, &spec.sft) {
        (Some(train), _) => {
            let mut train = serde_json::to_value(train).ok()?;
            // Changed freely mid-job: the operator reads them each round (the fidelity check
            // runs before the first session; held-out rounds have a digest of their own).
            if let Some(t) = train.as_object_mut() {
                t.remove("fidelityCheck");
                t.remove("heldOut");
            }
            json!({"train": train, "sampling": spec.sampling, "numSamples": spec.num_samples,
                   "reward": spec.evaluator.reward})
        }
        (None, Some(sft)) => json!({"sft": sft}),
        (None, None) => return None,
    };
    Some(format!(
        "{}/{}",
        env!("CARGO_PKG_VERSION"),
        crate::stable_hash::of_json(&material)
    ))
}

/// How the spec stands against the digest its pod was made with.
#[derive(Debug, PartialEq)]
pub enum Drift {
    Same,
    /// The spec changed since the pod was made.
    Changed,
    /// Not comparable: no digest on the pod (an older operator made it) or one of another
    /// operator version. Recorded again, as the spec is now.
    Unknown,
}

pub fn drift(recorded: Option<&str>, now: &str) -> Drift {
    let version = |d: &str| d.split_once('/').map(|(v, _)| v.to_string());
    match recorded {
        Some(r) if r == now => Drift::Same,
        Some(r) if version(r).is_some() && version(r) == version(now) => Drift::Changed,
        _ => Drift::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use floe_crds::rollout_job::RolloutJob;

    fn train_job() -> RolloutJob {
        serde_json::from_value(json!({
            "apiVersion": "floe.dev/v1alpha1", "kind": "RolloutJob",
            "metadata": {"name": "j", "namespace": "ns"},
            "spec": {"tasks": {"inline": [{"id": "a", "instruction": "x"}]}, "numSamples": 4,
                     "harness": {"preset": "pi"}, "poolRef": {"name": "p"},
                     "evaluator": {"command": ["true"]},
                     "train": {"image": "t", "model": "/m"}},
        }))
        .expect("a job")
    }

    #[test]
    fn what_the_trainer_is_made_from_changes_the_digest_and_nothing_else_does() {
        let job = train_job();
        let made = digest(&job.spec).expect("a train job's digest");
        assert!(made.starts_with(concat!(env!("CARGO_PKG_VERSION"), "/")));
        let edited = |edit: &dyn Fn(&mut RolloutJob)| {
            let mut j = job.clone();
            edit(&mut j);
            drift(Some(&made), &digest(&j.spec).expect("a digest"))
        };
        for changed in [
            edited(&|j| j.spec.sampling.temperature = 0.7),
            edited(&|j| j.spec.num_samples = 8),
            edited(&|j| j.spec.evaluator.reward.pass_threshold = 0.5),
            edited(&|j| {
                if let Some(t) = j.spec.train.as_mut() {
                    t.max_staleness = 3;
                }
            }),
        ] {
            assert_eq!(changed, Drift::Changed);
        }
        // Read each round, never baked in: free to change.
        for same in [
            edited(&|j| j.spec.suspend = true),
            edited(&|j| j.spec.concurrency = Some(2)),
            edited(&|j| {
                if let Some(t) = j.spec.train.as_mut() {
                    t.fidelity_check.max_mismatch = 0.5;
                }
            }),
        ] {
            assert_eq!(same, Drift::Same);
        }
        // A pod an older operator made, or another release's digest: recorded again.
        assert_eq!(drift(None, &made), Drift::Unknown);
        assert_eq!(drift(Some("0.0.1/0123456789abcdef"), &made), Drift::Unknown);
    }
}
