//! Prometheus as an on-call team runs it, against floe on the real node: the chart installed
//! by Helm runs the operator in a pod; a real Prometheus discovers it and the sandbox pods'
//! gateways through the apiserver exactly as the Prometheus Operator would from the chart's
//! own ServiceMonitor and PodMonitors, and evaluates the chart's own rule file (rendered by
//! Helm; only durations and thresholds are set through values, so that alerts act within a
//! test). Everything is read through Prometheus's HTTP API: incidents induced on the node make
//! the matching alerts fire with the labels on-call needs, and clear when the cause goes; the
//! dashboard's every panel returns data.

use super::*;
use floe_tests::chart::{
    dashboard_queries, documents, promql_metrics, referenced_metrics, render, rules_file,
};
use floe_tests::prometheus::Prometheus;
use k8s_openapi::api::rbac::v1::Role;

/// The monitors on, and values that shorten the rules' durations and lower the claim bound,
/// for a test's timescale (`--set-json` where Helm's `--set` would make a number a string).
const FAST_RULES: &[&str] = &[
    "metrics.serviceMonitor.enabled=true",
    "metrics.serviceMonitor.interval=2s",
    "metrics.podMonitor.enabled=true",
    // Two seconds: a scrape times out at its interval, and a gateway answers slower while
    // its pod's agent and the model share the node's two cores.
    "metrics.podMonitor.interval=2s",
    "prometheusRule.enabled=true",
    "prometheusRule.rules.poolEmpty.for=2s",
    "prometheusRule.rules.sessionFailures.window=40s",
    "prometheusRule.rules.sessionFailures.minResults=1",
    "prometheusRule.rules.sessionFailures.for=1s",
    "prometheusRule.rules.claimLatency.window=30s",
    "prometheusRule.rules.gatewayUpstreamLatency.window=30s",
    "prometheusRule.rules.gatewayUpstreamLatency.for=1s",
    "prometheusRule.rules.gatewayUpstreamErrors.window=30s",
    "prometheusRule.rules.gatewayUpstreamErrors.for=1s",
    "prometheusRule.rules.claimLatency.for=1s",
    "prometheusRule.rules.sandboxEgressUnrestricted.for=1s",
    "prometheusRule.rules.operatorDown.for=2s",
    "prometheusRule.rules.operatorNoLeader.for=2s",
    "prometheusRule.rules.poolBlocked.for=1s",
    "prometheusRule.rules.jobBlocked.for=1s",
    "prometheusRule.rules.reconcileErrors.window=30s",
    "prometheusRule.rules.reconcileErrors.for=1s",
];

/// Series only a train job's trainer pod (or a GPU node's DCGM exporter) has; this node runs
/// no trainer. `tests/tests/chart.rs` reads them from the real trainer's own page.
fn needs_a_trainer(metric: &str) -> bool {
    // `floe_job_held_out`: a train job's held-out rounds (the chart test and `operator_job.rs`
    // read it from the operator's code and page).
    metric.starts_with("floe_trainer_")
        || metric.starts_with("DCGM_")
        || metric == "floe_job_held_out"
}

/// Series only an operator installed cluster-wide exports: this one watches one namespace and
/// has no rule to read CRDs with (`floe_crd_missing_fields`: `chart.rs` and `operator_job.rs`
/// read it).
fn needs_a_cluster_wide_install(metric: &str) -> bool {
    metric == "floe_crd_missing_fields"
}

/// Wait until alert `name` fires with `labels`; its annotations' summary.
async fn fires(prom: &Prometheus, name: &str, labels: &[(&str, &str)]) -> Result<String> {
    eventually_within(150, &format!("{name} {labels:?} to fire"), async || {
        let firing = prom.firing(name, labels).await?;
        Ok(firing.first().map(|a| {
            a["annotations"]["summary"]
                .as_str()
                .unwrap_or("")
                .to_string()
        }))
    })
    .await
    .with_context(|| prom.log())
}

/// Wait until alert `name` with `labels` is neither pending nor firing.
async fn clears(prom: &Prometheus, name: &str, labels: &[(&str, &str)]) -> Result<()> {
    eventually_within(150, &format!("{name} {labels:?} to clear"), async || {
        let alerts = prom.alerts().await?;
        Ok((!alerts.iter().any(|a| {
            a["labels"]["alertname"] == name && labels.iter().all(|(k, v)| a["labels"][*k] == *v)
        }))
        .then_some(()))
    })
    .await
}

/// Pool `python` of `replicas` pods (the custom agent's image).
fn python_pool(image: &str, replicas: i32) -> Value {
    json!({"apiVersion": "floe.dev/v1alpha1", "kind": "GatewayPool",
           "metadata": {"name": "python"},
           "spec": {"replicas": replicas,
                    "template": agent_template(image, "agent")}})
}

/// Wait until Prometheus has scraped two of pool `python`'s pods before any call: a pod's
/// counters count for `rate()` from the first scrape on, so a pod claimed and used before
/// Prometheus ever saw it (possible within a scrape interval of READY) shows no calls.
async fn at_rest(prom: &Prometheus, ns: &str) -> Result<()> {
    let idle = format!(
        "count(floe_gateway_requests_total{{namespace=\"{ns}\", pool=\"python\", api=\"openai_chat\", status=\"200\"}} == 0) >= 2"
    );
    eventually_within(120, "two READY gateways scraped at rest", async || {
        Ok((!prom.query(&idle).await?.is_empty()).then_some(()))
    })
    .await
}

/// Set pool `python`'s replicas.
async fn scale_pool(client: &Client, ns: &str, replicas: i32) -> Result<()> {
    Api::<GatewayPool>::namespaced(client.clone(), ns)
        .patch(
            "python",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"replicas": replicas}})),
        )
        .await?;
    Ok(())
}

#[tokio::test]
async fn prometheus_scrapes_floe_on_the_node_and_its_alerts_fire_and_clear() -> Result<()> {
    let work = prepare("prom").await?;
    let (n, images, client, ns) = (
        work.n,
        work.images,
        work.client.clone(),
        work.ns.name.clone(),
    );
    let system = TestNamespace::create(&n.cluster, &client, "prom-sys").await?;
    let sys = system.name.clone();
    let release = install_chart(n, images, &sys, &ns, 1)?;
    // The same release's monitors and rules, as the Prometheus Operator would receive them.
    let mut monitoring = vec!["--namespace", sys.as_str()];
    monitoring.extend(release.iter().map(String::as_str));
    for v in FAST_RULES {
        monitoring.extend_from_slice(&["--set", v]);
    }
    for bound in [
        "prometheusRule.rules.claimLatency.p99Seconds=0.001",
        "prometheusRule.rules.gatewayUpstreamLatency.p99Seconds=0.001",
    ] {
        monitoring.extend_from_slice(&["--set-json", bound]);
    }
    let rendered = render(&monitoring)?;
    let rules = rules_file(&rendered)?;
    let prom = Prometheus::start_for_monitors(&documents(&rendered)?, client.clone(), &rules, "1s")
        .await?;

    // The operator, found through its Service's endpoints, by the job name the rules use.
    let op = format!("job=\"floe-metrics\", namespace=\"{sys}\"");
    eventually_within(90, "Prometheus scraping the operator", async || {
        Ok((!prom.query(&format!("up{{{op}}} == 1")).await?.is_empty()).then_some(()))
    })
    .await
    .with_context(|| prom.log())?;
    let leader = prom.query(&format!("floe_leader{{{op}}}")).await?;
    assert_eq!(leader.len(), 1, "one replica's leader gauge: {leader:?}");

    // Blockers, each named with its reason: a pool whose image the node may not pull, and a
    // job whose pool does not exist. They stay until the end (the series check below needs
    // them), then go with their objects, and so do their alerts.
    apply(
        &client,
        &ns,
        json!({"apiVersion": "floe.dev/v1alpha1", "kind": "GatewayPool",
               "metadata": {"name": "unpullable"},
               "spec": {"replicas": 1,
                        "template": {"image": "floe.local/no-such-image:1", "imagePullPolicy": "Never"}}}),
    )
    .await?;
    let mut orphan = sft_job("orphan", &ns, 1, "/orphan", json!([fix_add()]));
    orphan["spec"]["poolRef"]["name"] = "no-such-pool".into();
    apply(&client, &ns, orphan).await?;
    let on_unpullable = [
        ("namespace", ns.as_str()),
        ("pool", "unpullable"),
        ("reason", "ErrImageNeverPull"),
    ];
    let summary = fires(&prom, "FloePoolBlocked", &on_unpullable).await?;
    assert!(
        summary.contains(&format!(
            "GatewayPool {ns}/unpullable cannot make READY pods"
        )),
        "{summary}"
    );
    let on_orphan = [
        ("namespace", ns.as_str()),
        ("rolloutjob", "orphan"),
        ("reason", "PoolNotFound"),
    ];
    fires(&prom, "FloeRolloutJobBlocked", &on_orphan).await?;

    // An empty pool while sessions wait: FloePoolEmpty names the namespace and pool.
    apply(&client, &ns, python_pool(&images.python, 0)).await?;
    apply(
        &client,
        &ns,
        sft_job("fast", &ns, 2, "/fast", json!([fix_add()])),
    )
    .await?;
    let on_pool = [("namespace", ns.as_str()), ("pool", "python")];
    let summary = fires(&prom, "FloePoolEmpty", &on_pool).await?;
    assert!(
        summary.contains(&format!("GatewayPool {ns}/python has no READY pod while 2")),
        "{summary}"
    );
    // What the runbook says to do: raise the pool's replicas. The alert clears, the sessions run.
    scale_pool(&client, &ns, 2).await?;
    clears(&prom, "FloePoolEmpty", &on_pool).await?;
    finished(n, &client, &ns, "fast").await?;
    // Claims slower than the bound (lowered to 1 ms: any real claim).
    fires(&prom, "FloeClaimsSlow", &[("severity", "warning")]).await?;
    // The node's CNI enforces no NetworkPolicy: the pool's gateways say so, and the alert
    // names the pool.
    fires(&prom, "FloeSandboxEgressUnrestricted", &on_pool).await?;
    // The gateways are scraped through the chart's PodMonitor, labelled with their pool.
    let gateways = prom
        .query(&format!(
            "up{{job=\"{sys}/floe-gateways\", namespace=\"{ns}\", pool=\"python\"}} == 1"
        ))
        .await?;
    assert!(!gateways.is_empty(), "{:?}", prom.targets().await?);

    // A session pod lost mid-session (an infrastructure failure, retried on a fresh pod):
    // FloeSessionFailuresHigh names the job, on its first failure.
    at_rest(&prom, &ns).await?;
    apply(
        &client,
        &ns,
        sft_job("slow", &ns, 1, "/slow", json!([fix_add_slowly()])),
    )
    .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let victim = eventually_within(120, "the slow session's pod", async || {
        let listed = pods
            .list(&ListParams::default().labels("floe.dev/job=slow"))
            .await?;
        // Assigned: a pod lost before its assignment was delivered fails no session.
        Ok(listed
            .items
            .into_iter()
            .find(|p| p.annotations().contains_key("floe.dev/assigned"))
            .map(|p| p.name_any()))
    })
    .await?;
    // The agent has made its model call and sleeps (20 s) when the pod goes.
    tokio::time::sleep(std::time::Duration::from_secs(6)).await;
    pods.delete(&victim, &Default::default()).await?;
    let on_slow = [("namespace", ns.as_str()), ("rolloutjob", "slow")];
    let summary = fires(&prom, "FloeSessionFailuresHigh", &on_slow).await?;
    assert!(
        summary.contains("of sessions fail by infrastructure"),
        "{summary}"
    );
    // Its model calls are slower than the bound (lowered to 1 ms: any real vLLM call).
    if let Err(e) = fires(&prom, "FloeGatewayUpstreamSlow", &on_pool).await {
        let mut seen = String::new();
        for q in [
            "floe_gateway_upstream_latency_seconds_count[2m]",
            "up{endpoint=\"floe-control\"}[2m]",
        ] {
            seen.push_str(&format!("\n{q}: {:?}", prom.query(q).await?));
        }
        return Err(e.context(seen));
    }
    let status = finished(n, &client, &ns, "slow").await?;
    assert!(status.sessions.retried >= 1, "{status:?}");
    at_rest(&prom, &ns).await?;

    // A teacher that does not exist (no such Service): the gateway's calls fail upstream
    // within the job's 2 s call deadline. FloeGatewayUpstreamErrors names the pool, and the
    // job records the failure (its status counts upstream failures by kind). The failure comes
    // within a second of the claim: seen only because the pod's target keeps its labels
    // through the claim (the PodMonitor once copied the job label the claim adds, and then
    // missed it in two runs of three).
    let mut down = sft_job("down", &ns, 1, "/down", json!([fix_add_slowly()]));
    down["spec"]["sft"]["upstream"]["url"] = format!("http://nobody.{ns}.svc:8000").into();
    down["spec"]["timeouts"]["modelCallSeconds"] = 2.into();
    down["spec"]["backoffLimit"] = 0.into();
    apply(&client, &ns, down).await?;
    let jobs: Api<RolloutJob> = Api::namespaced(client.clone(), &ns);
    let failed = eventually_within(
        180,
        "the down job's upstream failure recorded",
        async || {
            let status = jobs.get("down").await?.status;
            Ok(status
                .and_then(|s| s.upstream_errors)
                .filter(|e| !e.failed.is_empty()))
        },
    )
    .await?;
    assert!(failed.failed.values().sum::<i64>() >= 1, "{failed:?}");
    let summary = fires(&prom, "FloeGatewayUpstreamErrors", &on_pool).await?;
    assert!(
        summary.contains(&format!("Gateways of pool {ns}/python:")),
        "{summary}"
    );

    // Every series the rules and the dashboard read exists, and every panel returns data for
    // this namespace, job and operator (the trainer's panels need a trainer: see above).
    let mut missing = Vec::new();
    for metric in referenced_metrics(&rules)?
        .into_iter()
        .filter(|m| !needs_a_trainer(m) && !needs_a_cluster_wide_install(m))
    {
        if prom.query(&format!("count({metric})")).await?.is_empty() {
            missing.push(metric);
        }
    }
    assert!(missing.is_empty(), "series no target exports: {missing:?}");
    let ours: Vec<(String, String)> = dashboard_queries()?
        .into_iter()
        .filter(|(_, expr)| !promql_metrics(expr).iter().any(|m| needs_a_trainer(m)))
        .collect();
    let vars = [
        ("namespace", ns.as_str()),
        ("rolloutjob", "slow|fast|down"),
        ("operator", "floe-metrics"),
    ];
    let empty = prom.panels_without_data(&ours, &vars).await?;
    assert!(
        empty.is_empty(),
        "dashboard panels with no data: {empty:#?}"
    );
    let errors = prom.rule_errors().await?;
    assert!(
        errors.is_empty(),
        "rules Prometheus cannot evaluate: {errors:?}"
    );

    // An upgrade that lost a permission: the operator may no longer write pools' status, so
    // every pool reconcile with a status to write fails (scaling the pool gives it one).
    // FloeReconcileErrors names the controller; with the permission back, it clears.
    let roles: Api<Role> = Api::namespaced(client.clone(), &ns);
    let granted = roles.get("floe").await?;
    let mut narrowed = granted.clone();
    for rule in narrowed.rules.iter_mut().flatten() {
        if let Some(resources) = rule.resources.as_mut() {
            resources.retain(|r| r != "gatewaypools/status");
        }
    }
    roles
        .replace("floe", &Default::default(), &narrowed)
        .await?;
    // Causes gone, alerts clear: no claims and no failures within their windows; the pool's
    // pods (and their unrestricted egress) gone.
    scale_pool(&client, &ns, 0).await?;
    let on_pools = [("controller", "gatewaypool"), ("severity", "warning")];
    let summary = fires(&prom, "FloeReconcileErrors", &on_pools).await?;
    assert!(
        summary.contains("floe gatewaypool controller:"),
        "{summary}"
    );
    let mut restored = roles.get("floe").await?;
    restored.rules = granted.rules;
    roles
        .replace("floe", &Default::default(), &restored)
        .await?;
    clears(&prom, "FloeReconcileErrors", &on_pools).await?;
    clears(&prom, "FloeSessionFailuresHigh", &on_slow).await?;
    clears(&prom, "FloeClaimsSlow", &[]).await?;
    clears(&prom, "FloeGatewayUpstreamSlow", &on_pool).await?;
    clears(&prom, "FloeGatewayUpstreamErrors", &on_pool).await?;
    clears(&prom, "FloeSandboxEgressUnrestricted", &on_pool).await?;
    // A deleted pool's and job's blockers go with them (pools have no finalizer: the
    // operator's sweep of deleted pools' series).
    Api::<GatewayPool>::namespaced(client.clone(), &ns)
        .delete("unpullable", &Default::default())
        .await?;
    Api::<RolloutJob>::namespaced(client.clone(), &ns)
        .delete("orphan", &Default::default())
        .await?;
    clears(&prom, "FloePoolBlocked", &on_unpullable).await?;
    clears(&prom, "FloeRolloutJobBlocked", &on_orphan).await?;

    // The operator's replicas scaled to none: FloeOperatorDown. Back while someone else holds
    // its Lease: FloeOperatorDown clears and FloeOperatorNoLeader fires; with that Lease gone,
    // the replica leads and it clears.
    let scale = |replicas: &str| {
        n.cluster.kubectl(
            &[
                "scale",
                "deployment",
                "-n",
                &sys,
                "--all",
                &format!("--replicas={replicas}"),
            ],
            None,
        )
    };
    scale("0")?;
    fires(&prom, "FloeOperatorDown", &[("severity", "critical")]).await?;
    assert!(prom.firing("FloeOperatorNoLeader", &[]).await?.is_empty());
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), &sys);
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        k8s_openapi::jiff::Timestamp::now(),
    );
    leases
        .patch(
            "floe-operator",
            &kube::api::PatchParams::apply("floe-test").force(),
            &kube::api::Patch::Apply(json!({
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": "floe-operator"},
                "spec": {"holderIdentity": "an-intruder", "leaseDurationSeconds": 3600,
                         "renewTime": now, "acquireTime": now}})),
        )
        .await?;
    scale("1")?;
    clears(&prom, "FloeOperatorDown", &[]).await?;
    fires(&prom, "FloeOperatorNoLeader", &[("severity", "critical")]).await?;
    leases.delete("floe-operator", &Default::default()).await?;
    clears(&prom, "FloeOperatorNoLeader", &[]).await?;
    eventually_within(60, "the replica to lead", async || {
        let led = prom.query(&format!("floe_leader{{{op}}} == 1")).await?;
        Ok((!led.is_empty()).then_some(()))
    })
    .await?;
    helm(n, &["uninstall", "floe", "--namespace", &sys])?;
    Ok(())
}
