//! The pod writes both controllers make: creating a sandbox pod with its control-token
//! Secret, marking its state, deleting it.

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
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

/// Delete an unclaimed pod as the cache last saw it: `false` (and nothing deleted) when it
/// has changed since, a job's claim perhaps (claims are compare-and-swaps on the same
/// resourceVersion), so a pool never deletes a pod a job has just claimed.
pub async fn delete_unclaimed(pods: &Api<Pod>, pod: &Pod) -> Result<bool, kube::Error> {
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            resource_version: pod.metadata.resource_version.clone(),
            uid: pod.metadata.uid.clone(),
        }),
        ..DeleteParams::default()
    };
    match pods.delete(&pod.name_any(), &params).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.is_not_found() => Ok(true),
        Err(kube::Error::Api(status)) if status.is_conflict() => Ok(false),
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
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    if let Err(e) = make_control_secret(&secrets, tokens, &created, label).await {
        // A pod whose Secret was never made waits for its volume for ever (ContainerCreating
        // is progress, never a start failure, and holds a session's place): it goes with the
        // error, and the next round makes both again.
        if let Err(gone) = delete(&pods, &created.name_any()).await {
            tracing::warn!(pod = %created.name_any(), "deleting a pod without its control Secret: {gone}");
        }
        return Err(e);
    }
    Ok(created)
}

/// Give a pod made by another operator process its control Secret when it has none: that
/// process died between creating the pod and its Secret, and the pod waits for the Secret's
/// volume for ever. Its gateway has not started, so a new token serves. True when it was
/// made here; a Secret there (or made meanwhile) is left as it is.
pub async fn restore_control_secret(
    client: &Client,
    tokens: &crate::tokens::ControlTokens,
    pod: &Pod,
    label: (&str, &str),
) -> Result<bool, kube::Error> {
    let secrets: Api<Secret> =
        Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
    // One create, no read first: a Secret already there is the apiserver's AlreadyExists.
    match make_control_secret(&secrets, tokens, pod, label).await {
        Ok(()) => Ok(true),
        Err(kube::Error::Api(status)) if status.is_already_exists() || status.is_conflict() => {
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

/// A new control token in the pod's Secret (owned by the pod), remembered for deliveries.
async fn make_control_secret(
    secrets: &Api<Secret>,
    tokens: &crate::tokens::ControlTokens,
    pod: &Pod,
    label: (&str, &str),
) -> Result<(), kube::Error> {
    let token = new_control_token();
    secrets
        .create(&PostParams::default(), &control_secret(pod, label, &token))
        .await?;
    tokens.remember(
        &pod.namespace().unwrap_or_default(),
        &pod.name_any(),
        &token,
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in apiserver holding pod `ns/p` at resourceVersion "2", deleting it only when
    /// the request's preconditions name that version, as the real one does.
    async fn apiserver() -> Api<Pod> {
        let app = axum::Router::new().route(
            "/api/v1/namespaces/ns/pods/p",
            axum::routing::delete(|body: axum::body::Bytes| async move {
                let params: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                let rv = &params["preconditions"]["resourceVersion"];
                if rv == "2" {
                    crate::stand_in_apiserver::status(200, "", "")
                } else {
                    crate::stand_in_apiserver::status(
                        409,
                        "Conflict",
                        "the object has been modified",
                    )
                }
            }),
        );
        Api::namespaced(crate::stand_in_apiserver::client_of(app).await, "ns")
    }

    fn seen_at(rv: &str) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.name = Some("p".into());
        pod.metadata.resource_version = Some(rv.into());
        pod
    }

    /// A quota refuses the control Secret: the pod made for it is deleted, not left waiting
    /// for a volume that never comes.
    #[tokio::test]
    async fn a_pod_whose_control_secret_is_refused_goes_too() {
        let deleted = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let seen = deleted.clone();
        let app = axum::Router::new()
            .route(
                "/api/v1/namespaces/ns/pods",
                axum::routing::post(
                    |axum::Json(mut pod): axum::Json<serde_json::Value>| async move {
                        pod["metadata"]["uid"] = "u1".into();
                        pod["metadata"]["resourceVersion"] = "1".into();
                        (axum::http::StatusCode::CREATED, axum::Json(pod))
                    },
                ),
            )
            .route(
                "/api/v1/namespaces/ns/secrets",
                axum::routing::post(|| async {
                    crate::stand_in_apiserver::status(403, "Forbidden", "exceeded quota: secrets")
                }),
            )
            .route(
                "/api/v1/namespaces/ns/pods/{name}",
                axum::routing::delete(
                    move |axum::extract::Path(name): axum::extract::Path<String>| async move {
                        seen.lock().map(|mut d| d.push(name)).ok();
                        crate::stand_in_apiserver::status(200, "", "")
                    },
                ),
            );
        let client = crate::stand_in_apiserver::client_of(app).await;
        let mut pod = Pod::default();
        pod.metadata.name = Some("p".into());
        pod.metadata.namespace = Some("ns".into());
        let tokens = crate::tokens::ControlTokens::default();
        let made = create_with_control_secret(&client, &tokens, &pod, ("floe.dev/pool", "w")).await;
        assert!(made.is_err(), "the Secret's refusal is the caller's error");
        assert_eq!(deleted.lock().map(|d| d.clone()).unwrap_or_default(), ["p"]);
    }

    /// A pool's cache showed the pod READY at "1"; a job's claim has since moved it to "2":
    /// the pool's delete is refused and the claimed pod stays. As cached now, it goes.
    #[tokio::test]
    async fn a_pod_claimed_since_the_cache_saw_it_is_not_deleted() {
        let pods = apiserver().await;
        assert!(!delete_unclaimed(&pods, &seen_at("1"))
            .await
            .expect("an answer"));
        assert!(delete_unclaimed(&pods, &seen_at("2"))
            .await
            .expect("an answer"));
    }
}
