//! Semantic validation that the OpenAPI schema alone cannot express.
//!
//! The rules are written once, as CEL `x-kubernetes-validations` in the schema (see the
//! `#[x_kube(validation = ...)]` attributes). Modern apiservers enforce them on admission; this
//! module evaluates the *same* rules client-side (kube's `cel` feature), so the operator on a
//! cluster without CRD CEL support (< 1.25) and `floe run` in local mode report the same
//! messages for the same mistakes.

use std::collections::{BTreeMap, BTreeSet};

pub use crate::field_error::FieldError;
use crate::root_agent::root_agent;
use crate::shared_volumes::shared_writable_mounts;
use crate::{GatewayPool, RolloutJob, Task};

/// Every problem found in one object.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", join(.errors))]
pub struct ValidationError {
    pub errors: Vec<FieldError>,
}

fn join(errors: &[FieldError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

fn into_result(errors: Vec<FieldError>) -> Result<(), ValidationError> {
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ValidationError { errors })
    }
}

fn cel_errors(result: Result<(), kube::core::cel::ValidationErrors>) -> Vec<FieldError> {
    match result {
        Ok(()) => Vec::new(),
        Err(errors) => errors
            .iter()
            .map(|e| FieldError {
                field: e.field_path.clone(),
                message: e.message.clone(),
            })
            .collect(),
    }
}

/// Validate a RolloutJob as the apiserver would on create, and refuse the fields it pruned.
pub fn validate_rollout_job(job: &RolloutJob) -> Result<(), ValidationError> {
    let mut errors = cel_errors(job.validate_cel());
    errors.extend(inline_duplicates(job));
    if let Some(template) = &job.spec.pool_template {
        errors.extend(shared_writable_mounts(template, "spec.poolTemplate"));
        errors.extend(root_agent(template, "spec.poolTemplate"));
    }
    errors.extend(pruned_fields(
        "RolloutJob",
        job.metadata.annotations.as_ref(),
    ));
    into_result(errors)
}

/// The annotation client-side `kubectl apply` (and Argo CD) writes: the object as it was last
/// applied, before the apiserver pruned what its schema does not know.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Fields the user applied that the CRD's schema does not know. An apiserver prunes them
/// silently (those before 1.25 have no strict field validation; later ones only when the client
/// asks), so the object no longer shows them and a misspelled `agentSecond` would run with the
/// default: they are read back from `kubectl apply`'s annotation. Objects created otherwise
/// carry none, and pass.
pub fn pruned_fields(
    kind: &str,
    annotations: Option<&BTreeMap<String, String>>,
) -> Vec<FieldError> {
    let Some(applied) = annotations.and_then(|a| a.get(LAST_APPLIED)) else {
        return Vec::new();
    };
    let Ok(document) = serde_json::from_str::<serde_json::Value>(applied) else {
        return Vec::new();
    };
    let Ok(schema) = schema_of(kind) else {
        return Vec::new();
    };
    let mut errors = Vec::new();
    unknown_fields(&schema, &document, "", &mut errors);
    for e in &mut errors {
        e.message = format!(
            "{}: the apiserver dropped it, so it has no effect; fix the manifest",
            e.message
        );
    }
    errors
}

/// Fields the user applied under `spec` that the object as the apiserver stored it lost: a
/// CRD on the cluster older than this code pruned them, so a job that sets `failureReward`
/// would run with the default, silently. `meta` and `spec` are the stored object's, read raw
/// (a typed object fills defaults in). Read back from `kubectl apply`'s annotation, as
/// [`pruned_fields`] does for fields no CRD knows (call that first: this one reports any
/// applied field lost, known or not). A field is lost when the stored object lacks it (the
/// older CRD is still there), or when the new CRD, installed since, fills its default in as
/// the object is read: it then holds the schema's default where another value was applied,
/// and no writer owns it (`managedFields`; a field pruned at its write was never recorded).
/// A value a writer changed since — Kueue resuming a job with `suspend: false`, a scale — is
/// owned by that writer, and kept. Objects created otherwise carry no record, and pass.
pub fn dropped_by_an_older_crd(
    kind: &str,
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    spec: &serde_json::Value,
) -> Vec<String> {
    let Some(applied) = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(LAST_APPLIED))
        .and_then(|a| serde_json::from_str::<serde_json::Value>(a).ok())
    else {
        return Vec::new();
    };
    let owned: Vec<&serde_json::Value> = meta
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|m| m.fields_v1.as_ref())
        .map(|f| &f.0)
        .collect();
    let walk = LostFields {
        // Without any record of who wrote what, a default cannot be told from a value set to
        // it: only a missing field counts.
        owned: (!owned.is_empty()).then_some(owned.as_slice()),
    };
    let schema = schema_of(kind).unwrap_or_default();
    let mut dropped = Vec::new();
    walk.compare(
        &applied["spec"],
        spec,
        &schema["properties"]["spec"],
        &[Step::Field("spec".into())],
        &mut dropped,
    );
    // In field-name order, whatever order the manifest wrote them in.
    dropped.sort();
    dropped
}

/// [`dropped_by_an_older_crd`]'s walk of the applied spec beside the stored one.
struct LostFields<'a> {
    /// Each writer's `fieldsV1`, if the object has any.
    owned: Option<&'a [&'a serde_json::Value]>,
}

/// One step down an object, as `managedFields` names it.
#[derive(Clone)]
enum Step {
    /// A field or a map's key: `f:<name>`.
    Field(String),
    /// An item of a list keyed by some of its fields (`x-kubernetes-list-type: map`):
    /// `k:{"id":"t1"}`; at `index` in the list.
    Keyed { key: String, index: usize },
    /// An item of any other list: the list is recorded whole, as one field.
    Index(usize),
}

impl LostFields<'_> {
    /// The fields of `applied` (non-null) that `kept` does not have, or has at the `schema`'s
    /// default instead of the value applied, no writer owning them. `path`: the steps down
    /// to `applied`.
    fn compare(
        &self,
        applied: &serde_json::Value,
        kept: &serde_json::Value,
        schema: &serde_json::Value,
        path: &[Step],
        out: &mut Vec<String>,
    ) {
        use serde_json::Value;
        let below = |step: Step| [path, &[step]].concat();
        match (applied, kept) {
            (Value::Object(fields), Value::Object(kept_fields)) => {
                for (key, value) in fields.iter().filter(|(_, v)| !v.is_null()) {
                    let field_schema = schema["properties"]
                        .get(key)
                        .or_else(|| schema.get("additionalProperties"))
                        .unwrap_or(&Value::Null);
                    let path = below(Step::Field(key.clone()));
                    match kept_fields.get(key) {
                        Some(k) => self.compare(value, k, field_schema, &path, out),
                        None => out.push(field_at(&path)),
                    }
                }
            }
            (Value::Array(items), Value::Array(kept_items)) if items.len() == kept_items.len() => {
                for (index, (item, k)) in items.iter().zip(kept_items).enumerate() {
                    let step = list_key(schema, item)
                        .map_or(Step::Index(index), |key| Step::Keyed { key, index });
                    self.compare(item, k, &schema["items"], &below(step), out);
                }
            }
            _ => {
                let defaulted = schema
                    .get("default")
                    .is_some_and(|d| same_value(kept, d) && !same_value(applied, d));
                if defaulted && self.owned.is_some_and(|owned| !owned_by_any(owned, path)) {
                    out.push(field_at(path));
                }
            }
        }
    }
}

/// How `managedFields` names `item` of a list keyed by some of its fields (`schema`'s
/// `x-kubernetes-list-map-keys`): `k:` and those fields as compact JSON, in name order.
fn list_key(schema: &serde_json::Value, item: &serde_json::Value) -> Option<String> {
    if schema["x-kubernetes-list-type"] != "map" {
        return None;
    }
    let mut names: Vec<&str> = schema["x-kubernetes-list-map-keys"]
        .as_array()?
        .iter()
        .filter_map(|k| k.as_str())
        .collect();
    names.sort_unstable();
    let mut key = serde_json::Map::new();
    for name in names {
        key.insert(name.to_string(), item.get(name)?.clone());
    }
    Some(format!("k:{}", serde_json::Value::Object(key)))
}

/// `spec.tasks.inline[0].metadata` for the steps `spec`, `tasks`, `inline`, item 0, `metadata`.
fn field_at(path: &[Step]) -> String {
    let mut out = String::new();
    for step in path {
        match step {
            Step::Field(name) if out.is_empty() => out.push_str(name),
            Step::Field(name) => out.push_str(&format!(".{name}")),
            Step::Keyed { index, .. } | Step::Index(index) => out.push_str(&format!("[{index}]")),
        }
    }
    out
}

/// Whether a writer's `fieldsV1` records the field at `path`. An item of a list that is not
/// keyed is recorded as part of the list, which then counts.
fn owned_by_any(owned: &[&serde_json::Value], path: &[Step]) -> bool {
    owned.iter().any(|fields| {
        let mut at = *fields;
        for step in path {
            let name = match step {
                Step::Field(name) => format!("f:{name}"),
                Step::Keyed { key, .. } => key.clone(),
                Step::Index(_) => return true,
            };
            match at.get(name) {
                Some(below) => at = below,
                None => return false,
            }
        }
        true
    })
}

/// JSON equality with numbers by value (`1` and `1.0` are one number to the apiserver).
fn same_value(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// The OpenAPI schema of one of floe's kinds, as the CRD carries it.
pub(crate) fn schema_of(kind: &str) -> Result<serde_json::Value, FieldError> {
    // With every default: a list item's, which the served schema leaves to serde, is what an
    // older CRD's apiserver filled in for a field it pruned.
    let crds = crate::generate::crds_documented().map_err(|e| FieldError {
        field: String::new(),
        message: format!("cannot build the CRD schema: {e}"),
    })?;
    Ok(crds
        .iter()
        .find(|c| c.spec.names.kind == kind)
        .and_then(|c| c.spec.versions.first())
        .and_then(|v| v.schema.as_ref())
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .and_then(|s| serde_json::to_value(s).ok())
        .unwrap_or_default())
}

/// Task ids written twice in the job's inline tasks or its inline held-out tasks (a list-map
/// key the apiserver before 1.25 does not check).
fn inline_duplicates(job: &RolloutJob) -> Vec<FieldError> {
    let held_out = job.spec.train.as_ref().and_then(|t| t.held_out.as_ref());
    [
        (job.spec.tasks.inline.as_ref(), "spec.tasks.inline"),
        (
            held_out.and_then(|h| h.tasks.inline.as_ref()),
            "spec.train.heldOut.tasks.inline",
        ),
    ]
    .into_iter()
    .filter_map(|(tasks, field)| Some(duplicate_task_ids(tasks?, field)))
    .flatten()
    .collect()
}

/// Validate an update of a RolloutJob (transition rules such as immutability after start).
pub fn validate_rollout_job_update(
    job: &RolloutJob,
    old: &RolloutJob,
) -> Result<(), ValidationError> {
    let mut errors = cel_errors(job.validate_cel_update(old));
    errors.extend(inline_duplicates(job));
    into_result(errors)
}

/// Validate a GatewayPool as the apiserver would on create, and refuse the fields it pruned
/// (a misspelled `egress.unrestricted` would leave the pods only warning of open egress).
pub fn validate_gateway_pool(pool: &GatewayPool) -> Result<(), ValidationError> {
    let mut errors = cel_errors(pool.validate_cel());
    // Its pods carry its name as a label value, which holds 63 characters at most.
    let name = pool.metadata.name.as_deref().unwrap_or_default();
    if name.len() > POOL_NAME_MAX {
        errors.push(FieldError {
            field: "metadata.name".into(),
            message: format!(
                "a GatewayPool's name is at most {POOL_NAME_MAX} characters (its pods carry it \
                 as a label value); this one has {}",
                name.len()
            ),
        });
    }
    errors.extend(shared_writable_mounts(&pool.spec.template, "spec.template"));
    errors.extend(root_agent(&pool.spec.template, "spec.template"));
    errors.extend(pruned_fields(
        "GatewayPool",
        pool.metadata.annotations.as_ref(),
    ));
    into_result(errors)
}

const POOL_NAME_MAX: usize = 63;

/// Task ids key the GRPO groups, so they must be unique. For inline tasks the apiserver enforces
/// this through `x-kubernetes-list-type: map`; tasks from a ConfigMap or file are checked here.
pub fn duplicate_task_ids(tasks: &[Task], field: &str) -> Vec<FieldError> {
    let mut seen = BTreeSet::new();
    tasks
        .iter()
        .enumerate()
        .filter(|(_, t)| !seen.insert(t.id.as_str()))
        .map(|(i, t)| FieldError {
            field: format!("{field}[{i}].id"),
            message: format!("duplicate task id {:?}", t.id),
        })
        .collect()
}

/// A held-out set must hold a task: a round of none would never open, and the job's own
/// sessions wait for the first round (an empty file or ConfigMap, which no schema refuses).
pub fn empty_held_out_set(tasks: &[Task], field: &str) -> Vec<FieldError> {
    if !tasks.is_empty() {
        return Vec::new();
    }
    vec![FieldError {
        field: field.to_string(),
        message: "holds no task: held-out rounds need at least one".into(),
    }]
}

/// Validate a RolloutJob document (parsed YAML or JSON) the way the apiserver would on create:
/// the CRD's OpenAPI schema (types, enums, ranges, patterns, required fields), then defaults
/// and the CEL rules. For `floe run`, which has no apiserver in front of it.
pub fn parse_rollout_job(document: &serde_json::Value) -> Result<RolloutJob, ValidationError> {
    let schema = schema_of("RolloutJob").map_err(|e| ValidationError { errors: vec![e] })?;
    let mut errors = Vec::new();
    for (key, want) in [("apiVersion", "floe.dev/v1alpha1"), ("kind", "RolloutJob")] {
        if document[key] != want {
            errors.push(FieldError {
                field: key.into(),
                message: format!("must be {want:?}"),
            });
        }
    }
    schema_errors(&schema, document, &mut errors);
    if !errors.is_empty() {
        return Err(ValidationError { errors });
    }
    let job: RolloutJob =
        serde_json::from_value(document.clone()).map_err(|e| ValidationError {
            errors: vec![FieldError {
                field: String::new(),
                message: e.to_string(),
            }],
        })?;
    validate_rollout_job(&job)?;
    Ok(job)
}

/// `document` against `schema`, as the apiserver checks it (types, enums, ranges, patterns,
/// required fields) and, strict like `kubectl --validate=strict`, every field the schema does
/// not know: an apiserver would prune a misspelled field silently, and the object would run
/// with the default in its place.
fn schema_errors(
    schema: &serde_json::Value,
    document: &serde_json::Value,
    errors: &mut Vec<FieldError>,
) {
    if let Ok(validator) = jsonschema::validator_for(schema) {
        compiled_errors(&validator, document, errors);
    }
    unknown_fields(schema, document, "", errors);
}

/// What a compiled schema says of `document`, in the apiserver's terms.
fn compiled_errors(
    validator: &jsonschema::Validator,
    document: &serde_json::Value,
    errors: &mut Vec<FieldError>,
) {
    for e in validator.iter_errors(document) {
        let path = e.instance_path().to_string();
        // The library names two options and counts the rest; a user needs them all.
        let message = match e.kind() {
            jsonschema::error::ValidationErrorKind::Enum { options } => format!(
                "{} is not one of {}",
                e.instance(),
                options
                    .as_array()
                    .map(|o| o
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", "))
                    .unwrap_or_else(|| options.to_string())
            ),
            _ => e.to_string(),
        };
        errors.push(FieldError {
            field: pointer_to_field(&path),
            message,
        });
    }
}

/// One task as a task file's line gives it: checked against the schema of
/// `spec.tasks.inline[]`, as strictly as a task written in the job itself (a misspelled
/// `evaluation` would otherwise run the task without its hidden tests). Fields are named from
/// the task, e.g. `evaluation.hiddenFile`.
pub fn task_errors(task: &serde_json::Value) -> Vec<FieldError> {
    type Compiled = (serde_json::Value, jsonschema::Validator);
    // Compiled once: a task file of thousands of lines, read again on every reconcile.
    static TASK_SCHEMA: std::sync::OnceLock<Result<Compiled, FieldError>> =
        std::sync::OnceLock::new();
    let compiled = TASK_SCHEMA.get_or_init(|| {
        let no_schema = |message: String| FieldError {
            field: String::new(),
            message,
        };
        let job = schema_of("RolloutJob")?;
        let task =
            &job["properties"]["spec"]["properties"]["tasks"]["properties"]["inline"]["items"];
        if !task.is_object() {
            return Err(no_schema(
                "the RolloutJob schema has no spec.tasks.inline[] to check a task against".into(),
            ));
        }
        let validator = jsonschema::validator_for(task)
            .map_err(|e| no_schema(format!("cannot compile the task schema: {e}")))?;
        Ok((task.clone(), validator))
    });
    // `null` is a field left out, as serde and the apiserver read it (the schema's `nullable`
    // is OpenAPI's, which the validator does not know).
    let task = without_nulls(task);
    let mut errors = Vec::new();
    match compiled {
        Ok((schema, validator)) => {
            compiled_errors(validator, &task, &mut errors);
            unknown_fields(schema, &task, "", &mut errors);
        }
        Err(e) => errors.push(e.clone()),
    }
    errors
}

fn without_nulls(value: &serde_json::Value) -> serde_json::Value {
    match value {
        serde_json::Value::Object(fields) => serde_json::Value::Object(
            fields
                .iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), without_nulls(v)))
                .collect(),
        ),
        serde_json::Value::Array(items) => {
            serde_json::Value::Array(items.iter().map(without_nulls).collect())
        }
        other => other.clone(),
    }
}

/// Fields of `document` that its structural `schema` does not know, each with its path and the
/// closest known name. Objects that keep unknown fields (`x-kubernetes-preserve-unknown-fields`)
/// or are maps (`additionalProperties`) accept any key.
fn unknown_fields(
    schema: &serde_json::Value,
    document: &serde_json::Value,
    pointer: &str,
    errors: &mut Vec<FieldError>,
) {
    match document {
        serde_json::Value::Object(fields) => {
            let properties = schema["properties"].as_object();
            let open = schema["x-kubernetes-preserve-unknown-fields"] == true;
            let map_values = schema.get("additionalProperties").filter(|v| v.is_object());
            for (key, value) in fields {
                let path = format!("{pointer}/{}", key.replace('~', "~0").replace('/', "~1"));
                // Every object has these; the CRD's schema does not list them.
                let object_field = pointer.is_empty()
                    && ["apiVersion", "kind", "metadata"].contains(&key.as_str());
                if object_field {
                    continue;
                }
                if let Some(known) = properties.and_then(|p| p.get(key)) {
                    unknown_fields(known, value, &path, errors);
                } else if let Some(values) = map_values {
                    unknown_fields(values, value, &path, errors);
                } else if let Some(known) = properties.filter(|_| !open) {
                    let hint = closest(key, known.keys())
                        .map(|k| format!(" (did you mean `{k}`?)"))
                        .unwrap_or_default();
                    errors.push(FieldError {
                        field: pointer_to_field(&path),
                        message: format!("unknown field{hint}"),
                    });
                }
            }
        }
        serde_json::Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    unknown_fields(item_schema, item, &format!("{pointer}/{i}"), errors);
                }
            }
        }
        _ => {}
    }
}

/// The known name nearest to a misspelling (at most a third of its letters off).
fn closest<'a>(key: &str, known: impl Iterator<Item = &'a String>) -> Option<&'a String> {
    let lower = key.to_ascii_lowercase();
    known
        .map(|k| (edit_distance(&lower, &k.to_ascii_lowercase()), k))
        .filter(|(d, k)| *d <= k.len().max(3) / 3)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

/// `/spec/tasks/inline/3/id` → `spec.tasks.inline[3].id`.
fn pointer_to_field(pointer: &str) -> String {
    let mut out = String::new();
    for part in pointer.split('/').filter(|p| !p.is_empty()) {
        if part.chars().all(|c| c.is_ascii_digit()) {
            out.push_str(&format!("[{part}]"));
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(&part.replace("~1", "/").replace("~0", "~"));
        }
    }
    out
}

#[cfg(test)]
mod document_tests {
    use super::*;

    fn job(spec: serde_json::Value) -> serde_json::Value {
        serde_json::json!({"apiVersion": "floe.dev/v1alpha1", "kind": "RolloutJob",
            "metadata": {"name": "j"}, "spec": spec})
    }

    fn valid_spec() -> serde_json::Value {
        serde_json::json!({
            "tasks": {"inline": [{"id": "t1", "instruction": "do it"}]},
            "numSamples": 2,
            "harness": {"preset": "pi"},
            "evaluator": {"command": ["true"]},
            "poolRef": {"name": "pool"},
            "sft": {"upstream": {"url": "http://127.0.0.1:8000"}, "output": {"claimName": "data"}},
        })
    }

    #[test]
    fn a_valid_document_parses_with_defaults() {
        let parsed = parse_rollout_job(&job(valid_spec())).expect("valid");
        assert_eq!(parsed.spec.num_samples, 2);
        assert_eq!(parsed.spec.evaluator.reward.pass_threshold, 1.0);
    }

    #[test]
    fn schema_errors_name_the_field() {
        let mut spec = valid_spec();
        spec["numSamples"] = serde_json::json!(0);
        spec["tasks"]["inline"][0]["id"] = serde_json::json!("bad id!");
        spec["harness"]["preset"] = serde_json::json!("vim");
        let err = parse_rollout_job(&job(spec)).expect_err("invalid");
        let fields: Vec<&str> = err.errors.iter().map(|e| e.field.as_str()).collect();
        assert!(fields.contains(&"spec.numSamples"), "{err}");
        assert!(fields.contains(&"spec.tasks.inline[0].id"), "{err}");
        assert!(fields.contains(&"spec.harness.preset"), "{err}");
    }

    /// A name Kubernetes takes but the job's Services cannot carry (a leading digit, a dot,
    /// 56 characters) failed only at the job's first Service; the same for a pool's name past
    /// a label value's 63 characters at its first pod.
    #[test]
    fn names_the_derived_objects_cannot_carry_are_refused() {
        for (name, ok) in [
            ("grpo-q4", true),
            (&"a".repeat(55), true),
            ("2026-q4-grpo", false),
            ("grpo.q4", false),
            ("grpo-", false),
            (&"a".repeat(56), false),
        ] {
            let mut doc = job(valid_spec());
            doc["metadata"]["name"] = name.into();
            let parsed = parse_rollout_job(&doc);
            match (ok, parsed) {
                (true, Ok(_)) => {}
                (false, Err(e)) => assert!(e.to_string().contains("metadata.name must"), "{e}"),
                (_, other) => panic!("{name}: {other:?}"),
            }
        }
        // A local job file may leave its name out (`floe run` calls it `local`).
        let mut nameless = job(valid_spec());
        nameless["metadata"] = serde_json::json!({});
        assert!(parse_rollout_job(&nameless).is_ok());
        let pool = |name: &str| -> GatewayPool {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "floe.dev/v1alpha1", "kind": "GatewayPool",
                "metadata": {"name": name},
                "spec": {"replicas": 1, "template": {"image": "agent:1"}}}))
            .expect("pool")
        };
        assert!(validate_gateway_pool(&pool(&"p".repeat(63))).is_ok());
        let err = validate_gateway_pool(&pool(&"p".repeat(64))).expect_err("too long");
        assert!(err.to_string().contains("at most 63"), "{err}");
    }

    /// A class the gateway could never record (it keeps only short lowercase words) is a
    /// typo the job would otherwise carry silently: every call trained.
    #[test]
    fn an_excluded_request_class_is_a_word_the_gateway_records() {
        let mut spec = valid_spec();
        spec["trajectory"] =
            serde_json::json!({"excludeRequestClasses": ["auxiliary", "side_reply"]});
        let parsed = parse_rollout_job(&job(spec.clone())).expect("valid");
        assert_eq!(
            parsed.spec.trajectory.exclude_request_classes,
            ["auxiliary", "side_reply"]
        );
        spec["trajectory"]["excludeRequestClasses"] = serde_json::json!(["Auxiliary"]);
        let err = parse_rollout_job(&job(spec)).expect_err("not a class the gateway records");
        let fields: Vec<&str> = err.errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            ["spec.trajectory.excludeRequestClasses[0]"],
            "{err}"
        );
    }

    /// A job's own pods share its template's volumes as a pool's do.
    #[test]
    fn a_jobs_pool_template_may_not_share_a_writable_volume_unless_it_says_so() {
        let mut spec = valid_spec();
        spec.as_object_mut().map(|s| s.remove("poolRef"));
        spec["poolTemplate"] = serde_json::json!({"image": "agent:1",
            "volumes": [{"name": "cache", "hostPath": {"path": "/srv/cache"}}],
            "volumeMounts": [{"name": "cache", "mountPath": "/cache"}]});
        let err = parse_rollout_job(&job(spec.clone())).expect_err("a shared writable volume");
        let fields: Vec<&str> = err.errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["spec.poolTemplate.volumeMounts[0]"], "{err}");
        spec["poolTemplate"]["sharedWritableVolumes"] = "Allow".into();
        parse_rollout_job(&job(spec)).expect("allowed");
    }

    #[test]
    fn cel_rules_apply_after_the_schema() {
        let mut spec = valid_spec();
        spec["train"] = serde_json::json!({"image": "x", "model": "m"});
        let err = parse_rollout_job(&job(spec)).expect_err("both train and sft");
        assert!(err.to_string().contains("exactly one of"), "{err}");
    }

    #[test]
    fn a_max_reward_below_the_pass_threshold_is_refused() {
        let mut spec = valid_spec();
        spec["evaluator"]["reward"] = serde_json::json!({"maxReward": 0.5});
        let err = parse_rollout_job(&job(spec.clone())).expect_err("no session could pass");
        assert!(
            err.to_string().contains("maxReward must be at least"),
            "{err}"
        );
        spec["evaluator"]["reward"] = serde_json::json!({"maxReward": 1.0});
        let parsed = parse_rollout_job(&job(spec)).expect("a scale to 1");
        assert_eq!(parsed.spec.evaluator.reward.max_reward, Some(1.0));
    }

    #[test]
    fn a_failure_reward_at_or_above_the_pass_threshold_is_refused() {
        let mut spec = valid_spec();
        spec["evaluator"]["reward"] = serde_json::json!({"failureReward": 1.0});
        let err = parse_rollout_job(&job(spec.clone())).expect_err("a failure that passes");
        assert!(
            err.to_string().contains("failureReward must be below"),
            "{err}"
        );
        spec["evaluator"]["reward"] = serde_json::json!({"failureReward": -1.0});
        let parsed = parse_rollout_job(&job(spec.clone())).expect("a scale from -1");
        assert_eq!(parsed.spec.evaluator.reward.failure_reward, -1.0);
        spec["evaluator"]["reward"] = serde_json::json!({"passThreshold": 0.0});
        let err = parse_rollout_job(&job(spec)).expect_err("the default 0 passing at 0");
        assert!(
            err.to_string().contains("failureReward must be below"),
            "{err}"
        );
    }

    #[test]
    fn an_overlong_buffer_fits_within_the_response_cap_its_default_included() {
        use crate::rollout_job::DEFAULT_MAX_RESPONSE_TOKENS as CAP;
        let mut spec = valid_spec();
        spec.as_object_mut().map(|s| s.remove("sft"));
        let train = |buffer: i32| {
            serde_json::json!({"image": "x", "model": "m",
                               "grpo": {"overlongPenalty": {"bufferTokens": buffer}}})
        };
        spec["train"] = train(CAP);
        let parsed = parse_rollout_job(&job(spec.clone())).expect("the whole default cap");
        let penalty = parsed
            .spec
            .train
            .and_then(|t| t.grpo.overlong_penalty)
            .expect("kept");
        assert_eq!((penalty.buffer_tokens, penalty.factor), (CAP, 1.0));
        spec["train"] = train(CAP + 1);
        let err = parse_rollout_job(&job(spec.clone())).expect_err("past the default cap");
        assert!(err.to_string().contains("bufferTokens is at most"), "{err}");
        spec["sampling"] = serde_json::json!({"maxResponseTokens": 512});
        spec["train"] = train(513);
        let err = parse_rollout_job(&job(spec.clone())).expect_err("past the job's cap");
        assert!(err.to_string().contains("bufferTokens is at most"), "{err}");
        spec["train"] = train(512);
        parse_rollout_job(&job(spec)).expect("within the job's cap");
    }

    #[test]
    fn a_train_job_refuses_greedy_sampling_and_an_sft_job_takes_it() {
        let mut spec = valid_spec();
        spec["sampling"] = serde_json::json!({"temperature": 0.0});
        parse_rollout_job(&job(spec.clone())).expect("an sft job samples as it likes");
        spec.as_object_mut().map(|s| s.remove("sft"));
        spec["train"] = serde_json::json!({"image": "x", "model": "m"});
        let err = parse_rollout_job(&job(spec.clone())).expect_err("greedy train job");
        assert!(
            err.to_string().contains("sampling.temperature > 0"),
            "{err}"
        );
        spec["sampling"] = serde_json::json!({"topP": 1.0, "temperature": 0.7});
        parse_rollout_job(&job(spec.clone())).expect("a tempered train job");
        // The trainer models the tempered full-vocabulary distribution: no nucleus.
        spec["sampling"] = serde_json::json!({"topP": 0.95, "temperature": 0.7});
        let err = parse_rollout_job(&job(spec.clone())).expect_err("top_p train job");
        assert!(err.to_string().contains("sampling.topP 1"), "{err}");
        // Nor an update clipped to nothing.
        spec["sampling"] = serde_json::json!({"temperature": 0.7});
        spec["train"]["grpo"] = serde_json::json!({"maxGradNorm": 0.0});
        let err = parse_rollout_job(&job(spec.clone())).expect_err("maxGradNorm 0");
        assert!(
            err.to_string().contains("grpo.maxGradNorm must be above 0"),
            "{err}"
        );
        spec["train"]["grpo"] = serde_json::json!({"maxGradNorm": 0.5});
        parse_rollout_job(&job(spec.clone())).expect("maxGradNorm 0.5");
        spec["train"]["grpo"] = serde_json::json!({"dualClip": 1.0});
        let err = parse_rollout_job(&job(spec.clone())).expect_err("dualClip 1");
        assert!(
            err.to_string().contains("grpo.dualClip must be above 1"),
            "{err}"
        );
        spec["train"]["grpo"] = serde_json::json!({"dualClip": 1.5});
        parse_rollout_job(&job(spec.clone())).expect("dualClip 1.5");
        // Nor an adapter scaled to nothing (it pushed a new version every step of the base).
        spec["train"]["lora"] = serde_json::json!({"alpha": 0.0});
        let err = parse_rollout_job(&job(spec.clone())).expect_err("lora alpha 0");
        assert!(
            err.to_string().contains("train.lora.alpha must be above 0"),
            "{err}"
        );
        spec["train"]["lora"] = serde_json::json!({"alpha": 8.0});
        parse_rollout_job(&job(spec)).expect("lora alpha 8");
    }

    #[test]
    fn a_lora_adapter_is_refused_where_the_trainer_cannot_train_one() {
        let mut spec = valid_spec();
        spec.as_object_mut().map(|s| s.remove("sft"));
        spec["train"] = serde_json::json!({"image": "x", "model": "m", "lora": {"rank": 8}});
        parse_rollout_job(&job(spec.clone())).expect("LoRA on one GPU");
        // Sharded like full training (FSDP2 over the processes), the adapter pushed as a file.
        spec["train"]["gpus"] = serde_json::json!(2);
        spec["train"]["nodes"] = serde_json::json!(2);
        parse_rollout_job(&job(spec.clone())).expect("LoRA over 2 nodes of 2 GPUs");
        spec["train"]["gpus"] = serde_json::json!(1);
        spec["train"]["nodes"] = serde_json::json!(1);
        spec["train"]["grpo"] = serde_json::json!({"weightSync": "NCCL"});
        let err = parse_rollout_job(&job(spec.clone())).expect_err("LoRA with NCCL");
        assert!(
            err.to_string().contains("grpo.weightSync must be File"),
            "{err}"
        );
        spec["train"]["grpo"] = serde_json::json!({});
        spec["train"]["lora"]["rank"] = serde_json::json!(1024);
        let err = parse_rollout_job(&job(spec)).expect_err("rank past vLLM's");
        assert!(err.to_string().contains("spec.train.lora.rank"), "{err}");
    }

    #[test]
    fn nccl_weight_sync_is_refused_for_a_trainer_of_several_processes() {
        let mut spec = valid_spec();
        spec.as_object_mut().map(|s| s.remove("sft"));
        spec["train"] = serde_json::json!({"image": "x", "model": "m",
                                           "grpo": {"weightSync": "NCCL"}});
        parse_rollout_job(&job(spec.clone())).expect("NCCL from one GPU");
        for (gpus, nodes) in [(4, 1), (1, 2), (0, 1)] {
            spec["train"]["gpus"] = serde_json::json!(gpus);
            spec["train"]["nodes"] = serde_json::json!(nodes);
            let err = parse_rollout_job(&job(spec.clone())).expect_err("NCCL, several");
            assert!(
                err.to_string().contains("one training GPU"),
                "{gpus} {nodes}: {err}"
            );
        }
        spec["train"]["grpo"] = serde_json::json!({"weightSync": "File"});
        parse_rollout_job(&job(spec)).expect("File from 2 nodes of no GPU");
    }

    #[test]
    fn unknown_fields_are_refused_with_their_path_and_a_suggestion() {
        let mut spec = valid_spec();
        spec["timeouts"] = serde_json::json!({"agentSecond": 5});
        spec["tasks"]["inline"][0]["hiddenFiles"] = serde_json::json!({"t.py": "x"});
        spec["harness"]["settings"] = serde_json::json!({"anything": {"goes": true}});
        let err = parse_rollout_job(&job(spec)).expect_err("unknown fields");
        let messages: Vec<String> = err.errors.iter().map(ToString::to_string).collect();
        assert_eq!(
            messages,
            [
                "spec.tasks.inline[0].hiddenFiles: unknown field",
                "spec.timeouts.agentSecond: unknown field (did you mean `agentSeconds`?)",
            ],
            "{err}"
        );
        // Free-form maps and preserved objects take any key.
        let mut spec = valid_spec();
        spec["tasks"]["inline"][0]["metadata"] = serde_json::json!({"any": "key"});
        spec["harness"]["settings"] = serde_json::json!({"model": {"x": 1}});
        parse_rollout_job(&job(spec)).expect("maps and settings take any key");
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }

    #[test]
    fn fields_the_apiserver_pruned_are_read_back_from_the_last_applied_annotation() {
        let applied = {
            let mut spec = valid_spec();
            spec["timeouts"] = serde_json::json!({"agentSecond": 5});
            job(spec)
        };
        // What the apiserver keeps: the same object without the field it does not know.
        let mut kept = parse_rollout_job(&job(valid_spec())).expect("valid");
        validate_rollout_job(&kept).expect("no annotation: nothing to read back");
        kept.metadata.annotations = Some(BTreeMap::from([(
            LAST_APPLIED.to_string(),
            applied.to_string(),
        )]));
        let err = validate_rollout_job(&kept).expect_err("a pruned field");
        assert_eq!(
            err.to_string(),
            "spec.timeouts.agentSecond: unknown field (did you mean `agentSeconds`?): the \
             apiserver dropped it, so it has no effect; fix the manifest"
        );
    }

    /// A pool's misspelled field runs as its default just as a job's would: here the pods
    /// would only warn of open egress, where the manifest asked them to refuse it.
    #[test]
    fn a_pools_field_the_apiserver_pruned_is_refused() {
        let pool = |egress: serde_json::Value| {
            serde_json::json!({"apiVersion": "floe.dev/v1alpha1", "kind": "GatewayPool",
                "metadata": {"name": "p"},
                "spec": {"replicas": 1, "template": {"image": "agent:1"}, "egress": egress}})
        };
        let applied = pool(serde_json::json!({"unrestrcted": "Refuse"}));
        let mut kept: GatewayPool =
            serde_json::from_value(pool(serde_json::json!({}))).expect("a pool");
        validate_gateway_pool(&kept).expect("no annotation: nothing to read back");
        kept.metadata.annotations = Some(BTreeMap::from([(
            LAST_APPLIED.to_string(),
            applied.to_string(),
        )]));
        let err = validate_gateway_pool(&kept).expect_err("a pruned field");
        assert_eq!(
            err.to_string(),
            "spec.egress.unrestrcted: unknown field (did you mean `unrestricted`?): the \
             apiserver dropped it, so it has no effect; fix the manifest"
        );
        let applied = pool(serde_json::json!({"unrestricted": "Refuse"}));
        kept.metadata.annotations = Some(BTreeMap::from([(
            LAST_APPLIED.to_string(),
            applied.to_string(),
        )]));
        validate_gateway_pool(&kept).expect("a known field");
    }

    /// The stored object's metadata: `kubectl apply`'s record of `applied`, and the fields
    /// each writer set (`fieldsV1`).
    fn stored(
        applied: &serde_json::Value,
        writers: &[serde_json::Value],
    ) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        serde_json::from_value(serde_json::json!({
            "name": "j",
            "annotations": {LAST_APPLIED: job(applied.clone()).to_string()},
            "managedFields": writers.iter().map(|f| serde_json::json!({
                "manager": "kubectl-client-side-apply", "operation": "Update",
                "apiVersion": "floe.dev/v1alpha1", "fieldsType": "FieldsV1", "fieldsV1": f}))
                .collect::<Vec<_>>(),
        }))
        .expect("metadata")
    }

    #[test]
    fn fields_an_older_crd_dropped_are_those_applied_and_not_kept() {
        let mut applied = valid_spec();
        applied["evaluator"]["reward"] = serde_json::json!({"source": "ExitCode",
            "failureReward": -1.0, "passThreshold": null});
        applied["tasks"]["inline"][0]["metadata"] = serde_json::json!({"difficulty": "hard"});
        // What the older CRD let the apply record: neither field.
        let written = serde_json::json!({"f:spec": {"f:numSamples": {},
            "f:evaluator": {"f:reward": {"f:source": {}}}, "f:tasks": {"f:inline": {}}}});
        let meta = stored(&applied, &[written]);
        let dropped = |kept: &serde_json::Value| dropped_by_an_older_crd("RolloutJob", &meta, kept);
        // As the older CRD kept it: `failureReward` and a task's `metadata` pruned; the null
        // (a field `kubectl apply` deletes) and the defaults the apiserver added are no matter.
        let mut kept = valid_spec();
        kept["evaluator"]["reward"] = serde_json::json!({"source": "ExitCode"});
        assert_eq!(
            dropped(&kept),
            [
                "spec.evaluator.reward.failureReward",
                "spec.tasks.inline[0].metadata"
            ]
        );
        // The new CRD installed since: read, the object holds `failureReward`'s default 0,
        // which nobody wrote. Still lost.
        kept["evaluator"]["reward"]["failureReward"] = serde_json::json!(0);
        kept["tasks"]["inline"][0]["metadata"] = serde_json::json!({"difficulty": "hard"});
        assert_eq!(dropped(&kept), ["spec.evaluator.reward.failureReward"]);
        // Applied again: kept as sent (`-1` is `-1.0`).
        kept["evaluator"]["reward"]["failureReward"] = serde_json::json!(-1);
        assert!(dropped(&kept).is_empty());
        let no_record = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta::default();
        assert!(
            dropped_by_an_older_crd("RolloutJob", &no_record, &kept).is_empty(),
            "no annotation"
        );
    }

    /// A job applied suspended and resumed by a patch (as Kueue admits it) holds `suspend`'s
    /// default against the record's `true`: the patch's writer owns it, so nothing was lost.
    /// Without any writer's record a default cannot be told from a value set to it.
    #[test]
    fn a_default_a_writer_set_since_the_apply_is_not_a_lost_field() {
        let mut applied = valid_spec();
        applied["suspend"] = serde_json::json!(true);
        let mut kept = valid_spec();
        kept["suspend"] = serde_json::json!(false);
        let apply = serde_json::json!({"f:spec": {"f:numSamples": {}}});
        let resumed = serde_json::json!({"f:spec": {"f:suspend": {}}});
        let meta = stored(&applied, &[apply.clone(), resumed]);
        assert!(dropped_by_an_older_crd("RolloutJob", &meta, &kept).is_empty());
        let meta = stored(&applied, &[apply]);
        assert_eq!(
            dropped_by_an_older_crd("RolloutJob", &meta, &kept),
            ["spec.suspend"],
            "a default nobody wrote"
        );
        let meta = stored(&applied, &[]);
        assert!(dropped_by_an_older_crd("RolloutJob", &meta, &kept).is_empty());
    }

    /// Items of a keyed list (`tasks.inline`, by `id`) are recorded by their key: a default
    /// inside one is lost only if no writer recorded it under that key.
    #[test]
    fn a_default_in_a_keyed_list_item_is_looked_up_by_its_key() {
        let mut applied = valid_spec();
        applied["tasks"]["inline"][0]["evaluation"] =
            serde_json::json!({"swebench": {"evalType": "fail_only"}});
        let mut kept = valid_spec();
        kept["tasks"]["inline"][0]["evaluation"] =
            serde_json::json!({"swebench": {"evalType": "pass_and_fail"}});
        let item = serde_json::json!({"f:id": {}, "f:instruction": {}});
        let written = |item: &serde_json::Value| serde_json::json!({"f:spec": {"f:tasks": {"f:inline": {"k:{\"id\":\"t1\"}": item}}}});
        let meta = stored(&applied, &[written(&item)]);
        assert_eq!(
            dropped_by_an_older_crd("RolloutJob", &meta, &kept),
            ["spec.tasks.inline[0].evaluation.swebench.evalType"]
        );
        let mut recorded = item.clone();
        recorded["f:evaluation"] = serde_json::json!({"f:swebench": {"f:evalType": {}}});
        let meta = stored(&applied, &[written(&recorded)]);
        assert!(dropped_by_an_older_crd("RolloutJob", &meta, &kept).is_empty());
    }

    #[test]
    fn wrong_kind_is_reported() {
        let mut doc = job(valid_spec());
        doc["kind"] = serde_json::json!("GatewayPool");
        let err = parse_rollout_job(&doc).expect_err("kind");
        assert_eq!(err.errors[0].field, "kind");
    }
}
