//! A chain: calls merged into one trace, and why a call may or may not continue one.

use std::collections::HashMap;

use super::hashing::{Mark, PrefixHash, Prompt};
use crate::capture::CompletionRecord;
use crate::trajectory::per_request::sampled_logprobs;
use crate::trajectory::types::{ChainStart, Trace};

pub struct Chain {
    /// prompt₀ + response₀ + interstitial₁ + response₁ + …: exactly the context the model saw.
    pub tokens: Vec<u32>,
    /// End of the first prompt: the part of `tokens` that is not in the trace's response.
    pub first_prompt: Mark,
    /// End of the last call's prompt (a prefix of `tokens`).
    pub last_prompt: Mark,
    /// The end of `tokens`: a call whose prompt starts with all of them may continue the chain.
    pub whole: Mark,
    pub mask: Vec<u8>,
    pub logprobs: Vec<Option<f64>>,
    pub completions: Vec<u64>,
    pub finish_reason: Option<String>,
    pub has_logprobs: bool,
    pub start: ChainStart,
    /// For a chain that branched off another one after a completed turn: that chain. Decided in
    /// hindsight: if the parent never continues, the branch was a history rewrite.
    pub branched_from: Option<usize>,
    pub open: bool,
}

impl Chain {
    pub fn new(
        r: &CompletionRecord,
        prompt: &Prompt,
        hash: &mut PrefixHash,
        start: ChainStart,
        branched_from: Option<usize>,
    ) -> Self {
        let end = prompt.mark(prompt.len());
        let mut tokens: Vec<u32> =
            Vec::with_capacity(r.prompt_token_ids.len() + r.completion_token_ids.len());
        tokens.extend_from_slice(&r.prompt_token_ids);
        tokens.extend_from_slice(&r.completion_token_ids);
        Self {
            tokens,
            first_prompt: end,
            last_prompt: end,
            whole: Mark {
                at: r.prompt_token_ids.len() + r.completion_token_ids.len(),
                hash: hash.continued(end.at, end.hash, &r.completion_token_ids),
            },
            mask: vec![1; r.completion_token_ids.len()],
            logprobs: sampled_logprobs(r),
            completions: vec![r.seq],
            finish_reason: r.finish_reason.clone(),
            has_logprobs: has_logprobs(r),
            start,
            branched_from,
            open: true,
        }
    }

    pub fn at(&self, mark: Mark) -> &[u32] {
        &self.tokens[..mark.at]
    }

    pub fn last_response(&self) -> &[u32] {
        &self.tokens[self.last_prompt.at..]
    }

    /// Whether a call continuing this chain must find the end-of-turn token right after it:
    /// its last turn stopped on its own without sampling one.
    pub fn needs_closing(&self, eot: Option<u32>) -> bool {
        eot.is_some_and(|eot| {
            stopped_on_its_own(self.finish_reason.as_deref())
                && self.last_response().last() != Some(&eot)
        })
    }

    /// Append a call whose prompt extends `tokens` (checked by the caller).
    pub fn extend(&mut self, r: &CompletionRecord, prompt: &Prompt, hash: &mut PrefixHash) {
        let turn_end = self.tokens.len();
        let interstitial = &r.prompt_token_ids[turn_end..];
        self.mask.extend(std::iter::repeat_n(0, interstitial.len()));
        self.logprobs
            .extend(std::iter::repeat_n(None, interstitial.len()));
        self.tokens.extend_from_slice(interstitial);
        self.last_prompt = prompt.mark(self.tokens.len());
        self.tokens.extend_from_slice(&r.completion_token_ids);
        self.mask
            .extend(std::iter::repeat_n(1, r.completion_token_ids.len()));
        self.logprobs.extend(sampled_logprobs(r));
        self.completions.push(r.seq);
        self.finish_reason = r.finish_reason.clone();
        self.whole = Mark {
            at: self.tokens.len(),
            hash: hash.continued(
                self.last_prompt.at,
                self.last_prompt.hash,
                &r.completion_token_ids,
            ),
        };
    }

    pub fn into_trace(self) -> Trace {
        let mut tokens = self.tokens;
        let response = tokens.split_off(self.first_prompt.at);
        Trace {
            prompt_token_ids: tokens,
            response_token_ids: response,
            loss_mask: self.mask,
            logprobs: self.logprobs,
            finish_reason: self.finish_reason,
            completions: self.completions,
            start: self.start,
        }
    }
}

pub fn has_logprobs(r: &CompletionRecord) -> bool {
    r.logprobs
        .as_ref()
        .is_some_and(|lp| lp.len() == r.completion_token_ids.len())
}

pub fn stopped_on_its_own(finish_reason: Option<&str>) -> bool {
    matches!(finish_reason, Some("stop" | "tool_calls"))
}

/// Is the previous turn still there, only rendered differently (re-tokenized, thinking
/// stripped, tool JSON re-serialized)? Yes if at least half of its sampled tokens reappear
/// where it should be; if it is simply gone, the history was changed instead.
fn looks_rerendered(sampled: &[u32], rest: &[u32]) -> bool {
    let window = &rest[..rest.len().min(sampled.len() + 16)];
    let mut pool: HashMap<u32, usize> = HashMap::new();
    for t in window {
        *pool.entry(*t).or_default() += 1;
    }
    let found = sampled
        .iter()
        .filter(|t| match pool.get_mut(t) {
            Some(n) if *n > 0 => {
                *n -= 1;
                true
            }
            _ => false,
        })
        .count();
    2 * found >= sampled.len()
}

/// Why `r` cannot continue `chain` (whose last prompt is a strict prefix of r's prompt), or
/// `None` if it can.
pub fn merge_blocker(
    chain: &Chain,
    r: &CompletionRecord,
    eot: Option<u32>,
    max_length: Option<usize>,
) -> Option<ChainStart> {
    let prompt = &r.prompt_token_ids;
    let rest = &prompt[chain.last_prompt.at..];
    let response = chain.last_response();
    if !rest.starts_with(response) {
        return Some(if looks_rerendered(response, rest) {
            ChainStart::TemplateRewrite
        } else {
            ChainStart::PrefixChanged
        });
    }
    if let Some(eot) = eot {
        // A turn that ended by itself must be closed by an end-of-turn token: sampled, or
        // (if the server did not report it) the first token after it in the next prompt.
        let closed = response.last() == Some(&eot) || rest.get(response.len()) == Some(&eot);
        if stopped_on_its_own(chain.finish_reason.as_deref()) && !closed {
            return Some(ChainStart::NoEndOfTurn);
        }
    }
    if has_logprobs(r) != chain.has_logprobs {
        return Some(ChainStart::MissingLogprobs);
    }
    if max_length.is_some_and(|max| prompt.len() + r.completion_token_ids.len() > max) {
        return Some(ChainStart::MaxLength);
    }
    None
}

/// The chains' traces, with the decision made in hindsight: a branch whose parent never went
/// on was not a parallel branch, the harness rewrote the history (compaction, trimmed tool
/// output) and continued from the rewritten version.
pub fn into_traces(mut chains: Vec<Chain>) -> Vec<Trace> {
    let last_call: Vec<Option<u64>> = chains
        .iter()
        .map(|c| c.completions.last().copied())
        .collect();
    for chain in &mut chains {
        if let Some(parent) = chain.branched_from {
            if last_call[parent] < chain.completions.first().copied() {
                chain.start = ChainStart::PrefixChanged;
            }
        }
    }
    chains.into_iter().map(Chain::into_trace).collect()
}
