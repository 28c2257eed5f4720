//! `--metrics-listen`: a local run as one Prometheus target, so the chart's rules and
//! dashboard read it as they read a cluster. Its `/metrics` holds the job's session series in
//! the operator's shapes (`floe_sessions`, `floe_session_results_total`, `floe_session_reward`,
//! from the same code), the in-process gateway's `floe_gateway_*`, and the trainer's
//! `floe_trainer_*` when the run trains. In a cluster Prometheus labels a pod's series with its
//! namespace and RolloutJob; here the page carries `namespace` and `rolloutjob` itself, on every
//! series, so a plain static scrape config is all a user writes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::response::IntoResponse;
use floe_crds::rollout_job::SessionCounts;
use floe_gateway::server::Gateway;
use floe_operator::job_series::{JobSeries, SessionResult};
use prometheus::{Encoder, Registry, TextEncoder};

use super::RunError;

pub struct RunMetrics {
    registry: Registry,
    jobs: JobSeries,
    namespace: String,
    job: String,
}

impl RunMetrics {
    pub fn new(namespace: &str, job: &str) -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let jobs = JobSeries::new()?;
        for c in jobs.collectors() {
            registry.register(c)?;
        }
        Ok(Self {
            registry,
            jobs,
            namespace: namespace.to_string(),
            job: job.to_string(),
        })
    }

    /// The run's session counts and reward tally now.
    pub fn set(&self, counts: &SessionCounts, scored: u64, reward_sum: f64) {
        self.jobs.set_sessions(&self.namespace, &self.job, counts);
        self.jobs
            .set_rewards(&self.namespace, &self.job, scored, reward_sum);
    }

    /// A held-out round is complete.
    pub fn held_out(&self, step: u64, pass_rate: Option<f64>, reward: Option<f64>) {
        self.jobs
            .set_held_out(&self.namespace, &self.job, step, pass_rate, reward);
    }

    /// A session attempt ended so.
    pub fn result(&self, result: SessionResult) {
        self.jobs.session_result(&self.namespace, &self.job, result);
    }

    /// The whole page: the run's series, then the gateway's and the trainer's, labelled.
    pub(super) fn page(&self, gateway: &str, trainer: Option<&str>) -> String {
        let mut out = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        let mut page = String::from_utf8(out).unwrap_or_default();
        self.jobs.render_rewards(&mut page);
        let labels = [
            ("namespace", self.namespace.as_str()),
            ("rolloutjob", self.job.as_str()),
        ];
        page.push_str(&labelled(gateway, &labels));
        if let Some(trainer) = trainer {
            page.push_str(&labelled(trainer, &labels));
        }
        page
    }
}

/// `page` (the text format) with `labels` on every sample that does not carry them already.
pub fn labelled(page: &str, labels: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(page.len() + page.len() / 2);
    for line in page.lines() {
        if line.is_empty() || line.starts_with('#') {
            out.push_str(line);
            out.push('\n');
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let (name, rest) = line.split_at(name_end);
        let (existing, value) = match rest.strip_prefix('{') {
            Some(r) => match r.split_once('}') {
                Some((existing, value)) => (existing, value),
                None => (r, ""),
            },
            None => ("", rest),
        };
        let added: Vec<String> = labels
            .iter()
            .filter(|(k, _)| !has_label(existing, k))
            .map(|(k, v)| format!("{k}=\"{}\"", floe_operator::job_series::escape(v)))
            .collect();
        let all: Vec<&str> = added
            .iter()
            .map(String::as_str)
            .chain((!existing.is_empty()).then_some(existing))
            .collect();
        out.push_str(&format!("{name}{{{}}}{value}\n", all.join(",")));
    }
    out
}

/// Whether the label set `existing` (`a="x",b="y"`) has a label named `key`.
fn has_label(existing: &str, key: &str) -> bool {
    let mut rest = existing;
    while let Some((name, after)) = rest.split_once("=\"") {
        if name.trim_start_matches(',').trim() == key {
            return true;
        }
        // Skip the quoted value (a backslash escapes the next character).
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    chars.next();
                }
                '"' => {
                    end = i + 1;
                    break;
                }
                _ => {}
            }
        }
        rest = &after[end..];
    }
    false
}

struct Sources {
    run: Arc<RunMetrics>,
    gateway: Arc<Gateway>,
    /// The trainer's `/metrics`, when the run trains.
    trainer: Option<String>,
    http: reqwest::Client,
}

async fn metrics(State(s): State<Arc<Sources>>) -> impl IntoResponse {
    let trainer = match &s.trainer {
        Some(url) => match s.http.get(url).timeout(Duration::from_secs(1)).send().await {
            Ok(r) => r.text().await.ok(),
            // The trainer's series go stale while it does not answer, as a pod's would.
            Err(_) => None,
        },
        None => None,
    };
    let page = s.run.page(&s.gateway.metrics.render(), trainer.as_deref());
    ([("content-type", "text/plain; version=0.0.4")], page)
}

/// Serve the run's page on `listen` until the process ends.
pub async fn serve(
    listen: SocketAddr,
    run: Arc<RunMetrics>,
    gateway: Arc<Gateway>,
    trainer_url: Option<String>,
) -> Result<(), RunError> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| RunError::Io(format!("--metrics-listen {listen}: {e}")))?;
    let sources = Sources {
        run,
        gateway,
        trainer: trainer_url.map(|u| format!("{}/metrics", u.trim_end_matches('/'))),
        http: reqwest::Client::new(),
    };
    let app = axum::Router::new()
        .route("/metrics", axum::routing::get(metrics))
        .with_state(Arc::new(sources));
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::warn!(error = %e, "the run's metrics server stopped");
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LABELS: [(&str, &str); 2] = [("namespace", "ns"), ("rolloutjob", "j")];

    #[test]
    fn every_sample_gets_the_labels_and_comments_stay() {
        let page = "# HELP a_total A.\n# TYPE a_total counter\na_total 3\n\
                    b{kind=\"x\"} 1.5\nc{} 2 1700000000\n";
        assert_eq!(
            labelled(page, &LABELS),
            "# HELP a_total A.\n# TYPE a_total counter\n\
             a_total{namespace=\"ns\",rolloutjob=\"j\"} 3\n\
             b{namespace=\"ns\",rolloutjob=\"j\",kind=\"x\"} 1.5\n\
             c{namespace=\"ns\",rolloutjob=\"j\"} 2 1700000000\n"
        );
    }

    #[test]
    fn a_label_a_sample_has_is_kept_and_not_doubled() {
        let page = "s{rolloutjob=\"other\",v=\"a,namespace=\\\"q\\\"\"} 1\n";
        assert_eq!(
            labelled(page, &LABELS),
            "s{namespace=\"ns\",rolloutjob=\"other\",v=\"a,namespace=\\\"q\\\"\"} 1\n"
        );
    }

    #[test]
    fn the_run_page_has_the_job_series_in_the_operators_shape() {
        let m = RunMetrics::new("ns", "j").expect("metrics");
        let counts = SessionCounts {
            total: 4,
            pending: 1,
            running: 2,
            succeeded: 1,
            ..Default::default()
        };
        m.set(&counts, 1, 0.5);
        m.result(SessionResult::Retried);
        let page = m.page("floe_gateway_requests_total{api=\"openai_chat\"} 7\n", None);
        for line in [
            "floe_sessions{namespace=\"ns\",rolloutjob=\"j\",state=\"running\"} 2",
            "floe_session_results_total{namespace=\"ns\",result=\"retried\",rolloutjob=\"j\"} 1",
            "floe_session_results_total{namespace=\"ns\",result=\"failed\",rolloutjob=\"j\"} 0",
            "floe_session_reward_sum{namespace=\"ns\",rolloutjob=\"j\"} 0.5",
            "floe_gateway_requests_total{namespace=\"ns\",rolloutjob=\"j\",api=\"openai_chat\"} 7",
        ] {
            assert!(page.lines().any(|l| l == line), "{line} not in:\n{page}");
        }
    }
}
