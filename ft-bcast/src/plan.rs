//! [`Plan`]: the activation trees of one broadcast, built from a [`PlanSpec`] by one of
//! the three [`Strategy`]s.
//!
//! A plan is a list of trees, all rooted at the task's root. Each tree is a list of
//! edges `(parent, child, outputs carried)` in parent-first order (a child's edge comes
//! after its parent's). Only live destinations appear; failed destinations are listed
//! in [`Plan::unreachable`].
//!
//! - [`Strategy::PerClass`]: the destinations are refined into classes needing the same
//!   outputs; one tree per class, every edge carries the class's outputs. One
//!   activation per destination, each byte sent once per rank that needs it. A class's
//!   tree is its slice of the [`Partition`]'s flat member array under the topology, so
//!   building the plan costs the refinement (`O(n + Σ|D_j|)`, one allocation for all
//!   members) plus `O(1)` per class.
//! - [`Strategy::FetchForDescendants`]: one tree over all destinations (increasing rank
//!   order); the edge into a rank carries the union of the needs of its subtree.
//! - [`Strategy::PerOutput`]: one tree per output over its destinations; each edge
//!   carries that output only.
//!
//! [`Plan::repair`] re-attaches the children of ranks that died to their nearest live
//! ancestor; repaired trees are kept as explicit edge lists.
//!
//! Invariants of every plan (verified by [`Plan::check`]): what a rank receives is the
//! union of its incoming edges' outputs; every edge carries only outputs its parent has
//! received (the root has all); every live destination receives at least what it needs;
//! no failed rank appears; the edges form no cycle; no output reaches a rank twice. For
//! per-class plans each destination has one incoming edge and receives exactly what it
//! needs.

use alloc::vec;
use alloc::vec::Vec;
use core::ops::Range;
use core::sync::atomic::{AtomicUsize, Ordering};

use ft_core::Rank;

use crate::outputs::OutputSet;
use crate::refine::Partition;
use crate::spec::{OutputSpec, PlanSpec, SpecError, Strategy};
use crate::topology::FailedRanks;
use hashbrown::HashMap;

/// Figures of a plan.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Stats {
    /// Trees with at least one edge.
    pub trees: usize,
    /// Activations sent: one per edge.
    pub activations: usize,
    /// Output bytes moved over all edges (saturating at `u64::MAX`).
    pub bytes: u64,
    /// Depth of the deepest tree (edges from the root).
    pub max_depth: u32,
}

/// One tree of a plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tree {
    /// What the tree serves: the class's outputs (per-class), the output (per-output),
    /// or every output needed by a live destination (fetch-for-descendants).
    pub outputs: OutputSet,
    /// Its depth (edges from the root to the deepest member).
    pub depth: u32,
    /// Output bytes moved over its edges.
    pub bytes: u64,
    pub(crate) len: usize,
    pub(crate) shape: Shape,
}

/// Where a tree's edges come from. Topology-shaped trees store only their members (in
/// position order) and derive each edge's parent from the topology, so a plan costs
/// about one word per activation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Shape {
    /// The topology over the members of class `class`; every edge carries set `set`.
    Class { class: usize, set: u32 },
    /// The topology over `Plan::nodes[nodes]`; every edge carries set `set`.
    Nodes { nodes: Range<usize>, set: u32 },
    /// The topology over `Plan::nodes[nodes]`; the edge into position `i` carries set
    /// `first_set + i - 1`.
    NodeSets { nodes: Range<usize>, first_set: u32 },
    /// Explicit edges `Plan::explicit[edges]`, parent-first (trees that are not
    /// topology-shaped).
    Explicit(Range<usize>),
}

impl Tree {
    /// Number of edges (= activations = members other than the root).
    pub fn len(&self) -> usize {
        self.len
    }
    /// True when the tree has no edge.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// An edge of a plan: `parent` activates `child`, which fetches `outputs` from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Edge<'a> {
    /// The sender of the activation and the data.
    pub parent: Rank,
    /// The receiver.
    pub child: Rank,
    /// Index of the edge's tree in [`Plan::trees`].
    pub tree: usize,
    /// The outputs carried (indices into the spec's outputs).
    pub outputs: &'a OutputSet,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RawEdge {
    pub(crate) parent: Rank,
    pub(crate) child: Rank,
    /// Index into `Plan::sets`.
    pub(crate) set: u32,
}

/// The activation trees of one broadcast. See the module documentation.
#[derive(Clone, Debug)]
pub struct Plan {
    pub(crate) spec: PlanSpec,
    pub(crate) classes: Partition,
    pub(crate) unreachable: Vec<Rank>,
    pub(crate) trees: Vec<Tree>,
    /// Members of `Shape::Nodes` / `Shape::NodeSets` trees.
    pub(crate) nodes: Vec<Rank>,
    /// Edges of `Shape::Explicit` trees.
    pub(crate) explicit: Vec<RawEdge>,
    /// Output sets referred to by index.
    pub(crate) sets: Vec<OutputSet>,
    pub(crate) stats: Stats,
    /// This plan's identity ([`Plan::id`]): clones share it, a plan built or repaired
    /// gets a new one.
    pub(crate) id: usize,
}

/// The id of the next plan built ([`Plan::id`]; 0 is never one).
static NEXT_PLAN_ID: AtomicUsize = AtomicUsize::new(1);

fn next_plan_id() -> usize {
    NEXT_PLAN_ID.fetch_add(1, Ordering::Relaxed)
}

/// Iterator over the edges of one tree, parent-first.
#[derive(Clone, Debug)]
pub struct TreeEdges<'a> {
    plan: &'a Plan,
    tree: usize,
    next: usize,
}

impl<'a> Iterator for TreeEdges<'a> {
    type Item = Edge<'a>;
    fn next(&mut self) -> Option<Edge<'a>> {
        let plan = self.plan;
        let raw = plan.raw_edge(self.tree, self.next)?;
        self.next += 1;
        Some(Edge {
            parent: raw.parent,
            child: raw.child,
            tree: self.tree,
            outputs: &plan.sets[raw.set as usize],
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self
            .plan
            .trees
            .get(self.tree)
            .map_or(0, |t| t.len.saturating_sub(self.next));
        (left, Some(left))
    }
}

/// The bytes of output sets, summed a byte of bits at a time: `chunks[c][b]` is the size
/// of the outputs `8c + i` for the bits `i` of `b` (saturating). The tables cover the
/// outputs an [`OutputSet`] holds inline; members beyond are summed one by one.
struct SetBytes<'a> {
    outputs: &'a [OutputSpec],
    chunks: Vec<[u64; 256]>,
}

impl<'a> SetBytes<'a> {
    fn new(plan: &'a Plan) -> Self {
        let outputs = &plan.spec.outputs[..];
        let covered = outputs.len().min(OutputSet::INLINE_CAPACITY as usize);
        let chunks = (0..covered.div_ceil(8))
            .map(|c| {
                let mut table = [0u64; 256];
                for b in 1..256usize {
                    // Size of the lowest bit's output plus the rest, already tabled.
                    let low = b.trailing_zeros() as usize;
                    let size = outputs.get(8 * c + low).map_or(0, |o| o.bytes);
                    table[b] = table[b & (b - 1)].saturating_add(size);
                }
                table
            })
            .collect();
        SetBytes { outputs, chunks }
    }

    fn of(&self, set: &OutputSet) -> u64 {
        let mut total = 0u64;
        for (w, &word) in set.words().iter().enumerate() {
            // Visit only the word's non-zero bytes.
            let mut rest = word;
            while rest != 0 {
                let k = (rest.trailing_zeros() / 8) as usize;
                let byte = (rest >> (8 * k)) as u8;
                rest &= !(0xff << (8 * k));
                total = total.saturating_add(match self.chunks.get(8 * w + k) {
                    Some(table) => table[byte as usize],
                    None => bytes_sum(
                        self.outputs,
                        (0..8)
                            .filter(|i| byte >> i & 1 == 1)
                            .map(|i| 64 * w + 8 * k + i),
                    ),
                });
            }
        }
        total
    }
}

/// The bytes of outputs `members` (indices into `outputs`; others count 0), saturating.
fn bytes_sum(outputs: &[OutputSpec], members: impl Iterator<Item = usize>) -> u64 {
    members
        .filter_map(|j| outputs.get(j))
        .fold(0u64, |acc, o| acc.saturating_add(o.bytes))
}

/// Every member of `classes` with its class index, in increasing rank order (ranks are
/// below `ranks`). When the destinations are a fair share of the ranks, a rank-indexed
/// array of class indices is filled and read in order (`O(ranks)`); otherwise the pairs
/// are sorted.
fn destinations_in_rank_order(classes: &Partition, ranks: u32) -> Vec<(Rank, u32)> {
    let count = classes.destinations();
    if (ranks as usize) / 4 > count {
        let mut order: Vec<(Rank, u32)> = Vec::with_capacity(count);
        for (k, class) in classes.iter().enumerate() {
            order.extend(class.members.iter().map(|&r| (r, k as u32)));
        }
        order.sort_unstable();
        return order;
    }
    const NONE: u32 = u32::MAX;
    let mut class_at: Vec<u32> = vec![NONE; ranks as usize];
    for (k, class) in classes.iter().enumerate() {
        for &r in class.members {
            class_at[r as usize] = k as u32;
        }
    }
    let mut order: Vec<(Rank, u32)> = Vec::with_capacity(count);
    order.extend(
        class_at
            .iter()
            .enumerate()
            .filter(|(_, &k)| k != NONE)
            .map(|(r, &k)| (r as Rank, k)),
    );
    order
}

/// Takes the ranks `gone` names out of `classes` (a class left empty disappears) and adds
/// them to `unreachable`, which stays sorted.
fn drop_unreachable(
    classes: &mut Partition,
    unreachable: &mut Vec<Rank>,
    mut gone: impl FnMut(Rank) -> bool,
) {
    classes.retain(|r| {
        let g = gone(r);
        if g {
            unreachable.push(r);
        }
        !g
    });
    unreachable.sort_unstable();
}

impl Plan {
    /// Validates `spec` and builds its plan with `spec.strategy`.
    pub fn build(spec: PlanSpec) -> Result<Plan, SpecError> {
        let mut partition = spec.partition()?;
        // Failed destinations leave their classes; a class left empty disappears.
        let mut unreachable = Vec::new();
        if !spec.failed.is_empty() {
            drop_unreachable(&mut partition, &mut unreachable, |r| {
                spec.failed.contains(r)
            });
        }
        let mut plan = Plan {
            spec,
            classes: partition,
            unreachable,
            trees: Vec::new(),
            nodes: Vec::new(),
            explicit: Vec::new(),
            sets: Vec::new(),
            stats: Stats::default(),
            id: next_plan_id(),
        };
        match plan.spec.strategy {
            Strategy::PerClass => plan.build_per_class(),
            Strategy::FetchForDescendants => plan.build_fetch_for_descendants(),
            Strategy::PerOutput => plan.build_per_output(),
        }
        plan.stats = plan.compute_stats();
        Ok(plan)
    }

    /// This plan's identity among the plans of this process: plans are immutable, so
    /// two with the same id (one a clone of the other) are the same plan, and a
    /// broadcaster that starts several broadcasts from it reuses what it derived from
    /// it the first time (see `Broadcaster::start_broadcast`). Ids are not reused
    /// before `usize::MAX` plans were built.
    pub fn id(&self) -> usize {
        self.id
    }

    /// The spec the plan was built from.
    pub fn spec(&self) -> &PlanSpec {
        &self.spec
    }
    /// Gives the spec back.
    pub fn into_spec(self) -> PlanSpec {
        self.spec
    }
    /// The classes of live destinations needing the same outputs, ordered by smallest
    /// member (whatever the strategy).
    pub fn classes(&self) -> &Partition {
        &self.classes
    }
    /// Failed destinations, left out of every tree, in increasing order.
    pub fn unreachable(&self) -> &[Rank] {
        &self.unreachable
    }
    /// The trees, in build order.
    pub fn trees(&self) -> &[Tree] {
        &self.trees
    }
    /// The plan's figures.
    pub fn stats(&self) -> Stats {
        self.stats
    }
    /// Every edge, tree by tree, parent-first within a tree.
    pub fn edges(&self) -> impl Iterator<Item = Edge<'_>> + '_ {
        (0..self.trees.len()).flat_map(move |t| self.tree_edges(t))
    }
    /// The edges of tree `tree`, parent-first (none if there is no such tree).
    pub fn tree_edges(&self, tree: usize) -> TreeEdges<'_> {
        TreeEdges {
            plan: self,
            tree,
            next: 0,
        }
    }
    /// The bytes of the outputs in `set`, saturating.
    pub fn bytes_of(&self, set: &OutputSet) -> u64 {
        bytes_sum(&self.spec.outputs, set.iter().map(|j| j as usize))
    }

    fn push_tree(&mut self, outputs: OutputSet, len: usize, shape: Shape) {
        let bytes = match &shape {
            Shape::Class { set, .. } | Shape::Nodes { set, .. } => self
                .bytes_of(&self.sets[*set as usize])
                .saturating_mul(len as u64),
            Shape::NodeSets { first_set, .. } => {
                // One set per edge: sum them a byte of bits at a time.
                let first = *first_set as usize;
                let sizes = SetBytes::new(self);
                self.sets[first..first + len]
                    .iter()
                    .fold(0u64, |a, s| a.saturating_add(sizes.of(s)))
            }
            Shape::Explicit(edges) => self.explicit[edges.clone()].iter().fold(0u64, |a, e| {
                a.saturating_add(self.bytes_of(&self.sets[e.set as usize]))
            }),
        };
        self.trees.push(Tree {
            outputs,
            depth: self.spec.topology.depth(len),
            bytes,
            len,
            shape,
        });
    }

    fn build_per_class(&mut self) {
        self.sets.reserve(self.classes.len());
        self.trees.reserve(self.classes.len());
        for class in 0..self.classes.len() {
            let Some(outputs) = self.classes.outputs_of(class).cloned() else {
                break;
            };
            let set = self.sets.len() as u32;
            self.sets.push(outputs.clone());
            let len = self.classes.members_of(class).len();
            self.push_tree(outputs, len, Shape::Class { class, set });
        }
    }

    fn build_per_output(&mut self) {
        let entries: usize = self.spec.outputs.iter().map(|o| o.dests.len()).sum();
        self.nodes.reserve(entries);
        for j in 0..self.spec.outputs.len() {
            let start = self.nodes.len();
            let failed = &self.spec.failed;
            let dests = &self.spec.outputs[j].dests;
            if failed.is_empty() {
                self.nodes.extend_from_slice(dests);
            } else {
                self.nodes
                    .extend(dests.iter().copied().filter(|&r| !failed.contains(r)));
            }
            if self.nodes.len() == start {
                continue;
            }
            self.nodes[start..].sort_unstable();
            let set = self.sets.len() as u32;
            self.sets.push(OutputSet::single(j as u32));
            let nodes = start..self.nodes.len();
            let len = nodes.len();
            self.push_tree(
                OutputSet::single(j as u32),
                len,
                Shape::Nodes { nodes, set },
            );
        }
    }

    fn build_fetch_for_descendants(&mut self) {
        let order = destinations_in_rank_order(&self.classes, self.spec.ranks);
        if order.is_empty() {
            return;
        }
        let topology = self.spec.topology;
        // Subtree needs, bottom-up: positions only have parents below them. Position 0
        // is the root.
        let mut fetch: Vec<OutputSet> = Vec::with_capacity(order.len() + 1);
        fetch.push(OutputSet::new());
        fetch.extend(order.iter().map(|&(_, k)| {
            self.classes
                .outputs_of(k as usize)
                .cloned()
                .unwrap_or_default()
        }));
        for i in (1..fetch.len()).rev() {
            let p = topology.parent(i).unwrap_or(0);
            let (low, high) = fetch.split_at_mut(i);
            low[p].union_with(&high[0]);
        }
        let everything = core::mem::take(&mut fetch[0]);
        // The edge into position i carries set `first_set + i - 1`; position 0's (now
        // empty) entry stays as an unused set, so the sets are moved, not copied.
        let first_set = self.sets.len() as u32 + 1;
        if self.sets.is_empty() {
            self.sets = fetch;
        } else {
            self.sets.append(&mut fetch);
        }
        let start = self.nodes.len();
        self.nodes.extend(order.iter().map(|&(r, _)| r));
        let nodes = start..self.nodes.len();
        let len = nodes.len();
        self.push_tree(everything, len, Shape::NodeSets { nodes, first_set });
    }

    /// The plan after `dead` ranks died mid-broadcast: each dead rank leaves its trees,
    /// and each of its live children is re-attached to its nearest live ancestor in the
    /// same tree (the root in the worst case), fetching the same outputs as before. Every
    /// ancestor holds what its descendants fetch (exactly the same outputs in per-class
    /// and per-output trees, a superset in fetch-for-descendants trees), so the repaired
    /// plan meets the same invariants; dead destinations join [`Plan::unreachable`] and
    /// the spec's failed set.
    ///
    /// Fails with [`SpecError::RootFailed`] when the root is among `dead`: nobody else
    /// holds every output.
    pub fn repair(&self, dead: &impl FailedRanks) -> Result<Plan, SpecError> {
        let root = self.spec.root;
        if dead.is_failed(root) {
            return Err(SpecError::RootFailed { root });
        }
        let mut spec = self.spec.clone();
        let mut classes = self.classes.clone();
        let mut unreachable = self.unreachable.clone();
        drop_unreachable(&mut classes, &mut unreachable, |r| {
            let gone = dead.is_failed(r);
            if gone {
                spec.failed.insert(r);
            }
            gone
        });
        let mut plan = Plan {
            spec,
            classes,
            unreachable,
            trees: Vec::with_capacity(self.trees.len()),
            nodes: Vec::new(),
            explicit: Vec::new(),
            sets: self.sets.clone(),
            stats: Stats::default(),
            id: next_plan_id(),
        };
        // Per tree: the nearest live ancestor-or-self of every member, and the depth of
        // every live member, both filled parent-first.
        let sizes = SetBytes::new(self);
        let mut live_anchor: HashMap<Rank, Rank> = HashMap::new();
        let mut depth: HashMap<Rank, u32> = HashMap::new();
        for (t, tree) in self.trees.iter().enumerate() {
            live_anchor.clear();
            depth.clear();
            let start = plan.explicit.len();
            let mut deepest = 0;
            let mut bytes = 0u64;
            for e in (0..tree.len).filter_map(|k| self.raw_edge(t, k)) {
                let anchor = if e.parent == root {
                    root
                } else {
                    live_anchor.get(&e.parent).copied().unwrap_or(root)
                };
                if dead.is_failed(e.child) {
                    live_anchor.insert(e.child, anchor);
                    continue;
                }
                live_anchor.insert(e.child, e.child);
                let d = depth.get(&anchor).copied().unwrap_or(0) + 1;
                depth.insert(e.child, d);
                deepest = deepest.max(d);
                bytes = bytes.saturating_add(sizes.of(&self.sets[e.set as usize]));
                plan.explicit.push(RawEdge {
                    parent: anchor,
                    ..e
                });
            }
            let edges = start..plan.explicit.len();
            plan.trees.push(Tree {
                outputs: tree.outputs.clone(),
                depth: deepest,
                bytes,
                len: edges.len(),
                shape: Shape::Explicit(edges),
            });
        }
        plan.stats = plan.compute_stats();
        Ok(plan)
    }

    /// Edge `k` of tree `tree` (`None` past the end).
    fn raw_edge(&self, tree: usize, k: usize) -> Option<RawEdge> {
        let tree = self.trees.get(tree)?;
        if k >= tree.len {
            return None;
        }
        let (members, set): (&[Rank], u32) = match &tree.shape {
            Shape::Explicit(edges) => return Some(self.explicit[edges.start + k]),
            Shape::Class { class, set } => (self.classes.members_of(*class), *set),
            Shape::Nodes { nodes, set } => (&self.nodes[nodes.clone()], *set),
            Shape::NodeSets { nodes, first_set } => {
                (&self.nodes[nodes.clone()], first_set + k as u32)
            }
        };
        let p = self.spec.topology.parent(k + 1).unwrap_or(0);
        Some(RawEdge {
            parent: if p == 0 {
                self.spec.root
            } else {
                members[p - 1]
            },
            child: members[k],
            set,
        })
    }

    fn compute_stats(&self) -> Stats {
        self.trees
            .iter()
            .filter(|t| !t.is_empty())
            .fold(Stats::default(), |s, t| Stats {
                trees: s.trees + 1,
                activations: s.activations + t.len,
                bytes: s.bytes.saturating_add(t.bytes),
                max_depth: s.max_depth.max(t.depth),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::refine::refine;

    #[test]
    fn destinations_come_in_rank_order_with_their_class_either_way() {
        // Classes {1, 4, 9} (A), {2, 7} (A, B), {5} (B).
        let classes = refine(10, &[vec![9, 1, 2, 4, 7], vec![7, 5, 2]]).unwrap();
        let expected = [(1, 0), (2, 1), (4, 0), (5, 2), (7, 1), (9, 0)];
        // 10 ranks: the rank-indexed array; 10^6 ranks: the sort.
        assert_eq!(destinations_in_rank_order(&classes, 10), expected);
        assert_eq!(destinations_in_rank_order(&classes, 1_000_000), expected);
        assert!(destinations_in_rank_order(&Partition::default(), 10).is_empty());
    }

    #[test]
    fn set_bytes_match_member_by_member_sums() {
        // 200 outputs (beyond the tables' 128), sizes up to near u64::MAX (saturation).
        let mut spec = PlanSpec::new(4, 0);
        for j in 0..200u64 {
            let bytes = if j % 50 == 49 {
                u64::MAX / 3
            } else {
                j * 1000 + 1
            };
            spec.outputs.push(OutputSpec::new(
                alloc::format!("o{j}"),
                bytes,
                alloc::vec![1],
            ));
        }
        let plan = Plan::build(spec).unwrap();
        let sizes = SetBytes::new(&plan);
        let mut rng = ft_core::rng::SplitMix::new(5);
        for _ in 0..500 {
            let set: OutputSet = (0..200).filter(|_| rng.chance(1, 3)).collect();
            assert_eq!(sizes.of(&set), plan.bytes_of(&set), "{set:?}");
        }
        assert_eq!(sizes.of(&OutputSet::new()), 0);
    }
}
