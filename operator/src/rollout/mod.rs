//! RolloutJob: tasks × samples → sessions on claimed pool pods → results folded into status.
//!
//! - [`indexes`]: `completedIndexes`-style range sets.
//! - [`job_state`]: what a job's spec and status say, as the planner reads it (sans-IO).
//! - [`plan`]: the reconcile decision (sans-IO).
//! - [`held_out`]: a train job's held-out rounds: when they open, their sessions, their tally
//!   (sans-IO).
//! - [`freshness`]: when a round may read the job's pods from the watch cache (sans-IO).
//! - [`pod_view`]: what a claimed pod says (sans-IO).
//! - [`status`]: counters, phase, conditions (sans-IO).
//! - [`tasks`]: task JSONL and hidden-file ConfigMaps (sans-IO).
//! - [`prewarm`]: a `poolTemplate` job's own pod for one session attempt (sans-IO).
//! - [`aux_gate`]: what the job's own pod allows its sessions: claim, start (sans-IO).
//! - [`aux_pods`]: the trainer pod (train) or dataset collector (sft) and their Services.
//! - [`trainer_launch`]: the train job's vLLM, policy proxy and trainer arguments (sans-IO).
//! - [`trainer_workers`]: a trainer over several nodes: the pods besides the first (sans-IO).
//! - [`spec_digest`]: what the job's own pod was made from, against the spec now (sans-IO).
//! - [`summary`]: a finished job's `summary.json` (sans-IO).
//! - [`suspended_trainer`]: when a suspended train job's trainer pod ends (sans-IO).
//! - [`controller`]: the IO edge.

pub(crate) mod aux_gate;
pub(crate) mod aux_pods;
pub(crate) mod controller;
pub(crate) mod freshness;
pub(crate) mod held_out;
pub(crate) mod indexes;
pub(crate) mod job_state;
pub(crate) mod plan;
pub(crate) mod pod_view;
pub(crate) mod prewarm;
pub(crate) mod spec_digest;
pub(crate) mod status;
pub(crate) mod summary;
pub(crate) mod suspended_trainer;
pub(crate) mod tasks;
pub mod trainer_launch;
/// A held-out set's digest, which `floe run --resume` checks as the operator does.
pub use aux_pods::TASKS_TOKEN_ENV;
pub use held_out::digest as held_out_digest;
pub(crate) mod trainer_workers;
