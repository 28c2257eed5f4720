//! From a RolloutJob file to the sessions `floe run` will run: parse and validate it like the
//! apiserver would, check what local mode cannot do, and expand tasks × samples into
//! assignments. Pure, except for reading the job's files.

use std::path::{Path, PathBuf};

use floe_crds::rollout_job::{RolloutJob, Task};
use floe_gateway::ship::{Assignment, Sink};
use floe_sandbox::session::{self, SessionOf};

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("cannot read {0}: {1}")]
    Read(PathBuf, std::io::Error),
    #[error("{0} is not valid YAML: {1}")]
    Yaml(PathBuf, serde_yaml::Error),
    #[error("{0} is not a valid RolloutJob: {1}")]
    Invalid(PathBuf, floe_crds::ValidationError),
    #[error("local mode cannot {0}")]
    Unsupported(String),
    #[error("task file {0}, {1}")]
    TaskFile(PathBuf, floe_crds::task_file::TaskFileError),
}

/// What a local run is: the job, its tasks, and where output goes.
pub struct Plan {
    pub job: RolloutJob,
    pub name: String,
    pub tasks: Vec<Task>,
    /// The JSONL task file the tasks came from (hidden from the sandbox, like the job file).
    pub task_file: Option<PathBuf>,
    /// `train.heldOut`'s tasks (none without it), and their file.
    pub held_out: Vec<Task>,
    pub held_out_file: Option<PathBuf>,
}

impl Plan {
    pub fn is_sft(&self) -> bool {
        self.job.spec.sft.is_some()
    }

    /// `train.heldOut`, when the job has one.
    pub fn held_out_spec(&self) -> Option<&floe_crds::rollout_job::HeldOutSpec> {
        self.job.spec.train.as_ref()?.held_out.as_ref()
    }

    /// `train.heldOut.samples` (at least 1).
    pub fn held_out_samples(&self) -> u32 {
        self.held_out_spec()
            .and_then(|h| u32::try_from(h.samples).ok())
            .unwrap_or(1)
            .max(1)
    }
}

pub fn load(path: &Path) -> Result<Plan, PlanError> {
    let text = std::fs::read_to_string(path).map_err(|e| PlanError::Read(path.into(), e))?;
    let document: serde_json::Value =
        serde_yaml::from_str(&text).map_err(|e| PlanError::Yaml(path.into(), e))?;
    let job = floe_crds::validation::parse_rollout_job(&document)
        .map_err(|e| PlanError::Invalid(path.into(), e))?;
    let spec = &job.spec;
    if spec.evaluator.hidden_files_from.is_some() {
        return Err(PlanError::Unsupported(
            "read evaluator.hiddenFilesFrom (a ConfigMap): put hidden files in each task's evaluation.hiddenFiles".into(),
        ));
    }
    let (tasks, task_file) = tasks_of(path, &spec.tasks, "spec.tasks")?;
    let (held_out, held_out_file) = match spec.train.as_ref().and_then(|t| t.held_out.as_ref()) {
        Some(h) => tasks_of(path, &h.tasks, "spec.train.heldOut.tasks")?,
        None => (Vec::new(), None),
    };
    let name = job
        .metadata
        .name
        .clone()
        .unwrap_or_else(|| "local".to_string());
    let tasks_field = match &spec.tasks.file {
        Some(file) if spec.tasks.inline.is_none() => file.path.clone(),
        _ => "spec.tasks.inline".to_string(),
    };
    let mut errors = floe_crds::validation::duplicate_task_ids(&tasks, "spec.tasks");
    errors.extend(floe_sandbox::checks::check_sessions(
        &name,
        spec,
        &tasks,
        &tasks_field,
        &Default::default(),
    ));
    if let Some(h) = spec.train.as_ref().and_then(|t| t.held_out.as_ref()) {
        let field = match &h.tasks.file {
            Some(file) if h.tasks.inline.is_none() => file.path.clone(),
            _ => "spec.train.heldOut.tasks.inline".to_string(),
        };
        errors.extend(floe_crds::validation::empty_held_out_set(&held_out, &field));
        errors.extend(floe_crds::validation::duplicate_task_ids(&held_out, &field));
        errors.extend(floe_sandbox::checks::check_sessions(
            &name,
            spec,
            &held_out,
            &field,
            &Default::default(),
        ));
    }
    if !errors.is_empty() {
        return Err(PlanError::Invalid(
            path.into(),
            floe_crds::ValidationError { errors },
        ));
    }
    Ok(Plan {
        job,
        name,
        tasks,
        task_file,
        held_out,
        held_out_file,
    })
}

/// The tasks of one source (`spec.tasks`, `spec.train.heldOut.tasks`) and the file they came
/// from, if any.
fn tasks_of(
    path: &Path,
    source: &floe_crds::rollout_job::TaskSource,
    field: &str,
) -> Result<(Vec<Task>, Option<PathBuf>), PlanError> {
    if source.config_map.is_some() {
        return Err(PlanError::Unsupported(format!(
            "read tasks from a ConfigMap: use {field}.inline or {field}.file"
        )));
    }
    match (&source.inline, &source.file) {
        (Some(tasks), _) => Ok((tasks.clone(), None)),
        (None, Some(file)) => {
            // A task file path is relative to the job file here (in a cluster: to the volume).
            let base = path.parent().unwrap_or(Path::new("."));
            let file_path = base.join(file.path.trim_start_matches('/'));
            let mut tasks = read_task_file(&file_path, source)?;
            // A repository (a SWE-bench instance's local checkout) is relative to the job file.
            for repository in tasks.iter_mut().filter_map(|t| t.repository.as_mut()) {
                repository.path = base.join(&repository.path).to_string_lossy().into_owned();
            }
            Ok((tasks, Some(file_path)))
        }
        (None, None) => Err(PlanError::Unsupported(format!(
            "run a job without tasks ({field})"
        ))),
    }
}

/// The distinct repositories the tasks check out (hidden from the sandbox).
pub fn repositories(plan: &Plan) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = plan
        .tasks
        .iter()
        .chain(&plan.held_out)
        .filter_map(|t| t.repository.as_ref().map(|r| PathBuf::from(&r.path)))
        .collect();
    paths.sort();
    paths.dedup();
    paths
}

/// The task file, through the one parser the operator uses too.
fn read_task_file(
    path: &Path,
    source: &floe_crds::rollout_job::TaskSource,
) -> Result<Vec<Task>, PlanError> {
    let text = std::fs::read_to_string(path).map_err(|e| PlanError::Read(path.into(), e))?;
    floe_crds::task_file::parse_source(&text, source, floe_crds::swebench::Checkouts::Local)
        .map_err(|e| PlanError::TaskFile(path.into(), e))
}

/// How many sessions the run has: tasks × samples × epochs, at most `limit`.
pub fn session_count(plan: &Plan, limit: Option<usize>) -> usize {
    let all = usize::try_from(plan.job.spec.session_count(plan.tasks.len())).unwrap_or(usize::MAX);
    limit.map_or(all, |l| l.min(all))
}

/// Attempt `attempt` of session `index` (epoch-major, then task-major: each GRPO group's
/// samples together; [`floe_crds::rollout_job::numbering`]).
pub fn assignment(plan: &Plan, sink: &Sink, index: usize, attempt: u32) -> Option<Assignment> {
    let place = plan
        .job
        .spec
        .session_at(u64::try_from(index).ok()?, plan.tasks.len())?;
    let task = plan.tasks.get(place.task)?;
    Some(session::assignment(&SessionOf {
        job: &plan.name,
        spec: &plan.job.spec,
        task,
        epoch: place.epoch,
        sample: place.sample,
        attempt,
        sink,
        upstream: Default::default(),
        shared_hidden_files: &Default::default(),
    }))
}

/// Attempt `next` of a held-out session (`train.heldOut`): its round's step, task and sample.
/// An id `taken` already (a resumed run measuring a step its interrupted run measured) moves
/// `next` on to the first attempt whose id is free.
pub fn held_out_assignment(
    plan: &Plan,
    rounds: &super::held_out::HeldOut,
    sink: &Sink,
    next: &mut super::queue::Attempt,
    taken: impl Fn(&str) -> bool,
) -> Option<Assignment> {
    let (step, task, sample) = rounds.session(next.index)?;
    loop {
        let a = session::held_out_assignment(
            &SessionOf {
                job: &plan.name,
                spec: &plan.job.spec,
                task,
                epoch: 0,
                sample,
                attempt: next.attempt,
                sink,
                upstream: Default::default(),
                shared_hidden_files: &Default::default(),
            },
            step,
        );
        if !taken(&a.session) || next.attempt >= 1000 {
            return Some(a);
        }
        next.attempt += 1;
    }
}

/// Every session's first attempt, in order, at most `limit`.
pub fn expand(plan: &Plan, sink: &Sink, limit: Option<usize>) -> Vec<Assignment> {
    (0..session_count(plan, limit))
        .filter_map(|i| assignment(plan, sink, i, 0))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use floe_sandbox::spec::RunSpec;

    fn plan(yaml: &str) -> Result<Plan, PlanError> {
        let dir = tempfile::tempdir().map_err(|e| PlanError::Read("tmp".into(), e))?;
        let path = dir.path().join("job.yaml");
        std::fs::write(&path, yaml).map_err(|e| PlanError::Read(path.clone(), e))?;
        std::fs::write(
            dir.path().join("tasks.jsonl"),
            "{\"id\": \"a\", \"instruction\": \"x\"}\n\n{\"id\": \"b\", \"instruction\": \"y\"}\n",
        )
        .map_err(|e| PlanError::Read(path.clone(), e))?;
        std::fs::write(dir.path().join("blank.jsonl"), "\n\n")
            .map_err(|e| PlanError::Read(path.clone(), e))?;
        load(&path)
    }

    const JOB: &str = "apiVersion: floe.dev/v1alpha1
kind: RolloutJob
metadata: {name: demo}
spec:
  tasks:
    inline:
      - {id: t1, instruction: one, metadata: {difficulty: easy}}
      - {id: t2, instruction: two}
  numSamples: 3
  harness: {preset: pi}
  poolRef: {name: pool}
  evaluator: {command: ['true']}
  sft: {upstream: {url: 'http://127.0.0.1:8000'}, output: {claimName: data}}
";

    /// `JOB` as a train job, its `train` line given.
    fn train_job(train: &str) -> String {
        JOB.replace(
            "  sft: {upstream: {url: 'http://127.0.0.1:8000'}, output: {claimName: data}}\n",
            train,
        )
    }

    #[test]
    fn tasks_times_samples_task_major_with_stable_ids() -> Result<(), PlanError> {
        let p = plan(JOB)?;
        let sessions = expand(&p, &Sink::None, None);
        let ids: Vec<_> = sessions.iter().map(|a| a.session.as_str()).collect();
        assert_eq!(
            ids,
            [
                "demo-t1-0",
                "demo-t1-1",
                "demo-t1-2",
                "demo-t2-0",
                "demo-t2-1",
                "demo-t2-2"
            ]
        );
        assert_eq!(sessions[4].group, "demo/t2");
        assert_eq!(sessions[4].sample, 1);
        assert_eq!(sessions[0].metadata["difficulty"], "easy");
        let run: RunSpec = serde_json::from_value(sessions[0].run.clone())
            .map_err(|e| PlanError::Unsupported(e.to_string()))?;
        assert_eq!(run.task.instruction, "one");
        assert_eq!(run.max_response_tokens, Some(16384));
        let upstream = sessions[0].upstream.clone().unwrap_or_default();
        assert_eq!(
            (upstream.temperature, upstream.top_p),
            (Some(1.0), Some(1.0))
        );
        assert_eq!(expand(&p, &Sink::None, Some(4)).len(), 4);
        assert!(sessions[0].exclude_classes.is_empty());
        // An sft job's trajectories are for imitation; a train job's are not.
        assert!(sessions.iter().all(|a| a.imitation));
        let trained = expand(
            &plan(&train_job("  train: {image: t, model: m}\n"))?,
            &Sink::None,
            None,
        );
        assert!(trained.iter().all(|a| !a.imitation));
        // The job's request classes left out of training reach every session's gateway.
        let excluding = JOB.replace(
            "  numSamples: 3\n",
            "  numSamples: 3\n  trajectory: {excludeRequestClasses: [auxiliary, compaction]}\n",
        );
        let sessions = expand(&plan(&excluding)?, &Sink::None, None);
        assert!(sessions
            .iter()
            .all(|a| a.exclude_classes == ["auxiliary", "compaction"]));
        Ok(())
    }

    #[test]
    fn held_out_tasks_are_read_beside_the_job_and_get_ids_of_their_own() -> Result<(), PlanError> {
        let job = train_job("  train: {image: t, model: m, heldOut: {tasks: {file: {path: tasks.jsonl}}, everySteps: 3}}\n");
        let p = plan(&job)?;
        assert_eq!(p.held_out.len(), 2);
        assert!(p
            .held_out_file
            .as_ref()
            .is_some_and(|f| f.ends_with("tasks.jsonl")));
        let spec = p.job.spec.train.as_ref().and_then(|t| t.held_out.clone());
        let spec = spec.ok_or_else(|| PlanError::Unsupported("no heldOut".into()))?;
        let mut rounds = super::super::held_out::HeldOut::new(&spec, p.held_out.clone(), 6);
        let first = rounds.due(4);
        assert_eq!(first.len(), 2);
        let mut next = first[1];
        let a = held_out_assignment(&p, &rounds, &Sink::None, &mut next, |_| false);
        let a = a.ok_or_else(|| PlanError::Unsupported("no assignment".into()))?;
        assert_eq!(
            (a.session.as_str(), a.group.as_str()),
            ("demo-b-0.h4", "demo/b/h4")
        );
        assert_eq!(a.metadata["heldOutStep"], 4);
        // A resumed run's round at a step already measured: the next free attempt's id.
        let a = held_out_assignment(&p, &rounds, &Sink::None, &mut next, |id| {
            id == "demo-b-0.h4"
        });
        assert_eq!(a.map(|a| a.session), Some("demo-b-0.h4-r1".into()));
        assert_eq!(next.attempt, 1);
        // Duplicate ids and a ConfigMap are refused in words.
        let dup = job.replace(
            "heldOut: {tasks: {file: {path: tasks.jsonl}}",
            "heldOut: {tasks: {inline: [{id: x, instruction: a}, {id: x, instruction: b}]}",
        );
        assert!(matches!(plan(&dup), Err(PlanError::Invalid(..))));
        // A file of blank lines: rounds of no task would never open.
        let blank = job.replace("{path: tasks.jsonl}", "{path: blank.jsonl}");
        let refused = plan(&blank)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(refused.contains("blank.jsonl: holds no task"), "{refused}");
        let cm = job.replace("{file: {path: tasks.jsonl}}", "{configMap: {name: h}}");
        let refused = plan(&cm).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            refused.contains("spec.train.heldOut.tasks.inline"),
            "{refused}"
        );
        Ok(())
    }

    #[test]
    fn a_train_job_s_epochs_pass_over_the_tasks_again_as_new_groups() -> Result<(), PlanError> {
        let job = train_job("  train: {image: t, model: m, epochs: 3}\n");
        let p = plan(&job)?;
        let sessions = expand(&p, &Sink::None, None);
        assert_eq!(sessions.len(), 2 * 3 * 3, "tasks × samples × epochs");
        assert_eq!(session_count(&p, None), 18);
        let first: Vec<_> = sessions[..6].iter().map(|a| a.session.as_str()).collect();
        assert_eq!(first[..3], ["demo-t1-0", "demo-t1-1", "demo-t1-2"]);
        // Each later epoch: every task once, a group's samples together, ids and groups of
        // its own.
        for (epoch, batch) in sessions.chunks(6).enumerate().skip(1) {
            let mut tasks: Vec<&str> = batch.iter().map(|a| a.task.as_str()).collect();
            tasks.dedup();
            tasks.sort_unstable();
            assert_eq!(tasks, ["t1", "t2"]);
            for a in batch {
                assert_eq!(a.group, format!("demo/{}/e{epoch}", a.task));
                assert_eq!(a.session, format!("demo-{}-{}.e{epoch}", a.task, a.sample));
                assert_eq!(a.metadata["epoch"], epoch);
            }
        }
        let mut ids: Vec<_> = sessions.iter().map(|a| a.session.clone()).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), 18, "every session id distinct");
        Ok(())
    }

    #[test]
    fn task_files_are_read_relative_to_the_job() -> Result<(), PlanError> {
        let job = JOB.replace(
            "    inline:\n      - {id: t1, instruction: one, metadata: {difficulty: easy}}\n      - {id: t2, instruction: two}\n",
            "    file: {path: tasks.jsonl}\n",
        );
        let p = plan(&job)?;
        assert_eq!(
            p.tasks.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        Ok(())
    }

    #[test]
    fn bad_input_is_one_clear_error() {
        let cases = [
            ("not: [valid", "not valid YAML"),
            (&JOB.replace("numSamples: 3", "numSamples: 0") as &str, "spec.numSamples"),
            (&JOB.replace("preset: pi", "preset: vim"), "spec.harness.preset"),
            (
                &JOB.replace("    inline:\n      - {id: t1, instruction: one, metadata: {difficulty: easy}}\n      - {id: t2, instruction: two}\n", "    configMap: {name: tasks}\n"),
                "local mode cannot read tasks from a ConfigMap",
            ),
        ];
        for (yaml, needle) in cases {
            let err = plan(yaml).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(err.contains(needle), "{needle:?} not in {err:?}");
            assert!(!err.contains('\n'), "one line: {err}");
        }
    }
}

#[cfg(test)]
mod examples {
    use std::path::{Path, PathBuf};

    use floe_sandbox::workspace::safe_join;

    fn jobs() -> Vec<PathBuf> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
        let mut files: Vec<PathBuf> = ["", "quickstart", "learn"]
            .iter()
            .flat_map(|dir| {
                std::fs::read_dir(root.join(dir))
                    .into_iter()
                    .flatten()
                    .flatten()
            })
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
            .collect();
        files.sort();
        files
    }

    /// Every RolloutJob in `examples/` validates as the apiserver and `floe run` validate it,
    /// and every path the runner resolves inside a workspace or evaluation copy (the reward
    /// file, task files, hidden files) is one it accepts: an example whose every session would
    /// fail cannot ship.
    #[test]
    fn every_example_job_is_valid_and_its_paths_are_ones_the_runner_accepts() {
        let mut checked = 0;
        for file in jobs() {
            let text = std::fs::read_to_string(&file).expect("example readable");
            let doc: serde_json::Value = serde_yaml::from_str(&text).expect("example is YAML");
            if doc["kind"] != "RolloutJob" {
                continue;
            }
            let job = floe_crds::validation::parse_rollout_job(&doc)
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            let eval = Path::new("/evaluation-copy");
            if let Some(path) = &job.spec.evaluator.reward.path {
                assert!(
                    safe_join(eval, path).is_ok(),
                    "{}: reward.path {path:?} is refused by the runner (relative to the evaluation copy)",
                    file.display()
                );
            }
            for task in job.spec.tasks.inline.iter().flatten() {
                let hidden = task.evaluation.as_ref().map(|e| e.hidden_files.keys());
                for name in task.files.keys().chain(hidden.into_iter().flatten()) {
                    assert!(
                        safe_join(eval, name).is_ok(),
                        "{}: task {} file {name:?}",
                        file.display(),
                        task.id
                    );
                }
            }
            checked += 1;
        }
        assert!(checked >= 7, "the example jobs were found ({checked})");
    }
}
