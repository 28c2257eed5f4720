//! The evaluator's result → a reward. Sans-IO: the runner passes the exit, stdout and the
//! report file's contents.
//!
//! The outcome table (`docs/sandbox-contract.md`): the evaluator runs the policy's code, so
//! whatever that code can cause — an exit before any summary, a signal, tests that never end,
//! a reward file missing or garbled — is the policy's failure, scored (reward 0) with a reason
//! code, never "not scored": an RL run learns every loss it can turn into a retry. Only what
//! floe can show is not the code's (an evaluator that did not start, a job that names no
//! reward file or format) is an infrastructure failure.

use floe_crds::rollout_job::{RewardSource, RewardSpec, TestOutputFormat, TestScoring};
use serde::Serialize;

use crate::process::Exit;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TestCounts {
    pub passed: u64,
    pub failed: u64,
    pub skipped: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Verdict {
    pub reward: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tests: Option<TestCounts>,
    /// The evaluator's own reward where it was below `failureReward` (and raised to it) or
    /// above `maxReward` (and lowered to it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub evaluator_reward: Option<f64>,
}

/// Why a session scored as a failure without a verdict of its evaluator: each is something the
/// agent's workspace or the code under test caused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureReason {
    /// The tests did not finish within `timeouts.evaluatorSeconds`.
    EvaluatorTimeout,
    /// The evaluator died by a signal (the code under test crashed it, or filled its memory).
    EvaluatorKilled,
    /// The evaluator ran but left no verdict: no reward file, an unparseable one, no test
    /// results in its output.
    NoVerdict,
    /// The evaluator's command left a process behind, which could have rewritten its verdict.
    EvaluatorStraggler,
    /// The agent's workspace could not be read as task content.
    WorkspaceUnreadable,
    /// The agent's changes are larger than floe copies for grading.
    WorkspaceTooLarge,
    /// The agent filled more disk than its session may (local mode's `--session-disk`, checked
    /// while it runs); it was stopped there, as by its timeout.
    DiskLimit,
}

impl FailureReason {
    pub fn code(self) -> &'static str {
        match self {
            Self::EvaluatorTimeout => "evaluator_timeout",
            Self::EvaluatorKilled => "evaluator_killed",
            Self::NoVerdict => "no_verdict",
            Self::EvaluatorStraggler => "evaluator_straggler",
            Self::WorkspaceUnreadable => "workspace_unreadable",
            Self::WorkspaceTooLarge => "workspace_too_large",
            Self::DiskLimit => "disk_limit",
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum EvaluatorFailure {
    /// What the evaluated code did: the policy's failure, scored.
    #[error("{message}")]
    ByTheCode {
        reason: FailureReason,
        message: String,
    },
    /// The evaluator or the job cannot judge anything: infrastructure.
    #[error("the evaluator could not judge the session: {0}")]
    Broken(String),
}

fn no_verdict(message: String) -> EvaluatorFailure {
    EvaluatorFailure::ByTheCode {
        reason: FailureReason::NoVerdict,
        message,
    }
}

/// What the evaluator left behind.
pub struct EvaluatorResult<'a> {
    pub exit: &'a Exit,
    pub stdout: &'a str,
    /// Contents of `reward.path` when the spec names one (or why it could not be read).
    pub report: Option<Result<String, String>>,
    /// `SWEBench`: swebench's reading of the log (graded only when the evaluator exited).
    pub swebench: Option<&'a SweBenchGraded>,
}

/// What the `swebench` package made of an eval log (its `get_eval_report`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SweBenchGraded {
    /// swebench found test results in the log (its `patch_successfully_applied`).
    pub read: bool,
    pub resolved: bool,
    /// The fraction of `FAIL_TO_PASS` / `PASS_TO_PASS` that passed (when read).
    pub fail_to_pass: Option<f64>,
    pub pass_to_pass: Option<f64>,
    pub tests: Option<TestCounts>,
    /// The `PASS_TO_PASS` tests that did not pass, by name (when read).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pass_to_pass_failing: Vec<String>,
    /// The `PASS_TO_PASS` tests the log reports skipped or expected to fail (`XFAIL`), which
    /// swebench counts as kept: a regression where the untouched repository's log has them
    /// passing, which only that log tells.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pass_to_pass_skipped: Vec<String>,
    /// Those of them that passed on the untouched repository: failed (when it was given).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pass_to_pass_regressed: Vec<String>,
    /// swebench's own reading of the log, by test (when asked: an untouched repository's).
    #[serde(skip)]
    pub statuses: Option<serde_json::Value>,
    /// Why floe believed none of the log's passes (more than its runner's tally counts).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub doubt: Option<String>,
    /// swebench's advisory reading of a log without results (`infra_failure_reason`): kept in
    /// the detail, never a reason not to score, since the code under test wrote the log.
    pub hint: Option<String>,
    pub version: String,
}

impl SweBenchGraded {
    /// A log read as no results, for `why` (kept as the hint).
    pub fn unread(why: String) -> Self {
        Self {
            read: false,
            resolved: false,
            fail_to_pass: None,
            pass_to_pass: None,
            tests: None,
            pass_to_pass_failing: Vec::new(),
            pass_to_pass_skipped: Vec::new(),
            pass_to_pass_regressed: Vec::new(),
            statuses: None,
            doubt: None,
            hint: Some(why),
            version: String::new(),
        }
    }

    /// From the bridge's answer: `{"report": <get_eval_report's entry>, "f2p", "p2p", "version"}`.
    pub fn from_report(answer: &serde_json::Value) -> Result<Self, String> {
        let report = answer
            .get("report")
            .filter(|r| r.is_object())
            .ok_or_else(|| format!("swebench answered no report: {answer}"))?;
        let count = |kind: &str, side: &str| {
            report["tests_status"][kind][side]
                .as_array()
                .map_or(0, |a| a.len() as u64)
        };
        let names = |v: &serde_json::Value| -> Vec<String> {
            v.as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| t.as_str().map(str::to_string))
                .collect()
        };
        let tests = report.get("tests_status").map(|_| TestCounts {
            passed: count("FAIL_TO_PASS", "success") + count("PASS_TO_PASS", "success"),
            failed: count("FAIL_TO_PASS", "failure") + count("PASS_TO_PASS", "failure"),
            skipped: 0,
        });
        Ok(Self {
            read: report["patch_successfully_applied"]
                .as_bool()
                .unwrap_or(false),
            resolved: report["resolved"].as_bool().unwrap_or(false),
            fail_to_pass: answer["f2p"].as_f64(),
            pass_to_pass: answer["p2p"].as_f64(),
            tests,
            pass_to_pass_failing: names(&report["tests_status"]["PASS_TO_PASS"]["failure"]),
            pass_to_pass_skipped: names(&answer["p2p_skipped"]),
            pass_to_pass_regressed: names(&answer["p2p_regressed"]),
            statuses: answer.get("statuses").filter(|s| s.is_object()).cloned(),
            doubt: answer["doubt"].as_str().map(str::to_string),
            hint: report["infra_failure_reason"].as_str().map(str::to_string),
            version: answer["version"].as_str().unwrap_or_default().to_string(),
        })
    }
}

/// swebench's verdict as a reward: resolved → 1; `Fraction` → the `FAIL_TO_PASS` fraction while
/// every `PASS_TO_PASS` passes (swebench's `RESOLVED_PARTIAL`), else 0.
pub(crate) fn swebench_verdict(
    graded: &SweBenchGraded,
    scoring: TestScoring,
) -> Result<Verdict, EvaluatorFailure> {
    if !graded.read {
        let hint = graded
            .hint
            .as_ref()
            .map(|h| format!(" ({h})"))
            .unwrap_or_default();
        return Err(no_verdict(format!(
            "swebench {}read no test results in the eval log{hint}",
            if graded.version.is_empty() {
                String::new()
            } else {
                format!("{} ", graded.version)
            }
        )));
    }
    let reward = match scoring {
        _ if graded.resolved => 1.0,
        TestScoring::AllPass => 0.0,
        TestScoring::Fraction => match (graded.fail_to_pass, graded.pass_to_pass) {
            (Some(f2p), Some(p2p)) if p2p >= 1.0 && f2p.is_finite() => f2p.clamp(0.0, 1.0),
            _ => 0.0,
        },
    };
    Ok(Verdict {
        reward,
        tests: graded.tests,
        evaluator_reward: None,
    })
}

pub fn judge(spec: &RewardSpec, result: &EvaluatorResult) -> Result<Verdict, EvaluatorFailure> {
    judge_source(spec, result).map(|v| within_scale(spec, v))
}

/// No verdict below the job's `failureReward`, what a failure scores: an evaluator whose
/// scale goes lower (a reward file of -1 under the default 0) would otherwise teach the policy
/// that hanging the evaluator or running out its time pays better than a wrong answer. None
/// above its `maxReward`, when set: a reward file the code under test wrote could claim more.
fn within_scale(spec: &RewardSpec, v: Verdict) -> Verdict {
    let top = spec.max_reward.unwrap_or(f64::INFINITY);
    let reward = v.reward.max(spec.failure_reward).min(top);
    if reward == v.reward {
        return v;
    }
    Verdict {
        reward,
        evaluator_reward: Some(v.reward),
        ..v
    }
}

fn judge_source(spec: &RewardSpec, result: &EvaluatorResult) -> Result<Verdict, EvaluatorFailure> {
    match result.exit {
        Exit::SpawnFailed(e) => {
            return Err(EvaluatorFailure::Broken(format!("did not start: {e}")))
        }
        Exit::Signal(s) => {
            return Err(EvaluatorFailure::ByTheCode {
                reason: FailureReason::EvaluatorKilled,
                message: format!("the evaluator was killed by signal {s}"),
            })
        }
        Exit::TimedOut => {
            return Err(EvaluatorFailure::ByTheCode {
                reason: FailureReason::EvaluatorTimeout,
                message: "the evaluator timed out".into(),
            })
        }
        Exit::Code(_) => {}
    }
    match spec.source {
        // Any exit but 0 is a failure, 126 and 127 too: the runner checked the evaluator's
        // program starts before running it, so they are the code's (`os._exit(127)`).
        RewardSource::ExitCode => Ok(Verdict {
            reward: f64::from(u8::from(*result.exit == Exit::Code(0))),
            tests: None,
            evaluator_reward: None,
        }),
        RewardSource::RewardFile => {
            let text = match &result.report {
                Some(Ok(text)) => text,
                Some(Err(e)) => return Err(no_verdict(format!("reward file: {e}"))),
                None => return Err(EvaluatorFailure::Broken("reward.path is not set".into())),
            };
            reward_file(text).map(|reward| Verdict {
                reward,
                tests: None,
                evaluator_reward: None,
            })
        }
        RewardSource::TestOutput => {
            let text = match &result.report {
                Some(Ok(text)) => text.as_str(),
                Some(Err(e)) => return Err(no_verdict(format!("test report: {e}"))),
                None => result.stdout,
            };
            let format = spec
                .format
                .ok_or_else(|| EvaluatorFailure::Broken("reward.format is not set".into()))?;
            let counts = match format {
                TestOutputFormat::PytestSummary => pytest_summary(text),
                TestOutputFormat::Tap => tap(text),
                TestOutputFormat::JUnitXml => junit_xml(text)?,
            };
            let Some(counts) = counts.filter(|c| c.passed.saturating_add(c.failed) > 0) else {
                return Err(no_verdict(format!(
                    "no test results found in the {format:?} output"
                )));
            };
            // The code under test can stop the run inside the test it fails (`pytest.exit()`,
            // a KeyboardInterrupt): pytest still prints the tally of the tests before it. Its
            // banner is in its output: stdout, or the report that is pytest's output (not a
            // JUnit report's captured `system-out`).
            let report_is_output = format == TestOutputFormat::PytestSummary;
            let banner = interrupted(result.stdout)
                .or_else(|| report_is_output.then(|| interrupted(text)).flatten());
            if let Some(banner) = banner {
                return Err(no_verdict(format!(
                    "the test run was interrupted ({banner}): the tests after it never ran"
                )));
            }
            // A skip past those the task allows is a test the code under test kept from
            // failing (pytest.skip() where it fails): it counts as failed.
            let failed = counts
                .failed
                .saturating_add(counts.skipped.saturating_sub(u64::from(spec.allowed_skips)));
            let reward = match spec.scoring {
                TestScoring::AllPass => f64::from(u8::from(failed == 0)),
                TestScoring::Fraction => {
                    counts.passed as f64 / counts.passed.saturating_add(failed) as f64
                }
            };
            Ok(Verdict {
                reward,
                tests: Some(counts),
                evaluator_reward: None,
            })
        }
        RewardSource::SweBench => match result.swebench {
            Some(graded) => swebench_verdict(graded, spec.scoring),
            None => Err(EvaluatorFailure::Broken(
                "the SWE-bench log was not graded".into(),
            )),
        },
    }
}

/// The largest reward, either way, a reward file may give (the trainer takes no more: past
/// any evaluator's scale, and the squares of a group's differences would overflow a float).
pub const REWARD_LIMIT: f64 = 1e9;

/// `{"reward": <finite number>}` (a bare number is accepted too), within ±[`REWARD_LIMIT`].
fn reward_file(text: &str) -> Result<f64, EvaluatorFailure> {
    let value: serde_json::Value = serde_json::from_str(text.trim())
        .map_err(|e| no_verdict(format!("reward file is not JSON: {e}")))?;
    let reward = value
        .get("reward")
        .unwrap_or(&value)
        .as_f64()
        .filter(|r| r.is_finite() && r.abs() <= REWARD_LIMIT)
        .ok_or_else(|| {
            no_verdict(format!(
                "reward file must hold {{\"reward\": <number within ±{REWARD_LIMIT:e}>}}, got {}",
                truncate(text.trim(), 200)
            ))
        })?;
    Ok(reward)
}

fn truncate(s: &str, max: usize) -> &str {
    s.char_indices().nth(max).map_or(s, |(i, _)| &s[..i])
}

/// pytest's banner for a run it stopped before its end, if `text` has one: a line that begins
/// with `!`s and a space (`!!!!! _pytest.outcomes.Exit: … !!!!!`, `!!!!! KeyboardInterrupt
/// !!!!!`, `!!!!! stopping after 1 failures !!!!!`). Not the title: the code under test picks
/// it (an `Exit` subclass, its reason), and a long one leaves a single `!` on each side, a
/// multi-line one none on the right of its first line.
pub fn interrupted(text: &str) -> Option<&str> {
    text.lines()
        .find(|l| {
            let rest = l.trim_start_matches('!');
            rest.len() < l.len() && rest.starts_with(' ')
        })
        .map(|l| l.trim_matches('!').trim())
}

/// pytest's summary line, e.g. `==== 3 passed, 1 failed, 2 errors in 0.12s ====` or, with
/// `-q`, `3 passed, 1 failed in 0.12s`. Errors count as failures, xpassed as passes, xfailed
/// as skips; deselected tests are not counted.
///
/// There must be exactly one: the code under test runs in pytest's process and can print a
/// second one after pytest's (an `atexit` hook, a leftover child), and "the last one wins"
/// would let it. Two summaries are no verdict (the policy's failure).
pub fn pytest_summary(text: &str) -> Option<TestCounts> {
    let mut found = text.lines().filter_map(pytest_summary_line);
    match (found.next(), found.next()) {
        (Some(counts), None) => Some(counts),
        _ => None,
    }
}

fn pytest_summary_line(line: &str) -> Option<TestCounts> {
    let line = line.trim().trim_matches('=').trim();
    let body = line.rsplit_once(" in ").map_or(line, |(b, _)| b);
    let mut counts = TestCounts::default();
    let mut matched = false;
    for part in body.split(", ") {
        let Some((n, word)) = part.split_once(' ') else {
            matched = false;
            break;
        };
        let Ok(n) = n.parse::<u64>() else {
            matched = false;
            break;
        };
        match word {
            "passed" | "xpassed" => counts.passed = counts.passed.saturating_add(n),
            // A failed subtest (pytest 9, pytest-subtests) fails its test too in the versions
            // that say so; counted here as well, since older ones left the test passed.
            "failed" | "error" | "errors" | "subtests failed" => {
                counts.failed = counts.failed.saturating_add(n)
            }
            "skipped" | "xfailed" | "subtests skipped" | "subtests xfailed" => {
                counts.skipped = counts.skipped.saturating_add(n)
            }
            // Left out of the run by its command (`-k`, `-m`), not by the code under test; a
            // passed subtest is part of its test, counted once as that test.
            "deselected" | "warning" | "warnings" | "rerun" | "reruns" | "subtests"
            | "subtests passed" | "subtests xpassed" => {}
            _ => {
                matched = false;
                break;
            }
        }
        matched = true;
    }
    matched.then_some(counts)
}

/// Test Anything Protocol: `ok` / `not ok` lines; `# SKIP` and `# TODO` are skips (after the
/// first `#` not escaped as `\#`); tests the plan (`1..N`) promises but never reports count as
/// failed; `Bail out!` fails one.
pub fn tap(text: &str) -> Option<TestCounts> {
    let mut counts = TestCounts::default();
    let mut plan = None;
    let mut seen = 0u64;
    let mut any = false;
    for line in text.lines() {
        let line = line.trim_start();
        if let Some(n) = line
            .strip_prefix("1..")
            .and_then(|r| r.split_whitespace().next())
            .and_then(|n| n.parse::<u64>().ok())
        {
            plan = Some(n);
            any = true;
            continue;
        }
        if line.starts_with("Bail out!") {
            counts.failed += 1;
            any = true;
            continue;
        }
        let (ok, rest) = if let Some(rest) = line.strip_prefix("not ok") {
            (false, rest)
        } else if let Some(rest) = line.strip_prefix("ok") {
            (true, rest)
        } else {
            continue;
        };
        if !(rest.is_empty() || rest.starts_with(' ')) {
            continue; // "okay", "nothing"
        }
        any = true;
        seen += 1;
        let directive = directive_of(rest).map(|d| d.trim().to_ascii_uppercase());
        match directive.as_deref() {
            Some(d) if d.starts_with("SKIP") || d.starts_with("TODO") => counts.skipped += 1,
            _ if ok => counts.passed += 1,
            _ => counts.failed += 1,
        }
    }
    if let Some(planned) = plan {
        counts.failed = counts.failed.saturating_add(planned.saturating_sub(seen));
    }
    any.then_some(counts)
}

/// What follows a TAP test line's first `#` that is not escaped (`\#` is a `#` of the
/// description: `ok 3 - issue \#12 # SKIP` is a skip).
fn directive_of(rest: &str) -> Option<&str> {
    let bytes = rest.as_bytes();
    // Escaped by an odd run of backslashes before it (`\\#` is a backslash, then a `#`).
    let escaped = |i: usize| bytes[..i].iter().rev().take_while(|&&b| b == b'\\').count() % 2 == 1;
    (0..bytes.len())
        .find(|&i| bytes[i] == b'#' && !escaped(i))
        .map(|i| &rest[i + 1..])
}

/// JUnit XML: every `<testcase>`; one with `<failure>` or `<error>` failed, with `<skipped>`
/// skipped, else passed.
pub fn junit_xml(text: &str) -> Result<Option<TestCounts>, EvaluatorFailure> {
    let doc = roxmltree::Document::parse(text)
        .map_err(|e| no_verdict(format!("JUnit XML does not parse: {e}")))?;
    let mut counts = TestCounts::default();
    let mut any = false;
    for case in doc.descendants().filter(|n| n.has_tag_name("testcase")) {
        any = true;
        let child = |name: &str| case.children().any(|c| c.has_tag_name(name));
        if child("failure") || child("error") {
            counts.failed += 1;
        } else if child("skipped") {
            counts.skipped += 1;
        } else {
            counts.passed += 1;
        }
    }
    Ok(any.then_some(counts))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(
        source: RewardSource,
        format: Option<TestOutputFormat>,
        scoring: TestScoring,
    ) -> RewardSpec {
        RewardSpec {
            source,
            path: None,
            format,
            scoring,
            allowed_skips: 0,
            pass_threshold: 1.0,
            failure_reward: 0.0,
            max_reward: None,
        }
    }

    fn verdict(
        spec: &RewardSpec,
        exit: Exit,
        stdout: &str,
        report: Option<Result<String, String>>,
    ) -> Result<Verdict, EvaluatorFailure> {
        judge(
            spec,
            &EvaluatorResult {
                swebench: None,
                exit: &exit,
                stdout,
                report,
            },
        )
    }

    fn judged(
        spec: &RewardSpec,
        exit: Exit,
        stdout: &str,
        report: Option<Result<String, String>>,
    ) -> Result<f64, EvaluatorFailure> {
        verdict(spec, exit, stdout, report).map(|v| v.reward)
    }

    /// The policy's failure without a verdict of its evaluator.
    fn is_no_verdict(judged: &Result<f64, EvaluatorFailure>) -> bool {
        matches!(
            judged,
            Err(EvaluatorFailure::ByTheCode {
                reason: FailureReason::NoVerdict,
                ..
            })
        )
    }

    #[test]
    fn exit_code_rewards_and_broken_evaluators() {
        let s = spec(RewardSource::ExitCode, None, TestScoring::AllPass);
        assert_eq!(judged(&s, Exit::Code(0), "", None), Ok(1.0));
        assert_eq!(judged(&s, Exit::Code(1), "", None), Ok(0.0));
        assert_eq!(judged(&s, Exit::Code(2), "", None), Ok(0.0));
        // The code under test can exit 127 (`os._exit(127)`): a failure, not a broken evaluator.
        assert_eq!(judged(&s, Exit::Code(127), "", None), Ok(0.0));
        assert_eq!(judged(&s, Exit::Code(126), "", None), Ok(0.0));
        let reason = |exit: Exit| match judged(&s, exit, "", None) {
            Err(EvaluatorFailure::ByTheCode { reason, .. }) => Some(reason),
            _ => None,
        };
        assert_eq!(
            reason(Exit::Signal(9)),
            Some(FailureReason::EvaluatorKilled)
        );
        assert_eq!(
            reason(Exit::TimedOut),
            Some(FailureReason::EvaluatorTimeout)
        );
        assert!(matches!(
            judged(&s, Exit::SpawnFailed("x".into()), "", None),
            Err(EvaluatorFailure::Broken(_))
        ));
    }

    #[test]
    fn no_reward_is_below_the_jobs_failure_reward() {
        let mut s = spec(RewardSource::RewardFile, None, TestScoring::AllPass);
        let result = |s: &RewardSpec, text: &str| {
            verdict(s, Exit::Code(0), "", Some(Ok(text.to_string())))
                .map(|v| (v.reward, v.evaluator_reward))
        };
        // Under the default 0, a -1 would make failing (0) pay better than a wrong answer.
        assert_eq!(result(&s, r#"{"reward": -1}"#), Ok((0.0, Some(-1.0))));
        assert_eq!(result(&s, r#"{"reward": 0.25}"#), Ok((0.25, None)));
        // A scale that goes to -1 says so, and keeps its rewards.
        s.failure_reward = -1.0;
        assert_eq!(result(&s, "-0.5"), Ok((-0.5, None)));
        assert_eq!(result(&s, "-3"), Ok((-1.0, Some(-3.0))));
        // Every source: an exit code's 0 is raised to a failure reward above it.
        let mut exit_code = spec(RewardSource::ExitCode, None, TestScoring::AllPass);
        exit_code.failure_reward = 0.5;
        assert_eq!(judged(&exit_code, Exit::Code(1), "", None), Ok(0.5));
    }

    /// A reward file the code under test wrote claims no more than the job's scale allows.
    #[test]
    fn no_reward_is_above_the_jobs_max_reward() {
        let mut s = spec(RewardSource::RewardFile, None, TestScoring::AllPass);
        let result = |s: &RewardSpec, text: &str| {
            verdict(s, Exit::Code(0), "", Some(Ok(text.to_string())))
                .map(|v| (v.reward, v.evaluator_reward))
        };
        assert_eq!(result(&s, "1e9"), Ok((1e9, None)), "unset: unbounded");
        s.max_reward = Some(1.0);
        assert_eq!(result(&s, "1e9"), Ok((1.0, Some(1e9))));
        assert_eq!(result(&s, "0.75"), Ok((0.75, None)));
        assert_eq!(result(&s, "-3"), Ok((0.0, Some(-3.0))));
    }

    #[test]
    fn reward_file_values_and_failures() {
        let s = spec(RewardSource::RewardFile, None, TestScoring::AllPass);
        let file = |t: &str| Some(Ok(t.to_string()));
        assert_eq!(
            judged(&s, Exit::Code(0), "", file(r#"{"reward": 0.25}"#)),
            Ok(0.25)
        );
        assert_eq!(judged(&s, Exit::Code(1), "", file("0.5\n")), Ok(0.5));
        assert!(judged(&s, Exit::Code(0), "", file(r#"{"score": 1}"#)).is_err());
        assert!(judged(&s, Exit::Code(0), "", file("nope")).is_err());
        // Past ±1e9 (the code under test writing a reward the trainer's squares overflow on):
        // the policy's failure.
        assert_eq!(judged(&s, Exit::Code(0), "", file("1e9")), Ok(1e9));
        for huge in [r#"{"reward": 1e300}"#, "-1.5e9"] {
            assert!(
                is_no_verdict(&judged(&s, Exit::Code(0), "", file(huge))),
                "{huge}"
            );
        }
        let missing = judged(&s, Exit::Code(0), "", Some(Err("missing".into())));
        assert!(is_no_verdict(&missing), "{missing:?}");
        // A job without reward.path cannot be judged by anyone: infrastructure.
        assert!(matches!(
            judged(&s, Exit::Code(0), "", None),
            Err(EvaluatorFailure::Broken(_))
        ));
    }

    #[test]
    fn pytest_summary_lines() {
        let c = |passed, failed, skipped| {
            Some(TestCounts {
                passed,
                failed,
                skipped,
            })
        };
        assert_eq!(pytest_summary("...\n3 passed in 0.01s\n"), c(3, 0, 0));
        assert_eq!(
            pytest_summary(
                "===== 3 passed, 1 failed, 2 errors, 1 skipped, 4 warnings in 0.12s =====\n"
            ),
            c(3, 3, 1)
        );
        assert_eq!(
            pytest_summary("1 failed, 1 xpassed, 2 xfailed in 1.0s"),
            c(1, 1, 2)
        );
        assert_eq!(
            pytest_summary("2 passed, 1 skipped, 40 deselected in 1.0s"),
            c(2, 0, 1)
        );
        // Subtests (pytest 9's, pytest-subtests'): `-v` counts the passed ones, which read as
        // no summary at all before (no verdict for every session); a failed one fails.
        assert_eq!(
            pytest_summary("===== 2 passed, 5 subtests passed in 0.12s =====\n"),
            c(2, 0, 0)
        );
        assert_eq!(
            pytest_summary("1 failed, 1 passed, 2 subtests failed, 3 subtests passed in 1s"),
            c(1, 3, 0)
        );
        assert_eq!(
            pytest_summary("1 passed, 1 subtests failed in 1s"),
            c(1, 1, 0)
        );
        assert_eq!(
            pytest_summary("1 passed, 1 subtests skipped in 1s"),
            c(1, 0, 1)
        );
        assert_eq!(
            pytest_summary("1 xfailed, 2 subtests xpassed in 1s"),
            c(0, 0, 1)
        );
        assert_eq!(pytest_summary("1 passed, 1 subtests vanished in 1s"), None);
        assert_eq!(pytest_summary("no tests ran in 0.01s"), None);
        assert_eq!(pytest_summary("all good"), None);
        // A second summary (the code under test printing one after pytest's) is no verdict.
        assert_eq!(
            pytest_summary("5 passed in 1s\nmore output\n2 failed in 3s"),
            None
        );
        assert_eq!(
            pytest_summary("1 failed in 0.1s\n99 passed in 0.1s\n"),
            None
        );
    }

    #[test]
    fn tap_streams() {
        let text = "TAP version 13\n1..5\nok 1 - a\nnot ok 2 - b\nok 3 # SKIP no db\nnot ok 4 # TODO later\n";
        // Test 5 was planned and never reported: a failure.
        assert_eq!(
            tap(text),
            Some(TestCounts {
                passed: 1,
                failed: 2,
                skipped: 2
            })
        );
        // An escaped `#` is the description's; the directive follows the first bare one.
        assert_eq!(
            tap("ok 1 - issue \\#12 # SKIP later\nok 2 - c\\# # todo\nok 3 - dir\\\\# SKIP\n"),
            Some(TestCounts {
                passed: 0,
                failed: 0,
                skipped: 3
            })
        );
        // A plan of 2⁶⁴−1 and two bail-outs wrapped the failures round to none.
        assert_eq!(
            tap("ok 1\nnot ok 2\n1..18446744073709551615\nBail out!\nBail out!\n")
                .map(|c| c.failed),
            Some(u64::MAX)
        );
        assert_eq!(tap("okay\nnothing"), None);
        assert_eq!(
            tap("ok\nBail out! db down"),
            Some(TestCounts {
                passed: 1,
                failed: 1,
                skipped: 0
            })
        );
    }

    #[test]
    fn junit_reports() -> Result<(), EvaluatorFailure> {
        let xml = r#"<testsuites><testsuite name="s">
            <testcase name="a"/><testcase name="b"><failure message="x"/></testcase>
            <testcase name="c"><error/></testcase><testcase name="d"><skipped/></testcase>
            <testcase name="e"></testcase></testsuite></testsuites>"#;
        assert_eq!(
            junit_xml(xml)?,
            Some(TestCounts {
                passed: 2,
                failed: 2,
                skipped: 1
            })
        );
        assert!(junit_xml("<not xml").is_err());
        assert_eq!(junit_xml("<testsuites/>")?, None);
        Ok(())
    }

    #[test]
    fn test_output_scoring_and_empty_runs() {
        let all = spec(
            RewardSource::TestOutput,
            Some(TestOutputFormat::PytestSummary),
            TestScoring::AllPass,
        );
        let frac = spec(
            RewardSource::TestOutput,
            Some(TestOutputFormat::PytestSummary),
            TestScoring::Fraction,
        );
        let out = "3 passed, 1 failed in 0.1s";
        assert_eq!(judged(&all, Exit::Code(1), out, None), Ok(0.0));
        assert_eq!(judged(&frac, Exit::Code(1), out, None), Ok(0.75));
        assert_eq!(
            judged(&all, Exit::Code(0), "4 passed in 0.1s", None),
            Ok(1.0)
        );
        // Collected nothing (e.g. the agent broke an import the tests need is *not* this: that
        // is "1 error"); no test ran, or the code exited before any summary: the code's failure.
        assert!(is_no_verdict(&judged(
            &all,
            Exit::Code(5),
            "no tests ran in 0.01s",
            None
        )));
        assert_eq!(
            judged(&all, Exit::Code(2), "1 error in 0.1s", None),
            Ok(0.0)
        );
        // The code under test skipping the tests it fails (`pytest.skip()`, `unittest.SkipTest`,
        // `pytest.xfail()`): each skip is a failure, past the skips the task allows.
        let skipping = "3 passed, 2 skipped in 0.1s";
        assert_eq!(judged(&all, Exit::Code(0), skipping, None), Ok(0.0));
        assert_eq!(judged(&frac, Exit::Code(0), skipping, None), Ok(0.6));
        assert_eq!(
            judged(&all, Exit::Code(0), "3 passed, 1 xfailed in 0.1s", None),
            Ok(0.0)
        );
        let mut allowing = all.clone();
        allowing.allowed_skips = 2;
        assert_eq!(judged(&allowing, Exit::Code(0), skipping, None), Ok(1.0));
        allowing.allowed_skips = 1;
        assert_eq!(judged(&allowing, Exit::Code(0), skipping, None), Ok(0.0));
        let mut fraction_allowing = frac.clone();
        fraction_allowing.allowed_skips = 1;
        assert_eq!(
            judged(&fraction_allowing, Exit::Code(0), skipping, None),
            Ok(0.75)
        );
        // Every test skipped: no result at all, as before.
        assert!(is_no_verdict(&judged(
            &allowing,
            Exit::Code(0),
            "4 skipped in 0.1s",
            None
        )));
        // Stopped inside the test it fails (`pytest.exit("x", returncode=0)`, a
        // KeyboardInterrupt): the tally of the tests before it is no verdict.
        for stopped in [
            ".\n1 passed in 0.31s\n!!!!!!!!!! _pytest.outcomes.Exit: bye !!!!!!!!!!\n",
            ".\n!!!!!!!!!! KeyboardInterrupt !!!!!!!!!!\n/t/test_a.py:4: KeyboardInterrupt\n1 passed in 0.7s\n",
            // A long title leaves one `!` a side; a multi-line one none after its first line.
            &format!("1 passed in 0.01s\n! _pytest.outcomes.Exit: {} !\n", "x".repeat(60)),
            "1 passed in 0.01s\n!!!!! mine.Stop: one\ntwo !!!!!\n",
        ] {
            assert!(
                is_no_verdict(&judged(&all, Exit::Code(0), stopped, None)),
                "{stopped}"
            );
        }
        // Huge counts saturate instead of wrapping (to a total of 0, or to a reward past 1).
        assert_eq!(
            judged(
                &all,
                Exit::Code(0),
                "18446744073709551615 passed, 18446744073709551615 passed, 1 failed in 1s",
                None
            ),
            Ok(0.0)
        );
        // Lines of `!`s alone, or with no space after them, are a test's output, not a banner.
        assert_eq!(
            judged(
                &all,
                Exit::Code(0),
                "!!!!!!!!\n!!!WARNING\n2 passed in 0.1s\n",
                None
            ),
            Ok(1.0)
        );
        // Deselected by the command: not counted.
        assert_eq!(
            judged(&all, Exit::Code(0), "4 passed, 9 deselected in 0.1s", None),
            Ok(1.0)
        );
        // A named report file wins over stdout.
        let mut from_file = all.clone();
        from_file.path = Some("report.txt".into());
        assert_eq!(
            judged(
                &from_file,
                Exit::Code(0),
                out,
                Some(Ok("2 passed in 1s".into()))
            ),
            Ok(1.0)
        );
    }
}
