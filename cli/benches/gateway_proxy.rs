//! Gateway overhead benchmark (a bench binary: `cargo bench -p floe --bench gateway_proxy`,
//! `-- --quick` in CI). In one run, against the same fast stub upstream (vLLM-shaped answers
//! with 1,000 prompt token ids, 64 sampled ids and logprobs, returned at once):
//!
//! - direct: the client calls the stub (the baseline);
//! - floe: through the `floe gateway` binary (a separate process: its CPU time is its own),
//!   which writes every call's capture record before answering; and again with
//!   `--capture-fsync` (fdatasync per record);
//! - rllm: through `rllm-model-gateway` from PyPI (sqlite trace store), when
//!   `scripts/rllm-gateway-setup.sh` has installed it (or `FLOE_BENCH_RLLM_PYTHON` names one).
//!
//! Prints p50/p99 latency, the latency added over direct, requests/s, requests per CPU-second
//! of the gateway process, and the gateway's RSS with 1,000 open sessions.
//!
//! Closed-loop clients (each sends its next request when the last one returns) find the
//! saturation point; real sessions call at harness pace. So an open-loop section follows the
//! RSS figure: 256 sessions, Poisson arrivals at fixed total rates (the same seeded schedule
//! for every target), each request sent at its scheduled time whether or not earlier ones
//! returned. `-- --open-only` runs just that table at 128 req/s (to repeat it, or to profile
//! the gateway: its pid is printed on stderr). The open loop also measures the plain gateway
//! serving a train job's sessions: their sink is a trainer (the stub answers its
//! `/v1/partial`), so each call posts a snapshot of its session before the reply.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use axum::routing::post;
use serde_json::{json, Value};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(0)
}

fn stub_answer() -> Vec<u8> {
    let sampled: Vec<u32> = (0..64).map(|i| 1000 + i).collect();
    let logprobs: Vec<Value> = sampled
        .iter()
        .map(|_| json!({"token": "x", "logprob": -0.25, "bytes": [120], "top_logprobs": []}))
        .collect();
    serde_json::to_vec(&json!({
        "id": "chatcmpl-stub", "object": "chat.completion", "created": 0, "model": "policy",
        "prompt_token_ids": (0..1000).collect::<Vec<u32>>(),
        "choices": [{"index": 0, "finish_reason": "stop", "token_ids": sampled, "logprobs": {"content": logprobs},
                     "message": {"role": "assistant", "content": "Here is the fix: the add function returned a - b instead of a + b."}}],
        "usage": {"prompt_tokens": 1000, "completion_tokens": 64, "total_tokens": 1064}
    }))
    .unwrap_or_default()
}

async fn start_stub() -> u16 {
    let body = axum::body::Bytes::from(stub_answer());
    let app = axum::Router::new()
        .route("/v1/partial", post(|| async { "{}" }))
        .route(
            "/v1/chat/completions",
            post(move || {
                let body = body.clone();
                async move { ([("content-type", "application/json")], body) }
            }),
        );
    let listener = match tokio::net::TcpListener::bind("127.0.0.1:0").await {
        Ok(l) => l,
        Err(e) => panic!("stub listen: {e}"),
    };
    let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
    tokio::spawn(async move { axum::serve(listener, app).await });
    port
}

struct Gateway {
    name: &'static str,
    child: Child,
    base: String,
    _dir: tempfile::TempDir,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Gateway {
    fn cpu_seconds(&self) -> f64 {
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap_or_default();
        let fields: Vec<&str> = stat
            .rsplit(')')
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .collect();
        let ticks = |i: usize| {
            fields
                .get(i)
                .and_then(|f| f.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        (ticks(11) + ticks(12)) / 100.0 // utime + stime, in clock ticks of 1/100 s
    }

    fn rss_mib(&self) -> f64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("VmRSS:"))
                    .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
            })
            .map_or(f64::NAN, |kib| kib / 1024.0)
    }

    /// A train job's session, as the operator assigns it (its sink the trainer at `trainer`)
    /// and a runner takes it: the chat completions URL and the key to call it with.
    async fn train_session(
        &self,
        http: &reqwest::Client,
        id: &str,
        trainer: &str,
    ) -> (String, String) {
        let assignment = json!({"session": id, "task": "bench", "group": "bench/t", "sample": 0,
                                "sink": {"kind": "trainer", "url": format!("{trainer}/v1/trajectories"),
                                         "snapshots": true}});
        let posted = http
            .post(format!("{}/floe/v1/assignments", self.base))
            .bearer_auth("bench")
            .json(&assignment)
            .send()
            .await;
        assert!(
            posted.is_ok_and(|r| r.status().is_success()),
            "assignment of {id}"
        );
        let taken: Value = match http
            .get(format!(
                "{}/floe/v1/assignments/next?session={id}&waitSeconds=5",
                self.base
            ))
            .bearer_auth("bench")
            .send()
            .await
        {
            Ok(r) => r.json().await.unwrap_or_default(),
            Err(e) => panic!("taking {id}: {e}"),
        };
        (
            format!("{}/v1/chat/completions", self.base),
            taken["token"].as_str().unwrap_or_default().to_string(),
        )
    }

    /// A new session; returns the chat completions URL and the key to call it with.
    async fn session(&self, http: &reqwest::Client, id: &str) -> (String, String) {
        if self.name.starts_with("floe") {
            let r: Value = match http
                .post(format!("{}/floe/v1/sessions", self.base))
                .bearer_auth("bench")
                .json(&json!({"session": id}))
                .send()
                .await
            {
                Ok(r) => r.json().await.unwrap_or_default(),
                Err(e) => panic!("floe session: {e}"),
            };
            (
                format!("{}/v1/chat/completions", self.base),
                r["token"].as_str().unwrap_or_default().to_string(),
            )
        } else {
            let _ = http
                .post(format!("{}/sessions", self.base))
                .json(&json!({"session_id": id}))
                .send()
                .await;
            (
                format!("{}/sessions/{id}/v1/chat/completions", self.base),
                "none".into(),
            )
        }
    }
}

async fn wait_up(http: &reqwest::Client, url: &str) -> bool {
    for _ in 0..300 {
        if http
            .get(url)
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

async fn start_floe(upstream: &str, http: &reqwest::Client, fsync: bool) -> Gateway {
    let dir = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => panic!("tempdir: {e}"),
    };
    let _ = std::fs::write(dir.path().join("token"), "bench");
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_floe"))
        .args([
            "gateway",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--upstream",
            upstream,
        ])
        .arg("--capture-dir")
        .arg(dir.path().join("captures"))
        .arg("--control-token-file")
        .arg(dir.path().join("token"))
        .args(fsync.then_some("--capture-fsync"))
        .env("FLOE_LOG", "warn")
        .stdout(Stdio::null())
        .spawn();
    let child = match child {
        Ok(c) => c,
        Err(e) => panic!("floe gateway: {e}"),
    };
    let base = format!("http://127.0.0.1:{port}");
    assert!(
        wait_up(http, &format!("{base}/healthz")).await,
        "floe gateway did not start"
    );
    let name = if fsync {
        "floe --capture-fsync"
    } else {
        "floe"
    };
    Gateway {
        name,
        child,
        base,
        _dir: dir,
    }
}

fn rllm_python() -> Option<String> {
    if let Ok(p) = std::env::var("FLOE_BENCH_RLLM_PYTHON") {
        return Some(p);
    }
    let cache = std::env::var("FLOE_CACHE")
        .unwrap_or_else(|_| format!("{}/.cache/floe", std::env::var("HOME").unwrap_or_default()));
    let venv = format!("{cache}/rllm-model-gateway-0.1.0-r1");
    std::path::Path::new(&format!("{venv}/.complete"))
        .exists()
        .then(|| format!("{venv}/bin/python"))
}

async fn start_rllm(python: &str, upstream: &str, http: &reqwest::Client) -> Option<Gateway> {
    let dir = tempfile::tempdir().ok()?;
    let port = free_port();
    let child = Command::new(python)
        .args([
            "-m",
            "rllm_model_gateway",
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--worker",
            upstream,
            "--store",
            "sqlite",
        ])
        .arg("--db-path")
        .arg(dir.path().join("traces.db"))
        .args(["--log-level", "warning"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let base = format!("http://127.0.0.1:{port}");
    let gw = Gateway {
        name: "rllm",
        child,
        base,
        _dir: dir,
    };
    wait_up(http, &format!("{}/health", gw.base))
        .await
        .then_some(gw)
}

struct Load {
    latencies: Vec<Duration>,
    elapsed: Duration,
}

impl Load {
    fn pct(&self, p: f64) -> f64 {
        let mut v = self.latencies.clone();
        v.sort();
        let i = ((v.len() as f64 - 1.0) * p).round() as usize;
        v.get(i).map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0)
    }
    fn rps(&self) -> f64 {
        self.latencies.len() as f64 / self.elapsed.as_secs_f64()
    }
}

/// `targets.len()` concurrent clients, each sending requests back to back for `duration`.
async fn load(http: &reqwest::Client, targets: Vec<(String, String)>, duration: Duration) -> Load {
    let body = json!({"model": "policy", "messages": [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "The test test_add fails. Fix calc.py."}], "max_tokens": 256});
    let start = Instant::now();
    let deadline = start + duration;
    let tasks: Vec<_> = targets
        .into_iter()
        .map(|(url, key)| {
            let http = http.clone();
            let body = body.clone();
            tokio::spawn(async move {
                let mut lat = Vec::new();
                while Instant::now() < deadline {
                    let t0 = Instant::now();
                    let ok = http
                        .post(&url)
                        .bearer_auth(&key)
                        .json(&body)
                        .send()
                        .await
                        .map(|r| r.status().is_success());
                    if let Ok(true) = ok {
                        lat.push(t0.elapsed());
                    }
                }
                lat
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await.unwrap_or_default());
    }
    Load {
        latencies,
        elapsed: start.elapsed(),
    }
}

/// Open loop: requests at Poisson arrival times of total `rate` per second for `duration`,
/// round-robin over `targets`; latency from each request's send.
async fn open_loop(
    http: &reqwest::Client,
    targets: &[(String, String)],
    rate: f64,
    duration: Duration,
) -> Load {
    let body = json!({"model": "policy", "messages": [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "The test test_add fails. Fix calc.py."}], "max_tokens": 256});
    let start = Instant::now() + Duration::from_millis(20);
    // xorshift64, fixed seed: every target sees the same schedule.
    let mut seed = 0x9E37_79B9_7F4A_7C15_u64;
    let mut at_s = 0.0;
    let mut handles = Vec::new();
    for i in 0.. {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let u = ((seed >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        at_s += -u.ln() / rate;
        if at_s >= duration.as_secs_f64() {
            break;
        }
        let at = start + Duration::from_secs_f64(at_s);
        let (url, key) = targets[i % targets.len()].clone();
        tokio::time::sleep_until(at.into()).await;
        // From the moment it is sent: the sender never waits for answers, so this is still
        // open loop, and tokio's 1 ms timer granularity stays out of the figures.
        let sent = Instant::now();
        let (http, body) = (http.clone(), body.clone());
        handles.push(tokio::spawn(async move {
            let ok = http.post(&url).bearer_auth(&key).json(&body).send().await;
            ok.is_ok_and(|r| r.status().is_success())
                .then(|| sent.elapsed())
        }));
    }
    let mut latencies = Vec::new();
    let mut failed = 0;
    for h in handles {
        match h.await {
            Ok(Some(l)) => latencies.push(l),
            _ => failed += 1,
        }
    }
    assert_eq!(failed, 0, "{failed} open-loop requests failed");
    Load {
        latencies,
        elapsed: duration,
    }
}

/// What a run measures: everything (`Full`), a short version of it for CI (`--quick`), or
/// only the open-loop table at 128 req/s (`--open-only`, for repeating it or profiling).
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Full,
    Quick,
    OpenOnly,
}

impl Mode {
    fn from_args() -> Self {
        let has = |flag: &str| std::env::args().any(|a| a == flag);
        if has("--open-only") {
            Mode::OpenOnly
        } else if has("--quick") {
            Mode::Quick
        } else {
            Mode::Full
        }
    }

    /// Closed-loop session counts.
    fn levels(self) -> &'static [usize] {
        match self {
            Mode::Full => &[1, 64, 256],
            Mode::Quick => &[1, 64],
            Mode::OpenOnly => &[],
        }
    }

    /// Idle sessions for the RSS figure (0: no RSS figure).
    fn idle_sessions(self) -> usize {
        match self {
            Mode::Full => 1000,
            Mode::Quick => 200,
            Mode::OpenOnly => 0,
        }
    }

    /// Open loop: sessions, offered rates, seconds per cell.
    fn open_loop(self) -> (usize, &'static [f64], u64) {
        match self {
            Mode::Full => (256, &[128.0, 512.0, 1024.0], 10),
            Mode::Quick => (64, &[64.0], 2),
            Mode::OpenOnly => (256, &[128.0], 10),
        }
    }
}

fn main() {
    let mode = Mode::from_args();
    let quick = mode == Mode::Quick;
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => panic!("runtime: {e}"),
    };
    runtime.block_on(async {
        let http = reqwest::Client::builder().pool_max_idle_per_host(2048).build().unwrap_or_default();
        let stub = format!("http://127.0.0.1:{}", start_stub().await);
        let floe = start_floe(&stub, &http, false).await;
        let floe_fsync = start_floe(&stub, &http, true).await;
        eprintln!("gateway pids: floe {}, floe --capture-fsync {}", floe.child.id(), floe_fsync.child.id());
        let rllm = match rllm_python() {
            Some(py) if mode == Mode::Full => start_rllm(&py, &stub, &http).await,
            _ => None,
        };
        let duration = Duration::from_secs(if quick { 1 } else { 4 });
        let levels = mode.levels();
        if !levels.is_empty() {
            println!("## gateway overhead against a stub upstream ({} s per cell)\n", duration.as_secs());
            println!("| sessions | target | p50 ms | p99 ms | added p50 ms | added p99 ms | req/s | req per gateway CPU-s | vs floe |");
            println!("|---|---|---|---|---|---|---|---|---|");
        }
        for &n in levels {
            let direct = load(&http, vec![(format!("{stub}/v1/chat/completions"), "x".into()); n], duration).await;
            println!("| {n} | direct | {:.2} | {:.2} | – | – | {:.0} | – | – |", direct.pct(0.5), direct.pct(0.99), direct.rps());
            let mut floe_per_cpu = f64::NAN;
            for gw in [&floe, &floe_fsync].into_iter().chain(rllm.as_ref()) {
                let mut targets = Vec::new();
                for i in 0..n {
                    targets.push(gw.session(&http, &format!("bench-{n}-{i}")).await);
                }
                let cpu0 = gw.cpu_seconds();
                let run = load(&http, targets, duration).await;
                let cpu = (gw.cpu_seconds() - cpu0).max(0.01);
                let per_cpu = run.latencies.len() as f64 / cpu;
                if gw.name == "floe" {
                    floe_per_cpu = per_cpu;
                }
                println!(
                    "| {n} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.0} | {:.0} | {} |",
                    gw.name, run.pct(0.5), run.pct(0.99), run.pct(0.5) - direct.pct(0.5), run.pct(0.99) - direct.pct(0.99),
                    run.rps(), per_cpu,
                    if gw.name == "floe" { "1.0x".to_string() } else { format!("floe does {:.1}x its req per CPU-s", floe_per_cpu / per_cpu) }
                );
            }
        }
        let sessions = mode.idle_sessions();
        if sessions > 0 {
            println!("\n## RSS with {sessions} open sessions\n");
            for gw in std::iter::once(&floe).chain(rllm.as_ref()) {
                for i in 0..sessions {
                    gw.session(&http, &format!("idle-{i}")).await;
                }
                println!("- {}: {:.1} MiB", gw.name, gw.rss_mib());
            }
            if rllm.is_none() && !quick {
                println!("\n(rllm-model-gateway not installed: run scripts/rllm-gateway-setup.sh to include it)");
            }
        }
        let (n, rates, secs) = mode.open_loop();
        println!("\n## open loop: {n} sessions, Poisson arrivals, {secs} s per cell\n");
        println!("| req/s offered | target | p50 ms | p99 ms | added p50 ms | added p99 ms | gateway CPU % |");
        println!("|---|---|---|---|---|---|---|");
        let duration = Duration::from_secs(secs);
        let direct_targets = vec![(format!("{stub}/v1/chat/completions"), "x".to_string()); n];
        let mut gateways = Vec::new();
        for gw in [&floe, &floe_fsync] {
            let mut targets = Vec::new();
            for i in 0..n {
                targets.push(gw.session(&http, &format!("open-{i}")).await);
            }
            gateways.push((gw.name, gw, targets));
        }
        let mut train = Vec::new();
        for i in 0..n {
            train.push(floe.train_session(&http, &format!("train-{i}"), &stub).await);
        }
        gateways.push(("floe, train job (a snapshot each call)", &floe, train));
        for &rate in rates {
            let direct = open_loop(&http, &direct_targets, rate, duration).await;
            println!("| {rate:.0} | direct | {:.2} | {:.2} | – | – | – |", direct.pct(0.5), direct.pct(0.99));
            for (name, gw, targets) in &gateways {
                let cpu0 = gw.cpu_seconds();
                let run = open_loop(&http, targets, rate, duration).await;
                let cpu = gw.cpu_seconds() - cpu0;
                println!(
                    "| {rate:.0} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.0} |",
                    name, run.pct(0.5), run.pct(0.99), run.pct(0.5) - direct.pct(0.5),
                    run.pct(0.99) - direct.pct(0.99), 100.0 * cpu / duration.as_secs_f64()
                );
            }
        }
    });
}
