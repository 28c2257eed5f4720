//! How a session's outcome turns into reward and trainability.
//!
//! - Completed: the evaluator's reward.
//! - Agent budget ran out (timeout): traces stay trainable, reward 0 — running out of budget is
//!   a failure of the policy.
//! - Infrastructure error or evaluator timeout: untrainable (every mask 0, reward `null`),
//!   flagged, so the trainer never counts it as a reward of 0.
//!
//! A tool call the gateway could not parse is none of these: the call is kept as a trainable
//! negative (the model produced it), counted in `stats.unparsed_tool_calls`.

use super::types::{Evaluation, SessionStatus, Trajectory};

/// As JSON (the sandbox runner's result): `{"status": "completed", "evaluation": {...}}`,
/// `{"status": "agent_timeout"}`, `{"status": "infra_error", "message": "..."}`,
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
    },
    /// Pod lost, prepare failed, gateway or evaluator crashed, …
    InfraError { message: String },
    /// The evaluator did not finish in time: the grade is unknown.
    EvaluatorTimeout,
    /// Not evaluated (yet), e.g. a capture inspected with `floe trajectories build`: tokens and
    /// masks as built, no reward, not trainable.
    Unscored,
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
        SessionOutcome::AgentTimeout { evaluation } => {
            trajectory.status = SessionStatus::Timeout;
            trajectory.reward = Some(0.0);
            trajectory.trainable = true;
            trajectory.evaluation = evaluation.clone();
        }
        SessionOutcome::InfraError { message } => {
            mark_untrainable(trajectory, serde_json::json!({"error": message}));
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
