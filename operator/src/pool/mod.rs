//! GatewayPool: a pool of pre-warmed sandbox pods, kept at `replicas` unclaimed.
//!
//! - [`plan`]: what to create and delete, from the pool's spec and its unclaimed pods (sans-IO).
//! - [`expectations`]: writes the pod cache does not show yet (sans-IO, clock passed in).
//! - [`context`]: what the controller shares across rounds, and remembers per pool.
//! - [`controller`]: the IO edge: observe, apply the plan, mark READY pods.
//! - [`status`]: counts, selector and conditions, written with their Events.

mod context;
pub mod controller;
pub mod expectations;
pub mod plan;
mod status;

pub use context::PoolContext;
pub use controller::{error_policy, reconcile};

use crate::api_call::ApiCallError;

#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error(transparent)]
    Api(#[from] ApiCallError),
    #[error("the pool has no namespace")]
    NoNamespace,
    #[error("cannot build the sandbox pod: {0}")]
    Template(#[from] serde_json::Error),
    /// The pool as stored is a newer spec than the watch cache's: the round would act on the
    /// older one with the newer one's verdict. The watch brings the newer one shortly.
    #[error("the watch cache is behind the pool as stored")]
    CacheBehind,
}

impl PoolError {
    /// For `map_err`: the apiserver failed while `doing` something.
    pub(crate) fn api(doing: impl Into<String>) -> impl FnOnce(kube::Error) -> Self {
        let failed = ApiCallError::doing(doing);
        move |source| Self::Api(failed(source))
    }
}
