//! The builder as it was before its chains were indexed: every chain scanned for every call.
//! Slow, and plainly right; the tests check that [`super::Merger`] builds the same traces.

use super::chain::{merge_blocker, Chain};
use super::hashing::{common_prefix_len, Mark, PrefixHash, Prompt, SEED};
use crate::capture::CompletionRecord;
use crate::trajectory::types::{ChainStart, Trace};

/// Build merged traces from calls in time order. `eot` is the end-of-turn token id, if known.
pub fn build(
    records: &[&CompletionRecord],
    eot: Option<u32>,
    max_length: Option<usize>,
) -> Vec<Trace> {
    let mut chains: Vec<Chain> = Vec::new();
    // Each chain's prompt ends and turn ends, which the indexed builder keeps in its indexes.
    let mut ends: Vec<Ends> = Vec::new();
    // One hash buffer for the whole build: consecutive prompts share at least the system
    // prompt, whose hashes are kept instead of recomputed or copied.
    let mut hash = PrefixHash::random();
    let mut h = vec![SEED];
    let mut previous: &[u32] = &[];
    for r in records {
        let shared = common_prefix_len(previous, &r.prompt_token_ids);
        h.truncate(shared + 1);
        hash.extend(&mut h, &r.prompt_token_ids[shared..]);
        let prompt = Prompt {
            tokens: &r.prompt_token_ids,
            h: &h,
        };
        if let Some((start, branched_from)) = attach(
            &mut chains,
            &mut ends,
            r,
            &prompt,
            &mut hash,
            eot,
            max_length,
        ) {
            let chain = Chain::new(r, &prompt, &mut hash, start, branched_from);
            ends.push(Ends {
                prompts: vec![chain.last_prompt],
                turns: Vec::new(),
            });
            chains.push(chain);
        }
        previous = &r.prompt_token_ids;
    }
    super::chain::into_traces(chains)
}

/// Where a chain's prompts and turns (all but the last) end.
struct Ends {
    prompts: Vec<Mark>,
    turns: Vec<Mark>,
}

/// Extend the right chain with `r` (→ `None`), or say why `r` starts a new one (and which
/// chain it branched off after a completed turn, if any).
fn attach(
    chains: &mut [Chain],
    ends: &mut [Ends],
    r: &CompletionRecord,
    prompt: &Prompt,
    hash: &mut PrefixHash,
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
                ends[i].turns.push(chains[i].whole);
                chains[i].extend(r, prompt, hash);
                ends[i].prompts.push(chains[i].last_prompt);
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
        ends[i]
            .prompts
            .iter()
            .any(|&end| end.at == len && prompt.starts_with(chains[i].at(end), end.hash))
    });
    if same_point {
        return Some((ChainStart::Fork, None));
    }
    // The deepest explanation wins: a branch point counts only if it lies deeper in the
    // prompt than every blocked candidate's last prompt.
    let deepest_candidate = candidates.first().map_or(0, |&i| chains[i].last_prompt.at);
    let branch = others
        .iter()
        .flat_map(|&i| ends[i].turns.iter().map(move |&end| (end, i)))
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
