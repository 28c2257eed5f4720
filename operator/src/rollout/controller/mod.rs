//! The RolloutJob controller. Each round is one short sequence: observe the job, its pool and
//! its pods; let [`super::plan::plan`] decide; apply the plan in the crash-safe order (fold
//! results into the status first; then claim and deliver; then release the pods whose results
//! are recorded); write the status.
//!
//! - [`context`]: what the controller shares across rounds, and remembers per job.
//! - [`observe`]: a round's reads: the pool, the tasks, the job's pods.
//! - [`own_pod`]: the job's own pod (trainer, dataset collector), its Services and its trainer.
//! - [`name_holder`]: whose an object under one of the job's names is (an earlier job's?).
//! - [`fidelity_gate`]: a train job's fidelity check, before its first session.
//! - [`claims`]: claiming READY pool pods and starting pre-warmed ones.
//! - [`deliver`]: a session's assignment, to its pod's gateway.
//! - [`pod_writes`]: releasing, stopping and creating the job's pods.
//! - [`report`]: a round's status writes, Events and metrics.
//! - [`task_sources`]: tasks from a ConfigMap, or from files on claims (a loader pod).
//! - [`job_end`]: a finished job (its own pods, its TTL) and a deleted one.

mod claims;
mod context;
mod deliver;
mod fidelity_gate;
mod job_end;
mod name_holder;
mod observe;
mod own_pod;
mod pod_writes;
mod report;
mod secret_token;
mod task_sources;
mod trainer_nodes;

use std::sync::Arc;
use std::time::{Duration, Instant};

use floe_crds::rollout_job::RolloutJob;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{finalizer, Event};
use kube::{Api, ResourceExt};

pub use context::{JobContext, DEFAULT_EARLY_CLAIM_LIMIT};

use super::aux_gate;
use super::held_out::{HeldOutState, TrainerAt};
use super::job_state::{job_state, staleness_gate};
use super::plan::{plan, Fold};
use super::pod_view;
use super::status::Blocked;
use super::suspended_trainer::SuspendedTrainer;

use crate::api_call::ApiCallError;
pub use crate::pods::names::JOB_FINALIZER;

#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error(transparent)]
    Api(#[from] ApiCallError),
    #[error("the job has no namespace")]
    NoNamespace,
    #[error("cannot build a session pod: {0}")]
    PodSpec(#[from] serde_json::Error),
    #[error(
        "the RolloutJob CRD on the cluster is older than this operator: the apiserver dropped \
         (part of) status.{0} from the job's status; apply the new CRDs \
         (`floe crds | kubectl apply -f -`)"
    )]
    CrdOutdated(&'static str),
    /// The apiserver refused a write for good (said on the job where it stops the job).
    #[error("the apiserver refused {0}")]
    Refused(String),
    /// The job as stored is a newer spec than the watch cache's: the round would act on the
    /// older one with the newer one's verdict. The watch brings the newer one shortly.
    #[error("the watch cache is behind the job as stored")]
    CacheBehind,
}

impl JobError {
    /// For `map_err`: the apiserver failed while `doing` something.
    pub(crate) fn api(doing: impl Into<String>) -> impl FnOnce(kube::Error) -> Self {
        let failed = ApiCallError::doing(doing);
        move |source| Self::Api(failed(source))
    }
}

/// What a round's failure is, to the controller: the finalizer helper's errors around ours.
pub type ReconcileError = kube::runtime::finalizer::Error<JobError>;

/// Why a round stops before its end.
enum Halt {
    /// The job cannot run as written, or waits for something to come: said on the job.
    Blocked(Blocked),
    /// A call failed: the round is tried again.
    Failed(JobError),
}

impl From<JobError> for Halt {
    fn from(e: JobError) -> Self {
        Self::Failed(e)
    }
}

impl From<serde_json::Error> for Halt {
    fn from(e: serde_json::Error) -> Self {
        Self::Failed(e.into())
    }
}

impl From<Blocked> for Halt {
    fn from(b: Blocked) -> Self {
        Self::Blocked(b)
    }
}

/// One reconcile, timed and counted under controller-runtime's metric names. The job keeps
/// [`JOB_FINALIZER`] while it lives, so that its claimed pods are let go when it is deleted.
pub async fn reconcile(
    job: Arc<RolloutJob>,
    ctx: Arc<JobContext>,
) -> Result<Action, ReconcileError> {
    let timer = ctx
        .metrics
        .reconcile_timer(crate::metrics::Kind::RolloutJob);
    let uid = job.uid().unwrap_or_default();
    let jobs: Api<RolloutJob> =
        Api::namespaced(ctx.client.clone(), &job.namespace().unwrap_or_default());
    let ctx_ref = &*ctx;
    let result = finalizer(&jobs, JOB_FINALIZER, job, |event| async move {
        match event {
            Event::Apply(job) => apply(&job, ctx_ref).await,
            Event::Cleanup(job) => job_end::cleanup(&job, ctx_ref).await,
        }
    })
    .await;
    if result.is_err() {
        // A write of this round may have landed unseen: never trust the cache over it.
        ctx.forget_bars(&uid);
    }
    timer.finish(result.is_ok());
    result
}

pub fn error_policy(job: Arc<RolloutJob>, error: &ReconcileError, _: Arc<JobContext>) -> Action {
    tracing::warn!(job = %job.name_any(), "reconcile failed: {error}");
    Action::requeue(Duration::from_secs(2))
}

/// A live job's round; a finished job only ends its pods and waits for its TTL.
async fn apply(job: &RolloutJob, ctx: &JobContext) -> Result<Action, JobError> {
    let ns = job.namespace().ok_or(JobError::NoNamespace)?;
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    if let Some(done) = job.status.as_ref().and_then(|s| s.completion_time.clone()) {
        return job_end::finished(job, ctx, &ns, &done, &now).await;
    }
    match round(job, ctx, &ns, &now).await {
        Ok(action) => Ok(action),
        Err(Halt::Blocked(blocked)) => stalled(job, ctx, &ns, &blocked, now).await,
        // Only the user can apply the new CRDs: said on the job (a condition and an Event),
        // not only in the operator's log. Its status write leaves `heldOut` alone.
        Err(Halt::Failed(e @ JobError::CrdOutdated(_))) => {
            let blocked = Blocked::stalled(report::CRD_OUTDATED, e.to_string());
            stalled(job, ctx, &ns, &blocked, now).await
        }
        Err(Halt::Failed(JobError::CacheBehind)) => Ok(Action::requeue(Duration::from_secs(1))),
        Err(Halt::Failed(e)) => Err(e),
    }
}

/// A round halted before its plan: said on the job. One that waits for something to come
/// keeps its claims; a stalled one gives back those it has not started a session on.
async fn stalled(
    job: &RolloutJob,
    ctx: &JobContext,
    ns: &str,
    blocked: &Blocked,
    now: Time,
) -> Result<Action, JobError> {
    if !blocked.transient {
        pod_writes::give_back_unstarted(ctx, job, ns, &blocked.reason).await?;
    }
    // Suspended while it cannot go on (Kueue preempts a stalled job too): its trainer's GPUs
    // go free as in a round, by what the status says of its sessions.
    if job.spec.suspend {
        match own_pod::stop_while_suspended_and_blocked(ctx, job, ns).await {
            Err(Halt::Failed(e)) => {
                tracing::warn!(job = %job.name_any(), "cannot stop the suspended job's trainer: {e}");
            }
            Err(Halt::Blocked(_)) | Ok(()) => {}
        }
    }
    report::blocked(job, ctx, blocked, now).await
}

/// observe → plan → fold → claim and deliver → release → status.
async fn round(job: &RolloutJob, ctx: &JobContext, ns: &str, now: &Time) -> Result<Action, Halt> {
    let started = Instant::now();
    // The job as this process last wrote it, or later: an older copy would claim again.
    if ctx.job_behind_own_write(job) {
        return Err(Halt::Failed(JobError::CacheBehind));
    }
    // Observe: the pool, the tasks and the pods; the job's own pod, which gates its sessions.
    let mut observed = observe::observe(job, ctx, ns).await?;
    let own_pod = own_pod::ensure(job, ctx, ns).await?;
    trainer_nodes::ensure(job, ctx, ns, own_pod.as_ref()).await?;
    // A train job's trainer, Ready, is checked once before its first session.
    if let fidelity_gate::Fidelity::Recorded =
        fidelity_gate::check(ctx, job, ns, &observed, own_pod.as_ref()).await?
    {
        return Ok(Action::requeue(Duration::from_millis(200)));
    }
    let job_pod = aux_gate::read(job, own_pod.as_ref(), ctx.early_claims, now.0);
    let (trainer, trainer_state) = own_pod::trainer_progress(ctx, job, own_pod.as_ref())
        .await
        .unzip();

    // A train job's sessions may all be done while its trainer still trains the last groups.
    let trainer_unfinished = crate::rollout::status::trainer_unfinished(
        job.spec.train.is_some(),
        job.status.as_ref().and_then(|s| s.trainer.as_ref()),
        trainer.as_ref(),
    );

    // Plan.
    let mut state = job_state(job, job.status.as_ref(), now, observed.total());
    state.staleness = staleness_gate(job, trainer_state);
    state.held_out = HeldOutState::of(job, observed.held_out.len(), state.total).map(|h| {
        HeldOutState {
            // Rounds open at what the trainer says, never at a version remembered.
            // `finished` as this read says it, like the version: a trainer replaced since it
            // finished (resumed from an older checkpoint) must not have a final round opened
            // at the version it has now.
            trainer: trainer_state.map(|t| TrainerAt {
                version: t.policy_version,
                finished: trainer.as_ref().is_some_and(|p| p.finished),
            }),
            // The set as it is now: `observe` stalled the job if it differs from the one the
            // rounds recorded.
            digest: Some(observed.held_out_digest.clone()),
            ..h
        }
    });
    let start_timeout = i64::from(job.spec.timeouts.pod_start_seconds);
    let sessions: Vec<_> = observed
        .pods
        .iter()
        .filter_map(|p| {
            let mut session = pod_view::session_pod(p)?;
            if state.lookahead.is_some() && !session.assigned {
                session.start_failed = pod_view::start_failure(p, now, start_timeout);
            }
            if session.start_failed.is_none() && !session.assigned {
                let timeout = Duration::from_secs(u64::try_from(start_timeout).unwrap_or(0));
                let uid = job.uid().unwrap_or_default();
                session.start_failed = ctx.undelivered_for(&uid, &p.name_any(), timeout);
            }
            Some(session)
        })
        .collect();
    let mut decided = plan(&state, &sessions, observed.ready.len(), job_pod.gate);
    report::start_problems(job, ctx, &observed.pods).await;
    pod_writes::mark_agents_ended(ctx, ns, &observed).await;
    // The rounds this plan may have opened: their sessions are claimed below.
    if let Some(h) = &decided.next.held_out {
        observed.held_out_steps = h.rounds.iter().map(|r| r.step).collect();
    }

    // Fold results into the status (guarded by the job's resourceVersion) ...
    let report = report::RoundReport {
        job,
        ctx,
        ns,
        now,
        job_pod: &job_pod,
        trainer_unfinished,
        tasks_digest: &observed.tasks_digest,
    };
    // Samples that failed for good: their groups need not wait for them, and one that failed
    // by the agent's own doing is a loss the trainer scores from the last snapshot its gateway
    // posted. Remembered before the fold, whose round may tell the trainer to finish: that
    // waits until it was told of them. (A fold that loses its write decides them again.)
    let failed: Vec<own_pod::FailedSample> = decided
        .folds
        .iter()
        .filter_map(|(_, fold)| match fold {
            Fold::Failed {
                index,
                agent_fault,
                attempt,
                reason,
            } => Some((
                *index,
                observed.session(*index)?,
                *agent_fault,
                *attempt,
                reason,
            )),
            _ => None,
        })
        // A held-out sample is no trainer's.
        .filter(|(_, at, ..)| at.held_out.is_none())
        .map(
            |(index, at, agent_fault, attempt, reason)| own_pod::FailedSample {
                index,
                group: floe_sandbox::session::group_id(&observed.name, &at.task.id, at.place.epoch),
                sample: at.place.sample,
                session: at.id(&observed.name, attempt),
                agent_fault: agent_fault.then(|| reason.clone()),
            },
        )
        .collect();
    own_pod::remember_failed(job, &mut decided.next, failed, now);
    let Some(written) = report.fold(&decided).await? else {
        // Someone else wrote first: look again before releasing anything.
        return Ok(Action::requeue(Duration::from_millis(200)));
    };
    own_pod::tell_trainer_failed(
        ctx,
        job,
        ns,
        own_pod.as_ref(),
        &mut decided.next.untold_failures,
        now,
    )
    .await;
    // The pods a round claims reach the job's trainer through the job's own policy: in place
    // before the first claim (the pool's allows no trainer).
    if !decided.claim.is_empty() && !observed.ready.is_empty() && observed.pool.is_some() {
        pod_writes::ensure_job_egress_policy(ctx, job, observed.pool.as_ref()).await?;
    }
    // ... then deliver and claim, so that new sessions are on their way ...
    let achieved =
        claims::claim_and_start(ctx, job, &observed, &decided, job_pod.gate, started).await?;
    // ... and only then let go of finished pods.
    pod_writes::release_and_replace(ctx, job, &observed, &decided).await?;

    // The status after this round.
    let running = decided.running_after(achieved.claimed, achieved.started);
    // Suspended (Kueue's preemption), its trainer's GPUs go free.
    let round = SuspendedTrainer {
        finished: !trainer_unfinished,
        sessions_done: decided.next.training_done(),
        running,
        untold_failures: decided.next.untold_failures.len(),
        ..SuspendedTrainer::default()
    };
    own_pod::stop_while_suspended(ctx, job, ns, own_pod.as_ref(), round).await?;
    Ok(report
        .finish(written, &decided.next, running, trainer, own_pod.as_ref())
        .await?)
}
