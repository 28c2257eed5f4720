//! SWE-bench instances in local mode (`tasks.swebench`), graded by the official `swebench`
//! package: instances this test makes in the exact SWE-bench format, one `floe run` (sandboxed,
//! as a newcomer runs it), and a scripted agent per instance — the fix, nothing, tampered
//! tests, deleted tests, a fix that breaks a `PASS_TO_PASS` test. Only the fix resolves. Every
//! agent also looks for the gold patch and the test patch everywhere it can read (its
//! workspace, the workspace's git history, the local checkout the instance came from, `$HOME`,
//! `/tmp`) and reports what it found.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};
use floe_tests::swebench_instance::{self as swe, GOLD_PATCH_MARKER, TEST_PATCH_MARKER};
use floe_tests::{floe_bin, wait_child, ScriptedUpstream, Step};
use serde_json::{json, Value};

/// One honest model call, then the behaviour the problem statement's last line names; before
/// it, a search for both patches' markers, reported on stderr as `leaks: …`.
const AGENT: &str = r#"
import json, os, subprocess, urllib.request
req = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/chat/completions",
    data=json.dumps({"model": os.environ["FLOE_MODEL"], "messages": [{"role": "user", "content": "hi"}]}).encode(),
    headers={"content-type": "application/json", "authorization": "Bearer " + os.environ["OPENAI_API_KEY"]},
)
urllib.request.urlopen(req, timeout=30).read()
statement = os.environ["FLOE_INSTRUCTION"]
checkout = statement.split("checkout: ")[1].split()[0]
behaviour = statement.strip().splitlines()[-1].split("agent: ")[1]
found = []
if "return a - b" not in open("calc.py").read():
    found.append("no-buggy-workspace")
for marker in ("MARK_TEST", "MARK_GOLD"):
    for what, cmd in [
        ("files", ["grep", "-rqs", marker, ".", os.environ.get("HOME", "/nonexistent"), "/tmp", checkout]),
        ("history", ["sh", "-c", "git log --all -p | grep -q " + marker]),
        ("checkout", ["sh", "-c", "git -C '%s' log --all -p | grep -q %s" % (checkout, marker)]),
    ]:
        if subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0:
            found.append(marker + ":" + what)
print("leaks: " + (",".join(found) or "none"), file=os.sys.stderr, flush=True)
scripts = {
    "fix": "printf 'FIXED' > calc.py",
    "nothing": "true",
    "tamper": "printf 'def test_add():\\n    pass\\n\\n\\ndef test_sub():\\n    pass\\n' > tests/test_calc.py"
              " && printf 'import pytest\\n@pytest.hookimpl(hookwrapper=True)\\ndef pytest_runtest_makereport(item, call):\\n"
              "    outcome = yield\\n    outcome.get_result().outcome = \"passed\"\\n' > conftest.py"
              " && git -c user.email=a@b -c user.name=a commit -qam tests-pass",
    "delete-tests": "rm -rf tests",
    "break-p2p": "printf 'BROKEN' > calc.py",
    "syntax-error": "printf 'def add(a, b)\\n' > calc.py",
    # The bug left in, and results of its own printed after pytest's, then exit status 0.
    "forge-log": "printf 'import atexit, os\\n\\n\\ndef _forge():\\n    print(\"PASSED tests/test_calc.py::test_add\", flush=True)\\n    os._exit(0)\\n\\n\\natexit.register(_forge)\\n' >> calc.py",
    # The same without the exit: an exit status of its own first (swebench reads the first).
    "forge-exit-status": "printf 'import atexit\\nprint(\">>>>> Test Exit Code: 0\", flush=True)\\natexit.register(lambda: print(\"PASSED tests/test_calc.py::test_add\", flush=True))\\n' >> calc.py",
    # The bug left in, and the repository's test runner (which this instance's eval script
    # runs by path) rewritten to report every test as passing.
    "rewrite-runner": "printf 'echo PASSED tests/test_calc.py::test_add; echo PASSED tests/test_calc.py::test_sub\\n' > runtests.sh",
    # The bug left in, the test it fails skipped (pytest's skip summary names no test), and a
    # pass of its own printed after pytest's tally.
    "skip-forge": "printf 'import atexit\\n\\n\\ndef add(a, b):\\n    import pytest\\n    pytest.skip(\"later\")\\n\\n\\natexit.register(lambda: print(\"PASSED tests/test_calc.py::test_add\", flush=True))\\n' >> calc.py",
    # The fix, and the PASS_TO_PASS test it breaks told to expect its failure: swebench counts
    # an XFAIL kept.
    "xfail-p2p": "printf 'FIXED' > calc.py && printf '\\n\\ndef sub(a, b):\\n    import pytest\\n    pytest.xfail(\"later\")\\n' >> calc.py",
    # The tests killed as they import the code: a log without results.
    "hide-results": "printf 'import os\\nos._exit(3)\\n' >> calc.py",
}
os.execvp("sh", ["sh", "-c", scripts[behaviour]])
"#;

/// (instance number, agent behaviour, reward).
const AGENTS: &[(u32, &str, f64)] = &[
    (1, "fix", 1.0),
    (2, "nothing", 0.0),
    (3, "tamper", 0.0),
    (4, "delete-tests", 0.0),
    (5, "break-p2p", 0.0),
    // Collection fails: the tests run on the untouched repository, so it is the agent's 0.
    (6, "syntax-error", 0.0),
    // The log forged two ways (swebench alone reads the first as resolved); both are 0.
    (7, "forge-log", 0.0),
    (8, "forge-exit-status", 0.0),
    (9, "rewrite-runner", 0.0),
    // Its log has no results, on an instance whose PASS_TO_PASS fails untouched (below): the
    // lazy baseline reads results, so it is the agent's 0. Judging the instance unfit there
    // (as pods do, where the baseline runs on every session) would make only the sessions that
    // hide their results unscored, while honest ones score 0.
    (10, "hide-results", 0.0),
    // swebench alone reads it as resolved: the printed pass is the test's only result.
    (11, "skip-forge", 0.0),
    // swebench alone reads it as resolved; the untouched repository's run, made for it, has
    // the test passing.
    (12, "xfail-p2p", 0.0),
];

fn agent() -> String {
    let printf = |s: &str| s.replace('\n', "\\\\n");
    AGENT
        .replace("MARK_TEST", TEST_PATCH_MARKER)
        .replace("MARK_GOLD", GOLD_PATCH_MARKER)
        .replace("FIXED", &printf(swe::FIXED_CALC))
        .replace(
            "BROKEN",
            &printf(&swe::FIXED_CALC.replace("return a - b", "return 0")),
        )
}

fn job(dir: &Path, model_url: &str, activate: &Path) -> Result<std::path::PathBuf> {
    job_of(dir, model_url, activate, AGENTS)
}

fn job_of(
    dir: &Path,
    model_url: &str,
    activate: &Path,
    agents: &[(u32, &str, f64)],
) -> Result<std::path::PathBuf> {
    let checkout = dir.join("repos").join(swe::REPO);
    let up = swe::upstream(&checkout)?;
    let lines: Vec<String> = agents
        .iter()
        .map(|(n, behaviour, _)| {
            let statement = format!(
                "calc.add(2, 3) returns -1; it should return 5.\n\ncheckout: {}\nagent: {behaviour}\n",
                checkout.display()
            );
            let mut line = swe::instance(&up, *n, &statement, activate);
            if *behaviour == "rewrite-runner" {
                let script = line["eval_script"].as_str().unwrap_or_default().replace(
                    "python -m pytest --no-header -rA tests/test_calc.py",
                    "bash runtests.sh tests/test_calc.py",
                );
                line["eval_script"] = script.into();
            }
            if *behaviour == "hide-results" {
                line["PASS_TO_PASS"] =
                    json!([swe::PASS_TO_PASS, "tests/test_calc.py::test_online"]);
            }
            line.to_string()
        })
        .collect();
    std::fs::write(dir.join("instances.jsonl"), lines.join("\n") + "\n")?;
    let job = json!({
        "apiVersion": "floe.dev/v1alpha1",
        "kind": "RolloutJob",
        "metadata": {"name": "swe"},
        "spec": {
            "numSamples": 1,
            "concurrency": 2,
            "backoffLimit": 0,
            "poolRef": {"name": "local"},
            "harness": {"preset": "custom", "model": "policy", "command": ["python3", "-c", agent()]},
            "tasks": {"file": {"path": "instances.jsonl"}, "swebench": {}},
            "evaluator": {"reward": {"source": "SWEBench"}},
            "timeouts": {"agentSeconds": 60, "evaluatorSeconds": 120},
            "sft": {"upstream": {"url": model_url}, "output": {"claimName": "unused"}},
        },
    });
    let path = dir.join("job.yaml");
    std::fs::write(&path, serde_json::to_string_pretty(&job)?)?;
    Ok(path)
}

#[tokio::test]
async fn swebench_instances_resolve_only_with_the_fix_and_the_agent_sees_no_patch() -> Result<()> {
    let install = swe::install_dir()?;
    let model = ScriptedUpstream::start(vec![Step::Say("done".into())]).await?;
    // Not under /tmp: each sandbox has a /tmp of its own, which would hide the checkout
    // whether or not floe does.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR"))?;
    let out = dir.path().join("out");
    let job = job(
        dir.path(),
        &model.url,
        &install.join("testbed/bin/activate"),
    )?;
    let (code, _, stderr) = floe(&[
        "run".as_ref(),
        job.as_os_str(),
        "--out".as_ref(),
        out.as_os_str(),
        "--model-url".as_ref(),
        model.url.as_ref(),
        "--swebench-python".as_ref(),
        install.join("venv/bin/python").as_os_str(),
    ])
    .await?;
    assert_eq!(code, Some(0), "{stderr}");
    let mut seen = BTreeMap::new();
    for entry in std::fs::read_dir(out.join("sessions"))? {
        let path = entry?.path();
        let s: Value = serde_json::from_str(&std::fs::read_to_string(path.join("summary.json"))?)?;
        seen.insert(
            s["task"].as_str().unwrap_or_default().to_string(),
            (s, path),
        );
    }
    for (n, behaviour, reward) in AGENTS {
        let id = format!("acme__calc-{n}");
        let (s, path) = seen
            .get(&id)
            .with_context(|| format!("no session for {id}: {stderr}"))?;
        eprintln!(
            "{behaviour}: reward {} failure {}",
            s["reward"], s["failure"]
        );
        let eval_log =
            std::fs::read_to_string(path.join("state/logs/evaluator.stdout")).unwrap_or_default();
        assert_ne!(s["status"], "infra_error", "{behaviour} went unscored: {s}");
        assert_eq!(
            s["reward"].as_f64(),
            Some(*reward),
            "{behaviour}: {s}\n{eval_log}"
        );
        let harness_log = std::fs::read_to_string(path.join("state/logs/harness.stderr"))
            .with_context(|| format!("{behaviour}: the harness's stderr"))?;
        assert!(
            harness_log.contains("leaks: none"),
            "{behaviour}: {harness_log}"
        );
    }
    // SFT over instances (Polar's offline mode): only resolved sessions are kept, each with
    // swebench's verdict; the summary has the acceptance rate and each instance's resolution.
    let summary: Value = serde_json::from_str(&std::fs::read_to_string(out.join("summary.json"))?)?;
    assert_eq!(summary["dataset"]["accepted"], 1, "{summary}");
    let rate = summary["dataset"]["acceptanceRate"].as_f64();
    assert!(
        rate.is_some_and(|r| (r - 1.0 / AGENTS.len() as f64).abs() < 1e-9),
        "{summary}"
    );
    assert_eq!(
        summary["tasks"]["acme__calc-1"]["passRate"], 1.0,
        "{summary}"
    );
    assert_eq!(
        summary["tasks"]["acme__calc-2"]["passRate"], 0.0,
        "{summary}"
    );
    let dataset = std::fs::read_to_string(out.join("dataset.jsonl"))?;
    let record: Value = serde_json::from_str(dataset.lines().next().context("a record")?)?;
    let evaluation = &record["evaluation"];
    assert_eq!(
        evaluation["detail"]["swebench"]["resolved"], true,
        "{evaluation}"
    );
    assert_eq!(
        evaluation["detail"]["swebench"]["version"], "5.0.2",
        "{evaluation}"
    );
    assert_eq!(record["metadata"]["swebench.repo"], swe::REPO, "{record}");
    Ok(())
}

/// `floe ARGS…` to its end (5 min at most): its exit code, stdout and stderr (to files, so
/// that a long output never blocks it).
async fn floe(args: &[&std::ffi::OsStr]) -> Result<(Option<i32>, String, String)> {
    let logs = tempfile::tempdir()?;
    let (out, err) = (logs.path().join("stdout"), logs.path().join("stderr"));
    let mut child = Command::new(floe_bin()?)
        .args(args)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out)?)
        .stderr(std::fs::File::create(&err)?)
        .spawn()?;
    let status = wait_child(&mut child, Duration::from_secs(300)).await?;
    Ok((
        status.code(),
        std::fs::read_to_string(out)?,
        std::fs::read_to_string(err)?,
    ))
}

#[tokio::test]
async fn floe_tasks_shows_what_an_instance_file_would_run_and_a_bad_instance_stops_a_run(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let activate = Path::new("/opt/env/bin/activate");
    let job = job(dir.path(), "http://127.0.0.1:9", activate)?;
    let file = dir.path().join("instances.jsonl");
    let (code, stdout, stderr) =
        floe(&["tasks".as_ref(), file.as_os_str(), "--swebench".as_ref()]).await?;
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains("acme__calc-1\n  image       floe-test/sweb.eval.acme_1776_calc-1:latest"),
        "{stdout}"
    );
    assert!(stdout.contains("  repository  /testbed at "), "{stdout}");
    assert!(
        stdout.contains("1 FAIL_TO_PASS, 1 PASS_TO_PASS · parse_log_pytest"),
        "{stdout}"
    );
    assert!(
        stdout.contains("  test        python -m pytest --no-header -rA tests/test_calc.py"),
        "{stdout}"
    );
    let n = AGENTS.len();
    assert!(
        stdout.ends_with(&format!(
            "{n} task(s), {n} image(s), 1 SWE-bench repository\n"
        )),
        "{stdout}"
    );
    // Through the job: the local checkout, relative to the job file, made absolute.
    let (code, stdout, stderr) = floe(&["tasks".as_ref(), job.as_os_str()]).await?;
    assert_eq!(code, Some(0), "{stderr}");
    let checkout = dir.path().join("repos").join(swe::REPO);
    assert!(
        stdout.contains(&format!("  repository  {} at ", checkout.display())),
        "{stdout}"
    );
    // What a line becomes: no gold patch anywhere.
    let (_, json_lines, _) = floe(&[
        "tasks".as_ref(),
        file.as_os_str(),
        "--swebench".as_ref(),
        "--json".as_ref(),
    ])
    .await?;
    assert_eq!(json_lines.lines().count(), n);
    assert!(!json_lines.contains(GOLD_PATCH_MARKER), "{json_lines}");
    // A malformed instance: one line naming it, exit 2, before any session.
    let text = std::fs::read_to_string(&file)?;
    let mut lines: Vec<Value> = text
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    lines[2]
        .as_object_mut()
        .context("object")?
        .remove("log_parser");
    let broken: Vec<String> = lines.iter().map(Value::to_string).collect();
    std::fs::write(&file, broken.join("\n") + "\n")?;
    let why = "line 3 (instance acme__calc-3): log_parser is missing or empty";
    let (code, _, stderr) =
        floe(&["tasks".as_ref(), file.as_os_str(), "--swebench".as_ref()]).await?;
    assert_eq!((code, stderr.contains(why)), (Some(2), true), "{stderr}");
    let out = dir.path().join("out");
    let (code, _, stderr) = floe(&[
        "run".as_ref(),
        job.as_os_str(),
        "--out".as_ref(),
        out.as_os_str(),
    ])
    .await?;
    assert_eq!(
        (code, stderr.trim().lines().count()),
        (Some(2), 1),
        "{stderr}"
    );
    assert!(stderr.contains(why), "{stderr}");
    assert!(!out.join("sessions").exists());
    Ok(())
}

/// An instance whose tests cannot run (no pytest), or cannot finish in `evaluatorSeconds`, on
/// its untouched repository is infrastructure, never the policy's 0.
#[tokio::test]
async fn an_instance_whose_tests_cannot_run_is_infrastructure_not_a_zero() -> Result<()> {
    let install = swe::install_dir()?;
    let model = ScriptedUpstream::start(vec![Step::Say("done".into())]).await?;
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR"))?;
    let out = dir.path().join("out");
    // An environment without pytest: no test ever runs, fixed or not.
    let activate = Path::new("/nonexistent/bin/activate");
    let job = job_of(dir.path(), &model.url, activate, &[(1, "fix", 1.0)])?;
    let message = infra_error_of_the_fix(&job, &out, &model.url, &install).await?;
    assert!(
        message.contains("untouched repository") && message.contains("No module named pytest"),
        "{message}"
    );

    // An environment whose tests outlast `evaluatorSeconds` even untouched: infrastructure
    // too, not a 0 for every session (the fix's included).
    let slow = dir.path().join("slow");
    std::fs::create_dir_all(&slow)?;
    let activate = slow.join("activate");
    std::fs::write(&activate, "sleep 30\n")?;
    let job = job_of(&slow, &model.url, &activate, &[(1, "fix", 1.0)])?;
    let mut spec: Value = serde_json::from_str(&std::fs::read_to_string(&job)?)?;
    spec["spec"]["timeouts"]["evaluatorSeconds"] = 3.into();
    std::fs::write(&job, spec.to_string())?;
    let message = infra_error_of_the_fix(&job, &slow.join("out"), &model.url, &install).await?;
    assert!(
        message.contains("untouched repository") && message.contains("TimedOut"),
        "{message}"
    );

    // A test command whose honest output prints a pass after pytest's tally (here an `echo`
    // of the command's own): floe's check voids every log of the instance, the untouched
    // repository's too. Not the fix's silent 0: the check does not fit the instance.
    let odd = dir.path().join("odd");
    std::fs::create_dir_all(&odd)?;
    let job = job_of(
        &odd,
        &model.url,
        &install.join("testbed/bin/activate"),
        &[(1, "fix", 1.0)],
    )?;
    let instances = odd.join("instances.jsonl");
    let text = std::fs::read_to_string(&instances)?;
    let echo = "tests/test_calc.py; echo PASSED tests/test_calc.py::test_sub";
    std::fs::write(
        &instances,
        text.replace("-rA tests/test_calc.py\\n", &format!("-rA {echo}\\n")),
    )?;
    anyhow::ensure!(
        std::fs::read_to_string(&instances)?.contains("; echo PASSED"),
        "the eval script was not changed"
    );
    let message = infra_error_of_the_fix(&job, &odd.join("out"), &model.url, &install).await?;
    assert!(
        message.contains("untouched repository") && message.contains("does not fit"),
        "{message}"
    );
    Ok(())
}

/// `floe run` of `job`, whose one session (the fix of instance 1) must be an infrastructure
/// error: its message.
async fn infra_error_of_the_fix(
    job: &Path,
    out: &Path,
    model_url: &str,
    install: &Path,
) -> Result<String> {
    let (code, _, stderr) = floe(&[
        "run".as_ref(),
        job.as_os_str(),
        "--out".as_ref(),
        out.as_os_str(),
        "--model-url".as_ref(),
        model_url.as_ref(),
        "--swebench-python".as_ref(),
        install.join("venv/bin/python").as_os_str(),
    ])
    .await?;
    let session = out.join("sessions/swe-acme__calc-1-0");
    let eval_log =
        std::fs::read_to_string(session.join("state/logs/evaluator.stdout")).unwrap_or_default();
    assert_eq!(code, Some(1), "{stderr}\n{eval_log}");
    let s: Value = serde_json::from_str(&std::fs::read_to_string(session.join("summary.json"))?)?;
    assert_eq!(s["status"], "infra_error", "{s}");
    Ok(s["error"].as_str().unwrap_or_default().to_string())
}

/// floe's grading bridge on the installed swebench's Python.
fn local_bridge() -> Result<floe_sandbox::swebench_grade::Bridge> {
    let python = swe::install_dir()?.join("venv/bin/python");
    Ok(floe_sandbox::swebench_grade::Bridge::Python(python))
}

/// swebench's maven parser prints a warning on stdout for a line naming a test without its
/// `BUILD` result, as floe feeds it each line alone: the bridge's answer, its stdout, was no
/// JSON, and every gson, druid or javaparser instance unscored.
#[tokio::test]
async fn a_parser_that_prints_leaves_the_bridges_answer_whole() -> Result<()> {
    let bridge = local_bridge()?;
    let grading: floe_crds::rollout_job::SweBenchGrading = serde_json::from_value(json!({
        "instanceId": "google__gson-1", "repo": "google/gson", "version": "2.10",
        "logParser": "parse_log_maven", "failToPass": ["A#x"], "passToPass": [],
        "testPatch": "x", "repositoryDirectory": "/testbed"}))?;
    let log = "+ : '>>>>> Start Test Output'\n+ mvn test -Dtest=A#x\n[INFO] BUILD SUCCESS\n\
               + : '>>>>> End Test Output'\n>>>>> Test Exit Code: 0\n";
    let graded = bridge
        .grade(&grading, "#!/bin/bash\n", log, None, false)
        .await
        .map_err(anyhow::Error::msg)?;
    assert_eq!((graded.read, graded.resolved), (true, true));
    Ok(())
}

/// swebench's maven parser pairs each run (`mvn test -Dtest=X`) with the next `BUILD` line:
/// code under test that prints `BUILD SUCCESS` during its failing test takes maven's own
/// `BUILD FAILURE`'s place (read as resolved by swebench alone). More result lines than runs
/// fail every test the log runs; an honest log of the same tests still resolves.
#[tokio::test]
async fn a_build_result_the_code_under_test_prints_never_resolves() -> Result<()> {
    let bridge = local_bridge()?;
    let grading: floe_crds::rollout_job::SweBenchGrading = serde_json::from_value(json!({
        "instanceId": "google__gson-2", "repo": "google/gson", "version": "2.10",
        "logParser": "parse_log_maven", "failToPass": ["A#x"], "passToPass": ["B#y"],
        "testPatch": "x", "repositoryDirectory": "/testbed"}))?;
    let log = |a: &str| {
        format!(
            "+ : '>>>>> Start Test Output'\n+ mvn test -Dtest=A#x\n{a}\
             + mvn test -Dtest=B#y\n[INFO] BUILD SUCCESS\n\
             + : '>>>>> End Test Output'\n>>>>> Test Exit Code: 0\n"
        )
    };
    let forged = log("BUILD SUCCESS\n[INFO] Tests run: 1, Failures: 1\n[INFO] BUILD FAILURE\n");
    let graded = bridge
        .grade(&grading, "#!/bin/bash\n", &forged, None, false)
        .await
        .map_err(anyhow::Error::msg)?;
    assert_eq!((graded.read, graded.resolved), (true, false), "{graded:?}");
    let honest = log("[INFO] BUILD SUCCESS\n");
    let graded = bridge
        .grade(&grading, "#!/bin/bash\n", &honest, None, false)
        .await
        .map_err(anyhow::Error::msg)?;
    assert_eq!((graded.read, graded.resolved), (true, true), "{graded:?}");
    Ok(())
}

/// Logs the code under test forged, graded through floe's bridge by the real `swebench`: the
/// Django runner says `FAIL`, and the agent's exit hook prints a pass of its own after it, in
/// the two shapes swebench's Django parser reads as the test's last word (`name ... x` then
/// `ok` on a line of its own; a result on its own line that only the summary names as
/// failed). swebench alone reads both as resolved; a test any line reports failing is failed.
#[tokio::test]
async fn results_the_code_under_test_prints_after_a_failure_never_resolve() -> Result<()> {
    let bridge = local_bridge()?;
    let grading: floe_crds::rollout_job::SweBenchGrading = serde_json::from_value(json!({
        "instanceId": "django__django-1", "repo": "django/django", "version": "4.0",
        "logParser": "parse_log_django", "failToPass": ["test_x (m.C)"],
        "passToPass": ["test_y (m.C)"], "testPatch": "x", "repositoryDirectory": "/testbed"}))?;
    let log = |body: &str, code: u8| {
        format!(
            "+ : '>>>>> Start Test Output'\n{body}+ : '>>>>> End Test Output'\n\
             >>>>> Test Exit Code: {code}\n"
        )
    };
    let failed = "\n======\nFAIL: test_x (m.C.test_x)\n------\nRan 2 tests\nFAILED (failures=1)\n";
    for (what, body, code, resolved) in [
        (
            "honest",
            "test_x (m.C) ... ok\ntest_y (m.C) ... ok\nRan 2 tests\nOK\n".to_string(),
            0,
            true,
        ),
        (
            "an ok line after a name",
            format!("test_x (m.C) ... FAIL\ntest_y (m.C) ... ok\n{failed}test_x (m.C) ... x\nok\n"),
            1,
            false,
        ),
        (
            "a result the summary alone names",
            format!(
                "test_x (m.C) ... output\nFAIL\ntest_y (m.C) ... ok\n{failed}test_x (m.C) ... ok\n"
            ),
            1,
            false,
        ),
    ] {
        let graded = bridge
            .grade(&grading, "#!/bin/bash\n", &log(&body, code), None, false)
            .await;
        let graded = graded.map_err(anyhow::Error::msg)?;
        assert_eq!((what, graded.read, graded.resolved), (what, true, resolved));
    }
    // Since Python 3.11 the result lines name a test `test_x (m.C.test_x)`, as newer
    // instances' lists do: the summary's failure must stick under that name too.
    let grading_311: floe_crds::rollout_job::SweBenchGrading = serde_json::from_value(json!({
        "instanceId": "django__django-2", "repo": "django/django", "version": "4.0",
        "logParser": "parse_log_django", "failToPass": ["test_x (m.C.test_x)"],
        "passToPass": ["test_y (m.C.test_y)"], "testPatch": "x",
        "repositoryDirectory": "/testbed"}))?;
    let forged = format!(
        "test_x (m.C.test_x) ... output\nFAIL\ntest_y (m.C.test_y) ... ok\n{failed}\
         test_x (m.C.test_x) ... ok\n"
    );
    let graded = bridge
        .grade(&grading_311, "#!/bin/bash\n", &log(&forged, 1), None, false)
        .await
        .map_err(anyhow::Error::msg)?;
    assert_eq!(
        (graded.read, graded.resolved),
        (true, false),
        "Python 3.11 names"
    );
    // A test with a docstring is listed by its docstring's first line, which unittest's
    // summary gives on the line under the failure: the code under test printing `x`, then
    // `ok`, passed it.
    let docstring: floe_crds::rollout_job::SweBenchGrading = serde_json::from_value(json!({
        "instanceId": "django__django-3", "repo": "django/django", "version": "4.0",
        "logParser": "parse_log_django", "failToPass": ["Docstring."],
        "passToPass": ["test_y (m.C)"], "testPatch": "x", "repositoryDirectory": "/testbed"}))?;
    for (body, code, resolved) in [
        (
            "test_x (m.C)\nDocstring. ... ok\ntest_y (m.C) ... ok\nRan 2 tests\nOK\n",
            0,
            true,
        ),
        (
            "test_x (m.C)\nDocstring. ... x\nok\nFAIL\ntest_y (m.C) ... ok\n======\n\
             FAIL: test_x (m.C)\nDocstring.\n------\nRan 2 tests\nFAILED (failures=1)\n",
            1,
            false,
        ),
    ] {
        let graded = bridge
            .grade(&docstring, "#!/bin/bash\n", &log(body, code), None, false)
            .await
            .map_err(anyhow::Error::msg)?;
        assert_eq!((graded.read, graded.resolved), (true, resolved), "{body}");
    }
    // sympy's runner prints a test's name, then its result: a test printing `ok` was read as
    // passed, its runner's `F` on a line of its own, and its failure header names the path.
    let sympy: floe_crds::rollout_job::SweBenchGrading = serde_json::from_value(json!({
        "instanceId": "sympy__sympy-1", "repo": "sympy/sympy", "version": "1.1",
        "logParser": "parse_log_sympy", "failToPass": ["test_foo"],
        "passToPass": ["test_bar"], "testPatch": "x", "repositoryDirectory": "/testbed"}))?;
    for (body, code, resolved) in [
        ("test_foo ok\ntest_bar ok\n", 0, true),
        (
            "test_foo ok\nF\ntest_bar ok\n___ sympy/core/tests/test_x.py:test_foo ___\n\
             AssertionError\n",
            1,
            false,
        ),
    ] {
        let graded = bridge
            .grade(&sympy, "#!/bin/bash\n", &log(body, code), None, false)
            .await
            .map_err(anyhow::Error::msg)?;
        assert_eq!((graded.read, graded.resolved), (true, resolved), "{body}");
    }
    // What the eval script prints before the tests (`git show`: the base commit's message,
    // indented) is no test's result: a message quoting a failure fails nothing.
    let honest = format!(
        "+ git show\n    FAIL: test_y (m.C)\n{}",
        log(
            "test_x (m.C) ... ok\ntest_y (m.C) ... ok\nRan 2 tests\nOK\n",
            0
        )
    );
    let graded = bridge
        .grade(&grading, "#!/bin/bash\n", &honest, None, false)
        .await
        .map_err(anyhow::Error::msg)?;
    assert_eq!(
        (graded.read, graded.resolved),
        (true, true),
        "a quoted failure"
    );
    Ok(())
}

/// The code under test can tell the runner to expect the failure it causes (`pytest.xfail()`
/// where it fails) or to skip the test (`pytest.skip()`, `raise unittest.SkipTest`):
/// swebench counts an expected failure as a pass, so a `FAIL_TO_PASS` test that "xfails"
/// resolved the instance. Through floe's bridge it fails, and a skipped one does too
/// (swebench's own rule since 5.0). An honest log of the same tests resolves.
#[tokio::test]
async fn a_fail_to_pass_test_the_code_under_test_skips_or_expects_to_fail_never_resolves(
) -> Result<()> {
    let bridge = local_bridge()?;
    let grading: floe_crds::rollout_job::SweBenchGrading = serde_json::from_value(json!({
        "instanceId": "acme__calc-9", "repo": "acme/calc", "version": "1.0",
        "logParser": "parse_log_pytest",
        "failToPass": ["tests/test_calc.py::test_add", "tests/test_calc.py::test_sum[1-2"],
        "passToPass": ["tests/test_calc.py::test_sub"], "testPatch": "x",
        "repositoryDirectory": "/testbed"}))?;
    let log = |add: &str, sum: &str| {
        format!(
            "+ : '>>>>> Start Test Output'\n{add}\n{sum}\nPASSED tests/test_calc.py::test_sub\n\
             + : '>>>>> End Test Output'\n>>>>> Test Exit Code: 0\n"
        )
    };
    let (add, sum) = (
        "PASSED tests/test_calc.py::test_add",
        "PASSED tests/test_calc.py::test_sum[1-2-3]",
    );
    for (what, text, resolved) in [
        ("honest", log(add, sum), true),
        (
            "xfail",
            log("XFAIL tests/test_calc.py::test_add - expected", sum),
            false,
        ),
        (
            "xfail under a truncated id",
            log(add, "XFAIL tests/test_calc.py::test_sum[1-2-3] - expected"),
            false,
        ),
        (
            "skip",
            log("SKIPPED [1] tests/test_calc.py:3: not today", sum),
            false,
        ),
        (
            "xfail, then a pass the code under test printed",
            log(
                "XFAIL tests/test_calc.py::test_add - expected\nPASSED tests/test_calc.py::test_add",
                sum,
            ),
            false,
        ),
    ] {
        let graded = bridge
            .grade(&grading, "#!/bin/bash\n", &text, None, false)
            .await
            .map_err(anyhow::Error::msg)?;
        assert_eq!((what, graded.read, graded.resolved), (what, true, resolved));
    }
    // Django's runner names a skipped test on its line; an `ok` printed for it later was its
    // last word.
    let django: floe_crds::rollout_job::SweBenchGrading = serde_json::from_value(json!({
        "instanceId": "django__django-9", "repo": "django/django", "version": "4.0",
        "logParser": "parse_log_django", "failToPass": ["test_x (m.C)"],
        "passToPass": ["test_y (m.C)"], "testPatch": "x", "repositoryDirectory": "/testbed"}))?;
    let skipped = "+ : '>>>>> Start Test Output'\ntest_x (m.C) ... skipped 'later'\n\
                   test_y (m.C) ... ok\nRan 2 tests\nOK (skipped=1)\ntest_x (m.C) ... ok\n\
                   + : '>>>>> End Test Output'\n>>>>> Test Exit Code: 0\n";
    let graded = bridge
        .grade(&django, "#!/bin/bash\n", skipped, None, false)
        .await
        .map_err(anyhow::Error::msg)?;
    assert_eq!((graded.read, graded.resolved), (true, false), "{graded:?}");
    Ok(())
}

/// pytest's skip summary (`SKIPPED [1] calc.py:6: later`) names no test: code under test that
/// skips the `FAIL_TO_PASS` test it fails and prints `PASSED <it>` (an exit hook, or inside a
/// passing test's captured output) gave that test its only result, a pass, and swebench alone
/// reads it as resolved. pytest's tally counts its own passes: a log reporting more passes
/// than the tally holds believes none of them, and passes with no tally after them are no
/// results. Honest logs resolve: colour codes, pytest 4's `seconds`, the captured output of a
/// pytester run in pytest's own tests (a tally, passes and a `PASSED [100%]` that an
/// instance's list holds), and a script that runs two test commands (two tallies).
#[tokio::test]
async fn passes_pytests_tally_does_not_account_for_never_resolve() -> Result<()> {
    let bridge = local_bridge()?;
    let grading = |p2p: Value| -> Result<floe_crds::rollout_job::SweBenchGrading> {
        Ok(serde_json::from_value(json!({
            "instanceId": "acme__calc-11", "repo": "acme/calc", "version": "1.0",
            "logParser": "parse_log_pytest", "failToPass": ["tests/test_calc.py::test_add"],
            "passToPass": p2p, "testPatch": "x", "repositoryDirectory": "/testbed"}))?)
    };
    let plain = grading(json!(["tests/test_calc.py::test_sub"]))?;
    let script = |commands: &str| {
        format!(
            "#!/bin/bash\nset -uxo pipefail\n: '>>>>> Start Test Output'\n{commands}\
             : '>>>>> End Test Output'\n"
        )
    };
    let one = script("python -m pytest --no-header -rA tests/test_calc.py\n");
    let log = |body: &str| {
        format!(
            "+ : '>>>>> Start Test Output'\n+ python -m pytest --no-header -rA tests\n\
             ============================= test session starts ==============================\n\
             collected 3 items\n\ntests/test_calc.py ..E                        [100%]\n\n\
             {body}+ : '>>>>> End Test Output'\n>>>>> Test Exit Code: 1\n"
        )
    };
    let summary = |add: &str| {
        format!(
            "=========================== short test summary info ============================\n\
             PASSED tests/test_calc.py::test_sub\n{add}\
             PASSED tests/test_calc.py::test_teardown_errs\n\
             ERROR tests/test_calc.py::test_teardown_errs - RuntimeError: teardown\n"
        )
    };
    let passed = summary("PASSED tests/test_calc.py::test_add\n");
    let skipped = summary("SKIPPED [1] calc.py:6: later\n");
    let forged = "PASSED tests/test_calc.py::test_add\n";
    let tally =
        |counts: &str| format!("==================== {counts} in 0.05s ====================\n");
    let captured = |output: &str| {
        format!(
            "==================================== PASSES ====================================\n\
             ___________________________________ test_sub ___________________________________\n\
             ----------------------------- Captured stdout call -----------------------------\n\
             {output}"
        )
    };
    let pytester = "============================= test session starts ==============================\n\
                    collected 1 item\n\ntest_inner.py::test_x \nPASSED [100%]\n\n\
                    =========================== short test summary info ============================\n\
                    PASSED test_inner.py::test_x\n\
                    ============================== 1 passed in 0.01s ===============================\n";
    let honest_tally = tally("3 passed, 1 error");
    let forged_tally = format!("{}{}", tally("2 passed, 1 skipped, 1 error"), forged);
    let with_progress = grading(json!(["tests/test_calc.py::test_sub", "[100%]"]))?;
    let two = script(
        "python -m pytest -rA tests/test_calc.py\npython -m pytest -rA tests/test_more.py\n",
    );
    let cases: Vec<(
        &str,
        &floe_crds::rollout_job::SweBenchGrading,
        &str,
        String,
        bool,
        bool,
    )> = vec![
        (
            "honest",
            &plain,
            &one,
            log(&format!("{passed}{honest_tally}")),
            true,
            true,
        ),
        (
            "skipped, then a pass printed after pytest's tally",
            &plain,
            &one,
            log(&format!("{skipped}{forged_tally}")),
            true,
            false,
        ),
        (
            "skipped, then a pass and a tally of its own",
            &plain,
            &one,
            log(&format!("{skipped}{forged_tally}{honest_tally}")),
            true,
            false,
        ),
        (
            "skipped, with a pass in a passing test's captured output",
            &plain,
            &one,
            log(&format!(
                "{}{skipped}{}",
                captured(forged),
                tally("2 passed, 1 skipped, 1 error")
            )),
            true,
            false,
        ),
        (
            "passes, and no tally after them",
            &plain,
            &one,
            log(&passed),
            false,
            false,
        ),
        (
            "colour",
            &plain,
            &one,
            log(&format!(
                "{passed}\x1b[32m==== \x1b[32m\x1b[1m3 passed\x1b[0m, \x1b[31m1 error\x1b[0m\
                 \x1b[32m in 0.05s\x1b[0m\x1b[32m ====\x1b[0m\n"
            )),
            true,
            true,
        ),
        (
            "pytest 4",
            &plain,
            &one,
            log(&format!(
                "{passed}=== 3 passed, 1 error in 0.05 seconds ===\n"
            )),
            true,
            true,
        ),
        (
            "a pytester run's output",
            &with_progress,
            &one,
            log(&format!("{}{passed}{honest_tally}", captured(pytester))),
            true,
            true,
        ),
        (
            "two test commands",
            &plain,
            &two,
            log(&format!(
                "{passed}{}{}",
                tally("1 passed"),
                tally("3 passed, 1 error")
            )),
            true,
            true,
        ),
    ];
    for (what, grading, script, text, read, resolved) in cases {
        let graded = bridge
            .grade(grading, script, &text, None, false)
            .await
            .map_err(anyhow::Error::msg)?;
        assert_eq!(
            (what, graded.read, graded.resolved),
            (what, read, resolved),
            "{graded:?}\n{text}"
        );
        if what.starts_with("skipped") {
            let hint = graded.doubt.unwrap_or_default();
            assert!(hint.contains("pytest's tally 2"), "{what}: {hint}");
        }
    }
    // From a review: the shapes that slipped past the first version of the check, and the
    // honest log it voided. `(parser, FAIL_TO_PASS, PASS_TO_PASS, summary and after, resolved)`.
    let t = |name: &str| format!("tests/test_calc.py::{name}");
    let header =
        "=========================== short test summary info ============================\n";
    let inner = "============================= test session starts ==============================\n\
                 collecting ... collected 2 items\n\ntest_inner.py::test_1 \n\
                 PASSED                                                                   [ 50%]\n\
                 test_inner.py::test_2 \n\
                 PASSED                                                                   \
                 [100%]------------------------------ live log teardown -----------------\n\n\
                 =========================== 2 passed in 0.02 seconds ===========================\n";
    type Case = (&'static str, Vec<String>, Vec<String>, String, bool);
    let reviewed: Vec<Case> = vec![
        // pytest's own tests: placeholders its lists hold (`[`, a progress mark and rule), and
        // pytester's sessions in the captured output, passes and tallies of their own.
        (
            "parse_log_pytest",
            vec![t("test_add")],
            vec![
                t("test_sub"),
                "[".into(),
                "[100%]------------------------------".into(),
            ],
            format!(
                "{}{header}PASSED {}\nPASSED {}\n{}",
                captured(inner),
                t("test_sub"),
                t("test_add"),
                tally("2 passed")
            ),
            true,
        ),
        // No PASS_TO_PASS: the real summary names an unlisted test; a pass and a tally of its
        // own follow pytest's.
        (
            "parse_log_pytest",
            vec![t("test_add")],
            vec![],
            format!(
                "{header}PASSED {}\nSKIPPED [1] calc.py:6: later\n{}{forged}{}",
                t("test_other"),
                tally("1 passed, 1 skipped"),
                tally("1 passed")
            ),
            false,
        ),
        // The run's only test, skipped: pytest's tally counts the whole run (`collected`).
        (
            "parse_log_pytest",
            vec![t("test_add")],
            vec![],
            format!(
                "collected 1 item\n{header}SKIPPED [1] calc.py:6: later\n{}{forged}{}",
                tally("1 skipped"),
                tally("1 passed")
            ),
            false,
        ),
        // Two ids the parser cuts to one name are two tests.
        (
            "parse_log_pytest",
            vec![t("test_add")],
            vec![t("test_sub"), t("test_b[x")],
            format!(
                "{header}PASSED {}\nPASSED {}\nPASSED {}\nSKIPPED [1] calc.py:6: later\n{}{forged}",
                t("test_sub"),
                t("test_b[x y]"),
                t("test_b[x z]"),
                tally("3 passed, 1 skipped")
            ),
            false,
        ),
        // seaborn's parser reads `id PASSED ` (a trailing space) as swebench feeds it.
        (
            "parse_log_seaborn",
            vec![t("test_add")],
            vec![t("test_sub")],
            format!(
                "{header}PASSED {}\nSKIPPED [1] calc.py:6: later\n{}{} PASSED \n",
                t("test_sub"),
                tally("1 passed, 1 skipped"),
                t("test_add")
            ),
            false,
        ),
        // From a second review. `-v` prints `collecting ... collected`: a test module the
        // code under test skips as it is collected, then passes and a tally of its own.
        (
            "parse_log_pytest_v2",
            vec![t("test_add")],
            vec![t("test_sub")],
            format!(
                "collecting ... collected 0 items / 1 skipped\n\n{}PASSED {}\nPASSED {}\n{}",
                tally("1 skipped"),
                t("test_sub"),
                t("test_add"),
                tally("2 passed")
            ),
            false,
        ),
        // A pytester session that counts more tests than the run (`5 failed, 1 passed` of 3)
        // is not pytest's tally of the run.
        (
            "parse_log_pytest",
            vec![t("test_add")],
            vec![t("test_sub")],
            format!(
                "collected 3 items\n{}{header}PASSED {}\nPASSED {}\nPASSED {}\n{}",
                captured(&inner.replace("2 passed in", "5 failed, 1 passed in")),
                t("test_sub"),
                t("test_add"),
                t("test_other"),
                tally("3 passed")
            ),
            true,
        ),
        // pytest before 6 times its run with `time.time`, which the code under test can
        // replace: a negative duration.
        (
            "parse_log_pytest",
            vec![t("test_add")],
            vec![t("test_sub")],
            format!(
                "{header}PASSED {}\nSKIPPED [1] calc.py:6: later\n\
                 ===== 1 passed, 1 skipped in -1765126530.42 seconds =====\n{forged}{}",
                t("test_sub"),
                tally("2 passed")
            ),
            false,
        ),
    ];
    for (parser, f2p, p2p, body, resolved) in reviewed {
        let grading: floe_crds::rollout_job::SweBenchGrading = serde_json::from_value(json!({
            "instanceId": "acme__calc-11", "repo": "acme/calc", "version": "1.0",
            "logParser": parser, "failToPass": f2p, "passToPass": p2p, "testPatch": "x",
            "repositoryDirectory": "/testbed"}))?;
        let text = format!(
            "+ : '>>>>> Start Test Output'\n+ python -m pytest --no-header -rA tests\n\
             ============================= test session starts ==============================\n\
             {body}+ : '>>>>> End Test Output'\n>>>>> Test Exit Code: 0\n"
        );
        let graded = bridge
            .grade(&grading, &one, &text, None, false)
            .await
            .map_err(anyhow::Error::msg)?;
        assert_eq!(
            (graded.read, graded.resolved),
            (true, resolved),
            "{graded:?}\n{text}"
        );
    }
    Ok(())
}

/// Django's runner writes a test's result after the output the test printed: code under test
/// that prints a newline, skips the test it fails, and at exit prints `test_x (m.C) ... ok`
/// leaves `skipped` on a line naming no test and a pass as the test's only result (swebench
/// alone reads it as resolved, for a `FAIL_TO_PASS` test as for a `PASS_TO_PASS` one).
/// unittest's tally (`Ran 2 tests`, `OK (skipped=1)`) allows one pass: none is believed.
/// Honest logs, a skipped unlisted test's included, resolve.
#[tokio::test]
async fn passes_unittests_tally_does_not_account_for_never_resolve() -> Result<()> {
    let bridge = local_bridge()?;
    let grading: floe_crds::rollout_job::SweBenchGrading = serde_json::from_value(json!({
        "instanceId": "django__django-14", "repo": "django/django", "version": "4.0",
        "logParser": "parse_log_django", "failToPass": ["test_x (m.C)"],
        "passToPass": ["test_y (m.C)"], "testPatch": "x", "repositoryDirectory": "/testbed"}))?;
    let script = "#!/bin/bash\n: '>>>>> Start Test Output'\n./tests/runtests.py --verbosity 2 m\n\
                  : '>>>>> End Test Output'\n";
    let log = |body: &str| {
        format!(
            "+ : '>>>>> Start Test Output'\n+ ./tests/runtests.py --verbosity 2 m\n{body}\
             + : '>>>>> End Test Output'\n>>>>> Test Exit Code: 0\n"
        )
    };
    let rule = "----------------------------------------------------------------------\n";
    let cases = [
        (
            "honest",
            format!(
                "test_x (m.C) ... ok\ntest_y (m.C) ... ok\n{rule}Ran 2 tests in 0.010s\n\nOK\n"
            ),
            true,
        ),
        (
            "honest, an unlisted test skipped",
            format!(
                "test_x (m.C) ... ok\ntest_y (m.C) ... ok\ntest_z (m.C) ... skipped 'no db'\n\
                 {rule}Ran 3 tests in 0.010s\n\nOK (skipped=1)\n"
            ),
            true,
        ),
        (
            "PASS_TO_PASS skipped, its skip on a line of its own, then an ok printed",
            format!(
                "test_x (m.C) ... ok\ntest_y (m.C) ... \nskipped 'later'\n{rule}\
                 Ran 2 tests in 0.010s\n\nOK (skipped=1)\ntest_y (m.C) ... ok\n"
            ),
            false,
        ),
        (
            "FAIL_TO_PASS likewise, and a tally of its own",
            format!(
                "test_x (m.C) ... \nskipped 'later'\ntest_y (m.C) ... ok\n{rule}\
                 Ran 2 tests in 0.010s\n\nOK (skipped=1)\ntest_x (m.C) ... ok\n\
                 Ran 2 tests in 0.010s\n\nOK\n"
            ),
            false,
        ),
    ];
    resolve_as_said(&bridge, &grading, script, log, cases).await
}

/// sympy's runner prints nothing swebench's parser reads for a skipped test (`test_foo s`), so
/// a `test_foo ok` the code under test prints at exit was the `FAIL_TO_PASS` test's only
/// result; its tally (`tests finished: 1 passed, 1 skipped`) counts the runner's passes.
#[tokio::test]
async fn passes_sympys_tally_does_not_account_for_never_resolve() -> Result<()> {
    let bridge = local_bridge()?;
    let grading: floe_crds::rollout_job::SweBenchGrading = serde_json::from_value(json!({
        "instanceId": "sympy__sympy-14", "repo": "sympy/sympy", "version": "1.1",
        "logParser": "parse_log_sympy", "failToPass": ["test_foo"],
        "passToPass": ["test_bar"], "testPatch": "x", "repositoryDirectory": "/testbed"}))?;
    let script = "#!/bin/bash\n: '>>>>> Start Test Output'\n\
                  bin/test -C --verbose sympy/core/tests/test_x.py\n: '>>>>> End Test Output'\n";
    let log = |body: &str| {
        format!(
            "+ : '>>>>> Start Test Output'\n+ bin/test -C --verbose sympy/core/tests/test_x.py\n\
             ============================= test process starts ==============================\n\
             sympy/core/tests/test_x.py[2]\n{body}+ : '>>>>> End Test Output'\n\
             >>>>> Test Exit Code: 0\n"
        )
    };
    let tally = |counts: &str| {
        format!(
            "\n================== tests finished: {counts}, in 0.10 seconds ===================\n"
        )
    };
    let cases = [
        (
            "honest",
            format!("test_foo ok\ntest_bar ok\n{}", tally("2 passed")),
            true,
        ),
        (
            "skipped, then an ok printed",
            format!(
                "test_foo s\ntest_bar ok\n{}test_foo ok\n",
                tally("1 passed, 1 skipped")
            ),
            false,
        ),
    ];
    resolve_as_said(&bridge, &grading, script, log, cases).await
}

/// Each case's log (`log` of its body), graded through floe's bridge: read, and resolved as
/// the case says.
async fn resolve_as_said<const N: usize>(
    bridge: &floe_sandbox::swebench_grade::Bridge,
    grading: &floe_crds::rollout_job::SweBenchGrading,
    script: &str,
    log: impl Fn(&str) -> String,
    cases: [(&str, String, bool); N],
) -> Result<()> {
    for (what, body, resolved) in cases {
        let graded = bridge
            .grade(grading, script, &log(&body), None, false)
            .await
            .map_err(anyhow::Error::msg)?;
        assert_eq!(
            (what, graded.read, graded.resolved),
            (what, true, resolved),
            "{graded:?}"
        );
    }
    Ok(())
}

/// swebench counts a `PASS_TO_PASS` test kept when it is `XFAIL` (as a repository's own
/// xfail-marked tests are) or skipped under a runner that names skips (Django's): code under
/// test that breaks one and tells the runner to expect it (`pytest.xfail()`) or skip it
/// resolved the instance. Given the untouched repository's log, where it passed, it fails;
/// one that is `XFAIL` there too stays kept. Without that log the bridge names the tests
/// that need it, and floe runs it then.
#[tokio::test]
async fn a_pass_to_pass_test_skipped_or_expected_to_fail_fails_where_it_passed_untouched(
) -> Result<()> {
    let bridge = local_bridge()?;
    let grading: floe_crds::rollout_job::SweBenchGrading = serde_json::from_value(json!({
        "instanceId": "acme__calc-12", "repo": "acme/calc", "version": "1.0",
        "logParser": "parse_log_pytest", "failToPass": ["t.py::add"],
        "passToPass": ["t.py::sub", "t.py::known"], "testPatch": "x",
        "repositoryDirectory": "/testbed"}))?;
    let log = |lines: &str| {
        format!(
            "+ : '>>>>> Start Test Output'\n{lines}+ : '>>>>> End Test Output'\n\
             >>>>> Test Exit Code: 0\n"
        )
    };
    let untouched = log("FAILED t.py::add - x\nPASSED t.py::sub\nXFAIL t.py::known - bug\n");
    let broken = log("PASSED t.py::add\nXFAIL t.py::sub - later\nXFAIL t.py::known - bug\n");
    let honest = log("PASSED t.py::add\nPASSED t.py::sub\nXFAIL t.py::known - bug\n");
    let script = "#!/bin/bash\n";
    // swebench's reading of the untouched repository's log, as floe keeps it from its run.
    let read = |grading: floe_crds::rollout_job::SweBenchGrading, log: String| {
        let bridge = bridge.clone();
        async move {
            let graded = bridge
                .grade(&grading, script, &log, None, true)
                .await
                .map_err(anyhow::Error::msg)?;
            graded.statuses.context("no statuses")
        }
    };
    let base = read(grading.clone(), untouched).await?;
    let graded = bridge
        .grade(&grading, script, &broken, None, false)
        .await
        .map_err(anyhow::Error::msg)?;
    assert!(graded.resolved, "swebench's own reading: {graded:?}");
    assert_eq!(graded.pass_to_pass_skipped, ["t.py::known", "t.py::sub"]);
    let graded = bridge
        .grade(&grading, script, &broken, Some(&base), false)
        .await
        .map_err(anyhow::Error::msg)?;
    assert_eq!((graded.read, graded.resolved), (true, false), "{graded:?}");
    assert_eq!(graded.pass_to_pass_regressed, ["t.py::sub"]);
    assert_eq!(graded.pass_to_pass_failing, ["t.py::sub"]);
    let graded = bridge
        .grade(&grading, script, &honest, Some(&base), false)
        .await
        .map_err(anyhow::Error::msg)?;
    assert_eq!((graded.read, graded.resolved), (true, true), "{graded:?}");
    assert!(graded.pass_to_pass_regressed.is_empty(), "{graded:?}");
    // A truncated id in the list (`t.py::test_foo[a`), the real test skipped (pytest names no
    // skipped test) and an `XFAIL` printed for a made-up sibling: by the list's name.
    let truncated: floe_crds::rollout_job::SweBenchGrading = serde_json::from_value(json!({
        "instanceId": "acme__calc-13", "repo": "acme/calc", "version": "1.0",
        "logParser": "parse_log_pytest", "failToPass": ["t.py::add"],
        "passToPass": ["t.py::test_foo[a"], "testPatch": "x",
        "repositoryDirectory": "/testbed"}))?;
    let base = read(
        truncated.clone(),
        log("FAILED t.py::add - x\nPASSED t.py::test_foo[a-b]\n"),
    )
    .await?;
    let sibling = log("PASSED t.py::add\nSKIPPED [1] calc.py:3: x\nXFAIL t.py::test_foo[a!\n");
    let graded = bridge
        .grade(&truncated, script, &sibling, Some(&base), false)
        .await
        .map_err(anyhow::Error::msg)?;
    assert_eq!((graded.read, graded.resolved), (true, false), "{graded:?}");
    // Django names a skipped test: skipped by the code under test where it ran untouched, an
    // `ok` printed for it afterwards (its parser takes the last line) included.
    let django: floe_crds::rollout_job::SweBenchGrading = serde_json::from_value(json!({
        "instanceId": "django__django-12", "repo": "django/django", "version": "4.0",
        "logParser": "parse_log_django", "failToPass": ["test_x (m.C)"],
        "passToPass": ["test_y (m.C)"], "testPatch": "x", "repositoryDirectory": "/testbed"}))?;
    let base = read(
        django.clone(),
        log("test_x (m.C) ... FAIL\ntest_y (m.C) ... ok\n"),
    )
    .await?;
    let skipped = "test_x (m.C) ... ok\ntest_y (m.C) ... skipped 'later'\n";
    let skipped_then_ok = format!("{skipped}test_y (m.C) ... ok\n");
    for (what, text) in [("skipped", skipped), ("then ok", &skipped_then_ok)] {
        for (baseline, resolved) in [(None, true), (Some(&base), false)] {
            let graded = bridge
                .grade(&django, script, &log(text), baseline, false)
                .await
                .map_err(anyhow::Error::msg)?;
            assert_eq!(
                (what, graded.read, graded.resolved),
                (what, true, resolved),
                "{baseline:?}: {graded:?}"
            );
        }
    }
    Ok(())
}
