//! The operator's Prometheus metrics, with controller-runtime's names where they exist so the
//! usual dashboards and alerts work: `controller_runtime_reconcile_total{controller,result}`,
//! `controller_runtime_reconcile_errors_total{controller}`,
//! `controller_runtime_reconcile_time_seconds{controller}`; and floe's own `floe_pool_ready`,
//! `floe_pool_desired`, `floe_pool_claimed{namespace,pool}`, `floe_leader` (1 on the replica
//! that holds the lease).

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

pub struct Metrics {
    registry: Registry,
    pub reconcile_total: IntCounterVec,
    pub reconcile_errors: IntCounterVec,
    pub reconcile_seconds: HistogramVec,
    pub pool_ready: IntGaugeVec,
    pub pool_desired: IntGaugeVec,
    pub pool_claimed: IntGaugeVec,
    pub leader: IntGauge,
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
        for c in [
            Box::new(reconcile_total.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(reconcile_errors.clone()),
            Box::new(reconcile_seconds.clone()),
            Box::new(pool_ready.clone()),
            Box::new(pool_desired.clone()),
            Box::new(pool_claimed.clone()),
            Box::new(leader.clone()),
        ] {
            registry.register(c)?;
        }
        Ok(Self {
            registry,
            reconcile_total,
            reconcile_errors,
            reconcile_seconds,
            pool_ready,
            pool_desired,
            pool_claimed,
            leader,
        })
    }

    pub fn render(&self) -> String {
        let mut out = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}
