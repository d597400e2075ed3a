//! [`Plan::check`]: verifies a plan against DESIGN.md's invariants, from the spec and
//! the edges alone (it does not trust the classes the plan was built from).

use alloc::vec::Vec;
use core::fmt;
use hashbrown::HashMap;

use ft_core::Rank;

use crate::outputs::OutputSet;
use crate::plan::{Plan, Stats};
use crate::spec::Strategy;

/// A broken invariant, named with the ranks and outputs (indices) that break it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CheckError {
    /// An edge names a rank outside `0..ranks`.
    RankOutOfRange {
        /// The rank.
        rank: Rank,
    },
    /// A failed rank appears in an edge.
    FailedRank {
        /// The rank.
        rank: Rank,
    },
    /// An edge leads into the root.
    EdgeIntoRoot {
        /// The edge's parent.
        parent: Rank,
    },
    /// An edge leads from a rank to itself.
    SelfLoop {
        /// The rank.
        rank: Rank,
    },
    /// An edge carries no output.
    EmptyEdge {
        /// The edge's parent.
        parent: Rank,
        /// The edge's child.
        child: Rank,
    },
    /// An edge carries an output index the spec does not have.
    UnknownOutput {
        /// The edge's parent.
        parent: Rank,
        /// The edge's child.
        child: Rank,
        /// The output index.
        output: u32,
    },
    /// Within a tree, a rank has two parents, or an edge's parent is neither the root nor
    /// the child of an earlier edge of the tree (edges are kept parent-first).
    NotATree {
        /// The tree.
        tree: usize,
        /// The rank.
        rank: Rank,
    },
    /// A tree's recorded depth differs from the depth of its edges.
    DepthMismatch {
        /// The tree.
        tree: usize,
        /// Depth recorded in the plan.
        recorded: u32,
        /// Depth of the edges.
        actual: u32,
    },
    /// The edges of all trees together form a cycle through `rank`.
    Cycle {
        /// A rank on or behind the cycle (the smallest one left).
        rank: Rank,
    },
    /// An edge carries an output its parent never receives (PaRSEC #624).
    ParentLacksOutput {
        /// The edge's parent.
        parent: Rank,
        /// The edge's child.
        child: Rank,
        /// The output index.
        output: u32,
    },
    /// An output reaches a rank over two edges.
    DuplicateDelivery {
        /// The rank.
        rank: Rank,
        /// The output index.
        output: u32,
    },
    /// A live destination does not receive an output it needs.
    MissingOutput {
        /// The rank.
        rank: Rank,
        /// The output index.
        output: u32,
    },
    /// A rank receives an output it does not need (per-class and per-output plans).
    ExtraOutput {
        /// The rank.
        rank: Rank,
        /// The output index.
        output: u32,
    },
    /// A destination has other than one incoming edge (per-class and
    /// fetch-for-descendants plans).
    IncomingEdges {
        /// The rank.
        rank: Rank,
        /// Its incoming edges.
        count: usize,
    },
    /// The unreachable list is not exactly the failed destinations, in order.
    Unreachable {
        /// A rank listed wrongly or missing from the list.
        rank: Rank,
    },
    /// The plan's statistics do not match its edges.
    StatsMismatch {
        /// Figures recorded in the plan.
        recorded: Stats,
        /// Figures of the edges.
        actual: Stats,
    },
}

impl fmt::Display for CheckError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckError::RankOutOfRange { rank } => {
                write!(f, "edge names rank {rank}, out of range")
            }
            CheckError::FailedRank { rank } => write!(f, "failed rank {rank} appears in a tree"),
            CheckError::EdgeIntoRoot { parent } => write!(f, "edge {parent} -> root"),
            CheckError::SelfLoop { rank } => write!(f, "edge {rank} -> {rank}"),
            CheckError::EmptyEdge { parent, child } => {
                write!(f, "edge {parent} -> {child} carries no output")
            }
            CheckError::UnknownOutput {
                parent,
                child,
                output,
            } => write!(
                f,
                "edge {parent} -> {child} carries unknown output #{output}"
            ),
            CheckError::NotATree { tree, rank } => {
                write!(f, "tree {tree} is not a parent-first tree at rank {rank}")
            }
            CheckError::DepthMismatch {
                tree,
                recorded,
                actual,
            } => write!(
                f,
                "tree {tree} records depth {recorded}, its edges give {actual}"
            ),
            CheckError::Cycle { rank } => write!(f, "edges form a cycle through rank {rank}"),
            CheckError::ParentLacksOutput {
                parent,
                child,
                output,
            } => write!(
                f,
                "edge {parent} -> {child} carries output #{output}, which {parent} never receives"
            ),
            CheckError::DuplicateDelivery { rank, output } => {
                write!(f, "rank {rank} receives output #{output} twice")
            }
            CheckError::MissingOutput { rank, output } => {
                write!(
                    f,
                    "rank {rank} needs output #{output} but does not receive it"
                )
            }
            CheckError::ExtraOutput { rank, output } => {
                write!(
                    f,
                    "rank {rank} receives output #{output}, which it does not need"
                )
            }
            CheckError::IncomingEdges { rank, count } => {
                write!(
                    f,
                    "destination {rank} has {count} incoming edges, expected 1"
                )
            }
            CheckError::Unreachable { rank } => {
                write!(f, "unreachable list is wrong about rank {rank}")
            }
            CheckError::StatsMismatch { recorded, actual } => {
                write!(f, "stats {recorded:?} do not match the edges ({actual:?})")
            }
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for CheckError {}

#[derive(Default)]
struct Seen {
    received: OutputSet,
    incoming: usize,
}

impl Plan {
    /// Verifies the plan's invariants (see the [module docs](crate::plan)); the first
    /// violation found is returned. Costs time and memory linear in the spec and the
    /// edges (hash maps keyed by rank).
    pub fn check(&self) -> Result<(), CheckError> {
        let spec = self.spec();
        let (n, root, failed) = (spec.ranks, spec.root, &spec.failed);
        let outputs = spec.outputs.len();

        let mut needs: HashMap<Rank, OutputSet> = HashMap::new();
        for (j, o) in spec.outputs.iter().enumerate() {
            for &r in &o.dests {
                needs.entry(r).or_default().insert(j as u32);
            }
        }

        let mut seen: HashMap<Rank, Seen> = HashMap::new();
        let mut links: Vec<(Rank, Rank)> = Vec::with_capacity(self.stats().activations);
        let mut actual = Stats::default();
        let mut depth_in_tree: HashMap<Rank, u32> = HashMap::new();
        for (t, tree) in self.trees().iter().enumerate() {
            depth_in_tree.clear();
            let mut deepest = 0;
            for e in self.tree_edges(t) {
                let (parent, child) = (e.parent, e.child);
                for rank in [parent, child] {
                    if rank >= n {
                        return Err(CheckError::RankOutOfRange { rank });
                    }
                    if failed.contains(rank) {
                        return Err(CheckError::FailedRank { rank });
                    }
                }
                if child == root {
                    return Err(CheckError::EdgeIntoRoot { parent });
                }
                if parent == child {
                    return Err(CheckError::SelfLoop { rank: parent });
                }
                if e.outputs.is_empty() {
                    return Err(CheckError::EmptyEdge { parent, child });
                }
                if let Some(output) = e.outputs.iter().find(|&j| j as usize >= outputs) {
                    return Err(CheckError::UnknownOutput {
                        parent,
                        child,
                        output,
                    });
                }
                let parent_depth = if parent == root {
                    0
                } else {
                    *depth_in_tree.get(&parent).ok_or(CheckError::NotATree {
                        tree: t,
                        rank: parent,
                    })?
                };
                if depth_in_tree.insert(child, parent_depth + 1).is_some() {
                    return Err(CheckError::NotATree {
                        tree: t,
                        rank: child,
                    });
                }
                deepest = deepest.max(parent_depth + 1);

                let s = seen.entry(child).or_default();
                if let Some(output) = s.received.first_common(e.outputs) {
                    return Err(CheckError::DuplicateDelivery {
                        rank: child,
                        output,
                    });
                }
                s.received.union_with(e.outputs);
                s.incoming += 1;
                links.push((parent, child));
                actual.activations += 1;
                actual.bytes = actual.bytes.saturating_add(self.bytes_of(e.outputs));
            }
            if deepest != tree.depth {
                return Err(CheckError::DepthMismatch {
                    tree: t,
                    recorded: tree.depth,
                    actual: deepest,
                });
            }
            if !tree.is_empty() {
                actual.trees += 1;
                actual.max_depth = actual.max_depth.max(deepest);
            }
        }

        check_acyclic(&mut links)?;

        let empty = OutputSet::new();
        for e in self.edges() {
            if e.parent == root {
                continue;
            }
            let held = seen.get(&e.parent).map_or(&empty, |s| &s.received);
            if let Some(output) = e.outputs.first_not_in(held) {
                return Err(CheckError::ParentLacksOutput {
                    parent: e.parent,
                    child: e.child,
                    output,
                });
            }
        }

        let mut dests: Vec<(&Rank, &OutputSet)> = needs.iter().collect();
        dests.sort_unstable_by_key(|d| *d.0);
        let mut expected_unreachable = Vec::new();
        let one_edge = matches!(
            spec.strategy,
            Strategy::PerClass | Strategy::FetchForDescendants
        );
        for &(&rank, need) in &dests {
            if failed.contains(rank) {
                expected_unreachable.push(rank);
                continue;
            }
            let got = seen.get(&rank);
            let held = got.map_or(&empty, |s| &s.received);
            if let Some(output) = need.first_not_in(held) {
                return Err(CheckError::MissingOutput { rank, output });
            }
            let count = got.map_or(0, |s| s.incoming);
            if one_edge && count != 1 {
                return Err(CheckError::IncomingEdges { rank, count });
            }
        }
        if matches!(spec.strategy, Strategy::PerClass | Strategy::PerOutput) {
            let mut receivers: Vec<(&Rank, &Seen)> = seen.iter().collect();
            receivers.sort_unstable_by_key(|r| *r.0);
            for (&rank, s) in receivers {
                let need = needs.get(&rank).unwrap_or(&empty);
                if let Some(output) = s.received.first_not_in(need) {
                    return Err(CheckError::ExtraOutput { rank, output });
                }
            }
        }
        if let Some(k) = (0..expected_unreachable.len().max(self.unreachable().len()))
            .find(|&k| expected_unreachable.get(k) != self.unreachable().get(k))
        {
            let rank = match (expected_unreachable.get(k), self.unreachable().get(k)) {
                (Some(&a), Some(&b)) => a.min(b),
                (Some(&r), None) | (None, Some(&r)) => r,
                (None, None) => 0,
            };
            return Err(CheckError::Unreachable { rank });
        }
        if actual != self.stats() {
            return Err(CheckError::StatsMismatch {
                recorded: self.stats(),
                actual,
            });
        }
        Ok(())
    }
}

/// Kahn's algorithm over the union of all trees' edges.
fn check_acyclic(links: &mut [(Rank, Rank)]) -> Result<(), CheckError> {
    links.sort_unstable();
    let mut index: HashMap<Rank, usize> = HashMap::new();
    let mut ranks: Vec<Rank> = Vec::new();
    for &(p, c) in links.iter() {
        for r in [p, c] {
            index.entry(r).or_insert_with(|| {
                ranks.push(r);
                ranks.len() - 1
            });
        }
    }
    let mut indegree = alloc::vec![0usize; ranks.len()];
    for &(_, c) in links.iter() {
        indegree[index[&c]] += 1;
    }
    // Out-edges of a rank are contiguous in the sorted links.
    let mut first_out: HashMap<Rank, usize> = HashMap::new();
    for (k, &(p, _)) in links.iter().enumerate() {
        first_out.entry(p).or_insert(k);
    }
    let mut ready: Vec<usize> = (0..ranks.len()).filter(|&i| indegree[i] == 0).collect();
    let mut done = 0;
    while let Some(i) = ready.pop() {
        done += 1;
        let rank = ranks[i];
        if let Some(&start) = first_out.get(&rank) {
            for &(p, c) in &links[start..] {
                if p != rank {
                    break;
                }
                let ci = index[&c];
                indegree[ci] -= 1;
                if indegree[ci] == 0 {
                    ready.push(ci);
                }
            }
        }
    }
    if done == ranks.len() {
        return Ok(());
    }
    let rank = (0..ranks.len())
        .filter(|&i| indegree[i] > 0)
        .map(|i| ranks[i])
        .min()
        .unwrap_or(0);
    Err(CheckError::Cycle { rank })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{RawEdge, Shape};
    use crate::spec::{OutputSpec, PlanSpec};
    use crate::topology::Topology;
    use alloc::vec;

    fn issue_624(strategy: Strategy) -> Plan {
        Plan::build(
            PlanSpec::new(3, 0)
                .with_topology(Topology::Chain)
                .with_strategy(strategy)
                .with_output(OutputSpec::new("A", 1024, vec![1, 2]))
                .with_output(OutputSpec::new("B", 4096, vec![2])),
        )
        .unwrap()
    }

    /// Rewrites tree 0's edges (and resets the stats to match).
    fn with_edges(mut plan: Plan, edges: &[(Rank, Rank, u32)]) -> Plan {
        plan.explicit = edges
            .iter()
            .map(|&(parent, child, set)| RawEdge { parent, child, set })
            .collect();
        plan.trees.truncate(1);
        plan.trees[0].shape = Shape::Explicit(0..edges.len());
        plan.trees[0].len = edges.len();
        plan
    }

    #[test]
    fn parsec_merged_tree_is_rejected_as_issue_624() {
        // What PaRSEC builds: one merged chain 0 -> 1 -> 2 where each rank fetches only
        // what it needs; rank 2 asks rank 1 for B, which rank 1 never gets.
        let mut plan = issue_624(Strategy::FetchForDescendants);
        plan.sets = vec![OutputSet::single(0), [0, 1].into_iter().collect()];
        let plan = with_edges(plan, &[(0, 1, 0), (1, 2, 1)]);
        assert_eq!(
            plan.check(),
            Err(CheckError::ParentLacksOutput {
                parent: 1,
                child: 2,
                output: 1
            })
        );
    }

    /// `(parent, child, set index)`.
    type Link = (Rank, Rank, u32);

    #[test]
    fn each_broken_invariant_is_named() {
        let good = issue_624(Strategy::PerClass);
        assert_eq!(good.check(), Ok(()));
        // Sets: 0 = {A}, 1 = {A, B}.
        let cases: [(&[Link], CheckError); 5] = [
            (
                &[(0, 1, 0), (1, 0, 1)],
                CheckError::EdgeIntoRoot { parent: 1 },
            ),
            (
                &[(0, 1, 0), (0, 1, 1)],
                CheckError::NotATree { tree: 0, rank: 1 },
            ),
            (&[(2, 1, 0)], CheckError::NotATree { tree: 0, rank: 2 }),
            (
                &[(0, 1, 0), (0, 3, 1)],
                CheckError::RankOutOfRange { rank: 3 },
            ),
            (
                &[(0, 1, 1), (1, 2, 1)],
                CheckError::DepthMismatch {
                    tree: 0,
                    recorded: 1,
                    actual: 2,
                },
            ),
        ];
        for (edges, want) in cases {
            assert_eq!(with_edges(good.clone(), edges).check(), Err(want));
        }
        // Rank 1 gets B too: exactness of per-class plans.
        let mut plan = with_edges(good.clone(), &[(0, 1, 1), (1, 2, 1)]);
        plan.trees[0].depth = 2;
        assert_eq!(
            plan.check(),
            Err(CheckError::ExtraOutput { rank: 1, output: 1 })
        );
        // Rank 2 gets nothing.
        let mut plan = with_edges(good.clone(), &[(0, 1, 0)]);
        plan.trees[0].depth = 1;
        assert_eq!(
            plan.check(),
            Err(CheckError::MissingOutput { rank: 2, output: 0 })
        );
        // Stats that lie.
        let mut plan = good.clone();
        plan.stats.bytes += 1;
        assert!(matches!(
            plan.check(),
            Err(CheckError::StatsMismatch { .. })
        ));
        // A failed rank in a tree.
        let mut plan = good.clone();
        plan.spec.failed = ft_core::RankSet::from_ranks(3, [1]);
        assert_eq!(plan.check(), Err(CheckError::FailedRank { rank: 1 }));
    }

    #[test]
    fn cycles_across_trees_are_found() {
        // Tree 0: 0 -> 1 -> 2 carrying A; tree 1: 0 -> 2 -> 1 carrying B. Each tree is
        // fine, together they cycle between 1 and 2.
        let mut plan = issue_624(Strategy::PerOutput);
        plan.sets = vec![OutputSet::single(0), OutputSet::single(1)];
        plan.explicit = [(0, 1, 0), (1, 2, 0), (0, 2, 1), (2, 1, 1)]
            .iter()
            .map(|&(parent, child, set)| RawEdge { parent, child, set })
            .collect();
        plan.trees[0].shape = Shape::Explicit(0..2);
        plan.trees[1].shape = Shape::Explicit(2..4);
        (plan.trees[0].len, plan.trees[1].len) = (2, 2);
        (plan.trees[0].depth, plan.trees[1].depth) = (2, 2);
        assert_eq!(plan.check(), Err(CheckError::Cycle { rank: 1 }));
    }
}
