//! `floe operator`: the controllers, wired to the apiserver. Today: GatewayPool (the warm pool);
//! RolloutJob is next (see the operator issue).

use std::sync::Arc;

use floe_crds::gateway_pool::GatewayPool;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::{watcher, Controller};
use kube::{Api, Client};

use crate::pool_controller::{error_policy, reconcile, PoolContext};

pub struct OperatorConfig {
    /// Watch one namespace, or all when `None`.
    pub namespace: Option<String>,
    pub floe_image: String,
    pub native_sidecars: bool,
    /// Reconciles of one controller running at once.
    pub concurrency: u16,
}

/// Run until SIGTERM/Ctrl-C (in-flight reconciles finish first).
pub async fn run(client: Client, config: OperatorConfig) {
    let (pools, pods): (Api<GatewayPool>, Api<Pod>) = match &config.namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    let context = Arc::new(PoolContext::new(
        client,
        config.floe_image,
        config.native_sidecars,
    ));
    tracing::info!(namespace = ?config.namespace, "floe operator started");
    Controller::new(pools, watcher::Config::default())
        .owns(
            pods,
            watcher::Config::default().labels("app.kubernetes.io/managed-by=floe"),
        )
        .with_config(kube::runtime::controller::Config::default().concurrency(config.concurrency))
        .shutdown_on_signal()
        .run(reconcile, error_policy, context)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!("reconcile: {e}");
            }
        })
        .await;
    tracing::info!("floe operator stopped");
}
