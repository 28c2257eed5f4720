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
//! Cost: each call hashes the part of its prompt the previous call's prompt does not share,
//! then looks its prefix hashes up in indexes of the chains' marks ([`index`]): at most a
//! lookup per distinct marked position shorter than its prompt. Each search ranks its hits by
//! the hashes alone and compares only the one it acts on token by token (a collision, when
//! that one is not a prefix, sends it the long way: each hit compared in order). A session's
//! build is therefore linear in its prompts' tokens (which its budget bounds) whatever number
//! of chains its agent makes, and many agents sharing a long system prompt cost no more than
//! one. [`Merger`] takes the calls one at a time, so a build can be continued as the session
//! goes on.

mod chain;
mod hashing;
mod index;
#[cfg(test)]
mod reference;
#[cfg(test)]
mod tests;

use chain::{has_logprobs, merge_blocker, Chain};
use hashing::{common_prefix_len, Mark, PrefixHash, Prompt, SEED};
use index::MarkIndex;

use std::cmp::Reverse;

use super::types::{ChainStart, Trace};
use crate::capture::CompletionRecord;

/// Build merged traces from calls in time order. `eot` is the end-of-turn token id, if known.
pub fn build(
    records: &[&CompletionRecord],
    eot: Option<u32>,
    max_length: Option<usize>,
) -> Vec<Trace> {
    let mut merger = Merger::new(eot, max_length);
    for r in records {
        merger.push(r);
    }
    merger.finish()
}

/// Where an open chain may be continued from, for the index of open chains by their whole
/// tokens: whether it has log-probs and needs an end-of-turn token after it (what decides,
/// with the call, whether the call may continue it), then its priority among candidates.
type Continuable = (bool, bool, usize, usize);

/// A prefix-merging build, call by call.
pub struct Merger {
    hash: PrefixHash,
    eot: Option<u32>,
    max_length: Option<usize>,
    chains: Vec<Chain>,
    /// Prefix hashes of the last call's prompt, kept for the next (consecutive prompts share
    /// at least the system prompt, whose hashes are kept instead of recomputed or copied).
    h: Vec<u64>,
    /// The chain the last call went to: its last prompt is that call's prompt.
    previous: Option<usize>,
    /// Open chains by their last prompt: the candidates a call may continue.
    open_last: MarkIndex<usize>,
    /// Open chains by their whole tokens: the candidates a call may continue at once.
    open_whole: MarkIndex<Continuable>,
    /// Open chains by their first prompt: a call that keeps one and differs after it rewrote
    /// that chain's history.
    open_first: MarkIndex<usize>,
    /// Every chain by each of its prompts: a call with one of them is another sample from
    /// that point.
    prompt_ends: MarkIndex<usize>,
    /// Every chain by the end of each of its turns but the last: a call may branch there.
    turn_ends: MarkIndex<usize>,
    /// Tokens compared confirming hits, for tests of what a build costs.
    #[cfg(test)]
    compared: std::cell::Cell<usize>,
}

impl Merger {
    pub fn new(eot: Option<u32>, max_length: Option<usize>) -> Self {
        Self::with_hash(PrefixHash::random(), eot, max_length)
    }

    fn with_hash(hash: PrefixHash, eot: Option<u32>, max_length: Option<usize>) -> Self {
        Self {
            hash,
            eot,
            max_length,
            chains: Vec::new(),
            h: vec![SEED],
            previous: None,
            open_last: MarkIndex::default(),
            open_whole: MarkIndex::default(),
            open_first: MarkIndex::default(),
            prompt_ends: MarkIndex::default(),
            turn_ends: MarkIndex::default(),
            #[cfg(test)]
            compared: std::cell::Cell::new(0),
        }
    }

    /// Take the next call. Calls must come in time order (`started_at_ms`, then `seq`): a
    /// call taken late is not where a build from scratch would put it.
    pub fn push(&mut self, r: &CompletionRecord) {
        let previous = self
            .previous
            .map_or(&[][..], |i| self.chains[i].at(self.chains[i].last_prompt));
        let shared = common_prefix_len(previous, &r.prompt_token_ids);
        let mut h = std::mem::take(&mut self.h);
        h.truncate(shared + 1);
        self.hash.extend(&mut h, &r.prompt_token_ids[shared..]);
        let prompt = Prompt {
            tokens: &r.prompt_token_ids,
            h: &h,
        };
        let chain = match self.attach(r, &prompt) {
            Ok(i) => i,
            Err((start, branched_from)) => {
                let chain = Chain::new(r, &prompt, &mut self.hash, start, branched_from);
                self.chains.push(chain);
                let i = self.chains.len() - 1;
                let c = &self.chains[i];
                self.open_first
                    .insert(c.first_prompt.at, c.first_prompt.hash, i);
                self.prompt_ends
                    .insert(c.last_prompt.at, c.last_prompt.hash, i);
                self.index_open(i);
                i
            }
        };
        self.previous = Some(chain);
        self.h = h;
    }

    /// The traces, with the decisions made in hindsight.
    pub fn finish(self) -> Vec<Trace> {
        chain::into_traces(self.chains)
    }

    /// The continuable key of open chain `i`.
    fn continuable(&self, i: usize) -> (Mark, Continuable) {
        let c = &self.chains[i];
        let key = (
            c.has_logprobs,
            c.needs_closing(self.eot),
            c.last_prompt.at,
            i,
        );
        (c.whole, key)
    }

    fn index_open(&mut self, i: usize) {
        let (whole, key) = self.continuable(i);
        self.open_whole.insert(whole.at, whole.hash, key);
        let last = self.chains[i].last_prompt;
        self.open_last.insert(last.at, last.hash, i);
    }

    fn unindex_open(&mut self, i: usize) {
        let (whole, key) = self.continuable(i);
        self.open_whole.remove(whole.at, whole.hash, key);
        let last = self.chains[i].last_prompt;
        self.open_last.remove(last.at, last.hash, i);
    }

    fn close(&mut self, i: usize) {
        self.unindex_open(i);
        let first = self.chains[i].first_prompt;
        self.open_first.remove(first.at, first.hash, i);
        self.chains[i].open = false;
    }

    /// Does chain `i`'s context up to `mark` begin `prompt`? Exact: a hash hit confirmed.
    fn begins(&self, i: usize, mark: Mark, prompt: &Prompt) -> bool {
        #[cfg(test)]
        self.compared.set(self.compared.get() + mark.at);
        prompt.starts_with(self.chains[i].at(mark), mark.hash)
    }

    /// Extend the right chain with `r` (→ its index), or say why `r` starts a new one (and
    /// which chain it branched off after a completed turn, if any).
    fn attach(
        &mut self,
        r: &CompletionRecord,
        prompt: &Prompt,
    ) -> Result<usize, (ChainStart, Option<usize>)> {
        if let Some(i) = self.continued(r, prompt) {
            self.extend(i, r, prompt);
            return Ok(i);
        }
        let len = prompt.len();
        // Open chains whose last prompt is a strict prefix of this prompt, longest prefix
        // first, most recent first on a tie (parallel samples from one point share a last
        // prompt). None of them can be continued; the first says why.
        let first_candidate = self
            .open_last
            .matching_in(0..len, prompt)
            .find_map(|(_, keys)| {
                keys.iter()
                    .rev()
                    .copied()
                    .find(|&i| self.begins(i, self.chains[i].last_prompt, prompt))
            });
        // A call from a point some *other* chain passed through is a branch. (A candidate
        // is never one: this prompt holds its whole last prompt, so it diverges inside its
        // last turn, which is a rewrite, not a branch; its prompts and turn ends all lie
        // before its last prompt's end, which the searches below start after.)
        let same_point = self.prompt_ends.matching(len, prompt).is_some_and(|keys| {
            keys.iter()
                .any(|&i| self.begins(i, prompt.mark(len), prompt))
        });
        if same_point {
            return Err((ChainStart::Fork, None));
        }
        // The deepest explanation wins: a branch point counts only if it lies deeper in the
        // prompt than every blocked candidate's last prompt.
        let deepest_candidate = first_candidate.map_or(0, |i| self.chains[i].last_prompt.at);
        let branch = self
            .turn_ends
            .matching_in(deepest_candidate + 1..len, prompt)
            .find_map(|(at, keys)| {
                keys.iter()
                    .rev()
                    .copied()
                    .find(|&i| self.begins(i, prompt.mark(at), prompt))
            });
        if let Some(parent) = branch {
            return Err((ChainStart::Fork, Some(parent)));
        }
        if let Some(i) = first_candidate {
            match merge_blocker(&self.chains[i], r, self.eot, self.max_length) {
                Some(reason) => {
                    self.close(i);
                    return Err((reason, None));
                }
                // `continued` finds every candidate that may be continued: never here.
                None => {
                    debug_assert!(false, "chain {i} may be continued but was not found");
                    self.extend(i, r, prompt);
                    return Ok(i);
                }
            }
        }
        Err((self.classify_unattached(prompt), None))
    }

    /// The open chain `r` continues: of those whose whole tokens begin its prompt and whose
    /// last turn it may follow, the one with the longest last prompt, the most recent on a tie.
    fn continued(&self, r: &CompletionRecord, prompt: &Prompt) -> Option<usize> {
        let len = prompt.len();
        if self
            .max_length
            .is_some_and(|max| len + r.completion_token_ids.len() > max)
        {
            return None;
        }
        let logprobs = has_logprobs(r);
        // The entries that may be continued, as far as the hashes tell, by position and
        // class: a candidate's last prompt is a strict prefix of the prompt.
        let classes = self
            .open_whole
            .matching_in(0..len + 1, prompt)
            .flat_map(|(at, keys)| {
                let closed = self.eot.is_some() && prompt.tokens.get(at) == self.eot.as_ref();
                [false, true]
                    .into_iter()
                    .filter(move |&needs_closing| closed || !needs_closing)
                    .map(move |nc| keys.range((logprobs, nc, 0, 0)..(logprobs, nc, len, 0)))
            });
        let rank = |&(_, _, last_at, i): &Continuable| (last_at, i);
        best_confirmed(
            classes
                .clone()
                .filter_map(|mut class| class.next_back().map(rank)),
            || classes.flatten().map(rank).collect(),
            |(_, i)| self.begins(i, self.chains[i].whole, prompt),
        )
        .map(|(_, i)| i)
    }

    fn extend(&mut self, i: usize, r: &CompletionRecord, prompt: &Prompt) {
        self.unindex_open(i);
        let turn_end = self.chains[i].whole;
        self.turn_ends.insert(turn_end.at, turn_end.hash, i);
        self.chains[i].extend(r, prompt, &mut self.hash);
        let last = self.chains[i].last_prompt;
        self.prompt_ends.insert(last.at, last.hash, i);
        self.index_open(i);
    }

    /// A call that extends no chain's last prompt and branches from none: a rewritten history
    /// or a new context.
    fn classify_unattached(&mut self, prompt: &Prompt) -> ChainStart {
        if self.chains.is_empty() {
            return ChainStart::First;
        }
        // Keeps an open chain's whole first prompt, then differs: its later history was
        // rewritten. (The earliest such chain.)
        let hits = || self.open_first.matching_in(0..prompt.len(), prompt);
        let rewritten = best_confirmed(
            hits().filter_map(|(at, keys)| keys.first().map(|&i| Reverse((i, at)))),
            || {
                hits()
                    .flat_map(|(at, keys)| keys.iter().map(move |&i| Reverse((i, at))))
                    .collect()
            },
            |Reverse((i, at))| self.begins(i, prompt.mark(at), prompt),
        );
        match rewritten {
            Some(Reverse((i, _))) => {
                self.close(i);
                ChainStart::PrefixChanged
            }
            None => ChainStart::NewContext,
        }
    }
}

/// The best hit (the greatest) that `confirm` accepts. The hits are ranked by their hashes
/// alone: only the best of `tops` (each bucket's best) is compared token by token, since
/// comparing every hit that would beat the best so far costs a session's chains times their
/// length on every call. One that is not a prefix (a collision, at most 2⁻³² a pair) sends
/// the search the long way: `all` the hits, best first, each confirmed.
fn best_confirmed<T: Ord + Copy>(
    tops: impl Iterator<Item = T>,
    all: impl FnOnce() -> Vec<T>,
    confirm: impl Fn(T) -> bool,
) -> Option<T> {
    let best = tops.max()?;
    if confirm(best) {
        return Some(best);
    }
    let mut all = all();
    all.sort_unstable_by(|a, b| b.cmp(a));
    all.into_iter().find(|&hit| confirm(hit))
}
