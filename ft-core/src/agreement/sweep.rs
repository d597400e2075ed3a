//! The failure-free fast path: two dissemination sweeps over the epoch's participants.
//!
//! A rank sweeps over the participants of epoch `e`, `C \ G_{e-1}`, minus the deaths it
//! knew at its call (`X`, carried by every sweep-1 frame: see [`FastPath`]), numbered
//! `0..m` in rank order ([`Survivors`]). A sweep has `K = ⌈log2 m⌉` rounds; in round
//! `k` participant `i` sends to `i + 2^k` and waits for `i - 2^k` (mod `m`), and it sends
//! round `k + 1` only once it heard round `k`. For every pair `j ≠ i` the distance
//! `d = i - j mod m < 2^K` is a sum of distinct powers `2^k`, taken in increasing `k`:
//! a chain of frames from `j` to `i`, each sent after the previous one arrived. So when
//! `i` has heard round `K - 1`, it has heard, transitively, every participant's round-0
//! frame of that sweep.
//!
//! - **Sweep 1** carries the sender's union of contributions heard so far. At its end
//!   every participant that finishes holds the same `U` (the union of all `m`
//!   contributions; union is idempotent, so chains that overlap do no harm).
//! - **Sweep 2** carries only "I finished sweep 1". A participant starts it after
//!   finishing sweep 1, so finishing sweep 2 at `i` proves that every participant
//!   finished sweep 1 and holds `U`: `i` decides `U`.
//!
//! A finished sweep 1 counts as *accepting* `U ∪ G_{e-1}` at ballot 0 (below every
//! ballot of the Paxos rounds); the safety argument lives in the module doc of
//! [`super`]. This file only moves the sweeps forward; it never decides on its own.

use alloc::sync::Arc;

use super::instance::Io;
use super::msg::Msg;
use crate::error::FrameError;
use crate::rank::Rank;
use crate::rankset::{Members, RankSet};
use crate::shrink::Survivors;

/// `⌈log2 m⌉`: rounds per sweep over `m` participants (0 for `m ≤ 1`).
pub(super) fn rounds_for(m: u32) -> u32 {
    32 - m.saturating_sub(1).leading_zeros()
}

/// The participant that sends to index `i` in round `k`, as an index.
fn source_index(i: u32, k: u32, m: u32) -> u32 {
    let step = (1u64 << k) % u64::from(m);
    ((u64::from(i) + u64::from(m) - step) % u64::from(m)) as u32
}

/// The participant that index `i` sends to in round `k`, as an index.
fn target_index(i: u32, k: u32, m: u32) -> u32 {
    ((u64::from(i) + (1u64 << k)) % u64::from(m)) as u32
}

/// Checks that `from` sends to `me` in round `round` of a sweep over `participants`
/// with `rounds` rounds per sweep.
pub(super) fn check_sender(
    participants: &Survivors,
    rounds: u32,
    me: Rank,
    from: Rank,
    round: u32,
) -> Result<(), FrameError> {
    let j = participants
        .new_rank(from)
        .ok_or(FrameError::NotParticipant(from))?;
    if round >= rounds {
        return Err(FrameError::BadSweepRound { round, rounds });
    }
    let Some(i) = participants.new_rank(me) else {
        return Err(FrameError::NotParticipant(me));
    };
    if source_index(i, round, participants.len()) != j {
        return Err(FrameError::NotSweepPeer {
            round,
            sender: from,
        });
    }
    Ok(())
}

/// Checks a sweep-1 frame of another exclusion than this rank's (`excluded`, the
/// sender's view at its call) against the sweep it belongs to: the sender is outside
/// `excluded`, `excluded` holds no rank of `base` (the previous agreed set), and the
/// round and the sender fit that sweep's layout (when it includes `me`).
pub(super) fn check_foreign(
    base: &RankSet,
    excluded: &impl Members,
    me: Rank,
    from: Rank,
    round: u32,
) -> Result<(), FrameError> {
    if excluded.members().any(|r| r == from) {
        return Err(FrameError::Malformed("sweep frame excludes its sender"));
    }
    if excluded.members().any(|r| base.contains(r)) {
        return Err(FrameError::Malformed(
            "sweep exclusion holds an agreed-dead rank",
        ));
    }
    let mut gone = excluded.to_set();
    gone.union_with(base);
    let theirs = Survivors::new(&gone);
    let rounds = rounds_for(theirs.len());
    if theirs.contains(me) {
        check_sender(&theirs, rounds, me, from, round)
    } else if round >= rounds {
        Err(FrameError::BadSweepRound { round, rounds })
    } else {
        Ok(()) // the sender holds this rank dead (false suspicion): not a peer error
    }
}

/// One rank's layout of round 0's fast path in one epoch, fixed at its call.
#[derive(Clone, Debug)]
pub(super) struct FastPath {
    /// The sweeps, while this rank still takes part in them: dropped for good when the
    /// rank learns a death, promises a ballot ≥ 1, decides, or hears a sweep frame of
    /// another exclusion.
    pub(super) fast: Option<Sweeps>,
    /// `X`: the participants (ranks outside `G_{e-1}`) this rank held dead at its call.
    /// Its sweep-1 frames carry it (shared with them).
    pub(super) excluded: Arc<RankSet>,
    /// The sweep's participants `C \ (G_{e-1} ∪ X)`, numbered in rank order.
    pub(super) sweepers: Survivors,
    /// Rounds per sweep, `⌈log2 |sweepers|⌉`.
    pub(super) rounds: u32,
    /// This rank heard a sweep-1 frame of another exclusion: views differ, so neither
    /// sweep can finish, and the coordinator must hear of it ([`Msg::SweepLeft`]).
    pub(super) views_differ: bool,
    /// The coordinator last told so.
    pub(super) told: Option<Rank>,
}

impl FastPath {
    /// Rank `me`'s sweeps over the ranks outside `base ∪ excluded`, starting from
    /// `contribution ∪ excluded`; `empty` (an empty set) is shared when `excluded` is
    /// empty.
    pub(super) fn new(
        me: Rank,
        base: &RankSet,
        excluded: RankSet,
        contribution: &RankSet,
        empty: Option<&Arc<RankSet>>,
    ) -> Self {
        let (sweepers, excluded) = if excluded.is_empty() {
            let empty = empty.map_or_else(|| Arc::new(excluded), Arc::clone);
            (Survivors::new(base), empty)
        } else {
            let mut gone = excluded.clone();
            gone.union_with(base);
            (Survivors::new(&gone), Arc::new(excluded))
        };
        let fast = sweepers.new_rank(me).map(|i| {
            let mut start = contribution.clone();
            start.union_with(&excluded);
            Sweeps::new(i, sweepers.len(), start)
        });
        FastPath {
            fast,
            rounds: rounds_for(sweepers.len()),
            excluded,
            sweepers,
            views_differ: false,
            told: None,
        }
    }

    /// [`check_sender`] for a frame of this rank's own sweep.
    pub(super) fn check_sender(&self, me: Rank, from: Rank, round: u32) -> Result<(), FrameError> {
        check_sender(&self.sweepers, self.rounds, me, from, round)
    }
}

/// What [`Sweeps::advance`] reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Progress {
    /// Waiting for a frame.
    Waiting,
    /// Sweep 1 just finished: [`Sweeps::union`] is `U`. Call `advance` again to go on.
    FirstDone,
    /// Sweep 2 finished: every participant holds `U`.
    SecondDone,
}

/// One rank's state in the two sweeps of one epoch.
#[derive(Clone, Debug)]
pub(super) struct Sweeps {
    /// This rank's index among the participants.
    me: u32,
    /// Number of participants.
    m: u32,
    /// Rounds per sweep, `⌈log2 m⌉`.
    rounds: u32,
    /// In sweep 2 (sweep 1 finished).
    second: bool,
    /// Rounds of the current sweep sent so far.
    sent: u32,
    /// Rounds heard, bit `k` for round `k`, per sweep.
    heard: [u64; 2],
    /// Sweep 1: the union of the contributions heard so far (this rank's included),
    /// shared with the queued sweep-1 frames that carry it (copied on write, i.e. only
    /// when it grows while such a frame still waits to be sent).
    union: Arc<RankSet>,
}

impl Sweeps {
    /// Sweeps for participant index `me` of `m`, starting from `contribution`.
    pub(super) fn new(me: u32, m: u32, contribution: RankSet) -> Self {
        Sweeps {
            me,
            m,
            rounds: rounds_for(m),
            second: false,
            sent: 0,
            heard: [0; 2],
            union: Arc::new(contribution),
        }
    }

    /// The union of contributions heard so far (`U` once sweep 1 finished).
    pub(super) fn union(&self) -> &RankSet {
        &self.union
    }

    /// Records a sweep-1 frame of `round` (the sender was checked by [`check_sender`]).
    pub(super) fn hear_first(&mut self, round: u32, union: &impl Members) {
        self.heard[0] |= 1 << round;
        if !self.second && !self.union.contains_all(union) {
            Arc::make_mut(&mut self.union).union_with_members(union);
        }
    }

    /// Records a sweep-2 frame of `round`.
    pub(super) fn hear_second(&mut self, round: u32) {
        self.heard[1] |= 1 << round;
    }

    fn heard(&self, round: u32) -> bool {
        self.heard[usize::from(self.second)] >> round & 1 == 1
    }

    /// Sends every frame that is due and reports how far the sweeps got.
    pub(super) fn advance(
        &mut self,
        io: &mut Io<'_>,
        participants: &Survivors,
        excluded: &Arc<RankSet>,
        epoch: u32,
    ) -> Progress {
        loop {
            if self.sent < self.rounds && (self.sent == 0 || self.heard(self.sent - 1)) {
                let k = self.sent;
                let Some(to) = participants.old_rank(target_index(self.me, k, self.m)) else {
                    return Progress::Waiting; // unreachable: indices stay below m
                };
                let msg = if self.second {
                    Msg::SweepDone { round: k }
                } else {
                    Msg::Sweep {
                        round: k,
                        excluded: Arc::clone(excluded),
                        union: Arc::clone(&self.union),
                    }
                };
                io.send(to, epoch, msg);
                self.sent += 1;
                continue;
            }
            let finished =
                self.sent == self.rounds && (self.rounds == 0 || self.heard(self.rounds - 1));
            if !finished {
                return Progress::Waiting;
            }
            if self.second {
                return Progress::SecondDone;
            }
            self.second = true;
            self.sent = 0;
            return Progress::FirstDone;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_participant_reaches_every_other_within_the_rounds() {
        for m in 1u32..=40 {
            let rounds = rounds_for(m);
            for j in 0..m {
                // Who has heard (transitively) from j after each round.
                let mut reached = alloc::vec![false; m as usize];
                reached[j as usize] = true;
                for k in 0..rounds {
                    let before = reached.clone();
                    for i in 0..m {
                        if before[source_index(i, k, m) as usize] {
                            reached[i as usize] = true;
                        }
                        assert_eq!(target_index(source_index(i, k, m), k, m), i);
                    }
                }
                assert!(reached.iter().all(|&r| r), "m={m} j={j}");
            }
        }
    }
}
