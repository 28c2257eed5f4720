//! What a local run leaves behind: `summary.json` (sessions by outcome, reward and pass rate per
//! task, tokens, acceptance, timings) and the dataset / GRPO trajectory files assembled from the
//! per-session files the gateway's dataset sink wrote. Aggregation is pure.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use floe_sandbox::summary::Summary;
use serde::Serialize;

/// One finished (or never started) session as `floe run` saw it.
#[derive(Clone, Debug)]
pub struct SessionResult {
    pub task: String,
    /// The runner's summary; `None` when the session never ran (interrupted).
    pub summary: Option<Summary>,
    /// Wall time of the whole sandbox session (prepare → shipped).
    pub wall_seconds: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Counts {
    pub total: u64,
    pub completed: u64,
    pub agent_failed: u64,
    pub agent_timeout: u64,
    pub infra_error: u64,
    pub evaluator_timeout: u64,
    /// Cancelled (Ctrl-C) or never started.
    pub not_finished: u64,
    /// Attempts run again after an infrastructure failure (each has its own `-r<N>` session).
    pub retries: u64,
    /// Scored sessions that failed without their evaluator's verdict, by reason
    /// (`evaluator_timeout`, `no_verdict`, `evaluator_straggler`, …): what the code under
    /// test did. One reason on every session of a task usually means a broken evaluator.
    pub failures: BTreeMap<String, u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RewardStats {
    /// Sessions with a reward (infrastructure failures have none).
    pub scored: u64,
    pub mean: Option<f64>,
    pub pass_rate: Option<f64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Tokens {
    pub completions: u64,
    pub sampled: u64,
    pub trainable: u64,
    /// Calls whose harness left before the answer came: trained in no trajectory.
    #[serde(skip_serializing_if = "is_zero")]
    pub abandoned_calls: u64,
    /// Calls of a request class the job does not train on: trained in no trajectory.
    #[serde(skip_serializing_if = "is_zero")]
    pub excluded_calls: u64,
    /// Calls by what the harness said each is for (Claude Code's request class), over the
    /// sessions that said: how much of the run is compaction, subagents, side calls.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub calls_by_class: BTreeMap<String, u64>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Timings {
    pub wall_seconds: f64,
    pub sessions_per_minute: f64,
    pub agent_seconds_mean: f64,
    pub evaluator_seconds_mean: f64,
    /// Per session: its wall time minus harness (incl. model) and evaluator time — what floe
    /// itself costs (prepare, snapshot, evaluation copy, trajectory build, shipping).
    pub overhead_seconds_mean: f64,
    pub overhead_seconds_max: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Dataset {
    /// `dataset.jsonl` (sft) or `trajectories.jsonl` (train).
    pub file: String,
    pub accepted: u64,
    pub rejected: u64,
    pub acceptance_rate: Option<f64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunSummary {
    pub job: String,
    /// `sft` or `train`.
    pub mode: String,
    /// What confined the agents: `bubblewrap 0.8.0`, or `none (--no-sandbox: …)`.
    pub sandbox: String,
    pub interrupted: bool,
    /// Why the run stopped before its sessions were done: the first sessions all failed by
    /// infrastructure for one cause no retry fixes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped_early: Option<String>,
    pub sessions: Counts,
    pub reward: RewardStats,
    pub tasks: BTreeMap<String, RewardStats>,
    pub tokens: Tokens,
    pub dataset: Dataset,
    pub timings: Timings,
    /// Failed model-server attempts of every attempt run, by kind: `retried` by the gateway,
    /// and `failed` (the call failed; its session was an infrastructure error).
    pub upstream_errors: floe_gateway::capture::upstream_errors::UpstreamErrors,
    /// Train mode: the trainer's steps, policy version, drops, final model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub training: Option<serde_json::Value>,
}

/// The run's output file from its trajectories (`dataset.jsonl` for sft, `trajectories.jsonl`
/// for a train job's `--collect-only`), and what went into it.
pub fn dataset(
    trajectories: &Path,
    out: &Path,
    sft: bool,
    counted: &BTreeSet<String>,
) -> Result<Dataset, String> {
    let file = if sft {
        "dataset.jsonl"
    } else {
        "trajectories.jsonl"
    };
    let (accepted, rejected) =
        assemble(trajectories, &out.join(file), counted).map_err(|e| format!("{file}: {e}"))?;
    Ok(Dataset {
        file: file.into(),
        accepted,
        rejected,
        acceptance_rate: (accepted + rejected > 0)
            .then(|| accepted as f64 / (accepted + rejected) as f64),
    })
}

fn rewards<'a>(results: impl Iterator<Item = &'a SessionResult>) -> RewardStats {
    let scored: Vec<(f64, bool)> = results
        .filter_map(|r| r.summary.as_ref())
        .filter_map(|s| s.reward.map(|reward| (reward, s.passed.unwrap_or(false))))
        .collect();
    let n = scored.len() as f64;
    RewardStats {
        scored: scored.len() as u64,
        mean: (!scored.is_empty()).then(|| scored.iter().map(|(r, _)| r).sum::<f64>() / n),
        pass_rate: (!scored.is_empty())
            .then(|| scored.iter().filter(|(_, p)| *p).count() as f64 / n),
    }
}

pub fn summarize(
    job: &str,
    mode: &str,
    results: &[SessionResult],
    wall_seconds: f64,
    interrupted: bool,
) -> RunSummary {
    let mut counts = Counts {
        total: results.len() as u64,
        ..Default::default()
    };
    let mut tokens = Tokens::default();
    let (mut agent, mut evaluator, mut overheads) = (0.0, 0.0, Vec::new());
    for r in results {
        let Some(s) = &r.summary else {
            counts.not_finished += 1;
            continue;
        };
        match s.status.as_str() {
            "completed" => counts.completed += 1,
            "agent_failed" => counts.agent_failed += 1,
            "agent_timeout" => counts.agent_timeout += 1,
            "evaluator_timeout" => counts.evaluator_timeout += 1,
            _ => counts.infra_error += 1,
        }
        if let Some(reason) = &s.failure {
            *counts.failures.entry(reason.clone()).or_default() += 1;
        }
        tokens.completions += s.completions;
        tokens.sampled += s.sampled_tokens;
        tokens.trainable += s.trainable_tokens;
        tokens.abandoned_calls += s.abandoned_calls;
        tokens.excluded_calls += s.excluded_calls;
        for (class, n) in &s.calls_by_class {
            floe_gateway::trajectory::count_calls_of_class(&mut tokens.calls_by_class, class, *n);
        }
        agent += s.agent_seconds;
        evaluator += s.evaluator_seconds;
        overheads.push((r.wall_seconds - s.agent_seconds - s.evaluator_seconds).max(0.0));
    }
    let ran = overheads.len().max(1) as f64;
    let mut tasks: BTreeMap<String, Vec<&SessionResult>> = BTreeMap::new();
    for r in results {
        tasks.entry(r.task.clone()).or_default().push(r);
    }
    RunSummary {
        job: job.to_string(),
        mode: mode.to_string(),
        sandbox: String::new(),
        interrupted,
        stopped_early: None,
        sessions: counts,
        reward: rewards(results.iter()),
        tasks: tasks
            .into_iter()
            .map(|(task, rs)| (task, rewards(rs.into_iter())))
            .collect(),
        tokens,
        dataset: Dataset::default(),
        upstream_errors: Default::default(),
        timings: Timings {
            wall_seconds,
            sessions_per_minute: if wall_seconds > 0.0 {
                overheads.len() as f64 * 60.0 / wall_seconds
            } else {
                0.0
            },
            agent_seconds_mean: agent / ran,
            evaluator_seconds_mean: evaluator / ran,
            overhead_seconds_mean: overheads.iter().sum::<f64>() / ran,
            overhead_seconds_max: overheads.iter().copied().fold(0.0, f64::max),
        },
        training: None,
    }
}

/// Join the per-session files under `dir/accepted/` into one JSONL file, ordered by GRPO group
/// then sample (each group's samples contiguous). Returns (accepted, rejected) counts.
///
/// One record per sample: an attempt the run retried (its trajectory not shipped in time, its
/// session then an infrastructure failure) may still ship later, beside the retry's. The
/// record of the attempt the run `counted` is kept, else the first by session id. Rejected
/// records are counted for counted attempts only (a retried attempt's untrainable one is no
/// session of the dataset's).
pub fn assemble(
    dir: &Path,
    out_file: &Path,
    counted: &BTreeSet<String>,
) -> std::io::Result<(u64, u64)> {
    let files = |sub: &str| -> std::io::Result<Vec<std::path::PathBuf>> {
        let path = dir.join(sub);
        if !path.exists() {
            return Ok(vec![]);
        }
        let mut found = Vec::new();
        for entry in std::fs::read_dir(&path)? {
            let p = entry?.path();
            if p.extension().and_then(|e| e.to_str()) == Some("json") {
                found.push(p);
            }
        }
        found.sort();
        Ok(found)
    };
    let session_of = |p: &Path| {
        p.file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_string()
    };
    /// What the dataset is ordered by; the rest of a trajectory is skipped, not kept.
    #[derive(serde::Deserialize)]
    struct Key {
        group: String,
        sample: u64,
    }
    // Keys first, then the files streamed in that order: one trajectory in memory at a time
    // (all of them at once would be the whole dataset's size).
    let mut keyed: BTreeMap<(String, u64), std::path::PathBuf> = BTreeMap::new();
    for p in files("accepted")? {
        let key: Key = serde_json::from_slice(&std::fs::read(&p)?)
            .map_err(|e| std::io::Error::other(format!("{}: {e}", p.display())))?;
        match keyed.entry((key.group, key.sample)) {
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert(p);
            }
            std::collections::btree_map::Entry::Occupied(mut o) => {
                if counted.contains(&session_of(&p)) && !counted.contains(&session_of(o.get())) {
                    o.insert(p);
                }
            }
        }
    }
    let ordered: Vec<_> = keyed.into_values().collect();
    let accepted = floe_gateway::ship::write_jsonl_durably(out_file, &ordered)?;
    let rejected = files("rejected")?
        .iter()
        .filter(|p| counted.contains(&session_of(p)))
        .count() as u64;
    Ok((accepted, rejected))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(task: &str, status: &str, reward: Option<f64>, passed: bool) -> SessionResult {
        SessionResult {
            task: task.into(),
            summary: Some(Summary {
                status: status.into(),
                reward,
                passed: reward.map(|_| passed),
                agent_seconds: 10.0,
                evaluator_seconds: 1.0,
                completions: 3,
                sampled_tokens: 100,
                trainable_tokens: if reward.is_some() { 100 } else { 0 },
                ..Default::default()
            }),
            wall_seconds: 11.5,
        }
    }

    #[test]
    fn outcomes_rewards_per_task_and_overhead() {
        let results = vec![
            result("a", "completed", Some(1.0), true),
            result("a", "agent_failed", Some(0.0), false),
            result("b", "infra_error", None, false),
            result("b", "agent_timeout", Some(0.0), false),
            SessionResult {
                task: "b".into(),
                summary: None,
                wall_seconds: 0.0,
            },
        ];
        let s = summarize("j", "sft", &results, 60.0, true);
        assert_eq!(
            s.sessions,
            Counts {
                total: 5,
                completed: 1,
                agent_failed: 1,
                agent_timeout: 1,
                infra_error: 1,
                evaluator_timeout: 0,
                not_finished: 1,
                retries: 0,
                failures: BTreeMap::new(),
            }
        );
        // The infrastructure failure has no reward and does not count as 0.
        assert_eq!(s.reward.scored, 3);
        assert_eq!(s.reward.mean, Some(1.0 / 3.0));
        assert_eq!(s.tasks["a"].pass_rate, Some(0.5));
        assert_eq!(s.tasks["b"].mean, Some(0.0));
        assert_eq!(s.tokens.sampled, 400);
        assert_eq!(s.tokens.trainable, 300);
        assert!((s.timings.overhead_seconds_mean - 0.5).abs() < 1e-9);
        assert!((s.timings.sessions_per_minute - 4.0).abs() < 1e-9);
    }

    #[test]
    fn calls_left_out_of_training_are_counted_and_said_only_when_there_are_some() {
        let mut left = result("a", "completed", Some(1.0), true);
        if let Some(s) = left.summary.as_mut() {
            s.abandoned_calls = 2;
            s.excluded_calls = 1;
        }
        let with = summarize("j", "sft", &[left.clone(), left], 60.0, true);
        assert_eq!(with.tokens.abandoned_calls, 4);
        assert_eq!(with.tokens.excluded_calls, 2);
        let json = serde_json::to_value(&with.tokens).unwrap_or_default();
        assert_eq!(
            (
                json["abandonedCalls"].as_u64(),
                json["excludedCalls"].as_u64()
            ),
            (Some(4), Some(2))
        );
        assert!(super::super::progress::table(&with).contains(
            "in 6 calls · 4 abandoned by the harness, not trained · 2 of an excluded class, not trained\n"
        ));
        let without = summarize(
            "j",
            "sft",
            &[result("a", "completed", Some(1.0), true)],
            60.0,
            true,
        );
        let json = serde_json::to_value(&without.tokens).unwrap_or_default();
        assert!(json.get("abandonedCalls").is_none(), "{json}");
        assert!(json.get("excludedCalls").is_none(), "{json}");
        assert!(super::super::progress::table(&without).contains("in 3 calls\n"));
    }

    #[test]
    fn calls_are_summed_by_the_class_the_harness_gave_them() {
        let classes = |pairs: &[(&str, u64)]| {
            let mut r = result("a", "completed", Some(1.0), true);
            if let Some(s) = r.summary.as_mut() {
                s.calls_by_class = pairs.iter().map(|(c, n)| (c.to_string(), *n)).collect();
            }
            r
        };
        let run = [
            classes(&[("main", 2), ("compaction", 1)]),
            classes(&[("main", 3)]),
            result("b", "completed", Some(0.0), true),
        ];
        // Each session's own classes are within bounds; their sum is too.
        let forged: Vec<SessionResult> = (0..4)
            .map(|i| {
                classes(&[
                    (format!("x{i}a").as_str(), 1),
                    (format!("x{i}b").as_str(), 1),
                ])
            })
            .collect();
        let summed = summarize("j", "sft", &forged, 60.0, true)
            .tokens
            .calls_by_class;
        assert_eq!(summed.len(), 5, "{summed:?}");
        assert_eq!(summed["other"], 4);
        let summary = summarize("j", "sft", &run, 60.0, true);
        let json = serde_json::to_value(&summary.tokens).unwrap_or_default();
        assert_eq!(
            json["callsByClass"],
            serde_json::json!({"compaction": 1, "main": 5})
        );
        assert!(
            super::super::progress::table(&summary).contains(" · by class: 1 compaction, 5 main\n")
        );
    }

    #[test]
    fn assembled_files_keep_groups_together() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        std::fs::create_dir_all(dir.path().join("accepted"))?;
        std::fs::create_dir_all(dir.path().join("rejected"))?;
        for (name, group, sample) in [("x", "g2", 0), ("y", "g1", 1), ("z", "g1", 0)] {
            let t = serde_json::json!({"session": name, "group": group, "sample": sample});
            std::fs::write(
                dir.path().join(format!("accepted/{name}.json")),
                t.to_string(),
            )?;
        }
        std::fs::write(dir.path().join("rejected/w.json"), "{}")?;
        // A retried attempt's records: one accepted late beside its retry's (`z`), one
        // rejected as the infrastructure failure that was retried.
        let late = serde_json::json!({"session": "late", "group": "g1", "sample": 0});
        std::fs::write(dir.path().join("accepted/late.json"), late.to_string())?;
        std::fs::write(dir.path().join("rejected/w-r0.json"), "{}")?;
        let counted: BTreeSet<String> = ["w", "x", "y", "z"].map(String::from).into();
        let out = dir.path().join("out.jsonl");
        assert_eq!(assemble(dir.path(), &out, &counted)?, (3, 1));
        let sessions: Vec<String> = std::fs::read_to_string(&out)?
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).map(|v| v["session"].to_string()))
            .collect::<Result<_, _>>()?;
        assert_eq!(sessions, ["\"z\"", "\"y\"", "\"x\""]);
        Ok(())
    }
}
