//! A round's claims: the assignments still owed, READY pool pods claimed for the next
//! sessions (each delivered as soon as it is claimed), and `poolTemplate` sessions started on
//! their pre-warmed pods.

use std::time::Instant;

use floe_crds::rollout_job::RolloutJob;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use super::deliver::deliver;
use super::observe::Observed;
use super::{JobContext, JobError};
use crate::metrics::ClaimPhase;
use crate::pods::names::*;
use crate::pods::PodState;
use crate::rollout::aux_gate::Gate;
use crate::rollout::freshness::{version, Bar};
use crate::rollout::plan::JobPlan;
use crate::rollout::pod_view;

/// What a round's claims and starts achieved.
pub(super) struct Achieved {
    /// Claims that won their pod.
    pub claimed: usize,
    /// `poolTemplate` sessions whose pre-warmed pod was there to start.
    pub started: usize,
}

/// Deliver assignments still owed, then claim READY pods for the next sessions, then start
/// pre-warmed ones; mark the pods whose gateway acknowledged. Deliveries and claims go out
/// concurrently: a burst of sessions must not wait for each other's apiserver round trips
/// (claim latency is measured from `round`, the start of the round).
pub(super) async fn claim_and_start(
    ctx: &JobContext,
    job: &RolloutJob,
    observed: &Observed,
    decided: &JobPlan,
    gate: Gate,
    round: Instant,
) -> Result<Achieved, JobError> {
    let ns = job.namespace().unwrap_or_default();
    // (Owned items: a stream of borrowed pods trips the compiler's higher-ranked lifetime
    // check once the future has to be Send.)
    let owed: Vec<Pod> = decided
        .deliver
        .iter()
        .filter_map(|name| observed.pods.iter().find(|p| p.name_any() == *name))
        .cloned()
        .collect();
    let uid = job.uid().unwrap_or_default();
    // A failed delivery's clock runs only while deliveries are tried every round: a pod not
    // tried now (held back by the gate, staleness or concurrency; released; gone) starts it
    // again at its next failure.
    let tried: Vec<&str> = decided
        .deliver
        .iter()
        .chain(&decided.start)
        .map(String::as_str)
        .collect();
    ctx.keep_undelivered(&uid, &tried);
    let uid_ref = &uid;
    let phase = |phase: ClaimPhase, since: Instant| ctx.metrics.claim_phase(phase, since);
    // Pods whose gateway acknowledged its assignment in this round: marked `assigned` once the
    // round's claims are out, so that this second write per claim never queues a claim.
    let mut acknowledged: Vec<String> = futures::stream::iter(owed)
        .map(|pod: Pod| async move {
            // A pod claimed while the job's pod was starting: its session may start from now,
            // so its claim latency counts from this round.
            let early = ctx.take_claimed_early(uid_ref, &pod.name_any());
            let delivering = Instant::now();
            let acked = deliver(ctx, job, observed, &pod, early.then_some(round)).await;
            if early {
                phase(ClaimPhase::Deliver, delivering);
            }
            acked
        })
        .buffer_unordered(ctx.in_flight)
        .filter_map(std::future::ready)
        .collect()
        .await;
    let pool_label = crate::rollout::job_state::pool_label(job);
    ctx.metrics
        .set_waiting_for_pod(&ns, &job.name_any(), pool_label, decided.starved.len());
    ctx.note_starved(&uid, &decided.starved);
    // Each session gets its own READY pod; one that someone else took first (a conflict) just
    // waits for the next round.
    let pairs: Vec<((u32, u32), Pod)> = decided
        .claim
        .iter()
        .copied()
        .zip(observed.ready.iter().cloned())
        .collect();
    // Two stages: `in_flight` PATCHes at the apiserver, and each claimed pod's delivery (to
    // its own gateway, not the apiserver) beside the next PATCHes. The delivery stage holds
    // as many as the round claims, so it never stops the PATCH stage from being polled.
    let deliveries = pairs.len().max(1);
    let claiming = (!pairs.is_empty()).then(|| ctx.claims.enter());
    let claims: Vec<Result<ClaimOutcome, JobError>> = futures::stream::iter(pairs)
        .map(
            |((index, attempt), candidate): ((u32, u32), Pod)| async move {
                phase(ClaimPhase::Observe, round);
                let patching = Instant::now();
                let claimed = claim(ctx, job, observed, &candidate, index, attempt).await?;
                if claimed.is_some() {
                    phase(ClaimPhase::Patch, patching);
                    ctx.count_claim(uid_ref, index);
                }
                Ok(claimed.map(|pod| (pod, [patching, Instant::now()])))
            },
        )
        .buffer_unordered(ctx.in_flight)
        .map(
            |claimed: Result<Option<(Pod, [Instant; 2])>, JobError>| async move {
                let Some((pod, [patching, patched])) = claimed? else {
                    return Ok(ClaimOutcome::Lost);
                };
                if !gate.deliver {
                    ctx.note_claimed_early(uid_ref, &pod.name_any());
                    return Ok(ClaimOutcome::Claimed { acknowledged: None });
                }
                let delivering = Instant::now();
                let acknowledged = deliver(ctx, job, observed, &pod, Some(round)).await;
                phase(ClaimPhase::Deliver, delivering);
                // Where a slow claim's time went, claim by claim (the histograms keep only sums).
                tracing::info!(
                    pod = %pod.name_any(),
                    since_round_ms = patching.saturating_duration_since(round).as_millis() as u64,
                    patch_ms = patched.saturating_duration_since(patching).as_millis() as u64,
                    deliver_ms = delivering.elapsed().as_millis() as u64,
                    acknowledged = acknowledged.is_some(),
                    "claim timings"
                );
                Ok(ClaimOutcome::Claimed { acknowledged })
            },
        )
        .buffer_unordered(deliveries)
        .collect()
        .await;
    drop(claiming);
    let (claimed, failed) = tally(claims, &mut acknowledged);
    if let Some(e) = failed {
        // The sessions that started this round are marked all the same: unmarked, a pod
        // whose session runs reads as one never started, which a stalled job gives back.
        mark_assigned(ctx, &ns, acknowledged).await;
        return Err(e);
    }
    // poolTemplate: sessions start on their pre-warmed pods.
    let (started, acked) = start_prewarmed(ctx, job, observed, &decided.start, round).await;
    acknowledged.extend(acked);
    mark_assigned(ctx, &ns, acknowledged).await;
    Ok(Achieved { claimed, started })
}

/// Claim one READY pod for a session attempt: a compare-and-swap on the pod (its
/// resourceVersion) that relabels it, records the session, moves the controller ownerRef from
/// the pool to the job and adds the finalizer that keeps the pod until its result is folded.
/// `None` when another claimer (or the pool) changed the pod first.
async fn claim(
    ctx: &JobContext,
    job: &RolloutJob,
    o: &Observed,
    pod: &Pod,
    index: u32,
    attempt: u32,
) -> Result<Option<Pod>, JobError> {
    let Some(at) = o.session(index) else {
        tracing::error!(job = %o.name, index, "session index beyond the job's tasks");
        return Ok(None);
    };
    let session = at.id(&o.name, attempt);
    let owner = job.controller_owner_ref(&());
    let patch = json!({"metadata": {
        "resourceVersion": pod.resource_version(),
        "labels": {STATE_LABEL: PodState::Claimed.label(), JOB_LABEL: o.name},
        "annotations": {
            INDEX_ANNOTATION: index.to_string(),
            ATTEMPT_ANNOTATION: attempt.to_string(),
            SESSION_ANNOTATION: session,
            CLAIMED_AT_ANNOTATION: k8s_openapi::jiff::Timestamp::now().to_string(),
        },
        "ownerReferences": owner.map(|o| vec![o]),
        "finalizers": [SESSION_FINALIZER],
        // The pool's READY mark cleared the pod's field-ownership record already; this also
        // clears one a pool pod marked by an older operator still has.
        "managedFields": crate::pods::sandbox::cleared_managed_fields(),
    }});
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &job.namespace().unwrap_or_default());
    match pods
        .patch(
            &pod.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(p) => {
            tracing::info!(job = %o.name, pod = %pod.name_any(), index, attempt, "claimed");
            ctx.raise_bar(
                &job.uid().unwrap_or_default(),
                &p.name_any(),
                Bar::written(version(p.metadata.resource_version.as_deref()).unwrap_or(u64::MAX)),
            );
            Ok(Some(p))
        }
        Err(kube::Error::Api(s)) if s.is_conflict() || s.is_not_found() => Ok(None),
        Err(e) => Err(JobError::api(format!(
            "claiming pod {}/{} for session {index}",
            pod.namespace().unwrap_or_default(),
            pod.name_any()
        ))(e)),
    }
}

/// One claim of a round.
enum ClaimOutcome {
    /// Someone else took the pod first (or it went): the session waits for the next round.
    Lost,
    /// The pod is the session's; `acknowledged` names it once its gateway took the assignment.
    Claimed { acknowledged: Option<String> },
}

/// The claims that won their pod, with the pods whose gateway took its assignment added to
/// `acknowledged`, and the first claim that failed: one failure loses none of the others'
/// acknowledgments (each must be marked, failure or not).
fn tally(
    claims: Vec<Result<ClaimOutcome, JobError>>,
    acknowledged: &mut Vec<String>,
) -> (usize, Option<JobError>) {
    let mut claimed = 0;
    let mut failed = None;
    for c in claims {
        match c {
            Ok(ClaimOutcome::Claimed {
                acknowledged: acked,
            }) => {
                claimed += 1;
                acknowledged.extend(acked);
            }
            Ok(ClaimOutcome::Lost) => {}
            Err(e) => failed = failed.or(Some(e)),
        }
    }
    (claimed, failed)
}

/// poolTemplate: deliver the assignments of sessions whose pre-warmed pod is Ready (counted as
/// claims: warm when the pod was Ready before the session could start, cold when the session
/// waited for it). Returns how many pods were found to start, and those whose gateway
/// acknowledged.
async fn start_prewarmed(
    ctx: &JobContext,
    job: &RolloutJob,
    observed: &Observed,
    names: &[String],
    round: Instant,
) -> (usize, Vec<String>) {
    let uid = job.uid().unwrap_or_default();
    let pods: Vec<(Pod, u32)> = names
        .iter()
        .filter_map(|name| observed.pods.iter().find(|p| p.name_any() == *name))
        .filter_map(|p| Some((p.clone(), pod_view::session_pod(p)?.index)))
        .collect();
    let found = pods.len();
    let (uid, observed) = (&uid, observed);
    let acknowledged = futures::stream::iter(pods)
        .map(|(pod, index): (Pod, u32)| async move {
            ctx.count_claim(uid, index);
            deliver(ctx, job, observed, &pod, Some(round)).await
        })
        .buffer_unordered(ctx.in_flight)
        .filter_map(std::future::ready)
        .collect()
        .await;
    (found, acknowledged)
}

/// Record on each pod that its gateway holds the assignment, so later rounds stop delivering
/// it (a lost mark only costs a repeated delivery, which the gateway takes idempotently).
async fn mark_assigned(ctx: &JobContext, ns: &str, names: Vec<String>) {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let pods = &pods;
    futures::stream::iter(names)
        .for_each_concurrent(ctx.in_flight, |name: String| async move {
            // A `poolTemplate` pod still has its creation's field-ownership record: from here
            // on the apiserver tracks none of its writes (`cleared_managed_fields`).
            let patch = json!({"metadata": {
                "annotations": {ASSIGNED_ANNOTATION: k8s_openapi::jiff::Timestamp::now().to_string()},
                "managedFields": crate::pods::sandbox::cleared_managed_fields(),
            }});
            if let Err(e) = pods
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                tracing::warn!(%name, "cannot mark the assignment delivered: {e}");
            }
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A claim the apiserver failed does not lose the acknowledgments of the others: their
    /// sessions run, and a pod left unmarked reads as never started (a stalled job would give
    /// it back, its session killed).
    #[test]
    fn a_failed_claim_keeps_the_rounds_acknowledgments() {
        let mut acknowledged = vec!["owed".to_string()];
        let claims = vec![
            Ok(ClaimOutcome::Claimed {
                acknowledged: Some("a".into()),
            }),
            Err(JobError::Refused("a claim".into())),
            Ok(ClaimOutcome::Lost),
            Ok(ClaimOutcome::Claimed {
                acknowledged: Some("b".into()),
            }),
            Ok(ClaimOutcome::Claimed { acknowledged: None }),
            Err(JobError::NoNamespace),
        ];
        let (claimed, failed) = tally(claims, &mut acknowledged);
        assert_eq!(claimed, 3);
        assert_eq!(acknowledged, ["owed", "a", "b"]);
        assert!(matches!(failed, Some(JobError::Refused(_))), "{failed:?}");
    }
}
