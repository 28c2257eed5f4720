//! `floe`: one binary for the operator, the gateway sidecar, the sandbox runner and local mode.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[cfg(test)]
mod cli_reference;
mod collect;
mod crds;
mod doctor;
mod gateway;
mod operator;
mod policy_proxy;
mod run;
mod sandbox;
mod serve_http;
mod serve_tasks;
mod swebench_pod;
mod tasks;
mod trajectories;

// glibc malloc showed up as ~15 % of the gateway's CPU per proxied call (perf, open-loop
// bench); the JSON trees of every call are many small short-lived allocations.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "floe",
    version,
    about = "RL rollouts over unmodified coding-agent harnesses, on Kubernetes"
)]
struct Cli {
    /// Log lines as text or as JSON objects (one per line, for log pipelines). The level comes
    /// from `FLOE_LOG` (`info` by default; e.g. `FLOE_LOG=debug,kube=info`).
    #[arg(
        long,
        global = true,
        value_enum,
        env = "FLOE_LOG_FORMAT",
        default_value = "text"
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Print the RolloutJob and GatewayPool CustomResourceDefinitions as multi-document YAML
    /// (`floe crds | kubectl apply -f -`), rendered for the cluster kubectl's configuration
    /// points at (its version is asked; a current cluster is assumed when none answers).
    Crds {
        /// Render for this Kubernetes version (e.g. `1.20`) instead of asking the cluster;
        /// clusters older than 1.25 get the CRDs without CEL rules, which the operator then
        /// enforces itself.
        #[arg(long, value_name = "VERSION")]
        kube_version: Option<String>,
    },
    /// Run the operator: GatewayPools' warm sandbox pods and RolloutJobs' sessions.
    Operator(operator::OperatorArgs),
    /// Run the gateway: provider APIs for the harness, vLLM upstream, token-level capture.
    Gateway(gateway::GatewayArgs),
    /// Run a RolloutJob on this machine: the same YAML, local processes instead of pods.
    /// Exit 0 all sessions ran, 1 some failed by infrastructure, 2 bad input, 130 interrupted
    /// (Ctrl-C), 143 terminated (SIGTERM).
    Run(run::RunArgs),
    /// Check what this machine lacks for local mode (`floe run`, the quickstart) and, with
    /// `--tests`, for floe's tests: each problem with its fix. Exit 0 when nothing is missing.
    Doctor(doctor::DoctorArgs),
    /// Check a job's tasks, or a JSONL task file (`--swebench`: SWE-bench instances), as `floe
    /// run` and the operator do, and print what would run: images, repositories, test lists and
    /// test commands. Exit 0 when every task is valid, 2 otherwise.
    Tasks(tasks::TasksArgs),
    /// Run one sandbox session: wait for the assignment from the pod's gateway, run the
    /// harness, evaluate, report. Exit 0 success, 1 agent failure, 2 usage, 3 infrastructure.
    Sandbox(sandbox::SandboxArgs),
    /// A sandbox pod's agent container: dial the grader, run the harness it sends, kill every
    /// process left in this container, report.
    Agent(sandbox::AgentArgs),
    /// Collect an sft job's trajectories into its dataset volume (the job's collector pod).
    Collect(collect::CollectArgs),
    /// Serve a job's JSONL task file from its volume to the operator (the job's task loader pod).
    ServeTasks(serve_tasks::ServeTasksArgs),
    /// Publish a trainer pod's vLLM (on loopback) to the policy Service: inference and
    /// read-only paths only, never its weight and pause endpoints.
    PolicyProxy(policy_proxy::PolicyProxyArgs),
    /// Copy this `floe` binary to DEST (the sandbox pod's init container puts it in a shared
    /// volume for the harness container).
    InstallBinary { dest: std::path::PathBuf },
    /// Build trajectories from session captures, or compare the builders on them.
    Trajectories {
        #[command(subcommand)]
        command: trajectories::TrajectoriesCommand,
    },
    /// A SWE-bench pod's init step: copy the image's repository directory into the workspace
    /// volume (docs/swebench.md).
    #[command(hide = true)]
    SeedWorkspace(swebench_pod::SeedArgs),
    /// A SWE-bench pod's grading sidecar: the `swebench` package's eval scripts and verdicts,
    /// on loopback, for the pod's runner (docs/swebench.md).
    SwebenchBridge(swebench_pod::BridgeArgs),
    /// Started by `floe run`: kill what the run left once the run is gone (even SIGKILLed).
    #[command(hide = true)]
    RunWatchdog {
        #[arg(long)]
        parent: u32,
        #[arg(long)]
        tag: String,
    },
    /// Started by a root `floe run`: hold a new user namespace for its sandboxes until stdin
    /// closes.
    #[command(hide = true)]
    SandboxUserns,
    /// Started by `floe run` inside each sandbox: run the command under the sandbox's syscall
    /// filter (for a harness, forwarding the gateway's loopback address to its unix socket),
    /// exit with its status.
    #[command(hide = true)]
    SandboxExec {
        #[arg(long, requires = "socket")]
        listen: Option<std::net::SocketAddr>,
        #[arg(long, requires = "listen")]
        socket: Option<std::path::PathBuf>,
        /// The evaluator: exit 253 if the command left a process behind (a straggler could have
        /// rewritten its verdict).
        #[arg(long)]
        no_stragglers: bool,
        /// A root run's sandbox: become this `UID:GID` (which the run's user namespace maps to
        /// the sandbox's host user) before anything else runs.
        #[arg(long, value_parser = floe_sandbox::sandbox_user::parse)]
        r#become: Option<(u32, u32)>,
        #[arg(required = true, last = true)]
        command: Vec<String>,
    },
}

#[derive(Debug, thiserror::Error)]
enum CliError {
    #[error(transparent)]
    Crds(#[from] crds::CrdsError),
    #[error("cannot write to stdout: {0}")]
    Stdout(#[from] std::io::Error),
    #[error(transparent)]
    Trajectories(#[from] trajectories::TrajectoriesError),
    #[error(transparent)]
    Gateway(#[from] gateway::GatewayError),
    #[error(transparent)]
    Operator(#[from] operator::OperatorError),
    #[error(transparent)]
    Collect(#[from] collect::CollectCliError),
    #[error(transparent)]
    ServeTasks(#[from] serve_tasks::ServeTasksError),
    #[error(transparent)]
    PolicyProxy(#[from] policy_proxy::PolicyProxyError),
    #[error(transparent)]
    Serve(#[from] serve_http::ServeError),
    #[error("cannot install the floe binary to {0}: {1}")]
    Install(std::path::PathBuf, std::io::Error),
}

fn install_binary(dest: &std::path::Path) -> Result<(), CliError> {
    use std::os::unix::fs::PermissionsExt;
    let install = || -> std::io::Result<()> {
        std::fs::copy(std::env::current_exe()?, dest)?;
        std::fs::set_permissions(dest, std::fs::Permissions::from_mode(0o755))
    };
    install().map_err(|e| CliError::Install(dest.to_path_buf(), e))
}

fn sandbox_exec(
    relay_to: Option<(std::net::SocketAddr, std::path::PathBuf)>,
    no_stragglers: bool,
    become_user: Option<(u32, u32)>,
    command: Vec<String>,
) -> u8 {
    use floe_sandbox::relay;
    let Some((program, args)) = command.split_first() else {
        return relay::NOT_STARTED as u8;
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("floe sandbox-exec: cannot start the async runtime: {e}");
            return relay::NOT_STARTED as u8;
        }
    };
    let code = runtime.block_on(relay::run(relay::ExecArgs {
        relay: relay_to,
        no_stragglers,
        become_user,
        program: program.clone(),
        args: args.to_vec(),
    }));
    u8::try_from(code).unwrap_or(1)
}

fn run(cli: Cli) -> Result<ExitCode, CliError> {
    match cli.command {
        Command::Crds { kube_version } => crds::run(kube_version)?,
        Command::Gateway(args) => gateway::run(args)?,
        Command::Operator(args) => operator::main(args)?,
        Command::InstallBinary { dest } => install_binary(&dest)?,
        Command::Collect(args) => collect::run(args)?,
        Command::ServeTasks(args) => serve_tasks::run(args)?,
        Command::PolicyProxy(args) => policy_proxy::run(args)?,
        Command::Doctor(args) => return Ok(ExitCode::from(doctor::main(&args))),
        Command::SeedWorkspace(args) => {
            return Ok(ExitCode::from(
                u8::try_from(swebench_pod::seed(&args)).unwrap_or(1),
            ))
        }
        Command::SwebenchBridge(args) => swebench_pod::bridge(args)?,
        Command::Tasks(args) => {
            return Ok(ExitCode::from(
                u8::try_from(tasks::main(&args)).unwrap_or(2),
            ))
        }
        Command::Run(args) => {
            return Ok(ExitCode::from(u8::try_from(run::main(args)).unwrap_or(1)))
        }
        Command::RunWatchdog { parent, tag } => {
            return Ok(ExitCode::from(
                u8::try_from(run::watchdog(parent, &tag)).unwrap_or(1),
            ))
        }
        Command::SandboxUserns => {
            return Ok(ExitCode::from(
                u8::try_from(floe_sandbox::sandbox_user::hold_new_namespace()).unwrap_or(1),
            ))
        }
        Command::SandboxExec {
            listen,
            socket,
            no_stragglers,
            r#become,
            command,
        } => {
            return Ok(ExitCode::from(sandbox_exec(
                listen.zip(socket),
                no_stragglers,
                r#become,
                command,
            )))
        }
        Command::Agent(args) => {
            return Ok(ExitCode::from(
                u8::try_from(sandbox::agent_main(args)).unwrap_or(3),
            ))
        }
        Command::Sandbox(args) => {
            return Ok(ExitCode::from(
                u8::try_from(sandbox::main(args)).unwrap_or(3),
            ))
        }
        Command::Trajectories { command } => {
            let stdout = std::io::stdout();
            trajectories::run(command, &mut std::io::BufWriter::new(stdout.lock()))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // `floe run` draws its own progress; library logs there are for problems only.
    let default_level = if matches!(cli.command, Command::Run(_)) {
        "warn"
    } else {
        "info"
    };
    let logs = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FLOE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level)),
        )
        .with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().flatten_event(true).init(),
    }
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("floe: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod docs_tests {
    use std::collections::BTreeSet;

    use clap::CommandFactory;

    use super::Cli;

    /// The `--flags` in `text`.
    fn flags_in(text: &str) -> BTreeSet<String> {
        text.split("--")
            .skip(1)
            .map(|rest| {
                rest.chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                    .collect::<String>()
            })
            .filter(|f| f.starts_with(|c: char| c.is_ascii_lowercase()))
            .collect()
    }

    /// Each subcommand's synopsis in the docs names exactly its flags (global ones, like
    /// `--log-format`, are documented once, beside the logs).
    #[test]
    fn each_synopsis_lists_every_flag_of_its_command() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
        let first_block = |doc: &str| doc.split("```").nth(1).unwrap_or_default().to_string();
        let runner_flags = |doc: &str| {
            let after = doc.split("## Runner flags").nth(1).unwrap_or_default();
            after.split("\n\n").nth(1).unwrap_or_default().to_string()
        };
        type Locate = fn(&str) -> String;
        let synopses: [(&str, &str, Locate); 4] = [
            ("gateway", "docs/gateway.md", first_block),
            ("operator", "docs/operator.md", first_block),
            ("run", "docs/local-mode.md", first_block),
            ("sandbox", "docs/sandbox-contract.md", runner_flags),
        ];
        let cli = Cli::command();
        for (name, path, locate) in synopses {
            let doc = std::fs::read_to_string(format!("{root}/{path}")).expect(path);
            let documented = flags_in(&locate(&doc));
            let command = cli.find_subcommand(name).expect(name);
            let flags: BTreeSet<String> = command
                .get_arguments()
                .filter(|a| !a.is_global_set())
                .filter_map(|a| a.get_long().map(str::to_string))
                .filter(|f| f != "help" && f != "version")
                .collect();
            assert_eq!(
                documented, flags,
                "{path}'s `floe {name}` synopsis vs its flags"
            );
        }
    }
}
