//! Which session attempt a local run starts next, and what follows each attempt's end (pure).
//!
//! Sessions are numbered in tasks × samples order (task-major: each GRPO group's samples
//! together). An attempt that failed by infrastructure (`infra_error`, `evaluator_timeout`) is
//! run again as the session's next attempt — its own session id, the same group and sample —
//! until `backoffLimit` retries are spent, like the operator does on a cluster. A retry goes to
//! the front: its batch is the oldest one still open (train mode starts batches in order).
//! The last attempt is the session's result.

use std::collections::VecDeque;

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
    backoff_limit: u32,
    /// Attempts started beyond each session's first.
    pub retries: u64,
}

impl Queue {
    /// `sessions`: each session's first attempt to run (a resumed run starts some later).
    pub fn new(sessions: impl IntoIterator<Item = Attempt>, backoff_limit: u32) -> Self {
        Self {
            pending: sessions.into_iter().collect(),
            backoff_limit,
            retries: 0,
        }
    }

    pub fn peek(&self) -> Option<Attempt> {
        self.pending.front().copied()
    }

    pub fn pop(&mut self) -> Option<Attempt> {
        self.pending.pop_front()
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// An attempt ended with `status`. Returns the retry queued, if any. `first` is the
    /// attempt number this run started the session at (retries are counted from there).
    pub fn ended(&mut self, done: Attempt, status: &str, first: u32) -> Option<Attempt> {
        let used = done.attempt.saturating_sub(first);
        if !is_infrastructure(status) || used >= self.backoff_limit {
            return None;
        }
        let retry = Attempt {
            index: done.index,
            attempt: done.attempt + 1,
        };
        self.pending.push_front(retry);
        self.retries += 1;
        Some(retry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn firsts(n: usize) -> Vec<Attempt> {
        (0..n).map(|index| Attempt { index, attempt: 0 }).collect()
    }

    #[test]
    fn infrastructure_failures_are_retried_first_until_the_backoff_limit() {
        let mut q = Queue::new(firsts(3), 2);
        let a = q.pop().expect("first");
        assert_eq!(q.ended(a, "completed", 0), None);
        let b = q.pop().expect("second");
        assert_eq!(b.index, 1);
        let r1 = q.ended(b, "infra_error", 0).expect("retried");
        assert_eq!(
            r1,
            Attempt {
                index: 1,
                attempt: 1
            }
        );
        // The retry runs before the sessions that have not started.
        assert_eq!(q.peek(), Some(r1));
        let r1 = q.pop().expect("retry");
        let queued = q.ended(r1, "evaluator_timeout", 0).expect("second retry");
        let r2 = q.pop().expect("r2");
        assert_eq!(r2, queued);
        assert_eq!(q.ended(r2, "infra_error", 0), None, "backoffLimit spent");
        assert_eq!(q.retries, 2);
        assert_eq!(
            q.pop(),
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
        let a = q.pop().expect("one");
        for status in ["agent_failed", "agent_timeout", "completed"] {
            assert_eq!(q.ended(a, status, 0), None, "{status}");
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
        let a = q.pop().expect("resumed");
        assert!(q.ended(a, "infra_error", 4).is_some());
        let b = q.pop().expect("retry");
        assert!(q.ended(b, "infra_error", 4).is_none());
    }
}
