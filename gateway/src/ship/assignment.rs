//! Assignments: the operator (or `floe run`) posts a session's assignment to the gateway; the
//! sandbox runner in the same pod long-polls for it. The gateway keeps what it needs to build
//! and ship the trajectory and hands the rest (`run`) to the runner untouched.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use super::Sink;
use crate::trajectory::Builder;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Assignment {
    /// Unique session id: the capture directory name and the trainer's idempotency key.
    pub session: String,
    /// Task id.
    pub task: String,
    /// GRPO group id (job + task).
    pub group: String,
    #[serde(default)]
    pub sample: u32,
    #[serde(default)]
    pub builder: Builder,
    /// Request classes whose calls its trajectory leaves out (the job's
    /// `trajectory.excludeRequestClasses`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude_classes: Vec<String>,
    /// Its trajectory is for imitation (an sft job's dataset): the calls a student should not
    /// copy train no token ([`crate::trajectory::BuildOptions::imitation`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub imitation: bool,
    #[serde(default)]
    pub sink: Sink,
    /// Where this session's calls go, when not the gateway's own upstream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<UpstreamOverride>,
    /// Copied into the trajectory.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, serde_json::Value>,
    /// What the sandbox runner needs (task, harness, evaluator, timeouts); opaque here.
    #[serde(default)]
    pub run: serde_json::Value,
}

/// Per-session upstream settings; each unset field keeps the gateway's own.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpstreamOverride {
    /// Base URL without `/v1` (e.g. the job's trainer vLLM Service).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Model name sent upstream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Bearer token for the upstream (a train job's policy server refuses calls without it:
    /// the agent shares the pod's network and must not call it past the capture).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    /// The server's kind (`vllm` or `sglang`), when not the gateway's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<crate::protocol::upstream::UpstreamKind>,
    /// The job's per-call response cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_response_tokens: Option<u32>,
    /// The job's sampling settings; they replace the harness's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// A train job's sampling contract for the caller's other parameters (unset: passed
    /// through, as an sft job's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller_sampling: Option<crate::protocol::sampling::CallerSampling>,
    /// The job's per-call deadline (`timeouts.modelCallSeconds`), retries included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_timeout_seconds: Option<u32>,
    /// The job's `harness.hostedTools`: refuse (default) or drop provider-hosted tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hosted_tools: Option<crate::protocol::HostedTools>,
    /// The job's `modelCallRetry`: how failed upstream attempts are retried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryOverride>,
    /// What one session may spend (`sampling.maxSessionTokens`, `maxCallsPerSession`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_budget: Option<crate::protocol::upstream::SessionBudget>,
}

/// A job's retry shape ([`crate::protocol::retry::RetryPolicy`]).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RetryOverride {
    pub first_backoff_millis: u32,
    pub max_backoff_millis: u32,
    pub http500_retries: u32,
}

impl From<RetryOverride> for crate::protocol::retry::RetryPolicy {
    fn from(o: RetryOverride) -> Self {
        Self {
            first_backoff: std::time::Duration::from_millis(o.first_backoff_millis.max(1).into()),
            max_backoff: std::time::Duration::from_millis(o.max_backoff_millis.max(1).into()),
            max_500_retries: o.http500_retries,
        }
    }
}

impl UpstreamOverride {
    /// A session's call limits: `limits` (the gateway's own) with what this overrides. One
    /// place, so that what a train run's fidelity check sends is what its sessions send.
    pub fn apply_to(&self, limits: &mut crate::protocol::upstream::CallLimits) {
        if let Some(kind) = self.kind {
            limits.kind = kind;
        }
        if let Some(model) = &self.model {
            limits.upstream_model = model.clone();
        }
        if let Some(max) = self.max_response_tokens {
            limits.max_response_tokens = max;
        }
        limits.temperature = self.temperature.or(limits.temperature);
        limits.top_p = self.top_p.or(limits.top_p);
        if let Some(mode) = self.caller_sampling {
            limits.caller_sampling = mode;
        }
        if let Some(seconds) = self.call_timeout_seconds {
            limits.call_deadline = Duration::from_secs(seconds.max(1).into());
        }
        if let Some(policy) = self.hosted_tools {
            limits.hosted_tools = policy;
        }
        if let Some(retry) = self.retry {
            limits.retry = retry.into();
        }
        if let Some(budget) = self.session_budget {
            limits.session_budget = budget;
        }
    }
}

/// An assignment as the runner receives it, with the session's model-API token.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Delivered {
    pub assignment: Assignment,
    pub token: String,
}

impl Delivered {
    /// What the runner may hold: without the job's ingest token and the upstream's key, which
    /// only the gateway uses. The runner grades code the agent wrote; what it never had, that
    /// code cannot take from it.
    pub fn for_the_runner(mut self) -> Self {
        if let Sink::Trainer { token, .. } = &mut self.assignment.sink {
            *token = None;
        }
        if let Some(upstream) = &mut self.assignment.upstream {
            upstream.api_key = None;
        }
        self
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum AssignmentError {
    #[error("session {0:?} was already assigned with different content")]
    Conflict(String),
}

/// Assignments not yet taken by a runner, in arrival order, and every assignment seen.
#[derive(Default)]
pub struct Assignments {
    state: Mutex<State>,
    arrived: Notify,
}

#[derive(Default)]
struct State {
    queue: VecDeque<String>,
    known: HashMap<String, (Delivered, bool)>,
}

impl Assignments {
    /// Queue an assignment. The same assignment again is a no-op (the operator retries);
    /// different content under a known session id is a conflict. Returns whether it is new.
    pub fn offer(&self, delivered: Delivered, taken: bool) -> Result<bool, AssignmentError> {
        let mut state = crate::sync::lock(&self.state);
        let session = delivered.assignment.session.clone();
        if let Some((known, _)) = state.known.get(&session) {
            return if known.assignment == delivered.assignment {
                Ok(false)
            } else {
                Err(AssignmentError::Conflict(session))
            };
        }
        if !taken {
            state.queue.push_back(session.clone());
        }
        state.known.insert(session, (delivered, taken));
        drop(state);
        self.arrived.notify_waiters();
        Ok(true)
    }

    pub fn get(&self, session: &str) -> Option<Delivered> {
        let state = crate::sync::lock(&self.state);
        state.known.get(session).map(|(d, _)| d.clone())
    }

    /// Every assignment seen, with whether a runner took it.
    pub fn all(&self) -> Vec<(Delivered, bool)> {
        let state = crate::sync::lock(&self.state);
        state.known.values().cloned().collect()
    }

    fn try_take(&self, only: Option<&str>) -> Option<Delivered> {
        let mut state = crate::sync::lock(&self.state);
        let position = match only {
            Some(id) => state.queue.iter().position(|s| s == id)?,
            None => 0,
        };
        let session = state.queue.remove(position)?;
        let entry = state.known.get_mut(&session)?;
        entry.1 = true;
        Some(entry.0.clone())
    }

    /// The next untaken assignment (or the one of session `only`), waiting up to `wait` for
    /// one to arrive.
    pub async fn take(&self, wait: Duration, only: Option<&str>) -> Option<Delivered> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            // Register interest before checking, so an offer between the check and the wait
            // is not missed.
            let arrived = self.arrived.notified();
            if let Some(d) = self.try_take(only) {
                return Some(d);
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                return self.try_take(only);
            }
        }
    }

    /// Forget a finished session's assignment (a long local run keeps no memory per session
    /// it has finished). Returns whether it was known.
    pub fn forget(&self, session: &str) -> bool {
        let mut state = crate::sync::lock(&self.state);
        state.queue.retain(|s| s != session);
        state.known.remove(session).is_some()
    }

    /// Take an untaken assignment out of the queue without delivering it (a run that will
    /// not run it, e.g. one abandoned when a local run resumes). Returns whether it was queued.
    pub fn withdraw(&self, session: &str) -> bool {
        let mut state = crate::sync::lock(&self.state);
        let Some(position) = state.queue.iter().position(|s| s == session) else {
            return false;
        };
        state.queue.remove(position);
        if let Some(entry) = state.known.get_mut(session) {
            entry.1 = true;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivered(session: &str, task: &str) -> Delivered {
        Delivered {
            assignment: Assignment {
                session: session.into(),
                task: task.into(),
                group: format!("job/{task}"),
                sample: 0,
                builder: Builder::default(),
                exclude_classes: Vec::new(),
                imitation: false,
                sink: Sink::None,
                upstream: None,
                metadata: BTreeMap::new(),
                run: serde_json::json!({"instruction": "x"}),
            },
            token: format!("tok-{session}"),
        }
    }

    #[test]
    fn the_runner_gets_neither_the_ingest_token_nor_the_upstream_key() {
        let mut d = delivered("s1", "t");
        d.assignment.sink = Sink::Trainer {
            url: "http://trainer:8100/v1/trajectories".into(),
            token: Some("ingest-secret".into()),
            snapshots: true,
        };
        d.assignment.upstream = Some(UpstreamOverride {
            url: Some("http://policy:8000".into()),
            api_key: Some("policy-secret".into()),
            ..Default::default()
        });
        let text = serde_json::to_string(&d.clone().for_the_runner()).expect("json");
        assert!(!text.contains("secret"), "{text}");
        // The rest is the runner's as it was: its session token, where trajectories go.
        assert!(
            text.contains("tok-s1") && text.contains("http://trainer:8100"),
            "{text}"
        );
        // The gateway's own copy keeps both.
        assert!(serde_json::to_string(&d)
            .expect("json")
            .contains("ingest-secret"));
    }

    #[tokio::test]
    async fn offers_are_idempotent_and_taken_once_in_order() {
        let a = Assignments::default();
        assert_eq!(a.offer(delivered("s1", "t"), false), Ok(true));
        assert_eq!(a.offer(delivered("s1", "t"), false), Ok(false));
        assert_eq!(
            a.offer(delivered("s1", "other"), false),
            Err(AssignmentError::Conflict("s1".into()))
        );
        assert_eq!(a.offer(delivered("s2", "t"), false), Ok(true));
        let first = a
            .take(Duration::ZERO, None)
            .await
            .map(|d| d.assignment.session);
        let second = a
            .take(Duration::ZERO, None)
            .await
            .map(|d| d.assignment.session);
        assert_eq!(
            (first.as_deref(), second.as_deref()),
            (Some("s1"), Some("s2"))
        );
        assert!(a.take(Duration::from_millis(10), None).await.is_none());
    }

    #[tokio::test]
    async fn a_waiting_runner_gets_a_later_offer() {
        let a = std::sync::Arc::new(Assignments::default());
        let waiter = {
            let a = a.clone();
            tokio::spawn(async move { a.take(Duration::from_secs(5), None).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        a.offer(delivered("late", "t"), false).ok();
        let got = waiter.await.ok().flatten().map(|d| d.assignment.session);
        assert_eq!(got.as_deref(), Some("late"));
    }

    #[test]
    fn restored_taken_assignments_are_not_queued_again() {
        let a = Assignments::default();
        a.offer(delivered("s1", "t"), true).ok();
        assert!(a.try_take(None).is_none());
        assert_eq!(a.all().len(), 1);
    }

    #[tokio::test]
    async fn a_runner_may_wait_for_its_own_session_and_a_withdrawn_one_is_never_delivered() {
        let a = Assignments::default();
        a.offer(delivered("s1", "t"), false).ok();
        a.offer(delivered("s2", "t"), false).ok();
        a.offer(delivered("s3", "t"), false).ok();
        let own = a.take(Duration::ZERO, Some("s2")).await;
        assert_eq!(own.map(|d| d.assignment.session).as_deref(), Some("s2"));
        assert!(a.take(Duration::ZERO, Some("s2")).await.is_none());
        assert!(a.withdraw("s1"));
        assert!(!a.withdraw("s1"));
        assert!(a.forget("s1") && !a.forget("s1"));
        assert!(a.get("s1").is_none());
        let next = a.take(Duration::ZERO, None).await;
        assert_eq!(next.map(|d| d.assignment.session).as_deref(), Some("s3"));
    }
}
