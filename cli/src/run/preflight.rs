//! Everything that would make every session of a local run fail, checked before the first one
//! starts: the harness and evaluator programs, the model server, the output directory.

use std::path::Path;
use std::time::Duration;

use super::plan::Plan;
use super::sandboxing::{self, Private};
use super::RunError;

pub fn on_path(program: &str) -> bool {
    if program.contains('/') {
        return Path::new(program).is_file();
    }
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|dir| dir.join(program).is_file()))
        .unwrap_or(false)
}

/// A program the sandbox would not find: refused here, not as every session's failure.
fn seen_by_sandbox(
    field: &str,
    program: &str,
    sandboxed: Option<&Private>,
) -> Result<(), RunError> {
    let Some(private) = sandboxed else {
        return Ok(());
    };
    let Some(found) = sandboxing::find_on_path(program) else {
        return Ok(());
    };
    match sandboxing::invisible(&found, private) {
        Some(why) => refuse(format!(
            "{field}: {} is not visible inside the agent's sandbox: {why} (move it, or pass --no-sandbox)",
            found.display()
        )),
        None => Ok(()),
    }
}

fn refuse(message: String) -> Result<(), RunError> {
    Err(RunError::Preflight(message))
}

/// A model server's URL and where it came from (`--model-url`, `spec.sft.upstream.url`).
pub type Located = (String, &'static str);

/// Where the run's model server is (`--model-url`, else the sft job's upstream, with where it
/// came from) and its key, from the environment (the in-process gateway sends it; no
/// sandboxed process sees it).
pub fn model_server_source(
    flag: Option<&String>,
    upstream: Option<&floe_crds::common::UpstreamSpec>,
    trains: bool,
) -> Result<(Option<Located>, Option<String>), RunError> {
    let key = floe_gateway::bearer::env_secret(floe_gateway::bearer::UPSTREAM_KEY_ENV);
    if let (Some(secret), None) = (upstream.and_then(|u| u.api_key_secret.as_ref()), &key) {
        return Err(RunError::Preflight(format!(
            "spec.sft.upstream.apiKeySecret names Secret {:?} (key {:?}), which floe run cannot read: put the key in {}",
            secret.name,
            secret.key,
            floe_gateway::bearer::UPSTREAM_KEY_ENV
        )));
    }
    let url = match (flag, upstream) {
        (Some(url), _) => Some((url.clone(), "--model-url")),
        (None, Some(u)) => Some((u.url.clone(), "spec.sft.upstream.url")),
        (None, None) => None,
    };
    if url.is_none() && !trains {
        return refuse("--collect-only needs --model-url (the policy's vLLM)".into())
            .map(|()| (None, None));
    }
    Ok((url, key))
}

/// SWE-bench instances (`tasks.swebench`): a Python whose `swebench` imports and has each
/// instance's log parser, git, an `--out` the eval scripts can name, and each instance's local
/// checkout, a plain clone (its history, which holds the fix, is hidden from the sandbox).
pub fn swebench(plan: &Plan, python: Option<&Path>, out: &Path) -> Result<(), RunError> {
    let held_out = plan.held_out_spec();
    if plan.job.spec.tasks.swebench.is_none() && held_out.is_none_or(|h| h.tasks.swebench.is_none())
    {
        return Ok(());
    }
    let Some(python) = python else {
        return refuse(
            "SWE-bench instances are graded by the swebench package: give --swebench-python \
             (scripts/swebench/install.sh makes one)"
                .into(),
        );
    };
    // The parsers this swebench has: an instance naming another would fail every session.
    let parsers = std::process::Command::new(python)
        .args([
            "-I",
            "-c",
            "import json; from swebench.harness.log_parsers import PARSER_REGISTRY; \
             print(json.dumps(sorted(PARSER_REGISTRY)))",
        ])
        .output();
    let parsers: Vec<String> = match parsers {
        Ok(out) if out.status.success() => serde_json::from_slice(&out.stdout).unwrap_or_default(),
        Ok(out) => {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let last = stderr.lines().last().unwrap_or_default();
            return refuse(format!(
                "--swebench-python {}: swebench does not import: {last}",
                python.display()
            ));
        }
        Err(e) => return refuse(format!("--swebench-python {}: {e}", python.display())),
    };
    if !on_path("git") {
        return refuse("SWE-bench instances need git (each workspace is a checkout)".into());
    }
    // The eval script names the evaluation copy, under --out, unquoted.
    let out = out.to_string_lossy();
    if !out
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._+-".contains(c))
    {
        return refuse(format!(
            "--out {out}: SWE-bench eval scripts name the evaluation copy under it unquoted; \
             use a path of letters, digits and / . _ + -"
        ));
    }
    for task in plan.tasks.iter().chain(&plan.held_out) {
        let Some(evaluation) = &task.evaluation else {
            continue;
        };
        if let Some(g) = &evaluation.swebench {
            if !parsers.contains(&g.log_parser) {
                return refuse(format!(
                    "instance {}: this swebench has no log parser {:?}",
                    task.id, g.log_parser
                ));
            }
        }
        let Some(repository) = &task.repository else {
            continue;
        };
        let git = Path::new(&repository.path).join(".git");
        if !git.is_dir() {
            return refuse(format!(
                "instance {}: no git checkout at {} (tasks.swebench.localCheckouts){}",
                task.id,
                repository.path,
                if git.exists() {
                    ": its .git is a file (a worktree or submodule), whose repository the \
                     sandbox would not hide; use a plain clone"
                } else {
                    ""
                }
            ));
        }
        if git.join("objects/info/alternates").exists() {
            return refuse(format!(
                "instance {}: {} borrows objects from another repository (alternates), which \
                 the sandbox would not hide; use a plain clone",
                task.id, repository.path
            ));
        }
    }
    Ok(())
}

/// The model server a run samples, as the pre-flight checks it.
pub struct ModelServer<'a> {
    pub url: &'a str,
    /// Where the URL came from, e.g. `--model-url` or `spec.sft.upstream.url`.
    pub source: &'a str,
    pub key: Option<&'a str>,
    /// The model name every call will send, where the run knows it before it starts.
    pub model: Option<&'a str>,
}

pub async fn check(
    plan: &Plan,
    model_server: Option<ModelServer<'_>>,
    out: &Path,
    resume: bool,
    sandboxed: Option<&Private>,
) -> Result<(), RunError> {
    let spec = &plan.job.spec;
    match floe_sandbox::presets::program(&spec.harness) {
        Some(program) if !on_path(program) => {
            return refuse(format!(
                "harness binary `{program}` is not on PATH (install the {:?} harness, e.g. scripts/harnesses/install.sh)",
                spec.harness.preset
            ))
        }
        Some(program) => seen_by_sandbox("spec.harness.command[0]", program, sandboxed)?,
        _ => {}
    }
    if let Some(program) = spec.evaluator.command.first() {
        if !program.contains('/') && !on_path(program) {
            return refuse(format!(
                "spec.evaluator.command[0]: `{program}` is not on PATH"
            ));
        }
        if program.starts_with('/') && !Path::new(program).is_file() {
            return refuse(format!(
                "spec.evaluator.command[0]: {program} does not exist"
            ));
        }
        seen_by_sandbox("spec.evaluator.command[0]", program, sandboxed)?;
    }
    if let Some(private) = sandboxed {
        // A script named by an absolute path (`python3 /tmp/agent.py`) must be visible too.
        let named = [
            ("spec.harness.command", &spec.harness.command),
            ("spec.harness.args", &spec.harness.args),
            ("spec.evaluator.command", &spec.evaluator.command),
        ];
        for (field, words) in named {
            for (i, word) in words.iter().enumerate() {
                let path = Path::new(word);
                if !path.is_absolute() || !path.exists() {
                    continue;
                }
                if let Some(why) = sandboxing::invisible(path, private) {
                    return refuse(format!(
                        "{field}[{i}]: {word} is not visible inside the agent's sandbox: {why} (move it, or pass --no-sandbox)"
                    ));
                }
            }
        }
    }
    if let Some(server) = model_server {
        check_model_server(&server).await?;
    }
    check_out(out, resume)
}

fn check_out(out: &Path, resume: bool) -> Result<(), RunError> {
    let names: Option<Vec<std::ffi::OsString>> = match std::fs::read_dir(out) {
        Ok(d) => Some(d.filter_map(Result::ok).map(|e| e.file_name()).collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return refuse(format!("--out {}: {e}", out.display())),
    };
    // A train run that failed or was stopped while its vLLM and trainer started leaves their
    // directory (its logs) and nothing else: no session ran, there is nothing to resume.
    if names.as_deref() == Some(&["trainer".into()]) {
        if resume {
            return refuse(format!(
                "--resume: --out {} holds only the trainer's directory of a train run that \
                 stopped before its first session: run it again without --resume",
                out.display()
            ));
        }
        // Reused, not removed (it could be someone's own): its logs are appended to, and
        // a trainer stopped before any session trained nothing to resume from.
        eprintln!(
            "floe run: --out {} holds only the trainer's directory of a train run that stopped \
             before its first session: reused",
            out.display()
        );
        return Ok(());
    }
    let entries = names.map(|n| n.len());
    match (entries, resume) {
        (Some(n), false) if n > 0 => refuse(format!(
            "--out {} is not empty (an earlier run?): add --resume to continue it, or use a new directory",
            out.display()
        )),
        (None | Some(0), true) => refuse(format!(
            "--resume: --out {} holds no earlier run to continue",
            out.display()
        )),
        _ => Ok(()),
    }
}

async fn check_model_server(server: &ModelServer<'_>) -> Result<(), RunError> {
    let (model_url, source, key) = (server.url, server.source, server.key);
    let scheme_ok = ["http://", "https://"]
        .iter()
        .any(|s| model_url.to_ascii_lowercase().starts_with(s));
    if !scheme_ok {
        return refuse(format!(
            "{source} {model_url:?} must be an http:// or https:// URL (the model server's base URL, without /v1)"
        ));
    }
    let url = format!("{}/v1/models", model_url.trim_end_matches('/'));
    let mut request = reqwest::Client::new()
        .get(&url)
        .timeout(Duration::from_secs(5));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let answer = match request.send().await {
        Ok(r) if r.status().is_success() => r,
        Ok(r) => {
            let hint = match (r.status().as_u16(), key) {
                (401 | 403, None) => format!(
                    " (a server that wants an API key: put it in {})",
                    floe_gateway::bearer::UPSTREAM_KEY_ENV
                ),
                (401 | 403, Some(_)) => format!(
                    " (it refused the key in {})",
                    floe_gateway::bearer::UPSTREAM_KEY_ENV
                ),
                _ => String::new(),
            };
            return refuse(format!(
                "model server at {model_url} ({source}) answered {} to GET /v1/models{hint}",
                r.status()
            ));
        }
        Err(e) => {
            let cause = floe_gateway::net_error::error_chain(&e);
            return refuse(format!(
                "model server at {model_url} ({source}) is unreachable ({cause}); start one or pass --model-url"
            ));
        }
    };
    let text = answer.text().await.unwrap_or_default();
    let list = serde_json::from_str::<serde_json::Value>(&text).ok();
    let Some(served) = list.as_ref().and_then(|v| v["data"].as_array()) else {
        let start: String = text.chars().take(80).collect();
        return refuse(format!(
            "{url} did not answer an OpenAI model list ({start:?}…): is {model_url} ({source}) an OpenAI-compatible server's base URL, without /v1?"
        ));
    };
    let served: Vec<&str> = served.iter().filter_map(|m| m["id"].as_str()).collect();
    match server.model {
        Some(model) if !served.is_empty() && !served.contains(&model) => refuse(format!(
            "the model server at {model_url} ({source}) does not serve {model:?}; it serves {}: pass --model-name NAME (MODEL_NAME=NAME for the quickstart's script) or set spec.sft.upstream.model",
            served
                .iter()
                .map(|m| format!("{m:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_output_directory_must_match_resume() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let fresh = dir.path().join("new");
        assert!(check_out(&fresh, false).is_ok());
        let err = check_out(&fresh, true).err().map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("holds no earlier run")));
        std::fs::write(dir.path().join("x"), "")?;
        let err = check_out(dir.path(), false).err().map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("--resume")));
        assert!(check_out(dir.path(), true).is_ok());
        // A train run stopped while its vLLM and trainer started: only their directory. Run
        // again, not resumed (nothing ran).
        let started = dir.path().join("started");
        std::fs::create_dir_all(started.join("trainer"))?;
        std::fs::write(started.join("trainer/vllm.log"), "OOM")?;
        assert!(check_out(&started, false).is_ok());
        assert!(started.join("trainer/vllm.log").exists(), "nothing removed");
        let err = check_out(&started, true).err().map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("without --resume")));
        Ok(())
    }

    #[tokio::test]
    async fn a_model_url_must_be_http() {
        let err = check_model_server(&ModelServer {
            url: "127.0.0.1:8000",
            source: "--model-url",
            key: None,
            model: None,
        })
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(
            err.contains("--model-url \"127.0.0.1:8000\" must be an http://"),
            "{err}"
        );
    }
}
