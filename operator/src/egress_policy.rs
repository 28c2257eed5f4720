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
    ];
    // DNS, only where the cluster serves it: port 53 anywhere would be a way out.
    let dns = match &egress.dns {
        Some(peers) => serde_json::to_value(peers)?,
        None => json!([{
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
        }]),
    };
    if dns.as_array().is_some_and(|peers| !peers.is_empty()) {
        rules.push(json!({"to": dns,
                          "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}));
    }
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
        // DNS only to the cluster's DNS pods.
        assert_eq!(
            rules[1]["to"],
            json!([{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                    "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}])
        );
        assert_eq!(rules[1]["ports"][0]["port"], 53);
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

    /// A destination as the CNI sees it: an address, and the pod's labels and namespace's
    /// labels when it is a pod.
    struct To {
        ip: [u8; 4],
        pod: Option<(serde_json::Value, serde_json::Value)>,
    }

    fn labels_match(selector: &serde_json::Value, labels: &serde_json::Value) -> bool {
        let by_labels = selector["matchLabels"]
            .as_object()
            .into_iter()
            .flatten()
            .all(|(k, v)| labels[k] == *v);
        let by_expressions = selector["matchExpressions"]
            .as_array()
            .into_iter()
            .flatten()
            .all(|e| {
                let values = e["values"].as_array().cloned().unwrap_or_default();
                match e["operator"].as_str() {
                    Some("In") => values.contains(&labels[e["key"].as_str().unwrap_or("")]),
                    _ => false,
                }
            });
        by_labels && by_expressions
    }

    fn in_cidr(ip: [u8; 4], cidr: &str) -> bool {
        let Some((net, bits)) = cidr.split_once('/') else {
            return false;
        };
        let net: Vec<u8> = net.split('.').filter_map(|o| o.parse().ok()).collect();
        let (Ok(bits), Ok(net)) = (bits.parse::<u32>(), <[u8; 4]>::try_from(net)) else {
            return false;
        };
        let mask = if bits == 0 {
            0
        } else {
            u32::MAX << (32 - bits)
        };
        u32::from_be_bytes(ip) & mask == u32::from_be_bytes(net) & mask
    }

    /// NetworkPolicy's egress semantics for one selected pod in namespace `rl`: allowed iff a
    /// rule's peers (none: anywhere) and ports (none: any) match.
    fn allowed(policy: &NetworkPolicy, to: &To, port: i64, protocol: &str) -> bool {
        let spec = serde_json::to_value(policy.spec.clone()).unwrap_or_default();
        let own_ns = json!({"kubernetes.io/metadata.name": "rl"});
        spec["egress"].as_array().into_iter().flatten().any(|rule| {
            let ports_ok = rule["ports"].as_array().is_none_or(|ports| {
                ports
                    .iter()
                    .any(|p| p["port"] == port && p["protocol"] == protocol)
            });
            let peer_ok = rule["to"].as_array().is_none_or(|peers| {
                peers.iter().any(|peer| {
                    if let Some(cidr) = peer["ipBlock"]["cidr"].as_str() {
                        return in_cidr(to.ip, cidr);
                    }
                    let Some((pod, ns)) = &to.pod else {
                        return false;
                    };
                    let ns_ok = match peer.get("namespaceSelector") {
                        Some(sel) => labels_match(sel, ns),
                        None => *ns == own_ns,
                    };
                    let pod_ok = peer
                        .get("podSelector")
                        .is_none_or(|sel| labels_match(sel, pod));
                    ns_ok && pod_ok
                })
            });
            ports_ok && peer_ok
        })
    }

    #[test]
    fn the_pool_policy_against_a_table_of_destinations() {
        let ns = |n: &str| json!({"kubernetes.io/metadata.name": n});
        let pod = |labels: serde_json::Value, n: &str| To {
            ip: [10, 244, 0, 9],
            pod: Some((labels, ns(n))),
        };
        let ip = |ip: [u8; 4]| To { ip, pod: None };
        let teacher = json!({"to": [{"ipBlock": {"cidr": "10.0.0.7/32"}}],
                             "ports": [{"protocol": "TCP", "port": 8000}]});
        let policy = build(&pool(json!({"allow": [teacher]})))
            .expect("builds")
            .expect("managed");
        let dns_pod = || pod(json!({"k8s-app": "kube-dns"}), "kube-system");
        let trainer = || pod(json!({ROLE_LABEL: "trainer"}), "rl");
        let table: Vec<(&str, To, i64, &str, bool)> = vec![
            ("cluster DNS, UDP", dns_pod(), 53, "UDP", true),
            ("cluster DNS, TCP", dns_pod(), 53, "TCP", true),
            (
                "a resolver on the internet",
                ip([8, 8, 8, 8]),
                53,
                "UDP",
                false,
            ),
            (
                "port 53 of another pod",
                pod(json!({"app": "x"}), "rl"),
                53,
                "UDP",
                false,
            ),
            (
                "the job's trainer, policy server",
                trainer(),
                8000,
                "TCP",
                true,
            ),
            ("the job's trainer, ingest", trainer(), 8100, "TCP", true),
            ("the trainer's ssh", trainer(), 22, "TCP", false),
            (
                "a collector",
                pod(json!({ROLE_LABEL: "dataset"}), "rl"),
                8100,
                "TCP",
                true,
            ),
            (
                "another pod on 8000",
                pod(json!({"app": "x"}), "rl"),
                8000,
                "TCP",
                false,
            ),
            (
                "a trainer in another namespace",
                pod(json!({ROLE_LABEL: "trainer"}), "other"),
                8000,
                "TCP",
                false,
            ),
            ("the Kubernetes API", ip([10, 96, 0, 1]), 443, "TCP", false),
            ("cloud metadata", ip([169, 254, 169, 254]), 80, "TCP", false),
            ("the allowed teacher", ip([10, 0, 0, 7]), 8000, "TCP", true),
            (
                "the teacher's other port",
                ip([10, 0, 0, 7]),
                22,
                "TCP",
                false,
            ),
        ];
        for (what, to, port, protocol, expected) in &table {
            assert_eq!(
                allowed(&policy, to, *port, protocol),
                *expected,
                "{what} ({protocol} {port})"
            );
        }
        // A DNS of the pool's own (a node-local cache), and no DNS at all.
        let local = build(&pool(
            json!({"dns": [{"ipBlock": {"cidr": "169.254.20.10/32"}}]}),
        ))
        .expect("builds")
        .expect("managed");
        assert!(allowed(&local, &ip([169, 254, 20, 10]), 53, "UDP"));
        assert!(!allowed(&local, &dns_pod(), 53, "UDP"));
        let none = build(&pool(json!({"dns": []})))
            .expect("builds")
            .expect("managed");
        assert!(!allowed(&none, &dns_pod(), 53, "UDP"));
        assert!(allowed(&none, &trainer(), 8000, "TCP"));
    }
}
