//! `floe run` for a `train` job: the trainer pod's three processes on this machine — vLLM
//! serving the policy, `floe policy-proxy` in front of it (in-process here) and `floe-trainer
//! serve` — started with the arguments and configuration the pod's containers get
//! (`floe_operator::rollout::trainer_launch`), or attached to with `--model-url` /
//! `--trainer-url`. Each child runs in its own process group, and every group is stopped on
//! exit, failure or Ctrl-C (and killed when this value is dropped on an error path).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use floe_operator::rollout::trainer_launch::{self, Layout, SERVED_MODEL};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde_json::Value;
use tokio::process::{Child, Command};

use super::plan::Plan;
use super::RunError;

mod fidelity_check;
mod finish;
mod report;

pub use finish::finish;
use report::requests_running;
pub use report::{step_line, summary, utilization};

/// Where this machine's vLLM and trainer programs are (flags of `floe run`).
pub struct Programs {
    /// A Python with vLLM: runs `PYTHON -m vllm.entrypoints.openai.api_server`. Default:
    /// `vllm serve` from PATH.
    pub vllm_python: Option<PathBuf>,
    /// A Python with `floe_trainer` importable: runs `PYTHON -m floe_trainer.cli serve`.
    /// Default: `floe-trainer` from PATH.
    pub trainer_python: Option<PathBuf>,
    /// How long vLLM and the trainer may take to answer their health checks.
    pub start_timeout: Duration,
}

/// Where the trainer reads its control token (`floe run` sets it for the one it starts, and
/// reads it for one it attaches to with `--trainer-url`).
const CONTROL_TOKEN_ENV: &str = "FLOE_TRAINER_CONTROL_TOKEN";

/// A running train job's policy server, proxy and trainer.
pub struct Training {
    /// What the gateway calls: the policy proxy (it labels each completion's policy version).
    pub policy_url: String,
    /// The trainer's ingest, status and finish endpoints.
    pub trainer_url: String,
    pub model_name: String,
    control_token: Option<String>,
    /// The started trainer's ingest token, which the gateway's sink carries.
    ingest_token: Option<String>,
    /// What each child is, the child, and its process group (its pid at spawn).
    children: Vec<(String, Child, i32)>,
    proxy_stop: Option<tokio::sync::oneshot::Sender<()>>,
    http: reqwest::Client,
    /// Steps already printed as progress lines.
    /// The last step whose line was printed.
    reported_step: u64,
    /// Samples of vLLM's `vllm:num_requests_running`: (all, with requests running).
    busy_samples: (u64, u64),
}

fn free_port() -> Result<u16, RunError> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| RunError::Io(format!("loopback port: {e}")))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| RunError::Io(format!("loopback port: {e}")))
}

/// The model directory of `spec.train.model`: a path relative to the job file, or absolute.
fn model_dir(plan: &Plan, job_file: &Path) -> Result<PathBuf, RunError> {
    let train = plan
        .job
        .spec
        .train
        .as_ref()
        .ok_or_else(|| RunError::Preflight("not a train job".into()))?;
    let dir = job_file
        .parent()
        .unwrap_or(Path::new("."))
        .join(&train.model);
    if !dir.join("config.json").is_file() {
        return Err(RunError::Preflight(format!(
            "spec.train.model {} is not a model directory here ({} has no config.json)",
            train.model,
            dir.display()
        )));
    }
    std::fs::canonicalize(&dir).map_err(|e| RunError::Preflight(format!("{}: {e}", dir.display())))
}

/// Appended to, never truncated: a resumed run's logs follow the interrupted run's, whose
/// end may be the only record of why it stopped (a trainer that crashed).
fn log_file(path: &Path) -> Result<Stdio, RunError> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map(Stdio::from)
        .map_err(|e| RunError::Io(format!("{}: {e}", path.display())))
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(8)..].join("\n")
}

impl Training {
    /// Everything the sessions need, started and healthy — or an error after stopping what
    /// was started (nothing is left half-started).
    pub async fn start(
        plan: &Plan,
        job_file: &Path,
        programs: &Programs,
        model_url: Option<&str>,
        trainer_url: Option<&str>,
        out: &Path,
    ) -> Result<Self, RunError> {
        let mut me = Training {
            policy_url: String::new(),
            trainer_url: String::new(),
            model_name: SERVED_MODEL.into(),
            control_token: None,
            ingest_token: None,
            children: Vec::new(),
            proxy_stop: None,
            http: reqwest::Client::new(),
            reported_step: 0,
            busy_samples: (0, 0),
        };
        match me
            .start_all(plan, job_file, programs, model_url, trainer_url, out)
            .await
        {
            Ok(()) => Ok(me),
            Err(e) => {
                me.stop(None).await;
                Err(e)
            }
        }
    }

    async fn start_all(
        &mut self,
        plan: &Plan,
        job_file: &Path,
        programs: &Programs,
        model_url: Option<&str>,
        trainer_url: Option<&str>,
        out: &Path,
    ) -> Result<(), RunError> {
        let spec = &plan.job.spec;
        let train = spec
            .train
            .as_ref()
            .ok_or_else(|| RunError::Preflight("not a train job".into()))?;
        let dir = out.join("trainer");
        // Checked before anything starts: each would fail the run later anyway.
        if train.nodes > 1 && trainer_url.is_none() {
            return Err(RunError::Preflight(format!(
                "train.nodes is {}: a trainer over several nodes runs on the cluster (the operator starts one pod per node); floe run trains on this machine: set train.nodes to 1 or pass --trainer-url URL",
                train.nodes
            )));
        }
        let model = match (model_url, trainer_url) {
            (Some(_), Some(_)) => None,
            _ => Some(model_dir(plan, job_file)?),
        };
        if model_url.is_none()
            && programs.vllm_python.is_none()
            && !super::preflight::on_path("vllm")
        {
            return Err(RunError::Preflight(
                "no policy server: `vllm` is not on PATH; pass --vllm-python PYTHON (a Python with vLLM) or --model-url URL (a running vLLM in dev mode)".into(),
            ));
        }
        if trainer_url.is_none()
            && programs.trainer_python.is_none()
            && !super::preflight::on_path("floe-trainer")
        {
            return Err(RunError::Preflight(
                "no trainer: `floe-trainer` is not on PATH; pass --trainer-python PYTHON (with floe_trainer importable) or --trainer-url URL".into(),
            ));
        }
        std::fs::create_dir_all(&dir)
            .map_err(|e| RunError::Io(format!("{}: {e}", dir.display())))?;
        let me = self;
        let layout = Layout {
            model: model
                .as_ref()
                .map(|m| m.display().to_string())
                .unwrap_or_default(),
            vllm_port: free_port()?,
            ingest_listen: format!("127.0.0.1:{}", free_port()?),
            checkpoint_dir: Some(dir.join("checkpoints").display().to_string()),
            final_dir: Some(out.join("final-model").display().to_string()),
            // The state directory is in --out already: it outlives the trainer (--resume).
            ingest_dir: None,
        };
        let config = trainer_url
            .is_none()
            .then(|| trainer_launch::trainer_config(&plan.name, None, spec, train, &layout));
        if let Some(config) = &config {
            // Before vLLM starts: a step that cannot fit is refused now, in the trainer's words.
            super::train_plan::check_memory_plan(config, programs.trainer_python.as_deref())
                .await?;
        }
        let vllm_url = match model_url {
            Some(url) => url.trim_end_matches('/').to_string(),
            None => {
                me.start_vllm(train, &layout, programs, &dir).await?;
                layout.vllm_url()
            }
        };
        me.start_proxy(&vllm_url).await?;
        me.trainer_url = match trainer_url {
            // The trainer's base URL (its ingest is `/v1/trajectories` under it), and its
            // control token when the environment has it, as the trainer reads it: without it
            // the trainer is not told the sessions are done, nor what failed, and its status
            // lists only its last steps.
            Some(url) => {
                me.control_token = floe_gateway::bearer::env_secret(CONTROL_TOKEN_ENV);
                url.trim_end_matches('/')
                    .trim_end_matches("/v1/trajectories")
                    .to_string()
            }
            None => {
                let mut config = config.unwrap_or_default();
                if model_url.is_some() {
                    // Attached to a running vLLM: the trainer pushes into that one.
                    config["policyUrl"] = Value::String(vllm_url.clone());
                }
                me.start_trainer(train, &config, &layout, programs, &dir)
                    .await?;
                format!("http://{}", layout.ingest_listen)
            }
        };
        me.check_fidelity(plan).await
    }

    /// Where the gateway ships trajectories.
    pub fn ingest_url(&self) -> String {
        format!("{}/v1/trajectories", self.trainer_url)
    }

    /// The ingest token of the trainer this run started (`None` for one the user runs).
    pub fn ingest_token(&self) -> Option<String> {
        self.ingest_token.clone()
    }

    async fn start_vllm(
        &mut self,
        train: &floe_crds::rollout_job::TrainSpec,
        layout: &Layout,
        programs: &Programs,
        dir: &Path,
    ) -> Result<(), RunError> {
        let mut cmd = match &programs.vllm_python {
            Some(py) => {
                let mut c = Command::new(py);
                c.args([
                    "-m",
                    "vllm.entrypoints.openai.api_server",
                    "--model",
                    &layout.model,
                ]);
                c
            }
            None => {
                let mut c = Command::new("vllm");
                c.args(["serve", &layout.model]);
                c
            }
        };
        cmd.args(trainer_launch::vllm_args(train, layout));
        cmd.envs(trainer_launch::vllm_env(train));
        let log = dir.join("vllm.log");
        self.spawn("vLLM", cmd, &log)?;
        eprintln!(
            "[train] starting vLLM on {} (log {})",
            layout.vllm_url(),
            log.display()
        );
        self.wait_healthy(
            "vLLM",
            &format!("{}/health", layout.vllm_url()),
            &log,
            programs,
        )
        .await
    }

    async fn start_proxy(&mut self, vllm_url: &str) -> Result<(), RunError> {
        // No token here: each sandbox has its own network namespace, which reaches nothing
        // but its gateway's socket.
        let app = crate::policy_proxy::router(vllm_url, 64 << 20, None)
            .map_err(|e| RunError::Io(format!("policy proxy: {e}")))?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| RunError::Io(format!("policy proxy: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| RunError::Io(format!("policy proxy: {e}")))?;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = rx.await;
                })
                .await;
        });
        self.proxy_stop = Some(tx);
        self.policy_url = format!("http://{addr}");
        Ok(())
    }

    async fn start_trainer(
        &mut self,
        train: &floe_crds::rollout_job::TrainSpec,
        config: &Value,
        layout: &Layout,
        programs: &Programs,
        dir: &Path,
    ) -> Result<(), RunError> {
        let state = dir.join("state");
        let python = programs
            .trainer_python
            .as_ref()
            .map(|p| p.display().to_string());
        let line = trainer_launch::trainer_command(train, python.as_deref(), None);
        let mut cmd = Command::new(&line[0]);
        cmd.args(&line[1..]).arg("--state-dir").arg(&state);
        let token = || hex::encode(rand::RngExt::random::<[u8; 24]>(&mut rand::rng()));
        let (control, ingest) = (token(), token());
        if train.gpus > 1 {
            let shutdown = trainer_launch::torch_shutdown_timeout();
            cmd.env("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", shutdown);
        }
        cmd.env("FLOE_TRAINER_CONFIG", config.to_string())
            .env(CONTROL_TOKEN_ENV, &control)
            .env("FLOE_TRAINER_INGEST_TOKEN", &ingest);
        self.control_token = Some(control);
        self.ingest_token = Some(ingest);
        let log = dir.join("trainer.log");
        self.spawn("trainer", cmd, &log)?;
        eprintln!(
            "[train] starting the trainer on {} (log {})",
            layout.ingest_listen,
            log.display()
        );
        let url = format!("http://{}/healthz", layout.ingest_listen);
        self.wait_healthy("the trainer", &url, &log, programs).await
    }

    fn spawn(&mut self, what: &str, mut cmd: Command, log: &Path) -> Result<(), RunError> {
        cmd.stdin(Stdio::null())
            .stdout(log_file(log)?)
            .stderr(log_file(&log.with_extension("err.log"))?)
            .process_group(0)
            .kill_on_drop(true);
        let child = cmd
            .spawn()
            .map_err(|e| RunError::Preflight(format!("cannot start {what}: {e}")))?;
        let pgid = child
            .id()
            .and_then(|p| i32::try_from(p).ok())
            .ok_or_else(|| RunError::Preflight(format!("{what} exited at once")))?;
        self.children.push((what.to_string(), child, pgid));
        Ok(())
    }

    async fn wait_healthy(
        &mut self,
        what: &str,
        url: &str,
        log: &Path,
        programs: &Programs,
    ) -> Result<(), RunError> {
        let t0 = Instant::now();
        loop {
            if let Ok(r) = self
                .http
                .get(url)
                .timeout(Duration::from_secs(2))
                .send()
                .await
            {
                if r.status().is_success() {
                    eprintln!(
                        "[train] {what} ready in {:.0} s",
                        t0.elapsed().as_secs_f64()
                    );
                    return Ok(());
                }
            }
            if let Some((_, child, _)) = self.children.last_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    let err = log.with_extension("err.log");
                    return Err(RunError::Preflight(format!(
                        "{what} exited ({status}) before it was ready; see {}:\n{}",
                        err.display(),
                        tail(&err)
                    )));
                }
            }
            if t0.elapsed() > programs.start_timeout {
                return Err(RunError::Preflight(format!(
                    "{what} was not ready within {} s; see {}",
                    programs.start_timeout.as_secs(),
                    log.display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The trainer's `/v1/status`, if it answers: whole, with the control token (without it,
    /// only the last rows of its per-step table).
    pub async fn status(&self) -> Option<Value> {
        let mut get = self
            .http
            .get(format!("{}/v1/status", self.trainer_url))
            .timeout(Duration::from_secs(5));
        if let Some(token) = &self.control_token {
            get = get.bearer_auth(token);
        }
        let r = get.send().await.ok()?;
        r.json().await.ok()
    }

    /// One sample of whether the policy server is generating (vLLM's own gauge).
    pub async fn sample_policy_server(&mut self) {
        let Ok(r) = self
            .http
            .get(format!("{}/metrics", self.policy_url))
            .timeout(Duration::from_secs(2))
            .send()
            .await
        else {
            return;
        };
        let Ok(text) = r.text().await else { return };
        if let Some(running) = requests_running(&text) {
            self.busy_samples.0 += 1;
            self.busy_samples.1 += u64::from(running > 0.0);
        }
    }

    /// Fraction of the samples in which vLLM had requests running.
    pub fn busy_fraction(&self) -> Option<f64> {
        (self.busy_samples.0 > 0).then(|| self.busy_samples.1 as f64 / self.busy_samples.0 as f64)
    }

    /// Prints a line for every step the trainer took since the last call, by step number (a
    /// trainer that is not told the control token lists only its last steps).
    pub fn report_steps(&mut self, status: &Value) {
        let steps = status["steps"].as_array().map(Vec::as_slice).unwrap_or(&[]);
        // Steps an earlier run took (`--resume`) were printed by that run.
        let resumed = status["resumedFromStep"].as_u64().unwrap_or(0);
        if resumed > 0 && self.reported_step == 0 {
            eprintln!(
                "[train] resumed from the checkpoint of step {resumed} (policy version {})",
                status["policyVersion"]
            );
            self.reported_step = resumed;
        }
        for s in steps {
            let step = s["step"].as_u64().unwrap_or(0);
            if step > self.reported_step {
                eprintln!("{}", step_line(s));
                self.reported_step = step;
            }
        }
    }

    /// A session that failed for good by infrastructure (its retries spent): its group need
    /// not wait for it. A trainer that cannot be told keeps the old behaviour (the group
    /// completes with its grace period or at the end), so a failure here is only logged.
    pub async fn sample_failed(&self, group: &str, sample: u32) {
        let Some(token) = &self.control_token else {
            return;
        };
        let sent = self
            .http
            .post(format!("{}/v1/failed", self.trainer_url))
            .bearer_auth(token)
            .json(&serde_json::json!({"group": group, "sample": sample}))
            .timeout(Duration::from_secs(5))
            .send()
            .await;
        if let Err(e) = sent.and_then(reqwest::Response::error_for_status) {
            tracing::warn!(
                group,
                sample,
                "could not tell the trainer of a failed sample: {e}"
            );
        }
    }

    /// The sessions are done and their trajectories acknowledged: the trainer trains what is
    /// left and writes the final checkpoint. Returns its last status.
    pub async fn finish(&mut self) -> Result<Value, RunError> {
        let Some(token) = &self.control_token else {
            // Attached to a trainer this run did not start: it decides when it is done.
            return self
                .status()
                .await
                .ok_or_else(|| RunError::Io("the trainer does not answer /v1/status".into()));
        };
        let resp = self
            .http
            .post(format!("{}/v1/finish", self.trainer_url))
            .bearer_auth(token)
            .send()
            .await
            .map_err(|e| RunError::Io(format!("finishing the trainer: {e}")))?;
        if !resp.status().is_success() {
            return Err(RunError::Io(format!(
                "the trainer refused to finish: {}",
                resp.text().await.unwrap_or_default()
            )));
        }
        loop {
            if let Some(status) = self.status().await {
                self.report_steps(&status);
                if status["finished"].as_bool() == Some(true) {
                    return Ok(status);
                }
            }
            if let Some((what, status)) = self.exited() {
                return Err(RunError::Io(format!(
                    "{what} exited ({status}) before the training finished"
                )));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// A child that exited on its own.
    pub fn exited(&mut self) -> Option<(String, std::process::ExitStatus)> {
        self.children
            .iter_mut()
            .find_map(|(what, c, _)| c.try_wait().ok().flatten().map(|s| (what.clone(), s)))
    }

    /// SIGTERM to every process group started (trainer first), then SIGKILL after a grace;
    /// returns once no process of those groups is left (vLLM's engine runs in a child).
    /// `hurry`: a second Ctrl-C or SIGTERM ends the trainer's grace at once.
    pub async fn stop(&mut self, mut hurry: Option<&mut super::signals::Signals>) {
        if let Some(tx) = self.proxy_stop.take() {
            let _ = tx.send(());
        }
        let mut children = std::mem::take(&mut self.children);
        // The trainer (started last) first, and alone: it finishes its step, which pushes to
        // vLLM, and writes its last checkpoint before vLLM goes. It gets the trainer pod's
        // grace: a large model's checkpoint takes minutes, and one cut short is lost (the
        // resumed run trains again from the periodic one before).
        children.reverse();
        for (what, child, pgid) in &mut children {
            let trainer = what == "trainer";
            let grace = Duration::from_secs(if trainer {
                trainer_launch::TRAINER_STOP_GRACE_SECONDS
            } else {
                20
            });
            signal_group(*pgid, Signal::SIGTERM);
            if trainer && matches!(child.try_wait(), Ok(None)) {
                eprintln!(
                    "[train] stopping the trainer: it finishes its step and writes its checkpoint \
                     (up to {} s; Ctrl-C again to kill it now)",
                    grace.as_secs()
                );
            }
            let waited = async {
                match hurry.as_mut() {
                    Some(signals) => tokio::select! {
                        done = tokio::time::timeout(grace, child.wait()) => done.is_ok(),
                        _ = signals.recv() => {
                            eprintln!("[train] {what} killed at the second signal");
                            true
                        }
                    },
                    None => tokio::time::timeout(grace, child.wait()).await.is_ok(),
                }
            };
            if !waited.await {
                eprintln!(
                    "[train] {what} did not stop in {} s: killed",
                    grace.as_secs()
                );
            }
            signal_group(*pgid, Signal::SIGKILL);
            let _ = child.wait().await;
            wait_group_gone(*pgid).await;
        }
    }
}

fn signal_group(pgid: i32, signal: Signal) {
    let _ = killpg(Pid::from_raw(pgid), signal);
}

impl Drop for Training {
    /// An error path that never reached `stop`: no process group outlives the run.
    fn drop(&mut self) {
        for (_, _, pgid) in &self.children {
            signal_group(*pgid, Signal::SIGKILL);
        }
    }
}

/// Until no process of group `pgid` is left (at most 20 s).
async fn wait_group_gone(pgid: i32) {
    for _ in 0..200 {
        if killpg(Pid::from_raw(pgid), None).is_err() {
            return;
        }
        signal_group(pgid, Signal::SIGKILL);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
