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
//!
//! Cost: each call hashes its prompt's prefixes once (O(prompt)), after which testing it
//! against a chain is O(1), confirmed by one exact comparison on a hash hit. Many agents that
//! share a long system prompt therefore cost no more than one.

use std::collections::HashMap;

use super::per_request::sampled_logprobs;
use super::types::{ChainStart, Trace};
use crate::capture::CompletionRecord;

const HASH_SEED: u64 = 0xcbf2_9ce4_8422_2325;

const HASH_BASE: u64 = 0x100_0000_01b3;

/// Extend prefix hashes `h` (where `h[n]` identifies the first `n` tokens; polynomial rolling
/// hash, equality always confirmed exactly) by `tokens`.
fn extend_hashes(h: &mut Vec<u64>, tokens: &[u32]) {
    let b1 = HASH_BASE;
    let b2 = b1.wrapping_mul(b1);
    let b3 = b2.wrapping_mul(b1);
    let b4 = b3.wrapping_mul(b1);
    let mut acc = h.last().copied().unwrap_or(HASH_SEED);
    h.reserve(tokens.len());
    // Four positions per step, each from the same `acc`: the same values as one token at a
    // time, with a quarter of the multiply chain (hashing is latency-bound).
    let mut chunks = tokens.chunks_exact(4);
    for c in &mut chunks {
        let x = [c[0], c[1], c[2], c[3]].map(|t| u64::from(t) + 1);
        let h1 = acc.wrapping_mul(b1).wrapping_add(x[0]);
        let h2 = acc
            .wrapping_mul(b2)
            .wrapping_add(x[0].wrapping_mul(b1))
            .wrapping_add(x[1]);
        let s3 = x[0]
            .wrapping_mul(b2)
            .wrapping_add(x[1].wrapping_mul(b1))
            .wrapping_add(x[2]);
        let h3 = acc.wrapping_mul(b3).wrapping_add(s3);
        let h4 = acc
            .wrapping_mul(b4)
            .wrapping_add(s3.wrapping_mul(b1))
            .wrapping_add(x[3]);
        h.extend_from_slice(&[h1, h2, h3, h4]);
        acc = h4;
    }
    for &t in chunks.remainder() {
        acc = acc.wrapping_mul(b1).wrapping_add(u64::from(t) + 1);
        h.push(acc);
    }
}

/// Length of the common prefix, compared a chunk at a time (memcmp) before token by token.
fn common_prefix_len(a: &[u32], b: &[u32]) -> usize {
    const CHUNK: usize = 64;
    let n = a.len().min(b.len());
    let mut i = 0;
    while i + CHUNK <= n && a[i..i + CHUNK] == b[i..i + CHUNK] {
        i += CHUNK;
    }
    i + a[i..n]
        .iter()
        .zip(&b[i..n])
        .take_while(|(x, y)| x == y)
        .count()
}

/// A prompt with its prefix hashes.
struct Prompt<'a> {
    tokens: &'a [u32],
    h: &'a [u64],
}

impl Prompt<'_> {
    /// Is `prefix` (of length `n`, hash `hash`) a prefix of this prompt?
    fn starts_with(&self, prefix: &[u32], hash: u64) -> bool {
        let n = prefix.len();
        n <= self.tokens.len() && self.h[n] == hash && &self.tokens[..n] == prefix
    }
}

/// A position in a chain's token sequence, with the hash of the tokens before it.
#[derive(Clone, Copy)]
struct Mark {
    at: usize,
    hash: u64,
}

struct Chain {
    /// prompt₀ + response₀ + interstitial₁ + response₁ + …: exactly the context the model saw.
    tokens: Vec<u32>,
    /// End of the first prompt: the part of `tokens` that is not in the trace's response.
    first_prompt: Mark,
    /// End of the last call's prompt (a prefix of `tokens`).
    last_prompt: Mark,
    /// End of each turn but the last: a branch may continue from one of these.
    turn_ends: Vec<Mark>,
    /// End of every prompt of the chain: a call with exactly one of these prompts is another
    /// sample from the same point.
    prompt_ends: Vec<Mark>,
    mask: Vec<u8>,
    logprobs: Vec<Option<f64>>,
    completions: Vec<u64>,
    finish_reason: Option<String>,
    has_logprobs: bool,
    start: ChainStart,
    /// For a chain that branched off another one after a completed turn: that chain. Decided in
    /// hindsight: if the parent never continues, the branch was a history rewrite.
    branched_from: Option<usize>,
    open: bool,
}

impl Chain {
    fn new(
        r: &CompletionRecord,
        prompt: &Prompt,
        start: ChainStart,
        branched_from: Option<usize>,
    ) -> Self {
        let end = Mark {
            at: prompt.tokens.len(),
            hash: prompt.h[prompt.tokens.len()],
        };
        let mut tokens =
            Vec::with_capacity(r.prompt_token_ids.len() + r.completion_token_ids.len());
        tokens.extend_from_slice(&r.prompt_token_ids);
        tokens.extend_from_slice(&r.completion_token_ids);
        Self {
            tokens,
            first_prompt: end,
            last_prompt: end,
            turn_ends: Vec::new(),
            prompt_ends: vec![end],
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

    fn at(&self, mark: Mark) -> &[u32] {
        &self.tokens[..mark.at]
    }

    fn last_response(&self) -> &[u32] {
        &self.tokens[self.last_prompt.at..]
    }

    /// Append a call whose prompt extends `tokens` (checked by the caller).
    fn extend(&mut self, r: &CompletionRecord, prompt: &Prompt) {
        let turn_end = self.tokens.len();
        self.turn_ends.push(Mark {
            at: turn_end,
            hash: prompt.h[turn_end],
        });
        let interstitial = &r.prompt_token_ids[turn_end..];
        self.mask.extend(std::iter::repeat_n(0, interstitial.len()));
        self.logprobs
            .extend(std::iter::repeat_n(None, interstitial.len()));
        self.tokens.extend_from_slice(interstitial);
        self.last_prompt = Mark {
            at: self.tokens.len(),
            hash: prompt.h[self.tokens.len()],
        };
        self.prompt_ends.push(self.last_prompt);
        self.tokens.extend_from_slice(&r.completion_token_ids);
        self.mask
            .extend(std::iter::repeat_n(1, r.completion_token_ids.len()));
        self.logprobs.extend(sampled_logprobs(r));
        self.completions.push(r.seq);
        self.finish_reason = r.finish_reason.clone();
    }

    fn into_trace(self) -> Trace {
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

fn has_logprobs(r: &CompletionRecord) -> bool {
    r.logprobs
        .as_ref()
        .is_some_and(|lp| lp.len() == r.completion_token_ids.len())
}

fn stopped_on_its_own(finish_reason: Option<&str>) -> bool {
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
fn merge_blocker(
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

/// Build merged traces from calls in time order. `eot` is the end-of-turn token id, if known.
pub fn build(
    records: &[&CompletionRecord],
    eot: Option<u32>,
    max_length: Option<usize>,
) -> Vec<Trace> {
    let mut chains: Vec<Chain> = Vec::new();
    // One hash buffer for the whole build: consecutive prompts share at least the system
    // prompt, whose hashes are kept instead of recomputed or copied.
    let mut h = vec![HASH_SEED];
    let mut previous: &[u32] = &[];
    for r in records {
        let shared = common_prefix_len(previous, &r.prompt_token_ids);
        h.truncate(shared + 1);
        extend_hashes(&mut h, &r.prompt_token_ids[shared..]);
        let prompt = Prompt {
            tokens: &r.prompt_token_ids,
            h: &h,
        };
        if let Some((start, branched_from)) = attach(&mut chains, r, &prompt, eot, max_length) {
            chains.push(Chain::new(r, &prompt, start, branched_from));
        }
        previous = &r.prompt_token_ids;
    }
    // A branch whose parent never went on was not a parallel branch: the harness rewrote the
    // history (compaction, trimmed tool output) and continued from the rewritten version.
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

/// Extend the right chain with `r` (→ `None`), or say why `r` starts a new one (and which
/// chain it branched off after a completed turn, if any).
fn attach(
    chains: &mut [Chain],
    r: &CompletionRecord,
    prompt: &Prompt,
    eot: Option<u32>,
    max_length: Option<usize>,
) -> Option<(ChainStart, Option<usize>)> {
    let len = prompt.tokens.len();
    // Open chains whose last prompt is a strict prefix of this prompt, longest prefix first,
    // most recent first on a tie (parallel samples from one point share a last prompt).
    let mut candidates: Vec<usize> = (0..chains.len())
        .filter(|&i| {
            let c = &chains[i];
            c.open
                && c.last_prompt.at < len
                && prompt.starts_with(c.at(c.last_prompt), c.last_prompt.hash)
        })
        .collect();
    candidates.sort_by_key(|&i| std::cmp::Reverse((chains[i].last_prompt.at, i)));
    let mut blockers = Vec::new();
    for &i in &candidates {
        match merge_blocker(&chains[i], r, eot, max_length) {
            None => {
                chains[i].extend(r, prompt);
                return None;
            }
            Some(reason) => blockers.push((i, reason)),
        }
    }
    // Nothing to extend. A call from a point some *other* chain passed through is a branch.
    // (The candidates are excluded: this prompt holds their whole last prompt, so it diverges
    // inside their last turn, which is a rewrite, not a branch.)
    // (A flag per chain: `candidates.contains` for every chain was chains × candidates steps a
    // call, and a session's calls are the agent's to shape: n forks from one point, each
    // refused, took n³ steps over the session.)
    let mut is_candidate = vec![false; chains.len()];
    for &i in &candidates {
        is_candidate[i] = true;
    }
    let others: Vec<usize> = (0..chains.len()).filter(|&i| !is_candidate[i]).collect();
    let same_point = others.iter().any(|&i| {
        let c = &chains[i];
        c.prompt_ends
            .iter()
            .any(|&end| end.at == len && prompt.starts_with(c.at(end), end.hash))
    });
    if same_point {
        return Some((ChainStart::Fork, None));
    }
    // The deepest explanation wins: a branch point counts only if it lies deeper in the
    // prompt than every blocked candidate's last prompt.
    let deepest_candidate = candidates.first().map_or(0, |&i| chains[i].last_prompt.at);
    let branch = others
        .iter()
        .flat_map(|&i| chains[i].turn_ends.iter().map(move |&end| (end, i)))
        .filter(|&(end, i)| {
            end.at > deepest_candidate
                && end.at < len
                && prompt.starts_with(chains[i].at(end), end.hash)
        })
        .max_by_key(|&(end, i)| (end.at, i));
    if let Some((_, parent)) = branch {
        return Some((ChainStart::Fork, Some(parent)));
    }
    if let Some(&(i, reason)) = blockers.first() {
        chains[i].open = false;
        return Some((reason, None));
    }
    Some((classify_unattached(chains, prompt), None))
}

/// A call that extends no chain's last prompt and branches from none: a rewritten history or
/// a new context.
fn classify_unattached(chains: &mut [Chain], prompt: &Prompt) -> ChainStart {
    if chains.is_empty() {
        return ChainStart::First;
    }
    // Keeps an open chain's whole first prompt, then differs: its later history was rewritten.
    let rewritten = chains.iter_mut().find(|c| {
        c.open
            && prompt.tokens.len() > c.first_prompt.at
            && prompt.starts_with(&c.tokens[..c.first_prompt.at], c.first_prompt.hash)
    });
    match rewritten {
        Some(chain) => {
            chain.open = false;
            ChainStart::PrefixChanged
        }
        None => ChainStart::NewContext,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reused_prefix_hashes_equal_fresh_ones() {
        let a: Vec<u32> = (0..300).collect();
        let mut b = a.clone();
        b[200] = 7;
        b.push(9);
        let mut fresh = vec![HASH_SEED];
        extend_hashes(&mut fresh, &b);
        let mut reused = vec![HASH_SEED];
        extend_hashes(&mut reused, &a);
        let shared = common_prefix_len(&a, &b);
        reused.truncate(shared + 1);
        extend_hashes(&mut reused, &b[shared..]);
        assert_eq!(reused, fresh);
        // The four-at-a-time hashing equals the plain recurrence.
        let mut plain = vec![HASH_SEED];
        for &t in &b {
            let last = *plain.last().unwrap_or(&HASH_SEED);
            plain.push(last.wrapping_mul(HASH_BASE).wrapping_add(u64::from(t) + 1));
        }
        assert_eq!(fresh, plain);
        assert_eq!(shared, 200);
        assert_eq!(common_prefix_len(&a, &a[..130]), 130);
    }
}
