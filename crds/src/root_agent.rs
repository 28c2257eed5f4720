//! A template's security context may not run the agent as root.
//!
//! The kubelet mounts one `/etc/hosts` into every container of a pod (and the runtime one
//! `/etc/resolv.conf`), writable and root's. The gateway beside the agent resolves the job's
//! trainer and policy server by name and shows them the job's token: an agent running as root
//! could point those names at a server of its own, answer its own model calls (token ids and
//! log-probs of its choosing, captured as the policy's) and read the token that posts
//! trajectories. So a template that makes the agent root (`runAsUser: 0`, or
//! `runAsNonRoot: false`, which lets an image that declares root run as root) is refused.

use crate::common::SandboxTemplate;
use crate::field_error::FieldError;

/// Why the template's security context would run the agent as root, if it would. `field` is
/// the template's path (`spec.template`, `spec.poolTemplate`).
pub fn root_agent(template: &SandboxTemplate, field: &str) -> Vec<FieldError> {
    let Some(context) = &template.security_context else {
        return Vec::new();
    };
    let why = |key: &str, what: &str| FieldError {
        field: format!("{field}.securityContext.{key}"),
        message: format!(
            "{what} would run the agent as root, which could rewrite the pod's shared \
             /etc/hosts and send its gateway's model calls (and the job's token) to a server \
             of its own; run the template as a user other than root"
        ),
    };
    let mut errors = Vec::new();
    if context.run_as_user == Some(0) {
        errors.push(why("runAsUser", "runAsUser: 0"));
    }
    if context.run_as_non_root == Some(false) {
        errors.push(why(
            "runAsNonRoot",
            "runAsNonRoot: false (an image that declares root runs as root)",
        ));
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(context: serde_json::Value) -> SandboxTemplate {
        serde_json::from_value(serde_json::json!({"image": "agent:1", "securityContext": context}))
            .expect("template")
    }

    #[test]
    fn a_template_that_runs_the_agent_as_root_is_refused() {
        let fields = |context| -> Vec<String> {
            root_agent(&template(context), "spec.template")
                .into_iter()
                .map(|e| e.field)
                .collect()
        };
        assert_eq!(
            fields(serde_json::json!({"runAsUser": 0})),
            ["spec.template.securityContext.runAsUser"]
        );
        assert_eq!(
            fields(serde_json::json!({"runAsNonRoot": false, "runAsUser": 1000})),
            ["spec.template.securityContext.runAsNonRoot"]
        );
        assert!(fields(serde_json::json!({"runAsUser": 1000, "runAsNonRoot": true})).is_empty());
        assert!(fields(serde_json::json!({"readOnlyRootFilesystem": true})).is_empty());
        let unset: SandboxTemplate =
            serde_json::from_value(serde_json::json!({"image": "agent:1"})).expect("template");
        assert!(root_agent(&unset, "spec.template").is_empty());
    }
}
