//! What grades a session: the evaluator's command, what it may rely on, and how its result
//! becomes a reward.

use k8s_openapi::api::core::v1::LocalObjectReference;
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Scores a session after the harness exits. Runs in a fresh copy of the task workspace with the
/// agent's changes applied, plus the task's hidden files.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EvaluatorSpec {
    /// Argument vector, e.g. `["python", "-m", "pytest", "-q", "tests/"]`. Required, except
    /// with `reward.source: SWEBench`, where it defaults to the instance's own eval script.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub command: Vec<String>,
    /// Image for the evaluator (default: the sandbox image).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub image: Option<String>,
    /// How the evaluator's result becomes a reward.
    #[serde(default)]
    pub reward: RewardSpec,
    /// Hidden files for every task (merged under each task's `evaluation.hiddenFiles`),
    /// from a ConfigMap whose keys are file paths with `/` written as `__`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::k8s::<Option<LocalObjectReference>>")]
    pub hidden_files_from: Option<LocalObjectReference>,
    /// Workspace paths (globs; `*` within a directory, `**` across directories) whose changes by
    /// the agent are discarded before the evaluator runs, e.g. `tests/**` or `**/conftest.py`.
    /// A path with no wildcard protects what is in it too (`tests` is `tests/**` as well); a
    /// leading `./` is dropped; absolute or `..` patterns are refused. Hidden files and the
    /// evaluator's program as the task's tree provides it (where a link there leads; for a
    /// bare name, every entry of each `PATH` directory inside the workspace) are always
    /// protected.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[schemars(inner(length(min = 1, max = 1024)))]
    pub protected_paths: Vec<String>,
    /// Protect the test runners' configuration files too, wherever they are in the workspace:
    /// `conftest.py`, `pytest.ini`, `.pytest.ini`, `pytest.toml`, `.pytest.toml`,
    /// `pyproject.toml`, `setup.cfg`, `tox.ini`, `sitecustomize.py`, `usercustomize.py`,
    /// `*.pth`, what is in `*.dist-info/` and `*.egg-info/` (a `pytest11` entry point there is
    /// a plugin pytest loads), `package.json`, `.npmrc`, `.yarnrc`, `.yarnrc.yml`, Yarn's
    /// releases, plugins and Plug'n'Play loader, and Babel's, SWC's, Jest's, Vitest's, Vite's
    /// and Mocha's config files. They decide what a test run collects
    /// and reports (`python_files = chk_*.py` skips the hidden tests). With them, a module the
    /// agent adds at the workspace's top (or beside a script the evaluator runs by path) named
    /// after one of the standard library's or a Python test runner's (`pytest.py`,
    /// `pkgutil.py`) is discarded: the runner would import it in place of its own. So are the
    /// agent's changes to what runs the tests and what a `git` or `hg` in the evaluator reads:
    /// `node_modules` (`npm test` and `npx` look programs up in `node_modules/.bin` first),
    /// Yarn's package cache and unplugged packages, `.git`, `.hg` and `.sl` (their hooks). An
    /// evaluator that needs the agent's `npm install`, commits or index sees the task's.
    /// Default `true`; `false` only for tasks whose solution must change one of them.
    #[serde(default = "default_true", skip_serializing_if = "is_true")]
    pub protect_test_config: bool,
}

fn default_true() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

#[derive(KubeSchema, Clone, Debug, Deserialize, Serialize, PartialEq)]
#[x_kube(
    validation = kube::core::Rule::new("self.source != 'RewardFile' || has(self.path)")
        .message("evaluator.reward.path is required when source is RewardFile"),
    validation = kube::core::Rule::new("self.source != 'TestOutput' || has(self.format)")
        .message("evaluator.reward.format is required when source is TestOutput"),
    validation = kube::core::Rule::new("self.failureReward < self.passThreshold")
        .message("evaluator.reward.failureReward must be below passThreshold: a failure never passes"),
    validation = kube::core::Rule::new("!has(self.maxReward) || self.maxReward >= self.passThreshold")
        .message("evaluator.reward.maxReward must be at least passThreshold: no session could pass")
)]
#[serde(rename_all = "camelCase")]
pub struct RewardSpec {
    /// Where the reward comes from: `ExitCode` (default), `RewardFile`, `TestOutput` or
    /// `SWEBench` (a SWE-bench instance's own tests, graded as the harness grades them).
    #[serde(default)]
    pub source: RewardSource,
    /// `RewardFile`: JSON file `{"reward": <number>}` written by the evaluator; `TestOutput`:
    /// the report file (default: the evaluator's stdout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    pub path: Option<String>,
    /// `TestOutput` format.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<TestOutputFormat>,
    /// `TestOutput`: 1 only when every test passed (`AllPass`) or the passed fraction (`Fraction`).
    #[serde(default)]
    pub scoring: TestScoring,
    /// `TestOutput`: how many tests may be skipped (pytest's `skipped` and `xfailed`, TAP's
    /// `# SKIP` and `# TODO`, JUnit's `<skipped>`) without counting as failed. The code under
    /// test runs inside the test runner and can skip the tests it fails (`pytest.skip()`,
    /// `raise unittest.SkipTest`): past this many, each skip is a failure. Set it to the
    /// skips the task's tests have on a correct solution (platform-dependent ones).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub allowed_skips: u32,
    /// Reward at or above which a session counts as passed (pass rate, SFT acceptance default).
    #[serde(default = "default_pass_threshold")]
    pub pass_threshold: f64,
    /// The reward of a session that failed by the policy's own doing: its agent timed out or
    /// filled its disk budget, the evaluator timed out, died or found no verdict, a process
    /// outlived it, the workspace could not be graded, or (train jobs) the pod was evicted for
    /// what the agent wrote. No session scores below it: a lower reward from the evaluator is
    /// raised to it (the evaluator's own in `evaluation.detail.evaluatorReward`), so failing
    /// never pays better than an answer. Set it to the lowest reward of your scale (`-1` for
    /// an evaluator that writes -1..1); below `passThreshold`.
    #[serde(default)]
    pub failure_reward: f64,
    /// The highest reward of your scale: a reward above it is lowered to it (the evaluator's
    /// own in `evaluation.detail.evaluatorReward`). A reward file the code under test can
    /// write could otherwise claim up to 1e9, which under `train.grpo.advantage: MeanOnly`
    /// (Dr. GRPO: advantages not divided by the group's spread) is that session's weight in
    /// the update. Unset: no bound but that one. At least `passThreshold`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_reward: Option<f64>,
}

fn default_pass_threshold() -> f64 {
    1.0
}

// Not derived: an omitted `reward` must get the same pass threshold as an omitted field.
impl Default for RewardSpec {
    fn default() -> Self {
        Self {
            source: RewardSource::default(),
            path: None,
            format: None,
            scoring: TestScoring::default(),
            allowed_skips: 0,
            pass_threshold: default_pass_threshold(),
            failure_reward: 0.0,
            max_reward: None,
        }
    }
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum RewardSource {
    /// 1 when the evaluator exits 0, else 0.
    #[default]
    ExitCode,
    RewardFile,
    TestOutput,
    /// The evaluator's output is a SWE-bench eval log (stdout and stderr together), graded by
    /// the `swebench` package against the task's `evaluation.swebench`: 1 when resolved (every
    /// `FAIL_TO_PASS` passes and every `PASS_TO_PASS` still does); with `scoring: Fraction`, the
    /// fraction of `FAIL_TO_PASS` that pass while every `PASS_TO_PASS` does.
    #[serde(rename = "SWEBench")]
    #[schemars(rename = "SWEBench")]
    SweBench,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum TestOutputFormat {
    JUnitXml,
    Tap,
    /// pytest's final `N passed, M failed` line.
    PytestSummary,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum TestScoring {
    #[default]
    AllPass,
    Fraction,
}
