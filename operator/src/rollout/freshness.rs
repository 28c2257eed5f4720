//! When a round may read a job's pods from the operator's watch cache instead of listing them
//! from the apiserver (sans-IO).
//!
//! A claim must never be made twice, so a round must see every claim made before it. The
//! watch cache lags the apiserver by an event or two; what it may lag on that matters is this
//! process's own writes (a claim it made last round, a pod it deleted) — and, after a leader
//! change, the writes of the replica before it. So, as the ReplicaSet controller does with its
//! "expectations":
//! - a job seen for the first time in this leadership term is listed from the apiserver (a
//!   quorum read), and what that list says becomes the cache's bar;
//! - every write of this process to a job's pod raises the bar for that pod to the
//!   resourceVersion the apiserver answered with;
//! - a round trusts the cache only when, for every pod with a bar, the cache holds that pod
//!   at that resourceVersion or later (or no longer holds it, where the pod may go away).
//!   Otherwise it lists from the apiserver and starts over from what the list says.
//!
//! A write whose outcome is unknown (an error) forgets the job, so its next round lists.
//! resourceVersions are compared as integers (they are etcd revisions); one that does not
//! parse never satisfies a bar, which falls back to listing.

use std::collections::HashMap;

/// What the cache must show of one pod before it can be trusted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bar {
    /// The cache's copy must be at least this resourceVersion ...
    pub version: u64,
    /// ... or be gone, where the pod may have been deleted since.
    pub may_vanish: bool,
}

impl Bar {
    /// A pod this process just wrote and that must not disappear from the view (a claim).
    pub fn written(version: u64) -> Self {
        Self {
            version,
            may_vanish: false,
        }
    }

    /// A pod that may be gone by the next round (deleted, or listed and possibly deleted since).
    pub fn at_least_or_gone(version: u64) -> Self {
        Self {
            version,
            may_vanish: true,
        }
    }

    /// A pod the apiserver no longer lists: the cache must drop it too.
    pub fn gone() -> Self {
        Self::at_least_or_gone(u64::MAX)
    }
}

/// A resourceVersion as a number; `None` when the apiserver uses some other form.
pub fn version(resource_version: Option<&str>) -> Option<u64> {
    resource_version?.parse().ok()
}

/// The bars of one job's pods.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Bars {
    by_pod: HashMap<String, Bar>,
}

impl Bars {
    /// After a list from the apiserver: each listed pod at its version (one deleted by someone
    /// else later leaves its bar unmet, which costs one more list), and each pod the cache still
    /// shows but the apiserver no longer lists, gone.
    pub fn from_list<'a>(
        listed: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
        cached: impl IntoIterator<Item = &'a str>,
    ) -> Self {
        let mut by_pod = HashMap::new();
        for (name, rv) in listed {
            // An unparsable version can never be met: the next round lists again.
            let bar = version(rv).map_or(Bar::gone(), Bar::written);
            by_pod.insert(name.to_string(), bar);
        }
        for name in cached {
            by_pod.entry(name.to_string()).or_insert_with(Bar::gone);
        }
        Self { by_pod }
    }

    /// Raise a pod's bar after a write the apiserver answered with `bar`.
    pub fn raise(&mut self, pod: &str, bar: Bar) {
        let entry = self.by_pod.entry(pod.to_string()).or_insert(bar);
        if bar.version >= entry.version || entry.version == u64::MAX {
            *entry = bar;
        }
    }

    /// Whether the cache's view of the job's pods (name, resourceVersion) has caught up with
    /// every bar.
    pub fn met<'a>(&self, cached: impl IntoIterator<Item = (&'a str, Option<&'a str>)>) -> bool {
        let cached: HashMap<&str, Option<u64>> = cached
            .into_iter()
            .map(|(name, rv)| (name, version(rv)))
            .collect();
        self.by_pod
            .iter()
            .all(|(name, bar)| match cached.get(name.as_str()) {
                Some(Some(v)) => *v >= bar.version && bar.version != u64::MAX,
                Some(None) => false,
                None => bar.may_vanish,
            })
    }

    #[cfg(test)]
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        self.by_pod.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view<'a>(pods: &'a [(&'a str, &'a str)]) -> Vec<(&'a str, Option<&'a str>)> {
        pods.iter().map(|(n, v)| (*n, Some(*v))).collect()
    }

    #[test]
    fn no_bars_trust_the_cache() {
        assert!(Bars::default().met(view(&[("a", "5")])));
    }

    #[test]
    fn a_claim_is_met_only_once_the_cache_shows_it() {
        let mut bars = Bars::default();
        bars.raise("p", Bar::written(20));
        // Before the claim's event the job's view does not hold the pod at all.
        assert!(!bars.met(view(&[])));
        // An older copy (the pool's) is not enough either.
        assert!(!bars.met(view(&[("p", "19")])));
        assert!(bars.met(view(&[("p", "20")])));
        assert!(bars.met(view(&[("p", "31")])));
    }

    #[test]
    fn a_deleted_pod_is_met_when_gone_or_at_its_deleting_version() {
        let mut bars = Bars::default();
        bars.raise("p", Bar::at_least_or_gone(40));
        assert!(!bars.met(view(&[("p", "39")])));
        assert!(bars.met(view(&[("p", "40")])));
        assert!(bars.met(view(&[])));
    }

    #[test]
    fn a_list_bars_its_pods_and_the_cache_ones_it_no_longer_has() {
        let bars = Bars::from_list(
            vec![("a", Some("10")), ("b", Some("12"))],
            vec!["a", "stale"],
        );
        assert_eq!(bars.len(), 3);
        // The cache still shows a pod the apiserver no longer lists.
        assert!(!bars.met(view(&[("a", "10"), ("b", "12"), ("stale", "99")])));
        // The cache has not seen b yet (a claim the replica before this one made, say).
        assert!(!bars.met(view(&[("a", "10")])));
        assert!(bars.met(view(&[("a", "10"), ("b", "12")])));
        assert!(bars.met(view(&[("a", "11"), ("b", "13")])));
    }

    #[test]
    fn unparsable_versions_never_meet_a_bar() {
        let bars = Bars::from_list(vec![("a", Some("opaque"))], vec![]);
        assert!(!bars.met(vec![("a", Some("opaque"))]));
        let mut bars = Bars::default();
        bars.raise("b", Bar::written(3));
        assert!(!bars.met(vec![("b", Some("x"))]));
        assert!(!bars.met(vec![("b", None)]));
    }

    #[test]
    fn raising_keeps_the_higher_bar_and_replaces_a_gone_one() {
        let mut bars = Bars::default();
        bars.raise("p", Bar::written(50));
        bars.raise("p", Bar::at_least_or_gone(40));
        assert_eq!(bars.by_pod["p"], Bar::written(50));
        bars.raise("p", Bar::at_least_or_gone(60));
        assert_eq!(bars.by_pod["p"], Bar::at_least_or_gone(60));
        let mut bars = Bars::from_list(vec![], vec!["q"]);
        bars.raise("q", Bar::written(7));
        assert_eq!(bars.by_pod["q"], Bar::written(7));
    }
}
