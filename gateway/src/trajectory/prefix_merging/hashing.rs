//! Prefix hashes of prompts: `h[n]` names the first `n` tokens, so "is this chain's context a
//! prefix of that prompt?" costs one lookup, confirmed by one exact comparison when acted on.
//!
//! A multilinear hash, `h[n] = Σ kᵢ·(tᵢ+1) mod 2⁶⁴` over the first `n` tokens, with keys `kᵢ`
//! drawn per build. Two different prompts of one length collide with probability at most
//! 2⁻³² (token ids are below 2³²) for keys the agent cannot know. The polynomial hash before
//! it (modulo 2⁶⁴, one public base) had strings that collide under every base (Thue–Morse),
//! and an agent shapes its own prompts: every collision costs a full comparison. Each token is
//! one multiply-add that does not wait on the one before, so it also costs less than a
//! polynomial modulo a prime. The traces never depend on the keys: every hit acted on is
//! compared token by token.

use rand::RngExt;

/// The hash of the empty prefix.
pub const SEED: u64 = 0;

/// A keyed prefix hash: its keys, one per position, made as prompts reach them.
pub struct PrefixHash {
    keys: Vec<u64>,
    /// splitmix64's state: the next key's.
    state: u64,
    /// ANDed into each key: all ones, or none for a hash under which every prefix of a length
    /// collides (tests of the paths a collision takes).
    mask: u64,
}

impl PrefixHash {
    pub fn random() -> Self {
        Self::seeded(rand::rng().random())
    }

    pub fn seeded(seed: u64) -> Self {
        Self {
            keys: Vec::new(),
            state: seed,
            mask: u64::MAX,
        }
    }

    /// Every prefix of a length has one hash: every lookup hits, every hit needs its comparison.
    #[cfg(test)]
    pub fn colliding() -> Self {
        Self {
            mask: 0,
            ..Self::seeded(0)
        }
    }

    /// The keys of positions `from..from + n`.
    fn keys(&mut self, from: usize, n: usize) -> &[u64] {
        while self.keys.len() < from + n {
            // splitmix64 (Steele, Lea, Flood 2014).
            self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            self.keys.push((z ^ (z >> 31)) & self.mask);
        }
        &self.keys[from..from + n]
    }

    /// Extend prefix hashes `h` (`h[0]` is [`SEED`]) by `tokens`.
    pub fn extend(&mut self, h: &mut Vec<u64>, tokens: &[u32]) {
        let from = h.len().saturating_sub(1);
        let mut acc = h.last().copied().unwrap_or(SEED);
        h.reserve(tokens.len());
        for (&k, &t) in self.keys(from, tokens.len()).iter().zip(tokens) {
            acc = acc.wrapping_add(k.wrapping_mul(u64::from(t) + 1));
            h.push(acc);
        }
    }

    /// The hash of a prefix of length `at` whose hash is `prefix`, extended by `tokens`.
    pub fn continued(&mut self, at: usize, prefix: u64, tokens: &[u32]) -> u64 {
        self.keys(at, tokens.len())
            .iter()
            .zip(tokens)
            .fold(prefix, |acc, (&k, &t)| {
                acc.wrapping_add(k.wrapping_mul(u64::from(t) + 1))
            })
    }
}

/// Length of the common prefix, compared a chunk at a time (memcmp) before token by token.
pub fn common_prefix_len(a: &[u32], b: &[u32]) -> usize {
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

/// A position in a token sequence, with the hash of the tokens before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mark {
    pub at: usize,
    pub hash: u64,
}

/// A prompt with its prefix hashes.
pub struct Prompt<'a> {
    pub tokens: &'a [u32],
    pub h: &'a [u64],
}

impl Prompt<'_> {
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// The hash of the first `n` tokens (`n` at most the prompt's length).
    pub fn hash(&self, n: usize) -> u64 {
        self.h[n]
    }

    /// The mark of its first `at` tokens (`at` at most its length).
    pub fn mark(&self, at: usize) -> Mark {
        Mark {
            at,
            hash: self.hash(at),
        }
    }

    /// Is `prefix` (hash `hash`) a prefix of this prompt? Exact.
    pub fn starts_with(&self, prefix: &[u32], hash: u64) -> bool {
        let n = prefix.len();
        n <= self.tokens.len() && self.h[n] == hash && &self.tokens[..n] == prefix
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reused_prefix_hashes_equal_fresh_ones_and_continued_ones() {
        let mut hash = PrefixHash::random();
        let a: Vec<u32> = (0..300).collect();
        let mut b = a.clone();
        b[200] = 7;
        b.push(u32::MAX);
        let mut fresh = vec![SEED];
        hash.extend(&mut fresh, &b);
        let mut reused = vec![SEED];
        hash.extend(&mut reused, &a);
        let shared = common_prefix_len(&a, &b);
        reused.truncate(shared + 1);
        hash.extend(&mut reused, &b[shared..]);
        assert_eq!(reused, fresh);
        assert_eq!(hash.continued(100, fresh[100], &b[100..]), fresh[b.len()]);
        assert_ne!(fresh[201], {
            let mut other = vec![SEED];
            hash.extend(&mut other, &a[..201]);
            other[201]
        });
        assert_eq!(shared, 200);
        assert_eq!(common_prefix_len(&a, &a[..130]), 130);
    }

    #[test]
    fn builds_draw_their_own_keys() {
        let tokens = [5u32, 6, 7];
        let of = |mut hash: PrefixHash| hash.continued(0, SEED, &tokens);
        assert_eq!(of(PrefixHash::seeded(7)), of(PrefixHash::seeded(7)));
        assert_ne!(of(PrefixHash::seeded(7)), of(PrefixHash::seeded(8)));
        assert_ne!(of(PrefixHash::random()), of(PrefixHash::random()));
    }

    #[test]
    fn thue_morse_strings_that_collide_under_the_old_hash_do_not_here() {
        // The classic attack on polynomial hashing modulo 2⁶⁴: a Thue–Morse string and its
        // complement collide for every odd base once they are 2¹¹ long.
        let t: Vec<u32> = (0u32..2048).map(|i| i.count_ones() % 2).collect();
        let u: Vec<u32> = t.iter().map(|x| 1 - x).collect();
        let polynomial = |s: &[u32], base: u64| {
            s.iter().fold(1u64, |acc, &x| {
                acc.wrapping_mul(base).wrapping_add(u64::from(x) + 1)
            })
        };
        for base in [0x100_0000_01b3, 3, 0x9e37_79b9_7f4a_7c15] {
            assert_eq!(polynomial(&t, base), polynomial(&u, base));
        }
        let mut hash = PrefixHash::random();
        assert_ne!(hash.continued(0, SEED, &t), hash.continued(0, SEED, &u));
    }

    #[test]
    fn a_prompt_starts_with_its_prefixes_only() {
        let mut hash = PrefixHash::seeded(1);
        let tokens = [5, 6, 7];
        let mut h = vec![SEED];
        hash.extend(&mut h, &tokens);
        let prompt = Prompt {
            tokens: &tokens,
            h: &h,
        };
        assert!(prompt.starts_with(&[5, 6], h[2]));
        assert!(prompt.starts_with(&[], SEED));
        assert!(!prompt.starts_with(&[5, 7], h[2]));
        assert!(!prompt.starts_with(&[5, 6, 7, 8], h[3]));
    }
}
