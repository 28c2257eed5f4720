//! Grading one session: the evaluation copy (the pristine task, the agent's diff without
//! protected paths, the hidden files), the evaluator in it, and the verdict.
//!
//! The outcome table ([`crate::reward`], `docs/sandbox-contract.md`): whatever the agent's
//! workspace or the code under test causes (names or files floe cannot read as content, a
//! workspace too large, an evaluator that hangs, dies or leaves no verdict) is scored as the
//! policy's failure, reward 0 with a reason code in the trajectory and the summary. Only what
//! floe can show is not the code's is an infrastructure failure: an evaluator whose program is
//! not there, a sandbox that did not start, a job that names no reward file, floe's own side.

use std::path::{Path, PathBuf};

use floe_crds::rollout_job::{RewardSource, RewardSpec, TaskEvaluation};
use floe_crds::swebench::{self, EVAL_SCRIPT};
use floe_gateway::trajectory::Evaluation;
use serde_json::json;

use crate::children::{tail, RunnerConfig};
use crate::disk_budget;
use crate::evaluator_run::{Evaluator, REPORT_LIMIT};
use crate::grading_swebench::SweBenchPrepared;
use crate::process::{self, Exit};
use crate::relay;
use crate::reward::{judge, EvaluatorFailure, EvaluatorResult, FailureReason};
use crate::spec::RunSpec;
use crate::summary::Summary;
use crate::workspace::{self, Protected, WorkspaceError};

/// Grades the session whose agent left `ws` (started from `pristine`). `Err`: an
/// infrastructure failure's message.
pub(crate) async fn grade(
    config: &RunnerConfig,
    spec: &RunSpec,
    pristine: &Path,
    ws: &Path,
    cgroup_procs: &[std::path::PathBuf],
    summary: &mut Summary,
) -> Result<Evaluation, String> {
    let failed = |summary: &mut Summary, reason: FailureReason, message: String| {
        tracing::info!(reason = reason.code(), %message, "scored as the policy's failure");
        summary.failure = Some(reason.code().to_string());
        Ok(Evaluation {
            reward: Some(spec.evaluator.reward.failure_reward),
            passed: Some(false),
            detail: json!({
                "failure": reason.code(),
                "failureMessage": message,
                "harnessExit": summary.harness_exit,
            }),
        })
    };
    // The same, once the evaluation copy exists: what of the agent's changes reached it.
    let failed_with = |summary: &mut Summary, reason, message, applied: &workspace::Applied| {
        failed(summary, reason, message).map(|mut e: Evaluation| {
            e.detail["changes"] = changes_detail(applied);
            e
        })
    };
    let workspace_failure = |summary: &mut Summary, e: WorkspaceError| {
        let reason = match e {
            WorkspaceError::TooLarge { .. } | WorkspaceError::TooMuch(_) => {
                FailureReason::WorkspaceTooLarge
            }
            _ => FailureReason::WorkspaceUnreadable,
        };
        failed(summary, reason, e.to_string())
    };
    let changes = match workspace::diff(pristine, ws) {
        Ok(c) => c,
        Err(e) if e.is_the_agents() => return workspace_failure(summary, e),
        Err(e) => return Err(format!("diff: {e}")),
    };
    let mut hidden = spec.all_hidden_files();
    let eval_dir = config.eval_dir();
    let task_evaluation = spec.task.evaluation.clone().unwrap_or_default();
    let swebench = match spec.evaluator.reward.source {
        RewardSource::SweBench => {
            let prepared =
                SweBenchPrepared::new(config, &task_evaluation, pristine, &eval_dir).await?;
            hidden.insert(EVAL_SCRIPT.to_string(), prepared.relocated.clone());
            Some(prepared)
        }
        _ => None,
    };
    // A SWE-bench job may leave the command out: the instance's eval script, its stderr
    // (where `set -x` writes swebench's markers) in the same log as its stdout.
    let default_command =
        ["bash", "-c", "exec 2>&1; exec bash \"$0\"", EVAL_SCRIPT].map(String::from);
    let command = match (&swebench, spec.evaluator.command.is_empty()) {
        (Some(_), true) => &default_command[..],
        _ => &spec.evaluator.command[..],
    };
    let Some((program, args)) = command.split_first() else {
        return Err("evaluator.command is empty".into());
    };
    // The reward file is the evaluator's to write, and an evaluator script of the task's is the
    // evaluator: what the agent left at either path is discarded. So is the script an
    // interpreter runs (`bash grade.sh`, the task's `args` included).
    let whole: Vec<String> = command
        .iter()
        .chain(&task_evaluation.args)
        .cloned()
        .collect();
    // A script of the task's: a word that names no file of its tree is not protected (an
    // option's argument read as the script would protect a whole directory of the agent's).
    // (An absolute one is judged where it leads, into the copy or not, below.)
    let interpreted = crate::evaluator_program::interpreted_script(&whole).filter(|script| {
        script.starts_with('/')
            || crate::workspace::safe_relative(script.trim_start_matches("./"))
                .is_ok_and(|rel| pristine.join(rel).is_file())
    });
    let evaluator_scripts: Vec<String> = [program.as_str()]
        .into_iter()
        .chain(interpreted.as_deref())
        .filter(|p| p.contains('/') && !p.starts_with('/'))
        .map(|p| p.trim_start_matches("./").to_string())
        .collect();
    let evaluator_owned = hidden
        .keys()
        .chain(spec.evaluator.reward.path.iter())
        .chain(evaluator_scripts.iter());
    let mut patterns = spec.evaluator.protected_paths.clone();
    patterns.extend(task_evaluation.protected_paths.iter().cloned());
    if spec.evaluator.protect_test_config {
        patterns.extend(workspace::TEST_RUNNER_CONFIG.iter().map(|p| p.to_string()));
    }
    let evaluator_env: Vec<(String, String)> = task_evaluation.env.clone().into_iter().collect();
    // What the program is found as: through a link, an absolute path into the copy, or a
    // `PATH` directory of the copy's.
    let path_var = crate::children::path_in(&evaluator_env);
    let mut derived =
        crate::evaluator_program::owned_patterns(program, path_var.as_deref(), &eval_dir, pristine);
    // Where the interpreted script leads (a link, an absolute path into the copy).
    if let Some(script) = &interpreted {
        derived.extend(crate::evaluator_program::owned_patterns(
            script, None, &eval_dir, pristine,
        ));
    }
    let python_path = task_evaluation.env.get("PYTHONPATH").map(String::as_str);
    let mut script_dirs =
        crate::evaluator_program::script_dirs(command, python_path, &eval_dir, pristine);
    // The repository's own test runner, which an instance's eval script runs by path (Django's
    // `./tests/runtests.py`, sympy's `bin/test`): rewritten, it would print a pass for every
    // test it is given. Decided here, not in the task, whose digest a running job keeps.
    if let (Some(grading), Some(script)) = (
        &task_evaluation.swebench,
        task_evaluation.hidden_files.get(EVAL_SCRIPT),
    ) {
        let runners = swebench::runner_scripts(script, &grading.repository_directory);
        derived.extend(runners.iter().map(|p| swebench::glob_literal(p)));
        script_dirs.extend(
            runners
                .iter()
                .filter_map(|p| Some(Path::new(p).parent()?.into())),
        );
    }
    // What floe derives itself and could not protect (a script outside the copy) is left out,
    // not a job's error.
    patterns.extend(derived.into_iter().filter(|p| Protected::names_the_tree(p)));
    let protected = Protected::new(&patterns, evaluator_owned).map_err(|e| e.to_string())?;
    let protected = if spec.evaluator.protect_test_config {
        protected.refusing_runner_modules(script_dirs)
    } else {
        protected
    };
    let evaluator = || Evaluator {
        program,
        args: args.iter().chain(&task_evaluation.args).cloned().collect(),
        env: evaluator_env.clone(),
        timeout_seconds: spec.timeouts.evaluator_seconds,
        cgroup_procs,
        disk_budget: None,
    };
    // In a pod the evaluation runs the agent's code unconfined, as the runner's user: what it
    // leaves (in the snapshot, `$HOME`, `/tmp`) could break a baseline run after it and turn
    // its loss into infrastructure. So there the untouched repository runs first.
    let baseline_first = swebench.is_some() && config.confinement.is_none();
    let mut baseline_log = None;
    if let (Some(prepared), true) = (&swebench, baseline_first) {
        baseline_log = Some(
            prepared
                .baseline(config, evaluator(), pristine, &hidden, true)
                .await?,
        );
    }
    // A mounted evaluation directory (a pod's `/testbed`) may hold an earlier attempt's copy,
    // or the baseline's.
    workspace::clear(&eval_dir).map_err(|e| format!("evaluation copy: {e}"))?;
    let applied =
        match workspace::evaluation_copy(pristine, ws, &eval_dir, &changes, &protected, &hidden) {
            Ok(a) => a,
            Err(e) if e.is_the_agents() => return workspace_failure(summary, e),
            Err(e) => return Err(format!("evaluation copy: {e}")),
        };
    // An evaluator program the task's tree holds (`node_modules/.bin/jest`, a relative `PATH`
    // entry) whose link or file the agent removed or made unexecutable would not start: the
    // workspace's doing, scored, never infrastructure's. One missing from the task itself
    // stays the job's error.
    let job_env = evaluator().env;
    if !crate::children::startable_in(program, &job_env, &eval_dir)
        && crate::children::startable_in(program, &job_env, pristine)
    {
        let why = format!(
            "the evaluator's program {program} starts from the task's files but not from the \
             workspace the agent left"
        );
        return failed_with(summary, FailureReason::NoVerdict, why, &applied);
    }
    // Whatever ran before (none should be left) is not the evaluator's doing.
    let before = process::other_processes();
    // The code under test runs here, held to twice the session's disk budget: the copy of
    // the workspace (up to the budget), and as much again for what honest tests and builds
    // write (local mode: a pod's grader has its container's limits). The untouched
    // repository's runs are the task's own: none.
    let disk_budget = config
        .confinement
        .as_ref()
        .and(config.disk_budget)
        .map(|b| b.saturating_mul(2));
    let evaluator_ran = Evaluator {
        disk_budget,
        ..evaluator()
    }
    .run(config, "evaluator", &eval_dir)
    .await?;
    let ran = &evaluator_ran.finished;
    summary.evaluator_seconds = ran.elapsed.as_secs_f64();
    if let Some(held) = &evaluator_ran.over_disk {
        if config.confinement.is_none() {
            // In a pod, what the evaluator left (a process out of its group and tag) would
            // go on writing, where nothing watches now: killed first, as below.
            let _ = tokio::task::spawn_blocking(process::empty_own_namespace).await;
            disk_budget::empty_files(&[PathBuf::from(disk_budget::TERMINATION_LOG)]);
        }
        // What it wrote is gone at once: the disk is the run's, not the session's.
        if let Err(e) = workspace::clear(&eval_dir) {
            tracing::warn!("emptying the evaluation copy: {e}");
        }
        let why = format!("the evaluator was stopped: {held}");
        return failed_with(summary, FailureReason::DiskLimit, why, &applied);
    }
    if config.confinement.is_some() && ran.exit == Exit::Code(relay::STRAGGLERS) {
        let why = "the evaluator's command left a process behind (it could have rewritten the \
                   verdict after the tests)";
        return failed_with(
            summary,
            FailureReason::EvaluatorStraggler,
            why.into(),
            &applied,
        );
    }
    if config.confinement.is_none() {
        // In a pod the runner is the grader container's init: whatever the evaluator left
        // (orphans come to it) is killed and reaped before the verdict is read, and its having
        // been there voids the verdict, as `floe sandbox-exec` decides in local mode.
        let left = tokio::task::spawn_blocking(process::empty_own_namespace)
            .await
            .ok()
            .flatten()
            .map_or(0, |after| after.difference(&before).count());
        if left > 0 {
            let why = format!(
                "the evaluator's command left {left} process(es) behind (they could have \
                 rewritten the verdict after the tests)"
            );
            return failed_with(summary, FailureReason::EvaluatorStraggler, why, &applied);
        }
    }
    let from_stdout = spec.evaluator.reward.path.is_none()
        && matches!(
            spec.evaluator.reward.source,
            RewardSource::TestOutput | RewardSource::SweBench
        );
    if from_stdout && ran.stdout_bytes > REPORT_LIMIT {
        // Only its first bytes were kept: a summary printed first and pushed out of reach of
        // the real one by padding would otherwise be read as the only one.
        let why = format!("the evaluator wrote more than {REPORT_LIMIT} bytes on stdout");
        return failed_with(summary, FailureReason::NoVerdict, why, &applied);
    }
    // Off the pipe, never the log file: the code under test could rewrite that.
    let stdout = evaluator_ran.stdout;
    let report = spec
        .evaluator
        .reward
        .path
        .as_ref()
        .map(|p| workspace::read_report(&eval_dir, p, REPORT_LIMIT));
    // swebench reads the log once everything the evaluator ran has ended.
    let graded = match (&swebench, &ran.exit) {
        (Some(prepared), Exit::Code(_)) => {
            let baseline = prepared.baseline(config, evaluator(), pristine, &hidden, false);
            Some(
                prepared
                    .verdict(&stdout, baseline_log.as_ref(), baseline)
                    .await?,
            )
        }
        // An instance whose honest tests outlast `evaluatorSeconds` would score every session
        // 0: the untouched repository's run, in the same time, tells the two apart (in a pod
        // it ran first). Its timing out too is infrastructure.
        (Some(prepared), Exit::TimedOut) if !baseline_first => {
            prepared
                .baseline(config, evaluator(), pristine, &hidden, false)
                .await?;
            None
        }
        _ => None,
    };
    let verdict = match judge(
        &task_reward(&spec.evaluator.reward, &task_evaluation),
        &EvaluatorResult {
            exit: &ran.exit,
            stdout: &stdout,
            report,
            swebench: graded.as_ref(),
        },
    ) {
        Ok(v) => v,
        Err(EvaluatorFailure::ByTheCode { reason, message }) => {
            return failed_with(summary, reason, message, &applied)
        }
        Err(e @ EvaluatorFailure::Broken(_)) => {
            return Err(format!(
                "{e}; evaluator stderr: {}",
                tail(&evaluator_ran.spec.stderr, 500)
            ))
        }
    };
    tracing::info!(
        reward = verdict.reward,
        changes = changes.len(),
        "evaluated"
    );
    Ok(Evaluation {
        reward: Some(verdict.reward),
        passed: Some(verdict.reward >= spec.evaluator.reward.pass_threshold),
        detail: json!({
            "evaluatorExit": match ran.exit { Exit::Code(c) => Some(c), _ => None },
            "tests": verdict.tests,
            "harnessExit": summary.harness_exit,
            "changes": changes_detail(&applied),
            "swebench": graded,
            "evaluatorReward": verdict.evaluator_reward,
        }),
    })
}

/// The job's reward with what the task sets instead (its `allowedSkips`).
fn task_reward(reward: &RewardSpec, task: &TaskEvaluation) -> RewardSpec {
    let mut reward = reward.clone();
    if let Some(skips) = task.allowed_skips {
        reward.allowed_skips = skips;
    }
    reward
}

/// What of the agent's changes reached the evaluation copy, for the trajectory's detail.
fn changes_detail(applied: &workspace::Applied) -> serde_json::Value {
    json!({
        "added": applied.applied.added.len(),
        "modified": applied.applied.modified.len(),
        "deleted": applied.applied.deleted.len(),
        "discarded": applied.discarded.iter().map(|p| p.to_string_lossy()).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A task's `allowedSkips` replaces the job's, either way; unset, the job's holds.
    #[test]
    fn a_tasks_allowed_skips_replace_the_jobs() {
        let job = RewardSpec {
            allowed_skips: 2,
            ..RewardSpec::default()
        };
        let task = |skips| TaskEvaluation {
            allowed_skips: skips,
            ..TaskEvaluation::default()
        };
        assert_eq!(task_reward(&job, &task(None)).allowed_skips, 2);
        assert_eq!(task_reward(&job, &task(Some(0))).allowed_skips, 0);
        assert_eq!(task_reward(&job, &task(Some(5))).allowed_skips, 5);
        assert_eq!(task_reward(&job, &task(Some(5))).source, job.source);
    }
}
