//! [`OutputSet`]: a set of output indices (positions in a task's output list).
//!
//! A bitset that stays inline (no allocation) while every member is below
//! [`OutputSet::INLINE_CAPACITY`] and moves to the heap for larger indices, so it works
//! for any number of outputs while the common case (a handful of outputs) costs a copy.
//!
//! Invariant: the heap form is used only when some member is `>= INLINE_CAPACITY`, and
//! its last word is non-zero; so equal sets have equal representations and the derived
//! `Eq`/`Hash` compare members.

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::fmt;

const INLINE_WORDS: usize = 2;

/// A set of output indices.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct OutputSet(Repr);

#[derive(Clone, PartialEq, Eq, Hash)]
enum Repr {
    Inline([u64; INLINE_WORDS]),
    Heap(Box<[u64]>),
}

impl Default for OutputSet {
    fn default() -> Self {
        OutputSet::new()
    }
}

impl OutputSet {
    /// Indices below this are stored without allocating.
    pub const INLINE_CAPACITY: u32 = (INLINE_WORDS * 64) as u32;

    /// The empty set.
    pub const fn new() -> Self {
        OutputSet(Repr::Inline([0; INLINE_WORDS]))
    }

    /// The set `{index}`.
    pub fn single(index: u32) -> Self {
        let mut s = OutputSet::new();
        s.insert(index);
        s
    }

    /// The bitset's words, least significant first (bit `i` of word `w` is index `64w + i`).
    pub(crate) fn words(&self) -> &[u64] {
        match &self.0 {
            Repr::Inline(w) => w,
            Repr::Heap(w) => w,
        }
    }

    /// Makes room for word `word` (switching to the heap form if needed) and returns the
    /// words, mutable.
    fn words_mut_with(&mut self, word: usize) -> &mut [u64] {
        let len = self.words().len();
        if word >= len {
            let mut grown: Vec<u64> = Vec::with_capacity(word + 1);
            grown.extend_from_slice(self.words());
            grown.resize(word + 1, 0);
            self.0 = Repr::Heap(grown.into_boxed_slice());
        }
        match &mut self.0 {
            Repr::Inline(w) => w,
            Repr::Heap(w) => w,
        }
    }

    /// Adds `index`; returns true if it was not a member.
    pub fn insert(&mut self, index: u32) -> bool {
        let (word, bit) = ((index / 64) as usize, 1u64 << (index % 64));
        let words = self.words_mut_with(word);
        let added = words[word] & bit == 0;
        words[word] |= bit;
        added
    }

    /// Whether `index` is a member.
    pub fn contains(&self, index: u32) -> bool {
        let (word, bit) = ((index / 64) as usize, 1u64 << (index % 64));
        self.words().get(word).is_some_and(|w| w & bit != 0)
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.words().iter().map(|w| w.count_ones() as usize).sum()
    }

    /// True when the set has no member.
    pub fn is_empty(&self) -> bool {
        self.words().iter().all(|w| *w == 0)
    }

    /// `self ∪= other`.
    pub fn union_with(&mut self, other: &OutputSet) {
        if let (Repr::Inline(mine), Repr::Inline(theirs)) = (&mut self.0, &other.0) {
            for (a, b) in mine.iter_mut().zip(theirs) {
                *a |= *b;
            }
            return;
        }
        let theirs = other.words();
        let last_nonzero = theirs.iter().rposition(|w| *w != 0);
        let Some(last) = last_nonzero else { return };
        let mine = self.words_mut_with(last);
        for (a, b) in mine.iter_mut().zip(theirs) {
            *a |= *b;
        }
    }

    /// `self \ other`, word by word.
    pub fn difference(&self, other: &OutputSet) -> OutputSet {
        let theirs = other.words();
        let left = |(i, &a): (usize, &u64)| a & !theirs.get(i).copied().unwrap_or(0);
        match &self.0 {
            Repr::Inline(mine) => {
                let mut words = [0; INLINE_WORDS];
                for (w, l) in words.iter_mut().zip(mine.iter().enumerate().map(left)) {
                    *w = l;
                }
                OutputSet(Repr::Inline(words))
            }
            Repr::Heap(mine) => {
                let words: Vec<u64> = mine.iter().enumerate().map(left).collect();
                match words.iter().rposition(|w| *w != 0) {
                    // The heap form only while a member is past the inline words.
                    Some(last) if last >= INLINE_WORDS => {
                        OutputSet(Repr::Heap(words[..=last].into()))
                    }
                    _ => {
                        let mut inline = [0; INLINE_WORDS];
                        inline.copy_from_slice(&words[..INLINE_WORDS]);
                        OutputSet(Repr::Inline(inline))
                    }
                }
            }
        }
    }

    /// Whether every member of `self` is in `other`.
    pub fn is_subset(&self, other: &OutputSet) -> bool {
        self.first_not_in(other).is_none()
    }

    /// The smallest member of `self` that is not in `other`.
    pub fn first_not_in(&self, other: &OutputSet) -> Option<u32> {
        let theirs = other.words();
        self.words().iter().enumerate().find_map(|(i, &a)| {
            let left = a & !theirs.get(i).copied().unwrap_or(0);
            (left != 0).then(|| i as u32 * 64 + left.trailing_zeros())
        })
    }

    /// The smallest member common to `self` and `other`.
    pub fn first_common(&self, other: &OutputSet) -> Option<u32> {
        self.words()
            .iter()
            .zip(other.words())
            .enumerate()
            .find_map(|(i, (&a, &b))| {
                let both = a & b;
                (both != 0).then(|| i as u32 * 64 + both.trailing_zeros())
            })
    }

    /// Members in increasing order.
    pub fn iter(&self) -> Iter<'_> {
        Iter {
            words: self.words(),
            word: 0,
            current: self.words().first().copied().unwrap_or(0),
        }
    }
}

impl FromIterator<u32> for OutputSet {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Self {
        let mut s = OutputSet::new();
        for i in iter {
            s.insert(i);
        }
        s
    }
}

impl<'a> IntoIterator for &'a OutputSet {
    type Item = u32;
    type IntoIter = Iter<'a>;
    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

impl fmt::Debug for OutputSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

/// Iterator over an [`OutputSet`]'s members in increasing order.
#[derive(Clone, Debug)]
pub struct Iter<'a> {
    words: &'a [u64],
    word: usize,
    current: u64,
}

impl Iterator for Iter<'_> {
    type Item = u32;
    fn next(&mut self) -> Option<u32> {
        while self.current == 0 {
            self.word += 1;
            self.current = *self.words.get(self.word)?;
        }
        let bit = self.current.trailing_zeros();
        self.current &= self.current - 1;
        Some(self.word as u32 * 64 + bit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::collections::BTreeSet;
    use proptest::prelude::*;

    #[test]
    fn small_sets_do_not_allocate_and_large_ones_do() {
        let mut s = OutputSet::single(127);
        assert!(matches!(s.0, Repr::Inline(_)));
        s.insert(128);
        assert!(matches!(s.0, Repr::Heap(_)));
        assert_eq!(s.iter().collect::<Vec<_>>(), [127, 128]);
    }

    proptest! {
        #[test]
        fn behaves_like_a_btreeset(a in prop::collection::vec(0u32..400, 0..20), b in prop::collection::vec(0u32..400, 0..20)) {
            let (sa, sb): (OutputSet, OutputSet) = (a.iter().copied().collect(), b.iter().copied().collect());
            let (ma, mb): (BTreeSet<u32>, BTreeSet<u32>) = (a.iter().copied().collect(), b.iter().copied().collect());
            prop_assert!(sa.iter().eq(ma.iter().copied()));
            prop_assert_eq!(sa.len(), ma.len());
            prop_assert_eq!(sa.is_empty(), ma.is_empty());
            prop_assert_eq!(sa.is_subset(&sb), ma.is_subset(&mb));
            prop_assert_eq!(sa.first_not_in(&sb), ma.difference(&mb).next().copied());
            prop_assert_eq!(sa.first_common(&sb), ma.intersection(&mb).next().copied());
            let mut u = sa.clone();
            u.union_with(&sb);
            prop_assert!(u.iter().eq(ma.union(&mb).copied()));
            let rebuilt: OutputSet = ma.union(&mb).copied().collect();
            prop_assert_eq!(&u, &rebuilt, "equal members, equal representation");
            let d = sa.difference(&sb);
            let rebuilt: OutputSet = ma.difference(&mb).copied().collect();
            prop_assert_eq!(&d, &rebuilt, "equal members, equal representation");
            for i in 0..400 { prop_assert_eq!(sa.contains(i), ma.contains(&i)); }
        }
    }
}
