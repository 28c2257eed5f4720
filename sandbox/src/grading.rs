//! Grading one session: the evaluation copy (the pristine task, the agent's diff without
//! protected paths, the hidden files), the evaluator in it, and the verdict.
//!
//! The outcome table ([`crate::reward`], `docs/sandbox-contract.md`): whatever the agent's
//! workspace or the code under test causes (names or files floe cannot read as content, a
//! workspace too large, an evaluator that hangs, dies or leaves no verdict) is scored as the
//! policy's failure, reward 0 with a reason code in the trajectory and the summary. Only what
//! floe can show is not the code's is an infrastructure failure: an evaluator whose program is
//! not there, a sandbox that did not start, a job that names no reward file, floe's own side.

use std::path::Path;

use floe_crds::rollout_job::RewardSource;
use floe_crds::swebench::EVAL_SCRIPT;
use floe_gateway::trajectory::Evaluation;
use serde_json::json;

use crate::children::{child, startable, tail, RunnerConfig};
use crate::confine::Access;
use crate::process::{self, Exit};
use crate::relay;
use crate::reward::{judge, EvaluatorFailure, EvaluatorResult, FailureReason, FAILURE_REWARD};
use crate::spec::RunSpec;
use crate::summary::Summary;
use crate::workspace::{self, Protected, WorkspaceError};

/// The most bytes of a reward or test report file read.
const REPORT_LIMIT: u64 = 16 << 20;

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
            reward: Some(FAILURE_REWARD),
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
    let eval_dir = config.state_dir.join("eval");
    let task_evaluation = spec.task.evaluation.clone().unwrap_or_default();
    let swebench = match spec.evaluator.reward.source {
        RewardSource::SweBench => {
            let prepared = swebench_prepare(config, &task_evaluation, pristine, &eval_dir).await?;
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
    // evaluator: what the agent left at either path is discarded.
    let evaluator_script = (program.contains('/') && !program.starts_with('/'))
        .then(|| program.trim_start_matches("./").to_string());
    let evaluator_owned = hidden
        .keys()
        .chain(spec.evaluator.reward.path.iter())
        .chain(evaluator_script.iter());
    let mut patterns = spec.evaluator.protected_paths.clone();
    patterns.extend(task_evaluation.protected_paths.iter().cloned());
    if spec.evaluator.protect_test_config {
        patterns.extend(workspace::TEST_RUNNER_CONFIG.iter().map(|p| p.to_string()));
    }
    let protected = Protected::new(&patterns, evaluator_owned).map_err(|e| e.to_string())?;
    let applied =
        match workspace::evaluation_copy(pristine, ws, &eval_dir, &changes, &protected, &hidden) {
            Ok(a) => a,
            Err(e) if e.is_the_agents() => return workspace_failure(summary, e),
            Err(e) => return Err(format!("evaluation copy: {e}")),
        };
    let evaluation_env = task_evaluation.clone();
    let mut evaluator = child(
        config,
        "evaluator",
        program,
        args.iter().chain(&evaluation_env.args).cloned().collect(),
        evaluation_env.env.into_iter().collect(),
        &eval_dir,
        spec.timeouts.evaluator_seconds,
    );
    // Its whole report, when the report is its stdout: the summary is at the end.
    evaluator.cap_bytes = REPORT_LIMIT;
    // A program that is not there is the job's (or the image's), not the code's: said here, so
    // that an exit code the code under test can also produce (127) is never taken for it.
    startable(&evaluator).map_err(|e| format!("the evaluator did not start: {e}"))?;
    if let Some(confinement) = &config.confinement {
        // Its own namespaces too: the agent's code it runs (tests import it) reaches neither
        // the network nor any other session, and whatever it starts dies with the namespace
        // before the reward is read.
        let access = Access {
            writable: vec![&eval_dir],
            read_only: vec![],
            model_api: false,
            cgroup_procs: cgroup_procs.to_vec(),
        };
        evaluator = confinement.wrap(evaluator, &access);
    }
    // Whatever ran before (none should be left) is not the evaluator's doing.
    let before = process::other_processes();
    let ran = process::run(&evaluator).await.map_err(|e| e.to_string())?;
    summary.evaluator_seconds = ran.elapsed.as_secs_f64();
    if config.confinement.is_some() && !sandbox_started(&evaluator.stderr) {
        return Err(format!(
            "the evaluator's sandbox did not start ({:?}): {}",
            ran.exit,
            tail(&evaluator.stderr, 500)
        ));
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
    let stdout = tail(&evaluator.stdout, REPORT_LIMIT as usize);
    let report = spec
        .evaluator
        .reward
        .path
        .as_ref()
        .map(|p| workspace::read_report(&eval_dir, p, REPORT_LIMIT));
    // swebench reads the log once everything the evaluator ran has ended.
    let graded = match (&swebench, &ran.exit) {
        (Some(prepared), Exit::Code(_)) => Some(
            crate::swebench_grade::grade(
                &prepared.python,
                &prepared.grading,
                &prepared.script,
                &stdout,
            )
            .await?,
        ),
        _ => None,
    };
    let verdict = match judge(
        &spec.evaluator.reward,
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
                tail(&evaluator.stderr, 500)
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
        }),
    })
}

/// What grading a SWE-bench instance needs before its evaluator runs.
struct SweBenchPrepared {
    python: std::path::PathBuf,
    grading: floe_crds::rollout_job::SweBenchGrading,
    /// The instance's eval script, as written.
    script: String,
    /// swebench's eval script with its repository directory moved to the evaluation copy.
    relocated: String,
}

/// The checks that tell a broken instance (infrastructure) from a failed session, made on what
/// the agent never touched, and the eval script as swebench runs it.
async fn swebench_prepare(
    config: &RunnerConfig,
    evaluation: &floe_crds::rollout_job::TaskEvaluation,
    pristine: &Path,
    eval_dir: &Path,
) -> Result<SweBenchPrepared, String> {
    let grading = evaluation
        .swebench
        .clone()
        .ok_or("reward.source SWEBench needs the task's evaluation.swebench (tasks.swebench)")?;
    let python = config.swebench_python.clone().ok_or(
        "SWE-bench grading needs a Python with the swebench package (floe run \
         --swebench-python; FLOE_SWEBENCH_PYTHON for floe sandbox)",
    )?;
    let script = evaluation
        .hidden_files
        .get(EVAL_SCRIPT)
        .cloned()
        .ok_or_else(|| format!("the task has no {EVAL_SCRIPT}"))?;
    crate::checkout::patch_applies(pristine, &grading.test_patch)
        .await
        .map_err(|e| format!("the instance's test patch does not apply to its base commit: {e}"))?;
    let full = crate::swebench_grade::eval_script(&python, &grading, &script).await?;
    let relocated = floe_crds::swebench::relocate(
        &full,
        &grading.repository_directory,
        &eval_dir.to_string_lossy(),
    );
    Ok(SweBenchPrepared {
        python,
        grading,
        script,
        relocated,
    })
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

/// Whether `floe sandbox-exec` announced the command started: its line comes first on stderr,
/// before anything the command writes, and nothing can take back bytes from a pipe. Without
/// it, `bwrap` failed to set the sandbox up (floe's side, not the code's).
fn sandbox_started(stderr: &Path) -> bool {
    let mut head = [0u8; 256];
    let n = std::fs::File::open(stderr)
        .and_then(|mut f| std::io::Read::read(&mut f, &mut head))
        .unwrap_or(0);
    head[..n]
        .split(|b| *b == b'\n')
        .any(|line| line == relay::STARTED.as_bytes())
}
