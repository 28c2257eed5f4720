//! A finished job's own pods end with it: the task loader at once; the dataset collector once
//! it wrote the job's `summary.json` beside the dataset (or, when it cannot, a bounded while
//! later with a Warning Event); the trainer once its final model is on the checkpoint volume.
//! A trainer without `spec.train.checkpoint` keeps running: its final model lives only in the
//! pod until the job is deleted. A finished job then waits for its TTL; a deleted job lets go
//! of its pods.

use std::time::Duration;

use floe_crds::rollout_job::RolloutJob;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::DeleteParams;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};

use super::own_pod::trainer_endpoint;
use super::pod_writes::{delete_pod, release_all};
use super::{JobContext, JobError};
use crate::metrics::Kind;
use crate::rollout::{aux_pods, status, summary};

/// A deleted job: its pods' finalizers come off (garbage collection deletes them); the
/// finalizer helper then removes the job's own.
pub(super) async fn cleanup(job: &RolloutJob, ctx: &JobContext) -> Result<Action, JobError> {
    let ns = job.namespace().ok_or(JobError::NoNamespace)?;
    release_all(ctx, job, &ns).await?;
    ctx.metrics.forget_job(
        &ns,
        &job.name_any(),
        crate::rollout::job_state::pool_label(job),
    );
    ctx.forget(&job.uid().unwrap_or_default());
    ctx.tokens.forget(&ns, &super::deliver::job_token_key(job));
    ctx.tokens
        .forget(&ns, &super::task_sources::loader_token_key(job));
    Ok(Action::await_change())
}

/// A finished job: pods stopped at a deadline let go, its own pods ended, then its TTL.
pub(super) async fn finished(
    job: &RolloutJob,
    ctx: &JobContext,
    ns: &str,
    done: &Time,
    now: &Time,
) -> Result<Action, JobError> {
    ctx.forget(&job.uid().unwrap_or_default());
    // Best effort: a status write refused for good must not keep a finished job from ending
    // its pods and meeting its TTL.
    if let Err(e) = super::report::observe_after_end(job, ctx).await {
        tracing::warn!(job = %job.name_any(), "cannot record the spec's edit as observed: {e}");
    }
    ctx.metrics.none_waiting_for_pod(
        ns,
        &job.name_any(),
        crate::rollout::job_state::pool_label(job),
    );
    // What the round that ended it published stays until the job goes: an ended job blocks
    // nothing and runs nothing (its deadline stopped what ran), whatever that round said.
    ctx.metrics
        .set_blocked(Kind::RolloutJob, ns, &job.name_any(), None);
    if let Some(st) = &job.status {
        ctx.metrics
            .set_sessions(ns, &job.name_any(), &status::ended(st.sessions.clone()));
    }
    // Pods stopped at a deadline end after the job did: let them go too.
    release_all(ctx, job, ns).await?;
    // The job's own pods end with it; a job due for deletion (its TTL) waits for none.
    let ttl_left = ttl_left(job, done, now);
    let patience = ttl_left.is_none_or(|left| left > 0);
    if let Some(wait) = end_job_pods(job, ctx, ns, done, now, patience).await? {
        let wait = ttl_left.map_or(wait, |left| {
            wait.min(Duration::from_secs(u64::try_from(left).unwrap_or(1)))
        });
        return Ok(Action::requeue(wait));
    }
    let Some(left) = ttl_left else {
        return Ok(Action::await_change());
    };
    if left > 0 {
        return Ok(Action::requeue(Duration::from_secs(
            u64::try_from(left).unwrap_or(1),
        )));
    }
    tracing::info!(job = %job.name_any(), "ttlSecondsAfterFinished passed: deleting the job");
    let jobs: Api<RolloutJob> = Api::namespaced(ctx.client.clone(), ns);
    match jobs
        .delete(&job.name_any(), &DeleteParams::background())
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.is_not_found() => {}
        Err(e) => {
            return Err(JobError::api(format!(
                "deleting job {ns}/{} (its TTL passed)",
                job.name_any()
            ))(e))
        }
    }
    Ok(Action::await_change())
}

/// Seconds until a finished job's `ttlSecondsAfterFinished` passes (≤ 0: passed); `None`
/// without one.
fn ttl_left(job: &RolloutJob, done: &Time, now: &Time) -> Option<i64> {
    job.spec
        .ttl_seconds_after_finished
        .map(|ttl| i64::from(ttl) - now.0.duration_since(done.0).as_secs())
}

/// How long after the job finished the collector may take to write the summary before it is
/// stopped without one.
const SUMMARY_GRACE: Duration = Duration::from_secs(120);

/// Ends the job's own pods; `Some(wait)` when a reconcile should come back for one. Without
/// `patience` (the job is about to be deleted) a collector that cannot write the summary now
/// is stopped at once.
async fn end_job_pods(
    job: &RolloutJob,
    ctx: &JobContext,
    ns: &str,
    done: &Time,
    now: &Time,
    patience: bool,
) -> Result<Option<Duration>, JobError> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let name = job.name_any();
    // The loader of a source the spec no longer names (edited to inline mid-job) goes too.
    let loader = aux_pods::task_loader_name(&name);
    if aux_pods::task_files(job).iter().any(Option::is_some)
        || ctx
            .pods
            .get(&kube::runtime::reflector::ObjectRef::new(&loader).within(ns))
            .is_some()
    {
        delete_pod(&pods, &loader).await?;
    }
    if let Some(train) = &job.spec.train {
        // The other nodes' pods hold GPUs and have nothing left to do: their processes ended
        // when the first pod's finished (or the job failed).
        for worker in crate::rollout::trainer_workers::worker_names(job) {
            delete_pod(&pods, &worker).await?;
        }
        if train.checkpoint.is_some() {
            delete_pod(&pods, &aux_pods::trainer_service(&name)).await?;
        }
        return Ok(None);
    }
    if job.spec.sft.is_none() {
        return Ok(None);
    }
    let collector = aux_pods::dataset_service(&name);
    let found = pods
        .get_opt(&collector)
        .await
        .map_err(JobError::api(format!("reading pod {ns}/{collector}")))?;
    let Some(pod) = found else {
        return Ok(None);
    };
    if pod.metadata.deletion_timestamp.is_some() {
        return Ok(None);
    }
    match write_summary(ctx, job, &pod).await {
        Ok(()) => {
            tracing::info!(job = %name, pod = %collector, "summary.json written; stopping the collector");
        }
        Err(why) => {
            let since = now.0.duration_since(done.0).as_secs();
            let left = SUMMARY_GRACE
                .as_secs()
                .saturating_sub(u64::try_from(since).unwrap_or(0));
            if left > 0 && patience {
                tracing::info!(job = %name, "summary.json not written yet: {why}");
                return Ok(Some(Duration::from_secs(left.min(5))));
            }
            let note = format!(
                "the dataset collector did not write summary.json {} ({why}); dataset.jsonl is complete, the summary is the job's status; stopping the collector",
                if patience {
                    format!("within {} s of the job's end", SUMMARY_GRACE.as_secs())
                } else {
                    "before the job's ttlSecondsAfterFinished".to_string()
                }
            );
            tracing::warn!(job = %name, "{note}");
            ctx.event(job, EventType::Warning, "SummaryNotWritten", note)
                .await;
        }
    }
    delete_pod(&pods, &collector).await?;
    Ok(None)
}

async fn write_summary(ctx: &JobContext, job: &RolloutJob, pod: &Pod) -> Result<(), String> {
    if !crate::pods::view::is_ready(pod) {
        return Err(format!("pod {} is not ready", pod.name_any()));
    }
    let status = job.status.clone().unwrap_or_default();
    let url = trainer_endpoint(pod, "/v1/finish").ok_or("the collector pod has no IP")?;
    let token = super::deliver::job_token(ctx, job).await.ok_or_else(|| {
        format!(
            "the job's token (Secret {}) cannot be read",
            aux_pods::job_token_secret(&job.name_any())
        )
    })?;
    let reply = ctx
        .http
        .post(&url)
        .bearer_auth(token)
        .json(&summary::job_summary(job, &status))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .map_err(|e| format!("POST {url}: {}", floe_gateway::net_error::describe(&e).1))?;
    if !reply.status().is_success() {
        let status = reply.status();
        let body = reply.text().await.unwrap_or_default();
        return Err(format!("POST {url}: {status} {}", body.trim()));
    }
    Ok(())
}
