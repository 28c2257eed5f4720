//! Property tests of the trajectory builders on generated sessions: several agents
//! interleaved, with template rewrites, compaction, truncated turns and missing logprobs.

use std::collections::BTreeMap;

use floe_gateway::capture::CompletionRecord;
use floe_gateway::trajectory::{build_traces, BuildOptions, Builder, Trace};
use proptest::prelude::*;

const EOT: u32 = 9;

#[derive(Clone, Debug)]
enum Event {
    /// The next prompt holds the sampled tokens verbatim.
    Verbatim,
    /// The chat template drops the first sampled token (e.g. stripped thinking).
    Rewrite,
    /// The history is replaced by the first prompt + a summary.
    Compact,
}

#[derive(Clone, Debug)]
struct Step {
    agent: usize,
    response: Vec<u32>,
    truncated: bool,
    logprobs: bool,
    interstitial: Vec<u32>,
    event: Event,
}

fn step() -> impl Strategy<Value = Step> {
    (
        0usize..3,
        prop::collection::vec(10u32..60, 1..6),
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.9),
        prop::collection::vec(10u32..60, 0..4),
        prop_oneof![8 => Just(Event::Verbatim), 1 => Just(Event::Rewrite), 1 => Just(Event::Compact)],
    )
        .prop_map(|(agent, response, truncated, logprobs, interstitial, event)| Step {
            agent,
            response,
            truncated,
            logprobs,
            interstitial,
            event,
        })
}

/// Play the steps: each agent keeps a context; a call's prompt is that context.
fn session(steps: &[Step]) -> Vec<CompletionRecord> {
    let firsts: Vec<Vec<u32>> = (0..3u32).map(|a| vec![1, 2, 100 + a]).collect();
    let mut contexts = firsts.clone();
    let mut records = Vec::new();
    for (seq, s) in steps.iter().enumerate() {
        let prompt = contexts[s.agent].clone();
        let mut response = s.response.clone();
        if !s.truncated {
            response.push(EOT);
        }
        let logprobs = s.logprobs.then(|| {
            (0..response.len())
                .map(|i| -((seq * 100 + i) as f64) / 1e4)
                .collect()
        });
        records.push(CompletionRecord {
            logprobs,
            finish_reason: Some(if s.truncated { "length" } else { "stop" }.into()),
            ..CompletionRecord::from_tokens(seq as u64, prompt.clone(), response.clone())
        });
        let mut next = match s.event {
            Event::Compact => firsts[s.agent].iter().copied().chain([7, 7]).collect(),
            Event::Verbatim => [prompt, response].concat(),
            Event::Rewrite => [prompt, response[1..].to_vec()].concat(),
        };
        if s.truncated && !matches!(s.event, Event::Compact) {
            next.push(EOT); // the template closes a truncated turn
        }
        next.extend(&s.interstitial);
        contexts[s.agent] = next;
    }
    records
}

fn by_seq(records: &[CompletionRecord]) -> BTreeMap<u64, &CompletionRecord> {
    records.iter().map(|r| (r.seq, r)).collect()
}

/// Every invariant a trainer relies on, for one builder's output.
fn check(records: &[CompletionRecord], traces: &[Trace]) -> Result<(), TestCaseError> {
    let records = by_seq(records);
    let mut seen = BTreeMap::new();
    for t in traces {
        let n = t.response_token_ids.len();
        prop_assert_eq!(t.loss_mask.len(), n, "mask length");
        prop_assert_eq!(t.logprobs.len(), n, "logprobs length");
        let full: Vec<u32> = [t.prompt_token_ids.clone(), t.response_token_ids.clone()].concat();
        // Walk the mask-1 positions, handing them to the trace's calls in order.
        let trained: Vec<usize> = (0..n).filter(|&i| t.loss_mask[i] == 1).collect();
        let mut cursor = 0;
        for seq in &t.completions {
            *seen.entry(*seq).or_insert(0) += 1;
            let r = records[seq];
            let mine = &trained[cursor..cursor + r.completion_token_ids.len()];
            cursor += r.completion_token_ids.len();
            // Sampled tokens appear once, contiguous, with mask 1 and their own logprobs…
            let tokens: Vec<u32> = mine.iter().map(|&i| t.response_token_ids[i]).collect();
            prop_assert_eq!(&tokens, &r.completion_token_ids);
            prop_assert!(
                mine.windows(2).all(|w| w[1] == w[0] + 1),
                "sampled run is contiguous"
            );
            let lps: Vec<Option<f64>> = mine.iter().map(|&i| t.logprobs[i]).collect();
            let expected: Vec<Option<f64>> = match &r.logprobs {
                Some(lp) => lp.iter().copied().map(Some).collect(),
                None => vec![None; r.completion_token_ids.len()],
            };
            prop_assert_eq!(lps, expected);
            // …right after exactly the prompt the model was given: no merge across a non-prefix.
            let start = t.prompt_token_ids.len() + mine[0];
            prop_assert_eq!(
                &full[..start],
                &r.prompt_token_ids[..],
                "call {} saw another context",
                seq
            );
        }
        prop_assert_eq!(
            cursor,
            trained.len(),
            "no mask-1 token that no call sampled"
        );
        for i in 0..n {
            if t.loss_mask[i] == 0 {
                prop_assert_eq!(t.logprobs[i], None, "context token with a logprob");
            }
        }
    }
    prop_assert_eq!(seen.len(), records.len(), "every call is in a trace");
    prop_assert!(seen.values().all(|n| *n == 1), "no call is in two traces");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn prefix_merging_keeps_every_sampled_token_exactly_once(steps in prop::collection::vec(step(), 1..40)) {
        let records = session(&steps);
        for eot in [Some(EOT), None] {
            let options = BuildOptions { builder: Builder::PrefixMerging, end_of_turn: eot, ..Default::default() };
            let (traces, stats) = build_traces(&records, &options);
            check(&records, &traces)?;
            prop_assert_eq!(stats.trainable_tokens, stats.sampled_tokens);
            prop_assert_eq!(stats.starts.values().sum::<u64>(), stats.traces);
        }
    }

    #[test]
    fn per_request_and_prefix_merging_carry_the_same_sampled_tokens(steps in prop::collection::vec(step(), 1..40)) {
        let records = session(&steps);
        let merged = build_traces(&records, &BuildOptions { builder: Builder::PrefixMerging, ..Default::default() });
        let single = build_traces(&records, &BuildOptions { builder: Builder::PerRequest, ..Default::default() });
        check(&records, &single.0)?;
        prop_assert_eq!(merged.1.sampled_tokens, single.1.sampled_tokens);
        prop_assert_eq!(merged.1.trainable_tokens, single.1.trainable_tokens);
        prop_assert!(merged.0.len() <= single.0.len());
        prop_assert!(merged.1.total_tokens <= single.1.total_tokens);
    }

    #[test]
    fn a_max_length_is_never_exceeded_by_a_merge(steps in prop::collection::vec(step(), 1..40), max in 8usize..64) {
        let records = session(&steps);
        let options = BuildOptions { builder: Builder::PrefixMerging, end_of_turn: Some(EOT), max_length: Some(max), ..Default::default() };
        let (traces, _) = build_traces(&records, &options);
        check(&records, &traces)?;
        for t in traces.iter().filter(|t| t.completions.len() > 1) {
            prop_assert!(t.prompt_token_ids.len() + t.response_token_ids.len() <= max);
        }
    }
}
