//! Tokens the operator keeps in Secrets of a job's own (its gateways', its task loader's),
//! read once per operator process.

use k8s_openapi::api::core::v1::Secret;
use kube::Api;

use super::JobContext;

/// The token a Secret holds, remembered under `key`: read once per operator process (the
/// operator made most of them itself and remembered them then). A Secret that is not
/// `trusted` (an earlier job's, not yet garbage-collected) holds none.
pub(super) async fn secret_token(
    ctx: &JobContext,
    ns: &str,
    key: &str,
    secret: &str,
    trusted: impl Fn(&Secret) -> bool,
) -> Option<String> {
    if let Some(t) = ctx.tokens.get(ns, key) {
        return Some(t);
    }
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    let token = match secrets.get(secret).await {
        Ok(s) if trusted(&s) => crate::pods::view::control_token_of(&s),
        Ok(_) => {
            tracing::warn!(%secret, "token: the Secret is not this job's (an earlier job's)");
            None
        }
        Err(e) => {
            tracing::warn!(%secret, "token: {e}");
            None
        }
    }?;
    ctx.tokens.remember(ns, key, &token);
    Some(token)
}
