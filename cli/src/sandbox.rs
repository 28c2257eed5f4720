//! `floe sandbox`: the runner in a sandbox pod's main container (see docs/sandbox-contract.md).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use floe_crds::common::PrepareStep;
use floe_sandbox::runner::{run, AgentContainer, RunnerConfig};
use floe_sandbox::summary::{render, ExitKind};

#[derive(Args)]
pub struct SandboxArgs {
    /// The pod's gateway (control and model API).
    #[arg(
        long,
        env = "FLOE_GATEWAY_URL",
        default_value = "http://127.0.0.1:8370"
    )]
    gateway: String,
    /// File holding the gateway's control token. In a pod the token comes as
    /// `FLOE_CONTROL_TOKEN` instead (from its Secret): no file the evaluator could read.
    #[arg(
        long,
        env = "FLOE_CONTROL_TOKEN_FILE",
        required_unless_present = "control_token"
    )]
    control_token_file: Option<PathBuf>,
    /// The gateway's control token itself.
    #[arg(long, env = "FLOE_CONTROL_TOKEN", hide = true, hide_env_values = true)]
    control_token: Option<String>,
    /// The task workspace: the harness's working directory (default: the current directory).
    #[arg(long)]
    workspace: Option<PathBuf>,
    /// Runner-private state (snapshot, harness home, logs, evaluation copy); outside the
    /// workspace.
    #[arg(long, default_value = "/tmp/floe-sandbox")]
    state_dir: PathBuf,
    /// Where the result summary goes (default: /dev/termination-log when it exists).
    #[arg(long)]
    summary_file: Option<PathBuf>,
    /// The pool's prepare steps as JSON (`[{"name": …, "command": […]}]`), run before ready.
    #[arg(long, env = "FLOE_POOL_PREPARE")]
    pool_prepare: Option<String>,
    /// Give up waiting for an assignment after this many seconds (default: wait forever).
    #[arg(long)]
    assignment_timeout_seconds: Option<u64>,
    /// How long to wait for the gateway to ship the trajectory.
    #[arg(long, default_value_t = 300)]
    ship_timeout_seconds: u64,
    /// Bytes of stdout/stderr kept per process (harness, evaluator, prepare steps).
    #[arg(long, default_value_t = 1024 * 1024)]
    log_cap_bytes: u64,
    /// Seconds between SIGTERM and SIGKILL when a process group times out.
    #[arg(long, default_value_t = 5)]
    kill_grace_seconds: u64,
    /// Run the harness in the pod's agent container: listen here for its supervisor
    /// (`floe agent`), which runs it and reports once every agent process is gone. Without
    /// it the harness runs in this container, beside the grader.
    #[arg(long, env = "FLOE_AGENT_LISTEN", requires = "agent_dir")]
    agent_listen: Option<std::net::SocketAddr>,
    /// The volume shared with the agent container (the harness's home, instruction, logs).
    #[arg(long, env = "FLOE_AGENT_DIR")]
    agent_dir: Option<PathBuf>,
    /// How long the agent container's supervisor may take to dial.
    #[arg(long, default_value_t = 300)]
    agent_dial_timeout_seconds: u64,
    /// Where the agent container mounts the workspace, when not at `--workspace` (a SWE-bench
    /// pod's agent works at the image's `/testbed`).
    #[arg(long, requires = "agent_dir")]
    agent_workspace: Option<PathBuf>,
    /// The agent container's user, `UID:GID`, when this container runs as root (a SWE-bench
    /// pod's grader): what the agent is given to write (the workspace, its home) is made its
    /// before it starts, and the evaluator runs with no capability.
    #[arg(long, requires = "agent_dir", value_parser = floe_sandbox::sandbox_user::parse)]
    agent_user: Option<(u32, u32)>,
    /// Check at start that this pod's egress is restricted (`warn` or `refuse` when it is
    /// not; the operator sets it from the pool's `spec.egress.unrestricted`).
    #[arg(long, env = "FLOE_EGRESS_CHECK")]
    egress_check: Option<floe_sandbox::egress_check::EgressCheck>,
    /// Disk the harness's workspace and home may fill together while it runs, e.g. `8Gi`
    /// (checked every 2 s; past it the harness is stopped and the session scores 0 as
    /// `disk_limit`); `0`: none. The operator sets it from the pool's `template.diskBudget`.
    #[arg(long, env = "FLOE_DISK_BUDGET", default_value = "0",
          value_parser = floe_sandbox::limits::parse_bytes)]
    disk_budget: u64,
    /// A Python with the `swebench` package, which grades SWE-bench instances
    /// (`reward.source: SWEBench`).
    #[arg(long, env = "FLOE_SWEBENCH_PYTHON", conflicts_with = "swebench_url")]
    swebench_python: Option<PathBuf>,
    /// A `floe swebench-bridge` that grades them instead (a pod's sidecar).
    #[arg(long, env = "FLOE_SWEBENCH_URL")]
    swebench_url: Option<String>,
    /// Build the evaluation copy here instead of under the state directory (a pod grading
    /// SWE-bench instances: the image's repository directory, which its environment imports
    /// from).
    #[arg(long, env = "FLOE_EVAL_DIR")]
    eval_dir: Option<PathBuf>,
    /// The workspace already holds a copy of this image directory (the pod's seed step): a task
    /// whose repository it is checks out in place.
    #[arg(long, env = "FLOE_SEEDED_FROM")]
    seeded_from: Option<PathBuf>,
}

#[derive(Args)]
pub struct AgentArgs {
    /// The grader's agent link (`floe sandbox --agent-listen`), on the pod's loopback.
    #[arg(long, env = "FLOE_AGENT_GRADER")]
    grader: std::net::SocketAddr,
    /// How long to keep dialling it (the grader's container starting).
    #[arg(long, default_value_t = 300)]
    dial_timeout_seconds: u64,
}

/// `floe agent`: the agent container's PID 1 (see `floe_sandbox::agent_link`). Exit 0 once it
/// reported, 3 when the link failed.
pub fn agent_main(args: AgentArgs) -> i32 {
    // Not dumpable: the agent, same user, can neither trace this process nor read its memory
    // or file descriptors (the link).
    if let Err(e) = nix::sys::prctl::set_dumpable(false) {
        eprintln!("floe agent: cannot make this process undumpable: {e}");
        return ExitKind::Infrastructure.code();
    }
    let runtime = match floe_sandbox::agent_link::supervisor_runtime() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("floe agent: cannot start the async runtime: {e}");
            return ExitKind::Infrastructure.code();
        }
    };
    let wait = Duration::from_secs(args.dial_timeout_seconds);
    match runtime.block_on(floe_sandbox::agent_link::supervise(args.grader, wait)) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("floe agent: {e}");
            ExitKind::Infrastructure.code()
        }
    }
}

/// Runs the session and returns the process exit code.
pub fn main(args: SandboxArgs) -> i32 {
    let usage = |message: String| {
        eprintln!("floe sandbox: {message}");
        ExitKind::Usage.code()
    };
    // Before the token is in memory: nothing this runner starts (the evaluator runs the
    // agent's code, as the same user) may trace it or read its memory or environment.
    if let Err(e) = nix::sys::prctl::set_dumpable(false) {
        return usage(format!("cannot make the runner undumpable: {e}"));
    }
    let token = match (&args.control_token, &args.control_token_file) {
        (Some(t), _) if !t.trim().is_empty() => t.trim().to_string(),
        (Some(_), _) => return usage("FLOE_CONTROL_TOKEN is empty".into()),
        (None, Some(file)) => match std::fs::read_to_string(file) {
            Ok(t) if !t.trim().is_empty() => t.trim().to_string(),
            Ok(_) => return usage(format!("{} is empty", file.display())),
            Err(e) => return usage(format!("{}: {e}", file.display())),
        },
        (None, None) => return usage("no control token (FLOE_CONTROL_TOKEN_FILE)".into()),
    };
    let pool_prepare: Vec<PrepareStep> = match args.pool_prepare.as_deref() {
        None | Some("") => vec![],
        Some(json) => match serde_json::from_str(json) {
            Ok(steps) => steps,
            Err(e) => {
                return usage(format!(
                    "--pool-prepare is not a list of prepare steps: {e}"
                ))
            }
        },
    };
    let workspace = match args.workspace.map_or_else(std::env::current_dir, Ok) {
        Ok(w) => w,
        Err(e) => return usage(format!("no workspace: {e}")),
    };
    let config = RunnerConfig {
        gateway_url: args.gateway,
        control_token: token.clone(),
        workspace,
        state_dir: args.state_dir,
        pool_prepare,
        assignment_wait: args.assignment_timeout_seconds.map(Duration::from_secs),
        session: None,
        ship_wait: Duration::from_secs(args.ship_timeout_seconds),
        log_cap_bytes: args.log_cap_bytes,
        kill_grace: Duration::from_secs(args.kill_grace_seconds),
        // The pod's containers are the sandbox.
        confinement: None,
        agent: args
            .agent_listen
            .zip(args.agent_dir)
            .map(|(listen, dir)| AgentContainer {
                listen,
                dir,
                dial_wait: Duration::from_secs(args.agent_dial_timeout_seconds),
                workspace: args.agent_workspace,
                user: args.agent_user,
            }),
        egress_check: args.egress_check,
        disk_budget: (args.disk_budget > 0).then_some(args.disk_budget),
        swebench: match (args.swebench_python, args.swebench_url) {
            (Some(python), _) => Some(floe_sandbox::swebench_grade::Bridge::Python(python)),
            (None, Some(url)) => Some(floe_sandbox::swebench_grade::Bridge::Url {
                url,
                token: token.clone(),
            }),
            (None, None) => None,
        },
        eval_dir: args.eval_dir,
        seeded_from: args.seeded_from,
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return usage(format!("cannot start the async runtime: {e}")),
    };
    let report = runtime.block_on(run(&config));
    let message = render(&report.summary);
    println!("{message}");
    let summary_file = args.summary_file.or_else(|| {
        let default = PathBuf::from("/dev/termination-log");
        default.exists().then_some(default)
    });
    if let Some(path) = summary_file {
        if let Err(e) = std::fs::write(&path, &message) {
            eprintln!(
                "floe sandbox: cannot write the summary to {}: {e}",
                path.display()
            );
        }
    }
    report.exit.code()
}
