//! A RolloutJob's session series, the same wherever its sessions run: on the operator's page
//! and on a local `floe run`'s (`--metrics-listen`), so the chart's rules and dashboard read
//! both. `floe_sessions{namespace,rolloutjob,state}`,
//! `floe_session_results_total{namespace,rolloutjob,result=scored|retried|failed}` and the
//! `floe_session_reward` summary (sum and count per job), and a train job's last complete
//! held-out round, `floe_job_held_out{namespace,rolloutjob,stat=pass_rate|reward|step}`.

use std::collections::BTreeMap;
use std::sync::Mutex;

use prometheus::core::Collector;
use prometheus::{GaugeVec, IntCounterVec, IntGaugeVec, Opts};

/// What became of a session attempt (`floe_session_results_total{result}`).
#[derive(Clone, Copy, Debug)]
pub enum SessionResult {
    Scored,
    Retried,
    Failed,
}

impl SessionResult {
    pub(crate) const ALL: [SessionResult; 3] = [Self::Scored, Self::Retried, Self::Failed];

    fn label(self) -> &'static str {
        match self {
            Self::Scored => "scored",
            Self::Retried => "retried",
            Self::Failed => "failed",
        }
    }
}

const SESSION_STATES: [&str; 4] = ["pending", "running", "succeeded", "failed"];

pub struct JobSeries {
    sessions: IntGaugeVec,
    results: IntCounterVec,
    held_out: GaugeVec,
    /// (namespace, job) → (scored sessions, reward sum).
    rewards: Mutex<BTreeMap<(String, String), (u64, f64)>>,
}

impl JobSeries {
    pub fn new() -> Result<Self, prometheus::Error> {
        let sessions = IntGaugeVec::new(
            Opts::new("floe_sessions", "Sessions of a RolloutJob by state"),
            &["namespace", "rolloutjob", "state"],
        )?;
        let results = IntCounterVec::new(
            Opts::new(
                "floe_session_results_total",
                "Finished session attempts of a RolloutJob by result (scored, the agent's own failures at failureReward included; retried or failed: infrastructure)",
            ),
            &["namespace", "rolloutjob", "result"],
        )?;
        let held_out = GaugeVec::new(
            Opts::new(
                "floe_job_held_out",
                "The last complete held-out round: its pass rate (stat=pass_rate), mean reward \
                 (stat=reward) and the step whose policy it measured (stat=step)",
            ),
            &["namespace", "rolloutjob", "stat"],
        )?;
        Ok(Self {
            sessions,
            results,
            held_out,
            rewards: Mutex::default(),
        })
    }

    /// What a registry holds of these (the reward summary is rendered by [`Self::render_rewards`]).
    pub fn collectors(&self) -> [Box<dyn Collector>; 3] {
        [
            Box::new(self.sessions.clone()),
            Box::new(self.results.clone()),
            Box::new(self.held_out.clone()),
        ]
    }

    /// A held-out round of a job is complete: the step it measured, its pass rate and mean
    /// reward, together. A round with nothing scored leaves the last round's three as they
    /// were (its step beside another round's figures would be read as that step's), and so
    /// does a round of an earlier step completing late (a local run's retried session).
    pub fn set_held_out(
        &self,
        namespace: &str,
        job: &str,
        step: u64,
        pass_rate: Option<f64>,
        reward: Option<f64>,
    ) {
        let (Some(p), Some(r)) = (pass_rate, reward) else {
            return;
        };
        let gauge = |stat: &str| self.held_out.with_label_values(&[namespace, job, stat]);
        let shown = gauge("step");
        if shown.get() > step as f64 {
            return;
        }
        shown.set(step as f64);
        gauge("pass_rate").set(p);
        gauge("reward").set(r);
    }

    /// A job's session counts.
    pub fn set_sessions(
        &self,
        namespace: &str,
        job: &str,
        s: &floe_crds::rollout_job::SessionCounts,
    ) {
        for (state, n) in
            SESSION_STATES
                .into_iter()
                .zip([s.pending, s.running, s.succeeded, s.failed])
        {
            self.sessions
                .with_label_values(&[namespace, job, state])
                .set(i64::from(n));
        }
        // Every result's counter exists from the job's first count, at 0: a counter whose first
        // sample is already 1 shows no increase() to Prometheus, so a job's first failures would
        // never reach FloeSessionFailuresHigh.
        for result in SessionResult::ALL {
            self.results
                .with_label_values(&[namespace, job, result.label()])
                .inc_by(0);
        }
    }

    /// A session attempt of a job ended so.
    pub fn session_result(&self, namespace: &str, job: &str, result: SessionResult) {
        self.results
            .with_label_values(&[namespace, job, result.label()])
            .inc();
    }

    /// A job's reward tally: scored sessions and the sum of their rewards.
    pub fn set_rewards(&self, namespace: &str, job: &str, scored: u64, sum: f64) {
        let mut r = floe_gateway::sync::lock(&self.rewards);
        r.insert((namespace.to_string(), job.to_string()), (scored, sum));
    }

    /// A deleted job's series go.
    pub fn forget(&self, namespace: &str, job: &str) {
        floe_gateway::sync::lock(&self.rewards).remove(&(namespace.to_string(), job.to_string()));
        for state in SESSION_STATES {
            let _ = self.sessions.remove_label_values(&[namespace, job, state]);
        }
        for result in SessionResult::ALL {
            let _ = self
                .results
                .remove_label_values(&[namespace, job, result.label()]);
        }
        for stat in ["pass_rate", "reward", "step"] {
            let _ = self.held_out.remove_label_values(&[namespace, job, stat]);
        }
    }

    /// Every job's series (this replica no longer leads: another says them now). The result
    /// counters too: a standby never counts, and kept they would outlive a job deleted while
    /// another replica leads, as series no one forgets (the leader counts from its own 0).
    pub fn forget_all(&self) {
        floe_gateway::sync::lock(&self.rewards).clear();
        self.sessions.reset();
        self.held_out.reset();
        self.results.reset();
    }

    /// The reward summary in the text format (the prometheus crate has no summary type; a
    /// summary without quantiles is sum + count).
    pub fn render_rewards(&self, text: &mut String) {
        let r = floe_gateway::sync::lock(&self.rewards);
        if r.is_empty() {
            return;
        }
        text.push_str("# HELP floe_session_reward Rewards of scored sessions\n");
        text.push_str("# TYPE floe_session_reward summary\n");
        for ((ns, job), (count, sum)) in r.iter() {
            let labels = format!(
                "namespace=\"{}\",rolloutjob=\"{}\"",
                escape(ns),
                escape(job)
            );
            text.push_str(&format!("floe_session_reward_sum{{{labels}}} {sum}\n"));
            text.push_str(&format!("floe_session_reward_count{{{labels}}} {count}\n"));
        }
    }
}

/// A label value as the text format writes it.
pub fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
