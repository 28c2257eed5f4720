//! The GatewayPool controller: observe a pool's pods, let [`crate::pool::plan`] decide, carry
//! out the plan (create pods with their control-token Secrets, delete), mark pods whose
//! readiness probe passed as READY, and write the pool's status.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use floe_crds::gateway_pool::{GatewayPool, GatewayPoolStatus};
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference, Time};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::Store;
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;

use crate::pool::{plan, DeleteReason, PoolPod, PoolView};
use crate::sandbox_pod::{self, PodState, SandboxPod, POOL_LABEL, STATE_LABEL};

#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("the pool has no namespace")]
    NoNamespace,
    #[error("cannot build the sandbox pod: {0}")]
    Template(#[from] serde_json::Error),
}

pub struct PoolContext {
    pub client: Client,
    /// The operator's slim pod cache ([`crate::pod_cache`]).
    pub pods: Store<Pod>,
    pub tokens: Arc<crate::tokens::ControlTokens>,
    events: crate::events::Events,
    pub metrics: Arc<crate::metrics::Metrics>,
    /// The image with the `floe` binary (init copy and gateway sidecar).
    pub floe_image: String,
    pub native_sidecars: bool,
    /// Refills wait for claims in flight ([`crate::claim_gate`]).
    pub claims: Arc<crate::claim_gate::ClaimGate>,
    /// Creation times per pool, for the per-minute rate limit.
    created: Mutex<HashMap<String, VecDeque<Instant>>>,
    /// Pods created or deleted but not yet seen so in the cache, per pool: without them a
    /// reconcile right after a burst would see the old count and act twice (the ReplicaSet
    /// controller's "expectations").
    expected: Mutex<HashMap<String, Expected>>,
    /// Pods replaced in a row for not becoming READY, per pool (reset by a READY pod): the
    /// unready timeout backs off with it ([`crate::pod_problem::backed_off_timeout`]).
    unready_failures: Mutex<HashMap<String, u32>>,
    /// The last pod per pool that ended before it was claimed, when, and how many in a row
    /// (reset by a READY pod): replacements back off ([`crate::pod_problem::ended_backoff`]).
    ended: Mutex<HashMap<String, (crate::pod_problem::PodProblem, Instant, u32)>>,
    /// The egress NetworkPolicy last applied per pool (its JSON, `None`: deleted) and when.
    egress_applied: Mutex<HashMap<String, (Option<String>, Instant)>>,
}

/// How often an unchanged egress policy is applied again (restoring one deleted by hand).
const EGRESS_REAPPLY: Duration = Duration::from_secs(60);

#[derive(Default)]
struct Expected {
    creates: HashMap<String, Instant>,
    deletes: HashMap<String, Instant>,
}

/// How long an expectation waits for the cache before it is dropped (a lost event).
const EXPECTATION_TTL: Duration = Duration::from_secs(60);

impl PoolContext {
    pub fn new(
        client: Client,
        pods: Store<Pod>,
        tokens: Arc<crate::tokens::ControlTokens>,
        metrics: Arc<crate::metrics::Metrics>,
        floe_image: String,
        native_sidecars: bool,
        claims: Arc<crate::claim_gate::ClaimGate>,
    ) -> Self {
        Self {
            events: crate::events::Events::new(client.clone()),
            client,
            pods,
            tokens,
            metrics,
            floe_image,
            native_sidecars,
            claims,
            created: Mutex::default(),
            expected: Mutex::default(),
            unready_failures: Mutex::default(),
            egress_applied: Mutex::default(),
            ended: Mutex::default(),
        }
    }

    fn record_ended(&self, key: &str, problem: crate::pod_problem::PodProblem) {
        let mut ended = crate::sync::lock(&self.ended);
        let in_a_row = ended.get(key).map_or(0, |(_, _, n)| *n) + 1;
        ended.insert(key.to_string(), (problem, Instant::now(), in_a_row));
    }

    fn forget_ended(&self, key: &str) {
        let mut ended = crate::sync::lock(&self.ended);
        ended.remove(key);
    }

    /// The last pod that ended unclaimed, its back-off and how much of it is left.
    fn last_ended(
        &self,
        key: &str,
    ) -> Option<(crate::pod_problem::PodProblem, Duration, Duration)> {
        let ended = crate::sync::lock(&self.ended);
        let (problem, at, in_a_row) = ended.get(key)?;
        let backoff = crate::pod_problem::ended_backoff(*in_a_row);
        Some((
            problem.clone(),
            backoff,
            backoff.saturating_sub(at.elapsed()),
        ))
    }

    /// Whether `wanted` for pool `key` was applied within [`EGRESS_REAPPLY`].
    fn egress_fresh(&self, key: &str, wanted: &Option<String>) -> bool {
        let applied = crate::sync::lock(&self.egress_applied);
        applied
            .get(key)
            .is_some_and(|(json, at)| json == wanted && at.elapsed() < EGRESS_REAPPLY)
    }

    fn egress_done(&self, key: &str, applied: Option<String>) {
        let mut map = crate::sync::lock(&self.egress_applied);
        map.insert(key.to_string(), (applied, Instant::now()));
    }

    fn expect(&self, key: &str, pod: &str, create: bool) {
        let mut e = crate::sync::lock(&self.expected);
        let entry = e.entry(key.to_string()).or_default();
        let set = if create {
            &mut entry.creates
        } else {
            &mut entry.deletes
        };
        set.insert(pod.to_string(), Instant::now());
    }

    /// Settle expectations against what the cache shows: (created, not yet seen), (deleted,
    /// still shown).
    fn pending(&self, key: &str, cached: &[Arc<Pod>]) -> (Vec<String>, HashSet<String>) {
        let mut e = crate::sync::lock(&self.expected);
        let entry = e.entry(key.to_string()).or_default();
        // By name once: a burst of expectations against thousands of cached pods stays linear.
        let by_name: HashMap<&str, &Pod> = cached
            .iter()
            .filter_map(|p| Some((p.metadata.name.as_deref()?, p.as_ref())))
            .collect();
        let shown = |name: &str| by_name.get(name).copied();
        entry
            .creates
            .retain(|name, at| at.elapsed() < EXPECTATION_TTL && shown(name).is_none());
        entry.deletes.retain(|name, at| {
            at.elapsed() < EXPECTATION_TTL
                && shown(name).is_some_and(|p| p.metadata.deletion_timestamp.is_none())
        });
        (
            entry.creates.keys().cloned().collect(),
            entry.deletes.keys().cloned().collect(),
        )
    }

    fn unready_failures(&self, key: &str) -> u32 {
        let failures = crate::sync::lock(&self.unready_failures);
        failures.get(key).copied().unwrap_or(0)
    }

    /// `Some(n)`: n more pods replaced for not becoming READY; `None`: a pod became READY.
    fn count_unready(&self, key: &str, more: Option<u32>) {
        let mut failures = crate::sync::lock(&self.unready_failures);
        match more {
            Some(n) => *failures.entry(key.to_string()).or_default() += n,
            None => {
                failures.remove(key);
            }
        }
    }

    fn created_last_minute(&self, key: &str) -> i32 {
        let mut created = crate::sync::lock(&self.created);
        let times = created.entry(key.to_string()).or_default();
        while times
            .front()
            .is_some_and(|t| t.elapsed() > Duration::from_secs(60))
        {
            times.pop_front();
        }
        times.len() as i32
    }

    fn record_created(&self, key: &str) {
        let mut created = crate::sync::lock(&self.created);
        created
            .entry(key.to_string())
            .or_default()
            .push_back(Instant::now());
    }
}

pub fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn state(pod: &Pod) -> Option<&str> {
    pod.labels().get(STATE_LABEL).map(String::as_str)
}

/// An unclaimed pod that can never serve: it ended, or one of its containers did. They never
/// restart (`restartPolicy: Never`), and the grader waits for an agent container that failed
/// to start (a kubelet restarted mid-start says `StartError`) until its dial timeout.
fn finished(pod: &Pod) -> bool {
    let status = pod.status.as_ref();
    matches!(
        status.and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    ) || status
        .and_then(|s| s.container_statuses.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.state.as_ref().is_some_and(|s| s.terminated.is_some()))
        })
}

fn owner(pool: &GatewayPool) -> Option<OwnerReference> {
    pool.controller_owner_ref(&())
}

/// One reconcile, timed and counted under controller-runtime's metric names.
pub async fn reconcile(pool: Arc<GatewayPool>, ctx: Arc<PoolContext>) -> Result<Action, PoolError> {
    let started = Instant::now();
    let result = reconcile_pool(pool, ctx.clone()).await;
    crate::metrics::record_reconcile(
        &ctx.metrics,
        crate::metrics::Kind::GatewayPool,
        started,
        result.is_ok(),
    );
    result
}

async fn reconcile_pool(
    pool: Arc<GatewayPool>,
    ctx: Arc<PoolContext>,
) -> Result<Action, PoolError> {
    let ns = pool.namespace().ok_or(PoolError::NoNamespace)?;
    let name = pool.name_any();
    let key = format!("{ns}/{name}");
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let cached: Vec<Arc<Pod>> = ctx.pods.state_filter(|p| {
        p.metadata.namespace.as_deref() == Some(ns.as_str())
            && p.labels().get(POOL_LABEL) == Some(&name)
    });
    ensure_egress_policy(&ctx, &pool, &ns, &key).await;
    let (creating, deleting) = ctx.pending(&key, &cached);
    let hash = sandbox_pod::template_hash(&pool.spec);
    let now = k8s_openapi::jiff::Timestamp::now();

    let mut unclaimed = Vec::new();
    let mut problems = Vec::new();
    let mut claimed = 0;
    for pod in &cached {
        let pod: &Pod = pod;
        if pod.metadata.deletion_timestamp.is_some() || deleting.contains(&pod.name_any()) {
            continue;
        }
        match state(pod) {
            Some("warming") | Some("ready") => {
                if finished(pod) {
                    // A warm pod that (partly) exited before being claimed is broken: replace it,
                    // saying why on the pool.
                    delete(&pods, &pod.name_any()).await?;
                    ctx.expect(&key, &pod.name_any(), false);
                    let why = crate::pod_problem::ended(pod);
                    ctx.events
                        .publish(
                            &pool.object_ref(&()),
                            EventType::Warning,
                            "PodFailed",
                            format!("{}; replacing it", why.describe()),
                        )
                        .await;
                    ctx.record_ended(&key, why);
                    continue;
                }
                let ready = is_ready(pod);
                if ready && state(pod) == Some("warming") {
                    mark(&pods, pod, PodState::Ready).await?;
                    ctx.count_unready(&key, None);
                    ctx.forget_ended(&key);
                }
                if !ready {
                    problems.extend(crate::pod_problem::problem(pod));
                }
                let age = pod
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .map(|t| now.duration_since(t.0).as_secs())
                    .unwrap_or(0);
                unclaimed.push(PoolPod {
                    name: pod.name_any(),
                    ready,
                    template_hash: pod
                        .annotations()
                        .get(sandbox_pod::TEMPLATE_HASH_ANNOTATION)
                        .cloned()
                        .unwrap_or_default(),
                    age_seconds: age,
                });
            }
            Some("claimed") => claimed += 1,
            _ => {}
        }
    }
    // Created, not yet in the cache: warming pods of the current template.
    for name in creating {
        unclaimed.push(PoolPod {
            name,
            ready: false,
            template_hash: hash.clone(),
            age_seconds: 0,
        });
    }
    let failures = ctx.unready_failures(&key);
    let unready_timeout =
        crate::pod_problem::backed_off_timeout(pool.spec.refill.unready_timeout_seconds, failures);
    let view = PoolView {
        desired: pool.spec.replicas,
        template_hash: hash.clone(),
        strategy: pool.spec.update_strategy.type_,
        refill: floe_crds::RefillPolicy {
            unready_timeout_seconds: unready_timeout,
            ..pool.spec.refill.clone()
        },
        created_last_minute: ctx.created_last_minute(&key),
    };
    let mut decided = plan(&view, &unclaimed);
    // Pods that end before they are claimed are replaced ever more slowly.
    if ctx
        .last_ended(&key)
        .is_some_and(|(_, _, left)| !left.is_zero())
    {
        decided.deferred += decided.create;
        decided.create = 0;
    }
    let replaced_unready = decided
        .delete
        .iter()
        .filter(|(_, r)| *r == DeleteReason::Unready)
        .count() as u32;
    if replaced_unready > 0 {
        ctx.count_unready(&key, Some(replaced_unready));
    }
    for (pod, reason) in &decided.delete {
        tracing::info!(pool = %key, %pod, ?reason, "deleting pod");
        delete(&pods, pod).await?;
        ctx.expect(&key, pod, false);
        let (type_, why, note) = match reason {
            DeleteReason::Unready => (
                EventType::Warning,
                "PodUnready",
                format!(
                    "pod {pod} was not READY within {unready_timeout} s{}; replacing it (the next \
                     replacement waits {} s)",
                    problems
                        .iter()
                        .find(|p| p.pod == *pod)
                        .map(|p| format!(" ({})", p.describe()))
                        .unwrap_or_default(),
                    crate::pod_problem::backed_off_timeout(
                        pool.spec.refill.unready_timeout_seconds,
                        failures + replaced_unready
                    ),
                ),
            ),
            DeleteReason::Stale => (
                EventType::Normal,
                "PodRecreated",
                format!("pod {pod} has an old template (updateStrategy Recreate); replacing it"),
            ),
            DeleteReason::Surplus => continue,
        };
        ctx.events
            .publish(&pool.object_ref(&()), type_, why, note)
            .await;
    }
    let yield_until = tokio::time::Instant::now() + crate::claim_gate::REFILL_YIELD_BUDGET;
    let mut created = 0;
    for _ in 0..decided.create {
        let waited = ctx.claims.quiet_by(yield_until).await;
        ctx.metrics.refill_yield.inc_by(waited.as_secs_f64());
        let pod = format!("{name}-{}", sandbox_pod::random_suffix());
        match create_pod(&ctx, &pool, &ns, &name, &pod).await {
            Ok(()) => {}
            // The apiserver refuses the pod the template makes (an admission rule, a
            // RuntimeClass that does not exist, a quota): say so on the pool and back off, as
            // for pods that end unclaimed, instead of retrying in the operator's log only.
            Err(PoolError::Kube(kube::Error::Api(e)))
                if (400..500).contains(&e.code) && e.code != 409 =>
            {
                let why = crate::pod_problem::PodProblem {
                    pod: pod.clone(),
                    container: None,
                    reason: "PodCreateRejected".into(),
                    message: e.message.clone(),
                };
                tracing::warn!(pool = %key, "{}", why.describe());
                ctx.events
                    .publish(
                        &pool.object_ref(&()),
                        EventType::Warning,
                        "PodCreateRejected",
                        why.describe(),
                    )
                    .await;
                ctx.record_ended(&key, why);
                break;
            }
            Err(e) => return Err(e),
        }
        created += 1;
        ctx.expect(&key, &pod, true);
        ctx.record_created(&key);
    }
    decided.deferred += decided.create - created;
    decided.create = created;

    let deleted: Vec<&String> = decided.delete.iter().map(|(p, _)| p).collect();
    let kept: Vec<&PoolPod> = unclaimed
        .iter()
        .filter(|p| !deleted.contains(&&p.name))
        .collect();
    let ready = kept.iter().filter(|p| p.ready).count() as i32;
    let replicas = kept.len() as i32 + decided.create;
    let mut kept_problems: Vec<&crate::pod_problem::PodProblem> = problems
        .iter()
        .filter(|p| !deleted.contains(&&p.pod))
        .collect();
    // The cache's order is arbitrary: with pods failing for different reasons, the condition
    // (and its Warning Event, sent when the reason changes) must not flip between them.
    kept_problems.sort_by(|a, b| (&a.reason, &a.pod).cmp(&(&b.reason, &b.pod)));
    // No live pod says what is wrong: the last one that ended (or was refused) does, until a
    // pod is READY.
    let ended_problem = ctx.last_ended(&key).map(|(mut p, backoff, _)| {
        p.message = format!("{}; replaced after {} s", p.message, backoff.as_secs());
        p
    });
    if kept_problems.is_empty() {
        kept_problems.extend(ended_problem.as_ref());
    }
    let counts = Counts {
        replicas,
        ready,
        claimed,
    };
    write_status(&ctx, &pool, &ns, counts, &kept_problems, &hash).await?;
    let settled = ready >= pool.spec.replicas && decided.deferred == 0 && decided.create == 0;
    Ok(Action::requeue(if settled {
        Duration::from_secs(60)
    } else {
        Duration::from_secs(2)
    }))
}

/// Keep the pool's egress NetworkPolicy ([`crate::egress_policy`]) as its spec says. A
/// failure (an operator without RBAC for NetworkPolicies, say) is a Warning on the pool, not a
/// failed reconcile: the pods' own check still says whether their egress is open.
async fn ensure_egress_policy(ctx: &PoolContext, pool: &GatewayPool, ns: &str, key: &str) {
    let name = crate::egress_policy::policy_name(&pool.name_any());
    let wanted = match crate::egress_policy::build(pool) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(pool = %key, "egress policy: {e}");
            return;
        }
    };
    let wanted_json = wanted.as_ref().and_then(|p| serde_json::to_string(p).ok());
    if ctx.egress_fresh(key, &wanted_json) {
        return;
    }
    match keep_policy(&ctx.client, ns, &name, wanted.as_ref()).await {
        Ok(()) => ctx.egress_done(key, wanted_json),
        Err(e) => {
            tracing::warn!(pool = %key, "egress policy {name}: {e}");
            ctx.events
                .publish(
                    &pool.object_ref(&()),
                    EventType::Warning,
                    "EgressPolicyFailed",
                    format!("cannot apply NetworkPolicy {name} (spec.egress): {e}"),
                )
                .await;
        }
    }
}

/// Make NetworkPolicy `name` what `wanted` says: applied (server-side, floe's field manager)
/// or, with `None`, deleted (one already gone is fine). (The RolloutJob controller keeps its
/// `poolTemplate` pods' policy with it too.)
pub async fn keep_policy(
    client: &Client,
    ns: &str,
    name: &str,
    wanted: Option<&k8s_openapi::api::networking::v1::NetworkPolicy>,
) -> Result<(), kube::Error> {
    let api: Api<k8s_openapi::api::networking::v1::NetworkPolicy> =
        Api::namespaced(client.clone(), ns);
    match wanted {
        Some(policy) => api
            .patch(
                name,
                &PatchParams::apply("floe-operator").force(),
                &Patch::Apply(policy),
            )
            .await
            .map(|_| ()),
        None => match api.delete(name, &DeleteParams::default()).await {
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            other => other.map(|_| ()),
        },
    }
}

/// Delete a pod; one already gone is fine. (The RolloutJob controller uses it too.)
pub async fn delete(pods: &Api<Pod>, name: &str) -> Result<(), kube::Error> {
    match pods.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.is_not_found() => Ok(()),
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
    let token = sandbox_pod::new_control_token();
    tokens.remember(&ns, &created.name_any(), &token);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    secrets
        .create(
            &PostParams::default(),
            &sandbox_pod::control_secret(&created, label, &token),
        )
        .await?;
    Ok(created)
}

async fn mark(pods: &Api<Pod>, pod: &Pod, to: PodState) -> Result<(), PoolError> {
    // The resourceVersion makes this a compare-and-swap: a concurrent claim wins.
    let patch = sandbox_pod::state_mark_patch(pod.resource_version(), to);
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
        Err(e) => Err(e.into()),
    }
}

async fn create_pod(
    ctx: &PoolContext,
    pool: &GatewayPool,
    ns: &str,
    name: &str,
    pod_name: &str,
) -> Result<(), PoolError> {
    let secret_name = sandbox_pod::control_secret_name(pod_name);
    let mut pod = sandbox_pod::build(&SandboxPod {
        name: pod_name,
        namespace: ns,
        pool: name,
        spec: &pool.spec,
        floe_image: &ctx.floe_image,
        secret: &secret_name,
        native_sidecars: ctx.native_sidecars,
    })?;
    pod.metadata.owner_references = owner(pool).map(|o| vec![o]);
    create_with_control_secret(&ctx.client, &ctx.tokens, &pod, (POOL_LABEL, name)).await?;
    tracing::info!(pool = %name, pod = %pod_name, "created sandbox pod");
    Ok(())
}

struct Counts {
    replicas: i32,
    ready: i32,
    claimed: i32,
}

async fn write_status(
    ctx: &PoolContext,
    pool: &GatewayPool,
    ns: &str,
    counts: Counts,
    problems: &[&crate::pod_problem::PodProblem],
    hash: &str,
) -> Result<(), PoolError> {
    let Counts {
        replicas,
        ready,
        claimed,
    } = counts;
    let desired = pool.spec.replicas;
    ctx.metrics
        .set_pool(ns, &pool.name_any(), ready, desired, claimed);
    let (status, reason, message) = match problems.first() {
        _ if ready >= desired => (
            "True",
            "PoolReady".to_string(),
            format!("{ready}/{desired} pods READY"),
        ),
        // Where users look: the kubelet's or the scheduler's reason on the pool itself.
        Some(p) => (
            "False",
            p.reason.clone(),
            format!(
                "{ready}/{desired} pods READY; {}{}",
                p.describe(),
                match problems.len() {
                    1 => String::new(),
                    n => format!(" (and {} more pods)", n - 1),
                }
            ),
        ),
        None => (
            "False",
            "Warming".to_string(),
            format!("{ready}/{desired} pods READY"),
        ),
    };
    let previous = pool
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"));
    let generation = pool.metadata.generation;
    let earlier = pool.status.as_ref().map(|s| s.conditions.as_slice());
    // kstatus: Reconciling while pods warm, Stalled while they cannot become READY as the
    // template stands (Argo CD and Flux show the pool Degraded then).
    let stalled = status == "False" && !problems.is_empty();
    ctx.metrics.set_blocked(
        crate::metrics::Kind::GatewayPool,
        ns,
        &pool.name_any(),
        stalled.then_some(reason.as_str()),
    );
    let conditions = pool_conditions(
        earlier,
        status == "True",
        stalled,
        &reason,
        &message,
        generation,
    );
    let new = GatewayPoolStatus {
        replicas,
        ready_replicas: ready,
        claimed_replicas: claimed,
        selector: Some(unclaimed_selector(&pool.name_any())),
        template_hash: Some(hash.to_string()),
        observed_generation: generation,
        conditions,
    };
    if pool.status.as_ref() == Some(&new) {
        return Ok(());
    }
    // A Warning when pods start failing for a new reason (once per reason, not per reconcile).
    if let Some(p) = problems.first() {
        if previous.is_none_or(|c| c.reason != reason) {
            let note = new.conditions[0].message.clone();
            ctx.events
                .publish(&pool.object_ref(&()), EventType::Warning, &p.reason, note)
                .await;
        }
    }
    // An Event when READY flips, not on every count change.
    if previous.is_some_and(|c| c.status != status) || (previous.is_none() && status == "True") {
        let why = if status == "True" {
            "PoolReady"
        } else {
            "PoolWarming"
        };
        let note = new.conditions[0].message.clone();
        ctx.events
            .publish(&pool.object_ref(&()), EventType::Normal, why, note)
            .await;
    }
    let api: Api<GatewayPool> = Api::namespaced(ctx.client.clone(), ns);
    api.patch_status(
        &pool.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": new})),
    )
    .await?;
    Ok(())
}

/// The scale subresource's selector: the pool's unclaimed pods (what `replicas` counts), so an
/// HPA or KEDA never counts pods busy with a session.
pub fn unclaimed_selector(pool: &str) -> String {
    format!(
        "{POOL_LABEL}={pool},{STATE_LABEL} in ({},{})",
        PodState::Warming.label(),
        PodState::Ready.label()
    )
}

/// The pool's conditions (`docs/crds.md` lists their types; a test checks): `Ready`, and
/// kstatus's `Reconciling` (not all pods READY yet) and `Stalled` (they cannot become READY as
/// the template stands).
fn pool_conditions(
    earlier: Option<&[Condition]>,
    ready: bool,
    stalled: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
) -> Vec<Condition> {
    let flag = |b: bool| if b { "True" } else { "False" };
    vec![
        condition(earlier, "Ready", flag(ready), reason, message, generation),
        condition(
            earlier,
            "Reconciling",
            flag(!ready),
            reason,
            message,
            generation,
        ),
        condition(
            earlier,
            "Stalled",
            flag(stalled),
            reason,
            message,
            generation,
        ),
    ]
}

/// A condition of the new status, keeping its transition time from `earlier` unless its
/// status flips.
fn condition(
    earlier: Option<&[Condition]>,
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
    generation: Option<i64>,
) -> Condition {
    let since = earlier
        .and_then(|cs| cs.iter().find(|c| c.type_ == type_))
        .filter(|c| c.status == status)
        .map_or_else(
            || Time(k8s_openapi::jiff::Timestamp::now()),
            |c| c.last_transition_time.clone(),
        );
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time: since,
        observed_generation: generation,
    }
}

pub fn error_policy(pool: Arc<GatewayPool>, error: &PoolError, _: Arc<PoolContext>) -> Action {
    tracing::warn!(pool = %pool.name_any(), "reconcile failed: {error}");
    Action::requeue(Duration::from_secs(5))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `docs/crds.md` names exactly the condition types a pool gets, ready, warming or stalled.
    #[test]
    fn the_docs_list_the_pools_condition_types() {
        let mut seen = std::collections::BTreeSet::new();
        for (ready, stalled) in [(true, false), (false, false), (false, true)] {
            for c in pool_conditions(None, ready, stalled, "R", "m", Some(1)) {
                seen.insert(c.type_);
            }
        }
        assert_eq!(seen, crate::documented_condition_types("GatewayPool"));
    }

    fn pod(phase: &str, agent_state: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "status": {"phase": phase, "containerStatuses": [
                {"name": "sandbox", "ready": false, "restartCount": 0, "image": "", "imageID": "",
                 "state": {"running": {}}},
                {"name": "agent", "ready": false, "restartCount": 0, "image": "", "imageID": "",
                 "state": agent_state}]}
        }))
        .expect("pod")
    }

    #[test]
    fn a_pod_whose_agent_container_ended_is_finished() {
        let start_error =
            serde_json::json!({"terminated": {"exitCode": 128, "reason": "StartError"}});
        assert!(finished(&pod("Running", start_error)));
        assert!(!finished(&pod(
            "Running",
            serde_json::json!({"running": {}})
        )));
        assert!(!finished(&pod(
            "Pending",
            serde_json::json!({"waiting": {"reason": "ContainerCreating"}})
        )));
        assert!(finished(&pod("Failed", serde_json::json!({"running": {}}))));
    }
}
