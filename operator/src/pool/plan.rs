//! What the GatewayPool controller does about a pool, decided from what it observes.
//!
//! Only the pool's *unclaimed* pods are its business (warming or READY; a claimed pod belongs
//! to its RolloutJob). The plan keeps `replicas` unclaimed pods, replaces pods stuck warming
//! past the unready timeout, applies the update strategy to pods of an older template, and
//! creates pods no faster than the refill batch size and rate limit allow.

use floe_crds::{PoolUpdateStrategyType, RefillPolicy};

/// An unclaimed pod of the pool, as observed.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolPod {
    pub name: String,
    /// READY: gateway healthy and the pool's prepare steps done.
    pub ready: bool,
    pub template_hash: String,
    /// Seconds since creation.
    pub age_seconds: i64,
}

/// What the controller knows about the pool besides its pods.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolView {
    pub desired: i32,
    pub template_hash: String,
    pub strategy: PoolUpdateStrategyType,
    pub refill: RefillPolicy,
    /// Pods this pool created in the last 60 seconds (the rate limit's window).
    pub created_last_minute: i32,
}

/// Why a pod is deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeleteReason {
    /// Not READY within `refill.unreadyTimeoutSeconds`.
    Unready,
    /// Made from an older template, and the strategy is `Recreate`.
    Stale,
    /// More unclaimed pods than `replicas` (scaled down).
    Surplus,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct PoolPlan {
    pub create: i32,
    pub delete: Vec<(String, DeleteReason)>,
    /// Pods wanted but held back by the batch size or the rate limit.
    pub deferred: i32,
}

pub fn plan(view: &PoolView, pods: &[PoolPod]) -> PoolPlan {
    let mut delete = Vec::new();
    let mut keep: Vec<&PoolPod> = Vec::new();
    for pod in pods {
        if !pod.ready && pod.age_seconds > i64::from(view.refill.unready_timeout_seconds) {
            delete.push((pod.name.clone(), DeleteReason::Unready));
        } else if pod.template_hash != view.template_hash
            && view.strategy == PoolUpdateStrategyType::Recreate
        {
            delete.push((pod.name.clone(), DeleteReason::Stale));
        } else {
            keep.push(pod);
        }
    }
    let desired = view.desired.max(0) as usize;
    if keep.len() > desired {
        // Scale down the least useful first: stale, then warming, then READY; youngest first
        // (an older pod has done more of its warming work).
        keep.sort_by_key(|p| {
            (
                p.template_hash == view.template_hash,
                p.ready,
                p.age_seconds,
            )
        });
        let surplus = keep.len() - desired;
        delete.extend(
            keep.drain(..surplus)
                .map(|p| (p.name.clone(), DeleteReason::Surplus)),
        );
    }
    let wanted = (desired - keep.len()) as i32;
    let rate_room = (view.refill.max_pods_per_minute - view.created_last_minute).max(0);
    let create = wanted.min(view.refill.batch_size).min(rate_room);
    PoolPlan {
        create,
        delete,
        deferred: wanted - create,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(desired: i32) -> PoolView {
        PoolView {
            desired,
            template_hash: "new".into(),
            strategy: PoolUpdateStrategyType::OnReplenish,
            refill: RefillPolicy {
                batch_size: 10,
                max_pods_per_minute: 120,
                unready_timeout_seconds: 600,
            },
            created_last_minute: 0,
        }
    }

    fn pod(name: &str, ready: bool, hash: &str, age: i64) -> PoolPod {
        PoolPod {
            name: name.into(),
            ready,
            template_hash: hash.into(),
            age_seconds: age,
        }
    }

    #[test]
    fn an_empty_pool_fills_in_batches() {
        let p = plan(&view(25), &[]);
        assert_eq!((p.create, p.deferred), (10, 15));
        assert!(p.delete.is_empty());
    }

    #[test]
    fn the_rate_limit_holds_creation_back() {
        let mut v = view(25);
        v.created_last_minute = 115;
        let p = plan(&v, &[]);
        assert_eq!((p.create, p.deferred), (5, 20));
        v.created_last_minute = 200;
        assert_eq!(plan(&v, &[]).create, 0);
    }

    #[test]
    fn a_full_pool_does_nothing_and_refills_after_claims() {
        let pods: Vec<_> = (0..4)
            .map(|i| pod(&format!("p{i}"), true, "new", 30))
            .collect();
        assert_eq!(plan(&view(4), &pods), PoolPlan::default());
        // Two pods were claimed (they left the unclaimed set): two new ones.
        assert_eq!(plan(&view(4), &pods[..2]).create, 2);
    }

    #[test]
    fn pods_stuck_warming_are_replaced() {
        let pods = [
            pod("stuck", false, "new", 601),
            pod("warming", false, "new", 30),
            pod("ok", true, "new", 900),
        ];
        let p = plan(&view(3), &pods);
        assert_eq!(p.delete, [("stuck".to_string(), DeleteReason::Unready)]);
        assert_eq!(p.create, 1);
    }

    #[test]
    fn recreate_replaces_stale_pods_now_on_replenish_keeps_them() {
        let pods = [
            pod("old-1", true, "old", 100),
            pod("old-2", true, "old", 100),
            pod("cur", true, "new", 10),
        ];
        let kept = plan(&view(3), &pods);
        assert_eq!(
            kept,
            PoolPlan::default(),
            "OnReplenish: stale pods serve until claimed"
        );
        let mut v = view(3);
        v.strategy = PoolUpdateStrategyType::Recreate;
        let p = plan(&v, &pods);
        assert_eq!(p.delete.len(), 2);
        assert!(p.delete.iter().all(|(_, r)| *r == DeleteReason::Stale));
        assert_eq!(p.create, 2);
    }

    #[test]
    fn scaling_down_removes_stale_then_warming_then_youngest_ready() {
        let pods = [
            pod("ready-old", true, "new", 500),
            pod("ready-young", true, "new", 50),
            pod("warming", false, "new", 20),
            pod("stale", true, "old", 900),
        ];
        let p = plan(&view(1), &pods);
        let names: Vec<&str> = p.delete.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["stale", "warming", "ready-young"]);
        assert!(p.delete.iter().all(|(_, r)| *r == DeleteReason::Surplus));
        assert_eq!(p.create, 0);
    }

    #[test]
    fn scale_to_zero_deletes_every_unclaimed_pod() {
        let pods = [pod("a", true, "new", 1), pod("b", false, "new", 1)];
        let p = plan(&view(0), &pods);
        assert_eq!(p.delete.len(), 2);
        assert_eq!(p.create, 0);
    }
}
