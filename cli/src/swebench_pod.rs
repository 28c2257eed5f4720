//! The two pieces a pod grading SWE-bench instances runs besides the sandbox (docs/swebench.md):
//! - `floe seed-workspace`: an init container of the instance's image copies the image's
//!   repository directory (`/testbed`) into the workspace volume, which the pod mounts over it;
//!   the runner then checks the base commit out in place (one commit, no later history).
//! - `floe swebench-bridge`: a sidecar of an image that has the `swebench` package answers the
//!   runner's two calls (the eval script, the verdict on a log) on loopback, since an
//!   instance's image has no swebench and the runner's must not import anything from the
//!   workspace.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use clap::Args;
use serde_json::json;

#[derive(Args)]
pub struct SeedArgs {
    /// The image's directory (e.g. `/testbed`).
    #[arg(long)]
    from: PathBuf,
    /// The workspace volume, as this container mounts it.
    #[arg(long)]
    into: PathBuf,
}

/// Exit 0 when copied; 1 (with the reason) otherwise.
pub fn seed(args: &SeedArgs) -> i32 {
    match floe_sandbox::workspace::copy_tree_except(&args.from, &args.into, &[]) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!(
                "floe seed-workspace: {} → {}: {e}",
                args.from.display(),
                args.into.display()
            );
            1
        }
    }
}

#[derive(Args)]
pub struct BridgeArgs {
    #[arg(long, default_value = "127.0.0.1:8391")]
    listen: SocketAddr,
    /// The Python that has swebench.
    #[arg(long, default_value = "python3")]
    python: PathBuf,
    /// The bearer token every call must carry: the pod's control token, which the grader has
    /// and the agent (on the same loopback) has not.
    #[arg(long, env = "FLOE_CONTROL_TOKEN", hide_env_values = true)]
    token: String,
}

struct Bridge {
    python: PathBuf,
    token: String,
    /// One call at a time: a session grades once, and nothing else may queue work here.
    one: tokio::sync::Semaphore,
}

pub fn bridge(args: BridgeArgs) -> Result<(), crate::serve_http::ServeError> {
    let state = Arc::new(Bridge {
        python: args.python,
        token: args.token,
        one: tokio::sync::Semaphore::new(1),
    });
    let app = axum::Router::new()
        .route("/", axum::routing::post(answer))
        // A 16 MiB log of control characters is about 96 MiB once JSON-escaped.
        .layer(axum::extract::DefaultBodyLimit::max(160 << 20))
        .with_state(state);
    crate::serve_http::serve_blocking(app, args.listen, 2, "swebench bridge listening")
}

/// The bridge's answer, or `{"error": …}`; 401 without the token.
async fn answer(
    State(bridge): State<Arc<Bridge>>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    if bridge.token.trim().is_empty()
        || !floe_gateway::bearer::carries(&headers, bridge.token.trim())
    {
        return axum::http::StatusCode::UNAUTHORIZED.into_response();
    }
    let request: serde_json::Value = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return Json(json!({"error": format!("not JSON: {e}")})).into_response(),
    };
    let Ok(_one) = bridge.one.acquire().await else {
        return axum::http::StatusCode::SERVICE_UNAVAILABLE.into_response();
    };
    Json(
        floe_sandbox::swebench_grade::call(&bridge.python, request)
            .await
            .unwrap_or_else(|e| json!({"error": e})),
    )
    .into_response()
}
