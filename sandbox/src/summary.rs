//! How a session's result leaves the pod: a short JSON summary (Kubernetes caps termination
//! messages at 4096 bytes) and an exit code the operator can act on without parsing anything.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The runner's exit code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ExitKind {
    /// 0: the session ran, was scored and its trajectory shipped (whatever the reward).
    Success,
    /// 1: the harness failed or ran out of time; the session was still scored and shipped — a
    /// valid (usually negative) sample, not something to retry.
    AgentFailure,
    /// 2: the runner was started wrongly (bad flags).
    Usage,
    /// 3: infrastructure failure (prepare failed, harness binary missing, evaluator broken or
    /// timed out, gateway unreachable, trajectory not shipped): retry on a fresh sandbox; the
    /// session never counts as reward 0.
    Infrastructure,
}

impl ExitKind {
    pub fn code(self) -> i32 {
        match self {
            Self::Success => 0,
            Self::AgentFailure => 1,
            Self::Usage => 2,
            Self::Infrastructure => 3,
        }
    }
}

/// The termination message.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Summary {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    /// `completed`, `agent_failed`, `agent_timeout`, `infra_error`, `evaluator_timeout`.
    pub status: String,
    pub reward: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub passed: Option<bool>,
    /// Why the session scored as the policy's failure without its evaluator's verdict
    /// ([`crate::reward::FailureReason`]'s code: `evaluator_timeout`, `no_verdict`, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub harness_exit: Option<i32>,
    /// When the harness process was started (wall clock, milliseconds since the Unix epoch):
    /// with the pod's `floe.dev/claimed-at`, how long a claimed session took to start.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub harness_started_unix_ms: Option<u64>,
    /// When the runner's long poll returned the assignment (same clock): splits a claim's
    /// latency into its delivery to the pod and the runner's own start of the harness.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub assignment_received_unix_ms: Option<u64>,
    pub agent_seconds: f64,
    pub evaluator_seconds: f64,
    pub completions: u64,
    pub sampled_tokens: u64,
    pub trainable_tokens: u64,
    pub traces: u64,
    /// Calls whose harness left before the answer came (its own stream guard gave up): in no
    /// trace, nor in the counts above.
    #[serde(skip_serializing_if = "is_zero")]
    pub abandoned_calls: u64,
    /// Calls of a request class the job does not train on (`trajectory.excludeRequestClasses`):
    /// in no trace, nor in the counts above.
    #[serde(skip_serializing_if = "is_zero")]
    pub excluded_calls: u64,
    /// The calls by what the harness said each is for (Claude Code's request class), when
    /// it says (the trajectory's `stats.calls_by_class`, at most eleven keys).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub calls_by_class: BTreeMap<String, u64>,
    /// The first and last policy version whose weights sampled the session's calls (from the
    /// policy server's version header; none without one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy_versions: Option<[u64; 2]>,
    /// `shipped`, `pending` (still in the gateway's spool), `rejected`, `none`.
    pub shipment: String,
    /// Where the trajectory went (sink) — the full trajectory never passes through here.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trajectory: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Upstream failures the gateway met on this session's calls, by kind: retried attempts
    /// and calls that failed for the harness (which make the session an infrastructure error).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream_errors: Option<floe_gateway::capture::upstream_errors::UpstreamErrors>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Kubernetes keeps at most 4096 bytes of a termination message.
pub const MAX_MESSAGE_BYTES: usize = 4096;

/// The summary as JSON within [`MAX_MESSAGE_BYTES`]: the error text is shortened first.
pub fn render(summary: &Summary) -> String {
    let mut s = summary.clone();
    loop {
        let text = serde_json::to_string(&s).unwrap_or_default();
        if text.len() <= MAX_MESSAGE_BYTES {
            return text;
        }
        match &mut s.error {
            Some(e) if e.len() > 16 => {
                let keep = e.len().saturating_sub(text.len() - MAX_MESSAGE_BYTES + 16);
                let cut = (0..=keep)
                    .rev()
                    .find(|i| e.is_char_boundary(*i))
                    .unwrap_or(0);
                e.truncate(cut);
                e.push('…');
            }
            _ => {
                s.session = None;
                s.task = None;
                s.error = None;
                s.trajectory = None;
                s.upstream_errors = None;
                s.calls_by_class.clear();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_fits_the_kubernetes_limit() {
        let summary = Summary {
            session: Some("s".into()),
            status: "infra_error".into(),
            error: Some("é".repeat(10_000)),
            ..Default::default()
        };
        let text = render(&summary);
        assert!(text.len() <= MAX_MESSAGE_BYTES, "{}", text.len());
        let back: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
        assert_eq!(back["status"], "infra_error");
        assert_eq!(back["session"], "s");
    }

    #[test]
    fn exit_codes_are_distinct() {
        let codes = [
            ExitKind::Success,
            ExitKind::AgentFailure,
            ExitKind::Usage,
            ExitKind::Infrastructure,
        ]
        .map(ExitKind::code);
        assert_eq!(codes, [0, 1, 2, 3]);
    }
}
