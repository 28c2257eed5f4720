//! `floe run`'s flags before anything runs: what would make a run do nothing (refused), and
//! every path made absolute.

use std::path::PathBuf;

use clap::Args;

use super::{plan, session_limits};

#[derive(Args)]
pub struct RunArgs {
    /// The RolloutJob file: the same YAML a cluster takes.
    pub(super) job: PathBuf,
    /// Output directory (new or empty): summary.json, dataset.jsonl or trajectories.jsonl,
    /// per-session logs, captures.
    #[arg(long)]
    pub(super) out: PathBuf,
    /// OpenAI-compatible model server (default: `spec.sft.upstream.url`); its key, if it
    /// takes one, in the environment variable `FLOE_UPSTREAM_API_KEY`.
    #[arg(long)]
    pub(super) model_url: Option<String>,
    /// Model name sent upstream (default: `spec.sft.upstream.model`, else `policy`).
    #[arg(long)]
    pub(super) model_name: Option<String>,
    /// Sessions at a time (default: `spec.concurrency`, else 2).
    #[arg(long)]
    pub(super) concurrency: Option<usize>,
    /// Run only the first N sessions (tasks × samples × epochs, task by task).
    #[arg(long)]
    pub(super) sessions: Option<usize>,
    /// Train mode: a trainer already running (its ingest URL) instead of starting one.
    #[arg(long)]
    pub(super) trainer_url: Option<String>,
    /// Train mode: a Python with vLLM, for the policy server (`PYTHON -m
    /// vllm.entrypoints.openai.api_server`; default: `vllm serve` from PATH). `--model-url`
    /// attaches to a running vLLM (dev mode) instead.
    #[arg(long)]
    pub(super) vllm_python: Option<PathBuf>,
    /// Train mode: a Python with `floe_trainer` importable (`PYTHON -m floe_trainer.cli
    /// serve`; default: `floe-trainer` from PATH).
    #[arg(long)]
    pub(super) trainer_python: Option<PathBuf>,
    /// Train mode: seconds the policy server and the trainer may take to become ready.
    #[arg(long, default_value_t = 900)]
    pub(super) start_timeout: u64,
    /// Train mode: only collect trajectories into trajectories.jsonl against `--model-url`
    /// (no trainer, no weight updates).
    #[arg(long)]
    pub(super) collect_only: bool,
    /// Continue the interrupted run in `--out` (same job, task file and `--sessions`):
    /// sessions that finished are kept, the others run again.
    #[arg(long)]
    pub(super) resume: bool,
    /// Run the agents without a sandbox (bubblewrap): they can then read the hidden tests, the
    /// captures and each other's sessions, and reach the network. Recorded in summary.json.
    #[arg(long)]
    pub(super) no_sandbox: bool,
    /// A root run's agents act on files as this host user (`UID:GID`), not as root: what only
    /// root may read stays out of their reach, and what they write is that user's. Root's home is
    /// shown to them with its directories and none of its files. Ignored when `floe run` is not
    /// root (its agents are then its own user).
    #[arg(long, default_value = "65534:65534", value_parser = floe_sandbox::sandbox_user::parse)]
    pub(super) sandbox_user: (u32, u32),
    /// A Python with the `swebench` package, which grades SWE-bench instances
    /// (`tasks.swebench`); `scripts/swebench/install.sh` makes one.
    #[arg(long, env = "FLOE_SWEBENCH_PYTHON")]
    pub(super) swebench_python: Option<PathBuf>,
    /// Serve `/metrics` here (e.g. `127.0.0.1:9464`): the job's session series, the gateway's
    /// and the trainer's, labelled with the job's namespace and name, for the chart's rules.
    #[arg(long)]
    pub(super) metrics_listen: Option<std::net::SocketAddr>,
    #[command(flatten)]
    pub(super) limits: session_limits::SessionLimitArgs,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Plan(#[from] plan::PlanError),
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Preflight(String),
    #[error("{0}")]
    Io(String),
}

/// Flags that would make a run do nothing, or something other than asked.
pub fn check(args: &RunArgs) -> Result<(), RunError> {
    if args.sessions == Some(0) {
        return Err(RunError::Usage(
            "--sessions 0 runs nothing: give at least 1 (or leave it out for every session)".into(),
        ));
    }
    if args.concurrency == Some(0) {
        return Err(RunError::Usage("--concurrency must be at least 1".into()));
    }
    Ok(())
}

/// Every path the run hands a child process (bubblewrap's bind sources, the runner's workspace,
/// the trainer's output) is absolute: a relative one names something else from the child's
/// working directory, and bubblewrap resolves a bind source against its own.
pub fn absolute_paths(args: &mut RunArgs) -> Result<(), RunError> {
    // A bare program name (`python3`) is looked up on PATH, not in the working directory.
    let named_by_path = |p: &Option<PathBuf>| {
        p.as_ref()
            .filter(|p| p.components().count() > 1 || p.is_absolute())
            .is_some()
    };
    let (vllm, trainer, swebench) = (
        named_by_path(&args.vllm_python),
        named_by_path(&args.trainer_python),
        named_by_path(&args.swebench_python),
    );
    for path in [
        Some(&mut args.out),
        Some(&mut args.job),
        args.vllm_python.as_mut().filter(|_| vllm),
        args.trainer_python.as_mut().filter(|_| trainer),
        args.swebench_python.as_mut().filter(|_| swebench),
    ]
    .into_iter()
    .flatten()
    {
        // Joined to the working directory as the kernel would (`..` kept, no link followed).
        *path = std::path::absolute(&*path)
            .map_err(|e| RunError::Usage(format!("{}: {e}", path.display())))?;
    }
    Ok(())
}
