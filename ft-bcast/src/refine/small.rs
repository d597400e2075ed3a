//! Refinement for small tasks: a few destination entries, whatever the communicator's
//! size.
//!
//! The dense paths cost `O(n)` however few the destinations: a task of 16 destinations
//! on 1024 ranks spent most of its plan in passes over 1024 masks. Here the cost
//! depends on the entries only. First every rank with its need mask, in increasing rank
//! order: when the task has at most [`MERGE_LISTS`] lists and each is strictly
//! increasing (the usual way a runtime lists destinations), by merging the lists,
//! `O(E · m)` with no sort; otherwise every entry becomes one word `rank · 64 + j`, the
//! words are sorted (so each rank's entries are adjacent) and each rank's mask is the
//! OR of its entries' bits. Then a rank's class id is given in order of first
//! appearance, which is the order of the classes' smallest members, and a counting
//! pass over the ids places each rank in the flat member array. Time `O(E log E)` for
//! `E = Σ|D_j|` at worst, memory `O(E)`.
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
use crate::outputs::OutputSet;

/// Tasks with at most this many destination entries take this path.
pub(super) const SMALL_ENTRIES: usize = 256;

/// Lists beyond this many do not fit one mask word.
pub(super) const SMALL_LISTS: usize = 64;

/// Up to this many classes, a rank's class is found by scanning the masks seen so far.
const SCAN: usize = 16;

/// Up to this many lists, sorted lists are merged rather than sorted together.
pub(super) const MERGE_LISTS: usize = 8;

/// Each rank named by the strictly increasing `lists` (at most [`MERGE_LISTS`]) with its
/// need mask, in increasing rank order, appended to `ranks`: the smallest head of the
/// lists is taken, with the bits of every list it heads. `None` on a list that is not
/// strictly increasing (unsorted, or a repeat), on a rank `>= n` or on `outsider`.
fn merge_sorted<L: AsRef<[Rank]>>(
    n: u32,
    lists: &[L],
    outsider: Option<Rank>,
    ranks: &mut Vec<(Rank, u64)>,
) -> Option<()> {
    // What is left of each list.
    let mut rest: [&[Rank]; MERGE_LISTS] = [&[]; MERGE_LISTS];
    for (list, rest) in lists.iter().zip(&mut rest) {
        let list = list.as_ref();
        if list.windows(2).any(|w| w[0] >= w[1]) || list.last().is_some_and(|&r| r >= n) {
            return None;
        }
        if outsider.is_some_and(|o| list.binary_search(&o).is_ok()) {
            return None;
        }
        *rest = list;
    }
    let rest = &mut rest[..lists.len()];
    loop {
        let Some(next) = rest.iter().filter_map(|l| l.first()).min().copied() else {
            return Some(());
        };
        let mut mask = 0u64;
        for (j, list) in rest.iter_mut().enumerate() {
            if let [first, tail @ ..] = list {
                if *first == next {
                    mask |= 1 << j;
                    *list = tail;
                }
            }
        }
        ranks.push((next, mask));
    }
}

/// Each rank named by `lists` with its need mask, in increasing rank order, by sorting
/// the entries; `None` on a repeat, on a rank `>= n` or on `outsider`.
fn sort_entries<L: AsRef<[Rank]>>(
    n: u32,
    lists: &[L],
    outsider: Option<Rank>,
    entries: usize,
    ranks: &mut Vec<(Rank, u64)>,
) -> Option<()> {
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
    Some(())
}

/// The partition of `lists` over `0..n`, `outsider` named by no list; `None` on bad
/// input (see the module docs). Needs at most [`SMALL_LISTS`] lists.
pub(super) fn refine_small<L: AsRef<[Rank]>>(
    n: u32,
    lists: &[L],
    outsider: Option<Rank>,
    entries: usize,
) -> Option<Partition> {
    debug_assert!(lists.len() <= SMALL_LISTS);
    // Each rank with its mask, in rank order; then its class id.
    let mut ranks: Vec<(Rank, u64)> = Vec::with_capacity(entries);
    let merged =
        lists.len() <= MERGE_LISTS && merge_sorted(n, lists, outsider, &mut ranks).is_some();
    if !merged {
        ranks.clear();
        sort_entries(n, lists, outsider, entries, &mut ranks)?;
    }
    // Class ids in order of first appearance: a scan of the masks seen while they are
    // few (kept on the stack), a map beyond (their masks kept in `more`).
    let mut seen = [0u64; SCAN + 1];
    let mut more: Vec<u64> = Vec::new();
    let mut classes = 0usize;
    let mut id_of: HashMap<u64, u32> = HashMap::new();
    for (_, mask_then_id) in ranks.iter_mut() {
        let mask = *mask_then_id;
        let found = if classes <= SCAN {
            seen[..classes]
                .iter()
                .position(|&m| m == mask)
                .map(|id| id as u32)
        } else {
            id_of.get(&mask).copied()
        };
        let id = found.unwrap_or_else(|| {
            if classes <= SCAN {
                seen[classes] = mask;
            } else {
                more.push(mask);
            }
            if classes == SCAN {
                id_of.extend(seen.iter().enumerate().map(|(id, &m)| (m, id as u32)));
            } else if classes > SCAN {
                id_of.insert(mask, classes as u32);
            }
            classes += 1;
            classes as u32 - 1
        });
        *mask_then_id = u64::from(id);
    }
    let mut outputs: Vec<OutputSet> = Vec::with_capacity(classes);
    outputs.extend(
        seen[..classes.min(SCAN + 1)]
            .iter()
            .chain(&more)
            .map(|&m| output_set(m)),
    );
    // offsets[id + 1] counts class id, then (prefix sums) ends where it ends; placing
    // the ranks from the last moves it back to where the class starts.
    let mut offsets = Vec::with_capacity(outputs.len() + 2);
    offsets.resize(outputs.len() + 1, 0usize);
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
        outputs,
        offsets,
        members,
    })
}
