//! The CEL rules of the CRDs, evaluated client-side (kube's `cel` feature) exactly as they
//! appear in the generated schema: every example passes, every rule catches its mistake.

use std::path::Path;

use floe_crds::validation::{
    validate_gateway_pool, validate_rollout_job, validate_rollout_job_update,
};
use floe_crds::{GatewayPool, RolloutJob};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

fn example<T: serde::de::DeserializeOwned>(name: &str) -> T {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples")
        .join(name);
    let text = std::fs::read_to_string(&path).expect("example exists");
    serde_yaml::from_str(&text).expect("example parses into the Rust type")
}

fn train_job() -> RolloutJob {
    example("rolloutjob-train.yaml")
}

fn messages(job: &RolloutJob) -> Vec<String> {
    match validate_rollout_job(job) {
        Ok(()) => Vec::new(),
        Err(e) => e.errors.into_iter().map(|f| f.message).collect(),
    }
}

#[test]
fn every_example_passes() {
    for name in [
        "rolloutjob-train.yaml",
        "rolloutjob-sft.yaml",
        "rolloutjob-lookahead.yaml",
    ] {
        let job: RolloutJob = example(name);
        validate_rollout_job(&job).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    let pool: GatewayPool = example("gatewaypool.yaml");
    validate_gateway_pool(&pool).expect("pool example");
}

#[test]
fn exactly_one_of_train_or_sft() {
    let mut job = train_job();
    let sft: RolloutJob = example("rolloutjob-sft.yaml");
    job.spec.sft = sft.spec.sft.clone();
    assert_eq!(
        messages(&job),
        ["exactly one of spec.train or spec.sft must be set"]
    );
    job.spec.sft = None;
    job.spec.train = None;
    assert_eq!(
        messages(&job),
        ["exactly one of spec.train or spec.sft must be set"]
    );
}

#[test]
fn exactly_one_of_pool_ref_or_pool_template() {
    let mut job = train_job();
    job.spec.pool_ref = None;
    assert_eq!(
        messages(&job),
        ["exactly one of spec.poolRef or spec.poolTemplate must be set"]
    );
}

#[test]
fn lookahead_only_with_a_pool_template() {
    let mut job = train_job();
    job.spec.lookahead = Some(4);
    assert_eq!(
        messages(&job),
        ["spec.lookahead applies only with spec.poolTemplate"]
    );
    let mut templated: RolloutJob = example("rolloutjob-lookahead.yaml");
    templated.spec.lookahead = Some(0);
    assert!(messages(&templated).is_empty());
}

#[test]
fn egress_only_with_a_pool_template() {
    let mut job = train_job();
    job.spec.egress = Some(Default::default());
    assert_eq!(
        messages(&job),
        ["spec.egress applies only with spec.poolTemplate (a pool's pods follow the pool's spec.egress)"]
    );
    let mut templated: RolloutJob = example("rolloutjob-lookahead.yaml");
    templated.spec.egress = Some(Default::default());
    assert!(messages(&templated).is_empty());
}

#[test]
fn exactly_one_task_source() {
    let mut job = train_job();
    job.spec.tasks.config_map = Some(floe_crds::ConfigMapTasks {
        name: "t".into(),
        key: "tasks.jsonl".into(),
    });
    assert_eq!(
        messages(&job),
        ["exactly one of tasks.inline, tasks.configMap or tasks.file must be set"]
    );
    job.spec.tasks = Default::default();
    assert_eq!(
        messages(&job),
        ["exactly one of tasks.inline, tasks.configMap or tasks.file must be set"]
    );
}

#[test]
fn custom_preset_needs_a_command() {
    let mut job = train_job();
    job.spec.harness.preset = floe_crds::HarnessPreset::Custom;
    assert_eq!(
        messages(&job),
        ["harness.command is required for the custom preset"]
    );
    job.spec.harness.command = vec!["my-agent".into(), "--headless".into()];
    assert!(messages(&job).is_empty());
}

#[test]
fn harness_env_takes_plain_values_only() {
    let mut job = train_job();
    job.spec.harness.env = serde_json::from_value(serde_json::json!([
        {"name": "PLAIN", "value": "1"}]))
    .expect("env");
    assert!(messages(&job).is_empty());
    job.spec.harness.env = serde_json::from_value(serde_json::json!([
        {"name": "PLAIN", "value": "1"},
        {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]))
    .expect("env");
    let said = messages(&job);
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(
        said[0].starts_with("harness.env takes plain values only"),
        "{said:?}"
    );
}

#[test]
fn api_must_be_one_the_preset_speaks() {
    use floe_crds::{HarnessPreset as P, ProviderApi as A};
    let cases = [
        (P::Codex, A::OpenaiResponses, true),
        (P::Codex, A::OpenaiChat, false),
        (P::ClaudeCode, A::Anthropic, true),
        (P::ClaudeCode, A::Gemini, false),
        (P::GeminiCli, A::Gemini, true),
        (P::GeminiCli, A::Anthropic, false),
        (P::QwenCode, A::OpenaiChat, true),
        (P::QwenCode, A::Anthropic, true),
        (P::QwenCode, A::Gemini, false),
        (P::Pi, A::Gemini, true),
        (P::Pi, A::OpenaiChat, true),
    ];
    for (preset, api, ok) in cases {
        let mut job = train_job();
        job.spec.harness.preset = preset;
        job.spec.harness.api = Some(api);
        assert_eq!(messages(&job).is_empty(), ok, "{preset:?} speaking {api:?}");
    }
}

#[test]
fn reward_source_needs_its_inputs() {
    let mut job = train_job();
    job.spec.evaluator.reward.format = None;
    assert_eq!(
        messages(&job),
        ["evaluator.reward.format is required when source is TestOutput"]
    );
    job.spec.evaluator.reward.source = floe_crds::RewardSource::RewardFile;
    job.spec.evaluator.reward.path = None;
    assert_eq!(
        messages(&job),
        ["evaluator.reward.path is required when source is RewardFile"]
    );
}

#[test]
fn duplicate_inline_task_ids() {
    let mut job = train_job();
    let tasks = job.spec.tasks.inline.as_mut().expect("inline");
    let first = tasks[0].clone();
    tasks.push(first);
    let err = validate_rollout_job(&job).expect_err("duplicate");
    assert_eq!(err.errors[0].field, "spec.tasks.inline[2].id");
    assert_eq!(err.errors[0].message, "duplicate task id \"fizzbuzz\"");
}

#[test]
fn gateway_ports_must_differ() {
    let mut pool: GatewayPool = example("gatewaypool.yaml");
    pool.spec.gateway.control_port = pool.spec.gateway.port;
    let err = validate_gateway_pool(&pool).expect_err("same ports");
    assert_eq!(
        err.errors[0].message,
        "gateway.port and gateway.controlPort must differ"
    );
}

#[test]
fn tasks_and_num_samples_are_immutable_once_started() {
    let old = train_job();
    let mut changed = old.clone();
    changed.spec.num_samples = 16;
    // Before the job starts, the spec may still change.
    validate_rollout_job_update(&changed, &old).expect("not started yet");

    let mut started = old.clone();
    started.status = Some(floe_crds::RolloutJobStatus {
        start_time: Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)),
        ..Default::default()
    });
    let mut changed = started.clone();
    changed.spec.num_samples = 16;
    let err = validate_rollout_job_update(&changed, &started).expect_err("immutable");
    assert_eq!(
        err.errors[0].message,
        "spec.tasks and spec.numSamples are immutable once the job has started"
    );

    let mut changed = started.clone();
    changed.spec.tasks.inline.as_mut().expect("inline")[0].instruction = "something else".into();
    validate_rollout_job_update(&changed, &started).expect_err("tasks immutable");

    // Other fields (e.g. suspend, concurrency) stay mutable after start.
    let mut changed = started.clone();
    changed.spec.suspend = true;
    changed.spec.concurrency = Some(4);
    validate_rollout_job_update(&changed, &started).expect("mutable fields");
}
