//! SWE-bench instances → floe tasks (`spec.tasks.swebench`). Sans-IO: the operator and
//! `floe run` hand the file's text here, through [`crate::task_file::parse_source`].
//!
//! One instance per line, in the shape the `swebench` package's datasets write (its `TestSpec`
//! needs `instance_id`, `repo`, `version`, `FAIL_TO_PASS`, `PASS_TO_PASS`, `log_parser`,
//! `eval_type` and `eval_script`; the lists may be JSON-encoded strings, as on the Hub). Other
//! columns (`hints_text`, `created_at`, a dataset's own) are read past: datasets differ in them.
//!
//! What reaches whom: the problem statement is the instruction; the eval script (which carries
//! the test patch) is a hidden file, in the evaluation copy only; the test lists and the test
//! patch are in the task's `evaluation`, which the grader holds and the agent never sees; the
//! gold patch (`patch`) is dropped here and reaches no one.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::rollout_job::{SweBenchGrading, SweBenchTasks, Task, TaskEvaluation, TaskRepository};

/// Where the eval script sits in the evaluation copy (hidden: never in the agent's workspace).
pub const EVAL_SCRIPT: &str = ".floe-swebench/eval.sh";

/// Where an instance's repository comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Checkouts {
    /// In a cluster: the image's `repositoryDirectory`.
    Image,
    /// `floe run`: `localCheckouts` (relative to the job file, which the caller resolves).
    Local,
}

/// One line, as read: the fields floe uses, each checked in [`to_task`].
#[derive(Debug, Deserialize)]
struct Instance {
    instance_id: Option<String>,
    repo: Option<String>,
    base_commit: Option<String>,
    problem_statement: Option<String>,
    test_patch: Option<String>,
    #[serde(rename = "FAIL_TO_PASS")]
    fail_to_pass: Option<serde_json::Value>,
    #[serde(rename = "PASS_TO_PASS")]
    pass_to_pass: Option<serde_json::Value>,
    version: Option<serde_json::Value>,
    image: Option<String>,
    eval_script: Option<String>,
    log_parser: Option<String>,
    eval_type: Option<String>,
}

/// Why one instance cannot be a task.
#[derive(Debug, PartialEq)]
pub struct InstanceError {
    /// Its `instance_id`, when it has one.
    pub id: Option<String>,
    pub message: String,
}

/// The task of one instance line.
pub fn to_task(
    value: serde_json::Value,
    settings: &SweBenchTasks,
    checkouts: Checkouts,
) -> Result<Task, InstanceError> {
    let id = value
        .get("instance_id")
        .and_then(|v| v.as_str())
        .map(str::to_string);
    let fail = |message: String| InstanceError {
        id: id.clone(),
        message,
    };
    if !value.is_object() {
        return Err(fail("an instance is a JSON object".into()));
    }
    let line: Instance = serde_json::from_value(value.clone()).map_err(|e| fail(format!("{e}")))?;
    let required = |field: &str, v: Option<String>| {
        v.filter(|s| !s.trim().is_empty())
            .ok_or_else(|| fail(format!("{field} is missing or empty")))
    };
    let instance_id = required("instance_id", line.instance_id)?;
    let repo = required("repo", line.repo)?;
    let base_commit = required("base_commit", line.base_commit)?;
    let problem_statement = required("problem_statement", line.problem_statement)?;
    let test_patch = required("test_patch", line.test_patch)?;
    let no_script = "eval_script is missing or empty: the grader runs the instance's own eval \
                     script, which the swebench package's datasets (version 5 on) carry with \
                     log_parser and eval_type";
    let eval_script = line
        .eval_script
        .filter(|s| !s.trim().is_empty())
        .ok_or_else(|| fail(no_script.into()))?;
    let log_parser = required("log_parser", line.log_parser)?;
    let eval_type = line.eval_type.unwrap_or_else(|| "pass_and_fail".into());
    if !["pass_and_fail", "fail_only"].contains(&eval_type.as_str()) {
        return Err(fail(format!(
            "eval_type {eval_type:?} is neither pass_and_fail nor fail_only"
        )));
    }
    let fail_to_pass = test_list("FAIL_TO_PASS", line.fail_to_pass).map_err(&fail)?;
    if fail_to_pass.is_empty() {
        return Err(fail(
            "FAIL_TO_PASS is empty: nothing would tell a fix from no change".into(),
        ));
    }
    let pass_to_pass = test_list("PASS_TO_PASS", line.pass_to_pass).map_err(&fail)?;
    let version = match line.version {
        None | Some(serde_json::Value::Null) => String::new(),
        Some(serde_json::Value::String(s)) => s,
        // Hub exports sometimes write `"version": 3.0` as a number.
        Some(serde_json::Value::Number(n)) => n.to_string(),
        Some(other) => return Err(fail(format!("version must be a string, got {other}"))),
    };
    let (owner_name, name) = match repo.split_once('/') {
        Some((owner, name)) if !owner.is_empty() && !name.is_empty() && !name.contains('/') => {
            (repo.clone(), name.to_string())
        }
        _ => return Err(fail(format!("repo {repo:?} is not owner/name"))),
    };
    let image = match line.image.filter(|s| !s.trim().is_empty()) {
        Some(image) => image,
        None => settings
            .image
            .replace("{id}", &docker_id(&instance_id))
            .replace("{instance_id}", &instance_id),
    };
    let path = match checkouts {
        Checkouts::Image => settings.repository_directory.clone(),
        Checkouts::Local => settings
            .local_checkouts
            .replace("{repo}", &owner_name)
            .replace("{name}", &name),
    };
    let mut protected_paths = patched_files(&test_patch);
    // The grader checks the repository's own tests out of git: its history is floe's.
    protected_paths.push(".git/**".into());
    Ok(Task {
        id: instance_id.clone(),
        instruction: problem_statement,
        image: Some(image),
        prepare: Vec::new(),
        repository: Some(TaskRepository {
            path,
            commit: base_commit,
        }),
        files: BTreeMap::new(),
        evaluation: Some(TaskEvaluation {
            hidden_files: BTreeMap::from([(EVAL_SCRIPT.to_string(), eval_script)]),
            protected_paths,
            swebench: Some(SweBenchGrading {
                instance_id,
                repo: repo.clone(),
                version: version.clone(),
                log_parser,
                eval_type,
                fail_to_pass,
                pass_to_pass,
                test_patch,
                repository_directory: settings.repository_directory.clone(),
            }),
            ..Default::default()
        }),
        metadata: BTreeMap::from([
            ("swebench.repo".to_string(), repo),
            ("swebench.version".to_string(), version),
        ]),
    })
}

/// The public images' spelling of an instance id: `django__django-11099` →
/// `django_1776_django-11099` (Docker names take no `__`), lower case.
pub fn docker_id(instance_id: &str) -> String {
    instance_id.replace("__", "_1776_").to_lowercase()
}

/// A test list: a JSON array of strings, or that array JSON-encoded in a string (the Hub's).
fn test_list(field: &str, value: Option<serde_json::Value>) -> Result<Vec<String>, String> {
    let value = match value {
        None | Some(serde_json::Value::Null) => return Ok(Vec::new()),
        Some(serde_json::Value::String(s)) => serde_json::from_str(&s)
            .map_err(|e| format!("{field} is a string but not a JSON list: {e}"))?,
        Some(v) => v,
    };
    serde_json::from_value(value).map_err(|_| format!("{field} must be a list of test names"))
}

/// The files a patch touches (`--- a/x` and `+++ b/x` headers), as workspace paths.
pub fn patched_files(patch: &str) -> Vec<String> {
    let mut files: Vec<String> = patch
        .lines()
        .filter_map(|l| {
            l.strip_prefix("--- a/")
                .or_else(|| l.strip_prefix("+++ b/"))
        })
        .map(|p| p.split('\t').next().unwrap_or(p).trim_end().to_string())
        .filter(|p| !p.is_empty())
        .collect();
    files.sort();
    files.dedup();
    files
}

/// The eval script with its repository directory moved to `to` (local mode, where the
/// evaluation copy is not where the image keeps the repository): each `dir` that is a whole
/// path (after a space, a quote, `=`, `:`, `;` or `(`; before a space, `/`, a quote, `;` or
/// `)`) outside here-documents. The test
/// patch, inside a here-document, is left as written.
pub fn relocate(script: &str, dir: &str, to: &str) -> String {
    if dir == to || dir.is_empty() {
        return script.to_string();
    }
    let mut out = String::with_capacity(script.len());
    let mut heredoc_end: Option<String> = None;
    for line in script.split_inclusive('\n') {
        if let Some(end) = &heredoc_end {
            if line.trim_end_matches(['\n', '\r']) == end {
                heredoc_end = None;
            }
            out.push_str(line);
            continue;
        }
        out.push_str(&replace_path(line, dir, to));
        heredoc_end = heredoc_delimiter(line);
    }
    out
}

fn replace_path(line: &str, dir: &str, to: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(at) = rest.find(dir) {
        let after = &rest[at + dir.len()..];
        // What came before, on this line: `/x/testbed` is another path.
        let before = out
            .chars()
            .last()
            .filter(|_| at == 0)
            .or(rest[..at].chars().last());
        let starts = before.is_none_or(|c| c.is_whitespace() || "'\"=;:(".contains(c));
        let ends = after
            .chars()
            .next()
            .is_none_or(|c| c.is_whitespace() || "/'\";:)".contains(c));
        let whole = starts && ends;
        out.push_str(&rest[..at]);
        out.push_str(if whole { to } else { dir });
        rest = after;
    }
    out.push_str(rest);
    out
}

/// The delimiter of a here-document a line opens (`<<'EOF'`, `<<"EOF"`, `<<EOF`, `<<-EOF`).
fn heredoc_delimiter(line: &str) -> Option<String> {
    let (_, after) = line.split_once("<<")?;
    let after = after.trim_start_matches('-').trim_start();
    let word: String = after
        .trim_start_matches(['\'', '"'])
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!word.is_empty()).then_some(word)
}

#[cfg(test)]
mod tests;
