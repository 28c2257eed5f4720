//! A round's reads: the job's pool, tasks, hidden files and pods. What makes the job unable to
//! run as written stops the round here ([`Halt::Blocked`]), before any claim.

use std::collections::BTreeMap;
use std::sync::Arc;

use floe_crds::gateway_pool::GatewayPool;
use floe_crds::rollout_job::{RolloutJob, SessionPlace, Task};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::ListParams;
use kube::{Api, ResourceExt};

use super::{task_sources, Halt, JobContext, JobError};
use crate::metrics::PodSource;
use crate::pods::names::{JOB_LABEL, POOL_LABEL, STATE_LABEL};
use crate::pods::PodState;
use crate::rollout::freshness::Bars;
use crate::rollout::held_out;
use crate::rollout::status::Blocked;
use crate::rollout::tasks;

/// Everything one round needs to know about where the job stands.
pub(super) struct Observed {
    pub(super) name: String,
    /// `numSamples` (at least 1).
    pub(super) samples: u32,
    /// `train.epochs` (at least 1).
    pub(super) epochs: u32,
    pub(super) tasks: Arc<Vec<Task>>,
    /// `train.heldOut`: its tasks (empty without), samples per task and the step each round
    /// opened at (this round's plan may open one: [`Observed::held_out_steps`] is then set
    /// from it before any claim).
    pub(super) held_out: Arc<Vec<Task>>,
    pub(super) held_out_samples: u32,
    /// The held-out set's digest, recorded with its rounds ([`held_out::digest`]).
    pub(super) held_out_digest: String,
    /// The job's own tasks' digest, recorded at its first claim
    /// ([`held_out::job_tasks_digest`]).
    pub(super) tasks_digest: String,
    pub(super) held_out_steps: Vec<u64>,
    pub(super) hidden: BTreeMap<String, String>,
    pub(super) control_port: i32,
    /// The pool the job claims from (`None`: `poolTemplate`).
    pub(super) pool: Option<GatewayPool>,
    pub(super) pods: Vec<Pod>,
    pub(super) ready: Vec<Pod>,
    /// An `sft` job's model server key (`spec.sft.upstream.apiKeySecret`), for its gateways.
    pub(super) upstream_key: Option<String>,
}

/// The pool, the tasks and the pods; `Err(Blocked)` when the job cannot run as written.
pub(super) async fn observe(
    job: &RolloutJob,
    ctx: &JobContext,
    ns: &str,
) -> Result<Observed, Halt> {
    let blocked =
        |reason: &str, message: String| Err(Halt::Blocked(Blocked::stalled(reason, message)));
    // apiservers < 1.25 do not run the CRD's CEL rules: the operator applies the same ones.
    if let Err(e) = ctx.validate(job) {
        return blocked("InvalidSpec", e);
    }
    if let Some(why) = ctx.dropped_by_an_older_crd(job, ns).await? {
        return blocked(super::report::CRD_OUTDATED, why);
    }
    if let Some(why) = crate::spec_check::served_crd_lacks(&ctx.served_crds, job, "job") {
        return blocked(super::report::CRD_OUTDATED, why);
    }
    if let Some(why) = crate::spec_check::served_crd_lacks_status(&ctx.served_crds) {
        return blocked(super::report::CRD_OUTDATED, why);
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
            let secret = secrets
                .get_opt(&r.name)
                .await
                .map_err(JobError::api(format!("reading Secret {ns}/{}", r.name)))?;
            match secret.as_ref().and_then(|s| crate::pods::view::secret_value(s, &r.key)) {
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
    let held_out_swebench = spec
        .train
        .as_ref()
        .and_then(|t| t.held_out.as_ref())
        .is_some_and(|h| h.tasks.swebench.is_some());
    let swebench_field = if spec.tasks.swebench.is_some() {
        Some("spec.tasks.swebench")
    } else {
        held_out_swebench.then_some("spec.train.heldOut.tasks.swebench")
    };
    if let Some(field) = swebench_field.filter(|_| spec.pool_ref.is_some()) {
        return blocked(
            "InvalidSpec",
            format!(
                "SWE-bench instances ({field}) each run in their own image: use \
                 spec.poolTemplate (a pod per session, lookahead pre-warming), not a pool"
            ),
        );
    }
    let configmaps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), ns);
    // Files on claims, the job's own and its held-out set's, come from one loader pod.
    let files = task_sources::file_tasks(job, ctx, ns).await?;
    let tasks = match (&spec.tasks.inline, &spec.tasks.config_map, files.tasks) {
        (Some(t), _, _) => Arc::new(t.clone()),
        (None, Some(_), _) => {
            task_sources::config_map_tasks(&configmaps, ns, &spec.tasks, "spec.tasks").await?
        }
        (None, None, Some(t)) => t,
        (None, None, None) => return blocked("InvalidSpec", "spec.tasks names no source".into()),
    };
    let tasks_digest = held_out::job_tasks_digest(&tasks, spec.samples(), spec.epochs());
    let recorded = job.status.as_ref().and_then(|s| s.tasks_digest.as_deref());
    if let Some(why) = held_out::tasks_changed(recorded, &tasks_digest) {
        return blocked("TasksChanged", why);
    }
    let held_out_spec = spec.train.as_ref().and_then(|t| t.held_out.as_ref());
    let held_out = match held_out_spec.map(|h| &h.tasks) {
        None => Arc::default(),
        Some(source) => match (&source.inline, &source.config_map, files.held_out) {
            (Some(t), _, _) => Arc::new(t.clone()),
            (None, Some(_), _) => {
                let field = "spec.train.heldOut.tasks";
                task_sources::config_map_tasks(&configmaps, ns, source, field).await?
            }
            (None, None, Some(t)) => t,
            (None, None, None) => {
                return blocked(
                    "InvalidSpec",
                    "spec.train.heldOut.tasks names no source".into(),
                )
            }
        },
    };
    let hidden = match &spec.evaluator.hidden_files_from {
        Some(r) => match configmaps
            .get_opt(&r.name)
            .await
            .map_err(JobError::api(format!("reading ConfigMap {ns}/{}", r.name)))?
        {
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
    let held_out_samples =
        held_out_spec.map_or(1, |h| u32::try_from(h.samples).unwrap_or(1).max(1));
    let held_out_digest = held_out::digest(&held_out, held_out_samples);
    if held_out_spec.is_some() {
        let per_round = held_out.len() as u64 * u64::from(held_out_samples);
        let recorded = job.status.as_ref().and_then(|s| s.held_out.as_ref());
        let total = floe_crds::rollout_job::numbering::session_count(
            tasks.len(),
            spec.samples(),
            spec.epochs(),
        );
        let total = u32::try_from(total).unwrap_or(u32::MAX);
        if let Some(why) = held_out::set_changed(recorded, total, per_round, &held_out_digest) {
            return blocked("HeldOutTasksChanged", why);
        }
    }
    let name = job.name_any();
    // What would fail every session only after its agent ran: refused before the first claim.
    let tasks_field = match (&spec.tasks.inline, &spec.tasks.config_map, &spec.tasks.file) {
        (Some(_), _, _) => "spec.tasks.inline".to_string(),
        (None, Some(cm), _) => format!("ConfigMap {}/{}", cm.name, cm.key),
        (None, None, Some(f)) => format!("task file {}", f.path),
        (None, None, None) => "spec.tasks".to_string(),
    };
    let mut problems =
        floe_sandbox::checks::check_sessions(&name, spec, &tasks, &tasks_field, &hidden);
    if held_out_spec.is_some() {
        problems.extend(floe_crds::validation::empty_held_out_set(
            &held_out,
            "spec.train.heldOut.tasks",
        ));
        problems.extend(floe_sandbox::checks::check_sessions(
            &name,
            spec,
            &held_out,
            "spec.train.heldOut.tasks",
            &hidden,
        ));
    }
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
                    && crate::pods::view::is_ready(p)
                    // A pod of an older template may grade in another image.
                    && spec.evaluator.image.as_ref().is_none_or(|want| {
                        crate::pods::view::grader_image(p) == Some(want.as_str())
                    })
            })
            .into_iter()
            .map(|p| (*p).clone())
            .collect(),
        None => Vec::new(),
    };
    // Oldest first: stale-template pods (OnReplenish) go before fresh ones.
    ready.sort_by_key(|p| p.metadata.creation_timestamp.as_ref().map(|t| t.0));
    Ok(Observed {
        name,
        samples: spec.samples(),
        epochs: spec.epochs(),
        tasks,
        held_out_samples,
        held_out_digest,
        tasks_digest,
        held_out_steps: job
            .status
            .as_ref()
            .and_then(|s| s.held_out.as_ref())
            .map(|h| {
                h.rounds
                    .iter()
                    .map(|r| u64::try_from(r.step).unwrap_or(0))
                    .collect()
            })
            .unwrap_or_default(),
        held_out,
        hidden,
        control_port: pool.as_ref().map_or_else(
            || floe_crds::gateway_pool::GatewaySettings::default().control_port,
            |p| p.spec.gateway.control_port,
        ),
        pool,
        pods: owned,
        ready,
        upstream_key,
    })
}

/// The job's pods. A claim must never be made twice, so they come from the watch cache only
/// once it has caught up with every write of this operator (see [`crate::rollout::freshness`]);
/// otherwise from the apiserver, a quorum list.
pub(super) async fn job_pods(
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
    let caught_up = ctx.remember(&uid, |m| match m.bars.as_mut() {
        Some(b) if b.met(view()) => {
            *b = Bars::default();
            true
        }
        _ => false,
    });
    if caught_up {
        ctx.metrics.job_pods_read(PodSource::Cache);
        return Ok(cached.iter().map(|p| (**p).clone()).collect());
    }
    ctx.metrics.job_pods_read(PodSource::Apiserver);
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let listed = pods
        .list(&ListParams::default().labels(&format!("{JOB_LABEL}={name}")))
        .await
        .map_err(JobError::api(format!("listing job {ns}/{name}'s pods")))?
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
    ctx.remember(&uid, |m| m.bars = Some(bars));
    Ok(listed)
}

impl Observed {
    /// The job's sessions: tasks × samples × epochs.
    pub(super) fn total(&self) -> u32 {
        let n = floe_crds::rollout_job::numbering::session_count(
            self.tasks.len(),
            self.samples,
            self.epochs,
        );
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// The task and place of a session index: the job's own
    /// ([`floe_crds::rollout_job::numbering`]), then the held-out rounds' (`base + round ×
    /// per_round + j`, `j` task-major over samples) of the rounds opened.
    pub(super) fn session(&self, index: u32) -> Option<SessionAt<'_>> {
        let total = self.total();
        if index < total {
            let place = floe_crds::rollout_job::numbering::session_at(
                u64::from(index),
                self.samples,
                self.tasks.len(),
                self.epochs,
            )?;
            return Some(SessionAt {
                task: self.tasks.get(place.task)?,
                place,
                held_out: None,
            });
        }
        let per_round = u32::try_from(self.held_out.len())
            .ok()?
            .checked_mul(self.held_out_samples)?;
        let offset = index - total;
        let round = usize::try_from(offset.checked_div(per_round)?).ok()?;
        let j = offset % per_round;
        Some(SessionAt {
            task: self
                .held_out
                .get(usize::try_from(j / self.held_out_samples).ok()?)?,
            place: SessionPlace {
                epoch: 0,
                task: usize::try_from(j / self.held_out_samples).ok()?,
                sample: j % self.held_out_samples,
            },
            held_out: Some(*self.held_out_steps.get(round)?),
        })
    }
}

/// One session: its task and place, and for a held-out one the step its round measures.
pub(super) struct SessionAt<'a> {
    pub(super) task: &'a Task,
    pub(super) place: SessionPlace,
    pub(super) held_out: Option<u64>,
}

impl SessionAt<'_> {
    /// Its id for `attempt` ([`floe_sandbox::session`]).
    pub(super) fn id(&self, job: &str, attempt: u32) -> String {
        let (task, place) = (&self.task.id, &self.place);
        match self.held_out {
            Some(step) => {
                floe_sandbox::session::held_out_session_id(job, task, place.sample, step, attempt)
            }
            None => {
                floe_sandbox::session::session_id(job, task, place.epoch, place.sample, attempt)
            }
        }
    }
}
