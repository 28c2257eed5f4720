//! The CRDs against a genuine kube-apiserver 1.20 (see `scripts/kube-test-cluster/`):
//! install, every example accepted (kube-rs and kubectl), bad objects rejected with
//! field-level 422s, printer columns, status and scale subresources.

use std::path::PathBuf;

use anyhow::{Context, Result};
use floe_crds::{GatewayPool, RolloutJob};
use floe_tests::{cluster, floe_bin, workspace_root, TestNamespace};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::Status;
use serde_json::json;

fn examples() -> Result<Vec<(PathBuf, serde_yaml::Value)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(workspace_root().join("examples"))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let doc = serde_yaml::from_str(&std::fs::read_to_string(&path)?)?;
            out.push((path, doc));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(out.len() >= 4, "examples/ holds a pool and a job per mode");
    Ok(out)
}

fn kind(doc: &serde_yaml::Value) -> &str {
    doc.get("kind").and_then(|k| k.as_str()).unwrap_or_default()
}

/// Create `doc` through the typed API and return the object as the apiserver stored it.
async fn create_typed(
    client: &kube::Client,
    ns: &str,
    doc: &serde_yaml::Value,
) -> Result<serde_json::Value> {
    let pp = PostParams::default();
    Ok(match kind(doc) {
        "GatewayPool" => {
            let obj: GatewayPool = serde_yaml::from_value(doc.clone())?;
            floe_crds::validation::validate_gateway_pool(&obj)?;
            serde_json::to_value(
                Api::<GatewayPool>::namespaced(client.clone(), ns)
                    .create(&pp, &obj)
                    .await?,
            )?
        }
        "RolloutJob" => {
            let obj: RolloutJob = serde_yaml::from_value(doc.clone())?;
            floe_crds::validation::validate_rollout_job(&obj)?;
            serde_json::to_value(
                Api::<RolloutJob>::namespaced(client.clone(), ns)
                    .create(&pp, &obj)
                    .await?,
            )?
        }
        other => anyhow::bail!("unexpected kind {other}"),
    })
}

/// Create a raw (possibly invalid) object, bypassing the Rust types, and return the API error.
async fn create_raw_err(client: &kube::Client, ns: &str, obj: serde_json::Value) -> Result<Status> {
    let kind = obj["kind"].as_str().context("kind")?.to_string();
    let ar = kube::core::ApiResource {
        group: "floe.dev".into(),
        version: "v1alpha1".into(),
        api_version: "floe.dev/v1alpha1".into(),
        kind: kind.clone(),
        plural: format!("{}s", kind.to_lowercase()),
    };
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
    let obj: DynamicObject = serde_json::from_value(obj)?;
    match api.create(&PostParams::default(), &obj).await {
        Ok(_) => anyhow::bail!("the apiserver accepted an invalid {kind}"),
        Err(kube::Error::Api(status)) => Ok(*status),
        Err(e) => Err(e.into()),
    }
}

#[tokio::test]
async fn crds_install_and_are_established() -> Result<()> {
    let c = cluster();
    let client = c.client().await?;
    let crds = c.install_crds(&client).await?;
    let names: Vec<_> = crds
        .iter()
        .filter_map(|c| c.metadata.name.clone())
        .collect();
    assert_eq!(names, ["gatewaypools.floe.dev", "rolloutjobs.floe.dev"]);
    Ok(())
}

/// The command users type, as `floe --help` shows it: `floe crds | kubectl apply -f -`, with
/// no flag. floe asks the cluster kubectl's configuration names for its version, so a 1.20
/// apiserver gets CRDs without CEL rules and accepts them.
#[tokio::test]
async fn floe_crds_piped_into_kubectl_apply() -> Result<()> {
    let c = cluster();
    let client = c.client().await?;
    let info = client.apiserver_version().await?;
    let version = format!("{}.{}", info.major, info.minor);
    let out = std::process::Command::new(floe_bin()?)
        .arg("crds")
        .env("KUBECONFIG", &c.kubeconfig)
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "floe crds: {stderr}");
    assert!(
        stderr.contains(&format!("rendered for the cluster's Kubernetes {version}")),
        "floe crds says what it rendered for: {stderr}"
    );
    let yaml = String::from_utf8_lossy(&out.stdout);
    let cel = floe_crds::generate::Target::for_kube_version(&version)?.cel;
    assert_eq!(yaml.contains("x-kubernetes-validations"), cel, "{version}");
    assert_eq!(
        yaml,
        floe_crds::generate::crds_yaml(floe_crds::generate::Target::for_kube_version(&version)?)?,
        "the same CRDs as --kube-version {version}"
    );
    let applied = c.kubectl(&["apply", "-f", "-"], Some(&out.stdout))?;
    let stdout = String::from_utf8_lossy(&applied.stdout);
    assert!(
        applied.status.success(),
        "kubectl apply: {}",
        String::from_utf8_lossy(&applied.stderr)
    );
    assert!(stdout.contains("gatewaypools.floe.dev"), "{stdout}");
    assert!(stdout.contains("rolloutjobs.floe.dev"), "{stdout}");
    // kubectl reads YAML 1.1, where a bare `Off` is `false`: the enum must reach the cluster
    // as the word it names (written bare, no job could ever say `action: "Off"`).
    let got = c.kubectl(&["get", "crd", "rolloutjobs.floe.dev", "-o", "json"], None)?;
    let crd: serde_json::Value = serde_json::from_slice(&got.stdout)?;
    let action = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        ["properties"]["train"]["properties"]["fidelityCheck"]["properties"]["action"];
    assert_eq!(action["enum"], json!(["Fail", "Warn", "Off"]), "{action}");
    Ok(())
}

/// No cluster to ask (a file rendered for later): a current cluster's CRDs, and stderr says
/// which flag renders them for an older one.
#[test]
fn floe_crds_without_a_cluster_renders_for_a_current_one_and_says_so() -> Result<()> {
    let out = std::process::Command::new(floe_bin()?)
        .arg("crds")
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "floe crds: {stderr}");
    assert!(stderr.contains("no cluster answered"), "{stderr}");
    assert!(stderr.contains("--kube-version 1.20"), "{stderr}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        floe_crds::generate::crds_yaml(floe_crds::generate::Target::LATEST)?
    );
    Ok(())
}

#[tokio::test]
async fn every_example_is_accepted_through_kube_rs_with_defaults_filled() -> Result<()> {
    let c = cluster();
    let client = c.client().await?;
    c.install_crds(&client).await?;
    let ns = TestNamespace::create(c, &client, "examples-rs").await?;
    for (path, doc) in examples()? {
        let stored = create_typed(&client, &ns.name, &doc)
            .await
            .with_context(|| format!("{} rejected", path.display()))?;
        let spec = &stored["spec"];
        match kind(&doc) {
            // Fields the examples leave out come back with the schema's defaults.
            "GatewayPool" => {
                assert_eq!(
                    spec["gateway"]["maxBodyBytes"],
                    json!(33554432),
                    "{}",
                    path.display()
                );
            }
            _ => {
                assert!(spec["backoffLimit"].is_i64(), "{}", path.display());
                assert_eq!(spec["sampling"]["topP"], json!(1.0), "{}", path.display());
                assert!(
                    spec["timeouts"]["agentSeconds"].is_i64(),
                    "{}",
                    path.display()
                );
            }
        }
    }
    // The lookahead example omits backoffLimit and the trainer's GRPO clip range.
    let jobs: Api<RolloutJob> = Api::namespaced(client.clone(), &ns.name);
    let job = jobs.get("swe-lookahead-grpo").await?;
    assert_eq!(job.spec.backoff_limit, 3);
    let grpo = &job.spec.train.as_ref().context("train")?.grpo;
    assert_eq!(
        (grpo.epsilon_low, grpo.epsilon_high, grpo.tis_cap),
        (0.2, 0.28, 2.0)
    );
    assert!(job.spec.suspend);
    Ok(())
}

#[tokio::test]
async fn every_example_is_accepted_by_kubectl_and_columns_answer_is_it_working() -> Result<()> {
    let c = cluster();
    let client = c.client().await?;
    c.install_crds(&client).await?;
    let ns = TestNamespace::create(c, &client, "examples-kubectl").await?;
    let dir = workspace_root().join("examples");
    let dir = dir.to_str().context("utf-8 path")?;
    let out = c.kubectl(&["apply", "-n", &ns.name, "-f", dir], None)?;
    assert!(
        out.status.success(),
        "kubectl apply: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let created = String::from_utf8_lossy(&out.stdout).lines().count();
    assert_eq!(
        created,
        examples()?.len(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    // Fill in status the way the operator will, then read the columns back.
    let jobs: Api<RolloutJob> = Api::namespaced(client.clone(), &ns.name);
    let status = json!({"status": {
        "phase": "Running", "progress": "3/16",
        "sessions": {"total": 16, "pending": 10, "running": 3, "succeeded": 3, "failed": 0, "retried": 1},
        "rewards": {"scored": 3, "mean": 0.6667, "passRate": 0.6667},
        "trainer": {"step": 7, "policyVersion": 7}
    }});
    jobs.patch_status(
        "fizzbuzz-grpo",
        &PatchParams::default(),
        &Patch::Merge(&status),
    )
    .await?;
    let pools: Api<GatewayPool> = Api::namespaced(client.clone(), &ns.name);
    let pool_status = json!({"status": {"replicas": 4, "readyReplicas": 3, "claimedReplicas": 2,
        "selector": "floe.dev/pool=codex,floe.dev/state in (warming,ready)"}});
    pools
        .patch_status(
            "codex",
            &PatchParams::default(),
            &Patch::Merge(&pool_status),
        )
        .await?;

    let out = c.kubectl(&["get", "rj,gp", "-n", &ns.name], None)?;
    let table = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for header in [
        "PHASE",
        "DONE/TOTAL",
        "PASS",
        "STEP",
        "READY",
        "DESIRED",
        "CLAIMED",
        "AGE",
    ] {
        assert!(table.contains(header), "column {header} missing:\n{table}");
    }
    let row = table
        .lines()
        .find(|l| l.contains("fizzbuzz-grpo"))
        .context("job row")?;
    let cells: Vec<_> = row.split_whitespace().collect();
    assert_eq!(&cells[1..5], ["Running", "3/16", "0.6667", "7"], "{table}");
    let row = table
        .lines()
        .find(|l| l.contains("gatewaypool.floe.dev/codex"))
        .context("pool row")?;
    let cells: Vec<_> = row.split_whitespace().collect();
    assert_eq!(&cells[1..4], ["3", "4", "2"], "{table}");
    Ok(())
}

#[tokio::test]
async fn invalid_objects_are_rejected_with_a_422_naming_the_field() -> Result<()> {
    let c = cluster();
    let client = c.client().await?;
    c.install_crds(&client).await?;
    let ns = TestNamespace::create(c, &client, "invalid").await?;
    let pool = |spec: serde_json::Value| json!({"apiVersion": "floe.dev/v1alpha1", "kind": "GatewayPool", "metadata": {"name": "p"}, "spec": spec});
    let job = |spec: serde_json::Value| json!({"apiVersion": "floe.dev/v1alpha1", "kind": "RolloutJob", "metadata": {"name": "j"}, "spec": spec});
    let valid_job_spec = json!({
        "numSamples": 4,
        "tasks": {"inline": [{"id": "t1", "instruction": "do it"}]},
        "harness": {"preset": "codex"},
        "poolRef": {"name": "codex"},
        "evaluator": {"command": ["true"]},
        "sft": {"upstream": {"url": "http://m:8000"}, "output": {"claimName": "data"}}
    });
    let with = |path: &[&str], value: serde_json::Value| {
        let mut spec = valid_job_spec.clone();
        let mut at = &mut spec;
        for key in &path[..path.len() - 1] {
            at = &mut at[*key];
        }
        at[path[path.len() - 1]] = value;
        spec
    };
    let without = |key: &str| {
        let mut spec = valid_job_spec.clone();
        spec.as_object_mut().map(|m| m.remove(key));
        spec
    };

    let cases = [
        (
            "bad enum",
            job(with(&["harness", "preset"], json!("cursor"))),
            "spec.harness.preset",
        ),
        (
            "bad enum",
            pool(
                json!({"replicas": 1, "template": {"image": "x"}, "updateStrategy": {"type": "Rolling"}}),
            ),
            "spec.updateStrategy.type",
        ),
        (
            "negative count",
            pool(json!({"replicas": -1, "template": {"image": "x"}})),
            "spec.replicas",
        ),
        (
            "zero samples",
            job(with(&["numSamples"], json!(0))),
            "spec.numSamples",
        ),
        (
            "negative backoff",
            job(with(&["backoffLimit"], json!(-2))),
            "spec.backoffLimit",
        ),
        (
            "missing required",
            job(without("evaluator")),
            "spec.evaluator",
        ),
        (
            "missing required",
            pool(json!({"replicas": 1, "template": {}})),
            "spec.template.image",
        ),
        (
            "too long",
            job(with(
                &["tasks", "inline"],
                json!([{"id": "x".repeat(129), "instruction": "i"}]),
            )),
            "spec.tasks.inline.id",
        ),
        (
            "bad pattern",
            job(with(
                &["tasks", "inline"],
                json!([{"id": "-bad id", "instruction": "i"}]),
            )),
            "spec.tasks.inline.id",
        ),
        (
            "duplicate task id",
            job(with(
                &["tasks", "inline"],
                json!([{"id": "a", "instruction": "i"}, {"id": "a", "instruction": "j"}]),
            )),
            "Duplicate value: map[string]interface {}{\"id\":\"a\"}",
        ),
        (
            "port out of range",
            pool(json!({"replicas": 1, "template": {"image": "x"}, "gateway": {"port": 80}})),
            "spec.gateway.port",
        ),
    ];
    for (what, obj, field) in cases {
        let err = create_raw_err(&client, &ns.name, obj)
            .await
            .with_context(|| what.to_string())?;
        assert_eq!(err.code, 422, "{what}: {err:?}");
        assert!(
            err.message.contains(field),
            "{what}: message does not name {field}: {}",
            err.message
        );
    }
    Ok(())
}

#[tokio::test]
async fn scale_subresource_drives_replicas() -> Result<()> {
    let c = cluster();
    let client = c.client().await?;
    c.install_crds(&client).await?;
    let ns = TestNamespace::create(c, &client, "scale").await?;
    let out = c.kubectl(
        &[
            "apply",
            "-n",
            &ns.name,
            "-f",
            workspace_root()
                .join("examples/gatewaypool.yaml")
                .to_str()
                .context("path")?,
        ],
        None,
    )?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let out = c.kubectl(&["scale", "-n", &ns.name, "gp/codex", "--replicas=5"], None)?;
    assert!(
        out.status.success(),
        "kubectl scale: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pools: Api<GatewayPool> = Api::namespaced(client.clone(), &ns.name);
    assert_eq!(pools.get("codex").await?.spec.replicas, 5);

    // What an HPA reads: status replicas and the selector, through /scale.
    let status =
        json!({"status": {"replicas": 5, "readyReplicas": 5, "selector": "floe.dev/pool=codex"}});
    pools
        .patch_status("codex", &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    let scale = pools.get_scale("codex").await?;
    let scale_status = scale.status.context("scale status")?;
    assert_eq!(scale_status.replicas, 5);
    assert_eq!(
        scale_status.selector.as_deref(),
        Some("floe.dev/pool=codex")
    );

    // And what an HPA writes.
    let patch = json!({"spec": {"replicas": 2}});
    pools
        .patch_scale("codex", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    assert_eq!(pools.get("codex").await?.spec.replicas, 2);

    // A negative scale is refused by the same schema rule.
    let out = c.kubectl(
        &["scale", "-n", &ns.name, "gp/codex", "--replicas=-3"],
        None,
    )?;
    assert!(!out.status.success());
    Ok(())
}
