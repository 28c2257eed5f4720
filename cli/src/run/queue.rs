//! Which session attempt a local run starts next, and what follows each attempt's end (pure).
//!
//! Sessions are numbered in tasks × samples order (task-major: each GRPO group's samples
//! together). An attempt that failed by infrastructure (`infra_error`, `evaluator_timeout`) is
//! run again as the session's next attempt — its own session id, the same group and sample —
//! until `backoffLimit` retries are spent, like the operator does on a cluster. A retry goes to
//! the front: its batch is the oldest one still open (train mode starts batches in order).
//! The last attempt is the session's result. A retry waits first, longer each time (1 s, 2 s,
//! 4 s, … at most 30 s): a cause that passes gets time to pass, and sessions not yet started
//! go ahead meanwhile.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

/// The wait before a session's `n`th retry (1-based).
pub fn retry_backoff(n: u32) -> Duration {
    Duration::from_secs(1u64 << n.saturating_sub(1).min(5)).min(Duration::from_secs(30))
}

/// One attempt of one session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attempt {
    /// The session's place in tasks × samples order.
    pub index: usize,
    /// 0 for the first; `-r<attempt>` in the session id after that.
    pub attempt: u32,
}

/// Outcomes that are the infrastructure's: the session says nothing about the policy.
pub fn is_infrastructure(status: &str) -> bool {
    matches!(status, "infra_error" | "evaluator_timeout")
}

#[derive(Debug, Default)]
pub struct Queue {
    pending: VecDeque<Attempt>,
    /// Retries not to start before their time.
    not_before: BTreeMap<(usize, u32), Instant>,
    backoff_limit: u32,
    /// Attempts started beyond each session's first.
    pub retries: u64,
}

impl Queue {
    /// `sessions`: each session's first attempt to run (a resumed run starts some later).
    pub fn new(sessions: impl IntoIterator<Item = Attempt>, backoff_limit: u32) -> Self {
        Self {
            pending: sessions.into_iter().collect(),
            not_before: BTreeMap::new(),
            backoff_limit,
            retries: 0,
        }
    }

    fn ready(&self, a: &Attempt, now: Instant) -> bool {
        self.not_before
            .get(&(a.index, a.attempt))
            .is_none_or(|t| *t <= now)
    }

    /// The first attempt that may start at `now`.
    pub fn peek(&self, now: Instant) -> Option<Attempt> {
        self.pending.iter().find(|a| self.ready(a, now)).copied()
    }

    /// Attempts to start before every pending one, in their order (a held-out round).
    pub fn run_first(&mut self, attempts: Vec<Attempt>) {
        for a in attempts.into_iter().rev() {
            self.pending.push_front(a);
        }
    }

    pub fn pop(&mut self, now: Instant) -> Option<Attempt> {
        let at = self.pending.iter().position(|a| self.ready(a, now))?;
        let a = self.pending.remove(at)?;
        self.not_before.remove(&(a.index, a.attempt));
        Some(a)
    }

    /// When the next waiting retry may start, if one waits and nothing else is ready.
    pub fn next_ready(&self, now: Instant) -> Option<Instant> {
        if self.peek(now).is_some() {
            return None;
        }
        self.not_before.values().min().copied()
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// An attempt ended with `status`. Returns the retry queued, if any. `first` is the
    /// attempt number this run started the session at (retries are counted from there).
    pub fn ended(
        &mut self,
        done: Attempt,
        status: &str,
        first: u32,
        now: Instant,
    ) -> Option<Attempt> {
        let used = done.attempt.saturating_sub(first);
        if !is_infrastructure(status) || used >= self.backoff_limit {
            return None;
        }
        let retry = Attempt {
            index: done.index,
            attempt: done.attempt + 1,
        };
        self.not_before
            .insert((retry.index, retry.attempt), now + retry_backoff(used + 1));
        self.pending.push_front(retry);
        self.retries += 1;
        Some(retry)
    }
}

/// A session the runner scored but whose trajectory was not shipped (the trainer refused it,
/// or it was still pending past `ship_wait`) ended by infrastructure, as the runner's exit
/// says: never scored, retried (the sandbox contract's rule, which a pod follows by its exit
/// code); counted as completed, its group would have waited for a sample never trained.
pub fn unshipped_is_infrastructure(report: &mut floe_sandbox::runner::RunReport) {
    if report.exit == floe_sandbox::summary::ExitKind::Infrastructure
        && !is_infrastructure(&report.summary.status)
    {
        report.summary.status = "infra_error".into();
        report.summary.reward = None;
        report.summary.passed = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static START: std::sync::LazyLock<Instant> = std::sync::LazyLock::new(Instant::now);
    const NOW: u64 = 0;
    /// Past every backoff.
    const LATER: u64 = 1000;

    fn at(secs: u64) -> Instant {
        *START + Duration::from_secs(secs)
    }

    fn firsts(n: usize) -> Vec<Attempt> {
        (0..n).map(|index| Attempt { index, attempt: 0 }).collect()
    }

    #[test]
    fn infrastructure_failures_are_retried_first_until_the_backoff_limit() {
        let mut q = Queue::new(firsts(3), 2);
        let a = q.pop(at(LATER)).expect("first");
        assert_eq!(q.ended(a, "completed", 0, at(NOW)), None);
        let b = q.pop(at(LATER)).expect("second");
        assert_eq!(b.index, 1);
        let r1 = q.ended(b, "infra_error", 0, at(NOW)).expect("retried");
        assert_eq!(
            r1,
            Attempt {
                index: 1,
                attempt: 1
            }
        );
        // The retry runs before the sessions that have not started.
        assert_eq!(q.peek(at(LATER)), Some(r1));
        let r1 = q.pop(at(LATER)).expect("retry");
        let queued = q
            .ended(r1, "evaluator_timeout", 0, at(NOW))
            .expect("second retry");
        let r2 = q.pop(at(LATER)).expect("r2");
        assert_eq!(r2, queued);
        assert_eq!(
            q.ended(r2, "infra_error", 0, at(NOW)),
            None,
            "backoffLimit spent"
        );
        assert_eq!(q.retries, 2);
        assert_eq!(
            q.pop(at(LATER)),
            Some(Attempt {
                index: 2,
                attempt: 0
            })
        );
        assert!(q.is_empty());
    }

    #[test]
    fn the_policy_s_failures_are_never_retried() {
        let mut q = Queue::new(firsts(1), 5);
        let a = q.pop(at(LATER)).expect("one");
        for status in ["agent_failed", "agent_timeout", "completed"] {
            assert_eq!(q.ended(a, status, 0, at(NOW)), None, "{status}");
        }
        assert_eq!(q.retries, 0);
    }

    #[test]
    fn a_resumed_session_gets_its_retries_from_where_it_starts() {
        let mut q = Queue::new(
            [Attempt {
                index: 0,
                attempt: 4,
            }],
            1,
        );
        let a = q.pop(at(LATER)).expect("resumed");
        assert!(q.ended(a, "infra_error", 4, at(NOW)).is_some());
        let b = q.pop(at(LATER)).expect("retry");
        assert!(q.ended(b, "infra_error", 4, at(NOW)).is_none());
    }

    #[test]
    fn a_retry_waits_longer_each_time_while_other_sessions_start() {
        assert_eq!(retry_backoff(1), Duration::from_secs(1));
        assert_eq!(retry_backoff(3), Duration::from_secs(4));
        assert_eq!(retry_backoff(40), Duration::from_secs(30));
        let mut q = Queue::new(firsts(2), 3);
        let a = q.pop(at(0)).expect("first");
        let retry = q.ended(a, "infra_error", 0, at(10)).expect("retried");
        // Not before 1 s: the session not yet started goes first.
        assert_eq!(q.peek(at(10)).map(|a| a.index), Some(1));
        let b = q.pop(at(10)).expect("second");
        assert_eq!(b.index, 1);
        assert_eq!(q.peek(at(10)), None);
        assert_eq!(q.next_ready(at(10)), Some(at(11)));
        assert_eq!(q.pop(at(11)), Some(retry));
        // The second retry waits 2 s.
        q.ended(retry, "infra_error", 0, at(20)).expect("again");
        assert_eq!(q.pop(at(21)), None);
        assert!(q.pop(at(22)).is_some());
    }
}

#[cfg(test)]
mod unshipped_tests {
    use floe_sandbox::runner::RunReport;
    use floe_sandbox::summary::{ExitKind, Summary};

    fn report(exit: ExitKind, status: &str) -> RunReport {
        RunReport {
            exit,
            summary: Summary {
                status: status.into(),
                reward: Some(1.0),
                passed: Some(true),
                ..Default::default()
            },
        }
    }

    #[test]
    fn a_scored_session_whose_trajectory_was_not_shipped_is_infrastructure() {
        let mut unshipped = report(ExitKind::Infrastructure, "completed");
        super::unshipped_is_infrastructure(&mut unshipped);
        assert_eq!(unshipped.summary.status, "infra_error");
        assert_eq!(
            (unshipped.summary.reward, unshipped.summary.passed),
            (None, None)
        );
        let mut shipped = report(ExitKind::Success, "completed");
        super::unshipped_is_infrastructure(&mut shipped);
        assert_eq!(
            (shipped.summary.status.as_str(), shipped.summary.reward),
            ("completed", Some(1.0))
        );
    }
}
