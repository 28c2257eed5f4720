//! The operator's two apiserver clients.

use std::time::Duration;

use kube::client::ClientBuilder;
use kube::Client;

use crate::client_rate::RateLimit;
use crate::lease_fence::{Fence, LeaseValidity};

/// The controllers' client (rate-limited, its writes fenced by `validity`) and the lease's own
/// (neither: a renewal queued behind a burst of claims would cost the lease, and the lease is
/// what the fence reads).
///
/// The controllers' client has no retry of kube's own: that layer sits below every layer added
/// here, so a write the fence let through would be sent again, unfenced, for minutes after the
/// lease was lost (15 tries, following `Retry-After`). A call the apiserver throttles or fails
/// fails the round instead, which is requeued ([`crate::api_call`] counts 429 and 5xx as worth
/// retrying). `connect_within`, under election a third of the lease's duration, bounds a new
/// connection's wait below the fence.
pub fn operator_clients(
    config: kube::Config,
    limit: RateLimit,
    validity: &LeaseValidity,
    connect_within: Option<Duration>,
) -> Result<(Client, Client), kube::Error> {
    let lease = ClientBuilder::try_from(config.clone())?.build();
    let mut config = config;
    config.default_retry = false;
    if let Some(within) = connect_within {
        config.connect_timeout = Some(config.connect_timeout.map_or(within, |t| t.min(within)));
    }
    // The fence above the rate limit: checked when a request goes, after any wait for a token.
    let controllers = ClientBuilder::try_from(config)?
        .with_layer(&limit)
        .with_layer(&Fence(validity.clone()))
        .build();
    Ok((controllers, lease))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// A write the apiserver throttles is not sent again by the controllers' client (kube's
    /// retry, below the fence, would send it unfenced after the lease was lost); the lease's
    /// own client keeps kube's retry.
    #[tokio::test]
    async fn the_controllers_client_sends_a_throttled_write_once() {
        let posts = Arc::new(AtomicUsize::new(0));
        let counted = posts.clone();
        let app = axum::Router::new().route(
            "/api/v1/namespaces/ns/configmaps",
            axum::routing::post(move || {
                counted.fetch_add(1, Ordering::SeqCst);
                async { crate::stand_in_apiserver::status(429, "TooManyRequests", "slow down") }
            }),
        );
        let config = crate::stand_in_apiserver::config_of(app).await;
        let validity = LeaseValidity::elected();
        validity.renewed(tokio::time::Instant::now(), Duration::from_secs(60));
        let limit = RateLimit { qps: 0.0, burst: 1 };
        let (controllers, lease) =
            operator_clients(config, limit, &validity, Some(Duration::from_secs(5)))
                .expect("clients");
        let map: k8s_openapi::api::core::v1::ConfigMap =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "m"}})).expect("a map");
        let post = kube::api::PostParams::default();
        let fenced: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
            kube::Api::namespaced(controllers, "ns");
        assert!(fenced.create(&post, &map).await.is_err());
        assert_eq!(posts.swap(0, Ordering::SeqCst), 1, "sent once");
        let own: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
            kube::Api::namespaced(lease, "ns");
        let _ = tokio::time::timeout(Duration::from_secs(2), own.create(&post, &map)).await;
        assert!(
            posts.load(Ordering::SeqCst) > 1,
            "the lease's client retries"
        );
    }
}
