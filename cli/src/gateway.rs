//! `floe gateway`: the sidecar every sandbox pod runs (and `floe run` runs in-process).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use floe_gateway::capture::Durability;
use floe_gateway::server::{serve, Config, ServeError};

#[derive(Args)]
pub struct GatewayArgs {
    /// Address the harness and the operator reach the gateway on.
    #[arg(long, default_value = "127.0.0.1:8370")]
    listen: SocketAddr,
    /// Also serve on this address (in a pod: the pod IP's control port for the operator, while
    /// `--listen` stays on loopback for the harness).
    #[arg(long)]
    control_listen: Option<SocketAddr>,
    /// Base URL of the OpenAI-compatible model server (vLLM), without `/v1`; its key, if it
    /// takes one, in the environment variable `FLOE_UPSTREAM_API_KEY`.
    #[arg(long)]
    upstream: String,
    /// Model name sent upstream (vLLM's --served-model-name).
    #[arg(long, default_value = "policy")]
    upstream_model: String,
    /// The model server: vllm (`return_token_ids`) or sglang (`return_prompt_token_ids` and
    /// `return_meta_info`); each returns the token ids in its own fields.
    #[arg(long, default_value = "vllm")]
    upstream_kind: floe_gateway::protocol::upstream::UpstreamKind,
    /// Where each session's capture directory is created.
    #[arg(long)]
    capture_dir: PathBuf,
    /// Where trajectories wait for their sink (default: CAPTURE_DIR/.spool).
    #[arg(long)]
    spool_dir: Option<PathBuf>,
    /// File holding the control API's bearer token (from the pod's Secret).
    #[arg(long)]
    control_token_file: PathBuf,
    /// Largest request body accepted, in bytes.
    #[arg(long, default_value_t = 32 * 1024 * 1024)]
    max_body_bytes: usize,
    /// Cap on tokens sampled per model call (the job's response-length cap).
    #[arg(long, default_value_t = floe_crds::rollout_job::DEFAULT_MAX_RESPONSE_TOKENS as u32)]
    max_response_tokens: u32,
    /// fdatasync every capture record before replying (default: the record is written to the
    /// kernel, which survives a gateway crash; a lost node loses the single-use pod anyway).
    #[arg(long)]
    capture_fsync: bool,
    /// Seconds between SSE keep-alive comments while the upstream works.
    #[arg(long, default_value_t = 5)]
    keepalive_seconds: u64,
    /// Report ready (`/readyz`) only after the sandbox runner finished its prepare steps.
    #[arg(long)]
    require_runner_ready: bool,
    /// Deadline of one upstream call, its retries included, in seconds (a session's
    /// assignment sets its job's `timeouts.modelCallSeconds` instead).
    #[arg(long, default_value_t = 900)]
    upstream_timeout_seconds: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("cannot read the control token from {0}: {1}")]
    Token(PathBuf, std::io::Error),
    #[error("control token file {0} is empty")]
    EmptyToken(PathBuf),
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
    #[error(transparent)]
    Serve(#[from] ServeError),
}

pub fn run(args: GatewayArgs) -> Result<(), GatewayError> {
    let token = std::fs::read_to_string(&args.control_token_file)
        .map_err(|e| GatewayError::Token(args.control_token_file.clone(), e))?
        .trim()
        .to_string();
    if token.is_empty() {
        return Err(GatewayError::EmptyToken(args.control_token_file));
    }
    let config = Config {
        listen: args.listen,
        control_listen: args.control_listen,
        upstream_url: args.upstream,
        upstream_model: args.upstream_model,
        upstream_api_key: floe_gateway::bearer::env_secret(floe_gateway::bearer::UPSTREAM_KEY_ENV),
        upstream_kind: args.upstream_kind,
        spool_dir: args
            .spool_dir
            .unwrap_or_else(|| args.capture_dir.join(".spool")),
        capture_dir: args.capture_dir,
        control_token: token,
        max_body_bytes: args.max_body_bytes,
        max_response_tokens: args.max_response_tokens,
        durability: if args.capture_fsync {
            Durability::Fsync
        } else {
            Durability::Write
        },
        keepalive: Duration::from_secs(args.keepalive_seconds.max(1)),
        upstream_timeout: Duration::from_secs(args.upstream_timeout_seconds),
        require_runner_ready: args.require_runner_ready,
        connection_limits: floe_gateway::serve_limited::Limits::SESSION,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(GatewayError::Runtime)?;
    runtime.block_on(serve(config, async {
        floe_operator::run::shutdown_signal().await;
        tracing::info!("shutting down");
    }))?;
    Ok(())
}
