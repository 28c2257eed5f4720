//! Semantic validation that the OpenAPI schema alone cannot express.
//!
//! The rules are written once, as CEL `x-kubernetes-validations` in the schema (see the
//! `#[x_kube(validation = ...)]` attributes). Modern apiservers enforce them on admission; this
//! module evaluates the *same* rules client-side (kube's `cel` feature), so the operator on a
//! cluster without CRD CEL support (< 1.25) and `floe run` in local mode report the same
//! messages for the same mistakes.

use std::collections::BTreeSet;

use serde::Serialize;

use crate::{GatewayPool, RolloutJob, Task};

/// One problem with one field, in the apiserver's terms.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FieldError {
    /// Dotted path, e.g. `spec.tasks.inline[3].id`.
    pub field: String,
    pub message: String,
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.field.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.field, self.message)
        }
    }
}

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

/// Validate a RolloutJob as the apiserver would on create.
pub fn validate_rollout_job(job: &RolloutJob) -> Result<(), ValidationError> {
    let mut errors = cel_errors(job.validate_cel());
    if let Some(tasks) = &job.spec.tasks.inline {
        errors.extend(duplicate_task_ids(tasks, "spec.tasks.inline"));
    }
    into_result(errors)
}

/// Validate an update of a RolloutJob (transition rules such as immutability after start).
pub fn validate_rollout_job_update(
    job: &RolloutJob,
    old: &RolloutJob,
) -> Result<(), ValidationError> {
    let mut errors = cel_errors(job.validate_cel_update(old));
    if let Some(tasks) = &job.spec.tasks.inline {
        errors.extend(duplicate_task_ids(tasks, "spec.tasks.inline"));
    }
    into_result(errors)
}

/// Validate a GatewayPool as the apiserver would on create.
pub fn validate_gateway_pool(pool: &GatewayPool) -> Result<(), ValidationError> {
    into_result(cel_errors(pool.validate_cel()))
}

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
