//! The [`JobState`] a job's spec and last status describe (sans-IO): what the planner reads.

use std::collections::BTreeMap;

use floe_crds::rollout_job::{RolloutJob, RolloutJobStatus};
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

/// `total`: the job's sessions (tasks × samples).
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
        pass_threshold: spec.evaluator.reward.pass_threshold,
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
