//! How a run ends once its sessions are done: its files (the reward curve of a train run, the
//! dataset otherwise, `summary.json`) and its exit code. Sessions ran by then, so a file not
//! written is said and makes the run a failure (1), never bad input (2), which means nothing
//! ran.

use std::path::Path;

use serde_json::Value;

use super::held_out::RoundReport;
use super::report::{self, RunSummary};
use super::signals::Stop;

/// What the end of a run needs to know of it.
pub struct Ended<'a> {
    pub out: &'a Path,
    pub job: &'a str,
    /// The session id of the attempt each session's result is.
    pub counted: &'a std::collections::BTreeSet<String>,
    /// A train run's trainer status and its held-out rounds: the reward curve.
    pub curve: Option<(&'a Value, &'a [RoundReport])>,
    /// Not a train run: the dataset is written from these trajectories (`sft`: its filter).
    pub dataset: Option<(&'a Path, bool)>,
    pub stopped: Option<Stop>,
    /// Training failed, or the run stopped early (`stoppedEarly`).
    pub failed: bool,
    /// Sessions a resumed run found done: not finished in this run's wall time.
    pub ran_before: u64,
}

/// Writes the run's files and says which exit code the run ends with.
pub fn write(summary: &mut RunSummary, ended: &Ended) -> i32 {
    per_minute_of_this_run(summary, ended.ran_before);
    let mut unwritten = false;
    let mut said = |what: &str, e: &dyn std::fmt::Display| {
        eprintln!("floe run: {what} not written: {e}");
        unwritten = true;
    };
    if let Some((status, rounds)) = ended.curve {
        if let Err(e) = super::curve::write(ended.out, status, rounds, ended.job) {
            said("reward-curve.svg", &e);
        }
    }
    if let Some((trajectories, sft)) = ended.dataset {
        match report::dataset(trajectories, ended.out, sft, ended.counted) {
            Ok(dataset) => summary.dataset = dataset,
            Err(e) => said("dataset.jsonl", &e),
        }
    }
    let written = serde_json::to_string_pretty(&summary)
        .map_err(|e| e.to_string())
        .and_then(|json| {
            floe_gateway::ship::write_durably(&ended.out.join("summary.json"), json.as_bytes())
                .map_err(|e| e.to_string())
        });
    if let Err(e) = written {
        said("summary.json", &e);
    }
    print!("{}", super::progress::table(summary));
    exit_code(summary, ended, unwritten)
}

/// `sessionsPerMinute` of the sessions this run finished, in its wall time.
fn per_minute_of_this_run(summary: &mut RunSummary, ran_before: u64) {
    let s = &summary.sessions;
    let finished = s
        .total
        .saturating_sub(s.not_finished)
        .saturating_sub(ran_before);
    let wall = summary.timings.wall_seconds;
    summary.timings.sessions_per_minute = if wall > 0.0 {
        finished as f64 * 60.0 / wall
    } else {
        0.0
    };
}

fn exit_code(summary: &RunSummary, ended: &Ended, unwritten: bool) -> i32 {
    if let Some(stop) = ended.stopped {
        stop.exit_code()
    } else if ended.failed
        || unwritten
        || summary.sessions.infra_error + summary.sessions.evaluator_timeout > 0
        // Not every session ran, yet nothing stopped the run.
        || summary.sessions.not_finished > 0
    {
        1
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resumed_runs_pace_counts_the_sessions_it_finished() {
        let mut summary = report::summarize("j", "train", &[], 120.0, false);
        summary.sessions.total = 10;
        summary.sessions.not_finished = 2;
        // 6 of the 8 finished were done before the resume: 2 in 2 minutes.
        per_minute_of_this_run(&mut summary, 6);
        assert_eq!(summary.timings.sessions_per_minute, 1.0);
    }
}
