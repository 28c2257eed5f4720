//! The operator's Prometheus metrics, with controller-runtime's names where they exist so the
//! usual dashboards and alerts work: `controller_runtime_reconcile_total{controller,result}`,
//! `controller_runtime_reconcile_errors_total{controller}`,
//! `controller_runtime_reconcile_time_seconds{controller}`; and floe's own `floe_pool_ready`,
//! `floe_pool_desired`, `floe_pool_claimed{namespace,pool}`, `floe_leader` (1 on the replica
//! that holds the lease); for RolloutJobs `floe_claims_total{kind=warm|cold}` (cold: the
//! session had to wait for a pod to warm up), `floe_claim_latency_seconds` (session claimable →
//! assignment acknowledged by the pod's gateway; a session claimed while the job's own pod was
//! starting becomes claimable when that pod is Ready) and its split `floe_claim_phase_seconds{phase=
//! observe|patch|deliver}`, `floe_sessions{namespace,rolloutjob,state}`,
//! `floe_session_results_total{namespace,rolloutjob,result=scored|retried|failed}` (each
//! finished pod's result as it is folded into status), `floe_sessions_waiting_for_pod{namespace,
//! rolloutjob,pool}` (sessions the last reconcile could not give a READY pod),
//! `floe_pool_refill_yield_seconds_total` (time pool refills waited for claims in flight), the
//! `floe_session_reward` summary (sum and count per job, from the job's status, so exact
//! across operator restarts), and `floe_pool_blocked{namespace,pool,reason}` /
//! `floe_rolloutjob_blocked{namespace,rolloutjob,reason}`: 1 while the object's `Ready`
//! condition names a blocker (a pod the apiserver refuses, an image that cannot be pulled, a
//! pod that cannot be scheduled or ends before READY, an invalid spec), with that condition's
//! reason; no series otherwise, so an alert reads `reason` straight from it.
//!
//! The job label is `rolloutjob`, not `job`: Prometheus owns `job` (the scrape job), and a
//! target's `job` would be renamed `exported_job` or, with `honorLabels`, replace it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use floe_crds::rollout_job::HeldOutRound;

pub mod job_series;
pub use job_series::{JobSeries, SessionResult};

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

/// Buckets of the claim latency and its phases: fine around the 100 ms target.
const CLAIM_BUCKETS: [f64; 23] = [
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25,
    0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0,
];

pub struct Metrics {
    registry: Registry,
    /// Every family registered, with its label names (the docs' list is checked against it).
    #[cfg_attr(not(test), allow(dead_code))]
    pub families: Vec<(String, Vec<String>)>,
    reconcile_total: IntCounterVec,
    reconcile_errors: IntCounterVec,
    reconcile_seconds: HistogramVec,
    pool_ready: IntGaugeVec,
    pool_desired: IntGaugeVec,
    pool_claimed: IntGaugeVec,
    leader: IntGauge,
    claims: IntCounterVec,
    claim_latency: prometheus::Histogram,
    claim_phase: prometheus::HistogramVec,
    jobs: JobSeries,
    waiting_for_pod: IntGaugeVec,
    job_pod_reads: IntCounterVec,
    refill_yield: prometheus::Counter,
    pool_blocked: IntGaugeVec,
    job_blocked: IntGaugeVec,
    crd_missing_fields: IntGaugeVec,
    /// (kind, namespace, name) → the reason its `*_blocked` series carries now.
    blocked: Mutex<BTreeMap<(Kind, String, String), String>>,
    /// Pools with series, so a deleted pool's go ([`Metrics::forget_pools_except`]).
    pools: Mutex<BTreeSet<(String, String)>>,
}

/// The operator's two kinds of object: each has a controller and can be blocked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    GatewayPool,
    RolloutJob,
}

impl Kind {
    /// The name its controller's reconcile series carry.
    pub fn controller(self) -> &'static str {
        match self {
            Kind::GatewayPool => "gatewaypool",
            Kind::RolloutJob => "rolloutjob",
        }
    }
}

impl Metrics {
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let reconcile_total = IntCounterVec::new(
            Opts::new(
                "controller_runtime_reconcile_total",
                "Reconciles by controller and result",
            ),
            &["controller", "result"],
        )?;
        let reconcile_errors = IntCounterVec::new(
            Opts::new(
                "controller_runtime_reconcile_errors_total",
                "Failed reconciles",
            ),
            &["controller"],
        )?;
        let reconcile_seconds = HistogramVec::new(
            HistogramOpts::new(
                "controller_runtime_reconcile_time_seconds",
                "Time per reconcile",
            )
            .buckets(vec![
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ]),
            &["controller"],
        )?;
        let pool = |name: &str, help: &str| {
            IntGaugeVec::new(Opts::new(name, help), &["namespace", "pool"])
        };
        let pool_ready = pool("floe_pool_ready", "READY unclaimed pods of a GatewayPool")?;
        let pool_desired = pool("floe_pool_desired", "spec.replicas of a GatewayPool")?;
        let pool_claimed = pool(
            "floe_pool_claimed",
            "Pods of a GatewayPool claimed by RolloutJobs",
        )?;
        let leader = IntGauge::new("floe_leader", "1 while this replica holds the leader lease")?;
        let claims = IntCounterVec::new(
            Opts::new(
                "floe_claims_total",
                "Sandbox pods claimed for sessions (warm: a READY pod was free; cold: the session waited)",
            ),
            &["kind"],
        )?;
        let claim_latency = prometheus::Histogram::with_opts(
            HistogramOpts::new(
                "floe_claim_latency_seconds",
                "From the reconcile round that found the session claimable (for a pod claimed while the job's trainer or collector was starting: the round that found it Ready) until its assignment was acknowledged by the pod's gateway",
            )
            .buckets(CLAIM_BUCKETS.to_vec()),
        )?;
        // The claim latency split, to tell a slow apiserver from a slow gateway: `observe` (the
        // round's reads and status write before the claim), `patch` (the compare-and-swap on
        // the pod), `deliver` (the assignment POST until the gateway acknowledged it).
        let claim_phase = prometheus::HistogramVec::new(
            HistogramOpts::new(
                "floe_claim_phase_seconds",
                "Claim latency by phase: observe (the round before the claim was sent: reads, status write, queueing behind other claims), patch (the pod compare-and-swap), deliver (assignment until acknowledged)",
            )
            .buckets(CLAIM_BUCKETS.to_vec()),
            &["phase"],
        )?;
        for phase in ["observe", "patch", "deliver"] {
            claim_phase.with_label_values(&[phase]);
        }
        let jobs = JobSeries::new()?;
        let waiting_for_pod = IntGaugeVec::new(
            Opts::new(
                "floe_sessions_waiting_for_pod",
                "Sessions of a RolloutJob that found no READY pod in its GatewayPool at the last reconcile",
            ),
            &["namespace", "rolloutjob", "pool"],
        )?;
        let job_pod_reads = IntCounterVec::new(
            Opts::new(
                "floe_job_pod_reads_total",
                "Reconcile rounds of RolloutJobs by where they read the job's pods: cache (the watch had caught up with every write of this operator) or apiserver (a quorum list)",
            ),
            &["source"],
        )?;
        for source in ["cache", "apiserver"] {
            job_pod_reads.with_label_values(&[source]);
        }
        let refill_yield = prometheus::Counter::new(
            "floe_pool_refill_yield_seconds_total",
            "Time GatewayPool refills waited for RolloutJob claims in flight (claims go first, within 2 s per pool reconcile)",
        )?;
        let pool_blocked = IntGaugeVec::new(
            Opts::new(
                "floe_pool_blocked",
                "1 while a GatewayPool's pods cannot become READY as its template stands, labelled with its Ready condition's reason (PodCreateRejected, PodFailed, Unschedulable, ErrImagePull, ...)",
            ),
            &["namespace", "pool", "reason"],
        )?;
        let job_blocked = IntGaugeVec::new(
            Opts::new(
                "floe_rolloutjob_blocked",
                "1 while a RolloutJob cannot go on without a change (an invalid spec, a missing pool) or its own pod (trainer, dataset collector, task loader) cannot run, labelled with the condition's reason",
            ),
            &["namespace", "rolloutjob", "reason"],
        )?;
        let crd_missing_fields = IntGaugeVec::new(
            Opts::new(
                "floe_crd_missing_fields",
                "Fields this operator reads or writes that the floe CRD the cluster serves lacks (0: up to date): the apiserver prunes them from every object it stores or serves; no series while the CRD may not be read",
            ),
            &["crd"],
        )?;
        // As controller-runtime does: each controller's series exist from the start, so error
        // ratios read 0 rather than nothing.
        for controller in [Kind::GatewayPool, Kind::RolloutJob].map(Kind::controller) {
            reconcile_errors.with_label_values(&[controller]).inc_by(0);
            for result in ["requeue_after", "error"] {
                reconcile_total
                    .with_label_values(&[controller, result])
                    .inc_by(0);
            }
        }
        let mut families = Vec::new();
        for c in [
            Box::new(reconcile_total.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(reconcile_errors.clone()),
            Box::new(reconcile_seconds.clone()),
            Box::new(pool_ready.clone()),
            Box::new(pool_desired.clone()),
            Box::new(pool_claimed.clone()),
            Box::new(leader.clone()),
            Box::new(claims.clone()),
            Box::new(claim_latency.clone()),
            Box::new(claim_phase.clone()),
            Box::new(waiting_for_pod.clone()),
            Box::new(job_pod_reads.clone()),
            Box::new(refill_yield.clone()),
            Box::new(pool_blocked.clone()),
            Box::new(job_blocked.clone()),
            Box::new(crd_missing_fields.clone()),
        ]
        .into_iter()
        .chain(jobs.collectors())
        {
            for desc in c.desc() {
                families.push((desc.fq_name.clone(), desc.variable_labels.clone()));
            }
            registry.register(c)?;
        }
        Ok(Self {
            registry,
            families,
            reconcile_total,
            reconcile_errors,
            reconcile_seconds,
            pool_ready,
            pool_desired,
            pool_claimed,
            leader,
            claims,
            claim_latency,
            claim_phase,
            jobs,
            waiting_for_pod,
            job_pod_reads,
            refill_yield,
            pool_blocked,
            job_blocked,
            crd_missing_fields,
            blocked: Mutex::default(),
            pools: Mutex::default(),
        })
    }

    /// Start timing a reconcile of `kind`.
    pub fn reconcile_timer(&self, kind: Kind) -> ReconcileTimer<'_> {
        ReconcileTimer {
            metrics: self,
            controller: kind.controller(),
            started: Instant::now(),
        }
    }

    /// This replica holds (or lost) the Lease.
    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    /// A session got its pod: `cold` when it had to wait for one.
    pub fn claimed(&self, cold: bool) {
        self.claims
            .with_label_values(&[if cold { "cold" } else { "warm" }])
            .inc();
    }

    /// One phase of a claim, from `since` until now.
    pub fn claim_phase(&self, phase: ClaimPhase, since: Instant) {
        let name = match phase {
            ClaimPhase::Observe => "observe",
            ClaimPhase::Patch => "patch",
            ClaimPhase::Deliver => "deliver",
        };
        self.claim_phase
            .with_label_values(&[name])
            .observe(since.elapsed().as_secs_f64());
    }

    /// A claimed session's assignment was acknowledged: its claim latency, from `since`.
    pub fn claim_delivered(&self, since: Instant) {
        self.claim_latency.observe(since.elapsed().as_secs_f64());
    }

    /// Sessions of a job that could start but found no READY pod of `pool`.
    pub fn set_waiting_for_pod(&self, namespace: &str, job: &str, pool: &str, sessions: usize) {
        self.waiting_for_pod
            .with_label_values(&[namespace, job, pool])
            .set(i64::try_from(sessions).unwrap_or(i64::MAX));
    }

    /// A job that claims nothing now (stalled, waiting on something else, or finished): none
    /// of its sessions waits for a pod. Left as its last claiming round set it, the gauge
    /// kept a stalled job's count, and `FloePoolEmpty` fired whenever its pool ran empty.
    pub fn none_waiting_for_pod(&self, namespace: &str, job: &str, pool: &str) {
        self.set_waiting_for_pod(namespace, job, pool, 0);
    }

    /// A round read a job's pods.
    pub fn job_pods_read(&self, from: PodSource) {
        let source = match from {
            PodSource::Cache => "cache",
            PodSource::Apiserver => "apiserver",
        };
        self.job_pod_reads.with_label_values(&[source]).inc();
    }

    /// A session attempt's result was folded into its job's status.
    pub fn session_result(&self, namespace: &str, job: &str, result: SessionResult) {
        self.jobs.session_result(namespace, job, result);
    }

    /// A job's session counts as its status says them.
    pub fn set_sessions(
        &self,
        namespace: &str,
        job: &str,
        s: &floe_crds::rollout_job::SessionCounts,
    ) {
        self.jobs.set_sessions(namespace, job, s);
    }

    /// A pool's refill waited this long for claims in flight.
    pub fn refill_yielded(&self, waited: Duration) {
        self.refill_yield.inc_by(waited.as_secs_f64());
    }

    /// The object's blocker now (`None`: not blocked): one series with its reason, or none.
    pub fn set_blocked(&self, kind: Kind, namespace: &str, name: &str, reason: Option<&str>) {
        let gauge = match kind {
            Kind::GatewayPool => &self.pool_blocked,
            Kind::RolloutJob => &self.job_blocked,
        };
        let mut blocked = floe_gateway::sync::lock(&self.blocked);
        let key = (kind, namespace.to_string(), name.to_string());
        if let Some(was) = blocked.get(&key).filter(|was| Some(was.as_str()) != reason) {
            let _ = gauge.remove_label_values(&[namespace, name, was]);
        }
        match reason {
            Some(reason) => {
                gauge.with_label_values(&[namespace, name, reason]).set(1);
                blocked.insert(key, reason.to_string());
            }
            None => {
                blocked.remove(&key);
            }
        }
    }

    /// How many fields the served CRD `crd` lacks; `None`: it could not be read.
    pub fn set_crd_missing_fields(&self, crd: &str, missing: Option<usize>) {
        match missing {
            Some(n) => self
                .crd_missing_fields
                .with_label_values(&[crd])
                .set(i64::try_from(n).unwrap_or(i64::MAX)),
            None => {
                let _ = self.crd_missing_fields.remove_label_values(&[crd]);
            }
        }
    }

    /// A pool's gauges as its last reconcile found it.
    pub fn set_pool(&self, namespace: &str, pool: &str, ready: i32, desired: i32, claimed: i32) {
        let labels = [namespace, pool];
        self.pool_ready
            .with_label_values(&labels)
            .set(i64::from(ready));
        self.pool_desired
            .with_label_values(&labels)
            .set(i64::from(desired));
        self.pool_claimed
            .with_label_values(&labels)
            .set(i64::from(claimed));
        floe_gateway::sync::lock(&self.pools).insert((namespace.to_string(), pool.to_string()));
    }

    /// Deleted pools' series go (pools have no finalizer, so no reconcile sees them go).
    pub fn forget_pools_except(&self, live: &BTreeSet<(String, String)>) {
        let gone: Vec<(String, String)> = {
            let mut pools = floe_gateway::sync::lock(&self.pools);
            let gone = pools.difference(live).cloned().collect();
            pools.retain(|p| live.contains(p));
            gone
        };
        for (ns, pool) in gone {
            tracing::info!(namespace = %ns, %pool, "the pool is gone: its series go");
            for gauge in [&self.pool_ready, &self.pool_desired, &self.pool_claimed] {
                let _ = gauge.remove_label_values(&[&ns, &pool]);
            }
            self.set_blocked(Kind::GatewayPool, &ns, &pool, None);
        }
    }

    /// Every pool's and job's series go: this replica lost its lease and stands by, and the
    /// leader now says them. Kept, they would be frozen at the hand-over and summed with the
    /// leader's by every rule that does not filter on `floe_leader` (a blocked object paging
    /// after it was fixed or deleted, running sessions counted twice, an empty pool hidden).
    /// The jobs' result counters go too (a job deleted meanwhile would keep them for good).
    pub fn forget_objects(&self) {
        for gauge in [
            &self.pool_ready,
            &self.pool_desired,
            &self.pool_claimed,
            &self.pool_blocked,
            &self.job_blocked,
            &self.waiting_for_pod,
            &self.crd_missing_fields,
        ] {
            gauge.reset();
        }
        floe_gateway::sync::lock(&self.blocked).clear();
        floe_gateway::sync::lock(&self.pools).clear();
        self.jobs.forget_all();
    }

    /// A deleted job's series go away.
    /// `pool`: the job's pool, `""` for a `poolTemplate` job (its series' label).
    pub fn forget_job(&self, namespace: &str, job: &str, pool: &str) {
        self.jobs.forget(namespace, job);
        let _ = self
            .waiting_for_pod
            .remove_label_values(&[namespace, job, pool]);
        self.set_blocked(Kind::RolloutJob, namespace, job, None);
    }

    /// The reward tally of a job as its status records it.
    pub fn set_rewards(&self, namespace: &str, job: &str, scored: u64, sum: f64) {
        self.jobs.set_rewards(namespace, job, scored, sum);
    }

    /// A job's held-out round is complete ([`job_series::JobSeries::set_held_out`]).
    pub fn set_held_out(&self, namespace: &str, job: &str, round: &HeldOutRound) {
        self.jobs.set_held_out(
            namespace,
            job,
            u64::try_from(round.step).unwrap_or(0),
            round.pass_rate,
            round.reward_mean,
        );
    }

    pub fn render(&self) -> String {
        let mut out = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        let mut text = String::from_utf8(out).unwrap_or_default();
        self.jobs.render_rewards(&mut text);
        text
    }
}

/// One reconcile, timed from its start; [`ReconcileTimer::finish`] records it under
/// controller-runtime's metric names.
pub struct ReconcileTimer<'a> {
    metrics: &'a Metrics,
    controller: &'static str,
    started: Instant,
}

impl ReconcileTimer<'_> {
    pub fn finish(self, ok: bool) {
        let m = self.metrics;
        m.reconcile_seconds
            .with_label_values(&[self.controller])
            .observe(self.started.elapsed().as_secs_f64());
        let result = if ok { "requeue_after" } else { "error" };
        m.reconcile_total
            .with_label_values(&[self.controller, result])
            .inc();
        if !ok {
            m.reconcile_errors
                .with_label_values(&[self.controller])
                .inc();
        }
    }
}

/// A claim's phase (`floe_claim_phase_seconds{phase}`).
#[derive(Clone, Copy, Debug)]
pub enum ClaimPhase {
    /// From the round's start until the claim's PATCH goes out.
    Observe,
    /// The claim's PATCH.
    Patch,
    /// The assignment's delivery to the pod's gateway.
    Deliver,
}

/// Where a round read a job's pods from (`floe_job_pod_reads_total{source}`).
#[derive(Clone, Copy, Debug)]
pub enum PodSource {
    Cache,
    Apiserver,
}

#[cfg(test)]
mod docs_tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::Metrics;

    /// `docs/operator.md`'s metrics section names every family the operator exposes, with its
    /// labels, and nothing else.
    #[test]
    fn the_docs_list_every_metric_with_its_labels() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/operator.md");
        let doc = std::fs::read_to_string(path).expect("docs/operator.md");
        let section = doc
            .split("\n## Metrics")
            .nth(1)
            .and_then(|s| s.split("\n## ").next())
            .expect("a Metrics section");
        let mut documented = BTreeMap::new();
        for quoted in section.split('`').skip(1).step_by(2) {
            if !(quoted.starts_with("floe_") || quoted.starts_with("controller_runtime_")) {
                continue;
            }
            let (name, labels) = match quoted.split_once('{') {
                Some((name, rest)) => (
                    name,
                    rest.trim_end_matches('}')
                        .split(',')
                        .map(|l| l.split('=').next().unwrap_or_default().trim().to_string())
                        .collect(),
                ),
                None => (quoted, BTreeSet::new()),
            };
            documented.insert(name.to_string(), labels);
        }
        let metrics = Metrics::new().expect("metrics");
        let mut exposed: BTreeMap<String, BTreeSet<String>> = metrics
            .families
            .iter()
            .map(|(name, labels)| (name.clone(), labels.iter().cloned().collect()))
            .collect();
        // Rendered by hand (the prometheus crate has no summary type).
        exposed.insert(
            "floe_session_reward".into(),
            ["namespace", "rolloutjob"].map(String::from).into(),
        );
        assert_eq!(
            documented, exposed,
            "docs/operator.md's metrics vs the registry"
        );
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::{Kind, Metrics};

    fn series(m: &Metrics, family: &str) -> Vec<String> {
        m.render()
            .lines()
            .filter(|l| l.starts_with(&format!("{family}{{")))
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn a_blocker_is_one_series_with_the_current_reason_and_none_once_cleared() {
        let m = Metrics::new().expect("metrics");
        m.set_blocked(Kind::GatewayPool, "ns", "p", Some("Unschedulable"));
        m.set_blocked(Kind::GatewayPool, "ns", "p", Some("ErrImagePull"));
        m.set_blocked(Kind::RolloutJob, "ns", "j", Some("PoolNotFound"));
        assert_eq!(
            series(&m, "floe_pool_blocked"),
            ["floe_pool_blocked{namespace=\"ns\",pool=\"p\",reason=\"ErrImagePull\"} 1"]
        );
        assert_eq!(
            series(&m, "floe_rolloutjob_blocked"),
            ["floe_rolloutjob_blocked{namespace=\"ns\",reason=\"PoolNotFound\",rolloutjob=\"j\"} 1"]
        );
        m.set_blocked(Kind::GatewayPool, "ns", "p", None);
        m.forget_job("ns", "j", "");
        assert!(series(&m, "floe_pool_blocked").is_empty());
        assert!(series(&m, "floe_rolloutjob_blocked").is_empty());
    }

    #[test]
    fn a_job_that_claims_nothing_has_no_session_waiting_and_a_deleted_one_no_series() {
        let m = Metrics::new().expect("metrics");
        // A `poolTemplate` job's series has pool "": reset and removed under that label too.
        for pool in ["warm", ""] {
            m.set_waiting_for_pod("ns", "j", pool, 3);
            m.none_waiting_for_pod("ns", "j", pool);
            assert_eq!(
                series(&m, "floe_sessions_waiting_for_pod"),
                [format!(
                    "floe_sessions_waiting_for_pod{{namespace=\"ns\",pool=\"{pool}\",rolloutjob=\"j\"}} 0"
                )]
            );
            m.forget_job("ns", "j", pool);
            assert!(series(&m, "floe_sessions_waiting_for_pod").is_empty());
        }
    }

    /// The held-out gauge says one round's three figures together: a round with nothing
    /// scored, or one of an earlier step completing late, leaves the last round's.
    #[test]
    fn the_held_out_gauge_never_pairs_one_rounds_step_with_anothers_figures() {
        let m = Metrics::new().expect("metrics");
        let shown = |m: &Metrics| {
            let mut s = series(m, "floe_job_held_out");
            s.sort();
            s
        };
        m.jobs.set_held_out("ns", "j", 5, Some(0.5), Some(0.25));
        let at_5 = shown(&m);
        assert_eq!(at_5.len(), 3, "{at_5:?}");
        assert!(at_5
            .iter()
            .any(|l| l.contains("stat=\"step\"") && l.ends_with(" 5")));
        m.jobs.set_held_out("ns", "j", 10, None, None);
        assert_eq!(shown(&m), at_5, "a round with nothing scored");
        m.jobs.set_held_out("ns", "j", 0, Some(0.0), Some(0.0));
        assert_eq!(shown(&m), at_5, "an earlier round, late");
        m.jobs.set_held_out("ns", "j", 10, Some(1.0), Some(1.0));
        assert!(shown(&m)
            .iter()
            .all(|l| l.ends_with(" 10") || l.ends_with(" 1")));
    }

    #[test]
    fn a_replica_that_stops_leading_says_no_pool_or_job_any_more() {
        let m = Metrics::new().expect("metrics");
        m.set_leader(true);
        m.set_pool("ns", "warm", 3, 4, 1);
        m.set_blocked(Kind::GatewayPool, "ns", "warm", Some("PodFailed"));
        m.set_blocked(Kind::RolloutJob, "ns", "j", Some("PoolNotFound"));
        m.set_sessions(
            "ns",
            "j",
            &floe_crds::rollout_job::SessionCounts {
                running: 2,
                ..Default::default()
            },
        );
        m.set_rewards("ns", "j", 3, 1.5);
        m.jobs
            .session_result("ns", "j", super::SessionResult::Failed);
        m.set_leader(false);
        m.forget_objects();
        let text = m.render();
        for gone in [
            "floe_pool_ready{",
            "floe_pool_blocked{",
            "floe_rolloutjob_blocked{",
            "floe_sessions{",
            "floe_session_reward_count{",
            "floe_session_results_total{",
        ] {
            assert!(!text.contains(gone), "{gone} left in:\n{text}");
        }
        assert!(text.contains("floe_leader 0"), "{text}");
        // Leading again, it says them again as its reconciles find them.
        m.set_pool("ns", "warm", 2, 4, 0);
        assert!(series(&m, "floe_pool_ready").len() == 1);
    }

    #[test]
    fn a_deleted_pools_series_go() {
        let m = Metrics::new().expect("metrics");
        m.set_pool("ns", "kept", 1, 2, 0);
        m.set_pool("ns", "gone", 0, 1, 0);
        m.set_blocked(Kind::GatewayPool, "ns", "gone", Some("PodFailed"));
        let live: BTreeSet<_> = [("ns".to_string(), "kept".to_string())].into();
        m.forget_pools_except(&live);
        let text = m.render();
        assert!(
            text.contains("floe_pool_ready{namespace=\"ns\",pool=\"kept\"} 1"),
            "{text}"
        );
        assert!(!text.contains("pool=\"gone\""), "{text}");
    }
}
