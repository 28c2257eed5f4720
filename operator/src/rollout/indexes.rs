//! Sets of session indexes written the way Kubernetes writes an Indexed Job's
//! `completedIndexes`: sorted, comma-separated ranges (`0-7,9,12-15`). A 10,000-session job
//! that finished in order is one short string, so the status can say exactly which sessions
//! are done — which is what makes folding a pod's result idempotent across operator restarts.

use std::collections::BTreeSet;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IndexSet(BTreeSet<u32>);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("bad index set {text:?}: {why}")]
pub struct IndexSetError {
    text: String,
    why: &'static str,
}

impl IndexSet {
    pub fn parse(text: &str) -> Result<Self, IndexSetError> {
        let bad = |why| IndexSetError {
            text: text.to_string(),
            why,
        };
        let mut set = BTreeSet::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (lo, hi) = match part.split_once('-') {
                Some((lo, hi)) => (lo, hi),
                None => (part, part),
            };
            let lo: u32 = lo.trim().parse().map_err(|_| bad("not a number"))?;
            let hi: u32 = hi.trim().parse().map_err(|_| bad("not a number"))?;
            if hi < lo {
                return Err(bad("a range ends before it starts"));
            }
            if hi - lo > 10_000_000 {
                return Err(bad("range too large"));
            }
            set.extend(lo..=hi);
        }
        Ok(Self(set))
    }

    pub fn insert(&mut self, index: u32) -> bool {
        self.0.insert(index)
    }

    pub fn contains(&self, index: u32) -> bool {
        self.0.contains(&index)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Display for IndexSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut first = true;
        let mut it = self.0.iter().copied().peekable();
        while let Some(lo) = it.next() {
            let mut hi = lo;
            while it.peek() == Some(&(hi + 1)) {
                hi += 1;
                it.next();
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if hi == lo {
                write!(f, "{lo}")?;
            } else {
                write!(f, "{lo}-{hi}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ranges_are_compressed_and_parsed_back() -> Result<(), IndexSetError> {
        let mut s = IndexSet::default();
        for i in [0, 1, 2, 3, 7, 9, 10, 5] {
            s.insert(i);
        }
        assert_eq!(s.to_string(), "0-3,5,7,9-10");
        assert_eq!(IndexSet::parse("0-3,5,7,9-10")?, s);
        assert_eq!(IndexSet::parse("")?.len(), 0);
        Ok(())
    }

    #[test]
    fn garbage_is_refused() {
        for bad in ["x", "3-1", "1-", "-", "0-99999999999"] {
            assert!(IndexSet::parse(bad).is_err(), "{bad}");
        }
    }

    proptest! {
        #[test]
        fn any_set_round_trips(v in proptest::collection::btree_set(0u32..500, 0..100)) {
            let s = IndexSet(v);
            prop_assert_eq!(IndexSet::parse(&s.to_string()).ok(), Some(s));
        }
    }
}
