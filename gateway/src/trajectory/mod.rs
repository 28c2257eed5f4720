//! Sans-IO trajectory building: a session's [`CompletionRecord`]s → one [`Trajectory`].
//!
//! - [`per_request`]: one trace per model call.
//! - [`prefix_merging`]: calls whose prompt extends the previous call's prompt + sampled tokens
//!   become one trace (interstitial tokens masked out), which is where most trainer work is saved.
//!
//! Then [`outcome`] applies the session's outcome (reward, timeout, infrastructure error).
//! The JSON form is the wire format the trainer ingests (`docs/trajectory-format.md`).

pub mod outcome;
pub mod per_request;
pub mod prefix_merging;
pub mod snapshot_delta;
mod types;

pub use outcome::{apply_outcome, SessionOutcome};
pub use types::*;

use crate::capture::CompletionRecord;

/// How to build, beyond the builder itself.
#[derive(Clone, Debug, Default)]
pub struct BuildOptions {
    pub builder: Builder,
    /// End-of-turn token id; inferred from the data when `None` (see [`infer_end_of_turn`]).
    pub end_of_turn: Option<u32>,
    /// Longest trace (prompt + response tokens) a merge may produce; `None` = unbounded.
    pub max_length: Option<usize>,
    /// Request classes whose calls are left out of the traces (a job's
    /// `trajectory.excludeRequestClasses`): the capture keeps them, `stats.excluded_calls`
    /// counts them, nobody trains on them.
    pub exclude_classes: Vec<String>,
    /// The trajectory is for imitation (an sft job's dataset): a call a student should not
    /// copy trains no token ([`leave_out_of_imitation`]).
    pub imitation: bool,
}

impl BuildOptions {
    /// Whether a call is left out for its request class.
    fn excludes(&self, record: &CompletionRecord) -> bool {
        record
            .request_class
            .as_ref()
            .is_some_and(|class| self.exclude_classes.contains(class))
    }
}

/// Bytes a captured token takes in a shipped trajectory at most: a sampled token's id, mask
/// and log-prob at their longest, with each trace's own fields (a prompt token costs less). A
/// session's token budget times this bounds what it ships.
pub const WORST_BYTES_PER_TOKEN: usize = 40;

/// Build the traces of a session's completions (any order) and their statistics.
pub fn build_traces(
    records: &[CompletionRecord],
    options: &BuildOptions,
) -> (Vec<Trace>, ReconstructionStats) {
    // A reply nobody saw is left out: its tokens were not the agent's act, and its session's
    // outcome says nothing of them (the capture keeps it).
    let (answered, abandoned): (Vec<&CompletionRecord>, Vec<&CompletionRecord>) =
        records.iter().partition(|r| !r.abandoned);
    // Calls of a class the job does not train on are left out the same way (the capture
    // keeps them too); whatever context they produced reaches later calls as prompt.
    let (mut ordered, excluded): (Vec<&CompletionRecord>, Vec<&CompletionRecord>) =
        answered.into_iter().partition(|r| !options.excludes(r));
    ordered.sort_by_key(|r| (r.started_at_ms, r.seq));
    let mut traces = match options.builder {
        Builder::PerRequest => per_request::build(&ordered),
        Builder::PrefixMerging => {
            let eot = options.end_of_turn.or_else(|| infer_end_of_turn(records));
            prefix_merging::build(&ordered, eot, options.max_length)
        }
    };
    let not_imitated = if options.imitation {
        leave_out_of_imitation(&mut traces, &ordered)
    } else {
        0
    };
    let mut stats = ReconstructionStats::of(&ordered, &traces)
        .with_abandoned(&abandoned)
        .with_excluded(&excluded);
    stats.not_imitated_calls = not_imitated;
    (traces, stats)
}

/// For imitation (an sft job's dataset, which a student copies token for token), a call it
/// should not copy trains no token: a tool call the harness could not parse (under GRPO a
/// trainable negative, which a low reward pushes down; imitation has no negative). Its tokens
/// stay in the trace, as the context the later turns saw. Returns how many calls. (A response
/// cut at its cap stays: its tokens are the teacher's, and no end of turn is learnt at the
/// cut, as when a trainer truncates a long example.)
fn leave_out_of_imitation(traces: &mut [Trace], records: &[&CompletionRecord]) -> u64 {
    let by_seq: std::collections::HashMap<u64, &CompletionRecord> =
        records.iter().map(|r| (r.seq, *r)).collect();
    let mut left_out = 0;
    for trace in traces {
        // The builders train exactly the sampled tokens: each call's are the next run of
        // trained ones, in the order the trace lists its calls (what is between is prompt).
        let mask = &mut trace.loss_mask;
        let mut at = 0;
        for seq in &trace.completions {
            let Some(r) = by_seq.get(seq) else { continue };
            while mask.get(at) == Some(&0) {
                at += 1;
            }
            let end = (at + r.completion_token_ids.len()).min(mask.len());
            if r.unparsed_tool_call {
                mask[at..end].fill(0);
                left_out += 1;
            }
            at = end;
        }
    }
    left_out
}

/// Build a session's trajectory and apply its outcome.
pub fn build_trajectory(
    session: &SessionInfo,
    records: &[CompletionRecord],
    options: &BuildOptions,
    outcome: &SessionOutcome,
) -> Trajectory {
    let (traces, stats) = build_traces(records, options);
    let mut policy_versions: Vec<u64> = records
        .iter()
        .filter(|r| !r.abandoned && !options.excludes(r))
        .filter_map(|r| r.policy_version)
        .collect();
    policy_versions.sort_unstable();
    policy_versions.dedup();
    let mut trajectory = Trajectory {
        format: TRAJECTORY_FORMAT.to_string(),
        session: session.session.clone(),
        task: session.task.clone(),
        group: session.group.clone(),
        sample: session.sample,
        status: SessionStatus::Completed,
        trainable: true,
        reward: None,
        evaluation: None,
        builder: options.builder,
        policy_versions,
        traces,
        stats,
        metadata: session.metadata.clone(),
    };
    apply_outcome(&mut trajectory, outcome);
    trajectory
}

/// The end-of-turn token: the most common last sampled token of calls that stopped on their
/// own (`stop` / `tool_calls`). `None` when no call did. Calls that named stops of their own
/// (`stop`, `stop_token_ids`) count only when no other call stopped: vLLM keeps a matched stop
/// id as the last sampled token, and side calls stopping on one of the agent's choosing would
/// outnumber the turns and turn every real turn's end into a break (a review, session 85).
pub fn infer_end_of_turn(records: &[CompletionRecord]) -> Option<u32> {
    let own_stops = |r: &CompletionRecord| {
        ["stop", "stop_token_ids"].iter().any(|k| {
            let v = &r.normalized_request[*k];
            !(v.is_null() || v.as_array().is_some_and(Vec::is_empty) || v.as_str() == Some(""))
        })
    };
    let stopped =
        |r: &&CompletionRecord| matches!(r.finish_reason.as_deref(), Some("stop" | "tool_calls"));
    let plain: Vec<&CompletionRecord> = records
        .iter()
        .filter(stopped)
        .filter(|r| !own_stops(r))
        .collect();
    let counted: Vec<&CompletionRecord> = if plain.is_empty() {
        records.iter().filter(stopped).collect()
    } else {
        plain
    };
    let mut counts = std::collections::BTreeMap::<u32, usize>::new();
    for last in counted.iter().filter_map(|r| r.completion_token_ids.last()) {
        *counts.entry(*last).or_default() += 1;
    }
    counts
        .into_iter()
        .max_by_key(|(token, n)| (*n, std::cmp::Reverse(*token)))
        .map(|(t, _)| t)
}

#[cfg(test)]
mod tests;

/// JSON Schema (draft 2020-12) of the wire format, as checked in at
/// `docs/trajectory.schema.json`.
pub fn wire_schema() -> serde_json::Value {
    let mut schema = serde_json::to_value(schemars::schema_for!(Trajectory)).unwrap_or_default();
    if let Some(map) = schema.as_object_mut() {
        map.insert(
            "$id".into(),
            "https://floe.dev/schemas/trajectory/v1.json".into(),
        );
        map.insert("title".into(), TRAJECTORY_FORMAT.into());
    }
    schema
}
