//! The RolloutJob controller: observe a job, its pool and its pods; let [`super::plan::plan`]
//! decide; apply the plan in the crash-safe order (fold results into the status first; then
//! deliver and claim; then release the pods whose results are recorded); write the status.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use floe_crds::gateway_pool::GatewayPool;
use floe_crds::rollout_job::{RolloutJob, RolloutJobStatus, Task};
use floe_gateway::capture::upstream_errors::UpstreamErrors;
use floe_gateway::protocol::upstream::UpstreamKind;
use floe_gateway::ship::Sink;
use floe_sandbox::session::{self, SessionOf, SessionUpstream};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;

mod job_end;

use super::aux_gate;
use super::freshness::{version, Bar, Bars};
use super::indexes::IndexSet;
use super::plan::{plan, Fold, JobPlan, JobState, RewardTally};
use super::pod_view::{self, *};
use super::status::{self, Blocked, StatusInput};
use super::tasks;
use crate::metrics::Metrics;
use crate::sandbox_pod::{self, PodState, CONTROL_TOKEN_KEY, POOL_LABEL, STATE_LABEL};

/// Holds a job until its pods' finalizers are removed.
pub const JOB_FINALIZER: &str = "floe.dev/sessions";
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("the job has no namespace")]
    NoNamespace,
    #[error("cannot build a session pod: {0}")]
    PodSpec(#[from] serde_json::Error),
}

pub struct JobContext {
    pub client: Client,
    /// The slim pod cache: READY pool pods are read from it, and a job's own pods once the
    /// cache has caught up with this operator's writes (`bars`, see `observe`).
    pods: Store<Pod>,
    tokens: Arc<crate::tokens::ControlTokens>,
    pub metrics: Arc<Metrics>,
    /// The image with the `floe` binary (the sft dataset collector, poolTemplate pods).
    pub floe_image: String,
    /// poolTemplate pods get the gateway as a native sidecar.
    native_sidecars: bool,
    http: reqwest::Client,
    events: crate::events::Events,
    /// Sessions that found no READY pod free, by (job uid, index): their claim counts as cold.
    starved: Mutex<HashSet<(String, u32)>>,
    /// Client-side CEL validation per (job uid, generation): evaluating the rules costs tens of
    /// milliseconds, too much for every round of a running job.
    validated: Mutex<HashMap<String, Validated>>,
    /// `tasks.file` jobs' tasks by job uid, with the loader arguments they were read with.
    file_tasks: Mutex<HashMap<String, LoadedTasks>>,
    /// Per job uid: what the pod cache must show before a round may read the job's pods from
    /// it. No entry: the next round lists them from the apiserver.
    bars: Mutex<HashMap<String, Bars>>,
    /// Claims, deliveries, marks and releases of one round in flight at once.
    in_flight: usize,
    /// Held while a round claims, so that pools' refills wait ([`crate::claim_gate`]).
    claims: Arc<crate::claim_gate::ClaimGate>,
    /// The pool controller's cache of GatewayPools: a round reads its pool from it, and asks
    /// the apiserver only for one it does not show (so `PoolNotFound` is the apiserver's word).
    pools: Option<Store<GatewayPool>>,
    /// Claim pool pods while the job's own pod is starting (`--claim-while-starting`), for at
    /// most this long (`--claim-while-starting-limit`); `None` when off.
    early_claims: Option<Duration>,
    /// Per job uid: pods claimed while the job's own pod was starting, whose assignment has
    /// not gone out. Their claim latency counts from the round that may deliver it (the
    /// session could not start before), and is recorded when that delivery is acknowledged.
    claimed_early: Mutex<HashMap<String, HashSet<String>>>,
}

/// How long pool pods claimed while the job's own pod starts may wait for it by default.
pub const DEFAULT_EARLY_CLAIM_LIMIT: Duration = Duration::from_secs(600);

/// The task loader's arguments and the tasks read with them.
type LoadedTasks = (String, Arc<Vec<Task>>);

/// A job's generation and what validating it said.
type Validated = (Option<i64>, Result<(), String>);

impl JobContext {
    pub fn new(
        client: Client,
        pods: Store<Pod>,
        tokens: Arc<crate::tokens::ControlTokens>,
        metrics: Arc<Metrics>,
        floe_image: String,
        native_sidecars: bool,
        in_flight: usize,
    ) -> Self {
        Self {
            in_flight: in_flight.max(1),
            claims: Arc::default(),
            pools: None,
            early_claims: Some(DEFAULT_EARLY_CLAIM_LIMIT),
            claimed_early: Mutex::default(),
            native_sidecars,
            events: crate::events::Events::new(client.clone()),
            client,
            pods,
            tokens,
            metrics,
            floe_image,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                .build()
                .unwrap_or_default(),
            starved: Mutex::default(),
            validated: Mutex::default(),
            file_tasks: Mutex::default(),
            bars: Mutex::default(),
        }
    }

    /// Share the gate with the pool controller, so that its refills wait for this one's
    /// claims (alone, the job controller's gate holds nothing back).
    pub fn with_claim_gate(mut self, claims: Arc<crate::claim_gate::ClaimGate>) -> Self {
        self.claims = claims;
        self
    }

    /// `None` claims only once the job's own pod is Ready.
    pub fn with_claim_while_starting(mut self, limit: Option<Duration>) -> Self {
        self.early_claims = limit;
        self
    }

    pub fn with_pool_cache(mut self, pools: Store<GatewayPool>) -> Self {
        self.pools = Some(pools);
        self
    }

    /// A job's pool: from the pool cache, else from the apiserver (`None`: it does not exist).
    /// Every round reads it, and an apiserver GET before a round's claims is a round trip
    /// each of them waits for.
    async fn pool(&self, ns: &str, name: &str) -> Result<Option<GatewayPool>, kube::Error> {
        let cached = self
            .pools
            .as_ref()
            .and_then(|store| store.get(&ObjectRef::new(name).within(ns)));
        match cached {
            Some(pool) => Ok(Some((*pool).clone())),
            None => {
                let pools: Api<GatewayPool> = Api::namespaced(self.client.clone(), ns);
                pools.get_opt(name).await
            }
        }
    }

    /// Raise the cache's bar for a job's pod after a write the apiserver answered.
    fn raise_bar(&self, uid: &str, pod: &str, bar: Bar) {
        if let Some(bars) = self
            .bars
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(uid)
        {
            bars.raise(pod, bar);
        }
    }

    /// The job's next round lists its pods from the apiserver (after a write whose outcome is
    /// unknown, or once the job is gone).
    fn forget_bars(&self, uid: &str) {
        self.bars
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(uid);
    }

    /// A job is done or gone: forget what this process kept about it between rounds.
    fn forget_job(&self, uid: &str) {
        self.forget_bars(uid);
        self.claimed_early
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(uid);
    }

    fn note_claimed_early(&self, uid: &str, pod: &str) {
        self.claimed_early
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(uid.to_string())
            .or_default()
            .insert(pod.to_string());
    }

    /// Whether `pod` was claimed while the job's pod was starting (and forget it: its
    /// delivery goes out now).
    fn take_claimed_early(&self, uid: &str, pod: &str) -> bool {
        self.claimed_early
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(uid)
            .is_some_and(|pods| pods.remove(pod))
    }

    /// A session got its pod: `cold` when it had waited for one (it was starved before).
    fn count_claim(&self, uid: &str, index: u32) {
        let cold = self
            .starved
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(uid.to_string(), index));
        self.metrics
            .claims
            .with_label_values(&[if cold { "cold" } else { "warm" }])
            .inc();
    }

    fn validate(&self, job: &RolloutJob) -> Result<(), String> {
        let uid = job.uid().unwrap_or_default();
        let generation = job.metadata.generation;
        let mut cache = self.validated.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((g, verdict)) = cache.get(&uid) {
            if *g == generation {
                return verdict.clone();
            }
        }
        let verdict = floe_crds::validation::validate_rollout_job(job).map_err(|e| e.to_string());
        cache.insert(uid, (generation, verdict.clone()));
        verdict
    }

    async fn event(&self, job: &RolloutJob, type_: EventType, reason: &str, note: String) {
        self.events
            .publish(&job.object_ref(&()), type_, reason, note)
            .await;
    }
}

/// One reconcile, timed and counted under controller-runtime's metric names.
pub async fn reconcile(job: Arc<RolloutJob>, ctx: Arc<JobContext>) -> Result<Action, JobError> {
    let started = Instant::now();
    let result = reconcile_job(&job, &ctx).await;
    if result.is_err() {
        // A write of this round may have landed unseen: never trust the cache over it.
        ctx.forget_bars(&job.uid().unwrap_or_default());
    }
    crate::metrics::record_reconcile(
        &ctx.metrics,
        crate::metrics::Kind::RolloutJob,
        started,
        result.is_ok(),
    );
    result
}

pub fn error_policy(job: Arc<RolloutJob>, error: &JobError, _: Arc<JobContext>) -> Action {
    tracing::warn!(job = %job.name_any(), "reconcile failed: {error}");
    Action::requeue(Duration::from_secs(2))
}

/// Everything one reconcile needs to know about where the job stands.
struct Observed {
    name: String,
    /// `numSamples` (at least 1).
    samples: u32,
    tasks: Arc<Vec<Task>>,
    hidden: BTreeMap<String, String>,
    control_port: i32,
    pods: Vec<Pod>,
    ready: Vec<Pod>,
    /// An `sft` job's model server key (`spec.sft.upstream.apiKeySecret`), for its gateways.
    upstream_key: Option<String>,
}

async fn reconcile_job(job: &RolloutJob, ctx: &JobContext) -> Result<Action, JobError> {
    let round = Instant::now();
    let ns = job.namespace().ok_or(JobError::NoNamespace)?;
    let jobs: Api<RolloutJob> = Api::namespaced(ctx.client.clone(), &ns);
    if job.metadata.deletion_timestamp.is_some() {
        return cleanup(job, ctx, &ns).await;
    }
    if !job.finalizers().iter().any(|f| f == JOB_FINALIZER) {
        let mut list = job.finalizers().to_vec();
        list.push(JOB_FINALIZER.into());
        let patch =
            json!({"metadata": {"resourceVersion": job.resource_version(), "finalizers": list}});
        jobs.patch(
            &job.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
        // The patch triggers the next reconcile with the new object.
        return Ok(Action::await_change());
    }
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let previous = job.status.clone();
    if let Some(done) = previous.as_ref().and_then(|s| s.completion_time.clone()) {
        ctx.forget_job(&job.uid().unwrap_or_default());
        // Pods stopped at a deadline end after the job did: let them go too.
        release_all(ctx, job, &ns).await?;
        // The job's own pods end with it; a job due for deletion (its TTL) waits for none.
        let ttl_left = ttl_left(job, &done, &now);
        let patience = ttl_left.is_none_or(|left| left > 0);
        if let Some(wait) = job_end::end_job_pods(job, ctx, &ns, &done, &now, patience).await? {
            let wait = ttl_left.map_or(wait, |left| {
                wait.min(Duration::from_secs(u64::try_from(left).unwrap_or(1)))
            });
            return Ok(Action::requeue(wait));
        }
        return after_completion(job, &jobs, ttl_left).await;
    }

    let observed = match observe(job, ctx, &ns).await? {
        Ok(o) => o,
        Err(blocked) => return report_blocked(job, ctx, &jobs, &blocked, now).await,
    };
    let total = u32::try_from(observed.tasks.len())
        .unwrap_or(u32::MAX)
        .saturating_mul(observed.samples);
    let mut state = job_state(job, previous.as_ref(), &now, total);
    let sessions: Vec<_> = observed
        .pods
        .iter()
        .filter_map(pod_view::session_pod)
        .collect();
    // Sessions start only once their trajectories have somewhere to go.
    let aux = match ensure_aux(job, ctx, &ns).await? {
        Ok(aux) => aux,
        Err(blocked) => return report_blocked(job, ctx, &jobs, &blocked, now).await,
    };
    let aux_phase = aux_gate::aux_phase(aux.as_ref());
    let unready_for = aux
        .as_ref()
        .map_or(Duration::ZERO, |p| aux_gate::unready_for(p, now.0));
    // Pool pods may be claimed while that pod is starting; assignments wait until it is Ready.
    let gate = aux_gate::gate(aux_phase, ctx.early_claims, unready_for);
    let waiting = aux
        .as_ref()
        .filter(|_| aux_phase != aux_gate::AuxPhase::Ready)
        .map(|p| aux_waiting(job, p, aux_phase, ctx.early_claims, unready_for));
    state.give_back_unstarted = gate.give_back;
    let free = if gate.claim { observed.ready.len() } else { 0 };
    let trainer = match (&job.spec.train, &aux) {
        (Some(_), Some(pod)) => trainer_progress(ctx, pod).await,
        _ => None,
    };
    // A train job's sessions may all be done while its trainer still trains the last groups.
    let trainer_unfinished =
        job.spec.train.is_some() && trainer.as_ref().is_some_and(|t| !t.finished);
    let mut decided = plan(&state, &sessions, free);
    if !gate.deliver {
        // Pods may warm (poolTemplate) or be claimed meanwhile, but no session starts before
        // its trajectories have somewhere to go: a claimed pod keeps its session, unstarted.
        decided.running -= decided.start.len() as u32;
        decided.start.clear();
        decided.deliver.clear();
    }

    // 1. Fold results into the status (guarded by the job's resourceVersion) ...
    let mut rv = job.resource_version();
    let mut written = previous.clone();
    if !decided.folds.is_empty() {
        let st = status::status(
            &StatusInput {
                previous: previous.as_ref(),
                generation: job.metadata.generation,
                state: &decided.next,
                running: decided.running - decided.claim.len() as u32,
                blocked: None,
                now: now.clone(),
                trainer_unfinished,
            },
            previous.as_ref().and_then(|s| s.start_time.clone()),
        );
        match write_status(&jobs, job, rv.as_deref(), &st).await? {
            Some(new_rv) => rv = Some(new_rv),
            // Someone else wrote first: look again before releasing anything.
            None => return Ok(Action::requeue(Duration::from_millis(200))),
        }
        // The fold may finish the job: announce it now, or the final write below (which then
        // sees no change) never would.
        announce_transition(job, ctx, previous.as_ref(), &st).await;
        written = Some(st);
        report_folds(job, ctx, &decided).await;
    }
    state = decided.next.clone();
    ctx.metrics.set_rewards(
        &ns,
        &observed.name,
        u64::from(state.rewards.scored),
        state.rewards.sum,
    );

    // 2. Deliver assignments still owed, then claim READY pods for the next sessions.
    // Deliveries and claims go out concurrently: a burst of sessions must not wait for each
    // other's apiserver round trips (claim latency is measured from the start of the round).
    // (Owned items: a stream of borrowed pods trips the compiler's higher-ranked lifetime
    // check once the future has to be Send.)
    let owed: Vec<Pod> = decided
        .deliver
        .iter()
        .filter_map(|name| observed.pods.iter().find(|p| p.name_any() == *name))
        .cloned()
        .collect();
    let observed_ref = &observed;
    let uid = job.uid().unwrap_or_default();
    let uid_ref = &uid;
    let phase = |name: &str, since: Instant| {
        ctx.metrics
            .claim_phase
            .with_label_values(&[name])
            .observe(since.elapsed().as_secs_f64());
    };
    // Pods whose gateway acknowledged its assignment in this round: marked `assigned` once the
    // round's claims are out, so that this second write per claim never queues a claim.
    let mut acknowledged: Vec<String> = futures::stream::iter(owed)
        .map(|pod: Pod| async move {
            // A pod claimed while the job's pod was starting: its session may start from now,
            // so its claim latency counts from this round.
            let early = ctx.take_claimed_early(uid_ref, &pod.name_any());
            let delivering = Instant::now();
            let acked = deliver(ctx, job, observed_ref, &pod, early.then_some(round)).await;
            if early {
                phase("deliver", delivering);
            }
            acked
        })
        .buffer_unordered(ctx.in_flight)
        .filter_map(std::future::ready)
        .collect()
        .await;
    let pool_label = job.spec.pool_ref.as_ref().map_or("", |p| p.name.as_str());
    ctx.metrics
        .waiting_for_pod
        .with_label_values(&[ns.as_str(), job.name_any().as_str(), pool_label])
        .set(i64::try_from(decided.starved.len()).unwrap_or(i64::MAX));
    ctx.starved
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .extend(decided.starved.iter().map(|i| (uid.clone(), *i)));
    // Each session gets its own READY pod; one that someone else took first (a conflict) just
    // waits for the next round.
    let pairs: Vec<((u32, u32), Pod)> = decided
        .claim
        .iter()
        .copied()
        .zip(observed.ready.iter().cloned())
        .collect();
    // Two stages: `in_flight` PATCHes at the apiserver, and each claimed pod's delivery (to
    // its own gateway, not the apiserver) beside the next PATCHes. The delivery stage holds
    // as many as the round claims, so it never stops the PATCH stage from being polled.
    let deliveries = pairs.len().max(1);
    let claiming = (!pairs.is_empty()).then(|| ctx.claims.enter());
    let claims: Vec<Result<ClaimOutcome, JobError>> = futures::stream::iter(pairs)
        .map(|((index, attempt), candidate): ((u32, u32), Pod)| {
            let (observed, uid) = (observed_ref, uid_ref);
            async move {
                phase("observe", round);
                let patching = Instant::now();
                let claimed = claim(ctx, job, observed, &candidate, index, attempt).await?;
                if claimed.is_some() {
                    phase("patch", patching);
                    ctx.count_claim(uid, index);
                }
                Ok(claimed)
            }
        })
        .buffer_unordered(ctx.in_flight)
        .map(|claimed: Result<Option<Pod>, JobError>| async move {
            let Some(pod) = claimed? else {
                return Ok(ClaimOutcome::Lost);
            };
            if !gate.deliver {
                ctx.note_claimed_early(uid_ref, &pod.name_any());
                return Ok(ClaimOutcome::Claimed { acknowledged: None });
            }
            let delivering = Instant::now();
            let acknowledged = deliver(ctx, job, observed_ref, &pod, Some(round)).await;
            phase("deliver", delivering);
            Ok(ClaimOutcome::Claimed { acknowledged })
        })
        .buffer_unordered(deliveries)
        .collect()
        .await;
    drop(claiming);
    let mut claimed = 0u32;
    for c in claims {
        if let ClaimOutcome::Claimed {
            acknowledged: acked,
        } = c?
        {
            claimed += 1;
            acknowledged.extend(acked);
        }
    }

    // poolTemplate: sessions start on their pre-warmed pods.
    let (started, acked) = start_prewarmed(ctx, job, &observed, &decided.start, round).await;
    if started < decided.start.len() {
        decided.running -= (decided.start.len() - started) as u32;
    }
    acknowledged.extend(acked);
    mark_assigned(ctx, &ns, acknowledged).await;

    // 3. Only now (results recorded, new sessions on their way) let go of finished pods.
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let pods_ref = &pods;
    let ns_ref = &ns;
    let released: Vec<Result<(), JobError>> = futures::stream::iter(decided.release.clone())
        .map(|name: String| async move {
            ctx.tokens.forget(ns_ref, &name);
            ctx.take_claimed_early(uid_ref, &name);
            let written = release(pods_ref, &name).await?;
            ctx.raise_bar(uid_ref, &name, bar_after_delete(written));
            Ok(())
        })
        .buffer_unordered(ctx.in_flight)
        .collect()
        .await;
    released.into_iter().collect::<Result<(), _>>()?;
    for name in &decided.stop {
        let written = delete_pod(&pods, name).await?;
        ctx.raise_bar(&uid, name, bar_after_delete(written));
    }
    // poolTemplate: the next sessions' pods, after the finished ones went (the window holds
    // `concurrency + lookahead` pods, not one more while a finished pod lingers).
    create_prewarmed(ctx, job, &observed, &decided.prewarm).await?;

    // 4. The status after this round.
    let running = decided.running - (decided.claim.len() as u32 - claimed);
    // Started once any session holds a pod or finished — not just "claimed in this round": a
    // round whose status write lost a conflict must not leave the job without a start time.
    let began = running > 0 || !state.completed.is_empty() || !state.failed.is_empty();
    let start_time = status::started(previous.as_ref(), began, &now);
    let mut st = status::status(
        &StatusInput {
            previous: written.as_ref(),
            generation: job.metadata.generation,
            state: &state,
            running,
            blocked: None,
            now: now.clone(),
            trainer_unfinished,
        },
        start_time,
    );
    // Where users look: the job's own pod's problem is the job's reason, and its metric.
    let aux_problem = aux
        .as_ref()
        .filter(|_| aux_phase != aux_gate::AuxPhase::Ready)
        .and_then(crate::pod_problem::problem);
    ctx.metrics.set_blocked(
        crate::metrics::Kind::RolloutJob,
        &ns,
        &observed.name,
        aux_problem.as_ref().map(|p| p.reason.as_str()),
    );
    if let Some(problem) = &aux_problem {
        for c in st.conditions.iter_mut().filter(|c| {
            c.reason == "SessionsRunning"
                && matches!(c.type_.as_str(), "Ready" | "Progressing" | "Reconciling")
        }) {
            c.reason = problem.reason.clone();
        }
    }
    if let (aux_gate::AuxPhase::Failing, Some(w), Some(pod)) = (aux_phase, &waiting, &aux) {
        let was_failing = written
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Progressing"))
            .is_some_and(|c| c.message.contains(AUX_FAILING));
        if !was_failing {
            tracing::warn!(job = %job.name_any(), pod = %pod.name_any(), "{w}");
            ctx.event(job, EventType::Warning, "JobPodFailing", w.clone())
                .await;
        }
    }
    if let Some(w) = &waiting {
        // Pods claimed early wait for it; started sessions (it was Ready before) go on.
        let w = if running > 0 && gate.claim {
            format!("{w}; {running} sessions hold their pods until then")
        } else {
            w.clone()
        };
        // Ready says it too when that pod has a problem (its reason is the Reason column).
        for c in st.conditions.iter_mut().filter(|c| {
            c.type_ == "Progressing"
                || c.type_ == "Reconciling"
                || (c.type_ == "Ready" && aux_problem.is_some())
        }) {
            c.message = w.clone();
        }
    }
    let finishing = st
        .conditions
        .iter()
        .any(|c| c.reason == status::TRAINING_LAST_GROUPS);
    if let (true, Some(pod)) = (finishing, &aux) {
        // Every round until the trainer says it finished: the call is idempotent.
        if let Err(e) = finish_trainer(ctx, job, &ns, pod).await {
            tracing::warn!(job = %job.name_any(), "cannot tell the trainer the sessions are done: {e}");
        }
    }
    if trainer.is_some() {
        st.trainer = trainer;
    }
    set_session_gauges(ctx, &ns, &observed.name, &st);
    if written.as_ref() != Some(&st) {
        if write_status(&jobs, job, rv.as_deref(), &st)
            .await?
            .is_none()
        {
            return Ok(Action::requeue(Duration::from_millis(200)));
        }
        announce_transition(job, ctx, written.as_ref(), &st).await;
    }
    Ok(Action::requeue(requeue_after(job, &st, &now)))
}

/// Words in the job's condition while its own pod fails (how the next round knows it said so).
const AUX_FAILING: &str = "is failing";

/// The job's condition while its own pod is not Ready: which pod, why, and what that means for
/// the pool pods the job holds.
fn aux_waiting(
    job: &RolloutJob,
    pod: &Pod,
    phase: aux_gate::AuxPhase,
    early_claims: Option<Duration>,
    unready_for: Duration,
) -> String {
    let role = if job.spec.train.is_some() {
        "trainer"
    } else {
        "dataset collector"
    };
    let name = pod.name_any();
    let problem = crate::pod_problem::problem(pod).map(|p| p.describe());
    match (phase, problem) {
        (aux_gate::AuxPhase::Failing, Some(why)) => format!(
            "the job's {role} {AUX_FAILING}: {why}; no session starts and the job holds no pool pods until it is Ready"
        ),
        (aux_gate::AuxPhase::Failing, None) => format!(
            "the job's {role} {AUX_FAILING}: pod {name} failed; no session starts and the job holds no pool pods until it is Ready"
        ),
        (aux_gate::AuxPhase::NotRunning, Some(why)) => {
            format!("waiting for pod {name} (the job's {role}) to run: {why}")
        }
        (aux_gate::AuxPhase::Starting, _)
            if early_claims.is_some_and(|limit| unready_for >= limit) =>
        {
            format!(
                "waiting for pod {name} (the job's {role}) to be ready; not ready for {} s, past the {} s early-claim limit: the job holds no pool pods until it is",
                unready_for.as_secs(),
                early_claims.map_or(0, |l| l.as_secs())
            )
        }
        _ => format!("waiting for pod {name} (the job's {role}) to be ready"),
    }
}

fn requeue_after(job: &RolloutJob, st: &RolloutJobStatus, now: &Time) -> Duration {
    if st.completion_time.is_some() {
        return match job.spec.ttl_seconds_after_finished {
            Some(ttl) => Duration::from_secs(u64::try_from(ttl).unwrap_or(0)),
            None => Duration::from_secs(300),
        };
    }
    // Pod changes wake the controller; this is the safety net, and the deadline's alarm.
    let mut wait = Duration::from_secs(10);
    if let (Some(deadline), Some(start)) = (job.spec.active_deadline_seconds, &st.start_time) {
        let left = deadline - now.0.duration_since(start.0).as_secs();
        wait = wait.min(Duration::from_secs(u64::try_from(left.max(1)).unwrap_or(1)));
    }
    wait
}

fn tally(counts: &BTreeMap<String, i64>) -> BTreeMap<String, u64> {
    counts
        .iter()
        .map(|(k, n)| (k.clone(), u64::try_from(*n).unwrap_or(0)))
        .collect()
}

fn job_state(
    job: &RolloutJob,
    previous: Option<&RolloutJobStatus>,
    now: &Time,
    total: u32,
) -> JobState {
    let spec = &job.spec;
    let parse = |s: Option<&String>| {
        s.map(|t| {
            IndexSet::parse(t).unwrap_or_else(|e| {
                tracing::error!(job = %job.name_any(), "unreadable status: {e}");
                IndexSet::default()
            })
        })
        .unwrap_or_default()
    };
    let rewards = previous.and_then(|s| s.rewards.as_ref());
    let deadline_exceeded = match (
        spec.active_deadline_seconds,
        previous.and_then(|s| s.start_time.as_ref()),
    ) {
        (Some(limit), Some(start)) => now.0.duration_since(start.0).as_secs() >= limit,
        _ => false,
    };
    let concurrency = spec.concurrency.and_then(|c| u32::try_from(c).ok());
    let lookahead = spec.pool_template.as_ref().map(|_| {
        spec.lookahead
            .and_then(|l| u32::try_from(l).ok())
            .unwrap_or(concurrency.unwrap_or(super::plan::TEMPLATE_CONCURRENCY))
    });
    JobState {
        total,
        backoff_limit: u32::try_from(spec.backoff_limit).unwrap_or(0),
        concurrency,
        lookahead,
        pass_threshold: spec.evaluator.reward.pass_threshold,
        suspend: spec.suspend,
        deadline_exceeded,
        // The job's own pod decides it in the round (`aux_gate`).
        give_back_unstarted: false,
        completed: parse(previous.and_then(|s| s.completed_indexes.as_ref())),
        failed: parse(previous.and_then(|s| s.failed_indexes.as_ref())),
        retries: previous
            .map(|s| {
                s.retries
                    .iter()
                    .filter_map(|(k, v)| Some((k.parse().ok()?, u32::try_from(*v).ok()?)))
                    .collect()
            })
            .unwrap_or_default(),
        upstream: previous
            .and_then(|s| s.upstream_errors.as_ref())
            .map(|u| UpstreamErrors {
                retried: tally(&u.retried),
                failed: tally(&u.failed),
            })
            .unwrap_or_default(),
        rewards: rewards
            .map(|r| RewardTally {
                scored: u32::try_from(r.scored).unwrap_or(0),
                sum: r.sum,
                passed: u32::try_from(r.passed).unwrap_or(0),
            })
            .unwrap_or_default(),
    }
}

/// The pool, the tasks and the pods; `Err(Blocked)` when the job cannot run as written.
async fn observe(
    job: &RolloutJob,
    ctx: &JobContext,
    ns: &str,
) -> Result<Result<Observed, Blocked>, JobError> {
    let blocked = |reason: &str, message: String| Ok(Err(Blocked::stalled(reason, message)));
    // apiservers < 1.25 do not run the CRD's CEL rules: the operator applies the same ones.
    if let Err(e) = ctx.validate(job) {
        return blocked("InvalidSpec", e);
    }
    let spec = &job.spec;
    // A pool to claim from, or (poolTemplate) the job's own pods with default gateway ports.
    let pool = match &spec.pool_ref {
        Some(pool_ref) => {
            let Some(pool) = ctx.pool(ns, &pool_ref.name).await? else {
                return blocked(
                    "PoolNotFound",
                    format!(
                        "GatewayPool {:?} (spec.poolRef) does not exist in namespace {ns}",
                        pool_ref.name
                    ),
                );
            };
            Some(pool)
        }
        None => None,
    };
    // The evaluator runs in the grader container of the pod a session claims.
    if let (Some(want), Some(pool)) = (&spec.evaluator.image, &pool) {
        let t = &pool.spec.template;
        let grades_in = t.grader_image.as_ref().unwrap_or(&t.image);
        if grades_in != want {
            return blocked(
                "EvaluatorImageMismatch",
                format!(
                    "spec.evaluator.image is {want:?}, but GatewayPool {:?} grades in {grades_in:?} \
                     (its spec.template.graderImage, else its image): set the pool's graderImage \
                     to {want:?}, or use a pool that has it",
                    pool.name_any()
                ),
            );
        }
    }
    let upstream_key = match spec
        .sft
        .as_ref()
        .filter(|_| spec.train.is_none())
        .and_then(|s| s.upstream.api_key_secret.as_ref())
    {
        Some(r) => {
            let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
            let secret = secrets.get_opt(&r.name).await?;
            match secret.as_ref().and_then(|s| sandbox_pod::secret_value(s, &r.key)) {
                Some(key) => Some(key),
                None => {
                    return blocked(
                        "UpstreamKeyNotFound",
                        match secret {
                            None => format!(
                                "Secret {:?} (spec.sft.upstream.apiKeySecret) does not exist in namespace {ns}",
                                r.name
                            ),
                            Some(_) => format!(
                                "Secret {:?} (spec.sft.upstream.apiKeySecret) has no key {:?}, or it is empty",
                                r.name, r.key
                            ),
                        },
                    )
                }
            }
        }
        None => None,
    };
    let configmaps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), ns);
    let tasks = match (&spec.tasks.inline, &spec.tasks.config_map, &spec.tasks.file) {
        (Some(t), _, _) => Arc::new(t.clone()),
        (None, Some(cm), _) => {
            let Some(map) = configmaps.get_opt(&cm.name).await? else {
                return blocked(
                    "TasksNotFound",
                    format!(
                        "ConfigMap {:?} (spec.tasks.configMap) does not exist",
                        cm.name
                    ),
                );
            };
            let Some(text) = map.data.as_ref().and_then(|d| d.get(&cm.key)) else {
                return blocked(
                    "TasksNotFound",
                    format!("ConfigMap {:?} has no key {:?}", cm.name, cm.key),
                );
            };
            match tasks::parse_jsonl(text, &format!("ConfigMap {}/{}", cm.name, cm.key)) {
                Ok(t) => Arc::new(t),
                Err(e) => return blocked("InvalidTasks", e),
            }
        }
        (None, None, Some(_)) => match file_tasks(job, ctx, ns).await? {
            Ok(t) => t,
            Err(b) => return Ok(Err(b)),
        },
        (None, None, None) => return blocked("InvalidSpec", "spec.tasks names no source".into()),
    };
    let hidden = match &spec.evaluator.hidden_files_from {
        Some(r) => match configmaps.get_opt(&r.name).await? {
            Some(map) => tasks::hidden_files(&map.data.unwrap_or_default()),
            None => {
                return blocked(
                    "HiddenFilesNotFound",
                    format!(
                        "ConfigMap {:?} (spec.evaluator.hiddenFilesFrom) does not exist",
                        r.name
                    ),
                )
            }
        },
        None => BTreeMap::new(),
    };
    let name = job.name_any();
    // What would fail every session only after its agent ran: refused before the first claim.
    let tasks_field = match (&spec.tasks.inline, &spec.tasks.config_map, &spec.tasks.file) {
        (Some(_), _, _) => "spec.tasks.inline".to_string(),
        (None, Some(cm), _) => format!("ConfigMap {}/{}", cm.name, cm.key),
        (None, None, Some(f)) => format!("task file {}", f.path),
        (None, None, None) => "spec.tasks".to_string(),
    };
    let problems = floe_sandbox::checks::check_sessions(&name, spec, &tasks, &tasks_field, &hidden);
    if !problems.is_empty() {
        let error = floe_crds::validation::ValidationError { errors: problems };
        return blocked("InvalidTasks", error.to_string());
    }
    let owned = job_pods(job, ctx, ns, &name).await?;
    // READY pods from the cache: a stale entry only costs a lost compare-and-swap (the claim
    // is retried next round), never a double claim.
    let pool_name = pool.as_ref().map(|p| p.name_any());
    let mut ready: Vec<Pod> = match &pool_name {
        Some(pool_name) => ctx
            .pods
            .state_filter(|p| {
                let labels = p.labels();
                p.metadata.namespace.as_deref() == Some(ns)
                    && labels.get(POOL_LABEL) == Some(pool_name)
                    && labels.get(STATE_LABEL).map(String::as_str) == Some(PodState::Ready.label())
                    && !labels.contains_key(JOB_LABEL)
                    && p.metadata.deletion_timestamp.is_none()
                    && crate::pool_controller::is_ready(p)
                    // A pod of an older template may grade in another image.
                    && spec.evaluator.image.as_ref().is_none_or(|want| {
                        sandbox_pod::grader_image(p) == Some(want.as_str())
                    })
            })
            .into_iter()
            .map(|p| (*p).clone())
            .collect(),
        None => Vec::new(),
    };
    // Oldest first: stale-template pods (OnReplenish) go before fresh ones.
    ready.sort_by_key(|p| p.metadata.creation_timestamp.as_ref().map(|t| t.0));
    Ok(Ok(Observed {
        name,
        samples: u32::try_from(spec.num_samples.max(1)).unwrap_or(1),
        tasks,
        hidden,
        control_port: pool.map_or_else(
            || floe_crds::gateway_pool::GatewaySettings::default().control_port,
            |p| p.spec.gateway.control_port,
        ),
        pods: owned,
        ready,
        upstream_key,
    }))
}

/// The job's pods. A claim must never be made twice, so they come from the watch cache only
/// once it has caught up with every write of this operator (see [`super::freshness`]);
/// otherwise from the apiserver, a quorum list.
async fn job_pods(
    job: &RolloutJob,
    ctx: &JobContext,
    ns: &str,
    name: &str,
) -> Result<Vec<Pod>, JobError> {
    let uid = job.uid().unwrap_or_default();
    let cached: Vec<Arc<Pod>> = ctx.pods.state_filter(|p| {
        p.metadata.namespace.as_deref() == Some(ns)
            && p.labels().get(JOB_LABEL).map(String::as_str) == Some(name)
    });
    let view = || {
        cached.iter().map(|p| {
            (
                p.metadata.name.as_deref().unwrap_or_default(),
                p.metadata.resource_version.as_deref(),
            )
        })
    };
    {
        let mut bars = ctx.bars.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(b) = bars.get_mut(&uid).filter(|b| b.met(view())) {
            *b = Bars::default();
            drop(bars);
            ctx.metrics
                .job_pod_reads
                .with_label_values(&["cache"])
                .inc();
            return Ok(cached.iter().map(|p| (**p).clone()).collect());
        }
    }
    ctx.metrics
        .job_pod_reads
        .with_label_values(&["apiserver"])
        .inc();
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let listed = pods
        .list(&ListParams::default().labels(&format!("{JOB_LABEL}={name}")))
        .await?
        .items;
    let bars = Bars::from_list(
        listed.iter().map(|p| {
            (
                p.metadata.name.as_deref().unwrap_or_default(),
                p.metadata.resource_version.as_deref(),
            )
        }),
        view().map(|(n, _)| n),
    );
    ctx.bars
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(uid, bars);
    Ok(listed)
}

/// `tasks.file`: the operator reads no volumes, so a loader pod mounts the claim and serves
/// the file (`aux_pods::task_loader`); the parsed tasks are kept per job (they cannot change
/// once the job started) and the pod stays for an operator restart to read them again.
async fn file_tasks(
    job: &RolloutJob,
    ctx: &JobContext,
    ns: &str,
) -> Result<Result<Arc<Vec<Task>>, Blocked>, JobError> {
    let stalled = |reason: &str, message: String| Ok(Err(Blocked::stalled(reason, message)));
    let uid = job.uid().unwrap_or_default();
    let Some(loader) = super::aux_pods::task_loader(job, &ctx.floe_image)? else {
        return stalled(
            "TaskFileNeedsClaim",
            "spec.tasks.file.claimName: in a cluster the task file is read from a PersistentVolumeClaim (or use spec.tasks.inline / spec.tasks.configMap)".into(),
        );
    };
    // The loader's arguments name the file: a changed path (before the job started) means a
    // new loader and a new read.
    let key = serde_json::to_string(&loader.spec.as_ref().map(|s| &s.containers[0].args))?;
    if let Some((k, tasks)) = ctx
        .file_tasks
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&uid)
    {
        if *k == key {
            return Ok(Ok(tasks.clone()));
        }
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let name = loader.name_any();
    let pod = match pods.get_opt(&name).await? {
        Some(p)
            if serde_json::to_string(&p.spec.as_ref().map(|s| &s.containers[0].args))? != key =>
        {
            delete_pod(&pods, &name).await?;
            None
        }
        Some(p) => Some(p),
        // Suspended before its tasks were read (Kueue creates jobs suspended): no pod yet.
        None if job.spec.suspend => {
            return Ok(Err(Blocked::waiting(
                "JobSuspended",
                format!("suspended; spec.tasks.file is read (pod {name}) once the job is resumed"),
            )))
        }
        None => {
            if let Err(b) = refused(create_if_missing(&pods, &loader).await, "pod", &loader)? {
                return Ok(Err(b));
            }
            None
        }
    };
    let waiting = |message: String| Ok(Err(Blocked::waiting("LoadingTasks", message)));
    let Some(pod) = pod else {
        return waiting(format!("starting pod {name} to read spec.tasks.file"));
    };
    if let Some(why) = pod_view::crashed(&pod) {
        return stalled("TaskFileUnreadable", format!("pod {name}: {why}"));
    }
    // Cannot be scheduled (a claim that does not exist), an image that cannot be pulled: the
    // scheduler's or the kubelet's words, on the job.
    if let Some(p) = crate::pod_problem::problem(&pod) {
        return stalled(
            &p.reason,
            format!("the job's task loader cannot run: {}", p.describe()),
        );
    }
    let ip = pod.status.as_ref().and_then(|s| s.pod_ip.clone());
    let (Some(ip), true) = (ip, crate::pool_controller::is_ready(&pod)) else {
        return waiting(format!("waiting for pod {name} to read spec.tasks.file"));
    };
    let url = format!("http://{ip}:{}/tasks", super::aux_pods::INGEST_PORT);
    let text = match ctx
        .http
        .get(&url)
        .timeout(Duration::from_secs(60))
        .send()
        .await
    {
        Ok(r) if r.status().is_success() => match r.text().await {
            Ok(t) => t,
            Err(e) => return waiting(format!("reading {url}: {e}")),
        },
        Ok(r) => return waiting(format!("{url} answered {}", r.status())),
        Err(e) => return waiting(format!("reading {url}: {e}")),
    };
    let file = job.spec.tasks.file.as_ref().map_or("", |f| f.path.as_str());
    let tasks = match tasks::parse_jsonl(&text, &format!("task file {file}")) {
        Ok(t) => Arc::new(t),
        Err(e) => return stalled("InvalidTasks", e),
    };
    tracing::info!(job = %job.name_any(), tasks = tasks.len(), "read the task file");
    ctx.file_tasks
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(uid, (key, tasks.clone()));
    Ok(Ok(tasks))
}

impl Observed {
    /// The task and sample of a session index (task-major numbering).
    fn session(&self, index: u32) -> Option<(&Task, u32)> {
        let task = self.tasks.get((index / self.samples) as usize)?;
        Some((task, index % self.samples))
    }
}

/// Writes the status with the job's resourceVersion as a precondition; `None` on a conflict.
async fn write_status(
    jobs: &Api<RolloutJob>,
    job: &RolloutJob,
    rv: Option<&str>,
    st: &RolloutJobStatus,
) -> Result<Option<String>, JobError> {
    let patch = json!({"metadata": {"resourceVersion": rv}, "status": st});
    match jobs
        .patch_status(
            &job.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(j) => Ok(j.resource_version()),
        Err(kube::Error::Api(s)) if s.is_conflict() => Ok(None),
        Err(e) => Err(e.into()),
    }
}

async fn report_folds(job: &RolloutJob, ctx: &JobContext, decided: &JobPlan) {
    let (ns, name) = (job.namespace().unwrap_or_default(), job.name_any());
    for (pod, fold) in &decided.folds {
        let result = match fold {
            Fold::Scored { .. } => "scored",
            Fold::Retry { .. } => "retried",
            Fold::Failed { .. } => "failed",
        };
        ctx.metrics
            .session_results
            .with_label_values(&[ns.as_str(), name.as_str(), result])
            .inc();
        match fold {
            Fold::Scored { index, reward } => {
                tracing::info!(job = %job.name_any(), %pod, index, reward, "session scored");
            }
            Fold::Retry {
                index,
                next_attempt,
                reason,
            } => {
                tracing::warn!(job = %job.name_any(), %pod, index, "session retried: {reason}");
                ctx.event(
                    job,
                    EventType::Warning,
                    "SessionRetried",
                    format!("session {index} (pod {pod}) failed: {reason}; attempt {next_attempt} follows on a fresh pod"),
                )
                .await;
            }
            Fold::Failed { index, reason } => {
                ctx.event(
                    job,
                    EventType::Warning,
                    "SessionFailed",
                    format!("session {index} (pod {pod}) failed after backoffLimit {} retries: {reason}; no reward recorded", job.spec.backoff_limit),
                )
                .await;
            }
        }
    }
}

/// A pod whose result is recorded: its finalizer comes off and it is deleted (the pool
/// refills). Returns the pod's last resourceVersion this wrote, if it still exists.
async fn release(pods: &Api<Pod>, name: &str) -> Result<Option<String>, JobError> {
    let patch =
        json!({"metadata": {"finalizers": null, "labels": {STATE_LABEL: PodState::Done.label()}}});
    let patched = match pods
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(p) => p.metadata.resource_version,
        Err(kube::Error::Api(s)) if s.is_not_found() => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    Ok(delete_pod(pods, name).await?.or(patched))
}

/// Every pod of the job, released (a finished or deleted job).
async fn release_all(ctx: &JobContext, job: &RolloutJob, ns: &str) -> Result<(), JobError> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let owned = pods
        .list(&ListParams::default().labels(&format!("{JOB_LABEL}={}", job.name_any())))
        .await?;
    for pod in owned.items {
        ctx.tokens.forget(ns, &pod.name_any());
        release(&pods, &pod.name_any()).await?;
    }
    Ok(())
}

/// Delete a pod; returns its resourceVersion when the deletion is graceful (the pod stays,
/// terminating, for now).
async fn delete_pod(pods: &Api<Pod>, name: &str) -> Result<Option<String>, JobError> {
    match pods.delete(name, &DeleteParams::default()).await {
        // The pod itself while it terminates; a Status once it is gone.
        Ok(answer) => Ok(answer.left().and_then(|p| p.metadata.resource_version)),
        Err(kube::Error::Api(status)) if status.is_not_found() => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// After deleting a job's pod: the cache must show it at that version (terminating) or gone.
fn bar_after_delete(version_written: Option<String>) -> Bar {
    // Gone before any version was written: the cache must drop it.
    version_written.as_deref().map_or(Bar::gone(), |v| {
        Bar::at_least_or_gone(version(Some(v)).unwrap_or(u64::MAX))
    })
}

/// Claim one READY pod for a session attempt: a compare-and-swap on the pod (its
/// resourceVersion) that relabels it, records the session, moves the controller ownerRef from
/// the pool to the job and adds the finalizer that keeps the pod until its result is folded.
/// `None` when another claimer (or the pool) changed the pod first.
async fn claim(
    ctx: &JobContext,
    job: &RolloutJob,
    o: &Observed,
    pod: &Pod,
    index: u32,
    attempt: u32,
) -> Result<Option<Pod>, JobError> {
    let Some((task, sample)) = o.session(index) else {
        tracing::error!(job = %o.name, index, "session index beyond the job's tasks");
        return Ok(None);
    };
    let session = session::session_id(&o.name, &task.id, sample, attempt);
    let owner = job.controller_owner_ref(&());
    let patch = json!({"metadata": {
        "resourceVersion": pod.resource_version(),
        "labels": {STATE_LABEL: PodState::Claimed.label(), JOB_LABEL: o.name},
        "annotations": {
            INDEX_ANNOTATION: index.to_string(),
            ATTEMPT_ANNOTATION: attempt.to_string(),
            SESSION_ANNOTATION: session,
            CLAIMED_AT_ANNOTATION: k8s_openapi::jiff::Timestamp::now().to_string(),
        },
        "ownerReferences": owner.map(|o| vec![o]),
        "finalizers": [SESSION_FINALIZER],
        // The pool's READY mark cleared the pod's field-ownership record already; this also
        // clears one a pool pod marked by an older operator still has.
        "managedFields": sandbox_pod::cleared_managed_fields(),
    }});
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &job.namespace().unwrap_or_default());
    match pods
        .patch(
            &pod.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(p) => {
            tracing::info!(job = %o.name, pod = %pod.name_any(), index, attempt, "claimed");
            ctx.raise_bar(
                &job.uid().unwrap_or_default(),
                &p.name_any(),
                Bar::written(version(p.metadata.resource_version.as_deref()).unwrap_or(u64::MAX)),
            );
            Ok(Some(p))
        }
        Err(kube::Error::Api(s)) if s.is_conflict() || s.is_not_found() => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// One claim of a round.
enum ClaimOutcome {
    /// Someone else took the pod first (or it went): the session waits for the next round.
    Lost,
    /// The pod is the session's; `acknowledged` names it once its gateway took the assignment.
    Claimed { acknowledged: Option<String> },
}

/// poolTemplate: deliver the assignments of sessions whose pre-warmed pod is Ready (counted as
/// claims: warm when the pod was Ready before the session could start, cold when the session
/// waited for it). Returns how many pods were found to start, and those whose gateway
/// acknowledged.
async fn start_prewarmed(
    ctx: &JobContext,
    job: &RolloutJob,
    observed: &Observed,
    names: &[String],
    round: Instant,
) -> (usize, Vec<String>) {
    let uid = job.uid().unwrap_or_default();
    let pods: Vec<(Pod, u32)> = names
        .iter()
        .filter_map(|name| observed.pods.iter().find(|p| p.name_any() == *name))
        .filter_map(|p| Some((p.clone(), pod_view::session_pod(p)?.index)))
        .collect();
    let found = pods.len();
    let (uid, observed) = (&uid, observed);
    let acknowledged = futures::stream::iter(pods)
        .map(|(pod, index): (Pod, u32)| async move {
            ctx.count_claim(uid, index);
            deliver(ctx, job, observed, &pod, Some(round)).await
        })
        .buffer_unordered(ctx.in_flight)
        .filter_map(std::future::ready)
        .collect()
        .await;
    (found, acknowledged)
}

/// Record on each pod that its gateway holds the assignment, so later rounds stop delivering
/// it (a lost mark only costs a repeated delivery, which the gateway takes idempotently).
async fn mark_assigned(ctx: &JobContext, ns: &str, names: Vec<String>) {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let pods = &pods;
    futures::stream::iter(names)
        .for_each_concurrent(ctx.in_flight, |name: String| async move {
            // A `poolTemplate` pod still has its creation's field-ownership record: from here
            // on the apiserver tracks none of its writes (`cleared_managed_fields`).
            let patch = json!({"metadata": {
                "annotations": {ASSIGNED_ANNOTATION: k8s_openapi::jiff::Timestamp::now().to_string()},
                "managedFields": sandbox_pod::cleared_managed_fields(),
            }});
            if let Err(e) = pods
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                tracing::warn!(%name, "cannot mark the assignment delivered: {e}");
            }
        })
        .await;
}

/// poolTemplate: create the pods (and their control-token Secrets) of the next sessions.
/// Keep a `poolTemplate` job's egress NetworkPolicy as its spec says
/// ([`crate::egress_policy::build_for_job`]). A failure (no RBAC for NetworkPolicies, say) is a
/// Warning on the job, not a failed reconcile: each pod's own check still says whether its
/// egress is open.
async fn ensure_job_egress_policy(ctx: &JobContext, job: &RolloutJob) {
    let ns = job.namespace().unwrap_or_default();
    let name = crate::egress_policy::job_policy_name(&job.name_any());
    let wanted = match crate::egress_policy::build_for_job(job) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(job = %job.name_any(), "egress policy: {e}");
            return;
        }
    };
    if let Err(e) =
        crate::pool_controller::keep_policy(&ctx.client, &ns, &name, wanted.as_ref()).await
    {
        tracing::warn!(job = %job.name_any(), "egress policy {name}: {e}");
        ctx.event(
            job,
            EventType::Warning,
            "EgressPolicyFailed",
            format!("cannot apply NetworkPolicy {name} (spec.egress): {e}"),
        )
        .await;
    }
}

async fn create_prewarmed(
    ctx: &JobContext,
    job: &RolloutJob,
    observed: &Observed,
    sessions: &[(u32, u32)],
) -> Result<(), JobError> {
    let Some(template) = &job.spec.pool_template else {
        return Ok(());
    };
    if sessions.is_empty() {
        return Ok(());
    }
    // The pods' NetworkPolicy before the pods: applied with each batch of new pods, so one
    // deleted by hand comes back before the next untrusted agent starts.
    ensure_job_egress_policy(ctx, job).await;
    let created: Vec<Result<(), JobError>> = futures::stream::iter(sessions.to_vec())
        .map(|(index, attempt)| async move {
            let Some((task, sample)) = observed.session(index) else {
                return Ok(());
            };
            let session = session::session_id(&observed.name, &task.id, sample, attempt);
            let suffix = crate::sandbox_pod::random_suffix();
            let pod = super::prewarm::build(&super::prewarm::SessionPodFor {
                job,
                template,
                task,
                index,
                attempt,
                session: &session,
                suffix: &suffix,
                floe_image: &ctx.floe_image,
                native_sidecars: ctx.native_sidecars,
            })?;
            let job_name = job.name_any();
            let created = crate::pool_controller::create_with_control_secret(
                &ctx.client,
                &ctx.tokens,
                &pod,
                (JOB_LABEL, &job_name),
            )
            .await?;
            ctx.raise_bar(
                &job.uid().unwrap_or_default(),
                &created.name_any(),
                Bar::written(
                    version(created.metadata.resource_version.as_deref()).unwrap_or(u64::MAX),
                ),
            );
            tracing::info!(job = %job_name, pod = %pod.name_any(), "created pre-warmed session pod");
            Ok(())
        })
        .buffer_unordered(ctx.in_flight)
        .collect()
        .await;
    created.into_iter().collect()
}

/// The token a Secret holds, remembered under `key`: read once per operator process (the
/// operator made most of them itself and remembered them then).
async fn secret_token(ctx: &JobContext, ns: &str, key: &str, secret: &str) -> Option<String> {
    if let Some(t) = ctx.tokens.get(ns, key) {
        return Some(t);
    }
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    let token = match secrets.get(secret).await {
        Ok(s) => crate::sandbox_pod::control_token_of(&s),
        Err(e) => {
            tracing::warn!(%secret, "token: {e}");
            None
        }
    }?;
    ctx.tokens.remember(ns, key, &token);
    Some(token)
}

/// The job's token (its Secret [`super::aux_pods::job_token_secret`]): what its gateways show
/// its ingest and policy server, and the operator the collector's finish.
async fn job_token(ctx: &JobContext, job: &RolloutJob) -> Option<String> {
    let secret = super::aux_pods::job_token_secret(&job.name_any());
    let ns = job.namespace().unwrap_or_default();
    secret_token(ctx, &ns, &format!("secret/{secret}"), &secret).await
}

/// Where sessions' model calls and trajectories go, by the job's mode, with the job's token:
/// the trainer's (or collector's) ingest and a train job's policy server demand it.
fn wiring(
    job: &RolloutJob,
    job_token: Option<String>,
    upstream_key: Option<String>,
) -> (Sink, SessionUpstream) {
    let ns = job.namespace().unwrap_or_default();
    let name = job.name_any();
    match (&job.spec.train, &job.spec.sft) {
        (Some(_), _) => (
            Sink::Trainer {
                url: format!(
                    "http://{}.{ns}.svc:{}/v1/trajectories",
                    super::aux_pods::trainer_service(&name),
                    super::aux_pods::INGEST_PORT
                ),
                token: job_token.clone(),
            },
            // The job's own policy server is vLLM, whatever the pool's gateways default to.
            SessionUpstream {
                url: Some(format!(
                    "http://{}.{ns}.svc:{}",
                    super::aux_pods::policy_service(&name),
                    super::aux_pods::VLLM_PORT
                )),
                model: Some(super::aux_pods::SERVED_MODEL.to_string()),
                kind: Some(UpstreamKind::Vllm),
                // The policy proxy refuses inference without the job's token.
                api_key: job_token,
            },
        ),
        (None, Some(sft)) => (
            Sink::Trainer {
                url: format!(
                    "http://{}.{ns}.svc:{}/v1/trajectories",
                    super::aux_pods::dataset_service(&name),
                    super::aux_pods::INGEST_PORT
                ),
                token: job_token,
            },
            SessionUpstream {
                url: Some(sft.upstream.url.clone()),
                model: sft.upstream.model.clone(),
                kind: Some(session::upstream_kind(sft.upstream.kind)),
                api_key: upstream_key,
            },
        ),
        (None, None) => (Sink::None, SessionUpstream::default()),
    }
}

/// Post the session's assignment to the pod's gateway control port. Idempotent at the
/// gateway (by session id), so a retry after a lost reply or an operator restart is safe.
/// Failures are logged and retried on the next reconcile. Returns the pod's name once its
/// gateway acknowledged (for [`mark_assigned`]).
async fn deliver(
    ctx: &JobContext,
    job: &RolloutJob,
    o: &Observed,
    pod: &Pod,
    claimed: Option<Instant>,
) -> Option<String> {
    let name = pod.name_any();
    let Some(ip) = pod.status.as_ref().and_then(|s| s.pod_ip.clone()) else {
        tracing::warn!(%name, "claimed pod has no IP yet");
        return None;
    };
    let annotations = pod.annotations();
    let (Some(index), attempt) = (
        annotations
            .get(INDEX_ANNOTATION)
            .and_then(|i| i.parse::<u32>().ok()),
        annotations
            .get(ATTEMPT_ANNOTATION)
            .and_then(|a| a.parse::<u32>().ok())
            .unwrap_or(0),
    ) else {
        return None;
    };
    let Some((task, sample)) = o.session(index) else {
        tracing::error!(%name, index, "session index beyond the job's tasks");
        return None;
    };
    let ns = job.namespace().unwrap_or_default();
    let job_token = match (&job.spec.train, &job.spec.sft) {
        (None, None) => None,
        // Without it the trainer or collector would refuse every trajectory: wait for it.
        _ => Some(job_token(ctx, job).await?),
    };
    let (sink, upstream) = wiring(job, job_token, o.upstream_key.clone());
    let assignment = session::assignment(&SessionOf {
        job: &o.name,
        spec: &job.spec,
        task,
        sample,
        attempt,
        sink: &sink,
        upstream,
        shared_hidden_files: &o.hidden,
    });
    let token = secret_token(
        ctx,
        &ns,
        &name,
        &crate::sandbox_pod::control_secret_name(&name),
    )
    .await?;
    let url = format!(
        "http://{}/floe/v1/assignments",
        join_host_port(&ip, o.control_port)
    );
    let sent = ctx
        .http
        .post(&url)
        .bearer_auth(&token)
        .json(&assignment)
        .send()
        .await;
    match sent {
        Ok(r) if r.status().is_success() => {
            if let Some(t) = claimed {
                ctx.metrics.claim_latency.observe(t.elapsed().as_secs_f64());
            }
            return Some(name);
        }
        Ok(r) => {
            let code = r.status();
            let body = r.text().await.unwrap_or_default();
            tracing::warn!(%name, %code, "assignment refused: {body}");
            if code == reqwest::StatusCode::CONFLICT {
                ctx.event(
                    job,
                    EventType::Warning,
                    "AssignmentConflict",
                    format!("pod {name} already holds a different session: {body}"),
                )
                .await;
            }
        }
        Err(e) => tracing::warn!(%name, "cannot deliver the assignment: {e}"),
    }
    None
}

fn join_host_port(ip: &str, port: i32) -> String {
    if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    }
}

/// A deleted job: its pods' finalizers come off (garbage collection deletes them), then its
/// own.
async fn cleanup(job: &RolloutJob, ctx: &JobContext, ns: &str) -> Result<Action, JobError> {
    release_all(ctx, job, ns).await?;
    let rest: Vec<String> = job
        .finalizers()
        .iter()
        .filter(|f| *f != JOB_FINALIZER)
        .cloned()
        .collect();
    let jobs: Api<RolloutJob> = Api::namespaced(ctx.client.clone(), ns);
    let patch = json!({"metadata": {"finalizers": rest}});
    match jobs
        .patch(
            &job.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.is_not_found() => {}
        Err(e) => return Err(e.into()),
    }
    let pool = job.spec.pool_ref.as_ref().map(|p| p.name.as_str());
    ctx.metrics.forget_job(ns, &job.name_any(), pool);
    let uid = job.uid().unwrap_or_default();
    ctx.forget_job(&uid);
    ctx.validated
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&uid);
    ctx.file_tasks
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&uid);
    ctx.starved
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|(u, _)| *u != uid);
    Ok(Action::await_change())
}

/// A finished job only waits for its TTL.
/// Seconds until a finished job's `ttlSecondsAfterFinished` passes (≤ 0: passed); `None`
/// without one.
fn ttl_left(job: &RolloutJob, done: &Time, now: &Time) -> Option<i64> {
    job.spec
        .ttl_seconds_after_finished
        .map(|ttl| i64::from(ttl) - now.0.duration_since(done.0).as_secs())
}

/// `ttl_left`: from [`ttl_left`].
async fn after_completion(
    job: &RolloutJob,
    jobs: &Api<RolloutJob>,
    ttl_left: Option<i64>,
) -> Result<Action, JobError> {
    let Some(left) = ttl_left else {
        return Ok(Action::await_change());
    };
    if left > 0 {
        return Ok(Action::requeue(Duration::from_secs(
            u64::try_from(left).unwrap_or(1),
        )));
    }
    tracing::info!(job = %job.name_any(), "ttlSecondsAfterFinished passed: deleting the job");
    match jobs
        .delete(&job.name_any(), &DeleteParams::background())
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.is_not_found() => {}
        Err(e) => return Err(e.into()),
    }
    Ok(Action::await_change())
}

async fn report_blocked(
    job: &RolloutJob,
    ctx: &JobContext,
    jobs: &Api<RolloutJob>,
    blocked: &Blocked,
    now: Time,
) -> Result<Action, JobError> {
    let previous = job.status.as_ref();
    let state = job_state(job, previous, &now, 0);
    let st = status::status(
        &StatusInput {
            previous,
            generation: job.metadata.generation,
            state: &state,
            running: 0,
            blocked: Some(blocked),
            now,
            trainer_unfinished: false,
        },
        previous.and_then(|s| s.start_time.clone()),
    );
    let st = RolloutJobStatus {
        sessions: previous.map(|p| p.sessions.clone()).unwrap_or_default(),
        progress: previous.and_then(|p| p.progress.clone()),
        ..st
    };
    ctx.metrics.set_blocked(
        crate::metrics::Kind::RolloutJob,
        &job.namespace().unwrap_or_default(),
        &job.name_any(),
        (!blocked.transient).then_some(blocked.reason.as_str()),
    );
    let was = previous
        .and_then(|p| p.conditions.iter().find(|c| c.type_ == "Stalled"))
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()));
    if blocked.transient {
        if previous != Some(&st) {
            write_status(jobs, job, job.resource_version().as_deref(), &st).await?;
        }
        // The pod it waits for triggers a reconcile when it changes; this is the fallback.
        return Ok(Action::requeue(Duration::from_secs(5)));
    }
    if was
        != Some((
            "True".into(),
            blocked.reason.clone(),
            blocked.message.clone(),
        ))
    {
        tracing::warn!(job = %job.name_any(), reason = %blocked.reason, "{}", blocked.message);
        ctx.event(
            job,
            EventType::Warning,
            &blocked.reason,
            blocked.message.clone(),
        )
        .await;
    }
    if previous != Some(&st) {
        write_status(jobs, job, job.resource_version().as_deref(), &st).await?;
    }
    // The user fixes the spec (a watch event) or creates the missing object.
    Ok(Action::requeue(Duration::from_secs(15)))
}

/// Events on phase transitions only.
async fn announce_transition(
    job: &RolloutJob,
    ctx: &JobContext,
    before: Option<&RolloutJobStatus>,
    after: &RolloutJobStatus,
) {
    let was = before.and_then(|s| s.phase);
    if was == after.phase {
        return;
    }
    let message = after
        .conditions
        .first()
        .map(|c| c.message.clone())
        .unwrap_or_default();
    let (type_, reason) = match after.phase {
        Some(floe_crds::rollout_job::RolloutJobPhase::Running) => (EventType::Normal, "Started"),
        Some(floe_crds::rollout_job::RolloutJobPhase::Suspended) => {
            (EventType::Normal, "Suspended")
        }
        Some(floe_crds::rollout_job::RolloutJobPhase::Succeeded) => {
            (EventType::Normal, "Completed")
        }
        Some(floe_crds::rollout_job::RolloutJobPhase::Failed) => (EventType::Warning, "Failed"),
        _ => return,
    };
    ctx.event(job, type_, reason, message).await;
}

fn set_session_gauges(ctx: &JobContext, ns: &str, job: &str, st: &RolloutJobStatus) {
    let s = &st.sessions;
    for (state, n) in [
        ("pending", s.pending),
        ("running", s.running),
        ("succeeded", s.succeeded),
        ("failed", s.failed),
    ] {
        ctx.metrics
            .sessions
            .with_label_values(&[ns, job, state])
            .set(i64::from(n));
    }
    // Every result's counter exists from the job's first round, at 0: a counter whose first
    // sample is already 1 shows no increase() to Prometheus, so a job's first failures would
    // never reach FloeSessionFailuresHigh.
    for result in ["scored", "retried", "failed"] {
        ctx.metrics
            .session_results
            .with_label_values(&[ns, job, result])
            .inc_by(0);
    }
}

/// Create the job's trainer pod (train) or dataset collector (sft) and their Services when
/// missing; returns the pod as it is now.
async fn ensure_aux(
    job: &RolloutJob,
    ctx: &JobContext,
    ns: &str,
) -> Result<Result<Option<Pod>, Blocked>, JobError> {
    use super::aux_pods;
    let built = match (&job.spec.train, &job.spec.sft) {
        (Some(_), _) => aux_pods::trainer(job, &ctx.floe_image),
        (None, Some(_)) => aux_pods::collector(job, &ctx.floe_image),
        _ => Ok(None),
    };
    // A pod that cannot be built must not read as "no pod needed": the gate would open.
    let objects = match built {
        Ok(Some(o)) => o,
        Ok(None) => return Ok(Ok(None)),
        Err(e) => {
            return Ok(Err(Blocked::stalled(
                "InvalidSpec",
                format!("cannot build the job's own pod from its spec: {e}"),
            )))
        }
    };
    let name = objects.pod.name_any();
    // The pod cache holds it (floe's label) with all a round reads of it: readiness and IP.
    if let Some(p) = ctx.pods.get(&ObjectRef::new(&name).within(ns)) {
        return Ok(Ok(Some((*p).clone())));
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    if let Some(p) = pods.get_opt(&name).await? {
        return Ok(Ok(Some(p)));
    }
    // A job suspended before it ran (Kueue admits jobs by resuming them) holds no trainer GPU
    // or collector until it is resumed; it starts no session meanwhile either.
    if job.spec.suspend {
        return Ok(Ok(None));
    }
    // Services first: the pod's clients find them ready when it is.
    let services: Api<k8s_openapi::api::core::v1::Service> =
        Api::namespaced(ctx.client.clone(), ns);
    for svc in &objects.services {
        if let Err(b) = refused(create_if_missing(&services, svc).await, "Service", svc)? {
            return Ok(Err(b));
        }
    }
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(ctx.client.clone(), ns);
    for secret in &objects.secrets {
        if let Err(b) = refused(create_if_missing(&secrets, secret).await, "Secret", secret)? {
            return Ok(Err(b));
        }
    }
    tracing::info!(job = %job.name_any(), pod = %name, "creating the job's pod");
    if let Err(b) = refused(
        create_if_missing(&pods, &objects.pod).await,
        "pod",
        &objects.pod,
    )? {
        return Ok(Err(b));
    }
    Ok(Ok(pods.get_opt(&name).await?))
}

/// A create the apiserver refuses for good (an admission rule, a quota, a RuntimeClass that
/// does not exist, RBAC) is the user's to fix: the job stalls saying which object and why,
/// instead of failing every reconcile with the words in the operator's log only.
fn refused<K: kube::Resource>(
    created: Result<(), JobError>,
    kind: &str,
    object: &K,
) -> Result<Result<(), Blocked>, JobError> {
    match created {
        Err(JobError::Kube(kube::Error::Api(e)))
            if (400..500).contains(&e.code) && !matches!(e.code, 408 | 409 | 429) =>
        {
            Ok(Err(Blocked::stalled(
                if kind == "pod" {
                    "PodCreateRejected"
                } else {
                    "CreateRejected"
                },
                format!(
                    "the apiserver refused the job's {kind} {}: {}",
                    object.meta().name.as_deref().unwrap_or_default(),
                    e.message
                ),
            )))
        }
        other => other.map(Ok),
    }
}

async fn create_if_missing<K>(api: &Api<K>, object: &K) -> Result<(), JobError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    match api.create(&kube::api::PostParams::default(), object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// `path` on the trainer pod's ingest port, once the pod has an IP.
fn trainer_endpoint(pod: &Pod, path: &str) -> Option<String> {
    let ip = pod.status.as_ref()?.pod_ip.clone()?;
    Some(format!(
        "http://{}{path}",
        join_host_port(&ip, super::aux_pods::INGEST_PORT)
    ))
}

/// The trainer's `GET /v1/status` (step, policy version, last step time), mirrored into the
/// job's status; `None` while it cannot be read.
async fn trainer_progress(
    ctx: &JobContext,
    pod: &Pod,
) -> Option<floe_crds::rollout_job::TrainerProgress> {
    let url = trainer_endpoint(pod, "/v1/status")?;
    let reply = ctx
        .http
        .get(&url)
        .timeout(Duration::from_secs(2))
        .send()
        .await
        .ok()?;
    if !reply.status().is_success() {
        return None;
    }
    let v: serde_json::Value = reply.json().await.ok()?;
    Some(floe_crds::rollout_job::TrainerProgress {
        step: v.get("step")?.as_i64()?,
        policy_version: v.get("policyVersion")?.as_i64()?,
        last_step_time: v
            .get("lastStepTime")
            .and_then(|t| t.as_str())
            .and_then(|t| t.parse().ok())
            .map(Time),
        finished: v.get("finished").and_then(|f| f.as_bool()).unwrap_or(false),
        final_model: v
            .get("finalCheckpoint")
            .and_then(|f| f.as_str())
            .map(String::from),
    })
}

/// `POST /v1/finish` to the trainer with the job's control token: the sessions are done, train
/// what is left and write the final model.
async fn finish_trainer(
    ctx: &JobContext,
    job: &RolloutJob,
    ns: &str,
    pod: &Pod,
) -> Result<(), String> {
    let url = trainer_endpoint(pod, "/v1/finish").ok_or("the trainer pod has no IP")?;
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(ctx.client.clone(), ns);
    let name = super::aux_pods::trainer_control_secret(&job.name_any());
    let secret = secrets
        .get_opt(&name)
        .await
        .map_err(|e| format!("reading Secret {name}: {e}"))?
        .ok_or_else(|| format!("Secret {name} is missing"))?;
    let token = crate::sandbox_pod::control_token_of(&secret)
        .ok_or_else(|| format!("Secret {name} has no {CONTROL_TOKEN_KEY}"))?;
    let reply = ctx
        .http
        .post(&url)
        .bearer_auth(token)
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .map_err(|e| format!("POST {url}: {e}"))?;
    if !reply.status().is_success() {
        return Err(format!("POST {url}: {}", reply.status()));
    }
    Ok(())
}
