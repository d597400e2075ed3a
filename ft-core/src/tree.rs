//! [`LiveTree`]: the binomial tree over the ranks outside an excluded set, and the
//! in-place repair queries every tree user shares.
//!
//! Layout: the ranks `C \ D` are renumbered `0..m` in rank order ([`Survivors`]); index
//! `i > 0` has parent [`binomial_parent`]`(i) = i & (i - 1)` and the children
//! [`binomial_children`]: `i + 2^k` for every `2^k` below `lowbit(i)` (any `k` for the
//! root), as long as they are below `m`. So the subtree of `i` is the index range
//! `[i, i + lowbit(i))`, the depth of `i` is `popcount(i)` and the tree's depth is at
//! most `⌈log2 m⌉`. This is MPI's binomial broadcast shape (the root sends to 1, 2, 4,
//! ...), which the broadcast's `Topology::Binomial` also lays out over its positions.
//!
//! Repair around deaths that happen after the layout was fixed (`dead ⊇ D` ranks are
//! still in the tree, but will not forward): a rank's answers go to its
//! [`LiveTree::nearest_live_ancestor`], and what a dead rank should have passed down
//! goes to [`LiveTree::live_below`] it: the live ranks whose path up to it is all dead.

use alloc::vec::Vec;

use crate::rank::Rank;
use crate::rankset::RankSet;
use crate::shrink::Survivors;

/// The parent index of index `i` in a binomial tree (`None` for the root, 0).
pub fn binomial_parent(i: u64) -> Option<u64> {
    (i > 0).then(|| i & (i - 1))
}

/// The child indices of index `i` in a binomial tree of `len` indices `0..len`, biggest
/// subtree first.
pub fn binomial_children(i: u64, len: u64) -> impl DoubleEndedIterator<Item = u64> {
    let below = if i == 0 { 64 } else { i.trailing_zeros() };
    (0..below)
        .rev()
        .filter_map(move |k| i.checked_add(1u64 << k))
        .filter(move |&c| c < len)
}

/// The binomial tree over the ranks outside an excluded set.
#[derive(Clone, Debug)]
pub struct LiveTree {
    live: Survivors,
}

impl LiveTree {
    /// The tree over `C \ excluded`.
    pub fn new(excluded: &RankSet) -> Self {
        LiveTree {
            live: Survivors::new(excluded),
        }
    }

    /// The renumbering the tree is laid out on.
    pub fn members(&self) -> &Survivors {
        &self.live
    }

    /// The root: the lowest rank outside the excluded set.
    pub fn root(&self) -> Option<Rank> {
        self.live.old_rank(0)
    }

    /// The parent of `r` (`None` for the root and for excluded ranks).
    pub fn parent(&self, r: Rank) -> Option<Rank> {
        let i = binomial_parent(u64::from(self.live.new_rank(r)?))?;
        self.live.old_rank(i as Rank)
    }

    /// The children of `r`, biggest subtree first (none for excluded ranks).
    pub fn children(&self, r: Rank) -> Vec<Rank> {
        let Some(i) = self.live.new_rank(r) else {
            return Vec::new();
        };
        binomial_children(u64::from(i), u64::from(self.live.len()))
            .filter_map(|c| self.live.old_rank(c as Rank))
            .collect()
    }

    /// Whether `a` is a proper ancestor of `r` (both in the tree).
    pub fn is_ancestor(&self, a: Rank, r: Rank) -> bool {
        let (Some(i), Some(mut j)) = (self.live.new_rank(a), self.live.new_rank(r)) else {
            return false;
        };
        // The ancestors of index `j` are `j` with its low set bits cleared one by one.
        while j > i {
            j &= j - 1;
            if j == i {
                return true;
            }
        }
        false
    }

    /// Whether `r` has a child.
    pub fn is_inner(&self, r: Rank) -> bool {
        match self.live.new_rank(r) {
            Some(0) => self.live.len() > 1,
            Some(i) => i & 1 == 0 && i + 1 < self.live.len(),
            None => false,
        }
    }

    /// The nearest ancestor of `r` not in `dead` (`None` if every ancestor is dead).
    pub fn nearest_live_ancestor(&self, r: Rank, dead: &RankSet) -> Option<Rank> {
        let mut at = r;
        while let Some(p) = self.parent(at) {
            if !dead.contains(p) {
                return Some(p);
            }
            at = p;
        }
        None
    }

    /// Appends to `out` the live ranks below `r` whose path up to `r` (`r` excluded)
    /// is all dead: where what `r` would pass down goes when `r`'s children are dead.
    pub fn live_below(&self, r: Rank, dead: &RankSet, out: &mut Vec<Rank>) {
        for c in self.children(r) {
            if dead.contains(c) {
                self.live_below(c, dead, out);
            } else {
                out.push(c);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repair_queries_route_around_dead_ranks() {
        // Live 0..8 as indices 0..8 (nothing excluded); 2 and 6 die after the layout.
        let t = LiveTree::new(&RankSet::new(8));
        let dead = RankSet::from_ranks(8, [2, 6]);
        assert_eq!(t.nearest_live_ancestor(3, &dead), Some(0));
        assert_eq!(t.nearest_live_ancestor(7, &dead), Some(4));
        assert_eq!(t.nearest_live_ancestor(0, &dead), None);
        let mut below = Vec::new();
        t.live_below(0, &dead, &mut below);
        assert_eq!(below, [4, 3, 1]);
        below.clear();
        t.live_below(6, &dead, &mut below);
        assert_eq!(below, [7]);
    }

    #[test]
    fn index_layout_matches_parent_and_children() {
        for len in 1u64..=70 {
            for i in 0..len {
                for c in binomial_children(i, len) {
                    assert_eq!(binomial_parent(c), Some(i));
                }
                if let Some(p) = binomial_parent(i) {
                    assert!(binomial_children(p, len).any(|c| c == i));
                }
            }
        }
    }
}
