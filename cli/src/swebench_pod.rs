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
}

pub fn bridge(args: BridgeArgs) -> Result<(), crate::serve_http::ServeError> {
    let python = Arc::new(args.python);
    let app = axum::Router::new()
        .route("/", axum::routing::post(answer))
        .layer(axum::extract::DefaultBodyLimit::max(64 << 20))
        .with_state(python);
    crate::serve_http::serve_blocking(app, args.listen, 2, "swebench bridge listening")
}

/// The bridge's answer, or `{"error": …}` (the runner makes that an infrastructure failure).
async fn answer(
    State(python): State<Arc<PathBuf>>,
    Json(request): Json<serde_json::Value>,
) -> Json<serde_json::Value> {
    Json(
        floe_sandbox::swebench_grade::call(&python, request)
            .await
            .unwrap_or_else(|e| json!({"error": e})),
    )
}
