//! The live view of a local run: one redrawn status line on a terminal, one plain line per
//! finished session otherwise (CI logs, pipes); a table at the end.

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::time::Instant;

use floe_operator::job_series::SessionResult as Outcome;

use super::metrics::RunMetrics;
use super::report::{RunSummary, SessionResult};

pub struct Progress {
    tty: bool,
    total: usize,
    done: usize,
    failed: usize,
    running: usize,
    retried: usize,
    reward_sum: f64,
    scored: usize,
    sampled_tokens: u64,
    started: Instant,
    /// `--metrics-listen`: the same counts, for Prometheus.
    metrics: Option<Arc<RunMetrics>>,
}

impl Progress {
    pub fn new(total: usize) -> Self {
        Self {
            tty: std::io::stderr().is_terminal(),
            total,
            done: 0,
            failed: 0,
            running: 0,
            retried: 0,
            reward_sum: 0.0,
            scored: 0,
            sampled_tokens: 0,
            started: Instant::now(),
            metrics: None,
        }
    }

    /// Keep `metrics` up to date from now on.
    pub fn export(&mut self, metrics: Arc<RunMetrics>) {
        self.metrics = Some(metrics);
        self.count(None);
    }

    /// The counts into the metrics, with the result of the attempt that just ended.
    fn count(&self, ended: Option<Outcome>) {
        let Some(m) = &self.metrics else { return };
        let n = |v: usize| i32::try_from(v).unwrap_or(i32::MAX);
        let counts = floe_crds::rollout_job::SessionCounts {
            total: n(self.total),
            pending: n(self.total.saturating_sub(self.done + self.running)),
            running: n(self.running),
            succeeded: n(self.done.saturating_sub(self.failed)),
            failed: n(self.failed),
            retried: n(self.retried),
        };
        if let Some(outcome) = ended {
            m.result(outcome);
        }
        m.set(&counts, self.scored as u64, self.reward_sum);
    }

    pub fn started(&mut self) {
        self.running += 1;
        self.count(None);
        self.draw();
    }

    /// Sessions an earlier run finished (`--resume`), counted as they ended then (a failed
    /// one is not a succeeded one now).
    pub fn resumed<'a>(&mut self, done: impl IntoIterator<Item = &'a SessionResult>) {
        for result in done {
            self.done += 1;
            self.tally(result);
        }
        self.count(None);
    }

    /// A finished session's reward and failure into the counts; whether it failed
    /// (by infrastructure, or with no summary: the runner reported nothing, not the policy's
    /// result).
    fn tally(&mut self, result: &SessionResult) -> bool {
        let failed = match &result.summary {
            Some(s) => {
                if let Some(r) = s.reward {
                    self.reward_sum += r;
                    self.scored += 1;
                }
                super::queue::is_infrastructure(&s.status)
            }
            None => true,
        };
        self.failed += usize::from(failed);
        failed
    }

    /// An attempt failed by infrastructure and runs again as `retry`.
    pub fn retrying(&mut self, session: &str, result: &SessionResult, retry: &str) {
        self.running = self.running.saturating_sub(1);
        self.retried += 1;
        self.count(Some(Outcome::Retried));
        if let Some(s) = &result.summary {
            self.clear();
            eprintln!(
                "[retry] {session}: {}{}; runs again as {retry}",
                s.status,
                s.error
                    .as_ref()
                    .map(|e| format!(" ({e})"))
                    .unwrap_or_default()
            );
        }
        self.draw();
    }

    /// A held-out round is complete: its line, and its figures for Prometheus.
    pub fn held_out(&self, round: &super::held_out::RoundReport) {
        self.clear();
        eprintln!("{}", super::held_out::line(round));
        if let Some(m) = &self.metrics {
            m.held_out(round.step, round.pass_rate, round.reward_mean);
        }
        self.draw();
    }

    pub fn finished(&mut self, session: &str, result: &SessionResult) {
        self.running = self.running.saturating_sub(1);
        self.done += 1;
        let failed = self.tally(result);
        // This run's tokens only: the rate is over this process's time.
        self.sampled_tokens += result.summary.as_ref().map_or(0, |s| s.sampled_tokens);
        if let (false, Some(s)) = (self.tty, &result.summary) {
            let reward = s.reward.map_or("-".to_string(), |r| format!("{r}"));
            eprintln!(
                "[{}/{}] {session}: {} reward {reward} ({:.1} s, {} calls){}",
                self.done,
                self.total,
                s.status,
                result.wall_seconds,
                s.completions,
                s.error
                    .as_ref()
                    .map(|e| format!(": {e}"))
                    .unwrap_or_default()
            );
        }
        self.count(Some(if failed {
            Outcome::Failed
        } else {
            Outcome::Scored
        }));
        self.draw();
    }

    fn draw(&self) {
        if !self.tty {
            return;
        }
        let width = 24;
        let filled = (self.done * width).checked_div(self.total).unwrap_or(0);
        let elapsed = self.started.elapsed().as_secs_f64().max(1e-9);
        let reward = if self.scored > 0 {
            format!("{:.2}", self.reward_sum / self.scored as f64)
        } else {
            "-".into()
        };
        let mut err = std::io::stderr().lock();
        let _ = write!(
            err,
            "\r\x1b[2K[{}{}] {}/{} done · {} running · {} failed · reward {reward} · {:.0} tok/s · {:.0}s",
            "#".repeat(filled),
            ".".repeat(width - filled),
            self.done,
            self.total,
            self.running,
            self.failed,
            self.sampled_tokens as f64 / elapsed,
            elapsed
        );
        let _ = err.flush();
    }

    /// The run stops (`why`, said on stderr): every running session is cancelled, and this
    /// returns once each has ended.
    /// Stop every running session. Those whose task had returned before the stop came are
    /// returned, to be counted as they ended.
    pub async fn cancel<T: 'static>(
        &self,
        running: &mut tokio::task::JoinSet<T>,
        why: &str,
    ) -> Vec<T> {
        self.clear();
        eprintln!("floe run: {why}");
        running.abort_all();
        let mut ended = Vec::new();
        while let Some(joined) = running.join_next().await {
            ended.extend(joined.ok());
        }
        ended
    }

    pub fn clear(&self) {
        if self.tty {
            eprint!("\r\x1b[2K");
        }
    }
}

/// What the table adds to the calls' count: those the harness abandoned, those of a class the
/// job does not train on, and the calls by what the harness said each is for.
fn calls_said(tokens: &super::report::Tokens) -> String {
    let mut said = match tokens.abandoned_calls {
        0 => String::new(),
        n => format!(" · {n} abandoned by the harness, not trained"),
    };
    if tokens.excluded_calls > 0 {
        let n = tokens.excluded_calls;
        said.push_str(&format!(" · {n} of an excluded class, not trained"));
    }
    if !tokens.calls_by_class.is_empty() {
        let classes: Vec<String> = tokens
            .calls_by_class
            .iter()
            .map(|(class, n)| format!("{n} {class}"))
            .collect();
        said.push_str(&format!(" · by class: {}", classes.join(", ")));
    }
    said
}

/// The final table, for people (the same numbers are in `summary.json`).
pub fn table(summary: &RunSummary) -> String {
    let s = &summary.sessions;
    let fmt = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.3}"));
    let mut out = format!(
        "job {} ({}){}\n\
         sessions  {} total: {} completed, {} agent failed, {} agent timeout, {} infra error, {} evaluator timeout, {} not finished\n\
         reward    mean {} · pass rate {} over {} scored\n\
         tokens    {} sampled ({} trainable) in {} calls{}\n\
         dataset   {}: {} accepted, {} rejected\n\
         time      {:.1} s wall · {:.2} sessions/min · per session: agent {:.1} s, evaluator {:.1} s, floe overhead {:.2} s (max {:.2} s)\n",
        summary.job,
        summary.mode,
        if summary.interrupted { " — interrupted" } else { "" },
        s.total, s.completed, s.agent_failed, s.agent_timeout, s.infra_error, s.evaluator_timeout, s.not_finished,
        fmt(summary.reward.mean), fmt(summary.reward.pass_rate), summary.reward.scored,
        summary.tokens.sampled, summary.tokens.trainable, summary.tokens.completions,
        calls_said(&summary.tokens),
        summary.dataset.file, summary.dataset.accepted, summary.dataset.rejected,
        summary.timings.wall_seconds, summary.timings.sessions_per_minute,
        summary.timings.agent_seconds_mean, summary.timings.evaluator_seconds_mean,
        summary.timings.overhead_seconds_mean, summary.timings.overhead_seconds_max,
    );
    if let Some(t) = &summary.training {
        let steps = t["steps"].as_array().map(Vec::as_slice).unwrap_or(&[]);
        let reward = |s: Option<&serde_json::Value>| fmt(s.and_then(|s| s["rewardMean"].as_f64()));
        out.push_str(&format!(
            "training  {} steps · policy v{} · step reward {} → {} · dropped {} · final model {} · {}\n",
            steps.len(),
            t["policyVersion"],
            reward(steps.first()),
            reward(steps.last()),
            t["dropped"],
            t["finalModel"].as_str().unwrap_or("-"),
            t["rewardCurve"].as_str().unwrap_or("-"),
        ));
        let rounds: Vec<String> = t["heldOut"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| format!("step {} {}", r["step"], fmt(r["passRate"].as_f64())))
            .collect();
        if !rounds.is_empty() {
            out.push_str(&format!("held-out  pass rate {}\n", rounds.join(" → ")));
        }
    }
    out.push_str(&format!(
        "{:<32} {:>7} {:>8} {:>9}\n",
        "task", "scored", "reward", "pass rate"
    ));
    for (task, r) in &summary.tasks {
        out.push_str(&format!(
            "{:<32} {:>7} {:>8} {:>9}\n",
            task,
            r.scored,
            fmt(r.mean),
            fmt(r.pass_rate)
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_without_a_summary_is_failed_in_both_the_counts_and_the_results() {
        let metrics = Arc::new(RunMetrics::new("ns", "j").expect("metrics"));
        let mut progress = Progress::new(1);
        progress.export(metrics.clone());
        progress.started();
        let nothing = SessionResult {
            task: "t".into(),
            summary: None,
            wall_seconds: 1.0,
        };
        progress.finished("j-t-0", &nothing);
        let page = metrics.page("", None);
        for line in [
            "floe_sessions{namespace=\"ns\",rolloutjob=\"j\",state=\"failed\"} 1",
            "floe_sessions{namespace=\"ns\",rolloutjob=\"j\",state=\"succeeded\"} 0",
            "floe_session_results_total{namespace=\"ns\",result=\"failed\",rolloutjob=\"j\"} 1",
        ] {
            assert!(page.lines().any(|l| l == line), "{line} not in:\n{page}");
        }
    }

    #[test]
    fn a_resumed_run_counts_the_earlier_runs_failures_as_failed_and_its_rewards() {
        let metrics = Arc::new(RunMetrics::new("ns", "j").expect("metrics"));
        let mut progress = Progress::new(4);
        progress.export(metrics.clone());
        let ended = |status: &str, reward: Option<f64>| SessionResult {
            task: "t".into(),
            summary: Some(floe_sandbox::summary::Summary {
                status: status.into(),
                reward,
                ..Default::default()
            }),
            wall_seconds: 1.0,
        };
        let earlier = [
            ended("completed", Some(1.0)),
            ended("infra_error", None),
            ended("agent_failed", Some(0.0)),
        ];
        progress.resumed(&earlier);
        let page = metrics.page("", None);
        for line in [
            "floe_sessions{namespace=\"ns\",rolloutjob=\"j\",state=\"succeeded\"} 2",
            "floe_sessions{namespace=\"ns\",rolloutjob=\"j\",state=\"failed\"} 1",
            "floe_sessions{namespace=\"ns\",rolloutjob=\"j\",state=\"pending\"} 1",
        ] {
            assert!(page.lines().any(|l| l == line), "{line} not in:\n{page}");
        }
        assert_eq!((progress.scored, progress.reward_sum), (2, 1.0));
    }
}
