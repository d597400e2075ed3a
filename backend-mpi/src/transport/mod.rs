//! [`MpiTransport`]: frames between ranks of one MPI communicator, with the failure
//! semantics the protocol machines expect.
//!
//! The transport works on two duplicates of the communicator it is given, both with
//! `MPI_ERRORS_RETURN`, so a dead peer is a return code, never an abort. Frames travel
//! on the first as `MPI_UINT8_T` messages told apart by their tag: a whole frame, a
//! frame's head whose payload follows ([`HEAD_TAG`]), a head sent ahead of its payload
//! ([`PROMISED_HEAD_TAG`]), or one of these with another frame joined in front of it
//! ([`JOINED_TAG`], [`JOINED_HEAD_TAG`], [`JOINED_PROMISED_HEAD_TAG`]). Bulk payloads
//! travel on the second, each as a contiguous message of its own, sent from the
//! caller's [`Bytes`] and received straight into the caller's memory where it says
//! ([`MpiTransport::try_recv_placing`]). Sends are nonblocking and completed by
//! [`MpiTransport::progress`]; receives come from a ring of [`RECV_SLOTS`] pre-posted
//! any-source receives.
//!
//! A send to a peer that died is dropped and counted, a frame whose sender died in
//! transfer is lost and counted ([`TransportStats`]): the protocol learns of deaths from
//! its own detector, and every frame it sends to a rank it will find dead is one it no
//! longer needs delivered. With the `ulfm` feature the transport acknowledges failures
//! (`MPIX_Comm_ack_failed`) so that its any-source receives keep working after a process
//! died.
//!
//! Invariants:
//!
//! - every buffer handed to MPI stays alive, unmoved, until its request completes or
//!   the transport is dropped;
//! - a ring buffer is a `Vec` of at least the frame capacity
//!   ([`ft_core::wire::frame_capacity`]) whose length is 0 while its receive is posted
//!   and, once the receive completed, the count MPI wrote (never more than its
//!   capacity): only bytes MPI wrote are ever read, and new buffers are never zeroed;
//! - the ring's slots are posted in ring order (a slot is re-posted before the head
//!   moves past it), which is what makes the head the first to match, so frames are
//!   handed on in the order MPI matched them and frames from one sender keep their
//!   order;
//! - a payload that follows its head at once is the next message from that sender
//!   under the frame tag on the payload communicator (MPI's non-overtaking rule), so
//!   a receiver never has to match payloads to heads; a payload may still complete after
//!   a later whole frame from its sender, and the protocols do not rely on a pair's
//!   frames keeping their order;
//! - drop waits for nothing: it cancels the posted receives and frees requests that are
//!   still pending with `MPI_Request_free`, which lets MPI finish or discard them on its
//!   own, and leaks their buffers rather than free memory MPI may still write or read.
//!
//! The parts (private modules):
//!
//! - `framing`: the tags and the layouts of the messages;
//! - `send`: [`MpiTransport::send`], [`MpiTransport::send_parts`] (a payload in place
//!   behind its head, or copied under [`COPY_BELOW`]), [`MpiTransport::send_then_parts`]
//!   (a frame joined in front of the head), and [`MpiTransport::progress`], which
//!   completes sends and keeps up to [`SPARE_BUFFERS`] of their buffers;
//! - `promise`: heads sent ahead of their payloads ([`MpiTransport::send_head`],
//!   [`MpiTransport::send_promised`], [`MpiTransport::withdraw`]);
//! - `recv`: the receive ring and [`MpiTransport::try_recv_placing`]: frames lent, or
//!   handed over from [`HAND_OVER_FROM`] bytes, joined messages taken apart;
//! - `payload`: the receives of payloads that follow their heads, into the caller's slot
//!   or behind the head in a buffer of the [`ReceivePool`];
//! - `failures`: [`MpiError`], process failures told apart from other errors, and
//!   ULFM's failure acknowledgement;
//! - `requests`: request and status helpers the others share;
//! - `stats`: [`TransportStats`].

mod failures;
mod framing;
mod payload;
mod promise;
mod recv;
mod requests;
mod send;
mod stats;

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::mem::ManuallyDrop;
use std::os::raw::c_int;

use bytes::Bytes;
use ft_core::{wire, Rank};
use ft_runtime::{Delivery, Place, Received, Transport};
use mpi::ffi;
use mpi::topology::{Communicator, SimpleCommunicator};

use crate::pool::ReceivePool;
pub(crate) use failures::check;
pub use failures::{errors_return, MpiError};
pub use framing::{
    HEAD_TAG, JOINED_HEAD_TAG, JOINED_PROMISED_HEAD_TAG, JOINED_TAG, PROMISED_HEAD_TAG,
};
use payload::{Arrival, Incoming};
use promise::{promise_tags, Promised};
use recv::RecvRing;
pub use recv::{HAND_OVER_FROM, RECV_SLOTS};
use requests::{cancel_receive, null_request};
use send::Sending;
pub use send::{COPY_BELOW, SPARE_BUFFERS};
pub use stats::TransportStats;

/// The longest payload a receiver takes after a head (a longer one is reported as
/// [`Received::Oversized`] and dropped): 64 MiB.
pub const MAX_PAYLOAD: usize = 64 << 20;

/// The broadcast chunk a relay is sent ([`Transport::chunk_bytes`]; leaves get whole
/// outputs, [`MAX_PAYLOAD`]): 256 KiB, so a large output pipelines down the tree.
///
/// Chunks are received straight into the output's one buffer
/// ([`MpiTransport::try_recv_placing`]), so a multi-chunk output costs no join, and
/// chunks this size do as well as whole outputs on one node while pipelining where a
/// link is slower than a copy (across nodes). `RankStack::set_chunk_bytes` (`ftmpi
/// bench-bcast --chunk-bytes`) overrides it.
pub const DEFAULT_CHUNK_BYTES: usize = 256 * 1024;

/// Frames between the ranks of one communicator: see the [module docs](self).
pub struct MpiTransport {
    /// Freed on drop unless a request may still complete on it (see `Drop`).
    comm: ManuallyDrop<SimpleCommunicator>,
    /// A second duplicate, for the payloads that follow their heads.
    data_comm: ManuallyDrop<SimpleCommunicator>,
    /// Posted payload receives, oldest first, in step with `incoming`.
    incoming_requests: Vec<ffi::MPI_Request>,
    incoming: Vec<Incoming>,
    /// The head of the last frame handed on as [`Delivery::Placed`] (lent from here).
    placed_head: Vec<u8>,
    /// Completed payload receives not yet handed on, oldest first.
    arrived: VecDeque<Arrival>,
    /// Where payload receives land, and their buffers come back to.
    pool: ReceivePool,
    me: Rank,
    n: u32,
    /// Pending `MPI_Isend` requests, in step with `sending`: `sending[i]` holds what
    /// `requests[i]` reads (a `Vec`'s heap buffer, which stays put while it is moved,
    /// and a `Bytes` payload).
    requests: Vec<ffi::MPI_Request>,
    sending: Vec<Sending>,
    /// Buffers of completed sends, for the next ones.
    spare: Vec<Vec<u8>>,
    /// Scratch for `MPI_Testsome`.
    completed: Vec<c_int>,
    /// Scratch for [`MpiTransport::poll_payloads`]: completed payload receives (index,
    /// bytes received), sorted into posting order.
    finished: Vec<(usize, c_int)>,
    statuses: Vec<ffi::MPI_Status>,
    ring: RecvRing,
    /// Payloads whose head went ahead, by the machine's promise id.
    promised: HashMap<u64, Promised>,
    /// The tag the next promised payload takes, and the last one there is
    /// (`MPI_TAG_UB`); `None` if MPI offers too few.
    promise_tags: Option<(c_int, c_int)>,
    stats: TransportStats,
}

impl fmt::Debug for MpiTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MpiTransport")
            .field("me", &self.me)
            .field("n", &self.n)
            .field("pending", &self.requests.len())
            .field("stats", &self.stats)
            .finish()
    }
}

impl MpiTransport {
    /// A transport over a duplicate of `comm` (collective: every rank of `comm` must
    /// call it), with errors returned instead of aborting, and its receives posted.
    pub fn new(comm: &SimpleCommunicator) -> Result<Self, MpiError> {
        let comm = comm.duplicate();
        errors_return(&comm)?;
        let data_comm = comm.duplicate();
        errors_return(&data_comm)?;
        let me = comm.rank() as Rank;
        let n = comm.size() as u32;
        let capacity = wire::frame_capacity(n);
        let mut transport = MpiTransport {
            comm: ManuallyDrop::new(comm),
            data_comm: ManuallyDrop::new(data_comm),
            incoming_requests: Vec::new(),
            incoming: Vec::new(),
            placed_head: Vec::new(),
            arrived: VecDeque::new(),
            pool: ReceivePool::new(),
            me,
            n,
            requests: Vec::new(),
            sending: Vec::new(),
            spare: Vec::new(),
            completed: Vec::new(),
            finished: Vec::new(),
            statuses: Vec::new(),
            ring: RecvRing::new(capacity),
            promised: HashMap::new(),
            promise_tags: None,
            stats: TransportStats::default(),
        };
        transport.promise_tags = promise_tags(&transport.data_comm);
        for slot in 0..RECV_SLOTS {
            // Nobody has failed yet in a fresh duplicate, so a failure here is an error.
            check("MPI_Irecv", transport.post_recv(slot))?;
        }
        Ok(transport)
    }

    /// What the transport did so far.
    pub fn stats(&self) -> TransportStats {
        self.stats
    }
}

impl Transport for MpiTransport {
    type Error = MpiError;

    fn rank(&self) -> Rank {
        self.me
    }
    fn size(&self) -> u32 {
        self.n
    }
    fn send(&mut self, to: Rank, frame: &[u8]) -> Result<(), MpiError> {
        MpiTransport::send(self, to, frame)
    }
    fn send_parts(&mut self, to: Rank, head: &[u8], payload: &Bytes) -> Result<(), MpiError> {
        MpiTransport::send_parts(self, to, head, payload)
    }
    fn send_then_parts(
        &mut self,
        to: Rank,
        frame: &[u8],
        head: &[u8],
        payload: &Bytes,
    ) -> Result<(), MpiError> {
        MpiTransport::send_then_parts(self, to, frame, head, payload)
    }
    fn copies_payload(&self) -> bool {
        MpiTransport::copies_payload(self)
    }
    fn sends_heads_early(&self) -> bool {
        MpiTransport::sends_heads_early(self)
    }
    fn send_head(
        &mut self,
        to: Rank,
        first: Option<&[u8]>,
        head: &[u8],
        len: usize,
        promise: u64,
    ) -> Result<(), MpiError> {
        MpiTransport::send_head(self, to, first, head, len, promise)
    }
    fn send_promised(&mut self, promise: u64, payload: &Bytes) -> Result<(), MpiError> {
        MpiTransport::send_promised(self, promise, payload)
    }
    fn withdraw(&mut self, promise: u64) -> Result<(), MpiError> {
        MpiTransport::withdraw(self, promise)
    }
    fn forget_peer(&mut self, rank: Rank) {
        MpiTransport::forget_peer(self, rank)
    }
    /// [`DEFAULT_CHUNK_BYTES`].
    fn chunk_bytes(&self) -> usize {
        DEFAULT_CHUNK_BYTES
    }
    /// [`MAX_PAYLOAD`]: a payload is its own message of any length behind its head,
    /// and each message costs a driver round, so a leaf gets each output whole.
    fn leaf_chunk_bytes(&self) -> Option<usize> {
        Some(MAX_PAYLOAD)
    }
    fn try_recv(&mut self) -> Result<Option<Received<'_>>, MpiError> {
        MpiTransport::try_recv(self)
    }
    fn try_recv_placing(
        &mut self,
        place: &mut Place<'_>,
    ) -> Result<Option<Delivery<'_>>, MpiError> {
        MpiTransport::try_recv_placing(self, place)
    }
    fn progress(&mut self) -> Result<(), MpiError> {
        MpiTransport::progress(self)
    }
    fn pending_sends(&self) -> usize {
        self.requests.len()
    }
}

impl Drop for MpiTransport {
    fn drop(&mut self) {
        // A request given up below may still complete (a send to a dead peer that MPI
        // did not fail yet): its error would then be raised on its communicator, and on
        // a freed one that aborts the job. So the communicators are freed only when no
        // request is left.
        let mut given_up = !self.requests.is_empty();
        let sending = std::mem::take(&mut self.sending);
        for (mut request, pending) in std::mem::take(&mut self.requests).into_iter().zip(sending) {
            if request != null_request() {
                // SAFETY: a live request of ours.
                unsafe { ffi::MPI_Request_free(&mut request) };
            }
            // After the free MPI may still read the buffers: leaked, not freed.
            std::mem::forget(pending);
        }
        let buffers = std::mem::take(&mut self.ring.buffers);
        for (request, buffer) in self.ring.requests.iter_mut().zip(buffers) {
            given_up |= !cancel_receive(request, buffer);
        }
        let incoming = std::mem::take(&mut self.incoming);
        for (request, incoming) in self.incoming_requests.iter_mut().zip(incoming) {
            let done = cancel_receive(request, incoming.buffer);
            if !done {
                // MPI may still write the slot: its memory must outlive that.
                std::mem::forget(incoming.slot);
            }
            given_up |= !done;
        }
        if !given_up {
            // SAFETY: dropped once, here, and never used again.
            unsafe {
                ManuallyDrop::drop(&mut self.comm);
                ManuallyDrop::drop(&mut self.data_comm);
            }
        }
    }
}
