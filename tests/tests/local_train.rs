//! `floe run` with a `train` job: the RL loop closed on one machine. `floe run` starts the
//! genuine CPU vLLM (SmolLM2-135M-Instruct) and the real `floe-trainer`, sessions of a small
//! agent of our own call the model through the gateway, the evaluator scores them, the trainer
//! trains on their trajectories and pushes each step's weights into the running vLLM, and the
//! next batch of sessions samples from the policy just trained.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use anyhow::{Context, Result};
use floe_tests::{
    floe_bin, harness_bin_dir, memory_lease, vllm, vllm_setup, workspace_root, MemoryLease, Share,
};
use serde_json::Value;

/// One model call (OpenAI Chat through the gateway, the session token as the key); the answer
/// goes to `answer.txt`. Asked for a country, it first thinks for 25 s: its group reaches the
/// trainer late, and the trainer waits without a step while sessions run (a stall for
/// Prometheus to see).
const AGENT: &str = r#"
import json, os, time, urllib.request
if "country" in os.environ["FLOE_INSTRUCTION"]:
    time.sleep(25)
body = {"model": os.environ["FLOE_MODEL"], "max_tokens": 24, "temperature": 0.8,
        "messages": [{"role": "user", "content": os.environ["FLOE_INSTRUCTION"]}]}
req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions",
    data=json.dumps(body).encode(), headers={"content-type": "application/json",
    "authorization": "Bearer " + os.environ["FLOE_SESSION_TOKEN"]})
answer = json.load(urllib.request.urlopen(req, timeout=300))["choices"][0]["message"]["content"]
open("answer.txt", "w").write(answer)
"#;

/// Shorter answers score higher; every length its own reward, so a group is never uniform.
const GRADER: &str = r#"
import json
answer = open("answer.txt").read().strip()
json.dump({"reward": 1.0 / (1.0 + len(answer) / 20.0)}, open("reward.json", "w"))
"#;

/// Each train job here runs its own vLLM and trainer (~4 GB together). Two at a time beside the
/// suite's two long-running vLLM servers left ~1.5 GB free on a 24 GB CI machine (measured);
/// the Pi job (Pi's Node processes on top) then starved the machine: its second batch's
/// sessions made no model call in 300 s and evaluators timed out. So the Pi job runs alone,
/// the others two at a time. Each also takes the machine's memory lease, shared: never beside
/// another test binary's vLLM and trainers (`floe_tests::memory`; `scripts/test.sh` runs the
/// real node's suite beside this one).
static MEMORY: RwLock<()> = RwLock::new(());

fn beside_one_other() -> Result<(RwLockReadGuard<'static, ()>, MemoryLease)> {
    let here = MEMORY
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    Ok((here, memory_lease("a train job", Share::Shared)?))
}

fn alone() -> Result<(RwLockWriteGuard<'static, ()>, MemoryLease)> {
    let here = MEMORY
        .write()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    Ok((here, memory_lease("the Pi train job", Share::Shared)?))
}

/// GRPO groups of `samples` sessions, `groups_per_step` of them per optimizer step, and
/// `epochs` passes over the tasks.
struct Shape {
    samples: u32,
    groups_per_step: u32,
    epochs: u32,
    /// `train.lora.rank`: a LoRA adapter instead of every weight.
    lora_rank: Option<u32>,
}

const LEARNING: Shape = Shape {
    samples: 4,
    groups_per_step: 2,
    epochs: 1,
    lora_rank: None,
};

fn job(model: &Path, tasks: &[&str], shape: &Shape) -> String {
    let indent = |code: &str| code.trim().replace('\n', "\n          ");
    let tasks: String = tasks
        .iter()
        .enumerate()
        .map(|(i, q)| format!("      - {{id: q{i}, instruction: \"{q}\"}}\n"))
        .collect();
    format!(
        r#"apiVersion: floe.dev/v1alpha1
kind: RolloutJob
metadata: {{name: brief}}
spec:
  numSamples: {samples}
  concurrency: 4
  poolRef: {{name: python-sandbox}}
  harness:
    preset: custom
    model: policy
    command:
      - python3
      - -c
      - |
          {agent}
  evaluator:
    command:
      - python3
      - -c
      - |
          {grader}
    reward: {{source: RewardFile, path: reward.json, passThreshold: 0.5}}
  sampling: {{maxResponseTokens: 24, temperature: 0.8}}
  timeouts: {{agentSeconds: 300, evaluatorSeconds: 30}}
  train:
    image: unused-on-one-machine
    model: {model}
    gpus: 0
    vllm:
      gpus: 0
      args: ["--dtype", "float32", "--enforce-eager", "--max-model-len", "2048"]
    grpo: {{groupsPerStep: {groups_per_step}, learningRate: 2.0e-5, microBatchSize: 8, miniBatches: 2}}
    # Traces here are a few hundred tokens; the plan's worst case (microBatchSize traces of
    # --max-model-len tokens each) needs more memory than a CI machine has: warn, not refuse.
    memoryPlan: Warn
    maxStaleness: 0
    epochs: {epochs}{lora}
  tasks:
    inline:
{tasks}"#,
        agent = indent(AGENT),
        grader = indent(GRADER),
        model = model.display(),
        samples = shape.samples,
        groups_per_step = shape.groups_per_step,
        epochs = shape.epochs,
        lora = shape
            .lora_rank
            .map(|r| format!("\n    lora: {{rank: {r}}}"))
            .unwrap_or_default(),
    )
}

fn floe_run(job_file: &Path, out: &Path, python: &Path) -> Command {
    let mut cmd = Command::new(floe_bin().expect("floe binary"));
    cmd.arg("run")
        .arg(job_file)
        .arg("--out")
        .arg(out)
        .arg("--vllm-python")
        .arg(python)
        .arg("--trainer-python")
        .arg(python)
        .env("PYTHONPATH", workspace_root().join("trainer"))
        .env("HF_HUB_OFFLINE", "1")
        .env("TRANSFORMERS_OFFLINE", "1")
        .env("VLLM_NO_USAGE_STATS", "1")
        .env("DO_NOT_TRACK", "1")
        .env("VLLM_CPU_KVCACHE_SPACE", "1");
    cmd
}

/// Run `floe run` to its end, which must be a success, and read its `summary.json`.
fn succeeded(run: &mut Command, out: &Path) -> Result<Value> {
    let result = run.output()?;
    assert_eq!(
        result.status.code(),
        Some(0),
        "floe run: {}\n{}",
        String::from_utf8_lossy(&result.stdout),
        String::from_utf8_lossy(&result.stderr)
    );
    Ok(serde_json::from_str(&std::fs::read_to_string(
        out.join("summary.json"),
    )?)?)
}

/// Processes a run started: their command line or an open file (the logs `floe run` gives
/// them as stdout and stderr, inherited by their own children) is under `dir`.
fn processes_naming(dir: &Path) -> Vec<String> {
    let needle = dir.display().to_string();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let pid = entry.file_name().to_string_lossy().to_string();
        if !pid.chars().all(|c| c.is_ascii_digit()) || pid == std::process::id().to_string() {
            continue;
        }
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let opens = std::fs::read_dir(entry.path().join("fd"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|fd| std::fs::read_link(fd.path()).ok())
            .any(|target| target.starts_with(dir));
        if cmdline.contains(&needle) || opens {
            found.push(format!("{pid}: {cmdline}"));
        }
    }
    found
}

/// `floe run`'s stderr forwarded to the test's own, as it comes; also its lines, for a test
/// that waits for one.
fn forward(stderr: std::process::ChildStderr) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            eprintln!("{line}");
            let _ = tx.send(line);
        }
    });
    rx
}

/// The series a local run can have: its sessions', its gateway's and its trainer's (the GPU
/// gauge needs a GPU: `trainer/tests/test_gpu.py` checks it where one is).
fn a_local_run_has(metric: &str) -> bool {
    (metric.starts_with("floe_trainer_")
        || metric.starts_with("floe_gateway_")
        || metric == "floe_sessions"
        || metric.starts_with("floe_session_"))
        && metric != "floe_trainer_gpu_utilization"
}

/// A real Prometheus scrapes the run as a user points one at it (`--metrics-listen`, a static
/// target: the page labels its series with the job) and evaluates the chart's own rules,
/// rendered by Helm with a trainer-stall bound of 10 s. While the slow group keeps the trainer
/// waiting with sessions running, FloeTrainerStalled fires for this job (the run's session
/// series and the trainer's step join on namespace and job); once the trainer steps again it
/// clears. Every series the rules and the dashboard read that a local run has exists, and
/// every panel over them returns data for this job.
async fn prometheus_reads_the_run(address: String) -> Result<()> {
    use floe_tests::chart::{
        dashboard_queries, promql_metrics, referenced_metrics, render, rules_file,
    };
    use floe_tests::operator::eventually_within;
    use floe_tests::prometheus::Prometheus;
    let rendered = render(&[
        "--set",
        "prometheusRule.enabled=true",
        "--set",
        "prometheusRule.rules.trainerStalled.noStepFor=10s",
        "--set",
        "prometheusRule.rules.trainerStalled.for=1s",
    ])?;
    let rules = rules_file(&rendered)?;
    let scrape = serde_json::json!({
        "job_name": "floe-run",
        "static_configs": [{"targets": [address]}]});
    let prom = Prometheus::start(&[scrape], &rules, "1s").await?;
    let job = [("namespace", "default"), ("rolloutjob", "brief")];
    eventually_within(900, "FloeTrainerStalled to fire for the job", async || {
        Ok((!prom.firing("FloeTrainerStalled", &job).await?.is_empty()).then_some(()))
    })
    .await
    .with_context(|| prom.log())?;
    eventually_within(300, "FloeTrainerStalled to clear", async || {
        let alerts = prom.alerts().await?;
        Ok((!alerts
            .iter()
            .any(|a| a["labels"]["alertname"] == "FloeTrainerStalled"))
        .then_some(()))
    })
    .await?;
    // The held-out round before training is in by now: its figures, labelled with the job.
    let held_out =
        "floe_job_held_out{namespace=\"default\", rolloutjob=\"brief\", stat=\"pass_rate\"}";
    eventually_within(120, "the held-out round's pass rate", async || {
        Ok((!prom.query(held_out).await?.is_empty()).then_some(()))
    })
    .await?;
    let mut missing = Vec::new();
    for metric in referenced_metrics(&rules)?
        .into_iter()
        .filter(|m| a_local_run_has(m))
    {
        let q = format!("count({metric}{{namespace=\"default\", rolloutjob=\"brief\"}})");
        if prom.query(&q).await?.is_empty() {
            missing.push(metric);
        }
    }
    assert!(
        missing.is_empty(),
        "series the run does not export: {missing:?}"
    );
    let panels: Vec<(String, String)> = dashboard_queries()?
        .into_iter()
        .filter(|(_, expr)| promql_metrics(expr).iter().all(|m| a_local_run_has(m)))
        .collect();
    assert!(panels.len() >= 15, "{panels:?}");
    let empty = prom.panels_without_data(&panels, &job).await?;
    assert!(empty.is_empty(), "panels with no data: {empty:#?}");
    let errors = prom.rule_errors().await?;
    assert!(
        errors.is_empty(),
        "rules Prometheus cannot evaluate: {errors:?}"
    );
    Ok(())
}

/// `model` as a directory of links to its files, but for a `generation_config.json` that
/// carries Qwen3's sampling defaults (and Qwen2.5's repetition penalty): what vLLM's default
/// `--generation-config auto` fills into every request that leaves a knob out. SmolLM2's own
/// carries none, so without this no test could see a sampled distribution the trainer does
/// not model (0.40 nats per token measured, against ~1e-5).
fn with_qwen3_sampling_defaults(model: &Path, dir: &Path) -> Result<PathBuf> {
    let copy = dir.join("smollm2-with-qwen3-defaults");
    std::fs::create_dir_all(&copy)?;
    for entry in std::fs::read_dir(model)? {
        let entry = entry?;
        if entry.file_name() != "generation_config.json" {
            std::os::unix::fs::symlink(entry.path(), copy.join(entry.file_name()))?;
        }
    }
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(
        model.join("generation_config.json"),
    )?)?;
    for (key, value) in [
        ("do_sample", serde_json::json!(true)),
        ("top_k", serde_json::json!(20)),
        ("top_p", serde_json::json!(0.95)),
        ("temperature", serde_json::json!(0.6)),
        ("repetition_penalty", serde_json::json!(1.05)),
    ] {
        config[key] = value;
    }
    std::fs::write(
        copy.join("generation_config.json"),
        serde_json::to_string_pretty(&config)?,
    )?;
    Ok(copy)
}

#[test]
fn a_train_job_trains_the_policy_its_later_sessions_sample_from() -> Result<()> {
    let _memory = beside_one_other()?;
    let (python, models) = vllm_setup()?;
    let dir = tempfile::tempdir()?;
    // Sampling defaults in the model's generation config must not change what is sampled.
    let model = with_qwen3_sampling_defaults(&models.join("smollm2-135m-instruct"), dir.path())?;
    let job_file = dir.path().join("job.yaml");
    let questions = [
        "Name a fruit.",
        "Name a colour.",
        "Name an animal.",
        "Name a country.",
        "Name a river.",
        "Name a tree.",
    ];
    // Two held-out questions, measured every 2 steps and at the end, trained on by nobody.
    let held_out = "    maxStaleness: 0\n    heldOut: {everySteps: 2, tasks: {inline: [\
        {id: h0, instruction: \"Name a city.\"}, {id: h1, instruction: \"Name a metal.\"}]}}\n";
    // DAPO's soft overlong punishment over the last 8 of the 24 tokens a call may sample.
    let text = job(&model, &questions, &LEARNING)
        .replace("    maxStaleness: 0\n", held_out)
        .replace(
            "miniBatches: 2}",
            "miniBatches: 2, overlongPenalty: {bufferTokens: 8, factor: 0.5}}",
        );
    std::fs::write(&job_file, text)?;
    let out = dir.path().join("out");
    let metrics = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let mut run = floe_run(&job_file, &out, &python)
        .arg("--metrics-listen")
        .arg(metrics.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let lines = forward(run.stderr.take().context("stderr")?);
    // Checked while the run goes on; the run is waited for whatever the check says.
    let scraped = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(prometheus_reads_the_run(metrics.to_string()));
    let result = run.wait_with_output()?;
    let table = String::from_utf8_lossy(&result.stdout);
    eprintln!("{table}");
    assert_eq!(result.status.code(), Some(0), "floe run: {table}");
    scraped?;
    // Before any session, the fidelity check: probes sampled with the sessions' own requests
    // (the gateway's code), through the generation config's defaults, scored by the trainer.
    let said: Vec<String> = lines.try_iter().collect();
    let fidelity = said
        .iter()
        .find(|l| l.starts_with("[train] fidelity check: "))
        .with_context(|| format!("no fidelity line in {said:?}"))?;
    let apart: f64 = fidelity
        .split(" nats apart")
        .next()
        .and_then(|head| head.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .with_context(|| fidelity.clone())?;
    assert!(apart < 1e-3, "{fidelity}");

    let summary: Value = serde_json::from_str(&std::fs::read_to_string(out.join("summary.json"))?)?;
    assert_eq!(summary["mode"], "train");
    assert_eq!(summary["sessions"]["total"], 24, "{summary}");
    assert_eq!(summary["sessions"]["completed"], 24, "{summary}");
    let training = &summary["training"];
    let steps = training["steps"].as_array().context("training.steps")?;
    // 6 groups, 2 per step, none uniform: 3 steps, each pushed as the next policy version.
    let versions: Vec<u64> = steps
        .iter()
        .filter_map(|s| s["policyVersion"].as_u64())
        .collect();
    assert_eq!(versions, [1, 2, 3], "{training}");
    assert_eq!(training["policyVersion"], 3);
    // Every scored session, by the policy version that sampled it (the reward curve's line):
    // batch b (8 sessions) ran on version b.
    let sampled: Vec<(u64, u64)> = training["sampled"]
        .as_array()
        .context("training.sampled")?
        .iter()
        .filter_map(|r| Some((r["policyVersion"].as_u64()?, r["sessions"].as_u64()?)))
        .collect();
    assert_eq!(sampled, [(0, 8), (1, 8), (2, 8)], "{training}");
    for s in steps {
        // What the trainer computes for the sampled tokens equals what vLLM sampled them
        // with: fp32 on both sides, 1e-3 nats mean |Δ| (measured: 1.0-1.3e-5), also after
        // pushes; at the job's temperature 0.8, so both weigh the tempered policy (vLLM's raw
        // log-probs, or a trainer that ignored the temperature, differ by far more), over the
        // full vocabulary whatever the model's generation config says (top_k 20 there: 0.40).
        let mismatch = s["logprobMismatch"].as_f64().context("logprobMismatch")?;
        assert!(
            mismatch < 1e-3,
            "step {s}: trainer vs vLLM logprobs differ by {mismatch}"
        );
        assert_eq!(s["groups"], 2);
        assert_eq!(
            s["updates"], 2,
            "two mini-batches: two optimizer updates per step"
        );
        assert_eq!(
            s["versionLagMax"], 0,
            "maxStaleness 0: every batch on-policy"
        );
    }
    // Every completion carries the policy version that sampled it: the sessions of batch b
    // (tasks 2b and 2b+1) ran on version b, after the push that made it.
    let ingest = out.join("trainer/state/ingest");
    let (mut seen, mut overlong, mut penalized, mut penalty) = (0, 0, 0, 0.0);
    for entry in std::fs::read_dir(&ingest)? {
        let t: Value = serde_json::from_str(&std::fs::read_to_string(entry?.path())?)?;
        overlong += u64::from(
            t["stats"]["overlong_turns"]
                .as_u64()
                .context("overlong_turns")?
                > 0,
        );
        // Its longest call, as the gateway counted it: past 16 tokens, into the buffer.
        let longest = t["stats"]["longest_turn_tokens"]
            .as_u64()
            .context("longest_turn_tokens")?;
        if longest > 16 {
            penalized += 1;
            penalty += 0.5 * ((longest - 16) as f64 / 8.0).min(1.0);
        }
        let task = t["task"].as_str().context("task")?;
        let index: u64 = task.trim_start_matches('q').parse()?;
        assert_eq!(
            t["policy_versions"],
            serde_json::json!([index / 2]),
            "task {task}: {}",
            t["session"]
        );
        seen += 1;
    }
    assert_eq!(seen, 24);
    // Sessions whose answer ran past the job's 24 tokens, as the gateway counted them against
    // the real vLLM, are what the steps report (all 24 trained; `grpo.overlong: Train`, so
    // none masked).
    let per_step = |key: &str| steps.iter().filter_map(|s| s[key].as_u64()).sum::<u64>();
    eprintln!("overlong sessions: {overlong} of 24");
    assert_eq!(per_step("overlongSessions"), overlong, "{training}");
    assert_eq!(per_step("maskedSessions"), 0, "{training}");
    // The overlong penalty of each session, from the gateway's count of its longest call, is
    // what the steps took their advantages with (8 sessions a step).
    eprintln!("penalized sessions: {penalized} of 24, penalties {penalty:.3} in all");
    assert!(penalized > 0, "no session reached the buffer: {training}");
    assert_eq!(per_step("penalizedSessions"), penalized, "{training}");
    let stepped: f64 = steps
        .iter()
        .filter_map(|s| s["overlongPenalty"].as_f64())
        .map(|mean| mean * 8.0)
        .sum();
    assert!((stepped - penalty).abs() < 1e-6, "{stepped} vs {penalty}");

    // The final model is a directory a server loads as the next job's model.
    let final_model = PathBuf::from(training["finalModel"].as_str().context("finalModel")?);
    for file in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        assert!(
            final_model.join(file).is_file(),
            "{file} in {}",
            final_model.display()
        );
    }
    let curve = std::fs::read_to_string(out.join("reward-curve.svg"))?;
    assert!(curve.contains("<polyline"), "{curve}");
    assert!(curve.contains("held-out pass rate"), "{curve}");
    // By the version that sampled them, as the curve draws them once any ran over.
    let by_version: f64 = training["sampled"]
        .as_array()
        .context("training.sampled")?
        .iter()
        .filter_map(|r| Some(r["sessions"].as_f64()? * r["overlongFraction"].as_f64()?))
        .sum();
    assert_eq!(by_version.round() as u64, overlong, "{training}");
    assert_eq!(curve.contains("overlong fraction"), overlong > 0, "{curve}");

    // Held-out rounds: before training, at step 2 and at the final version 3, each sampled by
    // the policy of its step (never an older one; a step may land while a round runs), graded,
    // written to held-out/ and never shipped to the trainer (its ingest holds the 24 above).
    let rounds = training["heldOut"].as_array().context("training.heldOut")?;
    let measured: Vec<(u64, bool, u64, u64)> = rounds
        .iter()
        .filter_map(|r| {
            Some((
                r["step"].as_u64()?,
                r["last"].as_bool().unwrap_or(false),
                r["scored"].as_u64()?,
                r["policyVersions"][0].as_u64()?,
            ))
        })
        .collect();
    assert_eq!(
        measured,
        [(0, false, 2, 0), (2, false, 2, 2), (3, true, 2, 3)],
        "{training}"
    );
    assert!(
        rounds.iter().all(|r| r["passRate"].is_number()),
        "{training}"
    );
    let kept = ["accepted", "rejected"]
        .iter()
        .filter_map(|d| std::fs::read_dir(out.join("held-out").join(d)).ok())
        .flatten()
        .count();
    assert_eq!(kept, 6, "held-out trajectories in {}", out.display());
    assert!(out.join("sessions/brief-h1-0.h2").is_dir());
    for step in [0, 2, 3] {
        assert!(
            said.iter()
                .any(|l| l.starts_with(&format!("[held-out] step {step}"))),
            "no round line for step {step} in {said:?}"
        );
    }
    assert!(table.contains("held-out  pass rate step 0 "), "{table}");
    let left = processes_naming(&out);
    assert!(left.is_empty(), "processes left behind: {left:?}");
    Ok(())
}

/// A real harness's sessions train the policy: `examples/learn/pi.yaml` as a user runs it (Pi
/// from npm, unmodified, each of its calls through floe's gateway), its first question's 4
/// samples (`--sessions 4`: training on Pi's ~2k-token prompts is this suite's costliest step
/// on CPU). Every session's trajectory is trained in one step, and the trainer's log-probs of
/// the tokens Pi was sampled are vLLM's. (That later sessions sample the policy earlier ones
/// trained is `a_train_job_trains_the_policy_its_later_sessions_sample_from`'s, and CI's
/// learning run's; `FLOE_TEST_FULL=1` runs both questions here.)
#[test]
#[ignore = "FLOE_TEST_FULL=1 only; in CI: a_pi_train_job_on_a_swebench_instance_takes_a_step \
            (Pi's own sessions trained in one step, the trainer's log-probs of Pi's tokens \
            vLLM's) and CI's learning run (later sessions sample the policy earlier ones \
            trained); ~5 min of a slow 2-core machine alone"]
fn a_pi_train_job_trains_on_pis_own_sessions() -> Result<()> {
    let _memory = alone()?;
    let (python, models) = vllm_setup()?;
    let pi = harness_bin_dir("pi")?;
    let dir = tempfile::tempdir()?;
    let job_file = dir.path().join("job.yaml");
    std::fs::copy(workspace_root().join("examples/learn/pi.yaml"), &job_file)?;
    // The example names its model relative to itself, as run.sh links it.
    std::os::unix::fs::symlink(
        models.join("smollm2-135m-instruct"),
        dir.path().join("model"),
    )?;
    let mut path = vec![pi];
    path.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    let out = dir.path().join("out");
    let full = std::env::var_os("FLOE_TEST_FULL").is_some();
    let sessions = if full { 8 } else { 4 };
    let summary = succeeded(
        floe_run(&job_file, &out, &python)
            .env("PATH", std::env::join_paths(path)?)
            .args(["--sessions", &sessions.to_string()]),
        &out,
    )?;
    assert_eq!(summary["sessions"]["completed"], sessions, "{summary}");
    let training = &summary["training"];
    assert_eq!(training["ingest"]["accepted"], sessions, "{training}");
    let steps = training["steps"].as_array().context("training.steps")?;
    let versions: Vec<u64> = steps
        .iter()
        .filter_map(|s| s["policyVersion"].as_u64())
        .collect();
    let expected: &[u64] = if full { &[1, 2] } else { &[1] };
    assert_eq!(versions, expected, "one step a question: {training}");
    for s in steps {
        assert_eq!(s["groups"], 1, "{s}");
        let mismatch = s["logprobMismatch"].as_f64().context("logprobMismatch")?;
        assert!(
            mismatch < 1e-3,
            "trainer vs vLLM on Pi's tokens: {mismatch}"
        );
    }
    let mut by_task = std::collections::BTreeMap::<String, Vec<Value>>::new();
    for entry in std::fs::read_dir(out.join("trainer/state/ingest"))? {
        let t: Value = serde_json::from_str(&std::fs::read_to_string(entry?.path())?)?;
        assert!(
            t["stats"]["completions"].as_u64() >= Some(1),
            "Pi called the model: {}",
            t["stats"]
        );
        let task = t["task"].as_str().context("task")?.to_string();
        by_task
            .entry(task)
            .or_default()
            .push(t["policy_versions"].clone());
    }
    assert_eq!(
        by_task["fruit"],
        vec![serde_json::json!([0]); 4],
        "{by_task:?}"
    );
    if full {
        assert_eq!(
            by_task["colour"],
            vec![serde_json::json!([1]); 4],
            "{by_task:?}"
        );
    }
    let left = processes_naming(&out);
    assert!(left.is_empty(), "processes left behind: {left:?}");
    Ok(())
}

/// Issue 62's loop with a real harness on a SWE-bench-format instance: Pi (from npm,
/// unmodified) works in the instance's repository at `base_commit`, swebench 5.0.2 grades the
/// evaluation copy with the instance's own eval script and log parser (`scoring: Fraction`:
/// the share of `FAIL_TO_PASS` that pass), and the trainer takes a step on Pi's four
/// trajectories: the policy version advances. The instance (`swebench_instance::NOTE`) is a
/// bug whose fix comes with a one-line release note, Pi's final answer: no model this machine
/// can run fixes the bug, but the note's tests grade its length, so a group's rewards differ
/// and train.
#[test]
fn a_pi_train_job_on_a_swebench_instance_takes_a_step() -> Result<()> {
    let _memory = alone()?;
    let (python, models) = vllm_setup()?;
    let pi = harness_bin_dir("pi")?;
    let install = floe_tests::swebench_instance::install_dir()?;
    // Not under /tmp: each sandbox has a /tmp of its own.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR"))?;
    let swe = &floe_tests::swebench_instance::NOTE;
    let up =
        floe_tests::swebench_instance::upstream_of(swe, &dir.path().join("repos").join(swe.repo))?;
    let statement = "greet(' ada ') returns 'hello  ada ': it should strip the spaces around \
                     a name and return 'hello ada'. Fix it. Your final answer is the release \
                     note for the fix: one short line.";
    let line = floe_tests::swebench_instance::instance(
        &up,
        1,
        statement,
        &install.join("testbed/bin/activate"),
    );
    std::fs::write(dir.path().join("instances.jsonl"), format!("{line}\n"))?;
    std::os::unix::fs::symlink(
        models.join("smollm2-135m-instruct"),
        dir.path().join("model"),
    )?;
    let job = serde_json::json!({
        "apiVersion": "floe.dev/v1alpha1", "kind": "RolloutJob",
        "metadata": {"name": "swe-pi"},
        "spec": {
            "numSamples": 4, "concurrency": 2, "poolRef": {"name": "local"},
            "harness": {"preset": "pi", "model": "policy", "api": "openai-chat",
                        "settings": {"contextWindow": 8192},
                        // Pi's printed answer is its change to the repository.
                        "command": ["sh", "-c", "pi --provider floe --model policy -p --offline --no-session \"$FLOE_INSTRUCTION\" > NOTE.md"]},
            "tasks": {"file": {"path": "instances.jsonl"}, "swebench": {}},
            "evaluator": {"reward": {"source": "SWEBench", "scoring": "Fraction",
                                     "passThreshold": 0.5}},
            "sampling": {"maxResponseTokens": 64, "temperature": 1.0},
            "timeouts": {"agentSeconds": 300, "evaluatorSeconds": 120},
            "train": {"image": "unused", "model": "model", "gpus": 0, "memoryPlan": "Warn",
                      "maxStaleness": 0,
                      "vllm": {"gpus": 0, "args": ["--dtype", "float32", "--enforce-eager",
                                                   "--max-model-len", "8192"]},
                      "grpo": {"groupsPerStep": 1, "learningRate": 2.0e-5,
                               "microBatchSize": 2}}}});
    let job_file = dir.path().join("job.yaml");
    std::fs::write(&job_file, serde_json::to_string_pretty(&job)?)?;
    let mut path = vec![pi];
    path.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    let out = dir.path().join("out");
    let summary = succeeded(
        floe_run(&job_file, &out, &python)
            .env("PATH", std::env::join_paths(path)?)
            .arg("--swebench-python")
            .arg(install.join("venv/bin/python")),
        &out,
    )?;
    assert_eq!(summary["sessions"]["completed"], 4, "{summary}");
    // swebench's verdicts: each session's reward is the share of the FAIL_TO_PASS tests that
    // passed.
    let mut rewards = Vec::new();
    for entry in std::fs::read_dir(out.join("sessions"))? {
        let s: Value = serde_json::from_str(&std::fs::read_to_string(
            entry?.path().join("summary.json"),
        )?)?;
        let reward = s["reward"]
            .as_f64()
            .with_context(|| format!("a reward: {s}"))?;
        let tests = swe.fail_to_pass.len() as f64;
        assert!(
            (reward * tests - (reward * tests).round()).abs() < 1e-9,
            "a share of {tests} tests: {s}"
        );
        rewards.push(reward);
    }
    eprintln!("[test] swebench's rewards of Pi's four samples: {rewards:?}");
    let training = &summary["training"];
    let steps = training["steps"].as_array().context("training.steps")?;
    assert_eq!(steps.len(), 1, "rewards {rewards:?}: {training}");
    assert_eq!(steps[0]["policyVersion"], 1, "{training}");
    let mismatch = steps[0]["logprobMismatch"]
        .as_f64()
        .context("logprobMismatch")?;
    assert!(
        mismatch < 1e-3,
        "trainer vs vLLM on Pi's tokens: {mismatch}"
    );
    for entry in std::fs::read_dir(out.join("trainer/state/ingest"))? {
        let t: Value = serde_json::from_str(&std::fs::read_to_string(entry?.path())?)?;
        assert_eq!(t["task"], "acme__greet-1", "{}", t["task"]);
        assert!(
            t["stats"]["completions"].as_u64() >= Some(1),
            "Pi called the model: {}",
            t["stats"]
        );
    }
    let left = processes_naming(&out);
    assert!(left.is_empty(), "processes left behind: {left:?}");
    Ok(())
}

/// `train.lora` through `floe run`: vLLM serves the base as `policy-base` with the adapter
/// the trainer pushes as `policy`, which is what the harness's gateway asks for; the trainer's
/// log-probs of what vLLM sampled through the adapter match; each push is the adapter alone;
/// the final model is the merged one, with the adapter beside it.
#[test]
#[ignore = "FLOE_TEST_FULL=1 only; in CI: trainer/tests/test_real_vllm_lora.py (the adapter vLLM serves after a push, the merged final model) and the shared policy-server command's unit tests"]
fn a_lora_train_job_samples_through_the_adapter_it_trains() -> Result<()> {
    let _memory = beside_one_other()?;
    let (python, models) = vllm_setup()?;
    let model = models.join("smollm2-135m-instruct");
    let dir = tempfile::tempdir()?;
    let job_file = dir.path().join("job.yaml");
    let shape = Shape {
        samples: 4,
        groups_per_step: 2,
        epochs: 1,
        lora_rank: Some(8),
    };
    std::fs::write(
        &job_file,
        job(&model, &["Name a fruit.", "Name a river."], &shape),
    )?;
    let out = dir.path().join("out");
    let summary = succeeded(&mut floe_run(&job_file, &out, &python), &out)?;
    assert_eq!(summary["sessions"]["completed"], 8, "{summary}");
    let training = &summary["training"];
    let steps = training["steps"].as_array().context("training.steps")?;
    assert_eq!(steps.len(), 1, "{training}");
    let mismatch = steps[0]["logprobMismatch"]
        .as_f64()
        .context("logprobMismatch")?;
    assert!(mismatch < 1e-3, "trainer vs vLLM's adapter: {mismatch}");
    let vllm_log = std::fs::read_to_string(out.join("trainer/vllm.log")).unwrap_or_default();
    assert!(
        vllm_log.contains("LoRA adapter 'policy' added") || vllm_log.contains("load_lora_adapter"),
        "vLLM loaded the adapter: {}",
        vllm_log
            .lines()
            .rev()
            .take(20)
            .collect::<Vec<_>>()
            .join("\n")
    );
    let pushed = out.join("trainer/state/weights/adapter-1");
    let bytes: u64 = std::fs::read_dir(&pushed)?
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum();
    assert!(bytes < 20 << 20, "a push is the adapter: {bytes} bytes");
    let final_model = PathBuf::from(training["finalModel"].as_str().context("finalModel")?);
    for file in [
        "config.json",
        "model.safetensors",
        "adapter/adapter_config.json",
    ] {
        assert!(
            final_model.join(file).is_file(),
            "{file} in {}",
            final_model.display()
        );
    }
    let left = processes_naming(&out);
    assert!(left.is_empty(), "processes left behind: {left:?}");
    Ok(())
}

#[test]
fn a_train_job_that_cannot_start_fails_before_any_session() -> Result<()> {
    let (python, models) = vllm_setup()?;
    let dir = tempfile::tempdir()?;
    let job_file = dir.path().join("job.yaml");
    // A model directory that does not exist: one line, exit 2, nothing started or written.
    std::fs::write(
        &job_file,
        job(
            &dir.path().join("no-such-model"),
            &["Name a fruit."],
            &LEARNING,
        ),
    )?;
    let out = dir.path().join("out");
    let result = floe_run(&job_file, &out, &python).output()?;
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert_eq!(result.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("spec.train.model"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(!out.join("sessions").exists());

    // A step that cannot fit (a million-token context, the memory plan enforced): the
    // trainer's one line, exit 2, before vLLM or the trainer starts.
    let model = models.join("smollm2-135m-instruct");
    let enforced = job(&model, &["Name a fruit."], &LEARNING)
        .replace("memoryPlan: Warn", "memoryPlan: Enforce")
        .replace(
            r#""--max-model-len", "2048""#,
            r#""--max-model-len", "1000000""#,
        );
    assert!(enforced.contains("Enforce") && enforced.contains("1000000"));
    std::fs::write(&job_file, enforced)?;
    let refused = dir.path().join("out-refused");
    let result = floe_run(&job_file, &refused, &python).output()?;
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert_eq!(result.status.code(), Some(2), "{stderr}");
    let line = stderr.lines().last().unwrap_or_default();
    assert!(
        line.contains("memory plan: a training step needs ")
            && line.contains("on each CPU (memory available to the trainer), which has ")
            && line.contains("shorten the context to"),
        "{stderr}"
    );
    assert!(
        !refused.join("trainer/vllm.log").exists(),
        "vLLM was started"
    );
    assert!(
        !refused.join("trainer/trainer.log").exists(),
        "the trainer was started"
    );
    assert!(!refused.join("sessions").exists());

    // A trainer over several nodes is the cluster's: refused, nothing started.
    let sharded = job(&model, &["Name a fruit."], &LEARNING).replacen(
        "    gpus: 0\n",
        "    gpus: 0\n    nodes: 2\n",
        1,
    );
    assert!(sharded.contains("nodes: 2"), "{sharded}");
    std::fs::write(&job_file, sharded)?;
    let refused = dir.path().join("out-nodes");
    let result = floe_run(&job_file, &refused, &python).output()?;
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert_eq!(result.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("train.nodes is 2: a trainer over several nodes runs on the cluster"),
        "{stderr}"
    );
    assert!(!refused.join("trainer/vllm.log").exists());
    assert!(!refused.join("sessions").exists());

    // `--resume` into another job's run: refused before vLLM or the trainer starts (which
    // would take minutes, and replay the other run's trajectories under this job).
    std::fs::write(&job_file, job(&model, &["Name a fruit."], &LEARNING))?;
    let other = dir.path().join("out-other");
    std::fs::create_dir_all(&other)?;
    std::fs::write(
        other.join("run.json"),
        r#"{"job": "other", "mode": "train", "assignments": []}"#,
    )?;
    let result = floe_run(&job_file, &other, &python)
        .arg("--resume")
        .output()?;
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert_eq!(result.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(r#"--out holds a run of train job "other", not of train job "brief""#),
        "{stderr}"
    );
    assert!(!other.join("trainer/vllm.log").exists(), "vLLM was started");

    // A policy server that exits while starting: its log, exit 2.
    let cmd = floe_run(&job_file, &out, &python);
    let args: Vec<_> = cmd.get_args().map(|a| a.to_os_string()).collect();
    let envs: Vec<_> = cmd
        .get_envs()
        .filter_map(|(k, v)| Some((k.to_os_string(), v?.to_os_string())))
        .collect();
    let mut cmd = Command::new(cmd.get_program());
    cmd.envs(envs);
    let mut after_vllm_flag = false;
    for a in args {
        cmd.arg(if after_vllm_flag {
            "/bin/false".into()
        } else {
            a.clone()
        });
        after_vllm_flag = a == "--vllm-python";
    }
    let result = cmd.output()?;
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert_eq!(result.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("vLLM exited"), "{stderr}");

    // A trainer that dies while starting (attached to the suite's running vLLM): its own
    // error, exit 2, nothing left running, no session started.
    let out = dir.path().join("out-2");
    let result = floe_run(&job_file, &out, &python)
        .args(["--model-url", &vllm().url])
        .env("PYTHONPATH", dir.path())
        .output()?;
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert_eq!(result.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("the trainer exited"), "{stderr}");
    assert!(
        stderr.contains("floe_trainer"),
        "the trainer's own error: {stderr}"
    );
    let left = processes_naming(&out);
    assert!(left.is_empty(), "processes left behind: {left:?}");
    assert!(!out.join("sessions").exists());

    // A fidelity check no measurement can pass (maxMismatch 0; the real one is ~1e-5): the
    // probes sampled from the real vLLM and scored by the real trainer, then its one line,
    // exit 2, everything stopped, no session.
    let _memory = beside_one_other()?;
    let strict = job(&model, &["Name a fruit.", "Name a colour."], &LEARNING).replacen(
        "    maxStaleness: 0\n",
        "    maxStaleness: 0\n    fidelityCheck: {maxMismatch: 0}\n",
        1,
    );
    assert!(strict.contains("fidelityCheck"), "{strict}");
    std::fs::write(&job_file, strict)?;
    let out = dir.path().join("out-fidelity");
    let result = floe_run(&job_file, &out, &python).output()?;
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert_eq!(result.status.code(), Some(2), "{stderr}");
    let line = stderr.lines().last().unwrap_or_default();
    assert!(
        line.contains("fidelity check: the trainer's log-probs of ")
            && line.contains("tokens sampled by the policy server are ")
            && line.contains("maxMismatch 0")
            && line.contains("would train a distribution vLLM does not sample"),
        "{stderr}"
    );
    let left = processes_naming(&out);
    assert!(left.is_empty(), "processes left behind: {left:?}");
    assert!(!out.join("sessions").exists());
    Ok(())
}

/// A train run of two epochs over two tasks, stopped after its first step (SIGTERM, as
/// `timeout` or systemd stop it) and continued with `--resume` in the same `--out`, is one
/// job: the stopped trainer wrote a checkpoint (none was due: the periodic one is every 50
/// steps), the resumed trainer starts from it with the new vLLM serving its weights, the
/// finished sessions are not run again, each sample of each group (a task's group per epoch)
/// is trained exactly once, each batch sampled from the policy of its step, and the step
/// table spans both runs. (A group whose samples score alike makes no step: the expected
/// steps come from the rewards the groups delivered.)
#[test]
#[ignore = "FLOE_TEST_FULL=1 only; in CI: faults.rs (`floe run --resume` keeps finished sessions, runs the rest), trainer/tests/test_real_vllm.py (a trainer resumes from its checkpoint, vLLM serving its weights, nothing trained twice) and real_node/training.rs (a deleted trainer pod's successor resumes so)"]
fn a_stopped_train_run_resumes_from_the_checkpoint_its_trainer_wrote() -> Result<()> {
    let _memory = beside_one_other()?;
    let (python, models) = vllm_setup()?;
    let model = models.join("smollm2-135m-instruct");
    let dir = tempfile::tempdir()?;
    let job_file = dir.path().join("job.yaml");
    let shape = Shape {
        samples: 2,
        groups_per_step: 1,
        epochs: 2,
        lora_rank: None,
    };
    let questions = ["Name a fruit.", "Name a colour."];
    // A held-out question measured before training and at the final version only.
    let held_out = "    maxStaleness: 0\n    heldOut: {everySteps: 1000, tasks: {inline: [\
        {id: h0, instruction: \"Name a city.\"}]}}\n";
    let text = job(&model, &questions, &shape).replace("    maxStaleness: 0\n", held_out);
    std::fs::write(&job_file, text)?;
    let out = dir.path().join("out");

    let mut run = floe_run(&job_file, &out, &python)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let lines = forward(run.stderr.take().context("stderr")?);
    let first_step = lines
        .iter()
        .find(|l| l.starts_with("[train] step 1 "))
        .context("floe run ended before its first step")?;
    eprintln!("[test] after {first_step:?}: SIGTERM");
    Command::new("kill")
        .args(["-TERM", &run.id().to_string()])
        .status()?;
    let status = run.wait()?;
    assert_eq!(status.code(), Some(143), "SIGTERM's exit code");
    let stopped: Value = serde_json::from_str(&std::fs::read_to_string(out.join("summary.json"))?)?;
    assert_eq!(stopped["interrupted"], true, "{stopped}");
    let checkpoints = out.join("trainer/checkpoints");
    // The stopping trainer's checkpoint (none was due): of its last step, which is step 1
    // unless a second step was under way when the stop came (it finishes before writing).
    let steps_then = std::fs::read_dir(&checkpoints)?
        .filter_map(|e| {
            e.ok()?
                .file_name()
                .to_str()?
                .strip_prefix("ckpt-")?
                .parse()
                .ok()
        })
        .max()
        .unwrap_or(0u64);
    assert!(
        steps_then >= 1
            && checkpoints
                .join(format!("ckpt-{steps_then}/state.json"))
                .is_file(),
        "the stopped trainer's checkpoint in {}",
        checkpoints.display()
    );
    let table = stopped["training"]["steps"].as_array().map_or(0, Vec::len);
    assert!((1..=steps_then as usize).contains(&table), "{stopped}");
    let left = processes_naming(&out);
    assert!(left.is_empty(), "processes left behind: {left:?}");

    let resumed = floe_run(&job_file, &out, &python)
        .arg("--resume")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let result = resumed.wait_with_output()?;
    let stderr = String::from_utf8_lossy(&result.stderr);
    eprintln!("{stderr}");
    assert_eq!(result.status.code(), Some(0), "floe run --resume: {stderr}");
    assert!(stderr.contains("resuming: "), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "[train] resumed from the checkpoint of step {steps_then}"
        )),
        "{stderr}"
    );
    let summary: Value = serde_json::from_str(&std::fs::read_to_string(out.join("summary.json"))?)?;
    assert_eq!(summary["interrupted"], false, "{summary}");
    assert_eq!(summary["sessions"]["total"], 8, "{summary}");
    // The round before training is carried over as the stopped run measured it (the policy
    // it measured is gone: it is not run again), then the final version's.
    let rounds = |s: &Value| -> Vec<(u64, u64, Value)> {
        s["training"]["heldOut"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| {
                Some((
                    r["step"].as_u64()?,
                    r["scored"].as_u64()?,
                    r["passRate"].clone(),
                ))
            })
            .collect()
    };
    let (before, after) = (rounds(&stopped), rounds(&summary));
    assert_eq!(before.first().map(|r| r.0), Some(0), "{stopped}");
    assert_eq!(after.first(), before.first(), "{summary}");
    assert_eq!(after.len(), 2, "{summary}");
    assert_eq!(
        Some(after[1].0),
        summary["training"]["policyVersion"].as_u64(),
        "{summary}"
    );
    assert!(!out.join("sessions/brief-h0-0.h0-r1").exists());
    assert_eq!(summary["sessions"]["completed"], 8, "{summary}");
    // Groups in run order (run.json: each session's first attempt, in order): the first epoch
    // as listed, then the second, each task once, as groups of their own.
    let run: Value = serde_json::from_str(&std::fs::read_to_string(out.join("run.json"))?)?;
    let mut groups: Vec<String> = run["assignments"]
        .as_array()
        .context("assignments")?
        .iter()
        .filter_map(|a| a["group"].as_str().map(str::to_owned))
        .collect();
    groups.dedup();
    assert_eq!(groups[..2], ["brief/q0", "brief/q1"], "{groups:?}");
    let mut second = groups[2..].to_vec();
    second.sort();
    assert_eq!(second, ["brief/q0/e1", "brief/q1/e1"], "{groups:?}");

    // What each group delivered: its samples' rewards and policy versions (attempts the stop
    // cut short are untrainable, and their sessions run again).
    let mut delivered: Vec<Vec<(f64, Value)>> = vec![Vec::new(); groups.len()];
    for entry in std::fs::read_dir(out.join("trainer/state/ingest"))? {
        let t: Value = serde_json::from_str(&std::fs::read_to_string(entry?.path())?)?;
        if t["trainable"] != true {
            continue;
        }
        let group = t["group"].as_str().context("group")?;
        let at = groups.iter().position(|g| g == group).context("group")?;
        let reward = t["reward"].as_f64().context("reward")?;
        delivered[at].push((reward, t["policy_versions"].clone()));
    }
    // A group whose two samples scored alike teaches nothing and makes no step (sampling at
    // temperature 0.8 gives two equally long answers now and then); the groups after it join
    // the step the same policy's samples go to.
    let teaches = |samples: &[(f64, Value)]| {
        let (lo, hi) = samples
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), (r, _)| {
                (lo.min(*r), hi.max(*r))
            });
        samples.len() == 2 && hi - lo >= 1e-12
    };
    let mut steps_before = 0u64;
    for (group, samples) in groups.iter().zip(&delivered) {
        assert_eq!(samples.len(), 2, "{group}: each sample once");
        // Each group was sampled from the policy its step started from, before and after the
        // stop.
        for (_, versions) in samples {
            assert_eq!(versions, &serde_json::json!([steps_before]), "{group}");
        }
        steps_before += u64::from(teaches(samples));
    }
    assert!(steps_before >= steps_then, "{delivered:?}");
    let training = &summary["training"];
    let table: Vec<u64> = training["steps"]
        .as_array()
        .context("training.steps")?
        .iter()
        .filter_map(|s| s["step"].as_u64())
        .collect();
    let expected: Vec<u64> = (1..=steps_before).collect();
    assert_eq!(table, expected, "one table over both runs: {training}");
    assert_eq!(training["policyVersion"], steps_before, "{training}");
    assert_eq!(
        training["dropped"]["zero_advantage"].as_u64().unwrap_or(0),
        groups.len() as u64 - steps_before,
        "{training}"
    );

    // Trained exactly once per sample: the sessions the last checkpoint (written when the
    // resumed run stopped its trainer) lists, by session without its attempt suffix.
    let state: Value = serde_json::from_str(&std::fs::read_to_string(
        checkpoints.join(format!("ckpt-{steps_before}/state.json")),
    )?)?;
    let mut trained: Vec<String> = state["trained_sessions"]
        .as_array()
        .context("trained_sessions")?
        .iter()
        .filter_map(Value::as_str)
        .map(|s| match s.rsplit_once("-r") {
            Some((base, n)) if n.chars().all(|c| c.is_ascii_digit()) => base.to_string(),
            _ => s.to_string(),
        })
        .collect();
    trained.sort();
    let count = trained.len();
    trained.dedup();
    let samples_trained = 2 * steps_before as usize;
    assert_eq!(
        (count, trained.len()),
        (samples_trained, samples_trained),
        "each sample of each trained group once: {state}"
    );
    let left = processes_naming(&out);
    assert!(left.is_empty(), "processes left behind: {left:?}");
    Ok(())
}
