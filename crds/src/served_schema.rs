//! The CRD a cluster serves, against the one this code was built with: the apiserver prunes
//! the fields it lacks from every object it stores or serves, silently, so the operator must
//! know them ([`fields_it_lacks`]).

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::Value;

/// The fields of floe's `kind` that the served CRD's schema (its `v1alpha1`) does not have,
/// as paths such as `spec.evaluator.reward.failureReward` (an object it lacks whole is named
/// once, not its fields). A part of the served schema that keeps unknown fields
/// (`x-kubernetes-preserve-unknown-fields`) prunes nothing below it. A served CRD without
/// `v1alpha1` lacks everything: `["v1alpha1"]`.
pub fn fields_it_lacks(kind: &str, served: &CustomResourceDefinition) -> Vec<String> {
    let Some(theirs) = served
        .spec
        .versions
        .iter()
        .find(|v| v.name == crate::VERSION)
        .and_then(|v| v.schema.as_ref())
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .and_then(|s| serde_json::to_value(s).ok())
    else {
        return vec![crate::VERSION.to_string()];
    };
    let ours = crate::validation::schema_of(kind).unwrap_or_default();
    // From the root, which may keep unknown fields itself, down `spec` and `status` only.
    let parts = serde_json::json!({"properties": {
        "spec": ours["properties"]["spec"], "status": ours["properties"]["status"]}});
    let mut lacking = Vec::new();
    lacks(&parts, &theirs, "", &mut lacking);
    lacking
}

/// [`fields_it_lacks`]'s walk: what `ours` has below `path` that `theirs` does not.
fn lacks(ours: &Value, theirs: &Value, path: &str, out: &mut Vec<String>) {
    if ours.is_null() {
        return;
    }
    if theirs.is_null() {
        out.push(path.to_string());
        return;
    }
    // Pruning keeps what a map (`additionalProperties`) holds; floe's maps all hold strings,
    // so what is below one is not compared.
    if !theirs["additionalProperties"].is_null() && theirs["properties"].is_null() {
        return;
    }
    // A part that keeps unknown fields keeps a field it does not list whole, and prunes
    // inside those it lists as their schemas say.
    let keeps_unknown = theirs["x-kubernetes-preserve-unknown-fields"] == true;
    let below = |name: &str| match path {
        "" => name.to_string(),
        _ => format!("{path}.{name}"),
    };
    if let Some(fields) = ours["properties"].as_object() {
        for (name, schema) in fields {
            let their_field = &theirs["properties"][name];
            if !(keeps_unknown && their_field.is_null()) {
                lacks(schema, their_field, &below(name), out);
            }
        }
    }
    if keeps_unknown {
        return;
    }
    if ours["items"].is_object() {
        lacks(&ours["items"], &theirs["items"], &format!("{path}[]"), out);
    }
    if ours["additionalProperties"].is_object() {
        lacks(
            &ours["additionalProperties"],
            &theirs["additionalProperties"],
            &below("*"),
            out,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::{crds, Target};

    fn served(kind: &str, target: Target) -> CustomResourceDefinition {
        crds(target)
            .expect("crds")
            .into_iter()
            .find(|c| c.spec.names.kind == kind)
            .expect("the kind")
    }

    fn edited(kind: &str, edit: impl FnOnce(&mut Value)) -> CustomResourceDefinition {
        let mut v = serde_json::to_value(served(kind, Target::LATEST)).expect("json");
        edit(&mut v["spec"]["versions"][0]["schema"]["openAPIV3Schema"]);
        serde_json::from_value(v).expect("a CRD")
    }

    /// Either rendering this code makes (with CEL rules, or without for apiservers before
    /// 1.25) serves every field: an up-to-date cluster is never reported.
    #[test]
    fn the_crds_this_code_renders_lack_nothing() {
        for kind in ["GatewayPool", "RolloutJob"] {
            for target in [Target::LATEST, Target { cel: false }] {
                assert_eq!(
                    fields_it_lacks(kind, &served(kind, target)),
                    Vec::<String>::new()
                );
            }
        }
    }

    #[test]
    fn an_older_crd_is_named_by_the_fields_it_lacks() {
        let crd = edited("RolloutJob", |s| {
            let reward = &mut s["properties"]["spec"]["properties"]["evaluator"]["properties"]
                ["reward"]["properties"];
            reward
                .as_object_mut()
                .expect("reward's fields")
                .remove("failureReward");
            s["properties"]["status"]["properties"]
                .as_object_mut()
                .expect("status fields")
                .remove("heldOut");
        });
        assert_eq!(
            fields_it_lacks("RolloutJob", &crd),
            ["spec.evaluator.reward.failureReward", "status.heldOut"]
        );
        // Inside a list's items, and a map's values.
        let crd = edited("RolloutJob", |s| {
            let task = &mut s["properties"]["spec"]["properties"]["tasks"]["properties"]["inline"]
                ["items"]["properties"];
            task.as_object_mut().expect("a task").remove("instruction");
        });
        assert_eq!(
            fields_it_lacks("RolloutJob", &crd),
            ["spec.tasks.inline[].instruction"]
        );
    }

    #[test]
    fn a_crd_that_keeps_unknown_fields_or_a_map_or_lacks_the_version_is_read_as_such() {
        let open = edited("GatewayPool", |s| {
            let spec = &mut s["properties"]["spec"];
            spec["x-kubernetes-preserve-unknown-fields"] = true.into();
            spec["properties"] = serde_json::json!({});
        });
        assert_eq!(fields_it_lacks("GatewayPool", &open), Vec::<String>::new());
        // Keeping unknown fields, it still prunes inside those it lists.
        let listed = edited("GatewayPool", |s| {
            let spec = &mut s["properties"]["spec"];
            spec["x-kubernetes-preserve-unknown-fields"] = true.into();
            let egress = &mut spec["properties"]["egress"]["properties"];
            egress
                .as_object_mut()
                .expect("egress")
                .remove("unrestricted");
            spec["properties"]
                .as_object_mut()
                .expect("spec's fields")
                .remove("template");
        });
        assert_eq!(
            fields_it_lacks("GatewayPool", &listed),
            ["spec.egress.unrestricted"]
        );
        // And at the root, with nothing listed: nothing is pruned.
        let root = edited("GatewayPool", |s| {
            *s =
                serde_json::json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
        });
        assert_eq!(fields_it_lacks("GatewayPool", &root), Vec::<String>::new());
        let a_map = edited("GatewayPool", |s| {
            let spec = &mut s["properties"]["spec"];
            spec["additionalProperties"] = serde_json::json!({"type": "string"});
            spec.as_object_mut().expect("spec").remove("properties");
        });
        assert_eq!(fields_it_lacks("GatewayPool", &a_map), Vec::<String>::new());
        let mut other = served("GatewayPool", Target::LATEST);
        other.spec.versions[0].name = "v1beta1".into();
        assert_eq!(fields_it_lacks("GatewayPool", &other), ["v1alpha1"]);
    }
}
