//! Refinement for tasks with at most 64 outputs, where a rank's class *is* its need mask.
//!
//! With `m ≤ 64` outputs the set of outputs a rank needs fits in one word, and two ranks
//! are in the same class exactly when their masks are equal. Refining by `D_j` then
//! amounts to setting bit `j` in the mask of every rank of `D_j`, and the classes come out
//! of two passes in rank order over the masks:
//!
//! 1. relabel every mask with a dense class id, in order of first appearance (so in order
//!    of smallest member), counting each class's size (up to 8 outputs the mask itself
//!    serves as the id, and this pass only counts and notes first appearances);
//! 2. append each rank to its class's member list, allocated at its final size, a block
//!    of ranks at a time (see `fill_blocked`).
//!
//! Every pass is sequential over the lists or the mask array, and the array is the
//! narrowest word that holds `m` bits (one byte per rank for up to 8 outputs), so the
//! scattered updates of pass 0 mostly hit cache. The cost is `O(n + Σ|D_j|)`; labels
//! cost one table lookup per rank for up to 16 outputs and one hash lookup per run of
//! equal masks beyond.

use alloc::vec;
use alloc::vec::Vec;
use core::ops::{BitAnd, BitOr};
use hashbrown::HashMap;

use ft_core::Rank;

use super::{Class, Partition, RefineError};
use crate::outputs::OutputSet;

/// An unsigned word used as a set of at most `BITS` outputs, or (after relabelling) as
/// a class id.
pub(super) trait NeedMask: Copy + Eq + BitOr<Output = Self> + BitAnd<Output = Self> {
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

/// Refines `0..n` by `lists` (at most `M`'s width of them): see the module docs.
pub(super) fn refine_by_masks<M: NeedMask, L: AsRef<[Rank]>>(
    n: u32,
    lists: &[L],
) -> Result<Partition, RefineError> {
    debug_assert!(lists.len() <= mask_bits::<M>() as usize);
    let mut masks = need_masks::<M, L>(n, lists)?;
    if lists.len() <= SMALL_OUTPUTS {
        return Ok(group_small_masks(&masks, lists.len()));
    }

    // Pass 1: masks become class ids; sizes counted per id.
    let mut labels = M::Labels::new(lists.len());
    let mut sizes: Vec<u32> = vec![0];
    for word in masks.iter_mut() {
        let id = labels.label(*word);
        if id as usize == sizes.len() {
            sizes.push(0);
        }
        sizes[id as usize] += 1;
        *word = M::from_id(id);
    }

    // Pass 2: member lists, each allocated once at its final size.
    let mut classes: Vec<Class> = labels
        .into_masks()
        .into_iter()
        .zip(sizes)
        .skip(1)
        .map(|(mask, size)| Class {
            outputs: output_set(mask.widen()),
            members: Vec::with_capacity(size as usize),
        })
        .collect();
    if classes.len() <= MAX_BLOCKED_CLASSES {
        let identity: Vec<u32> = (0..=classes.len() as u32).collect();
        fill_blocked(&masks, &identity, &mut classes);
    } else {
        for (rank, id) in masks.iter().enumerate() {
            let id = id.widen() as usize;
            if id != 0 {
                classes[id - 1].members.push(rank as Rank);
            }
        }
    }
    Ok(Partition { classes })
}

/// Up to this many outputs, masks serve directly as buckets of [`fill_blocked`] (at
/// most 256 of them), which saves the relabelling pass.
const SMALL_OUTPUTS: usize = 8;

/// Passes 1 and 2 for at most [`SMALL_OUTPUTS`] outputs: one pass counts each mask's
/// ranks and notes the masks in order of first appearance (the class order), and the
/// fill reads the masks as they are.
fn group_small_masks<M: NeedMask>(masks: &[M], outputs: usize) -> Partition {
    let buckets = 1usize << outputs;
    let mut sizes: Vec<u32> = vec![0; buckets];
    let mut first_seen: Vec<M> = Vec::new();
    for &mask in masks {
        let size = &mut sizes[mask.widen() as usize];
        if *size == 0 && mask != M::EMPTY {
            first_seen.push(mask);
        }
        *size += 1;
    }
    // class_of[mask]: 1 + the index of the mask's class, 0 for the empty mask.
    let mut class_of: Vec<u32> = vec![0; buckets];
    let mut classes: Vec<Class> = Vec::with_capacity(first_seen.len());
    for mask in first_seen {
        let bucket = mask.widen() as usize;
        classes.push(Class {
            outputs: output_set(mask.widen()),
            members: Vec::with_capacity(sizes[bucket] as usize),
        });
        class_of[bucket] = classes.len() as u32;
    }
    fill_blocked(masks, &class_of, &mut classes);
    Partition { classes }
}

/// Ranks per block of [`fill_blocked`]: its scratch (4 bytes a rank) stays in L2.
const FILL_BLOCK: usize = 16 * 1024;

/// Up to this many classes, [`fill_blocked`] pays for its per-block prefix sums.
const MAX_BLOCKED_CLASSES: usize = 4096;

/// Appends every rank to its class's members, given each rank's bucket (`ids`) and
/// `class_of[bucket]`: 1 + the index of the bucket's class, or 0 for no class.
///
/// Pushing each rank straight to its class writes to as many places at once as there
/// are classes, and with hundreds of them nearly every store misses the cache. Instead,
/// each block of ranks is counting-sorted by bucket into a small scratch buffer that
/// stays in cache, and every class then receives its run of the block in one copy.
fn fill_blocked<M: NeedMask>(ids: &[M], class_of: &[u32], classes: &mut [Class]) {
    let mut scratch: Vec<Rank> = vec![0; FILL_BLOCK.min(ids.len())];
    // The block's ranks sorted by bucket go to the scratch, bucket 0 first.
    // `cursor[b + 1]` starts as the offset of bucket b's run and ends as the offset of
    // its end, which is also the start of bucket b + 1's run.
    let mut cursor: Vec<u32> = vec![0; class_of.len() + 1];
    for (b, block) in ids.chunks(FILL_BLOCK).enumerate() {
        let first_rank = (b * FILL_BLOCK) as Rank;
        cursor.iter_mut().for_each(|c| *c = 0);
        for id in block {
            cursor[id.widen() as usize + 1] += 1;
        }
        let mut total = 0;
        for c in cursor.iter_mut() {
            total += *c;
            *c = total - *c;
        }
        for (i, id) in block.iter().enumerate() {
            let at = &mut cursor[id.widen() as usize + 1];
            scratch[*at as usize] = first_rank + i as Rank;
            *at += 1;
        }
        // Bucket k's run ends at cursor[k + 1] and starts where bucket k - 1's ends.
        for (k, &class) in class_of.iter().enumerate() {
            let (from, to) = (cursor[k] as usize, cursor[k + 1] as usize);
            if class != 0 && from < to {
                classes[class as usize - 1]
                    .members
                    .extend_from_slice(&scratch[from..to]);
            }
        }
    }
}

/// Pass 0: every rank's need mask, checking ranks and repeats in list order.
fn need_masks<M: NeedMask, L: AsRef<[Rank]>>(n: u32, lists: &[L]) -> Result<Vec<M>, RefineError> {
    let mut masks: Vec<M> = vec![M::EMPTY; n as usize];
    for (j, list) in lists.iter().enumerate() {
        let bit = M::bit(j);
        for &rank in list.as_ref() {
            let Some(mask) = masks.get_mut(rank as usize) else {
                return Err(RefineError::OutOfRange { list: j, rank });
            };
            if *mask & bit != M::EMPTY {
                return Err(RefineError::Duplicate { list: j, rank });
            }
            *mask = *mask | bit;
        }
    }
    Ok(masks)
}

/// The outputs whose bits are set in `bits`.
fn output_set(mut bits: u64) -> OutputSet {
    let mut set = OutputSet::new();
    while bits != 0 {
        set.insert(bits.trailing_zeros());
        bits &= bits - 1;
    }
    set
}
