//! `floe serve-tasks`: a RolloutJob's task loader pod, for `tasks.file` and
//! `train.heldOut.tasks.file`. The operator reads no volumes itself; this pod mounts the
//! claims read-only and serves the JSONL files to it (`GET /tasks`, `GET /held-out`). The
//! files are read once at start: a missing or unreadable one ends the pod with the reason as
//! its termination message, which the operator reports on the job.

use std::net::SocketAddr;
use std::path::PathBuf;

use axum::http::header;
use axum::routing::get;
use clap::Args;

#[derive(Args)]
pub struct ServeTasksArgs {
    /// The job's JSONL task file (on its volume), served at `/tasks`.
    #[arg(long)]
    file: Option<PathBuf>,
    /// The job's held-out task file, served at `/held-out`.
    #[arg(long)]
    held_out: Option<PathBuf>,
    #[arg(long, default_value = "0.0.0.0:8100")]
    listen: SocketAddr,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeTasksError {
    #[error("cannot read the task file {0}: {1}")]
    Read(PathBuf, std::io::Error),
    #[error("nothing to serve: give --file, --held-out or both")]
    NoFile,
    #[error(transparent)]
    Serve(#[from] crate::serve_http::ServeError),
}

pub fn run(args: ServeTasksArgs) -> Result<(), ServeTasksError> {
    let mut app = axum::Router::new().route("/healthz", get(|| async { "ok" }));
    let mut what = Vec::new();
    for (route, file) in [("/tasks", &args.file), ("/held-out", &args.held_out)] {
        let Some(file) = file else { continue };
        let text = std::fs::read(file).map_err(|e| ServeTasksError::Read(file.clone(), e))?;
        app = app.route(
            route,
            get(move || {
                let text = text.clone();
                async move { ([(header::CONTENT_TYPE, "application/x-ndjson")], text) }
            }),
        );
        what.push(format!("{route} from {}", file.display()));
    }
    if what.is_empty() {
        return Err(ServeTasksError::NoFile);
    }
    let what = format!("serving tasks: {}", what.join(", "));
    Ok(crate::serve_http::serve_blocking(
        app,
        args.listen,
        floe_gateway::serve_limited::Limits::CONTROL,
        1,
        &what,
    )?)
}
