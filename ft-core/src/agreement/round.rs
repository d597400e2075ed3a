//! The ballot rounds: one rank's part in one ballot over the binomial tree of the
//! ballot's participants ([`crate::tree::LiveTree`]): promise and acceptance gathers,
//! repaired in place around deaths.

use alloc::sync::Arc;
use alloc::vec::Vec;

use super::instance::Io;
use super::msg::{Msg, Out, Report};
use super::Ballot;
use crate::error::FrameError;
use crate::rank::Rank;
use crate::rankset::RankSet;
pub(super) use crate::tree::LiveTree as Tree;

/// Where a rank stands in the round it takes part in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Phase {
    /// Waiting for the children's promises.
    Promising,
    /// Promise sent up; waiting for the parent's accept.
    Promised,
    /// Waiting for the children's acknowledgements.
    Accepting,
    /// Acknowledgement sent up (or, at the root, the round is over).
    Accepted,
}

/// One rank's part in one ballot.
///
/// The ballot's tree is repaired in place as deaths are learned: a rank answers its
/// nearest live ancestor ([`Round::up`]), takes answers from any rank of its subtree,
/// and counts a dead child as answered once that child's own children are (recursively,
/// [`Round::covered`]). So a death costs a few frames near it, not a new round.
#[derive(Clone, Debug)]
pub(super) struct Round {
    pub(super) ballot: Ballot,
    pub(super) tree: Tree,
    /// The ballot's excluded set, shared with the prepare frames that carry it.
    pub(super) excluded: Arc<RankSet>,
    /// This rank's children in the ballot's tree (dead or not).
    pub(super) children: Vec<Rank>,
    pub(super) is_root: bool,
    pub(super) phase: Phase,
    /// Ranks of this rank's subtree heard from in the current gather.
    pub(super) heard: Vec<Rank>,
    /// Where this rank's answer of the current phase went, once sent.
    pub(super) sent_to: Option<Rank>,
    pub(super) report: Report,
    pub(super) reject: Option<Ballot>,
}

impl Round {
    pub(super) fn new(
        n: u32,
        me: Rank,
        ballot: Ballot,
        tree: Tree,
        excluded: Arc<RankSet>,
    ) -> Self {
        Round {
            ballot,
            children: tree.children(me),
            is_root: tree.parent(me).is_none(),
            tree,
            excluded,
            phase: Phase::Promising,
            heard: Vec::new(),
            sent_to: None,
            report: Report::empty(n),
            reject: None,
        }
    }

    /// Records an answer of the current gather from `from`; false if `from` is not in
    /// this rank's subtree. A repeated answer (re-sent after a death) is ignored.
    pub(super) fn hear(&mut self, me: Rank, from: Rank) -> Result<bool, FrameError> {
        if !self.tree.is_ancestor(me, from) {
            return Err(FrameError::Malformed("answer from outside the subtree"));
        }
        if self.heard.contains(&from) {
            return Ok(false);
        }
        self.heard.push(from);
        Ok(true)
    }

    /// Starts the next gather.
    pub(super) fn reset_gather(&mut self) {
        self.heard.clear();
        self.sent_to = None;
    }

    /// Whether the subtree of `r` has answered: `r` did, or `r` is dead and all its
    /// children's subtrees have.
    pub(super) fn covered(&self, r: Rank, dead: &RankSet) -> bool {
        self.heard.contains(&r)
            || (dead.contains(r)
                && self
                    .tree
                    .children(r)
                    .into_iter()
                    .all(|c| self.covered(c, dead)))
    }

    /// Whether every child's subtree has answered.
    pub(super) fn gathered(&self, dead: &RankSet) -> bool {
        self.children.iter().all(|&c| self.covered(c, dead))
    }

    /// This rank's nearest live ancestor: where its answers go.
    pub(super) fn up(&self, me: Rank, dead: &RankSet) -> Option<Rank> {
        self.tree.nearest_live_ancestor(me, dead)
    }

    /// Sends a broadcast message of this round to the live ranks below `under` (this
    /// rank for a first send; a dead child when passing on for it).
    pub(super) fn send_below(&self, io: &mut Io<'_>, epoch: u32, under: Rank, msg: Out) {
        let mut to = Vec::new();
        self.tree.live_below(under, io.dead, &mut to);
        for c in to {
            io.send(c, epoch, msg.clone()); // shares the body: no copy of its sets
        }
    }

    /// Sends this rank's answer of the current phase to its nearest live ancestor.
    pub(super) fn answer(&mut self, io: &mut Io<'_>, epoch: u32) {
        let Some(p) = self.up(io.cfg.me, io.dead) else {
            return; // every ancestor, the coordinator included, is dead: a new one takes over
        };
        let ballot = self.ballot;
        let msg = match self.phase {
            Phase::Promised => Msg::Promise {
                ballot,
                report: Arc::new(self.report.clone()),
            },
            Phase::Accepted => Msg::Accepted {
                ballot,
                reject: self.reject,
            },
            Phase::Promising | Phase::Accepting => return,
        };
        io.send(p, epoch, msg);
        self.sent_to = Some(p);
    }
}
