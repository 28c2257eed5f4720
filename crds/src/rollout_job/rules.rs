//! The RolloutJob's object-level CEL rules (`x-kubernetes-validations` at its root).

use kube::core::Rule;

/// Sessions are numbered by task order: a job that has started keeps its tasks.
pub fn tasks_immutable_once_started() -> Rule {
    Rule::new(
        "!has(oldSelf.status) || !has(oldSelf.status.startTime) || (self.spec.tasks == oldSelf.spec.tasks && self.spec.numSamples == oldSelf.spec.numSamples)",
    )
    .message("spec.tasks and spec.numSamples are immutable once the job has started")
}

/// Every job has Services named after it (a train job's `<job>-trainer` and `-policy`, an sft
/// job's `-dataset`), which need a DNS-1035 label: a name Kubernetes takes otherwise failed at
/// the first one. A local job file may have no name.
pub fn name_fits_its_services() -> Rule {
    Rule::new(
        "!has(self.metadata.name) || (size(self.metadata.name) <= 55 && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$'))",
    )
    .message("metadata.name must start with a lowercase letter, hold only lowercase letters, digits and '-', end with a letter or digit, and be at most 55 characters: the job's Services are named after it")
}
