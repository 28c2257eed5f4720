//! The pod writes both controllers make: creating a sandbox pod with its control-token
//! Secret, marking its state, deleting it.

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};

use super::sandbox::{control_secret, new_control_token, state_mark_patch};
use super::PodState;

/// Delete a pod; one already gone is fine. Returns its resourceVersion when the deletion is
/// graceful (the pod stays, terminating, for now): what a cache must show before it may be
/// trusted about the pod again.
pub async fn delete(pods: &Api<Pod>, name: &str) -> Result<Option<String>, kube::Error> {
    match pods.delete(name, &DeleteParams::default()).await {
        // The pod itself while it terminates; a Status once it is gone.
        Ok(answer) => Ok(answer.left().and_then(|p| p.metadata.resource_version)),
        Err(kube::Error::Api(status)) if status.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}

/// Move a pod to `to` as a compare-and-swap on its resourceVersion: a concurrent claim wins
/// (and this is a no-op).
pub async fn mark(pods: &Api<Pod>, pod: &Pod, to: PodState) -> Result<(), kube::Error> {
    let patch = state_mark_patch(pod.resource_version(), to);
    match pods
        .patch(
            &pod.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.is_conflict() => Ok(()),
        Err(e) => Err(e),
    }
}

/// Create a sandbox pod (a pool's or a `poolTemplate` job's), then its control-token Secret
/// owned by it, and remember the token for deliveries. Returns the created pod.
pub async fn create_with_control_secret(
    client: &Client,
    tokens: &crate::tokens::ControlTokens,
    pod: &Pod,
    label: (&str, &str),
) -> Result<Pod, kube::Error> {
    let ns = pod.namespace().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let created = pods.create(&PostParams::default(), pod).await?;
    let token = new_control_token();
    tokens.remember(&ns, &created.name_any(), &token);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    secrets
        .create(
            &PostParams::default(),
            &control_secret(&created, label, &token),
        )
        .await?;
    Ok(created)
}
