//! One small HTTP server for the `floe` commands that are nothing else (the task loader, the
//! policy proxy): its own runtime, the app on `listen`, a graceful stop on SIGTERM/SIGINT.

use std::net::SocketAddr;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {0}: {1}")]
    Listen(SocketAddr, std::io::Error),
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
}

/// Serve `app` within `limits` until a stop signal; `what` names the server in the start-up
/// log line.
pub fn serve_blocking(
    app: axum::Router,
    listen: SocketAddr,
    limits: floe_gateway::serve_limited::Limits,
    worker_threads: usize,
    what: &str,
) -> Result<(), ServeError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(worker_threads)
        .enable_all()
        .build()
        .map_err(ServeError::Runtime)?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|e| ServeError::Listen(listen, e))?;
        tracing::info!(%listen, "{what}");
        floe_gateway::serve_limited::serve(
            listener,
            app,
            limits,
            floe_operator::run::shutdown_signal(),
        )
        .await;
        Ok(())
    })
}
