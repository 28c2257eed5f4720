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
    #[error(transparent)]
    Serve(#[from] crate::serve_http::ServeError),
}

pub fn run(args: ServeTasksArgs) -> Result<(), ServeTasksError> {
    let text =
        std::fs::read(&args.file).map_err(|e| ServeTasksError::Read(args.file.clone(), e))?;
    let app = axum::Router::new()
        .route(
            "/tasks",
            get(move || {
                let text = text.clone();
                async move { ([(header::CONTENT_TYPE, "application/x-ndjson")], text) }
            }),
        )
        .route("/healthz", get(|| async { "ok" }));
    let what = format!("serving tasks from {}", args.file.display());
    Ok(crate::serve_http::serve_blocking(
        app,
        args.listen,
        1,
        &what,
    )?)
}
