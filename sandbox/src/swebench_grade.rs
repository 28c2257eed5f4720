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

/// How long a pod's runner waits for its grading sidecar: past the sidecar's own deadline, so
/// that a log its parser cannot finish is answered as such (the session's), not taken for a
/// sidecar that does not answer (infrastructure).
const SIDECAR_DEADLINE: Duration = Duration::from_secs(330);

/// A call of the bridge that gave no verdict.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// The bridge could not be asked (no such Python, its sidecar down or answering an HTTP
    /// error): nothing the session did. Graded as infrastructure, never as the session's 0.
    #[error("{0}")]
    Unreachable(String),
    /// The bridge was asked and could not grade (a parser failing or out of time on the log,
    /// swebench refusing the instance): what the log made of it.
    #[error("{0}")]
    Failed(String),
}

impl From<CallError> for String {
    fn from(e: CallError) -> String {
        e.to_string()
    }
}

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

    /// swebench's verdict on `log`; with swebench's reading of the untouched repository's log
    /// (`baseline`, the [`SweBenchGraded::statuses`] of its grading), a `PASS_TO_PASS` test
    /// that passed there and is skipped or expected to fail in `log` fails. `statuses`: keep
    /// swebench's reading of `log` in the answer (for a baseline).
    pub async fn grade(
        &self,
        grading: &SweBenchGrading,
        script: &str,
        log: &str,
        baseline: Option<&serde_json::Value>,
        statuses: bool,
    ) -> Result<SweBenchGraded, CallError> {
        let answer = self
            .call(
                json!({"do": "grade", "instance": instance(grading, script), "log": log,
                         "baseline": baseline, "statuses": statuses}),
            )
            .await?;
        SweBenchGraded::from_report(&answer).map_err(CallError::Failed)
    }

    async fn call(&self, request: serde_json::Value) -> Result<serde_json::Value, CallError> {
        match self {
            Self::Python(python) => call_python(python, request).await,
            Self::Url { url, token } => call_sidecar(url, token, &request).await,
        }
    }
}

/// One call of a pod's grading sidecar. It could not be asked (no connection, or it answered
/// an HTTP error: 503 when its own Python could not run, 401 for a wrong token): the log was
/// never read, infrastructure. A call that fails under way (the connection dropped) is made
/// once more; failing again in any way, the log is its cause: the sidecar is not restarted
/// (the pod's containers run once), so one that died of the log (a parser out of memory
/// takes its whole container) is gone, and a retry of the session is what the agent would
/// buy with such a log. No verdict then: the session's 0.
async fn call_sidecar(
    url: &str,
    token: &str,
    request: &serde_json::Value,
) -> Result<serde_json::Value, CallError> {
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .map_err(|e| CallError::Unreachable(format!("SWE-bench grading at {url}: {e}")))?;
    let send = || async {
        let sent = client
            .post(url)
            .bearer_auth(token)
            .json(request)
            .timeout(SIDECAR_DEADLINE)
            .send()
            .await
            .and_then(|r| r.error_for_status());
        match sent {
            Ok(r) => r.json::<serde_json::Value>().await,
            Err(e) => Err(e),
        }
    };
    let first = match send().await {
        Ok(answer) => return answered(answer),
        Err(e) if e.is_connect() || e.is_status() || e.is_builder() => {
            return Err(CallError::Unreachable(format!(
                "SWE-bench grading at {url}: {e}"
            )))
        }
        Err(e) => e,
    };
    match send().await {
        Ok(answer) => answered(answer),
        Err(e) => Err(CallError::Failed(format!(
            "SWE-bench grading at {url} failed under way ({first}), then: {e}"
        ))),
    }
}

/// The bridge's answer, or the error it answered (`{"error": …}`).
fn answered(answer: serde_json::Value) -> Result<serde_json::Value, CallError> {
    match answer.get("error").and_then(|e| e.as_str()) {
        Some(error) => Err(CallError::Failed(error.to_string())),
        None => Ok(answer),
    }
}

/// One call of the bridge with `python` (what `floe swebench-bridge` serves).
pub async fn call_python(
    python: &Path,
    request: serde_json::Value,
) -> Result<serde_json::Value, CallError> {
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
    .map_err(|_| CallError::Failed(format!("SWE-bench grading took over {CALL_DEADLINE:?}")))?
    .map_err(|e| CallError::Unreachable(format!("SWE-bench grading: {}: {e}", python.display())))?;
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
        return Err(CallError::Failed(format!(
            "SWE-bench grading failed ({}): {tail}",
            out.status
        )));
    }
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| {
        CallError::Failed(format!(
            "SWE-bench grading answered no JSON ({e}): {stderr}"
        ))
    })?;
    answered(answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sidecar that drops a call under way (dying of the log, say), then is gone: no verdict,
    /// never the infrastructure retry an agent could buy with a log that kills it. One that
    /// drops every call: the same after a second try. One that is not there at all is
    /// infrastructure at once.
    #[tokio::test]
    async fn a_sidecar_that_fails_under_way_gives_no_verdict_one_not_there_is_infrastructure() {
        use tokio::io::AsyncReadExt as _;
        let request = json!({"do": "grade"});
        for calls_taken in [1, 2] {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("a port");
            let url = format!("http://{}/", listener.local_addr().expect("its address"));
            let taken = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let count = taken.clone();
            tokio::spawn(async move {
                for _ in 0..calls_taken {
                    let Ok((mut stream, _)) = listener.accept().await else {
                        return;
                    };
                    count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let mut head = [0u8; 256];
                    let _ = stream.read(&mut head).await;
                }
                // Gone: the listener closes with this task.
            });
            match call_sidecar(&url, "t", &request).await {
                Err(CallError::Failed(e)) => assert!(e.contains("under way"), "{e}"),
                other => panic!("{calls_taken}: {other:?}"),
            }
            assert_eq!(taken.load(std::sync::atomic::Ordering::SeqCst), calls_taken);
        }
        let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let gone = format!("http://{}/", closed.local_addr().expect("addr"));
        drop(closed);
        assert!(matches!(
            call_sidecar(&gone, "t", &request).await,
            Err(CallError::Unreachable(_))
        ));
    }
}
