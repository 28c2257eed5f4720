//! A trainer over several nodes: the pods besides the first, made once the first has an IP
//! and made again when it is replaced or one of them fails ([`crate::rollout::trainer_workers`]
//! decides; this is the IO).

use floe_crds::rollout_job::RolloutJob;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};

use super::name_holder::{create_ours, delete_exactly};
use super::{Halt, JobContext};
use crate::rollout::status::Blocked;
use crate::rollout::trainer_workers::{self, WorkerAction};

/// Every pod of node rank 1… as the first pod (`leader`) is now; nothing before it has an IP.
pub(super) async fn ensure(
    job: &RolloutJob,
    ctx: &JobContext,
    ns: &str,
    leader: Option<&Pod>,
) -> Result<(), Halt> {
    let names = trainer_workers::worker_names(job);
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    if job.spec.suspend && leader.is_none() {
        // Suspended, its first pod stopped: the others have nothing to join, and one whose
        // first pod was killed mid-collective restarts to wait at its rendezvous, GPUs held.
        for name in &names {
            if let Some(p) = ctx.pods.get(&ObjectRef::new(name).within(ns)) {
                if p.metadata.deletion_timestamp.is_none() {
                    delete_exactly(&pods, "pod", name, p.metadata.uid.clone()).await?;
                }
            }
        }
        return Ok(());
    }
    let Some((ip, uid)) = leader.and_then(trainer_workers::leader_identity) else {
        return Ok(());
    };
    if names.is_empty() || job.spec.suspend {
        return Ok(());
    }
    for (rank, name) in (1..).zip(&names) {
        let existing = ctx.pods.get(&ObjectRef::new(name).within(ns));
        match trainer_workers::action(existing.as_deref(), uid) {
            WorkerAction::Keep => {}
            WorkerAction::Create => {
                // A spec that cannot be built must say so: the first pod would wait for this
                // one's rendezvous forever.
                let pod = match trainer_workers::worker(job, rank, ip, uid) {
                    Ok(Some(pod)) => pod,
                    Ok(None) => continue,
                    Err(e) => {
                        return Err(Halt::Blocked(Blocked::stalled(
                            "InvalidSpec",
                            format!("cannot build trainer pod {name} from the job's spec: {e}"),
                        )))
                    }
                };
                tracing::info!(job = %job.name_any(), pod = %name, rank, leader = %ip, "creating a trainer pod");
                create_ours(&pods, job, &pod, "pod").await?;
            }
            WorkerAction::Replace(why) => {
                let old = existing.as_deref().and_then(|p| p.metadata.uid.clone());
                tracing::info!(job = %job.name_any(), pod = %name, "replacing a trainer pod: {why}");
                delete_exactly(&pods, "pod", name, old).await?;
            }
        }
    }
    Ok(())
}
