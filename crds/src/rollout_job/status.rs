//! `status`: what the operator (or `floe run`) observed of a job.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Observed state of the job.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RolloutJobStatus {
    /// `Pending`, `Running`, `Suspended`, `Succeeded` or `Failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<RolloutJobPhase>,
    /// `finished/total` sessions, for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
    /// Sessions by state.
    #[serde(default)]
    pub sessions: SessionCounts,
    /// Rewards of the scored sessions so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rewards: Option<RewardStats>,
    /// Progress of the trainer pod (`train` mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trainer: Option<TrainerProgress>,
    /// `Ready`, `Progressing`, `Complete`, `Failed`, `Suspended`, and kstatus `Reconciling`/`Stalled`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::k8s::<Vec<Condition>>")]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Sessions that finished with a reward, by index (task `i`, sample `s` → `i × numSamples + s`),
    /// as sorted ranges like `0-7,9` — the record that makes counting each session exactly once
    /// survive operator restarts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_indexes: Option<String>,
    /// Sessions that exhausted `backoffLimit` (no reward recorded), by index, as ranges.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_indexes: Option<String>,
    /// Infrastructure failures so far, by session index, of the sessions not yet done that had
    /// one; the next attempt of a session is this number. A session's entry goes when it is
    /// scored or failed for good (`sessions.retried` keeps the total).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub retries: BTreeMap<String, i32>,
    /// A train job's sessions that failed for good (their `backoffLimit` spent, or their pod
    /// evicted for what the agent wrote) that its trainer has not taken yet, by session index.
    /// The operator tells the trainer of each (`POST /v1/failed`) every round until it does,
    /// and the trainer's finish waits for them; kept here so that an operator restarted
    /// meanwhile still tells it (the trainer takes a repeat as the same ruling).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub untold_failures: BTreeMap<String, UntoldFailure>,
    /// Failed model-server attempts of the job's sessions by kind (`connect`, `timeout`,
    /// `http_503`, …): `retried` by the gateways within a call's deadline, and `failed` (the
    /// call failed for the harness; its session was an infrastructure failure, never scored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_errors: Option<UpstreamErrorCounts>,
    /// When the first session was claimed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::k8s::<Option<Time>>")]
    pub start_time: Option<Time>,
    /// When the job succeeded or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::k8s::<Option<Time>>")]
    pub completion_time: Option<Time>,
    /// A train job's fidelity check, made once before its first session
    /// (`spec.train.fidelityCheck`); judged against the spec as it is now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fidelity: Option<FidelityStatus>,
    /// A train job's held-out rounds (`spec.train.heldOut`), as they were opened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_out: Option<HeldOutStatus>,
    /// A digest of the job's tasks as read from their source (a ConfigMap is read again each
    /// round), with `numSamples` and `epochs`, recorded when its first session was claimed.
    /// Sessions are numbered by task order: a later change would take scored sessions for
    /// other tasks' and leave tasks never run, so it stalls the job (`TasksChanged`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks_digest: Option<String>,
}

/// `status.untoldFailures`: a sample that failed for good, as its trainer is to be told.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct UntoldFailure {
    /// The sample's GRPO group (`<job>/<task>`, and `/e<epoch>` past the first epoch).
    pub group: String,
    /// The sample's number in its group.
    pub sample: i32,
    /// Its last attempt's session id: the trainer drops the session's snapshot, or scores it
    /// as 0 when the failure was the agent's doing.
    pub session: String,
    /// Why, when the failure was the agent's own doing (its pod evicted for what it wrote).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_fault: Option<String>,
    /// When the sample failed: a trainer that takes none of it for 15 minutes is no longer
    /// waited for.
    #[schemars(schema_with = "crate::schema::k8s::<Time>")]
    pub since: Time,
}

/// `status.heldOut`: each round, and which held-out sessions are done. Held-out sessions are
/// numbered after the job's own: round `r`'s session `j` (task-major over samples) is
/// `sessions.total + r × tasks × samples + j`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HeldOutStatus {
    /// The rounds opened so far, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rounds: Vec<HeldOutRound>,
    /// Held-out sessions that finished with a reward, by index, as ranges.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_indexes: Option<String>,
    /// Held-out sessions that exhausted `backoffLimit`, by index, as ranges.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_indexes: Option<String>,
    /// The first held-out session's index: the job's own session count when the first round
    /// opened. A job whose count changed since (`train.epochs`, a task ConfigMap edited) is
    /// stalled (`HeldOutTasksChanged`): its own sessions and the held-out ones would overlap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_index: Option<i64>,
    /// A digest of the held-out set the rounds measure (its tasks and `samples`), recorded with
    /// the first round: a later change stalls the job (`HeldOutTasksChanged`), so that every
    /// round measures the same set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks_digest: Option<String>,
}

/// One held-out round: every held-out task sampled `samples` times by one policy version.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HeldOutRound {
    /// The trainer's policy version when the round opened: the policy it measures.
    pub step: i64,
    /// The round at the trainer's final version (opened once the trainer finished).
    #[serde(default, rename = "final", skip_serializing_if = "std::ops::Not::not")]
    pub last: bool,
    /// The round's sessions.
    pub sessions: i32,
    /// Sessions scored so far.
    #[serde(default)]
    pub scored: i32,
    /// Scored sessions with reward ≥ `passThreshold`.
    #[serde(default)]
    pub passed: i32,
    /// Sum of the rewards (kept so that folding is exact).
    #[serde(default)]
    pub reward_sum: f64,
    /// Sessions that failed for good by infrastructure (not in the pass rate).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub infra_errors: i32,
    /// `passed / scored`, once a session is scored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pass_rate: Option<f64>,
    /// `rewardSum / scored`, once a session is scored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward_mean: Option<f64>,
    /// The lowest and highest policy version that sampled a call of the round (training does
    /// not wait for a round: a step may land while it runs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policy_versions: Vec<i64>,
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

impl HeldOutRound {
    /// One line for a log or an Event: `step 2: pass rate 0.500 · reward 0.542 over 2 of 2
    /// sessions (sampled by v2)`.
    pub fn line(&self) -> String {
        let fmt = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.3}"));
        let versions = match self.policy_versions.as_slice() {
            [a, b] if a == b => format!("v{a}"),
            [a, b] => format!("v{a}–v{b}"),
            _ => "-".into(),
        };
        format!(
            "step {}{}: pass rate {} · reward {} over {} of {} sessions (sampled by {versions}){}",
            self.step,
            if self.last { " (final)" } else { "" },
            fmt(self.pass_rate),
            fmt(self.reward_mean),
            self.scored,
            self.sessions,
            if self.infra_errors > 0 {
                format!(" · {} infrastructure failures", self.infra_errors)
            } else {
                String::new()
            }
        )
    }
}

/// What the fidelity check measured: the trainer's log-probs of tokens the policy server
/// sampled with the sessions' own requests, against the server's.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FidelityStatus {
    /// Sampled tokens scored.
    pub tokens: i64,
    /// Mean absolute difference per token, nats.
    pub mismatch: f64,
    /// The largest one, nats.
    pub max: f64,
    /// Why no measurement was made (a trainer over several processes does not make it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum RolloutJobPhase {
    Pending,
    Running,
    Suspended,
    Succeeded,
    Failed,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SessionCounts {
    /// Tasks × numSamples.
    #[serde(default)]
    pub total: i32,
    /// Waiting for a sandbox pod; in a finished job, sessions that never finished (those its
    /// deadline stopped included).
    #[serde(default)]
    pub pending: i32,
    /// Assigned to a pod and not finished (a held-out round's sessions included).
    #[serde(default)]
    pub running: i32,
    /// Finished with a reward.
    #[serde(default)]
    pub succeeded: i32,
    /// Sessions that exhausted `backoffLimit` on infrastructure failures (no reward recorded),
    /// and those the agent failed by its own doing (its grader OOM-killed, its pod evicted for
    /// its disk), scored at `failureReward` in `rewards`.
    #[serde(default)]
    pub failed: i32,
    /// Infrastructure retries of the job's sessions so far, of done sessions too.
    #[serde(default)]
    pub retried: i32,
}

/// Upstream failures by kind.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct UpstreamErrorCounts {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub retried: BTreeMap<String, i64>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub failed: BTreeMap<String, i64>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RewardStats {
    /// Sessions with a reward.
    pub scored: i32,
    /// Mean reward.
    pub mean: f64,
    /// Sum of the rewards (kept so that folding results in is exact).
    #[serde(default)]
    pub sum: f64,
    /// Scored sessions with reward ≥ `passThreshold`.
    #[serde(default)]
    pub passed: i32,
    /// Fraction of scored sessions with reward ≥ `passThreshold`.
    pub pass_rate: f64,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TrainerProgress {
    /// Optimizer steps taken.
    pub step: i64,
    /// Version of the weights vLLM serves (bumped on every weight push).
    pub policy_version: i64,
    /// When the last optimizer step finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::k8s::<Option<Time>>")]
    pub last_step_time: Option<Time>,
    /// The job's sessions are done and the trainer trained what was left and wrote its final
    /// model; until then a job whose sessions are done stays `Running`.
    #[serde(default)]
    pub finished: bool,
    /// The final model directory (a servable model: weights, config, tokenizer), in the
    /// trainer pod's filesystem (on the checkpoint volume when `train.checkpoint` is set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_model: Option<String>,
}
