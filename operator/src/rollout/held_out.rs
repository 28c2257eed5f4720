//! Held-out rounds of a train job on a cluster (`train.heldOut`), sans-IO: when a round opens,
//! which sessions it holds, and its tally — kept in the job's status like its own sessions, so
//! that an operator killed at any point neither loses nor double-counts a held-out result.
//!
//! The rule is `floe run`'s (`cli/src/run/held_out.rs`): a round at the trainer's version 0
//! before training, one each time the trainer's version reaches a multiple of `everySteps`,
//! and one at the final version once the trainer has trained everything (or the last round is
//! marked final when it already measured that version). A round is labelled with the version
//! the trainer had when it opened, and it is opened in the same status write as the round's
//! folds, before any of its pods is claimed. Held-out sessions are numbered after the job's
//! own (`base + round × per_round + j`, `j` task-major over samples); they go ahead of every
//! training session not started, pass no staleness gate, and ship their trajectories nowhere.

use std::ops::Range;

use floe_crds::rollout_job::{HeldOutRound, HeldOutStatus, RolloutJob, Task};

use super::indexes::IndexSet;

/// One round as the status records it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RoundTally {
    pub step: u64,
    /// The round at the trainer's final version.
    pub last: bool,
    /// Sessions scored, the sum of their rewards, and those that passed.
    pub scored: u32,
    pub sum: f64,
    pub passed: u32,
    /// Sessions that failed for good (not in the pass rate).
    pub infra_errors: u32,
    /// The lowest and highest policy version that sampled a call of the round.
    pub versions: Option<[u64; 2]>,
}

/// What the trainer said this round, for opening rounds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TrainerAt {
    pub version: u64,
    /// It trained everything and wrote its final model.
    pub finished: bool,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct HeldOutState {
    /// The job's own sessions: held-out indexes start here.
    pub base: u32,
    /// Held-out tasks × samples.
    pub per_round: u32,
    pub every: u64,
    pub rounds: Vec<RoundTally>,
    pub completed: IndexSet,
    pub failed: IndexSet,
    /// Set each reconcile from the trainer; `None`: unread, no round opens.
    pub trainer: Option<TrainerAt>,
    /// The held-out set's digest ([`digest`]), recorded with the rounds.
    pub digest: Option<String>,
}

impl HeldOutState {
    /// The job's held-out state from its spec and last status; `None` without `heldOut`.
    /// `tasks`: the held-out tasks' count; `base`: the job's own sessions.
    pub fn of(job: &RolloutJob, tasks: usize, base: u32) -> Option<Self> {
        let spec = job.spec.train.as_ref()?.held_out.as_ref()?;
        let samples = u32::try_from(spec.samples).unwrap_or(1).max(1);
        let status = job.status.as_ref().and_then(|s| s.held_out.as_ref());
        let parse =
            |s: Option<&String>| s.and_then(|t| IndexSet::parse(t).ok()).unwrap_or_default();
        Some(Self {
            base,
            per_round: u32::try_from(tasks)
                .unwrap_or(u32::MAX)
                .saturating_mul(samples),
            every: u64::try_from(spec.every_steps).unwrap_or(1).max(1),
            rounds: status
                .map(|s| s.rounds.iter().map(tally_of).collect())
                .unwrap_or_default(),
            completed: parse(status.and_then(|s| s.completed_indexes.as_ref())),
            failed: parse(status.and_then(|s| s.failed_indexes.as_ref())),
            trainer: None,
            digest: status.and_then(|s| s.tasks_digest.clone()),
        })
    }

    /// Is `index` a held-out session's?
    pub fn owns(&self, index: u32) -> bool {
        index >= self.base
    }

    /// The round and place `j` of a held-out index, if its round is open.
    pub fn slot(&self, index: u32) -> Option<(usize, u32)> {
        let offset = index.checked_sub(self.base)?;
        let round = usize::try_from(offset / self.per_round.max(1)).ok()?;
        (round < self.rounds.len()).then_some((round, offset % self.per_round.max(1)))
    }

    /// The indexes of round `round`.
    pub fn indexes(&self, round: usize) -> Range<u32> {
        let first = u32::try_from(round)
            .unwrap_or(u32::MAX)
            .saturating_mul(self.per_round)
            .saturating_add(self.base);
        first..first.saturating_add(self.per_round)
    }

    pub fn recorded(&self, index: u32) -> bool {
        self.completed.contains(index) || self.failed.contains(index)
    }

    /// Every session of round `round` is scored or failed for good.
    pub fn round_done(&self, round: usize) -> bool {
        self.indexes(round).all(|i| self.recorded(i))
    }

    /// The final round is open and every round is done.
    pub fn done(&self) -> bool {
        self.rounds.last().is_some_and(|r| r.last)
            && (0..self.rounds.len()).all(|r| self.round_done(r))
    }

    /// Open rounds' sessions neither done nor `holding` a pod, lowest index first.
    pub fn pending<'a>(
        &'a self,
        holding: &'a std::collections::BTreeSet<u32>,
    ) -> impl Iterator<Item = u32> + 'a {
        (0..self.rounds.len())
            .flat_map(|r| self.indexes(r))
            .filter(|i| !self.recorded(*i) && !holding.contains(i))
    }

    /// A held-out session scored `reward`, sampled by `versions`.
    pub fn scored(&mut self, index: u32, reward: f64, pass: f64, versions: Option<[u64; 2]>) {
        let Some((round, _)) = self.slot(index) else {
            return;
        };
        self.completed.insert(index);
        let r = &mut self.rounds[round];
        r.scored += 1;
        r.sum += reward;
        if reward >= pass {
            r.passed += 1;
        }
        if let Some([low, high]) = versions {
            r.versions = Some(match r.versions {
                Some([a, b]) => [a.min(low), b.max(high)],
                None => [low, high],
            });
        }
    }

    /// A held-out session failed for good.
    pub fn failed(&mut self, index: u32) {
        if let Some((round, _)) = self.slot(index) {
            self.failed.insert(index);
            self.rounds[round].infra_errors += 1;
        }
    }

    /// Open the round due now, or mark the last one final: `true` when the rounds changed.
    /// `training_done`: every session of the job's own is done.
    pub fn open_due(&mut self, training_done: bool) -> bool {
        let Some(trainer) = self.trainer else {
            return false;
        };
        if self.per_round == 0 || self.rounds.last().is_some_and(|r| r.last) {
            return false;
        }
        if training_done && trainer.finished {
            match self.rounds.last_mut() {
                Some(r) if r.step == trainer.version => r.last = true,
                _ => self.open(trainer.version, true),
            }
            return true;
        }
        let due = match self.rounds.last() {
            None => 0,
            Some(r) => (r.step / self.every + 1).saturating_mul(self.every),
        };
        if trainer.version < due {
            return false;
        }
        self.open(trainer.version, false);
        true
    }

    fn open(&mut self, step: u64, last: bool) {
        self.rounds.push(RoundTally {
            step,
            last,
            ..Default::default()
        });
    }

    /// The status's `heldOut`.
    pub fn status(&self) -> HeldOutStatus {
        let non_empty = |s: &IndexSet| (!s.is_empty()).then(|| s.to_string());
        HeldOutStatus {
            rounds: self
                .rounds
                .iter()
                .map(|r| round_status(r, self.per_round))
                .collect(),
            completed_indexes: non_empty(&self.completed),
            failed_indexes: non_empty(&self.failed),
            first_index: Some(i64::from(self.base)),
            tasks_digest: self.digest.clone(),
        }
    }
}

/// The digest of a held-out set: its tasks as the job reads them (whatever their source) and
/// `samples`.
pub fn digest(tasks: &[Task], samples: u32) -> String {
    let material = serde_json::json!({"tasks": tasks, "samples": samples});
    crate::stable_hash::of_json(&material)
}

/// The digest of a job's own tasks as they number its sessions: the tasks as the job reads them,
/// `samples` and `epochs` ([`floe_crds::rollout_job::RolloutJobStatus::tasks_digest`]).
pub fn job_tasks_digest(tasks: &[Task], samples: u32, epochs: u32) -> String {
    let material = serde_json::json!({"tasks": tasks, "samples": samples, "epochs": epochs});
    crate::stable_hash::of_json(&material)
}

/// Why the job's own sessions may not go on as numbered, when its tasks changed since the
/// first was claimed (`recorded`, the status's digest); `None` when they may.
pub fn tasks_changed(recorded: Option<&str>, digest: &str) -> Option<String> {
    let was = recorded.filter(|was| *was != digest)?;
    Some(format!(
        "the job's tasks changed after its first session (digest {was} then, {digest} now: \
         spec.tasks' source edited, or numSamples or epochs): sessions are numbered by task \
         order, so scored sessions would be taken for other tasks' and some tasks would never \
         run; restore them, or run the changed set as a new job (to go on with it knowingly, \
         remove status.tasksDigest)"
    ))
}

/// Why the held-out set may not be measured as it is now, when it or the job changed since
/// the rounds `recorded` began: a new size would move every later round's session indexes,
/// new contents would make the rounds measure two sets, and a new count of the job's own
/// sessions (`total`) would number some of them as held-out ones. `None` when it may.
pub fn set_changed(
    recorded: Option<&HeldOutStatus>,
    total: u32,
    per_round: u64,
    digest: &str,
) -> Option<String> {
    let recorded = recorded?;
    let first = recorded.rounds.first()?;
    if let Some(was) = recorded.first_index.filter(|was| *was != i64::from(total)) {
        return Some(format!(
            "the job now has {total} sessions of its own, but its held-out rounds are numbered \
             from {was} (its count when the first round opened): spec.train.epochs or the \
             job's task set changed after the first held-out round; restore it, or run the \
             changed job as a new one"
        ));
    }
    if u64::try_from(first.sessions).ok() != Some(per_round) {
        return Some(format!(
            "spec.train.heldOut now makes {per_round} sessions a round, but its rounds so far \
             had {}: its tasks or samples changed after the first round; restore them, or run \
             the changed set as a new job",
            first.sessions
        ));
    }
    let was = recorded
        .tasks_digest
        .as_deref()
        .filter(|was| *was != digest)?;
    Some(format!(
        "spec.train.heldOut's tasks changed after the first round (digest {was} then, {digest} \
         now): later rounds would measure another set than the first; restore them, or run the \
         changed set as a new job (to go on with it knowingly, remove \
         status.heldOut.tasksDigest)"
    ))
}

fn tally_of(r: &HeldOutRound) -> RoundTally {
    let count = |n: i32| u32::try_from(n).unwrap_or(0);
    let version = |i: usize| {
        r.policy_versions
            .get(i)
            .and_then(|v| u64::try_from(*v).ok())
    };
    RoundTally {
        step: u64::try_from(r.step).unwrap_or(0),
        last: r.last,
        scored: count(r.scored),
        sum: r.reward_sum,
        passed: count(r.passed),
        infra_errors: count(r.infra_errors),
        versions: version(0).zip(version(1)).map(|(a, b)| [a, b]),
    }
}

fn round_status(r: &RoundTally, sessions: u32) -> HeldOutRound {
    let count = |n: u32| i32::try_from(n).unwrap_or(i32::MAX);
    let scored = r.scored;
    let of = |n: f64| (scored > 0).then(|| n / f64::from(scored));
    HeldOutRound {
        step: i64::try_from(r.step).unwrap_or(i64::MAX),
        last: r.last,
        sessions: count(sessions),
        scored: count(scored),
        passed: count(r.passed),
        reward_sum: r.sum,
        infra_errors: count(r.infra_errors),
        pass_rate: of(f64::from(r.passed)),
        reward_mean: of(r.sum),
        policy_versions: r
            .versions
            .map(|v| {
                v.iter()
                    .map(|x| i64::try_from(*x).unwrap_or(i64::MAX))
                    .collect()
            })
            .unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_jobs_own_tasks_changed_is_said_against_their_recorded_digest() {
        let task = |id: &str| -> Task {
            serde_json::from_value(serde_json::json!({"id": id, "instruction": "x"}))
                .expect("a task")
        };
        let set = vec![task("a"), task("b")];
        let d = job_tasks_digest(&set, 2, 1);
        assert_eq!(
            tasks_changed(None, &d),
            None,
            "nothing recorded: nothing to compare"
        );
        assert_eq!(tasks_changed(Some(&d), &d), None);
        for other in [
            job_tasks_digest(&set[1..], 2, 1),
            job_tasks_digest(&[task("b"), task("a")], 2, 1),
            job_tasks_digest(&set, 3, 1),
            job_tasks_digest(&set, 2, 2),
        ] {
            let why = tasks_changed(Some(&d), &other).unwrap_or_default();
            assert!(
                why.contains(&format!("digest {d} then, {other} now")),
                "{why}"
            );
        }
    }

    use super::super::aux_gate::Gate;
    use super::super::plan::{plan, Fold, JobState, PodProgress, PodResult, SessionPod};
    use super::*;
    use floe_crds::rollout_job::{StalenessGate, TrainerState};

    fn state(every: u64) -> HeldOutState {
        HeldOutState {
            base: 10,
            per_round: 4,
            every,
            ..Default::default()
        }
    }

    fn at(s: &mut HeldOutState, version: u64, finished: bool) {
        s.trainer = Some(TrainerAt { version, finished });
    }

    #[test]
    fn rounds_open_at_zero_at_each_multiple_reached_and_at_the_final_version() {
        let mut s = state(5);
        assert!(!s.open_due(false), "an unread trainer opens nothing");
        at(&mut s, 0, false);
        assert!(s.open_due(false));
        assert!(!s.open_due(false), "once per multiple");
        at(&mut s, 4, false);
        assert!(!s.open_due(false));
        // A read that skipped 5: the round is labelled with the version it opened at.
        at(&mut s, 7, false);
        assert!(s.open_due(false));
        at(&mut s, 9, false);
        assert!(!s.open_due(false), "the next is due at 10");
        // The trainer finished before training was done: no final round yet.
        at(&mut s, 9, true);
        assert!(!s.open_due(false));
        assert!(s.open_due(true));
        let steps: Vec<_> = s.rounds.iter().map(|r| (r.step, r.last)).collect();
        assert_eq!(steps, [(0, false), (7, false), (9, true)]);
        assert!(!s.open_due(true), "nothing after the final round");
        assert_eq!(s.indexes(2), 18..22);
        assert_eq!(s.slot(19), Some((2, 1)));
        assert_eq!(s.slot(22), None, "a round not opened");
        assert_eq!(s.slot(9), None, "the job's own session");
    }

    #[test]
    fn a_round_that_measured_the_final_version_is_marked_final_not_repeated() {
        let mut s = state(5);
        at(&mut s, 5, false);
        assert!(s.open_due(false));
        at(&mut s, 5, true);
        assert!(s.open_due(true));
        assert_eq!(s.rounds.len(), 1);
        assert!(s.rounds[0].last);
    }

    #[test]
    fn the_tally_survives_the_status_and_the_rounds_complete() {
        let mut s = state(5);
        at(&mut s, 0, true);
        assert!(
            s.open_due(true),
            "no training left: the first round is the final one"
        );
        s.scored(10, 1.0, 1.0, Some([0, 0]));
        s.scored(11, 0.5, 1.0, Some([0, 1]));
        s.failed(12);
        assert!(!s.done());
        assert_eq!(
            s.pending(&[13].into()).collect::<Vec<_>>(),
            Vec::<u32>::new()
        );
        s.scored(13, 0.0, 1.0, None);
        assert!(s.done());
        s.digest = Some(digest(&[], 4));
        let st = s.status();
        let r = &st.rounds[0];
        assert_eq!((r.scored, r.passed, r.infra_errors), (3, 1, 1));
        assert_eq!(r.pass_rate, Some(1.0 / 3.0));
        assert_eq!(r.policy_versions, [0, 1]);
        assert_eq!(st.completed_indexes.as_deref(), Some("10-11,13"));
        assert_eq!(
            r.line(),
            "step 0 (final): pass rate 0.333 · reward 0.500 over 3 of 4 sessions (sampled by v0–v1) · 1 infrastructure failures"
        );
        // Read back from the status as written.
        let job: RolloutJob = serde_json::from_value(serde_json::json!({
            "apiVersion": "floe.dev/v1alpha1", "kind": "RolloutJob",
            "metadata": {"name": "j"},
            "spec": {"numSamples": 1, "poolRef": {"name": "p"}, "harness": {"preset": "pi"},
                     "evaluator": {"command": ["true"]},
                     "tasks": {"inline": [{"id": "a", "instruction": "x"}]},
                     "train": {"image": "t", "model": "m",
                               "heldOut": {"tasks": {"inline": [{"id": "h", "instruction": "y"}]},
                                           "samples": 4}}},
            "status": {"heldOut": st}}))
        .expect("a job");
        let mut back = HeldOutState::of(&job, 1, 10).expect("held out");
        back.trainer = s.trainer;
        assert_eq!(back, s);
    }

    #[test]
    fn a_held_out_set_changed_after_the_first_round_is_named() {
        let task = |id: &str, instruction: &str| -> Task {
            serde_json::from_value(serde_json::json!({"id": id, "instruction": instruction}))
                .expect("a task")
        };
        let set = [task("h", "solve h"), task("i", "solve i")];
        let d = digest(&set, 2);
        assert_eq!(d, digest(&set.clone(), 2), "the same set, the same digest");
        let edited = [task("h", "solve h"), task("i", "solve i differently")];
        let renamed = [task("h", "solve h"), task("j", "solve i")];
        assert_ne!(d, digest(&edited, 2));
        assert_ne!(d, digest(&renamed, 2));
        assert_ne!(d, digest(&set, 3));

        let mut s = state(5);
        s.per_round = 4;
        s.digest = Some(d.clone());
        assert_eq!(
            set_changed(Some(&s.status()), 10, 4, &d),
            None,
            "no round yet"
        );
        at(&mut s, 0, false);
        assert!(s.open_due(false));
        let recorded = s.status();
        assert_eq!(set_changed(Some(&recorded), 10, 4, &d), None);
        assert_eq!(set_changed(None, 10, 4, &d), None);
        let resized = set_changed(Some(&recorded), 10, 6, &d).expect("a new size");
        assert!(
            resized.contains("makes 6 sessions a round, but its rounds so far had 4"),
            "{resized}"
        );
        let other = digest(&edited, 2);
        let changed = set_changed(Some(&recorded), 10, 4, &other).expect("new contents");
        assert!(
            changed.contains(&format!("digest {d} then, {other} now")),
            "{changed}"
        );
        // The job's own sessions now 12 (epochs raised): 10 and 11 would be held-out indexes.
        let moved = set_changed(Some(&recorded), 12, 4, &d).expect("a new count");
        assert!(
            moved.contains(
                "now has 12 sessions of its own, but its held-out rounds are numbered from 10"
            ),
            "{moved}"
        );
        // A status written before digests and the first index were recorded: the size is all
        // it can check.
        let older = HeldOutStatus {
            tasks_digest: None,
            first_index: None,
            ..recorded
        };
        assert_eq!(set_changed(Some(&older), 12, 4, &other), None);
    }

    /// A train job of 8 sessions (batches of 4, no staleness) at trainer version `version`,
    /// with 2 held-out sessions a round every 2 steps.
    fn train_job(version: u64, idle: bool, finished: bool) -> JobState {
        JobState {
            staleness: Some(StalenessGate {
                batch_size: 4,
                groups_per_step: 2,
                max_staleness: 0,
                trainer: TrainerState {
                    policy_version: version,
                    idle,
                    ready_groups: 0,
                    groups_done: 0,
                },
            }),
            held_out: Some(HeldOutState {
                base: 8,
                per_round: 2,
                every: 2,
                trainer: Some(TrainerAt { version, finished }),
                ..Default::default()
            }),
            ..JobState::fresh(8, 1)
        }
    }

    fn pod(name: &str, index: u32, progress: PodProgress) -> SessionPod {
        SessionPod {
            name: name.into(),
            index,
            attempt: 0,
            assigned: true,
            ready: true,
            progress,
            upstream: Default::default(),
            policy_versions: Some([2, 3]),
            start_failed: None,
        }
    }

    fn rounds(j: &JobState) -> Vec<(u64, bool)> {
        j.held_out
            .iter()
            .flat_map(|h| h.rounds.iter().map(|r| (r.step, r.last)))
            .collect()
    }

    #[test]
    fn a_rounds_sessions_go_first_and_pass_the_staleness_gate() {
        // The trainer unread: no round opens, and nothing of the job's own starts before one.
        let mut unread = train_job(0, false, false);
        if let Some(h) = unread.held_out.as_mut() {
            h.trainer = None;
        }
        let p = plan(&unread, &[], 10, Gate::OPEN);
        assert!(p.claim.is_empty() && !p.rounds_changed, "{:?}", p.claim);
        let p = plan(&train_job(0, false, false), &[], 10, Gate::OPEN);
        assert!(
            p.rounds_changed,
            "round 0 opened, to be written before its claims"
        );
        assert_eq!(rounds(&p.next), [(0, false)]);
        // Held-out 8 and 9 first; then batch 0 (0-3), which they did not take room from.
        assert_eq!(p.claim, [(8, 0), (9, 0), (0, 0), (1, 0), (2, 0), (3, 0)]);
        // With the round's pods running, an idle trainer that cannot step lets the next batch
        // start: held-out sessions are not the trainer's running batch.
        let mut j = train_job(0, true, false);
        j.held_out = p.next.held_out.clone();
        for i in 0..4 {
            j.completed.insert(i);
        }
        let running = [
            pod("h0", 8, PodProgress::Active),
            pod("h1", 9, PodProgress::Active),
        ];
        let p = plan(&j, &running, 10, Gate::OPEN);
        assert!(!p.rounds_changed, "version 0's round is open already");
        assert_eq!(p.claim.first(), Some(&(4, 0)));
    }

    #[test]
    fn pods_outside_the_known_rounds_are_neither_folded_nor_lost() {
        // Round 0 open (8-9); a pod of round 1 (10), as a read older than its opening sees it.
        let mut j = train_job(0, false, false);
        j.held_out = plan(&j, &[], 0, Gate::OPEN).next.held_out;
        let scored = PodProgress::Finished(PodResult::Scored { reward: 1.0 });
        let p = plan(&j, &[pod("r1", 10, scored.clone())], 0, Gate::OPEN);
        assert!(p.folds.is_empty() && p.release.is_empty(), "{p:?}");
        assert!(!p.claim.iter().any(|(i, _)| *i == 10));
        // `heldOut` removed mid-round: its pods go, and count nothing towards the job's end.
        let mut gone = j.clone();
        gone.held_out = None;
        for i in 0..6 {
            gone.completed.insert(i);
        }
        let p = plan(
            &gone,
            &[pod("h0", 8, scored.clone()), pod("h1", 9, scored)],
            0,
            Gate::OPEN,
        );
        assert_eq!(p.release, ["h0", "h1"]);
        assert!(p.folds.is_empty());
        assert!(
            !p.next.training_done(),
            "6 of the job's 8 sessions are done"
        );
    }

    #[test]
    fn held_out_results_fold_into_their_round_not_the_jobs_rewards() {
        let mut j = train_job(0, false, false);
        j.held_out = plan(&j, &[], 0, Gate::OPEN).next.held_out;
        let done = [
            pod(
                "h0",
                8,
                PodProgress::Finished(PodResult::Scored { reward: 1.0 }),
            ),
            pod(
                "h1",
                9,
                PodProgress::Finished(PodResult::Infra {
                    reason: "node lost".into(),
                }),
            ),
        ];
        let p = plan(&j, &done, 0, Gate::OPEN);
        assert_eq!(p.next.rewards, Default::default(), "the job's own tally");
        assert_eq!(p.next.retries.get(&9), Some(&1), "retried like any session");
        assert_eq!(p.next.retried, 0, "the job's own retries only");
        assert!(p.rounds_done.is_empty());
        let h = p.next.held_out.as_ref().expect("held out");
        assert_eq!(h.rounds[0].passed, 1);
        assert_eq!(h.rounds[0].versions, Some([2, 3]));
        // Its retry fails for good: the round is done, with one infrastructure failure.
        let mut j = p.next.clone();
        let again = [pod(
            "h1b",
            9,
            PodProgress::Finished(PodResult::Infra {
                reason: "node lost".into(),
            }),
        )];
        let again = [SessionPod {
            attempt: 1,
            ..again[0].clone()
        }];
        j.staleness = train_job(0, false, false).staleness;
        let p = plan(&j, &again, 0, Gate::OPEN);
        assert_eq!(p.rounds_done, [0]);
        let h = p.next.held_out.as_ref().expect("held out");
        assert_eq!((h.rounds[0].infra_errors, h.failed.len()), (1, 1));
        assert!(p.next.failed.is_empty(), "not the job's failure");
        // Folded pods come back until released: not counted again.
        let p2 = plan(&p.next, &again, 0, Gate::OPEN);
        assert_eq!(p2.next.held_out, p.next.held_out);
        assert_eq!(p2.release, ["h1b"]);
    }

    /// A held-out session the agent ended itself (evicted for its disk) is a task it did not
    /// solve: scored the failure reward (0 by default) in its round's pass rate, neither
    /// retried nor left out of it.
    #[test]
    fn a_held_out_agent_fault_counts_as_unsolved() {
        let mut j = train_job(0, false, false);
        j.held_out = plan(&j, &[], 0, Gate::OPEN).next.held_out;
        let fault = PodProgress::Finished(PodResult::AgentFault {
            reason: "the agent outgrew its disk backstop".into(),
        });
        let p = plan(&j, &[pod("h0", 8, fault.clone())], 0, Gate::OPEN);
        assert!(matches!(p.folds[..], [(_, Fold::Scored { index: 8, reward })] if reward == 0.0));
        // The job's failure reward, where its scale goes below 0.
        let minus_one = JobState {
            failure_reward: -1.0,
            ..j.clone()
        };
        let q = plan(&minus_one, &[pod("h0", 8, fault)], 0, Gate::OPEN);
        assert!(matches!(q.folds[..], [(_, Fold::Scored { index: 8, reward })] if reward == -1.0));
        assert!(p.next.retries.is_empty());
        let h = p.next.held_out.as_ref().expect("held out");
        assert_eq!(
            (
                h.rounds[0].scored,
                h.rounds[0].passed,
                h.rounds[0].infra_errors
            ),
            (1, 0, 0)
        );
    }

    #[test]
    fn the_final_round_opens_once_the_trainer_finished_and_the_job_waits_for_it() {
        let mut j = train_job(3, false, true);
        if let Some(h) = j.held_out.as_mut() {
            h.every = 5;
            h.rounds.push(RoundTally::default());
            h.completed.insert(8);
            h.completed.insert(9);
        }
        for i in 0..7 {
            j.completed.insert(i);
        }
        // One session of the job's own left: no final round yet.
        let p = plan(&j, &[], 10, Gate::OPEN);
        assert!(!p.rounds_changed);
        assert_eq!(p.claim, [(7, 0)]);
        j.completed.insert(7);
        let p = plan(&j, &[], 10, Gate::OPEN);
        assert_eq!(rounds(&p.next), [(0, false), (3, true)]);
        assert_eq!(p.claim, [(10, 0), (11, 0)]);
        assert!(!p.next.finished(), "the final round runs");
        let mut done = p.next.clone();
        if let Some(h) = done.held_out.as_mut() {
            h.scored(10, 1.0, 1.0, None);
            h.scored(11, 0.0, 1.0, None);
        }
        assert!(done.finished());
        // A deadline opens no round.
        j.deadline_exceeded = true;
        assert!(!plan(&j, &[], 10, Gate::OPEN).rounds_changed);
    }

    #[test]
    fn pre_warmed_held_out_pods_start_first() {
        let mut j = train_job(0, false, false);
        j.held_out = plan(&j, &[], 0, Gate::OPEN).next.held_out;
        j.lookahead = Some(2);
        j.concurrency = Some(2);
        let warm = |name: &str, index| SessionPod {
            assigned: false,
            ..pod(name, index, PodProgress::Active)
        };
        let p = plan(
            &j,
            &[warm("t0", 0), warm("h1", 9), warm("h0", 8)],
            0,
            Gate::OPEN,
        );
        assert_eq!(p.start, ["h0", "h1"]);
        assert_eq!(
            p.prewarm,
            [(1, 0)],
            "then the job's own, up to the lookahead"
        );
    }
}
