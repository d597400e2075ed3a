//! The agreement state of one epoch at one rank: ballots, the running round, the
//! decision and its broadcast.

use alloc::boxed::Box;
use alloc::collections::VecDeque;
use alloc::sync::Arc;

use super::msg::{Msg, Out, Report};
use super::round::{Phase, Round, Tree};
use super::sweep::{self, FastPath, Progress};
use super::{Ballot, Config};
use crate::error::FrameError;
use crate::rank::Rank;
use crate::rankset::{Members, RankSet};
use crate::shrink::Survivors;

/// The agreement state of one epoch at one rank.
#[derive(Clone, Debug)]
pub(super) struct Instance {
    pub(super) epoch: u32,
    /// `G` of the previous epoch: round 0's excluded set, and a floor of every decision
    /// (correct peers never propose less; forged frames cannot make `G` shrink).
    pub(super) base: RankSet,
    pub(super) contribution: RankSet,
    /// The epoch's participants `C \ base`, numbered in rank order.
    pub(super) participants: Survivors,
    /// Round 0's fast path as this rank laid it out at its call; `None` when the epoch
    /// runs the tree path (too many participants, see [`Config::sweep_limit`]), so the
    /// tree path carries nothing of it.
    pub(super) path: Option<Box<FastPath>>,
    pub(super) promised: Ballot,
    pub(super) accepted: Option<(Ballot, RankSet)>,
    pub(super) round: Option<Box<Round>>,
    /// The latest ballot this rank started as coordinator.
    pub(super) leading: Option<Ballot>,
    pub(super) lead_failed: bool,
    pub(super) max_round: u32,
    pub(super) decided: Option<RankSet>,
    /// The last decision broadcast seen or sent.
    pub(super) wave: Option<Wave>,
    /// `|dead|` when `wave` was last checked for cuts (the check is skipped until a new
    /// failure arrives or a new wave replaces it).
    pub(super) wave_checked: Option<usize>,
}

/// How the decision this rank knows of reached the participants.
#[derive(Clone, Debug)]
pub(super) enum Wave {
    /// A decision broadcast over the tree of the ranks outside this excluded set.
    Tree(Arc<RankSet>),
    /// The fast path: every participant decides when it finishes sweep 2, so any
    /// participant death may leave some of them waiting.
    Sweeps,
}

/// What an instance needs from the machine around it.
pub(super) struct Io<'a> {
    pub(super) cfg: &'a Config,
    pub(super) dead: &'a RankSet,
    pub(super) out: &'a mut VecDeque<(Rank, u32, Out)>,
    pub(super) sent: &'a mut u64,
    /// The lowest rank not in `dead`: the coordinator in this rank's view.
    pub(super) lowest_live: Rank,
    /// An empty set, shared by every sweep frame of an empty exclusion (made by the
    /// first epoch on the fast path).
    pub(super) empty: Option<&'a Arc<RankSet>>,
}

impl Io<'_> {
    /// Queues `msg` for `to`; it is encoded only when `poll_transmit` takes it.
    pub(super) fn send(&mut self, to: Rank, epoch: u32, msg: Out) {
        *self.sent += 1;
        self.out.push_back((to, epoch, msg));
    }
    pub(super) fn coordinator(&self) -> Option<Rank> {
        (self.lowest_live < self.cfg.n).then_some(self.lowest_live)
    }
}

impl Instance {
    pub(super) fn new(io: &mut Io<'_>, epoch: u32, base: RankSet, contribution: RankSet) -> Self {
        let (n, me) = (io.cfg.n, io.cfg.me);
        let participants = Survivors::new(&base);
        let m = participants.len();
        let c0 = participants.old_rank(0).unwrap_or(me);
        let ballot = Ballot {
            round: 0,
            coord: c0,
        };
        let sweeping = m <= io.cfg.sweep_limit;
        let (leading, round) = if sweeping {
            (None, None)
        } else {
            let round = Round::new(n, me, ballot, Tree::new(&base), Arc::new(base.clone()));
            ((c0 == me).then_some(ballot), Some(Box::new(round)))
        };
        // The deaths known here at the call, beyond `base`: this rank's sweeps skip them.
        let path = sweeping.then(|| {
            let mut excluded = io.dead.clone();
            excluded.difference_with(&base);
            Box::new(FastPath::new(me, &base, excluded, &contribution, io.empty))
        });
        let mut inst = Instance {
            epoch,
            base,
            contribution,
            participants,
            path,
            promised: ballot,
            accepted: None,
            round,
            leading,
            lead_failed: false,
            max_round: 0,
            decided: None,
            wave: None,
            wave_checked: None,
        };
        inst.maybe_finish_gather(io);
        inst.advance_sweeps(io);
        inst
    }

    /// Moves the fast path forward: sends what is due, accepts `U` at ballot 0 when
    /// sweep 1 finishes, decides when sweep 2 does.
    fn advance_sweeps(&mut self, io: &mut Io<'_>) {
        loop {
            let Some(path) = self.path.as_deref_mut() else {
                return;
            };
            let Some(fast) = path.fast.as_mut() else {
                return;
            };
            match fast.advance(io, &path.sweepers, &path.excluded, self.epoch) {
                Progress::Waiting => return,
                Progress::FirstDone => {
                    let mut value = fast.union().clone();
                    value.union_with(&self.base);
                    // Still promised ballot 0: a promise of a higher one drops `fast`.
                    self.accepted = Some((self.promised, value));
                }
                Progress::SecondDone => {
                    self.leave_fast_path();
                    let Some((_, value)) = self.accepted.take() else {
                        return; // unreachable: sweep 1 finished first
                    };
                    if self.decided.is_none() {
                        self.wave = Some(Wave::Sweeps);
                        self.wave_checked = None;
                        self.decided = Some(value);
                    }
                    self.compact();
                    return;
                }
            }
        }
    }

    /// Leaves the fast path for good: no sweep frame is sent from now on.
    fn leave_fast_path(&mut self) {
        if let Some(path) = self.path.as_mut() {
            path.fast = None;
        }
    }

    /// The value this rank holds for the epoch: decided, or else the accepted one.
    pub(super) fn holds(&self) -> Option<&RankSet> {
        self.decided
            .as_ref()
            .or(self.accepted.as_ref().map(|(_, v)| v))
    }

    /// A sweep-1 frame of round `round`, its sets decoded ([`Msg::Sweep`]) or still in
    /// the frame ([`crate::wire::RankSetRef`]): nothing is allocated unless the frame
    /// brings news (a new member for the union, or an exclusion unlike this rank's).
    pub(super) fn hear_sweep(
        &mut self,
        io: &mut Io<'_>,
        from: Rank,
        round: u32,
        excluded: &impl Members,
        union: &impl Members,
    ) -> Result<(), FrameError> {
        let me = io.cfg.me;
        let Some(path) = self.path.as_mut() else {
            // The tree path: no sweep round exists.
            sweep::check_sender(&self.participants, 0, me, from, round)?;
            return Ok(());
        };
        if path.excluded.same_members(excluded) {
            path.check_sender(me, from, round)?;
        } else {
            sweep::check_foreign(&self.base, excluded, me, from, round)?;
            // The mutation counts a frame of another exclusion whenever its sender
            // happens to be this rank's own peer for that round.
            let counted = io.cfg.drop_exclusion_check && path.check_sender(me, from, round).is_ok();
            if !counted {
                path.fast = None;
                path.views_differ = true;
                return Ok(());
            }
        }
        if let Some(fast) = path.fast.as_mut() {
            fast.hear_first(round, union);
            self.advance_sweeps(io);
        }
        Ok(())
    }

    pub(super) fn handle(
        &mut self,
        io: &mut Io<'_>,
        from: Rank,
        msg: Msg,
    ) -> Result<(), FrameError> {
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
                if self.path.is_some() && io.dead.contains(ballot.coord) {
                    // A ballot whose coordinator is dead can never be decided; promising
                    // it would only take this rank off the fast path, where the live
                    // coordinator may wait for it. (The tree path keeps its old rule.)
                    return Ok(());
                }
                if ballot < self.promised {
                    let report = Arc::new(Report::rejection(io.cfg.n, self.promised));
                    io.send(from, self.epoch, Msg::Promise { ballot, report });
                    return Ok(());
                }
                if ballot == self.promised {
                    return Ok(()); // duplicate
                }
                self.promised = ballot;
                self.begin_round(io, ballot, tree, Arc::new(excluded));
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
                if self.path.is_some() && io.dead.contains(ballot.coord) {
                    return Ok(()); // see the prepare: its prepare may have been ignored
                }
                if ballot < self.promised {
                    let msg = Msg::Accepted {
                        ballot,
                        reject: Some(self.promised),
                    };
                    io.send(from, self.epoch, msg);
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
            Msg::Sweep {
                round,
                excluded,
                union,
            } => self.hear_sweep(io, from, round, &excluded, &union)?,
            Msg::SweepDone { round } => {
                match self.path.as_ref() {
                    Some(path) => path.check_sender(me, from, round)?,
                    None => sweep::check_sender(&self.participants, 0, me, from, round)?,
                }
                if let Some(fast) = self.path.as_mut().and_then(|p| p.fast.as_mut()) {
                    fast.hear_second(round);
                    self.advance_sweeps(io);
                }
            }
            Msg::SweepLeft => {
                if self.path.is_none() {
                    return Err(FrameError::Malformed("fast-path notice on the tree path"));
                }
                // Only the coordinator acts: it leaves and starts ballot 1 (`drive`).
                if io.coordinator() == Some(me) {
                    self.leave_fast_path();
                }
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
                let excluded = Arc::new(excluded);
                self.broadcast_decision(io, &tree, &excluded, &value);
                self.wave = Some(Wave::Tree(excluded));
                self.wave_checked = None;
                self.leave_fast_path();
                if self.decided.is_none() {
                    self.decided = Some(value);
                    self.compact();
                }
            }
        }
        Ok(())
    }

    /// Completes the current gather once every child has answered.
    pub(super) fn maybe_finish_gather(&mut self, io: &mut Io<'_>) {
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
                    // The fast-path rule: a finished sweep 1 is an acceptance at ballot 0.
                    // The mutation switch hides it, to show the rule is needed.
                    accepted: self
                        .accepted
                        .clone()
                        .filter(|(b, _)| b.round > 0 || !io.cfg.drop_fast_rule),
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
    pub(super) fn propose(&mut self, io: &mut Io<'_>) {
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
    pub(super) fn accept_and_forward(&mut self, io: &mut Io<'_>, ballot: Ballot, value: RankSet) {
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
    pub(super) fn decide_and_broadcast(&mut self, io: &mut Io<'_>, mut value: RankSet) {
        value.union_with(&self.base);
        let excluded = Arc::new(io.dead.clone());
        let tree = Tree::new(&excluded);
        self.broadcast_decision(io, &tree, &excluded, &value);
        self.wave = Some(Wave::Tree(excluded));
        self.wave_checked = None;
        self.leave_fast_path();
        self.decided = Some(value);
        self.compact();
    }

    /// Passes the decision `value` on to this rank's children in `tree`; they share one
    /// copy of the body.
    fn broadcast_decision(
        &self,
        io: &mut Io<'_>,
        tree: &Tree,
        excluded: &Arc<RankSet>,
        value: &RankSet,
    ) {
        let children = tree.children(io.cfg.me);
        if children.is_empty() {
            return;
        }
        let value = Arc::new(value.clone());
        for c in children {
            let msg = Msg::Decide {
                excluded: Arc::clone(excluded),
                value: Arc::clone(&value),
            };
            io.send(c, self.epoch, msg);
        }
    }

    /// Frees what a decided rank no longer needs: its finished round (a round still
    /// waiting for an accept or for children stays, its coordinator counts on it), its
    /// contribution and accepted value (its promises now carry the decision instead).
    pub(super) fn compact(&mut self) {
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
    pub(super) fn drive(&mut self, io: &mut Io<'_>) {
        if let Some(path) = self.path.as_mut().filter(|p| p.views_differ) {
            // Tell the coordinator, and again each time another rank becomes it: it may
            // still wait on a sweep that cannot finish.
            let coordinator = io.coordinator().filter(|&c| c != io.cfg.me);
            if let Some(c) = coordinator.filter(|_| self.decided.is_none()) {
                if path.told != Some(c) {
                    path.told = Some(c);
                    io.send(c, self.epoch, Msg::SweepLeft);
                }
            }
        }
        if io.coordinator() != Some(io.cfg.me) {
            return;
        }
        if let Some(value) = &self.decided {
            if self.wave_checked == Some(io.dead.len()) {
                return;
            }
            self.wave_checked = Some(io.dead.len());
            let cut = match &self.wave {
                None => true,
                Some(Wave::Tree(w)) => {
                    let tree = Tree::new(w);
                    io.dead.difference(w).any(|r| tree.is_inner(r))
                }
                Some(Wave::Sweeps) => io
                    .dead
                    .difference(&self.base)
                    .any(|r| !self.path.as_ref().is_some_and(|p| p.excluded.contains(r))),
            };
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
        // The fast path runs and no participant is known dead here: nothing to repair.
        if self.path.as_ref().is_some_and(|p| p.fast.is_some()) {
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
        self.begin_round(io, ballot, Tree::new(&excluded), Arc::new(excluded));
    }

    /// Takes part in ballot `ballot` (round ≥ 1) over the tree of the ranks outside
    /// `excluded`: passes the prepare on below and starts gathering promises.
    pub(super) fn begin_round(
        &mut self,
        io: &mut Io<'_>,
        ballot: Ballot,
        tree: Tree,
        excluded: Arc<RankSet>,
    ) {
        // Promising a ballot ≥ 1 leaves the fast path for good: no sweep frame follows.
        self.leave_fast_path();
        let round = Round::new(io.cfg.n, io.cfg.me, ballot, tree, excluded);
        self.round = Some(Box::new(round));
        self.pass_down(io, io.cfg.me);
        self.maybe_finish_gather(io);
    }

    /// The running round's broadcast of its current phase, as this rank passes it on:
    /// the prepare (rounds ≥ 1) while promises gather, the accepted value after.
    /// Its body is built once per call and shared by every receiver.
    pub(super) fn down_message(&self) -> Option<Out> {
        let round = self.round.as_ref()?;
        match round.phase {
            Phase::Promising | Phase::Promised if round.ballot.round > 0 => Some(Msg::Prepare {
                ballot: round.ballot,
                excluded: Arc::clone(&round.excluded),
            }),
            Phase::Accepting | Phase::Accepted => self
                .accepted
                .as_ref()
                .filter(|(b, _)| *b == round.ballot)
                .map(|(b, v)| Msg::Accept {
                    ballot: *b,
                    value: Arc::new(v.clone()),
                }),
            _ => None,
        }
    }

    /// Sends [`Instance::down_message`] to the live ranks below `under`.
    pub(super) fn pass_down(&self, io: &mut Io<'_>, under: Rank) {
        if let (Some(round), Some(msg)) = (self.round.as_ref(), self.down_message()) {
            round.send_below(io, self.epoch, under, msg);
        }
    }

    /// Repairs this rank's part of the running round around the newly dead `dead`: the
    /// round's broadcast goes on to the live ranks `dead` left without a parent (when
    /// this rank is their nearest live ancestor), this rank's answer goes again to its
    /// new nearest live ancestor (when `dead` held it), and the gather may now be
    /// complete. Repeats are harmless: receivers ignore a broadcast or an answer they
    /// already have.
    pub(super) fn on_death(&mut self, io: &mut Io<'_>, dead: Rank) {
        let me = io.cfg.me;
        // A dead participant cannot sweep: the fast path is over here (the coordinator
        // starts a ballot when it learns of the death).
        self.leave_fast_path();
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
