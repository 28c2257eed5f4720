//! The GatewayPool controller: observe a pool's pods, let [`super::plan::plan`] decide, carry
//! out the plan (create pods with their control-token Secrets, delete), mark pods whose
//! readiness probe passed as READY, and write the pool's status ([`super::status`]).

use std::sync::Arc;
use std::time::Duration;

use floe_crds::gateway_pool::GatewayPool;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, Resource, ResourceExt};

use super::plan::{plan, DeleteReason, PoolPod, PoolView};
use super::status::{write_status, Counts, Health};
use super::{PoolContext, PoolError};
use crate::metrics::Kind;
use crate::pods::names::{POOL_LABEL, TEMPLATE_HASH_ANNOTATION};
use crate::pods::sandbox::{self, SandboxPod};
use crate::pods::view::{finished, is_ready, state};
use crate::pods::{writes, PodState};

/// One reconcile, timed and counted under controller-runtime's metric names.
pub async fn reconcile(pool: Arc<GatewayPool>, ctx: Arc<PoolContext>) -> Result<Action, PoolError> {
    let timer = ctx.metrics.reconcile_timer(Kind::GatewayPool);
    let result = reconcile_pool(pool, ctx.clone()).await;
    timer.finish(result.is_ok());
    result
}

async fn reconcile_pool(
    pool: Arc<GatewayPool>,
    ctx: Arc<PoolContext>,
) -> Result<Action, PoolError> {
    let ns = pool.namespace().ok_or(PoolError::NoNamespace)?;
    let name = pool.name_any();
    let key = format!("{ns}/{name}");
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let cached: Vec<Arc<Pod>> = ctx.pods.state_filter(|p| {
        p.metadata.namespace.as_deref() == Some(ns.as_str())
            && p.labels().get(POOL_LABEL) == Some(&name)
    });
    let hash = sandbox::template_hash(&pool.spec);
    // apiservers < 1.25 do not run the CRD's rules, and every one prunes what its CRD does not
    // know: a pool that cannot run as written makes no pod (else one with `egress.unrestricted:
    // Refuse` lost would serve with open egress) and replaces none, and says why.
    let problem = match ctx.spec_problem(&pool, &key).await {
        Err(PoolError::CacheBehind) => return Ok(Action::requeue(Duration::from_secs(1))),
        problem => problem?,
    };
    // A policy of someone else's under the pool's name: its pods would run without floe's,
    // so the pool makes none (nor replaces any) until the name is free (looked at again
    // every 15 s: nothing of the pool's changes when that policy goes).
    let problem = match problem {
        Some(problem) => Some(problem),
        None => ensure_egress_policy(&ctx, &pool, &ns, &key)
            .await
            .map(|message| ("EgressPolicyNotOurs", message)),
    };
    if let Some((reason, message)) = problem {
        tracing::warn!(pool = %key, reason, "{message}");
        let health = Health::Spec { reason, message };
        write_status(
            &ctx,
            &pool,
            &ns,
            Counts::as_labelled(&cached),
            health,
            &hash,
        )
        .await?;
        return Ok(Action::requeue(Duration::from_secs(15)));
    }
    let pending = ctx.pending(&key, &cached);
    let (creating, deleting) = (pending.creating, pending.deleting);
    let now = k8s_openapi::jiff::Timestamp::now();

    let mut unclaimed = Vec::new();
    let mut problems = Vec::new();
    let mut claimed = 0;
    for pod in &cached {
        let pod: &Pod = pod;
        if pod.metadata.deletion_timestamp.is_some() || deleting.contains(&pod.name_any()) {
            continue;
        }
        match state(pod) {
            Some("warming") | Some("ready") => {
                // Once it has said how it ended (a round or two, at most 10 s on): until then
                // it counts as an unready pod, so that nothing replaces it yet.
                let ending = finished(pod);
                if ending && crate::pods::view::ending_told(pod, now) {
                    // A warm pod that (partly) exited before being claimed is broken: replace it,
                    // saying why on the pool.
                    let deleted =
                        writes::delete_unclaimed(&pods, pod)
                            .await
                            .map_err(PoolError::api(format!(
                                "deleting ended pod {ns}/{}",
                                pod.name_any()
                            )))?;
                    if !deleted {
                        continue;
                    }
                    ctx.expect_deleted(&key, &pod.name_any());
                    let why = crate::pod_problem::ended(pod);
                    ctx.events
                        .publish(
                            &pool.object_ref(&()),
                            EventType::Warning,
                            "PodFailed",
                            format!("{}; replacing it", why.describe()),
                        )
                        .await;
                    ctx.record_ended(&key, why);
                    continue;
                }
                let ready = is_ready(pod);
                if ready && state(pod) == Some("warming") {
                    writes::mark(&pods, pod, PodState::Ready)
                        .await
                        .map_err(PoolError::api(format!(
                            "marking pod {ns}/{} READY",
                            pod.name_any()
                        )))?;
                    ctx.pod_became_ready(&key);
                }
                if !ready && !ending {
                    problems.extend(crate::pod_problem::problem(pod));
                }
                let age = pod
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .map(|t| now.duration_since(t.0).as_secs())
                    .unwrap_or(0);
                unclaimed.push(PoolPod {
                    name: pod.name_any(),
                    ready,
                    template_hash: pod
                        .annotations()
                        .get(TEMPLATE_HASH_ANNOTATION)
                        .cloned()
                        .unwrap_or_default(),
                    age_seconds: age,
                });
            }
            Some("claimed") => claimed += 1,
            _ => {}
        }
    }
    // Created, not yet in the cache: warming pods of the current template.
    for name in creating {
        unclaimed.push(PoolPod {
            name,
            ready: false,
            template_hash: hash.clone(),
            age_seconds: 0,
        });
    }
    let failures = ctx.unready_failures(&key);
    let unready_timeout =
        crate::pod_problem::backed_off_timeout(pool.spec.refill.unready_timeout_seconds, failures);
    let view = PoolView {
        desired: pool.spec.replicas,
        template_hash: hash.clone(),
        strategy: pool.spec.update_strategy.type_,
        refill: floe_crds::RefillPolicy {
            unready_timeout_seconds: unready_timeout,
            ..pool.spec.refill.clone()
        },
        created_last_minute: ctx.created_last_minute(&key),
    };
    let mut decided = plan(&view, &unclaimed);
    // Pods that end before they are claimed are replaced ever more slowly.
    if ctx
        .last_ended(&key)
        .is_some_and(|(_, _, left)| !left.is_zero())
    {
        decided.deferred += decided.create;
        decided.create = 0;
    }
    let mut replaced_unready = 0;
    for (pod, reason) in &decided.delete {
        tracing::info!(pool = %key, %pod, ?reason, "deleting pod");
        let deleted = match cached.iter().find(|p| p.name_any() == *pod) {
            Some(seen) => writes::delete_unclaimed(&pods, seen).await,
            // Created this round, not yet cached: warming, so no job can have claimed it.
            None => writes::delete(&pods, pod).await.map(|_| true),
        }
        .map_err(PoolError::api(format!("deleting pod {ns}/{pod}")))?;
        if !deleted {
            tracing::info!(pool = %key, %pod, "pod changed since the cache saw it (claimed?): left");
            continue;
        }
        ctx.expect_deleted(&key, pod);
        // Counted as it goes: one left (changed since) is decided again next round.
        if *reason == DeleteReason::Unready {
            replaced_unready += 1;
            ctx.count_unready(&key, 1);
        }
        let (type_, why, note) = match reason {
            DeleteReason::Unready => (
                EventType::Warning,
                "PodUnready",
                format!(
                    "pod {pod} was not READY within {unready_timeout} s{}; replacing it (the next \
                     replacement waits {} s)",
                    problems
                        .iter()
                        .find(|p| p.pod == *pod)
                        .map(|p| format!(" ({})", p.describe()))
                        .unwrap_or_default(),
                    crate::pod_problem::backed_off_timeout(
                        pool.spec.refill.unready_timeout_seconds,
                        failures + replaced_unready
                    ),
                ),
            ),
            DeleteReason::Stale => (
                EventType::Normal,
                "PodRecreated",
                format!("pod {pod} has an old template (updateStrategy Recreate); replacing it"),
            ),
            DeleteReason::Surplus => continue,
        };
        ctx.events
            .publish(&pool.object_ref(&()), type_, why, note)
            .await;
    }
    let yield_until = tokio::time::Instant::now() + crate::claim_gate::REFILL_YIELD_BUDGET;
    let mut created = 0;
    for _ in 0..decided.create {
        let waited = ctx.claims.quiet_by(yield_until).await;
        ctx.metrics.refill_yielded(waited);
        let pod = format!("{name}-{}", sandbox::random_suffix());
        let made = create_pod(&ctx, &pool, &ns, &name, &pod).await;
        // The apiserver refuses the pod the template makes (an admission rule, a RuntimeClass
        // that does not exist, a quota): say so on the pool and back off, as for pods that
        // end unclaimed, instead of retrying in the operator's log only.
        if let Some(refusal) = match &made {
            Err(PoolError::Api(call)) => call.refusal(),
            _ => None,
        } {
            let why = crate::pod_problem::PodProblem {
                pod: pod.clone(),
                container: None,
                reason: "PodCreateRejected".into(),
                message: refusal.to_string(),
            };
            tracing::warn!(pool = %key, "{}", why.describe());
            ctx.events
                .publish(
                    &pool.object_ref(&()),
                    EventType::Warning,
                    "PodCreateRejected",
                    why.describe(),
                )
                .await;
            ctx.record_ended(&key, why);
            break;
        }
        made?;
        created += 1;
        ctx.expect_created(&key, &pod);
        ctx.record_created(&key);
    }
    decided.deferred += decided.create - created;
    decided.create = created;

    let deleted: Vec<&String> = decided.delete.iter().map(|(p, _)| p).collect();
    let kept: Vec<&PoolPod> = unclaimed
        .iter()
        .filter(|p| !deleted.contains(&&p.name))
        .collect();
    let ready = kept.iter().filter(|p| p.ready).count() as i32;
    let replicas = kept.len() as i32 + decided.create;
    let mut kept_problems: Vec<&crate::pod_problem::PodProblem> = problems
        .iter()
        .filter(|p| !deleted.contains(&&p.pod))
        .collect();
    // The cache's order is arbitrary: with pods failing for different reasons, the condition
    // (and its Warning Event, sent when the reason changes) must not flip between them.
    kept_problems.sort_by(|a, b| (&a.reason, &a.pod).cmp(&(&b.reason, &b.pod)));
    // No live pod says what is wrong: the last one that ended (or was refused) does, until a
    // pod is READY.
    let ended_problem = ctx.last_ended(&key).map(|(mut p, backoff, _)| {
        p.message = format!("{}; replaced after {} s", p.message, backoff.as_secs());
        p
    });
    if kept_problems.is_empty() {
        kept_problems.extend(ended_problem.as_ref());
    }
    let counts = Counts {
        replicas,
        ready,
        claimed,
    };
    write_status(
        &ctx,
        &pool,
        &ns,
        counts,
        Health::Pods(&kept_problems),
        &hash,
    )
    .await?;
    let settled = ready >= pool.spec.replicas && decided.deferred == 0 && decided.create == 0;
    Ok(Action::requeue(if settled {
        Duration::from_secs(60)
    } else {
        Duration::from_secs(2)
    }))
}

/// Keep the pool's egress NetworkPolicy ([`crate::egress_policy`]) as its spec says. A
/// failed write (an operator without RBAC for NetworkPolicies, say) is a Warning on the pool,
/// not a failed reconcile: the pods' own check still says whether their egress is open. A
/// policy of someone else's under the name is returned, to stall the pool.
async fn ensure_egress_policy(
    ctx: &PoolContext,
    pool: &GatewayPool,
    ns: &str,
    key: &str,
) -> Option<String> {
    let name = crate::egress_policy::policy_name(&pool.name_any());
    let wanted = match crate::egress_policy::build(pool) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(pool = %key, "egress policy: {e}");
            return None;
        }
    };
    let wanted_json = wanted.as_ref().and_then(|p| serde_json::to_string(p).ok());
    if ctx.egress_fresh(key, &wanted_json) {
        return None;
    }
    let owner = crate::egress_policy::Owner {
        kind: "GatewayPool",
        name: &pool.name_any(),
        uid: pool.meta().uid.as_deref().unwrap_or_default(),
    };
    match crate::egress_policy::keep(&ctx.client, ns, &name, owner, wanted.as_ref()).await {
        Ok(()) => ctx.egress_done(key, wanted_json),
        Err(e @ crate::egress_policy::KeepError::NotOurs { .. }) => return Some(e.to_string()),
        Err(e) => {
            tracing::warn!(pool = %key, "egress policy {name}: {e}");
            ctx.events
                .publish(
                    &pool.object_ref(&()),
                    EventType::Warning,
                    "EgressPolicyFailed",
                    format!("cannot apply NetworkPolicy {name} (spec.egress): {e}"),
                )
                .await;
        }
    }
    None
}

async fn create_pod(
    ctx: &PoolContext,
    pool: &GatewayPool,
    ns: &str,
    name: &str,
    pod_name: &str,
) -> Result<(), PoolError> {
    let secret_name = sandbox::control_secret_name(pod_name);
    let mut pod = sandbox::build(&SandboxPod {
        name: pod_name,
        namespace: ns,
        pool: name,
        spec: &pool.spec,
        floe_image: &ctx.floe_image,
        secret: &secret_name,
        native_sidecars: ctx.native_sidecars,
    })?;
    pod.metadata.owner_references = pool.controller_owner_ref(&()).map(|o| vec![o]);
    writes::create_with_control_secret(&ctx.client, &ctx.tokens, &pod, (POOL_LABEL, name))
        .await
        .map_err(PoolError::api(format!(
            "creating pod {ns}/{pod_name} and its control Secret"
        )))?;
    tracing::info!(pool = %name, pod = %pod_name, "created sandbox pod");
    Ok(())
}

pub fn error_policy(pool: Arc<GatewayPool>, error: &PoolError, _: Arc<PoolContext>) -> Action {
    tracing::warn!(pool = %pool.name_any(), "reconcile failed: {error}");
    Action::requeue(Duration::from_secs(5))
}
