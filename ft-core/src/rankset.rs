//! [`RankSet`]: a set of ranks of one communicator, stored sparse or dense by size.
//!
//! Invariants:
//! - every member is `< universe` (the communicator size);
//! - the sparse form is a strictly increasing `Vec<Rank>`;
//! - the dense form is a bitset of exactly `universe` bits whose cached `len` equals its
//!   population count;
//! - the form in use costs about `min(4·len, universe/8)` bytes: a set switches to dense
//!   when its sparse list would outgrow the bitset and back to sparse when it falls well
//!   below (the gap avoids flapping on insert/remove at the boundary).
//!
//! Equality compares members, never the form.

use alloc::vec::Vec;
use bitvec::prelude::{BitVec, Lsb0};
use core::fmt;

use crate::rank::Rank;

type Bits = BitVec<u64, Lsb0>;

/// A set of ranks in `0..universe`, ordered, with adaptive storage.
#[derive(Clone)]
pub struct RankSet {
    universe: u32,
    repr: Repr,
}

#[derive(Clone)]
enum Repr {
    Sparse(Vec<Rank>),
    Dense { bits: Bits, len: usize },
}

impl RankSet {
    /// The empty set of a communicator of `universe` ranks.
    pub const fn new(universe: u32) -> Self {
        RankSet {
            universe,
            repr: Repr::Sparse(Vec::new()),
        }
    }

    /// A set holding `ranks` (any order, duplicates allowed).
    ///
    /// # Panics
    /// If a rank is `>= universe` (a caller bug: peer input is range-checked by the codec).
    pub fn from_ranks(universe: u32, ranks: impl IntoIterator<Item = Rank>) -> Self {
        let mut list: Vec<Rank> = ranks.into_iter().collect();
        list.sort_unstable();
        list.dedup();
        list.shrink_to_fit();
        if let Some(&last) = list.last() {
            assert!(
                last < universe,
                "rank {last} out of range for a communicator of {universe}"
            );
        }
        Self::from_list(universe, list)
    }

    /// The set of `list`, strictly increasing and `< universe`, in the cheaper form.
    fn from_list(universe: u32, list: Vec<Rank>) -> Self {
        let mut set = RankSet {
            universe,
            repr: Repr::Sparse(list),
        };
        set.rebalance();
        set
    }

    /// The communicator size this set's ranks live in.
    pub const fn universe(&self) -> u32 {
        self.universe
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        match &self.repr {
            Repr::Sparse(list) => list.len(),
            Repr::Dense { len, .. } => *len,
        }
    }

    /// True when the set has no member.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True when the dense (bitset) form is in use.
    pub fn is_dense(&self) -> bool {
        matches!(self.repr, Repr::Dense { .. })
    }

    /// Heap bytes used by the set's storage.
    pub fn heap_bytes(&self) -> usize {
        match &self.repr {
            Repr::Sparse(list) => list.capacity() * core::mem::size_of::<Rank>(),
            Repr::Dense { bits, .. } => bits.as_raw_slice().len() * 8,
        }
    }

    /// Whether `rank` is a member (ranks out of range are never members).
    pub fn contains(&self, rank: Rank) -> bool {
        match &self.repr {
            Repr::Sparse(list) => list.binary_search(&rank).is_ok(),
            Repr::Dense { bits, .. } => bits.get(rank as usize).is_some_and(|b| *b),
        }
    }

    /// Adds `rank`; returns true if it was not a member.
    ///
    /// # Panics
    /// If `rank >= universe` (a caller bug: peer input is range-checked by the codec).
    pub fn insert(&mut self, rank: Rank) -> bool {
        assert!(
            rank < self.universe,
            "rank {rank} out of range for a communicator of {}",
            self.universe
        );
        let added = match &mut self.repr {
            Repr::Sparse(list) => match list.binary_search(&rank) {
                Ok(_) => false,
                Err(at) => {
                    list.insert(at, rank);
                    true
                }
            },
            Repr::Dense { bits, len } => {
                let was = bits.replace(rank as usize, true);
                *len += usize::from(!was);
                !was
            }
        };
        if added {
            self.rebalance();
        }
        added
    }

    /// Removes `rank`; returns true if it was a member.
    pub fn remove(&mut self, rank: Rank) -> bool {
        if rank >= self.universe {
            return false;
        }
        let removed = match &mut self.repr {
            Repr::Sparse(list) => match list.binary_search(&rank) {
                Ok(at) => {
                    list.remove(at);
                    true
                }
                Err(_) => false,
            },
            Repr::Dense { bits, len } => {
                let was = bits.replace(rank as usize, false);
                *len -= usize::from(was);
                was
            }
        };
        if removed {
            self.rebalance();
        }
        removed
    }

    /// Removes every member.
    pub fn clear(&mut self) {
        self.repr = Repr::Sparse(Vec::new());
    }

    /// Members in increasing order.
    pub fn iter(&self) -> Iter<'_> {
        match &self.repr {
            Repr::Sparse(list) => Iter(IterRepr::Sparse(list.iter())),
            Repr::Dense { bits, .. } => Iter(IterRepr::Dense(Ones::new(
                bits.as_raw_slice(),
                self.universe,
            ))),
        }
    }

    /// The smallest member.
    pub fn first(&self) -> Option<Rank> {
        self.iter().next()
    }

    /// `self ∪= other`. Returns the number of members added.
    ///
    /// # Panics
    /// If the universes differ.
    pub fn union_with(&mut self, other: &RankSet) -> usize {
        self.check_universe(other);
        let before = self.len();
        match (&mut self.repr, &other.repr) {
            (_, Repr::Sparse(theirs)) if theirs.is_empty() => return 0,
            (Repr::Dense { bits, len }, Repr::Dense { bits: theirs, .. }) => {
                // One pass: OR and count (both bitsets keep their bits past n clear).
                let mut count = 0;
                for (a, b) in bits
                    .as_raw_mut_slice()
                    .iter_mut()
                    .zip(theirs.as_raw_slice())
                {
                    *a |= *b;
                    count += a.count_ones() as usize;
                }
                *len = count;
            }
            (Repr::Dense { bits, len }, Repr::Sparse(theirs)) => {
                for &r in theirs {
                    *len += usize::from(!bits.replace(r as usize, true));
                }
            }
            (Repr::Sparse(mine), Repr::Dense { bits: theirs, .. }) => {
                let mut bits = theirs.clone();
                for &r in mine.iter() {
                    bits.set(r as usize, true);
                }
                let len = bits.count_ones();
                self.repr = Repr::Dense { bits, len };
            }
            (Repr::Sparse(mine), Repr::Sparse(theirs)) => {
                *mine = merge_sorted(mine, theirs);
            }
        }
        self.rebalance();
        self.len() - before
    }

    /// `self \= other`. Returns the number of members removed.
    ///
    /// # Panics
    /// If the universes differ.
    pub fn difference_with(&mut self, other: &RankSet) -> usize {
        self.check_universe(other);
        let before = self.len();
        match (&mut self.repr, &other.repr) {
            (Repr::Dense { bits, len }, Repr::Dense { bits: theirs, .. }) => {
                let mut count = 0;
                for (a, b) in bits
                    .as_raw_mut_slice()
                    .iter_mut()
                    .zip(theirs.as_raw_slice())
                {
                    *a &= !*b;
                    count += a.count_ones() as usize;
                }
                *len = count;
            }
            (Repr::Dense { bits, len }, Repr::Sparse(theirs)) => {
                for &r in theirs {
                    *len -= usize::from(bits.replace(r as usize, false));
                }
            }
            (Repr::Sparse(mine), _) => mine.retain(|&r| !other.contains(r)),
        }
        self.rebalance();
        before - self.len()
    }

    /// Whether every member of `self` is a member of `other`.
    pub fn is_subset(&self, other: &RankSet) -> bool {
        if self.len() > other.len() {
            return false;
        }
        match (&self.repr, &other.repr) {
            (Repr::Dense { bits, .. }, Repr::Dense { bits: theirs, .. }) => bits
                .as_raw_slice()
                .iter()
                .zip(theirs.as_raw_slice())
                .all(|(a, b)| a & !b == 0),
            _ => self.iter().all(|r| other.contains(r)),
        }
    }

    /// Members of `self` not in `other`, in increasing order.
    pub fn difference<'a>(&'a self, other: &'a RankSet) -> impl Iterator<Item = Rank> + 'a {
        self.iter().filter(move |&r| !other.contains(r))
    }

    fn check_universe(&self, other: &RankSet) {
        assert_eq!(
            self.universe, other.universe,
            "rank sets of different communicators"
        );
    }

    /// Picks the cheaper form: dense once the sparse list would cost more than the
    /// bitset (plus slack), sparse again once it would cost under half of it.
    fn rebalance(&mut self) {
        let dense_bytes = (self.universe as usize).div_ceil(64) * 8;
        let sparse_bytes = self.len() * core::mem::size_of::<Rank>();
        match &self.repr {
            Repr::Sparse(list) if sparse_bytes > dense_bytes + 64 => {
                let mut bits = Bits::repeat(false, self.universe as usize);
                for &r in list {
                    bits.set(r as usize, true);
                }
                let len = list.len();
                self.repr = Repr::Dense { bits, len };
            }
            Repr::Dense { bits, .. } if sparse_bytes * 2 < dense_bytes => {
                let list = Ones::new(bits.as_raw_slice(), self.universe).collect();
                self.repr = Repr::Sparse(list);
            }
            _ => {}
        }
    }
}

fn merge_sorted(a: &[Rank], b: &[Rank]) -> Vec<Rank> {
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut i, mut j) = (0, 0);
    // Branch-free step: ranks are random, so a compare-and-branch mispredicts often.
    while i < a.len() && j < b.len() {
        let (x, y) = (a[i], b[j]);
        out.push(x.min(y));
        i += usize::from(x <= y);
        j += usize::from(y <= x);
    }
    out.extend_from_slice(&a[i..]);
    out.extend_from_slice(&b[j..]);
    out
}

/// Ranks of one communicator in increasing order, with their count: a [`RankSet`], or
/// a set still in a frame's bytes ([`crate::wire::RankSetRef`]). What a machine needs
/// to compare a received set with its own, or merge it in, without decoding it into a
/// new [`RankSet`].
pub trait Members {
    /// The communicator size the ranks live in.
    fn universe(&self) -> u32;
    /// How many members.
    fn count(&self) -> usize;
    /// The members, strictly increasing.
    fn members(&self) -> impl Iterator<Item = Rank> + '_;
    /// The members as a [`RankSet`] of their own.
    fn to_set(&self) -> RankSet {
        RankSet::from_increasing(self.universe(), self.count(), self.members())
    }
}

impl Members for RankSet {
    fn universe(&self) -> u32 {
        self.universe
    }
    fn count(&self) -> usize {
        self.len()
    }
    fn members(&self) -> impl Iterator<Item = Rank> + '_ {
        self.iter()
    }
    fn to_set(&self) -> RankSet {
        self.clone()
    }
}

impl RankSet {
    /// A set of `count` ranks given strictly increasing and `< universe` (a checked
    /// frame's, or another set's): no sort, one allocation of the right size.
    pub(crate) fn from_increasing(
        universe: u32,
        count: usize,
        ranks: impl Iterator<Item = Rank>,
    ) -> Self {
        let mut list = Vec::with_capacity(count);
        list.extend(ranks);
        debug_assert!(list.windows(2).all(|w| w[0] < w[1]));
        debug_assert!(list.last().is_none_or(|&last| last < universe));
        Self::from_list(universe, list)
    }

    /// Whether `other` holds exactly this set's members (and lives in the same
    /// communicator).
    pub fn same_members(&self, other: &impl Members) -> bool {
        self.universe == other.universe()
            && self.len() == other.count()
            && self.iter().eq(other.members())
    }

    /// Whether every member of `other` is a member of `self`.
    pub fn contains_all(&self, other: &impl Members) -> bool {
        other.count() <= self.len() && other.members().all(|r| self.contains(r))
    }

    /// `self ∪= other` for any [`Members`]: nothing is allocated when `other` brings
    /// no new member. Returns the number of members added.
    ///
    /// # Panics
    /// If the universes differ.
    pub fn union_with_members(&mut self, other: &impl Members) -> usize {
        assert_eq!(
            self.universe,
            other.universe(),
            "rank sets of different communicators"
        );
        if self.contains_all(other) {
            return 0;
        }
        self.union_with(&other.to_set())
    }
}

impl PartialEq for RankSet {
    fn eq(&self, other: &Self) -> bool {
        self.universe == other.universe && self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for RankSet {}

impl fmt::Debug for RankSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

impl<'a> IntoIterator for &'a RankSet {
    type Item = Rank;
    type IntoIter = Iter<'a>;
    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

/// Iterator over a [`RankSet`]'s members in increasing order.
pub struct Iter<'a>(IterRepr<'a>);

enum IterRepr<'a> {
    Sparse(core::slice::Iter<'a, Rank>),
    Dense(Ones<'a>),
}

impl Iterator for Iter<'_> {
    type Item = Rank;
    fn next(&mut self) -> Option<Rank> {
        match &mut self.0 {
            IterRepr::Sparse(it) => it.next().copied(),
            IterRepr::Dense(it) => it.next(),
        }
    }

    fn fold<B, F: FnMut(B, Rank) -> B>(self, init: B, f: F) -> B {
        // Lets `sum`, `for_each`, `count`... run the inner loop without a per-item match.
        match self.0 {
            IterRepr::Sparse(it) => it.copied().fold(init, f),
            IterRepr::Dense(it) => it.fold(init, f),
        }
    }
}

/// The set bits of a dense set's words, a word at a time (bitvec's `iter_ones` tests
/// bit by bit and is several times slower on a 10^6-bit set).
struct Ones<'a> {
    words: &'a [u64],
    /// The word being drained (bits already returned are cleared).
    current: u64,
    /// Rank of bit 0 of `current`.
    base: Rank,
    /// Index in `words` of the next word to load.
    next_word: usize,
    universe: u32,
}

impl<'a> Ones<'a> {
    fn new(words: &'a [u64], universe: u32) -> Self {
        Ones {
            words,
            current: 0,
            base: 0,
            next_word: 0,
            universe,
        }
    }

    /// Loads the next word; bits at or past `universe` are dropped. False at the end.
    fn load(&mut self) -> bool {
        let Some(&word) = self.words.get(self.next_word) else {
            return false;
        };
        let base = (self.next_word as u64) * 64;
        let past = u64::from(self.universe).saturating_sub(base);
        self.current = if past >= 64 {
            word
        } else {
            word & ((1u64 << past) - 1)
        };
        self.base = base as Rank;
        self.next_word += 1;
        true
    }
}

impl Iterator for Ones<'_> {
    type Item = Rank;
    fn next(&mut self) -> Option<Rank> {
        while self.current == 0 {
            if !self.load() {
                return None;
            }
        }
        let bit = self.current.trailing_zeros();
        self.current &= self.current - 1;
        Some(self.base + bit)
    }

    fn fold<B, F: FnMut(B, Rank) -> B>(mut self, init: B, mut f: F) -> B {
        let mut acc = init;
        loop {
            while self.current != 0 {
                let bit = self.current.trailing_zeros();
                self.current &= self.current - 1;
                acc = f(acc, self.base + bit);
            }
            if !self.load() {
                return acc;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::collections::BTreeSet;
    use alloc::vec::Vec;
    use proptest::prelude::*;

    #[test]
    fn switches_form_by_size_and_back() {
        let n = 10_000;
        let mut s = RankSet::new(n);
        for r in 0..400 {
            s.insert(r * 7);
        }
        assert!(
            s.is_dense(),
            "400 members of 10^4 cost more sparse than dense"
        );
        assert!(s.heap_bytes() <= (n as usize).div_ceil(64) * 8);
        for r in 0..390 {
            s.remove(r * 7);
        }
        assert!(!s.is_dense());
        assert_eq!(
            s.iter().collect::<Vec<_>>(),
            (390..400).map(|r| r * 7).collect::<Vec<_>>()
        );
    }

    #[test]
    fn out_of_range_is_never_a_member() {
        let s = RankSet::from_ranks(4, [0, 3]);
        assert!(!s.contains(4));
        assert!(!s.contains(u32::MAX));
        assert!(!s.clone().remove(9));
    }

    fn arb_pair() -> impl Strategy<Value = (u32, Vec<u32>, Vec<u32>)> {
        (1u32..3000).prop_flat_map(|n| {
            (
                Just(n),
                prop::collection::vec(0..n, 0..400),
                prop::collection::vec(0..n, 0..400),
            )
        })
    }

    proptest! {
        #[test]
        fn behaves_like_a_btreeset((n, a, b) in arb_pair()) {
            let (sa, sb) = (RankSet::from_ranks(n, a.iter().copied()), RankSet::from_ranks(n, b.iter().copied()));
            let (ma, mb): (BTreeSet<u32>, BTreeSet<u32>) = (a.iter().copied().collect(), b.iter().copied().collect());
            prop_assert_eq!(sa.len(), ma.len());
            prop_assert!(sa.iter().eq(ma.iter().copied()));
            let mut u = sa.clone();
            let added = u.union_with(&sb);
            prop_assert!(u.iter().eq(ma.union(&mb).copied()));
            prop_assert_eq!(added, u.len() - sa.len());
            let mut d = sa.clone();
            d.difference_with(&sb);
            prop_assert!(d.iter().eq(ma.difference(&mb).copied()));
            prop_assert_eq!(sa.is_subset(&sb), ma.is_subset(&mb));
            prop_assert!(sa.is_subset(&u) && sb.is_subset(&u));
            for r in 0..n { prop_assert_eq!(sa.contains(r), ma.contains(&r)); }
            let dense_bytes = (n as usize).div_ceil(64) * 8;
            prop_assert!(sa.heap_bytes() <= (4 * sa.len()).min(dense_bytes + 64).max(8));
        }
    }
}
