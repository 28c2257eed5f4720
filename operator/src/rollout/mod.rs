//! RolloutJob: tasks × samples → sessions on claimed pool pods → results folded into status.
//!
//! - [`indexes`]: `completedIndexes`-style range sets.
//! - [`job_state`]: what a job's spec and status say, as the planner reads it (sans-IO).
//! - [`plan`]: the reconcile decision (sans-IO).
//! - [`freshness`]: when a round may read the job's pods from the watch cache (sans-IO).
//! - [`pod_view`]: what a claimed pod says (sans-IO).
//! - [`status`]: counters, phase, conditions (sans-IO).
//! - [`tasks`]: task JSONL and hidden-file ConfigMaps (sans-IO).
//! - [`prewarm`]: a `poolTemplate` job's own pod for one session attempt (sans-IO).
//! - [`aux_gate`]: what the job's own pod allows its sessions: claim, start (sans-IO).
//! - [`aux_pods`]: the trainer pod (train) or dataset collector (sft) and their Services.
//! - [`trainer_launch`]: the train job's vLLM, policy proxy and trainer arguments (sans-IO).
//! - [`summary`]: a finished job's `summary.json` (sans-IO).
//! - [`controller`]: the IO edge.

pub mod aux_gate;
pub mod aux_pods;
pub mod controller;
pub mod freshness;
pub mod indexes;
pub mod job_state;
pub mod plan;
pub mod pod_view;
pub mod prewarm;
pub mod status;
pub mod summary;
pub mod tasks;
pub mod trainer_launch;
