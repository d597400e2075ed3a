//! [`RankStack`]: one rank's whole protocol stack, the failure layer
//! ([`ft_core::node::Node`]: failure view, detector, agreement) under the broadcast
//! activation machine ([`Broadcaster`]) and the application's messages
//! ([`Messenger`]), behind the library's one state-machine face.
//!
//! Routing: the stack decodes each frame's header once, rejects frames whose sender
//! this rank knows to be dead ([`FrameError::FromFailedRank`]), and hands `"bcast"`
//! frames to the broadcaster, `"message"` frames to the messenger and every other
//! family (detector, agreement, revoke) to the node.
//!
//! Invariants, after every call:
//! - every rank the node knows dead (`L_i ∪ pending`) is dead for the broadcaster and
//!   the messenger too:
//!   each failure the node reports ([`NodeEvent::Suspected`], [`NodeEvent::Learned`])
//!   goes to [`Broadcaster::on_rank_failed`] within the same call, so repair starts at
//!   once; other node events (validations) re-sync the whole known-failed set, which
//!   also covers ranks first heard of through an agreement;
//! - the broadcaster and the messenger are created on first use (a broadcast started
//!   or a message sent here, or a first frame of theirs), already knowing every rank
//!   the node knows dead: a rank that never takes part in a broadcast or a message pays
//!   one pointer for each (simulations of millions of ranks);
//! - once the node is stopped (it learned it was declared dead), the whole stack is:
//!   it sends nothing, sets no timer and ignores every input; events already raised can
//!   still be polled.
//!
//! # Call order
//!
//! As for every [`Protocol`] (see [`ft_core::machine`]): feed `handle_message` (or
//! `handle_message_owned`, whose broadcast chunks are kept without a copy),
//! `handle_timeout` and application commands ([`RankStack::start_broadcast`],
//! [`RankStack::validate_local`], [`RankStack::validate_global`]); after each, drain
//! [`Protocol::poll_transmit`] (node frames first, then broadcast frames and message
//! fragments, taking turns), then
//! [`Protocol::poll_event`]; then sleep until the next frame or
//! [`Protocol::poll_timeout`] (the earlier of both layers' deadlines).
//!
//! Every application command goes through the stack ([`RankStack::recognize`],
//! [`RankStack::revoke`], [`RankStack::release`], ...), never to a layer directly, so
//! what one layer reports reaches the other within the same call.
//!
//! # Releasing broadcasts
//!
//! A rank keeps every broadcast it took part in (its payloads, what it served to whom)
//! until the application calls [`RankStack::release`]: the outputs stay readable with
//! [`Broadcaster::output`] and late requests from the subtree are still answered.
//! Release a task once no rank of it will ask this rank for data any more (every
//! destination released its outputs, e.g. after the application's own completion
//! step); a rank that releases early leaves later requests of its subtree unanswered
//! (they re-attach only if this rank dies).

use alloc::boxed::Box;
use alloc::collections::VecDeque;
use core::fmt;

use bytes::Bytes;
use ft_core::detector::DetectorConfig;
use ft_core::node::{Node, NodeError, NodeEvent};
use ft_core::shrink::Survivors;
use ft_core::wire::{Context, Family, Header};
use ft_core::{
    BufferTooShort, Counts, Duration, Filled, FrameError, Instant, Protocol, Rank, RankSet, Slot,
    Transmit, TransmitParts, ViewError,
};

use ft_core::messages::{Message, MessageStats, Messenger, MessengerConfig, SendError};

use crate::plan::Plan;
use crate::protocol::{BcastError, BcastEvent, BcastStats, Broadcaster, Config, TaskId};
use crate::spec::{PlanSpec, SpecError};
use crate::store::{Store, STORE_TAG};

/// The tag of the runtime's control messages ([`RankStack::send_control`]): one of the
/// library's reserved tags ([`STORE_TAG`] set), which the store never uses.
pub const CONTROL_TAG: u64 = STORE_TAG | 1 << 62;

/// A store for the node's rank, knowing the ranks the node knows dead.
fn new_store(node: &Node) -> Box<Store> {
    let config = node.detector().config();
    let known = node.view().known_failed();
    let mut store = Store::new(config.n, config.me, config.span, known.clone());
    for rank in known.iter() {
        store.on_rank_failed(rank);
    }
    Box::new(store)
}

/// What the stack reports to the application: the events of either layer.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StackEvent {
    /// An event of the failure layer.
    Node(NodeEvent),
    /// An event of the broadcast layer.
    Bcast(BcastEvent),
    /// A message for the application.
    Message(Message),
    /// A control message of the runtime above ([`RankStack::send_control`]).
    Control(Message),
}

/// An application command the stack refused; nothing changed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StackError {
    /// The failure layer refused the command (stopped, or not supported yet).
    Node(NodeError),
    /// The broadcast spec cannot be planned.
    Spec(SpecError),
    /// The broadcaster refused the plan or the payloads.
    Bcast(BcastError),
    /// The messenger refused the message.
    Send(SendError),
}

impl fmt::Display for StackError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StackError::Node(e) => write!(f, "{e}"),
            StackError::Spec(e) => write!(f, "invalid broadcast: {e}"),
            StackError::Bcast(e) => write!(f, "broadcast refused: {e}"),
            StackError::Send(e) => write!(f, "message refused: {e}"),
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for StackError {}

/// One rank's failure layer and broadcaster. See the [module documentation](self).
#[derive(Debug)]
pub struct RankStack {
    node: Node,
    /// Created on first use (see the invariants).
    bcast: Option<Box<Broadcaster>>,
    bcast_config: Config,
    /// Created on first use (see the invariants).
    messages: Option<Box<Messenger>>,
    /// Created on first use (a put here, or a peer's copy arriving).
    store: Option<Box<Store>>,
    /// Whether the next poll offers the messenger's fragments before the broadcaster's
    /// frames (they take turns).
    messages_first: bool,
    events: VecDeque<StackEvent>,
}

impl RankStack {
    /// The stack of rank `config.me`, started at `now`, with the broadcaster's default
    /// limits ([`Config::new`]).
    ///
    /// # Panics
    /// As [`Node::new`]: if `config.me >= config.n` or the period is zero.
    pub fn new(config: DetectorConfig, now: Instant) -> Self {
        let bcast = Config::new(config.comm, config.n, config.me);
        Self::with_config(config, bcast, now)
    }

    /// The stack with explicit broadcaster settings.
    ///
    /// # Panics
    /// If the two configurations disagree on the communicator, its size or the rank, or
    /// as [`Node::new`].
    pub fn with_config(detector: DetectorConfig, bcast: Config, now: Instant) -> Self {
        assert!(
            (bcast.comm, bcast.n, bcast.me) == (detector.comm, detector.n, detector.me),
            "the detector and broadcaster configurations name different ranks"
        );
        RankStack {
            node: Node::new(detector, now),
            bcast: None,
            bcast_config: bcast,
            messages: None,
            store: None,
            messages_first: false,
            events: VecDeque::new(),
        }
    }

    // ----- getters -----

    /// The failure layer.
    pub fn node(&self) -> &Node {
        &self.node
    }
    /// The broadcast layer (e.g. [`Broadcaster::output`] to read released outputs);
    /// `None` until this rank first takes part in a broadcast.
    pub fn broadcaster(&self) -> Option<&Broadcaster> {
        self.bcast.as_deref()
    }
    /// The broadcaster's settings.
    pub fn broadcaster_config(&self) -> Config {
        self.bcast_config
    }
    /// Whether the rank was declared dead and stopped.
    pub fn is_stopped(&self) -> bool {
        self.node.is_stopped()
    }

    // ----- application commands -----

    /// Makes `hook` give the memory this rank's broadcast outputs land in, from the
    /// next output on: [`Broadcaster::set_allocator`].
    pub fn set_allocator(&mut self, now: Instant, hook: Box<dyn crate::Allocate>) {
        self.broadcaster_mut(now).set_allocator(hook);
    }

    /// Plans and starts broadcast `key` at this rank (the root of `spec`; the
    /// broadcast is [`TaskId`] (this rank, `key`)): the plan leaves out `spec.failed`
    /// and every rank this rank knows dead; every destination receives `header` with
    /// its arrival; the `j`-th payload is output `j`'s bytes, handed over once as a
    /// shared buffer ([`Bytes`], or a `Vec<u8>`, which converts without a copy): see
    /// [`Broadcaster::start_with_header`].
    pub fn start_broadcast<P: Into<Bytes>>(
        &mut self,
        now: Instant,
        key: u64,
        header: Bytes,
        mut spec: PlanSpec,
        payloads: impl IntoIterator<Item = P>,
    ) -> Result<(), StackError> {
        self.check_start(&spec)?;
        spec.failed.union_with(&self.node.view().known_failed());
        let plan = Plan::build(spec).map_err(StackError::Spec)?;
        self.broadcaster_mut(now)
            .start_with_header(now, key, &plan, header, payloads)
            .map_err(StackError::Bcast)
    }

    /// [`RankStack::start_broadcast`] from a plan built earlier ([`Plan::build`]): a
    /// runtime that broadcasts many tasks of one shape (the same outputs to the same
    /// destinations) plans once and starts each task from that plan, as an MPI program
    /// splits a communicator once and broadcasts over it many times. The plan is used
    /// as it is when it already leaves out every rank this rank knows dead; otherwise
    /// it is built again from its spec with them left out, as `start_broadcast` does,
    /// so a stale plan never routes through a dead rank this rank knows of. From the
    /// third start from one plan on, the root's part comes from what the broadcaster
    /// derived from it before (see [`Broadcaster::start_broadcast`]).
    pub fn start_planned<P: Into<Bytes>>(
        &mut self,
        now: Instant,
        key: u64,
        header: Bytes,
        plan: &Plan,
        payloads: impl IntoIterator<Item = P>,
    ) -> Result<(), StackError> {
        let spec = plan.spec();
        self.check_start(spec)?;
        if !self.node.view().known_failed().is_subset(&spec.failed) {
            return self.start_broadcast(now, key, header, spec.clone(), payloads);
        }
        self.broadcaster_mut(now)
            .start_with_header(now, key, plan, header, payloads)
            .map_err(StackError::Bcast)
    }

    /// What both ways of starting a broadcast refuse first: a stopped rank, and a
    /// broadcast planned for another communicator size.
    fn check_start(&self, spec: &PlanSpec) -> Result<(), StackError> {
        if self.node.is_stopped() {
            return Err(StackError::Node(NodeError::Stopped));
        }
        let n = self.bcast_config.n;
        if spec.ranks != n || spec.failed.universe() != n {
            return Err(StackError::Bcast(BcastError::WrongSize {
                plan: spec.ranks,
            }));
        }
        Ok(())
    }

    /// [`Node::validate_local`].
    pub fn validate_local(&mut self, now: Instant) -> Result<Counts, StackError> {
        let result = self.node.validate_local(now).map_err(StackError::Node);
        self.absorb_node(now);
        result
    }

    /// [`Node::validate_global`]: starts a global validation; returns its epoch.
    pub fn validate_global(&mut self, now: Instant) -> Result<u32, StackError> {
        let result = self.node.validate_global(now).map_err(StackError::Node);
        self.absorb_node(now);
        result
    }

    /// [`Node::recognize`]: the application has dealt with failed `rank`.
    pub fn recognize(&mut self, rank: Rank) -> Result<(), ViewError> {
        self.node.recognize(rank)
    }

    /// [`Node::revoke`]: revokes the communicator; the broadcasts in flight here fail
    /// ([`BcastEvent::Failed`]) within this call.
    pub fn revoke(&mut self, now: Instant) -> Result<(), StackError> {
        let result = self.node.revoke(now).map_err(StackError::Node);
        self.absorb_node(now);
        result
    }

    /// Sends `bytes` to rank `to` under `tag` (handed over once: every fragment sent is
    /// a slice of it): see [`Messenger::send`]. Refused for a rank known dead.
    pub fn send(&mut self, to: Rank, tag: u64, bytes: Bytes) -> Result<(), StackError> {
        if self.node.is_stopped() {
            return Err(StackError::Node(NodeError::Stopped));
        }
        if tag & STORE_TAG != 0 {
            return Err(StackError::Send(SendError::ReservedTag(tag)));
        }
        self.messenger_mut()
            .send(to, tag, bytes)
            .map_err(StackError::Send)?;
        // A message to this rank itself is delivered at once.
        while let Some(m) = self.messenger_mut().poll_message() {
            self.events.push_back(StackEvent::Message(m));
        }
        Ok(())
    }

    /// What the messenger sent, received and copied.
    pub fn message_stats(&self) -> MessageStats {
        self.messages
            .as_ref()
            .map_or_else(MessageStats::default, |m| m.stats())
    }

    /// Drops everything this rank keeps for broadcast `task` (payloads, served sets):
    /// see [Releasing broadcasts](self#releasing-broadcasts). Idempotent.
    pub fn release(&mut self, task: TaskId) {
        if let Some(bcast) = self.bcast.as_mut() {
            bcast.forget(task);
        }
    }

    /// Sets the longest data chunk the broadcaster sends ([`Config::chunk_bytes`]): a
    /// backend passes its transport's preferred size. Applies to chunks sent from now on.
    ///
    /// # Panics
    /// If `bytes` is 0.
    pub fn set_chunk_bytes(&mut self, bytes: usize) {
        assert!(bytes > 0, "chunks of 0 bytes");
        self.bcast_config.chunk_bytes = bytes;
        if let Some(bcast) = self.bcast.as_mut() {
            bcast.set_chunk_bytes(bytes);
        }
        if let Some(messages) = self.messages.as_mut() {
            messages.set_fragment_bytes(bytes);
        }
    }

    /// Sets the longest data chunk the broadcaster sends to a leaf
    /// ([`Config::leaf_chunk_bytes`]). Applies to streams started from now on.
    ///
    /// # Panics
    /// If `bytes` is 0.
    pub fn set_leaf_chunk_bytes(&mut self, bytes: usize) {
        assert!(bytes > 0, "chunks of 0 bytes");
        self.bcast_config.leaf_chunk_bytes = Some(bytes);
        if let Some(bcast) = self.bcast.as_mut() {
            bcast.set_leaf_chunk_bytes(bytes);
        }
    }

    /// Sets whether the broadcaster may send a frame's head ahead of its payload
    /// ([`Config::early_heads`]). Applies to streams started from now on.
    pub fn set_early_heads(&mut self, on: bool) {
        self.bcast_config.early_heads = on;
        if let Some(bcast) = self.bcast.as_mut() {
            bcast.set_early_heads(on);
        }
    }

    /// What the broadcaster sent of its payloads ([`Broadcaster::stats`]; zeros before
    /// this rank takes part in a broadcast).
    pub fn bcast_stats(&self) -> BcastStats {
        self.bcast
            .as_ref()
            .map_or_else(BcastStats::default, |b| b.stats())
    }

    /// The payload bytes this rank holds for the broadcasts it has not released (all
    /// outputs, complete or not).
    pub fn held_bytes(&self) -> usize {
        self.bcast.as_ref().map_or(0, |b| b.held_bytes())
    }

    /// This rank's stack in the group shrunk from this one by `survivors` (the
    /// renumbering of an agreed `G`): communicator `comm`, `survivors.len()` ranks, this
    /// rank under its new number, started at `now` with an empty view (no failure
    /// known, no validation done) and its own detector ring. The detector's period,
    /// timeout and span and the broadcaster's settings are this stack's; the heartbeat
    /// phase is spread over the new size as over the old one. The allocation hook is
    /// not carried over. `None` if this rank is not a survivor.
    pub fn shrunk(&self, comm: u32, survivors: &Survivors, now: Instant) -> Option<RankStack> {
        let me = survivors.new_rank(self.node.detector().config().me)?;
        Some(self.derived(comm, survivors.len(), me, now))
    }

    /// This rank's stack in another group on the same transport: communicator `comm`
    /// of `n` ranks, this rank as `me`, started at `now` with an empty view and its own
    /// detector ring; the detector's period, timeout and span and the broadcaster's
    /// settings are this stack's, the heartbeat phase spread over `n`. The allocation
    /// hook is not carried over.
    ///
    /// # Panics
    /// If `me >= n`.
    pub fn derived(&self, comm: u32, n: u32, me: Rank, now: Instant) -> RankStack {
        let old = *self.node.detector().config();
        let detector = DetectorConfig {
            comm,
            n,
            me,
            phase: Duration::from_nanos(old.period.as_nanos() / u64::from(n) * u64::from(me)),
            ..old
        };
        let bcast = Config {
            comm,
            n,
            me,
            ..self.bcast_config
        };
        RankStack::with_config(detector, bcast, now)
    }

    /// [`Node::set_generation`]: `rank` is in its `generation`-th incarnation.
    pub fn set_generation(&mut self, rank: Rank, generation: u32) -> Result<(), ViewError> {
        self.node.set_generation(rank, generation)
    }

    /// Sends `bytes` to `to` as a control message of the runtime above (tag
    /// [`CONTROL_TAG`]): it arrives as a [`StackEvent::Control`], never as an
    /// application message. Refused for a rank known dead.
    pub fn send_control(&mut self, to: Rank, bytes: Bytes) -> Result<(), StackError> {
        if self.node.is_stopped() {
            return Err(StackError::Node(NodeError::Stopped));
        }
        self.messenger_mut()
            .send(to, CONTROL_TAG, bytes)
            .map_err(StackError::Send)?;
        // One to this rank itself is delivered at once.
        self.take_messages();
        Ok(())
    }

    /// Whether `slot` is one this stack gave for a payload ([`Protocol::place_payload`])
    /// and still keeps: a transport shared by several stacks gives an unfilled slot
    /// back to the one that owns it.
    pub fn holds(&self, slot: &Slot) -> bool {
        self.messages.as_ref().is_some_and(|m| m.holds(slot))
            || self.bcast.as_ref().is_some_and(|b| b.holds(slot))
    }

    // ----- the redundant store -----

    /// Keeps `bytes` as version `version` of this rank's `key` in the store, with a
    /// copy sent to a rank of another node ([`Store::put`]).
    pub fn store_put(&mut self, key: u64, version: u64, bytes: Bytes) -> Result<(), StackError> {
        if self.node.is_stopped() {
            return Err(StackError::Node(NodeError::Stopped));
        }
        self.store_mut().put(key, version, bytes);
        self.send_store_messages();
        Ok(())
    }

    /// Whether this rank's puts of `version` and before were acknowledged or cannot be
    /// ([`Store::flushed`]): the first step of a commit.
    pub fn store_flushed(&self, version: u64) -> bool {
        self.store.as_ref().is_none_or(|s| s.flushed(version))
    }

    /// Commits `version` iff the `G` of the last global validation equals the store's
    /// base ([`Store::decide`]): the last step of a commit, after a validation that
    /// followed the flush. Returns whether it committed.
    pub fn store_decide(&mut self, version: u64) -> bool {
        let agreed = self.node.view().global().clone();
        self.store_mut().decide(version, &agreed)
    }

    /// Makes the `G` of the last global validation the store's base ([`Store::rebase`]).
    pub fn store_rebase(&mut self) {
        let agreed = self.node.view().global().clone();
        self.store_mut().rebase(agreed);
    }

    /// The rank that keeps `owner`'s committed copies ([`Store::holder`]; before the
    /// store is used, reckoned over an empty base, as the store starts).
    pub fn store_holder(&self, owner: Rank) -> Rank {
        match &self.store {
            Some(store) => store.holder(owner),
            None => {
                let config = self.node.detector().config();
                crate::store::holder_of(config.n, config.span, owner, &RankSet::new(config.n))
            }
        }
    }

    /// The store, if this rank used it or holds copies for a peer.
    pub fn store(&self) -> Option<&Store> {
        self.store.as_deref()
    }

    /// The store, created (knowing every rank the node knows dead) if need be.
    fn store_mut(&mut self) -> &mut Store {
        let node = &self.node;
        self.store.get_or_insert_with(|| new_store(node))
    }

    // ----- internals -----

    /// Decodes the header of `bytes` (the very bytes of `frame`, if the frame was handed
    /// over) once and hands the frame to its layer: see the [module docs](self).
    fn route(
        &mut self,
        now: Instant,
        from: Rank,
        bytes: &[u8],
        frame: Option<&Bytes>,
    ) -> Result<(), FrameError> {
        if self.node.is_stopped() {
            return Ok(());
        }
        // One decode serves every layer: each takes the checked header and the payload.
        let (header, payload) = Header::decode(bytes, self.context(), from)?;
        let family = header.kind.family();
        if !matches!(family, Family::Bcast | Family::Message) {
            let result = self.node.handle_frame(now, &header, payload);
            self.absorb_node(now);
            return result;
        }
        // The node refuses frames of ranks it knows dead itself; the layers above
        // skip it.
        if self.node.detector().known_dead().contains(header.sender) {
            return Err(FrameError::FromFailedRank(header.sender));
        }
        if family == Family::Message {
            let messages = self.messenger_mut();
            let result = messages.handle_frame(&header, payload, frame);
            self.take_messages();
            return result;
        }
        let bcast = self.broadcaster_mut(now);
        match frame {
            Some(frame) => bcast.handle_frame_owned(now, &header, payload, frame),
            None => bcast.handle_frame(now, &header, payload),
        }
    }

    /// The messenger, created (knowing every rank the node knows dead) if need be.
    fn messenger_mut(&mut self) -> &mut Messenger {
        let (node, config) = (&self.node, self.bcast_config);
        self.messages.get_or_insert_with(|| {
            let mut cfg = MessengerConfig::new(config.comm, config.n, config.me);
            cfg.fragment_bytes = config.chunk_bytes;
            let mut messages = Messenger::new(cfg);
            for rank in node.view().known_failed().iter() {
                messages.on_rank_failed(rank);
            }
            Box::new(messages)
        })
    }

    /// Moves the messages delivered to the stack's events.
    fn take_messages(&mut self) {
        let Some(messages) = self.messages.as_mut() else {
            return;
        };
        let mut to_store = false;
        while let Some(m) = messages.poll_message() {
            if m.tag & STORE_TAG == 0 {
                self.events.push_back(StackEvent::Message(m));
                continue;
            }
            if m.tag == CONTROL_TAG {
                self.events.push_back(StackEvent::Control(m));
                continue;
            }
            // A store message a peer got wrong changes nothing (the store's invariant).
            let _ = self
                .store
                .get_or_insert_with(|| new_store(&self.node))
                .handle_message(m.from, m.tag, m.bytes);
            to_store = true;
        }
        if to_store {
            self.send_store_messages();
        }
    }

    /// Hands the store's messages to the messenger (a dead destination drops them).
    fn send_store_messages(&mut self) {
        while let Some(out) = self.store.as_mut().and_then(|s| s.poll_outgoing()) {
            let _ = self.messenger_mut().send(out.to, out.tag, out.bytes);
        }
        while let Some(m) = self.messages.as_mut().and_then(|m| m.poll_message()) {
            self.events.push_back(StackEvent::Message(m));
        }
    }

    /// The next frame of the broadcaster or the messenger, taking turns.
    fn poll_upper(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        split: bool,
    ) -> Result<Option<TransmitParts>, BufferTooShort> {
        if self.node.is_stopped() {
            return Ok(None);
        }
        self.messages_first = !self.messages_first;
        for messages_turn in [self.messages_first, !self.messages_first] {
            let next = if messages_turn {
                match self.messages.as_deref_mut() {
                    Some(m) => m.poll_transmit_parts(buf, split)?,
                    None => None,
                }
            } else {
                match self.bcast.as_deref_mut() {
                    Some(b) if split => b.poll_transmit_parts(now, buf)?,
                    Some(b) => b.poll_transmit(now, buf)?.map(TransmitParts::from),
                    None => None,
                }
            };
            if next.is_some() {
                return Ok(next);
            }
        }
        Ok(None)
    }

    /// The communicator frames are checked against.
    fn context(&self) -> Context {
        Context {
            comm: self.bcast_config.comm,
            n: self.bcast_config.n,
        }
    }

    /// The broadcaster, created (knowing every rank the node knows dead) if need be.
    fn broadcaster_mut(&mut self, now: Instant) -> &mut Broadcaster {
        let (node, config) = (&self.node, self.bcast_config);
        self.bcast.get_or_insert_with(|| {
            let mut bcast = Broadcaster::new(config);
            for rank in node.view().known_failed().iter() {
                bcast.on_rank_failed(now, rank);
            }
            if node.revoked_by().is_some() {
                bcast.revoke(now);
            }
            Box::new(bcast)
        })
    }

    /// The node's next frame (node frames go before broadcast frames); none once the
    /// stack is stopped.
    fn poll_node(
        &mut self,
        now: Instant,
        buf: &mut [u8],
    ) -> Result<Option<Transmit>, BufferTooShort> {
        self.absorb_node(now);
        if self.node.is_stopped() {
            return Ok(None);
        }
        self.node.poll_transmit(now, buf)
    }

    /// Moves the node's events to the stack's queue, telling the broadcaster of every
    /// failure among them.
    fn absorb_node(&mut self, now: Instant) {
        while let Some(event) = self.node.poll_event() {
            match event {
                NodeEvent::Suspected { rank } | NodeEvent::Learned { rank, .. } => {
                    if let Some(bcast) = self.bcast.as_mut() {
                        bcast.on_rank_failed(now, rank);
                    }
                    if let Some(messages) = self.messages.as_mut() {
                        messages.on_rank_failed(rank);
                    }
                    if let Some(store) = self.store.as_mut() {
                        store.on_rank_failed(rank);
                    }
                }
                NodeEvent::DeclaredDeadSelf { .. } => {}
                NodeEvent::Revoked { .. } => {
                    if let Some(bcast) = self.bcast.as_mut() {
                        bcast.revoke(now);
                    }
                }
                // Validations (a global one may teach ranks never reported here one by
                // one): re-sync; `on_rank_failed` ignores ranks it already knows.
                _ => {
                    for rank in self.node.view().known_failed().iter() {
                        if let Some(bcast) = self.bcast.as_mut() {
                            bcast.on_rank_failed(now, rank);
                        }
                        if let Some(messages) = self.messages.as_mut() {
                            messages.on_rank_failed(rank);
                        }
                        if let Some(store) = self.store.as_mut() {
                            store.on_rank_failed(rank);
                        }
                    }
                }
            }
            self.events.push_back(StackEvent::Node(event));
        }
    }
}

impl Protocol for RankStack {
    type Event = StackEvent;

    fn handle_message(&mut self, now: Instant, from: Rank, bytes: &[u8]) -> Result<(), FrameError> {
        self.route(now, from, bytes, None)
    }

    /// Broadcast frames go to [`Broadcaster::handle_frame_owned`], which keeps a data
    /// chunk as a slice of `frame`; the node's frames are read as lent.
    fn handle_message_owned(
        &mut self,
        now: Instant,
        from: Rank,
        frame: Bytes,
    ) -> Result<(), FrameError> {
        self.route(now, from, &frame, Some(&frame))
    }

    /// A broadcast data chunk of an output that comes in several chunks goes straight
    /// into the output's one buffer ([`Broadcaster::place_frame`]); nothing else is
    /// placed.
    fn place_payload(
        &mut self,
        _now: Instant,
        from: Rank,
        head: &[u8],
        len: usize,
    ) -> Option<Slot> {
        if self.node.is_stopped() {
            return None;
        }
        let (header, reader) = Header::decode(head, self.context(), from).ok()?;
        if self.node.detector().known_dead().contains(header.sender) {
            return None;
        }
        match header.kind.family() {
            Family::Bcast => self.bcast.as_mut()?.place_frame(&header, reader, len),
            Family::Message => self.messenger_mut().place_frame(&header, reader, len),
            _ => None,
        }
    }

    fn handle_message_placed(
        &mut self,
        _now: Instant,
        from: Rank,
        head: &[u8],
        payload: Filled,
    ) -> Result<(), FrameError> {
        if self.node.is_stopped() {
            return Ok(());
        }
        let (header, reader) = Header::decode(head, self.context(), from)?;
        if self.node.detector().known_dead().contains(header.sender) {
            return Err(FrameError::FromFailedRank(header.sender));
        }
        let family = header.kind.family();
        match (family, self.bcast.as_mut(), self.messages.as_mut()) {
            (Family::Bcast, Some(bcast), _) => bcast.handle_frame_placed(&header, reader, payload),
            (Family::Message, _, Some(messages)) => {
                let result = messages.handle_frame_placed(&header, reader, payload);
                self.take_messages();
                result
            }
            // Only these two place payloads: a stack without the one asked gave no slot.
            _ => Err(FrameError::Malformed("a placed payload nobody asked for")),
        }
    }

    fn placement_lost(&mut self, _now: Instant, slot: Slot) {
        if let Some(messages) = self.messages.as_mut().filter(|m| m.holds(&slot)) {
            messages.slot_lost(slot);
        } else if let Some(bcast) = self.bcast.as_mut() {
            bcast.slot_lost(slot);
        }
    }

    fn handle_timeout(&mut self, now: Instant) {
        if self.node.is_stopped() {
            return;
        }
        self.node.handle_timeout(now);
        self.absorb_node(now);
        if let Some(bcast) = self.bcast.as_mut() {
            bcast.handle_timeout(now);
        }
    }

    fn poll_transmit(
        &mut self,
        now: Instant,
        buf: &mut [u8],
    ) -> Result<Option<Transmit>, BufferTooShort> {
        if let Some(t) = self.poll_node(now, buf)? {
            return Ok(Some(t));
        }
        Ok(self.poll_upper(now, buf, false)?.map(|t| Transmit {
            to: t.to,
            len: t.head,
        }))
    }

    /// As `poll_transmit` (node frames first), broadcast data and message fragments as
    /// shared payloads.
    fn poll_transmit_parts(
        &mut self,
        now: Instant,
        buf: &mut [u8],
    ) -> Result<Option<TransmitParts>, BufferTooShort> {
        if let Some(t) = self.poll_node(now, buf)? {
            return Ok(Some(t.into()));
        }
        self.poll_upper(now, buf, true)
    }

    fn poll_timeout(&self) -> Option<Instant> {
        if self.node.is_stopped() {
            return None;
        }
        let bcast = self.bcast.as_ref().and_then(|b| b.poll_timeout());
        match (self.node.poll_timeout(), bcast) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn poll_event(&mut self) -> Option<StackEvent> {
        if let Some(event) = self.events.pop_front() {
            return Some(event);
        }
        self.bcast.as_mut()?.poll_event().map(StackEvent::Bcast)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::OutputSpec;
    use crate::topology::Topology;
    use alloc::vec;
    use alloc::vec::Vec;
    use ft_core::wire;
    use ft_core::Duration;

    fn config(n: u32, me: Rank) -> DetectorConfig {
        DetectorConfig {
            comm: 3,
            n,
            me,
            period: Duration::from_millis(10),
            timeout: Duration::from_millis(40),
            phase: Duration::from_millis(u64::from(me)),
            span: ft_core::detector::DEFAULT_SPAN,
        }
    }

    /// A tiny network: every frame takes 1 ms; dead ranks neither send nor receive.
    struct Net {
        now: Instant,
        ranks: Vec<RankStack>,
        alive: Vec<bool>,
        /// Ranks whose frames are lost (alive, but silent to the others).
        muted: Vec<bool>,
        in_flight: Vec<(Instant, Rank, Rank, Vec<u8>)>,
        events: Vec<Vec<StackEvent>>,
        buf: Vec<u8>,
        /// Each poll first offers only this many bytes of `buf`; a frame that does not
        /// fit is polled again with the size its `BufferTooShort` asked for.
        offered: Option<usize>,
        /// Polls that returned `BufferTooShort`.
        too_short: usize,
    }

    impl Net {
        fn new(n: u32) -> Self {
            Net {
                now: Instant::ZERO,
                ranks: (0..n)
                    .map(|me| RankStack::new(config(n, me), Instant::ZERO))
                    .collect(),
                alive: vec![true; n as usize],
                muted: vec![false; n as usize],
                in_flight: Vec::new(),
                events: (0..n).map(|_| Vec::new()).collect(),
                buf: vec![0; wire::frame_capacity(n)],
                offered: None,
                too_short: 0,
            }
        }

        fn settle(&mut self, r: Rank) {
            let now = self.now;
            let m = &mut self.ranks[r as usize];
            loop {
                let offered = self.offered.unwrap_or(self.buf.len());
                let t = match m.poll_transmit(now, &mut self.buf[..offered]) {
                    Ok(t) => t,
                    Err(short) => {
                        assert_eq!(short.available, offered);
                        self.too_short += 1;
                        m.poll_transmit(now, &mut self.buf[..short.needed])
                            .expect("the size it asked for fits")
                    }
                };
                let Some(t) = t else {
                    break;
                };
                if self.muted[r as usize] {
                    continue;
                }
                let at = now + Duration::from_millis(1);
                self.in_flight
                    .push((at, r, t.to, self.buf[..t.len].to_vec()));
            }
            while let Some(e) = m.poll_event() {
                self.events[r as usize].push(e);
            }
        }

        /// Runs every frame and timer up to `until`, in time order.
        fn run_until(&mut self, until: Instant) {
            loop {
                let frame = self
                    .in_flight
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, f)| f.0)
                    .map(|(k, f)| (f.0, k));
                let timer = (0..self.ranks.len())
                    .filter(|&r| self.alive[r])
                    .filter_map(|r| self.ranks[r].poll_timeout().map(|t| (t, r)))
                    .min();
                let next = match (frame, timer) {
                    (Some((a, _)), Some((b, _))) => a.min(b),
                    (Some((a, _)), None) => a,
                    (None, Some((b, _))) => b,
                    (None, None) => break,
                };
                if next > until {
                    break;
                }
                self.now = self.now.max(next);
                match (frame, timer) {
                    (Some((a, k)), _) if a == next => {
                        let (_, from, to, bytes) = self.in_flight.swap_remove(k);
                        if self.alive[to as usize] {
                            // As an MPI transport does: large frames (data chunks) are
                            // handed over, small ones lent.
                            let stack = &mut self.ranks[to as usize];
                            let _ = if bytes.len() >= 4096 {
                                stack.handle_message_owned(self.now, from, Bytes::from(bytes))
                            } else {
                                stack.handle_message(self.now, from, &bytes)
                            };
                            self.settle(to);
                        }
                    }
                    (_, Some((_, r))) => {
                        self.ranks[r].handle_timeout(self.now);
                        self.settle(r as Rank);
                    }
                    _ => unreachable!(),
                }
            }
            self.now = until;
        }

        fn released(&self, r: Rank) -> Vec<u32> {
            let mut got: Vec<u32> = self.events[r as usize]
                .iter()
                .filter_map(|e| match e {
                    StackEvent::Bcast(BcastEvent::Released { outputs, .. }) => Some(outputs),
                    _ => None,
                })
                .flat_map(|s| s.iter())
                .collect();
            got.sort_unstable();
            got
        }
    }

    fn ms(v: u64) -> Instant {
        Instant::ZERO + Duration::from_millis(v)
    }

    fn spec(n: u32) -> PlanSpec {
        PlanSpec::new(n, 0)
            .with_topology(Topology::Chain)
            .with_output(OutputSpec::new("A", 100, vec![1, 2, 3]))
            .with_output(OutputSpec::new("B", 70_000, vec![3]))
    }

    fn payloads() -> Vec<Vec<u8>> {
        vec![vec![7; 100], (0..70_000u32).map(|i| i as u8).collect()]
    }

    /// Four ranks whose detectors ran 25 ms, then rank 0 starts broadcasting `spec(4)`.
    fn four_ranks_broadcasting_at_25ms() -> Net {
        four_ranks_broadcasting_at_25ms_with(true)
    }

    /// [`four_ranks_broadcasting_at_25ms`] with [`Config::eager_push`] as given.
    fn four_ranks_broadcasting_at_25ms_with(eager_push: bool) -> Net {
        let mut net = Net::new(4);
        for (me, stack) in net.ranks.iter_mut().enumerate() {
            let mut bcast = Config::new(3, 4, me as Rank);
            bcast.eager_push = eager_push;
            *stack = RankStack::with_config(config(4, me as Rank), bcast, Instant::ZERO);
        }
        net.run_until(ms(25));
        net.ranks[0]
            .start_broadcast(net.now, 1, Bytes::new(), spec(4), payloads())
            .unwrap();
        net.settle(0);
        net
    }

    #[test]
    fn short_transmit_buffers_lose_and_garble_no_frame() {
        let mut net = Net::new(4);
        // A heartbeat (14 bytes) fits; notices, requests and data chunks do not.
        net.offered = Some(20);
        net.run_until(ms(25));
        net.ranks[0]
            .start_broadcast(net.now, 1, Bytes::new(), spec(4), payloads())
            .unwrap();
        net.settle(0);
        net.run_until(ms(60));
        assert!(net.too_short > 0);
        assert_eq!(net.released(3), vec![0, 1]);
        let rank3 = net.ranks[3].broadcaster().unwrap();
        let payloads = payloads();
        assert_eq!(rank3.output(TaskId::new(0, 1), 0), Some(&payloads[0][..]));
        assert_eq!(rank3.output(TaskId::new(0, 1), 1), Some(&payloads[1][..]));
    }

    #[test]
    fn released_broadcasts_free_their_payloads() {
        let mut net = four_ranks_broadcasting_at_25ms();
        net.run_until(ms(60));
        assert_eq!(net.released(3), vec![0, 1]);
        let total: usize = payloads().iter().map(Vec::len).sum();
        assert_eq!(
            net.ranks[0].held_bytes(),
            total,
            "the root keeps its payloads"
        );
        assert_eq!(
            net.ranks[3].held_bytes(),
            total,
            "rank 3 needs both outputs"
        );
        for r in 0..4 {
            net.ranks[r].release(TaskId::new(0, 1));
            assert_eq!(net.ranks[r].held_bytes(), 0, "rank {r} after release");
            net.ranks[r].release(TaskId::new(0, 1));
        }
        assert_eq!(
            net.ranks[3]
                .broadcaster()
                .unwrap()
                .output(TaskId::new(0, 1), 1),
            None
        );
    }

    #[test]
    fn recognize_goes_through_the_stack() {
        let mut net = Net::new(4);
        net.alive[2] = false;
        net.run_until(ms(200));
        let stack = &mut net.ranks[0];
        assert_eq!(
            stack.recognize(2),
            Err(ViewError::NotFailed(2)),
            "not validated"
        );
        stack.validate_local(net.now).unwrap();
        assert_eq!(stack.recognize(2), Ok(()));
        let view = stack.node().view();
        let info = view.rank_info(ft_core::Scope::Local, 2).unwrap().0;
        assert_eq!(info.state, ft_core::RankState::Null);
    }

    #[test]
    fn a_broadcast_runs_beside_the_detector() {
        let mut net = four_ranks_broadcasting_at_25ms();
        net.run_until(ms(60));
        assert_eq!(net.released(1), vec![0]);
        assert_eq!(net.released(2), vec![0]);
        assert_eq!(net.released(3), vec![0, 1]);
        assert_eq!(
            net.ranks[3]
                .broadcaster()
                .unwrap()
                .output(TaskId::new(0, 1), 1),
            Some(&payloads()[1][..])
        );
        // Output 1's chunks came in frames handed over and were kept in them; output
        // 0's one chunk (100 bytes) came lent and was copied.
        let stats = net.ranks[3].bcast_stats();
        assert_eq!(
            (stats.received_bytes_in_place, stats.received_bytes_copied),
            (70_000, 100)
        );
    }

    #[test]
    fn a_revoke_fails_in_flight_broadcasts_with_a_typed_error() {
        // Pull only, so that rank 1 waits a round trip for its data: activated at 26 ms,
        // it asks for it; rank 3 revokes at 26 ms. (With eager push the data comes with
        // the activation and nothing is in flight at a whole millisecond here.)
        let mut net = four_ranks_broadcasting_at_25ms_with(false);
        net.run_until(ms(26));
        net.ranks[3].revoke(net.now).unwrap();
        net.settle(3);
        net.run_until(ms(60));
        for r in 0..4 {
            assert!(
                net.events[r as usize]
                    .iter()
                    .any(|e| matches!(e, StackEvent::Node(NodeEvent::Revoked { by: 3 }))),
                "rank {r} learned of the revoke"
            );
        }
        assert!(net.events[1].iter().any(|e| matches!(
            e,
            StackEvent::Bcast(BcastEvent::Failed {
                task: TaskId { root: 0, key: 1 },
                error: BcastError::Revoked
            })
        )));
        assert!(
            !net.released(3).contains(&1),
            "nothing completes on a revoked communicator"
        );
        assert!(matches!(
            net.ranks[0].start_broadcast(net.now, 2, Bytes::new(), spec(4), payloads()),
            Err(StackError::Bcast(BcastError::Revoked))
        ));
    }

    #[test]
    fn a_relay_found_dead_by_the_detector_is_repaired_around() {
        // Rank 1 dies before the broadcast: nobody knows yet, so the plan holds it.
        // Once the detector declares it, 2 and 3 are re-attached to the root.
        let mut net = Net::new(4);
        net.run_until(ms(5));
        net.alive[1] = false;
        net.ranks[0]
            .start_broadcast(net.now, 1, Bytes::new(), spec(4), payloads())
            .unwrap();
        net.settle(0);
        net.run_until(ms(200));
        for r in [0, 2, 3] {
            assert!(
                net.ranks[r].node().view().is_known_failed(1),
                "rank {r} never learned"
            );
        }
        assert_eq!(net.released(2), vec![0]);
        assert_eq!(net.released(3), vec![0, 1]);
        // A later broadcast leaves the known-dead rank out of the plan.
        net.ranks[0]
            .start_broadcast(net.now, 2, Bytes::new(), spec(4), payloads())
            .unwrap();
        net.settle(0);
        net.run_until(ms(220));
        assert_eq!(
            net.ranks[3]
                .broadcaster()
                .unwrap()
                .output(TaskId::new(0, 2), 0),
            Some(&[7u8; 100][..])
        );
    }

    #[test]
    fn a_plan_built_once_serves_many_broadcasts() {
        let mut net = Net::new(4);
        net.run_until(ms(25));
        let plan = Plan::build(spec(4)).unwrap();
        for task in [1, 2] {
            net.ranks[0]
                .start_planned(net.now, task, Bytes::new(), &plan, payloads())
                .unwrap();
            net.settle(0);
        }
        net.run_until(ms(60));
        let rank3 = net.ranks[3].broadcaster().unwrap();
        for task in [1, 2] {
            assert_eq!(
                rank3.output(TaskId::new(0, task), 1),
                Some(&payloads()[1][..]),
                "task {task}"
            );
        }
        assert!(matches!(
            net.ranks[0].start_planned(
                net.now,
                3,
                Bytes::new(),
                &Plan::build(spec(5)).unwrap(),
                payloads()
            ),
            Err(StackError::Bcast(BcastError::WrongSize { plan: 5 }))
        ));
    }

    #[test]
    fn a_plan_that_predates_a_known_death_is_planned_again_without_it() {
        // The plan (a chain 0 → 1 → 2 → 3) was built while rank 1 lived; rank 0 has
        // since learned that 1 died, so the broadcast must not route through it.
        let plan = Plan::build(spec(4)).unwrap();
        let mut net = Net::new(4);
        net.run_until(ms(5));
        net.alive[1] = false;
        net.run_until(ms(200));
        assert!(net.ranks[0].node().view().is_known_failed(1));
        net.ranks[0]
            .start_planned(net.now, 1, Bytes::new(), &plan, payloads())
            .unwrap();
        net.settle(0);
        assert!(
            net.in_flight.iter().all(|f| f.2 != 1),
            "a frame went to the dead rank"
        );
        net.run_until(ms(220));
        assert_eq!(net.released(3), vec![0, 1]);
    }

    #[test]
    fn frames_from_known_dead_ranks_are_refused_and_only_the_root_starts() {
        let mut net = Net::new(4);
        net.alive[2] = false;
        net.run_until(ms(200));
        let frame = Header {
            kind: ft_core::wire::FrameKind::BcastRequest,
            comm: 3,
            epoch: 1,
            sender: 2,
        }
        .start()
        .finish();
        assert_eq!(
            net.ranks[3].handle_message(net.now, 2, &frame),
            Err(FrameError::FromFailedRank(2))
        );
        assert_eq!(
            net.ranks[1].start_broadcast(net.now, 1, Bytes::new(), spec(4), payloads()),
            Err(StackError::Bcast(BcastError::NotRoot { root: 0 }))
        );
    }

    #[test]
    fn a_rank_declared_dead_stops_the_whole_stack() {
        // Rank 2's frames are lost: the others declare it dead, and their notice tells it.
        let mut net = Net::new(4);
        net.muted[2] = true;
        net.run_until(ms(200));
        let stack = &mut net.ranks[2];
        assert!(stack.is_stopped());
        assert!(net.events[2]
            .iter()
            .any(|e| matches!(e, StackEvent::Node(NodeEvent::DeclaredDeadSelf { .. }))));
        assert_eq!(stack.poll_timeout(), None);
        assert_eq!(stack.poll_transmit(net.now, &mut net.buf), Ok(None));
        assert_eq!(
            stack.start_broadcast(net.now, 9, Bytes::new(), spec(4), payloads()),
            Err(StackError::Node(NodeError::Stopped))
        );
        net.ranks[0]
            .start_broadcast(net.now, 1, Bytes::new(), spec(4), payloads())
            .unwrap();
        net.settle(0);
        net.run_until(ms(210));
        assert_eq!(net.released(3), vec![0, 1], "2 is left out of the plan");
    }
}
