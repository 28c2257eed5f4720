//! A session's assignment, posted to its pod's gateway: what the session runs, where its
//! model calls and trajectories go, and with which tokens.

use std::time::Instant;

use floe_crds::rollout_job::RolloutJob;
use floe_gateway::protocol::upstream::UpstreamKind;
use floe_gateway::ship::Sink;
use floe_sandbox::session::{self, SessionOf, SessionUpstream};
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::events::EventType;
use kube::ResourceExt;

use super::observe::Observed;
use super::secret_token::secret_token;
use super::JobContext;
use crate::pods::names::{ATTEMPT_ANNOTATION, INDEX_ANNOTATION};
use crate::pods::view::join_host_port;
use crate::rollout::aux_pods;

/// The job's token (its Secret [`aux_pods::job_token_secret`]): what its gateways show
/// its ingest and policy server, and the operator the collector's finish.
pub(super) async fn job_token(ctx: &JobContext, job: &RolloutJob) -> Option<String> {
    super::secret_token::of_job(ctx, job, &aux_pods::job_token_secret(&job.name_any())).await
}

/// Where [`job_token`] is remembered.
pub(super) fn job_token_key(job: &RolloutJob) -> String {
    super::secret_token::job_key(job, &aux_pods::job_token_secret(&job.name_any()))
}

/// Where sessions' model calls and trajectories go, by the job's mode, with the job's token:
/// the trainer's (or collector's) ingest and a train job's policy server demand it.
pub(super) fn wiring(
    job: &RolloutJob,
    job_token: Option<String>,
    upstream_key: Option<String>,
) -> (Sink, SessionUpstream) {
    let ns = job.namespace().unwrap_or_default();
    let name = job.name_any();
    match (&job.spec.train, &job.spec.sft) {
        (Some(_), _) => (
            Sink::Trainer {
                url: format!(
                    "http://{}.{ns}.svc:{}/v1/trajectories",
                    aux_pods::trainer_service(&name),
                    aux_pods::INGEST_PORT
                ),
                token: job_token.clone(),
                // The kubelet evicts a pod with no grace period: each call's snapshot leaves
                // first, so that an eviction the agent caused still trains as its loss.
                snapshots: true,
            },
            // The job's own policy server is vLLM, whatever the pool's gateways default to.
            SessionUpstream {
                url: Some(format!(
                    "http://{}.{ns}.svc:{}",
                    aux_pods::policy_service(&name),
                    aux_pods::VLLM_PORT
                )),
                model: Some(aux_pods::SERVED_MODEL.to_string()),
                kind: Some(UpstreamKind::Vllm),
                // The policy proxy refuses inference without the job's token.
                api_key: job_token,
            },
        ),
        (None, Some(sft)) => (
            Sink::Trainer {
                url: format!(
                    "http://{}.{ns}.svc:{}/v1/trajectories",
                    aux_pods::dataset_service(&name),
                    aux_pods::INGEST_PORT
                ),
                token: job_token,
                snapshots: false,
            },
            SessionUpstream {
                url: Some(sft.upstream.url.clone()),
                model: sft.upstream.model.clone(),
                kind: Some(session::upstream_kind(sft.upstream.kind)),
                api_key: upstream_key,
            },
        ),
        (None, None) => (Sink::None, SessionUpstream::default()),
    }
}

/// Post the session's assignment to the pod's gateway control port. Idempotent at the
/// gateway (by session id), so a retry after a lost reply or an operator restart is safe.
/// Failures are logged and retried on the next reconcile. Returns the pod's name once its
/// gateway acknowledged (for [`mark_assigned`]).
pub(super) async fn deliver(
    ctx: &JobContext,
    job: &RolloutJob,
    o: &Observed,
    pod: &Pod,
    claimed: Option<Instant>,
) -> Option<String> {
    let name = pod.name_any();
    let Some(ip) = pod.status.as_ref().and_then(|s| s.pod_ip.clone()) else {
        tracing::warn!(%name, "claimed pod has no IP yet");
        return None;
    };
    let annotations = pod.annotations();
    let (Some(index), attempt) = (
        annotations
            .get(INDEX_ANNOTATION)
            .and_then(|i| i.parse::<u32>().ok()),
        annotations
            .get(ATTEMPT_ANNOTATION)
            .and_then(|a| a.parse::<u32>().ok())
            .unwrap_or(0),
    ) else {
        return None;
    };
    let Some(at) = o.session(index) else {
        tracing::error!(%name, index, "session index beyond the job's tasks");
        return None;
    };
    let ns = job.namespace().unwrap_or_default();
    let job_token = match (&job.spec.train, &job.spec.sft) {
        (None, None) => None,
        // Without it the trainer or collector would refuse every trajectory: wait for it.
        _ => Some(job_token(ctx, job).await?),
    };
    let (sink, upstream) = wiring(job, job_token, o.upstream_key.clone());
    // A held-out session's trajectory goes to no trainer: its reward is in its pod's result.
    let sink = if at.held_out.is_some() {
        Sink::None
    } else {
        sink
    };
    let of = SessionOf {
        job: &o.name,
        spec: &job.spec,
        task: at.task,
        epoch: at.place.epoch,
        sample: at.place.sample,
        attempt,
        sink: &sink,
        upstream,
        shared_hidden_files: &o.hidden,
    };
    let assignment = match at.held_out {
        Some(step) => session::held_out_assignment(&of, step),
        None => session::assignment(&of),
    };
    let token = secret_token(
        ctx,
        &ns,
        &name,
        &crate::pods::sandbox::control_secret_name(&name),
        // The pod's own Secret, under the pod's (random) name.
        |_| true,
    )
    .await?;
    let url = format!(
        "http://{}/floe/v1/assignments",
        join_host_port(
            &ip,
            crate::pods::view::control_port(pod).unwrap_or(o.control_port)
        )
    );
    let sent = ctx
        .http
        .post(&url)
        .bearer_auth(&token)
        .json(&assignment)
        .send()
        .await;
    let uid = job.uid().unwrap_or_default();
    let taken = || {
        if let Some(t) = claimed {
            ctx.metrics.claim_delivered(t);
        }
        ctx.delivered(&uid, &name);
        Some(name.clone())
    };
    match sent {
        Ok(r) if r.status().is_success() => return taken(),
        Ok(r) => {
            let code = r.status();
            let body = r.text().await.unwrap_or_default();
            if code == reqwest::StatusCode::CONFLICT && holds_it_already(&body, &assignment.session)
            {
                // Its mark was lost, and what the assignment is made from changed since (a
                // ConfigMap, a Secret): the pod runs the session with what it was first given.
                // Delivered, not a session to fail when its start never shows.
                ctx.event(
                    job,
                    EventType::Warning,
                    "AssignmentChanged",
                    format!(
                        "pod {name} runs session {} with the assignment it was first given; \
                         what it is made from changed since",
                        assignment.session
                    ),
                )
                .await;
                return taken();
            }
            tracing::warn!(%name, %code, "assignment refused: {body}");
            ctx.note_undelivered(&uid, &name, format!("{url} answered {code}: {body}"));
            if code == reqwest::StatusCode::CONFLICT {
                ctx.event(
                    job,
                    EventType::Warning,
                    "AssignmentConflict",
                    format!("pod {name} already holds a different session: {body}"),
                )
                .await;
            }
        }
        Err(e) => {
            tracing::warn!(%name, "cannot deliver the assignment: {e}");
            ctx.note_undelivered(&uid, &name, format!("POST {url}: {e}"));
        }
    }
    None
}

/// Whether a 409's `body` says the pod holds `session` already (assigned before with other
/// content), rather than another session.
fn holds_it_already(body: &str, session: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(body).is_ok_and(|b| {
        b["reason"] == floe_gateway::server::ASSIGNED_DIFFERENTLY && b["session"] == session
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The gateway's 409 for the same session, assigned before with other content, is the
    /// pod running it; one for a pod that holds another session (or any other body) is not.
    #[test]
    fn a_conflict_over_the_same_session_is_its_pod_running_it() {
        let same = serde_json::json!({"error": "session \"j-t-0\" was already assigned with different content",
                                      "reason": "AssignedDifferently", "session": "j-t-0"})
        .to_string();
        assert!(holds_it_already(&same, "j-t-0"));
        assert!(!holds_it_already(&same, "j-t-1"));
        let other = r#"{"error": "the pod holds another session"}"#;
        assert!(!holds_it_already(other, "j-t-0"));
        assert!(!holds_it_already("not json", "j-t-0"));
    }
}
