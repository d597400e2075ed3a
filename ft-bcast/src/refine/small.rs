//! Refinement for small tasks: a few destination entries, whatever the communicator's
//! size.
//!
//! The dense paths cost `O(n)` however few the destinations: a task of 16 destinations
//! on 1024 ranks spent most of its plan in passes over 1024 masks. Here the cost
//! depends on the entries only: every entry becomes one word `rank · 64 + j`, the words
//! are sorted (so each rank's entries are adjacent, ranks in increasing order), each
//! rank's need mask is the OR of its entries' bits, and a rank's class id is given in
//! order of first appearance, which is the order of the classes' smallest members. A
//! counting pass over the ids then places each rank in the flat member array. Time
//! `O(E log E)` for `E = Σ|D_j|`, memory `O(E)`.
//!
//! Bad input (a rank out of range, a repeat, the outsider) is not located here: the
//! call returns `None` and the caller runs the mask path, which reports the first
//! offending entry exactly as every other path does.

use alloc::vec;
use alloc::vec::Vec;
use hashbrown::HashMap;

use ft_core::Rank;

use super::masks::output_set;
use super::Partition;

/// Tasks with at most this many destination entries take this path.
pub(super) const SMALL_ENTRIES: usize = 256;

/// Lists beyond this many do not fit one mask word.
pub(super) const SMALL_LISTS: usize = 64;

/// Up to this many classes, a rank's class is found by scanning the masks seen so far.
const SCAN: usize = 16;

/// The partition of `lists` over `0..n`, `outsider` named by no list; `None` on bad
/// input (see the module docs). Needs at most [`SMALL_LISTS`] lists.
pub(super) fn refine_small<L: AsRef<[Rank]>>(
    n: u32,
    lists: &[L],
    outsider: Option<Rank>,
    entries: usize,
) -> Option<Partition> {
    debug_assert!(lists.len() <= SMALL_LISTS);
    let mut words: Vec<u64> = Vec::with_capacity(entries);
    for (j, list) in lists.iter().enumerate() {
        for &rank in list.as_ref() {
            if rank >= n || Some(rank) == outsider {
                return None;
            }
            words.push(u64::from(rank) << 6 | j as u64);
        }
    }
    words.sort_unstable();
    // Each rank with its mask, in rank order; then its class id.
    let mut ranks: Vec<(Rank, u64)> = Vec::with_capacity(words.len());
    for word in words {
        let (rank, bit) = ((word >> 6) as Rank, 1u64 << (word & 63));
        match ranks.last_mut() {
            Some((last, mask)) if *last == rank => {
                if *mask & bit != 0 {
                    return None;
                }
                *mask |= bit;
            }
            _ => ranks.push((rank, bit)),
        }
    }
    // Class ids in order of first appearance: a scan of the masks seen while they are
    // few, a map beyond.
    let mut masks: Vec<u64> = Vec::new();
    let mut id_of: HashMap<u64, u32> = HashMap::new();
    for (_, mask_then_id) in ranks.iter_mut() {
        let mask = *mask_then_id;
        let found = if masks.len() <= SCAN {
            masks.iter().position(|&m| m == mask).map(|id| id as u32)
        } else {
            id_of.get(&mask).copied()
        };
        let id = found.unwrap_or_else(|| {
            let id = masks.len() as u32;
            masks.push(mask);
            if masks.len() == SCAN + 1 {
                id_of.extend(masks.iter().enumerate().map(|(id, &m)| (m, id as u32)));
            } else if masks.len() > SCAN + 1 {
                id_of.insert(mask, id);
            }
            id
        });
        *mask_then_id = u64::from(id);
    }
    // offsets[id + 1] counts class id, then (prefix sums) ends where it ends; placing
    // the ranks from the last moves it back to where the class starts.
    let mut offsets = Vec::with_capacity(masks.len() + 2);
    offsets.resize(masks.len() + 1, 0usize);
    for &(_, id) in &ranks {
        offsets[id as usize + 1] += 1;
    }
    for k in 1..offsets.len() {
        offsets[k] += offsets[k - 1];
    }
    let mut members = vec![0; ranks.len()];
    for &(rank, id) in ranks.iter().rev() {
        let end = &mut offsets[id as usize + 1];
        *end -= 1;
        members[*end] = rank;
    }
    // Now offsets[k + 1] is where class k starts: shift to the partition's layout.
    offsets.remove(0);
    offsets.push(members.len());
    Some(Partition {
        outputs: masks.into_iter().map(output_set).collect(),
        offsets,
        members,
    })
}
