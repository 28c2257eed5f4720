//! Where trajectories go: the trainer's ingest endpoint, or a dataset directory (SFT).
//! Both are idempotent by session id, which is what makes spool replay exactly-once.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::spool::{write_durably, SpoolEntry};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Sink {
    /// `POST` each trajectory (JSON, `Idempotency-Key: <session>`) to the trainer's ingest URL.
    /// 2xx and 409 (already ingested) are success; 408, 429, 5xx and connection errors are
    /// retried; any other 4xx is a permanent refusal. With `token`, as a bearer token: the
    /// job's ingest token, which only floe's gateways hold (the agent, which shares the pod's
    /// network, can reach the ingest port but must not post trajectories of its own).
    #[serde(rename_all = "camelCase")]
    Trainer {
        url: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        token: Option<String>,
        /// After each call, post a snapshot of the running session to the trainer's
        /// `/v1/partial` beside `url` ([`crate::server::snapshot`]): a train job's pods, which
        /// the kubelet may evict with no grace period to ship anything.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        snapshots: bool,
    },
    /// Write `DIR/accepted/<session>.json` when the session is trainable, trains a token and
    /// its reward is at least `minReward` (any reward when unset), else
    /// `DIR/rejected/<session>.json`.
    #[serde(rename_all = "camelCase")]
    Dataset {
        dir: PathBuf,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        min_reward: Option<f64>,
    },
    /// Keep the trajectory in the gateway's spool only.
    #[default]
    None,
}

/// One delivery attempt to a trainer; a slower one is retried (the ingest is idempotent).
const DELIVERY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

#[derive(Debug, thiserror::Error)]
pub enum DeliveryError {
    /// Worth retrying (network, 5xx, 429, a full disk).
    #[error("{0}")]
    Retry(Failure),
    /// The sink refused it; retrying cannot help.
    #[error("{0}")]
    Permanent(String),
}

/// A delivery attempt that may succeed later: what happened, and its kind for the metric
/// (`dns`, `refused`, `timeout`, `tls`, `connect`, `broken`, `http_<status>`, `disk`).
#[derive(Debug)]
pub struct Failure {
    pub kind: String,
    pub message: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

fn retry(kind: impl Into<String>, message: String) -> DeliveryError {
    DeliveryError::Retry(Failure {
        kind: kind.into(),
        message,
    })
}

/// Deliver one spooled trajectory. Returns where it went.
pub async fn deliver(http: &reqwest::Client, entry: &SpoolEntry) -> Result<String, DeliveryError> {
    let trajectory = &entry.trajectory;
    match &entry.sink {
        Sink::None => Ok("spool".into()),
        Sink::Trainer { url, token, .. } => {
            let mut request = http
                .post(url)
                .timeout(DELIVERY_TIMEOUT)
                .header("idempotency-key", &trajectory.session)
                .json(trajectory);
            if let Some(token) = token {
                request = request.bearer_auth(token);
            }
            let resp = request.send().await.map_err(|e| {
                let (kind, chain) = crate::net_error::describe(&e);
                retry(kind, format!("POST {url}: {chain}"))
            })?;
            let status = resp.status();
            if status.is_success() || status.as_u16() == 409 {
                return Ok(url.clone());
            }
            let body = resp.text().await.unwrap_or_default();
            let message = format!("POST {url}: {status}: {}", truncate(&body, 500));
            if status.is_server_error() || matches!(status.as_u16(), 408 | 429) {
                Err(retry(format!("http_{}", status.as_u16()), message))
            } else {
                Err(DeliveryError::Permanent(message))
            }
        }
        Sink::Dataset { dir, min_reward } => {
            // A passing session with no token to train (every call abandoned, of an excluded
            // class, or not to be imitated) is no example: a line of nothing.
            let trains = trajectory.traces.iter().any(|t| t.loss_mask.contains(&1));
            let accepted = trajectory.trainable
                && trains
                && trajectory
                    .reward
                    .is_some_and(|r| min_reward.is_none_or(|min| r >= min));
            let sub = dir.join(if accepted { "accepted" } else { "rejected" });
            let path = sub.join(format!("{}.json", trajectory.session));
            let bytes = serde_json::to_vec(trajectory)
                .map_err(|e| DeliveryError::Permanent(e.to_string()))?;
            let write = move || -> Result<(), String> {
                std::fs::create_dir_all(&sub).map_err(|e| format!("{}: {e}", sub.display()))?;
                write_durably(&path, &bytes).map_err(|e| e.to_string())
            };
            let target = dir.display().to_string();
            tokio::task::spawn_blocking(write)
                .await
                .map_err(|e| retry("disk", e.to_string()))?
                .map_err(|e| retry("disk", e))?;
            Ok(target)
        }
    }
}

fn truncate(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}
