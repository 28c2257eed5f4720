//! floe's operator. Reconcile decisions are plain functions over plain data ([`pool`]), so
//! every decision is unit-tested without a cluster; the controllers that feed them from the
//! apiserver and apply their plans live at the edges.

pub mod claim_gate;
pub mod client_rate;
pub mod egress_policy;
pub mod events;
pub mod leader;
pub mod metrics;
pub mod pod_cache;
pub mod pod_problem;
pub mod pool;
pub mod pool_controller;
pub mod rollout;
pub mod run;
pub mod sandbox_pod;
pub mod tokens;
