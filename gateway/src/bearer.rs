//! Bearer-token checks shared by the gateway's control API and the dataset collector.

use axum::http::HeaderMap;

/// Where `floe gateway` and `floe run` read the model server's API key (a Secret's key in a
/// pod's gateway container; never in the agent's environment).
pub const UPSTREAM_KEY_ENV: &str = "FLOE_UPSTREAM_API_KEY";

/// Constant-time comparison, so response timing does not leak the token.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A token from the environment variable `var` (a Secret's key, never an argument: arguments
/// are visible to every process of the node). Unset or blank: `None`, and a warning that
/// whoever reaches the port can `what`.
pub fn token_from_env(var: &str, what: &str) -> Option<String> {
    let token = env_secret(var);
    if token.is_none() {
        tracing::warn!("no {var}: anyone who reaches this port can {what}");
    }
    token
}

/// The trimmed value of the environment variable `var`; `None` when unset or blank.
pub fn env_secret(var: &str) -> Option<String> {
    std::env::var(var)
        .ok()
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
}

/// Whether `headers` carry `Authorization: Bearer <token>`.
pub fn carries(headers: &HeaderMap, token: &str) -> bool {
    let given = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default();
    same(given.as_bytes(), token.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_bearer_token_passes() {
        let mut h = HeaderMap::new();
        assert!(!carries(&h, "t0k"));
        h.insert("authorization", "Bearer t0k".parse().expect("header"));
        assert!(carries(&h, "t0k"));
        assert!(!carries(&h, "t0"));
        h.insert("authorization", "t0k".parse().expect("header"));
        assert!(!carries(&h, "t0k"));
    }
}
