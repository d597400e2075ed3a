//! The one face every protocol state machine shows to a backend.
//!
//! A backend owns the clock and the network and runs this loop for each rank:
//!
//! 1. on a received frame: [`Protocol::handle_message`]`(now, from, bytes)`;
//! 2. when the clock passes [`Protocol::poll_timeout`]: [`Protocol::handle_timeout`]`(now)`;
//! 3. after either, and after any application command: drain
//!    [`Protocol::poll_transmit`] (send each frame to `Transmit::to`; machines queue
//!    typed messages and encode each one only here, in place, into the caller's
//!    buffer), then drain
//!    [`Protocol::poll_event`];
//! 4. sleep until the next frame or the new `poll_timeout`.
//!
//! **Bulk data.** A backend that can send one frame from two places (an iovec, an MPI
//! datatype, a simulator that keeps references) drains [`Protocol::poll_transmit_parts`]
//! instead of [`Protocol::poll_transmit`]: a frame that carries bulk data (a broadcast
//! chunk) then comes out as its head, encoded in place into the caller's buffer, plus
//! the payload as a shared [`Bytes`] slice of the buffer the data already lives in, so
//! the machine copies none of it. On the wire the frame is the head followed by the
//! payload, byte for byte what [`Protocol::poll_transmit`] writes contiguously: the
//! receiver cannot tell the two paths apart. A backend drains one of the two methods,
//! not both in turn. Machines without bulk data keep the default, which is
//! `poll_transmit` with no payload.
//!
//! Why a second method rather than a payload field in [`Transmit`]: `Transmit` stays a
//! `Copy` pair that every machine builds, and only the machines that carry bulk data (the
//! broadcaster and the stacks that hold it) implement the split form; a backend that
//! wants one contiguous frame keeps calling `poll_transmit` and needs no change.
//!
//! **Owned frames.** A backend whose receive buffer can become the frame itself (a
//! transport that hands a completed receive buffer over instead of lending it) feeds
//! it with [`Protocol::handle_message_owned`]: a machine that keeps bulk data (a
//! broadcast chunk) then keeps it as a shared slice of that frame instead of copying it
//! out. The frame is the same bytes either way, and so is the machine's answer; the
//! default borrows it and calls [`Protocol::handle_message`].
//!
//! **Payloads received in place.** A transport that receives a frame's head before its
//! payload (MPI: the payload is its own message behind its head) may ask the machine
//! where the payload should go: [`Protocol::place_payload`] answers with a [`Slot`] of
//! the machine's own buffer (a [`crate::landing::Landing`]: a broadcast output's one
//! buffer), or `None` for the transport's own buffer as before. A payload received into
//! a slot comes back through [`Protocol::handle_message_placed`] (head, and the slot
//! filled), which has the outcome `handle_message` would have on the whole frame; one
//! that never arrived (its sender died) gives its slot back through
//! [`Protocol::placement_lost`]. The defaults place nothing.
//!
//! **Heads sent ahead of their payload.** A machine that will send a frame with bulk
//! data it does not hold yet (a relay's data for a child, announced in the child's
//! activation) may, if its backend asked for it, send the frame's head now and its
//! payload later ([`TransmitParts::promise`], [`Promise`]): the receiver then knows where
//! the payload goes before it leaves, and a transport that receives payloads in place
//! posts that receive at once, so no head travels between the data's arrival at the
//! relay and its departure. The receiver sees the frame as if it was sent whole when its
//! payload was ([`Promise::Payload`]); a frame whose payload is withdrawn
//! ([`Promise::Withdrawn`]) is a frame never sent. A backend that cannot send a head
//! early keeps it and sends the whole frame at [`Promise::Payload`]. Machines make
//! promises only when their backend asked for them (for the broadcaster:
//! `Config::early_heads`).
//!
//! Time passed in only moves forward; a machine treats an `Instant` earlier than one it
//! saw as equal to it, and a `handle_timeout` that comes early does nothing.

pub use bytes::Bytes;

/// `part` as a slice of `frame` (no copy) if it lies within it; `None` if it does not
/// (a reader over other bytes than `frame`). Address arithmetic only: nothing is read.
pub fn slice_of_frame(frame: &Bytes, part: &[u8]) -> Option<Bytes> {
    // A part outside the frame makes the subtraction wrap and fails the bounds check.
    let start = (part.as_ptr() as usize).wrapping_sub(frame.as_ptr() as usize);
    let within = start <= frame.len() && part.len() <= frame.len() - start;
    within.then(|| frame.slice(start..start + part.len()))
}

use alloc::vec::Vec;

use crate::error::{BufferTooShort, FrameError};
use crate::landing::{Filled, Slot};
use crate::rank::Rank;
use crate::time::Instant;

/// A frame ready to send: `len` bytes at the start of the caller's buffer go to `to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transmit {
    /// Destination rank.
    pub to: Rank,
    /// Length of the frame written into the caller's buffer.
    pub len: usize,
}

/// A frame ready to send in two parts: `head` bytes at the start of the caller's buffer,
/// then `payload` (if any), go to `to` as one frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransmitParts {
    /// Destination rank.
    pub to: Rank,
    /// Length of the head written into the caller's buffer.
    pub head: usize,
    /// The bulk bytes that end the frame: a shared slice of a buffer the machine keeps
    /// (the backend may hold this clone until its send completes).
    pub payload: Option<Bytes>,
    /// `None` for a whole frame (head and payload, if any, sent now); else the frame is
    /// a head sent ahead of its payload, or that payload, or its withdrawal (see the
    /// [module docs](self)).
    pub promise: Option<Promise>,
}

/// A frame sent in two steps, its head ahead of its payload (see the
/// [module docs](self)). `id` is the sending machine's own, never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Promise {
    /// The head, in the caller's buffer, of a frame whose payload of `len` bytes follows
    /// under `id` ([`TransmitParts::payload`] is `None`).
    Head {
        /// The promise.
        id: u64,
        /// The payload's length.
        len: usize,
    },
    /// The payload promised under `id` ([`TransmitParts::head`] is 0): it goes to the
    /// peer the head went to.
    Payload {
        /// The promise.
        id: u64,
    },
    /// The payload promised under `id` will not come (its broadcast was forgotten
    /// here): the receiver's wait for it ends and the frame is lost. No head, no
    /// payload.
    Withdrawn {
        /// The promise.
        id: u64,
    },
}

/// Heads sent ahead of their payloads ([`Promise`]), kept by a backend that sends every
/// frame whole (the simulator; a driver over a transport that does not send heads
/// early): the whole frame goes when its payload does. One per sending machine, whose
/// promise ids it keys by.
#[derive(Debug, Default)]
pub struct HeldHeads {
    heads: hashbrown::HashMap<u64, HeldHead>,
}

/// A head kept until its payload comes ([`HeldHeads`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldHead {
    /// Where the frame goes.
    pub to: Rank,
    /// The head's bytes.
    pub head: Vec<u8>,
    /// The payload's promised length.
    pub len: usize,
}

impl HeldHeads {
    /// One step of a frame sent in two, its head `head` (as written with the step) to
    /// `to`: a [`Promise::Head`] is kept; a [`Promise::Payload`] gives its head back (the
    /// whole frame is that head, then the payload, to the head's peer); a
    /// [`Promise::Withdrawn`] drops it. `None` but for a payload whose head is kept (a
    /// head whose peer was forgotten is not).
    pub fn step(&mut self, to: Rank, head: &[u8], promise: Promise) -> Option<HeldHead> {
        match promise {
            Promise::Head { id, len } => {
                let head = head.to_vec();
                self.heads.insert(id, HeldHead { to, head, len });
                None
            }
            Promise::Payload { id } => self.heads.remove(&id),
            Promise::Withdrawn { id } => {
                self.heads.remove(&id);
                None
            }
        }
    }

    /// Drops the heads kept for `rank`, which died: their payloads go nowhere.
    pub fn forget_peer(&mut self, rank: Rank) {
        self.heads.retain(|_, held| held.to != rank);
    }
}

impl TransmitParts {
    /// The frame's length on the wire.
    pub fn len(&self) -> usize {
        self.head + self.payload.as_ref().map_or(0, Bytes::len)
    }

    /// Whether the frame is empty (never, for a frame of the library's machines).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl From<Transmit> for TransmitParts {
    fn from(t: Transmit) -> Self {
        TransmitParts {
            to: t.to,
            head: t.len,
            payload: None,
            promise: None,
        }
    }
}

/// The sans-IO protocol face: frames and time in; frames, a deadline and events out.
pub trait Protocol {
    /// What the machine reports to the application.
    type Event;

    /// Feeds one frame received from `from`. A rejected frame changes nothing and its
    /// error says why (the backend may log it; it must not stop the rank).
    fn handle_message(&mut self, now: Instant, from: Rank, bytes: &[u8]) -> Result<(), FrameError>;

    /// [`Protocol::handle_message`] with the frame handed over, shared: a machine may
    /// keep slices of `frame` (bulk data) instead of copying them (see the
    /// [module docs](self)). Same contract and same outcome as `handle_message` on
    /// the same bytes. The default borrows the frame and calls `handle_message`.
    fn handle_message_owned(
        &mut self,
        now: Instant,
        from: Rank,
        frame: Bytes,
    ) -> Result<(), FrameError> {
        self.handle_message(now, from, &frame)
    }

    /// A frame's head `head` came from `from`, and `len` payload bytes follow it (the
    /// frame is `head` then the payload): the machine's own memory to receive them into,
    /// a [`Slot`] of exactly `len` bytes, or `None` (the default) for the transport's
    /// buffer and then [`Protocol::handle_message_owned`]. A machine that answers a slot
    /// gets the frame back through [`Protocol::handle_message_placed`], or the slot
    /// through [`Protocol::placement_lost`]. Nothing is checked for good here but the
    /// slot's fit: the frame is checked when it comes back.
    fn place_payload(
        &mut self,
        _now: Instant,
        _from: Rank,
        _head: &[u8],
        _len: usize,
    ) -> Option<Slot> {
        None
    }

    /// The frame whose head is `head` and whose payload was received into the slot that
    /// [`Protocol::place_payload`] gave (now `payload`, filled). Same contract and same
    /// outcome as `handle_message` on the whole frame. The default (for a machine that
    /// places nothing, so never called by a correct transport) joins the two and calls
    /// `handle_message`.
    fn handle_message_placed(
        &mut self,
        now: Instant,
        from: Rank,
        head: &[u8],
        payload: Filled,
    ) -> Result<(), FrameError> {
        self.handle_message(now, from, &payload.behind(head))
    }

    /// A slot that [`Protocol::place_payload`] gave was not filled (its sender died
    /// during the transfer, or the frame was refused): it comes back unwritten. The
    /// default drops it.
    fn placement_lost(&mut self, _now: Instant, _slot: Slot) {}

    /// Tells the machine the clock reached `now`; timers due by then fire.
    fn handle_timeout(&mut self, now: Instant);

    /// Encodes the next queued frame in place at the start of `buf`: `Ok(None)` when
    /// nothing is queued.
    ///
    /// A frame longer than `buf` is [`BufferTooShort`] (with the size it needs): the
    /// frame stays queued, and the next call with a large enough buffer sends it intact.
    /// [`crate::wire::frame_capacity`] of the communicator size always suffices.
    fn poll_transmit(
        &mut self,
        now: Instant,
        buf: &mut [u8],
    ) -> Result<Option<Transmit>, BufferTooShort>;

    /// [`Protocol::poll_transmit`], but a frame that carries bulk data comes out as a head
    /// written into `buf` plus its payload, shared, not copied (see the
    /// [module docs](self)); the head followed by the payload is the very frame
    /// `poll_transmit` would have written. The same error contract: a head longer than
    /// `buf` is [`BufferTooShort`] and the frame stays queued. The default has no bulk
    /// data: it is `poll_transmit` with no payload.
    fn poll_transmit_parts(
        &mut self,
        now: Instant,
        buf: &mut [u8],
    ) -> Result<Option<TransmitParts>, BufferTooShort> {
        Ok(self.poll_transmit(now, buf)?.map(TransmitParts::from))
    }

    /// The earliest instant at which `handle_timeout` has work to do.
    fn poll_timeout(&self) -> Option<Instant>;

    /// The next event for the application.
    fn poll_event(&mut self) -> Option<Self::Event>;
}
