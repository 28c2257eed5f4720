//! SWE-bench instances made by the tests themselves, in the exact shape of the `swebench`
//! package's datasets (version 5: each line carries its `eval_script`, `log_parser`,
//! `eval_type` and `image`): a small Python repository with a bug at `base_commit`, the fix and
//! its tests committed after it (as in the upstream repository an instance comes from), the
//! gold patch and the test patch taken from that commit, and the eval script written as
//! swebench writes its own.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{ensure, Context, Result};
use serde_json::{json, Value};

pub const REPO: &str = "acme/calc";
pub const BUGGY_CALC: &str =
    "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n";
/// The fix as an agent would write it (the gold patch carries a marker this lacks).
pub const FIXED_CALC: &str =
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n";
const GOLD_CALC: &str =
    "def add(a, b):\n    # floe-gold-patch-marker\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n";
const BASE_TESTS: &str = "from calc import sub\n\n\ndef test_sub():\n    assert sub(5, 3) == 2\n";
/// With an unlisted test whose teardown errs, which `pytest -rA` reports as honest logs do,
/// both `PASSED` and `ERROR`: it must cost no listed test its result, nor the log its reading.
const NEW_TESTS: &str =
    "import pytest\n\nfrom calc import add, sub\n\n\ndef test_sub():\n    assert sub(5, 3) == 2\n\n\n\
                         # floe-test-patch-marker\ndef test_add():\n    assert add(2, 3) == 5\n\n\n\
                         @pytest.fixture\ndef noisy():\n    yield\n    raise RuntimeError('teardown')\n\n\n\
                         def test_teardown_errs(noisy):\n    pass\n";
pub const TEST_PATCH_MARKER: &str = "floe-test-patch-marker";
pub const GOLD_PATCH_MARKER: &str = "floe-gold-patch-marker";
pub const FAIL_TO_PASS: &str = "tests/test_calc.py::test_add";
pub const PASS_TO_PASS: &str = "tests/test_calc.py::test_sub";

/// The upstream repository, checked out at its latest commit (the fix), as a user's clone is.
pub struct Upstream {
    pub checkout: PathBuf,
    pub base_commit: String,
    pub gold_patch: String,
    pub test_patch: String,
    recipe: &'static Recipe,
}

/// What an instance's repository holds: its files at `base_commit`, the fix and the tests
/// committed after it, and the tests that decide it.
pub struct Recipe {
    pub repo: &'static str,
    /// `instance_id` is `<id_prefix>-<n>`; the image `floe-test/sweb.eval.<image_id>-<n>`.
    id_prefix: &'static str,
    image_id: &'static str,
    base: &'static [(&'static str, &'static str)],
    /// Files the gold patch writes (outside the test directory).
    fix: &'static [(&'static str, &'static str)],
    /// Test files as the fix commit leaves them (the test patch).
    tests: &'static [(&'static str, &'static str)],
    pub fail_to_pass: &'static [&'static str],
    pub pass_to_pass: &'static [&'static str],
}

/// `calc.add` subtracts: the fix is one line of code.
pub const CALC: Recipe = Recipe {
    repo: REPO,
    id_prefix: "acme__calc",
    image_id: "acme_1776_calc",
    base: &[
        ("calc.py", BUGGY_CALC),
        ("tests/test_calc.py", BASE_TESTS),
        // The repository's own runner, which an instance's eval script may run by path.
        (
            "runtests.sh",
            "exec python -m pytest --no-header -rA \"$@\"\n",
        ),
    ],
    fix: &[("calc.py", GOLD_CALC)],
    tests: &[("tests/test_calc.py", NEW_TESTS)],
    fail_to_pass: &[FAIL_TO_PASS],
    pass_to_pass: &[PASS_TO_PASS],
};

/// A bug at `base_commit` (`greet` keeps the spaces around a name) whose fix commit also adds
/// a one-line release note, `NOTE.md` (the agent's final answer), and tests of both: the fix's,
/// and the note's length. A model too small to fix code (the CPU ones) still passes some of the
/// note's tests (one per 8 characters up to 320), so under `scoring: Fraction` (the share of
/// `FAIL_TO_PASS` that pass) a group's samples differ and train.
pub const NOTE: Recipe = Recipe {
    repo: "acme/greet",
    id_prefix: "acme__greet",
    image_id: "acme_1776_greet",
    base: &[
        ("greet.py", "def greet(name):\n    return 'hello ' + name\n"),
        ("tests/test_greet.py", GREET_TESTS),
    ],
    fix: &[
        ("greet.py", "def greet(name):\n    return 'hello ' + name.strip()\n"),
        ("NOTE.md", "greet() strips the spaces around a name.\n"),
    ],
    tests: &[
        (
            "tests/test_greet.py",
            concat!(
                "from greet import greet\n\n\ndef test_greet():\n    assert greet('ada') == 'hello ada'\n",
                "\n\ndef test_greet_strips():\n    assert greet(' ada ') == 'hello ada'\n"
            ),
        ),
        (
            "tests/test_note.py",
            "import pathlib\n\nimport pytest\n\n\ndef note():\n    return pathlib.Path('NOTE.md').read_text().strip()\n\n\n\
             def test_note_is_written():\n    assert note()\n\n\n\
             def test_note_is_one_line():\n    assert len(note().splitlines()) == 1\n\n\n\
             @pytest.mark.parametrize('limit', range(8, 321, 8))\n\
             def test_note_is_brief(limit):\n    assert len(note()) <= limit\n",
        ),
    ],
    fail_to_pass: &[
        "tests/test_greet.py::test_greet_strips",
        "tests/test_note.py::test_note_is_written",
        "tests/test_note.py::test_note_is_one_line",
        "tests/test_note.py::test_note_is_brief[8]",
        "tests/test_note.py::test_note_is_brief[16]",
        "tests/test_note.py::test_note_is_brief[24]",
        "tests/test_note.py::test_note_is_brief[32]",
        "tests/test_note.py::test_note_is_brief[40]",
        "tests/test_note.py::test_note_is_brief[48]",
        "tests/test_note.py::test_note_is_brief[56]",
        "tests/test_note.py::test_note_is_brief[64]",
        "tests/test_note.py::test_note_is_brief[72]",
        "tests/test_note.py::test_note_is_brief[80]",
        "tests/test_note.py::test_note_is_brief[88]",
        "tests/test_note.py::test_note_is_brief[96]",
        "tests/test_note.py::test_note_is_brief[104]",
        "tests/test_note.py::test_note_is_brief[112]",
        "tests/test_note.py::test_note_is_brief[120]",
        "tests/test_note.py::test_note_is_brief[128]",
        "tests/test_note.py::test_note_is_brief[136]",
        "tests/test_note.py::test_note_is_brief[144]",
        "tests/test_note.py::test_note_is_brief[152]",
        "tests/test_note.py::test_note_is_brief[160]",
        "tests/test_note.py::test_note_is_brief[168]",
        "tests/test_note.py::test_note_is_brief[176]",
        "tests/test_note.py::test_note_is_brief[184]",
        "tests/test_note.py::test_note_is_brief[192]",
        "tests/test_note.py::test_note_is_brief[200]",
        "tests/test_note.py::test_note_is_brief[208]",
        "tests/test_note.py::test_note_is_brief[216]",
        "tests/test_note.py::test_note_is_brief[224]",
        "tests/test_note.py::test_note_is_brief[232]",
        "tests/test_note.py::test_note_is_brief[240]",
        "tests/test_note.py::test_note_is_brief[248]",
        "tests/test_note.py::test_note_is_brief[256]",
        "tests/test_note.py::test_note_is_brief[264]",
        "tests/test_note.py::test_note_is_brief[272]",
        "tests/test_note.py::test_note_is_brief[280]",
        "tests/test_note.py::test_note_is_brief[288]",
        "tests/test_note.py::test_note_is_brief[296]",
        "tests/test_note.py::test_note_is_brief[304]",
        "tests/test_note.py::test_note_is_brief[312]",
        "tests/test_note.py::test_note_is_brief[320]",
    ],
    pass_to_pass: &["tests/test_greet.py::test_greet"],
};

const GREET_TESTS: &str =
    "from greet import greet\n\n\ndef test_greet():\n    assert greet('ada') == 'hello ada'\n";

fn git(dir: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new("git")
        .args([
            "-c",
            "user.email=dev@acme.test",
            "-c",
            "user.name=dev",
            "-C",
        ])
        .arg(dir)
        .args(args)
        .output()
        .context("git")?;
    ensure!(out.status.success(), "git {args:?}: {out:?}");
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn write_all(dir: &Path, files: &[(&str, &str)]) -> Result<()> {
    for (path, text) in files {
        let path = dir.join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(path, text)?;
    }
    Ok(())
}

/// Makes the calc repository at `checkout` (its `owner/name` directories included by the
/// caller).
pub fn upstream(checkout: &Path) -> Result<Upstream> {
    upstream_of(&CALC, checkout)
}

/// Makes `recipe`'s repository at `checkout`: the base commit, then the fix and its tests in
/// one commit (tagged), as upstream history has them.
pub fn upstream_of(recipe: &'static Recipe, checkout: &Path) -> Result<Upstream> {
    std::fs::create_dir_all(checkout)?;
    git(checkout, &["init", "-q"])?;
    write_all(checkout, recipe.base)?;
    git(checkout, &["add", "."])?;
    git(checkout, &["commit", "-qm", "base"])?;
    let base_commit = git(checkout, &["rev-parse", "HEAD"])?.trim().to_string();
    write_all(checkout, recipe.fix)?;
    write_all(checkout, recipe.tests)?;
    git(checkout, &["add", "."])?;
    git(checkout, &["commit", "-qm", "the fix"])?;
    git(checkout, &["tag", "v0.2"])?;
    let paths = |files: &[(&str, &str)]| -> Vec<String> {
        files.iter().map(|(p, _)| p.to_string()).collect()
    };
    let diff = |files: &[(&str, &str)]| {
        let mut args = vec![
            "diff".to_string(),
            base_commit.clone(),
            "HEAD".into(),
            "--".into(),
        ];
        args.extend(paths(files));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        git(checkout, &args)
    };
    Ok(Upstream {
        checkout: checkout.to_path_buf(),
        gold_patch: diff(recipe.fix)?,
        test_patch: diff(recipe.tests)?,
        base_commit,
        recipe,
    })
}

/// The eval script, as swebench writes one for a pytest repository: activate the environment,
/// show the state, reset the test files, apply the test patch, run the tests between the
/// markers, reset again. `activate` is the environment's `activate` script.
pub fn eval_script(up: &Upstream, activate: &Path) -> String {
    let base = &up.base_commit;
    let mut files: Vec<&str> = up
        .recipe
        .tests
        .iter()
        .chain(
            up.recipe
                .base
                .iter()
                .filter(|(p, _)| p.starts_with("tests/")),
        )
        .map(|(p, _)| *p)
        .collect();
    files.sort_unstable();
    files.dedup();
    let files = files.join(" ");
    format!(
        "#!/bin/bash\nset -uxo pipefail\nsource {activate}\ncd /testbed\n\
         git config --global --add safe.directory /testbed\ncd /testbed\ngit status\ngit show\n\
         git -c core.fileMode=false diff {base}\ngit checkout {base} {files}\n\
         git apply -v - <<'EOF_114329324912'\n{patch}\nEOF_114329324912\n\
         : '>>>>> Start Test Output'\npython -m pytest --no-header -rA {files}\n\
         : '>>>>> End Test Output'\ngit checkout {base} {files}\n",
        activate = activate.display(),
        patch = up.test_patch.trim_end(),
    )
}

/// One instance line: `problem_statement` is `statement`, the id `<prefix>-<n>`.
pub fn instance(up: &Upstream, n: u32, statement: &str, activate: &Path) -> Value {
    let r = up.recipe;
    json!({
        "repo": r.repo,
        "instance_id": format!("{}-{n}", r.id_prefix),
        "base_commit": up.base_commit,
        "patch": up.gold_patch,
        "test_patch": up.test_patch,
        "problem_statement": statement,
        "hints_text": "",
        "created_at": "2026-11-30T00:00:00Z",
        "version": "0.1",
        // As on the Hub: the lists JSON-encoded in strings.
        "FAIL_TO_PASS": serde_json::to_string(r.fail_to_pass).unwrap_or_default(),
        "PASS_TO_PASS": serde_json::to_string(r.pass_to_pass).unwrap_or_default(),
        "environment_setup_commit": up.base_commit,
        "image": format!("floe-test/sweb.eval.{}-{n}:latest", r.image_id),
        "eval_script": eval_script(up, activate),
        "log_parser": "parse_log_pytest",
        "eval_type": "pass_and_fail",
    })
}

/// `scripts/swebench/install.sh`'s directory: `$FLOE_SWEBENCH_DIR`, else the script's answer.
pub fn install_dir() -> Result<PathBuf> {
    if let Ok(dir) = std::env::var("FLOE_SWEBENCH_DIR") {
        return Ok(dir.into());
    }
    let out = Command::new(crate::workspace_root().join("scripts/swebench/install.sh")).output()?;
    ensure!(
        out.status.success(),
        "installing swebench: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).trim().into())
}
