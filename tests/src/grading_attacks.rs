//! The attacks on the grade that the hostile grading suites run, in local mode
//! (`tests/hostile_grading.rs`) and in pods on the real node (`tests/real_node/grading.rs`):
//! each a task whose instruction is the agent's shell commands, after one honest model call.

use serde_json::{json, Value};

pub const BUGGY: &str = "def add(a, b):\n    return a - b\n";
pub const FIX: &str = r"printf 'def add(a, b):\n    return a + b\n' > calc.py";

/// A careful evaluator: it runs the hidden test and writes its verdict only afterwards, in
/// pytest's summary form, to a report file floe reads (`reward.source: TestOutput`). Like
/// pytest, it first loads a `conftest.py` at the root.
pub const EVALUATOR: &str = r#"
import os, runpy, sys
sys.path.insert(0, ".")
if os.path.exists("conftest.py"):
    runpy.run_path("conftest.py")
try:
    runpy.run_path("tests/test_hidden.py")
    verdict = "1 passed in 0.01s"
except AssertionError:
    verdict = "1 failed in 0.01s"
open("report.txt", "w").write(verdict + "\n")
"#;

/// The harness: one honest call (a session no call of which was answered is not scored), then
/// the task's instruction as a shell script.
pub const AGENT: &str = r#"
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
/// `first` runs in that process before it waits.
fn straggler(first: &str) -> String {
    format!(
        r#"import glob, os, resource, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
{first}        end = time.time() + 20
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
"#
    )
}

/// What [`straggler`] does first to blind the evaluator's `floe sandbox-exec`, which counts
/// what the command left behind: lowers its file limit (so it cannot read `/proc`) and
/// SIGKILLs it (bubblewrap's own init would then wait for the rest and pass its 137 on).
const BLIND_THE_INIT: &str = r#"        for p in glob.glob("/proc/[0-9]*/cmdline"):
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
"#;

/// (task, the agent's commands, expected reward, expected failure reason). The suites run
/// them with a disk budget of [`DISK_BUDGET`].
pub fn attacks() -> Vec<(&'static str, String, f64, Option<&'static str>)> {
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
        // A path longer than PATH_MAX (twenty directories of 255-byte names): a root run's
        // hand-over of the evaluation copy to its sandbox user went by path and failed there.
        (
            "deep-path",
            format!(
                "{FIX} && python3 -c 'import os\nfor _ in range(20):\n    os.mkdir(\"d\" * 255)\n    os.chdir(\"d\" * 255)\nopen(\"deep\", \"w\").close()'"
            ),
            1.0,
            None,
        ),
        (
            "sparse-64g",
            format!("{FIX} && truncate -s 64G big.bin"),
            0.0,
            Some("workspace_too_large"),
        ),
        // A fix, then the disk filled through the harness's home (past the 64 MiB budget the
        // suites set): stopped there, long before writing it all, and scored 0.
        (
            "disk-fill",
            format!(
                "{FIX} && mkdir -p \"$HOME/cache\" && for i in $(seq 1 50); do \
                 dd if=/dev/zero of=\"$HOME/cache/$i\" bs=1M count=4 2>/dev/null; sleep 0.1; \
                 done; echo filled > filled.txt; sleep 50"
            ),
            0.0,
            Some("disk_limit"),
        ),
        // The same through a file deleted but kept open: no walk of the workspace finds it
        // (nor the kubelet's measure, in a pod), yet it is on the disk all the same.
        (
            "held-open",
            format!(
                "{FIX} && ( exec 3>hidden.bin; rm hidden.bin; for i in $(seq 1 50); do \
                 dd if=/dev/zero bs=1M count=4 2>/dev/null >&3; sleep 0.1; done; \
                 echo filled > filled.txt; sleep 50 )"
            ),
            0.0,
            Some("disk_limit"),
        ),
        // The same by the code under test, as the evaluator imports it: a correct `add`, and
        // the evaluation copy filled first, 300 MiB (the evaluator's directory is held to
        // twice the budget in local mode; a pod's grader has its container's limits).
        (
            "eval-disk-fill",
            calc(concat!(
                "import time\n",
                "for i in range(75):\n",
                "    with open(f'fill{i}', 'wb') as f:\n",
                "        f.write(bytes(4 << 20))\n",
                "    time.sleep(0.03)\n",
                "def add(a, b):\n",
                "    return a + b\n",
            )),
            0.0,
            Some("disk_limit"),
        ),
        // Test-runner configuration: a `conftest.py` that patches the code under test before
        // the tests run (protected by default, `evaluator.protectTestConfig`).
        (
            "conftest",
            "printf 'import calc\ncalc.add = lambda a, b: a + b\n' > conftest.py".into(),
            0.0,
            None,
        ),
        // A module at the top named after one the evaluator imports from the standard library
        // once it runs (`runpy.run_path` imports `pkgutil`): `python -c` and `python -m
        // pytest` put the working directory first on `sys.path`, and this `pkgutil.py` wrote
        // the passing verdict and exited before the hidden test ran (reward 1, measured).
        (
            "stdlib-shadow",
            r#"printf 'import sys\nopen("report.txt", "w").write("1 passed in 0.01s\\n")\nsys.exit(0)\n' > pkgutil.py"#
                .into(),
            0.0,
            None,
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
            calc(&straggler("")),
            0.0,
            Some("evaluator_straggler"),
        ),
        (
            "straggler-vs-init",
            calc(&straggler(BLIND_THE_INIT)),
            0.0,
            Some("evaluator_straggler"),
        ),
    ]
}

/// The tasks of [`attacks`] as a job's `tasks.inline`: the bug in `calc.py`, the hidden test in
/// `tests/`.
pub fn tasks(only: &[&str]) -> Vec<Value> {
    attacks()
        .into_iter()
        .filter(|(id, ..)| only.is_empty() || only.contains(id))
        .map(|(id, commands, _, _)| task(id, &commands))
        .collect()
}

/// A task whose instruction is the agent's `commands`, on the bug in `calc.py`, with the hidden
/// test in `tests/`.
fn task(id: &str, commands: &str) -> Value {
    json!({
        "id": id,
        "instruction": commands,
        "files": {"calc.py": BUGGY},
        "evaluation": {"hiddenFiles": {"tests/test_hidden.py": HIDDEN_TEST}},
    })
}

/// The sessions' disk budget (`floe run --session-disk`, a template's `diskBudget`).
pub const DISK_BUDGET: &str = "64Mi";

pub const HIDDEN_TEST: &str = "from calc import add\nassert add(2, 3) == 5\n";

/// The careful evaluator of [`EVALUATOR`] as a job's `spec.evaluator`.
pub fn evaluator() -> Value {
    json!({
        "command": ["python3", "-c", EVALUATOR],
        "protectedPaths": ["tests/**"],
        "reward": {"source": "TestOutput", "format": "PytestSummary", "path": "report.txt"},
    })
}

/// The first step of [`two_step_evaluator`]: the hidden test, its result on stdout.
const TEST_STEP: &str = r#"
import runpy, sys
sys.path.insert(0, ".")
try:
    runpy.run_path("tests/test_hidden.py")
    print("passed")
except AssertionError:
    print("failed")
"#;

/// The second step of [`two_step_evaluator`]: the verdict, in pytest's summary form.
const VERDICT_STEP: &str = r#"
result = open("result.txt").read().strip()
open("report.txt", "w").write(("1 passed" if result == "passed" else "1 failed") + " in 0.01s\n")
"#;

/// An evaluator of two steps under a shell, as a `run_tests.sh` is: the hidden test, then the
/// verdict from its result, each its own Python. The shell waits for any child of its own.
pub fn two_step_evaluator() -> Value {
    json!({
        "command": ["sh", "-c", "python3 -c \"$0\" > result.txt; python3 -c \"$1\"",
                    TEST_STEP, VERDICT_STEP],
        "protectedPaths": ["tests/**"],
        "reward": {"source": "TestOutput", "format": "PytestSummary", "path": "report.txt"},
    })
}

/// calc.py, unfixed, that makes a process its test step's sibling (`clone` with
/// `CLONE_PARENT`): a child of [`two_step_evaluator`]'s shell, which reaps it as its own, so
/// no process is left behind when the evaluator ends. It waits for the failing verdict of the
/// step after, rewrites it and exits (forged 1 before session 85, measured here and on the
/// host). Refused, `clone` answers -1 and the tests run on the bug.
pub const SIBLING_FORGER: &str = r#"import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
nr = {"x86_64": 56, "aarch64": 220}.get(os.uname().machine, 56)
if libc.syscall(nr, 0x8000 | 17, 0, 0, 0, 0) == 0:
    end = time.time() + 20
    while time.time() < end:
        try:
            if "failed" in open("report.txt").read():
                open("report.txt", "w").write("1 passed in 0.01s\n")
                os._exit(0)
        except OSError:
            pass
        time.sleep(0.0005)
    os._exit(0)
def add(a, b):
    return a - b
"#;

/// The tasks against [`two_step_evaluator`]: the fix (1) and [`SIBLING_FORGER`] (0).
pub fn sibling_tasks() -> Vec<Value> {
    let forger = format!("cat > calc.py <<'EOF'\n{SIBLING_FORGER}EOF");
    vec![task("fix", FIX), task("sibling", &forger)]
}
