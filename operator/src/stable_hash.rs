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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_published_fnv1a_vectors() {
        // From the FNV reference test suite (draft-eastlake-fnv).
        assert_eq!(fnv1a_hex(""), "cbf29ce484222325");
        assert_eq!(fnv1a_hex("a"), "af63dc4c8601ec8c");
        assert_eq!(fnv1a_hex("foobar"), "85944171f73967e8");
    }
}
