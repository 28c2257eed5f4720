//! `floe operator`: the controllers, wired to the apiserver, behind leader election when
//! several replicas run: GatewayPool (the warm pool) and RolloutJob (sessions on claimed pods).

use std::sync::Arc;

use floe_crds::gateway_pool::GatewayPool;
use floe_crds::rollout_job::RolloutJob;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::{watcher, Controller};
use kube::{Api, Client, ResourceExt};

use crate::leader::{Election, Leader};
use crate::metrics::Metrics;
use crate::pool::{error_policy, reconcile, PoolContext};
use crate::rollout::controller as job_controller;

/// How long pool pods claimed while a job's own pod starts may wait for it (`--claim-while-starting-limit`).
pub use crate::rollout::controller::DEFAULT_EARLY_CLAIM_LIMIT;

pub struct OperatorConfig {
    /// Watch one namespace, or all when `None`.
    pub namespace: Option<String>,
    pub floe_image: String,
    pub native_sidecars: bool,
    /// Reconciles of one controller running at once.
    pub concurrency: u16,
    /// Apiserver writes and gateway deliveries of one job's reconcile round in flight at once.
    pub round_parallelism: usize,
    /// Claim pool pods for a job's sessions while its trainer or collector pod is starting,
    /// holding them at most this long; `None` claims only once it is Ready.
    pub claim_while_starting: Option<std::time::Duration>,
    /// Leader election; `None` runs unconditionally (a single replica). Under election the
    /// client given to [`run`] should carry its [`crate::lease_fence::Fence`].
    pub leader: Option<Election>,
    /// `/metrics`, `/healthz`, `/readyz` are served here.
    pub metrics_listen: Option<std::net::SocketAddr>,
}

/// The operator's HTTP endpoints: Prometheus metrics and health probes.
async fn serve_metrics(addr: std::net::SocketAddr, metrics: Arc<Metrics>) {
    use axum::routing::get;
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let metrics = metrics.clone();
                async move { metrics.render() }
            }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(|| async { "ok" }));
    match tokio::net::TcpListener::bind(addr).await {
        Ok(listener) => {
            tracing::info!(%addr, "metrics listening");
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!("metrics server: {e}");
            }
        }
        Err(e) => tracing::error!(%addr, "cannot serve metrics: {e}"),
    }
}

/// SIGTERM (pod deletion) or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = ctrl_c => {},
                _ = term.recv() => {},
            }
        }
        Err(_) => {
            let _ = ctrl_c.await;
        }
    }
}

/// Why the controllers stopped.
enum Stop {
    Signal,
    LostLease,
}

/// Run until SIGTERM/Ctrl-C (in-flight reconciles finish first). With leader election, the
/// controllers run only while this replica holds the lease; losing it stops them and this
/// replica campaigns again.
pub async fn run(client: Client, config: OperatorConfig) {
    let metrics = match Metrics::new() {
        Ok(m) => Arc::new(m),
        Err(e) => {
            tracing::error!("metrics: {e}");
            return;
        }
    };
    if let Some(addr) = config.metrics_listen {
        tokio::spawn(serve_metrics(addr, metrics.clone()));
    }
    let leader = config
        .leader
        .clone()
        .map(|e| Arc::new(Leader::new(e.client, e.lease, e.validity)));
    let signal = Arc::new(tokio::sync::Notify::new());
    {
        let signal = signal.clone();
        tokio::spawn(async move {
            shutdown_signal().await;
            signal.notify_waiters();
            signal.notify_one();
        });
    }
    loop {
        if let Some(l) = &leader {
            tokio::select! {
                _ = l.acquire() => {},
                _ = signal.notified() => return,
            }
        }
        // The lease keeper runs in its own task (kube's futures are not Sync, the controller's
        // shutdown trigger must be); it says why through `why` and stops the controllers
        // through `stop`. Stopped by a signal, it renews on while the rounds under way finish
        // (their writes are fenced by the lease), until `drained`.
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (why_tx, why_rx) = tokio::sync::oneshot::channel::<Stop>();
        let drained = Arc::new(tokio::sync::Notify::new());
        let keeper = {
            let leader = leader.clone();
            let signal = signal.clone();
            let drained = drained.clone();
            tokio::spawn(async move {
                let Some(l) = leader else {
                    signal.notified().await;
                    let _ = why_tx.send(Stop::Signal);
                    let _ = stop_tx.send(());
                    return;
                };
                let keep = l.keep();
                tokio::pin!(keep);
                let why = tokio::select! {
                    _ = &mut keep => Stop::LostLease,
                    _ = signal.notified() => Stop::Signal,
                };
                let draining = matches!(why, Stop::Signal);
                let _ = why_tx.send(why);
                let _ = stop_tx.send(());
                if draining {
                    tokio::select! {
                        _ = &mut keep => {},
                        _ = drained.notified() => {},
                    }
                }
            })
        };
        metrics.set_leader(true);
        run_controllers(client.clone(), &config, metrics.clone(), async move {
            let _ = stop_rx.await;
        })
        .await;
        // No renewal in flight once the keeper has ended: `release` must not race one.
        drained.notify_one();
        let _ = keeper.await;
        metrics.set_leader(false);
        metrics.forget_objects();
        match why_rx.await {
            Ok(Stop::LostLease) => continue,
            _ => {
                if let Some(l) = &leader {
                    l.release().await;
                }
                tracing::info!("floe operator stopped");
                return;
            }
        }
    }
}

async fn run_controllers(
    client: Client,
    config: &OperatorConfig,
    metrics: Arc<Metrics>,
    stop: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let (pools, jobs, pods): (Api<GatewayPool>, Api<RolloutJob>, Api<Pod>) = match &config.namespace
    {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        ),
        None => (
            Api::all(client.clone()),
            Api::all(client.clone()),
            Api::all(client.clone()),
        ),
    };
    // One slim pod cache and one pod watch for both controllers; they start once it holds
    // the whole current state (an empty cache would make the pool create its pods again).
    let cache = crate::pod_cache::start(pods);
    if cache.store.wait_until_ready().await.is_err() {
        tracing::error!("the pod cache never became ready");
        return;
    }
    // The served CRDs, read before the first round so that none acts on an object an older
    // CRD cut short: again until each is read (or may not be, or is not there), since a
    // verdict not yet had would let every object without a record run unchecked.
    let served_crds = Arc::new(crate::served_crds::ServedCrds::default());
    let mut wait = std::time::Duration::from_secs(1);
    while !served_crds.read(&client, &metrics).await {
        tracing::warn!(
            "the served CRDs could not be read; the controllers start once they are (again in \
             {wait:?})"
        );
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(crate::served_crds::READ_EVERY);
    }
    let crd_reads = tokio::spawn(crate::served_crds::keep_reading(
        client.clone(),
        served_crds.clone(),
        metrics.clone(),
    ));
    let shared = Arc::new(crate::shared::Shared::new(
        client,
        cache.store.clone(),
        metrics.clone(),
        config.floe_image.clone(),
        config.native_sidecars,
        served_crds.clone(),
    ));
    let pool_context = Arc::new(PoolContext::new(shared.clone()));
    // The pool controller's own cache of pools is the job controller's too.
    let pool_controller = Controller::new(pools, watcher::Config::default());
    let prune = tokio::spawn(forget_deleted_pools(
        pool_controller.store(),
        metrics.clone(),
        pool_context.clone(),
    ));
    let job_context = Arc::new(
        job_controller::JobContext::new(shared, config.round_parallelism)
            .with_claim_while_starting(config.claim_while_starting)
            .with_pool_cache(pool_controller.store()),
    );
    let controller_config =
        kube::runtime::controller::Config::default().concurrency(config.concurrency);
    // Both controllers stop together: one shutdown signal, shared.
    let stop = futures::future::FutureExt::shared(Box::pin(stop));
    tracing::info!(namespace = ?config.namespace, "controllers started");
    let pool_runs = pool_controller
        .reconcile_on(crate::pod_cache::stream(cache.pools))
        .reconcile_all_on(served_crds.changes())
        .with_config(controller_config.clone())
        .graceful_shutdown_on(stop.clone())
        .run(reconcile, error_policy, pool_context)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!("pool reconcile: {e}");
            }
        });
    let job_runs = Controller::new(jobs, watcher::Config::default())
        .reconcile_on(crate::pod_cache::stream(cache.jobs))
        .reconcile_all_on(served_crds.changes())
        .with_config(controller_config)
        .graceful_shutdown_on(stop)
        .run(
            job_controller::reconcile,
            job_controller::error_policy,
            job_context,
        )
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!("job reconcile: {e}");
            }
        });
    futures::join!(pool_runs, job_runs);
    prune.abort();
    crd_reads.abort();
    // Ended before the caller drops this replica's series: a read still in flight would
    // leave a frozen one on a standby, and `FloeCrdOutdated` takes the max over replicas.
    let _ = crd_reads.await;
    cache.task.abort();
    tracing::info!("controllers stopped");
}

/// Pools have no finalizer, so no reconcile sees one deleted: every half minute, the series of
/// pools no longer in the cache go (a deleted blocked pool must not page forever). The first
/// sweep comes 30 s after start, long after the cache's first list. (Not gated on the store's
/// `wait_until_ready`: with kube-runtime 5.0 it never resolved for the controller's store,
/// though the store filled.)
async fn forget_deleted_pools(
    pools: kube::runtime::reflector::Store<GatewayPool>,
    metrics: Arc<Metrics>,
    context: Arc<PoolContext>,
) {
    loop {
        tokio::time::sleep(std::time::Duration::from_secs(30)).await;
        let live: std::collections::BTreeSet<(String, String)> = pools
            .state()
            .iter()
            .map(|p| (p.namespace().unwrap_or_default(), p.name_any()))
            .collect();
        metrics.forget_pools_except(&live);
        context.forget_pools_except(
            &live
                .iter()
                .map(|(ns, name)| format!("{ns}/{name}"))
                .collect(),
        );
    }
}
