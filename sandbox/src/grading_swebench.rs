//! Grading a SWE-bench instance (`reward.source: SWEBench`): what is checked on the untouched
//! repository, so that a broken instance is infrastructure and never a session's 0, and the
//! eval script and log through the `swebench` package ([`crate::swebench_grade`]).

use std::collections::BTreeMap;
use std::path::Path;

use floe_crds::rollout_job::{SweBenchGrading, TaskEvaluation};
use floe_crds::swebench::{relocate, EVAL_SCRIPT};

use crate::children::RunnerConfig;
use crate::evaluator_run::Evaluator;
use crate::reward::SweBenchGraded;
use crate::swebench_grade::{Bridge, CallError};
use crate::workspace;

/// What grading a SWE-bench instance needs before its evaluator runs.
pub(crate) struct SweBenchPrepared {
    bridge: Bridge,
    grading: SweBenchGrading,
    /// The instance's eval script, as written.
    script: String,
    /// swebench's eval script with its repository directory moved to the evaluation copy.
    pub relocated: String,
}

impl SweBenchPrepared {
    /// Checks the test patch applies to the untouched repository (`pristine`), and asks
    /// swebench for the eval script.
    pub async fn new(
        config: &RunnerConfig,
        evaluation: &TaskEvaluation,
        pristine: &Path,
        eval_dir: &Path,
    ) -> Result<Self, String> {
        let grading = evaluation.swebench.clone().ok_or(
            "reward.source SWEBench needs the task's evaluation.swebench (tasks.swebench)",
        )?;
        let bridge = config.swebench.clone().ok_or(
            "SWE-bench grading needs a Python with the swebench package (floe run \
             --swebench-python; floe sandbox --swebench-python or --swebench-url)",
        )?;
        let script = evaluation
            .hidden_files
            .get(EVAL_SCRIPT)
            .cloned()
            .ok_or_else(|| format!("the task has no {EVAL_SCRIPT}"))?;
        crate::checkout::patch_applies(pristine, &grading.test_patch)
            .await
            .map_err(|e| {
                format!("the instance's test patch does not apply to its base commit: {e}")
            })?;
        let full = bridge.eval_script(&grading, &script).await?;
        let relocated = relocate(
            &full,
            &grading.repository_directory,
            &eval_dir.to_string_lossy(),
        );
        let relocated = read_whole_first(&relocated);
        Ok(Self {
            bridge,
            grading,
            script,
            relocated,
        })
    }

    /// swebench's verdict on the session's eval log. A log swebench cannot read (no results,
    /// markers the code under test printed, a parser that fails or times out on it) is the
    /// session's 0 when the untouched repository's log is readable, and infrastructure when it
    /// is not. A `PASS_TO_PASS` test the log reports skipped or expected to fail, which
    /// swebench counts as kept, fails when it passed on the untouched repository. Both need
    /// swebench's reading of that repository's log: `baseline_read` when it already ran
    /// (pods), else `baseline` runs it here, only when one of them needs it: a log without
    /// results, or one whose reward such a test could lower (resolved, or every
    /// `PASS_TO_PASS` kept and a `FAIL_TO_PASS` passing), so that printing such a line in a
    /// lost session buys no run that could end as infrastructure. A bridge that could not be
    /// asked at all (its sidecar down) is infrastructure too: the log was never read.
    pub async fn verdict(
        &self,
        log: &str,
        baseline_read: Option<&serde_json::Value>,
        baseline: impl std::future::Future<Output = Result<serde_json::Value, String>>,
    ) -> Result<SweBenchGraded, String> {
        let graded = self.read(log, baseline_read).await?;
        if baseline_read.is_some() {
            return Ok(graded);
        }
        if !graded.read {
            baseline.await?;
            return Ok(graded);
        }
        let could_score = graded.resolved
            || (graded.pass_to_pass == Some(1.0) && graded.fail_to_pass.is_some_and(|f| f > 0.0));
        if graded.doubt.is_some() {
            // A check that voided this log's passes: the agent's 0, unless it voids the
            // untouched repository's too, whose log no agent wrote (the check does not fit
            // the instance: infrastructure, said loudly, never every session's silent 0).
            baseline.await?;
            return Ok(graded);
        }
        if graded.pass_to_pass_skipped.is_empty() || !could_score {
            return Ok(graded);
        }
        let base = baseline.await?;
        self.read(log, Some(&base)).await
    }

    /// swebench's reading of `log` (with the untouched repository's, when given); no results
    /// when it cannot read it.
    async fn read(
        &self,
        log: &str,
        baseline: Option<&serde_json::Value>,
    ) -> Result<SweBenchGraded, String> {
        if let Some(why) = forged_markers(log) {
            return Ok(SweBenchGraded::unread(why));
        }
        match self
            .bridge
            .grade(&self.grading, &self.script, log, baseline, false)
            .await
        {
            Ok(graded) => Ok(graded),
            Err(CallError::Failed(e)) => Ok(SweBenchGraded::unread(format!(
                "swebench could not grade the log: {e}"
            ))),
            Err(CallError::Unreachable(e)) => Err(e),
        }
    }

    /// The same eval script on the untouched repository: when swebench reads no results from
    /// it either, the instance's tests cannot run here (an image without its environment, a
    /// parser that does not fit) — infrastructure, `Err` with the reason. The repository at its
    /// base commit runs no agent code. It runs where the evaluation does (the image's
    /// environment may import from there only), which it leaves holding the untouched
    /// repository.
    ///
    /// `judge_fit`: also refuse an instance whose untouched repository does not read as its
    /// lists say ([`unfit_on_its_base`]). Only where the baseline runs on every session, before
    /// the agent's evaluation (pods): run only for a log without results (`floe run`), it would
    /// let an agent that hid its results make its loss on such an instance unscored while
    /// honest sessions of it score 0.
    pub async fn baseline(
        &self,
        config: &RunnerConfig,
        evaluator: Evaluator<'_>,
        pristine: &Path,
        hidden: &BTreeMap<String, String>,
        judge_fit: bool,
    ) -> Result<serde_json::Value, String> {
        let dir = config.eval_dir();
        workspace::clear(&dir).map_err(|e| format!("baseline copy: {e}"))?;
        workspace::copy_tree(pristine, &dir).map_err(|e| format!("baseline copy: {e}"))?;
        workspace::write_files(&dir, hidden).map_err(|e| format!("baseline copy: {e}"))?;
        let ran = evaluator.run(config, "baseline", &dir).await?;
        let log = ran.stdout;
        let ran = ran.finished;
        let graded = self
            .bridge
            .grade(&self.grading, &self.script, &log, None, true)
            .await
            .map_err(|e| format!("the instance's untouched repository: {e}"))?;
        if let (true, Some(doubt)) = (graded.read, &graded.doubt) {
            return Err(format!(
                "floe's check of the passes against the test runner's tally voids the \
                 instance's untouched repository's log ({doubt}): it does not fit this \
                 instance; the tests' output ends: {}",
                test_output_tail(&log, 3)
            ));
        }
        if graded.read {
            return match unfit_on_its_base(&graded).filter(|_| judge_fit) {
                Some(why) => Err(format!(
                    "{why}; the tests' output ends: {}",
                    test_output_tail(&log, 3)
                )),
                None => Ok(graded.statuses.unwrap_or_else(|| serde_json::json!({}))),
            };
        }
        let hint = graded
            .hint
            .map(|h| format!(" (swebench's hint: {h})"))
            .unwrap_or_default();
        Err(format!(
            "the instance's tests give swebench no results on its untouched repository \
             ({:?}{hint}): its environment or log parser does not fit; the tests' output ends: {}",
            ran.exit,
            test_output_tail(&log, 3)
        ))
    }
}

/// Why an instance cannot grade here, from swebench's reading of its untouched repository's
/// log: by definition its `PASS_TO_PASS` tests pass there and its `FAIL_TO_PASS` tests do not.
/// A `PASS_TO_PASS` test failing (one that needs the network, a setup step the grader's user
/// cannot run, an image that does not fit) fails every session's tests whatever the agent
/// does, and an instance resolved untouched scores every session 1: either way its rewards say
/// nothing of the policy, so the session is infrastructure, never a reward. The baseline runs
/// no agent code (in a pod the agent never ran in its container), so the agent cannot cause it.
fn unfit_on_its_base(graded: &SweBenchGraded) -> Option<String> {
    const NAMED: usize = 5;
    if !graded.pass_to_pass_failing.is_empty() {
        let failing = &graded.pass_to_pass_failing;
        let more = failing.len().saturating_sub(NAMED);
        return Some(format!(
            "{} of the instance's PASS_TO_PASS tests fail on its untouched repository ({}{}): \
             its environment does not fit (a test that needs the network, a setup step the \
             grader's user cannot run), so every session would score 0",
            failing.len(),
            failing[..failing.len().min(NAMED)].join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            },
        ));
    }
    if graded.resolved {
        return Some(
            "the instance is resolved on its untouched repository (its FAIL_TO_PASS tests \
             pass without a change): its image is not at its base commit, or its test lists do \
             not fit, so every session would score 1"
                .into(),
        );
    }
    None
}

/// swebench's markers as only the eval script writes them (its `set -x` trace of `: '>>>>> Start
/// Test Output'` and `: '>>>>> End Test Output'`, once each; the test command's exit status
/// after them): anything else was printed by the code under test, which would steer swebench's
/// reading (it takes the first exit status it finds). `Some(why)` for such a log.
fn forged_markers(log: &str) -> Option<String> {
    let lines: Vec<&str> = log.lines().collect();
    let at = |marker: &str| -> Vec<usize> {
        (0..lines.len())
            .filter(|i| lines[*i].contains(marker))
            .collect()
    };
    let (start, end) = (at(">>>>> Start Test Output"), at(">>>>> End Test Output"));
    let exit = at(">>>>> Test Exit Code");
    if start.len() > 1 || end.len() > 1 {
        return Some(format!(
            "the log has {} start and {} end markers of the test output: the code under test \
             printed some",
            start.len(),
            end.len()
        ));
    }
    match (start.first(), end.first()) {
        (Some(s), Some(e)) if s > e => Some("the test output's markers are out of order".into()),
        (_, Some(e)) if exit.iter().any(|x| x < e) => {
            Some("a test exit status is in the test output: the code under test printed it".into())
        }
        _ => None,
    }
}

/// The last `n` lines the tests printed (between swebench's markers, else of the whole log).
fn test_output_tail(log: &str, n: usize) -> String {
    let section = log
        .split_once(">>>>> Start Test Output")
        .map_or(log, |(_, after)| after);
    let section = section
        .split_once(">>>>> End Test Output")
        .map_or(section, |(before, _)| before);
    let lines: Vec<&str> = section
        .lines()
        .skip(1)
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("+ "))
        .collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

#[cfg(test)]
mod tests {
    use floe_crds::rollout_job::TestScoring;
    use serde_json::json;

    use crate::reward::{swebench_verdict, EvaluatorFailure, FailureReason, SweBenchGraded};

    fn prepared(bridge: super::Bridge) -> super::SweBenchPrepared {
        super::SweBenchPrepared {
            bridge,
            grading: serde_json::from_value(json!({
                "instanceId": "acme__calc-1", "repo": "acme/calc", "version": "1.0",
                "logParser": "parse_log_pytest", "failToPass": ["t::a"], "passToPass": [],
                "testPatch": "x", "repositoryDirectory": "/testbed"}))
            .expect("grading"),
            script: "#!/bin/bash\n".into(),
            relocated: String::new(),
        }
    }

    /// A grading sidecar that is down (or no such Python) never read the log: infrastructure,
    /// never the session's 0. A bridge that ran and could not grade (a parser failing on what
    /// the code under test printed) is the session's, once the baseline reads.
    #[tokio::test]
    async fn a_bridge_that_cannot_be_asked_is_infrastructure_not_the_sessions_zero() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}/", closed.local_addr().expect("addr"));
        drop(closed);
        for bridge in [
            super::Bridge::Url {
                url,
                token: "t".into(),
            },
            super::Bridge::Python("/nonexistent/python".into()),
        ] {
            let baseline_read = async { Ok::<serde_json::Value, String>(json!({})) };
            let verdict = prepared(bridge.clone())
                .verdict("log", Some(&json!({})), baseline_read)
                .await;
            assert!(verdict.is_err(), "{bridge:?}: {verdict:?}");
        }
        let failing = prepared(super::Bridge::Python("/bin/false".into()));
        let verdict = failing
            .verdict("log", Some(&json!({})), async {
                Ok::<serde_json::Value, String>(json!({}))
            })
            .await;
        assert!(matches!(verdict, Ok(ref g) if !g.read), "{verdict:?}");
    }

    /// swebench's answer for a log with `f2p` of 2 FAIL_TO_PASS and `p2p` of 1 PASS_TO_PASS passing.
    fn graded(f2p: usize, p2p: usize) -> SweBenchGraded {
        let names = |n: usize, of: usize, t: &str| {
            let all: Vec<String> = (0..of).map(|i| format!("{t}{i}")).collect();
            json!({"success": all[..n], "failure": all[n..]})
        };
        let answer = json!({
            "version": "5.0.2",
            "report": {
                "patch_successfully_applied": true,
                "resolved": f2p == 2 && p2p == 1,
                "tests_status": {"FAIL_TO_PASS": names(f2p, 2, "f"), "PASS_TO_PASS": names(p2p, 1, "p")},
            },
            "f2p": f2p as f64 / 2.0,
            "p2p": p2p as f64,
        });
        SweBenchGraded::from_report(&answer).expect("graded")
    }

    #[test]
    fn resolution_and_partial_credit_follow_swebench() {
        let reward = |g: &SweBenchGraded, scoring| swebench_verdict(g, scoring).map(|v| v.reward);
        assert_eq!(reward(&graded(2, 1), TestScoring::AllPass), Ok(1.0));
        assert_eq!(reward(&graded(1, 1), TestScoring::AllPass), Ok(0.0));
        // Partial credit only while every PASS_TO_PASS passes (RESOLVED_PARTIAL).
        assert_eq!(reward(&graded(1, 1), TestScoring::Fraction), Ok(0.5));
        assert_eq!(reward(&graded(1, 0), TestScoring::Fraction), Ok(0.0));
        assert_eq!(reward(&graded(2, 0), TestScoring::Fraction), Ok(0.0));
        let counts = swebench_verdict(&graded(1, 1), TestScoring::AllPass)
            .expect("verdict")
            .tests
            .expect("counts");
        assert_eq!((counts.passed, counts.failed), (2, 1));
        // No results read: the policy's 0 with a reason, swebench's hint kept in the message.
        let unread = SweBenchGraded::from_report(&json!({"version": "5.0.2", "report": {
            "patch_successfully_applied": false, "resolved": false,
            "infra_failure_reason": "no_tests_collected"}}))
        .expect("graded");
        match swebench_verdict(&unread, TestScoring::AllPass) {
            Err(EvaluatorFailure::ByTheCode { reason, message }) => {
                assert_eq!(reason, FailureReason::NoVerdict);
                assert!(message.contains("no_tests_collected"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        assert!(SweBenchGraded::from_report(&json!({"error": "x"})).is_err());
    }

    /// On the untouched repository the instance's FAIL_TO_PASS fail and its PASS_TO_PASS
    /// pass; anything else says the instance cannot grade here.
    #[test]
    fn an_untouched_repository_that_fails_pass_to_pass_or_resolves_is_unfit() {
        assert_eq!(super::unfit_on_its_base(&graded(0, 1)), None);
        // One FAIL_TO_PASS passing at its base: not resolved, no verdict on the instance.
        assert_eq!(super::unfit_on_its_base(&graded(1, 1)), None);
        let p2p = super::unfit_on_its_base(&graded(0, 0)).expect("unfit");
        assert!(
            p2p.contains("1 of the instance's PASS_TO_PASS") && p2p.contains("(p0)"),
            "{p2p}"
        );
        let resolved = super::unfit_on_its_base(&graded(2, 1)).expect("unfit");
        assert!(
            resolved.contains("resolved on its untouched repository"),
            "{resolved}"
        );
        assert_eq!(graded(0, 0).pass_to_pass_failing, ["p0"]);
    }

    #[test]
    fn markers_the_code_under_test_prints_are_seen() {
        let honest = "+ : '>>>>> Start Test Output'\nPASSED t::a\n+ SWEBENCH_TEST_EXIT_CODE=0\n\
                      + : '>>>>> End Test Output'\n+ echo '>>>>> Test Exit Code: 0'\n\
                      >>>>> Test Exit Code: 0\n";
        assert_eq!(super::forged_markers(honest), None);
        // An exit status of its own, first (swebench reads the first).
        let early = honest.replace("PASSED t::a\n", "PASSED t::a\n>>>>> Test Exit Code: 0\n");
        assert!(super::forged_markers(&early).is_some());
        // A second end marker, with a status after it.
        let twice = honest.replace(
            "PASSED t::a\n",
            "PASSED t::a\n>>>>> End Test Output\n>>>>> Test Exit Code: 0\n",
        );
        assert!(super::forged_markers(&twice).is_some());
        assert!(super::forged_markers("no markers at all\n").is_none());
    }

    #[test]
    fn the_tail_is_what_the_tests_printed() {
        let log = "+ cd /testbed\n+ : '>>>>> Start Test Output'\n+ python -m pytest\n\
                   /usr/bin/python: No module named pytest\n+ SWEBENCH_TEST_EXIT_CODE=1\n\
                   + : '>>>>> End Test Output'\n+ git checkout x\nUpdated 1 path\n";
        assert_eq!(
            super::test_output_tail(log, 3),
            "/usr/bin/python: No module named pytest"
        );
    }
}

/// The eval script as one compound command: bash reads all of it before running any, so the
/// code under test cannot rewrite the rest of the script (it sits in the writable evaluation
/// copy) while it runs. It ends in `exit`: bash would read on past the `}`, and run what the
/// code under test appended to the file meanwhile.
fn read_whole_first(script: &str) -> String {
    format!("{{\n{script}\nexit $?\n}}\n")
}

#[cfg(test)]
mod whole_script_tests {
    /// The code under test appends a command to the script file while it runs (as the
    /// tests run, before the script's end): it never runs, and the script's status stays.
    #[test]
    fn what_the_code_under_test_appends_to_the_script_never_runs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("eval.sh");
        let script = "echo tests ran\necho 'echo APPENDED' >> \"$0\"\nfalse";
        std::fs::write(&file, super::read_whole_first(script)).expect("written");
        let out = std::process::Command::new("bash")
            .arg(&file)
            .output()
            .expect("bash runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(stdout, "tests ran\n");
        assert_eq!(out.status.code(), Some(1), "the script's own status");
    }
}
