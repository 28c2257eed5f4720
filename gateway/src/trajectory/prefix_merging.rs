//! Prefix merging: a multi-turn conversation becomes one trace instead of one per call.
//!
//! Each call (in time order) attaches to the open chain whose last prompt is the *longest
//! strict token prefix* of its prompt. The merge is accepted only if the context stays exactly
//! what the model saw: the previous turn's sampled tokens must reappear verbatim right after
//! that prefix. Then the tokens between the end of the previous turn and the end of the new
//! prompt (tool results, the next user message, template markers) join the trace with mask 0,
//! and the new call's sampled tokens with mask 1 and their logprobs.
//!
//! When a call cannot attach, it starts a new chain and the reason is recorded
//! ([`ChainStart`]); the chain it could not continue is kept as its own trace. Unlike Polar,
//! nothing after a break is dropped.

use super::per_request::sampled_logprobs;
use super::types::{ChainStart, Trace};
use crate::capture::CompletionRecord;

struct Chain {
    /// prompt₀ + response₀ + interstitial₁ + response₁ + …: exactly the context the model saw.
    tokens: Vec<u32>,
    /// Length of the first prompt: the part of `tokens` that is not in the trace's response.
    first_prompt_len: usize,
    /// Length of the last call's prompt (a prefix of `tokens`).
    last_prompt_len: usize,
    /// `tokens.len()` after each turn but the last: a fork may continue from one of these.
    turn_ends: Vec<usize>,
    /// Length of every prompt of the chain: a call with exactly one of these prompts is another
    /// sample from the same point.
    prompt_ends: Vec<usize>,
    mask: Vec<u8>,
    logprobs: Vec<Option<f64>>,
    completions: Vec<u64>,
    finish_reason: Option<String>,
    has_logprobs: bool,
    start: ChainStart,
    open: bool,
}

impl Chain {
    fn new(r: &CompletionRecord, start: ChainStart) -> Self {
        let mut tokens =
            Vec::with_capacity(r.prompt_token_ids.len() + r.completion_token_ids.len());
        tokens.extend_from_slice(&r.prompt_token_ids);
        tokens.extend_from_slice(&r.completion_token_ids);
        Self {
            tokens,
            first_prompt_len: r.prompt_token_ids.len(),
            last_prompt_len: r.prompt_token_ids.len(),
            turn_ends: Vec::new(),
            prompt_ends: vec![r.prompt_token_ids.len()],
            mask: vec![1; r.completion_token_ids.len()],
            logprobs: sampled_logprobs(r),
            completions: vec![r.seq],
            finish_reason: r.finish_reason.clone(),
            has_logprobs: has_logprobs(r),
            start,
            open: true,
        }
    }

    fn last_prompt(&self) -> &[u32] {
        &self.tokens[..self.last_prompt_len]
    }

    fn last_response(&self) -> &[u32] {
        &self.tokens[self.last_prompt_len..]
    }

    /// Append a call whose prompt extends `tokens` (checked by the caller).
    fn extend(&mut self, r: &CompletionRecord) {
        let interstitial = &r.prompt_token_ids[self.tokens.len()..];
        self.turn_ends.push(self.tokens.len());
        self.mask.extend(std::iter::repeat_n(0, interstitial.len()));
        self.logprobs
            .extend(std::iter::repeat_n(None, interstitial.len()));
        self.tokens.extend_from_slice(interstitial);
        self.last_prompt_len = self.tokens.len();
        self.prompt_ends.push(self.last_prompt_len);
        self.tokens.extend_from_slice(&r.completion_token_ids);
        self.mask
            .extend(std::iter::repeat_n(1, r.completion_token_ids.len()));
        self.logprobs.extend(sampled_logprobs(r));
        self.completions.push(r.seq);
        self.finish_reason = r.finish_reason.clone();
    }

    fn into_trace(self) -> Trace {
        let mut tokens = self.tokens;
        let response = tokens.split_off(self.first_prompt_len);
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

fn has_logprobs(r: &CompletionRecord) -> bool {
    r.logprobs
        .as_ref()
        .is_some_and(|lp| lp.len() == r.completion_token_ids.len())
}

fn stopped_on_its_own(finish_reason: Option<&str>) -> bool {
    matches!(finish_reason, Some("stop" | "tool_calls"))
}

fn common_prefix_len(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Why `r` cannot continue `chain` (whose last prompt is a strict prefix of r's prompt), or
/// `None` if it can.
fn merge_blocker(
    chain: &Chain,
    r: &CompletionRecord,
    eot: Option<u32>,
    max_length: Option<usize>,
) -> Option<ChainStart> {
    let prompt = &r.prompt_token_ids;
    let rest = &prompt[chain.last_prompt_len..];
    let response = chain.last_response();
    if !rest.starts_with(response) {
        return Some(ChainStart::TemplateRewrite);
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

/// Build merged traces from calls in time order. `eot` is the end-of-turn token id, if known.
pub fn build(
    records: &[&CompletionRecord],
    eot: Option<u32>,
    max_length: Option<usize>,
) -> Vec<Trace> {
    let mut chains: Vec<Chain> = Vec::new();
    for r in records {
        let start = attach(&mut chains, r, eot, max_length);
        if let Some(start) = start {
            chains.push(Chain::new(r, start));
        }
    }
    chains.into_iter().map(Chain::into_trace).collect()
}

/// Extend the right chain with `r` (→ `None`), or say why `r` starts a new one.
fn attach(
    chains: &mut [Chain],
    r: &CompletionRecord,
    eot: Option<u32>,
    max_length: Option<usize>,
) -> Option<ChainStart> {
    let prompt = &r.prompt_token_ids;
    // Open chains whose last prompt is a strict prefix of this prompt, longest prefix first,
    // most recent first on a tie (parallel samples from one point share a last prompt).
    let mut candidates: Vec<usize> = (0..chains.len())
        .filter(|&i| {
            let c = &chains[i];
            c.open && c.last_prompt_len < prompt.len() && prompt.starts_with(c.last_prompt())
        })
        .collect();
    candidates.sort_by_key(|&i| std::cmp::Reverse((chains[i].last_prompt_len, i)));
    let mut blockers = Vec::new();
    for &i in &candidates {
        match merge_blocker(&chains[i], r, eot, max_length) {
            None => {
                chains[i].extend(r);
                return None;
            }
            Some(reason) => blockers.push((i, reason)),
        }
    }
    // Nothing to extend. Another sample from a point some chain passed through is a fork,
    // whatever its siblings look like.
    if is_fork(chains, prompt) {
        return Some(ChainStart::Fork);
    }
    if let Some(&(i, reason)) = blockers.first() {
        chains[i].open = false;
        return Some(reason);
    }
    Some(classify_unattached(chains, prompt))
}

fn is_fork(chains: &[Chain], prompt: &[u32]) -> bool {
    chains.iter().any(|c| {
        let same_point = c.prompt_ends.iter().any(|&end| prompt == &c.tokens[..end]);
        let after_turn = c
            .turn_ends
            .iter()
            .any(|&end| prompt.len() > end && prompt.starts_with(&c.tokens[..end]));
        same_point || after_turn
    })
}

/// A call that extends no chain's last prompt and forks from none: a rewritten history or a
/// new context.
fn classify_unattached(chains: &mut [Chain], prompt: &[u32]) -> ChainStart {
    if chains.is_empty() {
        return ChainStart::First;
    }
    // Keeps an open chain's whole first prompt, then differs: its later history was rewritten.
    let rewritten = chains.iter_mut().find(|c| {
        c.open
            && prompt.len() > c.first_prompt_len
            && common_prefix_len(&c.tokens, prompt) >= c.first_prompt_len
    });
    match rewritten {
        Some(chain) => {
            chain.open = false;
            ChainStart::PrefixChanged
        }
        None => ChainStart::NewContext,
    }
}
