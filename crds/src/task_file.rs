//! A task file: JSONL, one task per line with the fields of `spec.tasks.inline[]`, blank lines
//! skipped, ids unique. The operator reads one from a ConfigMap or a claim (`spec.tasks`), and
//! `floe run` from disk: both through [`parse`].

use std::collections::BTreeMap;

use crate::rollout_job::Task;

/// Why a task file is not a list of tasks, with the line that says so.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TaskFileError {
    #[error("line {line}: {message}")]
    Unreadable { line: usize, message: String },
    #[error("line {line}: duplicate task id {id:?} (first on line {first})")]
    DuplicateId {
        line: usize,
        first: usize,
        id: String,
    },
}

/// The tasks of a task file, in order. An empty file is an empty list: what that means (a
/// job with nothing to run) is the caller's to say.
pub fn parse(text: &str) -> Result<Vec<Task>, TaskFileError> {
    let mut tasks = Vec::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let line_no = i + 1;
        let task: Task = serde_json::from_str(line).map_err(|e| TaskFileError::Unreadable {
            line: line_no,
            message: e.to_string(),
        })?;
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
}
