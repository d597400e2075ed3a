//! [`Transport`]: what a backend's network gives the [`crate::Driver`]: frames to and
//! from the ranks of one communicator, with dead peers as dropped frames, never errors.

use std::fmt;
use std::sync::Arc;
use std::time::Duration as StdDuration;

pub use bytes::Bytes;
use ft_core::{wire, Filled, Rank, Slot};

/// What one receive attempt found.
#[derive(Debug, PartialEq, Eq)]
pub enum Received<'a> {
    /// A frame from `from`.
    Frame {
        /// The sending rank.
        from: Rank,
        /// The frame's bytes.
        bytes: &'a [u8],
    },
    /// A frame from `from`, handed over: the receiver may keep slices of it (a
    /// broadcast chunk) instead of copying them
    /// ([`ft_core::Protocol::handle_message_owned`]). A transport hands over a frame
    /// whose receive buffer it can give up (and replace), typically a large one; the
    /// bytes are the frame's, exactly as [`Received::Frame`] would have lent them.
    Owned {
        /// The sending rank.
        from: Rank,
        /// The frame.
        frame: Bytes,
    },
    /// A message longer than any frame of this communicator arrived from `from` and was
    /// discarded.
    Oversized {
        /// The sending rank.
        from: Rank,
        /// Its length.
        len: usize,
    },
}

/// Where a payload that follows its head should be received: `place(from, head, len)`
/// gives a [`Slot`] of `len` bytes, or `None` for the transport's own buffer
/// ([`Transport::try_recv_placing`]; the driver passes the machine's
/// [`ft_core::Protocol::place_payload`]).
pub type Place<'p> = dyn FnMut(Rank, &[u8], usize) -> Option<Slot> + 'p;

/// What one receive attempt found, payloads received in place included
/// ([`Transport::try_recv_placing`]).
#[derive(Debug)]
pub enum Delivery<'a> {
    /// A frame as [`Transport::try_recv`] gives it.
    Received(Received<'a>),
    /// A frame from `from` whose payload was received into the slot the caller gave
    /// for it: its head (lent, valid until the next call) and the slot, filled
    /// ([`ft_core::Protocol::handle_message_placed`]).
    Placed {
        /// The sending rank.
        from: Rank,
        /// The frame's bytes before its payload.
        head: &'a [u8],
        /// The payload, where the caller wanted it.
        payload: Filled,
    },
    /// A slot the caller gave for a payload that never filled it (its sender died
    /// during the transfer, or sent another length than its head said): it comes back
    /// unwritten ([`ft_core::Protocol::placement_lost`]).
    Unplaced {
        /// The slot.
        slot: Slot,
    },
}

impl<'a> Delivery<'a> {
    /// What [`Transport::try_recv`] gives for this delivery, for a transport whose
    /// `try_recv` is its `try_recv_placing` placing nothing: a frame placed by an
    /// earlier placing call comes out whole, as a copy ([`Received::Owned`]); a slot
    /// that came back unfilled is dropped (its range stays claimed, never written) and
    /// nothing is received this time.
    pub fn into_received(self) -> Option<Received<'a>> {
        match self {
            Delivery::Received(received) => Some(received),
            Delivery::Placed {
                from,
                head,
                payload,
            } => Some(Received::Owned {
                from,
                frame: Bytes::from(payload.behind(head)),
            }),
            Delivery::Unplaced { .. } => None,
        }
    }
}

impl Received<'_> {
    /// The sender and the bytes of a frame, lent or handed over; `None` for
    /// [`Received::Oversized`].
    pub fn frame(&self) -> Option<(Rank, &[u8])> {
        match self {
            Received::Frame { from, bytes } => Some((*from, bytes)),
            Received::Owned { from, frame } => Some((*from, frame)),
            Received::Oversized { .. } => None,
        }
    }
}

/// Frames between the ranks of one communicator.
///
/// Contract: `send` copies the frame (the caller's buffer is reused at once) and
/// treats a dead peer as a dropped frame, not an error; the protocol learns of deaths
/// from its own detector. An error is a failure of the transport itself, and ends the
/// rank's loop.
pub trait Transport {
    /// A failure of the transport itself.
    type Error: fmt::Display;
    /// This rank.
    fn rank(&self) -> Rank;
    /// The communicator's size.
    fn size(&self) -> u32;
    /// Starts sending `frame` to `to` (below [`Transport::size`]).
    fn send(&mut self, to: Rank, frame: &[u8]) -> Result<(), Self::Error>;
    /// Starts sending one frame made of `head` followed by `payload` to `to`: the
    /// bulk-data path, where `payload` is a slice of a broadcast's shared buffer. A
    /// transport that can send from two places at once (an MPI datatype, an iovec)
    /// keeps a clone of `payload` until the send completes and copies none of it, and
    /// says so in [`Transport::copies_payload`]. The default copies both into one
    /// frame and calls [`Transport::send`].
    fn send_parts(&mut self, to: Rank, head: &[u8], payload: &Bytes) -> Result<(), Self::Error> {
        let mut frame = Vec::with_capacity(head.len() + payload.len());
        frame.extend_from_slice(head);
        frame.extend_from_slice(payload);
        self.send(to, &frame)
    }
    /// Starts sending `frame`, then the frame made of `head` and `payload`, both to
    /// `to`: what [`Transport::send`] then [`Transport::send_parts`] do (the default),
    /// for a transport that can send the two as one message. The driver calls it when
    /// the machine's next frame after a control frame carries a payload to the same
    /// peer (a broadcast's activation and the data pushed right behind it), and every
    /// message saved is a message delay and a receive less per tree edge. The receiver
    /// must hand the two on as two frames, in this order.
    fn send_then_parts(
        &mut self,
        to: Rank,
        frame: &[u8],
        head: &[u8],
        payload: &Bytes,
    ) -> Result<(), Self::Error> {
        self.send(to, frame)?;
        self.send_parts(to, head, payload)
    }
    /// Whether [`Transport::send_parts`] copies the payload (the default does).
    fn copies_payload(&self) -> bool {
        true
    }
    /// Whether this transport sends a frame's head ahead of its payload
    /// ([`Transport::send_head`], [`Transport::send_promised`]) in a way that lets the
    /// receiver post the payload's receive before the payload leaves (MPI: the head
    /// names the payload's own tag). A driver built with [`crate::Driver::for_stack`]
    /// then lets the broadcaster send heads early (`Config::early_heads` in `ft-bcast`).
    /// Default: no, and the driver never calls the three methods below.
    fn sends_heads_early(&self) -> bool {
        false
    }
    /// Starts sending `head` to `to`, the head of a frame whose payload of `len` bytes
    /// follows later under `promise` ([`ft_core::Promise`]); `first`, a whole frame,
    /// goes before it (joined into one message if the transport can, as
    /// [`Transport::send_then_parts`] does). The receiver sees the frame (`first`, then
    /// head and payload) as if it was sent whole when the payload is. A dead peer is
    /// not an error. Called only if [`Transport::sends_heads_early`]; the default sends
    /// `first` and drops the head.
    fn send_head(
        &mut self,
        to: Rank,
        first: Option<&[u8]>,
        head: &[u8],
        len: usize,
        promise: u64,
    ) -> Result<(), Self::Error> {
        let _ = (head, len, promise);
        match first {
            Some(frame) => self.send(to, frame),
            None => Ok(()),
        }
    }
    /// Starts sending the payload promised under `promise` to the peer its head went
    /// to, without copying it (a clone of `payload` is kept until the send completes).
    /// A promise whose peer was forgotten ([`Transport::forget_peer`]) sends nothing.
    /// Called only if [`Transport::sends_heads_early`]; the default does nothing.
    fn send_promised(&mut self, promise: u64, payload: &Bytes) -> Result<(), Self::Error> {
        let _ = (promise, payload);
        Ok(())
    }
    /// The payload promised under `promise` will not come: the receiver's wait for it
    /// ends, the frame lost. Called only if [`Transport::sends_heads_early`]; the
    /// default does nothing.
    fn withdraw(&mut self, promise: u64) -> Result<(), Self::Error> {
        let _ = promise;
        Ok(())
    }
    /// The data chunk this transport sends best, in bytes (positive): the driver's stack
    /// sends broadcast chunks of at most this ([`crate::Driver::for_stack`]). A transport
    /// must receive frames of [`wire::frame_capacity_for`]`(size, chunk_bytes)` bytes.
    /// Default: [`wire::MAX_CHUNK`].
    fn chunk_bytes(&self) -> usize {
        wire::MAX_CHUNK
    }
    /// The longest data chunk the driver's stack sends to a leaf (a child that relays
    /// nothing, so nothing is pipelined behind it), if it may be longer than
    /// [`Transport::chunk_bytes`]: a transport that receives a payload of any length
    /// behind its head, and whose cost is per message, sends a leaf each output whole,
    /// and the leaf joins no chunks ([`crate::Driver::for_stack`]). Default: none (leaves
    /// get [`Transport::chunk_bytes`] chunks, and receive buffers stay
    /// [`wire::frame_capacity_for`] long).
    fn leaf_chunk_bytes(&self) -> Option<usize> {
        None
    }
    /// The stack learned that `rank` is dead: drop whatever is kept for it (pending
    /// sends, one-sided transfers it would have read). Called once per death by a
    /// driver built with [`crate::Driver::for_stack`]. Default: nothing is kept.
    fn forget_peer(&mut self, rank: Rank) {
        let _ = rank;
    }
    /// Receives one frame if one has arrived: lent ([`Received::Frame`], valid until
    /// the next call) or handed over ([`Received::Owned`]), as the transport chooses.
    fn try_recv(&mut self) -> Result<Option<Received<'_>>, Self::Error>;
    /// [`Transport::try_recv`] for a transport that receives a frame's head before its
    /// payload: it asks `place(from, head, len)` where the `len` payload bytes should go,
    /// and a payload received into the [`Slot`] it was given comes out as
    /// [`Delivery::Placed`] (or, never filled, the slot as [`Delivery::Unplaced`]);
    /// otherwise as `try_recv` would give it. The driver passes the machine's
    /// [`ft_core::Protocol::place_payload`]. Default: `try_recv`, placing nothing.
    fn try_recv_placing(
        &mut self,
        place: &mut Place<'_>,
    ) -> Result<Option<Delivery<'_>>, Self::Error> {
        let _ = place;
        Ok(self.try_recv()?.map(Delivery::Received))
    }
    /// Completes finished sends (freeing their buffers).
    fn progress(&mut self) -> Result<(), Self::Error>;
    /// Sends not completed yet.
    fn pending_sends(&self) -> usize;
    /// Waits at most `timeout` for a frame, when there is nothing to do; may return
    /// early for any reason. The default sleeps the whole `timeout`: transports whose
    /// network has a wait object (an OS handle that wakes on arrival) override it, and
    /// [`Transport::wakes_on_arrival`].
    fn wait(&mut self, timeout: StdDuration) -> Result<(), Self::Error> {
        std::thread::sleep(timeout);
        Ok(())
    }
    /// Whether [`Transport::wait`] returns as soon as a frame arrives, so that an idle
    /// loop may wait until its next timer instead of napping (default: no).
    fn wakes_on_arrival(&self) -> bool {
        false
    }
    /// While an idle loop spins (within its spin window, [`crate::Driver::set_idle`]), it
    /// yields the CPU (`sched_yield`) every this many rounds and only pauses the core
    /// (`spin_loop`) in between. A yield is a system call, most of an idle round's
    /// cost; whether it pays depends on where the transport's progress happens, so the
    /// transport says. Default: [`DEFAULT_IDLE_YIELD_EVERY`].
    fn idle_yield_every(&self) -> u32 {
        DEFAULT_IDLE_YIELD_EVERY
    }
    /// A handle that ends a [`Transport::wait`] from another thread, if the transport
    /// has one (default: none). With it, a progress thread may wait in the transport
    /// until its next timer, and application threads wake it when they give it work.
    fn waker(&self) -> Option<Arc<dyn Wake>> {
        None
    }
}

/// The default of [`Transport::idle_yield_every`]: 16. Over Open MPI's shared memory
/// (the receiver polls memory the sender writes), yielding every round made
/// `validate_global` slower at n = 4 and 8 on 2 cores (`ftmpi bench`, alternated:
/// 2.8-3.1× against 3.1-3.4× `MPIX_Comm_agree` at n = 4, 3.0-4.4× against 5.6-8.8×
/// at n = 8; every 4th or 64th round did no better). With today's receive ring the two
/// are within the noise of each other (n = 2, 4, 8: 1.79-2.26, 3.04-3.52, 3.44-5.38
/// every 16th against 1.66-2.04, 3.13-3.46, 3.36-3.78 every round, three alternated
/// runs each, load 2-4).
pub const DEFAULT_IDLE_YIELD_EVERY: u32 = 16;

/// Ends a transport's [`Transport::wait`] from any thread (spuriously if nobody waits).
pub trait Wake: Send + Sync {
    /// Wakes the waiting thread, or makes its next wait return at once.
    fn wake(&self);
}
