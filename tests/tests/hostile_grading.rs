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
use floe_tests::{floe_bin, wait_child, ScriptedUpstream, Step};
use serde_json::{json, Value};

const BUGGY: &str = "def add(a, b):\n    return a - b\n";
const FIX: &str = r"printf 'def add(a, b):\n    return a + b\n' > calc.py";

/// A careful evaluator: it runs the hidden test and writes its verdict only afterwards, in
/// pytest's summary form, to a report file floe reads (`reward.source: TestOutput`).
const EVALUATOR: &str = r#"
import runpy, sys
sys.path.insert(0, ".")
try:
    runpy.run_path("tests/test_hidden.py")
    verdict = "1 passed in 0.01s"
except AssertionError:
    verdict = "1 failed in 0.01s"
open("report.txt", "w").write(verdict + "\n")
"#;

/// The harness: one honest call (a session no call of which was answered is not scored), then
/// the task's instruction as a shell script.
const AGENT: &str = r#"
import json, os, urllib.request
req = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/chat/completions",
    data=json.dumps({"model": os.environ["FLOE_MODEL"], "messages": [{"role": "user", "content": "hi"}]}).encode(),
    headers={"content-type": "application/json", "authorization": "Bearer " + os.environ["OPENAI_API_KEY"]},
)
urllib.request.urlopen(req, timeout=30).read()
os.execvp("sh", ["sh", "-c", os.environ["FLOE_INSTRUCTION"]])
"#;

/// calc.py, unfixed, that starts a process outside the evaluator's tree (`setsid`, double
/// fork) when the tests import it; the process waits for the failing verdict and rewrites it.
const STRAGGLER: &str = r#"import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        end = time.time() + 20
        while time.time() < end:
            try:
                if "failed" in open("report.txt").read():
                    open("report.txt", "w").write("1 passed in 0.01s\n")
            except OSError:
                pass
            time.sleep(0.001)
    os._exit(0)
def add(a, b):
    return a - b
"#;

/// [`STRAGGLER`] that first tries to blind the evaluator's `floe sandbox-exec`, which counts
/// what the command left behind: lowers its file limit (so it cannot read `/proc`) and
/// SIGKILLs it (bubblewrap's own init would then wait for the rest and pass its 137 on).
const STRAGGLER_VS_INIT: &str = r#"import glob, os, resource, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        for p in glob.glob("/proc/[0-9]*/cmdline"):
            try:
                argv = open(p, "rb").read().split(b"\0")
            except OSError:
                continue
            if len(argv) > 1 and argv[1] == b"sandbox-exec":
                pid = int(p.split("/")[2])
                try:
                    resource.prlimit(pid, resource.RLIMIT_NOFILE, (3, 3))
                except OSError:
                    pass
                try:
                    os.kill(pid, 9)
                except OSError:
                    pass
        end = time.time() + 20
        while time.time() < end:
            try:
                if "failed" in open("report.txt").read():
                    open("report.txt", "w").write("1 passed in 0.01s\n")
            except OSError:
                pass
            time.sleep(0.001)
    os._exit(0)
def add(a, b):
    return a - b
"#;

/// (task, the agent's commands, expected reward, expected failure reason).
fn attacks() -> Vec<(&'static str, String, f64, Option<&'static str>)> {
    let calc = |text: &str| format!("cat > calc.py <<'EOF'\n{text}EOF");
    vec![
        ("fix", FIX.into(), 1.0, None),
        // The hidden test's directory a link to the evaluator's own working directory, a
        // passing `test_hidden.py` where it leads: the runner used to write the hidden test
        // through the link, and the evaluator ran the agent's.
        (
            "link-ancestor",
            "ln -s /proc/self/cwd tests && echo 'print(1)' > test_hidden.py".into(),
            0.0,
            None,
        ),
        // Workspaces floe used to fail to copy (infrastructure, retried, never scored).
        (
            "odd-name",
            format!(r#"{FIX} && touch "$(printf 'caf\351.py')""#),
            1.0,
            None,
        ),
        (
            "mode-000",
            format!("{FIX} && mkdir locked && touch locked/f && chmod 000 locked"),
            1.0,
            None,
        ),
        (
            "sparse-64g",
            format!("{FIX} && truncate -s 64G big.bin"),
            0.0,
            Some("workspace_too_large"),
        ),
        // The code under test ends the evaluator before its verdict, kills it, or hangs it.
        (
            "exit-before-verdict",
            calc("import os\nos._exit(0)\n"),
            0.0,
            Some("no_verdict"),
        ),
        (
            "killed",
            calc("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n"),
            0.0,
            Some("no_verdict"),
        ),
        (
            "hang",
            calc("import time\ntime.sleep(600)\n"),
            0.0,
            Some("evaluator_timeout"),
        ),
        // The report file a link to /dev/zero: read whole, it ran `floe run` out of memory.
        (
            "report-link",
            calc(&format!(
                "import os\nos.symlink('/dev/zero', 'report.txt')\n{BUGGY}"
            )),
            0.0,
            Some("no_verdict"),
        ),
        (
            "straggler",
            calc(STRAGGLER),
            0.0,
            Some("evaluator_straggler"),
        ),
        (
            "straggler-vs-init",
            calc(STRAGGLER_VS_INIT),
            0.0,
            Some("evaluator_straggler"),
        ),
    ]
}

fn job(dir: &Path, model_url: &str) -> Result<std::path::PathBuf> {
    let path = dir.join("job.yaml");
    let tasks: Vec<Value> = attacks()
        .into_iter()
        .map(|(id, commands, _, _)| {
            json!({
                "id": id,
                "instruction": commands,
                "files": {"calc.py": BUGGY},
                "evaluation": {"hiddenFiles": {
                    "tests/test_hidden.py": "from calc import add\nassert add(2, 3) == 5\n",
                }},
            })
        })
        .collect();
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
            "evaluator": {
                "command": ["python3", "-c", EVALUATOR],
                "protectedPaths": ["tests/**"],
                "reward": {"source": "TestOutput", "format": "PytestSummary", "path": "report.txt"},
            },
            "timeouts": {"agentSeconds": 60, "evaluatorSeconds": 5},
            "sft": {"upstream": {"url": model_url}, "output": {"claimName": "unused"}},
            "tasks": {"inline": tasks},
        },
    });
    std::fs::write(&path, serde_json::to_string_pretty(&job)?)?;
    Ok(path)
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
    let model = ScriptedUpstream::start(vec![Step::Say("done".into())]).await?;
    let dir = tempfile::tempdir()?;
    let out = dir.path().join("out");
    let path = job(dir.path(), &model.url)?;
    let mut spec: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    spec["spec"]["tasks"]["inline"] = json!([
        {"id": "hog", "instruction": HOG, "files": {"calc.py": BUGGY},
         "evaluation": {"hiddenFiles": {"tests/test_hidden.py": "from calc import add\nassert add(2, 3) == 5\n"}}},
        {"id": "fix", "instruction": FIX, "files": {"calc.py": BUGGY},
         "evaluation": {"hiddenFiles": {"tests/test_hidden.py": "from calc import add\nassert add(2, 3) == 5\n"}}},
    ]);
    std::fs::write(&path, serde_json::to_string(&spec)?)?;
    let log = dir.path().join("stderr");
    let mut child = Command::new(floe_bin()?)
        .arg("run")
        .arg(&path)
        .arg("--out")
        .arg(&out)
        .args(["--model-url", &model.url])
        .args(["--session-pids", "128", "--session-memory", "256Mi"])
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
    let sandbox = summary["sandbox"].as_str().unwrap_or_default().to_string();
    let session = |task: &str| -> Result<Value> {
        Ok(serde_json::from_str(
            &std::fs::read_to_string(
                out.join("sessions")
                    .join(format!("grading-{task}-0/summary.json")),
            )
            .with_context(|| format!("{task}: {stderr}"))?,
        )?)
    };
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
