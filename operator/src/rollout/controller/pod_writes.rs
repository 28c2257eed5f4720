//! A round's writes to the job's pods after its claims: pods whose results are recorded are
//! let go, pods past the deadline stopped, and (`poolTemplate`) the next sessions' pods made.

use floe_crds::gateway_pool::GatewayPool;
use floe_crds::rollout_job::RolloutJob;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
use serde_json::json;

use super::observe::Observed;
use super::{Halt, JobContext, JobError};
use crate::pods::names::{AGENT_ENDED_ANNOTATION, JOB_LABEL, STATE_LABEL};
use crate::pods::PodState;
use crate::rollout::freshness::{version, Bar};
use crate::rollout::plan::JobPlan;
use crate::rollout::status::Blocked;

/// Mark the session pods whose agent container has ended while they run
/// ([`crate::rollout::pod_view::agent_ended_unmarked`]): an eviction's status may say nothing
/// of the containers, and the mark tells an agent that ended before it. Best effort: a mark
/// not written leaves such an eviction infrastructure, as it was.
pub(super) async fn mark_agents_ended(ctx: &JobContext, ns: &str, observed: &Observed) {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let pods = &pods;
    // Its value is when the agent container ended: a round whose cache is behind the mark
    // writes the same again, a no-op.
    let marks: Vec<(String, String)> = observed
        .pods
        .iter()
        .filter(|p| crate::rollout::pod_view::agent_ended_unmarked(p))
        .map(|p| {
            let when = crate::rollout::pod_view::agent_finished_at(p).unwrap_or_default();
            (p.name_any(), when)
        })
        .collect();
    futures::stream::iter(marks)
        .for_each_concurrent(ctx.in_flight, |(name, when): (String, String)| async move {
            let patch = json!({"metadata": {"annotations": {AGENT_ENDED_ANNOTATION: when}}});
            if let Err(e) = pods
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                tracing::warn!(%name, "cannot mark the agent ended: {e}");
            }
        })
        .await;
}

/// Only now (results recorded, new sessions on their way) let go of finished pods; then stop
/// the pods past the deadline; then (`poolTemplate`) make the next sessions' pods, after the
/// finished ones went (the window holds `concurrency + lookahead` pods, not one more while a
/// finished pod lingers).
pub(super) async fn release_and_replace(
    ctx: &JobContext,
    job: &RolloutJob,
    observed: &Observed,
    decided: &JobPlan,
) -> Result<(), Halt> {
    let ns = job.namespace().unwrap_or_default();
    let uid = job.uid().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let (pods_ref, ns_ref, uid_ref) = (&pods, &ns, &uid);
    let released: Vec<Result<(), JobError>> = futures::stream::iter(decided.release.clone())
        .map(|name: String| async move { let_go(ctx, pods_ref, ns_ref, uid_ref, &name).await })
        .buffer_unordered(ctx.in_flight)
        .collect()
        .await;
    released.into_iter().collect::<Result<(), _>>()?;
    for name in &decided.stop {
        let written = delete_pod(&pods, name).await?;
        ctx.raise_bar(&uid, name, bar_after_delete(written));
    }
    // Let go of but never deleted (the operator died between the two writes, or the DELETE
    // failed): no round would see it again, and it would keep its gateway and its resources
    // until the job ended.
    for pod in observed
        .pods
        .iter()
        .filter(|p| crate::rollout::pod_view::left_done(p))
    {
        let name = pod.name_any();
        let written = delete_pod(&pods, &name).await?;
        ctx.raise_bar(&uid, &name, bar_after_delete(written));
    }
    let gone: std::collections::HashSet<&str> = (decided.release.iter())
        .chain(&decided.stop)
        .map(String::as_str)
        .collect();
    restore_control_secrets(ctx, job, observed, &gone).await;
    create_prewarmed(ctx, job, observed, &decided.prewarm).await
}

/// `poolTemplate`: a starting pod another operator process made, which died before the pod's
/// control Secret, waits for the Secret's volume for ever (`ContainerCreating` is progress,
/// never a start failure, and the pod holds its session's place): it gets one. Looked for
/// once per pod and process, for pods whose token this process does not know (it made the
/// Secrets of its own pods, or deleted the pod).
async fn restore_control_secrets(
    ctx: &JobContext,
    job: &RolloutJob,
    observed: &Observed,
    gone: &std::collections::HashSet<&str>,
) {
    if job.spec.pool_template.is_none() {
        return;
    }
    let (uid, ns, job_name) = (
        job.uid().unwrap_or_default(),
        job.namespace().unwrap_or_default(),
        job.name_any(),
    );
    let there: std::collections::HashSet<&str> = (observed.pods.iter())
        .filter_map(|p| p.metadata.name.as_deref())
        .collect();
    for pod in &observed.pods {
        let name = pod.name_any();
        // Unstarted: a pod whose Secret volume never mounted ran no container, so its
        // gateway never read a token. Pods this round let go of or stopped are on their way
        // out (their tokens forgotten), and so are those let go of before.
        let sandbox = pod
            .labels()
            .get(crate::pods::names::SANDBOX_LABEL)
            .map(String::as_str)
            == Some("true");
        let starting = sandbox
            && crate::pods::view::unstarted(pod)
            && !gone.contains(name.as_str())
            && !crate::rollout::pod_view::left_done(pod);
        if !starting
            || ctx.tokens.get(&ns, &name).is_some()
            || ctx.looked_for_secret(&uid, &there, &name)
        {
            continue;
        }
        match crate::pods::writes::restore_control_secret(
            &ctx.client,
            &ctx.tokens,
            pod,
            (JOB_LABEL, &job_name),
        )
        .await
        {
            Ok(restored) => {
                ctx.note_looked_for_secret(&uid, &name);
                if restored {
                    tracing::warn!(job = %job_name, pod = %name, "the pod had no control Secret (an operator stopped between the two): made it");
                    ctx.event(
                        job,
                        EventType::Warning,
                        "ControlSecretRestored",
                        format!("pod {name} had no control Secret (an operator stopped between creating the two): made it, so the pod can start"),
                    )
                    .await;
                }
            }
            // Looked for again next round.
            Err(e) => {
                tracing::warn!(job = %job_name, pod = %name, "looking for the pod's control Secret: {e}")
            }
        }
    }
}

/// A job that cannot go on until its user changes something holds no pool pod whose session
/// has not started (claimed while its trainer or collector started, say): each goes back
/// unused, no attempt of its session's, and is claimed again once the job goes on. Others may
/// use the pool meanwhile; a stall may last until the job's deadline, or for good without one.
/// Running sessions keep their pods, and ended ones theirs until their results are folded.
/// Said in an Event when any went. (A `poolTemplate` job's pods are its own: kept.)
pub(super) async fn give_back_unstarted(
    ctx: &JobContext,
    job: &RolloutJob,
    ns: &str,
    why: &str,
) -> Result<(), JobError> {
    if job.spec.pool_ref.is_none() {
        return Ok(());
    }
    let uid = job.uid().unwrap_or_default();
    let unstarted: Vec<String> = super::observe::job_pods(job, ctx, ns, &job.name_any())
        .await?
        .iter()
        .filter(|p| crate::rollout::pod_view::unstarted_claim(p))
        .map(ResourceExt::name_any)
        .collect();
    if unstarted.is_empty() {
        return Ok(());
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    for name in &unstarted {
        let_go(ctx, &pods, ns, &uid, name).await?;
    }
    ctx.event(
        job,
        EventType::Normal,
        "PodsGivenBack",
        format!(
            "stalled ({why}): gave back {} pool pod(s) whose sessions had not started; they \
             are claimed again once the job goes on",
            unstarted.len()
        ),
    )
    .await;
    Ok(())
}

/// One of the job's pods released ([`release`]), and forgotten: its control token, its early
/// claim; the pod cache must show it terminating or gone before a round trusts it again.
async fn let_go(
    ctx: &JobContext,
    pods: &Api<Pod>,
    ns: &str,
    uid: &str,
    name: &str,
) -> Result<(), JobError> {
    ctx.tokens.forget(ns, name);
    ctx.take_claimed_early(uid, name);
    let written = release(pods, name).await?;
    ctx.raise_bar(uid, name, bar_after_delete(written));
    Ok(())
}

/// A pod whose result is recorded: its finalizer comes off and it is deleted (the pool
/// refills). Returns the pod's last resourceVersion this wrote, if it still exists.
async fn release(pods: &Api<Pod>, name: &str) -> Result<Option<String>, JobError> {
    let ns = pods.namespace().unwrap_or_default();
    let patch =
        json!({"metadata": {"finalizers": null, "labels": {STATE_LABEL: PodState::Done.label()}}});
    let patched = match pods
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(p) => p.metadata.resource_version,
        Err(kube::Error::Api(s)) if s.is_not_found() => return Ok(None),
        Err(e) => return Err(JobError::api(format!("releasing pod {ns}/{name}"))(e)),
    };
    Ok(delete_pod(pods, name).await?.or(patched))
}

/// Every pod of the job, released (a finished or deleted job).
pub(super) async fn release_all(
    ctx: &JobContext,
    job: &RolloutJob,
    ns: &str,
) -> Result<(), JobError> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let owned = pods
        .list(&ListParams::default().labels(&format!("{JOB_LABEL}={}", job.name_any())))
        .await
        .map_err(JobError::api(format!(
            "listing job {ns}/{}'s pods",
            job.name_any()
        )))?;
    for pod in owned.items {
        ctx.tokens.forget(ns, &pod.name_any());
        release(&pods, &pod.name_any()).await?;
    }
    Ok(())
}

/// Delete a job's pod ([`crate::pods::writes::delete`]).
pub(super) async fn delete_pod(pods: &Api<Pod>, name: &str) -> Result<Option<String>, JobError> {
    crate::pods::writes::delete(pods, name)
        .await
        .map_err(JobError::api(format!(
            "deleting pod {}/{name}",
            pods.namespace().unwrap_or_default()
        )))
}

/// After deleting a job's pod: the cache must show it at that version (terminating) or gone.
fn bar_after_delete(version_written: Option<String>) -> Bar {
    // Gone before any version was written: the cache must drop it.
    version_written.as_deref().map_or(Bar::gone(), |v| {
        Bar::at_least_or_gone(version(Some(v)).unwrap_or(u64::MAX))
    })
}

/// Keep the job's egress NetworkPolicy ([`crate::egress_policy::build_for_job`]): a
/// `poolTemplate` job's before each batch of new pods; a job on a pool's before its claims,
/// again only when it changes or a minute has passed (it is on the claims' way). A failure (no
/// RBAC for NetworkPolicies, say) is a Warning on the job, not a failed reconcile: each pod's
/// own check still says whether its egress is open.
pub(super) async fn ensure_job_egress_policy(
    ctx: &JobContext,
    job: &RolloutJob,
    pool: Option<&GatewayPool>,
) -> Result<(), Halt> {
    let ns = job.namespace().unwrap_or_default();
    let name = crate::egress_policy::job_policy_name(&job.name_any());
    let wanted = match crate::egress_policy::build_for_job(job, pool) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(job = %job.name_any(), "egress policy: {e}");
            return Ok(());
        }
    };
    let uid = job.uid().unwrap_or_default();
    let wanted_json = wanted.as_ref().and_then(|p| serde_json::to_string(p).ok());
    let memo = job.spec.pool_template.is_none();
    if memo && ctx.egress_fresh(&uid, &wanted_json) {
        return Ok(());
    }
    let owner = crate::egress_policy::Owner {
        kind: "RolloutJob",
        name: &job.name_any(),
        uid: &uid,
    };
    match crate::egress_policy::keep(&ctx.client, &ns, &name, owner, wanted.as_ref()).await {
        Ok(()) => ctx.egress_done(&uid, wanted_json),
        // Its pods would run without it: no claim and no new pod until the name is free.
        Err(e @ crate::egress_policy::KeepError::NotOurs { .. }) => {
            return Err(Halt::Blocked(Blocked::stalled(
                "EgressPolicyNotOurs",
                e.to_string(),
            )))
        }
        // An earlier job's, going: made again once gone, before any claim.
        Err(e @ crate::egress_policy::KeepError::BeingDeleted(_)) => {
            return Err(Halt::Blocked(Blocked::waiting(
                "EarlierJobObjects",
                e.to_string(),
            )))
        }
        Err(e) => {
            tracing::warn!(job = %job.name_any(), "egress policy {name}: {e}");
            ctx.event(
                job,
                EventType::Warning,
                "EgressPolicyFailed",
                format!("cannot apply NetworkPolicy {name} (spec.egress): {e}"),
            )
            .await;
        }
    }
    Ok(())
}

/// poolTemplate: create the pods (and their control-token Secrets) of the next sessions.
async fn create_prewarmed(
    ctx: &JobContext,
    job: &RolloutJob,
    observed: &Observed,
    sessions: &[(u32, u32)],
) -> Result<(), Halt> {
    let Some(template) = &job.spec.pool_template else {
        return Ok(());
    };
    if sessions.is_empty() {
        return Ok(());
    }
    // The pods' NetworkPolicy before the pods: applied with each batch of new pods, so one
    // deleted by hand comes back before the next untrusted agent starts.
    ensure_job_egress_policy(ctx, job, None).await?;
    let created: Vec<Result<(), Created>> = futures::stream::iter(sessions.to_vec())
        .map(|(index, attempt)| async move {
            let Some(at) = observed.session(index) else {
                return Ok(());
            };
            let (task, session) = (at.task, at.id(&observed.name, attempt));
            let suffix = crate::pods::sandbox::random_suffix();
            let pod = crate::rollout::prewarm::build(&crate::rollout::prewarm::SessionPodFor {
                job,
                template,
                task,
                index,
                attempt,
                session: &session,
                suffix: &suffix,
                floe_image: &ctx.floe_image,
                native_sidecars: ctx.native_sidecars,
            })?;
            let job_name = job.name_any();
            let created = crate::pods::writes::create_with_control_secret(
                &ctx.client,
                &ctx.tokens,
                &pod,
                (JOB_LABEL, &job_name),
            )
            .await
            .map_err(JobError::api(format!(
                "creating session pod {}/{} and its control Secret",
                pod.namespace().unwrap_or_default(),
                pod.name_any()
            )))
            .map_err(|e| Created::refused(e, index, attempt, &pod.name_any()))?;
            ctx.raise_bar(
                &job.uid().unwrap_or_default(),
                &created.name_any(),
                Bar::written(
                    version(created.metadata.resource_version.as_deref()).unwrap_or(u64::MAX),
                ),
            );
            tracing::info!(job = %job_name, pod = %pod.name_any(), "created pre-warmed session pod");
            Ok(())
        })
        .buffer_unordered(ctx.in_flight)
        .collect()
        .await;
    refused_for_good(created, observed.pods.is_empty())
}

/// Why a session pod was not made.
enum Created {
    /// The apiserver refused it for good; in words that stay the same from round to round
    /// (the pod's random name taken out), so the stall is written once.
    Refused(String),
    Failed(JobError),
}

impl Created {
    fn refused(e: JobError, index: u32, attempt: u32, pod: &str) -> Self {
        match &e {
            JobError::Api(call) => match call.refusal() {
                Some(words) => Self::Refused(format!(
                    "session {index} attempt {attempt}: {}",
                    words.replace(pod, "<pod>")
                )),
                None => Self::Failed(e),
            },
            _ => Self::Failed(e),
        }
    }
}

impl From<JobError> for Created {
    fn from(e: JobError) -> Self {
        Self::Failed(e)
    }
}

impl From<serde_json::Error> for Created {
    fn from(e: serde_json::Error) -> Self {
        Self::Failed(JobError::from(e))
    }
}

/// The creates of one round: when the apiserver refused every one for good (an admission rule
/// such as Pod Security's, a quota of no pods, a RuntimeClass that does not exist) and the job
/// has no pod at all, it cannot run a session until the user changes something: it stalls,
/// saying why, instead of failing every round in the operator's log only. With pods of its
/// own, a refusal (a quota the running ones fill) is tried again next round.
fn refused_for_good(created: Vec<Result<(), Created>>, no_pods: bool) -> Result<(), Halt> {
    let refused: Vec<&str> = created
        .iter()
        .filter_map(|c| match c {
            Err(Created::Refused(why)) => Some(why.as_str()),
            _ => None,
        })
        .collect();
    if no_pods && !created.is_empty() && refused.len() == created.len() {
        return Err(Halt::Blocked(crate::rollout::status::Blocked::stalled(
            "PodCreateRejected",
            format!(
                "the apiserver refused the job's session pods ({} this round), e.g. {}",
                refused.len(),
                refused[0]
            ),
        )));
    }
    for c in created {
        match c {
            Ok(()) => {}
            Err(Created::Failed(e)) => return Err(e.into()),
            Err(Created::Refused(why)) => {
                return Err(JobError::Refused(format!("creating a session pod: {why}")).into())
            }
        }
    }
    Ok(())
}
