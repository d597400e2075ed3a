//! Refinement for tasks with at most 64 outputs, where a rank's class *is* its need mask.
//!
//! With `m ≤ 64` outputs the set of outputs a rank needs fits in one word, and two ranks
//! are in the same class exactly when their masks are equal. Refining by `D_j` then
//! amounts to setting bit `j` in the mask of every rank of `D_j` (pass 0), and the
//! classes come out of passes in rank order over the masks:
//!
//! 1. beyond 8 outputs, relabel every mask with a dense class id in order of first
//!    appearance (up to 8 outputs the mask itself serves as the id, at most 256 ids);
//! 2. count each id's ranks (per block of ranks, for few ids); the counts also check
//!    that no list repeats a rank (list `j` has as many entries as there are ranks with
//!    bit `j`), so pass 0 does no test per entry;
//! 3. group: the flat member array of the [`Partition`] is filled by one counting-sort
//!    pass (`group_by_id` in the parent module), block by block for few ids.
//!
//! Every pass is sequential over the lists or the mask array, and the array is the
//! narrowest word that holds `m` bits (one byte per rank for up to 8 outputs), so the
//! scattered updates of pass 0 mostly hit cache. The cost is `O(n + Σ|D_j|)` time and
//! `n` words plus the member array of memory; labels cost one table lookup per rank for
//! up to 16 outputs and one hash lookup per run of equal masks beyond. Bad input (a
//! rank out of range, a repeat) is found by pass 0 or the counts and then located
//! exactly by a slow second look, so it is reported at the same entry as by the split
//! rounds of the parent module.

use alloc::vec;
use alloc::vec::Vec;
use core::ops::{BitAnd, BitOr};
use hashbrown::HashMap;

use ft_core::Rank;

use super::{count_ids, group_by_id, Id, Partition, RefineError};
use crate::outputs::OutputSet;

/// An unsigned word used as a set of at most `BITS` outputs, or (after relabelling) as
/// a class id.
pub(super) trait NeedMask:
    Copy + Eq + Id + BitOr<Output = Self> + BitAnd<Output = Self>
{
    /// The empty set; also the id of the class of ranks that need nothing.
    const EMPTY: Self;
    /// Maps masks to class ids.
    type Labels: Labels<Self>;
    /// `{j}`, for `j < BITS`.
    fn bit(j: usize) -> Self;
    /// The word as a `u64` (a mask's bits, or a class id).
    fn widen(self) -> u64;
    /// Class id `id` as a word. Ids are below the number of distinct masks, which is at
    /// most `min(2^BITS, n)`, so they fit.
    fn from_id(id: u32) -> Self;
}

/// Dense class ids for masks, `0` for the empty mask and `1, 2, ...` for the others in
/// order of first appearance.
pub(super) trait Labels<M>: Sized {
    /// Labels for masks of `outputs` bits.
    fn new(outputs: usize) -> Self;
    /// The id of `mask`, assigning the next one if it is new.
    fn label(&mut self, mask: M) -> u32;
    /// The mask of every id, in id order.
    fn into_masks(self) -> Vec<M>;
}

/// Labels in a table indexed by the mask (`2^m` entries for `m ≤ 16` outputs).
pub(super) struct TableLabels<M> {
    id_of: Vec<u32>,
    masks: Vec<M>,
}

/// `TableLabels::id_of` entry of a mask not seen yet (only the empty mask has id 0).
const UNSEEN: u32 = 0;

impl<M: NeedMask> Labels<M> for TableLabels<M> {
    fn new(outputs: usize) -> Self {
        TableLabels {
            id_of: vec![UNSEEN; 1 << outputs],
            masks: vec![M::EMPTY],
        }
    }

    #[inline]
    fn label(&mut self, mask: M) -> u32 {
        let slot = &mut self.id_of[mask.widen() as usize];
        if *slot == UNSEEN && mask != M::EMPTY {
            *slot = self.masks.len() as u32;
            self.masks.push(mask);
        }
        *slot
    }

    fn into_masks(self) -> Vec<M> {
        self.masks
    }
}

/// Labels in a hash map (17 to 64 outputs), with the last mask cached: neighbouring ranks
/// often share a class.
pub(super) struct HashLabels<M> {
    id_of: HashMap<u64, u32>,
    masks: Vec<M>,
    last: (M, u32),
}

impl<M: NeedMask> Labels<M> for HashLabels<M> {
    fn new(_outputs: usize) -> Self {
        let mut id_of = HashMap::new();
        id_of.insert(M::EMPTY.widen(), 0);
        HashLabels {
            id_of,
            masks: vec![M::EMPTY],
            last: (M::EMPTY, 0),
        }
    }

    #[inline]
    fn label(&mut self, mask: M) -> u32 {
        if mask == self.last.0 {
            return self.last.1;
        }
        let next = self.masks.len() as u32;
        let id = *self.id_of.entry(mask.widen()).or_insert(next);
        if id == next {
            self.masks.push(mask);
        }
        self.last = (mask, id);
        id
    }

    fn into_masks(self) -> Vec<M> {
        self.masks
    }
}

/// Number of bits of `M`.
fn mask_bits<M: NeedMask>() -> u32 {
    (core::mem::size_of::<M>() * 8) as u32
}

macro_rules! need_mask {
    ($t:ty, $labels:ident) => {
        impl NeedMask for $t {
            const EMPTY: Self = 0;
            type Labels = $labels<$t>;
            #[inline]
            fn bit(j: usize) -> Self {
                1 << j
            }
            #[inline]
            fn widen(self) -> u64 {
                self.into()
            }
            #[inline]
            fn from_id(id: u32) -> Self {
                id as $t
            }
        }
    };
}
need_mask!(u8, TableLabels);
need_mask!(u16, TableLabels);
need_mask!(u32, HashLabels);
need_mask!(u64, HashLabels);

/// Refines `0..n` by `lists` (at most `M`'s width of them), `outsider` being a rank no
/// list may name: see the module docs.
pub(super) fn refine_by_masks<M: NeedMask, L: AsRef<[Rank]>>(
    n: u32,
    lists: &[L],
    outsider: Option<Rank>,
) -> Result<Partition, RefineError> {
    debug_assert!(lists.len() <= mask_bits::<M>() as usize);
    let mut masks = need_masks::<M, L>(n, lists)?;
    // The lists naming the outsider are its mask's bits; reported after bad entries.
    let outsider = outsider.and_then(|rank| {
        let mask = masks.get(rank as usize)?.widen();
        (mask != 0).then(|| RefineError::Outsider {
            list: mask.trailing_zeros() as usize,
            rank,
        })
    });
    if lists.len() <= SMALL_OUTPUTS {
        return group_masks::<M, L>(n, lists, &masks, 1 << lists.len(), |id| id as u64, outsider);
    }

    // Masks become dense class ids, in order of first appearance.
    let mut labels = M::Labels::new(lists.len());
    for word in masks.iter_mut() {
        *word = M::from_id(labels.label(*word));
    }
    let label_masks = labels.into_masks();
    group_masks::<M, L>(
        n,
        lists,
        &masks,
        label_masks.len(),
        |id| label_masks[id].widen(),
        outsider,
    )
}

/// The end of both paths: counts `ids` (class ids below `id_count`, id `id` standing
/// for mask `mask_of(id)`), checks that no list repeats a rank, then reports `outsider`
/// (the error for a rank no list may name, if one does) or groups the ranks.
fn group_masks<M: NeedMask, L: AsRef<[Rank]>>(
    n: u32,
    lists: &[L],
    ids: &[M],
    id_count: usize,
    mask_of: impl Fn(usize) -> u64,
    outsider: Option<RefineError>,
) -> Result<Partition, RefineError> {
    let counts = count_ids(ids, id_count);
    check_no_repeats::<M, L>(n, lists, &counts.sizes, &mask_of)?;
    if let Some(e) = outsider {
        return Err(e);
    }
    Ok(group_by_id(
        ids,
        &counts,
        |i| i as Rank,
        |id| output_set(mask_of(id)),
    ))
}

/// Up to this many outputs, masks serve directly as class ids (at most 256 of them),
/// which saves the relabelling pass.
const SMALL_OUTPUTS: usize = 8;

/// The repeat check of pass 0, done on the class sizes: list `j` names no rank twice
/// exactly when as many ranks have bit `j` as the list has entries (`mask_of(id)` is
/// the mask of class id `id`). On a mismatch the lists are checked entry by entry for
/// the first offending one.
fn check_no_repeats<M: NeedMask, L: AsRef<[Rank]>>(
    n: u32,
    lists: &[L],
    sizes: &[u32],
    mask_of: impl Fn(usize) -> u64,
) -> Result<(), RefineError> {
    let mut with_bit: Vec<u64> = vec![0; lists.len()];
    for (id, &size) in sizes.iter().enumerate().filter(|(_, &s)| s > 0) {
        let mut bits = mask_of(id);
        while bits != 0 {
            with_bit[bits.trailing_zeros() as usize] += u64::from(size);
            bits &= bits - 1;
        }
    }
    if lists
        .iter()
        .zip(&with_bit)
        .all(|(list, &count)| list.as_ref().len() as u64 == count)
    {
        return Ok(());
    }
    first_bad_entry::<M, L>(n, lists).map_or(Ok(()), Err)
}

/// Pass 0: every rank's need mask. A rank out of range is reported here; repeats are
/// not looked for (that would cost a test and a branch per entry, the bulk of this
/// pass): a repeat leaves fewer ranks with the list's bit than the list has entries,
/// which [`check_no_repeats`] sees from the class sizes.
fn need_masks<M: NeedMask, L: AsRef<[Rank]>>(n: u32, lists: &[L]) -> Result<Vec<M>, RefineError> {
    let mut masks: Vec<M> = vec![M::EMPTY; n as usize];
    for (j, list) in lists.iter().enumerate() {
        let bit = M::bit(j);
        for &rank in list.as_ref() {
            let Some(mask) = masks.get_mut(rank as usize) else {
                // This entry is the first bad one unless a repeat comes before it.
                return Err(first_bad_entry::<M, L>(n, &lists[..=j])
                    .unwrap_or(RefineError::OutOfRange { list: j, rank }));
            };
            *mask = *mask | bit;
        }
    }
    Ok(masks)
}

/// The first entry, in list order then entry order, that is out of range or repeats a
/// rank of its list: the slow path, taken only when pass 0 has seen bad input.
fn first_bad_entry<M: NeedMask, L: AsRef<[Rank]>>(n: u32, lists: &[L]) -> Option<RefineError> {
    let mut masks: Vec<M> = vec![M::EMPTY; n as usize];
    for (j, list) in lists.iter().enumerate() {
        let bit = M::bit(j);
        for &rank in list.as_ref() {
            let Some(mask) = masks.get_mut(rank as usize) else {
                return Some(RefineError::OutOfRange { list: j, rank });
            };
            if *mask & bit != M::EMPTY {
                return Some(RefineError::Duplicate { list: j, rank });
            }
            *mask = *mask | bit;
        }
    }
    None
}

/// The outputs whose bits are set in `bits`.
pub(super) fn output_set(mut bits: u64) -> OutputSet {
    let mut set = OutputSet::new();
    while bits != 0 {
        set.insert(bits.trailing_zeros());
        bits &= bits - 1;
    }
    set
}
