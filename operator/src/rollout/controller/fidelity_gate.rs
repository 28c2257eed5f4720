//! A train job's fidelity check on the cluster (`spec.train.fidelityCheck`,
//! [`floe_sandbox::fidelity`]): once its trainer pod is Ready and before its first session, a
//! few completions are sampled from the job's policy server with the sessions' own requests
//! and scored by the trainer. The measurement is kept in `status.fidelity` and judged against
//! the spec as it is at each round, so a job stopped by it goes on once its spec allows what
//! was measured (`action: Warn`, a larger `maxMismatch`) without a second probe.

use floe_crds::rollout_job::{FidelityAction, FidelityStatus, RolloutJob};
use floe_sandbox::fidelity::{self, FidelityError, Measured, Probe};
use floe_sandbox::session::{self, SessionOf};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
use serde_json::json;

use super::observe::Observed;
use super::{Halt, JobContext, JobError};
use crate::pods::names::{ASSIGNED_ANNOTATION, INGEST_PORT, VLLM_PORT};
use crate::rollout::aux_pods;
use crate::rollout::status::Blocked;

/// What the round does next.
pub(super) enum Fidelity {
    /// Nothing to check, or checked and allowed: the round goes on.
    Pass,
    /// Measured now and written to the status: the next round reads it.
    Recorded,
}

pub(super) async fn check(
    ctx: &JobContext,
    job: &RolloutJob,
    ns: &str,
    observed: &Observed,
    trainer: Option<&Pod>,
) -> Result<Fidelity, Halt> {
    let Some(train) = &job.spec.train else {
        return Ok(Fidelity::Pass);
    };
    let spec = &train.fidelity_check;
    if spec.action == FidelityAction::Off {
        return Ok(Fidelity::Pass);
    }
    if let Some(done) = job.status.as_ref().and_then(|s| s.fidelity.as_ref()) {
        return judged(spec, done).map(|()| Fidelity::Pass);
    }
    // Only before the first session: a job already under way (started by an operator before
    // this check existed) is not held up to make it.
    let started = job
        .status
        .as_ref()
        .is_some_and(|s| s.sessions.succeeded + s.sessions.failed > 0)
        || observed
            .pods
            .iter()
            .any(|p| p.annotations().contains_key(ASSIGNED_ANNOTATION));
    let ip = trainer
        .filter(|p| crate::pods::view::is_ready(p))
        .and_then(|p| p.status.as_ref()?.pod_ip.clone());
    let Some(ip) = ip.filter(|_| !started) else {
        return Ok(Fidelity::Pass); // not Ready: the session gate waits for it anyway
    };
    let measured = match measure(ctx, job, ns, observed, &ip).await {
        Ok(m) => Ok(m),
        Err(Probing::Unsupported(why)) => Err(why),
        Err(Probing::NotYet(why)) => {
            return Err(Halt::Blocked(Blocked::waiting(
                "FidelityCheckPending",
                format!("the fidelity check could not be made yet: {why}"),
            )))
        }
    };
    let recorded = match &measured {
        Ok(m) => FidelityStatus {
            tokens: i64::try_from(m.tokens).unwrap_or(i64::MAX),
            mismatch: m.mismatch,
            max: m.max,
            skipped: None,
        },
        Err(why) => FidelityStatus {
            skipped: Some(why.clone()),
            ..Default::default()
        },
    };
    let jobs: Api<RolloutJob> = Api::namespaced(ctx.client.clone(), ns);
    jobs.patch_status(
        &job.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": {"fidelity": recorded}})),
    )
    .await
    .map_err(JobError::api(format!(
        "writing the fidelity check of job {ns}/{}",
        job.name_any()
    )))?;
    let (kind, note) = match &measured {
        Ok(m) => match fidelity::verdict(spec, m) {
            Ok(line) if m.mismatch <= spec.max_mismatch => (EventType::Normal, line),
            Ok(line) | Err(line) => (EventType::Warning, line),
        },
        Err(why) => (EventType::Normal, format!("fidelity check skipped: {why}")),
    };
    ctx.event(job, kind, "FidelityChecked", note).await;
    Ok(Fidelity::Recorded)
}

/// A measurement against the spec: `Err` stops the job (`Stalled`) until the spec allows it.
fn judged(
    spec: &floe_crds::rollout_job::FidelityCheckSpec,
    done: &FidelityStatus,
) -> Result<(), Halt> {
    if done.skipped.is_some() {
        return Ok(());
    }
    let m = Measured {
        samples: 0,
        tokens: u64::try_from(done.tokens).unwrap_or(0),
        mismatch: done.mismatch,
        max: done.max,
    };
    fidelity::verdict(spec, &m)
        .map(|_| ())
        .map_err(|line| Halt::Blocked(Blocked::stalled("FidelityCheckFailed", line)))
}

enum Probing {
    /// The trainer does not make the check (several processes): recorded as skipped.
    Unsupported(String),
    /// Not answerable yet (a Secret not there, the server still warming up): retried.
    NotYet(String),
}

async fn measure(
    ctx: &JobContext,
    job: &RolloutJob,
    ns: &str,
    observed: &Observed,
    ip: &str,
) -> Result<Measured, Probing> {
    let not_yet = |e: String| Probing::NotYet(e);
    let job_token = super::deliver::job_token(ctx, job)
        .await
        .ok_or_else(|| not_yet("the job's token Secret is not readable yet".into()))?;
    let control_token = super::own_pod::trainer_control_token(ctx, job, ns)
        .await
        .map_err(not_yet)?;
    let Some(at) = observed.session(0) else {
        return Err(Probing::Unsupported("the job has no session".into()));
    };
    // Session 0's own upstream settings: what its gateway will send the policy server.
    let (sink, upstream) = super::deliver::wiring(job, Some(job_token.clone()), None);
    let first = session::assignment(&SessionOf {
        job: &observed.name,
        spec: &job.spec,
        task: at.task,
        epoch: at.place.epoch,
        sample: at.place.sample,
        attempt: 0,
        sink: &sink,
        upstream,
        shared_hidden_files: &observed.hidden,
    });
    let over = first.upstream.unwrap_or_default();
    let samples = usize::try_from(
        job.spec
            .train
            .as_ref()
            .map_or(1, |t| t.fidelity_check.samples),
    )
    .unwrap_or(1);
    let host = crate::pods::view::join_host_port(ip, VLLM_PORT);
    let trainer = crate::pods::view::join_host_port(ip, INGEST_PORT);
    let (policy_url, trainer_url) = (format!("http://{host}"), format!("http://{trainer}"));
    let probe = Probe {
        http: &ctx.http,
        policy_url: &policy_url,
        policy_key: Some(&job_token),
        model: aux_pods::SERVED_MODEL,
        trainer_url: &trainer_url,
        control_token: &control_token,
        upstream: &over,
        prompts: fidelity::prompts(
            observed.tasks.iter().map(|t| t.instruction.as_str()),
            samples,
        ),
    };
    fidelity::measure(&probe).await.map_err(|e| match e {
        FidelityError::Unsupported(why) => Probing::Unsupported(why),
        other => Probing::NotYet(other.to_string()),
    })
}
