//! [`Survivors`]: the renumbering of a communicator shrunk by an agreed failed set `G`.
//!
//! The survivors of a communicator of `n` ranks are `C \ G`, renumbered `0..n-|G|` in
//! their old order: old rank `r ∉ G` becomes `r - |{g ∈ G : g < r}|` (a *rank* query on
//! `G`), and new rank `k` is the `k`-th non-member of `G` (a *select* query). Both are
//! binary searches over the sorted members of `G`, so the structure costs `4·|G|` bytes
//! and `O(log |G|)` per query, whatever `n` is.
//!
//! The agreement uses the same numbering to lay its trees over the live ranks, so the
//! shrunk communicator's rank 0 is the first coordinator of the next validation.

use alloc::vec::Vec;

use crate::rank::Rank;
use crate::rankset::RankSet;

/// The old ↔ new rank mapping of a communicator of `n` ranks without the ranks of `G`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Survivors {
    n: u32,
    /// Members of `G`, strictly increasing.
    gone: Vec<Rank>,
}

impl Survivors {
    /// The survivors of a communicator of `removed.universe()` ranks once `removed` (the
    /// agreed `G`) is taken out.
    pub fn new(removed: &RankSet) -> Self {
        Survivors {
            n: removed.universe(),
            gone: removed.iter().collect(),
        }
    }

    /// The size of the old communicator.
    pub fn old_size(&self) -> u32 {
        self.n
    }

    /// The size of the shrunk communicator: `n - |G|`.
    pub fn len(&self) -> u32 {
        self.n - self.gone.len() as u32
    }

    /// True when nobody survives.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether old rank `old` survives (is in `0..n` and not in `G`).
    pub fn contains(&self, old: Rank) -> bool {
        old < self.n && self.gone.binary_search(&old).is_err()
    }

    /// The new rank of old rank `old`, or `None` if it is in `G` or out of range.
    pub fn new_rank(&self, old: Rank) -> Option<Rank> {
        if old >= self.n {
            return None;
        }
        match self.gone.binary_search(&old) {
            Ok(_) => None,
            Err(below) => Some(old - below as Rank),
        }
    }

    /// The old rank of new rank `new`, or `None` if `new >= len()`.
    pub fn old_rank(&self, new: Rank) -> Option<Rank> {
        if new >= self.len() {
            return None;
        }
        // `gone[i] - i` counts the survivors below `gone[i]`; it never decreases. The
        // answer is `new + j`, where `j` is how many members of G have fewer than `new + 1`
        // survivors below them.
        let (mut lo, mut hi) = (0usize, self.gone.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.gone[mid] - mid as Rank <= new {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        Some(new + lo as Rank)
    }

    /// The survivors' old ranks, in increasing order (= new-rank order).
    pub fn iter(&self) -> impl Iterator<Item = Rank> + '_ {
        (0..self.len()).filter_map(|k| self.old_rank(k))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renumbering_keeps_order_and_round_trips() {
        for n in 1u32..40 {
            for mask in [
                0u64,
                1,
                0b1010,
                0b111000,
                0xffff_ffff_ffff,
                0x5555_5555_5555,
            ] {
                let g = RankSet::from_ranks(n, (0..n).filter(|r| mask >> (r % 48) & 1 == 1));
                let s = Survivors::new(&g);
                let live: Vec<Rank> = (0..n).filter(|r| !g.contains(*r)).collect();
                assert_eq!(s.len() as usize, live.len());
                for (k, &old) in live.iter().enumerate() {
                    assert_eq!(s.new_rank(old), Some(k as Rank));
                    assert_eq!(s.old_rank(k as Rank), Some(old));
                }
                for r in g.iter() {
                    assert_eq!(s.new_rank(r), None);
                    assert!(!s.contains(r));
                }
                assert_eq!(s.old_rank(s.len()), None);
                assert_eq!(s.new_rank(n), None);
                assert!(s.iter().eq(live.iter().copied()));
            }
        }
    }
}
