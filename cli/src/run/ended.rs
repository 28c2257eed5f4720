//! A session's runner returned: its result as the run records it, in `summary.json` and beside
//! its capture (`sessions/<id>/summary.json`, which `--resume` reads).

use std::collections::BTreeMap;
use std::path::PathBuf;

use floe_gateway::capture::upstream_errors::UpstreamErrors;
use floe_sandbox::runner::RunReport;

use super::held_out::HeldOut;
use super::progress::Progress;
use super::queue::{self, Attempt};
use super::report::SessionResult;

/// What a session's task returns: its attempt, its directory, its runner's report and its wall
/// time in seconds.
pub type Joined = (Attempt, PathBuf, RunReport, f64);

/// The session's id and result, written beside its capture; its model server's failures are
/// added to the run's.
pub fn result(joined: Joined, upstream: &mut UpstreamErrors) -> (Attempt, String, SessionResult) {
    let (attempt, slot, mut report, wall) = joined;
    queue::unshipped_is_infrastructure(&mut report);
    let session = report
        .summary
        .session
        .clone()
        .unwrap_or_else(|| "unassigned".into());
    if let Some(errors) = &report.summary.upstream_errors {
        upstream.add(errors);
    }
    let result = SessionResult {
        task: report.summary.task.clone().unwrap_or_default(),
        summary: Some(report.summary),
        wall_seconds: wall,
    };
    if let Err(e) = super::resume::write_result(&slot, &result) {
        // The run's own summary still counts it; a resume decides it afresh.
        eprintln!("[run] {session}: summary.json not written: {e}");
    }
    (attempt, session, result)
}

/// One attempt's runner to its report. A runner that panics is its attempt's infrastructure
/// failure (retried, and told to the trainer), not a session the run forgets.
pub async fn run_caught(
    config: &floe_sandbox::runner::RunnerConfig,
    session: &str,
    task: &str,
) -> RunReport {
    use futures::FutureExt;
    std::panic::AssertUnwindSafe(floe_sandbox::runner::run(config))
        .catch_unwind()
        .await
        .unwrap_or_else(|panic| panicked(session, task, panic.as_ref()))
}

/// Posts a session's assignment to the run's gateway.
pub async fn post_assignment(
    http: reqwest::Client,
    url: String,
    token: String,
    assignment: floe_gateway::ship::Assignment,
) -> Result<(), String> {
    let resp = http
        .post(format!("{url}/floe/v1/assignments"))
        .bearer_auth(&token)
        .json(&assignment)
        .send()
        .await
        .map_err(|e| format!("posting an assignment: {e}"))?;
    if resp.status().is_success() {
        Ok(())
    } else {
        let body = resp.text().await.unwrap_or_default();
        Err(format!("the gateway refused an assignment: {body}"))
    }
}

/// The report of an attempt whose runner panicked: an infrastructure failure, saying so.
pub fn panicked(session: &str, task: &str, panic: &(dyn std::any::Any + Send)) -> RunReport {
    let why = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".into());
    RunReport {
        exit: floe_sandbox::summary::ExitKind::Infrastructure,
        summary: floe_sandbox::summary::Summary {
            session: Some(session.into()),
            task: Some(task.into()),
            status: "infra_error".into(),
            error: Some(format!("the session's runner panicked: {why}")),
            ..Default::default()
        },
    }
}

/// Sessions whose runners had returned when the run was stopped (a signal, a failure, a cause
/// every session shares), before the run took their results: counted as they ended, not as
/// never finished. The run stops, so none is retried.
pub fn before_the_stop(
    ended: Vec<Joined>,
    results: &mut BTreeMap<usize, SessionResult>,
    mut held_out: Option<&mut HeldOut>,
    upstream: &mut UpstreamErrors,
    progress: &mut Progress,
) {
    for joined in ended {
        let (attempt, session, result) = result(joined, upstream);
        match held_out.as_deref_mut().filter(|h| h.owns(attempt.index)) {
            Some(h) => {
                if let Some(round) = h.ended(attempt.index, result) {
                    progress.held_out(&round);
                }
            }
            None => {
                progress.finished(&session, &result);
                results.insert(attempt.index, result);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use floe_sandbox::summary::{ExitKind, Summary};
    use futures::FutureExt;

    fn joined(dir: &std::path::Path, index: usize, session: &str, status: &str) -> Joined {
        let slot = dir.join(session);
        std::fs::create_dir_all(&slot).expect("mkdir");
        let summary = Summary {
            session: Some(session.into()),
            task: Some("t".into()),
            status: status.into(),
            reward: Some(1.0),
            ..Default::default()
        };
        let report = RunReport {
            exit: ExitKind::Success,
            summary,
        };
        (Attempt { index, attempt: 0 }, slot, report, 2.0)
    }

    /// A runner that panicked is an infrastructure failure of its attempt, which the run
    /// retries and tells the trainer of, never a session it loses (and exits 0 over).
    #[tokio::test]
    async fn a_runner_that_panics_is_its_attempts_infrastructure_failure() {
        let caught = std::panic::AssertUnwindSafe(async {
            panic!("index out of bounds");
        })
        .catch_unwind()
        .await
        .map(|()| unreachable_report())
        .unwrap_or_else(|p| panicked("j-t-0", "t", p.as_ref()));
        assert_eq!(caught.summary.status, "infra_error");
        assert_eq!(caught.summary.session.as_deref(), Some("j-t-0"));
        assert_eq!(caught.summary.task.as_deref(), Some("t"));
        assert_eq!(
            caught.summary.error.as_deref(),
            Some("the session's runner panicked: index out of bounds")
        );
        assert!(queue::is_infrastructure(&caught.summary.status));
    }

    fn unreachable_report() -> RunReport {
        RunReport {
            exit: ExitKind::Success,
            summary: Summary::default(),
        }
    }

    /// A session that ended just before Ctrl-C is the run's result as it ended, and `--resume`
    /// finds it done; before, the stop dropped it and the summary said it never finished.
    #[tokio::test]
    async fn sessions_that_ended_before_the_stop_are_counted_as_they_ended() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut running = tokio::task::JoinSet::new();
        let done = joined(dir.path(), 0, "j-t-0", "completed");
        let first = running.spawn(async move { done });
        let slow = joined(dir.path(), 1, "j-t-1", "completed");
        running.spawn(async move {
            tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
            slow
        });
        // The first has returned; the second is still running when the stop comes.
        while !first.is_finished() {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        let mut progress = Progress::new(2);
        let late = progress.cancel(&mut running, "stopped").await;
        assert_eq!(late.len(), 1, "only the one that returned");
        let mut results = BTreeMap::new();
        let mut upstream = UpstreamErrors::default();
        before_the_stop(late, &mut results, None, &mut upstream, &mut progress);
        let recorded: Vec<(usize, Option<&str>)> = results
            .iter()
            .map(|(i, r)| (*i, r.summary.as_ref().map(|s| s.status.as_str())))
            .collect();
        assert_eq!(recorded, [(0, Some("completed"))]);
        assert!(dir.path().join("j-t-0/summary.json").is_file());
        assert!(!dir.path().join("j-t-1/summary.json").exists());
    }
}
