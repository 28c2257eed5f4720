//! Continuing an interrupted local run in its own `--out` (`floe run --resume`).
//!
//! A run writes `run.json` first: the job's name, its mode and every session's first
//! assignment. `--resume` reads it back and refuses to continue a different job (the job file,
//! its task file or `--sessions` changed: the two halves would not be one dataset). Then:
//! - a session whose last attempt was scored (`sessions/<id>/summary.json`) is done and is
//!   not run again; its result counts in the new summary. So is one whose scored trajectory
//!   was already delivered (`trajectories/*/<id>.json`, or in a train run the trainer's spool
//!   entry `captures/.spool/{shipped,pending}/<id>.json`) when the run was killed before its
//!   `summary.json`: running it again would put a second sample of its group in the dataset
//!   or train it twice;
//! - any other session runs again as a new attempt, numbered past every attempt the earlier
//!   run started (its captures keep their ids, so nothing is overwritten or shipped twice).
//!
//! A train run's trainer resumes from its latest checkpoint in `--out` and replays what it
//! acknowledged but had not trained by then; the interrupted run's trainer sink (address and
//! token) is not part of what must match, and what it had spooled for that trainer is
//! redirected to the new one.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use floe_gateway::ship::{Assignment, Sink};
use serde::{Deserialize, Serialize};

use floe_crds::rollout_job::Task;
use floe_sandbox::session::held_out_session_id;

use super::held_out::Rounds;
use super::queue::is_infrastructure;
use super::report::SessionResult;

pub const RUN_FILE: &str = "run.json";

#[derive(Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunRecord {
    pub job: String,
    pub mode: String,
    /// Every session's first attempt, in order.
    pub assignments: Vec<Assignment>,
    /// A train job's held-out set (`train.heldOut`: its tasks and samples), as the operator
    /// records it: a resumed run carries the earlier rounds over only from the same set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_out_digest: Option<String>,
    /// The policy the run trains or samples: a train job's model and adapter (`train.model`,
    /// `train.lora`: what its checkpoints are made of), an sft run's model name
    /// ([`RunRecord::sampling`]). Resumed under another, a checkpoint of one model went on
    /// against another's KL reference and tokenizer, or one dataset mixed two policies'
    /// sessions (a review, session 85). Settings of how it trains (batch sizes, the learning
    /// rate, memory, checkpoints) may change between runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_digest: Option<String>,
}

/// What an earlier run left: results of the sessions that are done, and the first attempt
/// number free for each session that is not.
#[derive(Debug, Default)]
pub struct Earlier {
    pub done: BTreeMap<usize, SessionResult>,
    pub next_attempt: BTreeMap<usize, u32>,
    /// Attempts beyond each session's first that the earlier run started.
    pub retries: u64,
    /// The upstream failures of every attempt it finished.
    pub upstream: floe_gateway::capture::upstream_errors::UpstreamErrors,
    /// The held-out rounds it measured, carried into this run's.
    pub held_out: Rounds,
}

impl RunRecord {
    /// The record of a run of `plan` whose sessions' first attempts are `assignments`.
    pub fn of(plan: &super::plan::Plan, mode: &str, assignments: Vec<Assignment>) -> Self {
        let digest =
            |_| floe_operator::rollout::held_out_digest(&plan.held_out, plan.held_out_samples());
        let train = plan.job.spec.train.as_ref();
        let policy = train.map(|t| {
            let material = serde_json::json!({"model": t.model, "lora": t.lora});
            floe_operator::stable_hash::of_json(&material)
        });
        Self {
            job: plan.name.clone(),
            mode: mode.into(),
            assignments,
            held_out_digest: plan.held_out_spec().map(digest),
            policy_digest: policy,
        }
    }

    /// An sft run's record, with the model its calls name upstream (`None`: a train run's,
    /// whose policy is its `spec.train`).
    pub fn sampling(mut self, model: Option<&str>) -> Self {
        if let Some(model) = model {
            let material = serde_json::json!({"sftModel": model});
            self.policy_digest = Some(floe_operator::stable_hash::of_json(&material));
        }
        self
    }
}

/// What a run starts from: a new run writes its record in `out`; `--resume` checks the record
/// there, and returns the earlier run's for [`earlier`].
pub fn begin(
    out: &Path,
    record: &RunRecord,
    resume: bool,
) -> Result<Option<RunRecord>, super::RunError> {
    use super::RunError::{Io, Preflight};
    if !resume {
        write_record(out, record).map_err(Io)?;
        return Ok(None);
    }
    let before = check_record(out, record).map_err(Preflight)?;
    // The earlier run's summary is of that run: were this one killed, it would read as this
    // run's, finished. Written again at this run's end.
    match std::fs::remove_file(out.join("summary.json")) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(Io(format!("{}: {e}", out.display())))
        }
        _ => {}
    }
    Ok(Some(before))
}

/// What the earlier run in `out` left (`before`, its record; `None` for a new run), its
/// held-out rounds included. Read once the gateway has recovered the earlier run's sessions:
/// a session whose outcome it had recorded but not yet spooled when the run was killed is
/// spooled then, and so is done, not run again (a second sample of its group in the dataset,
/// or trained twice).
pub fn earlier(
    out: &Path,
    plan: &super::plan::Plan,
    record: RunRecord,
    before: Option<RunRecord>,
) -> Result<Earlier, super::RunError> {
    use super::RunError::{Io, Preflight};
    let Some(before) = before else {
        return Ok(Earlier::default());
    };
    let mut earlier = read(out, &record.assignments).map_err(Preflight)?;
    match (&before.held_out_digest, &record.held_out_digest) {
        // The same set (checked).
        (Some(_), Some(_)) => {
            let samples = plan.held_out_samples();
            earlier.held_out =
                read_rounds(out, &plan.name, &plan.held_out, samples).map_err(Preflight)?;
        }
        // A record without the set's digest (no held-out set then, or a floe from before
        // digests): its rounds may be of another set, so none is carried over. Recorded now,
        // so a later resume checks it.
        (None, Some(_)) => write_record(out, &record).map_err(Io)?,
        _ => {}
    }
    Ok(earlier)
}

pub fn write_record(out: &Path, record: &RunRecord) -> Result<(), String> {
    let text = serde_json::to_vec_pretty(record).map_err(|e| e.to_string())?;
    // Whole or not at all: a torn record would make the run impossible to resume.
    floe_gateway::ship::write_durably(&out.join(RUN_FILE), &text)
        .map_err(|e| format!("{}: {e}", out.display()))
}

/// A train run's `--resume`, checked before vLLM and the trainer start (minutes, a GPU, and
/// a trainer that replays its stored trajectories under a job that changed): the record holds
/// no trainer address or token, so a placeholder sink compares the same.
pub fn check_before_training(
    out: &Path,
    plan: &super::plan::Plan,
    sessions: Option<usize>,
) -> Result<(), String> {
    let sink = Sink::Trainer {
        url: String::new(),
        token: None,
        snapshots: false,
    };
    let record = RunRecord::of(plan, "train", super::plan::expand(plan, &sink, sessions));
    check_record(out, &record).map(|_| ())
}

/// The earlier run's record, when `now` may continue it.
pub fn check_record(out: &Path, now: &RunRecord) -> Result<RunRecord, String> {
    let path = out.join(RUN_FILE);
    let text = std::fs::read(&path).map_err(|e| {
        format!(
            "--resume: {} is unreadable ({e}): --out does not hold a floe run",
            path.display()
        )
    })?;
    let before: RunRecord = serde_json::from_slice(&text)
        .map_err(|e| format!("--resume: {} is not a run record: {e}", path.display()))?;
    if before.job != now.job || before.mode != now.mode {
        return Err(format!(
            "--resume: --out holds a run of {} job {:?}, not of {} job {:?}",
            before.mode, before.job, now.mode, now.job
        ));
    }
    if let (Some(was), Some(is)) = (&before.held_out_digest, &now.held_out_digest) {
        if was != is {
            return Err(format!(
                "--resume: the job's held-out set (train.heldOut: its tasks or samples) differs from the earlier run's (digest {was} then, {is} now): its rounds would not be one curve; restore it, or use a new --out"
            ));
        }
    }
    if let (Some(was), Some(is)) = (&before.policy_digest, &now.policy_digest) {
        if was != is {
            return Err(format!(
                "--resume: the job's policy (train.model or train.lora; an sft run's model) differs from the earlier run's (digest {was} then, {is} now): the run would go on with another policy than the one it trained or sampled; restore it, or use a new --out"
            ));
        }
    }
    // The first session that differs, or where the shorter list ends.
    let (b, n) = (&before.assignments, &now.assignments);
    let differs = b
        .iter()
        .zip(n)
        .position(|(x, y)| comparable(x) != comparable(y))
        .or((b.len() != n.len()).then(|| b.len().min(n.len())));
    if let Some(first) = differs {
        return Err(format!(
            "--resume: the job's sessions differ from the earlier run's from session {first} on (job file, task file or --sessions changed); resume with the same ones, or use a new --out"
        ));
    }
    Ok(before)
}

/// An assignment without what differs between two runs of the same job: a train run's
/// trainer listens on a new address with a new ingest token each time it starts; `imitation`
/// follows the job's mode, which the record checks already, and a run of an earlier floe
/// recorded none.
fn comparable(a: &Assignment) -> Assignment {
    let mut a = a.clone();
    a.imitation = false;
    if let Sink::Trainer { url, token, .. } = &mut a.sink {
        url.clear();
        *token = None;
    }
    a
}

/// `base` or `base-r<N>` → (base, N).
fn split_attempt(id: &str, firsts: &HashMap<&str, usize>) -> Option<(usize, u32)> {
    if let Some(index) = firsts.get(id) {
        return Some((*index, 0));
    }
    let (base, n) = id.rsplit_once("-r")?;
    let attempt = n.parse().ok()?;
    firsts.get(base).map(|index| (*index, attempt))
}

/// Read what the earlier run in `out` left, for sessions numbered as in `assignments`.
pub fn read(out: &Path, assignments: &[Assignment]) -> Result<Earlier, String> {
    let firsts: HashMap<&str, usize> = assignments
        .iter()
        .enumerate()
        .map(|(i, a)| (a.session.as_str(), i))
        .collect();
    // The highest attempt started per session, from its session and capture directories.
    let mut highest: BTreeMap<usize, u32> = BTreeMap::new();
    let mut latest: BTreeMap<usize, (u32, SessionResult)> = BTreeMap::new();
    let mut earlier = Earlier::default();
    for sub in ["sessions", "captures"] {
        let Ok(entries) = std::fs::read_dir(out.join(sub)) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some((index, attempt)) = split_attempt(&name, &firsts) else {
                continue;
            };
            let top = highest.entry(index).or_insert(attempt);
            *top = (*top).max(attempt);
            if sub != "sessions" {
                continue;
            }
            if attempt > 0 {
                earlier.retries += 1;
            }
            let Some(result) = attempt_result(out, "trajectories", &entry.path(), &name)? else {
                continue; // cancelled: no result
            };
            if let Some(errors) = result
                .summary
                .as_ref()
                .and_then(|s| s.upstream_errors.as_ref())
            {
                earlier.upstream.add(errors);
            }
            if latest.get(&index).is_none_or(|(a, _)| *a < attempt) {
                latest.insert(index, (attempt, result));
            }
        }
    }
    for (index, (_, result)) in latest {
        let scored = result
            .summary
            .as_ref()
            .is_some_and(|s| !is_infrastructure(&s.status));
        if scored {
            earlier.done.insert(index, result);
        }
    }
    for (index, top) in highest {
        if !earlier.done.contains_key(&index) {
            earlier.next_attempt.insert(index, top + 1);
        }
    }
    Ok(earlier)
}

/// The held-out rounds an earlier run in `out` measured: each held-out session's last attempt
/// that left a result in `sessions/`, by its id (`<job>-<task>-<sample>.h<step>[-r<attempt>]`).
fn read_rounds(out: &Path, job: &str, tasks: &[Task], samples: u32) -> Result<Rounds, String> {
    let samples = samples.max(1);
    let places: BTreeMap<String, usize> = tasks
        .iter()
        .enumerate()
        .flat_map(|(t, task)| {
            (0..samples).map(move |sample| {
                let id = held_out_session_id(job, &task.id, sample, 0, 0);
                let prefix = id.strip_suffix(".h0").unwrap_or(&id).to_owned();
                (prefix, t * samples as usize + sample as usize)
            })
        })
        .collect();
    let mut latest: BTreeMap<(u64, usize), (u32, SessionResult)> = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(out.join("sessions")) else {
        return Ok(Rounds::new());
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some((prefix, step, attempt)) = split_held_out_id(&name) else {
            continue;
        };
        let Some(&j) = places.get(prefix) else {
            continue;
        };
        // Killed before its summary.json, a session whose trajectory reached `held-out/` is
        // done: run again, its round would hold two samples of one place.
        let Some(result) = attempt_result(out, "held-out", &entry.path(), &name)? else {
            continue; // cancelled: no result
        };
        if latest.get(&(step, j)).is_none_or(|(a, _)| *a < attempt) {
            latest.insert((step, j), (attempt, result));
        }
    }
    let mut rounds = Rounds::new();
    for ((step, j), (_, result)) in latest {
        rounds.entry(step).or_default().insert(j, result);
    }
    Ok(rounds)
}

/// An attempt's result: its `summary.json` in `dir`, or, killed before it wrote one, its
/// trajectory as the `dataset` sink in `out` received it ([`delivered`]); `None` for one that
/// left neither (cancelled).
fn attempt_result(
    out: &Path,
    dataset: &str,
    dir: &Path,
    session: &str,
) -> Result<Option<SessionResult>, String> {
    match read_result(dir)? {
        Some(result) => Ok(Some(result)),
        None => delivered(out, dataset, session),
    }
}

/// `<prefix>.h<step>` or `<prefix>.h<step>-r<attempt>` → (prefix, step, attempt).
fn split_held_out_id(id: &str) -> Option<(&str, u64, u32)> {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let (head, attempt) = match id.rsplit_once("-r") {
        Some((head, n)) if digits(n) => (head, n.parse().ok()?),
        _ => (id, 0),
    };
    let (prefix, step) = head.rsplit_once(".h")?;
    digits(step).then_some(())?;
    Some((prefix, step.parse().ok()?, attempt))
}

/// The result of an attempt whose trajectory the dataset sink already wrote (to `dataset` in
/// `out`: `trajectories`, or `held-out` for a held-out session), rebuilt from it (timings
/// unknown: 0).
fn delivered(out: &Path, dataset: &str, session: &str) -> Result<Option<SessionResult>, String> {
    let file = format!("{session}.json");
    let (dataset, spool) = (out.join(dataset), out.join("captures/.spool"));
    // The dataset's files are trajectories; the spool's (a train run's trainer sink: shipped,
    // or still pending, which the resumed run ships) hold one under `trajectory`.
    // In the order a trajectory moves (spooled, written by the sink, marked shipped), so one
    // the recovered gateway is shipping while this looks is found wherever it goes next (gone
    // from one place between the look and the read, it is looked for in the next).
    let mut found = None;
    for (dir, spooled) in [(spool.join("pending"), true)]
        .into_iter()
        .chain(["accepted", "rejected"].map(|sub| (dataset.join(sub), false)))
        .chain([(spool.join("shipped"), true)])
    {
        let path = dir.join(&file);
        match std::fs::read(&path) {
            Ok(text) => {
                found = Some((path, spooled, text));
                break;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(format!("{}: {e}", path.display())),
        }
    }
    let Some((path, spooled, text)) = found else {
        return Ok(None);
    };
    let mut t: serde_json::Value =
        serde_json::from_slice(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    if spooled {
        t = t["trajectory"].take();
    }
    let evaluation = &t["evaluation"];
    let status = match t["status"].as_str() {
        Some("completed") if evaluation["detail"]["harnessExit"].as_i64() == Some(0) => "completed",
        Some("completed") => "agent_failed",
        Some("timeout") => "agent_timeout",
        _ => "infra_error",
    };
    let count = |k: &str| t["stats"][k].as_u64().unwrap_or(0);
    let summary = floe_sandbox::summary::Summary {
        session: Some(session.to_string()),
        task: t["task"].as_str().map(str::to_owned),
        status: status.into(),
        reward: t["reward"].as_f64(),
        // A timed-out session is no pass, whatever its evaluator said (as the runner says).
        passed: evaluation["passed"]
            .as_bool()
            .map(|p| p && status != "agent_timeout"),
        completions: count("completions"),
        sampled_tokens: count("sampled_tokens"),
        trainable_tokens: count("trainable_tokens"),
        traces: count("traces"),
        shipment: "shipped".into(),
        trajectory: Some(path.display().to_string()),
        ..Default::default()
    };
    Ok(Some(SessionResult {
        task: summary.task.clone().unwrap_or_default(),
        wall_seconds: 0.0,
        summary: Some(summary),
    }))
}

/// A finished attempt's `summary.json` (with the run's `wallSeconds`), if it has one.
fn read_result(dir: &Path) -> Result<Option<SessionResult>, String> {
    let path = dir.join("summary.json");
    let text = match std::fs::read(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    // One cut short (a full disk, a crash mid-write before writes went by rename) is no
    // result: the attempt is decided as one that never reported (by its delivered trajectory,
    // or run again), not a run that can never be resumed.
    let parsed = serde_json::from_slice::<serde_json::Value>(&text).and_then(|value| {
        serde_json::from_value::<floe_sandbox::summary::Summary>(value.clone()).map(|s| (value, s))
    });
    let (value, summary) = match parsed {
        Ok(read) => read,
        Err(e) => {
            eprintln!(
                "[resume] {} is unreadable ({e}): taken as no result",
                path.display()
            );
            return Ok(None);
        }
    };
    Ok(Some(SessionResult {
        task: summary.task.clone().unwrap_or_default(),
        wall_seconds: value["wallSeconds"].as_f64().unwrap_or(0.0),
        summary: Some(summary),
    }))
}

/// Write a finished attempt's `summary.json` whole or not at all (beside, synced, renamed).
pub fn write_result(dir: &Path, result: &SessionResult) -> std::io::Result<()> {
    let path = dir.join("summary.json");
    floe_gateway::ship::write_durably(&path, render_result(result).as_bytes())
        .map_err(std::io::Error::other)
}

/// A finished attempt's `summary.json`: the runner's summary and the session's wall time.
pub fn render_result(result: &SessionResult) -> String {
    let mut value = serde_json::to_value(&result.summary).unwrap_or_default();
    value["wallSeconds"] = result.wall_seconds.into();
    serde_json::to_string_pretty(&value).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use floe_sandbox::summary::Summary;

    fn assignment(session: &str) -> Assignment {
        serde_json::from_value(serde_json::json!({
            "session": session, "task": "t", "group": "j/t", "sample": 0,
            "builder": "prefix_merging", "sink": {"kind": "none"},
        }))
        .expect("assignment")
    }

    /// An sft run an earlier floe recorded (no `imitation`) is the same sessions as this one's.
    #[test]
    fn an_earlier_floes_sft_sessions_compare_equal_to_this_ones() {
        let recorded = assignment("j-t-0");
        let now = Assignment {
            imitation: true,
            ..assignment("j-t-0")
        };
        assert_eq!(comparable(&recorded), comparable(&now));
        let other = assignment("j-t-1");
        assert_ne!(comparable(&other), comparable(&now));
    }

    fn finish(out: &Path, id: &str, status: &str) -> std::io::Result<()> {
        std::fs::create_dir_all(out.join("sessions").join(id))?;
        let result = SessionResult {
            task: "t".into(),
            summary: Some(Summary {
                session: Some(id.into()),
                task: Some("t".into()),
                status: status.into(),
                ..Default::default()
            }),
            wall_seconds: 2.5,
        };
        std::fs::write(
            out.join("sessions").join(id).join("summary.json"),
            render_result(&result),
        )
    }

    #[test]
    fn done_sessions_are_kept_and_the_rest_continue_past_every_started_attempt(
    ) -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let out = dir.path();
        let all: Vec<Assignment> = ["j-t-0", "j-t-1", "j-t-2", "j-t-3"]
            .into_iter()
            .map(assignment)
            .collect();
        finish(out, "j-t-0", "completed")?;
        // Failed by infrastructure, retried once, the retry cancelled (no summary).
        finish(out, "j-t-1", "infra_error")?;
        std::fs::create_dir_all(out.join("sessions/j-t-1-r1"))?;
        // Started, then the run was killed: only its capture directory.
        std::fs::create_dir_all(out.join("captures/j-t-2"))?;
        std::fs::create_dir_all(out.join("captures/.spool"))?;
        let earlier = read(out, &all).map_err(std::io::Error::other)?;
        assert_eq!(earlier.done.keys().copied().collect::<Vec<_>>(), [0]);
        assert_eq!(earlier.done[&0].wall_seconds, 2.5);
        assert_eq!(earlier.next_attempt, BTreeMap::from([(1, 2), (2, 1)]));
        assert_eq!(earlier.retries, 1);
        Ok(())
    }

    #[test]
    fn a_summary_cut_short_is_no_result_not_a_run_that_cannot_resume() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let out = dir.path();
        let all: Vec<Assignment> = ["j-t-0", "j-t-1"].into_iter().map(assignment).collect();
        finish(out, "j-t-0", "completed")?;
        // A full disk (before summaries were written by rename): half a summary.
        finish(out, "j-t-1", "completed")?;
        std::fs::write(
            out.join("sessions/j-t-1/summary.json"),
            b"{\"session\": \"j-t",
        )?;
        let earlier = read(out, &all).map_err(std::io::Error::other)?;
        assert_eq!(earlier.done.keys().copied().collect::<Vec<_>>(), [0]);
        assert_eq!(earlier.next_attempt.get(&1), Some(&1), "run again");
        // Written now, a summary is whole or absent: the temporary file is renamed.
        let slot = out.join("sessions/j-t-1");
        let again = read_result(&out.join("sessions/j-t-0"))
            .map_err(std::io::Error::other)?
            .ok_or_else(|| std::io::Error::other("j-t-0's result"))?;
        write_result(&slot, &again)?;
        assert!(!slot.join("summary.json.tmp").exists());
        assert!(read_result(&slot).map_err(std::io::Error::other)?.is_some());
        Ok(())
    }

    #[test]
    fn a_session_killed_after_its_trajectory_was_delivered_is_done() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let out = dir.path();
        let all: Vec<Assignment> = ["j-t-0", "j-t-1"].into_iter().map(assignment).collect();
        // Both started; the run was killed before either wrote its summary.json. j-t-0's
        // scored trajectory reached the dataset sink, j-t-1's infrastructure failure too.
        for id in ["j-t-0", "j-t-1"] {
            std::fs::create_dir_all(out.join("sessions").join(id))?;
        }
        std::fs::create_dir_all(out.join("trajectories/accepted"))?;
        std::fs::create_dir_all(out.join("trajectories/rejected"))?;
        std::fs::write(
            out.join("trajectories/accepted/j-t-0.json"),
            r#"{"session": "j-t-0", "task": "t", "status": "completed", "reward": 1.0,
                "evaluation": {"reward": 1.0, "passed": true, "detail": {"harnessExit": 0}},
                "stats": {"completions": 3, "sampled_tokens": 40, "trainable_tokens": 40, "traces": 1}}"#,
        )?;
        std::fs::write(
            out.join("trajectories/rejected/j-t-1.json"),
            r#"{"session": "j-t-1", "task": "t", "status": "error", "reward": null}"#,
        )?;
        let earlier = read(out, &all).map_err(std::io::Error::other)?;
        assert_eq!(earlier.done.keys().copied().collect::<Vec<_>>(), [0]);
        let summary = earlier.done[&0].summary.clone().unwrap_or_default();
        assert_eq!(
            (summary.status.as_str(), summary.reward, summary.completions),
            ("completed", Some(1.0), 3)
        );
        // The infrastructure failure runs again, as its next attempt.
        assert_eq!(earlier.next_attempt, BTreeMap::from([(1, 1)]));
        Ok(())
    }

    /// A timed-out session's delivered trajectory keeps its evaluator's pass for the record;
    /// the session read back is no pass, as the runner said it.
    #[test]
    fn a_delivered_timed_out_session_is_no_pass() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let out = dir.path();
        let all: Vec<Assignment> = ["j-t-0"].into_iter().map(assignment).collect();
        std::fs::create_dir_all(out.join("sessions/j-t-0"))?;
        std::fs::create_dir_all(out.join("trajectories/accepted"))?;
        std::fs::write(
            out.join("trajectories/accepted/j-t-0.json"),
            r#"{"session": "j-t-0", "task": "t", "status": "timeout", "reward": 0.0,
                "evaluation": {"reward": 0.0, "passed": true, "detail": {}}}"#,
        )?;
        let earlier = read(out, &all).map_err(std::io::Error::other)?;
        let summary = earlier.done[&0].summary.clone().unwrap_or_default();
        assert_eq!(
            (summary.status.as_str(), summary.passed),
            ("agent_timeout", Some(false))
        );
        Ok(())
    }

    #[test]
    fn a_different_job_is_not_resumed() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let record = |sessions: &[&str]| RunRecord {
            job: "j".into(),
            mode: "sft".into(),
            assignments: sessions.iter().map(|s| assignment(s)).collect(),
            held_out_digest: None,
            policy_digest: None,
        };
        write_record(dir.path(), &record(&["a", "b"])).map_err(std::io::Error::other)?;
        assert!(check_record(dir.path(), &record(&["a", "b"])).is_ok());
        let err = check_record(dir.path(), &record(&["a", "c"]))
            .err()
            .unwrap_or_default();
        assert!(err.contains("from session 1 on"), "{err}");
        let err = check_record(dir.path(), &record(&["a"]))
            .err()
            .unwrap_or_default();
        assert!(err.contains("from session 1 on"), "fewer sessions: {err}");
        let mut other = record(&["a", "b"]);
        other.job = "k".into();
        assert!(check_record(dir.path(), &other).is_err());
        // A held-out set changed: its rounds would not be one curve. One added or dropped
        // leaves no earlier round to mix with.
        let held = |digest: Option<&str>| RunRecord {
            held_out_digest: digest.map(str::to_owned),
            ..record(&["a", "b"])
        };
        write_record(dir.path(), &held(Some("d1"))).map_err(std::io::Error::other)?;
        let err = check_record(dir.path(), &held(Some("d2")))
            .err()
            .unwrap_or_default();
        assert!(err.contains("held-out set"), "{err}");
        assert!(check_record(dir.path(), &held(Some("d1"))).is_ok());
        assert!(check_record(dir.path(), &held(None)).is_ok());
        // Another policy: refused; a record from before the digest is taken.
        let policy = |model: &str| record(&["a", "b"]).sampling(Some(model));
        write_record(dir.path(), &policy("m1")).map_err(std::io::Error::other)?;
        assert!(check_record(dir.path(), &policy("m1")).is_ok());
        let err = check_record(dir.path(), &policy("m2"))
            .err()
            .unwrap_or_default();
        assert!(err.contains("the job's policy"), "{err}");
        write_record(dir.path(), &record(&["a", "b"])).map_err(std::io::Error::other)?;
        assert!(check_record(dir.path(), &policy("m2")).is_ok());
        // A resumed run starts without the earlier run's summary (its own comes at its end).
        std::fs::write(dir.path().join("summary.json"), "{}")?;
        begin(dir.path(), &record(&["a", "b"]), true)
            .map_err(|e| std::io::Error::other(format!("{e:?}")))?;
        assert!(!dir.path().join("summary.json").exists());
        Ok(())
    }

    #[test]
    fn a_train_session_whose_trajectory_the_spool_holds_is_done() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let out = dir.path();
        let all: Vec<Assignment> = ["j-t-0", "j-t-1"].into_iter().map(assignment).collect();
        for id in ["j-t-0", "j-t-1"] {
            std::fs::create_dir_all(out.join("sessions").join(id))?;
        }
        // Killed before either summary.json: j-t-0's scored trajectory was spooled for the
        // trainer (not yet acknowledged); j-t-1's interrupted attempt was shipped untrainable.
        std::fs::create_dir_all(out.join("captures/.spool/pending"))?;
        std::fs::create_dir_all(out.join("captures/.spool/shipped"))?;
        std::fs::write(
            out.join("captures/.spool/pending/j-t-0.json"),
            r#"{"sink": {"kind": "trainer", "url": "http://127.0.0.1:9/v1/trajectories"},
                "trajectory": {"session": "j-t-0", "task": "t", "status": "completed", "reward": 0.5,
                "evaluation": {"reward": 0.5, "passed": false, "detail": {"harnessExit": 0}},
                "stats": {"completions": 1, "sampled_tokens": 9, "trainable_tokens": 9, "traces": 1}}}"#,
        )?;
        std::fs::write(
            out.join("captures/.spool/shipped/j-t-1.json"),
            r#"{"sink": {"kind": "trainer", "url": "http://127.0.0.1:9/v1/trajectories"},
                "trajectory": {"session": "j-t-1", "task": "t", "status": "error", "reward": null}}"#,
        )?;
        let earlier = read(out, &all).map_err(std::io::Error::other)?;
        assert_eq!(earlier.done.keys().copied().collect::<Vec<_>>(), [0]);
        let summary = earlier.done[&0].summary.clone().unwrap_or_default();
        assert_eq!(
            (summary.status.as_str(), summary.reward),
            ("completed", Some(0.5))
        );
        assert_eq!(earlier.next_attempt, BTreeMap::from([(1, 1)]));
        Ok(())
    }

    #[test]
    fn a_train_run_resumes_with_a_new_trainer_address_and_token() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let record = |port: u16, token: &str| RunRecord {
            job: "j".into(),
            mode: "train".into(),
            assignments: ["a", "b"]
                .iter()
                .map(|s| Assignment {
                    sink: Sink::Trainer {
                        url: format!("http://127.0.0.1:{port}/v1/trajectories"),
                        token: Some(token.into()),
                        snapshots: false,
                    },
                    ..assignment(s)
                })
                .collect(),
            held_out_digest: None,
            policy_digest: None,
        };
        write_record(dir.path(), &record(1000, "first")).map_err(std::io::Error::other)?;
        assert!(check_record(dir.path(), &record(2000, "second")).is_ok());
        let mut other = record(2000, "second");
        other.assignments[1].task = "u".into();
        let err = check_record(dir.path(), &other).err().unwrap_or_default();
        assert!(err.contains("from session 1 on"), "{err}");
        Ok(())
    }

    #[test]
    fn the_rounds_of_an_earlier_run_are_read_from_its_sessions() {
        let out = tempfile::tempdir().expect("tempdir");
        let tasks: Vec<Task> = ["h0", "h1"]
            .iter()
            .map(|id| serde_json::from_value(serde_json::json!({"id": id, "instruction": "x"})))
            .collect::<Result<_, _>>()
            .expect("tasks");
        let result = |reward| super::super::held_out::tests::result(reward, [0, 0]).summary;
        let write = |id: &str, reward: Option<f64>| {
            let dir = out.path().join("sessions").join(id);
            std::fs::create_dir_all(&dir).expect("mkdir");
            let text = serde_json::to_vec(&result(reward)).expect("json");
            std::fs::write(dir.join("summary.json"), text).expect("write");
        };
        write("job-h0-0.h0", Some(0.0));
        write("job-h0-0.h0-r1", Some(1.0)); // its retry: the last attempt counts
        write("job-h1-1.h0-r2", None);
        write("job-h1-1.h5", Some(1.0));
        write("job-h0-0", Some(1.0)); // a training session
        write("other-h0-0.h0", Some(1.0)); // another job's
        std::fs::create_dir_all(out.path().join("sessions/job-h1-0.h5")).expect("cancelled");
        // Killed after its trajectory reached held-out/, before its summary.json.
        std::fs::create_dir_all(out.path().join("sessions/job-h0-1.h5")).expect("mkdir");
        let accepted = out.path().join("held-out/accepted");
        std::fs::create_dir_all(&accepted).expect("mkdir");
        let trajectory = serde_json::json!({"task": "h0", "status": "completed", "reward": 0.5,
            "evaluation": {"passed": false, "detail": {"harnessExit": 0}}});
        std::fs::write(accepted.join("job-h0-1.h5.json"), trajectory.to_string()).expect("write");
        let rounds = read_rounds(out.path(), "job", &tasks, 2).expect("read");
        let read: Vec<(u64, usize, Option<f64>)> = rounds
            .iter()
            .flat_map(|(step, r)| {
                r.iter()
                    .map(|(j, res)| (*step, *j, res.summary.as_ref().and_then(|s| s.reward)))
            })
            .collect();
        assert_eq!(
            read,
            [
                (0, 0, Some(1.0)),
                (0, 3, None),
                (5, 1, Some(0.5)),
                (5, 3, Some(1.0))
            ]
        );
        assert_eq!(
            split_held_out_id("j-fix-regex-0.h3"),
            Some(("j-fix-regex-0", 3, 0))
        );
        assert_eq!(split_held_out_id("j-t-0.h3-r12"), Some(("j-t-0", 3, 12)));
        assert_eq!(split_held_out_id("j-t-0-r1"), None);
        let none = tempfile::tempdir().expect("tempdir");
        assert!(read_rounds(none.path(), "job", &tasks, 2)
            .expect("read")
            .is_empty());
    }
}
