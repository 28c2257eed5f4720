//! One sandbox session, start to end: pool prepare → ready → assignment → task files and
//! prepare steps → pristine snapshot → harness (preset) under the agent timeout → seal the
//! capture → evaluation copy with the agent's diff and the hidden files → evaluator under its
//! timeout → reward → result to the gateway (which ships the trajectory) → summary + exit code.

use std::path::Path;
use std::time::Duration;

use floe_crds::common::PrepareStep;
use floe_gateway::trajectory::SessionOutcome;

use crate::agent_link::{self, GraderEnd, Linked};
use crate::children::{child, startable, tail, tail_of};
pub use crate::children::{AgentContainer, RunnerConfig};
use crate::client::GatewayClient;
use crate::confine::Access;
use crate::presets::{self, PresetContext};
use crate::process::{self, CommandSpec, Exit, Finished};
use crate::spec::RunSpec;
use crate::summary::{ExitKind, Summary};
use crate::workspace;

pub struct RunReport {
    pub exit: ExitKind,
    pub summary: Summary,
}

/// The wall clock in milliseconds since the Unix epoch (compared with the operator's claim
/// time, so wall clock, not monotonic).
fn unix_ms_now() -> Option<u64> {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()
        .and_then(|d| u64::try_from(d.as_millis()).ok())
}

fn infra(summary: Summary, error: String) -> RunReport {
    RunReport {
        exit: ExitKind::Infrastructure,
        summary: Summary {
            status: "infra_error".into(),
            error: Some(error),
            ..summary
        },
    }
}

pub async fn run(config: &RunnerConfig) -> RunReport {
    let base = Summary {
        shipment: "none".into(),
        ..Default::default()
    };
    if config.state_dir.starts_with(&config.workspace) {
        return infra(
            base,
            "the state directory must be outside the workspace".into(),
        );
    }
    let client = GatewayClient::new(&config.gateway_url, &config.control_token);
    if let Err(e) = std::fs::create_dir_all(&config.workspace) {
        return infra(
            base,
            format!("workspace {}: {e}", config.workspace.display()),
        );
    }
    let logs = config.state_dir.join("logs");
    if let Err(e) = std::fs::create_dir_all(&logs) {
        return infra(base, format!("state dir {}: {e}", logs.display()));
    }
    // Bound before anything runs, so the agent container's supervisor is the first to dial.
    let grader_end = match &config.agent {
        Some(agent) => match GraderEnd::bind(agent.listen).await {
            Ok(end) => Some((end, agent.dial_wait)),
            Err(e) => return infra(base, format!("agent link on {}: {e}", agent.listen)),
        },
        None => None,
    };
    if let Err(e) = prepare(config, &config.pool_prepare, "pool").await {
        return infra(base, e);
    }
    let link = match grader_end {
        Some((end, wait)) => match end.accept(wait).await {
            Ok(linked) => Some(linked),
            Err(e) => return infra(base, e.to_string()),
        },
        None => None,
    };
    let unrestricted = match config.egress_check {
        Some(_) => crate::egress_check::unrestricted().await,
        None => None,
    };
    if let (Some(what), Some(mode)) = (&unrestricted, config.egress_check) {
        if mode == crate::egress_check::EgressCheck::Refuse {
            return infra(
                base,
                format!(
                    "this pod's egress is not restricted: {what}, which no sandbox egress rule \
                     allows. Its pool says spec.egress.unrestricted: Refuse; does the cluster's \
                     CNI enforce NetworkPolicy (docs/operations.md#sandbox-egress)?"
                ),
            );
        }
        tracing::warn!("this pod's egress is not restricted: {what} (agents can reach the network past the gateway)");
    }
    if let Err(e) = client.ready(unrestricted.as_deref()).await {
        return infra(base, e.to_string());
    }
    tracing::info!("sandbox ready; waiting for an assignment");
    let delivered = match client
        .assignment(config.assignment_wait, config.session.as_deref())
        .await
    {
        Ok(d) => d,
        Err(e) => return infra(base, e.to_string()),
    };
    let received = unix_ms_now();
    let session = delivered.assignment.session.clone();
    let mut summary = Summary {
        session: Some(session.clone()),
        task: Some(delivered.assignment.task.clone()),
        assignment_received_unix_ms: received,
        ..base
    };
    tracing::info!(%session, task = %delivered.assignment.task, "assignment received");

    let outcome = match serde_json::from_value::<RunSpec>(delivered.assignment.run.clone()) {
        Ok(spec) => {
            session_outcome(
                config,
                &client,
                &spec,
                &delivered.token,
                &session,
                &mut summary,
                link,
            )
            .await
        }
        Err(e) => SessionOutcome::InfraError {
            message: format!("the assignment's run spec is invalid: {e}"),
        },
    };
    // Whatever happened, the capture is sealed and the outcome reported, so captured calls
    // are shipped (an infrastructure failure as untrainable, never as reward 0).
    let _ = client.close(&session).await;
    match &outcome {
        SessionOutcome::Completed { evaluation } => {
            summary.passed = evaluation.passed;
        }
        // Scored the failure reward, below any pass, whatever its evaluator said (kept in the
        // trajectory's evaluation for the record): a held-out round or the run's pass rate
        // counted a timed-out session whose tests passed as passed.
        SessionOutcome::AgentTimeout {
            evaluation: Some(_),
            ..
        } => {
            summary.passed = Some(false);
        }
        SessionOutcome::InfraError { message } => {
            summary.status = "infra_error".into();
            summary.error = Some(message.clone());
        }
        SessionOutcome::EvaluatorTimeout => {
            summary.status = "evaluator_timeout".into();
            summary.error = Some("the evaluator timed out".into());
        }
        _ => {}
    }
    let reported = match client.result(&session, &outcome).await {
        Ok(r) => r,
        Err(e) => return infra(summary, format!("reporting the result: {e}")),
    };
    let count = |k: &str| reported[k].as_u64().unwrap_or(0);
    summary.upstream_errors = serde_json::from_value(reported["upstreamErrors"].clone()).ok();
    // The gateway makes a scored outcome an infrastructure failure when the session's model
    // calls failed at the model server or none was answered (see `account_for_calls`).
    let reclassified = reported["status"] == "error"
        && matches!(
            outcome,
            SessionOutcome::Completed { .. } | SessionOutcome::AgentTimeout { .. }
        );
    if reclassified {
        summary.status = "infra_error".into();
        summary.passed = None;
        summary.error = reported["error"].as_str().map(str::to_owned);
    }
    summary.reward = reported["reward"].as_f64();
    summary.completions = count("completions");
    if reclassified && summary.completions == 0 {
        // "No call answered" alone hides why: a harness that died before its first call
        // (a sandbox that could not start, a missing program) says so on its stderr.
        if let Some(why) = died_before_calling(config, summary.harness_exit) {
            let said = summary.error.take().unwrap_or_default();
            summary.error = Some(format!("{said}; {why}"));
        }
    }
    summary.sampled_tokens = count("sampledTokens");
    summary.trainable_tokens = count("trainableTokens");
    summary.traces = count("traces");
    summary.abandoned_calls = count("abandonedCalls");
    summary.excluded_calls = count("excludedCalls");
    summary.calls_by_class =
        serde_json::from_value(reported["callsByClass"].clone()).unwrap_or_default();
    summary.policy_versions = serde_json::from_value(reported["policyVersions"].clone()).ok();
    let (shipment, shipment_error) = client.wait_shipped(&session, config.ship_wait).await;
    summary.shipment = shipment;
    summary.trajectory = delivered_sink(&delivered.assignment.sink);

    let exit = if reclassified
        || matches!(
            outcome,
            SessionOutcome::InfraError { .. } | SessionOutcome::EvaluatorTimeout
        ) {
        ExitKind::Infrastructure
    } else if summary.shipment != "shipped" {
        summary.error = Some(match shipment_error {
            Some(cause) => format!("trajectory not shipped ({}): {cause}", summary.shipment),
            None => format!("trajectory not shipped ({})", summary.shipment),
        });
        ExitKind::Infrastructure
    } else if summary.status == "completed" {
        ExitKind::Success
    } else {
        ExitKind::AgentFailure
    };
    RunReport { exit, summary }
}

fn delivered_sink(sink: &floe_gateway::ship::Sink) -> Option<String> {
    match sink {
        floe_gateway::ship::Sink::Trainer { url, .. } => Some(url.clone()),
        floe_gateway::ship::Sink::Dataset { dir, .. } => Some(dir.display().to_string()),
        floe_gateway::ship::Sink::None => None,
    }
}

/// Prepare steps, each retried `retries` times under its own timeout.
async fn prepare(config: &RunnerConfig, steps: &[PrepareStep], phase: &str) -> Result<(), String> {
    for (i, step) in steps.iter().enumerate() {
        let Some((program, args)) = step.command.split_first() else {
            return Err(format!(
                "{phase} prepare step {:?} has an empty command",
                step.name
            ));
        };
        let attempts = 1 + step.retries.max(0) as u32;
        let mut last = String::new();
        for attempt in 1..=attempts {
            let spec = child(
                config,
                &format!("{phase}-prepare-{i}"),
                program,
                args.to_vec(),
                vec![],
                &config.workspace,
                step.timeout_seconds,
            );
            let done = process::run(&spec).await.map_err(|e| e.to_string())?;
            if done.success() {
                last.clear();
                break;
            }
            last = format!(
                "{phase} prepare step {:?} failed ({:?}) after {attempt} attempt(s): {}",
                step.name,
                done.exit,
                tail(&spec.stderr, 500)
            );
            tracing::warn!("{last}");
        }
        if !last.is_empty() {
            return Err(last);
        }
    }
    Ok(())
}

/// [`tail`] of a file the agent could have replaced: a regular file, its directory and itself
/// reached without a link.
fn agent_tail(path: &Path, max: usize) -> String {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return String::new();
    };
    crate::tree::Dir::open(parent)
        .and_then(|d| d.open_file(name))
        .map(|f| tail_of(f, max))
        .unwrap_or_default()
}

/// `the harness exited 1: bwrap: Can't find source path …`: a failed harness's exit and the
/// last line of its stderr, for a session none of whose calls was answered.
fn died_before_calling(config: &RunnerConfig, exit: Option<i32>) -> Option<String> {
    let code = exit.filter(|c| *c != 0)?;
    let agent_dir = config.agent.as_ref().map_or(&config.state_dir, |a| &a.dir);
    let stderr = agent_tail(&agent_dir.join("logs/harness.stderr"), 2000);
    let last: String = stderr
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty() && *l != crate::relay::STARTED)
        .unwrap_or("")
        .chars()
        .take(300)
        .collect();
    Some(if last.is_empty() {
        format!("the harness exited {code}, its stderr empty")
    } else {
        format!("the harness exited {code}: {}", last.trim())
    })
}

/// The harness in the agent container, through its supervisor. `Err`: a message for an
/// infrastructure failure. A container that died under its supervisor is the harness's own
/// failure (its memory limit, say), never the infrastructure's: the agent could cause it.
async fn in_agent_container(
    link: Linked,
    harness: &CommandSpec,
    disk: Option<agent_link::DiskWatch>,
    stop: impl std::future::Future<Output = String>,
) -> Result<(Finished, Option<String>), String> {
    let started = std::time::Instant::now();
    let report = link
        .run_until(harness, disk, Duration::from_secs(60), stop)
        .await;
    match report {
        Ok((r, _)) if !r.namespace_emptied => Err(
            "the agent container's supervisor is not its PID 1, so its processes could outlive \
             it (a pod sharing its process namespace?): not graded"
                .into(),
        ),
        // Over the disk budget: by the grader's walk, or by the deleted files its supervisor
        // counted.
        Ok((r, stopped)) => Ok((r.finished, stopped.or(r.over_disk))),
        // Silent, or a garbled line: its supervisor may still be alive, and so may the agent.
        Err(e) if !matches!(e, agent_link::LinkError::Gone) => Err(e.to_string()),
        Err(e) => {
            tracing::warn!("{e}; graded as the harness's failure");
            // Its init is gone, so the kernel is killing the rest of its namespace: give it
            // that moment before the workspace is read.
            tokio::time::sleep(Duration::from_secs(2)).await;
            let finished = Finished {
                // Killed, as far as anyone can tell: its container ended under it.
                exit: Exit::Signal(9),
                elapsed: started.elapsed(),
                stdout_bytes: 0,
                stderr_bytes: 0,
            };
            Ok((finished, None))
        }
    }
}

/// Everything between the assignment and the outcome. Infrastructure problems become an
/// `InfraError` outcome; the summary's timing and harness fields are filled as it goes.
async fn session_outcome(
    config: &RunnerConfig,
    client: &GatewayClient,
    spec: &RunSpec,
    token: &str,
    session: &str,
    summary: &mut Summary,
    link: Option<Linked>,
) -> SessionOutcome {
    let state = &config.state_dir;
    let ws = &config.workspace;
    let infra_error = |message: String| SessionOutcome::InfraError { message };
    // A pod's grader running as root (a SWE-bench pod's, or a template's own choice): the
    // files its containers share, as they are before anything of the agent's runs.
    let shared = (config.agent.is_some() && nix::unistd::geteuid().is_root()).then(|| {
        let paths: Vec<&Path> = crate::pod_files::SHARED.iter().map(Path::new).collect();
        crate::pod_files::Kept::read(&paths)
    });

    // The task: its repository, files, prepare steps, then the snapshot the evaluator starts
    // from.
    if let Some(repository) = &spec.task.repository {
        let seeded = config.seeded_from.as_deref() == Some(Path::new(&repository.path));
        let checked_out = match seeded {
            true => {
                let scratch = state.join("checkout");
                crate::checkout::check_out_in_place(&repository.commit, ws, &scratch).await
            }
            false => crate::checkout::check_out(repository, ws).await,
        };
        if let Err(e) = checked_out {
            return infra_error(e);
        }
    }
    if let Err(e) = workspace::write_files(ws, &spec.task.files) {
        return infra_error(format!("task files: {e}"));
    }
    if let Err(e) = prepare(config, spec.prepare_steps(), "task").await {
        return infra_error(e);
    }
    let pristine = state.join("pristine");
    if let Err(e) = workspace::copy_tree(ws, &pristine) {
        return infra_error(format!("snapshot: {e}"));
    }

    // Local mode: the session's own cgroup for the harness (removed, with anything left in
    // it, when this function returns; its evaluator gets one of its own below).
    let cgroup = match config.confinement.as_ref().and_then(|c| c.limits.as_ref()) {
        Some(limits) => match crate::limits::SessionCgroup::for_session(limits, session) {
            Ok(cg) => Some(cg),
            Err(e) => return infra_error(format!("the session's cgroup: {e}")),
        },
        None => None,
    };
    let cgroup_procs = cgroup.as_ref().map(|c| c.procs()).unwrap_or_default();

    // The harness. In a pod its home, instruction and logs are in the volume it shares with
    // this container; locally in the runner's state.
    let agent_dir = config.agent.as_ref().map_or(state, |a| &a.dir);
    let home = agent_dir.join("home");
    let instruction_file = agent_dir.join("instruction.md");
    if let Err(e) = std::fs::create_dir_all(&home)
        .and_then(|_| std::fs::create_dir_all(agent_dir.join("logs")))
        .and_then(|_| std::fs::write(&instruction_file, &spec.task.instruction))
    {
        return infra_error(format!("harness home: {e}"));
    }
    let ctx = PresetContext {
        gateway_url: client.base(),
        token,
        home: &home,
        instruction: &spec.task.instruction,
        instruction_file: &instruction_file,
        max_response_tokens: spec
            .max_response_tokens
            .unwrap_or(floe_crds::rollout_job::DEFAULT_MAX_RESPONSE_TOKENS as u32),
    };
    let launch = match presets::launch(&spec.harness, &ctx) {
        Ok(l) => l,
        Err(e) => return infra_error(format!("harness preset: {e}")),
    };
    for (path, content) in &launch.files {
        let written = path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|_| std::fs::write(path, content));
        if let Err(e) = written {
            return infra_error(format!("harness config {}: {e}", path.display()));
        }
    }
    let mut harness = child(
        config,
        "harness",
        &launch.program,
        launch.args.clone(),
        launch.env.clone(),
        ws,
        spec.timeouts.agent_seconds,
    );
    harness.stdout = agent_dir.join("logs/harness.stdout");
    harness.stderr = agent_dir.join("logs/harness.stderr");
    if config.agent.is_none() {
        crate::children::drop_users_credentials(&mut harness);
    }
    if let Some(theirs) = config.agent.as_ref().and_then(|a| a.workspace.clone()) {
        // The agent container mounts the workspace elsewhere (a SWE-bench pod: at `/testbed`).
        harness.cwd = theirs;
    }
    tracing::info!(%session, program = %harness.program, "starting the harness");
    if let Some(confinement) = &config.confinement {
        // Inside the sandbox a missing program is only an exit code: say it here instead.
        if let Err(e) = startable(&harness) {
            return infra_error(format!("the harness did not start: {e}"));
        }
        // A root run's agent is a host user of its own: what it may write is made its, and the
        // instruction (bound read-only) readable to it whatever floe's umask.
        if let Err(e) = confinement.hand_over(&[ws, &home, &instruction_file]) {
            return infra_error(e);
        }
        let access = Access {
            writable: vec![ws, &home],
            read_only: vec![&instruction_file],
            model_api: true,
            cgroup_procs: cgroup_procs.clone(),
        };
        harness = confinement.wrap(harness, &access);
    }
    // A root grader (a SWE-bench pod's) made the workspace's `.git`, the agent's home and
    // files of the task: the agent container's user is given them, as it would own them had
    // this runner been that user.
    if let Some((uid, gid)) = config.agent.as_ref().and_then(|a| a.user) {
        for path in [ws.as_path(), agent_dir.as_path()] {
            if let Err(e) = crate::sandbox_user::give(path, uid, gid) {
                return infra_error(format!("giving {} to the agent: {e}", path.display()));
            }
        }
    }
    summary.harness_started_unix_ms = unix_ms_now();
    // The harness is stopped once its workspace and home outgrow the session's disk budget.
    // The files its processes unlinked but keep open count too: here `holder` finds them (the
    // harness's processes); in a pod the agent container's supervisor does, in the agent's own
    // namespace, at the paths it sees the workspace and home by.
    let roots = vec![ws.to_path_buf(), home.clone()];
    let agent_disk = config.disk_budget.map(|bytes| agent_link::DiskWatch {
        roots: vec![harness.cwd.clone(), home.clone()],
        bytes,
    });
    let over_budget = |holder: Option<crate::disk_budget::Holder>| {
        crate::disk_budget::watch(roots, config.disk_budget, holder)
    };
    let in_a_pod = link.is_some();
    let (ran, over_disk): (Finished, Option<String>) = match link {
        Some(link) => match in_agent_container(link, &harness, agent_disk, over_budget(None)).await
        {
            Ok(f) => f,
            Err(message) => return infra_error(message),
        },
        None => match process::run_watching(&harness, |root| {
            over_budget(Some(crate::disk_budget::Holder {
                root,
                cgroup_procs: cgroup_procs.first().cloned(),
            }))
        })
        .await
        {
            Ok(f) => f,
            Err(e) => return infra_error(e.to_string()),
        },
    };
    summary.agent_seconds = ran.elapsed.as_secs_f64();
    if let Some(why) = &over_disk {
        tracing::warn!(%session, "the harness was stopped: its workspace and home hold {why}");
        // Local mode: what it wrote is on the run's disk, which one `fallocate` can fill at
        // once; left there, the session's own capture and result would fail for want of room
        // (infrastructure, retried) and so would its siblings'. Gone at once, ungraded (the
        // verdict cannot change the outcome). A pod's volumes are bounded by the kubelet.
        if !in_a_pod {
            for dir in [ws, home.as_path()] {
                if let Err(e) = crate::workspace::clear(dir) {
                    tracing::warn!(%session, "emptying {}: {e}", dir.display());
                }
            }
        }
    }
    let timed_out = ran.exit == Exit::TimedOut;
    match &ran.exit {
        Exit::SpawnFailed(e) => return infra_error(format!("the harness did not start: {e}")),
        Exit::Code(c) => summary.harness_exit = Some(*c),
        Exit::Signal(s) => summary.harness_exit = Some(128 + s),
        Exit::TimedOut => {}
    }
    summary.status = match (&ran.exit, timed_out) {
        (_, true) => "agent_timeout",
        (Exit::Code(0), _) => "completed",
        _ => "agent_failed",
    }
    .into();
    tracing::info!(%session, exit = ?ran.exit, seconds = summary.agent_seconds, "harness finished");
    if !ran.success() && !timed_out {
        // In a pod the state dir goes with the pod: this log line is where a user sees why.
        tracing::warn!(%session, stderr = %agent_tail(&harness.stderr, 2000), "the harness failed");
    }
    // Seal the capture before grading: nothing the agent left running can add calls.
    if let Err(e) = client.close(session).await {
        return infra_error(format!("closing the session: {e}"));
    }

    // Evaluation in a fresh copy; hidden files only now. A root grader's evaluation could
    // rewrite what the pod's containers resolve names by: put back (as they were before the
    // agent) before anything ships.
    //
    // Local mode: the evaluator runs in a cgroup of its own, with the session's limits. The
    // agent's still holds what the agent left in files on a `--out` on tmpfs (memory, which
    // it cannot reclaim without swap), up to its limit: the evaluator there was OOM-killed,
    // a correct session's 0, or infrastructure when its sandbox had not yet started.
    // Made only where an evaluator runs: a session stopped for its disk is scored as it is.
    let limits = config.confinement.as_ref().and_then(|c| c.limits.as_ref());
    let graded = match &over_disk {
        Some(why) if !in_a_pod => Ok(floe_gateway::trajectory::Evaluation {
            reward: Some(spec.evaluator.reward.failure_reward),
            passed: Some(false),
            detail: serde_json::json!({"harnessExit": summary.harness_exit,
                "ungraded": format!("its workspace and home, which held {why}, were emptied")}),
        }),
        _ => {
            let grading_cgroup = match (limits, &cgroup) {
                (Some(limits), Some(_)) => {
                    match crate::limits::SessionCgroup::for_grading(limits, session) {
                        Ok(cg) => Some(cg),
                        Err(e) => return infra_error(format!("the grading cgroup: {e}")),
                    }
                }
                _ => None,
            };
            let procs = grading_cgroup
                .as_ref()
                .map(|c| c.procs())
                .unwrap_or_default();
            crate::grading::grade(config, spec, &pristine, ws, &procs, summary).await
        }
    };
    match shared.as_ref().map(crate::pod_files::Kept::restore) {
        Some(Ok(restored)) if !restored.is_empty() => {
            tracing::warn!(
                ?restored,
                "the evaluation rewrote files the pod's containers share: put back"
            );
        }
        Some(Err(e)) => return infra_error(e),
        _ => {}
    }
    let evaluation = match graded {
        Ok(e) => e,
        Err(message) => return infra_error(message),
    };
    let mut evaluation = evaluation;
    if let Some(why) = over_disk {
        // Out of disk as out of time: the policy's failure (`failureReward` as
        // `agent_timeout`), the evaluator's verdict kept for the record.
        let reason = crate::reward::FailureReason::DiskLimit.code();
        let message = format!(
            "the harness was stopped: its workspace and home hold {why} (the session's disk budget)"
        );
        summary.failure = Some(reason.into());
        summary.error = Some(message.clone());
        evaluation.detail["failure"] = reason.into();
        evaluation.detail["failureMessage"] = message.into();
    }
    if timed_out {
        SessionOutcome::AgentTimeout {
            evaluation: Some(evaluation),
            reward: spec.evaluator.reward.failure_reward,
        }
    } else {
        SessionOutcome::Completed { evaluation }
    }
}
