//! Names and ports of a job's own pods and Services: the trainer pod (vLLM serving the policy,
//! and the GRPO trainer's ingest) in `train` mode, the dataset collector in `sft` mode.

/// vLLM's OpenAI server in the trainer pod.
pub const VLLM_PORT: i32 = 8000;
/// Trajectory ingest (trainer or dataset collector): `POST /v1/trajectories`.
pub const INGEST_PORT: i32 = 8100;
/// vLLM's `--served-model-name` in the trainer pod; the gateways ask for this model.
pub const SERVED_MODEL: &str = "policy";

/// Service in front of the trainer pod's vLLM.
pub fn policy_service(job: &str) -> String {
    format!("{job}-policy")
}

/// Service in front of the trainer's ingest and status endpoints.
pub fn trainer_service(job: &str) -> String {
    format!("{job}-trainer")
}

/// Service in front of the sft dataset collector.
pub fn dataset_service(job: &str) -> String {
    format!("{job}-dataset")
}
