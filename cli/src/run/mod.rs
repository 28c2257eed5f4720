//! `floe run JOB.yaml --out DIR`: a RolloutJob on one machine. The same YAML and validation as
//! the cluster, the same gateway and sandbox runner as a pod — one in-process gateway with a
//! token per session, one runner per running session, each in its own temp workspace — against
//! any OpenAI-compatible model server (vLLM in practice). A `train` job also runs its policy
//! server and trainer here ([`train`]) and trains while its sessions run.
//!
//! Exit codes: 0 every session ran (whatever its reward); 1 some sessions failed by
//! infrastructure (see summary.json); 2 bad input or a failed pre-flight check (nothing ran);
//! 130 interrupted (Ctrl-C; everything captured so far is written).

mod curve;
mod plan;
mod progress;
mod report;
mod train;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Args;
use floe_gateway::server::{drain, recover, router, Config, Gateway};
use floe_gateway::ship::Sink;
use floe_sandbox::runner::{run as run_sandbox, RunnerConfig};
use rand::RngExt;

use report::SessionResult;

#[derive(Args)]
pub struct RunArgs {
    /// The RolloutJob file: the same YAML a cluster takes.
    job: PathBuf,
    /// Output directory (new or empty): summary.json, dataset.jsonl or trajectories.jsonl,
    /// per-session logs, captures.
    #[arg(long)]
    out: PathBuf,
    /// OpenAI-compatible model server (default: `spec.sft.upstream.url`).
    #[arg(long)]
    model_url: Option<String>,
    /// Model name sent upstream (default: `spec.sft.upstream.model`, else `policy`).
    #[arg(long)]
    model_name: Option<String>,
    /// Sessions at a time (default: `spec.concurrency`, else 2).
    #[arg(long)]
    concurrency: Option<usize>,
    /// Run only the first N sessions (tasks × samples, task by task).
    #[arg(long)]
    sessions: Option<usize>,
    /// Train mode: a trainer already running (its ingest URL) instead of starting one.
    #[arg(long)]
    trainer_url: Option<String>,
    /// Train mode: a Python with vLLM, for the policy server (`PYTHON -m
    /// vllm.entrypoints.openai.api_server`; default: `vllm serve` from PATH). `--model-url`
    /// attaches to a running vLLM (dev mode) instead.
    #[arg(long)]
    vllm_python: Option<PathBuf>,
    /// Train mode: a Python with `floe_trainer` importable (`PYTHON -m floe_trainer.cli
    /// serve`; default: `floe-trainer` from PATH).
    #[arg(long)]
    trainer_python: Option<PathBuf>,
    /// Train mode: seconds the policy server and the trainer may take to become ready.
    #[arg(long, default_value_t = 900)]
    start_timeout: u64,
    /// Train mode: only collect trajectories into trajectories.jsonl against `--model-url`
    /// (no trainer, no weight updates).
    #[arg(long)]
    collect_only: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Plan(#[from] plan::PlanError),
    #[error("{0}")]
    Preflight(String),
    #[error("{0}")]
    Io(String),
}

pub fn main(args: RunArgs) -> i32 {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("floe run: cannot start the async runtime: {e}");
            return 2;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("floe run: {e}");
            2
        }
    }
}

fn on_path(program: &str) -> bool {
    if program.contains('/') {
        return Path::new(program).is_file();
    }
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|dir| dir.join(program).is_file()))
        .unwrap_or(false)
}

/// Everything that would make every session fail, checked before the first one starts.
async fn preflight(plan: &plan::Plan, model_url: Option<&str>, out: &Path) -> Result<(), RunError> {
    let spec = &plan.job.spec;
    match floe_sandbox::presets::program(&spec.harness) {
        Some(program) if !on_path(program) => {
            return Err(RunError::Preflight(format!(
                "harness binary `{program}` is not on PATH (install the {:?} harness, e.g. scripts/harnesses/install.sh)",
                spec.harness.preset
            )))
        }
        _ => {}
    }
    if let Some(program) = spec.evaluator.command.first() {
        if !program.contains('/') && !on_path(program) {
            return Err(RunError::Preflight(format!(
                "evaluator command `{program}` is not on PATH"
            )));
        }
    }
    if let Some(model_url) = model_url {
        check_model_server(model_url).await?;
    }
    let occupied = std::fs::read_dir(out)
        .map(|mut d| d.next().is_some())
        .unwrap_or(false);
    if occupied {
        return Err(RunError::Preflight(format!(
            "--out {} is not empty (it holds an earlier run?); use a new directory",
            out.display()
        )));
    }
    Ok(())
}

async fn check_model_server(model_url: &str) -> Result<(), RunError> {
    let url = format!("{}/v1/models", model_url.trim_end_matches('/'));
    let reachable = reqwest::Client::new()
        .get(&url)
        .timeout(Duration::from_secs(5))
        .send()
        .await;
    match reachable {
        Ok(r) if r.status().is_success() => Ok(()),
        Ok(r) => Err(RunError::Preflight(format!(
            "model server at {model_url} answered {} to GET /v1/models",
            r.status()
        ))),
        Err(e) => Err(RunError::Preflight(format!(
            "model server at {model_url} is unreachable ({e}); start one or pass --model-url"
        ))),
    }
}

async fn run(args: RunArgs) -> Result<i32, RunError> {
    let plan = plan::load(&args.job)?;
    let spec = &plan.job.spec;
    let upstream = spec.sft.as_ref().map(|s| &s.upstream);
    let trains = spec.train.is_some() && !args.collect_only;
    let model_url = args
        .model_url
        .clone()
        .or_else(|| upstream.map(|u| u.url.clone()));
    if model_url.is_none() && !trains {
        return Err(RunError::Preflight(
            "--collect-only needs --model-url (the policy's vLLM)".into(),
        ));
    }
    preflight(&plan, model_url.as_deref(), &args.out).await?;
    let mut training = if trains {
        let programs = train::Programs {
            vllm_python: args.vllm_python.clone(),
            trainer_python: args.trainer_python.clone(),
            start_timeout: Duration::from_secs(args.start_timeout),
        };
        // Ctrl-C while vLLM loads drops the start: what it started is killed with it.
        tokio::select! {
            started = train::Training::start(
                &plan,
                &args.job,
                &programs,
                model_url.as_deref(),
                args.trainer_url.as_deref(),
                &args.out,
            ) => Some(started?),
            _ = tokio::signal::ctrl_c() => {
                eprintln!("floe run: interrupted while the policy server and trainer started");
                return Ok(130);
            }
        }
    } else {
        None
    };
    let (model_url, model_name) = match &training {
        Some(t) => (t.policy_url.clone(), t.model_name.clone()),
        None => (
            model_url.unwrap_or_default(),
            args.model_name
                .clone()
                .or_else(|| upstream.and_then(|u| u.model.clone()))
                .unwrap_or_else(|| "policy".into()),
        ),
    };
    let io = |what: &str, e: &dyn std::fmt::Display| RunError::Io(format!("{what}: {e}"));
    let out = &args.out;
    std::fs::create_dir_all(out.join("sessions")).map_err(|e| io("output dir", &e))?;
    let trajectories = out.join("trajectories");
    let sink = match (&training, &spec.sft) {
        (Some(t), _) => Sink::Trainer {
            url: t.ingest_url(),
        },
        (None, Some(sft)) => Sink::Dataset {
            dir: std::fs::canonicalize(out)
                .map_err(|e| io("output dir", &e))?
                .join("trajectories"),
            min_reward: Some(
                sft.min_reward
                    .unwrap_or(spec.evaluator.reward.pass_threshold),
            ),
        },
        (None, None) => Sink::Dataset {
            dir: std::fs::canonicalize(out)
                .map_err(|e| io("output dir", &e))?
                .join("trajectories"),
            min_reward: None,
        },
    };
    let assignments = plan::expand(&plan, &sink, args.sessions);

    // One in-process gateway for all sessions, on a free loopback port.
    let control_token = hex::encode(rand::rng().random::<[u8; 24]>());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| io("loopback listener", &e))?;
    let listen = listener
        .local_addr()
        .map_err(|e| io("loopback listener", &e))?;
    let config = Config {
        listen,
        control_listen: None,
        upstream_url: model_url.trim_end_matches('/').to_string(),
        upstream_model: model_name,
        // The job's own server kind (sft); train mode's policy server is vLLM.
        upstream_kind: upstream.map_or(Default::default(), |u| {
            floe_sandbox::session::upstream_kind(u.kind)
        }),
        capture_dir: out.join("captures"),
        spool_dir: out.join("captures/.spool"),
        control_token: control_token.clone(),
        max_body_bytes: 32 * 1024 * 1024,
        max_response_tokens: u32::try_from(spec.sampling.max_response_tokens).unwrap_or(16384),
        durability: floe_gateway::capture::Durability::Write,
        keepalive: Duration::from_secs(5),
        upstream_timeout: Duration::from_secs(900),
        require_runner_ready: false,
    };
    let gateway = Gateway::new(config).map_err(|e| io("gateway", &e))?;
    recover(&gateway).map_err(|e| io("gateway", &e))?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let app = router(gateway.clone());
    let server = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stop_rx.await;
            })
            .await
    });
    let gateway_url = format!("http://{listen}");
    let http = reqwest::Client::new();
    for a in &assignments {
        let resp = http
            .post(format!("{gateway_url}/floe/v1/assignments"))
            .bearer_auth(&control_token)
            .json(a)
            .send()
            .await
            .map_err(|e| io("posting an assignment", &e))?;
        if !resp.status().is_success() {
            let body = resp.text().await.unwrap_or_default();
            return Err(RunError::Io(format!(
                "the gateway refused an assignment: {body}"
            )));
        }
    }

    let concurrency = args
        .concurrency
        .or(spec.concurrency.and_then(|c| usize::try_from(c).ok()))
        .unwrap_or(2)
        .max(1);
    let started = Instant::now();
    let mut progress = progress::Progress::new(assignments.len());
    let mut results: Vec<(String, SessionResult)> = Vec::new();
    let mut running = tokio::task::JoinSet::new();
    let mut next = 0usize;
    let mut interrupted = false;
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let samples = usize::try_from(spec.num_samples.max(1)).unwrap_or(1);
    let mut trainer_status = serde_json::Value::Null;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut failure: Option<String> = None;
    loop {
        while running.len() < concurrency
            && next < assignments.len()
            && training.as_ref().is_none_or(|t| {
                train::may_start(
                    next,
                    samples,
                    t.groups_per_step,
                    t.max_staleness,
                    &trainer_status,
                    running.len(),
                )
            })
        {
            let slot = out.join("sessions").join(format!(".run-{next}"));
            let config = RunnerConfig {
                gateway_url: gateway_url.clone(),
                control_token: control_token.clone(),
                workspace: slot.join("workspace"),
                state_dir: slot.join("state"),
                pool_prepare: vec![],
                assignment_wait: Some(Duration::from_secs(30)),
                ship_wait: Duration::from_secs(300),
                log_cap_bytes: 1024 * 1024,
                kill_grace: Duration::from_secs(5),
            };
            running.spawn(async move {
                let t0 = Instant::now();
                let report = run_sandbox(&config).await;
                (slot, report, t0.elapsed().as_secs_f64())
            });
            progress.started();
            next += 1;
        }
        if running.is_empty() && next >= assignments.len() {
            break;
        }
        tokio::select! {
            _ = tick.tick(), if training.is_some() => {
                if let Some(t) = training.as_mut() {
                    t.sample_policy_server().await;
                    if let Some(status) = t.status().await {
                        t.report_steps(&status);
                        trainer_status = status;
                    }
                    if let Some((what, status)) = t.exited() {
                        failure = Some(format!("{what} exited ({status}) during the run"));
                        progress.clear();
                        eprintln!("floe run: {what} exited ({status}); cancelling running sessions");
                        running.abort_all();
                        while running.join_next().await.is_some() {}
                        break;
                    }
                }
            }
            joined = running.join_next(), if !running.is_empty() => {
                let Some(Ok((slot, report, wall))) = joined else { continue };
                let session = report.summary.session.clone().unwrap_or_else(|| "unassigned".into());
                let task = report.summary.task.clone().unwrap_or_default();
                let dir = out.join("sessions").join(&session);
                if std::fs::rename(&slot, &dir).is_ok() {
                    let _ = std::fs::write(dir.join("summary.json"), floe_sandbox::summary::render(&report.summary));
                }
                let result = SessionResult { task, summary: Some(report.summary), wall_seconds: wall };
                progress.finished(&session, &result);
                results.push((session, result));
            }
            _ = &mut ctrl_c => {
                interrupted = true;
                progress.clear();
                eprintln!("floe run: interrupted; cancelling running sessions and writing what was captured");
                running.abort_all();
                while running.join_next().await.is_some() {}
                break;
            }
        }
    }
    progress.clear();
    // Unfinished sessions (interrupted) get an infrastructure outcome; their captured calls
    // are shipped like every other trajectory.
    drain(&gateway, Duration::from_secs(30)).await;
    let _ = stop_tx.send(());
    let _ = server.await;

    let done: std::collections::BTreeSet<&str> = results.iter().map(|(s, _)| s.as_str()).collect();
    let mut all: Vec<SessionResult> = results.iter().map(|(_, r)| r.clone()).collect();
    all.extend(
        assignments
            .iter()
            .filter(|a| !done.contains(a.session.as_str()))
            .map(|a| SessionResult {
                task: a.task.clone(),
                summary: None,
                wall_seconds: 0.0,
            }),
    );
    let mode = if plan.is_sft() { "sft" } else { "train" };
    let trained = match training.as_mut() {
        Some(t) if !interrupted && failure.is_none() => {
            eprintln!(
                "[train] sessions done: the trainer trains what is left and writes the final model"
            );
            tokio::select! {
                r = t.finish() => match r {
                    Ok(status) => Some(status),
                    Err(e) => {
                        failure = Some(e.to_string());
                        t.status().await
                    }
                },
                _ = &mut ctrl_c => {
                    interrupted = true;
                    t.status().await
                }
            }
        }
        Some(t) => t.status().await,
        None => None,
    };
    let busy = training.as_ref().and_then(train::Training::busy_fraction);
    if let Some(mut t) = training.take() {
        t.stop().await;
    }
    let mut summary = report::summarize(
        &plan.name,
        mode,
        &all,
        started.elapsed().as_secs_f64(),
        interrupted,
    );
    if let Some(status) = &trained {
        let mut t = train::summary(status, "reward-curve.svg");
        t["utilization"] = train::utilization(busy, status, started.elapsed().as_secs_f64());
        summary.training = Some(t);
        let points = train::curve_points(status);
        std::fs::write(
            out.join("reward-curve.svg"),
            curve::svg(&points, &format!("{}: reward per step", plan.name)),
        )
        .map_err(|e| io("reward-curve.svg", &e))?;
    }
    if let Some(f) = &failure {
        eprintln!("floe run: training failed: {f}");
    }
    if !trains {
        let file = if plan.is_sft() {
            "dataset.jsonl"
        } else {
            "trajectories.jsonl"
        };
        let (accepted, rejected) =
            report::assemble(&trajectories, &out.join(file)).map_err(|e| io(file, &e))?;
        summary.dataset = report::Dataset {
            file: file.into(),
            accepted,
            rejected,
            acceptance_rate: (accepted + rejected > 0)
                .then(|| accepted as f64 / (accepted + rejected) as f64),
        };
    }
    let json = serde_json::to_string_pretty(&summary).map_err(|e| io("summary.json", &e))?;
    std::fs::write(out.join("summary.json"), json).map_err(|e| io("summary.json", &e))?;
    print!("{}", progress::table(&summary));
    Ok(if interrupted {
        130
    } else if failure.is_some()
        || summary.sessions.infra_error + summary.sessions.evaluator_timeout > 0
    {
        1
    } else {
        0
    })
}
