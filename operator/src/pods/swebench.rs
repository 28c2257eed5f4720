//! A `poolTemplate` pod for SWE-bench instances (`tasks.swebench`; docs/swebench.md). The
//! public images keep the repository, built and installed in place, at `/testbed`, and their
//! environment imports from there; the pod's volumes would hide it. So:
//! - an init container of the instance's image copies `/testbed` into the workspace volume
//!   (`floe seed-workspace`); the runner then replaces its `.git` by one holding the base commit
//!   alone before the agent starts;
//! - the agent works in that volume mounted at `/testbed`, where its own test runs import it;
//! - the grader mounts the workspace elsewhere and builds the evaluation copy in a volume of its
//!   own mounted at `/testbed`, where the instance's eval script and environment expect it;
//! - a sidecar of an image with the `swebench` package answers the grader on loopback;
//! - the grader runs as root, as swebench's harness runs the eval script: the public images'
//!   environments are root's, and some eval scripts install the repository into them (or run
//!   `locale-gen`) before the tests. It keeps the three capabilities it needs (to give the
//!   agent what it prepared, to read what the agent left, to drop the rest), and every program
//!   it starts, the eval script first, runs with none: root only over root's own files, in a
//!   container the agent never ran in. A template's own `securityContext` replaces this.

use floe_crds::rollout_job::SweBenchTasks;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{json, Value};

use super::names::{AGENT_CONTAINER, GRADER_CONTAINER};

/// The grader's view of the workspace volume (its `/testbed` is the evaluation copy's).
const GRADER_WORKSPACE: &str = "/floe-workspace";
const SEED_MOUNT: &str = "/floe-seed";
pub const BRIDGE_CONTAINER: &str = "swebench";
const BRIDGE_LISTEN: &str = "127.0.0.1:8391";
/// The grader's own `/dev/shm` (a memory-backed volume of its own).
const GRADER_SHM: &str = "floe-grader-shm";

/// The grader's security context where the template sets none (the module's comment).
/// Capabilities from Pod Security's `baseline` list: `CHOWN` to give the agent its workspace
/// and home, `DAC_OVERRIDE` to read what it left whatever their modes, `SETPCAP` to start
/// every program with no capability at all.
fn root_grader() -> Value {
    json!({
        "runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": false, "allowPrivilegeEscalation": false,
        "capabilities": {"drop": ["ALL"], "add": ["CHOWN", "DAC_OVERRIDE", "SETPCAP"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    })
}

/// Rewrites a sandbox pod built by [`super::sandbox::build`] for SWE-bench instances.
/// `own_security`: the template sets its own `securityContext`, which every container keeps.
pub fn adapt(
    pod: Pod,
    settings: &SweBenchTasks,
    own_security: bool,
) -> Result<Pod, serde_json::Error> {
    let mut v = serde_json::to_value(pod)?;
    let repo = settings.repository_directory.as_str();
    let spec = &mut v["spec"];
    let Some(grader) = find(spec, GRADER_CONTAINER) else {
        return serde_json::from_value(v);
    };
    let floe_bin = grader["command"][0]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let bin_mount = json!({"name": "floe-bin", "mountPath": floe_bin.trim_end_matches("/floe"), "readOnly": true});
    // The agent's image, not the grader's: a template's graderImage has no `/testbed`.
    let instance_image =
        find(spec, AGENT_CONTAINER).map_or(grader["image"].clone(), |a| a["image"].clone());
    let seed = json!({
        "name": "floe-seed",
        "image": instance_image,
        "command": [floe_bin, "seed-workspace"],
        "args": ["--from", repo, "--into", SEED_MOUNT],
        "volumeMounts": [bin_mount, {"name": "floe-workspace", "mountPath": SEED_MOUNT}],
        "securityContext": grader["securityContext"],
    });
    // Right after floe-init, which copies the binary it runs.
    if let Some(init) = spec["initContainers"].as_array_mut() {
        let at = init.len().min(1);
        init.insert(at, seed);
    }
    if let Some(volumes) = spec["volumes"].as_array_mut() {
        volumes.push(json!({"name": GRADER_SHM, "emptyDir": {"medium": "Memory"}}));
    }
    let mut eval_volume = volume(spec, "floe-workspace").unwrap_or_else(|| json!({"emptyDir": {}}));
    eval_volume["name"] = super::names::EVAL_VOLUME.into();
    if let Some(volumes) = spec["volumes"].as_array_mut() {
        volumes.push(eval_volume);
    }
    // The grader's token, from the same Secret: the bridge answers nothing else (the agent
    // shares the pod's loopback).
    let token: Vec<Value> = grader["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["name"] == "FLOE_CONTROL_TOKEN")
        .cloned()
        .collect();
    let mut bridge = json!({
        "name": BRIDGE_CONTAINER,
        "image": settings.grader_image,
        "command": [floe_bin, "swebench-bridge"],
        "args": ["--listen", BRIDGE_LISTEN, "--python", "python3"],
        "env": token,
        "volumeMounts": [bin_mount],
        "securityContext": grader["securityContext"],
    });
    for key in ["resources", "imagePullPolicy"] {
        if let Some(value) = grader.get(key) {
            bridge[key] = value.clone();
        }
    }
    for container in spec["containers"].as_array_mut().into_iter().flatten() {
        match container["name"].as_str() {
            Some(GRADER_CONTAINER) => {
                // The eval script runs in the instance's environment: a grader image of its
                // own (`evaluator.image`, the template's `graderImage`) has none.
                container["image"] = instance_image.clone();
                remount(container, "floe-workspace", GRADER_WORKSPACE);
                push(
                    &mut container["volumeMounts"],
                    json!({"name": super::names::EVAL_VOLUME, "mountPath": repo}),
                );
                container["workingDir"] = GRADER_WORKSPACE.into();
                replace_arg(container, "--workspace", GRADER_WORKSPACE);
                let args = &mut container["args"];
                for arg in [
                    "--agent-workspace",
                    repo,
                    "--eval-dir",
                    repo,
                    "--seeded-from",
                    repo,
                    "--swebench-url",
                    &format!("http://{BRIDGE_LISTEN}/"),
                ] {
                    push(args, arg.into());
                }
                if !own_security {
                    let agent = super::sandbox::SANDBOX_UID;
                    push(args, "--agent-user".into());
                    push(args, format!("{agent}:{agent}").into());
                    container["securityContext"] = root_grader();
                }
                // The pod's IPC namespace is shared, and so is its `/dev/shm`: what the agent
                // left there (a full tmpfs) must not fail the untouched repository's tests,
                // which would make its loss infrastructure. (A template that mounts its own
                // there keeps it: two mounts at one path make the pod invalid.)
                let own_shm = container["volumeMounts"]
                    .as_array()
                    .is_some_and(|m| m.iter().any(|m| m["mountPath"] == "/dev/shm"));
                if !own_shm {
                    push(
                        &mut container["volumeMounts"],
                        json!({"name": GRADER_SHM, "mountPath": "/dev/shm"}),
                    );
                }
            }
            Some(AGENT_CONTAINER) => {
                remount(container, "floe-workspace", repo);
                container["workingDir"] = repo.into();
            }
            _ => {}
        }
    }
    push(&mut spec["containers"], bridge);
    serde_json::from_value(v)
}

fn find(spec: &Value, name: &str) -> Option<Value> {
    spec["containers"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == name)
        .cloned()
}

fn volume(spec: &Value, name: &str) -> Option<Value> {
    spec["volumes"]
        .as_array()?
        .iter()
        .find(|v| v["name"] == name)
        .cloned()
}

fn remount(container: &mut Value, volume: &str, path: &str) {
    for mount in container["volumeMounts"]
        .as_array_mut()
        .into_iter()
        .flatten()
    {
        if mount["name"] == volume {
            mount["mountPath"] = path.into();
        }
    }
}

fn replace_arg(container: &mut Value, flag: &str, value: &str) {
    if let Some(args) = container["args"].as_array_mut() {
        if let Some(i) = args.iter().position(|a| a == flag) {
            if let Some(slot) = args.get_mut(i + 1) {
                *slot = value.into();
            }
        }
    }
}

fn push(list: &mut Value, item: Value) {
    if let Some(items) = list.as_array_mut() {
        items.push(item);
    }
}

#[cfg(test)]
mod tests;
