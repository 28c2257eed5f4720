//! The operator's two apiserver clients.

use kube::client::ClientBuilder;
use kube::Client;

use crate::client_rate::RateLimit;
use crate::lease_fence::{Fence, LeaseValidity};

/// The controllers' client (rate-limited, its writes fenced by `validity`) and the lease's own
/// (neither: a renewal queued behind a burst of claims would cost the lease, and the lease is
/// what the fence reads).
pub fn operator_clients(
    config: kube::Config,
    limit: RateLimit,
    validity: &LeaseValidity,
) -> Result<(Client, Client), kube::Error> {
    let lease = ClientBuilder::try_from(config.clone())?.build();
    // The fence above the rate limit: checked when a request goes, after any wait for a token.
    let controllers = ClientBuilder::try_from(config)?
        .with_layer(&limit)
        .with_layer(&Fence(validity.clone()))
        .build();
    Ok((controllers, lease))
}
