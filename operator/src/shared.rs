//! What both controllers share, built once per operator process (`run.rs`): each controller's
//! context holds it and adds what only that controller keeps.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::Store;
use kube::Client;

use crate::claim_gate::ClaimGate;
use crate::events::Events;
use crate::metrics::Metrics;
use crate::served_crds::ServedCrds;
use crate::tokens::ControlTokens;

pub struct Shared {
    pub client: Client,
    /// The slim pod cache ([`crate::pod_cache`]): pools read their pods from it, jobs their
    /// READY candidates and (once it caught up with their writes) their own pods.
    pub pods: Store<Pod>,
    /// Sandbox pods' control tokens, remembered when made or first read.
    pub tokens: Arc<ControlTokens>,
    pub metrics: Arc<Metrics>,
    /// The image with the `floe` binary (init copy, gateway sidecar, collector, task loader).
    pub floe_image: String,
    /// Sandbox pods get the gateway as a native sidecar (Kubernetes ≥ 1.29).
    pub native_sidecars: bool,
    pub events: Events,
    /// Held while a job's round claims; pools' refills wait for it ([`crate::claim_gate`]).
    pub claims: Arc<ClaimGate>,
    /// The floe CRDs the cluster serves, as last read ([`crate::served_crds`]).
    pub served_crds: Arc<ServedCrds>,
}

impl Shared {
    pub fn new(
        client: Client,
        pods: Store<Pod>,
        metrics: Arc<Metrics>,
        floe_image: String,
        native_sidecars: bool,
        served_crds: Arc<ServedCrds>,
    ) -> Self {
        Self {
            events: Events::new(client.clone()),
            client,
            pods,
            tokens: Arc::default(),
            metrics,
            floe_image,
            native_sidecars,
            claims: Arc::default(),
            served_crds,
        }
    }
}
