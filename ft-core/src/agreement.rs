//! [`Agreement`]: the fault-tolerant agreement behind `validate_global`.
//!
//! Every rank of a communicator of `n` ranks calls [`Agreement::start`] with its
//! contribution `L_i` (what it knows failed); the survivors agree on one failed set `G`
//! and each reports it with [`Event::Decided`]. Successive validations are numbered
//! epochs `1, 2, ...`; the `G` of epoch `e` becomes the starting point of epoch `e + 1`.
//!
//! # Shape
//!
//! Single-decree Paxos run over binomial trees of the ranks believed alive. A ballot is
//! `(round, coordinator)`; the coordinator of a ballot is the lowest rank outside the
//! ballot's *excluded set* `D`, and the tree is the binomial tree over `C \ D` renumbered
//! in rank order (see [`crate::shrink::Survivors`]): index `i > 0` has parent
//! `i & (i - 1)` and the children `i + 2^k` for `2^k < lowbit(i)`, so its subtree is the
//! index range `[i, i + lowbit(i))` and the depth is `h(m) = max popcount(i < m)
//! ≤ ⌈log2 m⌉` for `m = |C \ D|` participants.
//!
//! A round is four tree traversals:
//!
//! 1. **promise** (reduce): each rank sends its parent the union of its subtree's
//!    contributions, the highest-ballot accepted value, any decided value and any
//!    rejection (a rank that promised a higher ballot rejects);
//! 2. **accept** (broadcast): the coordinator proposes the highest-ballot accepted value
//!    if one was reported, otherwise `⋃ contributions ∪ D ∪ (what it knows dead)`;
//! 3. **accepted** (reduce): each rank accepts (unless it promised a higher ballot) and
//!    acknowledges once its whole subtree has;
//! 4. **decide** (broadcast): the coordinator now knows every participant holds the
//!    value; it decides and broadcasts the decision; a rank returns it on receipt.
//!
//! Round 0 of epoch `e` needs no prepare message: its excluded set is `G_{e-1}` (the
//! previous agreed set, identical everywhere), so every rank computes the tree and sends
//! its promise (= contribution) up as soon as the application calls `start`. A later
//! round (`round ≥ 1`) starts with a **prepare** broadcast carrying `D`, then the four
//! traversals above.
//!
//! Failure-free cost with `m = n - |G_{e-1}|` participants, all starting together:
//! `4(m - 1)` messages and `4·h(m)` message delays (`= 4·log2 m` when `m` is a power of
//! two). That is twice the `2(m-1)` messages / `2·⌈log2 m⌉` delays of a bare
//! reduce+broadcast, and it is the price of *knowledge*: a rank may only return `G` once
//! it knows every live rank holds `G`, which needs the acknowledgement reduce and a
//! second broadcast. The acknowledgement reduce carries only a ballot; the decision
//! broadcast carries `G` and `D`.
//!
//! # Failures
//!
//! The failure detector reports deaths with [`Agreement::on_rank_failed`]; a reported rank is
//! dead here for good (its later frames are refused with
//! [`FrameError::FromFailedRank`]).
//!
//! **Deaths inside a round are repaired in place**, not by a new round. A rank answers
//! (promise, acknowledgement) its nearest *live* ancestor in the ballot's tree, accepts
//! answers from any rank of its subtree and a broadcast (prepare, accept) from any
//! ancestor, and counts a dead child as answered once that child's own children have
//! answered, recursively. When it learns a death it (a) passes the round's current
//! broadcast to the live ranks the dead one left without a live parent, if it is their
//! nearest live ancestor, and (b) sends its answer again if the dead rank held it. Both
//! repeats are idempotent at the receiver (answers are unions and maxima; a repeated
//! broadcast is recognised as a duplicate). So a death during the call costs about
//! `log2 n` frames around it, not the `5(m-1)` of a new round.
//!
//! A rank considers itself **coordinator** when every lower rank is dead in its view. A
//! coordinator that has not decided starts a new round (`round = 1 + highest round seen`,
//! `D =` every rank it knows dead) only when it has no round of its own (it just became
//! coordinator: the previous one died) or its round was rejected. A coordinator that has
//! decided re-broadcasts the decision over the live ranks whenever an inner node (root
//! included) of the last decision broadcast it knows of is dead. A rank that has decided
//! keeps participating in the epoch's rounds and reports its decision in its promise; a
//! coordinator that hears of a decision adopts and broadcasts it. A rank keeps the
//! agreement of the previous epoch alive (decided) while the next one runs, so late
//! requests are answered; two epochs are enough because a rank can only finish epoch
//! `e + 1` once every survivor has started it, i.e. finished epoch `e`.
//!
//! Ranks that die during the call are in `G` when the value was built after their death
//! was known to the coordinator; otherwise (the value was already accepted by someone,
//! which Paxos forces the next coordinator to re-propose) they are in the next
//! validation's `G`, as every rank's `L_i` then contains them.
//!
//! # Epochs
//!
//! Frames carry their epoch in the header. Frames of the current epoch and of the
//! previous one (answered from its kept decision) are processed. Frames of the next
//! epoch (a peer that decided and moved on before this rank) are decoded, checked and
//! buffered — at most [`Config::max_buffered`], beyond which they are refused with
//! [`FrameError::FutureEpoch`] — and replayed when the application starts that epoch.
//! Older frames are refused with [`FrameError::StaleEpoch`], later ones with
//! `FutureEpoch`. An epoch's frames never touch another epoch's state.
//!
//! # Properties (crash-stop, accurate detector: only crashed ranks are reported)
//!
//! - **Uniform agreement**: every rank that returns `G` for epoch `e`, even one that
//!   crashes right after, returns the same `G`. A value is decided only when every
//!   participant of a ballot `b` (`C \ D_b ⊇` every live rank) accepted it before
//!   promising anything higher, or was reported dead (in-place repair skips only ranks
//!   the detector declared dead, and under an accurate detector those crashed); any
//!   later ballot's coordinator hears from a live rank that accepted `b`, so it
//!   proposes the same value (the Paxos argument, with "all ranks not excluded" as the
//!   quorum: two such quorums always share the later coordinator, which was alive at
//!   the earlier ballot and so acknowledged it).
//! - **Knowledge**: when a rank returns `G`, every rank not yet crashed has accepted `G`
//!   (it was a participant of the deciding ballot and acknowledged). So the returning
//!   rank knows every live rank holds or will return `G`.
//! - **Validity**: `G ⊇ L_i` of every rank that started the epoch and is not in `G`
//!   (a survivor is a participant of the ballot whose reduce built the value), and
//!   `G ⊆` ranks some rank declared dead (contributions, detector reports, `D`).
//! - **Termination**: let `t*` be the time by which every failure of the run has been
//!   reported to every rank still alive (a rank that crashes later counts until it
//!   does: as coordinator it waits on what it was told) and every survivor has started
//!   the epoch, and `δ` the largest message delay. Then every survivor returns by `t* + (5·(k + 1) + 1)·h·δ`,
//!   where `k ≤ f` is the number of rejections the final coordinator meets (a rejection
//!   reveals a higher ballot of a dead earlier coordinator, and after it the final
//!   coordinator's round is above all of that coordinator's ballots). Without failures
//!   the bound is the `4·h` of the failure-free path. (Measured over 10^5 random
//!   schedules in `tests/agreement.rs`: at most `4.0·⌈log2 n⌉·δ` after `t*` with
//!   in-place repair; `5.3·⌈log2 n⌉·δ` when every death started a new round.)
//! - **Epochs**: successive decisions grow (`G_e ⊇ G_{e-1}`, since round 0 excludes
//!   `G_{e-1}` and every value contains its `D`), and no frame of one epoch changes the
//!   state of another.
//!
//! # Under false suspicion (partitions)
//!
//! If a live rank is reported dead, the "quorums" of two ballots may no longer
//! intersect and two sides may decide different sets (no protocol that keeps going
//! without a majority can avoid it; ULFM's agreement has the same limit). What still
//! holds: validity (`G ⊆` declared dead, `G ⊇` every contribution of a participant of the
//! deciding ballot), each returned `G` was accepted by every rank outside it that the
//! deciding coordinator did not exclude, a rank that receives a `G` containing itself
//! raises [`Event::SelfExcluded`] and stops (fail-stop enforcement), and every frame is
//! still epoch-separated. Termination needs the suspicion to become mutual.
//!
//! # Use
//!
//! Call order is the [`crate::machine`] loop; after every input drain `poll_transmit`,
//! then `poll_event`.
//!
//! - `validate_global` at this rank: [`Agreement::start`]`(now, &view.known_failed())`
//!   (refused with [`AgreementError::AlreadyRunning`] until the previous epoch decided);
//! - every detector suspicion, during a validation or not: [`Agreement::on_rank_failed`]
//!   (final; it also makes the machine refuse that rank's frames);
//! - every frame whose kind is in the `"agree"` family: [`Protocol::handle_message`];
//! - on [`Event::Decided`]: `view.commit_global(&agreed)` (agreed sets only grow, so its
//!   precondition holds) and report the counts; on [`Event::SelfExcluded`]: stop the rank.
//!
//! No timers: the machine waits on messages and detector news only, so `poll_timeout` is
//! always `None` and `handle_timeout` does nothing.

use alloc::boxed::Box;
use alloc::collections::VecDeque;
use alloc::vec::Vec;
use core::fmt;

use crate::error::FrameError;
use crate::machine::{Protocol, Transmit};
use crate::rank::Rank;
use crate::rankset::RankSet;
use crate::shrink::Survivors;
use crate::time::Instant;
use crate::wire::{self, Context, FrameKind, Header, Reader, Writer};

/// Settings of one rank's agreement machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Communicator size.
    pub n: u32,
    /// This rank.
    pub me: Rank,
    /// Communicator id carried by every frame.
    pub comm: u32,
    /// Most frames of the next epoch kept until the application starts it.
    pub max_buffered: usize,
}

impl Config {
    /// Rank `me` of communicator `comm` of `n` ranks, with a buffer of `64 + 16·log2 n`
    /// early frames (a rank gets at most a few frames per tree neighbour and round).
    ///
    /// # Panics
    /// If `me >= n`.
    pub fn new(n: u32, me: Rank, comm: u32) -> Self {
        assert!(me < n, "rank {me} out of range for a communicator of {n}");
        Config {
            n,
            me,
            comm,
            max_buffered: 64 + 16 * (32 - n.leading_zeros() as usize),
        }
    }
}

/// A ballot: rounds are ordered by number, then by coordinator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ballot {
    /// Round number within the epoch (0 is the implicit first round).
    pub round: u32,
    /// The round's coordinator.
    pub coord: Rank,
}

/// What the agreement reports to the application.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// `validate_global` of `epoch` returns `agreed` at this rank; every live rank holds
    /// the same set.
    Decided {
        /// The validation epoch (1 for the first validation).
        epoch: u32,
        /// The agreed failed set `G`.
        agreed: RankSet,
    },
    /// The survivors agreed that this rank is dead (it was falsely suspected): it must
    /// stop. The machine ignores every input from now on.
    SelfExcluded {
        /// The validation epoch.
        epoch: u32,
        /// The agreed failed set, which contains this rank.
        agreed: RankSet,
    },
}

/// A command of the agreement API was refused; the machine is unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AgreementError {
    /// A validation is already running here; wait for its [`Event::Decided`].
    AlreadyRunning {
        /// The running epoch.
        epoch: u32,
    },
    /// The survivors excluded this rank; it takes no further part.
    Excluded,
    /// The contribution belongs to a communicator of another size.
    WrongUniverse {
        /// Our communicator size.
        expected: u32,
        /// The set's.
        got: u32,
    },
    /// The rank is not in `0..n`, or is this rank itself.
    BadRank(Rank),
}

impl fmt::Display for AgreementError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AgreementError::AlreadyRunning { epoch } => {
                write!(f, "validation of epoch {epoch} is still running")
            }
            AgreementError::Excluded => f.write_str("this rank was agreed failed"),
            AgreementError::WrongUniverse { expected, got } => {
                write!(
                    f,
                    "rank set of a {got}-rank communicator, expected {expected}"
                )
            }
            AgreementError::BadRank(r) => write!(f, "rank {r} is out of range or self"),
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for AgreementError {}

/// The binomial tree over the ranks outside an excluded set.
#[derive(Clone, Debug)]
struct Tree {
    live: Survivors,
}

impl Tree {
    fn new(excluded: &RankSet) -> Self {
        Tree {
            live: Survivors::new(excluded),
        }
    }
    fn root(&self) -> Option<Rank> {
        self.live.old_rank(0)
    }
    fn parent(&self, r: Rank) -> Option<Rank> {
        let i = self.live.new_rank(r)?;
        if i == 0 {
            None
        } else {
            self.live.old_rank(i & (i - 1))
        }
    }
    /// Children of `r`, biggest subtree first.
    fn children(&self, r: Rank) -> Vec<Rank> {
        let Some(i) = self.live.new_rank(r) else {
            return Vec::new();
        };
        let m = u64::from(self.live.len());
        let limit = if i == 0 {
            1u64 << 32
        } else {
            1u64 << i.trailing_zeros()
        };
        let mut out = Vec::new();
        let mut step = limit >> 1;
        while step >= 1 {
            let c = u64::from(i) + step;
            if c < m {
                if let Some(old) = self.live.old_rank(c as Rank) {
                    out.push(old);
                }
            }
            step >>= 1;
        }
        out
    }
    /// Whether `a` is a proper ancestor of `r` (both participants).
    fn is_ancestor(&self, a: Rank, r: Rank) -> bool {
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
    fn is_inner(&self, r: Rank) -> bool {
        match self.live.new_rank(r) {
            Some(0) => self.live.len() > 1,
            Some(i) => i & 1 == 0 && i + 1 < self.live.len(),
            None => false,
        }
    }
}

/// What a subtree reports up in the promise reduce.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Report {
    contrib: RankSet,
    accepted: Option<(Ballot, RankSet)>,
    decided: Option<RankSet>,
    reject: Option<Ballot>,
}

impl Report {
    fn empty(n: u32) -> Self {
        Report {
            contrib: RankSet::new(n),
            accepted: None,
            decided: None,
            reject: None,
        }
    }
    fn rejection(n: u32, promised: Ballot) -> Self {
        Report {
            reject: Some(promised),
            ..Report::empty(n)
        }
    }
    fn merge(&mut self, other: Report) {
        self.contrib.union_with(&other.contrib);
        if let Some((b, v)) = other.accepted {
            if self.accepted.as_ref().is_none_or(|(mine, _)| b > *mine) {
                self.accepted = Some((b, v));
            }
        }
        if self.decided.is_none() {
            self.decided = other.decided;
        }
        self.reject = self.reject.max(other.reject);
    }
}

/// A decoded agreement frame.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Msg {
    Prepare {
        ballot: Ballot,
        excluded: RankSet,
    },
    Promise {
        ballot: Ballot,
        report: Report,
    },
    Accept {
        ballot: Ballot,
        value: RankSet,
    },
    Accepted {
        ballot: Ballot,
        reject: Option<Ballot>,
    },
    Decide {
        excluded: RankSet,
        value: RankSet,
    },
}

const HAS_ACCEPTED: u8 = 1;
const HAS_DECIDED: u8 = 2;
const HAS_REJECT: u8 = 4;

fn put_ballot(w: &mut Writer, b: Ballot) {
    w.put_varint(b.round.into());
    w.put_rank(b.coord);
}

fn read_ballot(r: &mut Reader<'_>) -> Result<Ballot, FrameError> {
    Ok(Ballot {
        round: r.varint_u32()?,
        coord: r.rank()?,
    })
}

impl Msg {
    fn kind(&self) -> FrameKind {
        match self {
            Msg::Prepare { .. } => FrameKind::AgreePrepare,
            Msg::Promise { .. } => FrameKind::AgreePromise,
            Msg::Accept { .. } => FrameKind::AgreeAccept,
            Msg::Accepted { .. } => FrameKind::AgreeAccepted,
            Msg::Decide { .. } => FrameKind::AgreeDecide,
        }
    }

    fn encode(&self, comm: u32, epoch: u32, sender: Rank) -> Vec<u8> {
        let mut w = Header {
            kind: self.kind(),
            comm,
            epoch,
            sender,
        }
        .start();
        match self {
            Msg::Prepare { ballot, excluded } => {
                put_ballot(&mut w, *ballot);
                w.put_rankset(excluded);
            }
            Msg::Promise { ballot, report } => {
                put_ballot(&mut w, *ballot);
                let flags = [
                    (report.accepted.is_some(), HAS_ACCEPTED),
                    (report.decided.is_some(), HAS_DECIDED),
                    (report.reject.is_some(), HAS_REJECT),
                ]
                .iter()
                .filter(|(present, _)| *present)
                .fold(0, |acc, (_, bit)| acc | bit);
                w.put_u8(flags);
                w.put_rankset(&report.contrib);
                if let Some((b, v)) = &report.accepted {
                    put_ballot(&mut w, *b);
                    w.put_rankset(v);
                }
                if let Some(v) = &report.decided {
                    w.put_rankset(v);
                }
                if let Some(b) = report.reject {
                    put_ballot(&mut w, b);
                }
            }
            Msg::Accept { ballot, value } => {
                put_ballot(&mut w, *ballot);
                w.put_rankset(value);
            }
            Msg::Accepted { ballot, reject } => {
                put_ballot(&mut w, *ballot);
                w.put_u8(u8::from(reject.is_some()) * HAS_REJECT);
                if let Some(b) = reject {
                    put_ballot(&mut w, *b);
                }
            }
            Msg::Decide { excluded, value } => {
                w.put_rankset(excluded);
                w.put_rankset(value);
            }
        }
        w.finish()
    }

    fn decode(kind: FrameKind, r: &mut Reader<'_>) -> Result<Msg, FrameError> {
        let msg = match kind {
            FrameKind::AgreePrepare => Msg::Prepare {
                ballot: read_ballot(r)?,
                excluded: r.rankset()?,
            },
            FrameKind::AgreePromise => {
                let ballot = read_ballot(r)?;
                let flags = r.u8()?;
                if flags & !(HAS_ACCEPTED | HAS_DECIDED | HAS_REJECT) != 0 {
                    return Err(FrameError::Malformed("unknown promise flags"));
                }
                let contrib = r.rankset()?;
                let accepted = if flags & HAS_ACCEPTED != 0 {
                    Some((read_ballot(r)?, r.rankset()?))
                } else {
                    None
                };
                let decided = if flags & HAS_DECIDED != 0 {
                    Some(r.rankset()?)
                } else {
                    None
                };
                let reject = if flags & HAS_REJECT != 0 {
                    Some(read_ballot(r)?)
                } else {
                    None
                };
                Msg::Promise {
                    ballot,
                    report: Report {
                        contrib,
                        accepted,
                        decided,
                        reject,
                    },
                }
            }
            FrameKind::AgreeAccept => Msg::Accept {
                ballot: read_ballot(r)?,
                value: r.rankset()?,
            },
            FrameKind::AgreeAccepted => {
                let ballot = read_ballot(r)?;
                let reject = match r.u8()? {
                    0 => None,
                    HAS_REJECT => Some(read_ballot(r)?),
                    _ => return Err(FrameError::Malformed("unknown accepted flags")),
                };
                Msg::Accepted { ballot, reject }
            }
            FrameKind::AgreeDecide => Msg::Decide {
                excluded: r.rankset()?,
                value: r.rankset()?,
            },
            other => return Err(FrameError::UnexpectedKind(other as u8)),
        };
        Ok(msg)
    }
}

/// Where a rank stands in the round it takes part in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
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
struct Round {
    ballot: Ballot,
    tree: Tree,
    excluded: RankSet,
    /// This rank's children in the ballot's tree (dead or not).
    children: Vec<Rank>,
    is_root: bool,
    phase: Phase,
    /// Ranks of this rank's subtree heard from in the current gather.
    heard: Vec<Rank>,
    /// Where this rank's answer of the current phase went, once sent.
    sent_to: Option<Rank>,
    report: Report,
    reject: Option<Ballot>,
}

impl Round {
    fn new(n: u32, me: Rank, ballot: Ballot, tree: Tree, excluded: RankSet) -> Self {
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
    fn hear(&mut self, me: Rank, from: Rank) -> Result<bool, FrameError> {
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
    fn reset_gather(&mut self) {
        self.heard.clear();
        self.sent_to = None;
    }

    /// Whether the subtree of `r` has answered: `r` did, or `r` is dead and all its
    /// children's subtrees have.
    fn covered(&self, r: Rank, dead: &RankSet) -> bool {
        self.heard.contains(&r)
            || (dead.contains(r)
                && self
                    .tree
                    .children(r)
                    .into_iter()
                    .all(|c| self.covered(c, dead)))
    }

    /// Whether every child's subtree has answered.
    fn gathered(&self, dead: &RankSet) -> bool {
        self.children.iter().all(|&c| self.covered(c, dead))
    }

    /// This rank's nearest live ancestor: where its answers go.
    fn up(&self, me: Rank, dead: &RankSet) -> Option<Rank> {
        let mut at = me;
        while let Some(p) = self.tree.parent(at) {
            if !dead.contains(p) {
                return Some(p);
            }
            at = p;
        }
        None
    }

    /// The live ranks below `r` whose path to `r` is all dead (`r` excluded): where a
    /// broadcast goes in place of `r`'s children.
    fn live_below(&self, r: Rank, dead: &RankSet, out: &mut Vec<Rank>) {
        for c in self.tree.children(r) {
            if dead.contains(c) {
                self.live_below(c, dead, out);
            } else {
                out.push(c);
            }
        }
    }

    /// Sends a broadcast message of this round to the live ranks below `under` (this
    /// rank for a first send; a dead child when passing on for it).
    fn send_below(&self, io: &mut Io<'_>, epoch: u32, under: Rank, msg: &Msg) {
        let mut to = Vec::new();
        self.live_below(under, io.dead, &mut to);
        for c in to {
            io.send(c, epoch, msg);
        }
    }

    /// Sends this rank's answer of the current phase to its nearest live ancestor.
    fn answer(&mut self, io: &mut Io<'_>, epoch: u32) {
        let Some(p) = self.up(io.cfg.me, io.dead) else {
            return; // every ancestor, the coordinator included, is dead: a new one takes over
        };
        let ballot = self.ballot;
        let msg = match self.phase {
            Phase::Promised => Msg::Promise {
                ballot,
                report: self.report.clone(),
            },
            Phase::Accepted => Msg::Accepted {
                ballot,
                reject: self.reject,
            },
            Phase::Promising | Phase::Accepting => return,
        };
        io.send(p, epoch, &msg);
        self.sent_to = Some(p);
    }
}

/// The agreement state of one epoch at one rank.
#[derive(Clone, Debug)]
struct Instance {
    epoch: u32,
    /// `G` of the previous epoch: round 0's excluded set, and a floor of every decision
    /// (correct peers never propose less; forged frames cannot make `G` shrink).
    base: RankSet,
    contribution: RankSet,
    promised: Ballot,
    accepted: Option<(Ballot, RankSet)>,
    round: Option<Box<Round>>,
    /// The latest ballot this rank started as coordinator.
    leading: Option<Ballot>,
    lead_failed: bool,
    max_round: u32,
    decided: Option<RankSet>,
    /// Excluded set of the last decision broadcast seen or sent.
    wave: Option<RankSet>,
    /// `|dead|` when `wave` was last checked for cuts (the check is skipped until a new
    /// failure arrives or a new wave replaces it).
    wave_checked: Option<usize>,
}

/// What an instance needs from the machine around it.
struct Io<'a> {
    cfg: &'a Config,
    dead: &'a RankSet,
    out: &'a mut VecDeque<(Rank, Vec<u8>)>,
    sent: &'a mut u64,
    /// The lowest rank not in `dead`: the coordinator in this rank's view.
    lowest_live: Rank,
}

impl Io<'_> {
    fn send(&mut self, to: Rank, epoch: u32, msg: &Msg) {
        *self.sent += 1;
        self.out
            .push_back((to, msg.encode(self.cfg.comm, epoch, self.cfg.me)));
    }
    fn coordinator(&self) -> Option<Rank> {
        (self.lowest_live < self.cfg.n).then_some(self.lowest_live)
    }
}

impl Instance {
    fn new(io: &mut Io<'_>, epoch: u32, base: RankSet, contribution: RankSet) -> Self {
        let (n, me) = (io.cfg.n, io.cfg.me);
        let c0 = Tree::new(&base).root().unwrap_or(me);
        let ballot = Ballot {
            round: 0,
            coord: c0,
        };
        let leading = (c0 == me).then_some(ballot);
        let round = Round::new(n, me, ballot, Tree::new(&base), base.clone());
        let mut inst = Instance {
            epoch,
            base,
            contribution,
            promised: ballot,
            accepted: None,
            round: Some(Box::new(round)),
            leading,
            lead_failed: false,
            max_round: 0,
            decided: None,
            wave: None,
            wave_checked: None,
        };
        inst.maybe_finish_gather(io);
        inst
    }

    /// The value this rank holds for the epoch: decided, or else the accepted one.
    fn holds(&self) -> Option<&RankSet> {
        self.decided
            .as_ref()
            .or(self.accepted.as_ref().map(|(_, v)| v))
    }

    fn handle(&mut self, io: &mut Io<'_>, from: Rank, msg: Msg) -> Result<(), FrameError> {
        let me = io.cfg.me;
        match msg {
            Msg::Prepare { ballot, excluded } => {
                if ballot.round == 0 {
                    return Err(FrameError::Malformed("prepare of round 0"));
                }
                let tree = Tree::new(&excluded);
                if tree.root() != Some(ballot.coord) {
                    return Err(FrameError::Malformed("coordinator is not the tree root"));
                }
                if !tree.is_ancestor(from, me) {
                    return Err(FrameError::Malformed("prepare not from a tree ancestor"));
                }
                self.max_round = self.max_round.max(ballot.round);
                if ballot < self.promised {
                    let report = Report::rejection(io.cfg.n, self.promised);
                    io.send(from, self.epoch, &Msg::Promise { ballot, report });
                    return Ok(());
                }
                if ballot == self.promised {
                    return Ok(()); // duplicate
                }
                self.promised = ballot;
                self.begin_round(io, ballot, tree, excluded);
            }
            Msg::Promise { ballot, report } => {
                self.max_round = self.max_round.max(report.reject.map_or(0, |b| b.round));
                let Some(round) = self.round.as_mut() else {
                    return Ok(());
                };
                if round.ballot != ballot || round.phase != Phase::Promising {
                    return Ok(()); // an abandoned round
                }
                if round.hear(me, from)? {
                    round.report.merge(report);
                }
                self.maybe_finish_gather(io);
            }
            Msg::Accept { ballot, value } => {
                if ballot < self.promised {
                    let msg = Msg::Accepted {
                        ballot,
                        reject: Some(self.promised),
                    };
                    io.send(from, self.epoch, &msg);
                    return Ok(());
                }
                let Some(round) = self.round.as_mut() else {
                    if ballot == self.promised {
                        return Ok(()); // a round this rank already finished
                    }
                    return Err(FrameError::Malformed("accept without a promise"));
                };
                if round.ballot != ballot || !round.tree.is_ancestor(from, me) {
                    return Err(FrameError::Malformed("accept outside the promised round"));
                }
                if round.phase != Phase::Promised {
                    return Ok(()); // duplicate
                }
                self.accept_and_forward(io, ballot, value);
            }
            Msg::Accepted { ballot, reject } => {
                self.max_round = self.max_round.max(reject.map_or(0, |b| b.round));
                let Some(round) = self.round.as_mut() else {
                    return Ok(());
                };
                if round.ballot != ballot || round.phase != Phase::Accepting {
                    return Ok(());
                }
                if round.hear(me, from)? {
                    round.reject = round.reject.max(reject);
                }
                self.maybe_finish_gather(io);
            }
            Msg::Decide {
                excluded,
                mut value,
            } => {
                value.union_with(&self.base);
                let tree = Tree::new(&excluded);
                if tree.parent(me) != Some(from) {
                    return Err(FrameError::Malformed("decision not from the tree parent"));
                }
                for c in tree.children(me) {
                    let msg = Msg::Decide {
                        excluded: excluded.clone(),
                        value: value.clone(),
                    };
                    io.send(c, self.epoch, &msg);
                }
                self.wave = Some(excluded);
                self.wave_checked = None;
                if self.decided.is_none() {
                    self.decided = Some(value);
                    self.compact();
                }
            }
        }
        Ok(())
    }

    /// Completes the current gather once every child has answered.
    fn maybe_finish_gather(&mut self, io: &mut Io<'_>) {
        let Some(round) = self.round.as_mut() else {
            return;
        };
        if matches!(round.phase, Phase::Promised | Phase::Accepted) || !round.gathered(io.dead) {
            return;
        }
        let ballot = round.ballot;
        match round.phase {
            Phase::Promising => {
                round.phase = Phase::Promised;
                let mut own = Report {
                    contrib: self.contribution.clone(),
                    accepted: self.accepted.clone(),
                    decided: self.decided.clone(),
                    reject: None,
                };
                own.contrib.union_with(io.dead);
                round.report.merge(own);
                if round.is_root {
                    self.propose(io);
                } else {
                    round.answer(io, self.epoch);
                }
            }
            Phase::Accepting => {
                round.phase = Phase::Accepted;
                if !round.is_root {
                    round.answer(io, self.epoch);
                    return;
                }
                let rejected = round.reject.is_some() || self.promised != ballot;
                match (&self.accepted, rejected, &self.decided) {
                    (_, _, Some(_)) => {}
                    (_, true, None) => self.lead_failed = true,
                    (Some((b, v)), false, None) if *b == ballot => {
                        let v = v.clone();
                        self.decide_and_broadcast(io, v);
                    }
                    _ => self.lead_failed = true,
                }
            }
            Phase::Promised | Phase::Accepted => {}
        }
    }

    /// The coordinator's step once its promise reduce is complete.
    fn propose(&mut self, io: &mut Io<'_>) {
        let Some(round) = self.round.as_mut() else {
            return;
        };
        if self.decided.is_some() {
            return;
        }
        let ballot = round.ballot;
        if round.report.reject.is_some() || self.promised != ballot {
            self.max_round = self
                .max_round
                .max(round.report.reject.map_or(0, |b| b.round));
            self.lead_failed = true;
            return;
        }
        if let Some(v) = round.report.decided.clone() {
            self.decide_and_broadcast(io, v);
            return;
        }
        let value = match &round.report.accepted {
            Some((_, v)) => v.clone(),
            None => {
                let mut v = round.report.contrib.clone();
                v.union_with(io.dead);
                v.union_with(&round.excluded);
                v
            }
        };
        self.accept_and_forward(io, ballot, value);
    }

    /// Accepts `value` in the current round (ballot `ballot`), passes the accept on to
    /// this rank's children and starts gathering their acknowledgements.
    fn accept_and_forward(&mut self, io: &mut Io<'_>, ballot: Ballot, value: RankSet) {
        let Some(round) = self.round.as_mut() else {
            return;
        };
        round.phase = Phase::Accepting;
        round.reset_gather();
        self.accepted = Some((ballot, value));
        self.pass_down(io, io.cfg.me);
        self.maybe_finish_gather(io);
    }

    /// Decides `value` (with the previous `G`) and broadcasts the decision over the ranks
    /// this rank believes alive.
    fn decide_and_broadcast(&mut self, io: &mut Io<'_>, mut value: RankSet) {
        value.union_with(&self.base);
        let excluded = io.dead.clone();
        let tree = Tree::new(&excluded);
        for c in tree.children(io.cfg.me) {
            let msg = Msg::Decide {
                excluded: excluded.clone(),
                value: value.clone(),
            };
            io.send(c, self.epoch, &msg);
        }
        self.wave = Some(excluded);
        self.wave_checked = None;
        self.decided = Some(value);
        self.compact();
    }

    /// Frees what a decided rank no longer needs: its finished round (a round still
    /// waiting for an accept or for children stays, its coordinator counts on it), its
    /// contribution and accepted value (its promises now carry the decision instead).
    fn compact(&mut self) {
        let finished = self
            .round
            .as_ref()
            .is_some_and(|r| r.is_root || r.phase == Phase::Accepted);
        if finished {
            self.round = None;
        }
        self.leading = None;
        self.accepted = None;
        self.contribution.clear();
    }

    /// The coordinator's duties: (re)start rounds until decided, then repair decision
    /// broadcasts cut by failures.
    fn drive(&mut self, io: &mut Io<'_>) {
        if io.coordinator() != Some(io.cfg.me) {
            return;
        }
        if let Some(value) = &self.decided {
            if self.wave_checked == Some(io.dead.len()) {
                return;
            }
            self.wave_checked = Some(io.dead.len());
            let cut = self.wave.as_ref().is_none_or(|w| {
                let tree = Tree::new(w);
                io.dead.difference(w).any(|r| tree.is_inner(r))
            });
            if cut {
                let value = value.clone();
                self.decide_and_broadcast(io, value);
            }
            return;
        }
        // A death inside the round is repaired in place (see [`Round`]); only a round
        // of somebody else (this rank just became coordinator) or a rejected one needs
        // a new ballot.
        if self.leading.is_some() && !self.lead_failed {
            return;
        }
        let ballot = Ballot {
            round: self.max_round.max(self.promised.round).saturating_add(1),
            coord: io.cfg.me,
        };
        self.max_round = ballot.round;
        self.promised = ballot;
        self.lead_failed = false;
        let excluded = io.dead.clone();
        self.leading = Some(ballot);
        self.begin_round(io, ballot, Tree::new(&excluded), excluded);
    }

    /// Takes part in ballot `ballot` (round ≥ 1) over the tree of the ranks outside
    /// `excluded`: passes the prepare on below and starts gathering promises.
    fn begin_round(&mut self, io: &mut Io<'_>, ballot: Ballot, tree: Tree, excluded: RankSet) {
        let round = Round::new(io.cfg.n, io.cfg.me, ballot, tree, excluded);
        self.round = Some(Box::new(round));
        self.pass_down(io, io.cfg.me);
        self.maybe_finish_gather(io);
    }

    /// The running round's broadcast of its current phase, as this rank passes it on:
    /// the prepare (rounds ≥ 1) while promises gather, the accepted value after.
    fn down_message(&self) -> Option<Msg> {
        let round = self.round.as_ref()?;
        match round.phase {
            Phase::Promising | Phase::Promised if round.ballot.round > 0 => Some(Msg::Prepare {
                ballot: round.ballot,
                excluded: round.excluded.clone(),
            }),
            Phase::Accepting | Phase::Accepted => self
                .accepted
                .as_ref()
                .filter(|(b, _)| *b == round.ballot)
                .map(|(b, v)| Msg::Accept {
                    ballot: *b,
                    value: v.clone(),
                }),
            _ => None,
        }
    }

    /// Sends [`Instance::down_message`] to the live ranks below `under`.
    fn pass_down(&self, io: &mut Io<'_>, under: Rank) {
        if let (Some(round), Some(msg)) = (self.round.as_ref(), self.down_message()) {
            round.send_below(io, self.epoch, under, &msg);
        }
    }

    /// Repairs this rank's part of the running round around the newly dead `dead`: the
    /// round's broadcast goes on to the live ranks `dead` left without a parent (when
    /// this rank is their nearest live ancestor), this rank's answer goes again to its
    /// new nearest live ancestor (when `dead` held it), and the gather may now be
    /// complete. Repeats are harmless: receivers ignore a broadcast or an answer they
    /// already have.
    fn on_death(&mut self, io: &mut Io<'_>, dead: Rank) {
        let me = io.cfg.me;
        let Some(round) = self.round.as_ref() else {
            return;
        };
        if round.tree.is_ancestor(me, dead) && round.up(dead, io.dead) == Some(me) {
            self.pass_down(io, dead);
        }
        let Some(round) = self.round.as_mut() else {
            return;
        };
        if round.sent_to.is_some_and(|to| io.dead.contains(to)) {
            round.answer(io, self.epoch);
        }
        self.maybe_finish_gather(io);
    }
}

/// One rank's `validate_global` agreement machine for one communicator.
///
/// Inputs: [`Agreement::start`] (the application), [`Agreement::on_rank_failed`] (the
/// detector), [`Protocol::handle_message`] (peers). Outputs: [`Protocol::poll_transmit`]
/// and [`Protocol::poll_event`]; drain both after every input.
#[derive(Clone, Debug)]
pub struct Agreement {
    cfg: Config,
    dead: RankSet,
    cur: Option<Box<Instance>>,
    prev: Option<Box<Instance>>,
    /// Epochs whose decision was already reported.
    reported: u32,
    buffered: VecDeque<(Rank, u32, Msg)>,
    out: VecDeque<(Rank, Vec<u8>)>,
    events: VecDeque<Event>,
    excluded: bool,
    sent: u64,
    lowest_live: Rank,
}

impl Agreement {
    /// A machine for `cfg.me`; no validation runs until [`Agreement::start`].
    pub fn new(cfg: Config) -> Self {
        Agreement {
            dead: RankSet::new(cfg.n),
            cfg,
            cur: None,
            prev: None,
            reported: 0,
            buffered: VecDeque::new(),
            out: VecDeque::new(),
            events: VecDeque::new(),
            excluded: false,
            sent: 0,
            lowest_live: 0,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }
    /// The latest epoch started here (0 before the first validation).
    pub fn epoch(&self) -> u32 {
        self.cur.as_ref().map_or(0, |i| i.epoch)
    }
    /// Whether a validation is running (started and not decided).
    pub fn is_running(&self) -> bool {
        self.cur.as_ref().is_some_and(|i| i.decided.is_none())
    }
    /// Whether the survivors excluded this rank.
    pub fn is_excluded(&self) -> bool {
        self.excluded
    }
    /// Ranks this machine treats as dead: detector reports and agreed sets.
    pub fn known_dead(&self) -> &RankSet {
        &self.dead
    }
    /// Frames queued so far (for cost accounting).
    pub fn frames_sent(&self) -> u64 {
        self.sent
    }
    /// The decision of `epoch`, if this rank still keeps it (current or previous epoch).
    pub fn decided(&self, epoch: u32) -> Option<&RankSet> {
        self.instance(epoch).and_then(|i| i.decided.as_ref())
    }
    /// The value this rank holds for `epoch`: its decision, or else the value it accepted
    /// at its highest ballot. Used to check knowledge in tests.
    pub fn holds(&self, epoch: u32) -> Option<&RankSet> {
        self.instance(epoch).and_then(Instance::holds)
    }
    /// Whether this rank currently acts as coordinator of a round of the running epoch.
    pub fn is_coordinating(&self) -> bool {
        self.cur
            .as_deref()
            .and_then(|i| i.round.as_ref())
            .is_some_and(|r| r.is_root)
    }

    fn instance(&self, epoch: u32) -> Option<&Instance> {
        [self.cur.as_deref(), self.prev.as_deref()]
            .into_iter()
            .flatten()
            .find(|i| i.epoch == epoch)
    }

    /// The application's `validate_global` at this rank: starts the next epoch with
    /// `contribution` (`L_i`; ranks reported through [`Agreement::on_rank_failed`] are added).
    pub fn start(&mut self, now: Instant, contribution: &RankSet) -> Result<u32, AgreementError> {
        let _ = now;
        if self.excluded {
            return Err(AgreementError::Excluded);
        }
        if contribution.universe() != self.cfg.n {
            return Err(AgreementError::WrongUniverse {
                expected: self.cfg.n,
                got: contribution.universe(),
            });
        }
        if let Some(cur) = &self.cur {
            if cur.decided.is_none() {
                return Err(AgreementError::AlreadyRunning { epoch: cur.epoch });
            }
        }
        let base = match &self.cur {
            Some(cur) => cur
                .decided
                .clone()
                .unwrap_or_else(|| RankSet::new(self.cfg.n)),
            None => RankSet::new(self.cfg.n),
        };
        let epoch = self.epoch() + 1;
        let mut contribution = contribution.clone();
        contribution.remove(self.cfg.me);
        self.prev = self.cur.take();
        let (mut io, _) = self.parts();
        let instance = Instance::new(&mut io, epoch, base, contribution);
        self.cur = Some(Box::new(instance));
        let early: Vec<_> = self.buffered.drain(..).collect();
        for (from, ep, msg) in early {
            if self.dead.contains(from) {
                continue;
            }
            let _ = self.dispatch(from, ep, msg);
        }
        self.after_input();
        Ok(epoch)
    }

    /// The failure detector declared `rank` dead (final). Its frames are refused from now
    /// on, and the agreement routes around it.
    pub fn on_rank_failed(&mut self, now: Instant, rank: Rank) -> Result<(), AgreementError> {
        let _ = now;
        if rank >= self.cfg.n || rank == self.cfg.me {
            return Err(AgreementError::BadRank(rank));
        }
        if self.excluded || !self.dead.insert(rank) {
            return Ok(());
        }
        self.advance_lowest_live();
        let (mut io, instances) = self.parts();
        for inst in instances.into_iter().flatten() {
            inst.on_death(&mut io, rank);
        }
        self.after_input();
        Ok(())
    }

    /// The epochs' instances and the I/O bundle they share.
    fn parts(&mut self) -> (Io<'_>, [Option<&mut Instance>; 2]) {
        let io = Io {
            cfg: &self.cfg,
            dead: &self.dead,
            out: &mut self.out,
            sent: &mut self.sent,
            lowest_live: self.lowest_live,
        };
        (io, [self.cur.as_deref_mut(), self.prev.as_deref_mut()])
    }

    fn advance_lowest_live(&mut self) {
        while self.dead.contains(self.lowest_live) {
            self.lowest_live += 1;
        }
    }

    /// Feeds a frame whose header was already decoded and checked against this
    /// agreement's communicator (by a layer that dispatches on [`FrameKind::family`]);
    /// `reader` is positioned after the header.
    pub fn handle_frame(
        &mut self,
        _now: Instant,
        header: &Header,
        mut reader: Reader<'_>,
    ) -> Result<(), FrameError> {
        if header.kind.family() != "agree" {
            return Err(FrameError::UnexpectedKind(header.kind as u8));
        }
        let from = header.sender;
        let msg = Msg::decode(header.kind, &mut reader)?;
        reader.finish()?;
        if self.dead.contains(from) {
            return Err(FrameError::FromFailedRank(from));
        }
        if from == self.cfg.me {
            return Err(FrameError::Malformed("frame from self"));
        }
        if self.excluded {
            return Ok(());
        }
        self.dispatch(from, header.epoch, msg)?;
        self.after_input();
        Ok(())
    }

    fn dispatch(&mut self, from: Rank, epoch: u32, msg: Msg) -> Result<(), FrameError> {
        let (mut io, instances) = self.parts();
        for inst in instances.into_iter().flatten() {
            if inst.epoch == epoch {
                return inst.handle(&mut io, from, msg);
            }
        }
        let current = self.epoch();
        let next = current + 1;
        if epoch == next {
            if self.buffered.len() >= self.cfg.max_buffered {
                return Err(FrameError::FutureEpoch {
                    current,
                    got: epoch,
                });
            }
            self.buffered.push_back((from, epoch, msg));
            Ok(())
        } else if epoch > next {
            Err(FrameError::FutureEpoch {
                current,
                got: epoch,
            })
        } else {
            Err(FrameError::StaleEpoch {
                current,
                got: epoch,
            })
        }
    }

    /// Runs the coordinator duties and turns fresh decisions into events.
    fn after_input(&mut self) {
        if self.excluded {
            return;
        }
        let (mut io, instances) = self.parts();
        for inst in instances.into_iter().flatten() {
            inst.drive(&mut io);
        }
        let Some(cur) = &self.cur else {
            return;
        };
        let Some(agreed) = &cur.decided else {
            return;
        };
        if self.reported >= cur.epoch {
            return;
        }
        self.reported = cur.epoch;
        let epoch = cur.epoch;
        let agreed = agreed.clone();
        if agreed.contains(self.cfg.me) {
            self.excluded = true;
            self.events.push_back(Event::SelfExcluded { epoch, agreed });
            return;
        }
        // Fail-stop: agreed-dead ranks are dead here too.
        let grew = self.dead.union_with(&agreed) > 0;
        self.advance_lowest_live();
        self.events.push_back(Event::Decided { epoch, agreed });
        if grew {
            self.after_input();
        }
    }
}

impl Protocol for Agreement {
    type Event = Event;

    fn handle_message(&mut self, now: Instant, from: Rank, bytes: &[u8]) -> Result<(), FrameError> {
        let ctx = Context {
            comm: self.cfg.comm,
            n: self.cfg.n,
        };
        let (header, reader) = Header::decode(bytes, ctx, from)?;
        self.handle_frame(now, &header, reader)
    }

    fn handle_timeout(&mut self, _now: Instant) {}

    fn poll_transmit(&mut self, _now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        let (to, frame) = self.out.pop_front()?;
        let len = wire::copy_out(&frame, buf);
        Some(Transmit { to, len })
    }

    fn poll_timeout(&self) -> Option<Instant> {
        None
    }

    fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_is_binomial_over_the_live_ranks() {
        let excluded = RankSet::from_ranks(10, [0, 4]);
        let t = Tree::new(&excluded);
        // Live: 1 2 3 5 6 7 8 9 -> indices 0..8.
        assert_eq!(t.root(), Some(1));
        assert_eq!(t.children(1), [6, 3, 2]);
        assert_eq!(t.children(6), [8, 7]);
        assert_eq!(t.children(3), [5]);
        assert_eq!(t.parent(7), Some(6));
        assert_eq!(t.parent(9), Some(8));
        assert_eq!(t.parent(4), None);
        assert!(t.is_inner(1) && t.is_inner(6) && t.is_inner(3) && t.is_inner(8));
        assert!(!t.is_inner(2) && !t.is_inner(5) && !t.is_inner(7) && !t.is_inner(9));
        for r in [2, 3, 5, 6, 7, 8, 9] {
            let p = t.parent(r).unwrap();
            assert!(t.children(p).contains(&r));
            assert_eq!(t.is_inner(r), !t.children(r).is_empty());
        }
    }

    #[test]
    fn trees_span_every_live_rank_with_logarithmic_depth() {
        for n in 1u32..=70 {
            for mask in [0u64, 1, 0b1011, 0x0f0f_0f0f, u64::MAX >> 3] {
                let excluded = RankSet::from_ranks(n, (0..n).filter(|r| mask >> (r % 64) & 1 == 1));
                let t = Tree::new(&excluded);
                let live: Vec<Rank> = (0..n).filter(|r| !excluded.contains(*r)).collect();
                let m = live.len() as u32;
                assert_eq!(t.root(), live.first().copied());
                let mut edges = 0;
                for &r in &live {
                    let kids = t.children(r);
                    assert_eq!(t.is_inner(r), !kids.is_empty());
                    edges += kids.len();
                    for &c in &kids {
                        assert_eq!(t.parent(c), Some(r));
                    }
                    let mut depth = 0;
                    let mut at = r;
                    while let Some(p) = t.parent(at) {
                        at = p;
                        depth += 1;
                    }
                    assert_eq!(Some(at), t.root());
                    assert!(depth <= 32 - m.saturating_sub(1).leading_zeros());
                }
                assert_eq!(edges as u32, m.saturating_sub(1));
            }
        }
    }

    #[test]
    fn frames_round_trip() {
        let n = 300;
        let set = |v: &[u32]| RankSet::from_ranks(n, v.iter().copied());
        let b = Ballot { round: 7, coord: 3 };
        let msgs = [
            Msg::Prepare {
                ballot: b,
                excluded: set(&[0, 1, 2]),
            },
            Msg::Promise {
                ballot: b,
                report: Report {
                    contrib: set(&[9]),
                    accepted: Some((Ballot { round: 2, coord: 0 }, set(&[1, 299]))),
                    decided: Some(set(&[])),
                    reject: Some(Ballot { round: 9, coord: 1 }),
                },
            },
            Msg::Promise {
                ballot: b,
                report: Report::empty(n),
            },
            Msg::Accept {
                ballot: b,
                value: set(&[5]),
            },
            Msg::Accepted {
                ballot: b,
                reject: None,
            },
            Msg::Decide {
                excluded: set(&[]),
                value: set(&(0..200).collect::<Vec<_>>()),
            },
        ];
        for m in msgs {
            let bytes = m.encode(4, 2, 11);
            let (h, mut r) = Header::decode(&bytes, Context { comm: 4, n }, 11).unwrap();
            assert_eq!(h.epoch, 2);
            assert_eq!(Msg::decode(h.kind, &mut r).unwrap(), m);
            r.finish().unwrap();
        }
    }
}
