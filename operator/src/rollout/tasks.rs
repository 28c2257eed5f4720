//! A job's tasks and shared hidden files, from where its spec says (sans-IO parsing; the
//! controller fetches ConfigMaps).

use std::collections::BTreeMap;

use floe_crds::rollout_job::Task;

/// JSONL: one task per line, the same fields as `spec.tasks.inline[]`; ids must be unique.
pub fn parse_jsonl(text: &str, source: &str) -> Result<Vec<Task>, String> {
    let mut tasks: Vec<Task> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let task: Task =
            serde_json::from_str(line).map_err(|e| format!("{source}, line {}: {e}", i + 1))?;
        tasks.push(task);
    }
    if tasks.is_empty() {
        return Err(format!("{source} holds no tasks"));
    }
    if let Some(e) = floe_crds::validation::duplicate_task_ids(&tasks, source).first() {
        return Err(e.to_string());
    }
    Ok(tasks)
}

/// `evaluator.hiddenFilesFrom`: ConfigMap keys are paths with `/` written as `__` (ConfigMap
/// keys cannot hold `/`).
pub fn hidden_files(data: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    data.iter()
        .map(|(k, v)| (k.replace("__", "/"), v.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonl_tasks_parse_and_bad_lines_say_where() {
        let ok = parse_jsonl(
            "{\"id\":\"a\",\"instruction\":\"x\"}\n\n{\"id\":\"b\",\"instruction\":\"y\"}\n",
            "cm",
        );
        assert_eq!(ok.map(|t| t.len()), Ok(2));
        let bad = parse_jsonl(
            "{\"id\":\"a\",\"instruction\":\"x\"}\n{\"id\":\n",
            "ConfigMap tasks/tasks.jsonl",
        );
        assert!(bad.is_err_and(|e| e.starts_with("ConfigMap tasks/tasks.jsonl, line 2")));
        let dup = parse_jsonl(
            "{\"id\":\"a\",\"instruction\":\"x\"}\n{\"id\":\"a\",\"instruction\":\"y\"}\n",
            "cm",
        );
        assert!(dup.is_err());
        assert!(parse_jsonl("\n", "cm").is_err());
    }

    #[test]
    fn hidden_file_keys_map_double_underscores_to_slashes() {
        let data = BTreeMap::from([("tests__test_hidden.py".to_string(), "x".to_string())]);
        assert_eq!(
            hidden_files(&data).keys().next().map(String::as_str),
            Some("tests/test_hidden.py")
        );
    }
}
