//! Pods a pool created or deleted that the pod cache does not show so yet (the ReplicaSet
//! controller's "expectations"): without them a round right after a burst would see the old
//! count and act twice. Sans-IO, with the clock passed in.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;

/// How long an expectation waits for the cache before it is dropped (a lost event).
pub const EXPECTATION_TTL: Duration = Duration::from_secs(60);

#[derive(Debug, Default)]
pub struct Expectations {
    creates: HashMap<String, Instant>,
    deletes: HashMap<String, Instant>,
}

/// What the cache does not show yet.
#[derive(Debug, Default, PartialEq)]
pub struct Pending {
    /// Created, not yet in the cache: count them as warming pods of the current template.
    pub creating: Vec<String>,
    /// Deleted, still shown as live: count them as gone.
    pub deleting: HashSet<String>,
}

impl Expectations {
    pub fn created(&mut self, pod: &str, now: Instant) {
        self.creates.insert(pod.to_string(), now);
    }

    pub fn deleted(&mut self, pod: &str, now: Instant) {
        self.deletes.insert(pod.to_string(), now);
    }

    /// Settle against what the cache shows at `now`: a create is met once the pod shows, a
    /// delete once it shows terminating or gone; either is dropped after [`EXPECTATION_TTL`].
    pub fn pending(&mut self, cached: &[Arc<Pod>], now: Instant) -> Pending {
        // By name once: a burst of expectations against thousands of cached pods stays linear.
        let by_name: HashMap<&str, &Pod> = cached
            .iter()
            .filter_map(|p| Some((p.metadata.name.as_deref()?, p.as_ref())))
            .collect();
        let shown = |name: &str| by_name.get(name).copied();
        let fresh = |at: &Instant| now.saturating_duration_since(*at) < EXPECTATION_TTL;
        self.creates
            .retain(|name, at| fresh(at) && shown(name).is_none());
        self.deletes.retain(|name, at| {
            fresh(at) && shown(name).is_some_and(|p| p.metadata.deletion_timestamp.is_none())
        });
        let mut creating: Vec<String> = self.creates.keys().cloned().collect();
        creating.sort();
        Pending {
            creating,
            deleting: self.deletes.keys().cloned().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, terminating: bool) -> Arc<Pod> {
        let mut meta = serde_json::json!({"name": name});
        if terminating {
            meta["deletionTimestamp"] = "2026-01-01T00:00:00Z".into();
        }
        Arc::new(serde_json::from_value(serde_json::json!({"metadata": meta})).expect("pod"))
    }

    #[test]
    fn a_create_is_pending_until_the_cache_shows_the_pod() {
        let t0 = Instant::now();
        let mut e = Expectations::default();
        e.created("a", t0);
        e.created("b", t0);
        let p = e.pending(&[pod("b", false)], t0 + Duration::from_secs(1));
        assert_eq!(p.creating, ["a"]);
        let p = e.pending(&[pod("a", false)], t0 + Duration::from_secs(2));
        assert!(p.creating.is_empty(), "met once shown, and stays met");
    }

    #[test]
    fn a_delete_is_pending_while_the_cache_shows_the_pod_live() {
        let t0 = Instant::now();
        let mut e = Expectations::default();
        e.deleted("a", t0);
        let p = e.pending(&[pod("a", false)], t0);
        assert!(p.deleting.contains("a"));
        let p = e.pending(&[pod("a", true)], t0);
        assert!(p.deleting.is_empty(), "terminating is what was expected");
        e.deleted("b", t0);
        assert!(e.pending(&[], t0).deleting.is_empty(), "gone is too");
    }

    #[test]
    fn an_expectation_the_cache_never_meets_is_dropped_after_its_ttl() {
        let t0 = Instant::now();
        let mut e = Expectations::default();
        e.created("lost", t0);
        e.deleted("kept", t0);
        let live = [pod("kept", false)];
        let before = e.pending(&live, t0 + EXPECTATION_TTL - Duration::from_secs(1));
        assert_eq!(before.creating, ["lost"]);
        assert!(before.deleting.contains("kept"));
        let after = e.pending(&live, t0 + EXPECTATION_TTL);
        assert_eq!(
            after,
            Pending::default(),
            "a lost event costs one TTL, not forever"
        );
    }
}
