//! The runner's part of an assignment (`Assignment.run` in the gateway), built by the operator
//! or `floe run` from the RolloutJob.

use std::collections::BTreeMap;

use floe_crds::common::PrepareStep;
use floe_crds::rollout_job::{EvaluatorSpec, HarnessSpec, Task, Timeouts};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunSpec {
    pub task: Task,
    pub harness: HarnessSpec,
    pub evaluator: EvaluatorSpec,
    #[serde(default)]
    pub timeouts: Timeouts,
    /// Job-wide hidden files (`evaluator.hiddenFilesFrom`, resolved by the operator); the task's
    /// own `evaluation.hiddenFiles` win on the same path.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub hidden_files: BTreeMap<String, String>,
    /// The job's per-call response cap; presets lower the harness's own limit to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_response_tokens: Option<u32>,
}

impl RunSpec {
    /// Every hidden file of the task: job-wide first, the task's own on top.
    pub fn all_hidden_files(&self) -> BTreeMap<String, String> {
        let mut files = self.hidden_files.clone();
        if let Some(evaluation) = &self.task.evaluation {
            files.extend(evaluation.hidden_files.clone());
        }
        files
    }

    pub fn prepare_steps(&self) -> &[PrepareStep] {
        &self.task.prepare
    }
}
