//! Whose an object under one of the job's names is. A job deleted and made again under its
//! name (a GitOps tool re-creating what a TTL deleted, `kubectl delete` then `apply`) finds
//! the earlier job's trainer or collector pod, Services, Secrets and task loader still there
//! until garbage collection deletes them. Taken as its own, the new job's sessions went to
//! the earlier job's pod, which garbage collection then deleted with its Secret (a pod that
//! exists is never made again with its objects), and the earlier token, kept in memory by
//! name, was refused by the new trainer or collector: every session failed.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::{Api, ResourceExt};

use super::{Halt, JobError};
use crate::controller_ref::{self, Holder};
use crate::rollout::status::Blocked;
use floe_crds::rollout_job::RolloutJob;

/// Whose an object under one of the job's names is ([`controller_ref::holder`]).
pub(super) fn holder<'a>(meta: &'a ObjectMeta, job: &RolloutJob) -> Holder<'a> {
    let uid = job.metadata.uid.as_deref().unwrap_or_default();
    controller_ref::holder(meta, "RolloutJob", &job.name_any(), uid)
}

/// Go on only with an object of this job's: an earlier job's is deleted (as garbage
/// collection would: its owner is gone) and the round waits for it to go; anything else
/// under the name stalls the job, saying what to delete.
pub(super) async fn ours<K>(
    api: &Api<K>,
    job: &RolloutJob,
    found: &K,
    kind: &str,
) -> Result<(), Halt>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let name = found.name_any();
    match holder(found.meta(), job) {
        Holder::This => Ok(()),
        Holder::Earlier { uid } => {
            delete_exactly(api, kind, &name, found.meta().uid.clone()).await?;
            Err(Halt::Blocked(Blocked::waiting(
                "EarlierJobObjects",
                format!(
                    "{kind} {name} is an earlier job {}'s (uid {uid}), not yet garbage-collected: \
                     deleted, and waited for before this job makes its own",
                    job.name_any()
                ),
            )))
        }
        Holder::Other(_) if found.meta().deletion_timestamp.is_some() => {
            Err(Halt::Blocked(Blocked::waiting(
                "EarlierJobObjects",
                format!("{kind} {name} is being deleted: waited for before this job makes its own"),
            )))
        }
        Holder::Other(_) => Err(Halt::Blocked(Blocked::stalled(
            "NameTaken",
            format!(
                "{kind} {name} exists and is not this job's (an earlier job's left by an orphaning \
                 delete, or another owner's): the job makes its own under that name; delete it"
            ),
        ))),
    }
}

/// Delete `name` only if it is still the object of UID `uid` (the cache may be behind one
/// made since under the name); gone already, or another one now, is fine.
pub(super) async fn delete_exactly<K>(
    api: &Api<K>,
    kind: &str,
    name: &str,
    uid: Option<String>,
) -> Result<(), Halt>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let preconditions = Preconditions {
        uid,
        resource_version: None,
    };
    delete_if(api, kind, name, preconditions).await.map(|_| ())
}

/// Delete the object `seen` only if it is still as the cache showed it (its UID and resource
/// version): `true` when this call deleted it. A delete that began since changed the
/// version, so a round whose cache is behind it neither deletes again nor says it did.
pub(super) async fn delete_as_seen<K>(api: &Api<K>, kind: &str, seen: &K) -> Result<bool, Halt>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let meta = seen.meta();
    let preconditions = Preconditions {
        uid: meta.uid.clone(),
        resource_version: meta.resource_version.clone(),
    };
    delete_if(api, kind, &seen.name_any(), preconditions).await
}

/// Delete `name` under `preconditions`: `true` when this call deleted it; gone already, or
/// not as the preconditions say (409), is `false`.
async fn delete_if<K>(
    api: &Api<K>,
    kind: &str,
    name: &str,
    preconditions: Preconditions,
) -> Result<bool, Halt>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let params = DeleteParams {
        preconditions: Some(preconditions),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(false),
        Err(e) => Err(Halt::Failed(JobError::api(format!(
            "deleting {kind} {}/{name}",
            api.namespace().unwrap_or_default()
        ))(e))),
    }
}

/// Create `object` unless there is one under its name; one there must be this job's
/// ([`ours`]). A create the apiserver refuses for good stalls the job
/// ([`refused`]).
pub(super) async fn create_ours<K>(
    api: &Api<K>,
    job: &RolloutJob,
    object: &K,
    kind: &str,
) -> Result<(), Halt>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let name = object.name_any();
    let created = match api.create(&PostParams::default(), object).await {
        Ok(_) => return Ok(()),
        Err(kube::Error::Api(s)) if s.is_already_exists() => None,
        Err(e) => Some(Err(JobError::api(format!(
            "creating {kind} {}/{name}",
            api.namespace().unwrap_or_default()
        ))(e))),
    };
    if let Some(failed) = created {
        return refused(failed, kind, object);
    }
    match api
        .get_opt(&name)
        .await
        .map_err(|e| Halt::Failed(JobError::api(format!("reading {kind} {name}"))(e)))?
    {
        Some(found) => ours(api, job, &found, kind).await,
        // Gone since (an earlier job's, garbage-collected): made on the next round.
        None => Err(Halt::Blocked(Blocked::waiting(
            "EarlierJobObjects",
            format!("{kind} {name} went as it was made: made again"),
        ))),
    }
}

/// A create the apiserver refuses for good (an admission rule, a quota, a RuntimeClass that
/// does not exist, RBAC) is the user's to fix: the job stalls saying which object and why,
/// instead of failing every reconcile with the words in the operator's log only.
fn refused<K: kube::Resource>(
    created: Result<(), JobError>,
    kind: &str,
    object: &K,
) -> Result<(), Halt> {
    if let Some(refusal) = match &created {
        Err(JobError::Api(call)) => call.refusal(),
        _ => None,
    } {
        return Err(Halt::Blocked(Blocked::stalled(
            if kind == "pod" {
                "PodCreateRejected"
            } else {
                "CreateRejected"
            },
            format!(
                "the apiserver refused the job's {kind} {}: {refusal}",
                object.meta().name.as_deref().unwrap_or_default(),
            ),
        )));
    }
    Ok(created?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn job(uid: &str) -> RolloutJob {
        serde_json::from_value(json!({
            "apiVersion": "floe.dev/v1alpha1", "kind": "RolloutJob",
            "metadata": {"name": "j", "namespace": "ns", "uid": uid},
            "spec": {"tasks": {"inline": [{"id": "a", "instruction": "x"}]}, "numSamples": 1,
                     "harness": {"preset": "pi"}, "poolRef": {"name": "p"},
                     "evaluator": {"command": ["true"]}},
        }))
        .expect("a job")
    }

    fn owned_by(
        kind: &str,
        api_version: &str,
        name: &str,
        uid: &str,
        controller: bool,
    ) -> ObjectMeta {
        serde_json::from_value(json!({"name": "j-trainer", "ownerReferences": [{
            "apiVersion": api_version, "kind": kind, "name": name, "uid": uid,
            "controller": controller}]}))
        .expect("metadata")
    }

    #[test]
    fn an_object_is_this_jobs_an_earlier_jobs_of_its_name_or_another_owners() {
        let now = job("u-2");
        let v1 = "floe.dev/v1alpha1";
        let mine = owned_by("RolloutJob", v1, "j", "u-2", true);
        assert_eq!(holder(&mine, &now), Holder::This);
        let earlier = owned_by("RolloutJob", v1, "j", "u-1", true);
        assert_eq!(holder(&earlier, &now), Holder::Earlier { uid: "u-1" });
        // Another job's name, another kind or group, or no controller: not ours to delete.
        for other in [
            owned_by("RolloutJob", v1, "k", "u-1", true),
            owned_by("Job", "batch/v1", "j", "u-1", true),
            owned_by("RolloutJob", "example.com/v1", "j", "u-1", true),
            owned_by("RolloutJob", v1, "j", "u-1", false),
            ObjectMeta::default(),
        ] {
            assert!(
                matches!(holder(&other, &now), Holder::Other(_)),
                "{other:?}"
            );
        }
    }
}
