//! `floe serve-tasks`: a `tasks.file` RolloutJob's task loader pod. The operator reads no
//! volumes itself; this pod mounts the job's PVC read-only and serves the JSONL file to it
//! (`GET /tasks`). The file is read once at start: a missing or unreadable file ends the pod
//! with the reason as its termination message, which the operator reports on the job.

use std::net::SocketAddr;
use std::path::PathBuf;

use axum::http::header;
use axum::routing::get;
use clap::Args;

#[derive(Args)]
pub struct ServeTasksArgs {
    /// The JSONL task file (on the job's volume).
    #[arg(long)]
    file: PathBuf,
    #[arg(long, default_value = "0.0.0.0:8100")]
    listen: SocketAddr,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeTasksError {
    #[error("cannot read the task file {0}: {1}")]
    Read(PathBuf, std::io::Error),
    #[error("cannot listen on {0}: {1}")]
    Listen(SocketAddr, std::io::Error),
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
}

pub fn run(args: ServeTasksArgs) -> Result<(), ServeTasksError> {
    let text =
        std::fs::read(&args.file).map_err(|e| ServeTasksError::Read(args.file.clone(), e))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(ServeTasksError::Runtime)?;
    runtime.block_on(async move {
        let app = axum::Router::new()
            .route(
                "/tasks",
                get(move || {
                    let text = text.clone();
                    async move { ([(header::CONTENT_TYPE, "application/x-ndjson")], text) }
                }),
            )
            .route("/healthz", get(|| async { "ok" }));
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .map_err(|e| ServeTasksError::Listen(args.listen, e))?;
        tracing::info!(file = %args.file.display(), listen = %args.listen, "serving tasks");
        axum::serve(listener, app)
            .with_graceful_shutdown(floe_operator::run::shutdown_signal())
            .await
            .map_err(|e| ServeTasksError::Listen(args.listen, e))
    })
}
