//! [`RankMap`]: where a group's ranks run on the transport.
//!
//! Invariants: a map names each transport rank at most once; the way from a transport
//! rank back to the group's rank is a binary search over the same entries sorted by
//! transport rank, so a rebuilt group (whose replacements run on spares' transport
//! ranks, out of order) costs `O(log n)` per frame as a shrunk one does.

use ft_core::Rank;

/// Where a group's ranks run: see the [module docs](self).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RankMap {
    /// Group rank `r` runs on transport rank `r` (the group a rank started in).
    Identity,
    /// Group rank `r` runs on transport rank `ranks[r]`.
    Table {
        /// The transport rank of each group rank.
        ranks: Vec<Rank>,
        /// `(transport rank, group rank)` for each entry, by transport rank.
        back: Vec<(Rank, Rank)>,
    },
}

impl RankMap {
    /// Group rank `r` on transport rank `ranks[r]`; `None` if a transport rank comes
    /// twice.
    pub fn of(ranks: Vec<Rank>) -> Option<RankMap> {
        let mut back: Vec<(Rank, Rank)> = ranks
            .iter()
            .enumerate()
            .map(|(r, &t)| (t, r as Rank))
            .collect();
        back.sort_unstable();
        if back.windows(2).any(|w| w[0].0 == w[1].0) {
            return None;
        }
        Some(RankMap::Table { ranks, back })
    }

    /// The transport rank of group rank `rank` (below the group's size).
    pub fn on_transport(&self, rank: Rank) -> Rank {
        match self {
            RankMap::Identity => rank,
            RankMap::Table { ranks, .. } => ranks[rank as usize],
        }
    }

    /// The group rank that runs on transport rank `rank`, if one does.
    pub fn rank_of(&self, rank: Rank) -> Option<Rank> {
        match self {
            RankMap::Identity => Some(rank),
            RankMap::Table { back, .. } => back
                .binary_search_by_key(&rank, |&(t, _)| t)
                .ok()
                .map(|i| back[i].1),
        }
    }

    /// The transport ranks of the group's `n` ranks, in group order.
    pub fn transport_ranks(&self, n: u32) -> Vec<Rank> {
        (0..n).map(|r| self.on_transport(r)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rebuilt_map_is_read_both_ways() {
        let map = RankMap::of(vec![0, 7, 2, 5]).unwrap();
        assert_eq!(map.on_transport(1), 7);
        assert_eq!(map.rank_of(7), Some(1));
        assert_eq!(map.rank_of(5), Some(3));
        assert_eq!(map.rank_of(1), None);
        assert_eq!(map.transport_ranks(4), [0, 7, 2, 5]);
        assert_eq!(RankMap::of(vec![1, 1]), None);
        assert_eq!(RankMap::Identity.rank_of(9), Some(9));
    }
}
