//! A hash that stays the same across processes and releases (std's hasher does not promise
//! that), for what the operator records and compares later: a pool template's hash on its pods,
//! a held-out set's digest in a job's status. Change detection, not security.

/// FNV-1a, 64 bit, of `material`, as 16 hex digits.
pub fn fnv1a_hex(material: &str) -> String {
    let hash = material.bytes().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
    });
    format!("{hash:016x}")
}

/// [`fnv1a_hex`] of `value` as compact JSON with every object's keys sorted: the bytes the
/// hashes recorded so far were taken of. serde_json keeps insertion order in this workspace
/// (tool-call arguments must keep the model's), so a struct would otherwise hash its fields
/// in declaration order, and every pool's pods would read as stale after an upgrade.
pub fn of_json(value: &serde_json::Value) -> String {
    fnv1a_hex(&sorted(value).to_string())
}

fn sorted(value: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            Value::Object(
                entries
                    .into_iter()
                    .map(|(k, v)| (k.clone(), sorted(v)))
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_hashes_with_its_keys_sorted_at_every_depth() {
        let built = serde_json::json!({"b": [{"z": 1, "y": 2}], "a": "x"});
        assert_eq!(
            of_json(&built),
            fnv1a_hex(r#"{"a":"x","b":[{"y":2,"z":1}]}"#)
        );
    }

    #[test]
    fn matches_the_published_fnv1a_vectors() {
        // From the FNV reference test suite (draft-eastlake-fnv).
        assert_eq!(fnv1a_hex(""), "cbf29ce484222325");
        assert_eq!(fnv1a_hex("a"), "af63dc4c8601ec8c");
        assert_eq!(fnv1a_hex("foobar"), "85944171f73967e8");
    }
}
