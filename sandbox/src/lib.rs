//! `floe sandbox`: what runs in a sandbox pod's main container (and, in local mode, in a temp
//! directory). It takes its assignment from the pod's gateway, runs the task's prepare steps
//! and an unmodified harness pointed at the gateway, evaluates the result in a fresh copy of
//! the workspace, reports the outcome, and leaves a short summary for the operator.
//! The contract is documented in `docs/sandbox-contract.md`.
//!
//! - [`spec`]: what an assignment tells the runner.
//! - [`presets`]: per-harness config files, env and headless command (sans-IO).
//! - [`workspace`]: snapshot, agent diff, evaluation copy.
//! - [`process`]: a command under a timeout, its process group killed, output capped.
//! - [`reward`]: evaluator result → reward (exit code, reward file, test reports).
//! - [`session`]: a job's task × sample as an assignment (shared with the operator).
//! - [`checks`]: what is wrong with a job's sessions, known before the first runs.
//! - [`confine`]: local mode's bubblewrap sandbox for the harness and the evaluator;
//!   [`relay`], the first process in it and the model API's only way out of it;
//!   [`syscall_filter`], the seccomp filter on what it starts.
//! - [`agent_link`]: in pods, the harness in a container of its own, run by `floe agent`
//!   for the grader, which waits until every agent process is gone.
//! - [`sandbox_user`]: whom a root run's sandboxes are on the host.
//! - [`runner`]: the whole session, talking to the gateway through [`client`].

pub mod agent_link;
pub mod checkout;
pub mod checks;
pub mod children;
pub mod client;
pub mod confine;
pub mod disk_budget;
pub mod egress_check;
mod evaluator_program;
mod evaluator_run;
pub mod fidelity;
pub mod grading;
mod grading_swebench;
mod import_shadowing;
pub mod limits;
pub mod pod_files;
pub mod presets;
pub mod process;
mod protected;
pub mod relay;
pub mod reward;
pub mod runner;
mod runner_shadowing;
pub mod sandbox_user;
pub mod session;
pub mod spec;
pub mod summary;
pub mod supervisor_guard;
pub mod swebench_grade;
pub mod syscall_filter;
pub mod tree;
pub mod workspace;
