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
}

/// The name the model sees for `name` declared in `namespace`: its own, unless another
/// declared tool has that name too; then `<namespace>__<name>`; and, should that be another
/// tool's already, a numbered one: every name the model sees is one tool's.
fn visible_name(
    namespace: &str,
    name: &str,
    declared: &BTreeMap<&str, usize>,
    used: &BTreeSet<String>,
) -> String {
    let mut visible = if declared.get(name).copied().unwrap_or(0) > 1 {
        format!("{namespace}__{name}")
    } else {
        name.to_string()
    };
    let base = visible.clone();
    let mut n = 2;
    while used.contains(&visible) {
        visible = format!("{base}_{n}");
        n += 1;
    }
    visible
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
            let name = t["name"].as_str().ok_or_else(|| {
                invalid(format!(
                    "{} tool without name",
                    t["type"].as_str().unwrap_or("a")
                ))
            })?;
            *counts.entry(name).or_default() += 1;
        }
    }
    // Top-level tools keep their own names; namespaced ones are named around them.
    let mut used: BTreeSet<String> = declared
        .iter()
        .filter(|(namespace, _)| namespace.is_none())
        .filter_map(|(_, t)| t["name"].as_str().map(str::to_string))
        .collect();
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
                let visible = visible_name(namespace, own, &counts, &used);
                used.insert(visible.clone());
                out.namespaced
                    .insert(visible.clone(), (namespace.to_string(), own.to_string()));
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
    namespaced: &BTreeMap<String, (String, String)>,
    namespace: Option<&str>,
    name: &str,
) -> String {
    namespaced
        .iter()
        .find(|(_, (ns, own))| Some(ns.as_str()) == namespace && own == name)
        .map_or_else(|| name.to_string(), |(visible, _)| visible.clone())
}
