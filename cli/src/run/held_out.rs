//! Held-out rounds of a local train run (`train.heldOut`), pure: which sessions a round runs,
//! when a round is due, and its pass rate once its sessions are in.
//!
//! A round samples every held-out task `samples` times with the policy of one step: before
//! training (version 0), when the trainer's version reaches each multiple of `everySteps`, and
//! at the final version once the trainer has trained everything. A round is labelled with the
//! version the trainer had when it opened (a read that skips from 9 to 11 with `everySteps`
//! 5 opens a round at 11, the next due at 15). Its sessions go ahead of training sessions not
//! yet started, but training does not wait for them: a step can land while a round runs, so
//! each round also reports the versions its calls were sampled with.
//!
//! Held-out attempts share the run's queue and slots: their indices follow the training
//! sessions' (`base + round × per_round + j`, `j` task-major over samples).

use std::collections::BTreeMap;

use floe_crds::rollout_job::{HeldOutRound, HeldOutSpec, Task};
use serde::Serialize;

use super::queue::Attempt;
use super::report::SessionResult;

pub struct HeldOut {
    tasks: Vec<Task>,
    samples: u32,
    every: u64,
    /// The training sessions' count: held-out indices start here.
    base: usize,
    /// The lowest version whose round has not been opened.
    next_step: u64,
    rounds: Vec<Round>,
    /// Each held-out session's first attempt this run (a resumed run may skip ids taken), so
    /// its retries are counted from there; and the attempts running now.
    first_attempts: BTreeMap<usize, u32>,
    running: usize,
}

struct Round {
    step: u64,
    /// Opened for the trainer's final version.
    last: bool,
    /// Each session's last attempt's result, by its place `j` in the round.
    results: BTreeMap<usize, SessionResult>,
}

/// One round, as summary.json and the reward curve show it.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RoundReport {
    /// The step whose policy the round measures (version `step`).
    pub step: u64,
    /// The round at the trainer's final version.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub last: bool,
    pub sessions: usize,
    pub scored: usize,
    pub passed: usize,
    pub pass_rate: Option<f64>,
    pub reward_mean: Option<f64>,
    /// Sessions that failed by infrastructure (not in the pass rate).
    pub infra_errors: usize,
    /// The lowest and highest policy version that sampled a call of the round.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy_versions: Option<[u64; 2]>,
}

impl HeldOut {
    pub fn new(spec: &HeldOutSpec, tasks: Vec<Task>, base: usize) -> Self {
        Self {
            tasks,
            samples: u32::try_from(spec.samples).unwrap_or(1).max(1),
            every: u64::try_from(spec.every_steps).unwrap_or(1).max(1),
            base,
            next_step: 0,
            rounds: Vec::new(),
            first_attempts: BTreeMap::new(),
            running: 0,
        }
    }

    fn per_round(&self) -> usize {
        self.tasks.len() * self.samples as usize
    }

    /// Is this attempt index a held-out session's?
    pub fn owns(&self, index: usize) -> bool {
        index >= self.base
    }

    /// The round due at trainer version `version`, if one is: its attempts, to run first.
    pub fn due(&mut self, version: u64) -> Vec<Attempt> {
        if version < self.next_step {
            return Vec::new();
        }
        self.next_step = (version / self.every + 1).saturating_mul(self.every);
        self.open(version, false)
    }

    /// The round at the final version, unless the last round already measured it.
    pub fn last(&mut self, version: u64) -> Vec<Attempt> {
        if let Some(r) = self.rounds.last_mut().filter(|r| r.step == version) {
            r.last = true;
            return Vec::new();
        }
        self.next_step = u64::MAX;
        self.open(version, true)
    }

    fn open(&mut self, step: u64, last: bool) -> Vec<Attempt> {
        let first = self.base + self.rounds.len() * self.per_round();
        self.rounds.push(Round {
            step,
            last,
            results: BTreeMap::new(),
        });
        (first..first + self.per_round())
            .map(|index| Attempt { index, attempt: 0 })
            .collect()
    }

    /// The round of a held-out index and its place `j` in the round.
    fn slot(&self, index: usize) -> Option<(usize, usize)> {
        let within = index.checked_sub(self.base)?;
        let per_round = self.per_round().max(1);
        Some((within / per_round, within % per_round))
    }

    /// The step, task and sample an attempt index runs.
    pub fn session(&self, index: usize) -> Option<(u64, &Task, u32)> {
        let (round, j) = self.slot(index)?;
        let task = self.tasks.get(j / self.samples as usize)?;
        let sample = (j % self.samples as usize) as u32;
        Some((self.rounds.get(round)?.step, task, sample))
    }

    /// Attempt `attempt` of held-out session `index` started.
    pub fn started(&mut self, index: usize, attempt: u32) {
        self.first_attempts.entry(index).or_insert(attempt);
        self.running += 1;
    }

    /// An attempt of session `index` ended: the attempt the session started at this run
    /// (its retries count from there).
    pub fn attempt_ended(&mut self, index: usize) -> u32 {
        self.running = self.running.saturating_sub(1);
        self.first_attempts.get(&index).copied().unwrap_or(0)
    }

    /// Held-out attempts running now (they hold slots, not the trainer's batches).
    pub fn running(&self) -> usize {
        self.running
    }

    /// A session's last attempt ended: its round's report, once the round is complete.
    pub fn ended(&mut self, index: usize, result: SessionResult) -> Option<RoundReport> {
        let (round, j) = self.slot(index)?;
        let expected = self.per_round();
        let round = self.rounds.get_mut(round)?;
        round.results.insert(j, result);
        (round.results.len() == expected).then(|| report(round, expected))
    }

    /// Take back the rounds an interrupted run measured (`floe run --resume`; [`read_rounds`]),
    /// before any round of this run opens, with the trainer at `version`. The rounds keep
    /// their steps, so no later round measures a step again. A round of `version` itself that
    /// was cut short measures the same weights still: its missing sessions are returned, to
    /// run first, and so are those whose last attempt failed by infrastructure (the stop came
    /// before their retry). One of an earlier version stays short (its policy is gone).
    pub fn restore(&mut self, earlier: Rounds, version: u64) -> Vec<Attempt> {
        let mut missing = Vec::new();
        for (step, mut results) in earlier {
            let first = self.base + self.rounds.len() * self.per_round();
            if step == version {
                // Its infrastructure failures run again: their results are superseded, and
                // the round is complete once every place has one again.
                results.retain(|_, r| {
                    r.summary
                        .as_ref()
                        .is_some_and(|s| !super::queue::is_infrastructure(&s.status))
                });
                missing.extend(
                    (0..self.per_round())
                        .filter(|j| !results.contains_key(j))
                        .map(|j| Attempt {
                            index: first + j,
                            attempt: 0,
                        }),
                );
            }
            self.next_step = (step / self.every + 1).saturating_mul(self.every);
            self.rounds.push(Round {
                step,
                last: false,
                results,
            });
        }
        missing
    }

    /// Every round so far, complete or not (an interrupted run reports what it has).
    pub fn reports(&self) -> Vec<RoundReport> {
        self.rounds
            .iter()
            .map(|r| report(r, self.per_round()))
            .collect()
    }
}

/// Held-out results by round step, then by place `j` in the round.
pub type Rounds = BTreeMap<u64, BTreeMap<usize, SessionResult>>;

fn report(round: &Round, sessions: usize) -> RoundReport {
    let summaries = || round.results.values().filter_map(|r| r.summary.as_ref());
    let rewards: Vec<f64> = summaries().filter_map(|s| s.reward).collect();
    let scored = rewards.len();
    let passed = summaries()
        .filter(|s| s.reward.is_some() && s.passed == Some(true))
        .count();
    let versions = summaries().filter_map(|s| s.policy_versions);
    let first = versions.clone().map(|v| v[0]).min();
    let high = versions.map(|v| v[1]).max();
    let mean = |n: f64| (scored > 0).then(|| n / scored as f64);
    RoundReport {
        step: round.step,
        last: round.last,
        sessions,
        scored,
        passed,
        pass_rate: mean(passed as f64),
        reward_mean: mean(rewards.iter().sum()),
        infra_errors: round.results.len() - scored,
        policy_versions: first.zip(high).map(|(a, b)| [a, b]),
    }
}

/// One line for the run's log, as the operator's Event says a round on a cluster.
pub fn line(r: &RoundReport) -> String {
    let count = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
    let round = HeldOutRound {
        step: i64::try_from(r.step).unwrap_or(i64::MAX),
        last: r.last,
        sessions: count(r.sessions),
        scored: count(r.scored),
        passed: count(r.passed),
        infra_errors: count(r.infra_errors),
        pass_rate: r.pass_rate,
        reward_mean: r.reward_mean,
        policy_versions: r
            .policy_versions
            .map(|v| {
                v.iter()
                    .map(|x| i64::try_from(*x).unwrap_or(i64::MAX))
                    .collect()
            })
            .unwrap_or_default(),
        ..Default::default()
    };
    format!("[held-out] {}", round.line())
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use floe_sandbox::summary::Summary;

    fn held_out(tasks: usize, samples: i32, every: i32) -> HeldOut {
        let spec = HeldOutSpec {
            tasks: Default::default(),
            every_steps: every,
            samples,
        };
        let tasks = (0..tasks)
            .map(|i| {
                serde_json::from_value(
                    serde_json::json!({"id": format!("h{i}"), "instruction": "x"}),
                )
                .expect("a task")
            })
            .collect();
        HeldOut::new(&spec, tasks, 100)
    }

    /// A held-out session's result: scored `reward`, or an infrastructure failure (`None`).
    pub(in crate::run) fn result(reward: Option<f64>, versions: [u64; 2]) -> SessionResult {
        SessionResult {
            task: "h".into(),
            summary: Some(Summary {
                status: if reward.is_some() {
                    "completed"
                } else {
                    "infra_error"
                }
                .into(),
                reward,
                passed: reward.map(|r| r >= 1.0),
                policy_versions: Some(versions),
                ..Default::default()
            }),
            wall_seconds: 1.0,
        }
    }

    #[test]
    fn rounds_come_at_version_zero_each_multiple_and_the_final_version() {
        let mut h = held_out(2, 2, 3);
        let first = h.due(0);
        assert_eq!(first.len(), 4);
        assert_eq!(first[0].index, 100);
        assert!(h.due(0).is_empty() && h.due(2).is_empty());
        // A read at version 7 (the trainer went past 3 and 6 between reads): one round,
        // labelled 7, the version its sessions sample; the next is due at 9.
        let second = h.due(7);
        assert_eq!(second[0].index, 104);
        assert_eq!(
            h.session(104).map(|(step, t, s)| (step, t.id.as_str(), s)),
            Some((7, "h0", 0))
        );
        assert_eq!(
            h.session(107).map(|(step, t, s)| (step, t.id.as_str(), s)),
            Some((7, "h1", 1))
        );
        assert!(h.due(8).is_empty());
        assert_eq!(h.due(9).len(), 4);
        // The final version 10 gets its own round; a final version already measured does not.
        assert_eq!(h.last(10).len(), 4);
        assert!(h.due(12).is_empty(), "no round after the final one");
        // Retries count from the attempt a session started at this run; slots held.
        h.started(100, 2);
        h.started(100, 3);
        assert_eq!(h.running(), 2);
        assert_eq!(h.attempt_ended(100), 2);
        assert_eq!(h.running(), 1);
        let mut measured = held_out(1, 1, 2);
        measured.due(0);
        measured.due(2);
        assert!(measured.last(2).is_empty());
        assert!(measured.reports()[1].last);
        assert!(h.owns(100) && !h.owns(99));
    }

    #[test]
    fn a_round_reports_once_all_its_sessions_are_in_and_infrastructure_is_not_a_fail() {
        let mut h = held_out(2, 1, 1);
        h.due(0);
        h.due(1);
        assert_eq!(h.ended(100, result(Some(1.0), [0, 0])), None);
        let r = h
            .ended(101, result(None, [0, 1]))
            .expect("round 0 complete");
        assert_eq!(
            r,
            RoundReport {
                step: 0,
                last: false,
                sessions: 2,
                scored: 1,
                passed: 1,
                pass_rate: Some(1.0),
                reward_mean: Some(1.0),
                infra_errors: 1,
                policy_versions: Some([0, 1]),
            }
        );
        assert!(line(&r).contains("pass rate 1.000"), "{}", line(&r));
        assert!(line(&r).contains("v0–v1") && line(&r).contains("1 infrastructure"));
        h.ended(102, result(Some(0.0), [1, 1]));
        let r = h.ended(103, result(Some(0.5), [2, 2])).expect("round 1");
        assert_eq!((r.step, r.passed, r.scored), (1, 0, 2));
        assert_eq!(r.reward_mean, Some(0.25));
        assert_eq!(r.pass_rate, Some(0.0));
        assert_eq!(h.reports().len(), 2);
    }

    /// `floe run --resume`: the rounds the interrupted run measured stay in the summary and
    /// keep the cadence; a round of the trainer's current version cut short is completed with
    /// the same weights, one of an earlier version is left as it was.
    #[test]
    fn a_resumed_run_keeps_the_rounds_measured_before_it() {
        let mut h = held_out(3, 1, 5);
        let mut earlier = Rounds::new();
        for (j, reward) in [0.0, 1.0, 1.0].into_iter().enumerate() {
            earlier
                .entry(0)
                .or_default()
                .insert(j, result(Some(reward), [0, 0]));
        }
        // Round 5: place 0 never ran, place 1 scored, place 2 failed by infrastructure (the
        // stop came before its retry).
        let five = earlier.entry(5).or_default();
        five.insert(1, result(Some(1.0), [5, 5]));
        five.insert(2, result(None, [5, 5]));
        let missing = h.restore(earlier.clone(), 5);
        assert_eq!(
            missing.iter().map(|a| a.index).collect::<Vec<_>>(),
            [103, 105]
        );
        assert_eq!(
            h.session(103).map(|(step, t, _)| (step, t.id.as_str())),
            Some((5, "h0"))
        );
        assert!(h.due(5).is_empty() && h.due(9).is_empty(), "5 is measured");
        assert!(h.ended(103, result(Some(1.0), [5, 5])).is_none());
        let report = h
            .ended(105, result(Some(0.0), [5, 5]))
            .expect("round 5 complete");
        assert_eq!(
            (
                report.step,
                report.passed,
                report.scored,
                report.infra_errors
            ),
            (5, 2, 3, 0)
        );
        assert_eq!(h.due(10).first().map(|a| a.index), Some(106));
        let steps: Vec<(u64, Option<f64>)> =
            h.reports().iter().map(|r| (r.step, r.pass_rate)).collect();
        assert_eq!(
            steps,
            [(0, Some(2.0 / 3.0)), (5, Some(2.0 / 3.0)), (10, None)]
        );
        // The trainer is past round 5's version: it stays as it was; so it does when the
        // trainer's version could not be read.
        for version in [7, u64::MAX] {
            let mut later = held_out(3, 1, 5);
            assert!(later.restore(earlier.clone(), version).is_empty());
            assert!(later.due(7).is_empty());
            let five = &later.reports()[1];
            assert_eq!((five.scored, five.infra_errors), (1, 1));
        }
    }
}
