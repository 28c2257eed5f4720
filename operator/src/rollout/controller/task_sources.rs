//! Where a job's tasks come from, beyond its spec: a ConfigMap, or files on claims that a
//! loader pod serves (the job's own and its held-out set's).

use std::sync::Arc;
use std::time::Duration;

use floe_crds::rollout_job::{RolloutJob, Task, TaskSource};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::{Api, ResourceExt};

use super::{name_holder, Halt, JobContext, JobError};
use crate::rollout::status::Blocked;
use crate::rollout::{aux_pods, pod_view, tasks};

/// The files a loader pod's arguments name.
fn loader_key(pod: &Pod) -> Result<String, serde_json::Error> {
    serde_json::to_string(&pod.spec.as_ref().map(|s| &s.containers[0].args))
}

/// Whether `found` reads every variable `made` does, from the same Secret key (its token): a
/// loader an older operator made, which takes none, is made again with it, or a running job's
/// tasks could never be read after an upgrade. Variables of its own beside ours (a mutating
/// webhook's) are no difference, nor is how the apiserver copies a value back.
fn carries_our_variables(found: &Pod, made: &Pod) -> bool {
    let variables = |pod: &Pod| -> Vec<(String, Option<(String, String)>)> {
        let container = pod.spec.as_ref().and_then(|s| s.containers.first());
        container
            .and_then(|c| c.env.as_ref())
            .into_iter()
            .flatten()
            .map(|e| {
                let secret = e
                    .value_from
                    .as_ref()
                    .and_then(|v| v.secret_key_ref.as_ref())
                    .map(|r| (r.name.clone(), r.key.clone()));
                (e.name.clone(), secret)
            })
            .collect()
    };
    let theirs = variables(found);
    variables(made).iter().all(|v| theirs.contains(v))
}

/// Where the task loader's token is remembered: by the job's UID, as the job's token is
/// (`deliver::job_token_key`).
pub(super) fn loader_token_key(job: &RolloutJob) -> String {
    super::secret_token::job_key(job, &aux_pods::task_loader_secret(&job.name_any()))
}

/// Tasks from the ConfigMap `source` names (`field`: where the spec names it).
pub(super) async fn config_map_tasks(
    configmaps: &Api<ConfigMap>,
    ns: &str,
    source: &TaskSource,
    field: &str,
) -> Result<Arc<Vec<Task>>, Halt> {
    let blocked =
        |reason: &str, message: String| Err(Halt::Blocked(Blocked::stalled(reason, message)));
    let Some(cm) = &source.config_map else {
        return blocked("InvalidSpec", format!("{field} names no ConfigMap"));
    };
    let map = configmaps
        .get_opt(&cm.name)
        .await
        .map_err(JobError::api(format!("reading ConfigMap {ns}/{}", cm.name)))?;
    let Some(map) = map else {
        return blocked(
            "TasksNotFound",
            format!("ConfigMap {:?} ({field}.configMap) does not exist", cm.name),
        );
    };
    let Some(text) = map.data.as_ref().and_then(|d| d.get(&cm.key)) else {
        return blocked(
            "TasksNotFound",
            format!("ConfigMap {:?} has no key {:?}", cm.name, cm.key),
        );
    };
    match tasks::parse_jsonl(text, source, &format!("ConfigMap {}/{}", cm.name, cm.key)) {
        Ok(t) => Ok(Arc::new(t)),
        Err(e) => blocked("InvalidTasks", e),
    }
}

/// The task files a job's loader pod serves: its own (`/tasks`) and its held-out set's
/// (`/held-out`), each `None` when the job names no such file.
#[derive(Clone, Default)]
pub(super) struct FileTasks {
    pub(super) tasks: Option<Arc<Vec<Task>>>,
    pub(super) held_out: Option<Arc<Vec<Task>>>,
}

/// `tasks.file` and `train.heldOut.tasks.file`: the operator reads no volumes, so a loader pod
/// mounts the claims and serves the files (`aux_pods::task_loader`); the parsed tasks are kept
/// per job (they cannot change once the job started) and the pod stays for an operator
/// restart to read them again. Nothing to read: nothing is started.
pub(super) async fn file_tasks(
    job: &RolloutJob,
    ctx: &JobContext,
    ns: &str,
) -> Result<FileTasks, Halt> {
    let stalled =
        |reason: &str, message: String| Err(Halt::Blocked(Blocked::stalled(reason, message)));
    let [own, held_out] = aux_pods::task_files(job);
    if own.is_none() && held_out.is_none() {
        return Ok(FileTasks::default());
    }
    let uid = job.uid().unwrap_or_default();
    let Some(loader) = aux_pods::task_loader(job, &ctx.floe_image)? else {
        let field = if own.is_some_and(|f| f.claim_name.is_none()) {
            "spec.tasks.file"
        } else {
            "spec.train.heldOut.tasks.file"
        };
        return stalled(
            "TaskFileNeedsClaim",
            format!("{field}.claimName: in a cluster a task file is read from a PersistentVolumeClaim (or write the tasks inline, or in a ConfigMap)"),
        );
    };
    // The loader's arguments name the files: a changed path (before the job started) means a
    // new loader and a new read.
    let key = loader_key(&loader)?;
    let known = ctx.remember(&uid, |m| {
        m.file_tasks
            .as_ref()
            .filter(|(k, _)| *k == key)
            .map(|(_, tasks)| tasks.clone())
    });
    if let Some(tasks) = known {
        return Ok(tasks);
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let name = loader.name_any();
    let found = pods
        .get_opt(&name)
        .await
        .map_err(JobError::api(format!("reading pod {ns}/{name}")))?;
    if let Some(p) = &found {
        name_holder::ours(&pods, job, p, "pod").await?;
    }
    let pod = match found {
        Some(p) if loader_key(&p)? != key || !carries_our_variables(&p, &loader) => {
            crate::pods::writes::delete(&pods, &name)
                .await
                .map_err(JobError::api(format!("deleting pod {ns}/{name}")))?;
            None
        }
        Some(p) => Some(p),
        // Suspended before its tasks were read (Kueue creates jobs suspended): no pod yet.
        None if job.spec.suspend => {
            return Err(Halt::Blocked(Blocked::waiting(
                "JobSuspended",
                format!("suspended; the task files are read (pod {name}) once the job is resumed"),
            )))
        }
        None => {
            // Its token first: the pod waits for the Secret it reads it from.
            let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
            let secret = aux_pods::task_loader_secret_object(job)?;
            name_holder::create_ours(&secrets, job, &secret, "Secret").await?;
            name_holder::create_ours(&pods, job, &loader, "pod").await?;
            None
        }
    };
    let waiting = |message: String| Err(Halt::Blocked(Blocked::waiting("LoadingTasks", message)));
    let Some(pod) = pod else {
        return waiting(format!("starting pod {name} to read the task files"));
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
    let (Some(ip), true) = (ip, crate::pods::view::is_ready(&pod)) else {
        return waiting(format!("waiting for pod {name} to read the task files"));
    };
    let secret = aux_pods::task_loader_secret(&job.name_any());
    let Some(token) = super::secret_token::of_job(ctx, job, &secret).await else {
        return waiting(format!("reading the task loader's token (Secret {secret})"));
    };
    let read = async |route: &str| -> Result<String, String> {
        let url = format!("http://{ip}:{}{route}", aux_pods::INGEST_PORT);
        match ctx
            .http
            .get(&url)
            .bearer_auth(&token)
            .timeout(Duration::from_secs(60))
            .send()
            .await
        {
            Ok(r) if r.status().is_success() => {
                r.text().await.map_err(|e| format!("reading {url}: {e}"))
            }
            Ok(r) => Err(format!("{url} answered {}", r.status())),
            Err(e) => Err(format!("reading {url}: {e}")),
        }
    };
    let mut out = FileTasks::default();
    let held_out_source = job
        .spec
        .train
        .as_ref()
        .and_then(|t| t.held_out.as_ref())
        .map(|h| &h.tasks);
    for (route, file, source, slot) in [
        ("/tasks", own, Some(&job.spec.tasks), &mut out.tasks),
        ("/held-out", held_out, held_out_source, &mut out.held_out),
    ] {
        let (Some(file), Some(source)) = (file, source) else {
            continue;
        };
        let text = match read(route).await {
            Ok(t) => t,
            Err(e) => return waiting(e),
        };
        match tasks::parse_jsonl(&text, source, &format!("task file {}", file.path)) {
            Ok(t) => *slot = Some(Arc::new(t)),
            Err(e) => return stalled("InvalidTasks", e),
        }
    }
    tracing::info!(job = %job.name_any(), "read the task files");
    ctx.remember(&uid, |m| m.file_tasks = Some((key, out.clone())));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A loader an older operator made (no token variable, or another Secret's) is not taken
    /// for the loader this one makes, so it is made again with its token; the same loader
    /// read back is, and so is one a mutating webhook added variables to.
    #[test]
    fn a_loader_not_reading_this_token_is_made_again_and_one_with_more_variables_is_not(
    ) -> Result<(), serde_json::Error> {
        let job: RolloutJob = serde_json::from_value(serde_json::json!({
            "apiVersion": "floe.dev/v1alpha1", "kind": "RolloutJob",
            "metadata": {"name": "j", "namespace": "ns", "uid": "u"},
            "spec": {"tasks": {"file": {"claimName": "c", "path": "t.jsonl"}}, "numSamples": 1,
                     "harness": {"preset": "pi"}, "poolRef": {"name": "p"},
                     "evaluator": {"command": ["true"]}}}))?;
        let Some(now) = aux_pods::task_loader(&job, "floe:1")? else {
            panic!("a loader");
        };
        let mut older = now.clone();
        if let Some(spec) = older.spec.as_mut() {
            spec.containers[0].env = None;
        }
        let read_back: Pod = serde_json::from_value(serde_json::to_value(&now)?)?;
        assert!(carries_our_variables(&read_back, &now));
        assert!(!carries_our_variables(&older, &now));
        // Another Secret for the same variable (an earlier build's name): not ours.
        let mut elsewhere = now.clone();
        let mut webhooked = now.clone();
        if let (Some(e), Some(w)) = (elsewhere.spec.as_mut(), webhooked.spec.as_mut()) {
            let env = e.containers[0].env.get_or_insert_with(Vec::new);
            if let Some(r) = env[0]
                .value_from
                .as_mut()
                .and_then(|v| v.secret_key_ref.as_mut())
            {
                r.name = "j-tasks-token".into();
            }
            w.containers[0]
                .env
                .get_or_insert_with(Vec::new)
                .push(serde_json::from_value(
                    serde_json::json!({"name": "AWS_REGION", "value": "x"}),
                )?);
        }
        assert!(!carries_our_variables(&elsewhere, &now));
        // A mutating webhook's variable beside ours: the same loader (else made again for ever).
        assert!(carries_our_variables(&webhooked, &now));
        Ok(())
    }
}
