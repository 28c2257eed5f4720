//! The [`JobState`] a job's spec and last status describe (sans-IO): what the planner reads.

use std::collections::BTreeMap;

use floe_crds::rollout_job::{RolloutJob, RolloutJobStatus, StalenessGate, TrainerState};
use floe_gateway::capture::upstream_errors::UpstreamErrors;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;

use super::indexes::IndexSet;
use super::plan::{JobState, RewardTally};

fn tally(counts: &BTreeMap<String, i64>) -> BTreeMap<String, u64> {
    counts
        .iter()
        .map(|(k, n)| (k.clone(), u64::try_from(*n).unwrap_or(0)))
        .collect()
}

/// `total`: the job's sessions (tasks × samples × epochs).
pub fn job_state(
    job: &RolloutJob,
    previous: Option<&RolloutJobStatus>,
    now: &Time,
    total: u32,
) -> JobState {
    let spec = &job.spec;
    let parse = |s: Option<&String>| {
        s.map(|t| {
            IndexSet::parse(t).unwrap_or_else(|e| {
                tracing::error!(job = %job.name_any(), "unreadable status: {e}");
                IndexSet::default()
            })
        })
        .unwrap_or_default()
    };
    let rewards = previous.and_then(|s| s.rewards.as_ref());
    let deadline_exceeded = match (
        spec.active_deadline_seconds,
        previous.and_then(|s| s.start_time.as_ref()),
    ) {
        (Some(limit), Some(start)) => now.0.duration_since(start.0).as_secs() >= limit,
        _ => false,
    };
    let concurrency = spec.concurrency.and_then(|c| u32::try_from(c).ok());
    let lookahead = spec.pool_template.as_ref().map(|_| {
        spec.lookahead
            .and_then(|l| u32::try_from(l).ok())
            .unwrap_or(concurrency.unwrap_or(super::plan::TEMPLATE_CONCURRENCY))
    });
    JobState {
        total,
        backoff_limit: u32::try_from(spec.backoff_limit).unwrap_or(0),
        concurrency,
        lookahead,
        // Set from what the trainer says this round ([`staleness_gate`]).
        staleness: None,
        // Set from the held-out tasks and the trainer this round (`held_out::HeldOutState`).
        held_out: None,
        pass_threshold: spec.evaluator.reward.pass_threshold,
        failure_reward: spec.evaluator.reward.failure_reward,
        suspend: spec.suspend,
        deadline_exceeded,
        completed: parse(previous.and_then(|s| s.completed_indexes.as_ref())),
        failed: parse(previous.and_then(|s| s.failed_indexes.as_ref())),
        retries: previous
            .map(|s| {
                s.retries
                    .iter()
                    .filter_map(|(k, v)| Some((k.parse().ok()?, u32::try_from(*v).ok()?)))
                    .collect()
            })
            .unwrap_or_default(),
        // Counted as retries happen since the map forgets done sessions. A status from before
        // counted the map's sum, the same number; the larger of the two survives a status
        // without the counter, or an older operator's write of the sum of a map since pruned.
        retried: previous
            .map(|s| {
                let summed: i64 = s
                    .retries
                    .iter()
                    .filter(|(k, _)| k.parse::<u32>().is_ok_and(|i| i < total))
                    .map(|(_, v)| i64::from(*v))
                    .sum();
                u32::try_from(i64::from(s.sessions.retried).max(summed)).unwrap_or(0)
            })
            .unwrap_or(0),
        untold_failures: previous
            .map(|s| {
                s.untold_failures
                    .iter()
                    .filter_map(|(k, v)| Some((k.parse().ok()?, v.clone())))
                    .collect()
            })
            .unwrap_or_default(),
        upstream: previous
            .and_then(|s| s.upstream_errors.as_ref())
            .map(|u| UpstreamErrors {
                retried: tally(&u.retried),
                failed: tally(&u.failed),
            })
            .unwrap_or_default(),
        rewards: rewards
            .map(|r| RewardTally {
                scored: u32::try_from(r.scored).unwrap_or(0),
                sum: r.sum,
                passed: u32::try_from(r.passed).unwrap_or(0),
            })
            .unwrap_or_default(),
    }
}

/// When a train job's sessions may start ([`StalenessGate`], as in `floe run`), from what its
/// trainer said this round; unread (the trainer restarting), the version the status last
/// recorded, and not idle. `None` for an sft job.
pub fn staleness_gate(job: &RolloutJob, read: Option<TrainerState>) -> Option<StalenessGate> {
    let train = job.spec.train.as_ref()?;
    let trainer = read.unwrap_or_else(|| TrainerState {
        policy_version: job
            .status
            .as_ref()
            .and_then(|s| s.trainer.as_ref())
            .map_or(0, |t| u64::try_from(t.policy_version).unwrap_or(0)),
        idle: false,
        ready_groups: 0,
        groups_done: 0,
    });
    Some(StalenessGate::new(train, job.spec.samples(), trainer))
}

/// The `pool` label of a job's series: its pool's name, `""` for a `poolTemplate` job.
pub fn pool_label(job: &RolloutJob) -> &str {
    job.spec.pool_ref.as_ref().map_or("", |p| p.name.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn train_job(status: serde_json::Value) -> RolloutJob {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "floe.dev/v1alpha1", "kind": "RolloutJob",
            "metadata": {"name": "j", "namespace": "ns"},
            "spec": {"numSamples": 2, "poolRef": {"name": "p"},
                     "harness": {"preset": "pi"}, "evaluator": {"command": ["true"]},
                     "train": {"image": "t", "model": "m", "maxStaleness": 0,
                               "grpo": {"groupsPerStep": 2}},
                     "tasks": {"inline": [{"id": "a", "instruction": "x"}]}},
            "status": status}))
        .expect("a train job")
    }

    #[test]
    fn a_train_jobs_gate_reads_the_trainer_or_else_the_status() {
        let job = train_job(serde_json::json!({"trainer": {"step": 2, "policyVersion": 2}}));
        let read = TrainerState {
            policy_version: 3,
            idle: true,
            ready_groups: 1,
            groups_done: 0,
        };
        let gate = staleness_gate(&job, Some(read)).expect("a train job has a gate");
        assert_eq!((gate.batch_size, gate.max_staleness), (4, 0));
        assert_eq!(gate.trainer, read);
        // Unread this round: the last recorded version, never idle.
        let gate = staleness_gate(&job, None).expect("gate");
        assert_eq!(
            gate.trainer,
            TrainerState {
                policy_version: 2,
                idle: false,
                ready_groups: 0,
                groups_done: 0
            }
        );
        let mut sft = job.clone();
        sft.spec.train = None;
        assert_eq!(staleness_gate(&sft, Some(read)), None);
    }

    /// The failures a train job's trainer has yet to take are read back from the status by
    /// session index (an operator restarted since they failed tells them still).
    #[test]
    fn untold_failures_are_read_back_from_the_status() {
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let failure = serde_json::json!({"group": "j/a", "sample": 1, "session": "j-a-1-r1",
                                         "agentFault": "evicted", "since": "2026-12-04T00:00:00Z"});
        let job = train_job(serde_json::json!({"untoldFailures": {"1": failure}}));
        let state = job_state(&job, job.status.as_ref(), &now, 2);
        let read: Vec<_> = state.untold_failures.iter().collect();
        assert!(
            matches!(read[..], [(1, f)] if f.session == "j-a-1-r1" && f.agent_fault.as_deref() == Some("evicted")),
            "{read:?}"
        );
    }

    /// `sessions.retried` counts done sessions' retries too, which the map forgets; a status
    /// an older operator wrote (its counter the map's sum) or without the counter still reads
    /// the larger, and held-out sessions (past the job's own) count in neither.
    #[test]
    fn the_retry_total_is_the_counter_or_the_maps_sum_whichever_is_larger() {
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let retried = |status: serde_json::Value| {
            let job = train_job(status);
            job_state(&job, job.status.as_ref(), &now, 2).retried
        };
        assert_eq!(retried(serde_json::json!({"sessions": {"retried": 5}})), 5);
        assert_eq!(
            retried(serde_json::json!({"retries": {"0": 2, "1": 1, "7": 3}})),
            3
        );
        assert_eq!(
            retried(serde_json::json!({"sessions": {"retried": 1}, "retries": {"1": 2}})),
            2
        );
        assert_eq!(retried(serde_json::json!({})), 0);
    }
}
