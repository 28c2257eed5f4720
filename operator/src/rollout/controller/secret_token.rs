//! Tokens the operator keeps in Secrets of a job's own (its gateways', its task loader's),
//! read once per operator process.

use floe_crds::rollout_job::RolloutJob;
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, ResourceExt};

use super::{name_holder, JobContext};

/// The token of `job`'s own Secret `secret`, remembered under [`job_key`]; none from a Secret
/// that is not this job's (an earlier job's under the same name).
pub(super) async fn of_job(ctx: &JobContext, job: &RolloutJob, secret: &str) -> Option<String> {
    let ns = job.namespace().unwrap_or_default();
    let ours =
        |s: &Secret| name_holder::holder(&s.metadata, job) == crate::controller_ref::Holder::This;
    secret_token(ctx, &ns, &job_key(job, secret), secret, ours).await
}

/// Where [`of_job`] remembers a token: by the job's UID, since a job made again under its name
/// has a token of its own (it was remembered by name, and the earlier job's sent).
pub(super) fn job_key(job: &RolloutJob, secret: &str) -> String {
    format!("secret/{secret}/{}", job.uid().unwrap_or_default())
}

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
