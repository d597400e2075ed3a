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
//! The result is a [`Partition`] stored flat (CSR): every class's members in one array,
//! class after class, plus one offset per class; a [`Class`] is a borrowed view. Building
//! it costs one allocation for all members, whatever the number of classes.
//!
//! Three implementations give the same result:
//! - a small task (at most 256 destination entries, 64 outputs) merges its lists (up to
//!   8 increasing lists) or sorts its entries by rank, and groups ranks by need mask in
//!   `O(E log E)` at most, whatever `n` (module `small`);
//! - up to 64 outputs with a dense rank map (large tasks), a rank's class is its
//!   need bitmask: one OR per destination entry into an `n`-entry array of the narrowest
//!   word that holds `m` bits, then passes in rank order that count the classes and
//!   place every rank in the member array (module `masks`);
//! - otherwise the split rounds above, over a rank → class map that is an `n`-entry
//!   array, or a hash map when `n` is much larger than `Σ|D_j|` (so a huge communicator
//!   with few destinations costs memory in the number of destinations only).
//!
//! The last two end in the same grouping step (`group_by_id`): a counting sort of the ranks by
//! class id into the flat member array, in `O(n + classes)` time. With at most 256 ids
//! (every task of up to 8 outputs) the counts are kept per block of 8192 ranks, and each
//! block is sorted in cache and copied out in runs, one per class: placing ranks one by
//! one would scatter single stores over 256 places of a member array far larger than
//! the cache.
//!
//! [`refine_without`] also checks, in `O(1)`, that one given rank (a task's root) is in
//! no list.

use alloc::vec;
use alloc::vec::Vec;
use core::fmt;
use hashbrown::HashMap;

use ft_core::Rank;

use crate::outputs::OutputSet;

mod masks;
mod small;
use masks::refine_by_masks;

/// A class of destinations that need the same outputs: a view into a [`Partition`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Class<'a> {
    /// The outputs every member needs (indices into the output list).
    pub outputs: &'a OutputSet,
    /// The members, in increasing rank order.
    pub members: &'a [Rank],
}

/// The classes of a partition, ordered by smallest member.
///
/// Stored flat: the members of every class in one array, class after class, with the
/// offset where each class starts (one allocation for all members, however many
/// classes there are). Class `k`'s members are `members[offsets[k]..offsets[k + 1]]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Partition {
    /// Each class's output set.
    outputs: Vec<OutputSet>,
    /// `offsets[k]`: where class `k` starts in `members`; one more entry than classes,
    /// the last being `members.len()`.
    offsets: Vec<usize>,
    /// Every class's members, class by class.
    members: Vec<Rank>,
}

impl Default for Partition {
    fn default() -> Self {
        Partition {
            outputs: Vec::new(),
            offsets: vec![0],
            members: Vec::new(),
        }
    }
}

impl Partition {
    /// Number of classes.
    pub fn len(&self) -> usize {
        self.outputs.len()
    }

    /// True when there is no class (no destination).
    pub fn is_empty(&self) -> bool {
        self.outputs.is_empty()
    }

    /// Class `k` (`None` past the end).
    pub fn get(&self, k: usize) -> Option<Class<'_>> {
        Some(Class {
            outputs: self.outputs.get(k)?,
            members: self.members_of(k),
        })
    }

    /// The members of class `k` in increasing rank order (empty past the end).
    pub fn members_of(&self, k: usize) -> &[Rank] {
        match (self.offsets.get(k), self.offsets.get(k + 1)) {
            (Some(&from), Some(&to)) => &self.members[from..to],
            _ => &[],
        }
    }

    /// The output set of class `k` (`None` past the end).
    pub fn outputs_of(&self, k: usize) -> Option<&OutputSet> {
        self.outputs.get(k)
    }

    /// The classes in order.
    pub fn iter(&self) -> Classes<'_> {
        Classes {
            partition: self,
            front: 0,
            back: self.len(),
        }
    }

    /// Every destination, class by class (each class in increasing rank order).
    pub fn members(&self) -> &[Rank] {
        &self.members
    }

    /// Total number of destination ranks (the sum of the class sizes).
    pub fn destinations(&self) -> usize {
        self.members.len()
    }

    /// Keeps the members for which `keep` holds (visited class by class) and drops the
    /// classes left empty; the order of classes and members is kept, so the invariants
    /// hold afterwards. One pass, in place.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(Rank) -> bool) {
        let mut write = 0;
        let mut kept_classes = 0;
        for k in 0..self.outputs.len() {
            let (from, to) = (self.offsets[k], self.offsets[k + 1]);
            let start = write;
            for i in from..to {
                let rank = self.members[i];
                if keep(rank) {
                    self.members[write] = rank;
                    write += 1;
                }
            }
            if write > start {
                self.outputs.swap(kept_classes, k);
                self.offsets[kept_classes] = start;
                kept_classes += 1;
            }
        }
        self.outputs.truncate(kept_classes);
        self.offsets.truncate(kept_classes);
        self.offsets.push(write);
        self.members.truncate(write);
    }
}

impl<'a> IntoIterator for &'a Partition {
    type Item = Class<'a>;
    type IntoIter = Classes<'a>;
    fn into_iter(self) -> Classes<'a> {
        self.iter()
    }
}

/// Iterator over the classes of a [`Partition`], in order.
#[derive(Clone, Debug)]
pub struct Classes<'a> {
    partition: &'a Partition,
    front: usize,
    back: usize,
}

impl<'a> Iterator for Classes<'a> {
    type Item = Class<'a>;
    fn next(&mut self) -> Option<Class<'a>> {
        if self.front == self.back {
            return None;
        }
        self.front += 1;
        self.partition.get(self.front - 1)
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.back - self.front;
        (left, Some(left))
    }
}

impl DoubleEndedIterator for Classes<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        if self.front == self.back {
            return None;
        }
        self.back -= 1;
        self.partition.get(self.back)
    }
}

impl ExactSizeIterator for Classes<'_> {}

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
    /// List `list` (the first to do so) names `rank`, which [`refine_without`] was told
    /// no list may name.
    Outsider {
        /// Index of the first list naming it.
        list: usize,
        /// The rank.
        rank: Rank,
    },
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
            RefineError::Outsider { list, rank } => {
                write!(f, "list {list}: rank {rank} may not be a destination")
            }
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
trait DenseId: Copy + Default + Id {
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
    refine_checked(n, lists, None)
}

/// [`refine`], where moreover no list may name `outsider` (a task's root needs nothing
/// from itself). If one does, and no entry is bad in [`refine`]'s sense,
/// [`RefineError::Outsider`] names the first such list. The check costs `O(1)` beyond
/// [`refine`].
pub fn refine_without<L: AsRef<[Rank]>>(
    n: u32,
    lists: &[L],
    outsider: Rank,
) -> Result<Partition, RefineError> {
    refine_checked(n, lists, Some(outsider))
}

fn refine_checked<L: AsRef<[Rank]>>(
    n: u32,
    lists: &[L],
    outsider: Option<Rank>,
) -> Result<Partition, RefineError> {
    if lists.len() >= (u32::MAX - 1) as usize {
        return Err(RefineError::TooManyLists);
    }
    let entries: usize = lists.iter().map(|l| l.as_ref().len()).sum();
    if lists.len() <= small::SMALL_LISTS && entries <= small::SMALL_ENTRIES {
        // Bad input falls through to the paths below, which locate it.
        if let Some(partition) = small::refine_small(n, lists, outsider, entries) {
            return Ok(partition);
        }
    }
    // The dense array costs up to 8 bytes per rank of the communicator; use it unless
    // that is far more than the lists themselves.
    let dense = (n as usize) <= entries.saturating_mul(4).saturating_add(1 << 16);
    if dense {
        match lists.len() {
            0..=8 => return refine_by_masks::<u8, L>(n, lists, outsider),
            9..=16 => return refine_by_masks::<u16, L>(n, lists, outsider),
            17..=32 => return refine_by_masks::<u32, L>(n, lists, outsider),
            33..=64 => return refine_by_masks::<u64, L>(n, lists, outsider),
            _ => {}
        }
        // Distinct output sets: at most 2^m, and at most one new class per entry.
        let most_ids = 1u64
            .checked_shl(lists.len().min(63) as u32)
            .unwrap_or(u64::MAX)
            .min(entries as u64 + 1);
        if most_ids <= <u8 as DenseId>::MAX + 1 {
            refine_dense::<u8, L>(n, lists, outsider)
        } else if most_ids <= <u16 as DenseId>::MAX + 1 {
            refine_dense::<u16, L>(n, lists, outsider)
        } else {
            refine_dense::<u32, L>(n, lists, outsider)
        }
    } else {
        let mut map: HashMap<Rank, u32> = HashMap::with_capacity(entries.min(1 << 20));
        let sets = run_rounds(n, lists, &mut map)?;
        check_outsider(&map, &sets, n, outsider)?;
        let mut pairs: Vec<(Rank, u32)> = map.into_iter().collect();
        pairs.sort_unstable_by_key(|p| p.0);
        let ids: Vec<u32> = pairs.iter().map(|p| p.1).collect();
        let counts = count_ids(&ids, sets.len());
        Ok(group_by_id(
            &ids,
            &counts,
            |i| pairs[i].0,
            |id| sets[id].clone(),
        ))
    }
}

fn refine_dense<T: DenseId, L: AsRef<[Rank]>>(
    n: u32,
    lists: &[L],
    outsider: Option<Rank>,
) -> Result<Partition, RefineError> {
    let mut map: Vec<T> = vec![T::default(); n as usize];
    let sets = run_rounds(n, lists, &mut map)?;
    check_outsider(&map, &sets, n, outsider)?;
    let counts = count_ids(&map, sets.len());
    Ok(group_by_id(
        &map,
        &counts,
        |i| i as Rank,
        |id| sets[id].clone(),
    ))
}

/// After the rounds over `0..n`: `outsider`'s class, if it has one, names the lists
/// that name it (a rank outside `0..n` is in no list).
fn check_outsider<M: ClassMap>(
    map: &M,
    sets: &[OutputSet],
    n: u32,
    outsider: Option<Rank>,
) -> Result<(), RefineError> {
    let Some(rank) = outsider.filter(|&r| r < n) else {
        return Ok(());
    };
    match sets
        .get(map.get(rank) as usize)
        .and_then(|set| set.iter().next())
    {
        Some(list) => Err(RefineError::Outsider {
            list: list as usize,
            rank,
        }),
        None => Ok(()),
    }
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

/// A class id as read by [`group_by_id`].
pub(crate) trait Id: Copy {
    fn index(self) -> usize;
}

macro_rules! id {
    ($($t:ty),*) => {$(
        impl Id for $t {
            #[inline]
            fn index(self) -> usize {
                self as usize
            }
        }
    )*};
}
id!(u8, u16, u32, u64);

/// How many ranks have each id: overall, and for few ids also per block of
/// [`PLACE_BLOCK`] ranks (which [`group_by_id`] then places block by block).
pub(crate) struct IdCounts {
    /// `sizes[id]`: ranks with id `id`, for every id below the id count.
    pub(crate) sizes: Vec<u32>,
    /// Block `b`'s counts are `per_block[b * ids..(b + 1) * ids]`, `ids` being the id
    /// count; empty above [`BLOCKED_MAX_IDS`] ids.
    per_block: Vec<u32>,
}

/// Counts the ids below `id_count` in `ids`: see [`IdCounts`].
pub(crate) fn count_ids<M: Id>(ids: &[M], id_count: usize) -> IdCounts {
    if id_count > BLOCKED_MAX_IDS {
        return IdCounts {
            sizes: count_block(ids, id_count),
            per_block: Vec::new(),
        };
    }
    let mut sizes: Vec<u32> = vec![0; id_count];
    let mut per_block: Vec<u32> = Vec::with_capacity(ids.len().div_ceil(PLACE_BLOCK) * id_count);
    for block in ids.chunks(PLACE_BLOCK) {
        let counts = count_block(block, id_count);
        for (size, count) in sizes.iter_mut().zip(&counts) {
            *size += count;
        }
        per_block.extend_from_slice(&counts);
    }
    IdCounts { sizes, per_block }
}

/// How many of `ids` have each id below `id_count`.
fn count_block<M: Id>(ids: &[M], id_count: usize) -> Vec<u32> {
    if id_count > SPLIT_COUNT_MAX_IDS {
        let mut sizes: Vec<u32> = vec![0; id_count];
        for id in ids {
            sizes[id.index()] += 1;
        }
        return sizes;
    }
    // Four tables in turn, summed at the end: with one, a run of equal ids (classes that
    // are rank ranges) chains every increment through the same memory word.
    let mut tables: Vec<[u32; 4]> = vec![[0; 4]; id_count];
    let quads = ids.chunks_exact(4);
    for id in quads.remainder() {
        tables[id.index()][0] += 1;
    }
    for quad in quads {
        for (k, id) in quad.iter().enumerate() {
            tables[id.index()][k] += 1;
        }
    }
    tables.iter().map(|t| t.iter().sum()).collect()
}

/// Above this many ids, [`count_block`] keeps one table.
const SPLIT_COUNT_MAX_IDS: usize = 1 << 12;

/// Up to this many ids, ranks are placed block by block ([`place_by_block`]).
const BLOCKED_MAX_IDS: usize = 256;

/// Ranks per block in [`place_by_block`]: the block's positions (2 bytes each), sorted
/// by class, take half of a 32 KiB L1 data cache.
const PLACE_BLOCK: usize = 8192;
const _: () = assert!(PLACE_BLOCK <= 1 << 16, "block positions are stored as u16");

/// Groups ranks into a [`Partition`] by class id: `ids[i]` is the id of rank
/// `rank_of(i)` (ranks increasing with `i`), `counts` is [`count_ids`] of `ids`, id 0
/// means no class, and `outputs_of(id)` is the output set of id `id`'s class.
///
/// Two steps: find the ids in order of first appearance (the class order; the scan
/// stops once every id in use is found, which is early unless a class's smallest member
/// comes late) and give each class its start in the flat member array, allocated once at
/// its final size; then place every rank at its class's cursor ([`place_by_block`] for
/// few ids, [`place_directly`] otherwise).
pub(crate) fn group_by_id<M: Id>(
    ids: &[M],
    counts: &IdCounts,
    rank_of: impl Fn(usize) -> Rank,
    outputs_of: impl Fn(usize) -> OutputSet,
) -> Partition {
    let sizes = &counts.sizes;
    let in_use = sizes.iter().skip(1).filter(|&&s| s > 0).count();
    let total = ids.len() - sizes.first().map_or(0, |&s| s as usize);

    // cursor[id]: where the next rank of id `id` goes; id 0's cursor is `total`.
    const UNSEEN: usize = usize::MAX;
    let mut cursor: Vec<usize> = vec![UNSEEN; sizes.len()];
    if let Some(c) = cursor.first_mut() {
        *c = total;
    }
    let mut outputs: Vec<OutputSet> = Vec::with_capacity(in_use);
    let mut offsets: Vec<usize> = Vec::with_capacity(in_use + 1);
    let mut start = 0;
    for id in ids {
        if outputs.len() == in_use {
            break;
        }
        let id = id.index();
        if cursor[id] == UNSEEN {
            cursor[id] = start;
            offsets.push(start);
            outputs.push(outputs_of(id));
            start += sizes[id] as usize;
        }
    }
    offsets.push(total);

    let mut members: Vec<Rank> = vec![0; total];
    if counts.per_block.is_empty() {
        place_directly(ids, &mut cursor, &mut members, rank_of);
    } else {
        place_by_block(ids, &counts.per_block, &mut cursor, &mut members, rank_of);
    }
    Partition {
        outputs,
        offsets,
        members,
    }
}

/// Placement for few ids, block by block: sort the block's positions by id into a
/// buffer that stays in cache (the block's counts give each id's run), then write each
/// id's run, as ranks, at its cursor in `members` in one sequential piece.
///
/// Placing every rank straight at its cursor (as [`place_directly`] does) scatters
/// single 4-byte stores over as many places in `members` as there are classes; once
/// `members` outgrows the cache nearly every store misses, and the stores queue behind
/// each other. Whole runs are short sequential copies instead.
fn place_by_block<M: Id>(
    ids: &[M],
    per_block: &[u32],
    cursor: &mut [usize],
    members: &mut [Rank],
    rank_of: impl Fn(usize) -> Rank,
) {
    let id_count = cursor.len();
    // run[id]: the start of the id's run in `sorted`, then (after the block's ranks are
    // placed) its end.
    let mut run: Vec<u32> = vec![0; id_count];
    // The block's positions (not ranks), by id: half the bytes of ranks, so the buffer
    // stays in L1; the copy out turns them into ranks.
    let mut sorted: Vec<u16> = vec![0; PLACE_BLOCK.min(ids.len())];
    for (b, (block, counts)) in ids
        .chunks(PLACE_BLOCK)
        .zip(per_block.chunks_exact(id_count))
        .enumerate()
    {
        let mut end = 0;
        for (r, &count) in run.iter_mut().zip(counts) {
            *r = end;
            end += count;
        }
        let first = b * PLACE_BLOCK;
        for (i, id) in block.iter().enumerate() {
            let at = &mut run[id.index()];
            sorted[*at as usize] = i as u16;
            *at += 1;
        }
        // Id 0 (no class) has the first run of the buffer, which is not copied.
        let mut from = counts.first().map_or(0, |&c| c as usize);
        for (id, &to) in run.iter().enumerate().skip(1) {
            let to = to as usize;
            if to > from {
                let at = cursor[id];
                for (member, &i) in members[at..at + (to - from)]
                    .iter_mut()
                    .zip(&sorted[from..to])
                {
                    *member = rank_of(first + usize::from(i));
                }
                cursor[id] = at + (to - from);
            }
            from = to;
        }
    }
}

/// Placement for many ids: every rank goes straight to its class's cursor. Ranks of id
/// 0 are written to a spare slot past the end that never advances, so the loop has no
/// branch.
fn place_directly<M: Id>(
    ids: &[M],
    cursor: &mut [usize],
    members: &mut Vec<Rank>,
    rank_of: impl Fn(usize) -> Rank,
) {
    let total = members.len();
    members.push(0);
    for (i, id) in ids.iter().enumerate() {
        let id = id.index();
        let at = &mut cursor[id];
        members[*at] = rank_of(i);
        *at += usize::from(id != 0);
    }
    members.truncate(total);
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
        let (a, ab) = (set(&[0]), set(&[0, 1]));
        assert_eq!(
            p.iter().collect::<Vec<_>>(),
            [
                Class {
                    outputs: &a,
                    members: &[1]
                },
                Class {
                    outputs: &ab,
                    members: &[2]
                }
            ]
        );
        assert_eq!(p.members(), [1, 2]);
        assert_eq!(p.iter().next_back().map(|c| c.members), Some(&[2][..]));
    }

    #[test]
    fn retain_keeps_order_and_drops_emptied_classes() {
        // Classes: {1, 4} needs A, {2, 3} needs A and B, {5} needs B.
        let mut p = refine(6, &[vec![1, 2, 3, 4], vec![5, 3, 2]]).unwrap();
        assert_eq!(p.len(), 3);
        p.retain(|r| r != 2 && r != 3);
        let classes: Vec<(Vec<u32>, Vec<Rank>)> = p
            .iter()
            .map(|c| (c.outputs.iter().collect(), c.members.to_vec()))
            .collect();
        assert_eq!(classes, [(vec![0], vec![1, 4]), (vec![1], vec![5])]);
        assert_eq!(p.destinations(), 3);
        assert_eq!(p.members_of(2), [] as [Rank; 0]);
        assert!(p.get(2).is_none());
        p.retain(|_| false);
        assert!(p.is_empty());
        assert_eq!(p, Partition::default());
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
        // A repeat is found after the masks are set, yet it still wins over a later
        // rank out of range.
        assert_eq!(
            refine(4, &[vec![1, 1], vec![9]]),
            Err(RefineError::Duplicate { list: 0, rank: 1 })
        );
        assert_eq!(
            refine(4, &[vec![1], vec![2, 3, 2, 9]]),
            Err(RefineError::Duplicate { list: 1, rank: 2 })
        );
    }

    /// The first bad entry, in list order then entry order, found the slow way.
    fn first_bad(n: u32, lists: &[Vec<Rank>]) -> Option<RefineError> {
        for (list, l) in lists.iter().enumerate() {
            for (k, &rank) in l.iter().enumerate() {
                if rank >= n {
                    return Some(RefineError::OutOfRange { list, rank });
                }
                if l[..k].contains(&rank) {
                    return Some(RefineError::Duplicate { list, rank });
                }
            }
        }
        None
    }

    #[test]
    fn many_outputs_beyond_a_machine_word() {
        // Output j goes to ranks j and j + 1: 300 outputs, classes {j-1, j}.
        let lists: Vec<Vec<Rank>> = (0..300).map(|j| vec![j, j + 1]).collect();
        let p = refine(301, &lists).unwrap();
        assert_eq!(p.len(), 301);
        assert_eq!(p.get(200).map(|c| c.outputs), Some(&set(&[199, 200])));
    }

    #[test]
    fn huge_communicators_use_the_sparse_map() {
        let p = refine(u32::MAX, &[vec![u32::MAX - 1, 5], vec![5]]).unwrap();
        assert_eq!(p.members_of(0), [5]);
        assert_eq!(p.members_of(1), [u32::MAX - 1]);
    }

    /// The classes the slow way: every rank's need set, grouped, ordered by smallest
    /// member.
    fn reference(lists: &[Vec<Rank>]) -> Vec<(Vec<u32>, Vec<Rank>)> {
        let mut needs: BTreeMap<Rank, Vec<u32>> = BTreeMap::new();
        for (j, l) in lists.iter().enumerate() {
            for &r in l {
                needs.entry(r).or_default().push(j as u32);
            }
        }
        let mut classes: Vec<(Vec<u32>, Vec<Rank>)> = Vec::new();
        let mut index: BTreeMap<Vec<u32>, usize> = BTreeMap::new();
        for (r, need) in needs {
            let k = *index.entry(need.clone()).or_insert_with(|| {
                classes.push((need, Vec::new()));
                classes.len() - 1
            });
            classes[k].1.push(r);
        }
        classes
    }

    fn as_pairs(p: &Partition) -> Vec<(Vec<u32>, Vec<Rank>)> {
        p.iter()
            .map(|c| (c.outputs.iter().collect(), c.members.to_vec()))
            .collect()
    }

    /// Communicators of many placement blocks, with few classes (placed block by block)
    /// and many (placed directly), random or in rank ranges, lists in any order: the
    /// same classes as the slow way, whichever rank map is used.
    #[test]
    fn large_communicators_match_the_slow_way() {
        let mut rng = ft_core::rng::SplitMix::new(624);
        let n = 3 * PLACE_BLOCK as u32 + 777;
        for (outputs, ranges) in [
            (1, false),
            (3, true),
            (8, false),
            (8, true),
            (12, false),
            (70, false),
        ] {
            let lists: Vec<Vec<Rank>> = (0..outputs)
                .map(|j| {
                    let mut l: Vec<Rank> = if ranges {
                        // Output j goes to a few rank ranges: classes are runs of ranks.
                        let cut = |k: u32| (n / 7) * k + j as u32 * 97;
                        (0..n)
                            .filter(|&r| (1..7).any(|k| r >= cut(k) && r < cut(k) + n / 9))
                            .collect()
                    } else {
                        (0..n).filter(|_| rng.chance(1, 2)).collect()
                    };
                    if j % 2 == 1 {
                        l.reverse();
                    }
                    l
                })
                .collect();
            let expected = reference(&lists);
            let dense = refine(n, &lists).unwrap();
            assert_eq!(
                as_pairs(&dense),
                expected,
                "{outputs} outputs, ranges {ranges}"
            );
            let sparse = refine(n.saturating_mul(1 << 12), &lists).unwrap();
            assert_eq!(sparse, dense, "{outputs} outputs, ranges {ranges}");
        }
    }

    #[test]
    fn an_outsider_is_reported_after_bad_entries() {
        // Every path: masks as ids, relabelled masks, split rounds, the sparse map.
        for (m, n) in [(2usize, 90u32), (12, 90), (70, 90), (2, u32::MAX)] {
            let mut lists: Vec<Vec<Rank>> = (0..m).map(|j| vec![j as Rank + 10]).collect();
            lists[m - 1].push(5);
            assert!(refine_without(n, &lists, 4).is_ok(), "{m} lists");
            assert_eq!(
                refine_without(n, &lists, 5),
                Err(RefineError::Outsider {
                    list: m - 1,
                    rank: 5
                }),
                "{m} lists"
            );
            lists[0].push(5);
            assert_eq!(
                refine_without(n, &lists, 5),
                Err(RefineError::Outsider { list: 0, rank: 5 }),
                "{m} lists"
            );
            assert_eq!(refine(n, &lists).map(|p| p.destinations()), Ok(m + 1));
            // A repeated entry is reported first.
            lists[m - 1].push(m as Rank + 9);
            assert_eq!(
                refine_without(n, &lists, 5),
                Err(RefineError::Duplicate {
                    list: m - 1,
                    rank: m as Rank + 9
                }),
                "{m} lists"
            );
        }
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
            for c in &p {
                prop_assert!(!c.members.is_empty() && !c.outputs.is_empty());
                prop_assert!(c.members.windows(2).all(|w| w[0] < w[1]));
                prop_assert!(seen_first < Some(c.members[0]));
                seen_first = Some(c.members[0]);
                for r in c.members { prop_assert_eq!(&needs[r], c.outputs); }
            }
            let distinct: alloc::collections::BTreeSet<Vec<u32>> = needs.values().map(|s| s.iter().collect()).collect();
            prop_assert_eq!(distinct.len(), p.len());
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

    proptest! {
        /// The small-task path gives exactly the mask path's partition, and declines
        /// (for the mask path to report) every bad input and an outsider in a list;
        /// half the cases have increasing lists (the merge, up to 8 lists).
        #[test]
        fn the_small_task_path_agrees_with_the_masks(
            n in 1u32..3000,
            lists in prop::collection::vec(prop::collection::vec(0u32..3000, 0..40), 0..12),
            outsider in prop::option::of(0u32..3000),
            sorted in any::<bool>(),
        ) {
            // Now and then a rank out of range (n) or a repeat.
            let lists: Vec<Vec<Rank>> = lists
                .into_iter()
                .map(|l| {
                    let mut l: Vec<Rank> = l.into_iter().map(|r| r % (n + 1)).collect();
                    if sorted {
                        l.sort_unstable();
                    }
                    l
                })
                .collect();
            let entries = lists.iter().map(Vec::len).sum();
            let small = small::refine_small(n, &lists, outsider, entries);
            let masks = refine_by_masks::<u16, _>(n, &lists, outsider);
            match (small, masks) {
                (Some(s), Ok(m)) => prop_assert_eq!(s, m),
                (None, Err(_)) => {}
                (s, m) => prop_assert!(false, "small {:?} against masks {:?}", s, m),
            }
        }
    }

    proptest! {
        /// Bad input (repeats, ranks out of range, in any order) is reported at the
        /// first offending entry, whatever the path (mask widths, split rounds).
        #[test]
        fn bad_entries_are_found_where_they_are(
            n in 1u32..40,
            lists in prop::collection::vec(prop::collection::vec(0u32..44, 0..12), 1..20),
        ) {
            let got = refine(n, &lists);
            match first_bad(n, &lists) {
                Some(e) => prop_assert_eq!(got, Err(e)),
                None => prop_assert!(got.is_ok()),
            }
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
