//! A running session's snapshot as a change to the last one its trainer took.
//!
//! A train job's gateway posts the session as it stands after every call (the gateway's
//! snapshot module). Posted whole, a session of `n` calls sends about `n` times its size in
//! all, and a `per_request` session's size itself grows with the square of its calls (each
//! call's trace repeats the conversation so far): a long agent's snapshots came to gigabytes,
//! past the trainer's body limit, and the snapshot of a long session (the one an eviction
//! needs) was refused. A delta sends each trace the trainer holds unchanged as its index, a
//! trace that grew (a merged chain, one more turn) as the tokens it grew by, and only new or
//! rewritten traces whole, so a session sends about its own size in all.
//!
//! Sans-IO: [`plan`] compares the traces with [`TraceMark`]s kept of the last snapshot taken
//! (lengths and keyed hashes, not the tokens), and the trainer rebuilds the snapshot from the
//! one it holds (`floe_trainer.snapshot_delta`). Each snapshot has an [`id`]; a delta names its
//! base's, and a trainer that holds another snapshot answers 409 and is sent the whole one.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};

use serde::Serialize;

use super::{ChainStart, Trace, Trajectory};

/// The `format` of a delta body (`POST /v1/partial/delta`, its base's id in `Floe-Base-Snapshot`).
pub const DELTA_FORMAT: &str = "floe.snapshot-delta/v1";

/// What the gateway keeps of one trace of the snapshot the trainer took: enough to tell
/// whether a trace now is that one, or that one grown.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TraceMark {
    /// The capture `seq` the trace starts with: each call is in exactly one trace, so it names it.
    first: Option<u64>,
    response_len: usize,
    /// Of its prompt and response arrays.
    tokens: u64,
    /// Of those and its last call's fields (`finish_reason`, `completions`, `start`).
    whole: u64,
}

/// One trace of a delta: the trainer's trace at that index unchanged, that trace grown by
/// these tokens (its prompt the same; its small fields replaced), or a trace whole.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum TraceDelta<'a> {
    Same {
        same: usize,
    },
    Extends {
        extends: usize,
        response_token_ids: &'a [u32],
        loss_mask: &'a [u8],
        logprobs: &'a [Option<f64>],
        #[serde(skip_serializing_if = "Option::is_none")]
        finish_reason: Option<&'a str>,
        completions: &'a [u64],
        start: ChainStart,
    },
    Whole {
        trace: &'a Trace,
    },
}

/// A delta body: the trajectory's own fields (its `traces` empty) and its traces as deltas
/// against the snapshot of `base_calls` calls.
#[derive(Debug, Serialize)]
pub struct SnapshotDelta<'a> {
    pub format: &'static str,
    pub base_calls: u64,
    pub trajectory: &'a Trajectory,
    pub traces: Vec<TraceDelta<'a>>,
}

/// The marks of `traces`, to plan the next delta against once the trainer took them.
pub fn marks(traces: &[Trace], key: &impl BuildHasher) -> Vec<TraceMark> {
    traces.iter().map(|t| mark(t, key)).collect()
}

/// `traces` as deltas against the snapshot `base` marks, and their own marks.
pub fn plan<'a>(
    base: &[TraceMark],
    traces: &'a [Trace],
    key: &impl BuildHasher,
) -> (Vec<TraceDelta<'a>>, Vec<TraceMark>) {
    let by_first: HashMap<u64, usize> = base
        .iter()
        .enumerate()
        .filter_map(|(i, m)| m.first.map(|f| (f, i)))
        .collect();
    let mut deltas = Vec::with_capacity(traces.len());
    let mut marks = Vec::with_capacity(traces.len());
    for trace in traces {
        let now = mark(trace, key);
        let held = now
            .first
            .and_then(|f| by_first.get(&f))
            .map(|&i| (i, &base[i]));
        deltas.push(match held {
            Some((i, was)) if *was == now => TraceDelta::Same { same: i },
            Some((i, was))
                if was.response_len <= trace.response_token_ids.len()
                    && trace.loss_mask.len() == trace.response_token_ids.len()
                    && trace.logprobs.len() == trace.response_token_ids.len()
                    && tokens_hash(trace, was.response_len, key) == was.tokens =>
            {
                let from = was.response_len;
                TraceDelta::Extends {
                    extends: i,
                    response_token_ids: &trace.response_token_ids[from..],
                    loss_mask: &trace.loss_mask[from..],
                    logprobs: &trace.logprobs[from..],
                    finish_reason: trace.finish_reason.as_deref(),
                    completions: &trace.completions,
                    start: trace.start,
                }
            }
            _ => TraceDelta::Whole { trace },
        });
        marks.push(now);
    }
    (deltas, marks)
}

/// A snapshot's id, from its marks and calls: what a delta names as the snapshot it is on, so
/// that a trainer holding any other (a late post of the same calls included) refuses it.
pub fn id(marks: &[TraceMark], calls: u64, key: &impl BuildHasher) -> String {
    let mut h = key.build_hasher();
    calls.hash(&mut h);
    marks.hash(&mut h);
    format!("{:016x}", h.finish())
}

fn mark(trace: &Trace, key: &impl BuildHasher) -> TraceMark {
    let tokens = tokens_hash(trace, trace.response_token_ids.len(), key);
    let mut h = key.build_hasher();
    h.write_u64(tokens);
    trace.finish_reason.hash(&mut h);
    trace.completions.hash(&mut h);
    trace.start.hash(&mut h);
    TraceMark {
        first: trace.completions.first().copied(),
        response_len: trace.response_token_ids.len(),
        tokens,
        whole: h.finish(),
    }
}

/// A keyed hash of the trace's prompt and the first `upto` elements of its response arrays
/// (keyed per session: what an agent puts in its context cannot be made to collide).
fn tokens_hash(trace: &Trace, upto: usize, key: &impl BuildHasher) -> u64 {
    // The arrays of a well-formed trace have one length; a malformed one is never "the same".
    let upto = upto
        .min(trace.response_token_ids.len())
        .min(trace.loss_mask.len())
        .min(trace.logprobs.len());
    let mut h = key.build_hasher();
    h.write_usize(trace.prompt_token_ids.len());
    write_ids(&mut h, &trace.prompt_token_ids);
    h.write_usize(upto);
    write_ids(&mut h, &trace.response_token_ids[..upto]);
    h.write(&trace.loss_mask[..upto]);
    for lp in &trace.logprobs[..upto] {
        match lp {
            Some(v) => {
                h.write_u8(1);
                h.write_u64(v.to_bits());
            }
            None => h.write_u8(0),
        }
    }
    h.finish()
}

/// Ids in blocks: a hasher's per-call cost, paid per token, would cost more than the hashing.
fn write_ids(h: &mut impl Hasher, ids: &[u32]) {
    let mut block = [0u8; 1024];
    for chunk in ids.chunks(block.len() / 4) {
        for (slot, id) in block.chunks_exact_mut(4).zip(chunk) {
            slot.copy_from_slice(&id.to_le_bytes());
        }
        h.write(&block[..chunk.len() * 4]);
    }
}

#[cfg(test)]
mod tests;
