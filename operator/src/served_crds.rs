//! The floe CRDs the cluster serves, read every half minute and compared with the ones this
//! operator was built with. A CRD older than the operator (the chart's `crds.install=false`
//! with CRDs kept elsewhere, or an operator image bumped alone) prunes the fields it lacks
//! from every object written through it, silently: a job's `failureReward: -1` would score
//! failures 0, a pool's `egress.unrestricted: Refuse` would only warn. Objects that carry
//! `kubectl apply`'s record are checked field by field
//! ([`crate::spec_check::dropped_by_an_older_crd`]); the others (server-side apply, as Flux
//! does; Helm; an API client) carry none, and are stalled when written through such a CRD
//! ([`crate::spec_check::written_through_an_older_crd`]). Either way the gap is exported
//! (`floe_crd_missing_fields`, alert `FloeCrdOutdated`) and logged.

use std::collections::BTreeMap;
use std::sync::RwLock;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::jiff::Timestamp;
use kube::{Api, Client, CustomResourceExt};

use crate::metrics::Metrics;
use floe_crds::{GatewayPool, RolloutJob};

/// How often the served CRDs are read: a CRD upgrade lifts the stalls within this.
pub const READ_EVERY: Duration = Duration::from_secs(30);

/// A served CRD that lacks fields this operator knows.
#[derive(Clone, Debug, PartialEq)]
pub struct Outdated {
    /// The fields, as paths (`spec.evaluator.reward.failureReward`).
    pub lacking: Vec<String>,
    /// When the served schema was written (its last `spec` write): objects written since
    /// went through it.
    pub written: Option<Timestamp>,
}

/// What the last read found, per kind (`GatewayPool`, `RolloutJob`); a kind not there was
/// up to date, or could not be read (then nothing is stalled for it: the check never stops
/// an operator that may not read CRDs).
#[derive(Default)]
pub struct ServedCrds {
    outdated: RwLock<BTreeMap<String, Outdated>>,
    /// The last error per CRD, so each is logged once, not every half minute.
    errors: RwLock<BTreeMap<String, String>>,
}

impl ServedCrds {
    /// The served CRD of `kind`, if it was read and lacks fields.
    pub fn outdated(&self, kind: &str) -> Option<Outdated> {
        floe_gateway::sync::read(&self.outdated).get(kind).cloned()
    }

    /// Read both CRDs once: the verdicts, the metric, a log line when one changes.
    pub async fn read(&self, client: &Client, metrics: &Metrics) {
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        for (kind, name) in [
            ("GatewayPool", GatewayPool::crd_name()),
            ("RolloutJob", RolloutJob::crd_name()),
        ] {
            let verdict = match crds.get(name).await {
                Ok(served) => {
                    floe_gateway::sync::write(&self.errors).remove(name);
                    let lacking = floe_crds::served_schema::fields_it_lacks(kind, &served);
                    metrics.set_crd_missing_fields(name, Some(lacking.len()));
                    (!lacking.is_empty()).then(|| Outdated {
                        lacking,
                        written: floe_crds::served_schema::spec_written(&served.metadata),
                    })
                }
                Err(e) => {
                    let e = e.to_string();
                    let mut errors = floe_gateway::sync::write(&self.errors);
                    if errors.get(name) != Some(&e) {
                        tracing::warn!(
                            crd = name,
                            "cannot read the served CRD, so objects written through an older \
                             one without `kubectl apply`'s record are not caught: {e}"
                        );
                        errors.insert(name.to_string(), e);
                    }
                    metrics.set_crd_missing_fields(name, None);
                    None
                }
            };
            self.set(kind, verdict);
        }
    }

    /// The verdict on `kind`'s served CRD (`None`: up to date, or unread), logged when it
    /// changes.
    pub fn set(&self, kind: &str, verdict: Option<Outdated>) {
        let mut outdated = floe_gateway::sync::write(&self.outdated);
        if outdated.get(kind).map(|o| &o.lacking) != verdict.as_ref().map(|o| &o.lacking) {
            match &verdict {
                Some(o) => tracing::warn!(
                    kind,
                    lacking = %o.lacking.join(", "),
                    "the CRD on the cluster is older than this operator: apply the new CRDs \
                     (`floe crds | kubectl apply -f -`)"
                ),
                None => tracing::info!(kind, "the CRD on the cluster lacks nothing known"),
            }
        }
        match verdict {
            Some(o) => outdated.insert(kind.to_string(), o),
            None => outdated.remove(kind),
        };
    }
}

/// Read the served CRDs every [`READ_EVERY`], for as long as the controllers run.
pub async fn keep_reading(
    client: Client,
    served: std::sync::Arc<ServedCrds>,
    metrics: std::sync::Arc<Metrics>,
) {
    loop {
        tokio::time::sleep(READ_EVERY).await;
        served.read(&client, &metrics).await;
    }
}
