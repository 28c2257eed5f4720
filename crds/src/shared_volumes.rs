//! Volumes that outlive a sandbox pod, mounted writable: a channel between sessions.
//!
//! Every session a pool runs mounts the template's volumes. One that outlives the pod (a
//! PersistentVolumeClaim, a hostPath, NFS, CSI…) and is writable is shared by all of them: an
//! agent could leave its answer there for a later sample of the same task (a GRPO group's
//! samples run at once, and a task comes back every epoch and in held-out rounds), and the
//! agent's code that the evaluator runs, with the hidden tests in place, could copy them there
//! for the next agent. Policy-gradient training rewards whatever finds such a file, so the
//! template is refused unless it mounts them read-only or says it means it.

use k8s_openapi::api::core::v1::Volume;

use crate::common::{SandboxTemplate, SharedWritableVolumes};
use crate::field_error::FieldError;

/// The template's mounts of volumes that outlive the pod, writable, unless the template allows
/// them. `field` is the template's path (`spec.template`, `spec.poolTemplate`).
pub fn shared_writable_mounts(template: &SandboxTemplate, field: &str) -> Vec<FieldError> {
    if template.shared_writable_volumes == SharedWritableVolumes::Allow {
        return Vec::new();
    }
    template
        .volume_mounts
        .iter()
        .enumerate()
        .filter(|(_, mount)| mount.read_only != Some(true))
        .filter_map(|(i, mount)| {
            let volume = template.volumes.iter().find(|v| v.name == mount.name)?;
            let kind = outlives_the_pod(volume)?;
            Some(FieldError {
                field: format!("{field}.volumeMounts[{i}]"),
                message: format!(
                    "volume {:?} ({kind}) outlives the pod and is mounted writable at {:?}, so \
                     every session of the pool shares it: an agent could leave an answer there \
                     for a later sample of its task, and the code the evaluator runs could copy \
                     the hidden tests there; mount it `readOnly: true`, or set \
                     `{field}.sharedWritableVolumes: Allow`",
                    volume.name, mount.mount_path
                ),
            })
        })
        .collect()
}

/// The volume's kind when its contents outlive the pod and the volume itself does not make
/// them read-only; `None` for the kinds made for the pod (emptyDir, a generic ephemeral claim,
/// a gitRepo clone, an image) and those the kubelet always mounts read-only (ConfigMap, Secret,
/// downward API, projected).
fn outlives_the_pod(v: &Volume) -> Option<&'static str> {
    let per_pod = v.empty_dir.is_some()
        || v.ephemeral.is_some()
        || v.git_repo.is_some()
        || v.image.is_some()
        || v.config_map.is_some()
        || v.secret.is_some()
        || v.downward_api.is_some()
        || v.projected.is_some();
    if per_pod {
        return None;
    }
    if let Some(claim) = &v.persistent_volume_claim {
        return (claim.read_only != Some(true)).then_some("persistentVolumeClaim");
    }
    if let Some(csi) = &v.csi {
        return (csi.read_only != Some(true)).then_some("csi");
    }
    if let Some(nfs) = &v.nfs {
        return (nfs.read_only != Some(true)).then_some("nfs");
    }
    Some(if v.host_path.is_some() {
        "hostPath"
    } else {
        "a volume that outlives the pod"
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(volumes: serde_json::Value, mounts: serde_json::Value) -> SandboxTemplate {
        serde_json::from_value(serde_json::json!({
            "image": "sandbox:1", "volumes": volumes, "volumeMounts": mounts,
        }))
        .expect("a valid template")
    }

    #[test]
    fn a_writable_claim_host_path_or_nfs_is_refused_with_the_way_out() {
        let t = template(
            serde_json::json!([
                {"name": "cache", "persistentVolumeClaim": {"claimName": "pip"}},
                {"name": "host", "hostPath": {"path": "/srv"}},
                {"name": "share", "nfs": {"server": "nfs", "path": "/x"}},
                {"name": "driver", "csi": {"driver": "x.csi"}},
            ]),
            serde_json::json!([
                {"name": "cache", "mountPath": "/root/.cache/pip"},
                {"name": "host", "mountPath": "/srv", "readOnly": false},
                {"name": "share", "mountPath": "/share"},
                {"name": "driver", "mountPath": "/d"},
            ]),
        );
        let errors = shared_writable_mounts(&t, "spec.template");
        let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [0, 1, 2, 3].map(|i| format!("spec.template.volumeMounts[{i}]"))
        );
        assert!(errors[0].message.starts_with(
            "volume \"cache\" (persistentVolumeClaim) outlives the pod and is mounted writable \
             at \"/root/.cache/pip\""
        ));
        assert!(errors[1].message.contains("(hostPath)"));
        assert!(errors[0]
            .message
            .ends_with("or set `spec.template.sharedWritableVolumes: Allow`"));
    }

    #[test]
    fn read_only_mounts_read_only_sources_and_per_pod_volumes_pass() {
        let t = template(
            serde_json::json!([
                {"name": "cache", "persistentVolumeClaim": {"claimName": "pip"}},
                {"name": "models", "persistentVolumeClaim": {"claimName": "m", "readOnly": true}},
                {"name": "share", "nfs": {"server": "nfs", "path": "/x", "readOnly": true}},
                {"name": "scratch", "emptyDir": {}},
                {"name": "tasks", "configMap": {"name": "tasks"}},
                {"name": "eph", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
            ]),
            serde_json::json!([
                {"name": "cache", "mountPath": "/c", "readOnly": true},
                {"name": "models", "mountPath": "/models"},
                {"name": "share", "mountPath": "/share"},
                {"name": "scratch", "mountPath": "/scratch"},
                {"name": "tasks", "mountPath": "/tasks"},
                {"name": "eph", "mountPath": "/eph"},
                {"name": "not-a-template-volume", "mountPath": "/x"},
            ]),
        );
        assert_eq!(shared_writable_mounts(&t, "spec.template"), []);
    }

    #[test]
    fn allow_lets_the_template_share_a_writable_volume() {
        let mut t = template(
            serde_json::json!([{"name": "host", "hostPath": {"path": "/srv"}}]),
            serde_json::json!([{"name": "host", "mountPath": "/srv"}]),
        );
        assert_eq!(shared_writable_mounts(&t, "spec.poolTemplate").len(), 1);
        t.shared_writable_volumes = SharedWritableVolumes::Allow;
        assert_eq!(shared_writable_mounts(&t, "spec.poolTemplate"), []);
    }
}
