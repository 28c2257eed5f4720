//! Deltas of sessions built by the real builders, call by call: rebuilt against the traces
//! the trainer held, each gives the traces now, and sends only what changed.

use std::collections::hash_map::RandomState;

use proptest::prelude::*;

use super::*;
use crate::capture::CompletionRecord;
use crate::trajectory::{build_traces, BuildOptions, Builder};

/// What the trainer does with a delta (`floe_trainer.ingest.apply_delta`), for the round trip.
fn apply(held: &[Trace], deltas: &[TraceDelta]) -> Vec<Trace> {
    deltas
        .iter()
        .map(|d| match d {
            TraceDelta::Same { same } => held[*same].clone(),
            TraceDelta::Extends {
                extends,
                response_token_ids,
                loss_mask,
                logprobs,
                finish_reason,
                completions,
                start,
            } => {
                let mut t = held[*extends].clone();
                t.response_token_ids.extend_from_slice(response_token_ids);
                t.loss_mask.extend_from_slice(loss_mask);
                t.logprobs.extend_from_slice(logprobs);
                t.finish_reason = finish_reason.map(str::to_string);
                t.completions = completions.to_vec();
                t.start = *start;
                t
            }
            TraceDelta::Whole { trace } => (*trace).clone(),
        })
        .collect()
}

/// Response tokens a delta carries (what it costs, near enough).
fn carried(deltas: &[TraceDelta]) -> usize {
    deltas
        .iter()
        .map(|d| match d {
            TraceDelta::Same { .. } => 0,
            TraceDelta::Extends {
                response_token_ids, ..
            } => response_token_ids.len(),
            TraceDelta::Whole { trace } => {
                trace.prompt_token_ids.len() + trace.response_token_ids.len()
            }
        })
        .sum()
}

/// An agent's session: each call's prompt is the last one's plus its reply and a tool result;
/// every `side`-th call is a background call with its own short prompt.
fn session(calls: usize, side: usize) -> Vec<CompletionRecord> {
    let mut context: Vec<u32> = (10..60).collect();
    let mut records = Vec::new();
    for seq in 0..calls as u64 {
        let background = side > 0 && seq as usize % side == side - 1;
        let prompt = if background {
            vec![7, 7, 7, seq as u32]
        } else {
            context.clone()
        };
        let mut response: Vec<u32> = (0..5).map(|i| 1000 + seq as u32 * 10 + i).collect();
        response.push(2);
        if !background {
            context.extend(&response);
            context.extend([300 + seq as u32, 301, 302]);
        }
        records.push(CompletionRecord {
            started_at_ms: seq,
            finished_at_ms: seq,
            logprobs: Some((0..response.len()).map(|i| -(i as f64) / 10.0).collect()),
            finish_reason: Some("tool_calls".into()),
            ..CompletionRecord::from_tokens(seq, prompt, response)
        });
    }
    records
}

fn traces(records: &[CompletionRecord], builder: Builder) -> Vec<Trace> {
    let options = BuildOptions {
        builder,
        end_of_turn: Some(2),
        max_length: None,
        ..Default::default()
    };
    build_traces(records, &options).0
}

#[test]
fn a_per_request_session_sends_each_call_once() {
    let key = RandomState::new();
    let records = session(12, 4);
    let mut held = traces(&records[..1], Builder::PerRequest);
    let mut base = marks(&held, &key);
    for k in 2..=records.len() {
        let now = traces(&records[..k], Builder::PerRequest);
        let (deltas, next) = plan(&base, &now, &key);
        assert_eq!(apply(&held, &deltas), now, "after {k} calls");
        let whole: Vec<_> = deltas
            .iter()
            .filter(|d| matches!(d, TraceDelta::Whole { .. }))
            .collect();
        assert_eq!(whole.len(), 1, "only the new call's trace: {deltas:?}");
        assert_eq!(deltas.len() - 1, held.len());
        assert_eq!(next, marks(&now, &key));
        (held, base) = (now, next);
    }
}

#[test]
fn a_merged_chain_sends_what_it_grew_by() {
    let key = RandomState::new();
    let records = session(10, 0);
    let mut held = traces(&records[..1], Builder::PrefixMerging);
    let mut base = marks(&held, &key);
    for k in 2..=records.len() {
        let now = traces(&records[..k], Builder::PrefixMerging);
        assert_eq!(now.len(), 1, "one chain");
        let (deltas, next) = plan(&base, &now, &key);
        assert_eq!(apply(&held, &deltas), now);
        let grown = now[0].response_token_ids.len() - held[0].response_token_ids.len();
        assert!(
            matches!(&deltas[..], [TraceDelta::Extends { extends: 0, response_token_ids, .. }]
                if response_token_ids.len() == grown),
            "{deltas:?}"
        );
        (held, base) = (now, next);
    }
}

#[test]
fn nothing_new_is_sent_as_indices_and_a_changed_token_whole() {
    let key = RandomState::new();
    let held = traces(&session(6, 3), Builder::PrefixMerging);
    let base = marks(&held, &key);
    let (deltas, _) = plan(&base, &held, &key);
    assert!(deltas
        .iter()
        .enumerate()
        .all(|(i, d)| matches!(d, TraceDelta::Same { same } if *same == i)));

    // A token inside what the trainer holds changed (a builder that rewrote a trace): whole.
    let mut changed = held.clone();
    changed[0].response_token_ids[1] += 1;
    let (deltas, _) = plan(&base, &changed, &key);
    assert!(matches!(deltas[0], TraceDelta::Whole { .. }), "{deltas:?}");
    assert_eq!(apply(&held, &deltas), changed);

    // Only the last call's fields changed: an extension by nothing that carries them.
    let mut finished = held.clone();
    finished[0].finish_reason = Some("stop".into());
    let (deltas, _) = plan(&base, &finished, &key);
    assert!(
        matches!(&deltas[0], TraceDelta::Extends { response_token_ids, finish_reason: Some("stop"), .. }
            if response_token_ids.is_empty()),
        "{deltas:?}"
    );
    assert_eq!(apply(&held, &deltas), finished);

    // A log-prob alone, or a mask alone, is a change too.
    for edit in [
        |t: &mut Trace| t.logprobs[0] = Some(-9.0),
        |t: &mut Trace| t.loss_mask[0] ^= 1,
        |t: &mut Trace| t.prompt_token_ids[0] += 1,
    ] {
        let mut edited = held.clone();
        edit(&mut edited[0]);
        let (deltas, _) = plan(&base, &edited, &key);
        assert!(matches!(deltas[0], TraceDelta::Whole { .. }), "{deltas:?}");
        assert_eq!(apply(&held, &deltas), edited);
    }
}

#[test]
fn the_wire_shape_is_the_one_the_trainer_reads() {
    let key = RandomState::new();
    let records = session(3, 0);
    let held = traces(&records[..2], Builder::PrefixMerging);
    let now = traces(&records, Builder::PrefixMerging);
    let (deltas, _) = plan(&marks(&held, &key), &now, &key);
    let json = serde_json::to_value(&deltas).expect("serialize");
    let one = &json[0];
    assert_eq!(one["extends"], 0);
    assert_eq!(one["finish_reason"], "tool_calls");
    assert_eq!(one["start"], "first");
    assert_eq!(one["completions"], serde_json::json!([0, 1, 2]));
    assert_eq!(
        one["response_token_ids"].as_array().map(Vec::len),
        one["loss_mask"].as_array().map(Vec::len)
    );
    let (same, _) = plan(&marks(&now, &key), &now, &key);
    assert_eq!(
        serde_json::to_value(&same).expect("serialize")[0],
        serde_json::json!({"same": 0})
    );
}

proptest! {
    /// Whatever changed between two snapshots (calls added, a trace rewritten, traces
    /// reordered), the delta rebuilds the second from the first.
    #[test]
    fn any_change_round_trips(
        calls in 1usize..14,
        more in 0usize..6,
        side in 0usize..5,
        per_request in any::<bool>(),
        edit in proptest::option::of((0usize..40, 0usize..200)),
        reverse in any::<bool>(),
    ) {
        let key = RandomState::new();
        let builder = if per_request { Builder::PerRequest } else { Builder::PrefixMerging };
        let records = session(calls + more, side);
        let held = traces(&records[..calls], builder);
        let mut now = traces(&records, builder);
        if let Some((t, at)) = edit {
            let n = now.len();
            let trace = &mut now[t % n];
            let len = trace.response_token_ids.len();
            trace.response_token_ids[at % len] ^= 1;
        }
        if reverse {
            now.reverse();
        }
        let (deltas, next) = plan(&marks(&held, &key), &now, &key);
        prop_assert_eq!(apply(&held, &deltas), now.clone());
        prop_assert_eq!(next, marks(&now, &key));
        let total: usize = now
            .iter()
            .map(|t| t.prompt_token_ids.len() + t.response_token_ids.len())
            .sum();
        prop_assert!(carried(&deltas) <= total);
    }
}

#[test]
fn a_snapshot_id_names_its_traces_and_calls() {
    let key = RandomState::new();
    let records = session(5, 0);
    let four = marks(&traces(&records[..4], Builder::PerRequest), &key);
    let five = marks(&traces(&records, Builder::PerRequest), &key);
    assert_eq!(id(&four, 4, &key), id(&four.clone(), 4, &key));
    assert_ne!(id(&four, 4, &key), id(&five, 5, &key));
    assert_ne!(
        id(&four, 4, &key),
        id(&four, 5, &key),
        "the calls are part of it"
    );
    // Keyed per session: another session's ids tell nothing of this one's.
    assert_ne!(id(&four, 4, &key), id(&four, 4, &RandomState::new()));
}
