//! The indexed builder against the scan-based one it replaced, on sessions drawn from a tiny
//! vocabulary so that prefixes, forks, branches and blocked merges coincide all the time.

use proptest::prelude::*;

use super::hashing::PrefixHash;
use super::{build, reference, Merger};
use crate::capture::CompletionRecord;
use crate::trajectory::Trace;

const EOT: u32 = 9;

/// Where a call's prompt comes from.
#[derive(Clone, Debug)]
enum Source {
    /// Tokens of its own.
    Fresh(Vec<u32>),
    /// An earlier call's prompt and sampled tokens, cut after `keep` of them (all when
    /// `keep` is past their end), then `more`.
    After {
        call: usize,
        keep: usize,
        more: Vec<u32>,
    },
    /// An earlier call's prompt again.
    Again(usize),
}

#[derive(Clone, Debug)]
struct Call {
    source: Source,
    response: Vec<u32>,
    finish: &'static str,
    logprobs: bool,
}

fn tokens(max: usize) -> impl Strategy<Value = Vec<u32>> {
    prop::collection::vec(prop_oneof![6 => 1u32..4, 1 => Just(EOT)], 0..max)
}

fn call() -> impl Strategy<Value = Call> {
    let source = prop_oneof![
        1 => tokens(4).prop_map(Source::Fresh),
        6 => (0usize..64, 0usize..24, tokens(3)).prop_map(|(call, keep, more)| Source::After { call, keep, more }),
        1 => (0usize..64).prop_map(Source::Again),
    ];
    (
        source,
        tokens(4),
        prop_oneof![Just("stop"), Just("tool_calls"), Just("length")],
        prop::bool::weighted(0.85),
    )
        .prop_map(|(source, response, finish, logprobs)| Call {
            source,
            response,
            finish,
            logprobs,
        })
}

fn session(calls: &[Call]) -> Vec<CompletionRecord> {
    let mut records: Vec<CompletionRecord> = Vec::new();
    for (seq, c) in calls.iter().enumerate() {
        let prompt = match (&c.source, records.is_empty()) {
            (Source::Fresh(t), _) | (Source::After { more: t, .. }, true) => t.clone(),
            (Source::Again(_), true) => vec![1],
            (Source::After { call, keep, more }, false) => {
                let r = &records[call % records.len()];
                let mut p = [&r.prompt_token_ids[..], &r.completion_token_ids[..]].concat();
                p.truncate(r.prompt_token_ids.len() + keep);
                p.extend(more);
                p
            }
            (Source::Again(call), false) => records[call % records.len()].prompt_token_ids.clone(),
        };
        let mut r = CompletionRecord::from_tokens(seq as u64, prompt, c.response.clone());
        r.finish_reason = Some(c.finish.into());
        r.logprobs = c
            .logprobs
            .then(|| c.response.iter().map(|&t| -f64::from(t)).collect());
        records.push(r);
    }
    records
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    #[test]
    fn the_indexed_builder_builds_what_scanning_every_chain_built(
        calls in prop::collection::vec(call(), 1..40),
        eot in prop::option::of(Just(EOT)),
        max_length in prop::option::weighted(0.2, 4usize..40),
    ) {
        let records = session(&calls);
        let refs: Vec<&CompletionRecord> = records.iter().collect();
        let indexed = build(&refs, eot, max_length);
        let scanned = reference::build(&refs, eot, max_length);
        prop_assert_eq!(&indexed, &scanned);
        // With every prefix of a length colliding, each search takes the way a collision
        // sends it (each hit confirmed) and must still find the same chains.
        prop_assert_eq!(colliding(&refs, eot, max_length), scanned);
    }
}

fn colliding(records: &[&CompletionRecord], eot: Option<u32>, max: Option<usize>) -> Vec<Trace> {
    let mut merger = Merger::with_hash(PrefixHash::colliding(), eot, max);
    for r in records {
        merger.push(r);
    }
    merger.finish()
}

#[test]
fn many_forks_from_one_point_each_refused_are_built_like_before() {
    // The case that made the scan cubic: n samples from one point, then n calls each
    // continuing one of them without log-probs (so every candidate is refused).
    let n = 300u32;
    let mut records = Vec::new();
    for i in 0..n {
        let mut r = CompletionRecord::from_tokens(u64::from(i), vec![1, 2, 3], vec![10 + i, EOT]);
        r.logprobs = Some(vec![-0.5, -0.1]);
        records.push(r);
    }
    for i in 0..n {
        let prompt = vec![1, 2, 3, 10 + i, EOT, 5];
        records.push(CompletionRecord::from_tokens(
            u64::from(n + i),
            prompt,
            vec![6],
        ));
    }
    let refs: Vec<&CompletionRecord> = records.iter().collect();
    let indexed = build(&refs, Some(EOT), None);
    assert_eq!(indexed, reference::build(&refs, Some(EOT), None));
    assert_eq!(indexed.len(), 2 * n as usize);
}

/// The traces the scan built, at under two tokens compared (confirming hits) a token of the
/// prompts: an agent shapes its calls, so a build must stay linear however it does.
fn builds_as_before_comparing_under_two_tokens_a_prompt_token(records: &[CompletionRecord]) {
    let refs: Vec<&CompletionRecord> = records.iter().collect();
    let mut merger = Merger::new(None, None);
    for r in records {
        merger.push(r);
    }
    let prompts: usize = records.iter().map(|r| r.prompt_token_ids.len()).sum();
    let ratio = merger.compared.get() as f64 / prompts as f64;
    assert_eq!(merger.finish(), reference::build(&refs, None, None));
    assert!(ratio <= 2.0, "{ratio:.1} tokens compared a prompt token");
}

fn record(seq: usize, prompt: Vec<u32>, completion: Vec<u32>) -> CompletionRecord {
    CompletionRecord::from_tokens(seq as u64, prompt, completion)
}

#[test]
fn rewrites_of_many_open_chains_compare_one_first_prompt_each() {
    // m chains whose first prompts nest (1, 1..2, …, 1..m), each continued away from the
    // others; then m calls that keep every first prompt and continue none: each compared
    // every chain's first prompt, m² tokens a call.
    let m = 300u32;
    let p: Vec<u32> = (1..=m).collect();
    let x = 100_000;
    let mut records = Vec::new();
    for k in (1..=m as usize).rev() {
        records.push(record(records.len(), p[..k].to_vec(), vec![x]));
    }
    for k in 1..=m as usize {
        let prompt = [&p[..k], &[x, 200_000 + k as u32]].concat();
        records.push(record(records.len(), prompt, vec![x]));
    }
    for j in 0..m {
        records.push(record(
            records.len(),
            [&p[..], &[300_000 + j]].concat(),
            vec![x],
        ));
    }
    builds_as_before_comparing_under_two_tokens_a_prompt_token(&records);
}

#[test]
fn forks_whose_answers_nest_are_not_each_compared_on_every_call() {
    // Samples from one point whose answers are prefixes of each other (greedy decoding, a
    // varying max_tokens), then calls continuing the longest: each compared every fork.
    let m = 200u32;
    let mut records = Vec::new();
    for k in (1..=m).rev() {
        records.push(record(records.len(), vec![1], (2..2 + k).collect()));
    }
    for _ in 0..m {
        let prompt = [&[1][..], &(2..2 + m).collect::<Vec<u32>>(), &[9_999]].concat();
        records.push(record(records.len(), prompt, vec![7]));
    }
    builds_as_before_comparing_under_two_tokens_a_prompt_token(&records);
}
