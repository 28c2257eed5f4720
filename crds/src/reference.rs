//! `docs/crds.md`, generated from the CRD schemas: every field with its type, default,
//! constraints, description and one example. Examples come from the files in `examples/` (so
//! they are the values the tests apply); a field no example sets shows its default or first
//! enum value. Embedded Kubernetes types (EnvVar, Volume, …) are listed but not expanded.

use std::fmt::Write;

use serde_json::Value;

use crate::generate::{crds_documented, GenerateError};

/// Render the reference. `examples` are the parsed example objects (any order).
pub fn reference_markdown(examples: &[Value]) -> Result<String, GenerateError> {
    Ok(render(examples)?.0)
}

/// Fields that the reference shows without a description or without an example.
pub fn undocumented_fields(examples: &[Value]) -> Result<Vec<String>, GenerateError> {
    Ok(render(examples)?.1)
}

/// State of one rendering: gaps found, and object schemas already expanded (by path), so a
/// type used twice (the sandbox template, prepare steps) is expanded once and referenced after.
#[derive(Default)]
struct Walk {
    gaps: Vec<String>,
    expanded: Vec<(Value, String)>,
}

impl Walk {
    fn seen_at(&mut self, node: &Value, path: &str) -> Option<String> {
        let mut key = node.clone();
        if let Some(m) = key.as_object_mut() {
            m.remove("description");
            m.remove("nullable");
        }
        if let Some((_, first)) = self.expanded.iter().find(|(k, _)| *k == key) {
            return Some(first.clone());
        }
        self.expanded.push((key, path.to_string()));
        None
    }
}

fn render(examples: &[Value]) -> Result<(String, Vec<String>), GenerateError> {
    let mut walk = Walk::default();
    let mut out = String::from(
        "# CRD reference\n\n<!-- Generated from the Rust types in crds/ and the files in examples/ \
         by `scripts/generate.sh`. Do not edit. -->\n\n\
         Group `floe.dev`, version `v1alpha1`, both namespaced. Constraints are enforced by the \
         apiserver's schema validation; the rules under *CEL rules* are enforced by the apiserver \
         on Kubernetes ≥ 1.25 and by the operator (and `floe run`) everywhere.\n",
    );
    for crd in crds_documented()? {
        let kind = crd.spec.names.kind.clone();
        let crd = serde_json::to_value(&crd)?;
        let version = &crd["spec"]["versions"][0];
        let schema = &version["schema"]["openAPIV3Schema"];
        let short = crd["spec"]["names"]["shortNames"][0]
            .as_str()
            .unwrap_or_default();
        let _ = write!(
            out,
            "\n## {kind} (`{short}`)\n\n{}\n",
            text(&schema["description"])
        );
        if let Some(sub) = version["subresources"].as_object() {
            let names: Vec<_> = sub.keys().map(|k| format!("`{k}`")).collect();
            let _ = writeln!(out, "\nSubresources: {}.", names.join(", "));
        }
        let columns: Vec<_> = version["additionalPrinterColumns"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| format!("{} (`{}`)", text(&c["name"]), text(&c["jsonPath"])))
            .collect();
        let _ = writeln!(out, "`kubectl get` columns: {}.", columns.join(", "));
        let mine: Vec<&Value> = examples
            .iter()
            .filter(|e| e["kind"] == kind.as_str())
            .collect();
        let mut rules = Vec::new();
        collect_rules(schema, "", &mut rules);
        if !rules.is_empty() {
            let _ = writeln!(
                out,
                "\n### CEL rules\n\n| where | rule | message |\n|---|---|---|"
            );
            for (path, rule, message) in rules {
                let _ = writeln!(
                    out,
                    "| `{}` | `{}` | {} |",
                    or_root(&path),
                    cell(&rule),
                    cell(&message)
                );
            }
        }
        for section in ["spec", "status"] {
            let _ = writeln!(
                out,
                "\n### {section}\n\n| field | type | default | constraints | description | example |\n|---|---|---|---|---|---|"
            );
            let node = &schema["properties"][section];
            let values: Vec<&Value> = mine.iter().map(|e| &e[section]).collect();
            fields(node, section, &values, &mut out, &mut walk);
        }
    }
    Ok((out, walk.gaps))
}

fn or_root(path: &str) -> &str {
    if path.is_empty() {
        "(object)"
    } else {
        path
    }
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

fn collect_rules(node: &Value, path: &str, out: &mut Vec<(String, String, String)>) {
    for rule in node["x-kubernetes-validations"]
        .as_array()
        .into_iter()
        .flatten()
    {
        out.push((
            path.to_string(),
            text(&rule["rule"]),
            text(&rule["message"]),
        ));
    }
    for (name, child) in node["properties"].as_object().into_iter().flatten() {
        collect_rules(child, &join(path, name), out);
    }
    if node["items"].is_object() {
        collect_rules(&node["items"], &format!("{path}[]"), out);
    }
}

fn join(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_string()
    } else {
        format!("{path}.{name}")
    }
}

/// Does anything under `node` carry floe's own documentation? Embedded Kubernetes types do not.
fn documented_inside(node: &Value) -> bool {
    let props = node["properties"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(_, v)| v);
    let items = node["items"].is_object().then(|| &node["items"]);
    props
        .chain(items)
        .any(|c| c.get("description").is_some() || documented_inside(c))
}

fn fields(node: &Value, path: &str, examples: &[&Value], out: &mut String, walk: &mut Walk) {
    let Some(props) = node["properties"].as_object() else {
        return;
    };
    let required: Vec<&str> = node["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    for (name, child) in props {
        let here = join(path, name);
        let values: Vec<&Value> = examples
            .iter()
            .map(|e| &e[name.as_str()])
            .filter(|v| !v.is_null())
            .collect();
        let items = &child["items"];
        let expand = if child["properties"].is_object() && documented_inside(child) {
            Some((child, here.clone(), values.clone()))
        } else if items["properties"].is_object() && documented_inside(items) {
            let elems = values
                .iter()
                .flat_map(|v| v.as_array().into_iter().flatten())
                .collect();
            Some((items, format!("{here}[]"), elems))
        } else {
            None
        };
        let same_as = expand
            .as_ref()
            .and_then(|(node, path, _)| walk.seen_at(node, path));
        row(
            &here,
            child,
            required.contains(&name.as_str()),
            &values,
            same_as.as_deref(),
            out,
            &mut walk.gaps,
        );
        if let (Some((node, path, elems)), None) = (expand, same_as) {
            fields(node, &path, &elems, out, walk);
        }
    }
}

fn type_of(node: &Value) -> String {
    match node["type"].as_str() {
        Some("array") => format!("[]{}", type_of(&node["items"])),
        Some("object") if node["additionalProperties"].is_object() => {
            format!("map[string]{}", type_of(&node["additionalProperties"]))
        }
        Some(t) => t.to_string(),
        None if node["x-kubernetes-int-or-string"] == true => "int-or-string".into(),
        None => "any".into(),
    }
}

fn constraints(node: &Value, required: bool) -> String {
    let mut c = Vec::new();
    if required {
        c.push("required".to_string());
    }
    if let Some(values) = node["enum"].as_array() {
        let names: Vec<_> = values
            .iter()
            .map(|v| format!("`{}`", v.as_str().unwrap_or_default()))
            .collect();
        c.push(format!("one of {}", names.join(", ")));
    }
    for (key, label) in [
        ("minimum", "≥"),
        ("maximum", "≤"),
        ("minLength", "min length"),
        ("maxLength", "max length"),
        ("minItems", "min items"),
        ("maxItems", "max items"),
    ] {
        if let Some(v) = node.get(key).and_then(Value::as_f64) {
            // schemars writes integer bounds as floats (1024.0); print them as the user types them.
            c.push(format!("{label} {v}"));
        }
    }
    if let Some(p) = node["pattern"].as_str() {
        c.push(format!("pattern `{p}`"));
    }
    if node["x-kubernetes-list-type"] == "map" {
        c.push("unique by `id`".into());
    }
    cell(&c.join(", "))
}

fn row(
    path: &str,
    node: &Value,
    required: bool,
    values: &[&Value],
    same_as: Option<&str>,
    out: &mut String,
    gaps: &mut Vec<String>,
) {
    let default = match node.get("default") {
        Some(d) => format!("`{}`", compact(d)),
        None => String::new(),
    };
    let example = values
        .first()
        .copied()
        .or_else(|| node.get("default"))
        .or_else(|| node["enum"].get(0))
        .map(|v| format!("`{}`", cell(&truncate(&compact(v), 80))))
        .unwrap_or_default();
    let mut description = node["description"].as_str().unwrap_or_default().to_string();
    if let Some(first) = same_as {
        description.push_str(&format!(" Same fields as `{first}` above."));
    }
    if description.is_empty() || example.is_empty() {
        gaps.push(format!(
            "{path} (description: {}, example: {})",
            !description.is_empty(),
            !example.is_empty()
        ));
    }
    let _ = writeln!(
        out,
        "| `{path}` | {} | {default} | {} | {} | {example} |",
        type_of(node),
        constraints(node, required),
        cell(&description)
    );
}

fn compact(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        format!("{}…", s.chars().take(max).collect::<String>())
    }
}
