//! What a `train` job's three processes are started with — vLLM serving the policy, `floe
//! policy-proxy` in front of it, and `floe-trainer serve` — wherever they run: the trainer pod's
//! containers ([`super::aux_pods::trainer`]) and `floe run`'s child processes read the same
//! arguments and configuration from here, so the two can never drift apart. Sans-IO.

use floe_crds::rollout_job::{RolloutJobSpec, TrainSpec, WeightSync};
use serde_json::{json, Value};

/// Where the trainer pod mounts `train.checkpoint.claimName`.
pub const CHECKPOINT_MOUNT: &str = "/checkpoints";

/// vLLM's `--served-model-name`; the gateways ask for this model. With `train.lora` it is
/// the adapter's name, and the base is served as [`BASE_MODEL`].
pub const SERVED_MODEL: &str = "policy";
/// The base model's name in vLLM when the policy is a LoRA adapter on it.
pub const BASE_MODEL: &str = "policy-base";
/// How long a stopped trainer has to finish its step and write its last checkpoint: its pod's
/// grace, and `floe run`'s wait for it.
pub const TRAINER_STOP_GRACE_SECONDS: u64 = 300;

/// `TORCH_ELASTIC_SHUTDOWN_TIMEOUT` for a sharded trainer: torchrun passes the stop's SIGTERM
/// to its processes and kills them 30 s later by default, too soon for the leader to gather
/// and write its last checkpoint (a 135M model on two CPU pods took longer); it waits out the
/// grace instead, less a margin to end them.
pub fn torch_shutdown_timeout() -> String {
    (TRAINER_STOP_GRACE_SECONDS - 15).to_string()
}

/// vLLM's `--max-lora-rank` takes one of these (vllm/config/lora.py).
const VLLM_LORA_RANKS: &[i32] = &[1, 8, 16, 32, 64, 128, 256, 320, 512];

/// Environment of the vLLM process: its dev-mode endpoints (pause, reload, weight version)
/// are how the trainer pushes each step's weights, and with LoRA it loads each step's
/// adapter in place at run time; only the trainer can reach those endpoints.
///
/// On CPU (`train.vllm.gpus: 0`) the model runs inside vLLM's engine process: its CPU platform
/// otherwise spawns a separate worker process, which imports torch and vLLM once more (~20 s
/// of a ~60 s start on a slow 2-core machine) to run the same single worker. Its OpenMP
/// threads sleep between kernels instead of spinning: on CPU vLLM shares the machine with the
/// trainer and the sessions, and a small model's kernels are too short for the spin to pay.
pub fn vllm_env(train: &TrainSpec) -> Vec<(&'static str, &'static str)> {
    let mut env = vec![("VLLM_SERVER_DEV_MODE", "1")];
    if train.lora.is_some() {
        env.push(("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True"));
    }
    if train.vllm.gpus == 0 {
        env.push(("VLLM_ENABLE_V1_MULTIPROCESSING", "0"));
        env.push(("OMP_WAIT_POLICY", "PASSIVE"));
    }
    env
}

/// Where one run's processes find each other and keep their files.
pub struct Layout {
    /// The model directory as vLLM and the trainer open it.
    pub model: String,
    /// vLLM's own port, on loopback only (dev mode).
    pub vllm_port: u16,
    /// `host:port` the trainer's ingest, status and metrics listen on.
    pub ingest_listen: String,
    /// The trainer's periodic checkpoints, if kept outside its state directory.
    pub checkpoint_dir: Option<String>,
    /// The final checkpoint (a servable model directory), if not `<checkpoints>/final`.
    pub final_dir: Option<String>,
    /// Where the trainer keeps every trajectory it acknowledged, if not under its state
    /// directory: on durable storage, so that losing the trainer loses none of them.
    pub ingest_dir: Option<String>,
}

impl Layout {
    pub fn vllm_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.vllm_port)
    }
}

/// vLLM's server arguments after the model (`vllm serve MODEL …` in the pod, the module entry
/// point's `--model MODEL …` on one machine).
pub fn vllm_args(train: &TrainSpec, layout: &Layout) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "--host".into(),
        "127.0.0.1".into(),
        "--port".into(),
        layout.vllm_port.to_string(),
        "--served-model-name".into(),
        if train.lora.is_some() {
            BASE_MODEL
        } else {
            SERVED_MODEL
        }
        .into(),
    ];
    if let Some(lora) = &train.lora {
        // The smallest rank vLLM accepts that holds the adapter; one adapter at a time.
        let rank = VLLM_LORA_RANKS
            .iter()
            .find(|r| **r >= lora.rank)
            .copied()
            .unwrap_or(lora.rank);
        args.extend([
            "--enable-lora".into(),
            "--max-lora-rank".into(),
            rank.to_string(),
            "--max-loras".into(),
            "1".into(),
        ]);
    }
    if train.vllm.gpus > 1 {
        args.extend(["--tensor-parallel-size".into(), train.vllm.gpus.to_string()]);
    }
    // floe's defaults, each unless the job's `vllm.args` names that flag itself:
    let named = |flag: &str| train.vllm.args.iter().any(|a| a.starts_with(flag));
    let defaults: [(&str, &[&str]); 3] = [
        // Harness requests carry tools; without a tool parser vLLM refuses them (400).
        (
            "--tool-call-parser",
            &["--enable-auto-tool-choice", "--tool-call-parser", "hermes"],
        ),
        // A request's unset sampling knobs come from vLLM's neutral defaults, not the model's
        // generation_config.json (Qwen3's top_k 20, top_p 0.95, …): the gateway sends the
        // whole set anyway, and this keeps any other caller of the policy server on the
        // distribution the trainer models.
        ("--generation-config", &["--generation-config", "vllm"]),
        // The behaviour log-probs the trainer's ratio and TIS weigh by: those of the
        // distribution the token was drawn from (temperature applied), not the raw model's.
        (
            "--logprobs-mode",
            &["--logprobs-mode", "processed_logprobs"],
        ),
    ];
    for (flag, words) in defaults {
        if !named(flag) {
            args.extend(words.iter().map(|w| (*w).to_string()));
        }
    }
    if train.grpo.weight_sync == WeightSync::NCCL {
        // The trainer joins vLLM's workers in an NCCL group to broadcast each step's weights.
        args.extend([
            "--weight-transfer-config".into(),
            r#"{"backend":"nccl"}"#.into(),
        ]);
    }
    args.extend(train.vllm.args.iter().cloned());
    args
}

/// vLLM's context length when the job sets it (`--max-model-len N` or `--max-model-len=N`):
/// the longest trace the trainer can be sent, which its memory plan is made for.
pub fn max_model_len(args: &[String]) -> Option<u64> {
    flag_value(args, "--max-model-len").and_then(parse_length)
}

/// The dtype vLLM serves in when the job sets it (`--dtype`), in torch's name: the trainer
/// pushes weights in it (half the bytes of fp32 for bf16). `None` for `auto` or unset.
pub fn serving_dtype(args: &[String]) -> Option<&'static str> {
    match flag_value(args, "--dtype")? {
        "bfloat16" => Some("bfloat16"),
        "half" | "float16" => Some("float16"),
        "float" | "float32" => Some("float32"),
        _ => None,
    }
}

/// The value of `flag` in `args` (`--flag V` or `--flag=V`): the last one given, as vLLM's
/// argument parser takes it.
fn flag_value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let mut it = args.iter();
    let mut last = None;
    while let Some(arg) = it.next() {
        let value = match arg.strip_prefix(flag) {
            Some("") => it.next().map(String::as_str),
            Some(rest) => rest.strip_prefix('='),
            None => None,
        };
        last = value.or(last);
    }
    last
}

/// vLLM's own spellings: `16384`, `16k`/`16K` (×1000 / ×1024), `1m`/`1M`.
fn parse_length(v: &str) -> Option<u64> {
    let (digits, unit) = match v.char_indices().last()? {
        (i, 'k') => (&v[..i], 1000),
        (i, 'K') => (&v[..i], 1024),
        (i, 'm') => (&v[..i], 1_000_000),
        (i, 'M') => (&v[..i], 1024 * 1024),
        _ => (v, 1),
    };
    digits.parse::<u64>().ok().map(|n| n.saturating_mul(unit))
}

/// torchrun's rendezvous port on the first trainer pod when the trainer spans several
/// (`train.nodes` > 1).
pub const RENDEZVOUS_PORT: u16 = 29500;

/// Which of a several-node trainer's pods (`train.nodes` > 1) a command line is for.
#[derive(Clone, Copy, Debug)]
pub struct TrainerNode<'a> {
    /// 0: the first pod (vLLM, the ingest, the leading process); 1…: the pods that only train.
    pub rank: i32,
    /// The first pod's address, where torchrun's rendezvous store listens.
    pub leader_addr: &'a str,
}

/// The trainer's command line after its program: `floe-trainer serve` for one process, or
/// `torchrun` starting one process per training GPU (they shard the model with FSDP2; the
/// first serves the ingest and leads). With `node` (a pod of a several-node trainer) torchrun
/// joins the other pods' processes by a static rendezvous at the first pod's address; without
/// it the processes are this machine's alone. `python` runs the module of that Python instead
/// of the installed entry points (`floe run --trainer-python`).
pub fn trainer_command(
    train: &TrainSpec,
    python: Option<&str>,
    node: Option<TrainerNode>,
) -> Vec<String> {
    let mut cmd: Vec<String> = Vec::new();
    let node = node.filter(|_| train.nodes > 1);
    let sharded = train.gpus > 1 || node.is_some();
    match (python, sharded) {
        (Some(py), true) => cmd.extend([py.into(), "-m".into(), "torch.distributed.run".into()]),
        (None, true) => cmd.push("torchrun".into()),
        (Some(py), false) => cmd.extend([py.into(), "-m".into(), "floe_trainer.cli".into()]),
        (None, false) => cmd.push("floe-trainer".into()),
    }
    if sharded {
        match node {
            // Static: each pod's rank is fixed, so the first pod's process is always the
            // world's rank 0, the one that serves the ingest and pushes to its vLLM.
            Some(n) => cmd.extend([
                format!("--nnodes={}", train.nodes),
                format!("--node-rank={}", n.rank),
                format!("--master-addr={}", n.leader_addr),
                format!("--master-port={RENDEZVOUS_PORT}"),
            ]),
            None => cmd.push("--standalone".into()),
        }
        cmd.extend([
            format!("--nproc-per-node={}", train.gpus.max(1)),
            "-m".into(),
            "floe_trainer.cli".into(),
        ]);
    }
    cmd.push("serve".into());
    cmd
}

/// `floe policy-proxy`'s arguments: the only door from the gateways to vLLM.
pub fn policy_proxy_args(listen: &str, layout: &Layout) -> Vec<String> {
    vec![
        "policy-proxy".into(),
        "--listen".into(),
        listen.into(),
        "--upstream".into(),
        layout.vllm_url(),
    ]
}

/// What `floe-trainer serve` reads (env `FLOE_TRAINER_CONFIG`): the job's `train` spec plus
/// where things are. The trainer owns its meaning (`docs/trainer.md`).
pub fn trainer_config(
    job: &str,
    namespace: Option<String>,
    spec: &RolloutJobSpec,
    train: &TrainSpec,
    layout: &Layout,
) -> Value {
    let mut config = json!({
        "job": job,
        "namespace": namespace,
        "numSamples": spec.num_samples,
        "passThreshold": spec.evaluator.reward.pass_threshold,
        "failureReward": spec.evaluator.reward.failure_reward,
        "model": layout.model,
        "policyUrl": layout.vllm_url(),
        "servedModel": SERVED_MODEL,
        "ingestListen": layout.ingest_listen,
        "gpus": train.gpus,
        "nodes": train.nodes,
        "vllmGpus": train.vllm.gpus,
        "grpo": train.grpo,
        "maxStaleness": train.max_staleness,
        "maxSequenceTokens": max_model_len(&train.vllm.args),
        "servingDtype": serving_dtype(&train.vllm.args),
        "temperature": spec.sampling.temperature,
        // TokenSumNorm's constant: the longest response a call may sample.
        "maxResponseTokens": spec.sampling.max_response_tokens,
        "memoryPlan": train.memory_plan,
        "lora": train.lora,
    });
    let checkpoint = match (&train.checkpoint, &layout.checkpoint_dir) {
        (Some(c), dir) => Some(json!({
            "dir": dir.clone().unwrap_or_else(|| CHECKPOINT_MOUNT.into()),
            "everySteps": c.every_steps, "keep": c.keep})),
        (None, Some(dir)) => Some(json!({"dir": dir})),
        (None, None) => None,
    };
    config["checkpoint"] = checkpoint.unwrap_or(Value::Null);
    if let Some(dir) = &layout.final_dir {
        config["finalDir"] = json!(dir);
    }
    if let Some(dir) = &layout.ingest_dir {
        config["ingestDir"] = json!(dir);
    }
    config
}

#[cfg(test)]
mod tests {
    use super::*;

    fn train(v: Value) -> TrainSpec {
        serde_json::from_value(v).expect("a valid train spec")
    }

    fn layout() -> Layout {
        Layout {
            model: "/m".into(),
            vllm_port: 9001,
            ingest_listen: "127.0.0.1:9100".into(),
            checkpoint_dir: Some("/out/ckpt".into()),
            final_dir: Some("/out/final".into()),
            ingest_dir: None,
        }
    }

    #[test]
    fn a_tool_parser_is_added_unless_the_job_names_one() {
        let t = train(json!({"image": "i", "model": "m"}));
        let args = vllm_args(&t, &layout());
        assert!(args
            .windows(2)
            .any(|w| w == ["--tool-call-parser", "hermes"]));
        assert!(args.windows(2).any(|w| w == ["--port", "9001"]));
        assert!(args
            .windows(2)
            .any(|w| w == ["--logprobs-mode", "processed_logprobs"]));
        assert!(args
            .windows(2)
            .any(|w| w == ["--generation-config", "vllm"]));
        let t = train(json!({"image": "i", "model": "m",
            "vllm": {"args": ["--tool-call-parser", "qwen3_xml"]}}));
        let args = vllm_args(&t, &layout());
        assert!(!args.contains(&"hermes".to_string()));
        assert!(args.ends_with(&["--tool-call-parser".into(), "qwen3_xml".into()]));
    }

    #[test]
    fn a_lora_job_serves_the_adapter_under_the_policy_name() {
        let t = train(json!({"image": "i", "model": "m", "lora": {"rank": 12}}));
        let args = vllm_args(&t, &layout());
        assert!(args
            .windows(2)
            .any(|w| w == ["--served-model-name", BASE_MODEL]));
        assert!(args.contains(&"--enable-lora".to_string()));
        // vLLM takes 1, 8, 16, 32, …: the smallest that holds rank 12.
        assert!(args.windows(2).any(|w| w == ["--max-lora-rank", "16"]));
        assert!(vllm_env(&t).contains(&("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")));
        let full = train(json!({"image": "i", "model": "m"}));
        assert!(!vllm_args(&full, &layout()).contains(&"--enable-lora".to_string()));
        assert_eq!(vllm_env(&full), vec![("VLLM_SERVER_DEV_MODE", "1")]);
        let cpu = train(json!({"image": "i", "model": "m", "vllm": {"gpus": 0}}));
        assert!(vllm_env(&cpu).contains(&("VLLM_ENABLE_V1_MULTIPROCESSING", "0")));
        assert!(vllm_env(&cpu).contains(&("OMP_WAIT_POLICY", "PASSIVE")));
        let spec: RolloutJobSpec = serde_json::from_value(json!({
            "numSamples": 2, "tasks": {"inline": []}, "harness": {"preset": "pi"},
            "evaluator": {"command": ["true"]},
            "train": {"image": "i", "model": "m", "lora": {"rank": 12}},
        }))
        .expect("a valid spec");
        let c = trainer_config("j", None, &spec, &t, &layout());
        assert_eq!(c["lora"], json!({"rank": 12, "mergeFinal": true}));
    }

    #[test]
    fn the_trainer_config_says_where_everything_is() {
        let spec: RolloutJobSpec = serde_json::from_value(json!({
            "numSamples": 3, "tasks": {"inline": []}, "harness": {"preset": "pi"},
            "evaluator": {"command": ["true"]},
            "train": {"image": "i", "model": "m", "grpo": {"miniBatches": 2}},
        }))
        .expect("a valid spec");
        let t = spec.train.clone().expect("train");
        let c = trainer_config("j", None, &spec, &t, &layout());
        assert_eq!(c["policyUrl"], "http://127.0.0.1:9001");
        assert_eq!(c["numSamples"], 3);
        assert_eq!(c["checkpoint"]["dir"], "/out/ckpt");
        assert_eq!(c["finalDir"], "/out/final");
        assert!(c.get("ingestDir").is_none(), "under the state directory");
        assert_eq!(c["grpo"]["miniBatches"], 2);
        assert_eq!(c["grpo"]["ppoEpochs"], 1);
        // No context length set: the trainer plans for the model's own.
        assert!(c["maxSequenceTokens"].is_null());
        assert_eq!(c["memoryPlan"], "Enforce");
        let mut t = t;
        t.vllm.args = vec!["--max-model-len".into(), "16384".into()];
        t.memory_plan = floe_crds::rollout_job::MemoryPlanMode::Warn;
        let c = trainer_config("j", None, &spec, &t, &layout());
        assert_eq!(c["maxSequenceTokens"], 16384);
        assert_eq!(c["memoryPlan"], "Warn");
    }

    #[test]
    fn several_training_gpus_start_one_process_each_under_torchrun() {
        let one = train(json!({"image": "i", "model": "m"}));
        assert_eq!(trainer_command(&one, None, None), ["floe-trainer", "serve"]);
        assert_eq!(
            trainer_command(&one, Some("/py"), None),
            ["/py", "-m", "floe_trainer.cli", "serve"]
        );
        let four = train(json!({"image": "i", "model": "m", "gpus": 4}));
        let torchrun = [
            "--standalone",
            "--nproc-per-node=4",
            "-m",
            "floe_trainer.cli",
            "serve",
        ];
        assert_eq!(trainer_command(&four, None, None)[0], "torchrun");
        assert_eq!(trainer_command(&four, None, None)[1..], torchrun);
        assert_eq!(
            trainer_command(&four, Some("/py"), None)[..3],
            ["/py", "-m", "torch.distributed.run"]
        );
        assert_eq!(trainer_command(&four, Some("/py"), None)[3..], torchrun);
    }

    #[test]
    fn several_trainer_nodes_join_by_a_static_rendezvous_at_the_first() {
        let two = train(json!({"image": "i", "model": "m", "gpus": 8, "nodes": 2}));
        let second = TrainerNode {
            rank: 1,
            leader_addr: "10.0.0.7",
        };
        assert_eq!(
            trainer_command(&two, None, Some(second)),
            [
                "torchrun",
                "--nnodes=2",
                "--node-rank=1",
                "--master-addr=10.0.0.7",
                "--master-port=29500",
                "--nproc-per-node=8",
                "-m",
                "floe_trainer.cli",
                "serve"
            ]
        );
        // CPU pods train with one process each, still joined.
        let cpu = train(json!({"image": "i", "model": "m", "gpus": 0, "nodes": 3}));
        let line = trainer_command(&cpu, None, Some(second));
        assert!(line.contains(&"--nproc-per-node=1".to_string()), "{line:?}");
        assert!(line.contains(&"--nnodes=3".to_string()), "{line:?}");
        // One node: the node is ignored, the processes are the pod's own.
        let one = train(json!({"image": "i", "model": "m", "gpus": 2}));
        assert!(trainer_command(&one, None, Some(second)).contains(&"--standalone".to_string()));
    }

    #[test]
    fn the_context_length_is_read_in_each_of_vllms_spellings() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            max_model_len(&args(&["--max-model-len", "8192"])),
            Some(8192)
        );
        assert_eq!(
            max_model_len(&args(&["--x", "--max-model-len=32k"])),
            Some(32_000)
        );
        assert_eq!(
            max_model_len(&args(&["--max-model-len", "16K"])),
            Some(16_384)
        );
        assert_eq!(
            max_model_len(&args(&["--max-model-len", "1M"])),
            Some(1 << 20)
        );
        assert_eq!(max_model_len(&args(&["--max-model-len", "auto"])), None);
        assert_eq!(max_model_len(&args(&["--max-model-len"])), None);
        assert_eq!(max_model_len(&args(&["--max-model-length", "9"])), None);
        assert_eq!(max_model_len(&args(&[])), None);
    }

    #[test]
    fn the_serving_dtype_is_read_in_each_of_vllms_spellings() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(serving_dtype(&args(&["--dtype", "half"])), Some("float16"));
        assert_eq!(
            serving_dtype(&args(&["--dtype=bfloat16"])),
            Some("bfloat16")
        );
        assert_eq!(
            serving_dtype(&args(&["--enforce-eager", "--dtype", "float"])),
            Some("float32")
        );
        assert_eq!(serving_dtype(&args(&["--dtype", "auto"])), None);
        // vLLM's parser keeps the last value given.
        assert_eq!(
            serving_dtype(&args(&["--dtype", "bfloat16", "--dtype", "float32"])),
            Some("float32")
        );
        assert_eq!(
            max_model_len(&args(&["--max-model-len=4k", "--max-model-len", "8192"])),
            Some(8192)
        );
        assert_eq!(serving_dtype(&args(&["--dtype"])), None);
        assert_eq!(serving_dtype(&args(&[])), None);
    }
}
