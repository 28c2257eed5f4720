//! Prometheus metrics of the gateway (`/metrics`).

use std::time::Duration;

use prometheus::core::Collector;
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry, TextEncoder,
};

use crate::capture::Api;

pub struct Metrics {
    registry: Registry,
    /// Every family registered, with its label names: all `/metrics` can ever show, series or
    /// not yet (the docs' list is checked against it).
    pub families: Vec<(String, Vec<String>)>,
    requests: IntCounterVec,
    upstream_seconds: HistogramVec,
    added_seconds: HistogramVec,
    bytes: IntCounterVec,
    sessions_open: IntGauge,
    /// 1 when the pod's grader reached, at start, what its egress policy should refuse.
    egress_unrestricted: IntGauge,
    capture_write_seconds: HistogramVec,
    errors: IntCounterVec,
    dropped: IntCounterVec,
    /// The `what` values `dropped` has series for: they come from requests (a hosted tool's
    /// type, a sampling parameter's name), so an agent could otherwise make series without end.
    dropped_seen: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Trajectories by what happened to them: `shipped`, `retried`, `rejected`.
    trajectories: IntCounterVec,
    snapshots: IntCounterVec,
    snapshot_bytes: IntCounterVec,
    spool_pending: IntGauge,
    /// Failed upstream attempts by kind and what followed: `retried` or `failed` (the call
    /// failed for the harness; its session is an infrastructure failure).
    upstream_errors: IntCounterVec,
    /// Failed trajectory deliveries by cause (`crate::net_error::KINDS`, `http_<status>`, `disk`).
    delivery_errors: IntCounterVec,
}

/// How many distinct `what` values `floe_gateway_dropped_total` keeps series for.
const DROPPED_LABELS: usize = 64;

/// The `floe_gateway_requests_total` statuses whose series exist, at 0, before any call.
const STATUSES_FROM_THE_START: [&str; 5] = ["200", "502", "504", "stream_error", "abandoned"];

const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0, 60.0, 120.0, 300.0,
];

/// Register `collector` and note its families.
fn register<C: Collector + Clone + 'static>(
    registry: &Registry,
    families: &mut Vec<(String, Vec<String>)>,
    collector: &C,
) -> Result<(), prometheus::Error> {
    for desc in collector.desc() {
        families.push((desc.fq_name.clone(), desc.variable_labels.clone()));
    }
    registry.register(Box::new(collector.clone()))
}

impl Metrics {
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let mut families = Vec::new();
        let requests = IntCounterVec::new(
            Opts::new(
                "floe_gateway_requests_total",
                "Model API requests by API and HTTP status",
            ),
            &["api", "status"],
        )?;
        let upstream_seconds = HistogramVec::new(
            HistogramOpts::new(
                "floe_gateway_upstream_latency_seconds",
                "Time waiting for the upstream model server",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["api"],
        )?;
        let added_seconds = HistogramVec::new(
            HistogramOpts::new(
                "floe_gateway_added_latency_seconds",
                "Time the gateway adds to a call (total minus upstream)",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["api"],
        )?;
        let bytes = IntCounterVec::new(
            Opts::new(
                "floe_gateway_bytes_total",
                "Request and response body bytes",
            ),
            &["api", "direction"],
        )?;
        let sessions_open = IntGauge::new(
            "floe_gateway_sessions_open",
            "Sessions created and not closed",
        )?;
        let capture_write_seconds = HistogramVec::new(
            HistogramOpts::new(
                "floe_gateway_capture_write_seconds",
                "Durable append of one capture record",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["api"],
        )?;
        let errors = IntCounterVec::new(
            Opts::new("floe_gateway_errors_total", "Errors by kind"),
            &["kind"],
        )?;
        register(&registry, &mut families, &requests)?;
        register(&registry, &mut families, &upstream_seconds)?;
        register(&registry, &mut families, &added_seconds)?;
        register(&registry, &mut families, &bytes)?;
        register(&registry, &mut families, &sessions_open)?;
        let egress_unrestricted = IntGauge::new(
            "floe_gateway_egress_unrestricted",
            "1 when this sandbox pod reached the Kubernetes API at start: its egress is not restricted (NetworkPolicy not enforced, or opened)",
        )?;
        register(&registry, &mut families, &egress_unrestricted)?;
        register(&registry, &mut families, &capture_write_seconds)?;
        let dropped = IntCounterVec::new(
            Opts::new(
                "floe_gateway_dropped_total",
                "Request parts vLLM cannot express, dropped by documented rule",
            ),
            &["api", "what"],
        )?;
        // A sandbox pod lives for one session: a series born at its first call would show
        // Prometheus no increase() for that call (often the pod's only one), so the per-API
        // series of successful calls, of calls the upstream failed (the denominator of the
        // upstream-error ratio: without them a pod whose only call failed reads +Inf) and of
        // latencies exist, empty, from the start; so do abandoned calls (a harness that gives
        // up once a session, then succeeds, would otherwise never show an increase()).
        for api in Api::ALL.map(api_label) {
            for status in STATUSES_FROM_THE_START {
                requests.with_label_values(&[api, status]).inc_by(0);
            }
            upstream_seconds.with_label_values(&[api]);
            added_seconds.with_label_values(&[api]);
        }
        for kind in crate::protocol::errors::ProtocolError::KINDS {
            errors.with_label_values(&[kind]).inc_by(0);
        }
        register(&registry, &mut families, &errors)?;
        register(&registry, &mut families, &dropped)?;
        let trajectories = IntCounterVec::new(
            Opts::new(
                "floe_gateway_trajectories_total",
                "Trajectory deliveries: shipped, retried (a failed attempt) or rejected by the sink",
            ),
            &["result"],
        )?;
        let spool_pending = IntGauge::new(
            "floe_gateway_spool_pending",
            "Trajectories in the spool not yet accepted by their sink",
        )?;
        register(&registry, &mut families, &trajectories)?;
        let snapshots = IntCounterVec::new(
            Opts::new(
                "floe_gateway_snapshots_total",
                "Snapshots of running train-job sessions posted to the trainer after a call: shipped or failed (the reply went on without it)",
            ),
            &["result"],
        )?;
        for result in ["shipped", "failed"] {
            snapshots.with_label_values(&[result]).inc_by(0);
        }
        register(&registry, &mut families, &snapshots)?;
        let snapshot_bytes = IntCounterVec::new(
            Opts::new(
                "floe_gateway_snapshot_bytes_total",
                "Bytes of the snapshots the trainer took, by kind: whole, or delta (the change to the last one it took)",
            ),
            &["kind"],
        )?;
        for kind in ["whole", "delta"] {
            snapshot_bytes.with_label_values(&[kind]).inc_by(0);
        }
        register(&registry, &mut families, &snapshot_bytes)?;
        register(&registry, &mut families, &spool_pending)?;
        let upstream_errors = IntCounterVec::new(
            Opts::new(
                "floe_gateway_upstream_errors_total",
                "Failed upstream attempts by kind (connect, broken, timeout, http_<status>, malformed) and result (retried, failed)",
            ),
            &["kind", "result"],
        )?;
        for kind in crate::protocol::retry::KINDS {
            for result in ["retried", "failed"] {
                upstream_errors.with_label_values(&[kind, result]).inc_by(0);
            }
        }
        register(&registry, &mut families, &upstream_errors)?;
        let delivery_errors = IntCounterVec::new(
            Opts::new(
                "floe_gateway_delivery_errors_total",
                "Failed trajectory delivery attempts by cause (dns, refused, timeout, tls, connect, broken, http_<status>, disk)",
            ),
            &["kind"],
        )?;
        for kind in crate::net_error::KINDS {
            delivery_errors.with_label_values(&[kind]).inc_by(0);
        }
        register(&registry, &mut families, &delivery_errors)?;
        Ok(Self {
            registry,
            families,
            requests,
            upstream_seconds,
            added_seconds,
            bytes,
            sessions_open,
            egress_unrestricted,
            capture_write_seconds,
            errors,
            dropped,
            dropped_seen: Default::default(),
            trajectories,
            snapshots,
            snapshot_bytes,
            spool_pending,
            upstream_errors,
            delivery_errors,
        })
    }

    /// A model API request answered with `status` (`200`, `400`, …, or `stream_error`).
    pub fn request(&self, api: Api, status: &str) {
        self.requests
            .with_label_values(&[api_label(api), status])
            .inc();
    }

    /// A request refused or failed, by the error's kind.
    pub fn error(&self, kind: &str) {
        self.errors.with_label_values(&[kind]).inc();
    }

    /// Bytes of a request read from the harness.
    pub fn bytes_in(&self, api: Api, n: usize) {
        self.bytes
            .with_label_values(&[api_label(api), "in"])
            .inc_by(n as u64);
    }

    /// A request answered: 200, the latency the gateway added beside the upstream's, the bytes
    /// sent back.
    pub fn answered(&self, api: Api, added: Duration, out_bytes: usize) {
        let label = api_label(api);
        self.requests.with_label_values(&[label, "200"]).inc();
        self.added_seconds
            .with_label_values(&[label])
            .observe(added.as_secs_f64());
        self.bytes
            .with_label_values(&[label, "out"])
            .inc_by(out_bytes as u64);
    }

    /// Something of the harness's request was dropped in translation.
    pub fn dropped(&self, api: Api, what: &str) {
        let what = self.dropped_label(what);
        self.dropped
            .with_label_values(&[api_label(api), &what])
            .inc();
    }

    /// `what` as a label: itself while it is short and plain and one of the first
    /// [`DROPPED_LABELS`] seen (or a word of the gateway's own), else `other` (the capture
    /// keeps it whole).
    fn dropped_label(&self, what: &str) -> String {
        let plain = what.len() <= 64
            && what
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b':' | b'.' | b'-'));
        let Ok(mut seen) = self.dropped_seen.lock() else {
            return "other".into();
        };
        // A word of the gateway's own (`tool_result_image`) names no request's thing: always
        // kept, so requests cannot use the room up before it.
        let own = !what.contains(':');
        if plain && (own || seen.contains(what) || seen.len() < DROPPED_LABELS) {
            seen.insert(what.to_string());
            return what.to_string();
        }
        "other".into()
    }

    /// One upstream call (with its retries) took this long.
    pub fn upstream_call(&self, api: Api, took: Duration) {
        self.upstream_seconds
            .with_label_values(&[api_label(api)])
            .observe(took.as_secs_f64());
    }

    /// One capture line took this long to write.
    pub fn capture_written(&self, api: Api, took: Duration) {
        self.capture_write_seconds
            .with_label_values(&[api_label(api)])
            .observe(took.as_secs_f64());
    }

    /// A failed upstream attempt, and whether it was `retried`.
    pub fn upstream_error(&self, kind: &str, retried: bool) {
        let result = if retried { "retried" } else { "failed" };
        self.upstream_errors
            .with_label_values(&[kind, result])
            .inc();
    }

    pub fn set_sessions_open(&self, n: usize) {
        self.sessions_open.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// The pod's grader reached, at start, what its egress policy should refuse.
    pub fn set_egress_unrestricted(&self, open: bool) {
        self.egress_unrestricted.set(i64::from(open));
    }

    /// A session's shipping loop started (`true`) or ended.
    pub fn shipping(&self, started: bool) {
        if started {
            self.spool_pending.inc();
        } else {
            self.spool_pending.dec();
        }
    }

    /// What happened to a trajectory's delivery: `shipped`, `retried` or `rejected`.
    pub fn trajectory(&self, fate: &str) {
        self.trajectories.with_label_values(&[fate]).inc();
    }

    /// A running session's snapshot reached the trainer (`true`) or did not.
    pub fn snapshot(&self, shipped: bool) {
        let result = if shipped { "shipped" } else { "failed" };
        self.snapshots.with_label_values(&[result]).inc();
    }

    /// A snapshot of `bytes` the trainer took, whole or as a delta.
    pub fn snapshot_taken(&self, delta: bool, bytes: usize) {
        let kind = if delta { "delta" } else { "whole" };
        self.snapshot_bytes
            .with_label_values(&[kind])
            .inc_by(bytes as u64);
    }

    /// A failed delivery attempt, by cause.
    pub fn delivery_error(&self, kind: &str) {
        self.delivery_errors.with_label_values(&[kind]).inc();
    }

    pub fn render(&self) -> String {
        let mut out = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

/// The `api` label of a provider API.
pub fn api_label(api: Api) -> &'static str {
    match api {
        Api::Anthropic => "anthropic",
        Api::OpenaiChat => "openai_chat",
        Api::OpenaiResponses => "openai_responses",
        Api::Gemini => "gemini",
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::{Api, Metrics, DROPPED_LABELS};

    #[test]
    fn the_upstream_failure_series_exist_before_any_call() {
        let page = Metrics::new().expect("metrics").render();
        for status in ["200", "502", "504", "stream_error", "abandoned"] {
            let line =
                format!("floe_gateway_requests_total{{api=\"gemini\",status=\"{status}\"}} 0");
            assert!(page.contains(&line), "{line}");
        }
    }

    /// `docs/gateway.md`'s metrics section names every family the gateway registers, with its
    /// labels, and nothing else.
    #[test]
    fn the_docs_list_every_metric_with_its_labels() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/gateway.md");
        let doc = std::fs::read_to_string(path).expect("docs/gateway.md");
        let section = doc
            .split("## Metrics")
            .nth(1)
            .and_then(|s| s.split("\n## ").next())
            .expect("a Metrics section");
        let mut documented = BTreeMap::new();
        for (at, _) in section.match_indices("floe_gateway_") {
            let rest = &section[at..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            let labels: BTreeSet<String> = match rest[end..].strip_prefix('{') {
                Some(inner) => inner
                    .split('}')
                    .next()
                    .unwrap_or_default()
                    .split(',')
                    .map(|l| l.split('=').next().unwrap_or_default().trim().to_string())
                    .collect(),
                None => BTreeSet::new(),
            };
            documented.insert(rest[..end].to_string(), labels);
        }
        let metrics = Metrics::new().expect("metrics");
        let registered: BTreeMap<String, BTreeSet<String>> = metrics
            .families
            .iter()
            .map(|(name, labels)| (name.clone(), labels.iter().cloned().collect()))
            .collect();
        assert_eq!(
            documented, registered,
            "docs/gateway.md's metrics vs the registry"
        );
    }

    #[test]
    fn what_a_request_names_makes_no_series_without_end() {
        let m = Metrics::new().expect("metrics");
        m.dropped(Api::Anthropic, "hosted_tool:web_search_20250305");
        m.dropped(Api::Anthropic, &"x".repeat(65));
        m.dropped(Api::Anthropic, "hosted_tool:a b");
        for n in 0..200 {
            m.dropped(Api::Anthropic, &format!("hosted_tool:t{n}"));
        }
        let page = m.render();
        let series = page
            .lines()
            .filter(|l| l.starts_with("floe_gateway_dropped_total{"))
            .count();
        assert_eq!(series, DROPPED_LABELS + 1, "{page}");
        assert!(
            page.contains(r#"what="hosted_tool:web_search_20250305"} 1"#),
            "{page}"
        );
        assert!(page.contains(r#"what="other"} 139"#), "{page}");
        // The gateway's own words keep their series, whatever requests used up.
        m.dropped(Api::Anthropic, "tool_result_image");
        assert!(m.render().contains(r#"what="tool_result_image"} 1"#));
    }
}
