//! The Helm chart with the real Helm v3.18, promtool and a Lua interpreter, against the
//! genuine test kube-apiserver: lint, every documented variant rendered and accepted by the
//! apiserver, the values schema rejecting bad values, every alert firing on a synthetic
//! incident (promtool unit tests), the Argo CD health checks, and a real `helm install` whose
//! operator (run here with the Deployment's own arguments, as the chart's ServiceAccount
//! through impersonation) completes a RolloutJob under the chart's RBAC. There is no kubelet:
//! `FakeKubelet` plays it, as in the operator tests.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use floe_crds::gateway_pool::GatewayPool;
use floe_crds::rollout_job::{RolloutJob, RolloutJobPhase};
use floe_tests::chart::{
    apiserver_rule, apiserver_rule_for, argocd_health, chart_dir, documents, exported_metrics,
    referenced_metrics, render, rules_file, run_tool, stdout_of, tool_ok, tools,
};
use floe_tests::kubelet::{FakeKubelet, Verdict};
use floe_tests::namespace::{with_crds, TestNamespace};
use floe_tests::operator::{eventually, eventually_within, pool_ready};
use floe_tests::{cluster, floe_bin, workspace_root, ScriptedUpstream, Step, TestGateway};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{json, Value};

/// Metrics the dashboard and alerts read that floe does not export: Prometheus's own `up` and
/// DCGM exporter's GPU utilization (used when DCGM runs in the cluster).
const EXTERNAL_METRICS: &[&str] = &["up", "DCGM_FI_DEV_GPU_UTIL"];

const CRDS: [&str; 2] = ["gatewaypools.floe.dev", "rolloutjobs.floe.dev"];

fn ci_values() -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(chart_dir().join("ci"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    anyhow::ensure!(files.len() >= 4, "charts/floe/ci/ lost its variants");
    Ok(files)
}

fn path_str(p: &Path) -> Result<&str> {
    p.to_str().context("path is not UTF-8")
}

#[test]
fn lint_passes_and_the_schema_rejects_bad_values() -> Result<()> {
    let chart = chart_dir();
    let chart = path_str(&chart)?;
    tool_ok("helm", &["lint", "--strict", chart])?;
    for values in ci_values()? {
        tool_ok(
            "helm",
            &["lint", "--strict", chart, "-f", path_str(&values)?],
        )?;
    }

    // The CRD rendering follows the cluster: CEL rules from 1.25 on, none before.
    let cel = |version: &str| -> Result<bool> {
        let out = render(&[
            "--kube-version",
            version,
            "--show-only",
            "templates/crds.yaml",
        ])?;
        let docs = documents(&out)?;
        anyhow::ensure!(docs.len() == 2, "two CRDs for {version}");
        for d in &docs {
            anyhow::ensure!(
                d["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep",
                "CRDs are kept on uninstall"
            );
        }
        Ok(out.contains("x-kubernetes-validations"))
    };
    assert!(cel("1.29.0")?, "1.29 gets the CEL rules");
    assert!(!cel("1.20.2")?, "1.20 must not get CEL rules");

    // Bad values fail at install time and say which value and why.
    let cases: &[(&[&str], &str)] = &[
        (&["--set", "operator.replicas=-1"], "operator.replicas"),
        (
            &["--set", "operator.sidecars=sometimes"],
            "operator.sidecars",
        ),
        (
            &["--set", "operator.kubeAPI.qpss=5"],
            "Additional property qpss is not allowed",
        ),
        (
            &["--set", "prometheusRule.rules.trainerGpuIdle.for=15"],
            "prometheusRule.rules.trainerGpuIdle.for",
        ),
        (
            &[
                "--set",
                "prometheusRule.rules.trainerGpuIdle.for=15 minutes",
            ],
            "Does not match pattern",
        ),
        (
            &["--set", "prometheusRule.rules.sessionFailures.ratio=2"],
            "prometheusRule.rules.sessionFailures.ratio",
        ),
        (
            &["--set", "operator.watchNamespace=Not_A_Namespace"],
            "operator.watchNamespace",
        ),
        (&["--set", "operator.log.format=xml"], "operator.log.format"),
        // Two operators acting at once: two claims for one session, pools over-filled.
        (
            &["--set", "operator.leaderElection.enabled=false"],
            "operator.leaderElection.enabled=false with operator.replicas > 1",
        ),
        // A tag of digits only is a number to `--set` (and to YAML): refused, not rendered as
        // `3.68351696377e+11`; `--set-string` (below) passes it.
        (&["--set", "image.tag=368351696377"], "image.tag"),
        (
            &["--set", "networkPolicy.operator.apiServer.cidrs={10.0.0.1}"],
            "networkPolicy.operator.apiServer.cidrs",
        ),
        (
            &["--set", "networkPolicy.sandbox.enabled=true"],
            "networkPolicy.sandbox.enabled needs networkPolicy.sandbox.namespaces",
        ),
        (
            &[
                "--kube-version",
                "1.20.2",
                "--set",
                "networkPolicy.sandbox.enabled=true",
                "--set",
                "networkPolicy.sandbox.namespaces={rl}",
            ],
            "before Kubernetes 1.21 namespaces carry no kubernetes.io/metadata.name label",
        ),
    ];
    for (args, message) in cases {
        let mut all = vec!["template", "floe", chart];
        all.extend_from_slice(args);
        let out = run_tool("helm", &all, None)?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(
            stderr.contains(message),
            "{args:?}: the error does not say {message:?}:\n{stderr}"
        );
    }
    // One replica without leader election: never two at once, a rolling update included.
    let alone = render(&[
        "--set",
        "operator.leaderElection.enabled=false",
        "--set",
        "operator.replicas=1",
    ])?;
    assert!(alone.contains("type: Recreate"), "{alone}");
    assert!(!render(&[])?.contains("type: Recreate"));
    let digits = render(&["--set-string", "image.tag=368351696377"])?;
    assert!(
        digits.contains("image: ghcr.io/floe-dev/floe:368351696377\n"),
        "{digits}"
    );
    Ok(())
}

#[test]
fn alerts_fire_on_synthetic_incidents_and_stay_silent_otherwise() -> Result<()> {
    let rendered = render(&[
        "--namespace",
        "floe-system",
        "--set",
        "prometheusRule.enabled=true",
    ])?;
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("rules.yaml"), rules_file(&rendered)?)?;
    let test = dir.path().join("alerts_test.yaml");
    std::fs::copy(workspace_root().join("tests/chart/alerts_test.yaml"), &test)?;
    let check = tool_ok(
        "promtool",
        &["check", "rules", path_str(&dir.path().join("rules.yaml"))?],
    )?;
    assert!(check.contains("SUCCESS: 22 rules found"), "{check}");
    let out = tool_ok("promtool", &["test", "rules", path_str(&test)?])?;
    assert!(out.contains("SUCCESS"), "{out}");

    // Every alert of the rule file has a test that expects it to fire.
    let tests = std::fs::read_to_string(&test)?;
    let rules: Value = serde_yaml::from_str(&rules_file(&rendered)?)?;
    for group in rules["groups"].as_array().context("groups")? {
        for rule in group["rules"].as_array().context("rules")? {
            let name = rule["alert"].as_str().context("alert name")?;
            assert!(
                tests.contains(&format!(
                    "alertname: {name}\n        exp_alerts:\n          - "
                )),
                "alert {name} is never shown to fire in tests/chart/alerts_test.yaml"
            );
        }
    }
    Ok(())
}

fn condition(type_: &str, status: &str, reason: &str, message: &str) -> Value {
    json!({"type": type_, "status": status, "reason": reason, "message": message,
           "lastTransitionTime": "2026-11-22T10:00:00Z"})
}

#[test]
fn argocd_health_checks_read_the_operators_conditions() -> Result<()> {
    let job_script = workspace_root().join("docs/argocd/rolloutjob-health.lua");
    let pool_script = workspace_root().join("docs/argocd/gatewaypool-health.lua");
    let job = |generation: i64, status: Value| {
        json!({"apiVersion": "floe.dev/v1alpha1", "kind": "RolloutJob",
               "metadata": {"name": "j", "generation": generation}, "spec": {}, "status": status})
    };
    // Observed by the operator (observedGeneration = generation) with these conditions.
    let settled = |generation: i64, conditions: &[(&str, &str, &str, &str)]| {
        let conditions: Vec<Value> = conditions
            .iter()
            .map(|(t, s, r, m)| condition(t, s, r, m))
            .collect();
        job(
            generation,
            json!({"observedGeneration": generation, "conditions": conditions}),
        )
    };
    let running = json!({"observedGeneration": 1, "progress": "3/8", "conditions": [
        condition("Progressing", "True", "SessionsRunning", "2 running, 3 pending"),
        condition("Reconciling", "True", "SessionsRunning", "2 running, 3 pending"),
        condition("Ready", "False", "SessionsRunning", "2 running, 3 pending; 3 of 8 sessions scored")]});
    let cases = [
        (job(1, Value::Null), "Progressing"),
        (job(2, running.clone()), "Progressing"),
        (job(1, running), "Progressing"),
        (
            settled(
                1,
                &[
                    (
                        "Complete",
                        "True",
                        "SessionsFinished",
                        "8 of 8 sessions scored",
                    ),
                    (
                        "Ready",
                        "True",
                        "SessionsFinished",
                        "8 of 8 sessions scored",
                    ),
                ],
            ),
            "Healthy",
        ),
        (
            settled(
                1,
                &[
                    (
                        "Failed",
                        "True",
                        "DeadlineExceeded",
                        "activeDeadlineSeconds passed",
                    ),
                    (
                        "Ready",
                        "False",
                        "DeadlineExceeded",
                        "activeDeadlineSeconds passed",
                    ),
                    (
                        "Stalled",
                        "True",
                        "DeadlineExceeded",
                        "activeDeadlineSeconds passed",
                    ),
                ],
            ),
            "Degraded",
        ),
        (
            settled(
                3,
                &[
                    (
                        "Ready",
                        "False",
                        "PoolNotFound",
                        "GatewayPool \"warm\" does not exist",
                    ),
                    (
                        "Stalled",
                        "True",
                        "PoolNotFound",
                        "GatewayPool \"warm\" does not exist",
                    ),
                ],
            ),
            "Degraded",
        ),
        (
            settled(
                1,
                &[
                    (
                        "Suspended",
                        "True",
                        "JobSuspended",
                        "suspended with 2 sessions still running",
                    ),
                    ("Ready", "False", "JobSuspended", "suspended"),
                ],
            ),
            "Suspended",
        ),
    ];
    for (object, expected) in &cases {
        let (status, message) = argocd_health(&job_script, object)?;
        assert_eq!(status, *expected, "{object}");
        assert!(!message.is_empty(), "a message for {object}");
    }
    let (_, message) = argocd_health(&job_script, &cases[5].0)?;
    assert!(message.starts_with("PoolNotFound: "), "{message}");

    let pool = |generation: i64, status: Value| {
        json!({"apiVersion": "floe.dev/v1alpha1", "kind": "GatewayPool",
               "metadata": {"name": "p", "generation": generation}, "spec": {"replicas": 4},
               "status": status})
    };
    let pool_cases = [
        (pool(1, Value::Null), "Progressing"),
        (
            pool(
                1,
                json!({"observedGeneration": 1, "readyReplicas": 1, "conditions": [
                condition("Ready", "False", "Warming", "1/4 pods READY")]}),
            ),
            "Progressing",
        ),
        (
            pool(
                2,
                json!({"observedGeneration": 1, "readyReplicas": 4, "conditions": [
                condition("Ready", "True", "PoolReady", "4/4 pods READY")]}),
            ),
            "Progressing",
        ),
        (
            pool(
                2,
                json!({"observedGeneration": 2, "readyReplicas": 4, "conditions": [
                condition("Ready", "True", "PoolReady", "4/4 pods READY")]}),
            ),
            "Healthy",
        ),
        (
            pool(
                1,
                json!({"observedGeneration": 1, "conditions": [
                condition("Stalled", "True", "TemplateInvalid", "bad image")]}),
            ),
            "Degraded",
        ),
    ];
    for (object, expected) in &pool_cases {
        assert_eq!(
            argocd_health(&pool_script, object)?.0,
            *expected,
            "{object}"
        );
    }
    Ok(())
}

async fn ensure_namespace(client: &Client, name: &str) -> Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The Prometheus Operator's kinds (open-schema stand-ins; see the file).
async fn install_monitoring_crds() -> Result<()> {
    let out = cluster().kubectl(
        &[
            "apply",
            "-f",
            path_str(&workspace_root().join("tests/chart/monitoring-crds.yaml"))?,
        ],
        None,
    )?;
    anyhow::ensure!(
        out.status.success(),
        "monitoring CRDs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let client = cluster().client().await?;
    let api: Api<CustomResourceDefinition> = Api::all(client);
    eventually("monitoring CRDs established", async || {
        for name in [
            "servicemonitors.monitoring.coreos.com",
            "podmonitors.monitoring.coreos.com",
            "prometheusrules.monitoring.coreos.com",
        ] {
            let crd = api.get(name).await?;
            let established = crd.status.and_then(|s| s.conditions).is_some_and(|cs| {
                cs.iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            });
            if !established {
                return Ok(None);
            }
        }
        Ok(Some(()))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_variant_is_accepted_by_the_apiserver() -> Result<()> {
    let (client, ns) = with_crds("chart-variants").await?;
    install_monitoring_crds().await?;
    for name in ["floe-chart-watched", "floe-chart-sandbox"] {
        ensure_namespace(&client, name).await?;
    }
    let mut variants: Vec<Vec<String>> = vec![vec![]];
    for values in ci_values()? {
        variants.push(vec!["-f".into(), path_str(&values)?.to_string()]);
    }
    for variant in &variants {
        let mut args = vec!["--kube-version", "1.20.2", "--namespace", &ns.name];
        args.extend(variant.iter().map(String::as_str));
        let rendered = render(&args)?;
        let kinds: BTreeSet<String> = documents(&rendered)?
            .iter()
            .map(|d| d["kind"].as_str().unwrap_or_default().to_string())
            .collect();
        let out = cluster().kubectl(
            &["apply", "--dry-run=server", "-f", "-"],
            Some(rendered.as_bytes()),
        )?;
        assert!(
            out.status.success(),
            "variant {variant:?} ({kinds:?}) refused by the apiserver:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// The Helm-less path's RBAC, checked in for `kubectl apply -f`: the chart's own ServiceAccount
/// and rules for release `floe` in `floe-system`, so it never drifts from what the chart's
/// tests prove the operator needs.
const HELMLESS_RBAC: &str = "deploy/operator-rbac.yaml";

fn helmless_rbac() -> Result<String> {
    let rendered = render(&[
        "--namespace",
        "floe-system",
        "--show-only",
        "templates/serviceaccount.yaml",
        "--show-only",
        "templates/rbac.yaml",
    ])?;
    Ok(format!(
        "# Generated from charts/floe (templates/serviceaccount.yaml, templates/rbac.yaml) for the\n\
         # operator without Helm: kubectl create namespace floe-system; kubectl apply -f {HELMLESS_RBAC};\n\
         # then run `floe operator` as system:serviceaccount:floe-system:floe (docs/operator.md#permissions).\n\
         # Regenerate: FLOE_BLESS=1 cargo test -p floe-tests --test chart helmless_rbac\n{rendered}"
    ))
}

#[test]
fn the_helmless_rbac_manifest_is_the_charts() -> Result<()> {
    let expected = helmless_rbac()?;
    let path = workspace_root().join(HELMLESS_RBAC);
    if std::env::var_os("FLOE_BLESS").is_some() {
        std::fs::write(&path, &expected)?;
    }
    let actual = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        actual == expected,
        "{HELMLESS_RBAC} drifted from the chart: run `FLOE_BLESS=1 cargo test -p floe-tests --test chart helmless_rbac` and commit it"
    );
    Ok(())
}

/// The checked-in manifest, applied as its header says, grants what the operator does: the
/// verbs a hand-written list once missed among them (NetworkPolicies, secrets delete, pods
/// list/watch, events patch, finalizers), and nothing it does not need.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_helmless_rbac_manifest_applies_and_grants_the_operators_verbs() -> Result<()> {
    let (client, ns) = with_crds("helmless-rbac").await?;
    ensure_namespace(&client, "floe-system").await?;
    let manifest = std::fs::read(workspace_root().join(HELMLESS_RBAC))?;
    let out = cluster().kubectl(&["apply", "-f", "-"], Some(&manifest))?;
    assert!(
        out.status.success(),
        "kubectl apply -f {HELMLESS_RBAC}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let user = "system:serviceaccount:floe-system:floe";
    let in_ns = format!("--namespace={}", ns.name);
    let lease_ns = "--namespace=floe-system";
    for (args, allowed) in [
        (
            vec!["create", "networkpolicies.networking.k8s.io", &in_ns],
            true,
        ),
        (
            vec!["delete", "networkpolicies.networking.k8s.io", &in_ns],
            true,
        ),
        (vec!["delete", "secrets", &in_ns], true),
        (vec!["delete", "services", &in_ns], true),
        (vec!["list", "pods", &in_ns], true),
        (vec!["watch", "pods", &in_ns], true),
        (vec!["patch", "events.events.k8s.io", &in_ns], true),
        (
            vec![
                "update",
                "rolloutjobs.floe.dev",
                "--subresource=finalizers",
                &in_ns,
            ],
            true,
        ),
        (
            vec![
                "update",
                "gatewaypools.floe.dev",
                "--subresource=finalizers",
                &in_ns,
            ],
            true,
        ),
        (
            vec![
                "patch",
                "rolloutjobs.floe.dev",
                "--subresource=status",
                &in_ns,
            ],
            true,
        ),
        (vec!["create", "leases.coordination.k8s.io", lease_ns], true),
        (
            vec![
                "get",
                "customresourcedefinitions.apiextensions.k8s.io/rolloutjobs.floe.dev",
            ],
            true,
        ),
        (
            vec![
                "get",
                "customresourcedefinitions.apiextensions.k8s.io/gatewaypools.floe.dev",
            ],
            true,
        ),
        (
            vec![
                "get",
                "customresourcedefinitions.apiextensions.k8s.io/pods.example.com",
            ],
            false,
        ),
        // ttlSecondsAfterFinished: the finished job is deleted; a pool is the user's.
        (vec!["delete", "rolloutjobs.floe.dev", &in_ns], true),
        (vec!["delete", "gatewaypools.floe.dev", &in_ns], false),
        (vec!["list", "secrets", &in_ns], false),
        (vec!["create", "deployments.apps", &in_ns], false),
    ] {
        assert_eq!(can_i(user, &args)?, allowed, "can-i {args:?}");
    }
    Ok(())
}

/// A kubeconfig that acts as `user` (impersonation by the test cluster's admin).
fn impersonating(user: &str, dir: &Path) -> Result<PathBuf> {
    let text = std::fs::read_to_string(&cluster().kubeconfig)?;
    let mut config: serde_yaml::Value = serde_yaml::from_str(&text)?;
    let users = config["users"]
        .as_sequence_mut()
        .context("kubeconfig users")?;
    for u in users {
        u["user"]["as"] = serde_yaml::Value::String(user.to_string());
    }
    let path = dir.join("impersonating.kubeconfig");
    std::fs::write(&path, serde_yaml::to_string(&config)?)?;
    Ok(path)
}

/// `kubectl auth can-i` as `user`.
fn can_i(user: &str, args: &[&str]) -> Result<bool> {
    let mut all = vec!["auth", "can-i", "--as", user];
    all.extend_from_slice(args);
    let out = cluster().kubectl(&all, None)?;
    Ok(String::from_utf8_lossy(&out.stdout).trim() == "yes")
}

/// Helm against the test cluster.
fn helm(args: &[&str]) -> Result<String> {
    let out = std::process::Command::new(tools().join("helm"))
        .args(args)
        .env("KUBECONFIG", &cluster().kubeconfig)
        .output()?;
    stdout_of("helm", args, out)
}

/// The objects a release installed, as its manifest lists them.
fn release_objects(release: &str, namespace: &str) -> Result<Vec<Value>> {
    documents(&helm(&[
        "get",
        "manifest",
        release,
        "--namespace",
        namespace,
    ])?)
}

/// The CRDs already exist (other tests applied them with `floe crds`): hand them to the
/// release, as docs/operations.md tells users who installed the CRDs first.
fn adopt_crds(release: &str, namespace: &str) -> Result<()> {
    for crd in CRDS {
        for args in [
            vec![
                "annotate".to_string(),
                "--overwrite".into(),
                "crd".into(),
                crd.into(),
                format!("meta.helm.sh/release-name={release}"),
                format!("meta.helm.sh/release-namespace={namespace}"),
            ],
            vec![
                "label".into(),
                "--overwrite".into(),
                "crd".into(),
                crd.into(),
                "app.kubernetes.io/managed-by=Helm".into(),
            ],
        ] {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let out = cluster().kubectl(&args, None)?;
            anyhow::ensure!(
                out.status.success(),
                "{args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    Ok(())
}

/// The operator as the chart's Deployment runs it: its container's args, with the metrics
/// address moved to a free local port, under a kubeconfig that impersonates the chart's
/// ServiceAccount.
struct ChartOperator {
    child: std::process::Child,
    metrics: String,
}

impl Drop for ChartOperator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl ChartOperator {
    fn start(deployment: &Value, kubeconfig: &Path, log: &Path) -> Result<Self> {
        let container = &deployment["spec"]["template"]["spec"]["containers"][0];
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut args: Vec<String> = Vec::new();
        for a in container["args"].as_array().context("args")? {
            let a = a.as_str().context("arg")?;
            if a.starts_with("--metrics-listen=") {
                args.push(format!("--metrics-listen=127.0.0.1:{port}"));
            } else {
                args.push(a.to_string());
            }
        }
        args.push(format!("--kubeconfig={}", kubeconfig.display()));
        let mut cmd = std::process::Command::new(floe_bin()?);
        cmd.args(&args)
            .env("POD_NAME", "floe-operator-test-0")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(log)?);
        for env in container["env"].as_array().context("env")? {
            if let (Some(name), Some(value)) = (env["name"].as_str(), env["value"].as_str()) {
                cmd.env(name, value);
            }
        }
        Ok(Self {
            child: cmd.spawn()?,
            metrics: format!("http://127.0.0.1:{port}/metrics"),
        })
    }
}

fn find<'a>(docs: &'a [Value], kind: &str) -> Result<&'a Value> {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .with_context(|| format!("no {kind} rendered"))
}

/// `/metrics` of a trainer ingest server (the trainer's own registry), started with the
/// trainer package and the Python the real-vLLM tests use.
/// A job's series as the one piece of code the operator and `floe run` both publish them with
/// (`JobSeries`), each set once: a train job's held-out gauge appears only after its first
/// round, which the sft job above never has.
fn job_series_page() -> Result<String> {
    use prometheus::Encoder;
    let series = floe_operator::job_series::JobSeries::new()?;
    let registry = prometheus::Registry::new();
    for c in series.collectors() {
        registry.register(c)?;
    }
    series.set_held_out("ns", "j", 2, Some(0.5), Some(0.5));
    let mut out = Vec::new();
    prometheus::TextEncoder::new().encode(&registry.gather(), &mut out)?;
    Ok(String::from_utf8(out)?)
}

fn trainer_metrics_page() -> Result<String> {
    let python = std::env::var("FLOE_TEST_PYTHON").context(
        "FLOE_TEST_PYTHON (a Python with the trainer's dependencies; scripts/test.sh sets it)",
    )?;
    let script = r#"
import sys, tempfile, threading, urllib.request
from pathlib import Path
from floe_trainer.ingest import Ingest, Store, make_server
from floe_trainer.metrics import Metrics
m = Metrics()
ingest = Ingest(Store(Path(tempfile.mkdtemp())), lambda t: None)
srv = make_server(ingest, ("127.0.0.1", 0), lambda: {}, m.render)
threading.Thread(target=srv.serve_forever, daemon=True).start()
url = f"http://127.0.0.1:{srv.server_address[1]}/metrics"
sys.stdout.write(urllib.request.urlopen(url).read().decode())
srv.shutdown()
"#;
    let out = std::process::Command::new(python)
        .args(["-c", script])
        .env("PYTHONPATH", workspace_root().join("trainer"))
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "trainer metrics: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

/// `/metrics` of a gateway that served a model call and refused one (the pool pods' gateways
/// above have served nothing: their per-API series are there, but only at 0).
async fn gateway_with_traffic_page() -> Result<String> {
    let upstream = ScriptedUpstream::start(vec![Step::Say("done".into())]).await?;
    let gw = TestGateway::start(&upstream.url, 16).await?;
    let token = gw.session("chart-metrics-1", "t", 0).await?;
    let http = reqwest::Client::new();
    let body = json!({"model": "policy", "max_tokens": 16,
                      "messages": [{"role": "user", "content": "hi"}]});
    for (key, expected) in [(token.as_str(), 200), ("floe-nope", 401)] {
        let status = http
            .post(format!("{}/v1/messages", gw.url))
            .header("x-api-key", key)
            .json(&body)
            .send()
            .await?
            .status();
        assert_eq!(status.as_u16(), expected);
    }
    Ok(reqwest::get(format!("{}/metrics", gw.url))
        .await?
        .text()
        .await?)
}

/// The two install tests run operators; a cluster-wide one would also act on the other's
/// namespaces, so they take turns.
static OPERATOR_TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_install_runs_the_operator_under_the_charts_rbac() -> Result<()> {
    let _turn = OPERATOR_TURN.lock().await;
    let (client, system) = with_crds("chart-sys").await?;
    let work = TestNamespace::create(cluster(), &client, "chart-work").await?;
    install_monitoring_crds().await?;
    let release = format!("floe-{}", system.name.trim_start_matches("floe-test-"));
    let release = &release[..release.len().min(40)];
    adopt_crds(release, &system.name)?;
    let chart = chart_dir();
    let monitoring = chart.join("ci/monitoring-values.yaml");
    let install_args = [
        "--namespace",
        &system.name,
        "-f",
        path_str(&monitoring)?,
        "--set",
        "networkPolicy.operator.enabled=true",
        "--set",
        "networkPolicy.sandbox.enabled=true",
        "--set-json",
        &format!("networkPolicy.sandbox.namespaces=[\"{}\"]", work.name),
        // This apiserver is 1.20: namespaces have no kubernetes.io/metadata.name label.
        "--set-json",
        r#"networkPolicy.sandbox.operatorNamespaceSelector={"matchLabels":{"floe.dev/operator":"true"}}"#,
    ];
    let mut args = vec!["install", release, path_str(&chart)?];
    args.extend_from_slice(&install_args);
    helm(&args)?;
    let manifest = helm(&["get", "manifest", release, "--namespace", &system.name])?;
    let docs = documents(&manifest)?;
    let kinds: BTreeSet<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
    for kind in [
        "CustomResourceDefinition",
        "Deployment",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Service",
        "ServiceMonitor",
        "PodMonitor",
        "PrometheusRule",
        "ConfigMap",
        "NetworkPolicy",
    ] {
        assert!(kinds.contains(kind), "{kind} not installed: {kinds:?}");
    }
    // The operator's NetworkPolicy names the apiserver as NetworkPolicy sees it (after
    // kube-proxy's DNAT): the addresses and ports of default/kubernetes, read at install.
    // This apiserver advertises a loopback address, which an Endpoints object may not hold,
    // so it has none: the policy falls back to any address on the values' ports (the real
    // node's test sees the addresses read).
    let endpoints =
        Api::<k8s_openapi::api::core::v1::Endpoints>::namespaced(client.clone(), "default")
            .get_opt("kubernetes")
            .await?;
    let (want_cidrs, want_ports) = apiserver_rule_for(endpoints.as_ref());
    let operator_policy = docs
        .iter()
        .find(|d| {
            d["kind"] == "NetworkPolicy"
                && d["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.ends_with("-operator"))
        })
        .context("the operator's NetworkPolicy")?;
    assert_eq!(
        apiserver_rule(operator_policy),
        (want_cidrs, want_ports),
        "{operator_policy}"
    );
    // Sandbox pods: DNS only to the cluster's DNS pods, and no trainer or collector (each
    // job's own policy adds its own; one rule here would open every job's to every agent).
    let sandbox_policy = docs
        .iter()
        .find(|d| {
            d["kind"] == "NetworkPolicy"
                && d["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.ends_with("-sandbox"))
        })
        .context("the sandbox pods' NetworkPolicy")?;
    assert_eq!(
        sandbox_policy["spec"]["egress"],
        json!([{"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                        "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
                "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}]),
        "{sandbox_policy}"
    );
    // Its own calls on port 8100: a trainer's status and finish (own_pod.rs), a task loader's
    // tasks, an sft collector's finish (job_end.rs). The collector's was once left out; so was
    // the fidelity check's call to a trainer's policy server (8000), which held every train job
    // at FidelityCheckPending where the CNI enforces policies.
    for (role, port) in [
        ("trainer", 8100),
        ("tasks", 8100),
        ("dataset", 8100),
        ("trainer", 8000),
    ] {
        let allowed = operator_policy["spec"]["egress"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|rule| {
                let port = rule["ports"]
                    .as_array()
                    .is_some_and(|ps| ps.iter().any(|p| p["port"] == port));
                let to_role = rule["to"].as_array().is_some_and(|to| {
                    to.iter().any(|peer| {
                        let selector = &peer["podSelector"];
                        selector["matchLabels"]["floe.dev/job-role"] == role
                            || selector["matchExpressions"].as_array().is_some_and(|es| {
                                es.iter().any(|e| {
                                    e["key"] == "floe.dev/job-role"
                                        && e["values"]
                                            .as_array()
                                            .is_some_and(|v| v.iter().any(|v| v == role))
                                })
                            })
                    })
                });
                port && to_role
            });
        assert!(
            allowed,
            "the operator cannot reach a {role} pod on {port}: {operator_policy}"
        );
    }
    let deployment = find(&docs, "Deployment")?.clone();
    let sa = find(&docs, "ServiceAccount")?["metadata"]["name"]
        .as_str()
        .context("sa name")?
        .to_string();
    let user = format!("system:serviceaccount:{}:{sa}", system.name);

    // Least privilege: what the operator needs, not spec writes, not other kinds.
    let ns_flag = format!("--namespace={}", work.name);
    for (args, allowed) in [
        (vec!["create", "pods", ns_flag.as_str()], true),
        (vec!["create", "secrets", ns_flag.as_str()], true),
        (
            vec![
                "patch",
                "rolloutjobs.floe.dev",
                "--subresource=status",
                ns_flag.as_str(),
            ],
            true,
        ),
        (
            vec!["patch", "rolloutjobs.floe.dev", ns_flag.as_str()],
            true,
        ),
        (
            vec!["update", "gatewaypools.floe.dev", ns_flag.as_str()],
            false,
        ),
        (
            vec!["delete", "rolloutjobs.floe.dev", ns_flag.as_str()],
            true,
        ),
        (
            vec!["delete", "gatewaypools.floe.dev", ns_flag.as_str()],
            false,
        ),
        (vec!["list", "secrets", ns_flag.as_str()], false),
        (vec!["create", "deployments.apps", ns_flag.as_str()], false),
        (
            vec!["create", "leases.coordination.k8s.io", ns_flag.as_str()],
            false,
        ),
    ] {
        assert_eq!(can_i(&user, &args)?, allowed, "can-i {args:?}");
    }

    // The operator, as the Deployment runs it, as the ServiceAccount.
    let dir = tempfile::tempdir()?;
    let kubeconfig = impersonating(&user, dir.path())?;
    let log = std::env::temp_dir().join(format!("floe-chart-operator-{}.log", system.name));
    let operator = ChartOperator::start(&deployment, &kubeconfig, &log)?;
    let pools: Api<GatewayPool> = Api::namespaced(client.clone(), &work.name);
    pools
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "floe.dev/v1alpha1", "kind": "GatewayPool",
                "metadata": {"name": "warm"},
                "spec": {"replicas": 3, "template": {"image": "ghcr.io/acme/sandbox-pi:1"},
                         "refill": {"batchSize": 8, "maxPodsPerMinute": 600}},
            }))?,
        )
        .await?;
    let kubelet = FakeKubelet::start(
        client.clone(),
        &work.name,
        41,
        Arc::new(|a: &Value| Verdict::Scored {
            exit: 0,
            reward: if a["sample"].as_u64() == Some(0) {
                1.0
            } else {
                0.0
            },
        }),
    )?;
    let pool_script = workspace_root().join("docs/argocd/gatewaypool-health.lua");
    let job_script = workspace_root().join("docs/argocd/rolloutjob-health.lua");
    eventually_within(90, "the pool READY (Argo CD: Healthy)", async || {
        let pool = serde_json::to_value(pools.get("warm").await?)?;
        Ok((argocd_health(&pool_script, &pool)?.0 == "Healthy").then_some(()))
    })
    .await
    .with_context(|| format!("operator log: {}", log.display()))?;

    let jobs: Api<RolloutJob> = Api::namespaced(client.clone(), &work.name);
    let tasks: Vec<Value> = (0..3)
        .map(|t| json!({"id": format!("t{t}"), "instruction": "solve"}))
        .collect();
    jobs.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "apiVersion": "floe.dev/v1alpha1", "kind": "RolloutJob",
            "metadata": {"name": "chart"},
            "spec": {"tasks": {"inline": tasks}, "numSamples": 2, "harness": {"preset": "pi"},
                     "poolRef": {"name": "warm"},
                     "evaluator": {"command": ["python", "-m", "pytest", "-q"]},
                     "sft": {"upstream": {"url": "http://teacher.models.svc:8000", "model": "teacher"},
                             "output": {"claimName": "sft-data"}}},
        }))?,
    )
    .await?;
    let done = eventually_within(120, "the job finished", async || {
        let job = jobs.get("chart").await?;
        let finished =
            job.status.as_ref().and_then(|s| s.phase) == Some(RolloutJobPhase::Succeeded);
        let object = serde_json::to_value(&job)?;
        let (health, message) = argocd_health(&job_script, &object)?;
        if finished {
            return Ok(Some((object, health, message)));
        }
        // Before it finishes, Argo CD sees it progressing.
        anyhow::ensure!(health == "Progressing", "{health}: {message}");
        Ok(None)
    })
    .await
    .with_context(|| format!("operator log: {}", log.display()))?;
    assert_eq!(done.1, "Healthy", "{}", done.2);
    // kstatus (Flux): Current = observed generation, Ready True, not Reconciling or Stalled.
    let status = &done.0["status"];
    assert_eq!(
        status["observedGeneration"],
        done.0["metadata"]["generation"]
    );
    let cond = |t: &str| {
        status["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == t))
            .map(|c| c["status"].as_str().unwrap_or_default().to_string())
    };
    assert_eq!(cond("Ready").as_deref(), Some("True"));
    assert_ne!(cond("Reconciling").as_deref(), Some("True"));
    assert_ne!(cond("Stalled").as_deref(), Some("True"));
    assert_eq!(status["sessions"]["succeeded"], 6);

    // Blocked objects, whose series exist only while they are blocked: a pool whose pods the
    // apiserver refuses (no such RuntimeClass) and a job whose pool does not exist.
    pools
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "floe.dev/v1alpha1", "kind": "GatewayPool",
                "metadata": {"name": "refused"},
                "spec": {"replicas": 1, "template": {"image": "sandbox:1", "runtimeClassName": "gvisor"}},
            }))?,
        )
        .await?;
    jobs.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "apiVersion": "floe.dev/v1alpha1", "kind": "RolloutJob",
            "metadata": {"name": "orphan"},
            "spec": {"tasks": {"inline": [{"id": "t", "instruction": "x"}]}, "numSamples": 1,
                     "harness": {"preset": "pi"},
                     "poolRef": {"name": "no-such-pool"},
                     "evaluator": {"command": ["true"]},
                     "sft": {"upstream": {"url": "http://teacher.models.svc:8000", "model": "teacher"},
                             "output": {"claimName": "sft-data"}}},
        }))?,
    )
    .await?;
    let blocked_page = eventually_within(60, "both blockers on the metrics page", async || {
        let page = reqwest::get(&operator.metrics).await?.text().await?;
        let pool = format!(
            "floe_pool_blocked{{namespace=\"{}\",pool=\"refused\",reason=\"PodCreateRejected\"}} 1",
            work.name
        );
        let job = format!(
            "floe_rolloutjob_blocked{{namespace=\"{}\",reason=\"PoolNotFound\",rolloutjob=\"orphan\"}} 1",
            work.name
        );
        Ok((page.contains(&pool) && page.contains(&job)).then_some(page))
    })
    .await
    .with_context(|| format!("operator log: {}", log.display()))?;
    // The chart's rules let it read the served CRDs, which lack nothing it knows.
    for crd in CRDS {
        let series = format!("floe_crd_missing_fields{{crd=\"{crd}\"}} 0");
        assert!(blocked_page.contains(&series), "{series}: {blocked_page}");
    }

    // Every metric the dashboard and the alerts read is exported by the code: the operator
    // that just ran the job, a pool pod's real gateway, and the trainer's registry.
    let mut exported = exported_metrics(&blocked_page);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &work.name);
    let gateway_page = eventually("a READY pool pod's gateway metrics", async || {
        let ready = pods
            .list(&ListParams::default().labels("floe.dev/pool=warm,floe.dev/state=ready"))
            .await?;
        for pod in ready.items {
            let Some(ip) = pod.status.and_then(|s| s.pod_ip) else {
                continue;
            };
            if let Ok(r) = reqwest::get(format!("http://{ip}:8371/metrics")).await {
                return Ok(Some(r.text().await?));
            }
        }
        Ok(None)
    })
    .await?;
    exported.extend(exported_metrics(&gateway_page));
    exported.extend(exported_metrics(&gateway_with_traffic_page().await?));
    exported.extend(exported_metrics(&trainer_metrics_page()?));
    exported.extend(exported_metrics(&job_series_page()?));
    let rules = rules_file(&manifest)?;
    let missing: Vec<String> = referenced_metrics(&rules)?
        .into_iter()
        .filter(|m| !exported.contains(m) && !EXTERNAL_METRICS.contains(&m.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "the dashboard or alerts read metrics nothing exports: {missing:?}"
    );

    // Upgrade: a changed value reaches the Deployment; CRDs stay.
    let mut args = vec!["upgrade", release, path_str(&chart)?];
    args.extend_from_slice(&install_args);
    args.extend_from_slice(&["--set", "operator.concurrency=9"]);
    helm(&args)?;
    let upgraded = release_objects(release, &system.name)?;
    let upgraded_args = find(&upgraded, "Deployment")?["spec"]["template"]["spec"]["containers"][0]
        ["args"]
        .to_string();
    assert!(upgraded_args.contains("--concurrency=9"), "{upgraded_args}");

    // The finished job's TTL, set now, deletes it: the operator's own DELETE under the chart's
    // RBAC, which once forbade it (the TTL then failed every 2 s for ever). Then uninstall:
    // the CRDs (and so every pool and job) survive it.
    jobs.patch(
        "chart",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"ttlSecondsAfterFinished": 0}})),
    )
    .await?;
    eventually("the job deleted at its TTL", async || {
        Ok(jobs.get_opt("chart").await?.is_none().then_some(()))
    })
    .await?;
    pools.delete("warm", &DeleteParams::default()).await?;
    kubelet.stop().await?;
    drop(operator);
    helm(&["uninstall", release, "--namespace", &system.name])?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for name in CRDS {
        assert!(crds.get_opt(name).await?.is_some(), "{name} was deleted");
    }
    let roles: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(client.clone());
    assert!(
        roles.get_opt(release).await?.is_none(),
        "ClusterRole left behind"
    );
    drop(work);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_namespace_install_is_confined_to_its_namespace() -> Result<()> {
    let _turn = OPERATOR_TURN.lock().await;
    let (client, system) = with_crds("chart-ns-sys").await?;
    let watched = TestNamespace::create(cluster(), &client, "chart-ns-work").await?;
    let elsewhere = TestNamespace::create(cluster(), &client, "chart-ns-else").await?;
    let release = format!("floe-{}", system.name.trim_start_matches("floe-test-"));
    let release = &release[..release.len().min(40)];
    let chart = chart_dir();
    let values = chart.join("ci/namespaced-values.yaml");
    helm(&[
        "install",
        release,
        path_str(&chart)?,
        "--namespace",
        &system.name,
        "-f",
        path_str(&values)?,
        "--set",
        &format!("operator.watchNamespace={}", watched.name),
    ])?;
    let docs = release_objects(release, &system.name)?;
    assert!(
        !docs
            .iter()
            .any(|d| d["kind"] == "ClusterRole" || d["kind"] == "CustomResourceDefinition"),
        "a single-namespace install without CRDs has no cluster-scoped objects"
    );
    let sa = find(&docs, "ServiceAccount")?["metadata"]["name"]
        .as_str()
        .context("sa")?
        .to_string();
    let user = format!("system:serviceaccount:{}:{sa}", system.name);
    assert!(can_i(&user, &["create", "pods", "-n", &watched.name])?);
    assert!(!can_i(&user, &["create", "pods", "-n", &elsewhere.name])?);
    assert!(!can_i(&user, &["list", "pods", "--all-namespaces"])?);

    let dir = tempfile::tempdir()?;
    let kubeconfig = impersonating(&user, dir.path())?;
    let log = std::env::temp_dir().join(format!("floe-chart-operator-{}.log", system.name));
    let deployment = find(&docs, "Deployment")?.clone();
    let operator = ChartOperator::start(&deployment, &kubeconfig, &log)?;
    let pool = |name: &str| -> Result<GatewayPool> {
        Ok(serde_json::from_value(json!({
            "apiVersion": "floe.dev/v1alpha1", "kind": "GatewayPool",
            "metadata": {"name": name},
            "spec": {"replicas": 2, "template": {"image": "ghcr.io/acme/sandbox-pi:1"}},
        }))?)
    };
    let watched_pools: Api<GatewayPool> = Api::namespaced(client.clone(), &watched.name);
    let other_pools: Api<GatewayPool> = Api::namespaced(client.clone(), &elsewhere.name);
    watched_pools
        .create(&PostParams::default(), &pool("mine")?)
        .await?;
    other_pools
        .create(&PostParams::default(), &pool("theirs")?)
        .await?;
    let kubelet = FakeKubelet::start(
        client.clone(),
        &watched.name,
        42,
        Arc::new(|_: &Value| Verdict::Hang),
    )?;
    pool_ready(&watched_pools, "mine", 2, 90)
        .await
        .with_context(|| format!("operator log: {}", log.display()))?;
    // The other namespace's pool is not this operator's: no pods, no status.
    let theirs = other_pools.get("theirs").await?;
    assert!(theirs.status.is_none(), "{:?}", theirs.status);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &elsewhere.name);
    assert!(pods.list(&ListParams::default()).await?.items.is_empty());
    let page = reqwest::get(&operator.metrics).await?.text().await?;
    assert!(page.contains("floe_leader 1"), "{page}");

    watched_pools
        .delete("mine", &DeleteParams::default())
        .await?;
    kubelet.stop().await?;
    drop(operator);
    helm(&["uninstall", release, "--namespace", &system.name])?;
    Ok(())
}
