//! The hostile-agent suite for grading, local mode: one `floe run` (bubblewrap, as a newcomer
//! runs it) whose tasks each carry one attack on the grade instead of a fix, as shell commands
//! the `custom` harness runs after one honest model call. Every attack must leave an unfixed bug
//! at reward 0 — scored, never "not scored" (infrastructure, retried): an RL run learns every
//! loss it can turn into a retry — and workspaces floe used to choke on must grade like any
//! other (a fixed bug scores 1). The outcome table is `docs/sandbox-contract.md`'s.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};
use floe_tests::grading_attacks::{self, attacks, AGENT, BUGGY, FIX, HIDDEN_TEST};
use floe_tests::{floe_bin, wait_child, ScriptedUpstream, Step};
use serde_json::{json, Value};

fn job(dir: &Path, model_url: &str) -> Result<std::path::PathBuf> {
    let path = dir.join("job.yaml");
    let tasks = grading_attacks::tasks(&[]);
    let job = json!({
        "apiVersion": "floe.dev/v1alpha1",
        "kind": "RolloutJob",
        "metadata": {"name": "grading"},
        "spec": {
            "numSamples": 1,
            "concurrency": 2,
            "backoffLimit": 0,
            "poolRef": {"name": "local"},
            "harness": {"preset": "custom", "model": "policy", "command": ["python3", "-c", AGENT]},
            "evaluator": grading_attacks::evaluator(),
            "timeouts": {"agentSeconds": 60, "evaluatorSeconds": 5},
            "sft": {"upstream": {"url": model_url}, "output": {"claimName": "unused"}},
            "tasks": {"inline": tasks},
        },
    });
    std::fs::write(&path, serde_json::to_string_pretty(&job)?)?;
    Ok(path)
}

/// A finished `floe run` of [`job`] with `tasks` instead of the attack table's, and `flags`.
struct Ran {
    // Before `_dir`: a tmpfs at `out` is unmounted before its directory goes.
    _tmpfs: Option<Tmpfs>,
    _dir: tempfile::TempDir,
    out: std::path::PathBuf,
    summary: Value,
    stderr: String,
}

impl Ran {
    /// A session's trajectory, by its task: where its summary says it went (accepted into
    /// the dataset or rejected).
    fn trajectory(&self, task: &str) -> Result<Value> {
        let s = self.session(task)?;
        let (dir, session) = (
            s["trajectory"].as_str().context("no trajectory dir")?,
            s["session"].as_str().context("no session")?,
        );
        let found = ["accepted", "rejected"]
            .map(|sub| Path::new(dir).join(sub).join(format!("{session}.json")))
            .into_iter()
            .find(|p| p.exists())
            .with_context(|| format!("no trajectory of {session}: {s}"))?;
        Ok(serde_json::from_str(&std::fs::read_to_string(found)?)?)
    }

    /// A session's summary, by its task.
    fn session(&self, task: &str) -> Result<Value> {
        Ok(serde_json::from_str(
            &std::fs::read_to_string(
                self.out
                    .join("sessions")
                    .join(format!("grading-{task}-0/summary.json")),
            )
            .with_context(|| format!("{task}: {}", self.stderr))?,
        )?)
    }
}

/// Run [`job`] with `tasks` and `flags`; it must exit 0.
async fn run_tasks(tasks: Value, flags: &[&str]) -> Result<Ran> {
    run_job(tasks, flags, |_| {}).await
}

/// [`run_tasks`] with the job's spec edited by `edit`.
async fn run_job(tasks: Value, flags: &[&str], edit: impl FnOnce(&mut Value)) -> Result<Ran> {
    run_job_in(tasks, flags, edit, None).await
}

/// A tmpfs mounted for a test (root only), unmounted when dropped.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Result<Self> {
        std::fs::create_dir_all(at)?;
        let done = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "floe-test"])
            .arg(at)
            .status()?;
        anyhow::ensure!(done.success(), "mount -t tmpfs {}: {done}", at.display());
        Ok(Self(at.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// [`run_job`] with `floe run`'s `PATH` led by `path_first`.
async fn run_job_in(
    tasks: Value,
    flags: &[&str],
    edit: impl FnOnce(&mut Value),
    path_first: Option<&Path>,
) -> Result<Ran> {
    run_job_with(tasks, flags, edit, path_first, false).await
}

/// [`run_job_in`], with `--out` on a tmpfs of its own when `tmpfs_out` (root only).
async fn run_job_with(
    tasks: Value,
    flags: &[&str],
    edit: impl FnOnce(&mut Value),
    path_first: Option<&Path>,
    tmpfs_out: bool,
) -> Result<Ran> {
    let model = ScriptedUpstream::start(vec![Step::Say("done".into())]).await?;
    let dir = tempfile::tempdir()?;
    let out = dir.path().join("out");
    let tmpfs = match tmpfs_out {
        true => Some(Tmpfs::mount(&out, "2G")?),
        false => None,
    };
    let path = job(dir.path(), &model.url)?;
    let mut spec: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    spec["spec"]["tasks"]["inline"] = tasks;
    edit(&mut spec["spec"]);
    std::fs::write(&path, serde_json::to_string(&spec)?)?;
    let log = dir.path().join("stderr");
    let mut child = Command::new(floe_bin()?)
        .arg("run")
        .arg(&path)
        .arg("--out")
        .arg(&out)
        .args(["--model-url", &model.url])
        .args(flags)
        .envs(path_first.map(|first| {
            let rest = std::env::var("PATH").unwrap_or_default();
            ("PATH", format!("{}:{rest}", first.display()))
        }))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()?;
    let status = wait_child(&mut child, Duration::from_secs(300)).await?;
    let stderr = std::fs::read_to_string(&log)?;
    assert_eq!(status.code(), Some(0), "{stderr}");
    let summary: Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("summary.json")).with_context(|| stderr.clone())?,
    )?;
    Ok(Ran {
        _tmpfs: tmpfs,
        _dir: dir,
        out,
        summary,
        stderr,
    })
}

#[tokio::test]
async fn no_attack_on_the_grade_forges_a_reward_or_escapes_scoring() -> Result<()> {
    let model = ScriptedUpstream::start(vec![Step::Say("done".into())]).await?;
    let dir = tempfile::tempdir()?;
    let out = dir.path().join("out");
    // The runner once wrote the hidden test through `tests -> /proc/self/cwd` into `floe
    // run`'s own directory: run it from one of its own, and look there afterwards.
    let cwd = dir.path().join("cwd");
    std::fs::create_dir(&cwd)?;
    let job = job(dir.path(), &model.url)?;
    let mut child = Command::new(floe_bin()?)
        .current_dir(&cwd)
        .arg("run")
        .arg(&job)
        .arg("--out")
        .arg(&out)
        .args(["--model-url", &model.url])
        .args(["--session-disk", grading_attacks::DISK_BUDGET])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()?;
    let status = wait_child(&mut child, Duration::from_secs(300)).await?;
    let summary: Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("summary.json")).context("summary.json")?,
    )?;
    let mut seen = BTreeMap::new();
    for entry in std::fs::read_dir(out.join("sessions"))? {
        let s: Value = serde_json::from_str(&std::fs::read_to_string(
            entry?.path().join("summary.json"),
        )?)?;
        seen.insert(s["task"].as_str().unwrap_or_default().to_string(), s);
    }
    eprintln!("\n| attack | reward | failure |\n|---|---|---|");
    for (task, s) in &seen {
        eprintln!("| `{task}` | {} | {} |", s["reward"], s["failure"]);
    }
    for (task, _, reward, failure) in attacks() {
        let s = seen
            .get(task)
            .with_context(|| format!("no session for {task}"))?;
        assert_ne!(s["status"], "infra_error", "{task} went unscored: {s}");
        assert_eq!(s["reward"].as_f64(), Some(reward), "{task}: {s}");
        assert_eq!(s["failure"].as_str(), failure, "{task}: {s}");
    }
    // Stopped at the budget, not at the 60 s timeout, before it wrote all it meant to; the
    // file deleted but held open counted as such. What it wrote is gone at once (the run's
    // disk, which one `fallocate` fills): its workspace emptied, ungraded.
    for filler in ["disk-fill", "held-open"] {
        let s = &seen[filler];
        assert!(s["agentSeconds"].as_f64().is_some_and(|t| t < 30.0), "{s}");
        let ws = out.join(format!("sessions/grading-{filler}-0/workspace"));
        assert!(!ws.join("filled.txt").exists());
        assert!(std::fs::read_dir(&ws)?.next().is_none(), "{filler}: {s}");
        assert_eq!(s["evaluatorSeconds"].as_f64(), Some(0.0), "{filler}: {s}");
    }
    // The evaluator too, by what the code under test wrote in its directory.
    let filled = &seen["eval-disk-fill"];
    assert!(
        filled["evaluatorSeconds"]
            .as_f64()
            .is_some_and(|t| t < 30.0),
        "{filled}"
    );
    let held = &seen["held-open"];
    assert!(
        held["error"]
            .as_str()
            .is_some_and(|e| e.contains("deleted but still open")),
        "{held}"
    );
    assert_eq!(summary["sessions"]["infraError"], 0, "{summary}");
    assert_eq!(
        summary["sessions"]["failures"]["evaluator_timeout"], 1,
        "{summary}"
    );
    assert!(
        std::fs::read_dir(&cwd)?.next().is_none(),
        "floe run wrote into its working directory"
    );
    assert_eq!(status.code(), Some(0), "{summary}");
    Ok(())
}

/// A session that forks without end and fills memory, beside an honest one: the hog is held
/// to its session's limits (`--session-pids`, `--session-memory`), and its sibling's outcome
/// is what it would have been alone.
#[tokio::test]
async fn a_session_that_exhausts_processes_and_memory_cannot_starve_its_sibling() -> Result<()> {
    const HOG: &str = r#"python3 - <<'EOF'
import json, os, subprocess, sys, time
forked, error = 0, None
children = []
for _ in range(400):
    try:
        children.append(subprocess.Popen(["sleep", "30"]))
        forked += 1
    except OSError as e:
        error = str(e)
        break
for c in children:
    c.kill()
    c.wait()
filler = subprocess.run([sys.executable, "-c", "x = bytearray(1 << 30); print(len(x))"])
json.dump({"forked": forked, "error": error, "fill_exit": filler.returncode}, open("hog.json", "w"))
EOF"#;
    let ran = run_tasks(
        json!([
            {"id": "hog", "instruction": HOG, "files": {"calc.py": BUGGY},
             "evaluation": {"hiddenFiles": {"tests/test_hidden.py": HIDDEN_TEST}}},
            {"id": "fix", "instruction": FIX, "files": {"calc.py": BUGGY},
             "evaluation": {"hiddenFiles": {"tests/test_hidden.py": HIDDEN_TEST}}},
        ]),
        &["--session-pids", "128", "--session-memory", "256Mi"],
    )
    .await?;
    let (out, stderr) = (&ran.out, &ran.stderr);
    let sandbox = ran.summary["sandbox"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let session = |task: &str| ran.session(task);
    assert_eq!(
        session("fix")?["reward"],
        1.0,
        "the sibling: {}",
        session("fix")?
    );
    assert_eq!(session("hog")?["reward"], 0.0);
    if !sandbox.contains("processes per session") {
        // A machine that does not let floe make cgroups (not root, none delegated) runs
        // without limits and says so; a root run always can.
        assert!(!nix_is_root(), "a root run without limits: {sandbox}");
        assert!(
            stderr.contains("no per-session resource limits"),
            "{stderr}"
        );
        return Ok(());
    }
    let hog_log =
        std::fs::read_to_string(out.join("sessions/grading-hog-0/state/logs/harness.stderr"))
            .unwrap_or_default();
    let hog: Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("sessions/grading-hog-0/workspace/hog.json"))
            .with_context(|| format!("the hog left no hog.json; its stderr: {hog_log}"))?,
    )?;
    eprintln!("{sandbox}\nhog: {hog}");
    assert!(
        hog["forked"].as_u64().is_some_and(|n| n < 128) && !hog["error"].is_null(),
        "the process limit did not hold: {hog}"
    );
    assert_eq!(
        hog["fill_exit"], -9,
        "the memory fill was not killed: {hog}"
    );
    Ok(())
}

fn nix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
}

/// A session that fills its sandbox's `/tmp`, which is memory: it holds no more than half of
/// `--session-memory`, so the fill meets "no space" before the memory limit, and the session
/// goes on to its fix and scores as it would have. (Filling the disk is an attack of the table:
/// `disk-fill`.)
#[tokio::test]
async fn a_session_that_fills_its_tmp_gets_no_space_not_the_machines_memory() -> Result<()> {
    let filler = format!(
        "dd if=/dev/zero of=/tmp/fill bs=1M count=600 2>/dev/null; \
         du -sm /tmp/fill | cut -f1 > tmp_mib.txt; rm -f /tmp/fill; {FIX}"
    );
    let ran = run_tasks(
        json!([
            {"id": "filler", "instruction": filler, "files": {"calc.py": BUGGY},
             "evaluation": {"hiddenFiles": {"tests/test_hidden.py": HIDDEN_TEST}}},
        ]),
        &["--session-memory", "256Mi"],
    )
    .await?;
    let (out, summary) = (&ran.out, &ran.summary);
    let session = ran.session("filler")?;
    eprintln!("{}\nfiller: {session}", summary["sandbox"]);
    assert_eq!(session["reward"], 1.0, "{session}");
    if summary["sandbox"]
        .as_str()
        .is_some_and(|s| s.starts_with("bubblewrap 0.6") || s.starts_with("bubblewrap 0.5"))
    {
        return Ok(()); // cannot size a tmpfs: /tmp is half the machine's memory
    }
    let tmp_mib: u64 =
        std::fs::read_to_string(out.join("sessions/grading-filler-0/workspace/tmp_mib.txt"))
            .with_context(|| format!("no tmp_mib.txt: {session}"))?
            .trim()
            .parse()?;
    assert!(tmp_mib <= 128, "/tmp held {tmp_mib} MiB");
    Ok(())
}

/// A session whose agent leaves its memory limit's worth of files in a `--out` on tmpfs (as
/// `/tmp` is on Fedora, Arch, Debian 13): they are the session's cgroup's memory, which it
/// cannot reclaim without swap. The evaluator ran in that cgroup and was OOM-killed: here as it
/// ran (`no_verdict`, a correct fix's 0, measured), or before its sandbox started, which is
/// infrastructure (the agent turning its loss into "not scored"). The evaluator now runs in a
/// cgroup of its own, with the same limits, and the session is graded (root only: a tmpfs of
/// its own).
#[tokio::test]
async fn files_the_agent_leaves_in_a_tmpfs_out_never_keep_its_evaluator_from_running() -> Result<()>
{
    if !nix_is_root() {
        eprintln!("not root: no tmpfs of its own");
        return Ok(());
    }
    let task = |id: &str, fill: &str| {
        json!({"id": id, "instruction": format!("{FIX}; {fill}"), "files": {"calc.py": BUGGY},
               "evaluation": {"hiddenFiles": {"tests/test_hidden.py": HIDDEN_TEST}}})
    };
    let ran = run_job_with(
        json!([
            task(
                "fills",
                "dd if=/dev/zero of=fill bs=1M count=250 2>/dev/null; true"
            ),
            task(
                "fills-less",
                "dd if=/dev/zero of=fill bs=1M count=8 2>/dev/null; true"
            ),
        ]),
        &["--session-memory", "256Mi"],
        |_| {},
        None,
        true,
    )
    .await?;
    // `fills` ends killed for its memory (its harness's exit 137, status `agent_failed`); its
    // fix was made first, and is graded: before, the evaluator died in the agent's cgroup
    // (`no_verdict`, reward 0).
    for task in ["fills", "fills-less"] {
        let s = ran.session(task)?;
        assert_eq!(
            (s["reward"].as_f64(), s["passed"].as_bool(), &s["failure"]),
            (Some(1.0), Some(true), &Value::Null),
            "{task}: {s}\n{}",
            ran.stderr
        );
    }
    assert_eq!(ran.summary["sessions"]["infraError"], 0, "{}", ran.summary);
    // And the run said where its output was.
    assert!(ran.stderr.contains("is memory (tmpfs)"), "{}", ran.stderr);
    // And that its 2 GiB could fill before any session reached its 8 GiB disk budget.
    assert!(
        ran.stderr.contains("GiB free, and") && ran.stderr.contains("may each fill --session-disk"),
        "{}",
        ran.stderr
    );
    Ok(())
}

/// An evaluator whose scale goes below 0 (a wrong answer -1): every failure of the policy's
/// scores the job's `failureReward` and no answer scores below it. Were a failure worth more
/// than a wrong answer (the 0 every failure once scored), the run would teach the agent to
/// stall until its time ran out, or to hang the evaluator. Nor does any reward pay more than
/// the scale's `maxReward`.
#[tokio::test]
async fn no_failure_pays_more_than_the_worst_answer() -> Result<()> {
    const SCALE: &str = r#"
import json, os, time
answer = open("answer.txt").read().strip() if os.path.exists("answer.txt") else ""
if answer == "hang":
    time.sleep(100)
reward = {"right": 1.0, "wrong": -1.0, "worst": -3.0, "forged": 1e9}.get(answer, -1.0)
json.dump({"reward": reward}, open("reward.json", "w"))
"#;
    let task = |id: &str, instruction: &str| json!({"id": id, "instruction": instruction});
    let ran = run_job(
        json!([
            task("right", "echo right > answer.txt"),
            task("wrong", "echo wrong > answer.txt"),
            task("worst", "echo worst > answer.txt"),
            // A reward the code under test could write: no more than the scale's top.
            task("forged", "echo forged > answer.txt"),
            // The right answer, then its time runs out: a loss all the same.
            task("stall", "echo right > answer.txt; sleep 60"),
            task("hang", "echo hang > answer.txt"),
        ]),
        &[],
        |spec| {
            spec["evaluator"] = json!({
                "command": ["python3", "-c", SCALE],
                "reward": {"source": "RewardFile", "path": "reward.json",
                           "passThreshold": 0.5, "failureReward": -1.0, "maxReward": 1.0},
            });
            spec["timeouts"] = json!({"agentSeconds": 8, "evaluatorSeconds": 5});
        },
    )
    .await?;
    for (task, reward, status, failure) in [
        ("right", 1.0, "completed", None),
        ("wrong", -1.0, "completed", None),
        ("worst", -1.0, "completed", None),
        ("forged", 1.0, "completed", None),
        ("stall", -1.0, "agent_timeout", None),
        ("hang", -1.0, "completed", Some("evaluator_timeout")),
    ] {
        let s = ran.session(task)?;
        assert_eq!(
            (
                s["reward"].as_f64(),
                s["status"].as_str(),
                s["failure"].as_str()
            ),
            (Some(reward), Some(status), failure),
            "{task}: {s}"
        );
    }
    // Not a pass, though its evaluator passed it (that verdict is kept for the record): a
    // pass rate counted it as one.
    assert_eq!(ran.session("stall")?["passed"], json!(false));
    let stall = ran.trajectory("stall")?;
    assert_eq!(stall["evaluation"]["passed"], json!(true), "{stall}");
    // The evaluator's own -3 is kept beside the reward it was raised from.
    let worst = ran.trajectory("worst")?;
    assert_eq!(
        (
            &worst["reward"],
            &worst["evaluation"]["detail"]["evaluatorReward"]
        ),
        (&json!(-1.0), &json!(-3.0)),
        "{worst}"
    );
    let forged = ran.trajectory("forged")?;
    assert_eq!(
        forged["evaluation"]["detail"]["evaluatorReward"],
        json!(1e9),
        "{forged}"
    );
    let wrong = ran.trajectory("wrong")?;
    assert_eq!(
        wrong["evaluation"]["detail"]["evaluatorReward"],
        Value::Null
    );
    Ok(())
}

/// An evaluator program that the task's own tree holds, found on a `PATH` entry inside the
/// workspace (as `npm test` finds `node_modules/.bin`), through a link (as
/// `node_modules/.bin/jest -> ../jest/bin/jest.js`). Only a program path with a `/` was kept
/// from the agent, as written: the link, where it leads and the `PATH` directory were the
/// agent's, and an evaluator it rewrote (or a `tee` it added where the evaluator looks
/// programs up) wrote the reward it liked; one it removed made the evaluator "not start", an
/// infrastructure failure (retried, never scored). Each change is now discarded: the task's
/// evaluator runs and says 0.5, and nothing is infrastructure.
#[tokio::test]
async fn the_evaluator_program_and_what_it_runs_are_the_tasks_not_the_agents() -> Result<()> {
    const SETUP: &str = r##"
import os
os.makedirs("tool/lib")
os.makedirs("bin")
open("tool/lib/grade.sh", "w").write("#!/bin/sh\necho 0.5 | tee reward.json > /dev/null\n")
os.chmod("tool/lib/grade.sh", 0o755)
os.symlink("../tool/lib/grade.sh", "bin/grade")
"##;
    let task = |id: &str, instruction: &str| {
        json!({"id": id, "instruction": instruction,
               "prepare": [{"name": "tool", "command": ["python3", "-c", SETUP]}],
               "evaluation": {"env": {"PATH": "bin:/usr/local/bin:/usr/bin:/bin"}}})
    };
    const CHEAT: &str = r"printf '#!/bin/sh
echo 1 > reward.json
'";
    // `floe run` checks the program is on its own `PATH` before any session: so it is, in a
    // directory the evaluator's `PATH` does not name.
    let elsewhere = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR"))?;
    let grade = elsewhere.path().join("grade");
    std::fs::write(&grade, "#!/bin/sh\nexit 1\n")?;
    std::fs::set_permissions(&grade, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let ran = run_job_in(
        json!([
            task("kept", "true"),
            task("target-removed", "rm tool/lib/grade.sh"),
            task("target-unexecutable", "chmod -x tool/lib/grade.sh"),
            task("target-rewritten", &format!("{CHEAT} > tool/lib/grade.sh"),),
            task(
                "link-replaced",
                &format!("rm bin/grade && {CHEAT} > bin/grade && chmod +x bin/grade"),
            ),
            task(
                "on-its-path",
                &format!("{CHEAT} > bin/tee && chmod +x bin/tee"),
            ),
        ]),
        &[],
        |spec| {
            spec["evaluator"] = json!({
                "command": ["grade"],
                "reward": {"source": "RewardFile", "path": "reward.json"},
            });
        },
        Some(elsewhere.path()),
    )
    .await?;
    for task in [
        "kept",
        "target-removed",
        "target-unexecutable",
        "target-rewritten",
        "link-replaced",
        "on-its-path",
    ] {
        let s = ran.session(task)?;
        assert_eq!(
            (s["status"].as_str(), s["reward"].as_f64()),
            (Some("completed"), Some(0.5)),
            "{task}: {s}"
        );
    }
    assert_eq!(ran.summary["sessions"]["infraError"], 0, "{}", ran.summary);
    Ok(())
}

/// Code under test that makes a process of its own a child of the evaluator's shell (`clone`
/// with `CLONE_PARENT`), which reaps it unseen: it rewrote the verdict a later step wrote
/// (reward 1 before session 85; `clone` with that flag is refused now).
#[tokio::test]
async fn code_under_test_cannot_slip_a_process_among_the_evaluators_own() -> Result<()> {
    let ran = run_job_in(
        json!(grading_attacks::sibling_tasks()),
        &[],
        |spec| spec["evaluator"] = grading_attacks::two_step_evaluator(),
        None,
    )
    .await?;
    // The plain failure of its tests: the `clone` refused, no process left to find.
    for (task, reward) in [("fix", 1.0), ("sibling", 0.0)] {
        let s = ran.session(task)?;
        assert_eq!(
            (s["status"].as_str(), s["reward"].as_f64(), &s["failure"]),
            (Some("completed"), Some(reward), &Value::Null),
            "{task}: {s}"
        );
    }
    Ok(())
}

/// The script an interpreter runs as the evaluator (`bash tool/lib/grade.sh`, the script in the
/// task's `args`; `sh -c ./grade.sh`) is the evaluator as much as a program run by its path:
/// the agent's rewrite of it is discarded (a read-only review, session 85; reward 1 before).
#[tokio::test]
async fn the_script_an_interpreter_runs_as_the_evaluator_is_the_tasks() -> Result<()> {
    const SETUP: &str = r##"
import os
os.makedirs("tool/lib")
for path in ("tool/lib/grade.sh", "grade.sh"):
    open(path, "w").write("#!/bin/sh\necho 0.5 > reward.json\n")
    os.chmod(path, 0o755)
"##;
    const CHEAT: &str = r"printf '#!/bin/sh
echo 1 > reward.json
'";
    let task = |id: &str, instruction: &str, args: &[&str]| {
        json!({"id": id, "instruction": instruction,
               "prepare": [{"name": "tool", "command": ["python3", "-c", SETUP]}],
               "evaluation": {"args": args}})
    };
    let ran = run_job_in(
        json!([
            task("kept", "true", &["tool/lib/grade.sh"]),
            task(
                "by-path-rewritten",
                &format!("{CHEAT} > tool/lib/grade.sh"),
                &["tool/lib/grade.sh"]
            ),
            task(
                "bare-name-rewritten",
                &format!("{CHEAT} > grade.sh"),
                &["grade.sh"]
            ),
            task(
                "command-string-rewritten",
                &format!("{CHEAT} > grade.sh"),
                &["-c", "./grade.sh"]
            ),
        ]),
        &[],
        |spec| {
            spec["evaluator"] = json!({
                "command": ["sh"],
                "reward": {"source": "RewardFile", "path": "reward.json"},
            });
        },
        None,
    )
    .await?;
    for task in [
        "kept",
        "by-path-rewritten",
        "bare-name-rewritten",
        "command-string-rewritten",
    ] {
        let s = ran.session(task)?;
        assert_eq!(
            (s["status"].as_str(), s["reward"].as_f64()),
            (Some("completed"), Some(0.5)),
            "{task}: {s}"
        );
    }
    Ok(())
}

/// A pytest-like runner for [`skipped_tests_and_a_runner_the_agent_added_never_pass`]: a smoke
/// test that passes and the hidden test, whose `unittest.SkipTest` (raised by the code under
/// test) is a skip, as pytest reports it; its summary in `report.txt`.
const SKIP_AWARE_RUNNER: &str = r#"
import runpy, sys, unittest
sys.path.insert(0, ".")
counts = {"passed": 1, "failed": 0, "skipped": 0}
try:
    runpy.run_path("tests/test_hidden.py")
    counts["passed"] += 1
except unittest.SkipTest:
    counts["skipped"] += 1
except Exception:
    counts["failed"] += 1
summary = ", ".join(f"{n} {k}" for k, n in counts.items() if n)
open("report.txt", "w").write(summary + " in 0.01s\n")
"#;

/// The code under test skipping the test it fails (`raise unittest.SkipTest`, as
/// `pytest.skip()` does) read "1 passed, 1 skipped": every test that ran passed, reward 1.
/// And the evaluator's `PATH` led by `node_modules/.bin`, as `npm test` and `npx` lead theirs
/// whatever the task says: a `python3` the agent put there (or a `node_modules` link to a
/// directory holding one) ran instead of the real one and wrote a pass. A skip is now a
/// failure past the skips the job allows (none here) or the task does (`skip-allowed`'s one,
/// its own `allowedSkips`), and `node_modules` is the task's.
#[tokio::test]
async fn skipped_tests_and_a_runner_the_agent_added_never_pass() -> Result<()> {
    const FAKE: &str = r"printf '#!/bin/sh\necho 2 passed in 0.01s > report.txt\n' > $D/python3 && chmod +x $D/python3";
    let task = |id: &str, instruction: String| {
        json!({"id": id, "instruction": instruction, "files": {"calc.py": BUGGY},
               "evaluation": {"hiddenFiles": {"tests/test_hidden.py": HIDDEN_TEST,
                                              "tests/runner.py": SKIP_AWARE_RUNNER}}})
    };
    // A task whose correct solutions skip one test (a platform's) says so itself: its
    // allowance replaces the job's 0, for it alone.
    let mut skip_allowed = task(
        "skip-allowed",
        r"printf 'import unittest\nraise unittest.SkipTest(0)\n' > calc.py".into(),
    );
    skip_allowed["evaluation"]["allowedSkips"] = json!(1);
    let ran = run_job(
        json!([
            task("fix", FIX.into()),
            task(
                "skip",
                r"printf 'import unittest\nraise unittest.SkipTest(0)\n' > calc.py".into()
            ),
            skip_allowed,
            task(
                "runner-added",
                format!("D=node_modules/.bin && mkdir -p $D && {FAKE}")
            ),
            task(
                "runner-linked",
                format!("D=lib/.bin && mkdir -p $D && {FAKE} && ln -s lib node_modules")
            ),
        ]),
        &[],
        |spec| {
            spec["evaluator"] = json!({
                "command": ["sh", "-c",
                            "PATH=\"$PWD/node_modules/.bin:$PATH\" exec python3 tests/runner.py"],
                "reward": {"source": "TestOutput", "format": "PytestSummary",
                           "path": "report.txt"},
            });
        },
    )
    .await?;
    let mut wrong = Vec::new();
    for (task, reward) in [
        ("fix", 1.0),
        ("skip", 0.0),
        ("skip-allowed", 1.0),
        ("runner-added", 0.0),
        ("runner-linked", 0.0),
    ] {
        let s = ran.session(task)?;
        if (s["status"].as_str(), s["reward"].as_f64()) != (Some("completed"), Some(reward)) {
            wrong.push(format!("{task}: {s}"));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    assert_eq!(ran.summary["sessions"]["infraError"], 0, "{}", ran.summary);
    Ok(())
}
