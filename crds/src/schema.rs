//! Schema helpers for fields whose Rust type does not say enough to the apiserver.

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde_json::Value;

/// Free-form object kept as the user wrote it (`x-kubernetes-preserve-unknown-fields`).
pub fn preserve_unknown_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// Schema of an embedded Kubernetes type (EnvVar, Volume, Affinity, …) without its upstream
/// descriptions. Those types are documented by Kubernetes itself; inlined with their prose the
/// CRDs grow past the 256 KiB limit of `kubectl apply`'s last-applied annotation.
/// The field's own doc comment is still added by schemars on top of this schema.
pub fn k8s<T: JsonSchema>(generator: &mut SchemaGenerator) -> Schema {
    let mut schema = generator.subschema_for::<T>();
    if let Some(map) = schema.as_object_mut() {
        map.remove("description");
        map.values_mut().for_each(strip_descriptions);
    }
    schema
}

fn strip_descriptions(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.remove("description");
            // A property *named* "description" is a field, not prose: keep it, clean inside.
            map.values_mut().for_each(strip_descriptions);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_descriptions),
        _ => {}
    }
}
