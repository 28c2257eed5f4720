//! A finished job's own pods end with it: the task loader at once; the dataset collector once
//! it wrote the job's `summary.json` beside the dataset (or, when it cannot, a bounded while
//! later with a Warning Event); the trainer once its final model is on the checkpoint volume.
//! A trainer without `spec.train.checkpoint` keeps running: its final model lives only in the
//! pod until the job is deleted.

use std::time::Duration;

use floe_crds::rollout_job::RolloutJob;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};

use super::{delete_pod, trainer_endpoint, JobContext, JobError};
use crate::rollout::{aux_pods, summary};

/// How long after the job finished the collector may take to write the summary before it is
/// stopped without one.
const SUMMARY_GRACE: Duration = Duration::from_secs(120);

/// Ends the job's own pods; `Some(wait)` when a reconcile should come back for one. Without
/// `patience` (the job is about to be deleted) a collector that cannot write the summary now
/// is stopped at once.
pub(super) async fn end_job_pods(
    job: &RolloutJob,
    ctx: &JobContext,
    ns: &str,
    done: &Time,
    now: &Time,
    patience: bool,
) -> Result<Option<Duration>, JobError> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let name = job.name_any();
    if job.spec.tasks.file.is_some() {
        delete_pod(&pods, &aux_pods::task_loader_name(&name)).await?;
    }
    if let Some(train) = &job.spec.train {
        if train.checkpoint.is_some() {
            delete_pod(&pods, &aux_pods::trainer_service(&name)).await?;
        }
        return Ok(None);
    }
    if job.spec.sft.is_none() {
        return Ok(None);
    }
    let collector = aux_pods::dataset_service(&name);
    let Some(pod) = pods.get_opt(&collector).await? else {
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
    if !crate::pool_controller::is_ready(pod) {
        return Err(format!("pod {} is not ready", pod.name_any()));
    }
    let status = job.status.clone().unwrap_or_default();
    let url = trainer_endpoint(pod, "/v1/finish").ok_or("the collector pod has no IP")?;
    let token = super::job_token(ctx, job).await.ok_or_else(|| {
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
