//! `floe collect`: the dataset collector pod of an `sft` RolloutJob (see
//! `floe_gateway::ship::collector`).

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;
use floe_gateway::ship::collector::{serve, CollectError, Collector, Run};

/// The job's ingest token; posts without it are refused.
pub const INGEST_TOKEN_ENV: &str = "FLOE_INGEST_TOKEN";
/// The job's teacher (`spec.sft.upstream`, JSON), named in `summary.json`.
pub const TEACHER_ENV: &str = "FLOE_TEACHER";

#[derive(Args)]
pub struct CollectArgs {
    /// Address the sandbox pods' gateways ship to.
    #[arg(long, default_value = "0.0.0.0:8100")]
    listen: SocketAddr,
    /// Dataset directory (on the job's output volume).
    #[arg(long)]
    dir: PathBuf,
    /// Trajectories with a lower reward go to `rejected/` (default: every trainable one is
    /// accepted).
    #[arg(long)]
    min_reward: Option<f64>,
    /// The job this collector writes for (named in `owner.json`).
    #[arg(long, default_value = "")]
    job: String,
    /// That job's uid: the directory is this run's (recorded in `owner.json`), and one another
    /// run recorded is refused. Without it nothing is checked.
    #[arg(long)]
    job_uid: Option<String>,
    /// Largest trajectory accepted, in bytes.
    #[arg(long, default_value_t = 256 * 1024 * 1024)]
    max_body_bytes: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum CollectCliError {
    #[error(transparent)]
    Collect(#[from] CollectError),
    #[error(
        "dataset directory {dir} is not writable by uid {uid} gid {gid}, the collector's user: {source}. \
         The volume does not give the pod's fsGroup write access (hostPath and some NFS exports \
         ignore fsGroup): make the directory writable by that user, or set \
         spec.sft.output.runAsUser/runAsGroup to its owner"
    )]
    NotWritable {
        dir: PathBuf,
        uid: u32,
        gid: u32,
        source: std::io::Error,
    },
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
}

pub fn run(args: CollectArgs) -> Result<(), CollectCliError> {
    let run = Run {
        job: &args.job,
        uid: args.job_uid.as_deref(),
    };
    let collector = match Collector::open(&args.dir, args.min_reward, run) {
        Ok(c) => c,
        Err(CollectError::Io(dir, e)) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            return Err(CollectCliError::NotWritable {
                dir,
                uid: nix::unistd::getuid().as_raw(),
                gid: nix::unistd::getgid().as_raw(),
                source: e,
            })
        }
        Err(e) => return Err(e.into()),
    };
    let token = floe_gateway::bearer::token_from_env(INGEST_TOKEN_ENV, "post trajectories");
    // Set by the operator from `spec.sft.upstream`; a value that is no JSON is kept as text.
    let teacher = std::env::var(TEACHER_ENV)
        .ok()
        .map(|t| serde_json::from_str(&t).unwrap_or(serde_json::Value::String(t)));
    let collector = collector.with_token(token).with_teacher(teacher);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(CollectCliError::Runtime)?;
    runtime.block_on(serve(
        args.listen,
        collector,
        args.max_body_bytes,
        floe_operator::run::shutdown_signal(),
    ))?;
    Ok(())
}
