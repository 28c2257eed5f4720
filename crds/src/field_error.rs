//! One problem with one field: what validation reports, in the apiserver's terms.

use serde::Serialize;

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
