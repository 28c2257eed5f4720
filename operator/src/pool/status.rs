//! The pool's status: counts, the scale subresource's selector, and the conditions kstatus
//! and `kubectl wait` read, with an Event when READY flips or pods fail for a new reason.

use floe_crds::gateway_pool::{GatewayPool, GatewayPoolStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use super::{PoolContext, PoolError};
use crate::pod_problem::PodProblem;
use crate::pods::names::{POOL_LABEL, STATE_LABEL};
use crate::pods::PodState;

pub(super) struct Counts {
    pub replicas: i32,
    pub ready: i32,
    pub claimed: i32,
}

impl Counts {
    /// The pool's pods as their state labels say, for a round that acts on none of them.
    pub fn as_labelled(pods: &[std::sync::Arc<k8s_openapi::api::core::v1::Pod>]) -> Self {
        let mut counts = Self {
            replicas: 0,
            ready: 0,
            claimed: 0,
        };
        for pod in pods
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
        {
            match crate::pods::view::state(pod) {
                Some("warming") => counts.replicas += 1,
                Some("ready") => {
                    counts.replicas += 1;
                    counts.ready += 1;
                }
                Some("claimed") => counts.claimed += 1,
                _ => {}
            }
        }
        counts
    }
}

/// What the pool's conditions say is wrong, if anything.
pub(super) enum Health<'a> {
    /// As its pods go: the problem of each pod not READY (none: all READY, or warming).
    Pods(&'a [&'a PodProblem]),
    /// The spec cannot be run as written (`InvalidSpec`, `CrdOutdated`): the pool makes and
    /// replaces no pod until it changes.
    Spec {
        reason: &'static str,
        message: String,
    },
}

pub(super) async fn write_status(
    ctx: &PoolContext,
    pool: &GatewayPool,
    ns: &str,
    counts: Counts,
    health: Health<'_>,
    hash: &str,
) -> Result<(), PoolError> {
    let Counts {
        replicas,
        ready,
        claimed,
    } = counts;
    let desired = pool.spec.replicas;
    ctx.metrics
        .set_pool(ns, &pool.name_any(), ready, desired, claimed);
    let problems = match &health {
        Health::Pods(problems) => *problems,
        Health::Spec { .. } => &[],
    };
    let (status, reason, message) = match (&health, problems.first()) {
        // The spec cannot be run: no pod is made or replaced, however many are READY.
        (Health::Spec { reason, message }, _) => (
            "False",
            reason.to_string(),
            format!("{ready}/{desired} pods READY; {message}"),
        ),
        _ if ready >= desired => (
            "True",
            "PoolReady".to_string(),
            format!("{ready}/{desired} pods READY"),
        ),
        // Where users look: the kubelet's or the scheduler's reason on the pool itself.
        (_, Some(p)) => (
            "False",
            p.reason.clone(),
            format!(
                "{ready}/{desired} pods READY; {}{}",
                p.describe(),
                match problems.len() {
                    1 => String::new(),
                    n => format!(" (and {} more pods)", n - 1),
                }
            ),
        ),
        (_, None) => (
            "False",
            "Warming".to_string(),
            format!("{ready}/{desired} pods READY"),
        ),
    };
    let previous = pool
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"));
    let generation = pool.metadata.generation;
    let earlier = pool.status.as_ref().map(|s| s.conditions.as_slice());
    // kstatus: Reconciling while pods warm, Stalled while they cannot become READY as the
    // template stands (Argo CD and Flux show the pool Degraded then).
    let spec_stalled = matches!(health, Health::Spec { .. });
    let stalled = status == "False" && (!problems.is_empty() || spec_stalled);
    ctx.metrics.set_blocked(
        crate::metrics::Kind::GatewayPool,
        ns,
        &pool.name_any(),
        stalled.then_some(reason.as_str()),
    );
    // A spec that cannot run is not progressing toward anything: kstatus (Flux, Argo CD) reads
    // a `Reconciling=True` first and would wait out its timeout on it instead of failing.
    let conditions = pool_conditions(
        earlier,
        status == "True",
        status != "True" && !spec_stalled,
        stalled,
        &reason,
        &message,
        generation,
    );
    let new = GatewayPoolStatus {
        replicas,
        ready_replicas: ready,
        claimed_replicas: claimed,
        selector: Some(unclaimed_selector(&pool.name_any())),
        template_hash: Some(hash.to_string()),
        observed_generation: generation,
        conditions,
    };
    if pool.status.as_ref() == Some(&new) {
        return Ok(());
    }
    // A Warning when pods start failing, or the spec is refused, for a new reason (once per
    // reason, not per reconcile).
    if stalled && previous.is_none_or(|c| c.reason != reason) {
        let note = new.conditions[0].message.clone();
        ctx.events
            .publish(&pool.object_ref(&()), EventType::Warning, &reason, note)
            .await;
    }
    // An Event when READY flips, not on every count change (a spec that cannot run has its
    // Warning above: it is not warming).
    let flipped =
        previous.is_some_and(|c| c.status != status) || (previous.is_none() && status == "True");
    if flipped && !spec_stalled {
        let why = if status == "True" {
            "PoolReady"
        } else {
            "PoolWarming"
        };
        let note = new.conditions[0].message.clone();
        ctx.events
            .publish(&pool.object_ref(&()), EventType::Normal, why, note)
            .await;
    }
    let api: Api<GatewayPool> = Api::namespaced(ctx.client.clone(), ns);
    api.patch_status(
        &pool.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": new})),
    )
    .await
    .map_err(PoolError::api(format!(
        "writing the status of GatewayPool {ns}/{}",
        pool.name_any()
    )))?;
    Ok(())
}

/// The scale subresource's selector: the pool's unclaimed pods (what `replicas` counts), so an
/// HPA or KEDA never counts pods busy with a session.
pub fn unclaimed_selector(pool: &str) -> String {
    format!(
        "{POOL_LABEL}={pool},{STATE_LABEL} in ({},{})",
        PodState::Warming.label(),
        PodState::Ready.label()
    )
}

/// The pool's conditions (`docs/crds.md` lists their types; a test checks): `Ready`, and
/// kstatus's `Reconciling` (not all pods READY yet) and `Stalled` (they cannot become READY as
/// the template stands).
fn pool_conditions(
    earlier: Option<&[Condition]>,
    ready: bool,
    reconciling: bool,
    stalled: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
) -> Vec<Condition> {
    let flag = |b: bool| if b { "True" } else { "False" };
    vec![
        condition(earlier, "Ready", flag(ready), reason, message, generation),
        condition(
            earlier,
            "Reconciling",
            flag(reconciling),
            reason,
            message,
            generation,
        ),
        condition(
            earlier,
            "Stalled",
            flag(stalled),
            reason,
            message,
            generation,
        ),
    ]
}

/// A condition of the new status, keeping its transition time from `earlier` unless its
/// status flips.
fn condition(
    earlier: Option<&[Condition]>,
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
    generation: Option<i64>,
) -> Condition {
    let since = earlier
        .and_then(|cs| cs.iter().find(|c| c.type_ == type_))
        .filter(|c| c.status == status)
        .map_or_else(
            || Time(k8s_openapi::jiff::Timestamp::now()),
            |c| c.last_transition_time.clone(),
        );
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time: since,
        observed_generation: generation,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `docs/crds.md` names exactly the condition types a pool gets, ready, warming or stalled.
    #[test]
    fn the_docs_list_the_pools_condition_types() {
        let mut seen = std::collections::BTreeSet::new();
        for (ready, stalled) in [(true, false), (false, false), (false, true)] {
            for c in pool_conditions(None, ready, !ready, stalled, "R", "m", Some(1)) {
                seen.insert(c.type_);
            }
        }
        assert_eq!(seen, crate::documented_condition_types("GatewayPool"));
    }
}
