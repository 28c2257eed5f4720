//! A round's reports: its status writes (guarded by the job's resourceVersion), the Events of
//! its folds and transitions, and the job's metrics.

use std::time::Duration;

use floe_crds::rollout_job::{RolloutJob, RolloutJobStatus, TrainerProgress};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
use serde_json::json;

use super::{own_pod, JobContext, JobError};
use crate::metrics::{Kind, SessionResult};
use crate::rollout::aux_gate::{self, JobPodRound};
use crate::rollout::job_state::job_state;
use crate::rollout::plan::{Fold, JobPlan, JobState};
use crate::rollout::status::{self, Blocked, StatusInput};

/// What a round's status writes share.
pub(super) struct RoundReport<'a> {
    pub job: &'a RolloutJob,
    pub ctx: &'a JobContext,
    pub ns: &'a str,
    pub now: &'a Time,
    pub job_pod: &'a JobPodRound,
    /// A train job whose trainer has not finished (`status::StatusInput::trainer_unfinished`).
    pub trainer_unfinished: bool,
    /// The job's tasks' digest as this round read them (`status::StatusInput::tasks_digest`).
    pub tasks_digest: &'a str,
}

pub(super) use crate::spec_check::CRD_OUTDATED;

/// The job's status as this round last wrote it (or found it), with its resourceVersion.
pub(super) struct Written {
    rv: Option<String>,
    status: Option<RolloutJobStatus>,
}

impl Written {
    /// The job's status as this round found it.
    fn found(job: &RolloutJob) -> Self {
        Self {
            rv: job.resource_version(),
            status: job.status.clone(),
        }
    }
}

/// The merge patch that makes the status `st`, guarded by `base`'s resourceVersion. A merge
/// patch keeps a map's keys it does not name, so the keys of `base`'s maps that `st` drops are
/// named null: without it `status.retries` would keep every session ever retried, and
/// `status.untoldFailures` every failure its trainer took.
fn status_patch(base: &Written, st: &RolloutJobStatus) -> serde_json::Value {
    let mut patch = json!({"metadata": {"resourceVersion": base.rv}, "status": st});
    let retries = base.status.iter().flat_map(|b| b.retries.keys());
    null_dropped(&mut patch, "retries", retries, |k| {
        st.retries.contains_key(k)
    });
    let untold = base.status.iter().flat_map(|b| b.untold_failures.keys());
    null_dropped(&mut patch, "untoldFailures", untold, |k| {
        st.untold_failures.contains_key(k)
    });
    patch
}

/// The status found with only `st`'s `heldOut`, where the job is stalled because its CRD
/// pruned that field and `st` changes it.
fn crd_probe(
    previous: Option<&RolloutJobStatus>,
    st: &RolloutJobStatus,
) -> Option<RolloutJobStatus> {
    let previous = previous?;
    let stalled = status::stalled_for(Some(previous), CRD_OUTDATED);
    (stalled && previous.held_out != st.held_out).then(|| RolloutJobStatus {
        held_out: st.held_out.clone(),
        ..previous.clone()
    })
}

/// Name null in the patch's `status.<field>` each of `was` that `kept` says is gone.
fn null_dropped<'a>(
    patch: &mut serde_json::Value,
    field: &str,
    was: impl Iterator<Item = &'a String>,
    kept: impl Fn(&String) -> bool,
) {
    let gone: serde_json::Map<String, serde_json::Value> = was
        .filter(|k| !kept(k))
        .map(|k| (k.clone(), serde_json::Value::Null))
        .collect();
    if gone.is_empty() {
        return;
    }
    let map = &mut patch["status"][field];
    match map.as_object_mut() {
        Some(kept) => kept.extend(gone),
        None => *map = serde_json::Value::Object(gone),
    }
}

impl RoundReport<'_> {
    fn jobs(&self) -> Api<RolloutJob> {
        Api::namespaced(self.ctx.client.clone(), self.ns)
    }

    fn status(
        &self,
        previous: Option<&RolloutJobStatus>,
        state: &JobState,
        running: u32,
        start_time: Option<Time>,
        record_digest: bool,
    ) -> RolloutJobStatus {
        status::status(
            &StatusInput {
                previous,
                generation: self.job.metadata.generation,
                state,
                running,
                blocked: None,
                now: self.now.clone(),
                trainer_unfinished: self.trainer_unfinished,
                job_pod: Some(self.job_pod),
                tasks_digest: Some(self.tasks_digest),
                record_digest,
            },
            start_time,
        )
    }

    /// Fold the plan's results into the status. `None`: someone else wrote the job first.
    pub async fn fold(&self, decided: &JobPlan) -> Result<Option<Written>, JobError> {
        let (job, ctx) = (self.job, self.ctx);
        let previous = job.status.as_ref();
        let mut written = Written::found(job);
        // The first round to give a session a pod records the tasks' digest before it does:
        // recorded after, an operator that died in between, or a final
        // write that lost its conflict, left a task list changed since to be taken as the
        // job's, and the sessions already started folded under indexes naming other tasks.
        let begins = begins(previous, decided);
        if !decided.folds.is_empty() || decided.rounds_changed || begins {
            // Claims are not made yet; pre-warmed starts are (a pod lost before its start is
            // counted at the round's end).
            let running = decided.running_after(0, decided.start.len());
            // (The start time stays the first claim's: `activeDeadlineSeconds` counts from it.)
            let start_time = previous.and_then(|s| s.start_time.clone());
            let st = self.status(previous, &decided.next, running, start_time, begins);
            // A job stalled on an outdated CRD tries `heldOut` alone first: pruned again, that
            // write changes nothing (no new resourceVersion, no watch event), whereas the whole
            // status would clear `Stalled` only for the stall to write it back, each write
            // triggering the next reconcile: a storm of writes and Events until the CRD is new.
            if let Some(probe) = crd_probe(previous, &st) {
                let Some(rv) = write_status(ctx, &self.jobs(), job, &written, &probe).await? else {
                    return Ok(None);
                };
                written = Written {
                    rv: Some(rv),
                    status: Some(probe),
                };
            }
            let Some(rv) = write_status(ctx, &self.jobs(), job, &written, &st).await? else {
                return Ok(None);
            };
            // The fold may finish the job: announce it now, or the final write (which then
            // sees no change) never would.
            announce_transition(job, ctx, previous, &st).await;
            written = Written {
                rv: Some(rv),
                status: Some(st),
            };
            report_folds(job, ctx, decided).await;
            report_rounds(job, ctx, decided).await;
        }
        let rewards = &decided.next.rewards;
        ctx.metrics.set_rewards(
            self.ns,
            &job.name_any(),
            u64::from(rewards.scored),
            rewards.sum,
        );
        // The last complete held-out round, as the status records it (an operator restarted
        // since it completed says it too).
        if let Some(h) = &decided.next.held_out {
            let rounds = h.status().rounds;
            let last = (0..rounds.len()).rev().find(|r| h.round_done(*r));
            if let Some(round) = last.and_then(|r| rounds.get(r)) {
                ctx.metrics.set_held_out(self.ns, &job.name_any(), round);
            }
        }
        Ok(Some(written))
    }

    /// The status after the round's claims and releases, with `running` sessions holding pods.
    pub async fn finish(
        &self,
        written: Written,
        state: &JobState,
        running: u32,
        trainer: Option<TrainerProgress>,
        own_pod: Option<&Pod>,
    ) -> Result<Action, JobError> {
        let (job, ctx, ns) = (self.job, self.ctx, self.ns);
        // Started once any session holds a pod or finished — not just "claimed in this round":
        // a round whose status write lost a conflict must not leave the job without a start time.
        let began = running > 0 || !state.completed.is_empty() || !state.failed.is_empty();
        let start_time = status::started(job.status.as_ref(), began, self.now);
        let mut st = self.status(written.status.as_ref(), state, running, start_time, false);
        let wait = self.job_pod.wait.as_ref();
        // Where users look: the job's own pod's problem is the job's reason, and its metric.
        ctx.metrics.set_blocked(
            Kind::RolloutJob,
            ns,
            &job.name_any(),
            wait.and_then(|w| w.problem.as_deref()),
        );
        if let Some(w) = wait.filter(|w| w.failing) {
            if !aux_gate::said_failing(job.status.as_ref()) {
                tracing::warn!(job = %job.name_any(), "{}", w.message);
                ctx.event(job, EventType::Warning, "JobPodFailing", w.message.clone())
                    .await;
            }
        }
        own_pod::finish_trainer_when_done(ctx, job, ns, &st, own_pod).await;
        if trainer.is_some() {
            st.trainer = trainer;
        }
        ctx.metrics.set_sessions(ns, &job.name_any(), &st.sessions);
        if written.status.as_ref() != Some(&st) {
            let jobs = self.jobs();
            if write_status(ctx, &jobs, job, &written, &st)
                .await?
                .is_none()
            {
                return Ok(Action::requeue(Duration::from_millis(200)));
            }
            announce_transition(job, ctx, written.status.as_ref(), &st).await;
        }
        Ok(Action::requeue(requeue_after(job, &st, self.now)))
    }
}

fn requeue_after(job: &RolloutJob, st: &RolloutJobStatus, now: &Time) -> Duration {
    if st.completion_time.is_some() {
        return match job.spec.ttl_seconds_after_finished {
            Some(ttl) => Duration::from_secs(u64::try_from(ttl).unwrap_or(0)),
            None => Duration::from_secs(300),
        };
    }
    // Pod changes wake the controller; this is the safety net, and the deadline's alarm. A
    // held-out round opens at a trainer version, which no watch event announces: read soon.
    let held_out = job
        .spec
        .train
        .as_ref()
        .is_some_and(|t| t.held_out.is_some());
    let mut wait = Duration::from_secs(if held_out { 3 } else { 10 });
    if let (Some(deadline), Some(start)) = (job.spec.active_deadline_seconds, &st.start_time) {
        let left = deadline - now.0.duration_since(start.0).as_secs();
        wait = wait.min(Duration::from_secs(u64::try_from(left.max(1)).unwrap_or(1)));
    }
    wait
}

/// Writes the status with the job's resourceVersion as a precondition; `None` on a conflict.
/// The version written is remembered: a round must not plan from a cached copy older than it.
async fn write_status(
    ctx: &JobContext,
    jobs: &Api<RolloutJob>,
    job: &RolloutJob,
    base: &Written,
    st: &RolloutJobStatus,
) -> Result<Option<String>, JobError> {
    let patch = status_patch(base, st);
    match jobs
        .patch_status(
            &job.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(j) => {
            // An older CRD prunes what it does not know. Nothing is claimed until it is new.
            if let Some(field) = pruned(st, j.status.as_ref()) {
                return Err(JobError::CrdOutdated(field));
            }
            ctx.wrote_status(
                &job.uid().unwrap_or_default(),
                j.resource_version().as_deref(),
            );
            Ok(j.resource_version())
        }
        Err(kube::Error::Api(s)) if s.is_conflict() => Ok(None),
        Err(e) => Err(JobError::api(format!(
            "writing the status of job {}/{}",
            job.namespace().unwrap_or_default(),
            job.name_any()
        ))(e)),
    }
}

/// A finished job whose spec changed since (a kustomize patch or an image bump applied to
/// every job in Git): the edit is observed, and changes nothing. Without it
/// `observedGeneration` stayed behind for good, and Argo CD's health check and kstatus
/// (Flux's `wait`) read the job as progressing for ever, holding up whatever waited on it.
pub(super) async fn observe_after_end(job: &RolloutJob, ctx: &JobContext) -> Result<(), JobError> {
    let (Some(generation), Some(previous)) = (job.metadata.generation, job.status.as_ref()) else {
        return Ok(());
    };
    if previous
        .observed_generation
        .is_some_and(|o| o >= generation)
    {
        return Ok(());
    }
    let st = RolloutJobStatus {
        observed_generation: Some(generation),
        ..previous.clone()
    };
    let jobs =
        Api::<RolloutJob>::namespaced(ctx.client.clone(), &job.namespace().unwrap_or_default());
    if write_status(ctx, &jobs, job, &Written::found(job), &st)
        .await?
        .is_some()
    {
        let note = format!(
            "the job has finished: its spec's edit (generation {generation}) changes nothing; \
             run the changed spec as a new job"
        );
        ctx.event(job, EventType::Normal, "FinishedSpecChanged", note)
            .await;
    }
    Ok(())
}

async fn report_folds(job: &RolloutJob, ctx: &JobContext, decided: &JobPlan) {
    let (ns, name) = (job.namespace().unwrap_or_default(), job.name_any());
    // A held-out session's step: its results are its round's (status.heldOut, the
    // floe_job_held_out gauge), not the job's session counters.
    let held_out_step = |index: u32| {
        let h = decided.next.held_out.as_ref()?;
        h.rounds.get(h.slot(index)?.0).map(|r| r.step)
    };
    for (pod, fold) in &decided.folds {
        let step = held_out_step(fold_index(fold));
        let said = fold_said(job, pod, fold, step);
        if step.is_none() {
            ctx.metrics.session_result(&ns, &name, said.result);
        }
        if let Fold::Scored { index, reward } = fold {
            tracing::info!(job = %name, %pod, index, reward, "session scored");
        }
        if let Some((reason, note)) = said.event {
            if let Fold::Retry { index, reason, .. } = fold {
                tracing::warn!(job = %name, %pod, index, "session retried: {reason}");
            }
            ctx.event(job, EventType::Warning, reason, note).await;
        }
    }
}

fn fold_index(fold: &Fold) -> u32 {
    match fold {
        Fold::Scored { index, .. } | Fold::Retry { index, .. } | Fold::Failed { index, .. } => {
            *index
        }
    }
}

/// What a fold says: its result for `floe_session_results_total`, and its Warning Event.
struct FoldSaid {
    result: SessionResult,
    event: Option<(&'static str, String)>,
}

/// `step`: the held-out round's step when the session is one of that round's.
fn fold_said(job: &RolloutJob, pod: &str, fold: &Fold, step: Option<u64>) -> FoldSaid {
    let session = match step {
        Some(step) => format!(
            "held-out session {} (the round at step {step})",
            fold_index(fold)
        ),
        None => format!("session {}", fold_index(fold)),
    };
    match fold {
        Fold::Scored { .. } => FoldSaid {
            result: SessionResult::Scored,
            event: None,
        },
        Fold::Retry {
            next_attempt,
            reason,
            ..
        } => FoldSaid {
            result: SessionResult::Retried,
            event: Some((
                "SessionRetried",
                format!("{session} (pod {pod}) failed: {reason}; attempt {next_attempt} follows on a fresh pod"),
            )),
        },
        Fold::Failed {
            reason,
            agent_fault,
            ..
        } => {
            let outcome = match (step, agent_fault) {
                (Some(_), _) => {
                    "an infrastructure failure of its round, out of its pass rate".to_string()
                }
                (None, true) => format!(
                    "scored failureReward {}",
                    job.spec.evaluator.reward.failure_reward
                ),
                (None, false) => "no reward recorded".to_string(),
            };
            let how = if *agent_fault {
                "failed without a retry, as the agent's own doing".to_string()
            } else {
                format!(
                    "failed after backoffLimit {} retries",
                    job.spec.backoff_limit
                )
            };
            FoldSaid {
                // The agent's own failure is scored at `failureReward` (status.rewards, the
                // trainer): counted with infrastructure's failures it paged as one, and the
                // reward summary's count ran ahead of the scored results.
                result: if *agent_fault {
                    SessionResult::Scored
                } else {
                    SessionResult::Failed
                },
                event: Some((
                    "SessionFailed",
                    format!("{session} (pod {pod}) {how}: {reason}; {outcome}"),
                )),
            }
        }
    }
}

/// Each held-out round these folds completed: an Event with its figures, and the gauge.
async fn report_rounds(job: &RolloutJob, ctx: &JobContext, decided: &JobPlan) {
    let Some(h) = decided.next.held_out.as_ref() else {
        return;
    };
    let name = job.name_any();
    let rounds = h.status().rounds;
    for round in decided.rounds_done.iter().filter_map(|r| rounds.get(*r)) {
        let line = round.line();
        tracing::info!(job = %name, "held-out round: {line}");
        let action = format!("MeasureStep{}", round.step);
        ctx.event_as(job, "HeldOutRound", &action, line).await;
    }
}

/// A job that cannot run as written, or waits for something to come: its conditions say
/// why; a Warning Event when it stalls (once per reason and message).
pub(super) async fn blocked(
    job: &RolloutJob,
    ctx: &JobContext,
    blocked: &Blocked,
    now: Time,
) -> Result<Action, JobError> {
    let jobs =
        &Api::<RolloutJob>::namespaced(ctx.client.clone(), &job.namespace().unwrap_or_default());
    let previous = job.status.as_ref();
    let state = job_state(job, previous, &now, 0);
    let st = status::status(
        &StatusInput {
            previous,
            generation: job.metadata.generation,
            state: &state,
            running: 0,
            blocked: Some(blocked),
            now,
            trainer_unfinished: false,
            job_pod: None,
            tasks_digest: None,
            record_digest: false,
        },
        previous.and_then(|s| s.start_time.clone()),
    );
    let sessions = previous.map(|p| p.sessions.clone()).unwrap_or_default();
    let st = RolloutJobStatus {
        // Failed at its deadline, it stops what ran.
        sessions: if st.completion_time.is_some() {
            status::ended(sessions)
        } else {
            sessions
        },
        progress: previous.and_then(|p| p.progress.clone()),
        ..st
    };
    ctx.metrics.none_waiting_for_pod(
        &job.namespace().unwrap_or_default(),
        &job.name_any(),
        crate::rollout::job_state::pool_label(job),
    );
    ctx.metrics.set_blocked(
        Kind::RolloutJob,
        &job.namespace().unwrap_or_default(),
        &job.name_any(),
        // A job failed at its deadline is no longer blocked: it has ended.
        (!blocked.transient && st.completion_time.is_none()).then_some(blocked.reason.as_str()),
    );
    let was = previous
        .and_then(|p| p.conditions.iter().find(|c| c.type_ == "Stalled"))
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()));
    if blocked.transient {
        if previous != Some(&st) {
            write_status(ctx, jobs, job, &Written::found(job), &st).await?;
        }
        // The pod it waits for triggers a reconcile when it changes; this is the fallback.
        return Ok(Action::requeue(Duration::from_secs(5)));
    }
    if was
        != Some((
            "True".into(),
            blocked.reason.clone(),
            blocked.message.clone(),
        ))
    {
        tracing::warn!(job = %job.name_any(), reason = %blocked.reason, "{}", blocked.message);
        ctx.event(
            job,
            EventType::Warning,
            &blocked.reason,
            blocked.message.clone(),
        )
        .await;
    }
    if previous != Some(&st) {
        write_status(ctx, jobs, job, &Written::found(job), &st).await?;
    }
    // The user fixes the spec (a watch event) or creates the missing object.
    Ok(Action::requeue(Duration::from_secs(15)))
}

/// Events on phase transitions only.
async fn announce_transition(
    job: &RolloutJob,
    ctx: &JobContext,
    before: Option<&RolloutJobStatus>,
    after: &RolloutJobStatus,
) {
    let was = before.and_then(|s| s.phase);
    if was == after.phase {
        return;
    }
    let message = after
        .conditions
        .first()
        .map(|c| c.message.clone())
        .unwrap_or_default();
    let (type_, reason) = match after.phase {
        Some(floe_crds::rollout_job::RolloutJobPhase::Running) => (EventType::Normal, "Started"),
        Some(floe_crds::rollout_job::RolloutJobPhase::Suspended) => {
            (EventType::Normal, "Suspended")
        }
        Some(floe_crds::rollout_job::RolloutJobPhase::Succeeded) => {
            (EventType::Normal, "Completed")
        }
        Some(floe_crds::rollout_job::RolloutJobPhase::Failed) => (EventType::Warning, "Failed"),
        _ => return,
    };
    ctx.event(job, type_, reason, message).await;
}

/// `poolTemplate`: a Warning Event for each problem a session's pod reports while starting
/// (once per pod and reason), saying what follows: a pod with no room waits, one that cannot
/// start counts as a failed attempt once `timeouts.podStartSeconds` have passed.
pub(super) async fn start_problems(job: &RolloutJob, ctx: &JobContext, pods: &[Pod]) {
    if job.spec.pool_template.is_none() {
        return;
    }
    let uid = job.uid().unwrap_or_default();
    let names: std::collections::HashSet<&str> = pods
        .iter()
        .filter_map(|p| p.metadata.name.as_deref())
        .collect();
    for pod in pods {
        let Some(session) = crate::rollout::pod_view::session_pod(pod) else {
            continue;
        };
        if session.assigned || crate::pods::view::is_ready(pod) {
            continue;
        }
        let Some(problem) = crate::pod_problem::problem(pod) else {
            continue;
        };
        if !ctx.start_problem_news(&uid, &names, &session.name, &problem.reason) {
            continue;
        }
        let follows = if problem.reason == "Unschedulable" {
            "it waits for room".to_string()
        } else {
            format!(
                "still so {}s after its creation (timeouts.podStartSeconds), it counts as a failed attempt",
                job.spec.timeouts.pod_start_seconds
            )
        };
        ctx.event(
            job,
            EventType::Warning,
            "SessionPodNotStarting",
            format!(
                "session {} attempt {}: {}; {follows}",
                session.index,
                session.attempt,
                problem.describe()
            ),
        )
        .await;
    }
}

/// Whether this round gives the job's first session a pod (a claim, a start, a pre-warmed
/// pod made) while no tasks' digest is recorded.
fn begins(previous: Option<&RolloutJobStatus>, decided: &JobPlan) -> bool {
    previous.and_then(|s| s.tasks_digest.as_ref()).is_none()
        && !(decided.claim.is_empty() && decided.start.is_empty() && decided.prewarm.is_empty())
}

/// The status field `sent` held that the apiserver's answer lacks: an older CRD pruned it.
/// Without `heldOut` the rounds would be opened again and again, their sessions run for ever
/// (without one of its fields the status would differ from every reconcile's and be written
/// for ever). (`untoldFailures` and `tasksDigest` are not checked here: stalled after the
/// fold's write, the round would return before telling the trainer, and the next fold would
/// clear the stall; a CRD without them wants a stall before any write.)
fn pruned(sent: &RolloutJobStatus, kept: Option<&RolloutJobStatus>) -> Option<&'static str> {
    let kept_held_out = kept.and_then(|k| k.held_out.as_ref());
    (sent.held_out.is_some() && kept_held_out != sent.held_out.as_ref()).then_some("heldOut")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An older CRD that pruned `heldOut` from the status the operator wrote is named.
    #[test]
    fn a_held_out_status_an_older_crd_pruned_is_named() {
        let sent = RolloutJobStatus {
            held_out: Some(Default::default()),
            ..Default::default()
        };
        assert_eq!(pruned(&sent, Some(&sent.clone())), None);
        assert_eq!(
            pruned(&sent, Some(&RolloutJobStatus::default())),
            Some("heldOut")
        );
        assert_eq!(pruned(&sent, None), Some("heldOut"));
        assert_eq!(pruned(&RolloutJobStatus::default(), None), None);
    }

    fn job() -> RolloutJob {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "floe.dev/v1alpha1", "kind": "RolloutJob",
            "metadata": {"name": "j", "namespace": "ml"},
            "spec": {"tasks": {"inline": [{"id": "a", "instruction": "x"}]},
                     "pool": "p", "numSamples": 1, "harness": {"preset": "pi"}, "backoffLimit": 2,
                     "evaluator": {"command": ["true"], "reward": {"failureReward": -1.0}}},
        }))
        .expect("job")
    }

    /// A session the agent failed by its own doing (its grader OOM-killed, its pod evicted
    /// for its disk) was scored at `failureReward`: a scored result, and its Event says so;
    /// only infrastructure's give-ups count as failed, which pages.
    #[test]
    fn the_agents_own_failure_is_a_scored_result_and_its_event_says_its_reward() {
        let failed = |agent_fault| Fold::Failed {
            index: 3,
            reason: "OOMKilled".into(),
            agent_fault,
            attempt: 0,
        };
        let own = fold_said(&job(), "pod-a", &failed(true), None);
        assert!(matches!(own.result, SessionResult::Scored));
        let (reason, note) = own.event.expect("an Event");
        assert_eq!(reason, "SessionFailed");
        assert!(note.contains("as the agent's own doing"), "{note}");
        assert!(note.ends_with("scored failureReward -1"), "{note}");
        assert!(!note.contains("no reward"), "{note}");

        let infra = fold_said(&job(), "pod-a", &failed(false), None);
        assert!(matches!(infra.result, SessionResult::Failed));
        let (_, note) = infra.event.expect("an Event");
        assert!(
            note.contains("backoffLimit 2") && note.ends_with("no reward recorded"),
            "{note}"
        );

        let held_out = fold_said(&job(), "pod-a", &failed(false), Some(4));
        let (_, note) = held_out.event.expect("an Event");
        assert!(
            note.starts_with("held-out session 3 (the round at step 4)"),
            "{note}"
        );
        let scored = fold_said(
            &job(),
            "pod-a",
            &Fold::Scored {
                index: 3,
                reward: 1.0,
            },
            None,
        );
        assert!(matches!(scored.result, SessionResult::Scored) && scored.event.is_none());
    }

    /// The digest goes into the status written before a round's first claims, not after them.
    #[test]
    fn the_round_that_gives_the_first_session_a_pod_records_the_tasks_first() {
        let claims = JobPlan {
            claim: vec![(0, 0)],
            ..JobPlan::default()
        };
        let prewarms = JobPlan {
            prewarm: vec![(0, 0)],
            ..JobPlan::default()
        };
        for plan in [&claims, &prewarms] {
            assert!(begins(None, plan));
            assert!(begins(Some(&RolloutJobStatus::default()), plan));
        }
        let recorded = RolloutJobStatus {
            tasks_digest: Some("d".into()),
            ..Default::default()
        };
        assert!(!begins(Some(&recorded), &claims));
        assert!(!begins(None, &JobPlan::default()));
    }

    fn with_retries(retries: &[(&str, i32)]) -> RolloutJobStatus {
        RolloutJobStatus {
            retries: retries.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_done_sessions_retry_count_is_named_null_so_the_merge_patch_removes_it() {
        let base = Written {
            rv: Some("7".into()),
            status: Some(with_retries(&[("0", 1), ("1", 2)])),
        };
        let patch = status_patch(&base, &with_retries(&[("1", 2), ("5", 1)]));
        assert_eq!(patch["metadata"]["resourceVersion"], "7");
        assert_eq!(
            patch["status"]["retries"],
            json!({"0": null, "1": 2, "5": 1})
        );
        // None left: the map (skipped when empty) is only the removals.
        let patch = status_patch(&base, &with_retries(&[]));
        assert_eq!(patch["status"]["retries"], json!({"0": null, "1": null}));
        let fresh = Written {
            rv: Some("1".into()),
            status: None,
        };
        let patch = status_patch(&fresh, &with_retries(&[]));
        assert!(patch["status"].get("retries").is_none(), "{patch}");
    }

    /// A failure the trainer took leaves `untoldFailures` by a null (the map skipped once
    /// empty would otherwise keep it, and the trainer's finish would wait for it forever).
    #[test]
    fn a_failure_the_trainer_took_is_named_null_so_the_merge_patch_removes_it() {
        let failure = |sample: i32| floe_crds::rollout_job::UntoldFailure {
            group: "j/t".into(),
            sample,
            session: format!("j-t-{sample}"),
            agent_fault: None,
            since: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        };
        let with_untold = |samples: &[i32]| RolloutJobStatus {
            untold_failures: samples
                .iter()
                .map(|s| (s.to_string(), failure(*s)))
                .collect(),
            ..Default::default()
        };
        let base = Written {
            rv: Some("3".into()),
            status: Some(with_untold(&[1, 2])),
        };
        let patch = status_patch(&base, &with_untold(&[2]));
        assert_eq!(patch["status"]["untoldFailures"]["1"], json!(null));
        assert_eq!(patch["status"]["untoldFailures"]["2"]["session"], "j-t-2");
        let patch = status_patch(&base, &with_untold(&[]));
        assert_eq!(
            patch["status"]["untoldFailures"],
            json!({"1": null, "2": null})
        );
        assert!(patch["status"].get("retries").is_none(), "{patch}");
    }

    #[test]
    fn only_a_job_stalled_on_its_crd_tries_held_out_alone_first() {
        use floe_crds::rollout_job::HeldOutStatus;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
        let stalled = |reason: &str| RolloutJobStatus {
            progress: Some("0/4".into()),
            conditions: vec![Condition {
                type_: "Stalled".into(),
                status: "True".into(),
                reason: reason.into(),
                message: "apply the new CRDs".into(),
                last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
                observed_generation: None,
            }],
            ..Default::default()
        };
        let opened = RolloutJobStatus {
            progress: Some("0/5".into()),
            held_out: Some(HeldOutStatus {
                first_index: Some(4),
                ..Default::default()
            }),
            ..Default::default()
        };
        // The probe is the status found, with only the new heldOut.
        let probe = crd_probe(Some(&stalled(CRD_OUTDATED)), &opened).expect("a probe");
        assert_eq!(probe.held_out, opened.held_out);
        assert_eq!(probe.progress.as_deref(), Some("0/4"));
        assert_eq!(probe.conditions, stalled(CRD_OUTDATED).conditions);
        // Stalled for another reason, or nothing new to record, or not stalled: no probe.
        assert!(crd_probe(Some(&stalled("PoolNotFound")), &opened).is_none());
        let recorded = RolloutJobStatus {
            held_out: opened.held_out.clone(),
            ..stalled(CRD_OUTDATED)
        };
        assert!(crd_probe(Some(&recorded), &opened).is_none());
        assert!(crd_probe(None, &opened).is_none());
    }
}
