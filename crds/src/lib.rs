//! floe's Kubernetes API, group `floe.dev`, version `v1alpha1`.
//!
//! - [`GatewayPool`] keeps sandbox pods pre-warmed and READY for a harness image.
//! - [`RolloutJob`] expands tasks × samples into sessions, runs them on pool pods and ships
//!   the trajectories to a GRPO trainer (`train`) or a dataset (`sft`).
//!
//! The CRD YAML is derived from these types ([`generate`]); `docs/crds.md` is the reference.

pub mod common;
mod field_error;
pub mod gateway_pool;
pub mod generate;
pub mod reference;
pub mod rollout_job;
pub mod root_agent;
mod schema;
pub mod served_schema;
pub mod shared_volumes;
pub mod swebench;
pub mod task_file;
pub mod validation;

pub use common::*;
pub use gateway_pool::*;
pub use rollout_job::*;
pub use validation::{FieldError, ValidationError};

/// The API group of every floe resource.
pub const GROUP: &str = "floe.dev";
/// The one served and stored version.
pub const VERSION: &str = "v1alpha1";
