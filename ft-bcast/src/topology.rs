//! Tree shapes over an ordered list of members under a root.
//!
//! A tree is laid out over positions `0..=len`: position 0 is the root, position `i ≥ 1`
//! is the `i`-th member of the ordered list. Every shape here gives each position `i ≥ 1`
//! a parent position strictly below `i`, so walking positions in increasing order visits
//! every parent before its children (the plans rely on this).
//!
//! - [`Topology::Star`]: every member's parent is the root (depth 1).
//! - [`Topology::Chain`]: position `i`'s parent is `i - 1` (depth `len`).
//! - [`Topology::Binomial`]: position `i`'s parent is `i` with its lowest set bit cleared,
//!   as in MPI's binomial broadcast (the root sends to 1, 2, 4, ...); the depth of `i` is
//!   its popcount, so the tree's depth is at most `⌈log2(len + 1)⌉`.
//! - [`Topology::Kary`]`(K)`: position `i`'s parent is `(i - 1) / K`; `K = 1` is a chain.
//!
//! Failed ranks never appear in a tree: [`tree_edges`] leaves them out (see
//! [`FailedRanks`], implemented for [`RankSet`] and [`FailureView`]).

use alloc::vec::Vec;
use core::fmt;
use core::num::NonZeroU32;
use core::str::FromStr;

use ft_core::tree::{binomial_children, binomial_parent};
use ft_core::{FailureView, Rank, RankSet};

/// The shape of an activation tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Topology {
    /// The root sends to every member.
    Star,
    /// Each member forwards to the next.
    Chain,
    /// Binomial tree (MPI's broadcast shape).
    Binomial,
    /// Complete `K`-ary tree in breadth-first order.
    Kary(NonZeroU32),
}

impl Topology {
    /// The parent position of position `i` (`None` for the root, position 0).
    pub fn parent(self, i: usize) -> Option<usize> {
        if i == 0 {
            return None;
        }
        Some(match self {
            Topology::Star => 0,
            Topology::Chain => i - 1,
            Topology::Binomial => binomial_parent(i as u64).unwrap_or(0) as usize,
            Topology::Kary(k) => (i - 1) / k.get() as usize,
        })
    }

    /// The child positions of position `i` in a tree of `len` members, in increasing
    /// order.
    pub fn children(self, i: usize, len: usize) -> impl Iterator<Item = usize> {
        let range = match self {
            Topology::Star if i == 0 => 1..len + 1,
            Topology::Star | Topology::Binomial => 0..0,
            Topology::Chain => i + 1..(i + 2).min(len + 1),
            Topology::Kary(k) => {
                let k = k.get() as usize;
                let first = i.saturating_mul(k).saturating_add(1);
                let end = first.saturating_add(k).min(len.saturating_add(1));
                first..end.max(first)
            }
        };
        // Binomial: the layout ft-core's agreement uses too, over positions `0..=len`.
        let binomial = (self == Topology::Binomial).then(|| {
            binomial_children(i as u64, (len as u64).saturating_add(1))
                .rev()
                .map(|c| c as usize)
        });
        range.chain(binomial.into_iter().flatten())
    }

    /// The depth of position `i` (edges from the root).
    pub fn depth_of(self, i: usize) -> u32 {
        match self {
            Topology::Star => u32::from(i > 0),
            Topology::Chain => u32::try_from(i).unwrap_or(u32::MAX),
            Topology::Binomial => i.count_ones(),
            Topology::Kary(k) if k.get() == 1 => u32::try_from(i).unwrap_or(u32::MAX),
            Topology::Kary(k) => {
                let k = k.get() as usize;
                let (mut i, mut d) = (i, 0);
                while i > 0 {
                    i = (i - 1) / k;
                    d += 1;
                }
                d
            }
        }
    }

    /// The depth of a tree of `len` members (0 for no member).
    pub fn depth(self, len: usize) -> u32 {
        match self {
            // The deepest binomial position up to len: len itself, or the all-ones number
            // just below len's highest bit.
            Topology::Binomial if len > 0 => {
                let below = usize::BITS - len.leading_zeros() - 1;
                len.count_ones().max(below)
            }
            // For the other shapes depth never decreases with the position.
            _ => self.depth_of(len),
        }
    }
}

impl fmt::Display for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Topology::Star => f.write_str("star"),
            Topology::Chain => f.write_str("chain"),
            Topology::Binomial => f.write_str("binomial"),
            Topology::Kary(k) => write!(f, "kary:{k}"),
        }
    }
}

/// A topology name that is not `star`, `chain`, `binomial` or `kary:K` with `K ≥ 1`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseTopologyError;

impl fmt::Display for ParseTopologyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("topology must be one of star, chain, binomial, kary:K (K >= 1)")
    }
}

#[cfg(feature = "std")]
impl std::error::Error for ParseTopologyError {}

impl FromStr for Topology {
    type Err = ParseTopologyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "star" => Ok(Topology::Star),
            "chain" => Ok(Topology::Chain),
            "binomial" => Ok(Topology::Binomial),
            _ => {
                let k = s.strip_prefix("kary:").ok_or(ParseTopologyError)?;
                let k: u32 = k.parse().map_err(|_| ParseTopologyError)?;
                NonZeroU32::new(k)
                    .map(Topology::Kary)
                    .ok_or(ParseTopologyError)
            }
        }
    }
}

/// Something that knows which ranks have failed.
pub trait FailedRanks {
    /// Whether `rank` must be treated as dead.
    fn is_failed(&self, rank: Rank) -> bool;
}

impl FailedRanks for RankSet {
    fn is_failed(&self, rank: Rank) -> bool {
        self.contains(rank)
    }
}

/// A rank this view knows to be failed, validated or not (`L_i ∪ pending`).
impl FailedRanks for FailureView {
    fn is_failed(&self, rank: Rank) -> bool {
        self.is_known_failed(rank)
    }
}

/// No rank has failed.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoFailures;

impl FailedRanks for NoFailures {
    fn is_failed(&self, _rank: Rank) -> bool {
        false
    }
}

/// The edges `(parent, child)` of a `topology` tree under `root` over `members` in the
/// given order, leaving out failed members and the root itself. Edges come parent-first.
pub fn tree_edges(
    topology: Topology,
    root: Rank,
    members: &[Rank],
    failed: &impl FailedRanks,
) -> Vec<(Rank, Rank)> {
    let mut nodes: Vec<Rank> = Vec::with_capacity(members.len() + 1);
    nodes.push(root);
    nodes.extend(
        members
            .iter()
            .copied()
            .filter(|&r| r != root && !failed.is_failed(r)),
    );
    (1..nodes.len())
        .map(|i| {
            let parent = topology.parent(i).unwrap_or(0);
            (nodes[parent], nodes[i])
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;
    use alloc::vec;

    const SHAPES: [Topology; 5] = [
        Topology::Star,
        Topology::Chain,
        Topology::Binomial,
        Topology::Kary(NonZeroU32::MIN),
        Topology::Kary(match NonZeroU32::new(3) {
            Some(k) => k,
            None => NonZeroU32::MIN,
        }),
    ];

    #[test]
    fn parents_precede_children_and_children_invert_parent() {
        for t in SHAPES {
            for len in 0..70 {
                let mut deepest = 0;
                for i in 1..=len {
                    let p = t.parent(i).unwrap();
                    assert!(p < i, "{t}: parent of {i} is {p}");
                    assert!(t.children(p, len).any(|c| c == i), "{t}: {p} -> {i}");
                    assert_eq!(t.depth_of(i), t.depth_of(p) + 1);
                    deepest = deepest.max(t.depth_of(i));
                }
                for i in 0..=len {
                    for c in t.children(i, len) {
                        assert_eq!(t.parent(c), Some(i), "{t} len {len}");
                    }
                }
                assert_eq!(t.depth(len), deepest, "{t} len {len}");
            }
        }
    }

    #[test]
    fn binomial_depth_is_logarithmic() {
        for len in 1..5000usize {
            let bound = (len + 1).next_power_of_two().trailing_zeros();
            assert!(Topology::Binomial.depth(len) <= bound);
        }
    }

    #[test]
    fn names_round_trip_and_bad_names_are_rejected() {
        for t in SHAPES {
            assert_eq!(t.to_string().parse::<Topology>(), Ok(t));
        }
        for bad in [
            "kary:0",
            "kary:",
            "kary:-1",
            "ring",
            "Star",
            "kary:99999999999",
        ] {
            assert_eq!(bad.parse::<Topology>(), Err(ParseTopologyError), "{bad}");
        }
    }

    #[test]
    fn failed_ranks_and_the_root_never_appear() {
        let failed = RankSet::from_ranks(8, [3, 5]);
        let edges = tree_edges(Topology::Chain, 2, &[1, 2, 3, 4, 5, 6], &failed);
        assert_eq!(edges, vec![(2, 1), (1, 4), (4, 6)]);
        let mut view = FailureView::new(8, 0);
        view.on_rank_failed(4).unwrap();
        let edges = tree_edges(Topology::Binomial, 0, &[1, 4, 6, 7], &view);
        assert_eq!(edges, vec![(0, 1), (0, 6), (6, 7)]);
    }
}
