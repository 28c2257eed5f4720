//! The Responses API's tools as Chat Completions functions: `function` tools as they are,
//! freeform `custom` tools as a function of one string, `namespace` tools flattened under names
//! that stay one tool's each, hosted tools dropped and counted.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Value};

use super::ProtocolError;

fn invalid(msg: impl Into<String>) -> ProtocolError {
    ProtocolError::InvalidRequest(msg.into())
}

/// What the request's tools became: chat functions, and what the reply needs to give calls of
/// them back in the caller's own terms.
#[derive(Default)]
pub(super) struct Tools {
    pub functions: Vec<Value>,
    /// The names (as the model sees them) of freeform custom tools.
    pub custom: BTreeSet<String>,
    /// A tool declared in a `namespace` (an MCP server's, say): the name the model sees → its
    /// namespace and own name, which its calls carry back (`function_call.namespace`).
    pub namespaced: BTreeMap<String, (String, String)>,
    /// The same the other way: (namespace, own name) → the name the model sees.
    pub shown: BTreeMap<(String, String), String>,
}

/// The names the model is shown, each one tool's.
#[derive(Default)]
struct Names {
    used: BTreeSet<String>,
    /// The next number to try after a taken name (so naming n clashing tools takes n tries,
    /// not n²: a request is the agent's to shape).
    next: BTreeMap<String, usize>,
}

impl Names {
    /// The name the model sees for `name` declared in `namespace`: its own, unless another
    /// declared tool has that name too; then `<namespace>__<name>`; and, should that be
    /// another tool's already, a numbered one.
    fn visible(&mut self, namespace: &str, name: &str, declared: &BTreeMap<&str, usize>) -> String {
        let base = if declared.get(name).copied().unwrap_or(0) > 1 {
            format!("{namespace}__{name}")
        } else {
            name.to_string()
        };
        let mut visible = base.clone();
        while self.used.contains(&visible) {
            let n = self.next.entry(base.clone()).or_insert(2);
            visible = format!("{base}_{n}");
            *n += 1;
        }
        self.used.insert(visible.clone());
        visible
    }
}

/// The longest tool or namespace name taken (OpenAI allows 64 characters). A namespaced tool's
/// name is kept with its namespace's for each tool: a namespace named in megabytes over 100k
/// tools would take the gateway's memory.
const MAX_NAME_BYTES: usize = 256;

fn checked_name(kind: &str, name: &str) -> Result<(), ProtocolError> {
    if name.len() > MAX_NAME_BYTES {
        return Err(invalid(format!(
            "a {kind} tool's name is {} bytes, over the {MAX_NAME_BYTES} taken",
            name.len()
        )));
    }
    Ok(())
}

/// Every tool of `tools`, each with the namespace it was declared in (the innermost, where
/// namespaces nest).
fn declared_in<'a>(
    tools: &'a Value,
    namespace: Option<&'a str>,
    out: &mut Vec<(Option<&'a str>, &'a Value)>,
) -> Result<(), ProtocolError> {
    for t in tools.as_array().into_iter().flatten() {
        if t["type"] == "namespace" {
            let inner = t["name"]
                .as_str()
                .ok_or_else(|| invalid("namespace tool without name"))?;
            checked_name("namespace", inner)?;
            declared_in(&t["tools"], Some(inner), out)?;
        } else {
            out.push((namespace, t));
        }
    }
    Ok(())
}

/// Chat functions for the tools (a `namespace`'s tools flattened among them).
pub(super) fn tools(
    tools: Option<&Value>,
    dropped: &mut Vec<String>,
) -> Result<Tools, ProtocolError> {
    let mut declared: Vec<(Option<&str>, &Value)> = Vec::new();
    if let Some(tools) = tools {
        declared_in(tools, None, &mut declared)?;
    }
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, t) in &declared {
        if matches!(t["type"].as_str(), Some("function" | "custom")) {
            let kind = t["type"].as_str().unwrap_or("a");
            let name = t["name"]
                .as_str()
                .ok_or_else(|| invalid(format!("{kind} tool without name")))?;
            checked_name(kind, name)?;
            *counts.entry(name).or_default() += 1;
        }
    }
    // Top-level tools keep their own names; namespaced ones are named around them.
    let mut names = Names {
        used: declared
            .iter()
            .filter(|(namespace, _)| namespace.is_none())
            .filter_map(|(_, t)| t["name"].as_str().map(str::to_string))
            .collect(),
        ..Names::default()
    };
    let mut out = Tools::default();
    for (namespace, t) in declared {
        let kind = t["type"].as_str();
        let parameters = match kind {
            Some("function") => t
                .get("parameters")
                .cloned()
                .unwrap_or(json!({"type": "object", "properties": {}})),
            Some("custom") => {
                json!({"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]})
            }
            Some(hosted) => {
                dropped.push(format!("hosted_tool:{hosted}"));
                continue;
            }
            None => return Err(invalid("every tool needs a type")),
        };
        // Checked above: a function or custom tool has a name.
        let own = t["name"].as_str().unwrap_or_default();
        let name = match namespace {
            Some(namespace) => {
                let visible = names.visible(namespace, own, &counts);
                let declared_as = (namespace.to_string(), own.to_string());
                out.shown.insert(declared_as.clone(), visible.clone());
                out.namespaced.insert(visible.clone(), declared_as);
                visible
            }
            None => own.to_string(),
        };
        if kind == Some("custom") {
            out.custom.insert(name.clone());
        }
        let strict = if kind == Some("function") {
            t["strict"].as_bool()
        } else {
            None
        };
        out.functions.push(super::function_tool(
            &Value::String(name),
            t.get("description"),
            parameters,
            strict,
        ));
    }
    Ok(out)
}

/// The name the model was shown for a tool the caller names by `name` (and `namespace`).
pub(super) fn name_shown(
    shown: &BTreeMap<(String, String), String>,
    namespace: Option<&str>,
    name: &str,
) -> String {
    namespace
        .and_then(|ns| shown.get(&(ns.to_string(), name.to_string())))
        .map_or_else(|| name.to_string(), String::clone)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::tools;

    #[test]
    fn clashing_names_are_numbered_past_every_name_taken() {
        // Three `x` in namespace `a` (each `a__x` first), and `a__x_2` declared at the top.
        let f = |name: &str| json!({"type": "function", "name": name});
        let declared = json!([f("a__x_2"), f("x"),
            {"type": "namespace", "name": "a", "tools": [f("x"), f("x"), f("x")]}]);
        let t = tools(Some(&declared), &mut Vec::new()).expect("valid");
        let names: Vec<&str> = t
            .functions
            .iter()
            .filter_map(|f| f["function"]["name"].as_str())
            .collect();
        assert_eq!(names, ["a__x_2", "x", "a__x", "a__x_3", "a__x_4"]);
        assert_eq!(t.namespaced.len(), 3);
        let long = "n".repeat(257);
        for declared in [
            json!([{"type": "namespace", "name": long, "tools": [f("x")]}]),
            json!([f(&long)]),
        ] {
            let refused = tools(Some(&declared), &mut Vec::new()).err();
            assert!(
                refused
                    .as_ref()
                    .is_some_and(|e| e.to_string().contains("over the 256")),
                "{refused:?}"
            );
        }
        assert_eq!(
            t.shown
                .get(&("a".to_string(), "x".to_string()))
                .map(String::as_str),
            Some("a__x_4"),
            "a name declared twice in one namespace is the caller's ambiguity: the last wins"
        );
    }
}
