//! The NetworkPolicies sandbox pods get (sans-IO). The agent is untrusted code that shares its
//! pod's network namespace with the gateway, so whatever the pod may reach, the agent may too.
//! A pool's policy allows its pods DNS and what `egress.allow` adds; a job's policy allows the
//! pods running its sessions (claimed from a pool, or its own `poolTemplate` pods) its own
//! trainer (policy server, ingest) or dataset collector, never another job's. Policies add up,
//! so a claimed pool pod gets both, and loses its job's rule when it leaves the job. What floe
//! serves demands the job's token, which only gateways hold; everything else (other pods, the
//! Kubernetes API, cloud metadata, the internet) is refused wherever the CNI enforces
//! NetworkPolicy. Each pod also checks at start
//! that it is enforced (`floe sandbox`, [`crate::pods::names::EGRESS_CHECK_ENV`]). [`keep`] is the one write: both
//! controllers apply their policy with it.

use floe_crds::gateway_pool::{EgressPolicy, EgressSpec, GatewayPool};
use floe_crds::rollout_job::RolloutJob;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;

use crate::controller_ref::{holder, Holder};
use crate::pods::names::{
    INGEST_PORT, JOB_LABEL, OWNER_JOB_LABEL, POOL_LABEL, ROLE_LABEL, SANDBOX_LABEL, VLLM_PORT,
};

/// The pool's policy: `<pool>-egress`.
pub fn policy_name(pool: &str) -> String {
    format!("{pool}-egress")
}

/// The NetworkPolicy the operator keeps for `pool`, owned by it: DNS and `egress.allow`, no
/// trainer (a job's own policy adds it to the pods it claims); `None` when the pool says
/// `egress.policy: Unmanaged`.
pub fn build(pool: &GatewayPool) -> Result<Option<NetworkPolicy>, serde_json::Error> {
    let name = pool.name_any();
    policy(
        &policy_name(&name),
        pool,
        json!({POOL_LABEL: name}),
        Vec::new(),
        Some(&pool.spec.egress),
    )
}

/// A job's policy: `<job>-job-egress` (a pool of the job's name keeps its own).
pub fn job_policy_name(job: &str) -> String {
    format!("{job}-job-egress")
}

/// The NetworkPolicy the operator keeps for the sandbox pods running `job`'s sessions, owned
/// by the job: its own trainer or collector and, for a `poolTemplate` job's own pods, the
/// pool's other rules from its `spec.egress` (DNS, `allow`). `pool` is the pool a job claims
/// from. `None` when that pool, or a `poolTemplate` job, says `Unmanaged`: a policy selecting
/// a pod makes everything it does not allow refused, which would cut off whatever the user's
/// own policies give it.
pub fn build_for_job(
    job: &RolloutJob,
    pool: Option<&GatewayPool>,
) -> Result<Option<NetworkPolicy>, serde_json::Error> {
    let name = job.name_any();
    let own_spec = job.spec.egress.clone().unwrap_or_default();
    let egress = match (&job.spec.pool_template, pool) {
        (Some(_), _) => Some(&own_spec),
        (None, Some(pool)) if pool.spec.egress.policy == EgressPolicy::Managed => None,
        (None, _) => return Ok(None),
    };
    let own_pods = json!({"to": [{"podSelector": {
                              "matchLabels": {OWNER_JOB_LABEL: name},
                              "matchExpressions": [{"key": ROLE_LABEL, "operator": "In",
                                                    "values": ["trainer", "dataset"]}]}}],
                          "ports": [{"protocol": "TCP", "port": VLLM_PORT},
                                    {"protocol": "TCP", "port": INGEST_PORT}]});
    policy(
        &job_policy_name(&name),
        job,
        json!({JOB_LABEL: name, SANDBOX_LABEL: "true"}),
        vec![own_pods],
        egress,
    )
}

/// A policy selecting `selector` with `first` rules, then (given `egress`) DNS and `allow`.
fn policy<K: Resource<DynamicType = ()>>(
    name: &str,
    owner: &K,
    selector: serde_json::Value,
    first: Vec<serde_json::Value>,
    egress: Option<&EgressSpec>,
) -> Result<Option<NetworkPolicy>, serde_json::Error> {
    if egress.is_some_and(|e| e.policy == EgressPolicy::Unmanaged) {
        return Ok(None);
    }
    let mut rules = first;
    if let Some(egress) = egress {
        pool_rules(egress, &mut rules)?;
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

/// A pool's rules: DNS, only where the cluster serves it (port 53 anywhere would be a way
/// out), and `allow`.
fn pool_rules(
    egress: &EgressSpec,
    rules: &mut Vec<serde_json::Value>,
) -> Result<(), serde_json::Error> {
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
    Ok(())
}

/// Whose policy `keep` writes: a pool's or a job's, by its kind, name and UID.
#[derive(Clone, Copy, Debug)]
pub struct Owner<'a> {
    pub kind: &'static str,
    pub name: &'a str,
    pub uid: &'a str,
}

/// Why [`keep`] did not make the policy what it should be.
#[derive(Debug, thiserror::Error)]
pub enum KeepError {
    #[error("{0}")]
    Api(#[from] kube::Error),
    /// Someone else's policy under the name: a user's own (a pool set `Unmanaged` to keep its
    /// own, under the name floe would use), or another controller's. Never written or deleted.
    #[error(
        "NetworkPolicy {name} exists and is not this {kind}'s ({holder}): floe leaves it as it \
         is, and starts no sandbox pod without its own policy; rename or delete it"
    )]
    NotOurs {
        name: String,
        kind: String,
        holder: String,
    },
    /// Its own, being deleted (garbage collection deciding before a takeover, say): written
    /// again once it is gone, rather than patched and then lost.
    #[error("NetworkPolicy {0} is being deleted: it is made again once gone")]
    BeingDeleted(String),
}

/// Whether a policy found under the name is `owner`'s to write: its own, or one an earlier
/// object of its kind and name made (deleted, so garbage collection deletes its policy soon;
/// taking it over leaves its pods no moment without one: the same field manager's apply
/// replaces the earlier owner reference). Anything else (no controller, another owner) is
/// someone else's.
fn may_keep(found: &ObjectMeta, owner: Owner) -> Result<(), String> {
    match holder(found, owner.kind, owner.name, owner.uid) {
        Holder::This | Holder::Earlier { .. } => Ok(()),
        Holder::Other(Some(o)) => Err(format!("its controller is {} {}", o.kind, o.name)),
        Holder::Other(None) => Err("it has no controller: a user's own?".into()),
    }
}

/// Make NetworkPolicy `name` what `wanted` says: applied (server-side, floe's field manager)
/// or, with `None`, deleted (one already gone is fine). Only `owner`'s ([`may_keep`]): a
/// policy of someone else's under the name is neither overwritten nor deleted
/// ([`KeepError::NotOurs`] when one is wanted). (The RolloutJob controller keeps its
/// `poolTemplate` pods' policy with it too.)
pub async fn keep(
    client: &Client,
    ns: &str,
    name: &str,
    owner: Owner<'_>,
    wanted: Option<&NetworkPolicy>,
) -> Result<(), KeepError> {
    let api: Api<NetworkPolicy> = Api::namespaced(client.clone(), ns);
    let found = api.get_opt(name).await?;
    let mine = found.as_ref().map(|f| may_keep(&f.metadata, owner));
    let going = found
        .as_ref()
        .is_some_and(|f| f.metadata.deletion_timestamp.is_some());
    match (wanted, mine) {
        (Some(_), Some(Ok(()))) if going => Err(KeepError::BeingDeleted(name.into())),
        (Some(_), Some(Err(holder))) => Err(KeepError::NotOurs {
            name: name.into(),
            kind: owner.kind.to_lowercase(),
            holder,
        }),
        (Some(policy), _) => {
            api.patch(
                name,
                &PatchParams::apply("floe-operator").force(),
                &Patch::Apply(policy),
            )
            .await?;
            Ok(())
        }
        (None, Some(Ok(()))) => {
            // Only the one read (the name may hold a new one since).
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: found.and_then(|f| f.metadata.uid),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match api.delete(name, &params).await {
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
                other => other.map(|_| ()).map_err(KeepError::from),
            }
        }
        // Nothing there, or someone else's: nothing to do.
        (None, _) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// floe writes or deletes a policy under its name only when it is the owner's own or an
    /// earlier same-named owner's: never a user's, nor another controller's.
    #[test]
    fn only_the_owners_policy_or_an_earlier_same_named_owners_is_kept() {
        let owner = Owner {
            kind: "GatewayPool",
            name: "pi",
            uid: "u-2",
        };
        let meta = |refs: serde_json::Value| -> ObjectMeta {
            serde_json::from_value(json!({"name": "pi-egress", "ownerReferences": refs}))
                .expect("meta")
        };
        let reference = |kind: &str, name: &str, uid: &str, controller: bool| {
            json!({"apiVersion": "floe.dev/v1alpha1", "kind": kind, "name": name, "uid": uid,
                   "controller": controller})
        };
        let kept = |m: ObjectMeta| may_keep(&m, owner);
        assert_eq!(
            kept(meta(json!([reference("GatewayPool", "pi", "u-2", true)]))),
            Ok(())
        );
        // An earlier pool of the name, deleted: taken over.
        assert_eq!(
            kept(meta(json!([reference("GatewayPool", "pi", "u-1", true)]))),
            Ok(())
        );
        assert!(kept(meta(json!([]))).is_err_and(|w| w.contains("no controller")));
        // Owned without control (a user's Application, say), another pool's, a job's.
        assert!(kept(meta(json!([reference("GatewayPool", "pi", "u-2", false)]))).is_err());
        assert!(kept(meta(json!([reference(
            "GatewayPool",
            "other",
            "u-3",
            true
        )])))
        .is_err_and(|w| w.contains("GatewayPool other")));
        assert!(kept(meta(json!([reference("RolloutJob", "pi", "u-4", true)]))).is_err());
        let mut foreign = reference("GatewayPool", "pi", "u-5", true);
        foreign["apiVersion"] = "example.com/v1".into();
        assert!(kept(meta(json!([foreign]))).is_err());
    }

    fn pool(egress: serde_json::Value) -> GatewayPool {
        serde_json::from_value(json!({
            "apiVersion": "floe.dev/v1alpha1", "kind": "GatewayPool",
            "metadata": {"name": "pi", "namespace": "rl", "uid": "u-1"},
            "spec": {"replicas": 1, "template": {"image": "pi:1"}, "egress": egress},
        }))
        .expect("pool")
    }

    #[test]
    fn by_default_the_pools_pods_reach_dns_only() {
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
        // DNS only to the cluster's DNS pods; trainers come with a job's own policy.
        assert_eq!(
            spec["egress"],
            json!([{"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
                    "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}])
        );
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

    /// The rule a job's policy starts with: its own trainer or collector, on 8000 and 8100.
    fn own_pods_rule(job: &str) -> serde_json::Value {
        json!({"to": [{"podSelector": {"matchLabels": {"floe.dev/owner-job": job},
                                       "matchExpressions": [{"key": "floe.dev/job-role", "operator": "In",
                                                             "values": ["trainer", "dataset"]}]}}],
               "ports": [{"protocol": "TCP", "port": 8000}, {"protocol": "TCP", "port": 8100}]})
    }

    #[test]
    fn a_pool_template_jobs_own_pods_get_its_trainer_and_the_pool_rules_owned_by_the_job() {
        let teacher = json!({"to": [{"ipBlock": {"cidr": "10.0.0.7/32"}}]});
        let policy = build_for_job(
            &job(json!({"poolTemplate": {"image": "swe:1"},
                        "egress": {"allow": [teacher]}})),
            None,
        )
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
        let mut want = vec![own_pods_rule("swe")];
        want.extend(pool_rules["egress"].as_array().cloned().unwrap_or_default());
        assert_eq!(spec["egress"], json!(want));
        assert!(build_for_job(
            &job(json!({"poolTemplate": {"image": "swe:1"},
                                           "egress": {"policy": "Unmanaged"}})),
            None
        )
        .expect("builds")
        .is_none());
    }

    #[test]
    fn a_job_on_a_managed_pool_adds_its_own_trainer_to_the_pods_it_claims() {
        let on_pool = job(json!({"poolRef": {"name": "pi"}}));
        let policy = build_for_job(&on_pool, Some(&pool(json!({}))))
            .expect("builds")
            .expect("managed");
        assert_eq!(policy.metadata.name.as_deref(), Some("swe-job-egress"));
        let spec = serde_json::to_value(policy.spec.expect("spec")).expect("json");
        // A claimed pod carries floe.dev/job; an unclaimed one does not, so it reaches no trainer.
        assert_eq!(
            spec["podSelector"],
            json!({"matchLabels": {"floe.dev/job": "swe", "floe.dev/sandbox": "true"}})
        );
        // Only the trainer: DNS and allow come with the pool's own policy.
        assert_eq!(spec["egress"], json!([own_pods_rule("swe")]));
        // A pool whose egress the user manages gets no policy from floe: one would cut off what
        // the user's policies allow.
        let unmanaged = pool(json!({"policy": "Unmanaged"}));
        assert!(build_for_job(&on_pool, Some(&unmanaged))
            .expect("builds")
            .is_none());
    }

    #[test]
    fn allow_adds_rules_and_unmanaged_keeps_none() {
        let teacher = json!({"to": [{"ipBlock": {"cidr": "10.0.0.7/32"}}],
                             "ports": [{"protocol": "TCP", "port": 8000}]});
        let policy = build(&pool(json!({"allow": [teacher]})))
            .expect("builds")
            .expect("managed");
        let spec = serde_json::to_value(policy.spec.expect("spec")).expect("json");
        assert_eq!(spec["egress"][1], teacher);
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

    /// NetworkPolicy's egress semantics for a pod in namespace `rl` labelled `from`: open when
    /// no policy selects it; else allowed iff a rule of a policy selecting it matches, by its
    /// peers (none: anywhere) and ports (none: any).
    fn allowed(
        policies: &[&NetworkPolicy],
        from: &serde_json::Value,
        to: &To,
        port: i64,
        protocol: &str,
    ) -> bool {
        let own_ns = json!({"kubernetes.io/metadata.name": "rl"});
        let selecting: Vec<serde_json::Value> = policies
            .iter()
            .map(|p| serde_json::to_value(p.spec.clone()).unwrap_or_default())
            .filter(|spec| labels_match(&spec["podSelector"], from))
            .collect();
        if selecting.is_empty() {
            return true;
        }
        let rules = selecting
            .iter()
            .flat_map(|spec| spec["egress"].as_array().cloned().unwrap_or_default());
        rules.into_iter().any(|rule| {
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

    /// The policies of one namespace (pool `pi`; jobs `swe` and `rival` claiming from it;
    /// `tmpl` with its own pods) against a table of destinations, from a pod `swe` claimed, an
    /// unclaimed pool pod and a `tmpl` pod.
    #[test]
    fn the_policies_against_a_table_of_destinations() {
        let ns = |n: &str| json!({"kubernetes.io/metadata.name": n});
        let pod = |labels: serde_json::Value, n: &str| To {
            ip: [10, 244, 0, 9],
            pod: Some((labels, ns(n))),
        };
        let ip = |ip: [u8; 4]| To { ip, pod: None };
        let teacher = json!({"to": [{"ipBlock": {"cidr": "10.0.0.7/32"}}],
                             "ports": [{"protocol": "TCP", "port": 8000}]});
        let the_pool = pool(json!({"allow": [teacher]}));
        let named = |name: &str, spec: serde_json::Value| {
            let mut j = job(spec);
            j.metadata.name = Some(name.into());
            j
        };
        let policies: Vec<NetworkPolicy> = [
            build(&the_pool),
            build_for_job(
                &named("swe", json!({"poolRef": {"name": "pi"}})),
                Some(&the_pool),
            ),
            build_for_job(
                &named("rival", json!({"poolRef": {"name": "pi"}})),
                Some(&the_pool),
            ),
            build_for_job(
                &named("tmpl", json!({"poolTemplate": {"image": "swe:1"}})),
                None,
            ),
        ]
        .into_iter()
        .map(|p| p.expect("builds").expect("managed"))
        .collect();
        let policies: Vec<&NetworkPolicy> = policies.iter().collect();
        let claimed = json!({POOL_LABEL: "pi", SANDBOX_LABEL: "true", JOB_LABEL: "swe"});
        let unclaimed = json!({POOL_LABEL: "pi", SANDBOX_LABEL: "true"});
        let own = json!({JOB_LABEL: "tmpl", SANDBOX_LABEL: "true"});
        let dns_pod = || pod(json!({"k8s-app": "kube-dns"}), "kube-system");
        let of = |job: &str, role: &str| pod(json!({OWNER_JOB_LABEL: job, ROLE_LABEL: role}), "rl");
        // (what, to, port, protocol, allowed from: the claimed pod, the unclaimed one, tmpl's)
        let table: Vec<(&str, To, i64, &str, [bool; 3])> = vec![
            ("cluster DNS, UDP", dns_pod(), 53, "UDP", [true; 3]),
            ("cluster DNS, TCP", dns_pod(), 53, "TCP", [true; 3]),
            (
                "a resolver on the internet",
                ip([8, 8, 8, 8]),
                53,
                "UDP",
                [false; 3],
            ),
            (
                "port 53 of another pod",
                pod(json!({"app": "x"}), "rl"),
                53,
                "UDP",
                [false; 3],
            ),
            (
                "swe's trainer, policy server",
                of("swe", "trainer"),
                8000,
                "TCP",
                [true, false, false],
            ),
            (
                "swe's trainer, ingest",
                of("swe", "trainer"),
                8100,
                "TCP",
                [true, false, false],
            ),
            (
                "swe's trainer, ssh",
                of("swe", "trainer"),
                22,
                "TCP",
                [false; 3],
            ),
            (
                "swe's task loader",
                of("swe", "tasks"),
                8100,
                "TCP",
                [false; 3],
            ),
            (
                "rival's trainer",
                of("rival", "trainer"),
                8100,
                "TCP",
                [false; 3],
            ),
            (
                "rival's collector",
                of("rival", "dataset"),
                8100,
                "TCP",
                [false; 3],
            ),
            (
                "tmpl's trainer",
                of("tmpl", "trainer"),
                8000,
                "TCP",
                [false, false, true],
            ),
            (
                "a trainer without an owner",
                pod(json!({ROLE_LABEL: "trainer"}), "rl"),
                8000,
                "TCP",
                [false; 3],
            ),
            (
                "another pod on 8000",
                pod(json!({"app": "x"}), "rl"),
                8000,
                "TCP",
                [false; 3],
            ),
            (
                "swe's trainer's twin in another namespace",
                pod(
                    json!({OWNER_JOB_LABEL: "swe", ROLE_LABEL: "trainer"}),
                    "other",
                ),
                8000,
                "TCP",
                [false; 3],
            ),
            (
                "the Kubernetes API",
                ip([10, 96, 0, 1]),
                443,
                "TCP",
                [false; 3],
            ),
            (
                "cloud metadata",
                ip([169, 254, 169, 254]),
                80,
                "TCP",
                [false; 3],
            ),
            (
                "the pool's teacher",
                ip([10, 0, 0, 7]),
                8000,
                "TCP",
                [true, true, false],
            ),
            (
                "the teacher's other port",
                ip([10, 0, 0, 7]),
                22,
                "TCP",
                [false; 3],
            ),
        ];
        for (what, to, port, protocol, expected) in &table {
            for (from, expected) in [&claimed, &unclaimed, &own].into_iter().zip(expected) {
                assert_eq!(
                    allowed(&policies, from, to, *port, protocol),
                    *expected,
                    "{what} ({protocol} {port}) from {from}"
                );
            }
        }
        // A DNS of the pool's own (a node-local cache), and no DNS at all.
        let local = build(&pool(
            json!({"dns": [{"ipBlock": {"cidr": "169.254.20.10/32"}}]}),
        ))
        .expect("builds")
        .expect("managed");
        assert!(allowed(
            &[&local],
            &unclaimed,
            &ip([169, 254, 20, 10]),
            53,
            "UDP"
        ));
        assert!(!allowed(&[&local], &unclaimed, &dns_pod(), 53, "UDP"));
        let none = build(&pool(json!({"dns": []})))
            .expect("builds")
            .expect("managed");
        assert!(!allowed(&[&none], &unclaimed, &dns_pod(), 53, "UDP"));
    }
}
