//! The RolloutJob reconcile decision (sans-IO): from what the job's status records and what
//! its pods say, decide which results to fold into the status, which pods to let go, which
//! claimed pods still need their assignment, and which sessions to claim pods for next.
//!
//! Crash safety comes from the order the controller applies a plan in, and from the status
//! being the record: a result is folded (its index added to `completedIndexes`/`failedIndexes`
//! or its retry counted) in the same status write, guarded by the job's resourceVersion, and
//! only then is the pod released. A pod whose result is already recorded is released without
//! folding again — so an operator killed at any point neither loses nor double-counts a session.

use floe_crds::rollout_job::{StalenessGate, UntoldFailure};
use floe_gateway::capture::upstream_errors::UpstreamErrors;
use std::collections::{BTreeMap, BTreeSet};

use super::aux_gate::Gate;
use super::held_out::HeldOutState;
use super::indexes::IndexSet;

/// What a finished session pod reported.
#[derive(Clone, Debug, PartialEq)]
pub enum PodResult {
    /// The runner scored the session (exit 0 or 1; an agent failure is a valid sample).
    Scored { reward: f64 },
    /// Infrastructure failure: retried on a fresh pod, never a reward of 0.
    Infra { reason: String },
    /// Ended by the agent's own doing with nothing to score (the kubelet evicted the pod for
    /// what the agent wrote past its disk backstop): failed at once, never retried — a retry
    /// would turn the agent's loss into another chance — and no reward recorded.
    AgentFault { reason: String },
}

#[derive(Clone, Debug, PartialEq)]
pub enum PodProgress {
    /// Claimed and not finished.
    Active,
    Finished(PodResult),
    /// Being deleted before it finished (eviction, node loss, someone's `kubectl delete`).
    Lost,
}

/// A pod claimed for one attempt of one session.
#[derive(Clone, Debug, PartialEq)]
pub struct SessionPod {
    pub name: String,
    pub index: u32,
    pub attempt: u32,
    /// The pod's gateway acknowledged the assignment.
    pub assigned: bool,
    /// The pod is Ready (its gateway answers). Pool pods are claimed Ready; a job's own
    /// pre-warmed pods (`poolTemplate`) may still be starting.
    pub ready: bool,
    pub progress: PodProgress,
    /// The model-server failures its gateway met (from the runner's summary).
    pub upstream: UpstreamErrors,
    /// The first and last policy version that sampled its calls (from the runner's summary).
    pub policy_versions: Option<[u64; 2]>,
    /// `poolTemplate`: why the pod, not Ready, will not start (stuck past
    /// `timeouts.podStartSeconds`, [`super::pod_view::start_failure`]).
    pub start_failed: Option<String>,
}

/// Rewards of the scored sessions, kept as sums so that folding is exact.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RewardTally {
    pub scored: u32,
    pub sum: f64,
    pub passed: u32,
}

/// The job as its spec and status describe it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JobState {
    pub total: u32,
    pub backoff_limit: u32,
    pub concurrency: Option<u32>,
    pub pass_threshold: f64,
    /// `evaluator.reward.failureReward`: a held-out session the agent failed itself scores it.
    pub failure_reward: f64,
    /// Stop claiming (`spec.suspend`); running sessions go on.
    pub suspend: bool,
    /// `activeDeadlineSeconds` passed: stop claiming and stop the running sessions.
    pub deadline_exceeded: bool,
    pub completed: IndexSet,
    pub failed: IndexSet,
    /// Infrastructure failures per session index so far (the next attempt's number), for
    /// sessions not yet done: a done session's count is read by nothing, so the status holds
    /// only those in flight however many sessions a long job retried.
    pub retries: BTreeMap<u32, u32>,
    /// Infrastructure failures of the job's own sessions so far, done ones included
    /// (`status.sessions.retried`; held-out sessions' are their rounds' business).
    pub retried: u32,
    /// A train job's samples failed for good that its trainer has not taken yet, by session
    /// index (`status.untoldFailures`): filled and emptied by the controller, which tells the
    /// trainer; the planner carries them.
    pub untold_failures: BTreeMap<u32, UntoldFailure>,
    pub rewards: RewardTally,
    /// Model-server failures of every attempt folded so far.
    pub upstream: UpstreamErrors,
    /// `poolTemplate` mode: the job creates its own pod per session, this many ahead of the
    /// running ones; `None` claims from a GatewayPool.
    pub lookahead: Option<u32>,
    /// A train job's sessions start at most `maxStaleness` policy versions ahead of its
    /// trainer; `None` for an sft job.
    pub staleness: Option<StalenessGate>,
    /// `train.heldOut`: its rounds so far and what the trainer said this reconcile.
    pub held_out: Option<HeldOutState>,
}

/// Sessions running at once in `poolTemplate` mode when `concurrency` is not set: the job
/// creates its pods itself, so "as many as the pool can serve" has no pool to ask.
pub const TEMPLATE_CONCURRENCY: u32 = 8;

impl JobState {
    /// A job with nothing done yet (pass threshold 1, no concurrency limit).
    #[cfg(test)]
    pub fn fresh(total: u32, backoff_limit: u32) -> Self {
        Self {
            total,
            backoff_limit,
            pass_threshold: 1.0,
            failure_reward: 0.0,
            ..Default::default()
        }
    }

    /// Every session of the job's own is done (held-out rounds aside).
    pub fn training_done(&self) -> bool {
        (self.completed.len() + self.failed.len()) as u64 >= u64::from(self.total)
    }

    /// Every session is done, the final held-out round's included.
    pub fn finished(&self) -> bool {
        self.training_done() && self.held_out.as_ref().is_none_or(HeldOutState::done)
    }

    /// May session `index` start, with `running` of the job's own sessions running? A
    /// held-out session passes no staleness gate: it trains nothing. The job's own wait for
    /// the first held-out round to open (the trainer read at version 0), so that it measures
    /// the policy before any of them ran.
    fn may_start(&self, index: u32, running: u32) -> bool {
        if let Some(h) = &self.held_out {
            if h.owns(index) {
                return true;
            }
            if h.rounds.is_empty() {
                return false;
            }
        }
        self.staleness
            .is_none_or(|g| g.may_start(u64::from(index), u64::from(running)))
    }

    fn held_out_owns(&self, index: u32) -> bool {
        self.held_out.as_ref().is_some_and(|h| h.owns(index))
    }

    /// The attempt a session's next pod runs (its infrastructure failures so far).
    fn attempt(&self, index: u32) -> u32 {
        self.retries.get(&index).copied().unwrap_or(0)
    }

    /// Session `index` is scored or failed for good.
    fn done(&self, index: u32) -> bool {
        match self.held_out.as_ref().filter(|h| h.owns(index)) {
            Some(h) => h.recorded(index),
            None => self.completed.contains(index) || self.failed.contains(index),
        }
    }

    fn recorded(&self, pod: &SessionPod) -> bool {
        self.done(pod.index) || self.attempt(pod.index) > pod.attempt
    }

    /// Drop the retry counts of done sessions (see [`JobState::retries`]), and of held-out
    /// sessions once the job has no `heldOut` (their pods are let go unfolded).
    fn forget_done_retries(&mut self) {
        let retries = std::mem::take(&mut self.retries);
        let orphan = |i: u32| i >= self.total && self.held_out.is_none();
        self.retries = retries
            .into_iter()
            .filter(|(i, _)| !self.done(*i) && !orphan(*i))
            .collect();
    }

    /// A pod past the job's own sessions that no open held-out round holds: `Some(true)` to
    /// let it go, `Some(false)` to leave it as it is, `None` for every other pod.
    fn outside_rounds(&self, index: u32) -> Option<bool> {
        if index < self.total {
            return None;
        }
        match &self.held_out {
            // `heldOut` removed mid-round: the session measures nothing now, and it is none of
            // the job's own (folding it there would count it towards the job's end).
            None => Some(true),
            // A round's opening is written before its pods are claimed: a round this read does
            // not know is a stale read, not an orphan. Its pods run on until the read catches up.
            Some(h) => h.slot(index).is_none().then_some(false),
        }
    }

    /// Sessions that may be claimed, in order: open held-out rounds' first, then the job's
    /// own, lowest index first.
    fn pending<'a>(&'a self, holding: &'a BTreeSet<u32>) -> impl Iterator<Item = u32> + 'a {
        let held_out = self.held_out.iter().flat_map(|h| h.pending(holding));
        held_out.chain((0..self.total).filter(|i| {
            !self.completed.contains(*i) && !self.failed.contains(*i) && !holding.contains(i)
        }))
    }
}

/// What happened to one session, as folded into the status.
#[derive(Clone, Debug, PartialEq)]
pub enum Fold {
    Scored {
        index: u32,
        reward: f64,
    },
    /// Another attempt follows on a fresh pod.
    Retry {
        index: u32,
        next_attempt: u32,
        reason: String,
    },
    /// `backoffLimit` exhausted, or the agent's own doing ([`PodResult::AgentFault`]):
    /// failed, no reward.
    Failed {
        index: u32,
        reason: String,
        /// Failed at this attempt whatever `backoffLimit` allows (the agent's doing).
        agent_fault: bool,
        /// The attempt that failed (its session id names it).
        attempt: u32,
    },
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct JobPlan {
    /// Results to record, with the pod each came from.
    pub folds: Vec<(String, Fold)>,
    /// Pods to let go of (finalizer removed, deleted) — only after `folds` are written.
    pub release: Vec<String>,
    /// Running pods to stop (deadline): deleted; their loss is folded next time.
    pub stop: Vec<String>,
    /// Claimed pods whose gateway has not acknowledged the assignment yet.
    pub deliver: Vec<String>,
    /// Sessions to claim a READY pod for, as (index, attempt), lowest index first so GRPO
    /// groups fill together.
    pub claim: Vec<(u32, u32)>,
    /// `poolTemplate`: pre-warmed pods whose session starts now (their assignment goes out).
    pub start: Vec<String>,
    /// `poolTemplate`: sessions to create a pod for, as (index, attempt), lowest index first.
    pub prewarm: Vec<(u32, u32)>,
    /// Sessions (indexes) that could start but found no READY pod free.
    pub starved: Vec<u32>,
    /// The status after the folds.
    pub next: JobState,
    /// A held-out round was opened (or marked final): written with the folds, before claims.
    pub rounds_changed: bool,
    /// Held-out rounds whose last session these folds recorded.
    pub rounds_done: Vec<usize>,
    /// Pods holding a session after this plan (active, not released), plus the new claims.
    pub running: u32,
}

impl JobPlan {
    /// Sessions holding a pod once the round's writes went out, of which `claimed` claims and
    /// `started` pre-warmed starts succeeded: a lost claim or a pod gone before its start
    /// holds no session.
    pub fn running_after(&self, claimed: usize, started: usize) -> u32 {
        let lost =
            self.claim.len().saturating_sub(claimed) + self.start.len().saturating_sub(started);
        self.running
            .saturating_sub(u32::try_from(lost).unwrap_or(u32::MAX))
    }
}

/// The round's decision. `gate`: what the job's own pod (trainer, collector) allows its
/// sessions now ([`super::aux_gate`]): claims only when it lets them; no session starts
/// before its trajectories have somewhere to go (a claimed pod keeps its session, unstarted);
/// and when it cannot take trajectories for a while, pods claimed for sessions that have not
/// started go back, unused (not an attempt).
pub fn plan(state: &JobState, pods: &[SessionPod], ready_pods: usize, gate: Gate) -> JobPlan {
    let ready_pods = if gate.claim { ready_pods } else { 0 };
    let mut out = plan_sessions(state, pods, ready_pods, gate.give_back);
    out.next.forget_done_retries();
    if !gate.deliver {
        out.running -= out.start.len() as u32;
        out.start.clear();
        out.deliver.clear();
    }
    out
}

fn plan_sessions(
    state: &JobState,
    pods: &[SessionPod],
    ready_pods: usize,
    give_back_unstarted: bool,
) -> JobPlan {
    let mut next = state.clone();
    let mut out = JobPlan::default();
    let mut holding: BTreeSet<u32> = BTreeSet::new();
    let mut running = 0u32;
    // Held-out sessions among `running`: the staleness gate counts the job's own only.
    let mut held_running = 0u32;
    let mut waiting: Vec<&SessionPod> = Vec::new();
    for pod in pods {
        match state.outside_rounds(pod.index) {
            Some(true) => {
                out.release.push(pod.name.clone());
                continue;
            }
            Some(false) => {
                holding.insert(pod.index);
                continue;
            }
            None => {}
        }
        if next.recorded(pod) {
            // Folded before (perhaps by an operator that died before releasing it).
            out.release.push(pod.name.clone());
            continue;
        }
        let scored = matches!(
            pod.progress,
            PodProgress::Finished(PodResult::Scored { .. })
        );
        let mut never_started = None;
        if state.lookahead.is_some() && !pod.assigned && !scored {
            // A pre-warmed pod whose session has not started. Deleted (evicted, drained, a
            // `kubectl delete`), it is simply replaced: same attempt. But a pod that cannot
            // start (its image cannot be pulled, its runner fails before its session) would be
            // made again and fail again for good: that is a failed attempt, so a template or
            // a task image that cannot run ends in `backoffLimit` attempts with its reason.
            // (A score is folded whatever the annotation says: it proves the session ran.)
            never_started = match &pod.progress {
                _ if state.deadline_exceeded => None,
                PodProgress::Active => pod.start_failed.clone(),
                // (No agent ran before its session: nothing it did.)
                PodProgress::Finished(
                    PodResult::Infra { reason } | PodResult::AgentFault { reason },
                ) => Some(format!(
                    "its pod failed before its session started: {reason}"
                )),
                _ => None,
            };
            if never_started.is_none() {
                if pod.progress == PodProgress::Active && !state.deadline_exceeded {
                    holding.insert(pod.index);
                    waiting.push(pod);
                } else {
                    out.release.push(pod.name.clone());
                }
                continue;
            }
        }
        if !pod.assigned && pod.progress == PodProgress::Lost {
            // Claimed from the pool and lost before its session started (a node drained, an
            // eviction under node pressure, a `kubectl delete` while the job's own pod was
            // starting): nothing of the session's ran, so it is claimed again at the same
            // attempt, as a pre-warmed pod is replaced, not a failed attempt.
            out.release.push(pod.name.clone());
            continue;
        }
        if give_back_unstarted && !pod.assigned && pod.progress == PodProgress::Active {
            // Claimed from the pool, its session never started: nothing to fold.
            out.release.push(pod.name.clone());
            continue;
        }
        // A pool pod whose gateway never took its session's assignment (unreachable from the
        // operator, refusing it): a failed attempt, retried on another pod, so that a cause
        // every pod shares ends the job's sessions with its reason instead of holding them.
        if state.lookahead.is_none()
            && !pod.assigned
            && pod.progress == PodProgress::Active
            && !state.deadline_exceeded
        {
            never_started = pod.start_failed.clone();
        }
        let progress = match (never_started, &pod.progress) {
            (Some(reason), _) => PodProgress::Finished(PodResult::Infra { reason }),
            // A held-out session measures the policy: what the agent did to itself is a task
            // it did not solve, not a session left out of the pass rate.
            (None, PodProgress::Finished(PodResult::AgentFault { .. }))
                if state.held_out_owns(pod.index) =>
            {
                PodProgress::Finished(PodResult::Scored {
                    reward: state.failure_reward,
                })
            }
            (None, p) => p.clone(),
        };
        let failure = match &progress {
            PodProgress::Active => {
                holding.insert(pod.index);
                running += 1;
                held_running += u32::from(state.held_out_owns(pod.index));
                if state.deadline_exceeded {
                    out.stop.push(pod.name.clone());
                } else if !pod.assigned {
                    out.deliver.push(pod.name.clone());
                }
                continue;
            }
            PodProgress::Finished(PodResult::Scored { reward }) => {
                next.upstream.add(&pod.upstream);
                let reward = if reward.is_finite() {
                    *reward
                } else {
                    state.failure_reward
                };
                match next.held_out.as_mut().filter(|h| h.owns(pod.index)) {
                    Some(h) => {
                        h.scored(pod.index, reward, state.pass_threshold, pod.policy_versions)
                    }
                    None => {
                        next.completed.insert(pod.index);
                        next.rewards.scored += 1;
                        next.rewards.sum += reward;
                        if reward >= state.pass_threshold {
                            next.rewards.passed += 1;
                        }
                    }
                }
                out.folds.push((
                    pod.name.clone(),
                    Fold::Scored {
                        index: pod.index,
                        reward,
                    },
                ));
                out.release.push(pod.name.clone());
                continue;
            }
            PodProgress::Finished(PodResult::Infra { reason }) => {
                next.upstream.add(&pod.upstream);
                reason.clone()
            }
            PodProgress::Finished(PodResult::AgentFault { reason }) => {
                next.upstream.add(&pod.upstream);
                reason.clone()
            }
            PodProgress::Lost => "the pod was deleted before the session finished".to_string(),
        };
        let agent_fault = matches!(
            progress,
            PodProgress::Finished(PodResult::AgentFault { .. })
        );
        let next_attempt = pod.attempt + 1;
        let fold = if agent_fault || next_attempt > state.backoff_limit {
            match next.held_out.as_mut().filter(|h| h.owns(pod.index)) {
                Some(h) => h.failed(pod.index),
                None => {
                    next.failed.insert(pod.index);
                    // The agent's own failure is its score (the trainer trains it as a loss at
                    // `failureReward`; `floe run` counts it so): left out, the pass rate read
                    // higher exactly when the policy learned to blow up on hard tasks.
                    if agent_fault {
                        next.rewards.scored += 1;
                        next.rewards.sum += state.failure_reward;
                        if state.failure_reward >= state.pass_threshold {
                            next.rewards.passed += 1;
                        }
                    }
                }
            }
            Fold::Failed {
                index: pod.index,
                reason: failure,
                agent_fault,
                attempt: pod.attempt,
            }
        } else {
            next.retries.insert(pod.index, next_attempt);
            if pod.index < state.total {
                next.retried += 1;
            }
            Fold::Retry {
                index: pod.index,
                next_attempt,
                reason: failure,
            }
        };
        out.folds.push((pod.name.clone(), fold));
        out.release.push(pod.name.clone());
    }

    if let (Some(before), Some(after)) = (&state.held_out, &next.held_out) {
        out.rounds_done = (0..after.rounds.len())
            .filter(|r| after.round_done(*r) && !before.round_done(*r))
            .collect();
    }
    if !state.suspend && !state.deadline_exceeded {
        let training_done = next.training_done();
        if let Some(h) = next.held_out.as_mut() {
            out.rounds_changed = h.open_due(training_done);
        }
    }
    if let Some(lookahead) = state.lookahead {
        plan_prewarmed(
            state,
            &next,
            &holding,
            &mut waiting,
            [running, held_running],
            lookahead,
            &mut out,
        );
        out.running += running;
        out.next = next;
        return out;
    }
    if !state.suspend && !state.deadline_exceeded && !give_back_unstarted {
        let room = state
            .concurrency
            .map_or(u32::MAX, |c| c.saturating_sub(running));
        let mut training = running - held_running;
        for index in next
            .pending(&holding)
            .take(usize::try_from(room).unwrap_or(usize::MAX))
        {
            // Lowest index first: once one waits for the trainer, so do all after it.
            if !next.may_start(index, training) {
                break;
            }
            if out.claim.len() < ready_pods {
                training += u32::from(!next.held_out_owns(index));
                out.claim.push((index, next.attempt(index)));
            } else {
                out.starved.push(index);
            }
        }
    }
    out.running = running + out.claim.len() as u32;
    out.next = next;
    out
}

/// `poolTemplate` mode: start the lowest waiting sessions whose pods are Ready (up to the
/// concurrency), and keep `concurrency + lookahead` pods alive by creating pods for the next
/// pending sessions. A session that could start but whose pod is still warming is `starved`.
fn plan_prewarmed(
    state: &JobState,
    next: &JobState,
    holding: &BTreeSet<u32>,
    waiting: &mut [&SessionPod],
    [running, held_running]: [u32; 2],
    lookahead: u32,
    out: &mut JobPlan,
) {
    if state.suspend || state.deadline_exceeded {
        return;
    }
    let concurrency = state.concurrency.unwrap_or(TEMPLATE_CONCURRENCY);
    let mut room = concurrency.saturating_sub(running);
    let mut training = running - held_running;
    // Held-out rounds first, then the job's own sessions, lowest index first.
    waiting.sort_by_key(|p| (!next.held_out_owns(p.index), p.index));
    for pod in waiting.iter() {
        if room == 0 || !next.may_start(pod.index, training) {
            break;
        }
        room -= 1;
        if pod.ready {
            training += u32::from(!next.held_out_owns(pod.index));
            out.start.push(pod.name.clone());
            out.running += 1;
        } else {
            out.starved.push(pod.index);
        }
    }
    let alive = running as usize + waiting.len();
    let budget = concurrency.saturating_add(lookahead) as usize;
    for index in next.pending(holding).take(budget.saturating_sub(alive)) {
        if room > 0 {
            room -= 1;
            out.starved.push(index);
        }
        out.prewarm.push((index, next.attempt(index)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(total: u32) -> JobState {
        JobState::fresh(total, 2)
    }

    /// The job's own pod failing: nothing starts, nothing is claimed, unstarted claims go back.
    const CLOSED: Gate = Gate {
        claim: false,
        deliver: false,
        give_back: true,
    };

    /// The job's own pod starting: pool pods may be claimed, no session starts.
    const CLAIM_ONLY: Gate = Gate {
        claim: true,
        deliver: false,
        give_back: false,
    };

    fn pod(name: &str, index: u32, attempt: u32, progress: PodProgress) -> SessionPod {
        SessionPod {
            name: name.into(),
            index,
            attempt,
            assigned: true,
            ready: true,
            progress,
            upstream: UpstreamErrors::default(),
            policy_versions: None,
            start_failed: None,
        }
    }

    fn scored(reward: f64) -> PodProgress {
        PodProgress::Finished(PodResult::Scored { reward })
    }

    fn infra() -> PodProgress {
        PodProgress::Finished(PodResult::Infra {
            reason: "evaluator crashed".into(),
        })
    }

    #[test]
    fn a_fresh_job_claims_as_many_sessions_as_ready_pods_lowest_first() {
        let p = plan(&job(8), &[], 3, Gate::OPEN);
        assert_eq!(p.claim, [(0, 0), (1, 0), (2, 0)]);
        assert_eq!(p.starved, [3, 4, 5, 6, 7]);
        assert_eq!(p.running, 3);
    }

    /// A train job: 2 sessions per group, 2 groups per step (batches of 4), maxStaleness 0.
    fn train_job(total: u32, version: u64, idle: bool) -> JobState {
        use floe_crds::rollout_job::TrainerState;
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
            ..job(total)
        }
    }

    #[test]
    fn a_train_jobs_next_batch_waits_for_the_trainers_version() {
        // Version 0: batch 0 (sessions 0-3) only, whatever the pool has READY; the rest are
        // not starved for pods, they wait for the trainer.
        let p = plan(&train_job(12, 0, false), &[], 10, Gate::OPEN);
        assert_eq!(p.claim, [(0, 0), (1, 0), (2, 0), (3, 0)]);
        assert!(p.starved.is_empty());
        // Batch 0 done and the trainer at version 1: batch 1 starts.
        let mut j = train_job(12, 1, false);
        for i in 0..4 {
            j.completed.insert(i);
        }
        let p = plan(&j, &[], 10, Gate::OPEN);
        assert_eq!(p.claim, [(4, 0), (5, 0), (6, 0), (7, 0)]);
        // An idle trainer (groups dropped for zero advantage make no step) holds nothing back
        // once no session runs: one starts, and the next round sees it running.
        let mut j = train_job(12, 0, true);
        for i in 0..4 {
            j.completed.insert(i);
        }
        let p = plan(&j, &[], 10, Gate::OPEN);
        assert_eq!(p.claim, [(4, 0)]);
    }

    #[test]
    fn concurrency_counts_running_pods() {
        let mut j = job(8);
        j.concurrency = Some(3);
        let pods = [
            pod("a", 0, 0, PodProgress::Active),
            pod("b", 1, 0, scored(1.0)),
        ];
        let p = plan(&j, &pods, 10, Gate::OPEN);
        // One running, one just finished: two more may start; session 0 is held, 1 is done.
        assert_eq!(p.claim, [(2, 0), (3, 0)]);
        assert!(p.starved.is_empty());
    }

    #[test]
    fn a_scored_pod_is_folded_then_released() {
        let p = plan(&job(4), &[pod("a", 2, 0, scored(0.5))], 0, Gate::OPEN);
        assert_eq!(
            p.folds,
            [(
                "a".into(),
                Fold::Scored {
                    index: 2,
                    reward: 0.5
                }
            )]
        );
        assert_eq!(p.release, ["a"]);
        assert!(p.next.completed.contains(2));
        assert_eq!(
            p.next.rewards,
            RewardTally {
                scored: 1,
                sum: 0.5,
                passed: 0
            }
        );
    }

    #[test]
    fn an_already_recorded_result_is_released_without_folding_again() {
        let mut j = job(4);
        j.completed.insert(2);
        j.rewards = RewardTally {
            scored: 1,
            sum: 1.0,
            passed: 1,
        };
        j.retries.insert(3, 1);
        let pods = [pod("a", 2, 0, scored(1.0)), pod("b", 3, 0, infra())];
        let p = plan(&j, &pods, 0, Gate::OPEN);
        assert!(p.folds.is_empty());
        assert_eq!(p.release, ["a", "b"]);
        assert_eq!(p.next, j);
    }

    #[test]
    fn infrastructure_failures_retry_with_a_new_attempt_then_fail_without_a_reward() {
        let j = job(1);
        let p = plan(&j, &[pod("a", 0, 0, infra())], 5, Gate::OPEN);
        assert!(matches!(
            p.folds[0].1,
            Fold::Retry {
                index: 0,
                next_attempt: 1,
                ..
            }
        ));
        // The retry is claimed at once, as attempt 1.
        assert_eq!(p.claim, [(0, 1)]);
        let p = plan(&p.next, &[pod("b", 0, 1, PodProgress::Lost)], 5, Gate::OPEN);
        assert!(matches!(
            p.folds[0].1,
            Fold::Retry {
                next_attempt: 2,
                ..
            }
        ));
        let p = plan(&p.next, &[pod("c", 0, 2, infra())], 5, Gate::OPEN);
        assert!(matches!(p.folds[0].1, Fold::Failed { index: 0, .. }));
        assert!(p.next.failed.contains(0));
        assert_eq!(
            p.next.rewards,
            RewardTally::default(),
            "never a reward of 0"
        );
        assert!(p.claim.is_empty());
        assert!(p.next.finished());
    }

    /// A long job retries many sessions: the status keeps the counts of those in flight only,
    /// and the total goes on counting the ones done.
    #[test]
    fn a_done_sessions_retry_count_is_forgotten_but_still_counted() {
        let j = job(2);
        let p = plan(
            &j,
            &[pod("a", 0, 0, infra()), pod("b", 1, 0, infra())],
            0,
            Gate::OPEN,
        );
        assert_eq!((p.next.retries.len(), p.next.retried), (2, 2));
        let p = plan(&p.next, &[pod("c", 0, 1, scored(1.0))], 0, Gate::OPEN);
        assert_eq!(Vec::from_iter(p.next.retries.clone()), [(1, 1)]);
        assert_eq!(p.next.retried, 2);
        // A pod of an attempt before the one that scored is still let go, never folded.
        let p = plan(&p.next, &[pod("a", 0, 0, infra())], 0, Gate::OPEN);
        assert!(p.folds.is_empty());
        assert_eq!(
            (p.release.as_slice(), p.next.retried),
            (&["a".to_string()][..], 2)
        );
    }

    /// A held-out session's count, once the job has no `heldOut` left: its pods are let go
    /// unfolded, so nothing would ever forget it.
    #[test]
    fn a_held_out_retry_count_goes_with_the_held_out_rounds() {
        let mut j = job(1);
        j.retries.insert(0, 1);
        j.retries.insert(5, 1);
        let p = plan(&j, &[], 0, Gate::OPEN);
        assert_eq!(Vec::from_iter(p.next.retries), [(0, 1)]);
    }

    #[test]
    fn backoff_limit_zero_fails_on_the_first_infrastructure_error() {
        let mut j = job(1);
        j.backoff_limit = 0;
        let p = plan(&j, &[pod("a", 0, 0, infra())], 5, Gate::OPEN);
        assert!(matches!(p.folds[0].1, Fold::Failed { .. }));
    }

    #[test]
    fn suspend_stops_claiming_but_keeps_running_sessions() {
        let mut j = job(4);
        j.suspend = true;
        let mut waiting = pod("a", 0, 0, PodProgress::Active);
        waiting.assigned = false;
        let p = plan(&j, &[waiting, pod("b", 1, 0, scored(1.0))], 5, Gate::OPEN);
        assert!(p.claim.is_empty());
        assert_eq!(
            p.deliver,
            ["a"],
            "a claimed session still gets its assignment"
        );
        assert_eq!(p.release, ["b"]);
        assert!(p.stop.is_empty());
    }

    #[test]
    fn unstarted_claims_are_given_back_unused_while_running_sessions_go_on() {
        let j = job(4);
        let mut unstarted = pod("a", 0, 0, PodProgress::Active);
        unstarted.assigned = false;
        let pods = [
            unstarted,
            pod("b", 1, 0, PodProgress::Active),
            pod("c", 2, 0, scored(1.0)),
        ];
        let p = plan(&j, &pods, 5, CLOSED);
        assert_eq!(p.release, ["a", "c"], "the unstarted pod goes, unused");
        assert_eq!(p.folds.len(), 1, "only the scored session is folded");
        assert!(
            p.next.retries.is_empty(),
            "an unstarted session is not an attempt"
        );
        assert!(p.claim.is_empty() && p.deliver.is_empty());
        assert!(p.starved.is_empty(), "not starved for pool pods: on hold");
        assert_eq!(p.running, 1, "the started session keeps its pod");
    }

    #[test]
    fn while_the_job_pod_starts_sessions_are_claimed_but_none_starts() {
        let mut unassigned = pod("a", 0, 0, PodProgress::Active);
        unassigned.assigned = false;
        let p = plan(&job(4), &[unassigned.clone()], 2, CLAIM_ONLY);
        assert_eq!(p.claim, [(1, 0), (2, 0)], "claims go on");
        assert!(p.deliver.is_empty(), "no assignment goes out");
        assert_eq!(p.running, 3, "the claimed pods hold their sessions");
        let p = plan(&job(4), &[unassigned], 2, CLOSED);
        assert!(p.claim.is_empty() && p.deliver.is_empty());
        assert_eq!(p.release, ["a"], "the unstarted claim goes back");

        let warm = |name: &str, index| SessionPod {
            assigned: false,
            ..pod(name, index, 0, PodProgress::Active)
        };
        let pods = [warm("w0", 0), warm("w1", 1)];
        let open = plan(&template_job(4), &pods, 0, Gate::OPEN);
        assert_eq!(open.start, ["w0", "w1"]);
        let held = plan(&template_job(4), &pods, 0, CLAIM_ONLY);
        assert!(held.start.is_empty(), "pre-warmed pods wait, unstarted");
        assert_eq!(held.running, open.running - 2);
        assert_eq!(held.prewarm, open.prewarm, "pods still warm meanwhile");
    }

    #[test]
    fn running_after_the_writes_counts_only_claims_and_starts_that_landed() {
        let p = plan(
            &job(8),
            &[pod("a", 0, 0, PodProgress::Active)],
            3,
            Gate::OPEN,
        );
        assert_eq!(p.running, 4);
        assert_eq!(p.running_after(3, 0), 4);
        assert_eq!(
            p.running_after(1, 0),
            2,
            "two claims lost to another claimer"
        );
    }

    #[test]
    fn the_deadline_stops_running_pods_and_claims_nothing() {
        let mut j = job(4);
        j.deadline_exceeded = true;
        let p = plan(&j, &[pod("a", 0, 0, PodProgress::Active)], 5, Gate::OPEN);
        assert_eq!(p.stop, ["a"]);
        assert!(p.claim.is_empty() && p.deliver.is_empty());
    }

    #[test]
    fn a_non_finite_reward_is_recorded_as_zero_not_nan() {
        let p = plan(&job(1), &[pod("a", 0, 0, scored(f64::NAN))], 0, Gate::OPEN);
        assert_eq!(p.next.rewards.sum, 0.0);
    }

    #[test]
    fn a_finished_job_claims_nothing() {
        let mut j = job(2);
        j.completed.insert(0);
        j.failed.insert(1);
        assert!(j.finished());
        let p = plan(&j, &[], 4, Gate::OPEN);
        assert!(p.claim.is_empty());
        assert!(p.starved.is_empty());
    }

    /// A `poolTemplate` job: concurrency 2, lookahead 2.
    fn template_job(total: u32) -> JobState {
        JobState {
            concurrency: Some(2),
            lookahead: Some(2),
            ..job(total)
        }
    }

    fn waiting(name: &str, index: u32, ready: bool) -> SessionPod {
        SessionPod {
            assigned: false,
            ready,
            ..pod(name, index, 0, PodProgress::Active)
        }
    }

    #[test]
    fn a_template_job_creates_concurrency_plus_lookahead_pods_and_waits_for_them() {
        let p = plan(&template_job(10), &[], 0, Gate::OPEN);
        assert_eq!(p.prewarm, vec![(0, 0), (1, 0), (2, 0), (3, 0)]);
        // Sessions 0 and 1 could run now; their pods are only being created.
        assert_eq!(p.starved, vec![0, 1]);
        assert!(p.start.is_empty() && p.claim.is_empty());
        assert_eq!(p.running, 0);
    }

    #[test]
    fn ready_prewarmed_pods_start_up_to_the_concurrency_lowest_first() {
        let pods = [
            waiting("w3", 3, true),
            waiting("w1", 1, true),
            waiting("w0", 0, false),
            waiting("w2", 2, true),
        ];
        let p = plan(&template_job(10), &pods, 0, Gate::OPEN);
        // Room for 2: session 0 (still warming: starved) and session 1 (ready: starts).
        assert_eq!(p.start, vec!["w1".to_string()]);
        assert_eq!(p.starved, vec![0]);
        assert!(p.prewarm.is_empty(), "4 pods alive = 2 + 2");
        assert_eq!(p.running, 1);
    }

    #[test]
    fn a_finished_template_session_is_folded_and_the_window_moves_on() {
        let pods = [
            pod("r0", 0, 0, scored(1.0)),
            pod("r1", 1, 0, PodProgress::Active),
            waiting("w2", 2, true),
            waiting("w3", 3, false),
        ];
        let p = plan(&template_job(10), &pods, 0, Gate::OPEN);
        assert_eq!(p.folds.len(), 1);
        assert_eq!(p.release, vec!["r0".to_string()]);
        assert_eq!(p.start, vec!["w2".to_string()]);
        // r1 and w2 run, w3 warms: one more pod for the window (session 4).
        assert_eq!(p.prewarm, vec![(4, 0)]);
        assert_eq!(p.running, 2);
    }

    #[test]
    fn upstream_failures_of_every_folded_attempt_are_counted_once() {
        let met = |kind: &str, result: &str| {
            let mut u = UpstreamErrors::default();
            let bucket = if result == "failed" {
                &mut u.failed
            } else {
                &mut u.retried
            };
            bucket.insert(kind.into(), 2);
            u
        };
        let pods = [
            SessionPod {
                upstream: met("connect", "retried"),
                ..pod("a", 0, 0, scored(1.0))
            },
            SessionPod {
                upstream: met("timeout", "failed"),
                ..pod("b", 1, 0, infra())
            },
        ];
        let p = plan(&JobState::fresh(4, 3), &pods, 0, Gate::OPEN);
        assert_eq!(p.next.upstream.retried["connect"], 2);
        assert_eq!(p.next.upstream.failed["timeout"], 2);
        // Folded pods come back until released: not counted again.
        let again = plan(&p.next, &pods, 0, Gate::OPEN);
        assert_eq!(again.next.upstream, p.next.upstream);
    }

    #[test]
    fn a_prewarmed_pod_lost_before_its_session_started_is_replaced_not_retried() {
        let lost = SessionPod {
            assigned: false,
            ready: false,
            ..pod("w0", 0, 0, PodProgress::Lost)
        };
        let p = plan(&template_job(4), &[lost], 0, Gate::OPEN);
        assert!(p.folds.is_empty(), "{:?}", p.folds);
        assert_eq!(p.release, vec!["w0".to_string()]);
        assert!(p.next.retries.is_empty());
        assert_eq!(p.prewarm, vec![(0, 0), (1, 0), (2, 0), (3, 0)]);
    }

    /// A pool pod lost before its session started (deleted, or evicted by its node, while
    /// the job's own pod was starting) is no attempt: its session is claimed again at the same
    /// attempt, and with no retries left it is not failed. One lost after its session
    /// started is a failed attempt.
    #[test]
    fn a_pool_pod_lost_before_its_session_started_is_claimed_again_not_retried() {
        let lost = SessionPod {
            assigned: false,
            ..pod("p0", 0, 0, PodProgress::Lost)
        };
        let state = JobState::fresh(1, 0);
        let p = plan(&state, &[lost], 1, Gate::OPEN);
        assert!(p.folds.is_empty(), "{:?}", p.folds);
        assert_eq!(p.release, vec!["p0".to_string()]);
        assert!(p.next.retries.is_empty() && p.next.failed.is_empty());
        assert_eq!(p.claim, vec![(0, 0)]);
        let started = pod("p1", 0, 0, PodProgress::Lost);
        let p = plan(&state, &[started], 1, Gate::OPEN);
        assert!(p.next.failed.contains(0), "{:?}", p.folds);
    }

    /// A pool pod whose gateway never took its assignment (the round says so once deliveries
    /// have failed for the pod-start timeout): a failed attempt, retried on another pod. One
    /// whose deliveries have not failed that long, or that took it, holds its session.
    #[test]
    fn a_pool_pod_whose_gateway_never_took_its_assignment_is_a_failed_attempt() {
        let why = "its gateway did not take the session's assignment within 600s: refused";
        let stuck = SessionPod {
            assigned: false,
            start_failed: Some(why.into()),
            ..pod("p0", 0, 0, PodProgress::Active)
        };
        let waiting = SessionPod {
            assigned: false,
            ..pod("p1", 1, 0, PodProgress::Active)
        };
        let p = plan(&job(4), &[stuck, waiting], 2, Gate::OPEN);
        assert_eq!(
            p.folds,
            [(
                "p0".to_string(),
                Fold::Retry {
                    index: 0,
                    next_attempt: 1,
                    reason: why.into()
                }
            )]
        );
        assert_eq!(p.release, vec!["p0".to_string()]);
        assert_eq!(p.deliver, vec!["p1".to_string()]);
    }

    /// A pod that cannot start would be made again and fail again for good (an image that
    /// cannot be pulled, a runner that fails before its session): each is a failed attempt,
    /// so the session ends at `backoffLimit` with the pod's reason instead of holding the job.
    #[test]
    fn a_prewarmed_pod_that_cannot_start_is_a_failed_attempt() {
        let crashed = SessionPod {
            assigned: false,
            ..pod("w0", 0, 0, infra())
        };
        let stuck = SessionPod {
            start_failed: Some("its pod did not start within 600s: ErrImagePull".into()),
            ..waiting("w1", 1, false)
        };
        let p = plan(&template_job(4), &[crashed, stuck.clone()], 0, Gate::OPEN);
        assert_eq!(
            p.folds,
            [
                (
                    "w0".to_string(),
                    Fold::Retry {
                        index: 0,
                        next_attempt: 1,
                        reason: "its pod failed before its session started: evaluator crashed"
                            .into()
                    }
                ),
                (
                    "w1".to_string(),
                    Fold::Retry {
                        index: 1,
                        next_attempt: 1,
                        reason: "its pod did not start within 600s: ErrImagePull".into()
                    }
                )
            ]
        );
        assert_eq!(p.release, ["w0", "w1"]);
        assert_eq!(p.prewarm, [(0, 1), (1, 1), (2, 0), (3, 0)]);
        assert!(p.starved.contains(&0) && p.starved.contains(&1));
        // The last attempt: failed, with the pod's reason; nothing made again for it.
        let last = SessionPod {
            attempt: 2,
            ..stuck.clone()
        };
        let mut j = template_job(4);
        j.retries.insert(1, 2);
        let p = plan(&j, &[last], 0, Gate::OPEN);
        assert!(
            matches!(&p.folds[..], [(_, Fold::Failed { index: 1, reason, agent_fault: false, .. })] if reason.contains("ErrImagePull"))
        );
        assert!(p.next.failed.contains(1));
        assert!(p.prewarm.iter().all(|(i, _)| *i != 1), "{:?}", p.prewarm);
        // Past the deadline, a pod that never started is let go of, not counted.
        let late = JobState {
            deadline_exceeded: true,
            ..template_job(4)
        };
        let p = plan(&late, &[stuck], 0, Gate::OPEN);
        assert!(p.folds.is_empty() && p.release == ["w1"]);
    }

    /// The agent's own doing with nothing to score (evicted for its disk): failed at its
    /// first attempt whatever `backoffLimit` allows; a retry would be another chance at a loss.
    #[test]
    fn an_agent_fault_fails_its_session_without_a_retry() {
        let fault = PodProgress::Finished(PodResult::AgentFault {
            reason: "the agent outgrew its disk backstop".into(),
        });
        let p = plan(
            &JobState::fresh(2, 3),
            &[pod("a", 0, 0, fault)],
            2,
            Gate::OPEN,
        );
        assert!(matches!(
            &p.folds[..],
            [(_, Fold::Failed { index: 0, agent_fault: true, reason, attempt: 0 })] if reason.contains("disk backstop")
        ));
        assert!(p.next.failed.contains(0) && p.next.retries.is_empty());
        assert_eq!(p.claim, [(1, 0)], "session 0 is not claimed again");
        // Scored as the agent's failure (the job's failureReward, 0 here), as the trainer
        // trains it: the pass rate counts it. An infrastructure failure is not scored.
        let r = &p.next.rewards;
        assert_eq!((r.scored, r.sum, r.passed), (1, 0.0, 0));
        let lost = pod("a", 0, 3, infra());
        let p = plan(&JobState::fresh(2, 3), &[lost], 2, Gate::OPEN);
        assert!(p.next.failed.contains(0));
        assert_eq!(p.next.rewards.scored, 0);
    }

    #[test]
    fn a_template_retry_gets_a_fresh_pod_with_the_next_attempt() {
        let failed = pod("r0", 0, 0, infra());
        let p = plan(&template_job(3), &[failed], 0, Gate::OPEN);
        assert_eq!(p.next.retries.get(&0), Some(&1));
        assert_eq!(p.prewarm, vec![(0, 1), (1, 0), (2, 0)]);
    }

    #[test]
    fn suspend_and_deadline_stop_template_jobs_from_starting_or_creating() {
        let pods = [waiting("w0", 0, true), pod("r1", 1, 0, PodProgress::Active)];
        let suspended = JobState {
            suspend: true,
            ..template_job(10)
        };
        let p = plan(&suspended, &pods, 0, Gate::OPEN);
        assert!(p.start.is_empty() && p.prewarm.is_empty());
        assert!(p.release.is_empty(), "a suspended job keeps its warm pods");
        let late = JobState {
            deadline_exceeded: true,
            ..template_job(10)
        };
        let p = plan(&late, &pods, 0, Gate::OPEN);
        assert!(p.start.is_empty() && p.prewarm.is_empty());
        assert_eq!(p.release, vec!["w0".to_string()]);
        assert_eq!(p.stop, vec!["r1".to_string()]);
    }

    #[test]
    fn without_concurrency_a_template_job_runs_the_default_number() {
        let j = JobState {
            concurrency: None,
            lookahead: Some(0),
            ..job(100)
        };
        assert_eq!(
            plan(&j, &[], 0, Gate::OPEN).prewarm.len(),
            TEMPLATE_CONCURRENCY as usize
        );
    }
}
