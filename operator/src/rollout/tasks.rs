//! A job's tasks and shared hidden files, from where its spec says (sans-IO parsing; the
//! controller fetches ConfigMaps).

use std::collections::BTreeMap;

use floe_crds::rollout_job::{Task, TaskSource};

/// A task file's tasks in the format `spec` says ([`floe_crds::task_file`]; SWE-bench instances
/// check out the image's repository); errors name `source` and the line.
pub fn parse_jsonl(text: &str, spec: &TaskSource, source: &str) -> Result<Vec<Task>, String> {
    floe_crds::task_file::parse_source(text, spec, floe_crds::swebench::Checkouts::Image)
        .map_err(|e| format!("{source}, {e}"))
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
            &Default::default(),
            "cm",
        );
        assert_eq!(ok.map(|t| t.len()), Ok(2));
        let bad = parse_jsonl(
            "{\"id\":\"a\",\"instruction\":\"x\"}\n{\"id\":\n",
            &Default::default(),
            "ConfigMap tasks/tasks.jsonl",
        );
        assert!(bad.is_err_and(|e| e.starts_with("ConfigMap tasks/tasks.jsonl, line 2")));
        let dup = parse_jsonl(
            "{\"id\":\"a\",\"instruction\":\"x\"}\n{\"id\":\"a\",\"instruction\":\"y\"}\n",
            &Default::default(),
            "cm",
        );
        assert!(dup.is_err());
        assert_eq!(
            parse_jsonl("\n", &Default::default(), "cm"),
            Ok(Vec::new()),
            "an empty job is refused with the other checks (`floe_sandbox::checks`)"
        );
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
