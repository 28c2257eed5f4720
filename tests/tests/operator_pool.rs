//! The GatewayPool controller on the genuine kube-apiserver: the real `floe operator` process
//! keeps `replicas` sandbox pods warm. There is no kubelet here, so the test plays it: it marks
//! pods Ready (as the readiness probe on the gateway's `/readyz` would) and claims a pod the way
//! a RolloutJob does (compare-and-swap on the `floe.dev/state` label).

use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};
use floe_crds::gateway_pool::GatewayPool;
use floe_tests::namespace::with_crds;
use floe_tests::operator::{eventually, eventually_within, metric_value, Operator};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

fn start_operator(namespace: &str) -> Result<Operator> {
    Operator::start(namespace, &[])
}

/// Play the kubelet: the pod runs and its readiness probe passes.
async fn make_ready(pods: &Api<Pod>, name: &str) -> Result<()> {
    let status = json!({"status": {"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-22T00:00:00Z"}]}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(())
}

async fn pool_pods(pods: &Api<Pod>, state: &str) -> Result<Vec<Pod>> {
    Ok(pods
        .list(&ListParams::default().labels(&format!("floe.dev/pool=warm,floe.dev/state={state}")))
        .await?
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect())
}

fn managed_fields(pod: &Pod) -> usize {
    pod.metadata.managed_fields.as_ref().map_or(0, Vec::len)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_fills_to_replicas_and_refills_after_a_claim() -> Result<()> {
    let (client, ns) = with_crds("pool").await?;
    let operator = start_operator(&ns.name)?;
    let pools: Api<GatewayPool> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let pool: GatewayPool = serde_json::from_value(json!({
        "apiVersion": "floe.dev/v1alpha1", "kind": "GatewayPool",
        "metadata": {"name": "warm"},
        "spec": {"replicas": 3, "template": {"image": "ghcr.io/acme/sandbox-pi:1"},
                 "prepare": [{"name": "deps", "command": ["true"]}],
                 "gateway": {"upstream": {"url": "http://policy:8000"}}},
    }))?;
    pools.create(&PostParams::default(), &pool).await?;

    // Three pods appear, warming, each with its own control-token Secret owned by the pod.
    let warming = eventually("3 warming pods", async || {
        let w = pool_pods(&pods, "warming").await?;
        Ok((w.len() == 3).then_some(w))
    })
    .await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns.name);
    for pod in &warming {
        // The operator creates each pod, then its Secret (owned by the pod, so it needs the
        // pod's uid): the Secret may trail the pod by a moment.
        let name = format!("{}-control", pod.name_any());
        let secret = eventually("the pod's control Secret", async || {
            Ok(secrets.get_opt(&name).await?)
        })
        .await?;
        let owner = &secret.owner_references()[0];
        assert_eq!(owner.uid, pod.uid().unwrap_or_default());
        assert!(secret
            .data
            .as_ref()
            .is_some_and(|d| d.contains_key("control-token")));
        let spec = pod.spec.as_ref().context("pod spec")?;
        assert_eq!(spec.automount_service_account_token, Some(false));
        // apiserver 1.20: no native sidecars, so the gateway is a second container.
        let names: Vec<&str> = spec.containers.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["sandbox", "agent", "floe-gateway"]);
        assert_eq!(pod.owner_references()[0].kind, "GatewayPool");
    }

    // The kubelet's part: pods become Ready; the operator marks them READY.
    for pod in &warming {
        make_ready(&pods, &pod.name_any()).await?;
    }
    eventually("3 READY pods and status", async || {
        let ready = pool_pods(&pods, "ready").await?.len();
        let status = pools.get("warm").await?.status.unwrap_or_default();
        Ok((ready == 3 && status.ready_replicas == 3 && status.replicas == 3).then_some(()))
    })
    .await?;
    // The READY mark cleared each pod's field-ownership record, and the apiserver then tracks
    // no later write either: the kubelet's next status write leaves it empty.
    for pod in &warming {
        assert!(
            managed_fields(pod) > 0,
            "{} was created tracked",
            pod.name_any()
        );
    }
    for pod in pool_pods(&pods, "ready").await? {
        assert_eq!(managed_fields(&pod), 0, "{}", pod.name_any());
        make_ready(&pods, &pod.name_any()).await?;
        assert_eq!(managed_fields(&pods.get(&pod.name_any()).await?), 0);
    }
    let status = pools.get("warm").await?.status.context("status")?;
    // What an HPA or KEDA counts: the unclaimed pods only.
    assert_eq!(
        status.selector.as_deref(),
        Some("floe.dev/pool=warm,floe.dev/state in (warming,ready)")
    );
    let kstatus: Vec<(&str, &str)> = status
        .conditions
        .iter()
        .map(|c| (c.type_.as_str(), c.status.as_str()))
        .collect();
    assert_eq!(
        kstatus,
        [
            ("Ready", "True"),
            ("Reconciling", "False"),
            ("Stalled", "False")
        ]
    );
    assert_eq!(
        status.observed_generation,
        pools.get("warm").await?.metadata.generation
    );
    let metrics = operator.metrics().await?;
    let line = format!(
        "floe_pool_ready{{namespace=\"{}\",pool=\"warm\"}} 3",
        ns.name
    );
    assert!(metrics.contains(&line), "{line} not in:\n{metrics}");
    assert!(metrics.contains(
        "controller_runtime_reconcile_total{controller=\"gatewaypool\",result=\"requeue_after\"}"
    ));
    assert!(metrics
        .contains("controller_runtime_reconcile_time_seconds_bucket{controller=\"gatewaypool\""));

    // A RolloutJob claims one (compare-and-swap on the state label); the pool refills.
    let victim = pool_pods(&pods, "ready").await?.remove(0);
    let claim = json!({"metadata": {"resourceVersion": victim.resource_version(), "labels": {"floe.dev/state": "claimed"}}});
    pods.patch(
        &victim.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&claim),
    )
    .await?;
    // The same claim again with the old resourceVersion loses: exactly one claimer wins.
    let second = pods
        .patch(
            &victim.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&claim),
        )
        .await;
    assert!(matches!(second, Err(kube::Error::Api(s)) if s.is_conflict()));
    let fresh = eventually("a replacement pod", async || {
        let w = pool_pods(&pods, "warming").await?;
        Ok((w.len() == 1).then_some(w))
    })
    .await?;
    make_ready(&pods, &fresh[0].name_any()).await?;
    eventually("status after refill", async || {
        let s = pools.get("warm").await?.status.unwrap_or_default();
        Ok((s.ready_replicas == 3 && s.claimed_replicas == 1).then_some(()))
    })
    .await?;

    // Scale down through the scale subresource: surplus pods go.
    pools
        .patch_scale(
            "warm",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"replicas": 1}})),
        )
        .await?;
    eventually("scaled down to 1", async || {
        let ready = pool_pods(&pods, "ready").await?.len();
        let s = pools.get("warm").await?.status.unwrap_or_default();
        Ok((ready == 1 && s.replicas == 1).then_some(()))
    })
    .await?;
    // The claimed pod is the job's business: untouched.
    assert!(pods.get(&victim.name_any()).await.is_ok());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_two_replicas_only_the_leader_acts_and_the_other_takes_over() -> Result<()> {
    use k8s_openapi::api::coordination::v1::Lease;
    let (client, ns) = with_crds("leader").await?;
    // 15 s: renewals every 5 s, so only a 10 s stall of the leader lets the other take over
    // before the test stops it (a stopping leader releases the Lease: no wait for expiry).
    let elect = |id: &'static str| -> Result<Operator> {
        Operator::start(
            &ns.name,
            &[
                "--leader-elect",
                "--lease-duration-seconds",
                "15",
                "--identity",
                id,
            ],
        )
    };
    let mut replicas = vec![("a", elect("a")?), ("b", elect("b")?)];
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns.name);
    let holder = async || -> Result<Option<String>> {
        Ok(leases
            .get_opt("floe-operator")
            .await?
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity))
    };
    let first = eventually("a leader", async || holder().await).await?;
    // The Lease is written before the winner sets its gauge, so the leader's page is awaited;
    // the other's is read once, after it.
    let (leader, others): (Vec<_>, Vec<_>) = replicas.iter().partition(|(id, _)| *id == first);
    for (_, op) in leader {
        eventually("the leader's floe_leader 1", async || {
            Ok(op
                .metrics()
                .await
                .ok()
                .filter(|m| m.contains("floe_leader 1")))
        })
        .await?;
    }
    for (id, op) in others {
        let m = eventually("metrics", async || Ok(op.metrics().await.ok())).await?;
        assert!(
            m.contains("floe_leader 0"),
            "{id}: floe_leader 0 not in metrics"
        );
    }

    let pools: Api<GatewayPool> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let pool: GatewayPool = serde_json::from_value(json!({
        "apiVersion": "floe.dev/v1alpha1", "kind": "GatewayPool",
        "metadata": {"name": "warm"},
        "spec": {"replicas": 2, "template": {"image": "ghcr.io/acme/sandbox-pi:1"}},
    }))?;
    pools.create(&PostParams::default(), &pool).await?;
    eventually("2 pods", async || {
        Ok((pool_pods(&pods, "warming").await?.len() == 2).then_some(()))
    })
    .await?;
    // Two replicas acting would each create pods: the count must stay at 2.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(pool_pods(&pods, "warming").await?.len(), 2);

    // The leader stops (SIGTERM, as on a rollout): it releases the lease and the other
    // replica takes over and keeps acting.
    let index = replicas
        .iter()
        .position(|(id, _)| *id == first)
        .context("leader is a replica")?;
    let (_, mut leader) = replicas.remove(index);
    Command::new("kill")
        .args(["-TERM", &leader.child.id().to_string()])
        .status()?;
    let exit = leader.child.wait()?;
    assert!(exit.success(), "the leader stops cleanly: {exit}");
    let next = eventually("the other replica leads", async || {
        Ok(holder().await?.filter(|h| h != &first))
    })
    .await?;
    assert_eq!(next, replicas[0].0);
    pools
        .patch_scale(
            "warm",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"replicas": 3}})),
        )
        .await?;
    eventually("the new leader adds the third pod", async || {
        Ok((pool_pods(&pods, "warming").await?.len() == 3).then_some(()))
    })
    .await?;
    Ok(())
}

/// A replica's writes are fenced by its lease (`lease_fence`): a leader frozen past its lease,
/// or one whose renewals fail, wakes with rounds under way while another replica acts. Through
/// the controllers' client as `floe operator` builds it, against the real apiserver: with the
/// lease not renewed within its deadline no write goes (the object is not made, the error says
/// why) while reads do, and the lease's own client is not fenced; renewed, writes go again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_does_not_hold_its_lease_sends_no_write() -> Result<()> {
    use floe_operator::client_rate::RateLimit;
    use floe_operator::clients::operator_clients;
    use floe_operator::lease_fence::LeaseValidity;
    let (admin, ns) = with_crds("fence").await?;
    let validity = LeaseValidity::elected();
    let config = floe_tests::cluster::cluster().config().await?;
    let limit = RateLimit {
        qps: 50.0,
        burst: 100,
    };
    let (controllers, lease) =
        operator_clients(config, limit, &validity, Some(Duration::from_secs(5)))?;
    let fenced: Api<Secret> = Api::namespaced(controllers, &ns.name);
    let own: Api<Secret> = Api::namespaced(lease, &ns.name);
    let seen: Api<Secret> = Api::namespaced(admin, &ns.name);
    let secret = |name: &str| -> Result<Secret> {
        Ok(serde_json::from_value(json!({"metadata": {"name": name}}))?)
    };
    let names = async || -> Result<Vec<String>> {
        let mut n: Vec<String> = seen
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .map(|s| s.name_any())
            .filter(|n| !n.starts_with("default-token"))
            .collect();
        n.sort();
        Ok(n)
    };
    let refused = fenced
        .create(&PostParams::default(), &secret("unheld")?)
        .await
        .err()
        .context("a write went without the lease")?;
    assert!(refused.to_string().contains("leader lease"), "{refused}");
    assert!(
        fenced.list(&ListParams::default()).await.is_ok(),
        "reads go"
    );
    own.create(&PostParams::default(), &secret("renewal")?)
        .await?;
    validity.renewed(tokio::time::Instant::now(), Duration::from_secs(10));
    fenced
        .create(&PostParams::default(), &secret("held")?)
        .await?;
    validity.revoked();
    let patch = Patch::Merge(json!({"metadata": {"labels": {"after": "loss"}}}));
    let refused = fenced.patch("held", &PatchParams::default(), &patch).await;
    assert!(
        refused.is_err(),
        "a write went after the lease was given up"
    );
    assert_eq!(names().await?, ["held", "renewal"]);
    assert!(seen.get("held").await?.labels().get("after").is_none());
    Ok(())
}

async fn event_reasons(client: &kube::Client, ns: &str) -> Result<Vec<String>> {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), ns);
    Ok(events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|e| e.reason)
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_change_recreates_or_waits_for_replenishment_by_strategy() -> Result<()> {
    let (client, ns) = with_crds("strategy").await?;
    let _operator = start_operator(&ns.name)?;
    let pools: Api<GatewayPool> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let pool: GatewayPool = serde_json::from_value(json!({
        "apiVersion": "floe.dev/v1alpha1", "kind": "GatewayPool",
        "metadata": {"name": "warm"},
        "spec": {"replicas": 2, "template": {"image": "sandbox:1"},
                 "updateStrategy": {"type": "Recreate"}},
    }))?;
    pools.create(&PostParams::default(), &pool).await?;
    let names = |list: &[Pod]| {
        let mut n: Vec<String> = list.iter().map(|p| p.name_any()).collect();
        n.sort();
        n
    };
    let first = eventually("2 warming pods", async || {
        let w = pool_pods(&pods, "warming").await?;
        Ok((w.len() == 2).then_some(w))
    })
    .await?;
    for pod in &first {
        make_ready(&pods, &pod.name_any()).await?;
    }
    eventually("2 READY", async || {
        Ok((pool_pods(&pods, "ready").await?.len() == 2).then_some(()))
    })
    .await?;

    // Recreate: a new template replaces the READY pods at once.
    let set_image = |image: &'static str| json!({"spec": {"template": {"image": image}}});
    pools
        .patch(
            "warm",
            &PatchParams::default(),
            &Patch::Merge(&set_image("sandbox:2")),
        )
        .await?;
    let second = eventually("2 new warming pods", async || {
        let w = pool_pods(&pods, "warming").await?;
        Ok((w.len() == 2 && pool_pods(&pods, "ready").await?.is_empty()).then_some(w))
    })
    .await?;
    assert!(names(&second).iter().all(|n| !names(&first).contains(n)));
    for pod in &second {
        let image = pod.spec.as_ref().map(|s| s.containers[0].image.clone());
        assert_eq!(image, Some(Some("sandbox:2".to_string())));
        make_ready(&pods, &pod.name_any()).await?;
    }
    eventually("2 READY again", async || {
        Ok((pool_pods(&pods, "ready").await?.len() == 2).then_some(()))
    })
    .await?;

    // OnReplenish: a new template leaves READY pods serving until they are claimed.
    pools
        .patch(
            "warm",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"updateStrategy": {"type": "OnReplenish"}, "template": {"image": "sandbox:3"}}})),
        )
        .await?;
    let hash = eventually("the new template hash in status", async || {
        let s = pools.get("warm").await?.status.unwrap_or_default();
        Ok(
            (s.observed_generation == pools.get("warm").await?.metadata.generation)
                .then_some(s.template_hash),
        )
    })
    .await?;
    assert_ne!(
        hash,
        second[0]
            .annotations()
            .get("floe.dev/template-hash")
            .cloned()
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(names(&pool_pods(&pods, "ready").await?), names(&second));
    assert!(pool_pods(&pods, "warming").await?.is_empty());

    // Events on transitions (repeats are folded into one Event's series by the recorder).
    eventually("the pool's Events", async || {
        let r = event_reasons(&client, &ns.name).await?;
        Ok(
            (r.iter().any(|r| r == "PodRecreated") && r.iter().any(|r| r == "PoolReady"))
                .then_some(()),
        )
    })
    .await?;
    Ok(())
}

/// A pod the apiserver refuses as the template makes it (here a RuntimeClass that does not
/// exist, as `examples/gatewaypool.yaml`'s `gvisor` on a plain cluster): the pool says so in its
/// `Ready` and `Stalled` conditions and a Warning, and backs off instead of retrying every
/// reconcile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_the_apiserver_refuses_is_named_on_the_pool_which_backs_off() -> Result<()> {
    let (client, ns) = with_crds("refused").await?;
    let operator = start_operator(&ns.name)?;
    let pools: Api<GatewayPool> = Api::namespaced(client.clone(), &ns.name);
    let pool: GatewayPool = serde_json::from_value(json!({
        "apiVersion": "floe.dev/v1alpha1", "kind": "GatewayPool",
        "metadata": {"name": "gvisor"},
        "spec": {"replicas": 2, "template": {"image": "sandbox:1", "runtimeClassName": "gvisor"}},
    }))?;
    pools.create(&PostParams::default(), &pool).await?;
    let status = eventually("the pool names the refusal", async || {
        let s = pools.get("gvisor").await?.status;
        Ok(s.filter(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.reason == "PodCreateRejected")
        }))
    })
    .await?;
    let condition = |t: &str| {
        status
            .conditions
            .iter()
            .find(|c| c.type_ == t)
            .map(|c| (c.status.clone(), c.message.clone()))
    };
    let (ready, message) = condition("Ready").context("Ready")?;
    assert_eq!(ready, "False");
    assert!(
        message.contains("RuntimeClass \"gvisor\" not found"),
        "{message}"
    );
    assert_eq!(condition("Stalled").map(|c| c.0).as_deref(), Some("True"));
    assert_eq!(status.replicas, 0, "nothing was created");
    // Backed off: 5 s, then 10 s, between tries (not a try per reconcile).
    tokio::time::sleep(Duration::from_secs(12)).await;
    let tries = event_reasons(&client, &ns.name)
        .await?
        .iter()
        .filter(|r| *r == "PodCreateRejected")
        .count();
    assert!((1..=3).contains(&tries), "{tries} refused creates in 12 s");
    // The blocker is a metric with its reason while the pool lives, and goes with the pool
    // (pools have no finalizer: the operator sweeps deleted pools' series).
    let series = format!(
        "floe_pool_blocked{{namespace=\"{}\",pool=\"gvisor\",reason=\"PodCreateRejected\"}}",
        ns.name
    );
    let page = operator.metrics().await?;
    assert_eq!(metric_value(&page, &series), Some(1.0), "{page}");
    pools.delete("gvisor", &Default::default()).await?;
    eventually_within(60, "the deleted pool's series gone", async || {
        let page = operator.metrics().await?;
        Ok((!page.contains("pool=\"gvisor\"")).then_some(()))
    })
    .await?;
    Ok(())
}

/// A pool that cannot run as written makes no pod and says why, on its `Stalled` condition
/// and in a Warning. Two ways: this apiserver (1.20; before 1.25) does not run the CRD's rules,
/// so the operator does (the gateway's two ports must differ); and every apiserver prunes a
/// field its CRD does not know, read back from `kubectl apply`'s record: misspelled here,
/// `egress.unrestricted: Refuse` would leave the pods only warning of open egress. A third
/// mounts a claim writable, a channel between its sessions. Mended, the pool fills.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_that_cannot_run_as_written_makes_no_pod_and_says_why() -> Result<()> {
    let (client, ns) = with_crds("badpool").await?;
    let operator = start_operator(&ns.name)?;
    let pools: Api<GatewayPool> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let pool = |name: &str, extra: serde_json::Value| {
        let mut spec = json!({"replicas": 1, "template": {"image": "sandbox:1"}});
        if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
            spec.extend(extra.clone());
        }
        json!({"apiVersion": "floe.dev/v1alpha1", "kind": "GatewayPool",
               "metadata": {"name": name}, "spec": spec})
    };
    let stalled = async |name: &str, reason: &str| {
        let said = eventually("the pool stalled", async || {
            let s = pools.get(name).await?.status.unwrap_or_default();
            Ok(s.conditions
                .iter()
                .find(|c| c.type_ == "Stalled" && c.status == "True" && c.reason == reason)
                .map(|c| c.message.clone()))
        })
        .await?;
        anyhow::Ok(said)
    };
    let pods_of = async |name: &str| {
        let listed = pods
            .list(&ListParams::default().labels(&format!("floe.dev/pool={name}")))
            .await?;
        anyhow::Ok(listed.items.len())
    };
    let same_ports = pool(
        "ports",
        json!({"gateway": {"port": 8000, "controlPort": 8000}}),
    );
    pools
        .create(&PostParams::default(), &serde_json::from_value(same_ports)?)
        .await?;
    let said = stalled("ports", "InvalidSpec").await?;
    assert!(
        said.contains("gateway.port and gateway.controlPort must differ"),
        "{said}"
    );
    // Not Ready and not Reconciling either: kstatus reads a stalled pool as failed, not one
    // still on its way (Flux would wait out its timeout).
    let conditions = pools
        .get("ports")
        .await?
        .status
        .unwrap_or_default()
        .conditions;
    let flags: Vec<(&str, &str)> = conditions
        .iter()
        .map(|c| (c.type_.as_str(), c.status.as_str()))
        .collect();
    assert_eq!(
        flags,
        [
            ("Ready", "False"),
            ("Reconciling", "False"),
            ("Stalled", "True")
        ]
    );
    // `--validate=false`: this kubectl, 1.20's, refuses a field the CRD lacks itself; a newer
    // one only warns, as the apiserver's field validation does, and Argo CD applies.
    let apply = |pool: &serde_json::Value| -> Result<()> {
        let done = floe_tests::cluster::cluster().kubectl(
            &["apply", "--validate=false", "-n", &ns.name, "-f", "-"],
            Some(serde_json::to_string(pool)?.as_bytes()),
        )?;
        anyhow::ensure!(done.status.success(), "{done:?}");
        Ok(())
    };
    apply(&pool("typo", json!({"egress": {"unrestrcted": "Refuse"}})))?;
    let said = stalled("typo", "InvalidSpec").await?;
    assert!(
        said.contains(
            "spec.egress.unrestrcted: unknown field (did you mean `unrestricted`?): the \
             apiserver dropped it"
        ),
        "{said}"
    );
    // A writable claim in the template is a channel between the pool's sessions.
    let shared = pool(
        "shared",
        json!({"template": {"image": "sandbox:1",
                            "volumes": [{"name": "cache", "persistentVolumeClaim": {"claimName": "pip"}}],
                            "volumeMounts": [{"name": "cache", "mountPath": "/cache"}]}}),
    );
    pools
        .create(&PostParams::default(), &serde_json::from_value(shared)?)
        .await?;
    let said = stalled("shared", "InvalidSpec").await?;
    assert!(
        said.contains(
            "spec.template.volumeMounts[0]: volume \"cache\" (persistentVolumeClaim) outlives \
             the pod and is mounted writable"
        ),
        "{said}"
    );
    // An agent run as root could rewrite the pod's shared /etc/hosts, by which its gateway
    // finds the trainer.
    let root = pool(
        "root",
        json!({"template": {"image": "sandbox:1", "securityContext": {"runAsUser": 0}}}),
    );
    pools
        .create(&PostParams::default(), &serde_json::from_value(root)?)
        .await?;
    let said = stalled("root", "InvalidSpec").await?;
    assert!(
        said.contains(
            "spec.template.securityContext.runAsUser: runAsUser: 0 would run the agent as root"
        ),
        "{said}"
    );
    // The check comes before any create in a round: a few rounds later, still no pod.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        (
            pods_of("ports").await?,
            pods_of("typo").await?,
            pods_of("shared").await?,
            pods_of("root").await?
        ),
        (0, 0, 0, 0)
    );
    let warnings = event_reasons(&client, &ns.name).await?;
    assert!(
        warnings.iter().filter(|r| *r == "InvalidSpec").count() >= 2,
        "{warnings:?}"
    );
    // What `FloePoolBlocked` pages on.
    let page = operator.metrics().await?;
    let series = format!(
        "floe_pool_blocked{{namespace=\"{}\",pool=\"typo\",reason=\"InvalidSpec\"}}",
        ns.name
    );
    assert_eq!(metric_value(&page, &series), Some(1.0), "{page}");
    // Stalled, the pool is left alone: no status write (each would be the next reconcile's
    // trigger) once it says why.
    let rv = pools.get("typo").await?.resource_version();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(pools.get("typo").await?.resource_version(), rv);
    // Spelled right, the pool goes on: its pod is made, and it is no longer stalled.
    apply(&pool("typo", json!({"egress": {"unrestricted": "Refuse"}})))?;
    eventually("the mended pool makes its pod", async || {
        let stalled = pools
            .get("typo")
            .await?
            .status
            .unwrap_or_default()
            .conditions
            .iter()
            .any(|c| c.type_ == "Stalled" && c.status == "True");
        Ok((!stalled && pods_of("typo").await? == 1).then_some(()))
    })
    .await?;
    assert_eq!(
        pools.get("typo").await?.spec.egress.unrestricted,
        floe_crds::gateway_pool::UnrestrictedEgress::Refuse
    );
    let page = operator.metrics().await?;
    assert_eq!(metric_value(&page, &series), None, "{page}");
    Ok(())
}

/// A NetworkPolicy under the name a pool's would take (`<pool>-egress`) that is not the
/// pool's (a user's own, kept with `egress.policy: Unmanaged`, or one written before the pool)
/// is never overwritten nor deleted. While the pool wants its own, it makes no pod (they would
/// run without it) and says why on its status; once the name is free, it makes its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_network_policy_under_the_pools_name_that_is_not_its_own_is_left_alone() -> Result<()> {
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    let (client, ns) = with_crds("egressname").await?;
    let _operator = start_operator(&ns.name)?;
    let pools: Api<GatewayPool> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), &ns.name);
    // The user's: every pod of theirs with `app: locked` reaches nothing.
    let own = json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "mine-egress"},
        "spec": {"podSelector": {"matchLabels": {"app": "locked"}}, "policyTypes": ["Egress"],
                 "egress": []}});
    policies
        .create(&PostParams::default(), &serde_json::from_value(own)?)
        .await?;
    let pool = |policy: &str| -> Result<GatewayPool> {
        Ok(serde_json::from_value(json!({
            "apiVersion": "floe.dev/v1alpha1", "kind": "GatewayPool",
            "metadata": {"name": "mine"},
            "spec": {"replicas": 1, "template": {"image": "sandbox:1"},
                     "egress": {"policy": policy}},
        }))?)
    };
    pools
        .create(&PostParams::default(), &pool("Managed")?)
        .await?;
    let said = eventually("the pool stalled", async || {
        let s = pools.get("mine").await?.status.unwrap_or_default();
        Ok(s.conditions
            .iter()
            .find(|c| {
                c.type_ == "Stalled" && c.status == "True" && c.reason == "EgressPolicyNotOurs"
            })
            .map(|c| c.message.clone()))
    })
    .await?;
    assert!(
        said.contains("mine-egress exists and is not this gatewaypool's")
            && said.contains("no controller"),
        "{said}"
    );
    let pool_pods = async || {
        let listed = pods
            .list(&ListParams::default().labels("floe.dev/pool=mine"))
            .await?;
        anyhow::Ok(listed.items.len())
    };
    assert_eq!(
        pool_pods().await?,
        0,
        "a pod was made without the pool's policy"
    );
    let untouched = |p: &NetworkPolicy| {
        let spec = serde_json::to_value(&p.spec).unwrap_or_default();
        p.metadata.owner_references.is_none()
            && spec["podSelector"] == json!({"matchLabels": {"app": "locked"}})
    };
    assert!(
        untouched(&policies.get("mine-egress").await?),
        "overwritten"
    );

    // Unmanaged: the pool deletes the policy it would keep, never this one.
    pools
        .patch(
            "mine",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"egress": {"policy": "Unmanaged"}}})),
        )
        .await?;
    let generation = pools.get("mine").await?.metadata.generation;
    eventually("the pool reconciled its Unmanaged spec", async || {
        let p = pools.get("mine").await?;
        Ok((p.status.and_then(|s| s.observed_generation) == generation).then_some(()))
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let still = policies.get_opt("mine-egress").await?;
    assert!(
        still.as_ref().is_some_and(untouched),
        "deleted or changed: {still:?}"
    );
    // Its pods' egress is the cluster's to restrict now: they are made.
    eventually("a pod of the Unmanaged pool", async || {
        Ok((pool_pods().await? > 0).then_some(()))
    })
    .await?;

    // Gone, and the pool managed again: it makes its own.
    policies.delete("mine-egress", &Default::default()).await?;
    pools
        .patch(
            "mine",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"egress": {"policy": "Managed"}}})),
        )
        .await?;
    let made = eventually("the pool's own policy", async || {
        Ok(policies
            .get_opt("mine-egress")
            .await?
            .filter(|p| p.metadata.owner_references.is_some()))
    })
    .await?;
    assert_eq!(made.owner_references()[0].kind, "GatewayPool");
    Ok(())
}
