//! Trajectory builder benchmark (a bench binary: `cargo bench -p floe-gateway --bench
//! trajectories`, or `-- --quick` for CI). Real-shaped sessions: a coding agent with a large
//! system prompt, tool calls whose results are sizeable, sub-agents and background calls.
//!
//! Prints, in one run: samples and tokens per builder with the per_request baseline ratio for
//! sessions of 10, 30 and 100 turns, the bytes a train job's session posts in snapshots (one
//! after each call) whole against as deltas, what building each snapshot from the capture costs
//! read whole against read as it grows, the build time of a 10,000-completion session for
//! both builders, how prefix merging's build grows with an agent's worst case (many samples
//! from one point, every continuation refused), plus peak RSS.
//!
//! The builder's cost on the other shapes an agent can give its calls is pinned by counting
//! tests (`prefix_merging::tests`: tokens compared per prompt token), not timed here.

use std::time::Instant;

use floe_gateway::capture::{
    read_session, Api, CaptureLog, CaptureTail, CompletionRecord, Durability,
};
use std::collections::hash_map::RandomState;

use floe_gateway::trajectory::snapshot_delta;
use floe_gateway::trajectory::{build_traces, BuildOptions, Builder, ReconstructionStats};

const EOT: u32 = 2;

/// Deterministic xorshift, so every run measures the same sessions.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() as usize) % (hi - lo)
    }
    fn tokens(&mut self, n: usize) -> Vec<u32> {
        (0..n).map(|_| 3 + (self.next() % 150_000) as u32).collect()
    }
}

struct Agent {
    context: Vec<u32>,
}

/// One session: `main_turns` turns of the main agent; a sub-agent of 5 turns every 10 main
/// turns; one background (title) call. Sizes in tokens follow real harness traffic: system
/// prompt `system`, responses 40-400, tool results 50-1500.
fn session(rng: &mut Rng, main_turns: usize, system: usize) -> Vec<CompletionRecord> {
    let sys = rng.tokens(system);
    let mut records = Vec::new();
    let call = |rng: &mut Rng, agent: &mut Agent, records: &mut Vec<CompletionRecord>| {
        let n = rng.range(40, 400);
        let mut response = rng.tokens(n);
        response.push(EOT);
        let prompt = agent.context.clone();
        let seq = records.len() as u64;
        agent.context.extend(&response);
        agent.context.push(198);
        let tool = rng.range(50, 1500);
        agent.context.extend(rng.tokens(tool));
        records.push(CompletionRecord {
            api: Api::Anthropic,
            logprobs: Some(vec![-0.5; response.len()]),
            finish_reason: Some("tool_calls".into()),
            ..CompletionRecord::from_tokens(seq, prompt, response)
        });
    };
    let mut main = Agent {
        context: [sys.clone(), rng.tokens(200)].concat(),
    };
    let mut title = Agent {
        context: rng.tokens(300),
    };
    call(rng, &mut title, &mut records);
    for turn in 0..main_turns {
        call(rng, &mut main, &mut records);
        if turn % 10 == 5 {
            let mut sub = Agent {
                context: [sys.clone(), rng.tokens(150)].concat(),
            };
            for _ in 0..5 {
                call(rng, &mut sub, &mut records);
            }
        }
    }
    records
}

/// Many agents sharing one system prompt, interleaved: `chains` × `turns` completions.
fn wide_session(
    rng: &mut Rng,
    chains: usize,
    turns: usize,
    system: usize,
) -> Vec<CompletionRecord> {
    let sys = rng.tokens(system);
    let mut agents: Vec<Vec<u32>> = (0..chains)
        .map(|_| [sys.clone(), rng.tokens(100)].concat())
        .collect();
    let mut records = Vec::with_capacity(chains * turns);
    for _ in 0..turns {
        for agent in agents.iter_mut() {
            let n = rng.range(20, 120);
            let mut response = rng.tokens(n);
            response.push(EOT);
            let seq = records.len() as u64;
            records.push(CompletionRecord {
                logprobs: Some(vec![-0.5; response.len()]),
                ..CompletionRecord::from_tokens(seq, agent.clone(), response.clone())
            });
            agent.extend(&response);
            let n = rng.range(20, 200);
            agent.extend(rng.tokens(n));
        }
    }
    records
}

/// An agent's worst case for prefix merging: `n` samples from one point, then `n` calls each
/// going on from one of them without log-probs: every sample's last prompt begins the call's
/// prompt, so each is a candidate, and none may be continued (the scan weighed each one on
/// every call). Each call starts a chain of its own and closes the candidate tried first.
fn refused_forks(n: u32) -> Vec<CompletionRecord> {
    let point = vec![7u32; 64];
    let mut records = Vec::new();
    for i in 0..n {
        let seq = u64::from(i);
        records.push(CompletionRecord {
            logprobs: Some(vec![-0.5, -0.5]),
            ..CompletionRecord::from_tokens(seq, point.clone(), vec![1000 + i, EOT])
        });
    }
    for i in 0..n {
        let prompt = [&point[..], &[1000 + i, EOT, 5]].concat();
        records.push(CompletionRecord::from_tokens(
            u64::from(n + i),
            prompt,
            vec![6, EOT],
        ));
    }
    records
}

fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kib| kib / 1024.0)
}

fn stats(records: &[CompletionRecord], builder: Builder) -> ReconstructionStats {
    build_traces(
        records,
        &BuildOptions {
            builder,
            ..Default::default()
        },
    )
    .1
}

fn time_build(records: &[CompletionRecord], builder: Builder, repeats: usize) -> f64 {
    let mut best = f64::INFINITY;
    for _ in 0..repeats {
        let t0 = Instant::now();
        let (traces, _) = build_traces(
            records,
            &BuildOptions {
                builder,
                ..Default::default()
            },
        );
        std::hint::black_box(traces);
        best = best.min(t0.elapsed().as_secs_f64() * 1000.0);
    }
    best
}

/// Bytes of the snapshots posted after each call of `records` (their traces, JSON), whole and
/// as deltas on the one before (the first whole), and the milliseconds spent making each kind.
fn snapshot_bytes(records: &[CompletionRecord], builder: Builder) -> [(usize, f64); 2] {
    let key = RandomState::new();
    let options = BuildOptions {
        builder,
        ..Default::default()
    };
    let (mut whole, mut delta) = ((0, 0.0), (0, 0.0));
    let mut held: Option<Vec<snapshot_delta::TraceMark>> = None;
    for calls in 1..=records.len() {
        let (traces, _) = build_traces(&records[..calls], &options);
        let t0 = Instant::now();
        whole.0 += serde_json::to_vec(&traces).map_or(0, |b| b.len());
        whole.1 += t0.elapsed().as_secs_f64() * 1000.0;
        let t0 = Instant::now();
        let (bytes, marks) = match &held {
            None => (
                serde_json::to_vec(&traces).map_or(0, |b| b.len()),
                snapshot_delta::marks(&traces, &key),
            ),
            Some(base) => {
                let (deltas, marks) = snapshot_delta::plan(base, &traces, &key);
                (serde_json::to_vec(&deltas).map_or(0, |b| b.len()), marks)
            }
        };
        delta.0 += bytes;
        delta.1 += t0.elapsed().as_secs_f64() * 1000.0;
        held = Some(marks);
    }
    [whole, delta]
}

/// A record as the gateway captures it: the harness's request and the one sent upstream each
/// carry the conversation (about 4 bytes of text a token), the answer its text.
fn with_bodies(record: &CompletionRecord) -> CompletionRecord {
    let conversation = "x".repeat(4 * record.prompt_token_ids.len());
    let answer = "y".repeat(4 * record.completion_token_ids.len());
    CompletionRecord {
        request: serde_json::json!({"messages": [{"role": "user", "content": conversation}]}),
        normalized_request: serde_json::json!({"max_tokens": 4096, "messages": [{"role": "user", "content": conversation}]}),
        response: serde_json::json!({"content": [{"type": "text", "text": answer}]}),
        ..record.clone()
    }
}

/// Milliseconds spent building a snapshot after each call of `records` from its capture (as
/// the gateway does), the file read whole each time, and read as it grows; the file's size.
fn snapshot_builds(records: &[CompletionRecord]) -> (f64, f64, u64) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut log = CaptureLog::open(dir.path(), Durability::Write).expect("a capture");
    let mut tail = CaptureTail::default();
    let options = BuildOptions::default();
    let (mut whole, mut grown) = (0.0, 0.0);
    for record in records {
        log.append(&with_bodies(record)).expect("a capture line");
        let t0 = Instant::now();
        let capture = read_session(dir.path()).expect("the capture");
        std::hint::black_box(build_traces(&capture.records, &options));
        whole += t0.elapsed().as_secs_f64() * 1000.0;
        let t0 = Instant::now();
        tail.read_more(dir.path()).expect("the capture's new lines");
        std::hint::black_box(build_traces(tail.records(), &options));
        grown += t0.elapsed().as_secs_f64() * 1000.0;
    }
    let size = std::fs::metadata(dir.path().join(floe_gateway::capture::CAPTURE_FILE))
        .map_or(0, |m| m.len());
    (whole, grown, size)
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let mut rng = Rng(0x5eed_f10e);
    println!("## samples and tokens per session (system prompt 6,000 tokens)\n");
    println!("| turns | calls | per_request samples | prefix_merging samples | sample ratio | per_request tokens | prefix_merging tokens | token ratio | breaks | trainable tokens equal |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for turns in [10, 30, 100] {
        let records = session(&mut rng, turns, 6000);
        let a = stats(&records, Builder::PerRequest);
        let b = stats(&records, Builder::PrefixMerging);
        println!(
            "| {turns} | {} | {} | {} | {:.1}x | {} | {} | {:.1}x | {} | {} |",
            records.len(),
            a.traces,
            b.traces,
            a.traces as f64 / b.traces as f64,
            a.total_tokens,
            b.total_tokens,
            a.total_tokens as f64 / b.total_tokens as f64,
            b.breaks,
            a.trainable_tokens == b.trainable_tokens,
        );
        assert_eq!(a.trainable_tokens, b.trainable_tokens, "silent drop");
    }
    let turns = if quick { 10 } else { 30 };
    let records = session(&mut rng, turns, 6000);
    println!("\n## snapshots: what a train job's session of {turns} turns ({} calls) posts, one after each call\n", records.len());
    println!("| builder | whole (MiB) | as deltas (MiB) | whole / deltas | final trajectory (MiB) | making them whole (ms) | as deltas (ms) |");
    println!("|---|---|---|---|---|---|---|");
    for builder in [Builder::PerRequest, Builder::PrefixMerging] {
        let [whole, delta] = snapshot_bytes(&records, builder);
        let (last, _) = build_traces(
            &records,
            &BuildOptions {
                builder,
                ..Default::default()
            },
        );
        let last = serde_json::to_vec(&last).map_or(0, |b| b.len());
        let mib = |b: usize| b as f64 / (1 << 20) as f64;
        println!(
            "| {builder:?} | {:.1} | {:.1} | {:.1}x | {:.1} | {:.0} | {:.0} |",
            mib(whole.0),
            mib(delta.0),
            whole.0 as f64 / delta.0 as f64,
            mib(last),
            whole.1,
            delta.1
        );
        assert!(delta.0 < whole.0, "deltas send less");
    }
    let (whole, grown, size) = snapshot_builds(&records);
    println!("\nBuilding those snapshots from the capture ({:.1} MiB at the end, its bodies included), all {} calls: the file read whole each time {whole:.0} ms, read as it grows {grown:.0} ms ({:.1}x)", size as f64 / (1 << 20) as f64, records.len(), whole / grown);
    assert!(grown < whole, "reading only the new lines costs less");
    let (chains, turns) = if quick { (100, 20) } else { (400, 25) };
    let records = wide_session(&mut rng, chains, turns, 2000);
    let rss_before = peak_rss_mib();
    let repeats = if quick { 2 } else { 5 };
    let per_request = time_build(&records, Builder::PerRequest, repeats);
    let merged = time_build(&records, Builder::PrefixMerging, repeats);
    let s = stats(&records, Builder::PrefixMerging);
    println!("\n## build time, {} completions ({chains} interleaved agents × {turns} turns, shared 2,000-token system prompt)\n", records.len());
    println!("| builder | best of {repeats} (ms) | vs per_request | samples |");
    println!("|---|---|---|---|");
    println!(
        "| per_request | {per_request:.1} | 1.0x | {} |",
        records.len()
    );
    println!(
        "| prefix_merging | {merged:.1} | {:.2}x | {} |",
        merged / per_request,
        s.traces
    );
    let n = if quick { 1000 } else { 4000 };
    let (small, large) = (refused_forks(n), refused_forks(4 * n));
    let small_ms = time_build(&small, Builder::PrefixMerging, repeats);
    let large_ms = time_build(&large, Builder::PrefixMerging, repeats);
    println!(
        "\n## an agent's worst case: n samples from one point, each continued without log-probs\n"
    );
    println!("| n | prefix_merging, best of {repeats} (ms) |");
    println!("|---|---|");
    println!("| {} | {small_ms:.1} |", small.len() / 2);
    println!("| {} | {large_ms:.1} |", large.len() / 2);
    println!(
        "\n4n against n: {:.1}x (a build linear in its calls: 4x; quadratic: 16x)",
        large_ms / small_ms
    );
    println!(
        "\npeak RSS {:.0} MiB (input records alone: {:.0} MiB at start of build)",
        peak_rss_mib(),
        rss_before
    );
}
