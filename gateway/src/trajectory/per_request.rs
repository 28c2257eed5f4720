//! One trace per model call: the simplest builder, and the baseline prefix merging is measured
//! against.

use super::types::{ChainStart, Trace};
use crate::capture::CompletionRecord;

pub fn build(records: &[&CompletionRecord]) -> Vec<Trace> {
    records
        .iter()
        .map(|r| Trace {
            prompt_token_ids: r.prompt_token_ids.clone(),
            response_token_ids: r.completion_token_ids.clone(),
            loss_mask: vec![1; r.completion_token_ids.len()],
            logprobs: sampled_logprobs(r),
            finish_reason: r.finish_reason.clone(),
            completions: vec![r.seq],
            start: ChainStart::PerRequest,
        })
        .collect()
}

/// The behaviour logprob of each sampled token, `None` where the upstream gave none (or gave a
/// list of the wrong length, which is as good as none).
pub(super) fn sampled_logprobs(r: &CompletionRecord) -> Vec<Option<f64>> {
    match &r.logprobs {
        Some(lp) if lp.len() == r.completion_token_ids.len() => {
            lp.iter().copied().map(Some).collect()
        }
        _ => vec![None; r.completion_token_ids.len()],
    }
}
