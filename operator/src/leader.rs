//! Leader election on a `coordination.k8s.io/v1` Lease, so several operator replicas can run and
//! exactly one acts. Every write is a compare-and-swap on the Lease's `resourceVersion`: a
//! replica becomes leader only by replacing the version it read, and stays leader only while
//! its renewals keep winning. A leader that stops releases the Lease so another takes over at
//! once; one that dies is replaced when its Lease expires.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

use crate::lease_fence::LeaseValidity;

#[derive(Clone, Debug)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    /// This replica (pod name, or host-pid).
    pub identity: String,
    /// A leader that has not renewed for this long is gone.
    pub duration: Duration,
    /// How often the leader renews and candidates retry.
    pub renew_every: Duration,
}

/// Leader election as `floe operator` runs it.
#[derive(Clone)]
pub struct Election {
    pub lease: LeaseConfig,
    /// The lease's own client (see [`Leader::new`]).
    pub client: Client,
    /// Shared with the [`crate::lease_fence::Fence`] of the controllers' client.
    pub validity: LeaseValidity,
}

pub struct Leader {
    api: Api<Lease>,
    config: LeaseConfig,
    /// Extended on each renewal won, read by the controllers' write fence.
    validity: LeaseValidity,
}

/// Sans-IO: may `me` take a lease held as `spec`, at `now`?
pub fn may_take(spec: Option<&LeaseSpec>, me: &str, now: Timestamp) -> bool {
    let Some(spec) = spec else { return true };
    let holder = spec.holder_identity.as_deref().unwrap_or("");
    if holder.is_empty() || holder == me {
        return true;
    }
    let duration = i64::from(spec.lease_duration_seconds.unwrap_or(0));
    match &spec.renew_time {
        Some(renewed) => now.as_second() > renewed.0.as_second() + duration,
        None => true,
    }
}

impl Leader {
    /// `client` should be one of the lease's own: neither rate-limited behind the controllers'
    /// requests nor fenced (see [`crate::lease_fence`]).
    pub fn new(client: Client, config: LeaseConfig, validity: LeaseValidity) -> Self {
        Self {
            api: Api::namespaced(client, &config.namespace),
            config,
            validity,
        }
    }

    fn spec(&self, previous: Option<&LeaseSpec>, now: Timestamp) -> LeaseSpec {
        let ours =
            previous.and_then(|s| s.holder_identity.as_deref()) == Some(&self.config.identity);
        let transitions = previous.and_then(|s| s.lease_transitions).unwrap_or(0);
        LeaseSpec {
            holder_identity: Some(self.config.identity.clone()),
            lease_duration_seconds: Some(self.config.duration.as_secs() as i32),
            acquire_time: if ours {
                previous.and_then(|s| s.acquire_time.clone())
            } else {
                Some(MicroTime(now))
            },
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(if ours || previous.is_none() {
                transitions
            } else {
                transitions + 1
            }),
            ..Default::default()
        }
    }

    /// One attempt to take or keep the lease. `Ok(true)`: we hold it now.
    pub async fn try_hold(&self) -> Result<bool, kube::Error> {
        // As of when this attempt started: the Lease it writes says `renewTime` is then.
        let sent = tokio::time::Instant::now();
        let held = self.write_hold(Timestamp::now()).await;
        if let Ok(true) = held {
            self.validity.renewed(sent, self.renew_deadline());
        }
        held
    }

    async fn write_hold(&self, now: Timestamp) -> Result<bool, kube::Error> {
        match self.api.get_opt(&self.config.name).await? {
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.config.name.clone()),
                        namespace: Some(self.config.namespace.clone()),
                        ..Default::default()
                    },
                    spec: Some(self.spec(None, now)),
                };
                match self.api.create(&PostParams::default(), &lease).await {
                    Ok(_) => Ok(true),
                    Err(kube::Error::Api(s)) if s.is_conflict() || s.code == 409 => Ok(false),
                    Err(e) => Err(e),
                }
            }
            Some(mut lease) => {
                if !may_take(lease.spec.as_ref(), &self.config.identity, now) {
                    return Ok(false);
                }
                lease.spec = Some(self.spec(lease.spec.as_ref(), now));
                // `replace` sends the resourceVersion we read: a concurrent writer makes it 409.
                match self
                    .api
                    .replace(&self.config.name, &PostParams::default(), &lease)
                    .await
                {
                    Ok(_) => Ok(true),
                    Err(kube::Error::Api(s)) if s.is_conflict() => Ok(false),
                    Err(e) => Err(e),
                }
            }
        }
    }

    /// Wait until this replica is the leader.
    pub async fn acquire(&self) {
        loop {
            match self.try_hold().await {
                Ok(true) => {
                    tracing::info!(identity = %self.config.identity, lease = %self.config.name, "became the leader");
                    return;
                }
                Ok(false) => {}
                Err(e) => tracing::warn!("leader election: {e}"),
            }
            tokio::time::sleep(self.config.renew_every).await;
        }
    }

    /// How long a leader goes on without a renewal: two thirds of the lease (client-go's 10 s
    /// of 15), so that it has stopped (its controllers' rounds in flight ending) before the
    /// lease expires and another replica may take it.
    pub fn renew_deadline(&self) -> Duration {
        self.config.duration * 2 / 3
    }

    /// How soon a failed renewal is tried again: several tries fit before the deadline
    /// (client-go retries every 2 s within its 10), so one apiserver hiccup is not a step-down.
    fn retry_every(&self) -> Duration {
        (self.config.duration / 15).max(Duration::from_millis(100))
    }

    /// Renew until a renewal is lost (another replica took over, or none succeeded within
    /// [`Self::renew_deadline`]: an apiserver unreachable, or a call that never answers, which
    /// is given only the time left); then return.
    pub async fn keep(&self) {
        let deadline = self.renew_deadline();
        // From when a renewal was sent: its `renewTime` is then, whenever the answer came.
        let mut last_renewal = tokio::time::Instant::now();
        let mut wait = self.config.renew_every;
        loop {
            tokio::time::sleep(wait).await;
            let sent = tokio::time::Instant::now();
            let left = deadline.saturating_sub(last_renewal.elapsed());
            wait = self.retry_every();
            match tokio::time::timeout(left, self.try_hold()).await {
                Ok(Ok(true)) => {
                    last_renewal = sent;
                    wait = self.config.renew_every;
                }
                Ok(Ok(false)) => {
                    tracing::warn!("lost the lease to another replica");
                    self.validity.revoked();
                    return;
                }
                Ok(Err(e)) => tracing::warn!("renewing the lease: {e}"),
                Err(_) => tracing::warn!("renewing the lease: no answer in time"),
            }
            if last_renewal.elapsed() >= deadline {
                tracing::warn!(
                    "no renewal of the lease for {} s: stepping down before it expires",
                    deadline.as_secs_f64()
                );
                self.validity.revoked();
                return;
            }
        }
    }

    /// Give the lease up (on shutdown), so another replica takes over without waiting for it
    /// to expire.
    pub async fn release(&self) {
        // No write of the controllers goes once this replica gives the lease up.
        self.validity.revoked();
        let name = &self.config.name;
        // Said when it fails (an uninstall that removed the operator's RBAC first, say): the
        // next leader then waits for the lease to expire.
        let failed = |e: kube::Error| {
            tracing::warn!(
                "could not release the lease {name}: {e}; another replica takes over when it expires ({} s)",
                self.config.duration.as_secs()
            )
        };
        let mut lease = match self.api.get_opt(name).await {
            Ok(Some(lease)) => lease,
            Ok(None) => return,
            Err(e) => return failed(e),
        };
        let held = lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref())
            == Some(&self.config.identity);
        if !held {
            return;
        }
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = None;
            spec.renew_time = None;
        }
        match self.api.replace(name, &PostParams::default(), &lease).await {
            Ok(_) => tracing::info!("released the lease {name}"),
            Err(e) => failed(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Replica "me" of lease `ns/l` on a stand-in apiserver, renewing every third of
    /// `duration`, as `floe operator` does.
    async fn leader_of(app: axum::Router, duration: Duration) -> Leader {
        let client = crate::stand_in_apiserver::client_of(app).await;
        Leader::new(
            client,
            LeaseConfig {
                namespace: "ns".into(),
                name: "l".into(),
                identity: "me".into(),
                duration,
                renew_every: duration / 3,
            },
            LeaseValidity::elected(),
        )
    }

    /// One renewal fails (an apiserver restarting): it is tried again soon, and the leader
    /// stays leader.
    #[tokio::test]
    async fn one_failed_renewal_is_tried_again_not_a_step_down() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let reads = std::sync::Arc::new(AtomicUsize::new(0));
        let counted = reads.clone();
        let lease = |now: Timestamp| {
            serde_json::json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": "l", "namespace": "ns", "resourceVersion": "1"},
                "spec": {"holderIdentity": "me", "leaseDurationSeconds": 3,
                    "renewTime": MicroTime(now)}})
        };
        let path = "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l";
        let app =
            axum::Router::new().route(
                path,
                axum::routing::get(move || {
                    let n = counted.fetch_add(1, Ordering::SeqCst);
                    async move {
                        if n == 0 {
                            crate::stand_in_apiserver::status(
                                503,
                                "ServiceUnavailable",
                                "restarting",
                            )
                        } else {
                            (
                                axum::http::StatusCode::OK,
                                axum::Json(lease(Timestamp::now())),
                            )
                        }
                    }
                })
                .put(
                    move |axum::Json(body): axum::Json<serde_json::Value>| async move {
                        axum::Json(body)
                    },
                ),
            );
        let leader = leader_of(app, Duration::from_secs(3)).await;
        // Past the deadline a single try would leave (2 s): still leader.
        let kept = tokio::time::timeout(Duration::from_secs(4), leader.keep()).await;
        assert!(kept.is_err(), "stepped down after one failed renewal");
        assert!(
            reads.load(Ordering::SeqCst) >= 3,
            "tried again, then renewed"
        );
        assert!(
            leader.validity.holds(tokio::time::Instant::now()),
            "the renewal let the controllers write"
        );
    }

    /// The apiserver stops answering (a dead connection, no read timeout): the leader steps
    /// down within its renew deadline, before the lease could pass to another replica.
    #[tokio::test]
    async fn a_leader_whose_renewals_hang_steps_down_before_the_lease_expires() {
        let app = axum::Router::new().route(
            "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l",
            axum::routing::get(std::future::pending::<String>),
        );
        let duration = Duration::from_secs(6);
        let leader = leader_of(app, duration).await;
        let t0 = tokio::time::Instant::now();
        // As `acquire` leaves it: held as of now.
        leader.validity.renewed(t0, leader.renew_deadline());
        tokio::time::timeout(duration * 4, leader.keep())
            .await
            .expect("it stepped down");
        let took = t0.elapsed();
        assert!(
            took >= leader.renew_deadline() && took < duration,
            "stepped down after {took:?}"
        );
        assert!(!leader.validity.holds(tokio::time::Instant::now()));
    }

    fn held(by: &str, renewed_at: i64, duration: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(by.into()),
            lease_duration_seconds: Some(duration),
            renew_time: Some(MicroTime(
                Timestamp::from_second(renewed_at).unwrap_or_default(),
            )),
            ..Default::default()
        }
    }

    #[test]
    fn who_may_take_the_lease() {
        let now = Timestamp::from_second(1_000).unwrap_or_default();
        assert!(may_take(None, "a", now), "no lease yet");
        assert!(may_take(Some(&held("a", 999, 15)), "a", now), "our own");
        assert!(
            !may_take(Some(&held("b", 990, 15)), "a", now),
            "b renewed 10 s ago"
        );
        assert!(
            may_take(Some(&held("b", 980, 15)), "a", now),
            "b expired 5 s ago"
        );
        assert!(may_take(Some(&LeaseSpec::default()), "a", now), "released");
    }
}
