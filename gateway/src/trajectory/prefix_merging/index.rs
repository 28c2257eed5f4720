//! Chains indexed by a mark of theirs (a position in their tokens and the hash of what lies
//! before it), so a call finds the chains a prefix of its prompt names by looking its own
//! prefix hashes up: a lookup per distinct marked position shorter than the prompt, however
//! many chains the session has. Scanning every chain for every call made a session's build
//! quadratic in its calls, and an agent decides how many calls and chains it makes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

use super::hashing::Prompt;

/// Entries of type `K` (ordered: a chain's index, or a priority ending in one) under marks.
pub struct MarkIndex<K> {
    by_position: BTreeMap<usize, Position<K>>,
}

/// The entries marked at one position. Most positions hold one mark (a chain's; or many
/// chains', after one point), and a call tests every position shorter than its prompt: a
/// comparison for those, a table lookup only where marks differ.
enum Position<K> {
    One(u64, BTreeSet<K>),
    Many(HashMap<u64, BTreeSet<K>, KeyedAlready>),
}

impl<K: Ord> Position<K> {
    fn get(&self, hash: u64) -> Option<&BTreeSet<K>> {
        match self {
            Self::One(h, keys) => (*h == hash).then_some(keys),
            Self::Many(by_hash) => by_hash.get(&hash),
        }
    }

    fn insert(&mut self, hash: u64, key: K) {
        if let Self::One(h, keys) = self {
            if *h == hash {
                keys.insert(key);
                return;
            }
            let mut by_hash = HashMap::default();
            by_hash.insert(*h, std::mem::take(keys));
            *self = Self::Many(by_hash);
        }
        if let Self::Many(by_hash) = self {
            by_hash.entry(hash).or_default().insert(key);
        }
    }

    /// Remove an entry; whether the position holds none now.
    fn remove(&mut self, hash: u64, key: &K) -> bool {
        match self {
            Self::One(h, keys) => {
                if *h == hash {
                    keys.remove(key);
                }
                keys.is_empty()
            }
            Self::Many(by_hash) => {
                if let Some(keys) = by_hash.get_mut(&hash) {
                    keys.remove(key);
                    if keys.is_empty() {
                        by_hash.remove(&hash);
                    }
                }
                by_hash.is_empty()
            }
        }
    }
}

/// The marks' hashes are keyed per build already, so a cheap mix is enough: hashbrown picks a
/// bucket by the low bits and a tag by the top ones, and prompts whose tokens differ by
/// multiples of 2¹⁶ (ids 5 and 65,541 in a 150k vocabulary) have hashes equal in their low
/// bits, which as they are would share a probe sequence (murmur3's finalizer folds the high
/// bits in).
type KeyedAlready = BuildHasherDefault<Mixed>;

#[derive(Default)]
struct Mixed(u64);

impl Hasher for Mixed {
    fn finish(&self) -> u64 {
        let z = (self.0 ^ (self.0 >> 33)).wrapping_mul(0xff51_afd7_ed55_8ccd);
        z ^ (z >> 33)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

impl<K> Default for MarkIndex<K> {
    fn default() -> Self {
        Self {
            by_position: BTreeMap::new(),
        }
    }
}

impl<K: Ord + Copy> MarkIndex<K> {
    pub fn insert(&mut self, at: usize, hash: u64, key: K) {
        match self.by_position.get_mut(&at) {
            Some(position) => position.insert(hash, key),
            None => {
                self.by_position
                    .insert(at, Position::One(hash, BTreeSet::from([key])));
            }
        }
    }

    pub fn remove(&mut self, at: usize, hash: u64, key: K) {
        if let Some(position) = self.by_position.get_mut(&at) {
            if position.remove(hash, &key) {
                self.by_position.remove(&at);
            }
        }
    }

    /// The entries whose mark is at `at` with the hash `prompt`'s first `at` tokens have (a
    /// hash match only: the caller confirms it), in order.
    pub fn matching(&self, at: usize, prompt: &Prompt) -> Option<&BTreeSet<K>> {
        if at > prompt.len() {
            return None;
        }
        self.by_position.get(&at)?.get(prompt.hash(at))
    }

    /// The marked positions in `range`, deepest first, with the entries matching `prompt`
    /// there.
    pub fn matching_in<'a>(
        &'a self,
        range: std::ops::Range<usize>,
        prompt: &'a Prompt,
    ) -> impl Iterator<Item = (usize, &'a BTreeSet<K>)> + Clone + 'a {
        let end = range.end.min(prompt.len() + 1);
        let range = range.start..end.max(range.start);
        self.by_position
            .range(range)
            .rev()
            .filter_map(|(&at, position)| position.get(prompt.hash(at)).map(|keys| (at, keys)))
    }
}

#[cfg(test)]
mod tests {
    use super::super::hashing::{PrefixHash, SEED};
    use super::*;

    #[test]
    fn marks_are_found_by_the_prompts_they_are_prefixes_of() {
        let mut hash = PrefixHash::random();
        let tokens = [4u32, 5, 6, 7];
        let mut h = vec![SEED];
        hash.extend(&mut h, &tokens);
        let prompt = Prompt {
            tokens: &tokens,
            h: &h,
        };
        let mut index = MarkIndex::default();
        index.insert(2, h[2], 1usize);
        index.insert(2, h[2], 3);
        index.insert(3, h[3], 2);
        index.insert(3, hash.continued(2, h[2], &[9]), 5);
        index.insert(9, 0, 6);
        let all: Vec<(usize, Vec<usize>)> = index
            .matching_in(0..4, &prompt)
            .map(|(at, keys)| (at, keys.iter().copied().collect()))
            .collect();
        assert_eq!(all, [(3, vec![2]), (2, vec![1, 3])]);
        assert_eq!(index.matching_in(0..3, &prompt).count(), 1);
        assert!(index.matching(9, &prompt).is_none());
        index.remove(2, h[2], 1);
        index.remove(3, h[3], 2);
        index.remove(3, h[3], 2);
        let left: Vec<usize> = index
            .matching_in(0..10, &prompt)
            .flat_map(|(_, keys)| keys.iter().copied())
            .collect();
        assert_eq!(left, [3]);
        assert_eq!(index.by_position.len(), 3);
        // A position is gone with its last entry, whether it held one mark or several.
        index.remove(3, hash.continued(2, h[2], &[9]), 5);
        index.remove(9, 0, 6);
        assert_eq!(index.by_position.keys().collect::<Vec<_>>(), [&2]);
    }
}
