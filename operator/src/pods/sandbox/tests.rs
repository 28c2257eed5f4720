use floe_crds::gateway_pool::GatewayPoolSpec;
use serde_json::{json, Value};

use super::*;
use crate::pods::view::grader_image;

fn spec(extra: Value) -> GatewayPoolSpec {
    let mut base = json!({
        "replicas": 2,
        "template": {"image": "ghcr.io/acme/sandbox-pi:1", "workingDir": "/repo",
            "env": [{"name": "TZ", "value": "UTC"}],
            "metadata": {"labels": {"team": "rl"}}},
        "prepare": [{"name": "deps", "command": ["npm", "ci"]}],
        "gateway": {"upstream": {"url": "http://policy:8000", "model": "qwen"}},
    });
    if let (Some(b), Some(e)) = (base.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            b.insert(k.clone(), v.clone());
        }
    }
    serde_json::from_value(base).expect("pool spec")
}

fn pod(spec: &GatewayPoolSpec, native: bool) -> Value {
    let p = SandboxPod {
        name: "pool-abc",
        namespace: "ns",
        pool: "pool",
        spec,
        floe_image: "ghcr.io/floe-dev/floe:0.1.0",
        secret: "pool-abc-control",
        native_sidecars: native,
    };
    serde_json::to_value(build(&p).expect("pod")).expect("json")
}

fn container<'a>(list: &'a Value, name: &str) -> &'a Value {
    list.as_array()
        .and_then(|l| l.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no container {name} in {list}"))
}

fn env<'a>(c: &'a Value, name: &str) -> Option<&'a Value> {
    c["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)
        .map(|e| &e["value"])
}

#[test]
fn the_harness_command_is_replaced_by_the_runner_with_the_gateway_beside_it() {
    let s = spec(json!({}));
    let p = pod(&s, false);
    let main = container(&p["spec"]["containers"], "sandbox");
    assert_eq!(main["image"], "ghcr.io/acme/sandbox-pi:1");
    assert_eq!(main["command"], json!(["/floe-bin/floe", "sandbox"]));
    assert_eq!(main["workingDir"], "/repo");
    assert_eq!(
        env(main, "FLOE_GATEWAY_URL"),
        Some(&json!("http://127.0.0.1:8370"))
    );
    let agent = container(&p["spec"]["containers"], "agent");
    assert_eq!(
        env(agent, "OPENAI_BASE_URL"),
        Some(&json!("http://127.0.0.1:8370/v1"))
    );
    assert_eq!(env(main, "TZ"), Some(&json!("UTC")));
    assert_eq!(env(agent, "TZ"), Some(&json!("UTC")));
    let prepare: Value = serde_json::from_str(
        env(main, "FLOE_POOL_PREPARE")
            .and_then(Value::as_str)
            .unwrap_or("null"),
    )
    .expect("json");
    assert_eq!(prepare[0]["name"], "deps");
    let gw = container(&p["spec"]["containers"], "floe-gateway");
    let args: Vec<&str> = gw["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    for needle in [
        "--require-runner-ready",
        "http://policy:8000",
        "qwen",
        "127.0.0.1:8370",
        "0.0.0.0:8371",
    ] {
        assert!(args.contains(&needle), "{needle} not in {args:?}");
    }
    assert_eq!(gw["readinessProbe"]["httpGet"]["path"], "/readyz");
    // The sidecar turns transparent huge pages off for itself; the runner (whose children are
    // the harness) does not.
    assert_eq!(env(gw, "MIMALLOC_ALLOW_THP"), Some(&json!("0")));
    assert_eq!(env(main, "MIMALLOC_ALLOW_THP"), None);
    // vLLM is the gateway's default: no kind flag.
    assert!(!args.contains(&"--upstream-kind"), "{args:?}");
    let init = container(&p["spec"]["initContainers"], "floe-init");
    assert_eq!(init["command"][1], "install-binary");
}

#[test]
fn an_sglang_upstream_switches_the_gateway_to_sglang_capture() {
    let s = spec(json!({"gateway": {"upstream": {"url": "http://sgl:30000", "kind": "SGLang"}}}));
    let p = pod(&s, false);
    let args = container(&p["spec"]["containers"], "floe-gateway")["args"].clone();
    let args: Vec<&str> = args
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let at = args
        .iter()
        .position(|a| *a == "--upstream-kind")
        .expect("--upstream-kind");
    assert_eq!(args.get(at + 1), Some(&"sglang"));
}

#[test]
fn native_sidecars_run_the_gateway_as_a_restartable_init_container() {
    let s = spec(json!({}));
    let p = pod(&s, true);
    let gw = container(&p["spec"]["initContainers"], "floe-gateway");
    assert_eq!(gw["restartPolicy"], "Always");
    assert_eq!(p["spec"]["containers"].as_array().map(Vec::len), Some(2));
    // The binary copy runs first, then the sidecar.
    assert_eq!(p["spec"]["initContainers"][0]["name"], "floe-init");
}

#[test]
fn the_control_token_comes_from_a_secret_never_the_pod_spec() {
    let s = spec(json!({}));
    let p = pod(&s, false);
    let text = p.to_string();
    let volumes = &p["spec"]["volumes"];
    let secret = volumes
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == "floe-control"))
        .expect("secret volume");
    assert_eq!(secret["secret"]["secretName"], "pool-abc-control");
    // The grader's FLOE_CONTROL_TOKEN comes from the Secret: no value in the pod spec.
    let containers = p["spec"]["containers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for c in &containers {
        for v in c["env"].as_array().into_iter().flatten() {
            if v["name"] == "FLOE_CONTROL_TOKEN" {
                assert!(v.get("value").is_none(), "a token value in env: {v}");
            }
        }
    }
    assert!(!text.contains("FLOE_CONTROL_TOKEN_FILE"), "{text}");
    assert_eq!(p["spec"]["automountServiceAccountToken"], false);
    assert_eq!(p["spec"]["restartPolicy"], "Never");
}

#[test]
fn restricted_security_unless_the_template_says_otherwise() {
    let p = pod(&spec(json!({})), false);
    let sc = &container(&p["spec"]["containers"], "sandbox")["securityContext"];
    assert_eq!(sc["runAsNonRoot"], true);
    // A numeric user, so images without a numeric non-root USER start too.
    assert_eq!(sc["runAsUser"], 1000);
    assert_eq!(sc["runAsGroup"], 1000);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    let mut s = spec(json!({}));
    s.template.security_context = serde_json::from_value(json!({"runAsUser": 2000,
        "privileged": true, "capabilities": {"add": ["NET_RAW", "SYS_PTRACE"]}}))
    .ok();
    let p = pod(&s, false);
    // The grader runs with the template's as given ...
    assert_eq!(
        container(&p["spec"]["containers"], "sandbox")["securityContext"],
        json!({"runAsUser": 2000, "privileged": true,
               "capabilities": {"add": ["NET_RAW", "SYS_PTRACE"]}})
    );
    // ... the agent with none of its privileges: raw sockets would read the gateway's
    // plaintext traffic to the trainer, the job's token in it.
    assert_eq!(
        container(&p["spec"]["containers"], "agent")["securityContext"],
        json!({"runAsUser": 2000, "allowPrivilegeEscalation": false,
               "capabilities": {"drop": ["ALL"]}})
    );
    // The gateway stays restricted either way.
    assert_eq!(
        container(&p["spec"]["containers"], "floe-gateway")["securityContext"]["runAsNonRoot"],
        true
    );
}

#[test]
fn labels_carry_pool_state_and_template_hash() {
    let s = spec(json!({}));
    let p = pod(&s, false);
    let labels = &p["metadata"]["labels"];
    assert_eq!(labels[POOL_LABEL], "pool");
    assert_eq!(labels[STATE_LABEL], "warming");
    assert_eq!(labels[SANDBOX_LABEL], "true");
    assert_eq!(labels["team"], "rl");
    assert_eq!(
        p["metadata"]["annotations"][TEMPLATE_HASH_ANNOTATION],
        template_hash(&s)
    );
}

#[test]
fn the_template_hash_changes_with_the_template_only() {
    let a = spec(json!({}));
    let mut scaled = a.clone();
    scaled.replicas = 50;
    assert_eq!(
        template_hash(&a),
        template_hash(&scaled),
        "scaling is not a template change"
    );
    let mut changed = a.clone();
    changed.template.image = "ghcr.io/acme/sandbox-pi:2".into();
    assert_ne!(template_hash(&a), template_hash(&changed));
    let mut prepared = a.clone();
    prepared.prepare.clear();
    assert_ne!(template_hash(&a), template_hash(&prepared));
    assert_eq!(template_hash(&a).len(), 16);
}

#[test]
fn the_ready_mark_is_a_compare_and_swap_that_clears_the_ownership_record() {
    let patch = state_mark_patch(Some("4711".into()), PodState::Ready);
    let meta = &patch["metadata"];
    assert_eq!(meta["resourceVersion"], "4711");
    assert_eq!(meta["labels"][STATE_LABEL], "ready");
    // One empty entry clears; an empty list would leave the record as it is.
    assert_eq!(meta["managedFields"], json!([{}]));
    assert_eq!(meta.as_object().map(|m| m.len()), Some(3), "{patch}");
}

#[test]
fn the_agent_runs_apart_from_the_grader_without_the_token_or_floe_state() {
    let s = spec(json!({"template": {"image": "img", "workingDir": "/repo",
        "resources": {"limits": {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "1"},
                      "requests": {"cpu": "1", "memory": "2Gi", "nvidia.com/gpu": "1"}},
        "volumes": [{"name": "cache", "emptyDir": {}}],
        "volumeMounts": [{"name": "cache", "mountPath": "/cache"}]}}));
    let p = pod(&s, true);
    let containers = &p["spec"]["containers"];
    let (grader, agent) = (
        container(containers, "sandbox"),
        container(containers, "agent"),
    );
    assert_eq!(agent["image"], "img");
    assert_eq!(agent["command"], json!(["/floe-bin/floe", "agent"]));
    assert_eq!(agent["args"], json!(["--grader", "127.0.0.1:8379"]));
    let grader_args = grader["args"].to_string();
    assert!(
        grader_args.contains("\"--agent-listen\",\"127.0.0.1:8379\""),
        "{grader_args}"
    );
    let mounts = |c: &Value| -> Vec<String> {
        c["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| m["name"].as_str().map(str::to_owned))
            .collect()
    };
    // The agent sees its workspace, its home and the template's volumes; never the token,
    // the grader's state (assignment, snapshot, evaluation copy) or the gateway's captures.
    assert_eq!(
        mounts(agent),
        ["floe-bin", "floe-workspace", "floe-agent", "cache"]
    );
    assert!(mounts(grader).contains(&"floe-run".to_string()));
    // The grader's evaluator runs the agent's code: the token is no file there, only the
    // runner's variable (from the Secret).
    assert!(!mounts(grader).contains(&"floe-control".to_string()));
    let from_secret = grader["env"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == "FLOE_CONTROL_TOKEN")
        .map(|v| v["valueFrom"]["secretKeyRef"].clone());
    assert_eq!(
        from_secret,
        Some(json!({"name": "pool-abc-control", "key": "control-token"}))
    );
    for private in ["floe-control", "floe-run", "floe-state"] {
        assert!(!mounts(agent).contains(&private.to_string()), "{private}");
    }
    assert_eq!(env(agent, "FLOE_CONTROL_TOKEN_FILE"), None);
    assert_eq!(env(agent, "FLOE_POOL_PREPARE"), None);
    // The PID namespaces stay apart: the agent's init is `floe agent`.
    assert_eq!(p["spec"].get("shareProcessNamespace"), None);
    // The harness keeps the template's resources; the grader its limits, small requests,
    // and no GPU of its own (and the room on disk its disk-budget test covers).
    assert_eq!(agent["resources"]["requests"]["nvidia.com/gpu"], "1");
    assert_eq!(
        grader["resources"]["limits"],
        json!({"cpu": "2", "memory": "4Gi", "ephemeral-storage": (128u64 << 30).to_string()})
    );
    assert_eq!(
        grader["resources"]["requests"],
        json!({"cpu": "10m", "memory": "32Mi", "ephemeral-storage": "0"})
    );
    assert_eq!(agent["securityContext"], grader["securityContext"]);
}

#[test]
fn the_grader_runs_in_its_own_image_when_the_template_names_one() {
    let plain = pod(&spec(json!({})), true);
    let image = |p: &Value, name: &str| container(&p["spec"]["containers"], name)["image"].clone();
    assert_eq!(image(&plain, "sandbox"), image(&plain, "agent"));
    let s = spec(json!({"template": {"image": "harness:1", "graderImage": "graders/pytest:3"}}));
    let p = pod(&s, true);
    assert_eq!(image(&p, "sandbox"), "graders/pytest:3");
    assert_eq!(image(&p, "agent"), "harness:1");
    let built: Pod = serde_json::from_value(p).expect("pod");
    assert_eq!(grader_image(&built), Some("graders/pytest:3"));
}

#[test]
fn the_model_servers_key_reaches_the_gateway_container_only() {
    let s = spec(
        json!({"gateway": {"upstream": {"url": "http://teacher:8000",
        "apiKeySecret": {"name": "teacher-key"}}}}),
    );
    let p = pod(&s, false);
    let containers = &p["spec"]["containers"];
    let gateway = container(containers, "floe-gateway");
    let from = gateway["env"]
        .as_array()
        .and_then(|e| e.iter().find(|e| e["name"] == "FLOE_UPSTREAM_API_KEY"))
        .expect("the key's variable");
    assert_eq!(
        from["valueFrom"]["secretKeyRef"],
        json!({"name": "teacher-key", "key": "apiKey"})
    );
    for other in ["sandbox", "agent"] {
        assert!(
            !container(containers, other)
                .to_string()
                .contains("teacher-key"),
            "{other} has the key"
        );
    }
    // Without a Secret, no variable at all.
    let none = pod(&spec(json!({})), false);
    assert!(!none.to_string().contains("FLOE_UPSTREAM_API_KEY"));
}

#[test]
fn the_agents_disk_budget_reaches_the_grader_and_bounds_its_volumes() {
    let volume = |p: &Value, name: &str| -> Value {
        p["spec"]["volumes"]
            .as_array()
            .and_then(|vs| vs.iter().find(|v| v["name"] == name))
            .cloned()
            .unwrap_or_else(|| panic!("no volume {name}"))
    };
    // By default 8Gi: the grader checks it, the kubelet evicts past four times that.
    let p = pod(&spec(json!({})), false);
    let main = container(&p["spec"]["containers"], "sandbox");
    assert_eq!(env(main, "FLOE_DISK_BUDGET"), Some(&json!("8Gi")));
    for name in ["floe-workspace", "floe-agent"] {
        assert_eq!(
            volume(&p, name)["emptyDir"]["sizeLimit"],
            (32u64 << 30).to_string()
        );
    }
    // floe's own volumes are not the agent's to fill.
    assert_eq!(volume(&p, "floe-state")["emptyDir"], json!({}));
    let agent = container(&p["spec"]["containers"], "agent");
    assert_eq!(env(agent, "FLOE_DISK_BUDGET"), None);
    // What it writes outside them (its container's layer) has the same backstop...
    assert_eq!(
        agent["resources"]["limits"]["ephemeral-storage"],
        (32u64 << 30).to_string()
    );
    // ... and reserves nothing on the node (a limit alone would be its request).
    assert_eq!(agent["resources"]["requests"]["ephemeral-storage"], "0");
    // The grader's room keeps the pod's sum of limits (which the kubelet checks first) far
    // above anything honest: the agent's own limit is the one that names it.
    let grader = container(&p["spec"]["containers"], "sandbox");
    assert_eq!(
        (
            &grader["resources"]["limits"]["ephemeral-storage"],
            &grader["resources"]["requests"]["ephemeral-storage"]
        ),
        (&json!((128u64 << 30).to_string()), &json!("0"))
    );
    // The pod says so where the job's pod cache keeps it (no spec there).
    assert_eq!(
        p["metadata"]["annotations"]["floe.dev/grader-disk-room"],
        (128u64 << 30).to_string()
    );
    // ... unless the template sets its own, which stays with the rest of its resources.
    let mut s = spec(json!({}));
    s.template.resources = Some(
        serde_json::from_value(json!({"limits": {"ephemeral-storage": "1Gi", "cpu": "2"}}))
            .unwrap_or_default(),
    );
    let p = pod(&s, false);
    let agent = container(&p["spec"]["containers"], "agent");
    assert_eq!(
        agent["resources"]["limits"],
        json!({"ephemeral-storage": "1Gi", "cpu": "2"})
    );
    // "0": no budget, no sizeLimit.
    let mut s = spec(json!({}));
    s.template.disk_budget = Some("0".into());
    let p = pod(&s, false);
    assert_eq!(volume(&p, "floe-workspace")["emptyDir"], json!({}));
    assert!(container(&p["spec"]["containers"], "agent")["resources"].is_null());
    // No budget but the template's own limit on the agent: the grader gets room all the same.
    s.template.resources = Some(
        serde_json::from_value(json!({"limits": {"ephemeral-storage": "1Gi"}})).unwrap_or_default(),
    );
    let p = pod(&s, false);
    let grader = container(&p["spec"]["containers"], "sandbox");
    assert_eq!(
        grader["resources"]["limits"]["ephemeral-storage"],
        (4u64 << 30).to_string()
    );
    let main = container(&p["spec"]["containers"], "sandbox");
    assert_eq!(env(main, "FLOE_DISK_BUDGET"), Some(&json!("0")));
}
