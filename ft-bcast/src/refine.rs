//! Partition refinement: the destination ranks of a task, grouped into classes of ranks
//! that need exactly the same set of outputs.
//!
//! Start with every rank in the class of the empty set. For output `j` with destination
//! list `D_j`, every class `C` that `D_j` touches splits into `C ∩ D_j` (a new class,
//! needing `outputs(C) ∪ {j}`) and `C \ D_j` (keeps its id). Each touched class gets its
//! split target on first touch in a round, so the whole refinement costs
//! `O(n + Σ|D_j|)` (plus the size of the output sets copied per new class) and never
//! enumerates subsets of outputs: it works for any number of outputs.
//!
//! Invariants of the result:
//! - every rank that appears in some `D_j` is in exactly one class, whose output set is
//!   exactly `{ j : rank ∈ D_j }`; no class is empty or has an empty output set;
//! - members of a class are in increasing rank order; classes are ordered by their
//!   smallest member. The result depends only on the sets `D_j`, not on the order of
//!   ranks within a list.
//!
//! Two implementations give the same result:
//! - up to 64 outputs with a dense rank map (the common case), a rank's class is its
//!   need bitmask: one OR per destination entry into an `n`-entry array of the narrowest
//!   word that holds `m` bits, then two passes in rank order that label and fill the
//!   classes (module `masks`);
//! - otherwise the split rounds above, over a rank → class map that is an `n`-entry
//!   array, or a hash map when `n` is much larger than `Σ|D_j|` (so a huge communicator
//!   with few destinations costs memory in the number of destinations only).

use alloc::vec;
use alloc::vec::Vec;
use core::fmt;
use hashbrown::HashMap;

use ft_core::Rank;

use crate::outputs::OutputSet;

mod masks;
use masks::refine_by_masks;

/// A class of destinations that need the same outputs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Class {
    /// The outputs every member needs (indices into the output list).
    pub outputs: OutputSet,
    /// The members, in increasing rank order.
    pub members: Vec<Rank>,
}

/// The classes of a partition, ordered by smallest member.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Partition {
    /// The classes.
    pub classes: Vec<Class>,
}

impl Partition {
    /// Total number of destination ranks (the sum of the class sizes).
    pub fn destinations(&self) -> usize {
        self.classes.iter().map(|c| c.members.len()).sum()
    }
}

/// A destination list that cannot be refined.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RefineError {
    /// List `list` names a rank outside `0..n`.
    OutOfRange {
        /// Index of the offending list.
        list: usize,
        /// The rank.
        rank: Rank,
    },
    /// List `list` names `rank` twice.
    Duplicate {
        /// Index of the offending list.
        list: usize,
        /// The rank.
        rank: Rank,
    },
    /// More lists, or more distinct need sets, than `u32::MAX - 2`.
    TooManyLists,
}

impl fmt::Display for RefineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RefineError::OutOfRange { list, rank } => {
                write!(f, "list {list}: rank {rank} out of range")
            }
            RefineError::Duplicate { list, rank } => {
                write!(f, "list {list}: rank {rank} appears twice")
            }
            RefineError::TooManyLists => f.write_str("too many destination lists"),
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for RefineError {}

/// `split_to` entries: no split target yet in this round.
const NO_TARGET: u32 = u32::MAX;
/// `split_to` entry of a class created in this round: a member found there was already
/// moved this round, so its rank is listed twice.
const MOVED: u32 = u32::MAX - 1;

/// The rank → class map: an array over `0..n`, or a hash map when `n` dwarfs the
/// destination lists.
trait ClassMap {
    fn get(&self, rank: Rank) -> u32;
    fn set(&mut self, rank: Rank, class: u32);
}

/// A class id as stored in the dense map. Every class has a distinct output set, so
/// there are at most `min(2^m, Σ|D_j| + 1)` of them: with few outputs a byte per rank
/// holds every id, which keeps the map (touched once per destination entry) in cache.
trait DenseId: Copy + Default {
    const MAX: u64;
    fn from_u32(v: u32) -> Self;
    fn to_u32(self) -> u32;
}

macro_rules! dense_id {
    ($t:ty) => {
        impl DenseId for $t {
            const MAX: u64 = <$t>::MAX as u64;
            #[inline]
            fn from_u32(v: u32) -> Self {
                v as $t
            }
            #[inline]
            fn to_u32(self) -> u32 {
                self.into()
            }
        }
    };
}
dense_id!(u8);
dense_id!(u16);
dense_id!(u32);

impl<T: DenseId> ClassMap for Vec<T> {
    #[inline]
    fn get(&self, rank: Rank) -> u32 {
        self[rank as usize].to_u32()
    }
    #[inline]
    fn set(&mut self, rank: Rank, class: u32) {
        self[rank as usize] = T::from_u32(class);
    }
}

impl ClassMap for HashMap<Rank, u32> {
    #[inline]
    fn get(&self, rank: Rank) -> u32 {
        self.get(&rank).copied().unwrap_or(EMPTY_CLASS)
    }
    #[inline]
    fn set(&mut self, rank: Rank, class: u32) {
        self.insert(rank, class);
    }
}

/// Class 0: ranks in no list so far.
const EMPTY_CLASS: u32 = 0;

/// Refines `0..n` by the destination lists `lists` (list `j` is output `j`).
///
/// Every rank must be `< n` and appear at most once per list; otherwise the first
/// offending entry (in list order, then entry order) is reported.
pub fn refine<L: AsRef<[Rank]>>(n: u32, lists: &[L]) -> Result<Partition, RefineError> {
    if lists.len() >= (u32::MAX - 1) as usize {
        return Err(RefineError::TooManyLists);
    }
    let entries: usize = lists.iter().map(|l| l.as_ref().len()).sum();
    // The dense array costs up to 8 bytes per rank of the communicator; use it unless
    // that is far more than the lists themselves.
    let dense = (n as usize) <= entries.saturating_mul(4).saturating_add(1 << 16);
    if dense {
        match lists.len() {
            0..=8 => return refine_by_masks::<u8, L>(n, lists),
            9..=16 => return refine_by_masks::<u16, L>(n, lists),
            17..=32 => return refine_by_masks::<u32, L>(n, lists),
            33..=64 => return refine_by_masks::<u64, L>(n, lists),
            _ => {}
        }
        // Distinct output sets: at most 2^m, and at most one new class per entry.
        let most_ids = 1u64
            .checked_shl(lists.len().min(63) as u32)
            .unwrap_or(u64::MAX)
            .min(entries as u64 + 1);
        if most_ids <= <u8 as DenseId>::MAX + 1 {
            refine_dense::<u8, L>(n, lists)
        } else if most_ids <= <u16 as DenseId>::MAX + 1 {
            refine_dense::<u16, L>(n, lists)
        } else {
            refine_dense::<u32, L>(n, lists)
        }
    } else {
        let mut map: HashMap<Rank, u32> = HashMap::with_capacity(entries.min(1 << 20));
        let sets = run_rounds(n, lists, &mut map)?;
        let mut pairs: Vec<(Rank, u32)> = map.into_iter().collect();
        pairs.sort_unstable_by_key(|p| p.0);
        Ok(group(pairs.into_iter(), &sets))
    }
}

fn refine_dense<T: DenseId, L: AsRef<[Rank]>>(
    n: u32,
    lists: &[L],
) -> Result<Partition, RefineError> {
    let mut map: Vec<T> = vec![T::default(); n as usize];
    let sets = run_rounds(n, lists, &mut map)?;
    // Size every class before filling it: one counting pass over the (small) map.
    let mut sizes: Vec<usize> = vec![0; sets.len()];
    for c in &map {
        sizes[c.to_u32() as usize] += 1;
    }
    const UNSEEN: u32 = u32::MAX;
    let mut final_index: Vec<u32> = vec![UNSEEN; sets.len()];
    let mut classes: Vec<Class> = Vec::new();
    for (rank, c) in map.iter().enumerate() {
        let c = c.to_u32();
        if c == EMPTY_CLASS {
            continue;
        }
        let slot = &mut final_index[c as usize];
        if *slot == UNSEEN {
            *slot = classes.len() as u32;
            classes.push(Class {
                outputs: sets[c as usize].clone(),
                members: Vec::with_capacity(sizes[c as usize]),
            });
        }
        classes[*slot as usize].members.push(rank as Rank);
    }
    Ok(Partition { classes })
}

fn run_rounds<L: AsRef<[Rank]>, M: ClassMap>(
    n: u32,
    lists: &[L],
    map: &mut M,
) -> Result<Vec<OutputSet>, RefineError> {
    let mut sets: Vec<OutputSet> = vec![OutputSet::new()];
    // split_to[c]: where members of class c touched in this round go. Entries set in a
    // round are listed in `touched` and reset at its end, so a round costs its list's
    // length, not the number of classes.
    let mut split_to: Vec<u32> = vec![NO_TARGET];
    let mut touched: Vec<u32> = Vec::new();
    for (j, list) in lists.iter().enumerate() {
        for &rank in list.as_ref() {
            if rank >= n {
                return Err(RefineError::OutOfRange { list: j, rank });
            }
            let class = map.get(rank);
            let mut target = split_to[class as usize];
            if target >= MOVED {
                if target == MOVED {
                    return Err(RefineError::Duplicate { list: j, rank });
                }
                target = u32::try_from(sets.len())
                    .ok()
                    .filter(|&t| t < MOVED)
                    .ok_or(RefineError::TooManyLists)?;
                let mut set = sets[class as usize].clone();
                set.insert(j as u32);
                sets.push(set);
                split_to.push(MOVED);
                split_to[class as usize] = target;
                touched.push(class);
                touched.push(target);
            }
            map.set(rank, target);
        }
        for c in touched.drain(..) {
            split_to[c as usize] = NO_TARGET;
        }
    }
    Ok(sets)
}

/// Groups `(rank, class id)` pairs, given in increasing rank order, into classes ordered
/// by smallest member.
fn group(ordered: impl Iterator<Item = (Rank, u32)>, sets: &[OutputSet]) -> Partition {
    const UNSEEN: u32 = u32::MAX;
    let mut final_index: Vec<u32> = vec![UNSEEN; sets.len()];
    let mut classes: Vec<Class> = Vec::new();
    for (rank, class) in ordered {
        let slot = &mut final_index[class as usize];
        if *slot == UNSEEN {
            *slot = classes.len() as u32;
            classes.push(Class {
                outputs: sets[class as usize].clone(),
                members: Vec::new(),
            });
        }
        classes[*slot as usize].members.push(rank);
    }
    Partition { classes }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::collections::BTreeMap;
    use proptest::prelude::*;

    fn set(items: &[u32]) -> OutputSet {
        items.iter().copied().collect()
    }

    #[test]
    fn issue_624_splits_into_two_classes() {
        let p = refine(3, &[vec![1, 2], vec![2]]).unwrap();
        assert_eq!(
            p.classes,
            [
                Class {
                    outputs: set(&[0]),
                    members: vec![1]
                },
                Class {
                    outputs: set(&[0, 1]),
                    members: vec![2]
                }
            ]
        );
    }

    #[test]
    fn bad_lists_are_reported_at_the_first_offending_entry() {
        assert_eq!(
            refine(4, &[vec![1, 2], vec![3, 4, 9]]),
            Err(RefineError::OutOfRange { list: 1, rank: 4 })
        );
        assert_eq!(
            refine(4, &[vec![1, 2, 1]]),
            Err(RefineError::Duplicate { list: 0, rank: 1 })
        );
        assert_eq!(refine::<Vec<Rank>>(0, &[]), Ok(Partition::default()));
    }

    #[test]
    fn many_outputs_beyond_a_machine_word() {
        // Output j goes to ranks j and j + 1: 300 outputs, classes {j-1, j}.
        let lists: Vec<Vec<Rank>> = (0..300).map(|j| vec![j, j + 1]).collect();
        let p = refine(301, &lists).unwrap();
        assert_eq!(p.classes.len(), 301);
        assert_eq!(p.classes[200].outputs, set(&[199, 200]));
    }

    #[test]
    fn huge_communicators_use_the_sparse_map() {
        let p = refine(u32::MAX, &[vec![u32::MAX - 1, 5], vec![5]]).unwrap();
        assert_eq!(p.classes[0].members, [5]);
        assert_eq!(p.classes[1].members, [u32::MAX - 1]);
    }

    proptest! {
        #[test]
        fn classes_are_exactly_the_rank_need_sets(
            n in 1u32..300,
            lists in prop::collection::vec(prop::collection::btree_set(0u32..300, 0..60), 0..12),
            sparse in any::<bool>(),
        ) {
            let lists: Vec<Vec<Rank>> = lists.into_iter().map(|l| l.into_iter().filter(|r| *r < n).rev().collect()).collect();
            // Same partition whether the rank map is dense or sparse.
            let universe = if sparse { n.saturating_mul(1 << 20).max(n) } else { n };
            let p = refine(universe, &lists).unwrap();
            let mut needs: BTreeMap<Rank, OutputSet> = BTreeMap::new();
            for (j, l) in lists.iter().enumerate() {
                for &r in l { needs.entry(r).or_default().insert(j as u32); }
            }
            prop_assert_eq!(p.destinations(), needs.len());
            let mut seen_first = None;
            for c in &p.classes {
                prop_assert!(!c.members.is_empty() && !c.outputs.is_empty());
                prop_assert!(c.members.windows(2).all(|w| w[0] < w[1]));
                prop_assert!(seen_first < Some(c.members[0]));
                seen_first = Some(c.members[0]);
                for r in &c.members { prop_assert_eq!(&needs[r], &c.outputs); }
            }
            let distinct: alloc::collections::BTreeSet<Vec<u32>> = needs.values().map(|s| s.iter().collect()).collect();
            prop_assert_eq!(distinct.len(), p.classes.len());
        }

        /// 13 to 70 outputs: the 16-, 32- and 64-bit masks and the split rounds beyond
        /// agree with the general rounds (forced by a sparse universe).
        #[test]
        fn every_mask_width_agrees_with_the_split_rounds(
            n in 1u32..200,
            lists in prop::collection::vec(prop::collection::btree_set(0u32..200, 0..40), 13..70),
        ) {
            let lists: Vec<Vec<Rank>> = lists.into_iter().map(|l| l.into_iter().filter(|r| *r < n).collect()).collect();
            let dense = refine(n, &lists).unwrap();
            let sparse = refine(n.saturating_mul(1 << 20), &lists).unwrap();
            prop_assert_eq!(dense, sparse);
        }
    }

    #[test]
    fn mask_widths_report_bad_entries_like_the_rounds() {
        for m in [1usize, 9, 17, 33, 65] {
            let mut lists: Vec<Vec<Rank>> = (0..m).map(|j| vec![j as Rank]).collect();
            lists[m - 1].push(0);
            lists[m - 1].push(0);
            assert_eq!(
                refine(70, &lists),
                Err(RefineError::Duplicate {
                    list: m - 1,
                    rank: 0
                }),
                "{m} lists"
            );
            lists[m - 1] = vec![3, 70];
            assert_eq!(
                refine(70, &lists),
                Err(RefineError::OutOfRange {
                    list: m - 1,
                    rank: 70
                }),
                "{m} lists"
            );
        }
    }
}
