//! A broadcast's state at one rank: its place in each tree ([`TreeState`]: parent,
//! ancestors, what it needs and fetches, its subtree), the outputs' bytes as they
//! arrive ([`Buffer`]), requests waiting for data ([`Waiting`]), all of it per task
//! ([`Task`]), and the frames waiting to go out ([`Outgoing`]).
//!
//! Invariants: a subtree is complete when it holds as many entries as its activation
//! announced, parent-first, each fetching within its parent's fetch set
//! ([`validate_entries`]); a buffer never holds more than its output's announced size,
//! and only what arrived.

use alloc::collections::BTreeMap;
use alloc::vec::Vec;
use hashbrown::{HashMap, HashSet};

use ft_core::{FrameError, Rank, RankSet};

use crate::outputs::OutputSet;

/// A descendant in a rank's subtree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Entry {
    pub(super) child: Rank,
    pub(super) parent: Rank,
    pub(super) needs: OutputSet,
    pub(super) fetch: OutputSet,
}

/// This rank's place in one tree of one broadcast.
#[derive(Debug)]
pub(super) struct TreeState {
    /// Where this rank fetches from (itself at the root).
    pub(super) parent: Rank,
    /// Root first; the last is the original parent.
    pub(super) ancestors: Vec<Rank>,
    pub(super) needs: OutputSet,
    pub(super) fetch: OutputSet,
    /// Descendants, parent-first, as the activation announced them (dead ones
    /// included: their children's effective parent is their nearest live ancestor).
    pub(super) entries: Vec<Entry>,
    /// Position of each descendant in `entries`.
    pub(super) index: HashMap<Rank, usize>,
    /// Live descendants whose nearest live ancestor is this rank, by entry position.
    pub(super) direct: Vec<usize>,
    /// Entries announced by the activation (the subtree is complete when all are here).
    pub(super) expected: usize,
    /// The sender of the activation whose subtree `entries` holds.
    pub(super) source: Rank,
    /// Direct children already activated.
    pub(super) activated: HashSet<Rank>,
    /// The rank the fetch set was last requested from.
    pub(super) requested_from: Option<Rank>,
    pub(super) released: bool,
}

impl TreeState {
    pub(super) fn complete_subtree(&self) -> bool {
        self.entries.len() == self.expected
    }

    pub(super) fn append(&mut self, part: Vec<Entry>) {
        let room = self.expected.saturating_sub(self.entries.len());
        for e in part.into_iter().take(room) {
            self.index.insert(e.child, self.entries.len());
            self.entries.push(e);
        }
    }

    /// Recomputes `direct`: live descendants whose chain of parents up to this rank
    /// passes only through dead ranks (re-attachment after failures).
    pub(super) fn recompute_direct(&mut self, me: Rank, dead: &RankSet) {
        self.direct.clear();
        for (k, e) in self.entries.iter().enumerate() {
            if dead.contains(e.child) {
                continue;
            }
            let mut p = e.parent;
            while p != me && dead.contains(p) {
                match self.index.get(&p) {
                    Some(&i) => p = self.entries[i].parent,
                    None => break,
                }
            }
            if p == me {
                self.direct.push(k);
            }
        }
    }
}

/// One output's bytes, filled chunk by chunk as they arrive.
///
/// `data` is the received prefix and grows with it (never reserved at the announced
/// size, never past it); chunks that arrive ahead of the prefix wait in `ahead`, keyed
/// by offset, until the gap before them fills. So the memory held is what arrived.
#[derive(Debug, Default)]
pub(super) struct Buffer {
    pub(super) data: Vec<u8>,
    pub(super) ahead: BTreeMap<u64, Vec<u8>>,
}

impl Buffer {
    /// Adds the chunk at `offset` of an output of `size` bytes; true once the output is
    /// complete. A chunk already held (from an old and a new source) is ignored.
    pub(super) fn add(&mut self, size: u64, offset: u64, chunk: &[u8]) -> bool {
        let held = self.data.len() as u64;
        if offset > held {
            self.ahead.entry(offset).or_insert_with(|| chunk.to_vec());
        } else if offset == held {
            self.append(size, chunk);
            while let Some(next) = self.ahead.remove(&(self.data.len() as u64)) {
                self.append(size, &next);
            }
        }
        self.data.len() as u64 == size
    }

    /// Appends to the prefix, growing it geometrically but never past `size`.
    pub(super) fn append(&mut self, size: u64, chunk: &[u8]) {
        let len = self.data.len();
        if self.data.capacity() - len < chunk.len() {
            let need = len + chunk.len();
            let most = usize::try_from(size).unwrap_or(usize::MAX).max(need);
            let want = len.saturating_mul(2).max(need).min(most);
            self.data.reserve_exact(want - len);
        }
        self.data.extend_from_slice(chunk);
    }
}

/// A request waiting for outputs this rank does not hold yet.
#[derive(Debug)]
pub(super) struct Waiting {
    pub(super) child: Rank,
    pub(super) outputs: OutputSet,
}

#[derive(Debug, Default)]
pub(super) struct Task {
    pub(super) sizes: HashMap<u32, u64>,
    pub(super) buffers: HashMap<u32, Buffer>,
    pub(super) complete: OutputSet,
    pub(super) trees: BTreeMap<u32, TreeState>,
    pub(super) waiting: Vec<Waiting>,
    /// Outputs already streamed (or being streamed) to each rank.
    pub(super) served: HashMap<Rank, OutputSet>,
    /// Subtree parts not yet absorbed (out of order, or before their activation):
    /// (tree, sender, position of the first entry, entries).
    pub(super) parts: Vec<(u32, Rank, usize, Vec<Entry>)>,
    /// Streams that caught up with the data this rank holds, waiting for more (woken
    /// by the next chunk of their output).
    pub(super) parked: Vec<Parked>,
    pub(super) abandoned: bool,
}

/// A stream of an output to a child, stopped at `offset` until the data past it
/// arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Parked {
    pub(super) to: Rank,
    pub(super) output: u32,
    pub(super) offset: u64,
}

#[derive(Debug)]
pub(super) enum Outgoing {
    Frame {
        to: Rank,
        bytes: Vec<u8>,
    },
    Stream {
        to: Rank,
        task: u32,
        output: u32,
        offset: u64,
    },
}

/// `want \ held`.
pub(super) fn missing_from(want: &OutputSet, held: &OutputSet) -> OutputSet {
    want.iter().filter(|&j| !held.contains(j)).collect()
}

/// Appends the buffered parts of tree `tree_id` that continue its subtree, in order;
/// drops parts that can no longer fit. A part that fails validation is dropped and
/// reported.
pub(super) fn absorb_parts(t: &mut Task, tree_id: u32, me: Rank) -> Result<(), FrameError> {
    let Some(tree) = t.trees.get_mut(&tree_id) else {
        return Ok(());
    };
    let mut result = Ok(());
    loop {
        let next = t
            .parts
            .iter()
            .position(|p| p.0 == tree_id && p.1 == tree.source && p.2 == tree.entries.len());
        let Some(k) = next else { break };
        let (_, _, _, entries) = t.parts.swap_remove(k);
        if tree.entries.len() + entries.len() > tree.expected {
            result = Err(FrameError::Malformed("more subtree entries than announced"));
            continue;
        }
        let mut known: HashMap<Rank, OutputSet> = tree
            .entries
            .iter()
            .map(|e| (e.child, e.fetch.clone()))
            .collect();
        match validate_entries(me, &tree.fetch, &tree.ancestors, &mut known, &entries) {
            Ok(()) => tree.append(entries),
            Err(e) => result = Err(e),
        }
    }
    // Parts that start before the current end, or come from another sender once the
    // subtree is complete, are stale.
    let (len, source, complete) = (tree.entries.len(), tree.source, tree.complete_subtree());
    t.parts
        .retain(|p| p.0 != tree_id || (p.2 > len && p.1 == source && !complete));
    result
}

/// Checks subtree entries: parent-first (each parent is this rank or an earlier
/// child), no rank twice, none of this rank's ancestors, and each fetch set within its
/// parent's.
pub(super) fn validate_entries(
    me: Rank,
    my_fetch: &OutputSet,
    ancestors: &[Rank],
    known: &mut HashMap<Rank, OutputSet>,
    entries: &[Entry],
) -> Result<(), FrameError> {
    for e in entries {
        if e.child == me || ancestors.contains(&e.child) || known.contains_key(&e.child) {
            return Err(FrameError::Malformed("subtree names a rank twice"));
        }
        let parent_fetch = if e.parent == me {
            my_fetch
        } else {
            known
                .get(&e.parent)
                .ok_or(FrameError::Malformed("subtree entry before its parent"))?
        };
        if !e.fetch.is_subset(parent_fetch) {
            return Err(FrameError::Malformed(
                "subtree entry fetches more than its parent",
            ));
        }
        known.insert(e.child, e.fetch.clone());
    }
    Ok(())
}
