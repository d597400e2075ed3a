//! [`Groups`]: the groups of one process that share one transport, driven as one
//! machine: the group the process started in and the groups derived from it, each a
//! [`RankStack`] of its own (its communicator id, its numbering, its failure view, its
//! detector ring), all over the connections the transport already has. A group is
//! derived by a shrink ([`Groups::shrink`]: the survivors of an agreed `G`, renumbered),
//! a split ([`Groups::split_spares`]: the first ranks, the last ones kept as spares) or
//! a rebuild ([`Groups::rebuild`]: the same size and numbering, each rank of `G` taken
//! by the next spare, which [`Groups::join`]s from the [`Admission`] the survivors send).
//!
//! Frames are told apart by the communicator id of their header ([`ft_core::wire`],
//! offset 2), and ranks are translated between a group's numbering and the
//! transport's through its [`RankMap`].
//!
//! Invariants:
//! - a rank map names each transport rank at most once;
//! - a frame reaches the stack of its communicator, its sender renumbered; a frame
//!   from a transport rank outside that group is rejected;
//! - a frame of a communicator this process has not created yet (a faster peer has
//!   derived it already: its heartbeats and its first validation's frames come early)
//!   is kept, at most [`EARLY_FRAMES`] frames and [`EARLY_BYTES`] bytes, and handed to
//!   that group when it is created, in arrival order; past either limit, and for a
//!   communicator that was removed here, the frame is rejected;
//! - the ids of payload promises ([`Promise`]) are tagged with the group's index in
//!   their top byte, so the promises of two groups never meet at the transport
//!   (hence at most [`MAX_GROUPS`] groups are ever created);
//! - a group's events come out tagged with it, and a death names the transport rank
//!   that died ([`GroupEvent::dead`], which the driver tells the transport) once every
//!   open group that has that rank knows it dead: a peer that closed one group (its
//!   detector falls silent there) still talks in the others;
//! - the groups' frames take turns at the transport, each group's in its own order;
//! - a rebuilt group keeps its parent's size and numbering; a rank's incarnation
//!   (`RankInfo::generation`) grows by one each time a spare takes its number; the
//!   spares are taken in the order of the split, the one for the lowest rank of `G`
//!   first ([`ft_core::rebuild`]'s rule), so every survivor of the same `G` builds the
//!   same group. Frames of a
//!   replaced incarnation cannot reach the rebuilt group: it has its own
//!   communicator id.
//!
//! A derived group's communicator id is derived from its parent's id, the epoch of the
//! agreed `G` it was derived after and how many groups were derived from that parent
//! at that epoch before, so the members name it alike without a message, and ranks
//! that derived after different validations never mix their frames.

use std::collections::VecDeque;
use std::fmt;

use ft_bcast::{RankStack, StackEvent};
use ft_core::node::NodeEvent;
use ft_core::rebuild;
use ft_core::rng::SplitMix;
use ft_core::shrink::Survivors;
use ft_core::{
    BufferTooShort, Filled, FrameError, Instant, Promise, Protocol, Rank, Scope, Slot, Transmit,
    TransmitParts,
};

use crate::transport::Bytes;

pub mod admission;
pub mod map;

pub use admission::Admission;
pub use map::RankMap;

/// Names one group of a [`Groups`]: its index, in creation order (the first is 0).
pub type GroupId = usize;

/// The most groups one process creates (base group and shrunk ones, removed or not).
pub const MAX_GROUPS: usize = 256;

/// The most frames of communicators not created yet that are kept.
pub const EARLY_FRAMES: usize = 4096;

/// The most bytes of frames of communicators not created yet that are kept.
pub const EARLY_BYTES: usize = 64 << 20;

/// Bits of a promise id left to the group's own ids; the top byte is the group.
const PROMISE_BITS: u32 = 56;

/// An event of one group's stack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupEvent {
    /// The group.
    pub group: GroupId,
    /// The event, its ranks in the group's numbering.
    pub event: StackEvent,
    /// For a death (a suspicion, a notice), the transport rank that died, once every
    /// open group that has it knows it dead (see the [module docs](self)).
    pub dead: Option<Rank>,
}

/// Why a group could not be derived ([`Groups::shrink`], [`Groups::split_spares`],
/// [`Groups::rebuild`], [`Groups::join`]); nothing changed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum GroupError {
    /// The group does not exist (any more) here.
    UnknownGroup(GroupId),
    /// This rank was declared dead or excluded: it has no place in a derived group.
    Stopped,
    /// [`MAX_GROUPS`] groups were created already.
    TooManyGroups,
    /// The derived communicator id is taken by another group of this process.
    CommunicatorInUse(u32),
    /// As many spares as ranks, or more: no rank would work.
    TooManySpares {
        /// The spares asked for.
        spares: u32,
        /// The group's ranks.
        ranks: u32,
    },
    /// `G` holds more ranks than there are spares left to rebuild them from.
    NoSpares {
        /// The ranks to replace.
        needed: u32,
        /// The spares left.
        left: u32,
    },
    /// An admission that does not name this process.
    NotAMember,
}

impl fmt::Display for GroupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GroupError::UnknownGroup(g) => write!(f, "group {g} is not open here"),
            GroupError::Stopped => write!(f, "this rank was declared dead (fail-stop)"),
            GroupError::TooManyGroups => {
                write!(f, "this process created {MAX_GROUPS} groups already")
            }
            GroupError::CommunicatorInUse(comm) => {
                write!(f, "communicator id {comm} is taken by another group here")
            }
            GroupError::TooManySpares { spares, ranks } => {
                write!(f, "{spares} spares of {ranks} ranks leave none to work")
            }
            GroupError::NoSpares { needed, left } => write!(
                f,
                "{needed} ranks failed but {left} spares are left to rebuild them from"
            ),
            GroupError::NotAMember => write!(f, "the admission does not name this process"),
        }
    }
}

impl std::error::Error for GroupError {}

/// A group [`Groups::rebuild`] opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rebuilt {
    /// The new group.
    pub group: GroupId,
    /// What to send each spare it takes.
    pub admission: Admission,
    /// Each rank replaced, with its new incarnation.
    pub replaced: Vec<(Rank, u32)>,
}

/// How the transport wants the stacks' broadcast frames: set on every group's stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StackTuning {
    /// [`RankStack::set_chunk_bytes`].
    pub chunk_bytes: usize,
    /// [`RankStack::set_leaf_chunk_bytes`], if any.
    pub leaf_chunk_bytes: Option<usize>,
    /// [`RankStack::set_early_heads`].
    pub early_heads: bool,
}

impl StackTuning {
    /// Applies the settings to `stack`.
    pub fn apply(&self, stack: &mut RankStack) {
        stack.set_chunk_bytes(self.chunk_bytes);
        stack.set_early_heads(self.early_heads);
        if let Some(bytes) = self.leaf_chunk_bytes.filter(|&b| b > 0) {
            stack.set_leaf_chunk_bytes(bytes);
        }
    }
}

/// One group: its stack and where its ranks run.
#[derive(Debug)]
struct Group {
    stack: RankStack,
    map: RankMap,
    /// Groups derived from this one so far (shrunk, split, rebuilt): (epoch, count).
    derived: Vec<(u32, u32)>,
    /// The spares (transport ranks) a rebuild of this group takes, in order.
    spares: Vec<Rank>,
}

impl Group {
    fn new(stack: RankStack, map: RankMap) -> Self {
        Group {
            stack,
            map,
            derived: Vec::new(),
            spares: Vec::new(),
        }
    }

    fn comm(&self) -> u32 {
        self.stack.node().detector().config().comm
    }

    fn size(&self) -> u32 {
        self.stack.node().view().size()
    }

    fn on_transport(&self, rank: Rank) -> Rank {
        self.map.on_transport(rank)
    }

    fn rank_of(&self, rank: Rank) -> Option<Rank> {
        self.map.rank_of(rank)
    }

    /// Rank `rank`'s incarnation, as the group's failure view holds it.
    fn generation(&self, rank: Rank) -> u32 {
        self.stack.node().view().generation(rank)
    }

    /// The communicator id of the next group derived from this one after global
    /// validation `epoch`, counted.
    fn next_comm(&mut self, epoch: u32) -> u32 {
        let seq = match self.derived.iter_mut().find(|(e, _)| *e == epoch) {
            Some((_, count)) => {
                *count += 1;
                *count - 1
            }
            None => {
                self.derived.push((epoch, 1));
                0
            }
        };
        shrunk_comm(self.comm(), epoch, seq)
    }
}

/// A frame of a communicator not created here yet.
#[derive(Debug)]
struct Early {
    from: Rank,
    comm: u32,
    frame: Bytes,
}

/// See the [module docs](self).
#[derive(Debug)]
pub struct Groups {
    /// By [`GroupId`]; `None` once removed.
    groups: Vec<Option<Group>>,
    /// Communicator ids of removed groups.
    retired: Vec<u32>,
    early: VecDeque<Early>,
    early_bytes: usize,
    /// The group whose frames are offered first at the next poll.
    turn: usize,
    tuning: StackTuning,
}

/// The communicator id a frame's header names, if the frame is long enough to name one.
fn comm_of(frame: &[u8]) -> Option<u32> {
    frame
        .get(2..6)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// The communicator id of the `seq`-th group shrunk from communicator `parent` at
/// global epoch `epoch`.
fn shrunk_comm(parent: u32, epoch: u32, seq: u32) -> u32 {
    let mut rng = SplitMix::new(u64::from(parent) << 32 | u64::from(epoch));
    let mut comm = 0;
    for _ in 0..=seq {
        comm = rng.next_u64() as u32;
    }
    comm
}

impl Groups {
    /// One group, `stack` (group 0, numbered as the transport), its broadcasts tuned
    /// with `tuning`.
    pub fn new(mut stack: RankStack, tuning: StackTuning) -> Self {
        tuning.apply(&mut stack);
        Groups {
            groups: vec![Some(Group::new(stack, RankMap::Identity))],
            retired: Vec::new(),
            early: VecDeque::new(),
            early_bytes: 0,
            turn: 0,
            tuning,
        }
    }

    fn group(&self, id: GroupId) -> Option<&Group> {
        self.groups.get(id).and_then(Option::as_ref)
    }

    fn live(&mut self) -> impl Iterator<Item = (GroupId, &mut Group)> {
        self.groups
            .iter_mut()
            .enumerate()
            .filter_map(|(id, g)| g.as_mut().map(|g| (id, g)))
    }

    /// Group `id`'s stack, if the group is open.
    pub fn stack(&self, id: GroupId) -> Option<&RankStack> {
        self.group(id).map(|g| &g.stack)
    }

    /// Group `id`'s stack, mutably (an application command), if the group is open.
    pub fn stack_mut(&mut self, id: GroupId) -> Option<&mut RankStack> {
        self.groups
            .get_mut(id)
            .and_then(Option::as_mut)
            .map(|g| &mut g.stack)
    }

    /// The transport rank that group `id`'s rank `rank` runs on.
    pub fn transport_rank(&self, id: GroupId, rank: Rank) -> Option<Rank> {
        let group = self.group(id)?;
        (rank < group.stack.node().view().size()).then(|| group.on_transport(rank))
    }

    /// The open groups.
    pub fn open(&self) -> impl Iterator<Item = GroupId> + '_ {
        self.groups
            .iter()
            .enumerate()
            .filter_map(|(id, g)| g.as_ref().map(|_| id))
    }

    /// Frames of communicators not created here yet, kept for them.
    pub fn early_frames(&self) -> usize {
        self.early.len()
    }

    /// Creates the group shrunk from group `parent` by its last agreed `G`
    /// ([`RankStack::shrunk`]): its survivors renumbered in order, on the same
    /// transport ranks, with an empty view and its own detector ring, started at
    /// `now`; the frames that came early for it are handed to it. Every survivor must
    /// make the same shrinks of `parent` after the same global validation: the new
    /// group's communicator id is derived from both (see the [module docs](self)).
    pub fn shrink(&mut self, parent: GroupId, now: Instant) -> Result<GroupId, GroupError> {
        let group = self.derivable(parent)?;
        let view = group.stack.node().view();
        let epoch = view.epoch(Scope::Global);
        let survivors = Survivors::new(view.global());
        let me = survivors.new_rank(view.rank()).ok_or(GroupError::Stopped)?;
        let ranks = survivors
            .iter()
            .map(|old| group.on_transport(old))
            .collect();
        let comm = self.next_comm(parent, epoch)?;
        let stack = self.groups[parent]
            .as_ref()
            .expect("checked")
            .stack
            .derived(comm, survivors.len(), me, now);
        let map = RankMap::of(ranks).expect("survivors run on distinct ranks");
        Ok(self.open_group(Group::new(stack, map), now))
    }

    /// Splits the last `spares` ranks of group `parent` off as spares: the group of
    /// its first ones (their numbers kept), whose rebuilds take the spares in order
    /// ([`Groups::rebuild`]); `None` at a spare, which stays in `parent` and waits for an
    /// [`Admission`]. Every rank of `parent` makes the same splits after the same
    /// global validation (before any, at the start).
    pub fn split_spares(
        &mut self,
        parent: GroupId,
        spares: u32,
        now: Instant,
    ) -> Result<Option<GroupId>, GroupError> {
        let group = self.derivable(parent)?;
        let n = group.size();
        if spares >= n {
            return Err(GroupError::TooManySpares { spares, ranks: n });
        }
        let view = group.stack.node().view();
        let (me, epoch, working) = (view.rank(), view.epoch(Scope::Global), n - spares);
        let ranks: Vec<Rank> = (0..working).map(|r| group.on_transport(r)).collect();
        let spare_ranks: Vec<Rank> = (working..n).map(|r| group.on_transport(r)).collect();
        let comm = self.next_comm(parent, epoch)?;
        if me >= working {
            return Ok(None);
        }
        let stack = self.groups[parent]
            .as_ref()
            .expect("checked")
            .stack
            .derived(comm, working, me, now);
        let mut team = Group::new(stack, RankMap::of(ranks).expect("distinct ranks"));
        team.spares = spare_ranks;
        Ok(Some(self.open_group(team, now)))
    }

    /// Rebuilds group `parent` after its last agreed `G`: the same size and numbering,
    /// each rank of `G` taken by the next spare (the one that failed first in rank
    /// order takes the first), one incarnation more; the survivors keep their numbers.
    /// Returns the new group, the [`Admission`] to send each spare it takes, and its
    /// ranks of `G` with their new generations. A dead spare is taken like a live
    /// one: it is then a failure of the rebuilt group, which a later rebuild replaces.
    pub fn rebuild(&mut self, parent: GroupId, now: Instant) -> Result<Rebuilt, GroupError> {
        let group = self.derivable(parent)?;
        let view = group.stack.node().view();
        let (epoch, me, n) = (view.epoch(Scope::Global), view.rank(), group.size());
        let mut ranks = group.map.transport_ranks(n);
        let mut generations: Vec<u32> = (0..n).map(|r| group.generation(r)).collect();
        let rule =
            rebuild::admissions(view.global(), &group.spares, &generations).map_err(|e| {
                GroupError::NoSpares {
                    needed: e.needed,
                    left: e.left,
                }
            })?;
        let mut replaced = Vec::with_capacity(rule.admitted.len());
        for admitted in &rule.admitted {
            ranks[admitted.rank as usize] = admitted.spare;
            generations[admitted.rank as usize] = admitted.generation;
            replaced.push((admitted.rank, admitted.generation));
        }
        let spares = rule.spares_left;
        let comm = self.next_comm(parent, epoch)?;
        let admission = Admission {
            comm,
            ranks: ranks.clone(),
            generations: generations.clone(),
            spares,
        };
        let stack = self.groups[parent]
            .as_ref()
            .expect("checked")
            .stack
            .derived(comm, n, me, now);
        let group = self.open_member(stack, &admission, now)?;
        Ok(Rebuilt {
            group,
            admission,
            replaced,
        })
    }

    /// Joins the rebuilt group `admission` describes, as the rank this process's
    /// transport rank takes there, started at `now`: its stack derived from group
    /// `from`'s (the group the admission came in). `None` if this process has that
    /// group already (every survivor sends the admission).
    pub fn join(
        &mut self,
        from: GroupId,
        admission: &Admission,
        now: Instant,
    ) -> Result<Option<GroupId>, GroupError> {
        if self.live_comm(admission.comm).is_some() || self.retired.contains(&admission.comm) {
            return Ok(None);
        }
        let group = self.derivable(from)?;
        let me_here = group.stack.node().view().rank();
        let transport_me = group.on_transport(me_here);
        let n = admission.ranks.len() as u32;
        let me = admission
            .ranks
            .iter()
            .position(|&t| t == transport_me)
            .ok_or(GroupError::NotAMember)? as Rank;
        let stack = group.stack.derived(admission.comm, n, me, now);
        self.open_member(stack, admission, now).map(Some)
    }

    /// Opens the group of `admission` with `stack` as this rank's.
    fn open_member(
        &mut self,
        mut stack: RankStack,
        admission: &Admission,
        now: Instant,
    ) -> Result<GroupId, GroupError> {
        let map = RankMap::of(admission.ranks.clone()).ok_or(GroupError::NotAMember)?;
        for (rank, &generation) in admission.generations.iter().enumerate() {
            if generation > 0 {
                let _ = stack.set_generation(rank as Rank, generation);
            }
        }
        let mut group = Group::new(stack, map);
        group.spares = admission.spares.clone();
        Ok(self.open_group(group, now))
    }

    /// Group `parent`, if a group may be derived from it.
    fn derivable(&self, parent: GroupId) -> Result<&Group, GroupError> {
        if self.groups.len() >= MAX_GROUPS {
            return Err(GroupError::TooManyGroups);
        }
        let group = self.group(parent).ok_or(GroupError::UnknownGroup(parent))?;
        if group.stack.is_stopped() {
            return Err(GroupError::Stopped);
        }
        Ok(group)
    }

    /// The communicator id of the next group derived from `parent` after validation
    /// `epoch`, checked free.
    fn next_comm(&mut self, parent: GroupId, epoch: u32) -> Result<u32, GroupError> {
        let comm = self.groups[parent]
            .as_mut()
            .ok_or(GroupError::UnknownGroup(parent))?
            .next_comm(epoch);
        if self.retired.contains(&comm) || self.live_comm(comm).is_some() {
            return Err(GroupError::CommunicatorInUse(comm));
        }
        Ok(comm)
    }

    /// Adds `group` (tuned), hands it the frames that came early for it.
    fn open_group(&mut self, mut group: Group, now: Instant) -> GroupId {
        self.tuning.apply(&mut group.stack);
        let comm = group.comm();
        let id = self.groups.len();
        self.groups.push(Some(group));
        self.hand_early_frames(id, comm, now);
        id
    }

    /// Closes group `id`: its stack is dropped, and later frames of its communicator
    /// are rejected. Remove a group once its peers are done with it (as for releasing
    /// a broadcast): frames they still send it are lost.
    pub fn remove(&mut self, id: GroupId) {
        if let Some(group) = self.groups.get_mut(id).and_then(Option::take) {
            self.retired.push(group.comm());
        }
    }

    /// Whether every open group that has transport rank `rank` knows it dead: only
    /// then is the process dead for this rank (a group closed at a peer makes that
    /// group's detector declare it, while the others still talk to it).
    fn dead_everywhere(&self, rank: Rank) -> bool {
        self.groups.iter().flatten().all(|group| {
            group
                .rank_of(rank)
                .is_none_or(|r| group.stack.node().detector().known_dead().contains(r))
        })
    }

    fn live_comm(&self, comm: u32) -> Option<GroupId> {
        self.groups
            .iter()
            .position(|g| g.as_ref().is_some_and(|g| g.comm() == comm))
    }

    /// Hands group `id` (communicator `comm`, just created) the frames kept for it.
    fn hand_early_frames(&mut self, id: GroupId, comm: u32, now: Instant) {
        let (mine, others): (VecDeque<Early>, VecDeque<Early>) =
            self.early.drain(..).partition(|e| e.comm == comm);
        self.early = others;
        self.early_bytes = self.early.iter().map(|e| e.frame.len()).sum();
        let group = self.groups[id].as_mut().expect("just created");
        for early in mine {
            if let Some(from) = group.rank_of(early.from) {
                let _ = group.stack.handle_message_owned(now, from, early.frame);
            }
        }
    }

    /// Routes a frame from transport rank `from` to its group: `deliver` hands it to
    /// the stack under the group's number of the sender; a frame of a communicator
    /// not created yet is kept (`keep` makes the bytes to keep).
    fn route(
        &mut self,
        from: Rank,
        bytes: &[u8],
        keep: impl FnOnce() -> Bytes,
        deliver: impl FnOnce(&mut RankStack, Rank) -> Result<(), FrameError>,
    ) -> Result<(), FrameError> {
        let comm = comm_of(bytes).ok_or(FrameError::Truncated)?;
        match self.live_comm(comm) {
            Some(id) => {
                let group = self.groups[id].as_mut().expect("live");
                let n = group.stack.node().view().size();
                let rank = group.rank_of(from).ok_or(FrameError::RankOutOfRange {
                    rank: u64::from(from),
                    n,
                })?;
                deliver(&mut group.stack, rank)
            }
            None => {
                let refused = self.retired.contains(&comm)
                    || self.early.len() >= EARLY_FRAMES
                    || self.early_bytes + bytes.len() > EARLY_BYTES;
                if refused {
                    let expected = self.group(0).map_or(0, Group::comm);
                    return Err(FrameError::WrongCommunicator {
                        expected,
                        got: comm,
                    });
                }
                let frame = keep();
                self.early_bytes += frame.len();
                self.early.push_back(Early { from, comm, frame });
                Ok(())
            }
        }
    }

    /// The next frame of any group, the groups taking turns; `poll` polls one stack.
    fn poll<F>(
        &mut self,
        mut poll: impl FnMut(&mut RankStack) -> Result<Option<F>, BufferTooShort>,
        mut translate: impl FnMut(F, GroupId, &Group) -> F,
    ) -> Result<Option<F>, BufferTooShort> {
        let count = self.groups.len();
        for step in 0..count {
            let id = (self.turn + step) % count;
            let Some(group) = self.groups[id].as_mut() else {
                continue;
            };
            if let Some(frame) = poll(&mut group.stack)? {
                self.turn = (id + 1) % count;
                return Ok(Some(translate(frame, id, group)));
            }
        }
        Ok(None)
    }
}

/// A group's promise id, tagged with the group.
fn tag_promise(promise: Promise, group: GroupId) -> Promise {
    let tag = |id: u64| {
        debug_assert!(id >> PROMISE_BITS == 0, "promise ids fit 56 bits");
        (group as u64) << PROMISE_BITS | id
    };
    match promise {
        Promise::Head { id, len } => Promise::Head { id: tag(id), len },
        Promise::Payload { id } => Promise::Payload { id: tag(id) },
        Promise::Withdrawn { id } => Promise::Withdrawn { id: tag(id) },
    }
}

impl Protocol for Groups {
    type Event = GroupEvent;

    fn handle_message(&mut self, now: Instant, from: Rank, bytes: &[u8]) -> Result<(), FrameError> {
        self.route(
            from,
            bytes,
            || Bytes::copy_from_slice(bytes),
            |stack, from| stack.handle_message(now, from, bytes),
        )
    }

    fn handle_message_owned(
        &mut self,
        now: Instant,
        from: Rank,
        frame: Bytes,
    ) -> Result<(), FrameError> {
        let kept = frame.clone();
        self.route(
            from,
            &frame,
            || kept,
            |stack, from| stack.handle_message_owned(now, from, frame.clone()),
        )
    }

    fn place_payload(&mut self, now: Instant, from: Rank, head: &[u8], len: usize) -> Option<Slot> {
        let id = self.live_comm(comm_of(head)?)?;
        let group = self.groups[id].as_mut()?;
        let from = group.rank_of(from)?;
        group.stack.place_payload(now, from, head, len)
    }

    fn handle_message_placed(
        &mut self,
        now: Instant,
        from: Rank,
        head: &[u8],
        payload: Filled,
    ) -> Result<(), FrameError> {
        let comm = comm_of(head).ok_or(FrameError::Truncated)?;
        let group = self
            .live_comm(comm)
            .and_then(|id| self.groups[id].as_mut())
            .ok_or(FrameError::Malformed("a placed payload of a closed group"))?;
        let from = group.rank_of(from).ok_or(FrameError::Malformed(
            "a placed payload from outside the group",
        ))?;
        group.stack.handle_message_placed(now, from, head, payload)
    }

    fn placement_lost(&mut self, now: Instant, slot: Slot) {
        if let Some((_, group)) = self.live().find(|(_, g)| g.stack.holds(&slot)) {
            group.stack.placement_lost(now, slot);
        }
    }

    fn handle_timeout(&mut self, now: Instant) {
        for (_, group) in self.live() {
            if group.stack.poll_timeout().is_some_and(|t| t <= now) {
                group.stack.handle_timeout(now);
            }
        }
    }

    fn poll_transmit(
        &mut self,
        now: Instant,
        buf: &mut [u8],
    ) -> Result<Option<Transmit>, BufferTooShort> {
        self.poll(
            |stack| stack.poll_transmit(now, buf),
            |t: Transmit, _, group| Transmit {
                to: group.on_transport(t.to),
                len: t.len,
            },
        )
    }

    fn poll_transmit_parts(
        &mut self,
        now: Instant,
        buf: &mut [u8],
    ) -> Result<Option<TransmitParts>, BufferTooShort> {
        self.poll(
            |stack| stack.poll_transmit_parts(now, buf),
            |t: TransmitParts, id, group| TransmitParts {
                to: group.on_transport(t.to),
                promise: t.promise.map(|p| tag_promise(p, id)),
                ..t
            },
        )
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.groups
            .iter()
            .flatten()
            .filter_map(|g| g.stack.poll_timeout())
            .min()
    }

    fn poll_event(&mut self) -> Option<GroupEvent> {
        let (id, event, died) = self.live().find_map(|(id, group)| {
            let event = group.stack.poll_event()?;
            let died = match event {
                StackEvent::Node(NodeEvent::Suspected { rank })
                | StackEvent::Node(NodeEvent::Learned { rank, .. }) => {
                    Some(group.on_transport(rank))
                }
                _ => None,
            };
            Some((id, event, died))
        })?;
        Some(GroupEvent {
            group: id,
            event,
            dead: died.filter(|&rank| self.dead_everywhere(rank)),
        })
    }
}

#[cfg(test)]
mod tests;
