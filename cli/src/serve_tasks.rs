//! `floe serve-tasks`: a RolloutJob's task loader pod, for `tasks.file` and
//! `train.heldOut.tasks.file`. The operator reads no volumes itself; this pod mounts the
//! claims read-only and serves the JSONL files to it (`GET /tasks`, `GET /held-out`). The
//! files are read once at start: a missing or unreadable one ends the pod with the reason as
//! its termination message, which the operator reports on the job. They hold every task's
//! hidden tests, so they are served only to a caller with the token of
//! [`TASKS_TOKEN_ENV`] (the operator's Secret): a sandbox
//! pod on a cluster whose CNI does not enforce NetworkPolicy reaches this port too.

use std::net::SocketAddr;
use std::path::PathBuf;

use axum::http::{header, HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use clap::Args;
use floe_gateway::bearer;
use floe_operator::rollout::TASKS_TOKEN_ENV;

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
    let token = bearer::token_from_env(TASKS_TOKEN_ENV, "read every task's hidden files");
    let (app, what) = routes(&args, token)?;
    Ok(crate::serve_http::serve_blocking(
        app,
        args.listen,
        floe_gateway::serve_limited::Limits::CONTROL,
        1,
        &what,
    )?)
}

/// The files' routes, each answered only to a caller showing `token` (when there is one), and
/// what is served, in words.
fn routes(
    args: &ServeTasksArgs,
    token: Option<String>,
) -> Result<(axum::Router, String), ServeTasksError> {
    let mut app = axum::Router::new().route("/healthz", get(|| async { "ok" }));
    let mut what = Vec::new();
    for (route, file) in [("/tasks", &args.file), ("/held-out", &args.held_out)] {
        let Some(file) = file else { continue };
        let text = std::fs::read(file).map_err(|e| ServeTasksError::Read(file.clone(), e))?;
        let token = token.clone();
        app = app.route(
            route,
            get(move |headers: HeaderMap| {
                let text = text.clone();
                let shown = token
                    .as_deref()
                    .is_none_or(|t| bearer::carries(&headers, t));
                async move {
                    if !shown {
                        return (StatusCode::UNAUTHORIZED, "the operator's token, please\n")
                            .into_response();
                    }
                    ([(header::CONTENT_TYPE, "application/x-ndjson")], text).into_response()
                }
            }),
        );
        what.push(format!("{route} from {}", file.display()));
    }
    if what.is_empty() {
        return Err(ServeTasksError::NoFile);
    }
    Ok((app, format!("serving tasks: {}", what.join(", "))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_files_are_served_only_to_a_caller_with_the_token(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let file = dir.path().join("tasks.jsonl");
        std::fs::write(&file, "{\"id\": \"t\", \"hidden\": \"the answer\"}\n")?;
        let args = ServeTasksArgs {
            file: Some(file),
            held_out: None,
            listen: "127.0.0.1:0".parse()?,
        };
        let (app, _) = routes(&args, Some("s3cret".into()))?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        tokio::spawn(async move { axum::serve(listener, app).await });
        let http = reqwest::Client::new();
        let get = |token: Option<&str>| {
            let mut request = http.get(format!("{url}/tasks"));
            if let Some(t) = token {
                request = request.bearer_auth(t);
            }
            request.send()
        };
        for wrong in [None, Some("s3cre"), Some("s3cret2")] {
            let answer = get(wrong).await?;
            assert_eq!(answer.status(), 401, "{wrong:?}");
            assert!(!answer.text().await?.contains("the answer"));
        }
        let answer = get(Some("s3cret")).await?;
        assert_eq!(answer.status(), 200);
        assert!(answer.text().await?.contains("the answer"));
        let health = http.get(format!("{url}/healthz")).send().await?;
        assert_eq!(health.status(), 200, "the kubelet's probe needs no token");
        Ok(())
    }
}
