//! A RolloutJob's status from its [`JobState`] (sans-IO): counters, rewards, phase, and the
//! conditions both `kubectl wait` and kstatus (Flux, Argo CD health) read. A condition keeps
//! its transition time unless its status flips, so an unchanged job is never rewritten.

use std::collections::BTreeMap;

use floe_crds::rollout_job::{
    RewardStats, RolloutJobPhase, RolloutJobStatus, SessionCounts, TrainerProgress,
    UpstreamErrorCounts,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use super::aux_gate::{JobPodRound, Wait};
use super::indexes::IndexSet;
use super::plan::{JobState, RewardTally};

/// Why a job cannot run (bad pool ref, invalid spec, unreadable tasks): reported, not retried
/// in a hot loop.
#[derive(Clone, Debug, PartialEq)]
pub struct Blocked {
    pub reason: String,
    pub message: String,
    /// Waiting on something that comes by itself (the task loader pod starting): the job is
    /// reconciling, not stalled.
    pub transient: bool,
}

impl Blocked {
    /// Cannot go on without a change from the user (kstatus `Stalled`).
    pub fn stalled(reason: &str, message: String) -> Self {
        Self {
            reason: reason.into(),
            message,
            transient: false,
        }
    }

    /// Waiting on something that comes by itself (kstatus `Reconciling`).
    pub fn waiting(reason: &str, message: String) -> Self {
        Self {
            reason: reason.into(),
            message,
            transient: true,
        }
    }
}

/// The reason while a train job's sessions are done and its trainer finishes.
pub const TRAINING_LAST_GROUPS: &str = "TrainingLastGroups";

/// The reason while a train job's trainer has finished and its final held-out round runs.
pub const HELD_OUT_FINAL_ROUND: &str = "HeldOutFinalRound";

/// Whether `status` says the job stands stalled for `reason` (its `Stalled` condition).
pub fn stalled_for(status: Option<&RolloutJobStatus>, reason: &str) -> bool {
    status.is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "Stalled" && c.status == "True" && c.reason == reason)
    })
}

pub struct StatusInput<'a> {
    pub previous: Option<&'a RolloutJobStatus>,
    pub generation: Option<i64>,
    pub state: &'a JobState,
    pub running: u32,
    pub blocked: Option<&'a Blocked>,
    pub now: Time,
    /// A train job whose trainer has not finished ([`trainer_unfinished`]): when the sessions
    /// are done, the job waits for it to train the last groups and write its final model.
    pub trainer_unfinished: bool,
    /// The job's own pod as this round read it: while it is not Ready, the job's conditions
    /// say what it waits for.
    pub job_pod: Option<&'a JobPodRound>,
    /// The job's tasks' digest as this round read them: recorded once the job has begun, or
    /// with `record_digest` (a round about to give its first session a pod writes it first).
    pub tasks_digest: Option<&'a str>,
    pub record_digest: bool,
}

/// The job's `status.startTime`: kept once set, else now if the job has begun.
fn counts(by_kind: &BTreeMap<String, u64>) -> BTreeMap<String, i64> {
    by_kind
        .iter()
        .map(|(k, n)| (k.clone(), i64::try_from(*n).unwrap_or(i64::MAX)))
        .collect()
}

pub fn started(previous: Option<&RolloutJobStatus>, begun: bool, now: &Time) -> Option<Time> {
    previous
        .and_then(|s| s.start_time.clone())
        .or_else(|| begun.then(|| now.clone()))
}

pub fn status(i: &StatusInput, start_time: Option<Time>) -> RolloutJobStatus {
    let begun = start_time.is_some();
    let s = i.state;
    let done = (s.completed.len() + s.failed.len()) as i32;
    let total = s.total as i32;
    let running = i.running as i32;
    let mut sessions = SessionCounts {
        total,
        pending: (total - done - running).max(0),
        running,
        succeeded: s.completed.len() as i32,
        failed: s.failed.len() as i32,
        retried: i32::try_from(s.retried).unwrap_or(i32::MAX),
    };
    let previous_completion = i.previous.and_then(|p| p.completion_time.clone());
    let (phase, mut conditions) = phase_and_conditions(i, &sessions);
    if let Some(round) = i.job_pod {
        if let Some(wait) = &round.wait {
            say_job_pod_waits(
                &mut conditions,
                wait,
                (i.running > 0 && round.gate.claim).then_some(i.running),
            );
        }
    }
    let finished = matches!(phase, RolloutJobPhase::Succeeded | RolloutJobPhase::Failed);
    if finished {
        sessions = ended(sessions);
    }
    RolloutJobStatus {
        phase: Some(phase),
        progress: Some(format!("{done}/{total}")),
        sessions,
        rewards: rewards(&s.rewards),
        trainer: i.previous.and_then(|p| p.trainer.clone()),
        conditions: keep_transition_times(i.previous, conditions),
        observed_generation: i.generation,
        completed_indexes: non_empty(&s.completed),
        failed_indexes: non_empty(&s.failed),
        retries: s
            .retries
            .iter()
            .map(|(k, v)| (k.to_string(), *v as i32))
            .collect::<BTreeMap<_, _>>(),
        untold_failures: s
            .untold_failures
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
        upstream_errors: (!s.upstream.is_empty()).then(|| UpstreamErrorCounts {
            retried: counts(&s.upstream.retried),
            failed: counts(&s.upstream.failed),
        }),
        start_time,
        completion_time: if finished {
            previous_completion.or_else(|| Some(i.now.clone()))
        } else {
            None
        },
        fidelity: i.previous.and_then(|p| p.fidelity.clone()),
        held_out: s.held_out.as_ref().map(|h| h.status()),
        tasks_digest: i.previous.and_then(|p| p.tasks_digest.clone()).or_else(|| {
            i.tasks_digest
                .filter(|_| begun || i.record_digest)
                .map(str::to_string)
        }),
    }
}

/// A finished job's counts: nothing runs. What ran at its deadline is stopped in the round that
/// failed it, never scored: it stays pending (not finished), not running for good, which read
/// as sessions the trainer did not step for (`FloeTrainerStalled`).
pub fn ended(counts: SessionCounts) -> SessionCounts {
    SessionCounts {
        pending: counts.pending + counts.running,
        running: 0,
        ..counts
    }
}

/// While the job's own pod is not Ready its conditions say so: the pod's problem is the job's
/// reason (the Reason column), and what it waits for their message. `holding`: sessions that
/// keep their pods meanwhile (started before, or claimed early).
fn say_job_pod_waits(conditions: &mut [Condition], wait: &Wait, holding: Option<u32>) {
    if let Some(reason) = &wait.problem {
        for c in conditions.iter_mut().filter(|c| {
            c.reason == "SessionsRunning"
                && matches!(c.type_.as_str(), "Ready" | "Progressing" | "Reconciling")
        }) {
            c.reason = reason.clone();
        }
    }
    let message = match holding {
        Some(n) => format!("{}; {n} sessions hold their pods until then", wait.message),
        None => wait.message.clone(),
    };
    // Ready says it too when that pod has a problem.
    for c in conditions.iter_mut().filter(|c| {
        c.type_ == "Progressing"
            || c.type_ == "Reconciling"
            || (c.type_ == "Ready" && wait.problem.is_some())
    }) {
        c.message = message.clone();
    }
}

/// Whether a train job's trainer has yet to finish: until a round reads `finished` from it
/// (`now`) or an earlier round did (`previous`, the progress mirrored into the status). A
/// trainer that cannot be read — its pod being replaced, an answer slower than the round's
/// timeout — has not finished: a job declared done then would delete the pod that was about
/// to resume from its checkpoint and write the final model.
pub fn trainer_unfinished(
    train: bool,
    previous: Option<&TrainerProgress>,
    now: Option<&TrainerProgress>,
) -> bool {
    train && !previous.is_some_and(|t| t.finished) && !now.is_some_and(|t| t.finished)
}

fn non_empty(set: &IndexSet) -> Option<String> {
    (!set.is_empty()).then(|| set.to_string())
}

fn rewards(t: &RewardTally) -> Option<RewardStats> {
    (t.scored > 0).then(|| RewardStats {
        scored: t.scored as i32,
        mean: t.sum / f64::from(t.scored),
        sum: t.sum,
        passed: t.passed as i32,
        pass_rate: f64::from(t.passed) / f64::from(t.scored),
    })
}

fn condition(type_: &str, status: bool, reason: &str, message: String) -> Condition {
    Condition {
        type_: type_.into(),
        status: if status { "True" } else { "False" }.into(),
        reason: reason.into(),
        message,
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        observed_generation: None,
    }
}

/// Failed at `activeDeadlineSeconds`, whatever the job was doing or waiting for (`why`).
fn deadline_exceeded(mut out: Vec<Condition>, why: String) -> (RolloutJobPhase, Vec<Condition>) {
    out.push(condition("Failed", true, "DeadlineExceeded", why.clone()));
    out.push(condition("Ready", false, "DeadlineExceeded", why.clone()));
    out.push(condition("Stalled", true, "DeadlineExceeded", why));
    (RolloutJobPhase::Failed, out)
}

fn phase_and_conditions(i: &StatusInput, c: &SessionCounts) -> (RolloutJobPhase, Vec<Condition>) {
    let s = i.state;
    let mut out = Vec::new();
    // Suspended while waiting for something of its own (its task file): suspended is the news.
    if let Some(b) = i.blocked.filter(|b| b.transient && s.suspend) {
        out.push(condition(
            "Suspended",
            true,
            "JobSuspended",
            b.message.clone(),
        ));
        out.push(condition(
            "Progressing",
            false,
            "JobSuspended",
            b.message.clone(),
        ));
        out.push(condition("Ready", false, "JobSuspended", b.message.clone()));
        return (RolloutJobPhase::Suspended, out);
    }
    // The deadline passes whatever the job waits for: a job stalled after it started (its
    // pool deleted, its trainer disagreeing with its policy server) held its claimed pods and
    // its trainer's GPUs for good. Failed, it ends them.
    if let Some(b) = i.blocked.filter(|_| s.deadline_exceeded && !s.suspend) {
        let why = format!(
            "activeDeadlineSeconds passed while {}: {}",
            b.reason, b.message
        );
        return deadline_exceeded(out, why);
    }
    if let Some(b) = i.blocked.filter(|b| b.transient) {
        out.push(condition("Ready", false, &b.reason, b.message.clone()));
        out.push(condition("Reconciling", true, &b.reason, b.message.clone()));
        out.push(condition("Progressing", true, &b.reason, b.message.clone()));
        return (RolloutJobPhase::Pending, out);
    }
    if let Some(b) = i.blocked {
        // kstatus: Stalled = cannot make progress without a change from the user.
        out.push(condition("Ready", false, &b.reason, b.message.clone()));
        out.push(condition("Stalled", true, &b.reason, b.message.clone()));
        out.push(condition(
            "Reconciling",
            false,
            &b.reason,
            b.message.clone(),
        ));
        return (RolloutJobPhase::Pending, out);
    }
    let summary = format!(
        "{} of {} sessions scored, {} failed after retries",
        c.succeeded, c.total, c.failed
    );
    if s.training_done() {
        if c.succeeded == 0 && c.total > 0 {
            out.push(condition(
                "Failed",
                true,
                "AllSessionsFailed",
                summary.clone(),
            ));
            out.push(condition(
                "Ready",
                false,
                "AllSessionsFailed",
                summary.clone(),
            ));
            out.push(condition("Stalled", true, "AllSessionsFailed", summary));
            return (RolloutJobPhase::Failed, out);
        }
        // Past the deadline, what the job still waited for never comes: no final model, or no
        // final held-out round. Succeeded would let a pipeline go on with neither.
        let waiting = if i.trainer_unfinished {
            Some("the trainer had not written the final model")
        } else {
            (!s.finished()).then_some("the final held-out round had not finished")
        };
        if let Some(what) = waiting.filter(|_| s.deadline_exceeded) {
            let why = format!("activeDeadlineSeconds passed; {summary}, but {what}");
            return deadline_exceeded(out, why);
        }
        if i.trainer_unfinished {
            let why =
                format!("{summary}; the trainer trains the last groups and writes the final model");
            out.push(condition(
                "Progressing",
                true,
                TRAINING_LAST_GROUPS,
                why.clone(),
            ));
            out.push(condition("Ready", false, TRAINING_LAST_GROUPS, why));
            return (RolloutJobPhase::Running, out);
        }
        if !s.finished() && s.suspend {
            // The final round's sessions start only once the job is resumed.
            let why = format!("{summary}; suspended before its final held-out round is done");
            out.push(condition("Suspended", true, "JobSuspended", why.clone()));
            out.push(condition("Progressing", false, "JobSuspended", why.clone()));
            out.push(condition("Ready", false, "JobSuspended", why));
            return (RolloutJobPhase::Suspended, out);
        }
        if !s.finished() {
            let why = format!("{summary}; the final held-out round measures the final policy");
            out.push(condition(
                "Progressing",
                true,
                HELD_OUT_FINAL_ROUND,
                why.clone(),
            ));
            out.push(condition("Ready", false, HELD_OUT_FINAL_ROUND, why));
            return (RolloutJobPhase::Running, out);
        }
        out.push(condition(
            "Complete",
            true,
            "SessionsFinished",
            summary.clone(),
        ));
        out.push(condition(
            "Ready",
            true,
            "SessionsFinished",
            summary.clone(),
        ));
        out.push(condition("Progressing", false, "SessionsFinished", summary));
        return (RolloutJobPhase::Succeeded, out);
    }
    if s.deadline_exceeded {
        let why = format!("activeDeadlineSeconds passed; {summary}");
        return deadline_exceeded(out, why);
    }
    if s.suspend {
        let why = format!("suspended with {} sessions still running", c.running);
        out.push(condition("Suspended", true, "JobSuspended", why.clone()));
        out.push(condition("Progressing", false, "JobSuspended", why.clone()));
        out.push(condition("Ready", false, "JobSuspended", why));
        return (RolloutJobPhase::Suspended, out);
    }
    let why = format!("{} running, {} pending; {summary}", c.running, c.pending);
    out.push(condition(
        "Progressing",
        true,
        "SessionsRunning",
        why.clone(),
    ));
    out.push(condition(
        "Reconciling",
        true,
        "SessionsRunning",
        why.clone(),
    ));
    out.push(condition("Ready", false, "SessionsRunning", why));
    let started = i.previous.is_some_and(|p| p.start_time.is_some()) || c.running > 0;
    (
        if started {
            RolloutJobPhase::Running
        } else {
            RolloutJobPhase::Pending
        },
        out,
    )
}

/// A condition's transition time moves only when its status changes.
fn keep_transition_times(
    previous: Option<&RolloutJobStatus>,
    mut new: Vec<Condition>,
) -> Vec<Condition> {
    for c in &mut new {
        let before = previous.and_then(|p| p.conditions.iter().find(|o| o.type_ == c.type_));
        c.last_transition_time = match before {
            Some(o) if o.status == c.status => o.last_transition_time.clone(),
            _ => Time(k8s_openapi::jiff::Timestamp::now()),
        };
    }
    new
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(total: u32) -> JobState {
        JobState::fresh(total, 3)
    }

    fn input<'a>(
        s: &'a JobState,
        previous: Option<&'a RolloutJobStatus>,
        running: u32,
    ) -> StatusInput<'a> {
        StatusInput {
            previous,
            generation: Some(2),
            state: s,
            running,
            blocked: None,
            now: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            tasks_digest: None,
            record_digest: false,
            trainer_unfinished: false,
            job_pod: None,
        }
    }

    /// The digest is recorded once the job began, or when the round asks (it is about to give
    /// its first session a pod), the start time left as it is either way.
    #[test]
    fn the_tasks_digest_is_recorded_when_begun_or_asked_to() {
        let s = state(2);
        let mut i = input(&s, None, 0);
        i.tasks_digest = Some("d");
        assert_eq!(status(&i, None).tasks_digest, None);
        let begun = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        assert_eq!(status(&i, Some(begun)).tasks_digest.as_deref(), Some("d"));
        i.record_digest = true;
        let asked = status(&i, None);
        assert_eq!(
            (asked.tasks_digest.as_deref(), asked.start_time),
            (Some("d"), None)
        );
    }

    fn waiting_for(problem: Option<&str>, claim: bool) -> JobPodRound {
        JobPodRound {
            phase: super::super::aux_gate::AuxPhase::NotRunning,
            gate: super::super::aux_gate::Gate {
                claim,
                deliver: false,
                give_back: !claim,
            },
            wait: Some(Wait {
                message: "waiting for pod j-trainer".into(),
                problem: problem.map(String::from),
                failing: false,
            }),
        }
    }

    /// A condition's "reason: message".
    fn said(st: &RolloutJobStatus, t: &str) -> String {
        st.conditions
            .iter()
            .find(|c| c.type_ == t)
            .map(|c| format!("{}: {}", c.reason, c.message))
            .unwrap_or_default()
    }

    #[test]
    fn while_the_job_pod_is_not_ready_the_conditions_say_what_the_job_waits_for() {
        let s = state(4);
        let plain = waiting_for(None, true);
        let mut i = input(&s, None, 2);
        i.job_pod = Some(&plain);
        let st = status(&i, None);
        assert_eq!(
            said(&st, "Progressing"),
            "SessionsRunning: waiting for pod j-trainer; 2 sessions hold their pods until then"
        );
        assert!(
            !said(&st, "Ready").contains("j-trainer"),
            "Ready names the pod only when it has a problem"
        );
        let problem = waiting_for(Some("ErrImagePull"), false);
        let mut i = input(&s, None, 2);
        i.job_pod = Some(&problem);
        let st = status(&i, None);
        for t in ["Progressing", "Reconciling", "Ready"] {
            assert_eq!(
                said(&st, t),
                "ErrImagePull: waiting for pod j-trainer",
                "{t}"
            );
        }
    }

    #[test]
    fn a_train_job_whose_sessions_are_done_waits_for_its_trainer_to_finish() {
        let mut s = state(2);
        s.completed.insert(0);
        s.completed.insert(1);
        s.rewards = RewardTally {
            scored: 2,
            sum: 1.0,
            passed: 1,
        };
        let mut i = input(&s, None, 0);
        i.trainer_unfinished = true;
        let st = status(&i, None);
        assert_eq!(st.phase, Some(RolloutJobPhase::Running));
        assert_eq!(
            st.completion_time, None,
            "not finished while the trainer trains"
        );
        assert!(st
            .conditions
            .iter()
            .any(|c| c.type_ == "Progressing" && c.reason == TRAINING_LAST_GROUPS));
        // Once it says finished, the job completes as before.
        i.trainer_unfinished = false;
        assert_eq!(status(&i, None).phase, Some(RolloutJobPhase::Succeeded));
        // A deadline does not wait for it.
        let mut late = state(2);
        late.completed.insert(0);
        late.completed.insert(1);
        late.deadline_exceeded = true;
        let mut i = input(&late, None, 0);
        i.trainer_unfinished = true;
        let st = status(&i, None);
        assert_eq!(
            st.phase,
            Some(RolloutJobPhase::Failed),
            "no final model: not Succeeded"
        );
        assert_eq!(cond(&st, "Failed"), Some("True"));
        assert!(st.conditions.iter().all(|c| c.type_ != "Complete"));
        assert!(st.conditions[0].message.contains("final model"));
    }

    /// The round that fails a job at its deadline stops what runs: the status it writes (the
    /// last a finished job gets) counts none running, or the dashboard and the trainer alerts
    /// saw them run for good.
    #[test]
    fn a_job_failed_at_its_deadline_runs_nothing() {
        let mut late = state(4);
        late.completed.insert(0);
        late.deadline_exceeded = true;
        let st = status(&input(&late, None, 2), None);
        assert_eq!(st.phase, Some(RolloutJobPhase::Failed));
        assert_eq!(
            (
                st.sessions.running,
                st.sessions.pending,
                st.sessions.succeeded
            ),
            (0, 3, 1)
        );
        // Before the deadline, they run.
        late.deadline_exceeded = false;
        assert_eq!(status(&input(&late, None, 2), None).sessions.running, 2);
    }

    #[test]
    fn a_train_job_with_held_out_rounds_completes_after_its_final_round() {
        use super::super::held_out::{HeldOutState, TrainerAt};
        let mut s = state(1);
        s.completed.insert(0);
        s.rewards.scored = 1;
        let mut h = HeldOutState {
            base: 1,
            per_round: 2,
            every: 5,
            trainer: Some(TrainerAt {
                version: 3,
                finished: true,
            }),
            ..Default::default()
        };
        assert!(h.open_due(true));
        h.scored(1, 1.0, 1.0, Some([3, 3]));
        s.held_out = Some(h);
        let st = status(&input(&s, None, 1), None);
        assert_eq!(st.phase, Some(RolloutJobPhase::Running));
        assert_eq!(said(&st, "Progressing"), format!("{HELD_OUT_FINAL_ROUND}: 1 of 1 sessions scored, 0 failed after retries; the final held-out round measures the final policy"));
        let rounds = st.held_out.map(|h| h.rounds).unwrap_or_default();
        assert_eq!(
            (rounds[0].step, rounds[0].last, rounds[0].scored),
            (3, true, 1)
        );
        // Suspended meanwhile: no session of the round starts, and the status says so.
        s.suspend = true;
        let st = status(&input(&s, None, 1), None);
        assert_eq!(st.phase, Some(RolloutJobPhase::Suspended));
        assert!(
            said(&st, "Suspended").contains("suspended before its final held-out round is done")
        );
        s.suspend = false;
        // Past the deadline before the round is done: the final policy was never measured.
        s.deadline_exceeded = true;
        let st = status(&input(&s, None, 1), None);
        assert_eq!(st.phase, Some(RolloutJobPhase::Failed));
        assert!(said(&st, "Failed").contains("the final held-out round had not finished"));
        s.deadline_exceeded = false;
        if let Some(h) = s.held_out.as_mut() {
            h.failed(2);
        }
        let st = status(&input(&s, None, 0), None);
        assert_eq!(st.phase, Some(RolloutJobPhase::Succeeded));
        assert_eq!(
            st.held_out.map(|h| h.rounds[0].infra_errors),
            Some(1),
            "a held-out failure is its round's"
        );
        assert_eq!(st.sessions.failed, 0, "and not the job's");
    }

    #[test]
    fn a_trainer_that_cannot_be_read_has_not_finished() {
        let said = |finished| TrainerProgress {
            step: 1,
            policy_version: 1,
            last_step_time: None,
            finished,
            final_model: None,
        };
        // Its pod replaced after the sessions were done: no answer this round.
        assert!(trainer_unfinished(true, Some(&said(false)), None));
        assert!(trainer_unfinished(true, None, None));
        assert!(trainer_unfinished(true, None, Some(&said(false))));
        assert!(!trainer_unfinished(true, None, Some(&said(true))));
        // Finished once stays finished, when the job's end has deleted the trainer pod.
        assert!(!trainer_unfinished(true, Some(&said(true)), None));
        assert!(!trainer_unfinished(false, None, None));
    }

    /// `docs/crds.md` names exactly the condition types a job gets, on every path: running,
    /// finished, failed, past its deadline, suspended, blocked, waiting, training its last
    /// groups.
    #[test]
    fn the_docs_list_the_jobs_condition_types() {
        let mut seen = std::collections::BTreeSet::new();
        let mut see = |st: RolloutJobStatus| {
            seen.extend(st.conditions.into_iter().map(|c| c.type_));
        };
        let running = state(2);
        see(status(&input(&running, None, 1), None));
        let mut done = state(1);
        done.completed.insert(0);
        see(status(&input(&done, None, 0), None));
        let mut training = input(&done, None, 0);
        training.trainer_unfinished = true;
        see(status(&training, None));
        let mut failed = state(1);
        failed.failed.insert(0);
        see(status(&input(&failed, None, 0), None));
        let mut late = state(1);
        late.deadline_exceeded = true;
        see(status(&input(&late, None, 0), None));
        let mut suspended = state(1);
        suspended.suspend = true;
        see(status(&input(&suspended, None, 0), None));
        for blocked in [
            Blocked::stalled("PoolNotFound", "m".into()),
            Blocked::waiting("LoadingTasks", "m".into()),
        ] {
            let mut i = input(&running, None, 0);
            i.blocked = Some(&blocked);
            see(status(&i, None));
        }
        assert_eq!(seen, crate::documented_condition_types("RolloutJob"));
    }

    fn cond<'a>(st: &'a RolloutJobStatus, t: &str) -> Option<&'a str> {
        st.conditions
            .iter()
            .find(|c| c.type_ == t)
            .map(|c| c.status.as_str())
    }

    #[test]
    fn counters_and_rewards_follow_the_state() {
        let mut s = state(4);
        s.completed.insert(0);
        s.completed.insert(1);
        s.failed.insert(3);
        s.retries.insert(2, 1);
        s.retried = 3;
        let untold = floe_crds::rollout_job::UntoldFailure {
            group: "j/t".into(),
            sample: 3,
            session: "j-t-3".into(),
            agent_fault: None,
            since: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        };
        s.untold_failures.insert(3, untold.clone());
        s.rewards = RewardTally {
            scored: 2,
            sum: 1.5,
            passed: 1,
        };
        let st = status(&input(&s, None, 1), None);
        assert_eq!(st.progress.as_deref(), Some("3/4"));
        assert_eq!(
            (
                st.sessions.pending,
                st.sessions.running,
                st.sessions.retried
            ),
            (0, 1, 3)
        );
        let r = st.rewards.clone().expect("rewards");
        assert_eq!((r.mean, r.pass_rate), (0.75, 0.5));
        assert_eq!(st.completed_indexes.as_deref(), Some("0-1"));
        assert_eq!(st.failed_indexes.as_deref(), Some("3"));
        assert_eq!(
            st.untold_failures.clone().into_iter().collect::<Vec<_>>(),
            [("3".to_string(), untold)]
        );
        assert_eq!(st.observed_generation, Some(2));
        assert_eq!(st.phase, Some(RolloutJobPhase::Running));
        assert_eq!(cond(&st, "Reconciling"), Some("True"));
    }

    #[test]
    fn finished_with_some_scores_is_complete_and_ready_and_keeps_its_completion_time() {
        let mut s = state(2);
        s.completed.insert(0);
        s.failed.insert(1);
        let first = status(&input(&s, None, 0), None);
        assert_eq!(first.phase, Some(RolloutJobPhase::Succeeded));
        assert_eq!(cond(&first, "Complete"), Some("True"));
        assert_eq!(cond(&first, "Ready"), Some("True"));
        let mut later = input(&s, Some(&first), 0);
        later.now = Time(k8s_openapi::jiff::Timestamp::now());
        let again = status(&later, None);
        assert_eq!(again.completion_time, first.completion_time);
        assert_eq!(again.conditions, first.conditions, "no needless rewrite");
    }

    #[test]
    fn every_session_failed_is_a_failed_job() {
        let mut s = state(1);
        s.failed.insert(0);
        let st = status(&input(&s, None, 0), None);
        assert_eq!(st.phase, Some(RolloutJobPhase::Failed));
        assert_eq!(cond(&st, "Stalled"), Some("True"));
    }

    #[test]
    fn deadline_suspend_and_blocked_each_say_so() {
        let mut s = state(3);
        s.deadline_exceeded = true;
        assert_eq!(
            status(&input(&s, None, 0), None).phase,
            Some(RolloutJobPhase::Failed)
        );
        let mut s = state(3);
        s.suspend = true;
        let st = status(&input(&s, None, 2), None);
        assert_eq!(st.phase, Some(RolloutJobPhase::Suspended));
        assert_eq!(cond(&st, "Suspended"), Some("True"));
        let s = state(3);
        let blocked = Blocked::stalled("PoolNotFound", "no pool".into());
        let mut i = input(&s, None, 0);
        i.blocked = Some(&blocked);
        let st = status(&i, None);
        assert_eq!(st.phase, Some(RolloutJobPhase::Pending));
        assert_eq!(cond(&st, "Stalled"), Some("True"));
        assert_eq!(st.conditions[0].reason, "PoolNotFound");
        // Waiting on something that comes by itself: reconciling, never stalled.
        let loading = Blocked::waiting("LoadingTasks", "waiting for the task loader".into());
        i.blocked = Some(&loading);
        let st = status(&i, None);
        assert_eq!(st.phase, Some(RolloutJobPhase::Pending));
        assert_eq!(cond(&st, "Stalled"), None);
        assert_eq!(cond(&st, "Reconciling"), Some("True"));
        assert_eq!(cond(&st, "Ready"), Some("False"));
        // Past its deadline, whatever it waits for: failed, completed (its pods end).
        for b in [&blocked, &loading] {
            let mut late = state(3);
            late.deadline_exceeded = true;
            let mut i = input(&late, None, 0);
            i.blocked = Some(b);
            let st = status(&i, None);
            assert_eq!(st.phase, Some(RolloutJobPhase::Failed), "{}", b.reason);
            assert_eq!(st.conditions[0].reason, "DeadlineExceeded");
            assert!(st.conditions[0].message.contains(&b.reason));
            assert!(st.completion_time.is_some());
        }
        // Suspended before its task file was read: suspended is what it says.
        let mut s = state(0);
        s.suspend = true;
        let unread = Blocked::waiting(
            "JobSuspended",
            "suspended; spec.tasks.file is read …".into(),
        );
        let mut i = input(&s, None, 0);
        i.blocked = Some(&unread);
        let st = status(&i, None);
        assert_eq!(st.phase, Some(RolloutJobPhase::Suspended));
        assert_eq!(cond(&st, "Suspended"), Some("True"));
        assert_eq!(cond(&st, "Reconciling"), None);
    }
}
