//! What survivors do once they agree on `G`: the owners of the dead ranks' tasks, the
//! holdings they exchange, and the plan each of them computes from those holdings.
//!
//! Invariants:
//! - [`owner`] is a function of (task, `G`) alone: every survivor computes the same
//!   owners. A task keeps its failure-free owner while that rank lives; a dead rank's
//!   task goes to the live rank of highest weight `xxh3(task, rank)` (rendezvous
//!   hashing), so a later failure moves only the tasks of the ranks that just died. The
//!   collector goes to the lowest live rank.
//! - Every output is kept, immutable, by every rank that holds it until the graph
//!   completes, so a rank's [`Holdings`] only grow.
//! - [`plan`] is a function of the graph, `G` and the holdings of every survivor of
//!   `G`: every survivor that has all of them computes the same plan. It re-runs a task
//!   only if one of its outputs is needed and no survivor holds it, recursively from
//!   the collector back; every other input a task to run lacks is re-sent by one
//!   survivor that holds it.

use std::collections::BTreeMap;
use std::fmt;

use ft::{Rank, RankSet};
use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::graph::{Graph, OutputId, TaskIdx};

/// The owner of task `t` once the ranks in `dead` failed (`dead` must leave a rank).
pub fn owner(graph: &Graph, t: TaskIdx, dead: &RankSet) -> Rank {
    let n = dead.universe();
    if t == graph.collector() {
        return (0..n).find(|&r| !dead.contains(r)).unwrap_or(0);
    }
    let base = graph.task(t).owner;
    if !dead.contains(base) {
        return base;
    }
    (0..n)
        .filter(|&r| !dead.contains(r))
        .max_by_key(|&r| xxh3_64_with_seed(&t.to_le_bytes(), u64::from(r)))
        .unwrap_or(base)
}

/// A set of small integers as a bitmap.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bits(Vec<u64>);

impl Bits {
    /// `len` zeros.
    pub fn new(len: usize) -> Self {
        Bits(vec![0; len.div_ceil(64)])
    }
    /// Sets `i`.
    pub fn set(&mut self, i: u32) {
        if let Some(w) = self.0.get_mut(i as usize / 64) {
            *w |= 1 << (i % 64);
        }
    }
    /// Whether `i` is set.
    pub fn get(&self, i: u32) -> bool {
        self.0
            .get(i as usize / 64)
            .is_some_and(|w| w >> (i % 64) & 1 == 1)
    }
}

/// What a survivor tells the others after agreeing on `G` at `epoch`: the outputs it
/// holds and the tasks it knows ran (here, or at the root of a broadcast it saw).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holdings {
    /// The validation's epoch.
    pub epoch: u32,
    /// Outputs held, by id.
    pub held: Bits,
    /// Tasks known to have run.
    pub ran: Bits,
}

/// Holdings a peer sent that do not fit this graph.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HoldingsError {
    /// The message's length is not the graph's.
    Length {
        /// Bytes expected.
        expected: usize,
        /// Bytes received.
        got: usize,
    },
}

impl fmt::Display for HoldingsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HoldingsError::Length { expected, got } => {
                write!(
                    f,
                    "holdings of {got} bytes where the graph needs {expected}"
                )
            }
        }
    }
}

impl std::error::Error for HoldingsError {}

impl Holdings {
    /// Empty holdings for `graph`.
    pub fn new(graph: &Graph, epoch: u32) -> Self {
        Holdings {
            epoch,
            held: Bits::new(graph.outputs.len()),
            ran: Bits::new(graph.tasks.len()),
        }
    }

    /// The message: epoch, then both bitmaps' words, little-endian.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(4 + 8 * (self.held.0.len() + self.ran.0.len()));
        out.extend_from_slice(&self.epoch.to_le_bytes());
        for w in self.held.0.iter().chain(&self.ran.0) {
            out.extend_from_slice(&w.to_le_bytes());
        }
        out
    }

    /// Decodes a peer's message against `graph`.
    pub fn decode(bytes: &[u8], graph: &Graph) -> Result<Holdings, HoldingsError> {
        let mut h = Holdings::new(graph, 0);
        let expected = 4 + 8 * (h.held.0.len() + h.ran.0.len());
        if bytes.len() != expected {
            return Err(HoldingsError::Length {
                expected,
                got: bytes.len(),
            });
        }
        h.epoch = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        let mut words = bytes[4..]
            .chunks_exact(8)
            .map(|w| u64::from_le_bytes(w.try_into().unwrap_or([0; 8])));
        for w in h.held.0.iter_mut().chain(h.ran.0.iter_mut()) {
            *w = words.next().unwrap_or(0);
        }
        Ok(h)
    }
}

/// What every survivor does after a validation: see [`plan`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Tasks that must (still) run: needed, and some needed output of theirs is held
    /// by no survivor. Pending work counts: a task that never ran is in it too.
    pub must_run: Vec<bool>,
    /// Of those, the ones some survivor knows ran before: their run is a re-execution.
    pub rerun: Vec<bool>,
    /// Re-sends: by (sender, producing task), the outputs to send and to whom.
    pub resends: BTreeMap<(Rank, TaskIdx), BTreeMap<OutputId, Vec<Rank>>>,
}

impl Plan {
    /// The tasks of `plan` that rank `me` runs under `dead`.
    pub fn runs_at(&self, graph: &Graph, dead: &RankSet, me: Rank) -> Vec<TaskIdx> {
        (0..graph.tasks.len() as TaskIdx)
            .filter(|&t| self.must_run[t as usize] && owner(graph, t, dead) == me)
            .collect()
    }
}

// ANCHOR: plan
/// The plan after `G = dead`, from every survivor's holdings (see the [module
/// docs](self)). `collected` says whether the collector already ran at a survivor.
pub fn plan(
    graph: &Graph,
    dead: &RankSet,
    holdings: &BTreeMap<Rank, Holdings>,
    collected: bool,
) -> Plan {
    let holders = |o: OutputId| -> Vec<Rank> {
        holdings
            .iter()
            .filter(|(_, h)| h.held.get(o))
            .map(|(&r, _)| r)
            .collect()
    };
    let tasks = graph.tasks.len();
    let mut must_run = vec![false; tasks];
    must_run[graph.collector() as usize] = !collected;
    for t in (0..graph.collector()).rev() {
        let task = graph.task(t);
        must_run[t as usize] = task.output_ids().any(|o| {
            let needed = graph
                .output(o)
                .consumers
                .iter()
                .any(|&c| must_run[c as usize]);
            needed && holders(o).is_empty()
        });
    }
    let ran = |t: TaskIdx| holdings.values().any(|h| h.ran.get(t));
    let rerun = (0..tasks as TaskIdx)
        .map(|t| must_run[t as usize] && ran(t))
        .collect();
    let mut resends: BTreeMap<(Rank, TaskIdx), BTreeMap<OutputId, Vec<Rank>>> = BTreeMap::new();
    for c in (0..tasks as TaskIdx).filter(|&c| must_run[c as usize]) {
        let to = owner(graph, c, dead);
        for &o in &graph.task(c).inputs {
            let have = holders(o);
            if have.is_empty() || have.contains(&to) {
                continue;
            }
            let pick = xxh3_64_with_seed(&o.to_le_bytes(), u64::from(to)) as usize % have.len();
            let dests = resends
                .entry((have[pick], graph.output(o).producer))
                .or_default()
                .entry(o)
                .or_default();
            if !dests.contains(&to) {
                dests.push(to);
            }
        }
    }
    Plan {
        must_run,
        rerun,
        resends,
    }
}
// ANCHOR_END: plan

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workloads::cholesky::Cholesky;
    use crate::workloads::Workload;

    #[test]
    fn only_the_dead_ranks_tasks_move_and_every_survivor_agrees() {
        let w = Cholesky::new(6, 2, 1, 4);
        let g = w.graph();
        let one = RankSet::from_ranks(4, [2]);
        let two = RankSet::from_ranks(4, [2, 3]);
        for t in 0..g.collector() {
            let base = g.task(t).owner;
            let after_one = owner(g, t, &one);
            assert_ne!(after_one, 2);
            if base != 2 {
                assert_eq!(after_one, base);
            }
            // A second failure moves only the tasks of the rank that just died.
            if after_one != 3 {
                assert_eq!(owner(g, t, &two), after_one);
            }
        }
        assert_eq!(owner(g, g.collector(), &RankSet::from_ranks(4, [0, 1])), 2);
    }

    #[test]
    fn holdings_round_trip_and_a_short_message_is_refused() {
        let w = Cholesky::new(3, 2, 1, 2);
        let mut h = Holdings::new(w.graph(), 7);
        h.held.set(3);
        h.ran.set(1);
        let bytes = h.encode();
        assert_eq!(Holdings::decode(&bytes, w.graph()), Ok(h));
        assert!(Holdings::decode(&bytes[1..], w.graph()).is_err());
    }

    #[test]
    fn a_held_output_is_resent_and_only_a_lost_one_is_recomputed() {
        // 2×2 tiles on 2 ranks: POTRF(0)@0, TRSM(1,0)@0, SYRK(1,0)@1... owners by grid(2) = 1×2.
        let w = Cholesky::new(2, 2, 1, 2);
        let g = w.graph();
        // Tasks: 0 POTRF(0), 1 TRSM(1,0), 2 SYRK(1,0), 3 POTRF(1), 4 collect.
        assert_eq!(g.work_tasks(), 4);
        let dead = RankSet::from_ranks(3, [2]);
        // Rank 0 holds POTRF(0)'s and TRSM(1,0)'s tiles; nobody holds SYRK(1,0)'s.
        let mut h0 = Holdings::new(g, 2);
        h0.held.set(0);
        h0.held.set(1);
        h0.ran.set(0);
        h0.ran.set(1);
        h0.ran.set(2);
        let mut h1 = Holdings::new(g, 2);
        h1.held.set(1);
        let holdings = BTreeMap::from([(0, h0), (1, h1)]);
        let p = plan(g, &dead, &holdings, false);
        assert_eq!(p.must_run, [false, false, true, true, true]);
        assert_eq!(p.rerun, [false, false, true, false, false]);
        // SYRK(1,0) needs TRSM(1,0)'s tile where it now runs, and the collector (rank 0)
        // needs nothing re-sent: it holds both column-0 tiles.
        let syrk_at = owner(g, 2, &dead);
        for ((sender, _), outs) in &p.resends {
            for dests in outs.values() {
                assert!(!dests.contains(sender));
            }
        }
        if syrk_at == 0 {
            assert!(p.resends.is_empty());
        }
    }
}
