//! An in-process floe gateway on a free loopback port, with a control-API client.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Result};
use floe_gateway::server::{router, Config, Gateway};
use serde_json::{json, Value};

pub struct TestGateway {
    pub url: String,
    pub control_token: String,
    pub capture_dir: PathBuf,
    pub gateway: Arc<Gateway>,
    _dir: tempfile::TempDir,
    http: reqwest::Client,
}

impl TestGateway {
    /// Start a gateway in front of `upstream` with a per-call cap of `max_response_tokens`.
    pub async fn start(upstream: &str, max_response_tokens: u32) -> Result<Self> {
        Self::start_with_kind(upstream, max_response_tokens, Default::default()).await
    }

    /// [`TestGateway::start`] for an upstream of `kind` (vLLM or SGLang).
    pub async fn start_with_kind(
        upstream: &str,
        max_response_tokens: u32,
        kind: floe_gateway::protocol::upstream::UpstreamKind,
    ) -> Result<Self> {
        Self::start_with_deadline(
            upstream,
            max_response_tokens,
            kind,
            Duration::from_secs(300),
        )
        .await
    }

    /// [`TestGateway::start_with_kind`] with a per-call deadline (retries of a failing upstream
    /// included).
    pub async fn start_with_deadline(
        upstream: &str,
        max_response_tokens: u32,
        kind: floe_gateway::protocol::upstream::UpstreamKind,
        call_deadline: Duration,
    ) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let config = Config {
            listen: listener.local_addr()?,
            control_listen: None,
            upstream_url: upstream.to_string(),
            upstream_model: "policy".into(),
            upstream_api_key: None,
            upstream_kind: kind,
            capture_dir: dir.path().join("captures"),
            spool_dir: dir.path().join("spool"),
            control_token: "test-control-token".into(),
            max_body_bytes: 4 * 1024 * 1024,
            max_response_tokens,
            durability: floe_gateway::capture::Durability::Fsync,
            keepalive: Duration::from_secs(1),
            upstream_timeout: call_deadline,
            require_runner_ready: false,
            connection_limits: floe_gateway::serve_limited::Limits::SHARED,
        };
        let gateway = Gateway::new(config.clone())?;
        let app = router(gateway.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Ok(Self {
            url: format!("http://{}", config.listen),
            control_token: config.control_token,
            capture_dir: config.capture_dir,
            gateway,
            _dir: dir,
            http: reqwest::Client::new(),
        })
    }

    /// Create a session through the control API; returns its token.
    pub async fn session(&self, id: &str, task: &str, sample: u32) -> Result<String> {
        self.session_with(id, task, sample, json!({})).await
    }

    /// A session whose provider-hosted tools are dropped (a job's `hostedTools: Drop`), not
    /// refused.
    pub async fn session_dropping_hosted_tools(&self, id: &str) -> Result<String> {
        self.session_with(id, "t", 0, json!({"hostedTools": "drop"}))
            .await
    }

    /// A session with per-session upstream settings (an assignment's `upstream`).
    pub async fn session_with(
        &self,
        id: &str,
        task: &str,
        sample: u32,
        upstream: Value,
    ) -> Result<String> {
        let resp = self
            .http
            .post(format!("{}/floe/v1/sessions", self.url))
            .bearer_auth(&self.control_token)
            .json(&json!({"session": id, "task": task, "group": format!("test/{task}"), "sample": sample, "upstream": upstream}))
            .send()
            .await?;
        let status = resp.status();
        let body: Value = resp.json().await?;
        if !status.is_success() {
            bail!("create session: {status} {body}");
        }
        Ok(body["token"].as_str().unwrap_or_default().to_string())
    }

    /// Queue `assignment` as the operator does and take it as the sandbox runner does: the
    /// runner's `{"assignment": …, "token": …}`.
    pub async fn assign_and_take(&self, assignment: &Value) -> Result<Value> {
        let posted = self
            .http
            .post(format!("{}/floe/v1/assignments", self.url))
            .bearer_auth(&self.control_token)
            .json(assignment)
            .send()
            .await?;
        let status = posted.status();
        if status != reqwest::StatusCode::CREATED {
            bail!("assign: {status} {}", posted.text().await?);
        }
        let next = self
            .http
            .get(format!(
                "{}/floe/v1/assignments/next?waitSeconds=5",
                self.url
            ))
            .bearer_auth(&self.control_token)
            .send()
            .await?;
        Ok(next.json().await?)
    }

    pub async fn close(&self, id: &str) -> Result<Value> {
        let resp = self
            .http
            .post(format!("{}/floe/v1/sessions/{id}/close", self.url))
            .bearer_auth(&self.control_token)
            .send()
            .await?;
        Ok(resp.json().await?)
    }

    pub fn session_dir(&self, id: &str) -> PathBuf {
        self.capture_dir.join(id)
    }
}
