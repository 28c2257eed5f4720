//! A RolloutJob's sessions as assignments (sans-IO): the one place that turns a job, a task and
//! a sample into what a pod's gateway and runner receive, shared by the operator and `floe run`
//! so both run a job the same way.

use std::collections::BTreeMap;

use floe_crds::common::UpstreamKind as SpecKind;
use floe_crds::rollout_job::{RolloutJobSpec, Task, TrajectoryBuilder};
use floe_gateway::protocol::sampling::CallerSampling;
use floe_gateway::protocol::upstream::{SessionBudget, UpstreamKind};
use floe_gateway::protocol::HostedTools;
use floe_gateway::ship::{Assignment, RetryOverride, Sink, UpstreamOverride};
use floe_gateway::trajectory::Builder;

use crate::spec::RunSpec;

/// Session id: `<job>-<task>-<sample>` in the first epoch, `<job>-<task>-<sample>.e<epoch>` in
/// a later one (no first-epoch id ends so: ids stay distinct whatever the task ids), and
/// `-r<attempt>` for a retry after an infrastructure failure — a retry needs its own id,
/// because the trainer deduplicates by session id and the failed attempt may already have
/// shipped its (untrainable) trajectory.
pub fn session_id(job: &str, task: &str, epoch: u32, sample: u32, attempt: u32) -> String {
    let mut id = format!("{job}-{task}-{sample}");
    if epoch > 0 {
        id.push_str(&format!(".e{epoch}"));
    }
    if attempt > 0 {
        id.push_str(&format!("-r{attempt}"));
    }
    id
}

/// The GRPO group of a task within a job: one per epoch (each pass samples the task anew).
pub fn group_id(job: &str, task: &str, epoch: u32) -> String {
    if epoch == 0 {
        format!("{job}/{task}")
    } else {
        format!("{job}/{task}/e{epoch}")
    }
}

/// One attempt of one session.
#[derive(Clone)]
pub struct SessionOf<'a> {
    pub job: &'a str,
    pub spec: &'a RolloutJobSpec,
    pub task: &'a Task,
    /// The pass over the task set, from 0.
    pub epoch: u32,
    pub sample: u32,
    pub attempt: u32,
    pub sink: &'a Sink,
    /// Where the session's model calls go (URL, model, server kind), when not the gateway's
    /// default.
    pub upstream: SessionUpstream,
    /// Hidden files for every task (`evaluator.hiddenFilesFrom`); the task's own win.
    pub shared_hidden_files: &'a BTreeMap<String, String>,
}

/// A session's own upstream; `None` parts are the gateway's.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SessionUpstream {
    pub url: Option<String>,
    pub model: Option<String>,
    pub kind: Option<UpstreamKind>,
    /// The upstream's bearer token (the job's policy server demands one).
    pub api_key: Option<String>,
}

/// The gateway's name for a spec's `upstream.kind`.
pub fn upstream_kind(kind: SpecKind) -> UpstreamKind {
    match kind {
        SpecKind::Vllm => UpstreamKind::Vllm,
        SpecKind::Sglang => UpstreamKind::Sglang,
    }
}

/// The job's retry shape as the gateway takes it.
fn retry_override(r: &floe_crds::rollout_job::ModelCallRetry) -> RetryOverride {
    let positive = |v: i32| u32::try_from(v).unwrap_or(0);
    RetryOverride {
        first_backoff_millis: positive(r.first_backoff_millis),
        max_backoff_millis: positive(r.max_backoff_seconds).saturating_mul(1000),
        http500_retries: positive(r.http500_retries),
    }
}

/// What one session of the job may spend, as the gateway takes it.
fn session_budget(sampling: &floe_crds::rollout_job::SamplingSpec) -> SessionBudget {
    let positive = |v: i64| u64::try_from(v).ok().filter(|v| *v > 0);
    SessionBudget {
        tokens: positive(
            sampling
                .max_session_tokens
                .unwrap_or(floe_crds::rollout_job::DEFAULT_MAX_SESSION_TOKENS),
        ),
        calls: sampling
            .max_calls_per_session
            .and_then(|c| positive(i64::from(c))),
        bytes: positive(
            sampling
                .max_session_bytes
                .unwrap_or(floe_crds::rollout_job::DEFAULT_MAX_SESSION_BYTES),
        ),
    }
}

pub fn assignment(s: &SessionOf) -> Assignment {
    let spec = s.spec;
    let cap = u32::try_from(spec.sampling.max_response_tokens).ok();
    // The job's response cap and sampling apply to every call of its sessions.
    let upstream = UpstreamOverride {
        url: s.upstream.url.clone(),
        model: s.upstream.model.clone(),
        api_key: s.upstream.api_key.clone(),
        kind: s.upstream.kind,
        max_response_tokens: cap,
        temperature: Some(spec.sampling.temperature),
        top_p: Some(spec.sampling.top_p),
        // A train job's samples are trained as the policy's: its sampling contract holds.
        caller_sampling: spec
            .train
            .as_ref()
            .map(|_| match spec.sampling.caller_params {
                floe_crds::rollout_job::CallerParams::Drop => CallerSampling::Drop,
                floe_crds::rollout_job::CallerParams::Refuse => CallerSampling::Refuse,
            }),
        call_timeout_seconds: u32::try_from(spec.timeouts.model_call_seconds).ok(),
        hosted_tools: Some(match spec.harness.hosted_tools {
            floe_crds::rollout_job::HostedTools::Reject => HostedTools::Reject,
            floe_crds::rollout_job::HostedTools::Drop => HostedTools::Drop,
        }),
        retry: Some(retry_override(&spec.model_call_retry)),
        session_budget: Some(session_budget(&spec.sampling)),
    };
    let builder = match spec.trajectory.builder {
        TrajectoryBuilder::PrefixMerging => Builder::PrefixMerging,
        TrajectoryBuilder::PerRequest => Builder::PerRequest,
    };
    let run = RunSpec {
        task: s.task.clone(),
        harness: spec.harness.clone(),
        evaluator: spec.evaluator.clone(),
        timeouts: spec.timeouts.clone(),
        hidden_files: s.shared_hidden_files.clone(),
        max_response_tokens: cap,
    };
    let mut metadata: BTreeMap<String, serde_json::Value> = s
        .task
        .metadata
        .iter()
        .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
        .collect();
    metadata.insert("job".into(), s.job.into());
    if s.attempt > 0 {
        metadata.insert("attempt".into(), s.attempt.into());
    }
    if s.epoch > 0 {
        metadata.insert("epoch".into(), s.epoch.into());
    }
    Assignment {
        session: session_id(s.job, &s.task.id, s.epoch, s.sample, s.attempt),
        task: s.task.id.clone(),
        group: group_id(s.job, &s.task.id, s.epoch),
        sample: s.sample,
        builder,
        exclude_classes: spec.trajectory.exclude_request_classes.clone(),
        imitation: spec.sft.is_some(),
        sink: s.sink.clone(),
        upstream: Some(upstream),
        metadata,
        run: serde_json::to_value(&run).unwrap_or_default(),
    }
}

/// A held-out session's id ([`held_out_assignment`]).
pub fn held_out_session_id(job: &str, task: &str, sample: u32, step: u64, attempt: u32) -> String {
    let mut id = format!("{job}-{task}-{sample}.h{step}");
    if attempt > 0 {
        id.push_str(&format!("-r{attempt}"));
    }
    id
}

/// A held-out round's session (`train.heldOut`), sampled by the policy of step `step` and
/// trained on by nobody: `<job>-<task>-<sample>.h<step>` (`-r<attempt>` for a retry), in
/// group `<job>/<task>/h<step>`. No training session's id ends in `.h<n>`, so the two never
/// meet whatever the task ids.
pub fn held_out_assignment(s: &SessionOf, step: u64) -> Assignment {
    let mut a = assignment(&SessionOf {
        epoch: 0,
        ..s.clone()
    });
    a.session = held_out_session_id(s.job, &s.task.id, s.sample, step, s.attempt);
    a.group = format!("{}/{}/h{step}", s.job, s.task.id);
    a.metadata.insert("heldOutStep".into(), step.into());
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default budget bounds what a session ships below what its trainer or collector
    /// takes (256 MiB): past that, the trajectory would be refused and the session retried.
    #[test]
    fn the_default_session_budget_ships_less_than_an_ingest_takes() {
        let most = usize::try_from(floe_crds::rollout_job::DEFAULT_MAX_SESSION_TOKENS)
            .unwrap_or(usize::MAX)
            .saturating_mul(floe_gateway::trajectory::WORST_BYTES_PER_TOKEN);
        assert!(most < 256 * 1024 * 1024, "{most}");
    }

    #[test]
    fn a_retry_gets_its_own_session_id_in_the_same_group() {
        assert_eq!(session_id("j", "t", 0, 3, 0), "j-t-3");
        assert_eq!(session_id("j", "t", 0, 3, 2), "j-t-3-r2");
        assert_eq!(session_id("j", "t", 2, 3, 0), "j-t-3.e2");
        assert_eq!(session_id("j", "t", 2, 3, 1), "j-t-3.e2-r1");
        // A task whose id looks like a later epoch's suffix still gets its own ids.
        assert_ne!(
            session_id("j", "t-3.e2", 0, 0, 0),
            session_id("j", "t", 2, 3, 0)
        );
        assert_eq!(group_id("j", "t", 0), "j/t");
        assert_eq!(group_id("j", "t", 2), "j/t/e2");
    }

    #[test]
    fn the_spec_kinds_map_to_the_gateway_kinds() {
        assert_eq!(upstream_kind(SpecKind::Vllm), UpstreamKind::Vllm);
        assert_eq!(upstream_kind(SpecKind::Sglang), UpstreamKind::Sglang);
        // The gateway reads the spec's spelling too (`--upstream-kind SGLang`).
        assert_eq!("SGLang".parse(), Ok(UpstreamKind::Sglang));
    }
}
