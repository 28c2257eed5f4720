//! The gateway HTTP server: the harness-facing provider APIs, the operator-facing control API,
//! health and metrics. Handlers stay thin: protocol work is in [`crate::protocol`], the shared
//! call path in [`complete`].

mod assignments;
mod complete;
mod control;
mod metrics;
mod model_api;
mod reply;
pub use reply::ASSIGNED_DIFFERENTLY;
pub mod session_store;
pub mod sessions;
mod shipping;
pub mod snapshot;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::middleware;
use axum::routing::{get, post};
use axum::Router;

pub use metrics::Metrics;
pub use model_api::REQUEST_CLASS_HEADER;
pub use session_store::{abandon_unfinished, drain, recover, redirect_trainer};
use sessions::Sessions;

use crate::protocol::upstream::CallLimits;

/// Everything `floe gateway` is started with.
#[derive(Clone, Debug)]
pub struct Config {
    pub listen: SocketAddr,
    /// A second address serving the same API, for the operator's control calls from outside
    /// the pod (`listen` then stays on loopback for the harness).
    pub control_listen: Option<SocketAddr>,
    /// Base URL of the OpenAI-compatible upstream (vLLM), without `/v1`.
    pub upstream_url: String,
    /// Model name sent upstream.
    pub upstream_model: String,
    /// The upstream's API key, sent as a bearer token to `upstream_url` only.
    pub upstream_api_key: Option<String>,
    /// vLLM or SGLang: how the token ids are asked for and read back.
    pub upstream_kind: crate::protocol::upstream::UpstreamKind,
    /// One subdirectory per session is created here.
    pub capture_dir: PathBuf,
    /// Trajectories wait here until their sink accepts them (survives restarts).
    pub spool_dir: PathBuf,
    /// Bearer token of the control API.
    pub control_token: String,
    pub max_body_bytes: usize,
    /// Cap on sampled tokens per call.
    pub max_response_tokens: u32,
    /// How far a capture record gets before the reply (`write` or `fsync`).
    pub durability: crate::capture::Durability,
    /// Interval of SSE keep-alive comments while the upstream works.
    pub keepalive: Duration,
    /// Deadline of one upstream call with its retries, unless the assignment sets the job's.
    pub upstream_timeout: Duration,
    /// `/readyz` stays 503 until the sandbox runner reports its prepare steps done
    /// (`POST /floe/v1/runner/ready`): a pool pod is READY only then.
    pub require_runner_ready: bool,
    /// What the model API's port takes at once (the control port's are
    /// [`crate::serve_limited::Limits::CONTROL`]).
    pub connection_limits: crate::serve_limited::Limits,
}

pub struct Gateway {
    pub config: Config,
    pub limits: CallLimits,
    pub sessions: Sessions,
    pub metrics: Metrics,
    pub http: reqwest::Client,
    pub assignments: crate::ship::Assignments,
    pub spool: crate::ship::Spool,
    /// Sessions with a shipper running.
    pub shipping: std::sync::Mutex<std::collections::HashSet<String>>,
    /// The last failed delivery attempt of each session not yet shipped (for its outcome).
    pub delivery_errors: std::sync::Mutex<std::collections::HashMap<String, String>>,
    /// Serializes recording a session's outcome (a result and a shutdown may race), per
    /// session: building one session's trajectory (its calls are the agent's to shape) holds
    /// up no other session's finish.
    pub finishing: crate::sync::KeyedLocks,
    /// Flips to true when the gateway starts stopping (ends long polls).
    pub stopping: tokio::sync::watch::Sender<bool>,
    pub runner_ready: std::sync::atomic::AtomicBool,
    /// The metrics page as last served, and a signal on each serving: a stopping gateway
    /// waits for its final counters to be scraped ([`final_scrape`]).
    pub last_scrape: std::sync::Mutex<Option<String>>,
    pub scraped: tokio::sync::Notify,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot create capture dir {0}: {1}")]
    CaptureDir(PathBuf, std::io::Error),
    #[error("spool: {0}")]
    Spool(#[from] crate::ship::SpoolError),
    #[error("recovering sessions from disk: {0}")]
    Recover(#[from] session_store::StoreError),
    #[error("cannot build the upstream client: {0}")]
    Client(#[from] reqwest::Error),
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("cannot listen on {0}: {1}")]
    Listen(SocketAddr, std::io::Error),
    #[error("server error: {0}")]
    Serve(std::io::Error),
}

impl Gateway {
    pub fn new(config: Config) -> Result<Arc<Self>, ServeError> {
        std::fs::create_dir_all(&config.capture_dir)
            .map_err(|e| ServeError::CaptureDir(config.capture_dir.clone(), e))?;
        // No client-wide timeout: each upstream call carries its session's deadline, and
        // shipping has its own.
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .pool_max_idle_per_host(256)
            // floe's own servers close a connection idle 30 s (`serve_limited`): let go first.
            .pool_idle_timeout(crate::serve_limited::CLIENT_IDLE)
            .tcp_nodelay(true)
            .build()?;
        Ok(Arc::new(Self {
            limits: CallLimits {
                kind: config.upstream_kind,
                upstream_model: config.upstream_model.clone(),
                max_response_tokens: config.max_response_tokens,
                temperature: None,
                top_p: None,
                caller_sampling: Default::default(),
                call_deadline: config.upstream_timeout,
                hosted_tools: Default::default(),
                retry: Default::default(),
                session_budget: Default::default(),
            },
            sessions: Sessions::default(),
            metrics: Metrics::new()?,
            http,
            assignments: Default::default(),
            spool: crate::ship::Spool::open(&config.spool_dir)?,
            shipping: Default::default(),
            delivery_errors: Default::default(),
            finishing: Default::default(),
            stopping: tokio::sync::watch::Sender::new(false),
            runner_ready: Default::default(),
            last_scrape: Default::default(),
            scraped: Default::default(),
            config,
        }))
    }
}

impl Gateway {
    /// A session's upstream: the gateway's own, with what the assignment overrides (a job in
    /// train mode calls its trainer's vLLM; its sampling settings replace the harness's).
    pub fn upstream_for(&self, over: Option<&crate::ship::UpstreamOverride>) -> sessions::Upstream {
        let mut upstream = sessions::Upstream {
            url: self.config.upstream_url.clone(),
            api_key: self.config.upstream_api_key.clone(),
            limits: self.limits.clone(),
        };
        if let Some(o) = over {
            // The gateway's own key goes to its own upstream only, never to a job's server.
            if let Some(url) = &o.url {
                upstream.url = url.clone();
                upstream.api_key = None;
            }
            if let Some(key) = &o.api_key {
                upstream.api_key = Some(key.clone());
            }
            o.apply_to(&mut upstream.limits);
        }
        upstream
    }
}

pub fn router(gateway: Arc<Gateway>) -> Router {
    let control_api = Router::new()
        .route("/floe/v1/sessions", post(control::create_session))
        .route(
            "/floe/v1/sessions/{id}",
            get(control::get_session).delete(control::delete_session),
        )
        .route("/floe/v1/sessions/{id}/close", post(control::close_session))
        .route(
            "/floe/v1/sessions/{id}/result",
            post(assignments::post_result),
        )
        .route(
            "/floe/v1/assignments",
            post(assignments::post_assignment)
                .layer(DefaultBodyLimit::max(assignments::ASSIGNMENT_BODY_LIMIT)),
        )
        .route("/floe/v1/runner/ready", post(control::runner_ready))
        .route(
            "/floe/v1/assignments/next",
            get(assignments::next_assignment),
        )
        .route_layer(middleware::from_fn_with_state(
            gateway.clone(),
            control::require_control_token,
        ));
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(control::readyz))
        .route("/metrics", get(control::metrics))
        .merge(control_api)
        .route("/v1/chat/completions", post(model_api::chat_completions))
        .route("/v1/messages", post(model_api::messages))
        .route(
            "/v1/messages/count_tokens",
            post(model_api::anthropic_count_tokens),
        )
        .route("/api/hello", get(model_api::hello).head(model_api::hello))
        .route("/v1/responses", post(model_api::responses))
        .route("/v1beta/models/{model_method}", post(model_api::gemini))
        .route("/v1/models", get(model_api::models))
        .fallback(model_api::not_found)
        .with_state(gateway)
}

/// How long a stopping gateway keeps trying to ship what is left (pods get 30 s by default).
pub const DRAIN_DEADLINE: Duration = Duration::from_secs(20);

/// How long a stopping gateway that is scraped keeps its control port up for the scrape that
/// sees its final counters (with the drain, within a pod's default 30 s grace).
pub const FINAL_SCRAPE_WAIT: Duration = Duration::from_secs(25);

/// A session pod is deleted as soon as its result is folded, often within a second of its
/// last model call: without this, a failure in that second never reaches Prometheus (a pod
/// whose only call failed upstream showed nothing). When something scrapes this gateway and
/// the page changed since its last scrape, wait (at most `wait`) for one more scrape.
pub async fn final_scrape(gateway: &Gateway, wait: Duration) -> bool {
    let unseen = || {
        let last = crate::sync::lock(&gateway.last_scrape);
        last.as_ref()
            .is_some_and(|page| *page != gateway.metrics.render())
    };
    if !unseen() {
        return true;
    }
    tracing::info!(
        "waiting up to {} s for a scrape of the final metrics",
        wait.as_secs()
    );
    tokio::time::timeout(wait, async {
        loop {
            // Registered before the check: a scrape between the two is not missed.
            let scraped = gateway.scraped.notified();
            tokio::pin!(scraped);
            scraped.as_mut().enable();
            if !unseen() {
                return;
            }
            scraped.await;
        }
    })
    .await
    .is_ok()
}

/// Serve until `shutdown` resolves: recover sessions and the spool from disk first; when
/// stopping, let in-flight calls finish, then give unfinished sessions an outcome and drain;
/// the control port (metrics) stays up until the final counters are scraped.
pub async fn serve(
    config: Config,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let addrs: Vec<SocketAddr> = std::iter::once(config.listen)
        .chain(config.control_listen)
        .collect();
    let gateway = Gateway::new(config)?;
    let restored = recover(&gateway)?;
    let released = tokio::sync::watch::Sender::new(false);
    let mut servers = tokio::task::JoinSet::new();
    let mut control = tokio::task::JoinSet::new();
    for (i, addr) in addrs.into_iter().enumerate() {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| ServeError::Listen(addr, e))?;
        tracing::info!(addr = %listener.local_addr().map_err(ServeError::Serve)?, restored, "gateway listening");
        // The model API stops taking calls at once; the control port (a second listener)
        // serves until the drain and the final scrape are done.
        let mut until = if i == 0 {
            gateway.stopping.subscribe()
        } else {
            released.subscribe()
        };
        let app = router(gateway.clone());
        let limits = if i == 0 {
            gateway.config.connection_limits
        } else {
            crate::serve_limited::Limits::CONTROL
        };
        let server = crate::serve_limited::serve(listener, app, limits, async move {
            let _ = until.wait_for(|s| *s).await;
        });
        if i == 0 {
            servers.spawn(server);
        } else {
            control.spawn(server);
        }
    }
    shutdown.await;
    gateway.stopping.send_replace(true);
    while let Some(done) = servers.join_next().await {
        done.map_err(|e| ServeError::Serve(std::io::Error::other(e)))?;
    }
    drain(&gateway, DRAIN_DEADLINE).await;
    if !control.is_empty() && !final_scrape(&gateway, FINAL_SCRAPE_WAIT).await {
        tracing::warn!("no scrape saw the final metrics");
    }
    released.send_replace(true);
    while let Some(done) = control.join_next().await {
        done.map_err(|e| ServeError::Serve(std::io::Error::other(e)))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ship::UpstreamOverride;

    fn gateway(dir: &std::path::Path, key: Option<&str>) -> Arc<Gateway> {
        Gateway::new(Config {
            listen: "127.0.0.1:0".parse().expect("addr"),
            control_listen: None,
            upstream_url: "http://teacher:8000".into(),
            upstream_model: "policy".into(),
            upstream_api_key: key.map(str::to_string),
            upstream_kind: Default::default(),
            capture_dir: dir.join("captures"),
            spool_dir: dir.join("spool"),
            control_token: "control".into(),
            max_body_bytes: 1024,
            max_response_tokens: 16,
            durability: crate::capture::Durability::Write,
            keepalive: Duration::from_secs(5),
            upstream_timeout: Duration::from_secs(5),
            require_runner_ready: false,
            connection_limits: crate::serve_limited::Limits::SHARED,
        })
        .expect("gateway")
    }

    #[test]
    fn the_gateways_key_goes_to_its_own_upstream_only() -> Result<(), std::io::Error> {
        let dir = tempfile::tempdir()?;
        let g = gateway(dir.path(), Some("pool-key"));
        let key = |over: Option<UpstreamOverride>| g.upstream_for(over.as_ref()).api_key;
        assert_eq!(key(None).as_deref(), Some("pool-key"));
        let model_only = UpstreamOverride {
            model: Some("m".into()),
            ..Default::default()
        };
        assert_eq!(key(Some(model_only)).as_deref(), Some("pool-key"));
        // A job's own server never sees the pool's key; its own key replaces it.
        let elsewhere = UpstreamOverride {
            url: Some("http://policy:8000".into()),
            ..Default::default()
        };
        assert_eq!(key(Some(elsewhere.clone())), None);
        let with_key = UpstreamOverride {
            api_key: Some("job-key".into()),
            ..elsewhere
        };
        assert_eq!(key(Some(with_key)).as_deref(), Some("job-key"));
        Ok(())
    }

    #[test]
    fn a_jobs_retry_shape_replaces_the_default_for_its_sessions() -> Result<(), std::io::Error> {
        use crate::protocol::retry::RetryPolicy;
        let dir = tempfile::tempdir()?;
        let g = gateway(dir.path(), None);
        assert_eq!(g.upstream_for(None).limits.retry, RetryPolicy::default());
        let strict = UpstreamOverride {
            retry: Some(crate::ship::RetryOverride {
                first_backoff_millis: 1500,
                max_backoff_millis: 3000,
                http500_retries: 0,
            }),
            ..Default::default()
        };
        assert_eq!(
            g.upstream_for(Some(&strict)).limits.retry,
            RetryPolicy {
                first_backoff: Duration::from_millis(1500),
                max_backoff: Duration::from_secs(3),
                max_500_retries: 0,
            }
        );
        Ok(())
    }

    /// The model API's port is served within the gateway's connection limits: a head the
    /// agent never finishes is closed at the header timeout, and the port still serves.
    #[tokio::test]
    async fn the_model_port_does_not_hold_a_head_past_its_timeout() -> Result<(), std::io::Error> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let dir = tempfile::tempdir()?;
        let free = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let mut config = gateway(dir.path(), None).config.clone();
        config.listen = free;
        config.connection_limits = crate::serve_limited::Limits {
            max_connections: 4,
            max_per_peer: 4,
            this_host_share: 4,
            header_read_timeout: Duration::from_millis(300),
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn(serve(config, async {
            let _ = stopped.await;
        }));
        let connect = || async {
            for _ in 0..50 {
                if let Ok(c) = tokio::net::TcpStream::connect(free).await {
                    return Ok(c);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(std::io::Error::other("the gateway never listened"))
        };
        let mut slow = connect().await?;
        slow.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\n")
            .await?;
        let mut got = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(5), slow.read_to_end(&mut got)).await;
        assert!(closed.is_ok(), "the gateway held a half-sent head");
        let mut ready = connect().await?;
        ready
            .write_all(b"GET /readyz HTTP/1.1\r\nHost: g\r\nConnection: close\r\n\r\n")
            .await?;
        let mut answer = String::new();
        tokio::time::timeout(Duration::from_secs(5), ready.read_to_string(&mut answer))
            .await
            .map_err(std::io::Error::other)??;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        drop(stop);
        served
            .await
            .map_err(std::io::Error::other)?
            .map_err(std::io::Error::other)?;
        Ok(())
    }

    /// A stopping gateway waits for the scrape that sees its final counters when something
    /// scrapes it and the page changed since; not when nothing ever scraped it, or nothing
    /// changed; and never past its bound.
    #[tokio::test]
    async fn a_stopping_gateway_waits_for_the_scrape_of_its_final_counters(
    ) -> Result<(), std::io::Error> {
        let dir = tempfile::tempdir()?;
        let g = gateway(dir.path(), None);
        let bump = || g.metrics.error("upstream");
        let short = Duration::from_millis(200);
        // Never scraped: nothing to wait for.
        bump();
        assert!(final_scrape(&g, short).await);
        // Scraped, unchanged since: nothing to wait for.
        let _ = control::metrics(axum::extract::State(g.clone())).await;
        assert!(final_scrape(&g, short).await);
        // Changed since the last scrape, and nobody scrapes again: the bound ends the wait.
        bump();
        let started = std::time::Instant::now();
        assert!(!final_scrape(&g, short).await);
        assert!(started.elapsed() >= short);
        // Changed, and a scrape comes: the wait ends with it.
        let scraper = {
            let g = g.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let _ = control::metrics(axum::extract::State(g)).await;
            })
        };
        let started = std::time::Instant::now();
        assert!(final_scrape(&g, Duration::from_secs(10)).await);
        assert!(started.elapsed() < Duration::from_secs(5));
        scraper.await.map_err(std::io::Error::other)?;
        Ok(())
    }
}
