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
//! A later round (`round ≥ 1`) starts with a **prepare** broadcast carrying `D`, then
//! the four traversals above. Round 0 of epoch `e` needs no prepare: its participants
//! are `C \ G_{e-1}` (the previous agreed set, identical everywhere), so it starts as
//! soon as the application calls `start`, in one of two shapes chosen by the number of
//! participants `m` (the same choice everywhere, [`Config::sweep_limit`]):
//!
//! - **Fast path** (`m ≤ sweep_limit`, default [`DEFAULT_SWEEP_LIMIT`] `= 2^17`): two
//!   dissemination sweeps (module `sweep`) over the participants **minus the deaths this
//!   rank knows at its call**, `X_i = (known dead at the call) \ G_{e-1}`: over
//!   `S_i = C \ (G_{e-1} ∪ X_i)`, `m_i = |S_i|`, `K = ⌈log2 m_i⌉` rounds; in round `k`
//!   index `i` sends to `i + 2^k` and waits for `i - 2^k` (mod `m_i`). Every sweep-1
//!   frame carries `X_i`, and a rank counts a sweep-1 frame only if it carries its own
//!   `X` (*the exclusion check*). Sweep 1 carries the union of contributions (each
//!   starts from `L_i ∪ X_i`); when it finishes, `i` holds `U = X ∪ ⋃_{p ∈ S} L_p` and
//!   **accepts `U ∪ G_{e-1}` at ballot `(0, c0)`**, below every ballot of the later
//!   rounds. Sweep 2 carries "sweep 1 done"; finishing it proves every rank of `S`
//!   accepted, so `i` decides. Cost when every rank knows the same deaths (none, one
//!   rank, a whole node): `2·m'·K` messages and `2·K` delays, `m'` the ranks alive.
//! - **Tree round** (`m > sweep_limit`): round 0 is the four traversals above without the
//!   prepare: `4(m - 1)` messages and `4·h(m)` delays. Sweeps would cost `2·m·⌈log2 m⌉`
//!   frames, 40·10^6 at `m = 10^6`, where the simulator's 10^6-rank scenario must stay
//!   within its time and memory budget; the tree needs 4·10^6.
//!
//! Either way a rank may only return `G` once it knows every live rank holds `G`
//! (*knowledge*): the second sweep, or the acknowledgement reduce and the decision
//! broadcast, is the price of it over a bare reduce+broadcast.
//!
//! ## Leaving the fast path
//!
//! A rank leaves the fast path for good, sending no further sweep frame, when it learns
//! of a death after its call (every such death is in its `S`), when it promises a
//! ballot `≥ 1`, when it decides by a decision broadcast, or when it hears a sweep-1
//! frame of another exclusion (views differ: its own sweep cannot finish). The
//! coordinator (lowest live rank) starts ballot 1 as soon as it has left the fast path
//! without deciding; the ballot runs as any round `≥ 1`. Two more rules keep the
//! coordinator from waiting for ever on a sweep that cannot finish:
//!
//! - a rank that heard a frame of another exclusion sends a notice
//!   (`AgreeSweepDone` with body 0) to the coordinator of its view, and again to each
//!   rank that becomes it, until it decides; the coordinator that hears it leaves;
//! - on the fast path a rank neither promises nor accepts a ballot whose coordinator
//!   it holds dead (such a ballot can never be decided; the tree path keeps its rules).
//!
//! The rule that keeps a possible fast decision is plain Paxos, because a finished
//! sweep 1 is an acceptance at ballot 0: each promise reports the highest
//! accepted value, so a rank that finished sweep 1 reports `(ballot 0, U ∪ G_{e-1})`,
//! and a coordinator that hears of one and of nothing higher proposes exactly that. In
//! particular, if every live participant that answers finished sweep 1, the proposal
//! is `U ∪ G_{e-1}`; if none did, nobody can have decided fast and the proposal is the
//! union of the contributions. [`Config::mutation_without_fast_path_rule`] hides
//! ballot-0 acceptances from the promises; `tests/agreement.rs` shows a two-failure
//! schedule at `n = 3` where agreement then breaks.
//!
//! **One value at ballot 0.** (Accurate detector: `X_i` holds only ranks that crashed
//! before `i`'s call.) Say `i` finishes sweep 1 of exclusion `X`. The round-`(K-1)` frame
//! it counted carried `X`, so its sender had exclusion `X` and had counted round
//! `K - 2` from its own source, which carried `X` too, and so on: every chain of the
//! sweep (the dissemination argument of module `sweep`: from every `p ∈ S` to `i`) is
//! made of frames carrying `X`, so **every rank of `S = C \ (G_{e-1} ∪ X)` called with
//! exclusion `X`**, and `i`'s union is exactly `X ∪ ⋃_{p ∈ S} L_p` (no other rank's
//! contribution can reach it). Two exclusions `X ≠ X'` cannot both have a rank that
//! finishes sweep 1: a rank outside `X ∪ X'` would have called with both, so
//! `S ⊆ X'` and `S' ⊆ X`; take `q ∈ S` and `q' ∈ S'`: `q ∈ X'` died before `q'` called
//! and `q' ∈ X` died before `q` called, yet each called before it died — a cycle in
//! time. So at most one value is ever accepted at ballot 0, the premise of Paxos. (The
//! test `without_the_exclusion_check_some_schedule_breaks` removes the check: views
//! then wait on each other for ever.)
//!
//! Why a fast decision at `j` (exclusion `X`, sweep ranks `S`) survives: `j` finished
//! sweep 2, so every `p ∈ S` sent its round-0 sweep-2 frame, hence finished sweep 1
//! (accepted `U` at ballot 0) *before* it promised any ballot `≥ 1` (after such a
//! promise it sends no sweep frame). Take the first ballot `b ≥ 1` that gets a proposal.
//! Its coordinator `c` is in `S`: it is outside `G_{e-1}`, and if `c ∈ X` it crashed
//! before any rank of `S` called, while a proposal needs a promise from every live rank
//! outside `D_b` (every rank of `S` was alive then and is outside `D_b`), which a rank
//! sends only after its call. So `c`'s own promise carries ballot 0's `U` unless it
//! accepted something higher — and by induction over ballots (the usual Paxos step,
//! below) every value accepted at a ballot in `(0, b)` is `U` too. So every later
//! proposal is `U ∪ G_{e-1}`.
//!
//! **Termination of the fast path.** Let `c*` be the lowest rank that never crashes;
//! eventually it is everyone's coordinator. Suppose it never leaves the fast path nor
//! decides. Then no rank of its `S*` crashes (it would hear of it after its call and
//! leave), so every `a ∈ S*` has `X_a ⊆ X*` (a rank of `X_a \ X*` is a crashed rank of
//! `S*`). If some `a ∈ S*` has `X_a ≠ X*`, then going round `S*` in rank order some rank
//! of exclusion `X*` has such an `a` as its round-0 target: `a` hears a frame of another
//! exclusion and its notice reaches `c*` (re-sent as `a` learns the deaths below `c*`),
//! so `c*` leaves. Otherwise every rank of `S*` sweeps with `X*` and none leaves: a death
//! after its call would be in `S*`; a prepare comes from a coordinator below `c*`, which
//! crashed, so it is in `X*` and refused (the second rule), or above `c*`, which would
//! have to hold `c*` dead; a notice is acted on by the coordinator only; a decision
//! broadcast would have needed `c*`'s own promise. So both sweeps finish at `c*`: a
//! contradiction. A fast decision at `c*` reaches every survivor: a rank of `S*` can
//! only miss sweep 2 if a rank of `S*` crashed (then `c*` re-broadcasts the decision,
//! as below) or left the fast path, which by the same list needs a crash in `S*`.
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
//! Sweep frames are checked against the layout of the sweep they belong to (this
//! rank's, or for a sweep-1 frame of another exclusion that one's): a round outside
//! `0..K` is [`FrameError::BadSweepRound`] (`K = 0` on the tree path), a participant that
//! does not send to this rank in that round is [`FrameError::NotSweepPeer`], a sender
//! outside the participants is [`FrameError::NotParticipant`] (the machine refuses such
//! a rank earlier, with `FromFailedRank`, as `G_{e-1}` is dead here); an exclusion that
//! holds its own sender or a rank of `G_{e-1}`, and a notice on the tree path, are
//! [`FrameError::Malformed`]. A frame of another exclusion that excludes this rank (its
//! sender suspects it) is no peer error: it only means views differ.
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
//!   the earlier ballot and so acknowledged it). The fast path is ballot 0 with the
//!   quorum "every rank of the sweep `S`" (every participant not known dead at the
//!   calls); one exclusion at most can accept, so ballot 0 has one value, and a fast
//!   decision needs every rank of `S`'s acceptance before any higher promise, so it is
//!   kept by the same argument (see *Leaving the fast path*).
//! - **Knowledge**: when a rank returns `G`, every rank not yet crashed has accepted `G`
//!   (it was a participant of the deciding ballot and acknowledged). So the returning
//!   rank knows every live rank holds or will return `G`. A fast decision at `i`
//!   follows the acceptance of every rank of its sweep `S` (finishing sweep 2 proves
//!   it), and the ranks outside `S` are in `G_{e-1}` or in `X`, crashed before the calls.
//! - **Validity**: `G ⊇ L_i` of every rank that started the epoch and is not in `G`
//!   (a survivor is a participant of the ballot whose reduce built the value), and
//!   `G ⊆` ranks some rank declared dead (contributions, detector reports, `D`).
//!   A fast decision is `U ∪ G_{e-1}` with `U = X ∪ ⋃_{p ∈ S} L_p`: every survivor is in
//!   `S` (only crashed ranks are in `X`), so its `L_i` is in `G`, and `X` holds only
//!   ranks the sweep's ranks held dead.
//! - **Termination**: let `t*` be the time by which every failure of the run has been
//!   reported to every rank still alive (a rank that crashes later counts until it
//!   does: as coordinator it waits on what it was told) and every survivor has started
//!   the epoch, and `δ` the largest message delay. Then every survivor returns by `t* + (5·(k + 1) + 1)·h·δ`,
//!   where `k ≤ f` is the number of rejections the final coordinator meets (a rejection
//!   reveals a higher ballot of a dead earlier coordinator, and after it the final
//!   coordinator's round is above all of that coordinator's ballots). Without failures
//!   the bound is the failure-free path's: `2·⌈log2 m⌉` on the sweeps, `4·h` on the
//!   tree, also when every rank knew the same deaths at its call. On the sweeps a death
//!   learned after a call, or views that differ at the calls, cost the coordinator's
//!   ballot 1 (its prepare and four traversals, after at most a round-0 frame and a
//!   notice) at most, which the `k + 1` rounds of the bound already count.
//!   (`randomized_schedules_many` in `tests/agreement.rs` checks the bound over 10^5
//!   random schedules, 80 % of them on the sweeps and 30 % with deaths known at the
//!   call by some ranks, and prints the worst time after `t*` in `⌈log2 n⌉·δ`.)
//! - **Epochs**: successive decisions grow (`G_e ⊇ G_{e-1}`, since round 0 excludes
//!   `G_{e-1}` and every value contains its `D`), and no frame of one epoch changes the
//!   state of another. Sweep frames carry the epoch like every frame; a rank that
//!   finished epoch `e` sends at most `2·⌈log2 m⌉` sweep frames of `e + 1` to each
//!   slower peer (and a notice to each coordinator it sees while views differ), within
//!   [`Config::max_buffered`].
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
//! still epoch-separated. Termination needs the suspicion to reach the coordinator (a
//! rank that suspects a participant leaves the fast path, and only the coordinator
//! starts the ballot that replaces it) and to become mutual.
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
//! - every frame whose kind is in the [`Family::Agree`] family: [`Protocol::handle_message`];
//! - on [`Event::Decided`]: `view.commit_global(&agreed)` (agreed sets only grow, so its
//!   precondition holds) and report the counts; on [`Event::SelfExcluded`]: stop the rank.
//!
//! No timers: the machine waits on messages and detector news only, so `poll_timeout` is
//! always `None` and `handle_timeout` does nothing.
//!
//! # Frames without allocation
//!
//! The machine queues typed messages `(to, epoch, body)` (module `msg`, `Out`) and
//! encodes each one only in `poll_transmit`, in place into the caller's buffer; a buffer
//! too short for it is [`BufferTooShort`] and the frame stays first in the queue.
//! Invariants: a queued body's rank sets are shared (`Arc`) with the machine's state
//! and with the other receivers of the same broadcast, never copied per receiver; a
//! sweep-1 frame shares the sender's union, which is copied on write only when it grows
//! while such a frame still waits; a queued frame is encoded exactly as it was when it
//! was queued (its shared sets are never changed in place). So a failure-free
//! validation allocates a constant per call and rank (its epoch's state) and nothing per
//! frame once the queues have grown to size (`tests/agreement_allocations.rs`).

mod instance;
mod msg;
mod round;
mod sweep;
#[cfg(test)]
mod tests;

use alloc::boxed::Box;
use alloc::collections::VecDeque;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::fmt;

use crate::error::{BufferTooShort, FrameError};
use crate::machine::{Protocol, Transmit};
use crate::rank::Rank;
use crate::rankset::{Members, RankSet};
use crate::time::Instant;
use crate::wire::{Context, Family, FrameKind, Header, Reader};

use instance::{Instance, Io};
use msg::{Msg, Out};

/// Default [`Config::sweep_limit`]: the fast path up to `2^17` participants (at most
/// `2·17·2^17 ≈ 4.5·10^6` frames per validation), the tree above.
pub const DEFAULT_SWEEP_LIMIT: u32 = 1 << 17;

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
    /// Most participants for which an epoch runs the two-sweep fast path; above it the
    /// epoch's round 0 is the tree round (sweeps cost `2·m·⌈log2 m⌉` frames against the
    /// tree's `4(m - 1)`). Must be the same at every rank of the communicator.
    pub sweep_limit: u32,
    /// Mutation switch for tests: promises hide a finished sweep 1, so the fallback may
    /// propose another value than a fast decision. Breaks agreement; never set it.
    pub(crate) drop_fast_rule: bool,
    /// Mutation switch for tests: a sweep-1 frame counts even when its exclusion differs
    /// from this rank's, if its sender is this rank's peer for that round. Breaks
    /// agreement; never set it.
    pub(crate) drop_exclusion_check: bool,
}

impl Config {
    /// Rank `me` of communicator `comm` of `n` ranks, with a buffer of `64 + 16·log2 n`
    /// early frames (a rank gets at most a few frames per tree neighbour and round).
    ///
    /// # Panics
    /// If `me >= n`.
    pub fn new(comm: u32, n: u32, me: Rank) -> Self {
        assert!(me < n, "rank {me} out of range for a communicator of {n}");
        Config {
            n,
            me,
            comm,
            max_buffered: 64 + 16 * (32 - n.leading_zeros() as usize),
            sweep_limit: DEFAULT_SWEEP_LIMIT,
            drop_fast_rule: false,
            drop_exclusion_check: false,
        }
    }

    /// This configuration with the fast-path fallback rule removed (promises no longer
    /// report a finished sweep 1). For the mutation test that shows the rule is needed:
    /// agreement breaks with it.
    #[doc(hidden)]
    pub fn mutation_without_fast_path_rule(mut self) -> Self {
        self.drop_fast_rule = true;
        self
    }

    /// This configuration with the exclusion check of the sweeps removed (a sweep-1
    /// frame of another view counts when its sender is this rank's peer for the round).
    /// For the mutation test that shows the check is needed: agreement breaks without it.
    #[doc(hidden)]
    pub fn mutation_without_exclusion_check(mut self) -> Self {
        self.drop_exclusion_check = true;
        self
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
    /// Frames to send, typed: `(to, epoch, body)`, encoded by `poll_transmit`.
    out: VecDeque<(Rank, u32, Out)>,
    events: VecDeque<Event>,
    excluded: bool,
    sent: u64,
    lowest_live: Rank,
    /// The empty set of this communicator, shared by the sweep frames of every epoch
    /// whose exclusion is empty (no allocation per call); made by the first epoch that
    /// runs the fast path, so a machine on the tree path holds none.
    empty: Option<Arc<RankSet>>,
}

impl Agreement {
    /// A machine for `cfg.me`; no validation runs until [`Agreement::start`].
    pub fn new(cfg: Config) -> Self {
        Agreement {
            dead: RankSet::new(cfg.n),
            empty: None,
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
        if self.empty.is_none() && self.cfg.n - base.len() as u32 <= self.cfg.sweep_limit {
            self.empty = Some(Arc::new(RankSet::new(self.cfg.n)));
        }
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
            empty: self.empty.as_ref(),
        };
        (io, [self.cur.as_deref_mut(), self.prev.as_deref_mut()])
    }

    fn advance_lowest_live(&mut self) {
        while self.dead.contains(self.lowest_live) {
            self.lowest_live += 1;
        }
    }

    /// Feeds a frame whose header was already decoded and checked against this
    /// agreement's communicator (by a layer that dispatches on [`crate::wire::FrameKind::family`]);
    /// `reader` is positioned after the header.
    pub fn handle_frame(
        &mut self,
        _now: Instant,
        header: &Header,
        mut reader: Reader<'_>,
    ) -> Result<(), FrameError> {
        if header.kind.family() != Family::Agree {
            return Err(FrameError::UnexpectedKind(header.kind as u8));
        }
        let from = header.sender;
        if header.kind == FrameKind::AgreeSweep {
            // The most frequent frame of a call: its sets stay in the frame's bytes.
            let round = reader.varint_u32()?;
            let excluded = reader.rankset_ref()?;
            let union = reader.rankset_ref()?;
            reader.finish()?;
            self.check_origin(from)?;
            if self.excluded {
                return Ok(());
            }
            let epoch = header.epoch;
            let (mut io, instances) = self.parts();
            let live = instances
                .into_iter()
                .flatten()
                .find(|inst| inst.epoch == epoch);
            if let Some(inst) = live {
                inst.hear_sweep(&mut io, from, round, &excluded, &union)?;
            } else {
                // Another epoch: kept for later or refused, as any frame ([`dispatch`]).
                let msg = Msg::Sweep {
                    round,
                    excluded: excluded.to_set(),
                    union: union.to_set(),
                };
                self.dispatch(from, epoch, msg)?;
            }
            self.after_input();
            return Ok(());
        }
        let msg = Msg::decode(header.kind, &mut reader)?;
        reader.finish()?;
        self.check_origin(from)?;
        if self.excluded {
            return Ok(());
        }
        self.dispatch(from, header.epoch, msg)?;
        self.after_input();
        Ok(())
    }

    /// A frame's sender must be live and another rank.
    fn check_origin(&self, from: Rank) -> Result<(), FrameError> {
        if self.dead.contains(from) {
            return Err(FrameError::FromFailedRank(from));
        }
        if from == self.cfg.me {
            return Err(FrameError::Malformed("frame from self"));
        }
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

    fn poll_transmit(
        &mut self,
        _now: Instant,
        buf: &mut [u8],
    ) -> Result<Option<Transmit>, BufferTooShort> {
        let Some((to, epoch, body)) = self.out.front() else {
            return Ok(None);
        };
        // Encoded before it leaves the queue: a short buffer keeps it there.
        let len = body.encode(self.cfg.comm, *epoch, self.cfg.me, buf)?;
        let to = *to;
        self.out.pop_front();
        Ok(Some(Transmit { to, len }))
    }

    fn poll_timeout(&self) -> Option<Instant> {
        None
    }

    fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }
}
