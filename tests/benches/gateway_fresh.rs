//! What a freshly started gateway sidecar costs for the one session it serves: CPU to start,
//! to answer the runner's first long poll and to take its first assignment, and its RSS —
//! each against a baseline measured in the same run:
//!
//! - the first assignment's CPU against a second assignment on the same, now warm, gateway;
//! - the RSS after it against the gateway's RSS when it had just started;
//! - with `FLOE_BENCH_BASELINE_BIN` (another `floe` binary, e.g. an older build), every figure
//!   also for that binary's gateways, started alternately with this one's, as a ratio.
//!
//! A sandbox pod's gateway lives for one session, so its first request is most of its work.
//! With mimalloc asking for transparent huge pages, each thread's first heap segment faulted in
//! a 2 MB page that the kernel zeroed: 3.5–5 ms of CPU for a first assignment and ~9 MiB of RSS.
//! On a kernel whose transparent huge pages are `always` (not `madvise`), the gateways run with
//! `MIMALLOC_ALLOW_THP=0`, as the sandbox pod's gateway container sets it.
//! Each batch of gateways starts at once, as a pool's refill starts them on a node; one gateway
//! at a time then takes its requests. `--quick`: one batch of 8 per binary instead of 3 of 25.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result};
use floe_tests::cluster::floe_bin;
use floe_tests::proc_cpu;
use floe_tests::processes::{sidecar_gateway, KillOnDrop};
use serde_json::json;

const TOKEN: &str = "bench-token";

/// One gateway's figures, CPU in ms, RSS in MiB.
#[derive(Default, Clone, Copy)]
struct Fresh {
    start_cpu: f64,
    first_poll_cpu: f64,
    first_assignment_cpu: f64,
    second_assignment_cpu: f64,
    rss_started: f64,
    rss_after_first: f64,
}

struct Gateway {
    child: KillOnDrop,
    control: String,
}

fn rss_mib(pid: u32) -> Option<f64> {
    proc_cpu::rss_kib(pid).map(|(rss, _)| rss as f64 / 1024.0)
}

fn cpu_ms(pid: u32) -> f64 {
    proc_cpu::seconds(pid).unwrap_or(0.0) * 1e3
}

/// Whether this machine's kernel backs every large enough anonymous mapping with transparent
/// huge pages (`always`), not only those a program asks for (`madvise`).
fn thp_always() -> bool {
    std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .is_ok_and(|s| s.contains("[always]"))
}

fn start(bin: &Path, dir: &Path, ip: &str) -> Result<Gateway> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("token"), TOKEN)?;
    let mut command = sidecar_gateway(bin, ip, 8371, dir);
    if thp_always() {
        // The build alone cannot refuse them there; the sandbox pod's gateway container sets
        // this (`operator::sandbox_pod`), so measure the sidecar as it runs.
        command.env("MIMALLOC_ALLOW_THP", "0");
    }
    let child = command.stderr(Stdio::null()).spawn()?;
    Ok(Gateway {
        child: KillOnDrop(child),
        control: format!("http://{ip}:8371"),
    })
}

async fn assign(http: &reqwest::Client, gw: &Gateway, session: &str) -> Result<()> {
    let poll = http
        .get(format!(
            "{}/floe/v1/assignments/next?waitSeconds=30",
            gw.control
        ))
        .bearer_auth(TOKEN)
        .send();
    let poll = tokio::spawn(poll);
    // The runner's poll is waiting before the assignment arrives, as in a pod.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let body = json!({"session": session, "task": "t", "group": "g", "sample": 0,
                      "run": {"task": {"instruction": "x".repeat(500)}}});
    http.post(format!("{}/floe/v1/assignments", gw.control))
        .bearer_auth(TOKEN)
        .json(&body)
        .send()
        .await?
        .error_for_status()?;
    poll.await??.error_for_status()?;
    Ok(())
}

async fn wait_up(http: &reqwest::Client, gw: &Gateway) {
    // Its control endpoint answers (unauthenticated: 401, which costs it next to nothing).
    for _ in 0..500 {
        if http
            .get(format!("{}/floe/v1/sessions", gw.control))
            .send()
            .await
            .is_ok()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Start `n` gateways at once (as a pool's refill does on a node), then take each through its
/// runner's first long poll and two assignments, one gateway at a time.
async fn batch(
    http: &reqwest::Client,
    bin: &Path,
    dir: &Path,
    block: u32,
    n: u32,
) -> Result<Vec<Fresh>> {
    let gateways: Vec<Gateway> = (0..n)
        .map(|i| {
            let ip = format!("127.{block}.{}.{}", i / 250, i % 250 + 1);
            start(bin, &dir.join(format!("g{i}")), &ip)
        })
        .collect::<Result<_>>()?;
    for gw in &gateways {
        wait_up(http, gw).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut out = Vec::new();
    for gw in &gateways {
        let pid = gw.child.id();
        let mut f = Fresh {
            start_cpu: cpu_ms(pid),
            rss_started: rss_mib(pid).context("gateway RSS")?,
            ..Default::default()
        };
        // The runner's first long poll, answered empty (a pod's runner waits before a claim).
        let before = cpu_ms(pid);
        http.get(format!(
            "{}/floe/v1/assignments/next?waitSeconds=0",
            gw.control
        ))
        .bearer_auth(TOKEN)
        .send()
        .await?;
        f.first_poll_cpu = cpu_ms(pid) - before;
        let before = cpu_ms(pid);
        assign(http, gw, "first").await?;
        tokio::time::sleep(Duration::from_millis(20)).await;
        f.first_assignment_cpu = cpu_ms(pid) - before;
        f.rss_after_first = rss_mib(pid).context("gateway RSS")?;
        let before = cpu_ms(pid);
        assign(http, gw, "second").await?;
        tokio::time::sleep(Duration::from_millis(20)).await;
        f.second_assignment_cpu = cpu_ms(pid) - before;
        out.push(f);
    }
    Ok(out)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn medians(runs: &[Fresh]) -> Fresh {
    let m = |f: fn(&Fresh) -> f64| median(runs.iter().map(f).collect());
    Fresh {
        start_cpu: m(|f| f.start_cpu),
        first_poll_cpu: m(|f| f.first_poll_cpu),
        first_assignment_cpu: m(|f| f.first_assignment_cpu),
        second_assignment_cpu: m(|f| f.second_assignment_cpu),
        rss_started: m(|f| f.rss_started),
        rss_after_first: m(|f| f.rss_after_first),
    }
}

fn report(name: &str, f: &Fresh) {
    println!(
        "  {name}: start {:.2} ms CPU; first long poll {:.2} ms; first assignment {:.2} ms \
         ({:.1}× a second one on the warm gateway, {:.2} ms); RSS {:.1} MiB started, {:.1} MiB \
         after the first assignment ({:.2}×)",
        f.start_cpu,
        f.first_poll_cpu,
        f.first_assignment_cpu,
        f.first_assignment_cpu / f.second_assignment_cpu,
        f.second_assignment_cpu,
        f.rss_started,
        f.rss_after_first,
        f.rss_after_first / f.rss_started,
    );
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let (n, rounds) = if quick { (8, 1) } else { (25, 3) };
    let candidate = floe_bin()?;
    let baseline: Option<PathBuf> = std::env::var_os("FLOE_BENCH_BASELINE_BIN").map(Into::into);
    let dir = tempfile::tempdir()?;
    let http = reqwest::Client::new();
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    // Batches of the two binaries alternate.
    for r in 0..rounds {
        let d = dir.path().join(format!("r{r}"));
        ours.extend(batch(&http, &candidate, &d.join("c"), 83, n).await?);
        if let Some(b) = &baseline {
            theirs.extend(batch(&http, b, &d.join("b"), 84, n).await?);
        }
    }
    println!(
        "fresh gateways, {rounds} batch(es) of {n} started at once per binary, medians{}:",
        if thp_always() {
            " (transparent huge pages: always; gateways run with MIMALLOC_ALLOW_THP=0, as in a pod)"
        } else {
            ""
        }
    );
    let ours = medians(&ours);
    report(&format!("{}", candidate.display()), &ours);
    if let Some(b) = &baseline {
        let theirs = medians(&theirs);
        report(&format!("{} (baseline)", b.display()), &theirs);
        println!(
            "  this build ÷ baseline: start CPU {:.2}×, first long poll {:.2}×, first assignment \
             {:.2}×, RSS after it {:.2}×",
            ours.start_cpu / theirs.start_cpu,
            ours.first_poll_cpu / theirs.first_poll_cpu,
            ours.first_assignment_cpu / theirs.first_assignment_cpu,
            ours.rss_after_first / theirs.rss_after_first,
        );
    }
    // A fresh gateway's first assignment may cost more than a warm one's (a worker thread's
    // first heap segment, first-touched code), not many times more.
    anyhow::ensure!(
        ours.first_assignment_cpu <= 2.5 * ours.second_assignment_cpu.max(0.25),
        "a fresh gateway's first assignment cost {:.2} ms of CPU, {:.1}× a warm one's",
        ours.first_assignment_cpu,
        ours.first_assignment_cpu / ours.second_assignment_cpu
    );
    Ok(())
}
