//! `floe run JOB.yaml --out DIR`: a RolloutJob on one machine. The same YAML and validation as
//! the cluster, the same gateway and sandbox runner as a pod — one in-process gateway with a
//! token per session, one runner per running session, each in its own temp workspace — against
//! any OpenAI-compatible model server (vLLM in practice). A `train` job also runs its policy
//! server and trainer here ([`train`]) and trains while its sessions run.
//!
//! A session that fails by infrastructure (the model server failing its calls, the evaluator
//! timing out, …) runs again as its next attempt, up to `spec.backoffLimit` times ([`queue`]);
//! an interrupted run continues with `--resume` ([`resume`]).
//!
//! Exit codes: 0 every session ran (whatever its reward); 1 some sessions failed by
//! infrastructure (see summary.json); 2 bad input or a failed pre-flight check (nothing ran);
//! 130 interrupted (Ctrl-C), 143 terminated (SIGTERM) — everything captured so far is written.

mod credentials;
mod curve;
mod ended;
mod fail_fast;
mod flags;
mod held_out;
mod metrics;
mod outcome;
mod plan;
mod preflight;
mod progress;
mod queue;
mod report;
mod resume;
mod sandboxing;
pub(crate) mod session_limits;
mod signals;
mod train;
mod train_plan;

pub use flags::{RunArgs, RunError};
pub use plan::load as load_plan;
pub use sandboxing::works as sandbox_works;
pub use signals::watchdog;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use floe_crds::rollout_job::{StalenessGate, TrainerState};
use floe_gateway::server::{
    abandon_unfinished, drain, recover, redirect_trainer, router, Config, Gateway,
};
use floe_gateway::ship::{Assignment, Sink};
use rand::RngExt;

use queue::{Attempt, Queue};
use report::SessionResult;
use resume::RunRecord;
use signals::{Signals, Stop};

pub fn main(args: RunArgs) -> i32 {
    // Before any thread exists: everything this run starts carries its tag.
    if let Err(e) = signals::watch_this_run() {
        eprintln!("floe run: cannot start the run's watchdog: {e}");
        return 2;
    }
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
    let code = match runtime.block_on(run(args)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("floe run: {e}");
            2
        }
    };
    drop(runtime);
    // Nothing the run started outlives it: a cancelled session's processes were sent SIGKILL,
    // but under load they may not be gone yet when the run is done. (The watchdog covers a
    // run that cannot get here: SIGKILL, a panic.)
    let left = signals::end_this_runs_processes(std::time::Duration::from_secs(5));
    if left > 0 {
        eprintln!("floe run: {left} process(es) the run started are still alive at exit");
    }
    code
}

async fn run(mut args: RunArgs) -> Result<i32, RunError> {
    flags::check(&args)?;
    flags::absolute_paths(&mut args)?;
    let mut signals = Signals::new().map_err(|e| RunError::Io(format!("signal handlers: {e}")))?;
    let plan = plan::load(&args.job)?;
    let spec = &plan.job.spec;
    let upstream = spec.sft.as_ref().map(|s| &s.upstream);
    let trains = spec.train.is_some() && !args.collect_only;
    let (model_url, upstream_key) =
        preflight::model_server_source(args.model_url.as_ref(), upstream, trains)?;
    let bwrap = if args.no_sandbox {
        None
    } else {
        Some(sandboxing::check(args.sandbox_user)?.with_limits(&args.limits))
    };
    let private = sandboxing::Private {
        out: args.out.clone(),
        job: args.job.clone(),
        task_files: plan
            .task_file
            .iter()
            .chain(&plan.held_out_file)
            .cloned()
            .collect(),
        repositories: plan::repositories(&plan),
    };
    // The name every call sends upstream (a train run names its own policy server).
    let served_name = args
        .model_name
        .clone()
        .or_else(|| upstream.and_then(|u| u.model.clone()))
        .unwrap_or_else(|| "policy".into());
    preflight::swebench(&plan, args.swebench_python.as_deref(), &args.out)?;
    preflight::check(
        &plan,
        model_url
            .as_ref()
            .map(|(url, source)| preflight::ModelServer {
                url,
                source,
                key: upstream_key.as_deref(),
                model: (!trains).then_some(served_name.as_str()),
            }),
        &args.out,
        args.resume,
        bwrap.is_some().then_some(&private),
    )
    .await?;
    let model_url = model_url.map(|(u, _)| u);
    if args.resume && trains {
        resume::check_before_training(&args.out, &plan, args.sessions)
            .map_err(RunError::Preflight)?;
    }
    let mut training = if trains {
        let programs = train::Programs {
            vllm_python: args.vllm_python.clone(),
            trainer_python: args.trainer_python.clone(),
            start_timeout: Duration::from_secs(args.start_timeout),
        };
        // A signal while vLLM loads drops the start: what it started is killed with it.
        tokio::select! {
            started = train::Training::start(
                &plan,
                &args.job,
                &programs,
                model_url.as_deref(),
                args.trainer_url.as_deref(),
                &args.out,
            ) => Some(started?),
            stop = signals.recv() => {
                eprintln!("floe run: {} while the policy server and trainer started", stop.name());
                return Ok(stop.exit_code());
            }
        }
    } else {
        None
    };
    let (model_url, model_name) = match &training {
        Some(t) => (t.policy_url.clone(), t.model_name.clone()),
        None => (model_url.unwrap_or_default(), served_name),
    };
    let out = &args.out;
    let io = |what: &str, e: &dyn std::fmt::Display| RunError::Io(format!("{what}: {e}"));
    let out_error =
        |e: &dyn std::fmt::Display| RunError::Io(format!("--out {}: {e}", out.display()));
    std::fs::create_dir_all(out).map_err(|e| out_error(&e))?;
    let trajectories = out.join("trajectories");
    let dataset_dir = || -> Result<PathBuf, RunError> {
        Ok(std::fs::canonicalize(out)
            .map_err(|e| out_error(&e))?
            .join("trajectories"))
    };
    let sink = match (&training, &spec.sft) {
        (Some(t), _) => Sink::Trainer {
            url: t.ingest_url(),
            token: t.ingest_token(),
            // No kubelet evicts a local session: `floe run` stops one over its disk budget
            // itself, and scores it.
            snapshots: false,
        },
        (None, Some(_)) => Sink::Dataset {
            dir: dataset_dir()?,
            min_reward: spec.sft_min_reward(),
        },
        (None, None) => Sink::Dataset {
            dir: dataset_dir()?,
            min_reward: None,
        },
    };
    let mode = if plan.is_sft() { "sft" } else { "train" };
    let count = plan::session_count(&plan, args.sessions);
    let record = RunRecord::of(&plan, mode, plan::expand(&plan, &sink, args.sessions))
        .sampling(training.is_none().then_some(model_name.as_str()));
    let before = resume::begin(out, &record, args.resume)?;
    // After `--resume`'s check: a directory it refuses is left as it was.
    sandboxing::sessions_dir(out).map_err(|e| out_error(&e))?;

    // One in-process gateway for all sessions, on a free loopback port.
    let control_token = hex::encode(rand::rng().random::<[u8; 24]>());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| io("loopback listener", &e))?;
    let listen = listener
        .local_addr()
        .map_err(|e| io("loopback listener", &e))?;
    let concurrency = session_limits::concurrency(args.concurrency, spec.concurrency);
    let limits = session_limits::gateway_connections(concurrency);
    session_limits::warn_when_out_is_small(out, concurrency, args.limits.session_disk);
    let config = Config {
        listen,
        control_listen: None,
        upstream_url: model_url.trim_end_matches('/').to_string(),
        upstream_model: model_name,
        // A train run samples its own policy server, which takes no key.
        upstream_api_key: upstream_key.filter(|_| training.is_none()),
        // The job's own server kind (sft); train mode's policy server is vLLM.
        upstream_kind: upstream.map_or(Default::default(), |u| {
            floe_sandbox::session::upstream_kind(u.kind)
        }),
        capture_dir: out.join("captures"),
        spool_dir: out.join("captures/.spool"),
        control_token: control_token.clone(),
        max_body_bytes: 32 * 1024 * 1024,
        max_response_tokens: u32::try_from(spec.sampling.max_response_tokens)
            .unwrap_or(floe_crds::rollout_job::DEFAULT_MAX_RESPONSE_TOKENS as u32),
        durability: floe_gateway::capture::Durability::Write,
        keepalive: Duration::from_secs(5),
        upstream_timeout: Duration::from_secs(
            u64::try_from(spec.timeouts.model_call_seconds).unwrap_or(600),
        ),
        require_runner_ready: false,
        connection_limits: limits,
    };
    let gateway = Gateway::new(config).map_err(|e| io("gateway", &e))?;
    if args.resume && training.is_some() {
        // The interrupted run's trainer is gone; this run's has a new address and token.
        redirect_trainer(&gateway, &sink).map_err(|e| io("gateway", &e))?;
    }
    recover(&gateway).map_err(|e| io("gateway", &e))?;
    let earlier = resume::earlier(out, &plan, record, before)?;
    if args.resume {
        // Sessions the interrupted run left without an outcome: their calls are shipped
        // untrainable, and the sessions run again under new attempt ids.
        let abandoned = abandon_unfinished(
            &gateway,
            "the run was interrupted before the session finished",
        )
        .await;
        eprintln!(
            "floe run: resuming: {} of {count} sessions done; {} left unfinished run again",
            earlier.done.len(),
            abandoned.len()
        );
    }
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopping = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let app = router(gateway.clone());
    let server = tokio::spawn(floe_gateway::serve_limited::serve(
        listener,
        app.clone(),
        limits,
        stopping(stop_rx.clone()),
    ));
    // Sandboxed harnesses reach the same gateway through a unix socket (their relay forwards
    // their loopback to it): a short path of its own, private to this user, kept to the end.
    let (confinement, _socket_dir) = match &bwrap {
        Some(b) => {
            let socket_dir = tempfile::Builder::new()
                .prefix("floe-run-")
                .tempdir()
                .map_err(|e| io("the gateway's socket directory", &e))?;
            let socket = socket_dir.path().join("gateway.sock");
            let unix = tokio::net::UnixListener::bind(&socket)
                .map_err(|e| io("the gateway's unix socket", &e))?;
            tokio::spawn(floe_gateway::serve_limited::serve(
                unix,
                app,
                limits,
                stopping(stop_rx.clone()),
            ));
            let confinement = sandboxing::confinement(b, &private, &socket, listen)?;
            (Some(confinement), Some(socket_dir))
        }
        None => (None, None),
    };
    let gateway_url = format!("http://{listen}");
    // The gateway closes a connection idle 30 s: let go first.
    let http = reqwest::Client::builder()
        .pool_idle_timeout(floe_gateway::serve_limited::CLIENT_IDLE)
        .build()
        .unwrap_or_default();
    let post = |assignment: Assignment| {
        ended::post_assignment(
            http.clone(),
            gateway_url.clone(),
            control_token.clone(),
            assignment,
        )
    };

    let started = Instant::now();
    let mut progress = progress::Progress::new(count);
    progress.resumed(earlier.done.values());
    if let Some(listen) = args.metrics_listen {
        let namespace = plan.job.metadata.namespace.as_deref().unwrap_or("default");
        let run_metrics = metrics::RunMetrics::new(namespace, &plan.name)
            .map(std::sync::Arc::new)
            .map_err(|e| io("metrics", &e))?;
        let trainer = training.as_ref().map(|t| t.trainer_url.clone());
        metrics::serve(listen, run_metrics.clone(), gateway.clone(), trainer).await?;
        progress.export(run_metrics);
    }
    let firsts: Vec<Attempt> = (0..count)
        .filter(|i| !earlier.done.contains_key(i))
        .map(|index| Attempt {
            index,
            attempt: earlier.next_attempt.get(&index).copied().unwrap_or(0),
        })
        .collect();
    let first_attempt: std::collections::BTreeMap<usize, u32> =
        firsts.iter().map(|a| (a.index, a.attempt)).collect();
    let mut queue = Queue::new(firsts, u32::try_from(spec.backoff_limit).unwrap_or(0));
    let ran_before = earlier.done.len() as u64;
    let mut results = earlier.done;
    let mut upstream_errors = earlier.upstream;
    let mut running = tokio::task::JoinSet::new();
    let mut stopped: Option<Stop> = None;
    let mut trainer_status = serde_json::Value::Null;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut failure: Option<String> = None;
    let mut fail_fast = fail_fast::FailFast::default();
    let mut gave_up: Option<String> = None;
    // Sessions that ended before a stop, not yet counted ([`ended::before_the_stop`]).
    let mut late = Vec::new();
    let mut held_out = match (
        &training,
        spec.train.as_ref().and_then(|t| t.held_out.as_ref()),
    ) {
        (Some(t), Some(h)) => {
            let mut rounds = held_out::HeldOut::new(h, plan.held_out.clone(), count);
            let version = t
                .status()
                .await
                .map(|s| TrainerState::from_status(&s).policy_version);
            // Restored whatever the read said: a version unknown here completes no round.
            queue.run_first(rounds.restore(earlier.held_out, version.unwrap_or(u64::MAX)));
            if let Some(version) = version {
                queue.run_first(rounds.due(version));
            }
            Some(rounds)
        }
        _ => None,
    };
    let held_out_sink = Sink::Dataset {
        dir: dataset_dir()?.with_file_name("held-out"),
        min_reward: None,
    };
    // The trainer's final status, once it has trained everything (before the final held-out
    // round, which samples the final version).
    let mut trained: Option<serde_json::Value> = None;
    'sessions: loop {
        while running.len() < concurrency {
            let now = Instant::now();
            let Some(next) = queue.peek(now) else { break };
            // The same gate as the operator's: a batch at most maxStaleness versions ahead.
            let held = held_out.as_ref().filter(|h| h.owns(next.index));
            let may = match (&training, &spec.train) {
                // A held-out session trains nothing: no staleness to keep.
                _ if held.is_some() => true,
                (Some(t), Some(train)) => {
                    let gate = |status: &serde_json::Value| {
                        StalenessGate::new(train, spec.samples(), TrainerState::from_status(status))
                    };
                    // Training sessions: held-out ones hold slots, not the trainer's batches.
                    let training_running = running
                        .len()
                        .saturating_sub(held_out.as_ref().map_or(0, |h| h.running()));
                    let (index, now_running) = (next.index as u64, training_running as u64);
                    if gate(&trainer_status).in_reach(index) {
                        true
                    } else if gate(&trainer_status).may_start(index, now_running) {
                        // Only because the trainer looked idle, in a status read up to a
                        // second ago: the sessions that just ended delivered their group since
                        // (acknowledged before they ended). Read it again before relying on it.
                        if let Some(status) = t.status().await {
                            trainer_status = status;
                        }
                        gate(&trainer_status).may_start(index, now_running)
                    } else {
                        false
                    }
                }
                _ => true,
            };
            if !may {
                break;
            }
            queue.pop(now);
            let mut next = next;
            let assignment = match held {
                // A resumed run's ids must be new to both (see [`resume`]).
                Some(h) => plan::held_out_assignment(&plan, h, &held_out_sink, &mut next, |id| {
                    ["sessions", "captures"]
                        .iter()
                        .any(|d| out.join(d).join(id).exists())
                }),
                None => plan::assignment(&plan, &sink, next.index, next.attempt),
            };
            let Some(assignment) = assignment else {
                continue;
            };
            let held = held.is_some();
            let session = assignment.session.clone();
            let task = assignment.task.clone();
            // Posted only now: a queued session holds no file or socket (10,000 sessions run
            // under the default `ulimit -n`).
            // Refused (the gateway's disk full, say) after sessions ran: the run ends as a
            // failure (exit 1, summary written, trainer stopped with its checkpoint), not as
            // bad input that ran nothing.
            if let Err(e) = post(assignment).await {
                let why = format!("the gateway did not take session {session}: {e}");
                late = progress
                    .cancel(&mut running, &format!("{why}; cancelling running sessions"))
                    .await;
                failure = Some(why);
                break 'sessions;
            }
            let slot = out.join("sessions").join(&session);
            let config = sandboxing::runner_config(
                &slot,
                session.clone(),
                (&gateway_url, &control_token),
                confinement.clone(),
                &args,
            );
            running.spawn(async move {
                let t0 = Instant::now();
                let report = ended::run_caught(&config, &session, &task).await;
                (next, slot, report, t0.elapsed().as_secs_f64())
            });
            match held_out.as_mut().filter(|_| held) {
                Some(h) => h.started(next.index, next.attempt),
                None => progress.started(),
            }
        }
        if running.is_empty() && queue.is_empty() {
            // Sessions done: the trainer trains what is left, and a final held-out round
            // samples the version it ends at.
            if let (Some(h), Some(t), None) = (held_out.as_mut(), training.as_mut(), &trained) {
                let finished = train::finish(t, &mut signals).await;
                let version = finished.status.as_ref().map(TrainerState::from_status);
                trained = finished.status.or(Some(serde_json::Value::Null));
                failure = finished.failure;
                stopped = finished.stopped;
                if let (Some(v), None, None) = (version, &failure, &stopped) {
                    queue.run_first(h.last(v.policy_version));
                    continue;
                }
            }
            break;
        }
        // A retry backing off while a slot is free: wake when it may start.
        let now = Instant::now();
        let retry_at = (running.len() < concurrency)
            .then(|| queue.next_ready(now))
            .flatten();
        if running.is_empty() && training.is_none() && retry_at.is_none() {
            // A retry became ready since the slots were filled: nothing else would wake us.
            continue;
        }
        tokio::select! {
            _ = tokio::time::sleep_until(retry_at.unwrap_or_else(Instant::now).into()), if retry_at.is_some() => {}
            _ = tick.tick(), if training.is_some() => {
                if let Some(t) = training.as_mut() {
                    t.sample_policy_server().await;
                    if let Some(status) = t.status().await {
                        t.report_steps(&status);
                        if let Some(h) = held_out.as_mut().filter(|_| trained.is_none()) {
                            queue.run_first(h.due(TrainerState::from_status(&status).policy_version));
                        }
                        trainer_status = status;
                    }
                    if let Some((what, status)) = t.exited() {
                        failure = Some(format!("{what} exited ({status}) during the run"));
                        late = progress.cancel(&mut running, &format!("{what} exited ({status}); cancelling running sessions")).await;
                        break;
                    }
                }
            }
            joined = running.join_next(), if !running.is_empty() => {
                let Some(Ok(joined)) = joined else { continue };
                let (attempt, session, result) = ended::result(joined, &mut upstream_errors);
                // Its outcome is recorded and its trajectory shipped (or spooled, which the
                // drain at the end waits for): the gateway need not keep it in memory.
                gateway.sessions.remove(&session);
                gateway.assignments.forget(&session);
                let status = result.summary.as_ref().map(|s| s.status.clone()).unwrap_or_default();
                let first = first_attempt.get(&attempt.index).copied().unwrap_or(0);
                let held = held_out.as_mut().filter(|h| h.owns(attempt.index));
                let alike = fail_fast.ended(&fail_fast::Ended {
                    task: &result.task,
                    session: &session,
                    status: &status,
                    error: result.summary.as_ref().and_then(|s| s.error.as_deref()),
                    failed_calls: result
                        .summary
                        .as_ref()
                        .and_then(|s| s.upstream_errors.as_ref())
                        .map_or(0, |u| u.failed_calls()),
                });
                if let Some(cause) = alike {
                    if held.is_none() {
                        progress.finished(&session, &result);
                        results.insert(attempt.index, result);
                    }
                    let line = fail_fast::explain(&cause);
                    late = progress.cancel(&mut running, &line).await;
                    gave_up = Some(line);
                    break;
                }
                if let Some(h) = held {
                    progress.clear();
                    eprintln!("[held-out] {session}: {status} reward {}", result.summary.as_ref().and_then(|s| s.reward).map_or("-".into(), |r| r.to_string()));
                    let first = h.attempt_ended(attempt.index);
                    if queue.ended(attempt, &status, first, Instant::now()).is_none() {
                        if let Some(round) = h.ended(attempt.index, result) {
                            progress.held_out(&round);
                        }
                    }
                    continue;
                }
                match queue.ended(attempt, &status, first, Instant::now()) {
                    Some(retry) => {
                        let id = plan::assignment(&plan, &sink, retry.index, retry.attempt)
                            .map(|a| a.session)
                            .unwrap_or_default();
                        progress.retrying(&session, &result, &id);
                    }
                    None => {
                        if let (Some(t), true) = (&training, queue::is_infrastructure(&status)) {
                            // Failed for good: its group completes without it.
                            if let Some(a) = plan::assignment(&plan, &sink, attempt.index, 0) {
                                t.sample_failed(&a.group, a.sample).await;
                            }
                        }
                        progress.finished(&session, &result);
                        results.insert(attempt.index, result);
                    }
                }
            }
            stop = signals.recv() => {
                stopped = Some(stop);
                late = progress.cancel(&mut running, &format!("{}; cancelling running sessions and writing what was captured", stop.name())).await;
                break;
            }
        }
    }
    ended::before_the_stop(
        late,
        &mut results,
        held_out.as_mut(),
        &mut upstream_errors,
        &mut progress,
    );
    progress.clear();
    // Unfinished sessions (interrupted) get an infrastructure outcome; their captured calls
    // are shipped like every other trajectory.
    drain(&gateway, Duration::from_secs(30)).await;
    let _ = stop_tx.send(true);
    let _ = server.await;

    let all: Vec<SessionResult> = (0..count)
        .map(|index| {
            results.remove(&index).unwrap_or_else(|| SessionResult {
                task: plan::assignment(&plan, &sink, index, 0)
                    .map(|a| a.task)
                    .unwrap_or_default(),
                summary: None,
                wall_seconds: 0.0,
            })
        })
        .collect();
    let trained = match (training.as_mut(), trained) {
        // Finished already, for the final held-out round: its status now.
        (Some(t), Some(_)) => t.status().await,
        (Some(t), None) if stopped.is_none() && failure.is_none() && gave_up.is_none() => {
            let finished = train::finish(t, &mut signals).await;
            failure = finished.failure;
            stopped = finished.stopped;
            finished.status
        }
        (Some(t), None) => t.status().await,
        (None, _) => None,
    };
    let busy = training.as_ref().and_then(train::Training::busy_fraction);
    if let Some(mut t) = training.take() {
        t.stop(Some(&mut signals)).await;
    }
    let mut summary = report::summarize(
        &plan.name,
        mode,
        &all,
        started.elapsed().as_secs_f64(),
        stopped.is_some(),
    );
    summary.sandbox = sandboxing::describe(bwrap.as_ref());
    summary.stopped_early = gave_up.clone();
    summary.sessions.retries = earlier.retries + queue.retries;
    summary.upstream_errors = upstream_errors;
    let rounds = held_out.as_ref().map(held_out::HeldOut::reports);
    if let Some(status) = &trained {
        let mut t = train::summary(status, "reward-curve.svg");
        t["utilization"] = train::utilization(busy, status, started.elapsed().as_secs_f64());
        if let Some(rounds) = &rounds {
            t["heldOut"] = serde_json::json!(rounds);
        }
        summary.training = Some(t);
    }
    if let Some(f) = &failure {
        eprintln!("floe run: training failed: {f}");
    }
    // The attempt each session ended with: the one its dataset record is, of several.
    let counted: std::collections::BTreeSet<String> = all
        .iter()
        .filter_map(|r| r.summary.as_ref()?.session.clone())
        .collect();
    let ended = outcome::Ended {
        out,
        job: &plan.name,
        counted: &counted,
        curve: trained
            .as_ref()
            .map(|s| (s, rounds.as_deref().unwrap_or(&[]))),
        dataset: (!trains).then_some((trajectories.as_path(), plan.is_sft())),
        stopped,
        failed: failure.is_some() || gave_up.is_some(),
        ran_before,
    };
    Ok(outcome::write(&mut summary, &ended))
}
