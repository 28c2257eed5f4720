//! The runner's client for its gateway's control API (bearer = the pod's control token).

use std::time::Duration;

use floe_gateway::ship::Delivered;
use floe_gateway::trajectory::SessionOutcome;
use serde_json::Value;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("gateway at {url} unreachable: {message}")]
    Unreachable { url: String, message: String },
    #[error("gateway answered {status} to {what}: {body}")]
    Status {
        what: String,
        status: u16,
        body: String,
    },
    #[error("no assignment arrived within {0:?}")]
    NoAssignment(Duration),
}

#[derive(Clone)]
pub struct GatewayClient {
    base: String,
    token: String,
    http: reqwest::Client,
}

impl GatewayClient {
    pub fn new(base: &str, token: &str) -> Self {
        Self {
            base: base.trim_end_matches('/').to_string(),
            token: token.to_string(),
            // The gateway closes a connection idle 30 s: let go first.
            http: reqwest::Client::builder()
                .pool_idle_timeout(std::time::Duration::from_secs(20))
                .build()
                .unwrap_or_default(),
        }
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    /// One request, retried on connection errors (the gateway sidecar may still be starting,
    /// or restarting) until `patience` is spent. HTTP errors are not retried.
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
        timeout: Duration,
        patience: Duration,
    ) -> Result<(u16, Value), ClientError> {
        let url = format!("{}{path}", self.base);
        let give_up = tokio::time::Instant::now() + patience;
        let mut backoff = Duration::from_millis(100);
        loop {
            let mut request = self
                .http
                .request(method.clone(), &url)
                .bearer_auth(&self.token)
                .timeout(timeout);
            if let Some(body) = body {
                request = request.json(body);
            }
            match request.send().await {
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    let text = resp.text().await.unwrap_or_default();
                    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
                    if (200..300).contains(&status) {
                        return Ok((status, value));
                    }
                    return Err(ClientError::Status {
                        what: format!("{method} {path}"),
                        status,
                        body: value.to_string(),
                    });
                }
                Err(e) if tokio::time::Instant::now() + backoff < give_up => {
                    tracing::debug!("gateway not reachable yet: {e}");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
                Err(e) => {
                    return Err(ClientError::Unreachable {
                        url,
                        message: e.to_string(),
                    })
                }
            }
        }
    }

    /// Tell the gateway this sandbox is prepared (its `/readyz` turns ready), and what its
    /// egress check reached that it should not have.
    pub async fn ready(&self, egress_unrestricted: Option<&str>) -> Result<(), ClientError> {
        let body = serde_json::json!({"egressUnrestricted": egress_unrestricted});
        self.call(
            reqwest::Method::POST,
            "/floe/v1/runner/ready",
            Some(&body),
            Duration::from_secs(10),
            Duration::from_secs(120),
        )
        .await
        .map(|_| ())
    }

    /// Long-poll until an assignment arrives (or `within` passes, when given).
    /// The next assignment (or session `only`'s), within `within` (`None`: wait forever).
    pub async fn assignment(
        &self,
        within: Option<Duration>,
        only: Option<&str>,
    ) -> Result<Delivered, ClientError> {
        let started = tokio::time::Instant::now();
        loop {
            let left = within.map(|w| w.saturating_sub(started.elapsed()));
            if left == Some(Duration::ZERO) {
                return Err(ClientError::NoAssignment(within.unwrap_or_default()));
            }
            let wait = left
                .unwrap_or(Duration::from_secs(30))
                .min(Duration::from_secs(30));
            let mut path = format!(
                "/floe/v1/assignments/next?waitSeconds={}",
                wait.as_secs().max(1)
            );
            if let Some(id) = only {
                // Session ids are [A-Za-z0-9._-]: nothing to escape.
                path.push_str(&format!("&session={id}"));
            }
            let (status, body) = self
                .call(
                    reqwest::Method::GET,
                    &path,
                    None,
                    wait + Duration::from_secs(10),
                    Duration::from_secs(120),
                )
                .await?;
            if status == 200 {
                return serde_json::from_value(body.clone()).map_err(|e| ClientError::Status {
                    what: "GET next assignment".into(),
                    status,
                    body: format!("unreadable assignment ({e}): {body}"),
                });
            }
        }
    }

    /// Seal the session's capture: the harness's token stops working.
    pub async fn close(&self, session: &str) -> Result<(), ClientError> {
        self.call(
            reqwest::Method::POST,
            &format!("/floe/v1/sessions/{session}/close"),
            None,
            Duration::from_secs(30),
            Duration::from_secs(60),
        )
        .await
        .map(|_| ())
    }

    /// Report the outcome; the gateway builds, spools and ships the trajectory. Returns its
    /// summary (status, reward, token counts, shipment).
    pub async fn result(
        &self,
        session: &str,
        outcome: &SessionOutcome,
    ) -> Result<Value, ClientError> {
        let body = serde_json::to_value(outcome).unwrap_or_default();
        // A 5xx is the gateway's storage (its outcome may be recorded and its trajectory not
        // yet spooled, which the same result posted again spools): asked twice more before the
        // session is given up as infrastructure.
        let mut tries = 0;
        loop {
            tries += 1;
            match self
                .call(
                    reqwest::Method::POST,
                    &format!("/floe/v1/sessions/{session}/result"),
                    Some(&body),
                    Duration::from_secs(120),
                    Duration::from_secs(120),
                )
                .await
            {
                Err(ClientError::Status { status, .. }) if status >= 500 && tries < 3 => {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
                done => return done.map(|(_, v)| v),
            }
        }
    }

    /// Wait until the trajectory left the spool (`shipped` or `rejected`), up to `within`.
    /// Returns the last shipment state seen, with the gateway's last delivery error when it
    /// was not shipped.
    pub async fn wait_shipped(&self, session: &str, within: Duration) -> (String, Option<String>) {
        let give_up = tokio::time::Instant::now() + within;
        let mut last = String::from("unknown");
        let mut error = None;
        loop {
            if let Ok((_, v)) = self
                .call(
                    reqwest::Method::GET,
                    &format!("/floe/v1/sessions/{session}"),
                    None,
                    Duration::from_secs(10),
                    Duration::from_secs(10),
                )
                .await
            {
                last = v["shipment"].as_str().unwrap_or("unknown").to_string();
                error = v["shipmentError"].as_str().map(str::to_owned);
                if last == "shipped" {
                    return (last, None);
                }
                if last == "rejected" {
                    return (last, error);
                }
            }
            if tokio::time::Instant::now() >= give_up {
                return (last, error);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A result the gateway failed to store (a 5xx) is posted again, twice at most: the same
    /// outcome again spools a trajectory whose first spooling failed.
    #[tokio::test]
    async fn a_result_answered_with_a_server_error_is_posted_again() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let url = format!("http://{}", listener.local_addr().expect("its address"));
        let served = tokio::spawn(async move {
            let mut posts = 0;
            for answer in [
                "HTTP/1.1 500 Internal Server Error\r\nconnection: close\r\ncontent-length: 2\r\n\r\n{}",
                "HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: 23\r\n\r\n{\"shipment\": \"pending\"}",
            ] {
                let (mut stream, _) = listener.accept().await.expect("a post");
                let mut buf = vec![0u8; 64 * 1024];
                let _ = stream.read(&mut buf).await;
                posts += 1;
                stream.write_all(answer.as_bytes()).await.expect("answered");
            }
            posts
        });
        let outcome: SessionOutcome = serde_json::from_value(
            serde_json::json!({"status": "completed", "evaluation": {"reward": 1.0}}),
        )
        .expect("outcome");
        let answer = GatewayClient::new(&url, "t")
            .result("s", &outcome)
            .await
            .expect("the second post");
        assert_eq!(answer["shipment"], "pending");
        assert_eq!(served.await.expect("server"), 2);
    }
}
