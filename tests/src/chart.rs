//! The Helm chart's test tools: the real Helm and promtool (`scripts/chart/tools.sh`, or the
//! directory `FLOE_CHART_TOOLS` names), a Lua interpreter for the Argo CD health checks, and
//! the pure helpers the chart tests share: the dashboard's queries, metric names in PromQL (and
//! every one the dashboard and rules read), metric names a `/metrics` page exports, JSON
//! objects as Lua table literals.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::cluster::workspace_root;

static TOOLS: OnceLock<PathBuf> = OnceLock::new();

/// `bin/` with `helm`, `promtool` and `lua`. Fails (never skips) when they cannot be had.
pub fn tools() -> &'static Path {
    TOOLS.get_or_init(|| {
        if let Some(dir) = std::env::var_os("FLOE_CHART_TOOLS") {
            return PathBuf::from(dir);
        }
        let out = Command::new(workspace_root().join("scripts/chart/tools.sh"))
            .stderr(Stdio::inherit())
            .output()
            .expect("scripts/chart/tools.sh runs");
        assert!(out.status.success(), "scripts/chart/tools.sh failed");
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    })
}

pub fn chart_dir() -> PathBuf {
    workspace_root().join("charts/floe")
}

/// Run a tool from [`tools()`]; the output whatever the exit status.
pub fn run_tool(tool: &str, args: &[&str], stdin: Option<&[u8]>) -> Result<Output> {
    use std::io::Write;
    let mut child = Command::new(tools().join(tool))
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {tool}"))?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(input)?;
    }
    Ok(child.wait_with_output()?)
}

/// Run a tool and return its stdout; its stderr is the error when it fails.
pub fn tool_ok(tool: &str, args: &[&str]) -> Result<String> {
    stdout_of(tool, args, run_tool(tool, args, None)?)
}

/// A tool run's stdout; its stderr (and stdout) is the error when it failed.
pub fn stdout_of(tool: &str, args: &[&str], out: Output) -> Result<String> {
    if !out.status.success() {
        bail!(
            "{tool} {} failed: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
    }
    Ok(String::from_utf8(out.stdout)?)
}

/// `helm template` of the chart with these extra arguments.
pub fn render(args: &[&str]) -> Result<String> {
    let chart = chart_dir();
    let mut all = vec!["template", "floe", chart.to_str().context("chart path")?];
    all.extend_from_slice(args);
    tool_ok("helm", &all)
}

/// The YAML documents of a rendering, as JSON values (empty documents dropped).
pub fn documents(yaml: &str) -> Result<Vec<Value>> {
    let mut docs = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(yaml) {
        let v: Value = serde::Deserialize::deserialize(doc)?;
        if !v.is_null() {
            docs.push(v);
        }
    }
    Ok(docs)
}

/// The Prometheus rule groups of a rendering's PrometheusRule, as a rules file.
pub fn rules_file(yaml: &str) -> Result<String> {
    let rule = documents(yaml)?
        .into_iter()
        .find(|d| d["kind"] == "PrometheusRule")
        .context("no PrometheusRule rendered")?;
    Ok(serde_yaml::to_string(
        &serde_json::json!({"groups": rule["spec"]["groups"]}),
    )?)
}

/// The chart dashboard's panel queries: (panel title, PromQL with its `$variables`).
pub fn dashboard_queries() -> Result<Vec<(String, String)>> {
    let path = crate::chart::chart_dir().join("files/dashboards/floe.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(path)?)?;
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().context("panels")? {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().context("panel expr")?;
            out.push((
                panel["title"].as_str().unwrap_or("").to_string(),
                expr.to_string(),
            ));
        }
    }
    Ok(out)
}

/// Every metric the dashboard's queries, its variables and the alerts' expressions read.
pub fn referenced_metrics(rules: &str) -> Result<BTreeSet<String>> {
    let mut exprs: Vec<String> = dashboard_queries()?.into_iter().map(|(_, e)| e).collect();
    let path = chart_dir().join("files/dashboards/floe.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(path)?)?;
    for var in dashboard["templating"]["list"]
        .as_array()
        .context("templating")?
    {
        if let Some(q) = var["query"]["query"].as_str() {
            // label_values(metric{...}, label)
            let inner = q.trim_start_matches("label_values(");
            let metric = inner.split([',', '{']).next().unwrap_or_default();
            exprs.push(metric.to_string());
        }
    }
    anyhow::ensure!(exprs.len() > 20, "the dashboard lost its queries");
    let rules: Value = serde_yaml::from_str(rules)?;
    for group in rules["groups"].as_array().context("groups")? {
        for rule in group["rules"].as_array().context("rules")? {
            exprs.push(rule["expr"].as_str().context("expr")?.to_string());
        }
    }
    Ok(exprs.iter().flat_map(|e| promql_metrics(e)).collect())
}

const PROMQL_WORDS: &[&str] = &[
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "offset",
    "bool",
    "inf",
    "nan",
    // Aggregations, which may be followed by `by (...)` rather than `(`.
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
];

/// The metric names a PromQL expression reads: identifiers that are not functions (followed
/// by `(`), keywords, label names (inside `{}` or the `(...)` of by/on/without/ignoring/
/// group_*), string contents or durations.
pub fn promql_metrics(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let chars: Vec<char> = expr.chars().collect();
    let (mut i, mut brace, mut label_list, mut paren) = (0, 0usize, None::<usize>, 0usize);
    let mut last_word = String::new();
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' | '\'' | '`' => {
                i += 1;
                while i < chars.len() && chars[i] != c {
                    if chars[i] == '\\' {
                        i += 1;
                    }
                    i += 1;
                }
                i += 1;
                continue;
            }
            '[' => {
                while i < chars.len() && chars[i] != ']' {
                    i += 1;
                }
            }
            '{' => brace += 1,
            '}' => brace = brace.saturating_sub(1),
            '(' => {
                paren += 1;
                if matches!(
                    last_word.as_str(),
                    "by" | "without" | "on" | "ignoring" | "group_left" | "group_right"
                ) && label_list.is_none()
                {
                    label_list = Some(paren);
                }
            }
            ')' => {
                if label_list == Some(paren) {
                    label_list = None;
                }
                paren = paren.saturating_sub(1);
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let start = i;
                while i < chars.len()
                    && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
                {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let mut j = i;
                while j < chars.len() && chars[j].is_whitespace() {
                    j += 1;
                }
                let is_call = j < chars.len() && chars[j] == '(';
                let numeric = start > 0 && chars[start - 1].is_ascii_digit();
                if brace == 0
                    && label_list.is_none()
                    && !is_call
                    && !numeric
                    && !PROMQL_WORDS.contains(&word.to_ascii_lowercase().as_str())
                {
                    out.insert(word.clone());
                }
                last_word = word;
                continue;
            }
            _ => {}
        }
        if !c.is_whitespace() {
            last_word.clear();
        }
        i += 1;
    }
    out
}

/// Every sample name a Prometheus text page can carry: the names on sample lines, and for
/// each `# TYPE` family (also one with no samples yet: a labelled metric nobody set) the
/// names its type implies.
/// The apiserver rule (the first egress rule) of the chart's operator NetworkPolicy: its
/// `ipBlock` CIDRs and ports.
pub fn apiserver_rule(policy: &Value) -> (BTreeSet<String>, BTreeSet<i64>) {
    let rule = &policy["spec"]["egress"][0];
    let cidrs = rule["to"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["ipBlock"]["cidr"].as_str().map(str::to_string))
        .collect();
    let ports = rule["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["port"].as_i64())
        .collect();
    (cidrs, ports)
}

/// What that rule must be, given the cluster's `default/kubernetes` Endpoints: their
/// addresses (`/32`) and ports, or, with none to read, any address on the values' default
/// ports.
pub fn apiserver_rule_for(
    endpoints: Option<&k8s_openapi::api::core::v1::Endpoints>,
) -> (BTreeSet<String>, BTreeSet<i64>) {
    let subsets = endpoints
        .and_then(|e| e.subsets.clone())
        .unwrap_or_default();
    let cidrs: BTreeSet<String> = subsets
        .iter()
        .flat_map(|s| s.addresses.iter().flatten())
        .map(|a| format!("{}/32", a.ip))
        .collect();
    let ports: BTreeSet<i64> = subsets
        .iter()
        .flat_map(|s| s.ports.iter().flatten())
        .map(|p| i64::from(p.port))
        .collect();
    if cidrs.is_empty() || ports.is_empty() {
        return (BTreeSet::new(), [443, 6443].into());
    }
    (cidrs, ports)
}

pub fn exported_metrics(page: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in page.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
                continue;
            };
            out.insert(name.to_string());
            match kind {
                "counter" => {
                    out.insert(format!("{}_total", name.trim_end_matches("_total")));
                }
                "histogram" => {
                    for suffix in ["_bucket", "_sum", "_count"] {
                        out.insert(format!("{name}{suffix}"));
                    }
                }
                "summary" => {
                    for suffix in ["_sum", "_count"] {
                        out.insert(format!("{name}{suffix}"));
                    }
                }
                _ => {}
            }
        } else if !line.starts_with('#') {
            let name: String = line
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

/// A JSON value as a Lua expression (objects and arrays become tables; arrays 1-based).
pub fn lua_literal(v: &Value) -> String {
    match v {
        Value::Null => "nil".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => lua_string(s),
        Value::Array(items) => format!(
            "{{{}}}",
            items.iter().map(lua_literal).collect::<Vec<_>>().join(", ")
        ),
        Value::Object(map) => format!(
            "{{{}}}",
            map.iter()
                .map(|(k, v)| format!("[{}] = {}", lua_string(k), lua_literal(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

fn lua_string(s: &str) -> String {
    let mut out = String::from("\"");
    for b in s.bytes() {
        match b {
            b'"' | b'\\' => {
                out.push('\\');
                out.push(b as char);
            }
            0x20..=0x7e => out.push(b as char),
            _ => out.push_str(&format!("\\{b:03}")),
        }
    }
    out.push('"');
    out
}

/// Run an Argo CD health script on `object` (as Argo CD does: the object is the global `obj`)
/// and return (status, message).
pub fn argocd_health(script: &Path, object: &Value) -> Result<(String, String)> {
    let body = std::fs::read_to_string(script)?;
    let program = format!(
        "obj = {}\nlocal hs = (function()\n{body}\nend)()\nio.write(hs.status, \"\\n\", hs.message or \"\")\n",
        lua_literal(object)
    );
    let out = run_tool("lua", &["-"], Some(program.as_bytes()))?;
    if !out.status.success() {
        bail!(
            "lua failed on {}: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8(out.stdout)?;
    let (status, message) = text.split_once('\n').unwrap_or((text.as_str(), ""));
    Ok((status.to_string(), message.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(words: &[&str]) -> BTreeSet<String> {
        words.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn promql_metrics_skips_functions_labels_strings_and_durations() {
        let expr = r#"sum by (namespace, rolloutjob) (increase(floe_session_results_total{result=~"retried|failed"}[15m]))
            / clamp_min(sum by (namespace) (rate(floe_x_total[5m])), 1) > 0.25
            and on (namespace, rolloutjob) group_left(pool) floe_sessions{state="running"} > 1e3"#;
        assert_eq!(
            promql_metrics(expr),
            set(&[
                "floe_session_results_total",
                "floe_x_total",
                "floe_sessions"
            ])
        );
        let dcgm = r#"label_replace(DCGM_FI_DEV_GPU_UTIL{pod=~".+-trainer"}, "rolloutjob", "$1", "pod", "(.+)-trainer")"#;
        assert_eq!(promql_metrics(dcgm), set(&["DCGM_FI_DEV_GPU_UTIL"]));
        assert_eq!(promql_metrics("absent(up{job=\"x\"} == 1)"), set(&["up"]));
    }

    #[test]
    fn exported_metrics_include_what_each_type_implies() {
        let page = "# TYPE a counter\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\n# TYPE g gauge\ng{x=\"1\"} 2\n# TYPE s summary\n# TYPE c_total counter\n";
        let got = exported_metrics(page);
        for name in [
            "a_total", "h_bucket", "h_sum", "h_count", "g", "s_sum", "s_count", "c_total",
        ] {
            assert!(got.contains(name), "{name} missing from {got:?}");
        }
    }

    #[test]
    fn lua_literals_escape_strings() {
        let v = serde_json::json!({"a": [1, "x\"y\n"], "b": null});
        assert_eq!(
            lua_literal(&v),
            "{[\"a\"] = {1, \"x\\\"y\\010\"}, [\"b\"] = nil}"
        );
    }
}
