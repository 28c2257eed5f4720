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
        .with_state(state);
    crate::serve_http::serve_blocking(
        app,
        args.listen,
        floe_gateway::serve_limited::Limits::CONTROL,
        2,
        "swebench bridge listening",
    )
}

/// A 16 MiB log of control characters is about 96 MiB once JSON-escaped.
const BODY_LIMIT: usize = 160 << 20;

/// The bridge's answer, or `{"error": …}`; 401 without the token. The agent shares the pod's
/// loopback: its calls are refused on their headers, before any body is read (bodies read
/// first, many at once, could run the bridge out of memory, and every grading after it would
/// fail as infrastructure), and the runner's are read one at a time.
async fn answer(
    State(bridge): State<Arc<Bridge>>,
    request: axum::extract::Request,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    if bridge.token.trim().is_empty()
        || !floe_gateway::bearer::carries(request.headers(), bridge.token.trim())
    {
        return axum::http::StatusCode::UNAUTHORIZED.into_response();
    }
    floe_gateway::serve_limited::Vouch::for_request(&request);
    let Ok(_one) = bridge.one.acquire().await else {
        return axum::http::StatusCode::SERVICE_UNAVAILABLE.into_response();
    };
    let body = match axum::body::to_bytes(request.into_body(), BODY_LIMIT).await {
        Ok(b) => b,
        Err(e) => return Json(json!({"error": format!("body: {e}")})).into_response(),
    };
    let request: serde_json::Value = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return Json(json!({"error": format!("not JSON: {e}")})).into_response(),
    };
    use floe_sandbox::swebench_grade::{call_python, CallError};
    match call_python(&bridge.python, request).await {
        Ok(answer) => Json(answer).into_response(),
        // Its Python could not run: the log was never read (the runner's infrastructure).
        Err(CallError::Unreachable(e)) => (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"error": e})),
        )
            .into_response(),
        // It ran and could not grade: what the log made of it (the session's).
        Err(CallError::Failed(e)) => Json(json!({"error": e})).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    /// An agent's call without the token, announcing 100 MB it never sends: refused at
    /// once on its headers (a bridge reading bodies first would wait for it, and hold it).
    /// A sidecar with `python` and the token `t0ken`, serving on loopback: its address.
    async fn sidecar(python: &str) -> std::net::SocketAddr {
        let state = Arc::new(Bridge {
            python: PathBuf::from(python),
            token: "t0ken".into(),
            one: tokio::sync::Semaphore::new(1),
        });
        let app = axum::Router::new()
            .route("/", axum::routing::post(answer))
            .with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let address = listener.local_addr().expect("its address");
        tokio::spawn(async move { axum::serve(listener, app).await });
        address
    }

    #[tokio::test]
    async fn a_call_without_the_token_is_refused_before_its_body_is_read() {
        let address = sidecar("/nonexistent/python").await;
        let mut stream = tokio::net::TcpStream::connect(address)
            .await
            .expect("connected");
        stream
            .write_all(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100000000\r\n\r\n{")
            .await
            .expect("sent");
        let mut answer = [0u8; 64];
        let n = tokio::time::timeout(std::time::Duration::from_secs(10), stream.read(&mut answer))
            .await
            .expect("answered without the body")
            .expect("read");
        let answer = String::from_utf8_lossy(&answer[..n]);
        assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    }

    /// The sidecar's own Python that cannot run is infrastructure (a 503, which the runner
    /// reads as no verdict to give), never the session's 0; one that runs and cannot grade
    /// is the log's (the session's).
    #[tokio::test]
    async fn a_sidecar_whose_python_cannot_run_is_not_a_sessions_zero() {
        use floe_sandbox::swebench_grade::{Bridge as Client, CallError};
        let grading: floe_crds::rollout_job::SweBenchGrading = serde_json::from_value(json!({
                "instanceId": "acme__calc-1", "repo": "acme/calc", "version": "1.0",
                "logParser": "parse_log_pytest", "failToPass": ["t::a"], "passToPass": [],
                "testPatch": "x", "repositoryDirectory": "/testbed"}))
        .expect("grading");
        for (python, unreachable) in [("/nonexistent/python", true), ("/bin/false", false)] {
            let url = format!("http://{}/", sidecar(python).await);
            let client = Client::Url {
                url,
                token: "t0ken".into(),
            };
            let graded = client
                .grade(&grading, "#!/bin/bash\n", "log", None, false)
                .await;
            match graded {
                Err(CallError::Unreachable(_)) => assert!(unreachable, "{python}"),
                Err(CallError::Failed(_)) => assert!(!unreachable, "{python}"),
                Ok(g) => panic!("{python}: graded {g:?}"),
            }
        }
    }
}
