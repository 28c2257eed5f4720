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
const NEW_TESTS: &str =
    "from calc import add, sub\n\n\ndef test_sub():\n    assert sub(5, 3) == 2\n\n\n\
                         # floe-test-patch-marker\ndef test_add():\n    assert add(2, 3) == 5\n";
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
}

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

/// Makes the repository at `checkout` (its `owner/name` directories included by the caller).
pub fn upstream(checkout: &Path) -> Result<Upstream> {
    std::fs::create_dir_all(checkout.join("tests"))?;
    git(checkout, &["init", "-q"])?;
    std::fs::write(checkout.join("calc.py"), BUGGY_CALC)?;
    std::fs::write(checkout.join("tests/test_calc.py"), BASE_TESTS)?;
    git(checkout, &["add", "."])?;
    git(checkout, &["commit", "-qm", "calc"])?;
    let base_commit = git(checkout, &["rev-parse", "HEAD"])?.trim().to_string();
    std::fs::write(checkout.join("calc.py"), GOLD_CALC)?;
    std::fs::write(checkout.join("tests/test_calc.py"), NEW_TESTS)?;
    git(checkout, &["commit", "-qam", "fix add"])?;
    git(checkout, &["tag", "v0.2"])?;
    let gold_patch = git(checkout, &["diff", &base_commit, "HEAD", "--", "calc.py"])?;
    let test_patch = git(checkout, &["diff", &base_commit, "HEAD", "--", "tests"])?;
    Ok(Upstream {
        checkout: checkout.to_path_buf(),
        base_commit,
        gold_patch,
        test_patch,
    })
}

/// The eval script, as swebench writes one for a pytest repository: activate the environment,
/// show the state, reset the test files, apply the test patch, run the tests between the
/// markers, reset again. `activate` is the environment's `activate` script.
pub fn eval_script(up: &Upstream, activate: &Path) -> String {
    let base = &up.base_commit;
    format!(
        "#!/bin/bash\nset -uxo pipefail\nsource {activate}\ncd /testbed\n\
         git config --global --add safe.directory /testbed\ncd /testbed\ngit status\ngit show\n\
         git -c core.fileMode=false diff {base}\ngit checkout {base} tests/test_calc.py\n\
         git apply -v - <<'EOF_114329324912'\n{patch}\nEOF_114329324912\n\
         : '>>>>> Start Test Output'\npython -m pytest --no-header -rA tests/test_calc.py\n\
         : '>>>>> End Test Output'\ngit checkout {base} tests/test_calc.py\n",
        activate = activate.display(),
        patch = up.test_patch.trim_end(),
    )
}

/// One instance line: `problem_statement` is `statement`, the id `acme__calc-<n>`.
pub fn instance(up: &Upstream, n: u32, statement: &str, activate: &Path) -> Value {
    json!({
        "repo": REPO,
        "instance_id": format!("acme__calc-{n}"),
        "base_commit": up.base_commit,
        "patch": up.gold_patch,
        "test_patch": up.test_patch,
        "problem_statement": statement,
        "hints_text": "",
        "created_at": "2026-11-30T00:00:00Z",
        "version": "0.1",
        // As on the Hub: the lists JSON-encoded in strings.
        "FAIL_TO_PASS": serde_json::to_string(&[FAIL_TO_PASS]).unwrap_or_default(),
        "PASS_TO_PASS": serde_json::to_string(&[PASS_TO_PASS]).unwrap_or_default(),
        "environment_setup_commit": up.base_commit,
        "image": format!("floe-test/sweb.eval.acme_1776_calc-{n}:latest"),
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
