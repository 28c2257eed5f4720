//! What both controllers check of a floe object's spec before acting on it, beyond what the
//! apiserver checked: a field the object as `kubectl apply` sent it had that an older CRD
//! pruned from the object as stored ([`dropped_by_an_older_crd`]), and each verdict
//! remembered for the spec version it holds for ([`ForSpec`]), since a running object is
//! reconciled every few seconds and the checks cost tens of milliseconds (CEL) or an
//! apiserver call.

use kube::api::{ApiResource, DynamicObject};
use kube::{Api, Client, Resource, ResourceExt};

/// What a verdict on a spec holds for: the object (its uid: a pool deleted and made again
/// under its name is another), the spec's generation and a hash of the last-applied
/// annotation. What `kubectl apply` last sent counts too: removing a field the apiserver
/// pruned leaves the spec (and its generation) as it was.
pub(crate) type SpecVersion = (Option<String>, Option<i64>, Option<u64>);

pub(crate) fn spec_version<K: Resource>(object: &K) -> SpecVersion {
    let applied = object
        .annotations()
        .get(floe_crds::validation::LAST_APPLIED)
        .map(|a| {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            a.hash(&mut h);
            h.finish()
        });
    (object.meta().uid.clone(), object.meta().generation, applied)
}

/// The `Stalled` reason of an object whose CRD on the cluster prunes what this operator reads
/// or writes.
pub(crate) const CRD_OUTDATED: &str = "CrdOutdated";

/// One verdict, for the spec version it holds for.
pub(crate) struct ForSpec<T>(Option<(SpecVersion, T)>);

impl<T> Default for ForSpec<T> {
    fn default() -> Self {
        Self(None)
    }
}

impl<T: Clone> ForSpec<T> {
    /// The verdict, if it holds for `version`.
    pub(crate) fn get(&self, version: &SpecVersion) -> Option<T> {
        self.0
            .as_ref()
            .filter(|(v, _)| v == version)
            .map(|(_, t)| t.clone())
    }

    pub(crate) fn set(&mut self, version: SpecVersion, verdict: T) {
        self.0 = Some((version, verdict));
    }
}

/// The stall's message when `object` as `kubectl apply` last sent it has fields the apiserver
/// did not keep, though this operator knows them: the object's CRD on the cluster is (or was,
/// when the object was written) older and pruned them, so the object would run with their
/// defaults, silently (a job's `failureReward: -1` scored 0, a pool's `egress.unrestricted:
/// Refuse` warning only). Read from the object as stored, raw: the typed object fills defaults
/// in ([`floe_crds::validation::dropped_by_an_older_crd`]). Returned with the spec version the
/// verdict holds for: the stored object's, which may be newer than the cache's. An object with
/// no such annotation (server-side apply, an API client) is not read, and passes. `noun` names
/// the object to its user: "job", "pool".
pub(crate) async fn dropped_by_an_older_crd<K>(
    client: &Client,
    object: &K,
    noun: &str,
) -> Result<(SpecVersion, Option<String>), kube::Error>
where
    K: Resource<DynamicType = ()>,
{
    use floe_crds::validation::LAST_APPLIED;
    if !object.annotations().contains_key(LAST_APPLIED) {
        return Ok((spec_version(object), None));
    }
    let resource = ApiResource::erase::<K>(&());
    let raw: Api<DynamicObject> = match object.namespace() {
        Some(ns) => Api::namespaced_with(client.clone(), &ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    let stored = raw.get(&object.name_any()).await?;
    let dropped = floe_crds::validation::dropped_by_an_older_crd(
        K::kind(&()).as_ref(),
        &stored.metadata,
        stored.data.get("spec").unwrap_or(&serde_json::Value::Null),
    );
    let verdict = (!dropped.is_empty()).then(|| {
        format!(
            "the {kind} CRD on the cluster is older than this operator, or was when the {noun} \
             was applied: the apiserver dropped {fields} from the {noun} as `kubectl apply` sent \
             it, so the {noun} would run without them; apply the new CRDs (`floe crds | kubectl \
             apply -f -`), then the {noun} again",
            kind = K::kind(&()),
            fields = dropped.join(", "),
        )
    });
    Ok((spec_version(&stored), verdict))
}

/// The stall's message when nothing on `object` says which `spec` fields it was written with
/// ([`writers_past_the_record`]: no `kubectl apply` record, as with server-side apply (Flux),
/// Helm or an API client; or other writers of its spec besides the record) and the cluster
/// serves its kind's CRD without `spec` fields this operator knows: the apiserver prunes them
/// from every object it stores or serves, so the object may be without any it set. Not
/// remembered per spec version: the new CRDs lift it (both controllers are woken when the
/// served CRDs change, [`crate::served_crds::ServedCrds::changes`]). An object whose spec
/// only `kubectl apply` wrote gets the exact check, [`dropped_by_an_older_crd`], instead. A
/// CRD that lacks only `status` fields stalls nothing here: what the operator writes there is
/// checked where it writes it.
pub(crate) fn served_crd_lacks<K>(
    served: &crate::served_crds::ServedCrds,
    object: &K,
    noun: &str,
) -> Option<String>
where
    K: Resource<DynamicType = ()>,
{
    let kind = K::kind(&());
    let lacking: Vec<String> = served
        .lacking(&kind)
        .into_iter()
        .filter(|f| f == "spec" || f.starts_with("spec."))
        .collect();
    if lacking.is_empty() {
        return None;
    }
    let unknown = writers_past_the_record(object, &lacking)?;
    let fields = named(&lacking, 6);
    let untold = match unknown.as_slice() {
        [] => "it carries no `kubectl apply` record to tell which".to_string(),
        writers => format!(
            "{} wrote its spec besides its `kubectl apply` record, which cannot tell which",
            named(writers, 3)
        ),
    };
    Some(format!(
        "the {kind} CRD on the cluster is older than this operator: it lacks {fields}, which \
         the apiserver prunes from every {kind} it stores or serves, so the {noun} is without \
         any of those it set, and {untold}. Apply the new CRDs (`floe crds | kubectl apply -f \
         -`), then the {noun} again: one written while the older CRD was served lost those \
         fields for good"
    ))
}

/// The RolloutJob `status` fields the operator must read back from its own writes: failures
/// the trainer is still to be told (`untoldFailures`: the round after the one that failed to
/// tell it reads them there) and the tasks' digest (`tasksDigest`: a changed task list is
/// caught by it). An older CRD prunes them from every write, silently.
const STATUS_READ_BACK: &[&str] = &["status.untoldFailures", "status.tasksDigest"];

/// The stall's message when the served RolloutJob CRD lacks a field of [`STATUS_READ_BACK`]
/// (or `status`, or the version, whole): decided before a round writes anything, since a
/// stall after the write would leave the round's failures untold and the next round's write
/// would lift it. An unreadable CRD lacks nothing here, as in [`served_crd_lacks`].
pub(crate) fn served_crd_lacks_status(served: &crate::served_crds::ServedCrds) -> Option<String> {
    let lacking = served.lacking("RolloutJob");
    let pruned: Vec<String> = STATUS_READ_BACK
        .iter()
        .filter(|f| {
            lacking
                .iter()
                .any(|l| l == *f || l == "status" || l == floe_crds::VERSION)
        })
        .map(|f| f.to_string())
        .collect();
    if pruned.is_empty() {
        return None;
    }
    Some(format!(
        "the RolloutJob CRD on the cluster is older than this operator: it lacks {}, which the \
         apiserver prunes from the status the operator writes and must read back (failures \
         its trainer is still to be told; the digest that catches a changed task list). Apply \
         the new CRDs (`floe crds | kubectl apply -f -`)",
        named(&pruned, 6)
    ))
}

/// The writer `kubectl apply` (client-side) records itself as in `managedFields`.
const KUBECTL_APPLY: &str = "kubectl-client-side-apply";

/// Why `object`'s `kubectl apply` record cannot say which `spec` fields it was written with,
/// `lacking` being the `spec` fields the served CRD lacks: `None` when it can (the record is
/// there and no other writer set anything under `spec` that may have been pruned, or the
/// apiserver keeps no `managedFields`), else the other writers by name, none when there is no
/// record at all. A record alone is not enough: a field that Flux's server-side apply or a
/// `kubectl patch` set besides it was pruned too, and is in no record. Not others: a writer of
/// the record itself (`kubectl apply`; Argo CD's client-side apply and `kubectl edit`, which
/// write it under their own names), a write through a subresource (`scale`, `status`), and
/// one that set only top-level values the served CRD has (`kubectl scale`, an autoscaler's
/// `replicas`, Kueue's `suspend`, as Kubernetes before 1.22 records them).
fn writers_past_the_record<K: Resource>(object: &K, lacking: &[String]) -> Option<Vec<String>> {
    if !object
        .annotations()
        .contains_key(floe_crds::validation::LAST_APPLIED)
    {
        return Some(Vec::new());
    }
    let record = format!("f:{}", floe_crds::validation::LAST_APPLIED);
    // A value at the top of `spec` ("f:replicas": {}) that the served CRD has whole.
    let served_value = |(key, below): (&String, &serde_json::Value)| {
        let Some(name) = key.strip_prefix("f:") else {
            return false;
        };
        let under = |f: &String| {
            f.strip_prefix("spec.")
                .and_then(|f| f.strip_prefix(name))
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
        };
        below.as_object().is_some_and(|b| b.is_empty()) && !lacking.iter().any(under)
    };
    let mut others: Vec<String> = object
        .meta()
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| m.manager.as_deref() != Some(KUBECTL_APPLY))
        .filter(|m| m.subresource.as_deref().unwrap_or_default().is_empty())
        .filter_map(|m| Some((m, &m.fields_v1.as_ref()?.0)))
        .filter(|(_, f)| f["f:metadata"]["f:annotations"].get(&record).is_none())
        .filter(|(_, f)| {
            f["f:spec"]
                .as_object()
                .is_some_and(|spec| !spec.iter().all(served_value))
        })
        .map(|(m, _)| format!("`{}`", m.manager.as_deref().unwrap_or("an unnamed writer")))
        .collect();
    others.sort();
    others.dedup();
    (!others.is_empty()).then_some(others)
}

/// Up to `at_most` of `names`, and how many more.
fn named(names: &[String], at_most: usize) -> String {
    let mut said = names[..names.len().min(at_most)].join(", ");
    if names.len() > at_most {
        said.push_str(&format!(" and {} more", names.len() - at_most));
    }
    said
}

#[cfg(test)]
mod tests {
    use super::*;
    use floe_crds::gateway_pool::GatewayPool;

    fn pool(uid: &str, generation: i64, applied: Option<&str>) -> GatewayPool {
        let mut pool: GatewayPool = serde_json::from_value(serde_json::json!({
            "apiVersion": "floe.dev/v1alpha1", "kind": "GatewayPool",
            "metadata": {"name": "p", "uid": uid, "generation": generation},
            "spec": {"replicas": 1, "template": {"image": "agent:1"}}
        }))
        .expect("a pool");
        if let Some(a) = applied {
            pool.annotations_mut().insert(
                floe_crds::validation::LAST_APPLIED.to_string(),
                a.to_string(),
            );
        }
        pool
    }

    /// A served RolloutJob CRD without the status fields the operator reads back stalls every
    /// job; one lacking other status fields (checked where they are written) does not.
    #[test]
    fn a_crd_without_the_status_the_operator_reads_back_stalls_jobs() {
        use crate::served_crds::ServedCrds;
        let served = ServedCrds::default();
        assert_eq!(served_crd_lacks_status(&served), None);
        served.set("RolloutJob", vec!["status.heldOut".into()]);
        assert_eq!(served_crd_lacks_status(&served), None);
        served.set(
            "RolloutJob",
            vec!["status.heldOut".into(), "status.untoldFailures".into()],
        );
        let why = served_crd_lacks_status(&served).expect("stalled");
        assert!(
            why.contains("it lacks status.untoldFailures,")
                && why.contains("floe crds | kubectl apply -f -"),
            "{why}"
        );
        served.set("RolloutJob", vec!["status".into()]);
        assert!(served_crd_lacks_status(&served)
            .is_some_and(|w| w.contains("status.untoldFailures, status.tasksDigest")));
    }

    /// An object without `kubectl apply`'s record is stalled while its served CRD lacks `spec`
    /// fields: not when the CRD lacks only `status` fields, not when it is up to date, and
    /// not when the object has the record and no other writer set its spec (the exact check
    /// reads that record); with one, it is.
    #[test]
    fn an_unrecorded_object_stalls_while_its_crd_lacks_spec_fields() {
        use crate::served_crds::ServedCrds;
        let served = ServedCrds::default();
        let unrecorded = pool("u1", 1, None);
        assert_eq!(served_crd_lacks(&served, &unrecorded, "pool"), None);
        let mut lacking: Vec<String> = (0..8).map(|i| format!("spec.f{i}")).collect();
        lacking.push("status.g".into());
        served.set("GatewayPool", lacking);
        let why = served_crd_lacks(&served, &unrecorded, "pool").expect("stalled");
        assert!(
            why.contains(
                "it lacks spec.f0, spec.f1, spec.f2, spec.f3, spec.f4, spec.f5 and 2 more"
            ),
            "{why}"
        );
        assert!(why.contains("floe crds | kubectl apply -f -"), "{why}");
        let recorded = pool("u1", 1, Some("{}"));
        assert_eq!(served_crd_lacks(&served, &recorded, "pool"), None);
        // The record and `managedFields`: `kubectl apply` wrote the spec, the operator only
        // its status and a finalizer, so the record tells all.
        let written_by = |writers: &[(&str, serde_json::Value)]| {
            let mut p = recorded.clone();
            p.meta_mut().managed_fields = Some(
                writers
                    .iter()
                    .map(|(manager, fields)| {
                        serde_json::from_value(serde_json::json!({
                            "manager": manager, "operation": "Update",
                            "fieldsType": "FieldsV1", "fieldsV1": fields}))
                        .expect("an entry")
                    })
                    .collect(),
            );
            p
        };
        let applied = (
            KUBECTL_APPLY,
            serde_json::json!({"f:spec": {"f:replicas": {}}}),
        );
        let operator = (
            "floe",
            serde_json::json!({"f:status": {}, "f:metadata": {"f:finalizers": {}}}),
        );
        let only_applied = written_by(&[applied.clone(), operator.clone()]);
        assert_eq!(served_crd_lacks(&served, &only_applied, "pool"), None);
        // Argo CD's client-side apply writes the record under its own name.
        let argo = (
            "argocd-application-controller",
            serde_json::json!({"f:spec": {"f:replicas": {}}, "f:metadata": {"f:annotations":
                {format!("f:{}", floe_crds::validation::LAST_APPLIED): {}}}}),
        );
        let by_argo = written_by(&[argo, operator.clone()]);
        assert_eq!(served_crd_lacks(&served, &by_argo, "pool"), None);
        // Flux's server-side apply (or `kubectl patch`) set spec fields since: the record
        // cannot tell which of those went.
        let flux = (
            "flux",
            serde_json::json!({"f:spec": {".": {}, "f:egress": {"f:unrestricted": {}}}}),
        );
        let patched = written_by(&[applied.clone(), operator.clone(), flux.clone(), flux]);
        let why = served_crd_lacks(&served, &patched, "pool").expect("stalled");
        assert!(
            why.contains("`flux` wrote its spec besides its `kubectl apply` record"),
            "{why}"
        );
        // Not a scaler, nor Kueue: a value at the top of `spec` the served CRD has, or a
        // write through the scale subresource. A top-level value the CRD lacks is another.
        let scaler = ("hpa", serde_json::json!({"f:spec": {"f:replicas": {}}}));
        let scaled = written_by(&[applied.clone(), operator.clone(), scaler]);
        assert_eq!(served_crd_lacks(&served, &scaled, "pool"), None);
        let mut through_scale = scaled.clone();
        for m in through_scale.meta_mut().managed_fields.iter_mut().flatten() {
            if m.manager.as_deref() == Some("hpa") {
                m.fields_v1 = serde_json::from_value(
                    serde_json::json!({"f:spec": {".": {}, "f:replicas": {}}}),
                )
                .ok();
                m.subresource = Some("scale".into());
            }
        }
        assert_eq!(served_crd_lacks(&served, &through_scale, "pool"), None);
        let new_value = ("kubectl-patch", serde_json::json!({"f:spec": {"f:f0": {}}}));
        let set_new = written_by(&[applied, operator, new_value]);
        assert!(served_crd_lacks(&served, &set_new, "pool").is_some());
        // A CRD without `spec` at all.
        served.set("GatewayPool", vec!["spec".into()]);
        assert!(served_crd_lacks(&served, &unrecorded, "pool").is_some());
        served.set("GatewayPool", vec!["status.g".into()]);
        assert_eq!(served_crd_lacks(&served, &unrecorded, "pool"), None);
        served.set("GatewayPool", Vec::new());
        assert_eq!(served_crd_lacks(&served, &unrecorded, "pool"), None);
    }

    /// A verdict holds for one object, one generation and one last-applied annotation: a
    /// pool made again under the same name, a spec edit, or `kubectl apply` again (which may
    /// change only the annotation, the pruned field still missing) each ask anew.
    #[test]
    fn a_verdict_holds_for_the_spec_version_it_was_made_on_only() {
        let mut memo = ForSpec::default();
        let first = spec_version(&pool("u1", 1, Some("{}")));
        memo.set(first.clone(), "verdict");
        assert_eq!(memo.get(&first), Some("verdict"));
        for other in [
            pool("u2", 1, Some("{}")),
            pool("u1", 2, Some("{}")),
            pool("u1", 1, Some("{\"spec\":{}}")),
            pool("u1", 1, None),
        ] {
            assert_eq!(memo.get(&spec_version(&other)), None);
        }
    }
}
