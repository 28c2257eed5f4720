//! A task file: JSONL, one task per line with the fields of `spec.tasks.inline[]`, blank lines
//! skipped, ids unique. The operator reads one from a ConfigMap or a claim (`spec.tasks`), and
//! `floe run` from disk: both through [`parse`].

use std::collections::BTreeMap;

use crate::rollout_job::{Task, TaskSource};
use crate::swebench::{self, Checkouts};

/// Why a task file is not a list of tasks, with the line that says so.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TaskFileError {
    #[error("line {line}: {message}")]
    Unreadable { line: usize, message: String },
    #[error("line {line}: {}", join(.errors))]
    Invalid {
        line: usize,
        errors: Vec<crate::validation::FieldError>,
    },
    #[error("line {line}{id}: {message}")]
    Instance {
        line: usize,
        /// ` (instance <id>)`, or empty when the line names none.
        id: String,
        message: String,
    },
    #[error("line {line}: duplicate task id {id:?} (first on line {first})")]
    DuplicateId {
        line: usize,
        first: usize,
        id: String,
    },
}

fn join(errors: &[crate::validation::FieldError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// The tasks of a task file, in order. Each line is checked against the schema of an inline
/// task: an unknown key is refused with its line and name, never dropped. An empty file is an empty list: what that means (a
/// job with nothing to run) is the caller's to say.
pub fn parse(text: &str) -> Result<Vec<Task>, TaskFileError> {
    each_line(text, |line_no, value| {
        let errors = crate::validation::task_errors(&value);
        if !errors.is_empty() {
            return Err(TaskFileError::Invalid {
                line: line_no,
                errors,
            });
        }
        serde_json::from_value(value).map_err(|e| TaskFileError::Unreadable {
            line: line_no,
            message: e.to_string(),
        })
    })
}

/// The tasks of a job's task file or ConfigMap, in the format `source` says: floe tasks, or
/// SWE-bench instances (`tasks.swebench`), each made a task and checked as one.
pub fn parse_source(
    text: &str,
    source: &TaskSource,
    checkouts: Checkouts,
) -> Result<Vec<Task>, TaskFileError> {
    let Some(settings) = &source.swebench else {
        return parse(text);
    };
    each_line(text, |line_no, value| {
        let task =
            swebench::to_task(value, settings, checkouts).map_err(|e| TaskFileError::Instance {
                line: line_no,
                id: e
                    .id
                    .map(|id| format!(" (instance {id})"))
                    .unwrap_or_default(),
                message: e.message,
            })?;
        let as_written = serde_json::to_value(&task).map_err(|e| TaskFileError::Unreadable {
            line: line_no,
            message: e.to_string(),
        })?;
        let errors = crate::validation::task_errors(&as_written);
        if !errors.is_empty() {
            return Err(TaskFileError::Invalid {
                line: line_no,
                errors,
            });
        }
        Ok(task)
    })
}

/// Each non-blank line's JSON through `task`, ids unique.
fn each_line(
    text: &str,
    mut task: impl FnMut(usize, serde_json::Value) -> Result<Task, TaskFileError>,
) -> Result<Vec<Task>, TaskFileError> {
    let mut tasks = Vec::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let line_no = i + 1;
        let value: serde_json::Value =
            serde_json::from_str(line).map_err(|e| TaskFileError::Unreadable {
                line: line_no,
                message: e.to_string(),
            })?;
        let task = task(line_no, value)?;
        if let Some(first) = seen.insert(task.id.clone(), line_no) {
            return Err(TaskFileError::DuplicateId {
                line: line_no,
                first,
                id: task.id,
            });
        }
        tasks.push(task);
    }
    Ok(tasks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_parse_and_bad_lines_say_where() {
        let ok =
            parse("{\"id\":\"a\",\"instruction\":\"x\"}\n\n{\"id\":\"b\",\"instruction\":\"y\"}\n");
        assert_eq!(ok.map(|t| t.len()), Ok(2));
        let bad = parse("{\"id\":\"a\",\"instruction\":\"x\"}\n{\"id\":\n");
        assert!(matches!(
            bad,
            Err(TaskFileError::Unreadable { line: 2, .. })
        ));
        let dup =
            parse("{\"id\":\"a\",\"instruction\":\"x\"}\n\n{\"id\":\"a\",\"instruction\":\"y\"}\n");
        assert_eq!(
            dup.map_err(|e| e.to_string()),
            Err("line 3: duplicate task id \"a\" (first on line 1)".into())
        );
        assert_eq!(parse("\n"), Ok(Vec::new()));
    }

    #[test]
    fn a_misspelled_or_unknown_key_is_refused_with_its_line_and_name() {
        let err = |text: &str| parse(text).map_err(|e| e.to_string()).err();
        let good = "{\"id\":\"a\",\"instruction\":\"x\"}\n";
        let hidden = format!(
            "{good}{{\"id\":\"t0\",\"instruction\":\"x\",\"hidden\":{{\"test_x.py\":\"\"}}}}\n"
        );
        assert_eq!(err(&hidden), Some("line 2: hidden: unknown field".into()));
        let typo = "{\"id\":\"t0\",\"instruction\":\"x\",\"evalution\":{}}";
        assert_eq!(
            err(typo),
            Some("line 1: evalution: unknown field (did you mean `evaluation`?)".into())
        );
        // Nested too: a task's evaluation is as strict as the task.
        let nested = "{\"id\":\"t0\",\"instruction\":\"x\",\"evaluation\":{\"hiddenFile\":{}}}";
        assert_eq!(
            err(nested),
            Some(
                "line 1: evaluation.hiddenFile: unknown field (did you mean `hiddenFiles`?)".into()
            )
        );
        // A field written as null is a field left out, as serde reads it.
        let nulls = "{\"id\":\"t0\",\"instruction\":\"x\",\"image\":null,\"evaluation\":null}";
        assert_eq!(parse(nulls).map(|t| t.len()), Ok(1));
        // The schema's own rules hold as for an inline task: a wrong type names its field.
        let typed = "{\"id\":\"t0\",\"instruction\":7}";
        assert!(
            err(typed).is_some_and(|e| e.starts_with("line 1: instruction: ")),
            "{:?}",
            err(typed)
        );
    }
}
