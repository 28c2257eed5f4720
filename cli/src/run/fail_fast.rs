//! When a run's first attempts all fail by infrastructure for one and the same cause (the sandbox
//! cannot start, a program the harness needs is missing), no retry will fix it: the run stops
//! with that cause instead of spending every session's `backoffLimit` on it (pure).
//!
//! Armed only until the first attempt that ends any other way: once one session ran, a later
//! failure is one session's, and retries are the answer. Failures at the model server (calls
//! the gateway retried and gave up on) are left to the retries too: an outage ends.

use std::collections::BTreeSet;

/// Attempts that must fail alike before the run stops, across at least two tasks (sessions
/// are numbered task by task, so the first ones are often all one task's samples: a cause of
/// that task alone, a prepare step or a prompt too long, must not stop the run).
const ALIKE: usize = 4;

#[derive(Debug, Default)]
pub struct FailFast {
    disarmed: bool,
    cause: Option<String>,
    tasks: BTreeSet<String>,
    alike: usize,
}

/// One ended attempt, as the verdict needs it.
pub struct Ended<'a> {
    /// The session's task.
    pub task: &'a str,
    /// Its id, left out of the cause so that two sessions' messages compare equal.
    pub session: &'a str,
    pub status: &'a str,
    pub error: Option<&'a str>,
    /// Model calls that failed at the model server after the gateway's retries.
    pub failed_calls: u64,
}

impl FailFast {
    /// Records an ended attempt; `Some(cause)` when the run should stop now.
    pub fn ended(&mut self, attempt: &Ended<'_>) -> Option<String> {
        if self.disarmed {
            return None;
        }
        if attempt.status != "infra_error" {
            self.disarmed = true;
            return None;
        }
        if attempt.failed_calls > 0 {
            return None;
        }
        let cause = normalized(attempt.error.unwrap_or("no cause given"), attempt.session);
        if self.cause.as_ref() != Some(&cause) {
            self.cause = Some(cause);
            self.tasks.clear();
            self.alike = 0;
        }
        self.tasks.insert(attempt.task.to_string());
        self.alike += 1;
        (self.alike >= ALIKE && self.tasks.len() >= 2)
            .then(|| attempt.error.unwrap_or("no cause given").to_string())
    }
}

/// The message without what differs from session to session: its id, and numbers (ports,
/// process ids, durations).
fn normalized(message: &str, session: &str) -> String {
    let without_id = if session.is_empty() {
        message.to_string()
    } else {
        message.replace(session, "<session>")
    };
    let mut out = String::with_capacity(without_id.len());
    let mut in_number = false;
    for c in without_id.chars() {
        if c.is_ascii_digit() {
            if !in_number {
                out.push('#');
            }
            in_number = true;
        } else {
            in_number = false;
            out.push(c);
        }
    }
    out
}

/// The line the run stops with: what failed, then what to do.
pub fn explain(cause: &str) -> String {
    let hint = if cause.contains("bwrap") {
        " — the sandbox could not start (bubblewrap); `floe run --no-sandbox` runs without it, docs/troubleshooting.md#the-sandbox-cannot-start"
    } else if cause.contains("the harness exited 127") || cause.contains("not found") {
        " — a program the harness or evaluator runs is missing inside the sandbox"
    } else {
        ""
    };
    format!("the first sessions all failed alike by infrastructure, so no retry will help; stopping: {cause}{hint}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn infra<'a>(task: &'a str, session: &'a str, error: &'a str) -> Ended<'a> {
        Ended {
            task,
            session,
            status: "infra_error",
            error: Some(error),
            failed_calls: 0,
        }
    }

    const BWRAP: &str = "no model call was answered; the harness exited 1: bwrap: Can't find source path out/sessions/";

    #[test]
    fn the_same_cause_across_sessions_stops_the_run() {
        let mut f = FailFast::default();
        let msg = |s: &str| format!("{BWRAP}{s}/workspace");
        let (a0, b0, a1, b1) = (msg("j-a-0"), msg("j-b-0"), msg("j-a-0-r1"), msg("j-b-0-r1"));
        assert_eq!(f.ended(&infra("a", "j-a-0", &a0)), None);
        assert_eq!(f.ended(&infra("b", "j-b-0", &b0)), None);
        assert_eq!(f.ended(&infra("a", "j-a-0-r1", &a1)), None);
        assert_eq!(f.ended(&infra("b", "j-b-0-r1", &b1)), Some(b1.clone()));
        assert!(explain(&b1).contains("the sandbox could not start"));
    }

    #[test]
    fn one_task_failing_again_and_again_is_that_task_s() {
        // Its samples and their retries alike (a prepare step of that task, say): the run
        // goes on to the other tasks.
        let mut f = FailFast::default();
        for (sample, attempt) in [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)] {
            let id = format!("j-a-{sample}-r{attempt}");
            let e = format!("task prepare step failed in {id}: exit 1");
            assert_eq!(f.ended(&infra("a", &id, &e)), None);
        }
    }

    #[test]
    fn a_session_that_ran_disarms_it_and_model_server_failures_never_count() {
        let mut f = FailFast::default();
        let outage = Ended {
            failed_calls: 2,
            ..infra("a", "a", "2 model call(s) failed at the model server")
        };
        for _ in 0..5 {
            assert_eq!(f.ended(&outage), None);
        }
        assert_eq!(
            f.ended(&Ended {
                status: "agent_failed",
                error: None,
                ..infra("b", "b", "")
            }),
            None
        );
        for task in ["a", "b", "c", "d", "e", "f"] {
            assert_eq!(f.ended(&infra(task, "x", "the same")), None);
        }
    }

    #[test]
    fn different_causes_do_not_add_up() {
        let mut f = FailFast::default();
        for (i, e) in ["one", "two", "one", "two", "one", "two"]
            .iter()
            .enumerate()
        {
            assert_eq!(f.ended(&infra(["a", "b", "c"][i % 3], "s", e)), None);
        }
    }
}
