use floe_crds::gateway_pool::GatewayPoolSpec;
use serde_json::{json, Value};

use super::*;
use crate::pods::sandbox::{build, SandboxPod};

fn pod(native: bool) -> Value {
    pod_with(native, Some(json!({"runAsUser": 1000})), None)
}

fn pod_with(native: bool, security: Option<Value>, also_mount: Option<Value>) -> Value {
    let mut template = json!({"image": "swebench/sweb.eval.x86_64.acme_1776_calc-1:latest",
                              "graderImage": "graders/pytest:3",
                              "volumes": [{"name": "datasets", "emptyDir": {}},
                                          {"name": "dshm", "emptyDir": {"medium": "Memory"}}],
                              "volumeMounts": [{"name": "datasets", "mountPath": "/data"}]});
    if let (Some(mount), Some(mounts)) = (also_mount, template["volumeMounts"].as_array_mut()) {
        mounts.push(mount);
    }
    if let Some(security) = &security {
        template["securityContext"] = security.clone();
    }
    let spec: GatewayPoolSpec =
        serde_json::from_value(json!({"replicas": 0, "template": template})).expect("spec");
    let pod = build(&SandboxPod {
        name: "swe-0",
        namespace: "ns",
        pool: "swe",
        spec: &spec,
        floe_image: "ghcr.io/floe-dev/floe:0.1.0",
        secret: "swe-0-control",
        native_sidecars: native,
    })
    .expect("pod");
    let settings = SweBenchTasks {
        grader_image: "registry.local/swebench-grader:5.0.2".into(),
        ..Default::default()
    };
    serde_json::to_value(adapt(pod, &settings, security.is_some()).expect("adapted")).expect("json")
}

/// The grader runs the eval script as swebench's harness does, as root (the images'
/// environments are root's), keeping only what it needs and giving its programs nothing; the
/// agent, the seed step and the bridge stay the sandbox's user. A template's own security
/// context is every container's, as in any pod.
#[test]
fn the_grader_runs_as_root_with_three_capabilities_unless_the_template_says_otherwise() {
    let p = pod_with(false, None, None);
    let grader = named(&p["spec"]["containers"], "sandbox");
    let sc = &grader["securityContext"];
    assert_eq!(
        (sc["runAsUser"].as_i64(), sc["runAsNonRoot"].as_bool()),
        (Some(0), Some(false))
    );
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(
        sc["capabilities"]["add"],
        json!(["CHOWN", "DAC_OVERRIDE", "SETPCAP"])
    );
    let grader_args = args(grader);
    let at = grader_args
        .iter()
        .position(|a| *a == "--agent-user")
        .expect("--agent-user");
    assert_eq!(grader_args[at + 1], "1000:1000");
    for (list, name) in [
        ("containers", "agent"),
        ("containers", "swebench"),
        ("initContainers", "floe-seed"),
    ] {
        let sc = &named(&p["spec"][list], name)["securityContext"];
        assert_eq!(
            (sc["runAsUser"].as_i64(), sc["runAsNonRoot"].as_bool()),
            (Some(1000), Some(true)),
            "{name}: {sc}"
        );
    }
    // Its `/dev/shm` is its own, not the pod's; the template's volumes are its as before.
    let mounts_at = |c: &Value, path: &str| -> Vec<Value> {
        let all = c["volumeMounts"].as_array().expect("mounts");
        all.iter()
            .filter(|m| m["mountPath"] == path)
            .cloned()
            .collect()
    };
    assert_eq!(mounts_at(grader, "/dev/shm")[0]["name"], "floe-grader-shm");
    assert!(mounts_at(named(&p["spec"]["containers"], "agent"), "/dev/shm").is_empty());
    assert_eq!(mounts_at(grader, "/data").len(), 1);
    // A template that mounts its own `/dev/shm` keeps it, and only it (two mounts at one
    // path would make the pod invalid).
    let with_shm = pod_with(
        false,
        None,
        Some(json!({"name": "dshm", "mountPath": "/dev/shm"})),
    );
    let shm = mounts_at(
        named(&with_shm["spec"]["containers"], "sandbox"),
        "/dev/shm",
    );
    assert_eq!((shm.len(), shm[0]["name"].as_str()), (1, Some("dshm")));
    let own = pod_with(false, Some(json!({"runAsUser": 1234})), None);
    let grader = named(&own["spec"]["containers"], "sandbox");
    assert_eq!(grader["securityContext"], json!({"runAsUser": 1234}));
    assert!(!args(grader).contains(&"--agent-user"));
}

/// A container's arguments.
fn args(c: &Value) -> Vec<&str> {
    c["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(Value::as_str)
        .collect()
}

fn named<'a>(list: &'a Value, name: &str) -> &'a Value {
    list.as_array()
        .and_then(|l| l.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no {name} in {list}"))
}

fn mounts(c: &Value) -> Vec<(String, String)> {
    c["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            (
                m["name"].as_str().unwrap_or_default().into(),
                m["mountPath"].as_str().unwrap_or_default().into(),
            )
        })
        .collect()
}

fn has(c: &Value, volume: &str, path: &str) -> bool {
    mounts(c).contains(&(volume.to_string(), path.to_string()))
}

#[test]
fn the_agent_works_in_testbed_and_the_grader_evaluates_there() {
    for native in [false, true] {
        let p = pod(native);
        let spec = &p["spec"];
        // The seed copies the image's /testbed into the workspace, after floe-init.
        let init = spec["initContainers"].as_array().expect("init");
        assert_eq!(init[0]["name"], "floe-init");
        assert_eq!(init[1]["name"], "floe-seed");
        let seed = &init[1];
        assert_eq!(
            seed["image"],
            "swebench/sweb.eval.x86_64.acme_1776_calc-1:latest"
        );
        assert_eq!(
            seed["args"],
            json!(["--from", "/testbed", "--into", "/floe-seed"])
        );
        assert!(has(seed, "floe-workspace", "/floe-seed"));
        assert_eq!(seed["securityContext"]["runAsUser"], 1000);
        let containers = &spec["containers"];
        let agent = named(containers, AGENT_CONTAINER);
        assert_eq!(agent["workingDir"], "/testbed");
        assert!(has(agent, "floe-workspace", "/testbed"));
        assert!(!mounts(agent).iter().any(|(v, _)| v == "floe-eval"));
        let grader = named(containers, GRADER_CONTAINER);
        assert!(has(grader, "floe-workspace", "/floe-workspace"));
        assert!(has(grader, "floe-eval", "/testbed"));
        let args = args(grader);
        for pair in [
            ["--workspace", "/floe-workspace"],
            ["--agent-workspace", "/testbed"],
            ["--eval-dir", "/testbed"],
            ["--seeded-from", "/testbed"],
            ["--swebench-url", "http://127.0.0.1:8391/"],
        ] {
            assert!(args.windows(2).any(|w| w == pair), "{pair:?} in {args:?}");
        }
        let bridge = named(containers, BRIDGE_CONTAINER);
        assert_eq!(bridge["image"], "registry.local/swebench-grader:5.0.2");
        assert_eq!(
            bridge["args"],
            json!(["--listen", "127.0.0.1:8391", "--python", "python3"])
        );
        assert!(
            mounts(bridge).iter().all(|(v, _)| v == "floe-bin"),
            "{bridge}"
        );
        // The evaluation copy gets the workspace's size limit.
        assert_eq!(
            named(&spec["volumes"], "floe-eval")["emptyDir"],
            named(&spec["volumes"], "floe-workspace")["emptyDir"]
        );
    }
}
