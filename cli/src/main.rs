//! `floe`: one binary for the operator, the gateway sidecar, the sandbox runner and local mode.

use std::io::Write;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use floe_crds::generate::Target;

#[derive(Parser)]
#[command(
    name = "floe",
    version,
    about = "RL rollouts over unmodified coding-agent harnesses, on Kubernetes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the RolloutJob and GatewayPool CustomResourceDefinitions as multi-document YAML
    /// (`floe crds | kubectl apply -f -`).
    Crds {
        /// Render for this Kubernetes version (e.g. `1.20`); clusters older than 1.25 get the
        /// CRDs without CEL rules, which the operator then enforces itself.
        #[arg(long, value_name = "VERSION")]
        kube_version: Option<String>,
    },
}

#[derive(Debug, thiserror::Error)]
enum CliError {
    #[error("cannot render the CRDs: {0}")]
    Render(#[from] floe_crds::generate::GenerateError),
    #[error(transparent)]
    KubeVersion(#[from] floe_crds::generate::VersionError),
    #[error("cannot write to stdout: {0}")]
    Stdout(#[from] std::io::Error),
}

fn run(cli: Cli) -> Result<(), CliError> {
    match cli.command {
        Command::Crds { kube_version } => {
            let target = match kube_version {
                Some(v) => Target::for_kube_version(&v)?,
                None => Target::LATEST,
            };
            let yaml = floe_crds::generate::crds_yaml(target)?;
            std::io::stdout().lock().write_all(yaml.as_bytes())?;
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("floe: {e}");
            ExitCode::FAILURE
        }
    }
}
