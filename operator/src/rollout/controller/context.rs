//! What the job controller shares across rounds: clients, caches, and what it remembers
//! about each job between rounds ([`JobMemory`], forgotten in one place).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use floe_crds::gateway_pool::GatewayPool;
use floe_crds::rollout_job::RolloutJob;
use kube::runtime::events::EventType;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Resource, ResourceExt};

use super::JobError;
use crate::rollout::freshness::{Bar, Bars};
use crate::shared::Shared;
use crate::spec_check::{spec_version, ForSpec};
use floe_gateway::sync::lock;

pub struct JobContext {
    shared: Arc<Shared>,
    pub(super) http: reqwest::Client,
    /// Per job uid, what this process remembers between rounds.
    memory: Mutex<HashMap<String, JobMemory>>,
    /// Claims, deliveries, marks and releases of one round in flight at once.
    pub(super) in_flight: usize,
    /// The pool controller's cache of GatewayPools: a round reads its pool from it, and asks
    /// the apiserver only for one it does not show (so `PoolNotFound` is the apiserver's word).
    pools: Option<Store<GatewayPool>>,
    /// Claim pool pods while the job's own pod is starting (`--claim-while-starting`), for at
    /// most this long (`--claim-while-starting-limit`); `None` when off.
    pub(super) early_claims: Option<Duration>,
}

/// What the controller keeps about one job between its rounds. Losing it (an operator
/// restart) costs work, never correctness: each piece is read again or counted afresh.
#[derive(Default)]
pub(super) struct JobMemory {
    /// Sessions that found no READY pod free: their claim counts as cold.
    starved: HashSet<u32>,
    /// Client-side validation of one generation (and last-applied annotation): evaluating
    /// the CEL rules costs tens of milliseconds, too much for every round of a running job.
    validated: ForSpec<Result<(), String>>,
    /// [`JobContext::dropped_by_an_older_crd`]'s verdict on one spec version.
    crd_dropped: ForSpec<Option<String>>,
    /// `tasks.file`: the loader arguments the tasks were read with, and the tasks.
    pub(super) file_tasks: Option<(String, super::task_sources::FileTasks)>,
    /// What the pod cache must show before a round may read the job's pods from it. `None`:
    /// the next round lists them from the apiserver.
    pub(super) bars: Option<Bars>,
    /// Pods claimed while the job's own pod was starting, whose assignment has not gone out.
    /// Their claim latency counts from the round that may deliver it (the session could not
    /// start before), and is recorded when that delivery is acknowledged.
    claimed_early: HashSet<String>,
    /// The job's egress NetworkPolicy last applied (its JSON, `None`: deleted) and when.
    egress_applied: Option<(Option<String>, Instant)>,
    /// `poolTemplate`: the (pod, reason) of each problem a session's pod reported while
    /// starting that an Event already told.
    start_problems_told: HashSet<(String, String)>,
    /// The resourceVersion of this process's last status write of the job.
    status_written: Option<u64>,
    /// `poolTemplate`: the starting pods another operator process made whose control Secret
    /// this one has looked for.
    secrets_looked_for: HashSet<String>,
    /// Claimed pods whose gateway has not taken their assignment: since when each delivery
    /// failed, and the last failure's words ([`JobContext::undelivered_for`]).
    undelivered: HashMap<String, (Instant, String)>,
}

/// The shared part reads as the context's own (`ctx.client`, `ctx.metrics`, …).
impl std::ops::Deref for JobContext {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.shared
    }
}

/// How often an unchanged egress policy of a job on a pool is applied again.
const EGRESS_REAPPLY: Duration = Duration::from_secs(60);

/// How long pool pods claimed while the job's own pod starts may wait for it by default.
pub const DEFAULT_EARLY_CLAIM_LIMIT: Duration = Duration::from_secs(600);

impl JobContext {
    pub fn new(shared: Arc<Shared>, in_flight: usize) -> Self {
        Self {
            shared,
            in_flight: in_flight.max(1),
            pools: None,
            early_claims: Some(DEFAULT_EARLY_CLAIM_LIMIT),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                // The gateways close a connection idle 30 s: let go first.
                .pool_idle_timeout(floe_gateway::serve_limited::CLIENT_IDLE)
                .build()
                .unwrap_or_default(),
            memory: Mutex::default(),
        }
    }

    /// `None` claims only once the job's own pod is Ready.
    pub fn with_claim_while_starting(mut self, limit: Option<Duration>) -> Self {
        self.early_claims = limit;
        self
    }

    pub fn with_pool_cache(mut self, pools: Store<GatewayPool>) -> Self {
        self.pools = Some(pools);
        self
    }

    /// A job's pool: from the pool cache, else from the apiserver (`None`: it does not exist).
    /// Every round reads it, and an apiserver GET before a round's claims is a round trip
    /// each of them waits for.
    pub(super) async fn pool(&self, ns: &str, name: &str) -> Result<Option<GatewayPool>, JobError> {
        let cached = self
            .pools
            .as_ref()
            .and_then(|store| store.get(&ObjectRef::new(name).within(ns)));
        match cached {
            Some(pool) => Ok(Some((*pool).clone())),
            None => {
                let pools: Api<GatewayPool> = Api::namespaced(self.client.clone(), ns);
                pools
                    .get_opt(name)
                    .await
                    .map_err(JobError::api(format!("reading GatewayPool {ns}/{name}")))
            }
        }
    }

    /// Read or change what is remembered about job `uid`.
    pub(super) fn remember<T>(&self, uid: &str, f: impl FnOnce(&mut JobMemory) -> T) -> T {
        f(lock(&self.memory).entry(uid.to_string()).or_default())
    }

    /// Remember the resourceVersion a status write of the job's got.
    pub(super) fn wrote_status(&self, uid: &str, resource_version: Option<&str>) {
        let written = crate::rollout::freshness::version(resource_version);
        self.remember(uid, |m| m.status_written = m.status_written.max(written));
    }

    /// Is the watch cache's copy of the job older than this process's last status write? A
    /// round planned from it would see sessions that write folded as still pending, and claim
    /// pods for them again.
    pub(super) fn job_behind_own_write(&self, job: &RolloutJob) -> bool {
        let written = self.remember(&job.uid().unwrap_or_default(), |m| m.status_written);
        cache_behind(written, job.metadata.resource_version.as_deref())
    }

    /// A job is done or gone: forget everything this process kept about it.
    pub(super) fn forget(&self, uid: &str) {
        lock(&self.memory).remove(uid);
    }

    /// Raise the cache's bar for a job's pod after a write the apiserver answered.
    pub(super) fn raise_bar(&self, uid: &str, pod: &str, bar: Bar) {
        if let Some(bars) = lock(&self.memory)
            .get_mut(uid)
            .and_then(|m| m.bars.as_mut())
        {
            bars.raise(pod, bar);
        }
    }

    /// The job's next round lists its pods from the apiserver (after a write whose outcome is
    /// unknown).
    pub(super) fn forget_bars(&self, uid: &str) {
        if let Some(m) = lock(&self.memory).get_mut(uid) {
            m.bars = None;
        }
    }

    /// Whether `wanted` was applied for job `uid` within the last minute: a job claiming
    /// from a pool keeps its policy on its rounds' way to their claims, so it is applied again
    /// only when it changes or a minute has passed (restoring one deleted by hand).
    pub(super) fn egress_fresh(&self, uid: &str, wanted: &Option<String>) -> bool {
        self.remember(uid, |m| {
            m.egress_applied
                .as_ref()
                .is_some_and(|(json, at)| json == wanted && at.elapsed() < EGRESS_REAPPLY)
        })
    }

    pub(super) fn egress_done(&self, uid: &str, applied: Option<String>) {
        self.remember(uid, |m| m.egress_applied = Some((applied, Instant::now())));
    }

    /// Whether the problem `reason` of `pod` is news (and remember it told): only the pods
    /// still there are kept.
    pub(super) fn start_problem_news(
        &self,
        uid: &str,
        pods: &HashSet<&str>,
        pod: &str,
        reason: &str,
    ) -> bool {
        self.remember(uid, |m| {
            m.start_problems_told
                .retain(|(p, _)| pods.contains(p.as_str()));
            m.start_problems_told
                .insert((pod.to_string(), reason.to_string()))
        })
    }

    /// Whether this process has looked for `pod`'s control Secret: only the pods still
    /// there (`pods`) are kept.
    pub(super) fn looked_for_secret(&self, uid: &str, pods: &HashSet<&str>, pod: &str) -> bool {
        self.remember(uid, |m| {
            m.secrets_looked_for.retain(|p| pods.contains(p.as_str()));
            m.secrets_looked_for.contains(pod)
        })
    }

    pub(super) fn note_looked_for_secret(&self, uid: &str, pod: &str) {
        self.remember(uid, |m| m.secrets_looked_for.insert(pod.to_string()));
    }

    pub(super) fn note_claimed_early(&self, uid: &str, pod: &str) {
        self.remember(uid, |m| m.claimed_early.insert(pod.to_string()));
    }

    /// Whether `pod` was claimed while the job's pod was starting (and forget it: its
    /// delivery goes out now).
    pub(super) fn take_claimed_early(&self, uid: &str, pod: &str) -> bool {
        lock(&self.memory)
            .get_mut(uid)
            .is_some_and(|m| m.claimed_early.remove(pod))
    }

    /// A delivery to `pod` failed (`why`, cut to 300 characters); the first failure of a run
    /// of them is kept.
    pub(super) fn note_undelivered(&self, uid: &str, pod: &str, why: String) {
        let why: String = why.chars().take(300).collect();
        self.remember(uid, |m| {
            let since = m
                .undelivered
                .get(pod)
                .map_or_else(Instant::now, |(t, _)| *t);
            m.undelivered.insert(pod.to_string(), (since, why));
        });
    }

    /// Only the pods whose delivery is tried this round keep their run of failures.
    pub(super) fn keep_undelivered(&self, uid: &str, tried: &[&str]) {
        if let Some(m) = lock(&self.memory).get_mut(uid) {
            m.undelivered.retain(|pod, _| tried.contains(&pod.as_str()));
        }
    }

    /// `pod`'s gateway took its assignment (or the pod is gone).
    pub(super) fn delivered(&self, uid: &str, pod: &str) {
        if let Some(m) = lock(&self.memory).get_mut(uid) {
            m.undelivered.remove(pod);
        }
    }

    /// Why `pod`'s session never started, once its deliveries have failed for `timeout`: a
    /// gateway that never takes an assignment (unreachable from the operator, refusing it)
    /// held its claim for good, the job running for ever with no word of why. (A restarted
    /// operator starts the clock again.)
    pub(super) fn undelivered_for(
        &self,
        uid: &str,
        pod: &str,
        timeout: Duration,
    ) -> Option<String> {
        let m = lock(&self.memory);
        let (since, why) = m.get(uid)?.undelivered.get(pod)?;
        (since.elapsed() >= timeout).then(|| {
            format!(
                "its gateway did not take the session's assignment within {}s: {why}",
                timeout.as_secs()
            )
        })
    }

    /// Sessions that could start but found no READY pod: their claims, later, count as cold.
    pub(super) fn note_starved(&self, uid: &str, indexes: &[u32]) {
        if !indexes.is_empty() {
            self.remember(uid, |m| m.starved.extend(indexes.iter().copied()));
        }
    }

    /// A session got its pod: `cold` when it had waited for one (it was starved before).
    pub(super) fn count_claim(&self, uid: &str, index: u32) {
        let cold = lock(&self.memory)
            .get_mut(uid)
            .is_some_and(|m| m.starved.remove(&index));
        self.metrics.claimed(cold);
    }

    pub(super) fn validate(&self, job: &RolloutJob) -> Result<(), String> {
        let uid = job.uid().unwrap_or_default();
        let version = spec_version(job);
        if let Some(verdict) = self.remember(&uid, |m| m.validated.get(&version)) {
            return verdict;
        }
        let verdict = floe_crds::validation::validate_rollout_job(job).map_err(|e| e.to_string());
        self.remember(&uid, |m| m.validated.set(version, verdict.clone()));
        verdict
    }

    /// The stall's message when the job as `kubectl apply` last sent it has fields the
    /// apiserver did not keep, though this operator knows them
    /// ([`crate::spec_check::dropped_by_an_older_crd`]), once per spec version.
    pub(super) async fn dropped_by_an_older_crd(
        &self,
        job: &RolloutJob,
        ns: &str,
    ) -> Result<Option<String>, JobError> {
        let uid = job.uid().unwrap_or_default();
        let version = spec_version(job);
        if let Some(verdict) = self.remember(&uid, |m| m.crd_dropped.get(&version)) {
            return Ok(verdict);
        }
        let (read, verdict) = crate::spec_check::dropped_by_an_older_crd(&self.client, job, "job")
            .await
            .map_err(JobError::api(format!(
                "reading RolloutJob {ns}/{}",
                job.name_any()
            )))?;
        let behind = read != version;
        self.remember(&uid, |m| m.crd_dropped.set(read, verdict.clone()));
        if behind {
            return Err(JobError::CacheBehind);
        }
        Ok(verdict)
    }

    pub(super) async fn event(
        &self,
        job: &RolloutJob,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        self.events
            .publish(&job.object_ref(&()), type_, reason, note)
            .await;
    }

    /// An Event with an action of its own ([`crate::events::Events::publish_as`]).
    pub(super) async fn event_as(
        &self,
        job: &RolloutJob,
        reason: &str,
        action: &str,
        note: String,
    ) {
        self.events
            .publish_as(
                &job.object_ref(&()),
                EventType::Normal,
                reason,
                action,
                note,
            )
            .await;
    }
}

/// Sans-IO: is a cached object at `cached` older than a write answered at `written`? An
/// unparsable version counts as behind (as the pods' bars do), so the round waits for the cache
/// or, failing that, its next write lists afresh.
fn cache_behind(written: Option<u64>, cached: Option<&str>) -> bool {
    written.is_some_and(|w| crate::rollout::freshness::version(cached).is_none_or(|c| c < w))
}

#[cfg(test)]
mod freshness_of_the_job {
    use super::cache_behind;

    #[test]
    fn a_cached_job_older_than_its_last_status_write_is_behind() {
        assert!(!cache_behind(None, Some("5")), "nothing written: trusted");
        assert!(cache_behind(Some(7), Some("5")));
        assert!(!cache_behind(Some(7), Some("7")));
        assert!(!cache_behind(Some(7), Some("9")));
        assert!(cache_behind(Some(7), None));
    }
}
