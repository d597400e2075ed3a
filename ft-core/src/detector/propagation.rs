//! Propagation: failure notices over the circulant graph, and their repair.
//!
//! A declaration starts two spanning trees rooted at the declaring rank, one over
//! increasing offsets and one over decreasing ones; a rank at offset `d` covering
//! `[d, e)` hands `[d + 2^k, min(d + 2^(k+1), e))` to the first rank of it not known
//! dead. A rank keeps, per tree it took part in, how far it has covered (a [`Spread`])
//! and, per sub-range it handed on, who got it (a [`Child`]): a second, larger range for
//! the same tree only sends the part not yet covered, and a child learned dead has its
//! range handed to the next live rank of it (rule b). Every notice carries the whole
//! `K_i` when it is encoded. The reliability argument and the wire format are in the
//! [detector's documentation](super).

use alloc::vec::Vec;

use super::{Detector, DetectorEvent, Outgoing};
use crate::error::{BufferTooShort, FrameError};
use crate::rank::Rank;
use crate::rankset::RankSet;
use crate::wire::{FrameKind, Reader};

/// Wire code of a notice sent point to point (to the suspect, or along the ring edge).
pub(super) const DIRECT: u8 = 0;
/// Wire code of a notice in the tree of increasing offsets from its origin.
pub(super) const PLUS: u8 = 1;
/// Wire code of a notice in the tree of decreasing offsets from its origin.
pub(super) const MINUS: u8 = 2;

/// One spanning tree of one notice: who declared, which of its declarations, which
/// direction. `seq` counts the origin's declarations from 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct TreeId {
    origin: Rank,
    seq: u32,
    plus: bool,
}

/// This rank's part in one tree: it has forwarded to cover offsets `[own, covered_end)`
/// (offsets from the origin, in the tree's direction); its frames carry `hops`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Spread {
    tree: TreeId,
    covered_end: u32,
    hops: u32,
}

/// A child this rank sent a tree notice to, for the sub-range `[start, end)`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Child {
    tree: TreeId,
    start: u32,
    end: u32,
    /// The rank that got it (the first live one at or past `start`), or `None` once
    /// every rank of the range is known dead.
    child: Option<Rank>,
}

/// A decoded notice, checked against this rank's position before anything changes.
struct Notice {
    hops: u32,
    tree: Option<(TreeId, u32)>,
    set: RankSet,
}

impl Detector {
    /// A [`FrameKind::FailureNotice`] from `from`: stop if it names us, else learn what
    /// is new and relay it in its tree.
    pub(super) fn handle_notice(
        &mut self,
        from: Rank,
        payload: Reader<'_>,
    ) -> Result<(), FrameError> {
        let notice = self.decode_notice(from, payload)?;
        if notice.set.contains(self.config.me) {
            self.stop(from);
            return Ok(());
        }
        let fresh: Vec<Rank> = notice.set.difference(&self.dead).collect();
        for &rank in &fresh {
            self.events.push_back(DetectorEvent::Learned {
                rank,
                hops: notice.hops,
            });
        }
        self.learn(&fresh, notice.hops.saturating_add(1));
        if let Some((tree, end)) = notice.tree {
            self.relay(tree, end, notice.hops.saturating_add(1));
        }
        self.flush_ring_edge();
        Ok(())
    }

    fn decode_notice(&self, from: Rank, mut r: Reader<'_>) -> Result<Notice, FrameError> {
        let hops = r.varint_u32()?;
        if hops == 0 {
            return Err(FrameError::Malformed("notice with zero hops"));
        }
        let tree = match r.u8()? {
            DIRECT => None,
            code @ (PLUS | MINUS) => {
                let origin = r.rank()?;
                let seq = r.varint_u32()?;
                let end = r.varint_u32()?;
                let tree = TreeId {
                    origin,
                    seq,
                    plus: code == PLUS,
                };
                let own = self.offset(self.config.me, tree);
                if own == 0 || end <= own || end > self.config.n {
                    return Err(FrameError::Malformed(
                        "tree range does not hold the receiver",
                    ));
                }
                Some((tree, end))
            }
            _ => return Err(FrameError::Malformed("unknown notice tree")),
        };
        let set = r.rankset()?;
        r.finish()?;
        if set.contains(from) {
            return Err(FrameError::Malformed("notice names its sender"));
        }
        Ok(Notice { hops, tree, set })
    }

    /// The offset of `rank` from the tree's origin, in the tree's direction.
    fn offset(&self, rank: Rank, tree: TreeId) -> u32 {
        let n = u64::from(self.config.n);
        let (r, o) = (u64::from(rank), u64::from(tree.origin));
        let off = if tree.plus { r + n - o } else { o + n - r };
        (off % n) as u32
    }

    /// The rank at `offset` from the tree's origin.
    fn at_offset(&self, tree: TreeId, offset: u32) -> Rank {
        let n = u64::from(self.config.n);
        let (o, d) = (u64::from(tree.origin), u64::from(offset) % n);
        let r = if tree.plus { o + d } else { o + n - d };
        (r % n) as Rank
    }

    /// The first rank of offsets `[start, end)` not known dead (nor us).
    fn first_live(&self, tree: TreeId, start: u32, end: u32) -> Option<Rank> {
        (start..end)
            .map(|off| self.at_offset(tree, off))
            .find(|&r| r != self.config.me && !self.dead.contains(r))
    }

    /// Declares `suspects` (not known dead, not us) dead by our own timeout, as one
    /// declaration: tell each suspect, everyone through the two trees rooted here, and
    /// our ring predecessor.
    pub(super) fn declare(&mut self, suspects: &[Rank]) {
        if suspects.is_empty() {
            return;
        }
        self.declarations += 1;
        for &rank in suspects {
            self.events.push_back(DetectorEvent::Suspected { rank });
            // Our own suspicion: tell the suspect, so a live one stops (fail-stop).
            // Nobody else will: every rank skips the ranks it knows dead.
            self.outbox
                .push_back(Outgoing::Direct { to: rank, hops: 1 });
        }
        self.learn(suspects, 1);
        for plus in [true, false] {
            let tree = TreeId {
                origin: self.config.me,
                seq: self.declarations,
                plus,
            };
            self.spreads.push(Spread {
                tree,
                covered_end: self.config.n,
                hops: 1,
            });
            self.cover(tree, 0, 1, self.config.n, 1);
        }
        self.flush_ring_edge();
    }

    /// Sends `K_i` to `pred(i)` if it grew and no queued notice to `pred(i)` carries it
    /// already (every notice carries the whole `K_i` when it is polled; in the
    /// decreasing-offset tree, `pred(i)` is often our first child).
    pub(super) fn flush_ring_edge(&mut self) {
        let Some((pred, hops)) = self.ring_edge_due.take() else {
            return;
        };
        let covered = self.outbox.iter().any(
            |o| matches!(o, Outgoing::Direct { to, .. } | Outgoing::Tree { to, .. } if *to == pred),
        );
        if !covered {
            self.outbox.push_back(Outgoing::Direct { to: pred, hops });
        }
    }

    /// We were asked to cover our subtree of `tree` up to offset `end`.
    fn relay(&mut self, tree: TreeId, end: u32, hops: u32) {
        let own = self.offset(self.config.me, tree);
        match self.spreads.iter_mut().find(|s| s.tree == tree) {
            None => {
                self.spreads.push(Spread {
                    tree,
                    covered_end: end,
                    hops,
                });
                self.cover(tree, own, own + 1, end, hops);
            }
            Some(spread) if end > spread.covered_end => {
                let (old, hops) = (spread.covered_end, spread.hops);
                spread.covered_end = end;
                self.cover(tree, own, old, end, hops);
            }
            Some(_) => {}
        }
    }

    /// Binomial forwarding from offset `own`: child `k` covers
    /// `[own + 2^k, min(own + 2^(k+1), end))` and gets the notice at its first rank not
    /// known dead. Only the part past `old_end` (already covered) is sent.
    fn cover(&mut self, tree: TreeId, own: u32, old_end: u32, end: u32, hops: u32) {
        let (own, old_end, end) = (u64::from(own), u64::from(old_end), u64::from(end));
        let mut step: u64 = 1;
        while own + step < end {
            let start = own + step;
            let new_stop = (own + 2 * step).min(end);
            let old_stop = (own + 2 * step).min(old_end).max(start);
            if new_stop > old_stop {
                let (start, stop) = (start as u32, new_stop as u32);
                let child = self.first_live(tree, start, stop);
                if let Some(to) = child {
                    self.outbox.push_back(Outgoing::Tree {
                        to,
                        tree,
                        end: stop,
                        hops,
                    });
                }
                match self
                    .children
                    .iter_mut()
                    .find(|c| c.tree == tree && c.start == start)
                {
                    Some(c) => {
                        c.end = stop;
                        c.child = child;
                    }
                    None => self.children.push(Child {
                        tree,
                        start,
                        end: stop,
                        child,
                    }),
                }
            }
            step *= 2;
        }
    }

    /// Hands the sub-range of every tree child in `fresh` (just learned dead) to the
    /// next live rank of that range (rule b), at the hop count of our part in that tree.
    pub(super) fn repair_children(&mut self, fresh: &[Rank], hops: u32) {
        for i in 0..self.children.len() {
            let c = self.children[i];
            let Some(gone) = c.child else { continue };
            if !fresh.contains(&gone) {
                continue;
            }
            let replacement = self.first_live(c.tree, c.start, c.end);
            self.children[i].child = replacement;
            if let Some(to) = replacement {
                let hops = self
                    .spreads
                    .iter()
                    .find(|s| s.tree == c.tree)
                    .map_or(hops, |s| s.hops);
                self.outbox.push_back(Outgoing::Tree {
                    to,
                    tree: c.tree,
                    end: c.end,
                    hops,
                });
            }
        }
    }

    pub(super) fn write_notice(
        &self,
        hops: u32,
        tree: Option<(TreeId, u32)>,
        buf: &mut [u8],
    ) -> Result<usize, BufferTooShort> {
        let mut w = self.header(FrameKind::FailureNotice).write_into(buf);
        w.put_varint(hops.into());
        match tree {
            None => {
                w.put_u8(DIRECT);
            }
            Some((tree, end)) => {
                w.put_u8(if tree.plus { PLUS } else { MINUS })
                    .put_rank(tree.origin)
                    .put_varint(tree.seq.into())
                    .put_varint(end.into());
            }
        }
        w.put_rankset(&self.dead);
        w.finish()
    }
}
