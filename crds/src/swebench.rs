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
    hints_text: Option<String>,
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
    /// SWE-bench Multimodal's files beside the patches, by patch: the test patch's are binary
    /// baselines its tests compare against, which swebench's harness downloads and stages.
    image_assets: Option<serde_json::Value>,
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
    let assets = match line.image_assets {
        Some(serde_json::Value::String(text)) if !text.trim().is_empty() => {
            serde_json::from_str(&text)
                .map_err(|e| fail(format!("image_assets is not JSON: {e}")))?
        }
        Some(serde_json::Value::String(_)) | None => serde_json::Value::Null,
        Some(other) => other,
    };
    // The gold patch's and the test patch's files (binary baselines, images a fix adds),
    // which swebench downloads and stages when it grades; the problem statement's are only
    // pictures of the issue.
    let staged: usize = ["patch", "test_patch"]
        .iter()
        .filter_map(|k| assets[k].as_array().map(Vec::len))
        .sum();
    if staged > 0 {
        return Err(fail(format!(
            "image_assets names {staged} file(s) of the patches, which swebench downloads \
             when it grades: floe fetches nothing at run time, and without them every session \
             would fail its tests; put them in the instance's image"
        )));
    }
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
    let mut protected_paths: Vec<String> = patched_files(&test_patch)
        .iter()
        .map(|p| glob_literal(p))
        .collect();
    // The grader checks the repository's own tests out of git: its history is floe's.
    protected_paths.push(".git/**".into());
    let instruction = fill(
        &settings.instruction,
        &[
            ("problem_statement", &problem_statement),
            ("repo", &repo),
            ("instance_id", &instance_id),
            ("hints_text", line.hints_text.as_deref().unwrap_or_default()),
        ],
    )
    .map_err(fail)?;
    Ok(Task {
        id: instance_id.clone(),
        instruction,
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

/// `template` with each `{name}` of `values` replaced, in one pass (a statement that itself
/// holds `{repo}` stays as written). `Err` for a template without `{problem_statement}`: every
/// session of every instance would get the same prompt.
fn fill(template: &str, values: &[(&str, &str)]) -> Result<String, String> {
    if !template.contains("{problem_statement}") {
        return Err(
            "tasks.swebench.instruction has no {problem_statement}: every instance would \
                    get the same instruction"
                .into(),
        );
    }
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open..];
        match values.iter().find(|(name, _)| {
            after[1..].starts_with(name) && after[1 + name.len()..].starts_with('}')
        }) {
            Some((name, value)) => {
                out.push_str(value);
                rest = &after[name.len() + 2..];
            }
            None => {
                out.push('{');
                rest = &after[1..];
            }
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// The lines of an eval script between swebench's test-output markers: its test command.
pub fn test_commands(script: &str) -> Vec<&str> {
    script
        .lines()
        .skip_while(|l| !l.contains(">>>>> Start Test Output"))
        .skip(1)
        .take_while(|l| !l.contains(">>>>> End Test Output"))
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect()
}

/// The repository's own files the test command runs as its program, as workspace paths:
/// `./tests/runtests.py …`, `bin/test …`, `python tests/runtests.py …`, `/testbed/x.py …` (past
/// leading `VAR=value` assignments); none for a program from the environment (`pytest`,
/// `tox`, `python -m pytest`).
pub fn runner_scripts<'a>(script: &'a str, repository: &str) -> Vec<String> {
    // A bare name is a program from `PATH` (`pytest`), but a script an interpreter is given.
    let in_repo = |word: &str, bare: bool| -> Option<String> {
        let relative = match word.strip_prefix(repository.trim_end_matches('/')) {
            Some(rest) => rest.strip_prefix('/')?,
            None if word.starts_with('/') => return None,
            None => word.strip_prefix("./").unwrap_or(word),
        };
        (bare || relative.contains('/') || word.starts_with("./")).then(|| relative.to_string())
    };
    test_commands(script)
        .iter()
        .filter_map(|line| {
            let mut words = line.split_whitespace().skip_while(|w| {
                w.split_once('=')
                    .is_some_and(|(name, _)| !name.is_empty() && !name.contains('/'))
            });
            let mut program = words.next()?;
            // A wrapper that runs what follows it (`timeout 1800 ./x`, `env X=1 ./x`).
            while matches!(program, "timeout" | "env" | "nice" | "exec") {
                program = words.find(|w| !w.contains('=') && w.parse::<f64>().is_err())?;
            }
            let name = program.rsplit('/').next()?;
            let interpreter = name.starts_with("python")
                || matches!(name, "sh" | "bash" | "node" | "perl" | "ruby");
            let unquoted = |w: &'a str| w.trim_matches(|c| c == '"' || c == '\'');
            if !interpreter {
                return in_repo(unquoted(program), false);
            }
            // An interpreter runs the script it is given, past its own flags (`-W ignore`);
            // `-m` and `-c` run no file.
            while let Some(word) = words.next() {
                match word {
                    "-m" | "-c" | "-e" => return None,
                    "-W" | "-X" => {
                        words.next();
                    }
                    flag if flag.starts_with('-') => {}
                    script => return in_repo(unquoted(script), true),
                }
            }
            None
        })
        .collect()
}

/// The files a patch touches, as workspace paths: both sides of each `diff --git` header, of
/// `---`/`+++` lines and of renames and copies, git's quoted form (`"b/t\303\251st.py"`)
/// included — a new empty file or a pure rename has no `---`/`+++` line.
pub fn patched_files(patch: &str) -> Vec<String> {
    let mut files = Vec::new();
    for line in patch.lines() {
        if let Some(rest) = line.strip_prefix("diff --git ") {
            files.extend(git_header_paths(rest));
            continue;
        }
        let named = [
            ("--- ", "a/"),
            ("+++ ", "b/"),
            ("rename from ", ""),
            ("rename to ", ""),
            ("copy from ", ""),
            ("copy to ", ""),
        ];
        for (prefix, side) in named {
            if let Some(rest) = line.strip_prefix(prefix) {
                let rest = rest.split('\t').next().unwrap_or(rest).trim_end();
                let path = if rest.starts_with('"') {
                    unquote(rest).map(|(p, _)| p)
                } else {
                    Some(rest.to_string())
                };
                if let Some(p) = path.and_then(|p| p.strip_prefix(side).map(str::to_string)) {
                    files.push(p);
                }
            }
        }
    }
    files.retain(|p| !p.is_empty() && p != "/dev/null" && p != "dev/null");
    files.sort();
    files.dedup();
    files
}

/// `a/X b/Y` (or git's quoted forms) of a `diff --git` header.
fn git_header_paths(rest: &str) -> Vec<String> {
    let mut out = Vec::new();
    if rest.starts_with('"') {
        if let Some((a, after)) = unquote(rest) {
            out.push(a);
            let after = after.trim_start();
            let b = if after.starts_with('"') {
                unquote(after).map(|(b, _)| b)
            } else {
                Some(after.to_string())
            };
            out.extend(b);
        }
    } else if let Some((a, b)) = rest.split_once(" b/") {
        out.push(a.to_string());
        out.push(format!("b/{b}"));
    }
    out.into_iter()
        .filter_map(|p| {
            p.strip_prefix("a/")
                .or_else(|| p.strip_prefix("b/"))
                .map(str::to_string)
        })
        .collect()
}

/// A C-quoted string at the start of `s` (git's form for unusual names): the text and what
/// follows it.
fn unquote(s: &str) -> Option<(String, &str)> {
    let body = s.strip_prefix('"')?;
    let mut bytes = Vec::new();
    let mut chars = body.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Some((String::from_utf8_lossy(&bytes).into_owned(), &body[i + 1..])),
            '\\' => {
                let (_, e) = chars.next()?;
                match e {
                    'n' => bytes.push(b'\n'),
                    't' => bytes.push(b'\t'),
                    '0'..='7' => {
                        let mut n = e.to_digit(8)?;
                        for _ in 0..2 {
                            let (_, d) = chars.next()?;
                            n = n * 8 + d.to_digit(8)?;
                        }
                        bytes.push(u8::try_from(n).ok()?);
                    }
                    other => {
                        let mut buf = [0u8; 4];
                        bytes.extend_from_slice(other.encode_utf8(&mut buf).as_bytes());
                    }
                }
            }
            c => {
                let mut buf = [0u8; 4];
                bytes.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    None
}

/// A path as a glob that matches it alone (`[`, `*`, `?`, `{` are literal).
pub fn glob_literal(path: &str) -> String {
    path.chars()
        .map(|c| match c {
            '*' | '?' | '[' | ']' | '{' | '}' => format!("[{c}]"),
            c => c.to_string(),
        })
        .collect()
}

/// The eval script with its repository directory moved to `to` (local mode, where the
/// evaluation copy is not where the image keeps the repository): each `dir` that is a whole
/// path (after a space, a quote, `=`, `:`, `;` or `(`; before a space, `/`, a quote, `;` or
/// `)`) outside here-documents. The test
/// patch, inside a here-document, is left as written.
pub fn relocate(script: &str, dir: &str, to: &str) -> String {
    let (dir, to) = (dir.trim_end_matches('/'), to.trim_end_matches('/'));
    if dir == to || dir.is_empty() {
        return script.to_string();
    }
    let mut out = String::with_capacity(script.len());
    let mut heredoc_end: Option<String> = None;
    for line in script.split_inclusive('\n') {
        if let Some(end) = &heredoc_end {
            // `<<-` strips leading tabs from the terminator too.
            if line.trim_end_matches(['\n', '\r']).trim_start_matches('\t') == end {
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
        let starts = before.is_none_or(|c| c.is_whitespace() || "'\"=;:(<>|&`".contains(c));
        let ends = after
            .chars()
            .next()
            .is_none_or(|c| c.is_whitespace() || "/'\";:)<>|&`".contains(c));
        let whole = starts && ends;
        out.push_str(&rest[..at]);
        out.push_str(if whole { to } else { dir });
        rest = after;
    }
    out.push_str(rest);
    out
}

/// The delimiter of a here-document a line opens (`<<'EOF'`, `<<"EOF-1"`, `<<EOF`, `<<-EOF`);
/// a `<<` that opens none (`$((1<<2))`, a here-string `<<<`) is not one.
fn heredoc_delimiter(line: &str) -> Option<String> {
    let mut rest = line;
    while let Some(at) = rest.find("<<") {
        let after = &rest[at + 2..];
        rest = after;
        if after.starts_with('<') {
            rest = after.trim_start_matches('<');
            continue;
        }
        let word = after.trim_start_matches('-').trim_start();
        let (quoted, word) = match word.chars().next() {
            Some(q @ ('\'' | '"')) => (Some(q), &word[1..]),
            _ => (None, word),
        };
        let delimiter: String = match quoted {
            Some(q) => word.chars().take_while(|c| *c != q).collect(),
            None => word
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect(),
        };
        if delimiter
            .chars()
            .next()
            .is_some_and(|c| c.is_alphabetic() || c == '_')
        {
            return Some(delimiter);
        }
    }
    None
}

#[cfg(test)]
mod tests;
