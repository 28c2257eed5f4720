//! `floe run` at scale against a stub model: sessions per minute and floe's overhead per
//! session, against a baseline measured in the same run — the same agent command run directly
//! at the same concurrency, with no floe (no gateway, runner, snapshot, evaluation copy,
//! trajectory or dataset) — and the run's peak RSS and open files, sampled from `/proc`.
//!
//! The agent is one `curl` chat completion and a file write; the evaluator `test -f`. So the
//! difference between the two rates is what floe costs per session. floe runs twice: with its
//! sandbox (bubblewrap around every harness and evaluator, the default) and `--no-sandbox`, so
//! the sandbox's own cost per session is measured in the same run.
//!
//! `--quick`: 100 sessions. Default: 400. `FLOE_BENCH_SESSIONS=N` sets any other size (the
//! figures in docs/benchmarks.md include 10,000); `FLOE_BENCH_CONCURRENCY` (default 8).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use floe_tests::cluster::floe_bin;
use floe_tests::{proc_cpu, ScriptedUpstream, Step};
use serde_json::Value;

const AGENT: &str = r#"curl -sf -H "authorization: Bearer $OPENAI_API_KEY" -H 'content-type: application/json' -d '{"model":"policy","messages":[{"role":"user","content":"hi"}]}' "$OPENAI_BASE_URL/chat/completions" > /dev/null && echo ok > answer.txt"#;

fn job(sessions: usize) -> String {
    let samples = 4;
    let tasks = sessions.div_ceil(samples);
    let list: String = (0..tasks)
        .map(|i| format!("      - {{id: t{i}, instruction: x}}\n"))
        .collect();
    format!(
        r#"apiVersion: floe.dev/v1alpha1
kind: RolloutJob
metadata: {{name: scale}}
spec:
  numSamples: {samples}
  poolRef: {{name: local}}
  harness:
    preset: custom
    command: [sh, -c, {agent}]
  evaluator: {{command: [test, -f, answer.txt]}}
  sft:
    upstream: {{url: "http://127.0.0.1:9"}}
    output: {{claimName: unused}}
  tasks:
    inline:
{list}"#,
        agent = serde_json::to_string(AGENT).unwrap_or_default(),
    )
}

/// Open files of `pid` now.
fn open_files(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

struct Floe {
    per_minute: f64,
    overhead_mean: f64,
    /// Mean wall time of one session: harness + evaluator + floe's overhead.
    session_mean: f64,
    /// Of which the harness and the evaluator (each inside its sandbox, when there is one).
    agent_mean: f64,
    evaluator_mean: f64,
    peak_rss_mib: f64,
    peak_open_files: usize,
}

fn run_floe(
    dir: &Path,
    model: &str,
    sessions: usize,
    concurrency: usize,
    sandbox: bool,
) -> Result<Floe> {
    std::fs::create_dir_all(dir)?;
    let job_file = dir.join("job.yaml");
    std::fs::write(&job_file, job(sessions))?;
    let out = dir.join("out");
    let mut command = Command::new(floe_bin()?);
    command
        .arg("run")
        .arg(&job_file)
        .arg("--out")
        .arg(&out)
        .args(["--model-url", model])
        .args(["--sessions", &sessions.to_string()])
        .args(["--concurrency", &concurrency.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if !sandbox {
        command.arg("--no-sandbox");
    }
    let mut child = command.spawn()?;
    let pid = child.id();
    let (mut peak_rss, mut peak_files) = (0u64, 0usize);
    let status = loop {
        if let Some((_, hwm)) = proc_cpu::rss_kib(pid) {
            peak_rss = peak_rss.max(hwm);
        }
        peak_files = peak_files.max(open_files(pid));
        if let Some(status) = child.try_wait()? {
            break status;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    anyhow::ensure!(status.success(), "floe run exited {status}");
    let summary: Value = serde_json::from_str(&std::fs::read_to_string(out.join("summary.json"))?)?;
    anyhow::ensure!(
        summary["sessions"]["completed"] == sessions,
        "every session completed: {}",
        summary["sessions"]
    );
    let timing = |k: &str| summary["timings"][k].as_f64().context(k.to_string());
    Ok(Floe {
        agent_mean: timing("agentSecondsMean")?,
        evaluator_mean: timing("evaluatorSecondsMean")?,
        session_mean: timing("agentSecondsMean")?
            + timing("evaluatorSecondsMean")?
            + timing("overheadSecondsMean")?,
        per_minute: summary["timings"]["sessionsPerMinute"]
            .as_f64()
            .context("sessionsPerMinute")?,
        overhead_mean: summary["timings"]["overheadSecondsMean"]
            .as_f64()
            .context("overheadSecondsMean")?,
        peak_rss_mib: peak_rss as f64 / 1024.0,
        peak_open_files: peak_files,
    })
}

/// The same agent, `sessions` times at `concurrency`, straight against the model (a fake
/// session token: the stub does not check it).
fn run_direct(dir: &Path, model: &str, sessions: usize, concurrency: usize) -> Result<f64> {
    let script = dir.join("agent.sh");
    std::fs::write(
        &script,
        format!("mkdir -p \"$1/s$2\" && cd \"$1/s$2\" && {AGENT}\n"),
    )?;
    let t0 = Instant::now();
    // `-n 1` appends each number as the last argument; `-I N` would also replace an `N` in
    // the temporary directory's random name (a CI run failed on `/tmp/.tmponDMJN`).
    let status = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "seq {sessions} | xargs -P {concurrency} -n 1 sh '{}' '{}'",
            script.display(),
            dir.display()
        ))
        .env("OPENAI_API_KEY", "bench")
        .env("OPENAI_BASE_URL", format!("{model}/v1"))
        .status()?;
    anyhow::ensure!(status.success(), "the direct baseline failed: {status}");
    Ok(sessions as f64 * 60.0 / t0.elapsed().as_secs_f64())
}

#[tokio::main]
async fn main() -> Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let sessions = std::env::var("FLOE_BENCH_SESSIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 100 } else { 400 });
    let concurrency = std::env::var("FLOE_BENCH_CONCURRENCY")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let model = ScriptedUpstream::start(vec![Step::Say("done".into())]).await?;
    let dir = tempfile::tempdir()?;
    let url = model.url.clone();
    let root = dir.path().to_path_buf();
    let direct_dir = root.join("direct");
    std::fs::create_dir_all(&direct_dir)?;
    let (floe, open, direct) = tokio::task::spawn_blocking(move || -> Result<(Floe, Floe, f64)> {
        let direct = run_direct(&direct_dir, &url, sessions, concurrency)?;
        let floe = run_floe(&root.join("floe"), &url, sessions, concurrency, true)?;
        let open = run_floe(&root.join("open"), &url, sessions, concurrency, false)?;
        Ok((floe, open, direct))
    })
    .await??;
    println!(
        "local run, {sessions} sessions at concurrency {concurrency}: floe {:.0} sessions/min, the agent alone {:.0}/min (floe {:.2}x the bare rate); floe overhead {:.3} s/session; peak RSS {:.0} MiB; peak open files {}",
        floe.per_minute,
        direct,
        floe.per_minute / direct,
        floe.overhead_mean,
        floe.peak_rss_mib,
        floe.peak_open_files,
    );
    println!(
        "the sandbox: {:.0} sessions/min with it, {:.0}/min with --no-sandbox ({:.2}x); a session takes {:.3} s with it, {:.3} s without: {:+.3} s each (harness {:+.3} s, evaluator {:+.3} s, the rest {:+.3} s)",
        floe.per_minute,
        open.per_minute,
        floe.per_minute / open.per_minute,
        floe.session_mean,
        open.session_mean,
        floe.session_mean - open.session_mean,
        floe.agent_mean - open.agent_mean,
        floe.evaluator_mean - open.evaluator_mean,
        (floe.session_mean - floe.agent_mean - floe.evaluator_mean)
            - (open.session_mean - open.agent_mean - open.evaluator_mean),
    );
    Ok(())
}
