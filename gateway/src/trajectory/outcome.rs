//! How a session's outcome turns into reward and trainability.
//!
//! - Completed: the evaluator's reward.
//! - Agent budget ran out (timeout): traces stay trainable, the job's failure reward (default
//!   0) — running out of budget is a failure of the policy.
//! - Infrastructure error or evaluator timeout: untrainable (every mask 0, reward `null`),
//!   flagged, so the trainer never counts it as a reward of 0.
//! - Interrupted (a snapshot of a session still running, shipped after each of a train job's
//!   calls): untrainable, reward `null`, masks as built, so that a stop the operator rules the
//!   agent's doing (an eviction for what it wrote, which kills the pod without a grace period)
//!   can still be trained as the loss it is, where nothing else of the session survives.
//!
//! A tool call the gateway could not parse is none of these: the call is kept as a trainable
//! negative (the model produced it), counted in `stats.unparsed_tool_calls`.

use super::types::{Evaluation, SessionStatus, Trajectory};
use crate::capture::upstream_errors::UpstreamErrors;

/// As JSON (the sandbox runner's result): `{"status": "completed", "evaluation": {...}}`,
/// `{"status": "agent_timeout"}`, `{"status": "infra_error", "message": "..."}`,
/// `{"status": "interrupted", "message": "..."}`,
/// `{"status": "evaluator_timeout"}`, `{"status": "unscored"}`.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum SessionOutcome {
    /// The harness exited (any code) and the evaluator scored the result.
    Completed { evaluation: Evaluation },
    /// The agent timeout fired; the evaluator's verdict, if it ran, is kept for the record.
    AgentTimeout {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        evaluation: Option<Evaluation>,
        /// The session's reward: the job's `evaluator.reward.failureReward` (0 from a runner
        /// older than that field).
        #[serde(default)]
        reward: f64,
    },
    /// Pod lost, prepare failed, gateway or evaluator crashed, …
    InfraError { message: String },
    /// No outcome yet: the session as it stands, shipped as a snapshot while it runs
    /// ([`crate::server::snapshot`]).
    Interrupted { message: String },
    /// The evaluator did not finish in time: the grade is unknown.
    EvaluatorTimeout,
    /// Not evaluated (yet), e.g. a capture inspected with `floe trajectories build`: tokens and
    /// masks as built, no reward, not trainable.
    Unscored,
}

/// The runner's outcome, corrected by what the gateway itself saw of the session's model calls.
/// A session is the infrastructure's failure, not the policy's result, when
/// - one of its calls failed at the model server after the gateway's retries (the agent went on
///   from an error the policy never caused), or
/// - none of its calls was answered: the policy never acted, so its reward measures nothing
///   (a harness that crashed before its first call, or one that bypassed the gateway).
///
/// Such a session is retried like any infrastructure failure and never scored or trained.
pub fn account_for_calls(
    outcome: SessionOutcome,
    answered_calls: usize,
    upstream: &UpstreamErrors,
) -> SessionOutcome {
    let scored = matches!(
        outcome,
        SessionOutcome::Completed { .. } | SessionOutcome::AgentTimeout { .. }
    );
    if !scored {
        return outcome;
    }
    let failed = upstream.failed_calls();
    if failed > 0 {
        SessionOutcome::InfraError {
            message: format!(
                "{failed} model call(s) failed at the model server ({}) after the gateway's retries; not scored",
                upstream.describe_failed()
            ),
        }
    } else if answered_calls == 0 {
        SessionOutcome::InfraError {
            message: "no model call of the session was answered (the harness made none through the gateway); not scored".into(),
        }
    } else {
        outcome
    }
}

pub fn apply_outcome(trajectory: &mut Trajectory, outcome: &SessionOutcome) {
    match outcome {
        SessionOutcome::Completed { evaluation } => {
            trajectory.status = SessionStatus::Completed;
            trajectory.reward = evaluation.reward;
            trajectory.trainable = evaluation.reward.is_some();
            trajectory.evaluation = Some(evaluation.clone());
            if !trajectory.trainable {
                mask_out(trajectory);
            }
        }
        SessionOutcome::AgentTimeout { evaluation, reward } => {
            trajectory.status = SessionStatus::Timeout;
            trajectory.reward = Some(*reward);
            trajectory.trainable = true;
            trajectory.evaluation = evaluation.clone();
        }
        SessionOutcome::InfraError { message } => {
            mark_untrainable(trajectory, serde_json::json!({"error": message}));
        }
        SessionOutcome::Interrupted { message } => {
            trajectory.status = SessionStatus::Interrupted;
            trajectory.reward = None;
            trajectory.trainable = false;
            trajectory.evaluation = Some(Evaluation {
                reward: None,
                passed: None,
                detail: serde_json::json!({"interrupted": message}),
            });
        }
        SessionOutcome::EvaluatorTimeout => {
            mark_untrainable(
                trajectory,
                serde_json::json!({"error": "evaluator timed out"}),
            );
        }
        SessionOutcome::Unscored => {
            trajectory.status = SessionStatus::Completed;
            trajectory.reward = None;
            trajectory.trainable = false;
            trajectory.evaluation = None;
        }
    }
}

fn mark_untrainable(trajectory: &mut Trajectory, detail: serde_json::Value) {
    trajectory.status = SessionStatus::Error;
    trajectory.reward = None;
    trajectory.trainable = false;
    trajectory.evaluation = Some(Evaluation {
        reward: None,
        passed: None,
        detail,
    });
    mask_out(trajectory);
}

fn mask_out(trajectory: &mut Trajectory) {
    for trace in &mut trajectory.traces {
        trace.loss_mask.iter_mut().for_each(|m| *m = 0);
    }
    trajectory.stats.trainable_tokens = 0;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn completed() -> SessionOutcome {
        SessionOutcome::Completed {
            evaluation: Evaluation {
                reward: Some(1.0),
                passed: Some(true),
                detail: serde_json::Value::Null,
            },
        }
    }

    #[test]
    fn a_failed_model_call_makes_the_session_the_infrastructure_s() {
        let mut upstream = UpstreamErrors::default();
        upstream.retried.insert("connect".into(), 5);
        // Retried and then answered: the policy's session.
        assert_eq!(account_for_calls(completed(), 3, &upstream), completed());
        upstream.failed.insert("http_502".into(), 1);
        let SessionOutcome::InfraError { message } = account_for_calls(completed(), 3, &upstream)
        else {
            panic!("not reclassified");
        };
        assert!(message.contains("http_502 ×1"), "{message}");
        let timeout = SessionOutcome::AgentTimeout {
            evaluation: None,
            reward: 0.0,
        };
        assert!(matches!(
            account_for_calls(timeout, 2, &upstream),
            SessionOutcome::InfraError { .. }
        ));
    }

    #[test]
    fn a_session_without_an_answered_call_is_never_scored() {
        let none = UpstreamErrors::default();
        assert!(matches!(
            account_for_calls(completed(), 0, &none),
            SessionOutcome::InfraError { .. }
        ));
        // Outcomes that are already unscored stay as they are.
        assert_eq!(
            account_for_calls(SessionOutcome::EvaluatorTimeout, 0, &none),
            SessionOutcome::EvaluatorTimeout
        );
        assert_eq!(
            account_for_calls(SessionOutcome::Unscored, 0, &none),
            SessionOutcome::Unscored
        );
    }
}
