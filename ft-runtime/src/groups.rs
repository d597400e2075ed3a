//! [`Groups`]: the groups of one process that share one transport, driven as one
//! machine: the group the process started in and the groups shrunk from it
//! ([`Groups::shrink`]), each a [`RankStack`] of its own (its communicator id, its
//! numbering, its failure view, its detector ring), all over the connections the
//! transport already has.
//!
//! Frames are told apart by the communicator id of their header ([`ft_core::wire`],
//! offset 2), and ranks are translated between a group's numbering and the
//! transport's: a group's rank map lists, for each of its ranks, the transport rank
//! it runs on.
//!
//! Invariants:
//! - a rank map is strictly increasing (a shrunk group keeps its survivors' order), so
//!   the transport rank of a group rank is an index and the way back a binary search;
//! - a frame reaches the stack of its communicator, its sender renumbered; a frame
//!   from a transport rank outside that group is rejected;
//! - a frame of a communicator this process has not created yet (a faster peer has
//!   shrunk already: its heartbeats and its first validation's frames come early) is
//!   kept, at most [`EARLY_FRAMES`] frames and [`EARLY_BYTES`] bytes, and handed to
//!   that group when it is created, in arrival order; past either limit, and for a
//!   communicator that was removed here, the frame is rejected;
//! - the ids of payload promises ([`Promise`]) are tagged with the group's index in
//!   their top byte, so the promises of two groups never meet at the transport
//!   (hence at most [`MAX_GROUPS`] groups are ever created);
//! - a group's events come out tagged with it, and a death names the transport rank
//!   that died ([`GroupEvent::dead`], which the driver tells the transport) once every
//!   open group that has that rank knows it dead: a peer that closed one group (its
//!   detector falls silent there) still talks in the others;
//! - the groups' frames take turns at the transport, each group's in its own order.
//!
//! A shrunk group's communicator id is derived from its parent's id, the epoch of the
//! agreed `G` it leaves out and how many groups were shrunk from that parent at that
//! epoch before, so the survivors name it alike without a message, and ranks that
//! shrank at different epochs never mix their frames.

use std::collections::VecDeque;
use std::fmt;

use ft_bcast::{RankStack, StackEvent};
use ft_core::node::NodeEvent;
use ft_core::rng::SplitMix;
use ft_core::shrink::Survivors;
use ft_core::{
    BufferTooShort, Filled, FrameError, Instant, Promise, Protocol, Rank, Scope, Slot, Transmit,
    TransmitParts,
};

use crate::transport::Bytes;

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

/// Why [`Groups::shrink`] refused; nothing changed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ShrinkError {
    /// The group does not exist (any more) here.
    UnknownGroup(GroupId),
    /// This rank was declared dead or excluded: it has no place in a shrunk group.
    Stopped,
    /// [`MAX_GROUPS`] groups were created already.
    TooManyGroups,
    /// The derived communicator id is taken by another group of this process.
    CommunicatorInUse(u32),
}

impl fmt::Display for ShrinkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShrinkError::UnknownGroup(g) => write!(f, "group {g} is not open here"),
            ShrinkError::Stopped => write!(f, "this rank was declared dead (fail-stop)"),
            ShrinkError::TooManyGroups => {
                write!(f, "this process created {MAX_GROUPS} groups already")
            }
            ShrinkError::CommunicatorInUse(comm) => {
                write!(f, "communicator id {comm} is taken by another group here")
            }
        }
    }
}

impl std::error::Error for ShrinkError {}

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
    /// The transport rank of each group rank, strictly increasing; `None` for the
    /// identity (the base group).
    ranks: Option<Vec<Rank>>,
    /// Groups shrunk from this one so far: (epoch, count).
    shrinks: Vec<(u32, u32)>,
}

impl Group {
    fn comm(&self) -> u32 {
        self.stack.node().detector().config().comm
    }

    fn on_transport(&self, rank: Rank) -> Rank {
        match &self.ranks {
            None => rank,
            Some(ranks) => ranks[rank as usize],
        }
    }

    fn rank_of(&self, rank: Rank) -> Option<Rank> {
        match &self.ranks {
            None => Some(rank),
            Some(ranks) => ranks.binary_search(&rank).ok().map(|i| i as Rank),
        }
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
            groups: vec![Some(Group {
                stack,
                ranks: None,
                shrinks: Vec::new(),
            })],
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
    pub fn shrink(&mut self, parent: GroupId, now: Instant) -> Result<GroupId, ShrinkError> {
        if self.groups.len() >= MAX_GROUPS {
            return Err(ShrinkError::TooManyGroups);
        }
        let group = self
            .group(parent)
            .ok_or(ShrinkError::UnknownGroup(parent))?;
        if group.stack.is_stopped() {
            return Err(ShrinkError::Stopped);
        }
        let view = group.stack.node().view();
        let epoch = view.epoch(Scope::Global);
        let survivors = Survivors::new(view.global());
        let seq = group
            .shrinks
            .iter()
            .find(|(e, _)| *e == epoch)
            .map_or(0, |(_, count)| *count);
        let comm = shrunk_comm(group.comm(), epoch, seq);
        let taken = self.retired.contains(&comm) || self.live_comm(comm).is_some();
        if taken {
            return Err(ShrinkError::CommunicatorInUse(comm));
        }
        let mut stack = group
            .stack
            .shrunk(comm, &survivors, now)
            .ok_or(ShrinkError::Stopped)?;
        self.tuning.apply(&mut stack);
        let ranks = survivors
            .iter()
            .map(|old| group.on_transport(old))
            .collect();
        let parent_group = self.groups[parent].as_mut().expect("checked above");
        match parent_group.shrinks.iter_mut().find(|(e, _)| *e == epoch) {
            Some((_, count)) => *count += 1,
            None => parent_group.shrinks.push((epoch, 1)),
        }
        let id = self.groups.len();
        self.groups.push(Some(Group {
            stack,
            ranks: Some(ranks),
            shrinks: Vec::new(),
        }));
        self.hand_early_frames(id, comm, now);
        Ok(id)
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
mod tests {
    use super::*;
    use ft_core::detector::DetectorConfig;
    use ft_core::wire::{FrameKind, Header};
    use ft_core::{Duration, RankSet};

    const TUNING: StackTuning = StackTuning {
        chunk_bytes: ft_core::wire::MAX_CHUNK,
        leaf_chunk_bytes: None,
        early_heads: false,
    };

    fn stack(n: u32, me: Rank) -> RankStack {
        let config = DetectorConfig {
            comm: 5,
            n,
            me,
            period: Duration::from_millis(10),
            timeout: Duration::from_millis(40),
            phase: Duration::from_millis(u64::from(me)),
            span: ft_core::detector::DEFAULT_SPAN,
        };
        RankStack::new(config, Instant::ZERO)
    }

    /// Ranks of [`Groups`] on a network where every frame takes 1 ms; a dead rank
    /// neither sends nor receives.
    struct Net {
        now: Instant,
        ranks: Vec<Groups>,
        alive: Vec<bool>,
        in_flight: Vec<(Instant, Rank, Rank, Vec<u8>)>,
        events: Vec<Vec<GroupEvent>>,
    }

    impl Net {
        fn new(n: u32) -> Self {
            Net {
                now: Instant::ZERO,
                ranks: (0..n).map(|me| Groups::new(stack(n, me), TUNING)).collect(),
                alive: vec![true; n as usize],
                in_flight: Vec::new(),
                events: vec![Vec::new(); n as usize],
            }
        }

        /// Sends what every live rank has queued, then collects its events.
        fn flush(&mut self) {
            let mut buf = vec![0u8; ft_core::wire::frame_capacity(64)];
            for (me, groups) in self.ranks.iter_mut().enumerate() {
                while let Some(t) = groups.poll_transmit(self.now, &mut buf).unwrap() {
                    if self.alive[me] {
                        let at = Instant::from_nanos(self.now.as_nanos() + 1_000_000);
                        let frame = buf[..t.len].to_vec();
                        self.in_flight.push((at, me as Rank, t.to, frame));
                    }
                }
                while let Some(event) = groups.poll_event() {
                    self.events[me].push(event);
                }
            }
        }

        /// Runs the network for `ms` milliseconds.
        fn run(&mut self, ms: u64) {
            for _ in 0..ms {
                self.now = Instant::from_nanos(self.now.as_nanos() + 1_000_000);
                let now = self.now;
                let (due, later) = self.in_flight.drain(..).partition(|f| f.0 <= now);
                self.in_flight = later;
                for (_, from, to, frame) in due {
                    if self.alive[to as usize] {
                        let _ = self.ranks[to as usize].handle_message(now, from, &frame);
                    }
                }
                for (me, groups) in self.ranks.iter_mut().enumerate() {
                    if self.alive[me] && groups.poll_timeout().is_some_and(|t| t <= now) {
                        groups.handle_timeout(now);
                    }
                }
                self.flush();
            }
        }

        /// `G` of group `id` at rank `me`, once a validation of that group finished.
        fn validated(&self, me: usize, id: GroupId) -> Option<RankSet> {
            self.events[me].iter().rev().find_map(|e| match e.event {
                StackEvent::Node(NodeEvent::GlobalValidated { .. }) if e.group == id => {
                    Some(self.ranks[me].stack(id)?.node().view().global().clone())
                }
                _ => None,
            })
        }
    }

    #[test]
    fn shrunk_communicator_ids_are_alike_at_every_survivor_and_differ_per_shrink() {
        assert_eq!(shrunk_comm(5, 1, 0), shrunk_comm(5, 1, 0));
        let ids = [
            shrunk_comm(5, 1, 0),
            shrunk_comm(5, 2, 0),
            shrunk_comm(5, 1, 1),
            shrunk_comm(6, 1, 0),
        ];
        for (i, a) in ids.iter().enumerate() {
            assert!(ids[i + 1..].iter().all(|b| a != b), "{ids:?}");
        }
    }

    #[test]
    fn survivors_shrink_over_the_same_network_and_agree_in_the_new_group() {
        let mut net = Net::new(4);
        net.run(30);
        net.alive[2] = false;
        net.run(200);
        for me in [0, 1, 3] {
            net.ranks[me]
                .stack_mut(0)
                .unwrap()
                .validate_global(net.now)
                .unwrap();
        }
        net.flush();
        net.run(100);
        for me in [0, 1, 3] {
            assert_eq!(net.validated(me, 0), Some(RankSet::from_ranks(4, [2])));
        }
        // Rank 0 shrinks first and starts validating at once: its frames of the new
        // group reach ranks 1 and 3 before they shrink, and are kept for it.
        let now = net.now;
        let id = net.ranks[0].shrink(0, now).unwrap();
        assert_eq!(id, 1);
        net.ranks[0]
            .stack_mut(id)
            .unwrap()
            .validate_global(now)
            .unwrap();
        net.flush();
        net.run(20);
        assert!(
            net.ranks[1].early_frames() > 0,
            "kept for the group to come"
        );
        for me in [1, 3] {
            let now = net.now;
            assert_eq!(net.ranks[me].shrink(0, now), Ok(1));
            assert_eq!(net.ranks[me].early_frames(), 0, "handed over");
            net.ranks[me]
                .stack_mut(1)
                .unwrap()
                .validate_global(now)
                .unwrap();
        }
        net.flush();
        net.run(100);
        for (me, new) in [(0, 0), (1, 1), (3, 2)] {
            let stack = net.ranks[me].stack(1).unwrap();
            assert_eq!(stack.node().view().rank(), new);
            assert_eq!(stack.node().view().size(), 3);
            assert_eq!(
                net.validated(me, 1),
                Some(RankSet::new(3)),
                "nobody failed since"
            );
            assert_eq!(net.ranks[me].transport_rank(1, 2), Some(3));
        }
        // Transport rank 2 is not in the new group: its frames are refused.
        let comm = net.ranks[0]
            .stack(1)
            .unwrap()
            .node()
            .detector()
            .config()
            .comm;
        let heartbeat = Header {
            kind: FrameKind::Heartbeat,
            comm,
            epoch: 0,
            sender: 2,
        }
        .start()
        .finish();
        assert!(matches!(
            net.ranks[0].handle_message(net.now, 2, &heartbeat),
            Err(FrameError::RankOutOfRange { rank: 2, n: 3 })
        ));
        // A closed group's frames are refused, not kept.
        net.ranks[0].remove(1);
        assert!(net.ranks[0].stack(1).is_none());
        assert!(matches!(
            net.ranks[0].handle_message(net.now, 1, &heartbeat),
            Err(FrameError::WrongCommunicator { .. })
        ));
        assert_eq!(net.ranks[0].early_frames(), 0);
    }

    #[test]
    fn a_peer_that_closed_one_group_is_not_dead_for_the_transport() {
        let mut net = Net::new(3);
        net.run(30);
        for me in 0..3 {
            let now = net.now;
            assert_eq!(net.ranks[me].shrink(0, now), Ok(1));
        }
        net.run(30);
        // Rank 2 closes the shrunk group: its detector there falls silent.
        net.ranks[2].remove(1);
        net.run(300);
        let declared: Vec<&GroupEvent> = net.events[0]
            .iter()
            .filter(|e| matches!(e.event, StackEvent::Node(NodeEvent::Suspected { rank: 2 })))
            .collect();
        assert_eq!(declared.len(), 1, "declared in the group it closed");
        assert_eq!(
            (declared[0].group, declared[0].dead),
            (1, None),
            "alive in group 0"
        );
        // It dies for real: group 0 declares it too, and now the transport forgets it.
        net.alive[2] = false;
        net.run(300);
        let dead: Vec<Option<Rank>> = net.events[0]
            .iter()
            .filter(|e| {
                e.group == 0 && matches!(e.event, StackEvent::Node(NodeEvent::Suspected { .. }))
            })
            .map(|e| e.dead)
            .collect();
        assert_eq!(dead, [Some(2)]);
    }

    #[test]
    fn frames_of_unknown_communicators_are_kept_up_to_the_limit() {
        let mut groups = Groups::new(stack(2, 0), TUNING);
        let frame = Header {
            kind: FrameKind::Heartbeat,
            comm: 99,
            epoch: 0,
            sender: 1,
        }
        .start()
        .finish();
        for _ in 0..EARLY_FRAMES {
            assert_eq!(groups.handle_message(Instant::ZERO, 1, &frame), Ok(()));
        }
        assert!(matches!(
            groups.handle_message(Instant::ZERO, 1, &frame),
            Err(FrameError::WrongCommunicator {
                expected: 5,
                got: 99
            })
        ));
        assert_eq!(groups.early_frames(), EARLY_FRAMES);
        assert_eq!(
            groups.handle_message(Instant::ZERO, 1, &[1, 1]),
            Err(FrameError::Truncated)
        );
    }

    #[test]
    fn promise_ids_carry_their_group() {
        let tagged = tag_promise(Promise::Head { id: 5, len: 9 }, 3);
        assert_eq!(
            tagged,
            Promise::Head {
                id: 3 << 56 | 5,
                len: 9
            }
        );
        assert_eq!(
            tag_promise(Promise::Withdrawn { id: 5 }, 0),
            Promise::Withdrawn { id: 5 }
        );
    }
}
