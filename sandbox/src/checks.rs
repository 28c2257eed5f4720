//! What can be known wrong about a job's sessions before the first one starts (sans-IO),
//! shared by `floe run` and the operator. Each of these would otherwise surface only after an
//! agent had spent its model calls: a session id that cannot exist, a task or hidden file path
//! the runner refuses, a protected-path glob that does not parse, a reward file outside the
//! evaluation copy, an evaluator program the evaluation copy will not hold.

use std::collections::BTreeMap;

use floe_crds::rollout_job::{RolloutJobSpec, Task};
use floe_crds::validation::FieldError;
use floe_gateway::capture::valid_session_id as valid_id;

use crate::session::session_id;

/// The longest instruction a harness can be started with: Linux refuses an `execve` one of
/// whose arguments or environment strings is over `MAX_ARG_STRLEN` (32 pages, 131,072 bytes
/// with its NUL), and the instruction is both (`FLOE_INSTRUCTION=…` and the presets' argv).
pub const MAX_INSTRUCTION_BYTES: usize = 131_072 - "FLOE_INSTRUCTION=".len() - 1;
use crate::workspace::{safe_join, Protected};

/// Every problem found, each naming its field: `tasks` is where the tasks came from
/// (`spec.tasks.inline`, or a task file's name), `shared_hidden` the job-wide hidden files.
pub fn check_sessions(
    job: &str,
    spec: &RolloutJobSpec,
    tasks: &[Task],
    tasks_field: &str,
    shared_hidden: &BTreeMap<String, String>,
) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let mut push = |field: String, message: String| errors.push(FieldError { field, message });
    if tasks.is_empty() {
        push(
            tasks_field.to_string(),
            "the job has no tasks: nothing would run".into(),
        );
    }
    let root = std::path::Path::new("/");
    let evaluator = &spec.evaluator;
    if let Some(path) = &evaluator.reward.path {
        if safe_join(root, path).is_err() {
            push(
                "spec.evaluator.reward.path".into(),
                format!("{path:?} must be a relative path inside the evaluation copy (no `..`, not absolute)"),
            );
        }
    }
    if let Err(e) = Protected::new(&evaluator.protected_paths, std::iter::empty()) {
        push("spec.evaluator.protectedPaths".into(), e.to_string());
    }
    // The last attempt has the longest id.
    let (samples, epochs) = (spec.samples(), spec.epochs());
    let attempts = u32::try_from(spec.backoff_limit.max(0)).unwrap_or(0);
    // The program is looked up in the evaluation copy when it is a relative path with a `/`.
    let local_program = evaluator
        .command
        .first()
        .filter(|p| p.contains('/') && !p.starts_with('/'))
        .map(|p| p.trim_start_matches("./").to_string());
    for (i, task) in tasks.iter().enumerate() {
        let field = format!("{tasks_field}[{i}]");
        let id = session_id(job, &task.id, epochs - 1, samples - 1, attempts);
        if task.instruction.contains('\0') {
            push(
                format!("{field}.instruction"),
                "holds a NUL character, which no command-line argument can: it could never \
                 start a harness"
                    .into(),
            );
        }
        if task.instruction.len() > MAX_INSTRUCTION_BYTES {
            push(
                format!("{field}.instruction"),
                format!(
                    "is {} bytes: a harness takes the instruction as one argument and in \
                     `FLOE_INSTRUCTION`, which Linux limits to {MAX_INSTRUCTION_BYTES} bytes \
                     (MAX_ARG_STRLEN): it could never start",
                    task.instruction.len()
                ),
            );
        }
        if !valid_id(&id) {
            push(
                format!("{field}.id"),
                format!("task {:?} of job {job:?} makes session ids like {id:?}, which must be 1-{} characters of [A-Za-z0-9._-] not starting with a dot: shorten or rename the task (or the job)", task.id, floe_gateway::capture::MAX_SESSION_ID_LEN),
            );
        }
        let hidden = task
            .evaluation
            .as_ref()
            .map(|e| &e.hidden_files)
            .into_iter()
            .flatten();
        for (kind, name) in task
            .files
            .keys()
            .map(|k| ("files", k))
            .chain(hidden.map(|(k, _)| ("evaluation.hiddenFiles", k)))
        {
            if safe_join(root, name).is_err() {
                push(
                    format!("{field}.{kind}"),
                    format!("{name:?} must be a relative path inside the workspace (no `..`, not absolute, not empty)"),
                );
            }
        }
        if let Some(e) = task.evaluation.as_ref() {
            if let Err(err) = Protected::new(&e.protected_paths, std::iter::empty()) {
                push(
                    format!("{field}.evaluation.protectedPaths"),
                    err.to_string(),
                );
            }
        }
        // A file that another needs as its directory (`tests` and `tests/test_x.py`): one
        // would silently replace the other when the workspace or the evaluation copy is made.
        let task_hidden = task.evaluation.as_ref().map(|e| &e.hidden_files);
        let all: std::collections::BTreeSet<&str> = task
            .files
            .keys()
            .chain(task_hidden.into_iter().flat_map(|h| h.keys()))
            .chain(shared_hidden.keys())
            .map(|p| p.trim_start_matches("./"))
            .filter(|p| safe_join(root, p).is_ok())
            .collect();
        for path in &all {
            let as_dir = std::path::Path::new(path)
                .ancestors()
                .skip(1)
                .filter_map(|a| a.to_str())
                .find(|a| all.contains(a));
            if let Some(dir) = as_dir {
                push(
                    format!("{field}.evaluation.hiddenFiles"),
                    format!("{dir:?} is a file of the task, and {path:?} needs it to be a directory: the two cannot both be written"),
                );
            }
        }
        if let Some(program) = &local_program {
            let provided = task.files.contains_key(program)
                || shared_hidden.contains_key(program)
                || task
                    .evaluation
                    .as_ref()
                    .is_some_and(|e| e.hidden_files.contains_key(program));
            if !provided {
                push(
                    "spec.evaluator.command[0]".into(),
                    format!("{program:?} is a relative path, so it is run from the evaluation copy of the workspace, and task {:?} puts no such file there (task files or hidden files); use a program on PATH or an absolute path", task.id),
                );
            }
        }
    }
    for name in shared_hidden.keys() {
        if safe_join(root, name).is_err() {
            push(
                "spec.evaluator.hiddenFilesFrom".into(),
                format!("{name:?} must be a relative path inside the workspace"),
            );
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> RolloutJobSpec {
        serde_json::from_value(serde_json::json!({
            "tasks": {"inline": []}, "numSamples": 2, "harness": {"preset": "pi"},
            "poolRef": {"name": "p"}, "evaluator": {"command": ["python", "-m", "pytest"]},
        }))
        .expect("spec")
    }

    fn task(id: &str) -> Task {
        serde_json::from_value(serde_json::json!({"id": id, "instruction": "x"})).expect("task")
    }

    fn fields(errors: &[FieldError]) -> Vec<&str> {
        errors.iter().map(|e| e.field.as_str()).collect()
    }

    #[test]
    fn a_sound_job_has_no_problems() {
        let none = BTreeMap::new();
        assert!(check_sessions("j", &spec(), &[task("t")], "spec.tasks.inline", &none).is_empty());
    }

    #[test]
    fn every_problem_names_its_field() {
        let mut bad = task("t");
        bad.files.insert("../escape.py".into(), String::new());
        bad.evaluation = Some(
            serde_json::from_value(
                serde_json::json!({"hiddenFiles": {"/etc/passwd": "", "": ""},
                "protectedPaths": ["../outside/**"]}),
            )
            .expect("evaluation"),
        );
        let mut s = spec();
        s.evaluator.protected_paths = vec!["[".into()];
        s.evaluator.reward.path = Some("../reward.json".into());
        // Its session ids are 245 characters: their files' names would pass Linux's 255 bytes.
        let long = task(&"x".repeat(237));
        let errors = check_sessions("j", &s, &[bad, long], "spec.tasks.inline", &BTreeMap::new());
        let f = fields(&errors);
        assert!(f.contains(&"spec.tasks.inline[0].files"), "{errors:?}");
        assert_eq!(
            f.iter()
                .filter(|x| **x == "spec.tasks.inline[0].evaluation.hiddenFiles")
                .count(),
            2,
            "{errors:?}"
        );
        assert!(f.contains(&"spec.evaluator.protectedPaths"), "{errors:?}");
        assert!(
            f.contains(&"spec.tasks.inline[0].evaluation.protectedPaths"),
            "{errors:?}"
        );
        assert!(f.contains(&"spec.evaluator.reward.path"), "{errors:?}");
        assert!(f.contains(&"spec.tasks.inline[1].id"), "{errors:?}");
        assert_eq!(
            check_sessions("j", &s, &[], "tasks.jsonl", &BTreeMap::new())[0].field,
            "tasks.jsonl"
        );
    }

    /// Past Linux's limit on one argument the harness could never start: every attempt an
    /// infrastructure failure, retried.
    #[test]
    fn an_instruction_too_long_to_start_a_harness_with_is_refused() {
        let mut at = task("a");
        at.instruction = "é".repeat(MAX_INSTRUCTION_BYTES / 2);
        let mut past = task("b");
        past.instruction = "x".repeat(MAX_INSTRUCTION_BYTES + 1);
        let mut nul = task("c");
        nul.instruction = "a\0b".into();
        let errors = check_sessions("j", &spec(), &[at, past, nul], "t", &BTreeMap::new());
        assert_eq!(
            fields(&errors),
            ["t[1].instruction", "t[2].instruction"],
            "{errors:?}"
        );
        assert!(errors[0].message.contains("MAX_ARG_STRLEN"), "{errors:?}");
        assert!(errors[1].message.contains("NUL"), "{errors:?}");
    }

    #[test]
    fn a_relative_evaluator_must_be_in_every_evaluation_copy() {
        let mut s = spec();
        s.evaluator.command = vec!["./check.sh".into()];
        let mut has = task("a");
        has.files.insert("check.sh".into(), "#!/bin/sh".into());
        let errors = check_sessions("j", &s, &[has.clone(), task("b")], "t", &BTreeMap::new());
        assert_eq!(fields(&errors), ["spec.evaluator.command[0]"]);
        assert!(errors[0].message.contains("\"b\""), "{errors:?}");
        let shared = BTreeMap::from([("check.sh".to_string(), String::new())]);
        assert!(check_sessions("j", &s, &[has, task("b")], "t", &shared).is_empty());
    }

    #[test]
    fn a_file_that_another_needs_as_its_directory_is_refused() {
        let task: Task = serde_json::from_value(serde_json::json!({
            "id": "t", "instruction": "x", "files": {"tests": "a file"},
            "evaluation": {"hiddenFiles": {"tests/test_hidden.py": "assert True"}},
        }))
        .expect("task");
        let errors = check_sessions("j", &spec(), &[task], "spec.tasks.inline", &BTreeMap::new());
        assert!(
            errors
                .iter()
                .any(|e| e.message.contains("needs it to be a directory")),
            "{errors:?}"
        );
    }
}
