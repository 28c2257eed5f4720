//! SWE-bench grading through the `swebench` package (`evaluator.reward.source: SWEBench`).
//!
//! Two calls of a Python that has the package, each a fresh `python -I` (no workspace on its
//! path, no `PYTHON*` variables) running floe's bridge (`swebench_grade.py`) — here, or in a
//! pod's grading sidecar (`floe swebench-bridge`, its own image) reached over loopback HTTP,
//! since an instance's image has no swebench:
//! - before the evaluator: the eval script as swebench's `TestSpec` makes it from the instance
//!   (it adds the line recording the test command's exit status, which its grading reads);
//! - after it, outside the evaluator's sandbox and after everything in it has ended: the log
//!   (the script's stdout and stderr together, captured by floe) graded by swebench's parser and
//!   report. Nothing the code under test leaves behind is read, only what it printed.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use floe_crds::rollout_job::SweBenchGrading;
use serde_json::json;

use crate::reward::SweBenchGraded;

const BRIDGE: &str = include_str!("swebench_grade.py");

/// How long one call may take (the import is about a second; a log of 16 MiB a few more).
const CALL_DEADLINE: Duration = Duration::from_secs(300);

/// The instance as swebench's `make_test_spec` reads it.
fn instance(grading: &SweBenchGrading, eval_script: &str) -> serde_json::Value {
    json!({
        "instance_id": grading.instance_id,
        "image": "",
        "repo": grading.repo,
        "version": grading.version,
        "FAIL_TO_PASS": grading.fail_to_pass,
        "PASS_TO_PASS": grading.pass_to_pass,
        "log_parser": grading.log_parser,
        "eval_type": grading.eval_type,
        "eval_script": eval_script,
    })
}

/// Where the bridge runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Bridge {
    /// This Python (it has swebench).
    Python(PathBuf),
    /// A `floe swebench-bridge` at this URL (a pod's sidecar), which answers only this bearer
    /// token (the pod's control token: the agent shares the pod's loopback, not the token).
    Url { url: String, token: String },
}

impl Bridge {
    /// The eval script swebench runs for this instance.
    pub async fn eval_script(
        &self,
        grading: &SweBenchGrading,
        script: &str,
    ) -> Result<String, String> {
        let answer = self
            .call(json!({"do": "script", "instance": instance(grading, script)}))
            .await?;
        answer["eval_script"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("swebench answered no eval script: {answer}"))
    }

    /// swebench's verdict on `log`.
    pub async fn grade(
        &self,
        grading: &SweBenchGrading,
        script: &str,
        log: &str,
    ) -> Result<SweBenchGraded, String> {
        let answer = self
            .call(json!({"do": "grade", "instance": instance(grading, script), "log": log}))
            .await?;
        SweBenchGraded::from_report(&answer)
    }

    async fn call(&self, request: serde_json::Value) -> Result<serde_json::Value, String> {
        match self {
            Self::Python(python) => call(python, request).await,
            Self::Url { url, token } => {
                let client = reqwest::Client::builder()
                    .no_proxy()
                    .build()
                    .map_err(|e| format!("SWE-bench grading at {url}: {e}"))?;
                let answer: serde_json::Value = client
                    .post(url)
                    .bearer_auth(token)
                    .json(&request)
                    .timeout(CALL_DEADLINE)
                    .send()
                    .await
                    .and_then(|r| r.error_for_status())
                    .map_err(|e| format!("SWE-bench grading at {url}: {e}"))?
                    .json()
                    .await
                    .map_err(|e| format!("SWE-bench grading at {url}: {e}"))?;
                answered(answer)
            }
        }
    }
}

/// The bridge's answer, or the error it answered (`{"error": …}`).
fn answered(answer: serde_json::Value) -> Result<serde_json::Value, String> {
    match answer.get("error").and_then(|e| e.as_str()) {
        Some(error) => Err(error.to_string()),
        None => Ok(answer),
    }
}

/// One call of the bridge with `python` (what `floe swebench-bridge` serves).
pub async fn call(python: &Path, request: serde_json::Value) -> Result<serde_json::Value, String> {
    let mut cmd = tokio::process::Command::new(python);
    cmd.args(["-I", "-c", BRIDGE])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = tokio::time::timeout(
        CALL_DEADLINE,
        crate::process::output_with_input(cmd, request.to_string().into_bytes()),
    )
    .await
    .map_err(|_| format!("SWE-bench grading took over {CALL_DEADLINE:?}"))?
    .map_err(|e| format!("SWE-bench grading: {}: {e}", python.display()))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        let tail: String = stderr
            .chars()
            .rev()
            .take(800)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        return Err(format!("SWE-bench grading failed ({}): {tail}", out.status));
    }
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("SWE-bench grading answered no JSON ({e}): {stderr}"))?;
    answered(answer)
}
