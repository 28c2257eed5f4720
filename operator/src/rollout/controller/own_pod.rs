//! The job's own pod: the trainer (train) or the dataset collector (sft), with its Services
//! and Secrets, created when missing; and what its trainer says (progress, finish).

use std::collections::BTreeMap;
use std::time::Duration;

use floe_crds::rollout_job::{
    RolloutJob, RolloutJobStatus, TrainerProgress, TrainerState, UntoldFailure,
};
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};

use super::{name_holder, Halt, JobContext, JobError};
use crate::pods::names::CONTROL_TOKEN_KEY;
use crate::pods::view::join_host_port;
use crate::rollout::plan::JobState;
use crate::rollout::status::{self, Blocked};
use crate::rollout::suspended_trainer::SuspendedTrainer;
use crate::rollout::{aux_gate, aux_pods, spec_digest};

/// Create the job's trainer pod (train) or dataset collector (sft) and their Services when
/// missing; returns the pod as it is now.
pub(super) async fn ensure(
    job: &RolloutJob,
    ctx: &JobContext,
    ns: &str,
) -> Result<Option<Pod>, Halt> {
    let built = match (&job.spec.train, &job.spec.sft) {
        (Some(_), _) => aux_pods::trainer(job, &ctx.floe_image),
        (None, Some(_)) => aux_pods::collector(job, &ctx.floe_image),
        _ => Ok(None),
    };
    // A pod that cannot be built must not read as "no pod needed": the gate would open.
    let objects = match built {
        Ok(Some(o)) => o,
        Ok(None) => return Ok(None),
        Err(e) => {
            return Err(Halt::Blocked(Blocked::stalled(
                "InvalidSpec",
                format!("cannot build the job's own pod from its spec: {e}"),
            )))
        }
    };
    let name = objects.pod.name_any();
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    // The pod cache holds it (floe's label) with all a round reads of it: readiness and IP.
    let read = |e| JobError::api(format!("reading pod {ns}/{name}"))(e);
    let found = match ctx.pods.get(&ObjectRef::new(&name).within(ns)) {
        Some(p) => Some((*p).clone()),
        None => pods.get_opt(&name).await.map_err(read)?,
    };
    let made_from = spec_digest::digest(&objects.pod);
    if let Some(p) = found {
        name_holder::ours(&pods, job, &p, "pod").await?;
        if let Some(why) = aux_gate::ended_for_good(&p) {
            replace_ended(ctx, job, &pods, &p, &why).await?;
            // Not Ready: the gate stays closed until the new one is.
            return Ok(Some(p));
        }
        made_from_the_spec(job, &pods, &p, &made_from).await?;
        return Ok(Some(p));
    }
    // A job suspended before it ran (Kueue admits jobs by resuming them) holds no trainer GPU
    // or collector until it is resumed; it starts no session meanwhile either.
    if job.spec.suspend {
        return Ok(None);
    }
    // Services first: the pod's clients find them ready when it is.
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), ns);
    for svc in &objects.services {
        name_holder::create_ours(&services, job, svc, "Service").await?;
    }
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    for secret in &objects.secrets {
        name_holder::create_ours(&secrets, job, secret, "Secret").await?;
    }
    tracing::info!(job = %job.name_any(), pod = %name, "creating the job's pod");
    let mut pod = objects.pod;
    pod.annotations_mut()
        .insert(spec_digest::ANNOTATION.into(), made_from);
    name_holder::create_ours(&pods, job, &pod, "pod").await?;
    Ok(pods.get_opt(&name).await.map_err(read)?)
}

/// The job's own pod runs with the spec it was made from (its config is baked in): a spec
/// changed since in what it runs with stalls the job, saying how to go on. A pod whose digest
/// cannot be compared (an older operator made it) gets the spec's as it is now.
async fn made_from_the_spec(
    job: &RolloutJob,
    pods: &Api<Pod>,
    pod: &Pod,
    now: &str,
) -> Result<(), Halt> {
    let name = pod.name_any();
    let recorded = pod.annotations().get(spec_digest::ANNOTATION);
    // On the pod, where a stall for another reason found first (an outdated CRD during the
    // very upgrade) cannot hide it; the job's condition for pods stalled before it was kept.
    let marked = pod
        .annotations()
        .contains_key(spec_digest::CHANGED_ANNOTATION);
    let stalled_for_it = marked || status::stalled_for(job.status.as_ref(), OWN_POD_SPEC_CHANGED);
    let annotate = async |annotations: serde_json::Value| {
        let patch = serde_json::json!({"metadata": {"annotations": annotations}});
        pods.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
            .map_err(|e| Halt::Failed(JobError::api(format!("annotating pod {name}"))(e)))
    };
    match spec_digest::drift(recorded.map(String::as_str), now, stalled_for_it) {
        // Restored: the mark goes.
        spec_digest::Drift::Same if marked => {
            annotate(serde_json::json!({spec_digest::CHANGED_ANNOTATION: null})).await
        }
        spec_digest::Drift::Same => Ok(()),
        spec_digest::Drift::Unknown => {
            annotate(serde_json::json!({spec_digest::ANNOTATION: now})).await
        }
        spec_digest::Drift::Changed => {
            if !marked {
                annotate(serde_json::json!({spec_digest::CHANGED_ANNOTATION: "true"})).await?;
            }
            let message = if job.spec.train.is_some() {
                format!(
                    "the spec changed since the trainer pod {name} was made in what it runs with \
                     (spec.train, spec.sampling, spec.numSamples or the evaluator's reward): it \
                     trains with the config it was made with, while new sessions would sample \
                     with the new spec (a gradient of a policy nothing samples). Restore the \
                     spec, or delete pod {name} to have it made again from the new one (it \
                     resumes from its last checkpoint; without spec.train.checkpoint it starts \
                     over)"
                )
            } else {
                format!(
                    "the spec changed since the dataset collector pod {name} was made in what it \
                     runs with (spec.sft: its teacher, output or minimum reward): it runs with \
                     what it was made with, and new sessions would sample another teacher into \
                     the same dataset. Restore the spec, or delete pod {name} to have it made \
                     again from the new one"
                )
            };
            Err(Halt::Blocked(Blocked::stalled(
                OWN_POD_SPEC_CHANGED,
                message,
            )))
        }
        spec_digest::Drift::UnknownWhileStalled => Err(Halt::Blocked(Blocked::stalled(
            OWN_POD_SPEC_CHANGED,
            format!(
                "the job was stalled for a spec changed since its pod {name} was made, and this \
                 operator builds the pod otherwise than the one that found it (an upgrade), so \
                 it cannot tell whether the spec was restored since. Delete pod {name} to have \
                 it made again from the spec as it is{}",
                if job.spec.train.is_some() {
                    " (it resumes from its last checkpoint; without spec.train.checkpoint it \
                     starts over)"
                } else {
                    ""
                }
            ),
        ))),
    }
}

/// The reason a job stalls for a spec its own pod was not made from.
const OWN_POD_SPEC_CHANGED: &str = "OwnPodSpecChanged";

/// Delete the job's pod that ended for good (`why`), saying so: the next round makes it again.
async fn replace_ended(
    ctx: &JobContext,
    job: &RolloutJob,
    pods: &Api<Pod>,
    pod: &Pod,
    why: &str,
) -> Result<(), Halt> {
    let name = pod.name_any();
    let resumes = if job.spec.train.is_some() {
        " (the trainer resumes from its last checkpoint)"
    } else {
        ""
    };
    let note = format!("the job's pod {name} {why}: deleted to be made again{resumes}");
    tracing::warn!(job = %job.name_any(), "{note}");
    ctx.event(job, EventType::Warning, "JobPodReplaced", note)
        .await;
    // Only that pod: the cache may be behind one made since under its name.
    name_holder::delete_exactly(pods, "pod", &name, pod.metadata.uid.clone()).await
}

/// `path` on the trainer pod's ingest port, once the pod has an IP.
pub(super) fn trainer_endpoint(pod: &Pod, path: &str) -> Option<String> {
    let ip = pod.status.as_ref()?.pod_ip.clone()?;
    Some(format!(
        "http://{}{path}",
        join_host_port(&ip, aux_pods::INGEST_PORT)
    ))
}

/// The trainer's `GET /v1/status`: its progress (step, policy version, last step time),
/// mirrored into the job's status, and what gates the job's sessions; `None` while it cannot
/// be read.
pub(super) async fn trainer_progress(
    ctx: &JobContext,
    job: &RolloutJob,
    pod: Option<&Pod>,
) -> Option<(TrainerProgress, TrainerState)> {
    job.spec.train.as_ref()?;
    let pod = pod?;
    let url = trainer_endpoint(pod, "/v1/status")?;
    let reply = ctx
        .http
        .get(&url)
        .timeout(Duration::from_secs(2))
        .send()
        .await
        .ok()?;
    if !reply.status().is_success() {
        return None;
    }
    let v: serde_json::Value = reply.json().await.ok()?;
    let progress = TrainerProgress {
        step: v.get("step")?.as_i64()?,
        policy_version: v.get("policyVersion")?.as_i64()?,
        last_step_time: v
            .get("lastStepTime")
            .and_then(|t| t.as_str())
            .and_then(|t| t.parse().ok())
            .map(Time),
        finished: v.get("finished").and_then(|f| f.as_bool()).unwrap_or(false),
        final_model: v
            .get("finalCheckpoint")
            .and_then(|f| f.as_str())
            .map(String::from),
    };
    Some((progress, TrainerState::from_status(&v)))
}

/// `POST /v1/finish` to the trainer with the job's control token: the sessions are done, train
/// what is left and write the final model.
async fn finish_trainer(
    ctx: &JobContext,
    job: &RolloutJob,
    ns: &str,
    pod: &Pod,
) -> Result<(), TellError> {
    post_to_trainer(ctx, job, ns, pod, "/v1/finish", None).await
}

/// A sample whose session failed for good.
pub(super) struct FailedSample {
    /// Its session index.
    pub index: u32,
    pub group: String,
    pub sample: u32,
    /// The failed attempt's session id.
    pub session: String,
    /// Why, when it was the agent's own doing (its pod evicted for what it wrote).
    pub agent_fault: Option<String>,
}

/// How long the operator keeps telling a trainer of a failed sample it answers 5xx for: past
/// this the job's end no longer waits for it. One not there is told once it is, however long
/// that takes.
const TELL_FAILED_FOR: Duration = Duration::from_secs(15 * 60);

/// Samples of a train job that failed for good, folded this round: to be told to its trainer
/// (by [`tell_trainer_failed`], this round and every next one until it answers). Kept in the
/// status the fold writes (`untoldFailures`), so that an operator restarted before the trainer
/// answered still tells it.
pub(super) fn remember_failed(
    job: &RolloutJob,
    next: &mut JobState,
    failed: Vec<FailedSample>,
    now: &Time,
) {
    if job.spec.train.is_none() {
        return;
    }
    for f in failed {
        next.untold_failures
            .entry(f.index)
            .or_insert(UntoldFailure {
                group: f.group,
                sample: i32::try_from(f.sample).unwrap_or(i32::MAX),
                session: f.session,
                agent_fault: f.agent_fault,
                since: now.clone(),
            });
    }
}

/// `POST /v1/failed` for each sample whose session failed for good (its `backoffLimit`
/// retries spent) that the trainer has not taken: its group completes without it instead of
/// waiting for it until the job's end, and the session's snapshot is dropped. For the agent's
/// own failure the body says why (`agentFault`): the trainer scores the last snapshot its
/// gateway posted while it ran (the eviction left no time for more) as 0, so the loss trains
/// instead of vanishing. Each one taken (or refused for good) leaves `untold`, which the
/// round's status write then records. A trainer that cannot take it now (its pod lost and not
/// back yet, a 5xx) is told again on a later round (one that answers 5xx, for up to
/// [`TELL_FAILED_FOR`]; one not there, until it is): the trainer
/// takes a repeat (a write lost, an operator restarted) as the same ruling.
pub(super) async fn tell_trainer_failed(
    ctx: &JobContext,
    job: &RolloutJob,
    ns: &str,
    pod: Option<&Pod>,
    untold: &mut BTreeMap<u32, UntoldFailure>,
    now: &Time,
) {
    let Some(pod) = pod.filter(|_| !untold.is_empty()) else {
        return;
    };
    let mut taken = Vec::new();
    for (index, failure) in untold.iter() {
        let (group, sample) = (&failure.group, failure.sample);
        let mut body =
            serde_json::json!({"group": group, "sample": sample, "session": failure.session});
        if let Some(why) = &failure.agent_fault {
            body["agentFault"] = why.as_str().into();
        }
        let waited = Duration::try_from(now.0.duration_since(failure.since.0)).unwrap_or_default();
        let done = match post_to_trainer(ctx, job, ns, pod, "/v1/failed", Some(&body)).await {
            Ok(()) => true,
            Err(TellError::Refused(e)) => {
                // Asking again cannot help (a trainer without the route): not waited for.
                tracing::warn!(job = %job.name_any(), %group, sample, "the trainer refused a failed sample: {e}");
                true
            }
            Err(TellError::Unreachable(e)) => {
                tracing::warn!(job = %job.name_any(), %group, sample, "cannot tell the trainer of a failed sample yet: {e}");
                // The trainer is not there: the rest wait for the next round too. Never given
                // up on for that: a trainer back after a long outage that was not told would
                // hold the sample's group until the job's end (and, within `maxStaleness`, the
                // job with it); its finish, which waits for these, needs it there anyway.
                break;
            }
            Err(e) if waited > TELL_FAILED_FOR => {
                tracing::warn!(job = %job.name_any(), %group, sample, "the trainer did not take a failed sample in {TELL_FAILED_FOR:?}; no longer waited for: {e}");
                true
            }
            Err(TellError::Busy(e)) => {
                tracing::warn!(job = %job.name_any(), %group, sample, "the trainer did not take a failed sample yet: {e}");
                false
            }
        };
        if done {
            taken.push(*index);
        }
    }
    for index in taken {
        untold.remove(&index);
    }
}

/// A train job's control token, from its trainer's Secret.
pub(super) async fn trainer_control_token(
    ctx: &JobContext,
    job: &RolloutJob,
    ns: &str,
) -> Result<String, String> {
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    let name = aux_pods::trainer_control_secret(&job.name_any());
    let secret = secrets
        .get_opt(&name)
        .await
        .map_err(|e| format!("reading Secret {name}: {e}"))?
        .ok_or_else(|| format!("Secret {name} is missing"))?;
    if name_holder::holder(&secret.metadata, job) != crate::controller_ref::Holder::This {
        return Err(format!(
            "Secret {name} is not this job's (an earlier job's)"
        ));
    }
    crate::pods::view::control_token_of(&secret)
        .ok_or_else(|| format!("Secret {name} has no {CONTROL_TOKEN_KEY}"))
}

/// `POST` to the trainer's `path` with the job's control token (from its Secret).
async fn post_to_trainer(
    ctx: &JobContext,
    job: &RolloutJob,
    ns: &str,
    pod: &Pod,
    path: &str,
    body: Option<&serde_json::Value>,
) -> Result<(), TellError> {
    let url = trainer_endpoint(pod, path)
        .ok_or_else(|| TellError::Unreachable("the trainer pod has no IP".into()))?;
    let token = trainer_control_token(ctx, job, ns)
        .await
        .map_err(TellError::Unreachable)?;
    let mut request = ctx
        .http
        .post(&url)
        .bearer_auth(token)
        .timeout(Duration::from_secs(5));
    if let Some(body) = body {
        request = request.json(body);
    }
    let reply = request
        .send()
        .await
        .map_err(|e| TellError::Unreachable(format!("POST {url}: {e}")))?;
    let status = reply.status();
    if status.is_success() {
        return Ok(());
    }
    let why = format!("POST {url}: {status}");
    if status.is_client_error() && !matches!(status.as_u16(), 408 | 429) {
        return Err(TellError::Refused(why));
    }
    Err(TellError::Busy(why))
}

/// Why the trainer was not told.
#[derive(Debug, thiserror::Error)]
pub(super) enum TellError {
    /// Not there (no IP, no answer): worth another try later.
    #[error("{0}")]
    Unreachable(String),
    /// There, but it did not take this now (5xx, 408, 429): worth another try.
    #[error("{0}")]
    Busy(String),
    /// It answered no (another 4xx): another try would get the same answer.
    #[error("{0}")]
    Refused(String),
}

/// A train job whose sessions are done: tell its trainer, every round until it says it
/// finished (the call is idempotent).
pub(super) async fn finish_trainer_when_done(
    ctx: &JobContext,
    job: &RolloutJob,
    ns: &str,
    st: &RolloutJobStatus,
    pod: Option<&Pod>,
) {
    let finishing = st
        .conditions
        .iter()
        .any(|c| c.reason == status::TRAINING_LAST_GROUPS);
    // Told first of every sample that failed for good: a loss it would score after its finish
    // would never train.
    if let (true, Some(pod), true) = (finishing, pod, st.untold_failures.is_empty()) {
        if let Err(e) = finish_trainer(ctx, job, ns, pod).await {
            tracing::warn!(job = %job.name_any(), "cannot tell the trainer the sessions are done: {e}");
        }
    }
}

/// A train job suspended after it started: its trainer pod ends once nothing is owed to it
/// ([`SuspendedTrainer`]), so its GPUs go free; resumed, [`ensure`] makes it again and it goes on
/// from its checkpoint.
pub(super) async fn stop_while_suspended(
    ctx: &JobContext,
    job: &RolloutJob,
    ns: &str,
    pod: Option<&Pod>,
    round: SuspendedTrainer,
) -> Result<(), Halt> {
    let Some(train) = &job.spec.train else {
        return Ok(());
    };
    let decision = SuspendedTrainer {
        suspended: job.spec.suspend,
        checkpointed: train.checkpoint.is_some(),
        pod_alive: pod.is_some_and(|p| p.metadata.deletion_timestamp.is_none()),
        pod_ready: pod.is_some_and(crate::pods::view::is_ready),
        ..round
    };
    let (Some(pod), true) = (pod, decision.stops()) else {
        return Ok(());
    };
    let name = pod.name_any();
    let claim = train
        .checkpoint
        .as_ref()
        .map(|c| c.claim_name.clone())
        .unwrap_or_default();
    tracing::info!(job = %job.name_any(), pod = %name, "suspended: stopping the trainer pod");
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    if !name_holder::delete_as_seen(&pods, "pod", pod).await? {
        // Changed since the cache saw it: deleted already (the cache is behind), or to be
        // judged again from what it is now.
        return Ok(());
    }
    ctx.event(
        job,
        EventType::Normal,
        "TrainerStopped",
        format!(
            "suspended with no session running: trainer pod {name} stopped, its GPUs free (it \
             checkpoints on claim {claim} as it stops); resumed, the job makes it again and it \
             goes on from that checkpoint"
        ),
    )
    .await;
    Ok(())
}

/// [`stop_while_suspended`] for a job whose round halted before it planned (blocked): what
/// it needs of the round, read from the job's status and the pod cache.
pub(super) async fn stop_while_suspended_and_blocked(
    ctx: &JobContext,
    job: &RolloutJob,
    ns: &str,
) -> Result<(), Halt> {
    let name = aux_pods::trainer_service(&job.name_any());
    let pod = ctx.pods.get(&ObjectRef::new(&name).within(ns));
    let st = job.status.clone().unwrap_or_default();
    let s = &st.sessions;
    let round = SuspendedTrainer {
        finished: !status::trainer_unfinished(job.spec.train.is_some(), st.trainer.as_ref(), None),
        sessions_done: s.total > 0 && s.succeeded + s.failed >= s.total,
        running: u32::try_from(s.running).unwrap_or(u32::MAX),
        untold_failures: st.untold_failures.len(),
        ..SuspendedTrainer::default()
    };
    stop_while_suspended(ctx, job, ns, pod.as_deref(), round).await
}
