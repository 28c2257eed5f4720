//! The floe CRDs the cluster serves, read every half minute and compared with the ones this
//! operator was built with. A CRD older than the operator (the chart's `crds.install=false`
//! with CRDs kept elsewhere, or an operator image bumped alone) has the apiserver prune the
//! fields it lacks from every object it stores or serves, silently: a job's `failureReward:
//! -1` would score failures 0, a pool's `egress.unrestricted: Refuse` would only warn.
//! Objects that carry `kubectl apply`'s record are checked field by field
//! ([`crate::spec_check::dropped_by_an_older_crd`]); the others (server-side apply, as Flux
//! does; Helm; an API client) carry nothing that says what they set, and stall while such a
//! CRD is served ([`crate::spec_check::served_crd_lacks`]). Either way the gap is exported
//! (`floe_crd_missing_fields`, alert `FloeCrdOutdated`) and logged, and a change of verdict
//! wakes both controllers ([`ServedCrds::changes`]).

use std::collections::BTreeMap;
use std::sync::RwLock;
use std::time::Duration;

use futures::Stream;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{Api, Client, CustomResourceExt};

use crate::metrics::Metrics;
use floe_crds::{GatewayPool, RolloutJob};
use floe_gateway::sync::{read, write};

/// How often the served CRDs are read: a CRD upgrade lifts the stalls within this.
pub const READ_EVERY: Duration = Duration::from_secs(30);

/// What the last read found, per kind (`GatewayPool`, `RolloutJob`): the fields its served CRD
/// lacks (`spec.evaluator.reward.failureReward`, `status.heldOut`); a kind not there lacks
/// nothing, or its CRD may not be read (a single-namespace install): then nothing is stalled
/// for it, since the check must never stop an operator that may not read CRDs.
pub struct ServedCrds {
    lacking: RwLock<BTreeMap<String, Vec<String>>>,
    /// The last error per CRD, so each is logged once, not every half minute.
    errors: RwLock<BTreeMap<String, String>>,
    /// Bumped when a verdict changes.
    changed: tokio::sync::watch::Sender<u64>,
}

impl Default for ServedCrds {
    fn default() -> Self {
        Self {
            lacking: RwLock::default(),
            errors: RwLock::default(),
            changed: tokio::sync::watch::Sender::new(0),
        }
    }
}

impl ServedCrds {
    /// The fields `kind`'s served CRD lacks (empty: none, or it could not be read).
    pub fn lacking(&self, kind: &str) -> Vec<String> {
        read(&self.lacking).get(kind).cloned().unwrap_or_default()
    }

    /// One item each time a verdict changes: for `Controller::reconcile_all_on`, so that a CRD
    /// upgrade lifts the stalls at once, not at each object's next requeue.
    pub fn changes(&self) -> impl Stream<Item = ()> + Send + 'static {
        futures::stream::unfold(self.changed.subscribe(), |mut rx| async move {
            rx.changed().await.ok()?;
            Some(((), rx))
        })
    }

    /// Read both CRDs once: the verdicts, the metric, a log line when one changes. A read
    /// that fails keeps the verdict it had (an apiserver's blip must not let a stalled pool
    /// make its pods), but for a CRD this operator may not read or that is not there.
    /// Whether each verdict was had: `false` when a read failed otherwise.
    pub async fn read(&self, client: &Client, metrics: &Metrics) -> bool {
        let mut had = true;
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        for (kind, name) in [
            ("GatewayPool", GatewayPool::crd_name()),
            ("RolloutJob", RolloutJob::crd_name()),
        ] {
            match crds.get(name).await {
                Ok(served) => {
                    write(&self.errors).remove(name);
                    let lacking = floe_crds::served_schema::fields_it_lacks(kind, &served);
                    metrics.set_crd_missing_fields(name, Some(lacking.len()));
                    self.set(kind, lacking);
                }
                Err(e) => {
                    let gone = matches!(&e, kube::Error::Api(s) if s.code == 403 || s.code == 404);
                    let e = e.to_string();
                    if write(&self.errors).insert(name.to_string(), e.clone()) != Some(e.clone()) {
                        let why = if gone {
                            "so an older one is not caught for objects without `kubectl \
                             apply`'s record"
                        } else {
                            "the last verdict holds until it is"
                        };
                        tracing::warn!(crd = name, "cannot read the served CRD, {why}: {e}");
                    }
                    if gone {
                        metrics.set_crd_missing_fields(name, None);
                        self.set(kind, Vec::new());
                    } else {
                        had = false;
                    }
                }
            }
        }
        had
    }

    /// The fields `kind`'s served CRD lacks (empty: none, or unread), logged when they change.
    pub fn set(&self, kind: &str, lacking: Vec<String>) {
        let mut all = write(&self.lacking);
        if all.get(kind).map_or(&[][..], |l| l.as_slice()) == lacking.as_slice() {
            return;
        }
        if lacking.is_empty() {
            tracing::info!(
                kind,
                "the CRD on the cluster lacks nothing this operator knows"
            );
            all.remove(kind);
        } else {
            tracing::warn!(
                kind,
                lacking = %lacking.join(", "),
                "the CRD on the cluster is older than this operator: apply the new CRDs \
                 (`floe crds | kubectl apply -f -`)"
            );
            all.insert(kind.to_string(), lacking);
        }
        drop(all);
        self.changed.send_modify(|n| *n += 1);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU16, Ordering};
    use std::sync::Arc;

    /// A stand-in apiserver that answers both CRDs with `answer`'s status code: 200 with this
    /// code's CRDs, the RolloutJob one without `failureReward`; else a `Status` of that code.
    async fn apiserver(answer: Arc<AtomicU16>) -> Client {
        let crds = floe_crds::generate::crds(floe_crds::generate::Target::LATEST).expect("crds");
        let app = axum::Router::new().route(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}",
            axum::routing::get(
                move |axum::extract::Path(name): axum::extract::Path<String>| {
                    let code = answer.load(Ordering::SeqCst);
                    let crd = crds
                        .iter()
                        .find(|c| c.metadata.name.as_deref() == Some(&name));
                    let mut body = serde_json::to_value(crd).expect("json");
                    if name == RolloutJob::crd_name() {
                        let reward = &mut body["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
                            ["properties"]["spec"]["properties"]["evaluator"]["properties"]
                            ["reward"]["properties"];
                        reward.as_object_mut().map(|r| r.remove("failureReward"));
                    }
                    let answer = if code == 200 {
                        (axum::http::StatusCode::OK, axum::Json(body))
                    } else {
                        crate::stand_in_apiserver::status(code, "x", "no")
                    };
                    async move { answer }
                },
            ),
        );
        crate::stand_in_apiserver::client_of(app).await
    }

    /// A read that fails keeps the verdict and says it has none (the operator's start waits
    /// on that); a CRD it may not read, or that is not there, clears it and counts as had.
    #[tokio::test]
    async fn a_failed_read_keeps_the_verdict_and_says_so() {
        let answer = Arc::new(AtomicU16::new(500));
        let client = apiserver(answer.clone()).await;
        let metrics = Metrics::new().expect("metrics");
        let served = ServedCrds::default();
        assert!(!served.read(&client, &metrics).await);
        assert!(served.lacking("RolloutJob").is_empty());
        answer.store(200, Ordering::SeqCst);
        assert!(served.read(&client, &metrics).await);
        assert_eq!(
            served.lacking("RolloutJob"),
            ["spec.evaluator.reward.failureReward"]
        );
        assert!(served.lacking("GatewayPool").is_empty());
        // (Not 503: the client itself retries that one, for minutes.)
        answer.store(502, Ordering::SeqCst);
        assert!(!served.read(&client, &metrics).await);
        assert_eq!(served.lacking("RolloutJob").len(), 1);
        answer.store(403, Ordering::SeqCst);
        assert!(served.read(&client, &metrics).await);
        assert!(served.lacking("RolloutJob").is_empty());
    }
}
