//! The NetworkPolicy a GatewayPool's pods get (sans-IO). The agent is untrusted code that
//! shares its pod's network namespace with the gateway, so whatever the pod may reach, the
//! agent may too: DNS, the job's own trainer pod (policy server, ingest) or dataset collector,
//! and what the pool's `egress.allow` adds. Those floe serves demand the job's token, which only
//! gateways hold; everything else (other pods, the Kubernetes API, cloud metadata, the
//! internet) is refused wherever the CNI enforces NetworkPolicy. Each pod also checks at start
//! that it is enforced (`floe sandbox`, [`crate::pods::names::EGRESS_CHECK_ENV`]). [`keep`] is the one write: both
//! controllers apply their policy with it.

use floe_crds::gateway_pool::{EgressPolicy, EgressSpec, GatewayPool};
use floe_crds::rollout_job::RolloutJob;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;

use crate::pods::names::{
    INGEST_PORT, JOB_LABEL, POOL_LABEL, ROLE_LABEL, SANDBOX_LABEL, VLLM_PORT,
};

/// The pool's policy: `<pool>-egress`.
pub fn policy_name(pool: &str) -> String {
    format!("{pool}-egress")
}

/// The NetworkPolicy the operator keeps for `pool`, owned by it; `None` when the pool says
/// `egress.policy: Unmanaged`.
pub fn build(pool: &GatewayPool) -> Result<Option<NetworkPolicy>, serde_json::Error> {
    let name = pool.name_any();
    policy(
        &policy_name(&name),
        pool,
        json!({POOL_LABEL: name}),
        &pool.spec.egress,
    )
}

/// A `poolTemplate` job's policy: `<job>-job-egress` (a pool of the job's name keeps its own).
pub fn job_policy_name(job: &str) -> String {
    format!("{job}-job-egress")
}

/// The NetworkPolicy the operator keeps for a `poolTemplate` job's own sandbox pods, owned by
/// the job, as its `spec.egress` says (the pool's rules: DNS, the job's trainer or collector,
/// `allow`); `None` for a job that claims from a pool, or says `Unmanaged`.
pub fn build_for_job(job: &RolloutJob) -> Result<Option<NetworkPolicy>, serde_json::Error> {
    if job.spec.pool_template.is_none() {
        return Ok(None);
    }
    let name = job.name_any();
    policy(
        &job_policy_name(&name),
        job,
        json!({JOB_LABEL: name, SANDBOX_LABEL: "true"}),
        &job.spec.egress.clone().unwrap_or_default(),
    )
}

fn policy<K: Resource<DynamicType = ()>>(
    name: &str,
    owner: &K,
    selector: serde_json::Value,
    egress: &EgressSpec,
) -> Result<Option<NetworkPolicy>, serde_json::Error> {
    if egress.policy == EgressPolicy::Unmanaged {
        return Ok(None);
    }
    let mut rules = vec![
        // The job's trainer pod (policy proxy, ingest) or dataset collector, in this namespace.
        json!({"to": [{"podSelector": {"matchExpressions": [
                  {"key": ROLE_LABEL, "operator": "In", "values": ["trainer", "dataset"]}]}}],
               "ports": [{"protocol": "TCP", "port": VLLM_PORT},
                         {"protocol": "TCP", "port": INGEST_PORT}]}),
        // DNS, wherever the cluster serves it.
        json!({"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}),
    ];
    for rule in &egress.allow {
        rules.push(serde_json::to_value(rule)?);
    }
    let mut labels = selector.clone();
    labels["app.kubernetes.io/managed-by"] = "floe".into();
    let policy = json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": name,
            "namespace": owner.meta().namespace,
            "labels": labels,
            "ownerReferences": owner.controller_owner_ref(&()).into_iter().collect::<Vec<_>>(),
        },
        "spec": {
            "podSelector": {"matchLabels": selector},
            "policyTypes": ["Egress"],
            "egress": rules,
        },
    });
    serde_json::from_value(policy).map(Some)
}

/// Make NetworkPolicy `name` what `wanted` says: applied (server-side, floe's field manager)
/// or, with `None`, deleted (one already gone is fine). (The RolloutJob controller keeps its
/// `poolTemplate` pods' policy with it too.)
pub async fn keep(
    client: &Client,
    ns: &str,
    name: &str,
    wanted: Option<&k8s_openapi::api::networking::v1::NetworkPolicy>,
) -> Result<(), kube::Error> {
    let api: Api<k8s_openapi::api::networking::v1::NetworkPolicy> =
        Api::namespaced(client.clone(), ns);
    match wanted {
        Some(policy) => api
            .patch(
                name,
                &PatchParams::apply("floe-operator").force(),
                &Patch::Apply(policy),
            )
            .await
            .map(|_| ()),
        None => match api.delete(name, &DeleteParams::default()).await {
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            other => other.map(|_| ()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(egress: serde_json::Value) -> GatewayPool {
        serde_json::from_value(json!({
            "apiVersion": "floe.dev/v1alpha1", "kind": "GatewayPool",
            "metadata": {"name": "pi", "namespace": "rl", "uid": "u-1"},
            "spec": {"replicas": 1, "template": {"image": "pi:1"}, "egress": egress},
        }))
        .expect("pool")
    }

    #[test]
    fn by_default_the_pools_pods_reach_dns_and_their_jobs_pods_only() {
        let policy = build(&pool(json!({}))).expect("builds").expect("managed");
        assert_eq!(policy.metadata.name.as_deref(), Some("pi-egress"));
        assert_eq!(policy.metadata.namespace.as_deref(), Some("rl"));
        let owner = &policy.metadata.owner_references.as_ref().expect("owner")[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("GatewayPool", "u-1")
        );
        let spec = serde_json::to_value(policy.spec.expect("spec")).expect("json");
        assert_eq!(
            spec["podSelector"],
            json!({"matchLabels": {"floe.dev/pool": "pi"}})
        );
        // Egress only: the operator's assignments come in on the control port.
        assert_eq!(spec["policyTypes"], json!(["Egress"]));
        let rules = spec["egress"].as_array().expect("rules");
        assert_eq!(rules.len(), 2);
        assert_eq!(
            rules[0]["to"][0]["podSelector"]["matchExpressions"][0]["values"],
            json!(["trainer", "dataset"])
        );
        assert_eq!(
            rules[0]["ports"],
            json!([{"protocol": "TCP", "port": 8000},
                                              {"protocol": "TCP", "port": 8100}])
        );
        assert!(rules[1].get("to").is_none(), "DNS anywhere: {}", rules[1]);
    }

    fn job(spec: serde_json::Value) -> RolloutJob {
        let mut full = json!({"tasks": {"inline": [{"id": "a", "instruction": "x"}]}, "numSamples": 1,
                              "harness": {"preset": "pi"}, "evaluator": {"command": ["true"]},
                              "sft": {"upstream": {"url": "http://m:8000"},
                                      "output": {"claimName": "d"}}});
        if let (Some(full), Some(spec)) = (full.as_object_mut(), spec.as_object()) {
            full.extend(spec.clone());
        }
        serde_json::from_value(json!({
            "apiVersion": "floe.dev/v1alpha1", "kind": "RolloutJob",
            "metadata": {"name": "swe", "namespace": "rl", "uid": "u-2"}, "spec": full,
        }))
        .expect("job")
    }

    #[test]
    fn a_pool_template_jobs_own_pods_get_the_same_rules_owned_by_the_job() {
        let teacher = json!({"to": [{"ipBlock": {"cidr": "10.0.0.7/32"}}]});
        let policy = build_for_job(&job(json!({"poolTemplate": {"image": "swe:1"},
                                                "egress": {"allow": [teacher]}})))
        .expect("builds")
        .expect("managed");
        assert_eq!(policy.metadata.name.as_deref(), Some("swe-job-egress"));
        let owner = &policy.metadata.owner_references.as_ref().expect("owner")[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("RolloutJob", "u-2")
        );
        let spec = serde_json::to_value(policy.spec.expect("spec")).expect("json");
        assert_eq!(
            spec["podSelector"],
            json!({"matchLabels": {"floe.dev/job": "swe", "floe.dev/sandbox": "true"}})
        );
        let pool_rules = serde_json::to_value(
            build(&pool(json!({"allow": [teacher]})))
                .expect("builds")
                .expect("managed")
                .spec,
        )
        .expect("json");
        assert_eq!(spec["egress"], pool_rules["egress"]);
        // A job on a pool follows the pool's policy; Unmanaged keeps none.
        assert!(build_for_job(&job(json!({"poolRef": {"name": "p"}})))
            .expect("builds")
            .is_none());
        assert!(
            build_for_job(&job(json!({"poolTemplate": {"image": "swe:1"},
                                           "egress": {"policy": "Unmanaged"}})))
            .expect("builds")
            .is_none()
        );
    }

    #[test]
    fn allow_adds_rules_and_unmanaged_keeps_none() {
        let teacher = json!({"to": [{"ipBlock": {"cidr": "10.0.0.7/32"}}],
                             "ports": [{"protocol": "TCP", "port": 8000}]});
        let policy = build(&pool(json!({"allow": [teacher]})))
            .expect("builds")
            .expect("managed");
        let spec = serde_json::to_value(policy.spec.expect("spec")).expect("json");
        assert_eq!(spec["egress"][2], teacher);
        assert!(build(&pool(json!({"policy": "Unmanaged"})))
            .expect("builds")
            .is_none());
    }
}
