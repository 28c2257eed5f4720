//! What the pool controller shares across rounds, and what it remembers about each pool
//! between rounds ([`PoolMemory`], forgotten in one place when the pool goes).

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;

use super::expectations::{Expectations, Pending};
use super::PoolError;
use crate::pod_problem::PodProblem;
use crate::shared::Shared;
use crate::spec_check::{
    dropped_by_an_older_crd, served_crd_lacks, spec_version, ForSpec, CRD_OUTDATED,
};
use floe_crds::gateway_pool::GatewayPool;
use floe_gateway::sync::lock;

/// How often an unchanged egress policy is applied again (restoring one deleted by hand).
const EGRESS_REAPPLY: Duration = Duration::from_secs(60);

pub struct PoolContext {
    shared: Arc<Shared>,
    /// Per pool (`namespace/name`), what this process remembers between rounds.
    memory: Mutex<HashMap<String, PoolMemory>>,
}

/// The shared part reads as the context's own (`ctx.client`, `ctx.metrics`, …).
impl std::ops::Deref for PoolContext {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.shared
    }
}

/// What the controller keeps about one pool between its rounds. Losing it (an operator
/// restart) costs a moment's caution at most: each piece is counted afresh.
#[derive(Default)]
struct PoolMemory {
    /// Creation times, for the per-minute rate limit.
    created: VecDeque<Instant>,
    /// Pods created or deleted but not yet seen so in the cache.
    expected: Expectations,
    /// Pods replaced in a row for not becoming READY (reset by a READY pod): the unready
    /// timeout backs off with it ([`crate::pod_problem::backed_off_timeout`]).
    unready_failures: u32,
    /// The last pod that ended before it was claimed, when, and how many in a row (reset by a
    /// READY pod): replacements back off ([`crate::pod_problem::ended_backoff`]).
    ended: Option<(PodProblem, Instant, u32)>,
    /// The egress NetworkPolicy last applied (its JSON, `None`: deleted) and when.
    egress_applied: Option<(Option<String>, Instant)>,
    /// Client-side validation of one spec version: the CEL rules an apiserver before 1.25
    /// does not run, and the fields it pruned.
    validated: ForSpec<Result<(), String>>,
    /// [`PoolContext::spec_problem`]'s older-CRD verdict on one spec version.
    crd_dropped: ForSpec<Option<String>>,
}

impl PoolContext {
    pub fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            memory: Mutex::default(),
        }
    }

    fn remember<T>(&self, key: &str, f: impl FnOnce(&mut PoolMemory) -> T) -> T {
        f(lock(&self.memory).entry(key.to_string()).or_default())
    }

    /// Forget every pool but `live` (`namespace/name` keys): deleted pools leave nothing behind.
    pub fn forget_pools_except(&self, live: &BTreeSet<String>) {
        lock(&self.memory).retain(|key, _| live.contains(key));
    }

    /// Why the pool cannot run as written, as its `Stalled` reason and message: a spec the
    /// CRD's rules refuse or with a field the apiserver pruned (`InvalidSpec`), or one the
    /// cluster's older CRD cut short (`CrdOutdated`). Each verdict is made once per spec
    /// version, but for the served CRD's, which a CRD upgrade lifts.
    pub(super) async fn spec_problem(
        &self,
        pool: &GatewayPool,
        key: &str,
    ) -> Result<Option<(&'static str, String)>, PoolError> {
        let version = spec_version(pool);
        let validated = match self.remember(key, |m| m.validated.get(&version)) {
            Some(verdict) => verdict,
            None => {
                let verdict =
                    floe_crds::validation::validate_gateway_pool(pool).map_err(|e| e.to_string());
                self.remember(key, |m| m.validated.set(version.clone(), verdict.clone()));
                verdict
            }
        };
        if let Err(why) = validated {
            return Ok(Some(("InvalidSpec", why)));
        }
        let dropped = match self.remember(key, |m| m.crd_dropped.get(&version)) {
            Some(verdict) => verdict,
            None => {
                let (read, verdict) = dropped_by_an_older_crd(&self.client, pool, "pool")
                    .await
                    .map_err(PoolError::api(format!("reading GatewayPool {key}")))?;
                let behind = read != version;
                self.remember(key, |m| m.crd_dropped.set(read, verdict.clone()));
                if behind {
                    return Err(PoolError::CacheBehind);
                }
                verdict
            }
        };
        let unrecorded = || served_crd_lacks(&self.served_crds, pool, "pool");
        Ok(dropped.or_else(unrecorded).map(|why| (CRD_OUTDATED, why)))
    }

    pub(super) fn record_ended(&self, key: &str, problem: PodProblem) {
        self.remember(key, |m| {
            let in_a_row = m.ended.as_ref().map_or(0, |(_, _, n)| *n) + 1;
            m.ended = Some((problem, Instant::now(), in_a_row));
        });
    }

    /// The last pod that ended unclaimed, its back-off and how much of it is left.
    pub(super) fn last_ended(&self, key: &str) -> Option<(PodProblem, Duration, Duration)> {
        self.remember(key, |m| {
            let (problem, at, in_a_row) = m.ended.as_ref()?;
            let backoff = crate::pod_problem::ended_backoff(*in_a_row);
            Some((
                problem.clone(),
                backoff,
                backoff.saturating_sub(at.elapsed()),
            ))
        })
    }

    /// Whether `wanted` was applied for the pool within [`EGRESS_REAPPLY`].
    pub(super) fn egress_fresh(&self, key: &str, wanted: &Option<String>) -> bool {
        self.remember(key, |m| {
            m.egress_applied
                .as_ref()
                .is_some_and(|(json, at)| json == wanted && at.elapsed() < EGRESS_REAPPLY)
        })
    }

    pub(super) fn egress_done(&self, key: &str, applied: Option<String>) {
        self.remember(key, |m| m.egress_applied = Some((applied, Instant::now())));
    }

    pub(super) fn expect_created(&self, key: &str, pod: &str) {
        self.remember(key, |m| m.expected.created(pod, Instant::now()));
    }

    pub(super) fn expect_deleted(&self, key: &str, pod: &str) {
        self.remember(key, |m| m.expected.deleted(pod, Instant::now()));
    }

    pub(super) fn pending(&self, key: &str, cached: &[Arc<Pod>]) -> Pending {
        self.remember(key, |m| m.expected.pending(cached, Instant::now()))
    }

    pub(super) fn unready_failures(&self, key: &str) -> u32 {
        self.remember(key, |m| m.unready_failures)
    }

    /// n more pods replaced for not becoming READY.
    pub(super) fn count_unready(&self, key: &str, n: u32) {
        self.remember(key, |m| m.unready_failures += n);
    }

    /// A pod became READY: the back-offs start over.
    pub(super) fn pod_became_ready(&self, key: &str) {
        self.remember(key, |m| {
            m.unready_failures = 0;
            m.ended = None;
        });
    }

    pub(super) fn created_last_minute(&self, key: &str) -> i32 {
        self.remember(key, |m| {
            while m
                .created
                .front()
                .is_some_and(|t| t.elapsed() > Duration::from_secs(60))
            {
                m.created.pop_front();
            }
            m.created.len() as i32
        })
    }

    pub(super) fn record_created(&self, key: &str) {
        self.remember(key, |m| m.created.push_back(Instant::now()));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A stand-in apiserver that serves one stored pool, `ns/p`, and counts its reads.
    async fn apiserver(stored: serde_json::Value) -> (kube::Client, Arc<AtomicUsize>) {
        let reads = Arc::new(AtomicUsize::new(0));
        let counted = reads.clone();
        let app = axum::Router::new().route(
            "/apis/floe.dev/v1alpha1/namespaces/ns/gatewaypools/p",
            axum::routing::get(move || {
                counted.fetch_add(1, Ordering::SeqCst);
                let stored = stored.clone();
                async move { axum::Json(stored) }
            }),
        );
        (crate::stand_in_apiserver::client_of(app).await, reads)
    }

    fn pool(generation: i64) -> serde_json::Value {
        let spec = serde_json::json!({"replicas": 1, "template": {"image": "agent:1"}});
        serde_json::json!({
            "apiVersion": "floe.dev/v1alpha1", "kind": "GatewayPool",
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "generation": generation,
                "annotations": {floe_crds::validation::LAST_APPLIED:
                    serde_json::json!({"spec": spec}).to_string()}},
            "spec": spec
        })
    }

    /// When the pool as stored is newer than the watch cache's (an operator that starts as the
    /// pool is applied again), the verdict is of the newer one: the round on the cached one
    /// does nothing and comes again, and the next, on the newer one, reads the verdict
    /// remembered without asking the apiserver again.
    #[tokio::test]
    async fn a_round_on_a_spec_older_than_the_stored_one_waits_for_the_cache() {
        let (client, reads) = apiserver(pool(2)).await;
        let pods = kube::runtime::reflector::store::Writer::<Pod>::default().as_reader();
        let metrics = Arc::new(crate::metrics::Metrics::new().expect("metrics"));
        let shared = Shared::new(client, pods, metrics, "floe:1".into(), true, Arc::default());
        let ctx = PoolContext::new(Arc::new(shared));
        let cached: GatewayPool = serde_json::from_value(pool(1)).expect("a pool");
        let behind = ctx.spec_problem(&cached, "ns/p").await;
        assert!(matches!(behind, Err(PoolError::CacheBehind)), "{behind:?}");
        assert_eq!(reads.load(Ordering::SeqCst), 1);
        let caught_up: GatewayPool = serde_json::from_value(pool(2)).expect("a pool");
        let verdict = ctx
            .spec_problem(&caught_up, "ns/p")
            .await
            .expect("a verdict");
        assert_eq!(verdict, None);
        assert_eq!(reads.load(Ordering::SeqCst), 1);
    }
}
