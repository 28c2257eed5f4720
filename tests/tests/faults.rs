//! Fault injection: `floe run` as a real process against a model server that is killed and
//! restarted, answers errors, or hangs, and `floe run` itself interrupted, terminated and
//! SIGKILLed, then resumed. What is asserted each time: the infrastructure's failures are never
//! scored as the policy's (never in a dataset), what can be retried is, every session is
//! accounted for once, and nothing the run started outlives it.
//!
//! The agent is a small `custom` harness: it makes its model calls and then writes its answer
//! whether they succeeded or not — the case that once put sessions without a single answered
//! call into the dataset as passed.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};
use floe_tests::{floe_bin, wait_child, Fault, FaultProxy, ScriptedUpstream, Step};
use serde_json::Value;

/// Makes `CALLS` calls (unless told otherwise by the instruction: `calls N`, `hold FILE`: wait
/// while FILE exists after the first call), then writes `answer.txt` regardless.
const AGENT: &str = r#"
import json, os, sys, time, urllib.request
words = os.environ["FLOE_INSTRUCTION"].split()
calls = int(words[words.index("calls") + 1]) if "calls" in words else 2
hold = words[words.index("hold") + 1] if "hold" in words else None
ok = 0
for i in range(calls):
    body = json.dumps({"model": os.environ["FLOE_MODEL"], "messages": [{"role": "user", "content": "step %d" % i}]}).encode()
    req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body,
        headers={"content-type": "application/json", "authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    try:
        urllib.request.urlopen(req, timeout=300).read()
        ok += 1
    except Exception as e:
        print("call failed:", e, file=sys.stderr)
    while hold and os.path.exists(hold):
        time.sleep(0.2)
open("answer.txt", "w").write(str(ok))
"#;

struct Job {
    tasks: Vec<String>,
    samples: u32,
    concurrency: u32,
    backoff_limit: u32,
    model_call_seconds: u32,
    agent_seconds: u32,
    /// `spec.modelCallRetry`.
    first_backoff_millis: u32,
    http500_retries: u32,
}

impl Default for Job {
    fn default() -> Self {
        Self {
            tasks: vec!["calls 2".into()],
            samples: 2,
            concurrency: 2,
            backoff_limit: 3,
            model_call_seconds: 30,
            agent_seconds: 120,
            first_backoff_millis: 250,
            http500_retries: 2,
        }
    }
}

impl Job {
    fn yaml(&self) -> String {
        let agent = AGENT.trim().replace('\n', "\n          ");
        let tasks: String = self
            .tasks
            .iter()
            .enumerate()
            .map(|(i, t)| format!("      - {{id: t{i}, instruction: \"{t}\"}}\n"))
            .collect();
        format!(
            r#"apiVersion: floe.dev/v1alpha1
kind: RolloutJob
metadata: {{name: faults}}
spec:
  numSamples: {samples}
  concurrency: {concurrency}
  backoffLimit: {backoff}
  poolRef: {{name: local}}
  harness:
    preset: custom
    model: policy
    command:
      - python3
      - -c
      - |
          {agent}
  evaluator:
    command: [test, -f, answer.txt]
  timeouts: {{agentSeconds: {agent_s}, evaluatorSeconds: 30, modelCallSeconds: {call_s}}}
  modelCallRetry: {{firstBackoffMillis: {first}, http500Retries: {r500}}}
  sft:
    upstream: {{url: "http://127.0.0.1:9"}}
    output: {{claimName: unused}}
  tasks:
    inline:
{tasks}"#,
            samples = self.samples,
            concurrency = self.concurrency,
            backoff = self.backoff_limit,
            agent_s = self.agent_seconds,
            call_s = self.model_call_seconds,
            first = self.first_backoff_millis,
            r500 = self.http500_retries,
        )
    }

    fn write(&self, dir: &Path) -> Result<PathBuf> {
        let path = dir.join("job.yaml");
        std::fs::write(&path, self.yaml())?;
        Ok(path)
    }
}

fn floe_run(job: &Path, out: &Path, model_url: &str) -> Result<Command> {
    let mut cmd = Command::new(floe_bin()?);
    cmd.arg("run")
        .arg(job)
        .arg("--out")
        .arg(out)
        .args(["--model-url", model_url])
        .stdin(Stdio::null());
    Ok(cmd)
}

fn resuming(mut cmd: Command) -> Command {
    cmd.arg("--resume");
    cmd
}

/// A run in the background (its progress on the test's stderr).
fn spawn_run(job: &Path, out: &Path, model_url: &str) -> Result<std::process::Child> {
    Ok(floe_run(job, out, model_url)?
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()?)
}

/// Start a run, and take its model server down once its pre-flight passed.
async fn start_then_fail(
    job: &Path,
    out: &Path,
    proxy: &mut FaultProxy,
) -> Result<std::process::Child> {
    let child = spawn_run(job, out, &proxy.url)?;
    wait_for("the run's pre-flight", Duration::from_secs(30), || {
        out.join("run.json").exists()
    })
    .await?;
    proxy.down();
    Ok(child)
}

async fn upstream() -> Result<ScriptedUpstream> {
    ScriptedUpstream::start(vec![Step::Say("done".into())]).await
}

async fn run_to_end(cmd: Command) -> Result<(i32, String)> {
    let mut cmd = cmd;
    let output = tokio::task::spawn_blocking(move || cmd.output()).await??;
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    Ok((output.status.code().unwrap_or(-1), stderr))
}

fn summary(out: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(out.join("summary.json")).context("summary.json")?;
    Ok(serde_json::from_str(&text)?)
}

fn trajectories(out: &Path, which: &str) -> Result<Vec<Value>> {
    let mut all = Vec::new();
    for entry in std::fs::read_dir(out.join("trajectories").join(which))
        .into_iter()
        .flatten()
    {
        all.push(serde_json::from_slice(&std::fs::read(entry?.path())?)?);
    }
    Ok(all)
}

/// Every accepted trajectory has an answered call and a reward; each (group, sample) once.
fn assert_dataset_is_clean(out: &Path) -> Result<usize> {
    let mut seen = std::collections::BTreeSet::new();
    let text = std::fs::read_to_string(out.join("dataset.jsonl"))?;
    for line in text.lines() {
        let t: Value = serde_json::from_str(line)?;
        assert!(
            t["stats"]["completions"].as_u64() >= Some(1),
            "a session without an answered call was accepted: {line}"
        );
        assert_eq!(t["trainable"], true, "{line}");
        assert!(
            seen.insert((t["group"].to_string(), t["sample"].to_string())),
            "a sample twice in the dataset: {line}"
        );
    }
    Ok(seen.len())
}

async fn wait_for(what: &str, limit: Duration, mut ready: impl FnMut() -> bool) -> Result<()> {
    let deadline = tokio::time::Instant::now() + limit;
    while !ready() {
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// Processes whose environment holds `needle` (the agents of one test's job: their
/// instruction names the hold file).
fn processes_with(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        if String::from_utf8_lossy(&environ).contains(needle) {
            found.push(format!("{:?}", entry.file_name()));
        }
    }
    found
}

#[tokio::test]
async fn a_short_outage_and_passing_errors_are_absorbed_by_the_gateway_s_retries() -> Result<()> {
    let model = upstream().await?;
    let mut proxy = FaultProxy::start(&model.url).await?;
    let dir = tempfile::tempdir()?;
    let job = Job {
        tasks: vec!["calls 3".into(), "calls 3".into()],
        ..Default::default()
    }
    .write(dir.path())?;
    let out = dir.path().join("out");
    // Every 3rd call answers 503, and the server is down for 2 s once sessions are calling.
    proxy.set(Fault::StatusEvery {
        status: 503,
        every: 3,
    });
    let mut child = spawn_run(&job, &out, &proxy.url)?;
    wait_for("the first model call", Duration::from_secs(60), || {
        proxy.calls() >= 1
    })
    .await?;
    proxy.down();
    tokio::time::sleep(Duration::from_secs(2)).await;
    proxy.up().await?;
    let status = wait_child(&mut child, Duration::from_secs(120)).await?;
    let s = summary(&out)?;
    assert_eq!(status.code(), Some(0), "{s}");
    assert_eq!(s["sessions"]["completed"], 4, "{s}");
    assert_eq!(
        s["sessions"]["retries"], 0,
        "no session needed a second attempt: {s}"
    );
    let retried = &s["upstreamErrors"]["retried"];
    assert!(retried["http_503"].as_u64() >= Some(1), "{s}");
    assert!(
        retried["connect"].as_u64().unwrap_or(0) + retried["broken"].as_u64().unwrap_or(0) >= 1,
        "the outage was met and retried: {s}"
    );
    assert!(s["upstreamErrors"].get("failed").is_none(), "{s}");
    assert_eq!(assert_dataset_is_clean(&out)?, 4);
    Ok(())
}

#[tokio::test]
async fn an_outage_past_the_call_deadline_is_an_infrastructure_error_retried_never_scored(
) -> Result<()> {
    let model = upstream().await?;
    let mut proxy = FaultProxy::start(&model.url).await?;
    let dir = tempfile::tempdir()?;
    let out = dir.path().join("out");
    let job = Job {
        model_call_seconds: 2,
        backoff_limit: 0,
        ..Default::default()
    }
    .write(dir.path())?;
    // Down for the whole run (after pre-flight): with no retry left, every session fails.
    let mut child = start_then_fail(&job, &out, &mut proxy).await?;
    let status = wait_child(&mut child, Duration::from_secs(120)).await?;
    let s = summary(&out)?;
    assert_eq!(status.code(), Some(1), "{s}");
    assert_eq!(s["sessions"]["infraError"], 2, "{s}");
    assert_eq!(s["reward"]["scored"], 0, "nothing scored: {s}");
    assert!(
        s["upstreamErrors"]["failed"]["connect"].as_u64() >= Some(2),
        "{s}"
    );
    assert_eq!(s["dataset"]["accepted"], 0, "{s}");
    for t in trajectories(&out, "rejected")? {
        assert_eq!(t["trainable"], false);
        assert!(t["reward"].is_null(), "{t}");
        let error = t["evaluation"]["detail"]["error"]
            .as_str()
            .unwrap_or_default();
        assert!(error.contains("failed at the model server"), "{error}");
    }

    // The same outage with retries left: the sessions that failed run again once the server
    // is back, and only their later attempts are scored.
    proxy.up().await?;
    let out = dir.path().join("out-retried");
    let job = Job {
        model_call_seconds: 2,
        backoff_limit: 5,
        ..Default::default()
    }
    .write(dir.path())?;
    let mut child = start_then_fail(&job, &out, &mut proxy).await?;
    wait_for("a failed first attempt", Duration::from_secs(60), || {
        out.join("sessions/faults-t0-0/summary.json").exists()
            || out.join("sessions/faults-t0-1/summary.json").exists()
    })
    .await?;
    proxy.up().await?;
    let status = wait_child(&mut child, Duration::from_secs(120)).await?;
    let s = summary(&out)?;
    assert_eq!(status.code(), Some(0), "{s}");
    assert_eq!(s["sessions"]["completed"], 2, "{s}");
    assert!(s["sessions"]["retries"].as_u64() >= Some(1), "{s}");
    assert_eq!(assert_dataset_is_clean(&out)?, 2);
    let retried_ids: Vec<String> = trajectories(&out, "accepted")?
        .iter()
        .filter_map(|t| t["session"].as_str().map(str::to_owned))
        .filter(|id| id.contains("-r"))
        .collect();
    assert!(
        !retried_ids.is_empty(),
        "a later attempt was the scored one"
    );
    Ok(())
}

#[tokio::test]
async fn a_hung_model_and_http_500s_are_the_infrastructure_s() -> Result<()> {
    let model = upstream().await?;
    let proxy = FaultProxy::start(&model.url).await?;
    let dir = tempfile::tempdir()?;
    // One session, one call, no session retry: each fault shows as it is.
    let job_spec = || Job {
        tasks: vec!["calls 1".into()],
        samples: 1,
        model_call_seconds: 2,
        backoff_limit: 0,
        agent_seconds: 60,
        ..Default::default()
    };
    // `job` run into `dir/name` with `fault` on the model: its exit code, summary and stderr.
    let under = async |fault: Fault, job: Job, name: &str| -> Result<(i32, Value, String)> {
        let here = dir.path().join(name);
        std::fs::create_dir_all(&here)?;
        let job = job.write(&here)?;
        proxy.set(fault);
        let out = here.join("out");
        let (code, stderr) = run_to_end(floe_run(&job, &out, &proxy.url)?).await?;
        Ok((code, summary(&out)?, stderr))
    };
    let (code, s, stderr) = under(Fault::Hang(Duration::from_secs(60)), job_spec(), "hung").await?;
    assert_eq!(code, 1, "{stderr}");
    // Not "agent timeout, reward 0, trainable": the call's deadline caught the hang.
    assert_eq!(s["sessions"]["infraError"], 1, "{s}");
    assert_eq!(s["sessions"]["agentTimeout"], 0, "{s}");
    assert_eq!(s["upstreamErrors"]["failed"]["timeout"], 1, "{s}");
    assert!(
        s["timings"]["agentSecondsMean"].as_f64() < Some(30.0),
        "{s}"
    );

    // A 500 is retried (twice at most); a run of them fails the call. A deadline of 10 s: a
    // retry is made only while it fits in the call's deadline, and on a busy machine two
    // attempts and a backoff can take most of 2 s.
    let http = |status, next| Fault::Status { status, next };
    let roomy = || Job {
        model_call_seconds: 10,
        ..job_spec()
    };
    let (code, s, stderr) = under(http(500, 2), roomy(), "500-twice").await?;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(s["upstreamErrors"]["retried"]["http_500"], 2, "{s}");
    assert_eq!(s["sessions"]["completed"], 1, "{s}");
    let (code, s, _) = under(http(500, 3), roomy(), "500-thrice").await?;
    assert_eq!(code, 1, "{s}");
    assert_eq!(s["upstreamErrors"]["failed"]["http_500"], 1, "{s}");
    assert_eq!(s["dataset"]["accepted"], 0, "{s}");

    // The job's retry shape: no retry of a 500 at all, and a first wait of 1.5 s.
    let strict = Job {
        http500_retries: 0,
        ..job_spec()
    };
    let (code, s, _) = under(http(500, 1), strict, "500-once-no-retry").await?;
    assert_eq!(code, 1, "{s}");
    assert_eq!(s["upstreamErrors"]["failed"]["http_500"], 1, "{s}");
    assert!(
        s["upstreamErrors"]["retried"]["http_500"].as_u64() < Some(1),
        "{s}"
    );
    let patient = Job {
        first_backoff_millis: 1500,
        model_call_seconds: 30,
        ..job_spec()
    };
    let (code, s, stderr) = under(http(503, 1), patient, "503-once-slow-backoff").await?;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(s["upstreamErrors"]["retried"]["http_503"], 1, "{s}");
    let errors = dir
        .path()
        .join("503-once-slow-backoff/out/captures/faults-t0-0/upstream-errors.jsonl");
    let record: Value = serde_json::from_str(std::fs::read_to_string(errors)?.trim())?;
    assert_eq!(
        record["retryInMs"], 1500,
        "the job's first backoff, not the default 250: {record}"
    );
    Ok(())
}

#[tokio::test]
async fn sigterm_ends_a_run_like_ctrl_c_and_sigkill_leaves_nothing_behind_then_resume_finishes(
) -> Result<()> {
    let model = upstream().await?;
    let dir = tempfile::tempdir()?;
    // Outside /tmp: each agent's sandbox has a /tmp of its own but sees the rest read-only.
    let hold =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("faults-hold-{}", std::process::id()));
    std::fs::write(&hold, "")?;
    // Three tasks answer at once; the fourth's agents wait on the hold file after a call.
    let held = format!("calls 1 hold {}", hold.display());
    let job = Job {
        tasks: vec![
            "calls 1".into(),
            "calls 1".into(),
            "calls 1".into(),
            held.clone(),
        ],
        ..Default::default()
    }
    .write(dir.path())?;

    // SIGTERM: summary written, agents gone, exit 143.
    let out = dir.path().join("terminated");
    let mut child = spawn_run(&job, &out, &model.url)?;
    wait_for("the held sessions", Duration::from_secs(120), || {
        !processes_with(&hold.display().to_string()).is_empty()
            && out.join("sessions/faults-t3-1").exists()
    })
    .await?;
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()?;
    let status = wait_child(&mut child, Duration::from_secs(60)).await?;
    assert_eq!(status.code(), Some(143));
    let s = summary(&out)?;
    assert_eq!(s["interrupted"], true);
    assert_eq!(s["sessions"]["completed"], 6, "{s}");
    assert_eq!(s["sessions"]["notFinished"], 2, "{s}");
    // Only sessions that started have a trajectory; none is a cancelled one's hidden slot.
    assert_eq!(
        trajectories(&out, "accepted")?.len() + trajectories(&out, "rejected")?.len(),
        8
    );
    assert!(processes_with(&hold.display().to_string()).is_empty());

    // SIGKILL: nothing can be caught; the watchdog still kills every agent.
    let out = dir.path().join("killed");
    let mut child = spawn_run(&job, &out, &model.url)?;
    wait_for("the held sessions", Duration::from_secs(120), || {
        processes_with(&hold.display().to_string()).len() >= 2
            && out.join("sessions/faults-t3-1").exists()
    })
    .await?;
    child.kill()?;
    let _ = child.wait();
    wait_for(
        "the agents to die with the run",
        Duration::from_secs(10),
        || processes_with(&hold.display().to_string()).is_empty(),
    )
    .await?;
    assert!(!out.join("summary.json").exists());

    // Resume: the six finished sessions are kept, the two killed ones run again (and now pass).
    std::fs::remove_file(&hold)?;
    let (code, stderr) = run_to_end(resuming(floe_run(&job, &out, &model.url)?)).await?;
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("6 of 8 sessions done"), "{stderr}");
    let s = summary(&out)?;
    assert_eq!(s["sessions"]["total"], 8, "{s}");
    assert_eq!(s["sessions"]["completed"], 8, "{s}");
    assert_eq!(assert_dataset_is_clean(&out)?, 8);
    // The killed attempts kept their ids; the new ones have their own.
    assert!(out.join("sessions/faults-t3-0-r1/summary.json").is_file());

    // A different job does not resume in that directory.
    let other = Job {
        tasks: vec!["calls 5".into()],
        ..Default::default()
    }
    .write(&{
        let d = dir.path().join("other");
        std::fs::create_dir_all(&d)?;
        d
    })?;
    let (code, stderr) = run_to_end(resuming(floe_run(&other, &out, &model.url)?)).await?;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("differ from the earlier run"), "{stderr}");
    // Nor the same job sampling another model (here: the record says it did), which the
    // preflight's name check passes when the new server serves the name asked for: one
    // dataset would hold two policies' sessions.
    let record = out.join("run.json");
    let text = std::fs::read_to_string(&record)?;
    let mut was: Value = serde_json::from_str(&text)?;
    anyhow::ensure!(was["policyDigest"].is_string(), "no policy in {text}");
    was["policyDigest"] = "another".into();
    std::fs::write(&record, was.to_string())?;
    let (code, stderr) = run_to_end(resuming(floe_run(&job, &out, &model.url)?)).await?;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("the job's policy"), "{stderr}");
    // Refused, the run left its summary where it was.
    assert_eq!(summary(&out)?["sessions"]["completed"], 8);
    Ok(())
}

/// Killed after the gateway recorded a session's outcome and before it spooled its
/// trajectory (so before its `summary.json`), the session is done: the resumed run's gateway
/// ships it as it recovers, and running it again would put a second sample of its group in
/// the dataset (in a train run, train it twice).
#[tokio::test]
async fn a_session_whose_outcome_was_recorded_but_not_spooled_is_done_on_resume() -> Result<()> {
    let model = upstream().await?;
    let dir = tempfile::tempdir()?;
    let job = Job::default().write(dir.path())?;
    let out = dir.path().join("out");
    let (code, stderr) = run_to_end(floe_run(&job, &out, &model.url)?).await?;
    assert_eq!(code, 0, "{stderr}");
    // What the disk holds when the kill comes between the outcome and the spool: the outcome,
    // and nothing downstream of it.
    let id = "faults-t0-1";
    assert!(out.join("captures").join(id).join("outcome.json").is_file());
    for gone in [
        out.join("sessions").join(id).join("summary.json"),
        out.join("captures/.spool/shipped")
            .join(format!("{id}.json")),
        out.join("trajectories/accepted").join(format!("{id}.json")),
        out.join("summary.json"),
        out.join("dataset.jsonl"),
    ] {
        std::fs::remove_file(&gone).with_context(|| gone.display().to_string())?;
    }
    let (code, stderr) = run_to_end(resuming(floe_run(&job, &out, &model.url)?)).await?;
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("2 of 2 sessions done"), "{stderr}");
    assert!(!out.join("sessions").join(format!("{id}-r1")).exists());
    assert!(out
        .join("trajectories/accepted")
        .join(format!("{id}.json"))
        .is_file());
    assert_eq!(summary(&out)?["sessions"]["completed"], 2);
    Ok(())
}

#[tokio::test]
async fn a_run_s_open_files_do_not_grow_with_its_queue() -> Result<()> {
    let model = upstream().await?;
    let dir = tempfile::tempdir()?;
    let job = Job {
        tasks: (0..30).map(|_| "calls 1".to_string()).collect(),
        samples: 3,
        concurrency: 4,
        ..Default::default()
    }
    .write(dir.path())?;
    let out = dir.path().join("out");
    // 90 queued sessions under 64 open files: each used to hold its capture open from the start.
    let cmd = format!(
        "ulimit -n 64 && exec {} run {} --out {} --model-url {}",
        floe_bin()?.display(),
        job.display(),
        out.display(),
        model.url
    );
    let mut sh = Command::new("sh");
    sh.args(["-c", &cmd]);
    let (code, stderr) = run_to_end(sh).await?;
    let s = summary(&out)?;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(s["sessions"]["completed"], 90, "{s}");
    assert_eq!(s["sessions"]["retries"], 0, "{s}");
    Ok(())
}

#[tokio::test]
async fn broken_job_files_and_flags_stop_before_any_session_with_one_line() -> Result<()> {
    let model = upstream().await?;
    let dir = tempfile::tempdir()?;
    let good = Job::default().yaml();
    std::fs::write(dir.path().join("empty.jsonl"), "\n")?;
    let not_json = ScriptedUpstream::start(vec![]).await?;
    // A server whose /v1/models is not a model list.
    let html = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let html_url = format!("http://{}", html.local_addr()?);
    tokio::spawn(async move {
        let app = axum::Router::new().fallback(|| async { "<html>hello</html>" });
        let _ = axum::serve(html, app).await;
    });
    drop(not_json);
    let edit = |from: &str, to: &str| {
        assert!(good.contains(from), "{from}");
        good.replacen(from, to, 1)
    };
    let long_id = "x".repeat(250);
    let cases: Vec<(String, Vec<&str>, &str, &str)> = vec![
        (
            edit("  backoffLimit", "  agentSecond: 5\n  backoffLimit"),
            vec![],
            &model.url,
            "spec.agentSecond: unknown field",
        ),
        (
            edit("modelCallSeconds", "modelCallSecond"),
            vec![],
            &model.url,
            "did you mean `modelCallSeconds`?",
        ),
        (
            edit(
                "instruction: \"calls 2\"}",
                "instruction: \"calls 2\", evaluation: {hiddenFiles: {'../x.py': ''}}}",
            ),
            vec![],
            &model.url,
            "spec.tasks.inline[0].evaluation.hiddenFiles: \"../x.py\" must be a relative path",
        ),
        (
            // A hidden test under a path the task has as a file: one would replace the other.
            edit(
                "instruction: \"calls 2\"}",
                "instruction: \"calls 2\", files: {tests: x}, evaluation: {hiddenFiles: {'tests/t.py': ''}}}",
            ),
            vec![],
            &model.url,
            "\"tests\" is a file of the task, and \"tests/t.py\" needs it to be a directory",
        ),
        (
            edit(
                "command: [test, -f, answer.txt]",
                "command: [test, -f, answer.txt]\n    protectedPaths: ['[']",
            ),
            vec![],
            &model.url,
            "spec.evaluator.protectedPaths",
        ),
        (
            edit("command: [test, -f, answer.txt]", "command: [./check.sh]"),
            vec![],
            &model.url,
            "spec.evaluator.command[0]: \"check.sh\" is a relative path",
        ),
        (
            edit("{id: t0,", &format!("{{id: {long_id},")),
            vec![],
            &model.url,
            "spec.tasks.inline[0].id",
        ),
        (
            // One byte past what `execve` takes as one string: no harness could start with it.
            edit(
                "instruction: \"calls 2\"}",
                &format!("instruction: \"{}\"}}", "x".repeat(131_055)),
            ),
            vec![],
            &model.url,
            "spec.tasks.inline[0].instruction: is 131055 bytes",
        ),
        (
            edit(
                "    inline:\n      - {id: t0, instruction: \"calls 2\"}\n",
                "    file: {path: empty.jsonl}\n",
            ),
            vec![],
            &model.url,
            "empty.jsonl: the job has no tasks",
        ),
        (
            edit("preset: custom", "preset: vim"),
            vec![],
            &model.url,
            "gemini-cli",
        ),
        (
            good.clone(),
            vec!["--sessions", "0"],
            &model.url,
            "--sessions 0 runs nothing",
        ),
        (
            good.clone(),
            vec!["--concurrency", "0"],
            &model.url,
            "--concurrency must be at least 1",
        ),
        (
            good.clone(),
            vec![],
            "127.0.0.1:8000",
            "must be an http:// or https:// URL",
        ),
        (
            good.clone(),
            vec![],
            &html_url,
            "did not answer an OpenAI model list",
        ),
        (
            good.clone(),
            vec!["--resume"],
            &model.url,
            "holds no earlier run",
        ),
        (
            good.clone(),
            vec!["--model-name", "qwen"],
            &model.url,
            "does not serve \"qwen\"; it serves \"policy\": pass --model-name",
        ),
        (
            edit(
                "    inline:\n      - {id: t0, instruction: \"calls 2\"}\n",
                "    file: {path: misspelled.jsonl}\n",
            ),
            vec![],
            &model.url,
            "misspelled.jsonl, line 2: evalution: unknown field (did you mean `evaluation`?)",
        ),
        (
            edit(
                "    inline:\n      - {id: t0, instruction: \"calls 2\"}\n",
                "    file: {path: hidden.jsonl}\n",
            ),
            vec![],
            &model.url,
            "hidden.jsonl, line 1: hidden: unknown field",
        ),
    ];
    std::fs::write(
        dir.path().join("misspelled.jsonl"),
        "{\"id\": \"t0\", \"instruction\": \"calls 2\"}\n{\"id\": \"t1\", \"instruction\": \"x\", \"evalution\": {\"hiddenFiles\": {\"test_x.py\": \"assert False\"}}}\n",
    )?;
    std::fs::write(
        dir.path().join("hidden.jsonl"),
        "{\"id\": \"t0\", \"instruction\": \"x\", \"hidden\": {\"test_x.py\": \"assert False\"}}\n",
    )?;
    for (i, (yaml, flags, url, needle)) in cases.into_iter().enumerate() {
        let job = dir.path().join(format!("job-{i}.yaml"));
        std::fs::write(&job, &yaml)?;
        let out = dir.path().join(format!("out-{i}"));
        let (code, stderr) = run_to_end({
            let mut c = floe_run(&job, &out, url)?;
            c.args(&flags);
            c
        })
        .await?;
        assert_eq!(code, 2, "{needle}: {stderr}");
        assert!(stderr.contains(needle), "{needle:?} not in {stderr:?}");
        assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
        assert!(!out.join("sessions").exists(), "nothing ran for {needle:?}");
    }
    assert_eq!(model.calls(), 0, "no model call was made");
    Ok(())
}

/// README's run command is typed from anywhere: a relative `--out`, job file and task file
/// (relative to the job) from another working directory. Bubblewrap resolves a relative bind
/// source against its own directory, so every path floe hands a child must be absolute.
#[tokio::test]
async fn relative_paths_from_another_directory_run_sandboxed() -> Result<()> {
    let model = upstream().await?;
    let dir = tempfile::tempdir()?;
    let jobs = dir.path().join("jobs");
    let here = dir.path().join("here");
    std::fs::create_dir_all(&jobs)?;
    std::fs::create_dir_all(&here)?;
    let yaml = Job::default().yaml().replacen(
        "    inline:\n      - {id: t0, instruction: \"calls 2\"}\n",
        "    file: {path: tasks.jsonl}\n",
        1,
    );
    anyhow::ensure!(yaml.contains("tasks.jsonl"), "the job reads its task file");
    std::fs::write(jobs.join("job.yaml"), yaml)?;
    std::fs::write(
        jobs.join("tasks.jsonl"),
        "{\"id\": \"t0\", \"instruction\": \"calls 1\"}\n",
    )?;
    let mut cmd = floe_run(Path::new("../jobs/job.yaml"), Path::new("out"), &model.url)?;
    cmd.current_dir(&here);
    let (code, stderr) = run_to_end(cmd).await?;
    let out = here.join("out");
    let s = summary(&out)?;
    assert_eq!(code, 0, "{stderr}\n{s}");
    assert_eq!(s["sessions"]["completed"], 2, "{s}");
    assert!(
        s["sandbox"]
            .as_str()
            .is_some_and(|b| b.contains("bubblewrap")),
        "{s}"
    );
    assert!(out
        .join("sessions/faults-t0-0/workspace/answer.txt")
        .is_file());
    assert_eq!(assert_dataset_is_clean(&out)?, 2);
    Ok(())
}

/// A failure that hits every session alike (here: the harness cannot start its program, before
/// any model call) stops the run after a few attempts with one line naming it, exit 1: not
/// `backoffLimit` retries of every session under "no model call was answered" alone.
#[tokio::test]
async fn one_infrastructure_cause_for_every_session_stops_the_run_early() -> Result<()> {
    let model = upstream().await?;
    let dir = tempfile::tempdir()?;
    let job = Job {
        tasks: (0..4).map(|i| format!("calls {i}")).collect(),
        ..Default::default()
    }
    .yaml();
    let start = job
        .find("    command:\n      - python3")
        .context("the agent's command")?;
    let end = job.find("  evaluator:").context("the evaluator")?;
    let broken = format!(
        "{}    command: [sh, -c, \"echo 'cannot find the agent binary' >&2; exit 1\"]\n{}",
        &job[..start],
        &job[end..]
    );
    let path = dir.path().join("job.yaml");
    std::fs::write(&path, broken)?;
    let out = dir.path().join("out");
    let started = std::time::Instant::now();
    let (code, stderr) = run_to_end(floe_run(&path, &out, &model.url)?).await?;
    let s = summary(&out)?;
    assert_eq!(code, 1, "{stderr}");
    let stop_line = "stopping: no model call of the session was answered";
    assert!(stderr.contains(stop_line), "{stderr}");
    assert!(
        stderr.contains("the harness exited 1: cannot find the agent binary"),
        "the harness's own words name the cause: {stderr}"
    );
    assert!(
        s["stoppedEarly"]
            .as_str()
            .is_some_and(|c| c.contains("cannot find the agent binary")),
        "{s}"
    );
    // 8 sessions × 4 attempts would be 32: four alike (two per session at concurrency 2) and
    // what was running then.
    let attempts = std::fs::read_dir(out.join("sessions"))?.count();
    assert!(attempts <= 6, "{attempts} attempts ran: {s}");
    assert_eq!(s["reward"]["scored"], 0, "{s}");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(model.calls(), 0);
    Ok(())
}
