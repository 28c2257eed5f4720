//! A finished job's `summary.json` (sans-IO): the job's record as its status holds it, in the
//! shape `floe run` writes (`docs/local-mode.md`), so a dataset read later says how it was made
//! without the RolloutJob (which `ttlSecondsAfterFinished` may have deleted). The dataset
//! collector adds its own counts (`dataset`) and writes it beside `dataset.jsonl`.

use floe_crds::rollout_job::{RolloutJob, RolloutJobStatus};
use kube::ResourceExt;
use serde_json::{json, Value};

pub fn job_summary(job: &RolloutJob, status: &RolloutJobStatus) -> Value {
    let mode = if job.spec.train.is_some() {
        "train"
    } else {
        "sft"
    };
    let s = &status.sessions;
    let rewards = status.rewards.clone().unwrap_or_default();
    let wall = match (&status.start_time, &status.completion_time) {
        (Some(start), Some(end)) => Some(end.0.duration_since(start.0).as_secs_f64().max(0.0)),
        _ => None,
    };
    let upstream = status.upstream_errors.clone().unwrap_or_default();
    json!({
        "job": job.name_any(),
        "namespace": job.namespace(),
        "uid": job.uid(),
        "mode": mode,
        "phase": status.phase,
        "sessions": {
            "total": s.total,
            "completed": s.succeeded,
            "failed": s.failed,
            "retries": s.retried,
        },
        "reward": {
            "scored": rewards.scored,
            "mean": rewards.mean,
            "passRate": rewards.pass_rate,
            "passThreshold": job.spec.evaluator.reward.pass_threshold,
        },
        "upstreamErrors": {"retried": upstream.retried, "failed": upstream.failed},
        "timings": {
            "startTime": status.start_time,
            "completionTime": status.completion_time,
            "wallSeconds": wall,
            "sessionsPerMinute": wall.filter(|w| *w > 0.0).map(|w| {
                f64::from(s.succeeded + s.failed) * 60.0 / w
            }),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_is_the_jobs_record_in_floe_runs_shape() {
        let job: RolloutJob = serde_json::from_value(json!({
            "apiVersion": "floe.dev/v1alpha1", "kind": "RolloutJob",
            "metadata": {"name": "fix", "namespace": "team", "uid": "u-1"},
            "spec": {"numSamples": 2, "tasks": {"inline": [{"id": "t", "instruction": "x"}]},
                     "harness": {"preset": "custom", "command": ["agent"]},
                     "poolRef": {"name": "p"},
                     "evaluator": {"command": ["true"]},
                     "sft": {"upstream": {"url": "http://m:8000", "model": "m"},
                             "output": {"claimName": "data"}}},
        }))
        .expect("job");
        let status: RolloutJobStatus = serde_json::from_value(json!({
            "phase": "Succeeded",
            "sessions": {"total": 4, "pending": 0, "running": 0, "succeeded": 3, "failed": 1, "retried": 2},
            "rewards": {"scored": 3, "mean": 0.5, "sum": 1.5, "passed": 1, "passRate": 0.333},
            "upstreamErrors": {"retried": {"connect": 2}},
            "startTime": "2026-11-25T10:00:00Z",
            "completionTime": "2026-11-25T10:02:00Z",
        }))
        .expect("status");
        let got = job_summary(&job, &status);
        assert_eq!(got["job"], "fix");
        assert_eq!(got["mode"], "sft");
        assert_eq!(got["phase"], "Succeeded");
        assert_eq!(
            got["sessions"],
            json!({"total": 4, "completed": 3, "failed": 1, "retries": 2})
        );
        assert_eq!(got["reward"]["mean"], 0.5);
        assert_eq!(got["upstreamErrors"]["retried"]["connect"], 2);
        assert_eq!(got["timings"]["wallSeconds"], 120.0);
        assert_eq!(got["timings"]["sessionsPerMinute"], 2.0);
    }
}
