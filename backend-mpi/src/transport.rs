//! [`MpiTransport`]: frames between ranks of one MPI communicator, with the failure
//! semantics the protocol machines expect.
//!
//! The transport works on its own duplicate of the communicator it is given, with
//! `MPI_ERRORS_RETURN`, so a dead peer is a return code, never an abort. Frames travel
//! as `MPI_UINT8_T` messages with one tag:
//!
//! - **send** copies the frame into a buffer owned by a pending `MPI_Isend`, taken
//!   from a pool of spare buffers; when the request completes (one `MPI_Testsome` over
//!   every pending send in [`MpiTransport::progress`]) the buffer goes back to the pool
//!   (at most [`SPARE_BUFFERS`] are kept), so steady traffic allocates nothing.
//!   A send that fails because its peer died is dropped and counted: the protocol
//!   learns of deaths from its own detector, and every frame it sends to a rank it will
//!   find dead is one it no longer needs delivered. A process failure may come back
//!   in a request's status (`MPI_ERR_IN_STATUS`, what Open MPI 5 does) or, as ULFM
//!   allows, as `MPI_Testsome`'s own code, which names no request: then each send is
//!   tested alone ([`TransportStats::unattributed_failures`]);
//! - **send_parts** (the bulk-data path) sends a header and a payload without copying
//!   the payload: the header, followed by the payload's length (4 bytes), goes from a
//!   pooled buffer as a message tagged [`HEAD_TAG`], and the payload right behind it as
//!   a contiguous `MPI_Isend` of its own, straight from the caller's [`Bytes`] (a clone
//!   stays in the pending send until it completes), on a second duplicate of the
//!   communicator. Contiguous, the payload takes shared memory's single-copy path (a
//!   two-block datatype, which this replaced, made Open MPI pack every byte at the
//!   sender). Payloads shorter than [`COPY_BELOW`] are copied after the header into one
//!   frame instead. [`TransportStats::payload_bytes_in_place`] and
//!   [`TransportStats::payload_bytes_copied`] count the two cases;
//! - **send_then_parts** (a control frame and the payload frame behind it to the same
//!   peer, [`MpiTransport::send_then_parts`]: what the driver does with a broadcast's
//!   activation and the data pushed right behind it) puts the control frame, after its
//!   length (4 bytes), at the front of the head's message ([`JOINED_HEAD_TAG`], or
//!   [`JOINED_TAG`] for a copied payload): one small message per tree edge instead of
//!   two. The receiver hands the front frame on first and keeps the rest in its ring
//!   slot until the next call (so the machine has taken in the activation, and knows
//!   the output's size, before it is asked where the payload goes), then treats the
//!   rest as a head (or a whole frame); the slot is re-posted after that. A joined
//!   message whose front length runs past its end is counted in
//!   [`TransportStats::bad_heads`] and dropped;
//! - **a head's payload**: a receiver that gets a head posts the receive of its payload
//!   from that sender on the payload communicator, into a new buffer right behind a copy
//!   of the head (MPI keeps a pair's messages in order, so the next payload from that
//!   sender is this head's), and hands the whole frame over ([`Received::Owned`]) once
//!   it completes (one `MPI_Testsome` over the payloads pending), so the protocol sees
//!   the same frames either way. A payload over [`MAX_PAYLOAD`] is received into no room
//!   (truncated, which keeps the pair in step) and reported [`Received::Oversized`]; a
//!   sender that dies first loses the frame ([`TransportStats::lost_in_transfer`]). A
//!   payload may complete after a later whole frame from its sender: the protocols do
//!   not rely on a pair's frames keeping their order;
//! - **a head sent ahead of its payload** ([`MpiTransport::send_head`], for a relay
//!   that activates a child before it holds the child's data: `ft_core::Promise`)
//!   goes as a message tagged [`PROMISED_HEAD_TAG`] (or [`JOINED_PROMISED_HEAD_TAG`]
//!   behind the activation), ending with the payload's length and a tag of its own,
//!   taken in turn from the tags above the frames' own up to `MPI_TAG_UB`. The receiver
//!   posts the payload's receive on that tag at once, exactly as for a head; the
//!   payload follows on it whenever the sender holds it
//!   ([`MpiTransport::send_promised`]), in any order with other payloads, and lands
//!   with no step at the receiver in between. A withdrawn promise
//!   ([`MpiTransport::withdraw`]) sends an empty message on the tag, which ends the
//!   receive as a payload of the wrong length (the frame lost); promises to a peer
//!   that died are dropped ([`MpiTransport::forget_peer`]), and the receiver's
//!   receive from a dead sender fails (ULFM) and gives its slot back;
//! - **the timeline**: with `ft_runtime::timeline` on, the transport marks each payload
//!   receive it posts and each poll that found payloads landed;
//! - **a payload received in place** ([`MpiTransport::try_recv_placing`], what the
//!   driver calls): on a head, the transport first asks the caller where the payload
//!   should go (the machine's [`ft_core::Protocol::place_payload`]: a broadcast chunk
//!   of a multi-chunk output goes straight to its offset in the output's one buffer, a
//!   [`ft_core::Slot`]); given a slot of the payload's length, the `MPI_Irecv` writes
//!   there, and the frame comes out as [`Delivery::Placed`] (its head and the slot,
//!   filled), or the slot as [`Delivery::Unplaced`] if the sender died first or sent
//!   another length ([`TransportStats::placed_mismatched`]). Otherwise the payload goes
//!   behind the head as above. [`TransportStats::payload_bytes_placed`] counts them;
//! - **receive** keeps a ring of [`RECV_SLOTS`] any-source, any-tag `MPI_Irecv`s posted, each
//!   into its own buffer of the largest frame of this communicator
//!   ([`ft_core::wire::frame_capacity`]). MPI matches an arriving message to the
//!   earliest posted receive that fits, so the ring's head is always the first to be
//!   matched: [`MpiTransport::try_recv`] tests the head alone (`MPI_Test`), lends its
//!   frame out, and re-posts it at the next call before moving to the next slot. A
//!   frame of at least [`HAND_OVER_FROM`] bytes (a broadcast chunk) is handed over
//!   instead ([`Received::Owned`]): the slot's buffer becomes the frame's [`Bytes`],
//!   which the broadcaster keeps and forwards from without a copy, and the slot is
//!   re-posted with a new buffer (an allocation per such frame, in place of a copy of
//!   it; a pool cannot take buffers back once `Bytes` owns them). Smaller frames
//!   (control frames) are lent as before, allocating nothing. So
//!   frames are handed on in the order MPI matched them, and frames from one sender
//!   keep their order (MPI's non-overtaking rule), as with a probe per frame. A longer
//!   message is truncated by MPI (`MPI_ERR_TRUNCATE`) and reported as
//!   [`Received::Oversized`], whose `len` is then a lower bound (MPI does not say
//!   the length of a truncated message), never handed on;
//! - with the `ulfm` feature, an any-source receive that cannot complete because a
//!   process died reports `MPI_ERR_PROC_FAILED_PENDING` and stays posted: the transport
//!   acknowledges the failures (`MPIX_Comm_ack_failed`), after which the same receive
//!   matches again (ULFM); a receive matched to a sender that died during the transfer
//!   completes with `MPI_ERR_PROC_FAILED`: the frame is lost, counted and the slot
//!   re-posted, as if the sender had died before sending it.
//!
//! Invariants: every buffer handed to MPI stays alive, unmoved, until its request
//! completes or the transport is dropped. A ring buffer is a `Vec` of at least the
//! frame capacity whose length is 0 while its receive is posted and, once the receive
//! completed, the count MPI wrote (never more than its capacity): only bytes MPI
//! wrote are ever read, and new buffers are never zeroed. The ring's slots are posted in ring order
//! (a slot is re-posted before the head moves past it), which is what makes the head
//! the first to match. Drop waits for nothing: it cancels the posted receives and frees
//! requests that are still pending with `MPI_Request_free`, which lets MPI finish or
//! discard them on its own, and leaks their buffers rather than free memory MPI may
//! still write or read.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::mem::ManuallyDrop;
use std::os::raw::{c_int, c_void};

use crate::pool::ReceivePool;
use bytes::Bytes;
use ft_core::{wire, Filled, Rank, Slot};
use ft_runtime::timeline::{self, Mark};
use ft_runtime::{Delivery, Place, Received, Transport};
use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::topology::{Communicator, SimpleCommunicator};

/// The tag of a whole frame, and of a payload on the payload communicator.
const FRAME_TAG: c_int = 0x6674;

/// The tag of a frame's head whose payload follows as its own message
/// ([`MpiTransport::send_parts`]): the head's bytes, then the payload's length (4 bytes,
/// little-endian).
pub const HEAD_TAG: c_int = 0x6675;

/// The tag of a whole frame sent together with the frame before it to the same peer
/// ([`MpiTransport::send_then_parts`]): that frame's length (4 bytes, little-endian),
/// its bytes, then this frame's.
pub const JOINED_TAG: c_int = 0x6676;

/// The tag of a head sent ahead of its payload ([`MpiTransport::send_head`]): after the
/// head, the payload's length and the payload's own tag (4 bytes each), under which the
/// payload follows on the payload communicator when the sender holds it.
pub const PROMISED_HEAD_TAG: c_int = 0x6678;

/// [`PROMISED_HEAD_TAG`] with the frame before it in front, as [`JOINED_HEAD_TAG`].
pub const JOINED_PROMISED_HEAD_TAG: c_int = 0x6679;

/// The first tag a promised payload takes on the payload communicator (below it:
/// [`FRAME_TAG`], the tag of payloads that follow their head at once). Promised
/// payloads take the tags from here to `MPI_TAG_UB` in turn, so two promises in flight
/// share a tag only after that many others (over two billion with Open MPI).
const FIRST_PROMISE_TAG: c_int = 0x10000;

/// Promise tags needed for [`MpiTransport::sends_heads_early`]: an MPI whose
/// `MPI_TAG_UB` leaves fewer (the standard's least is 32767) sends heads with their
/// payloads.
const PROMISE_TAGS_NEEDED: c_int = 1 << 20;

/// [`HEAD_TAG`] with the frame before it in front ([`MpiTransport::send_then_parts`]):
/// that frame's length (4 bytes, little-endian), its bytes, then the head as a
/// [`HEAD_TAG`] message holds it (its payload follows on the payload communicator).
pub const JOINED_HEAD_TAG: c_int = 0x6677;

/// The longest payload a receiver takes after a head (a longer one is reported as
/// [`Received::Oversized`] and dropped): 64 MiB.
pub const MAX_PAYLOAD: usize = 64 << 20;

/// The most send buffers kept for reuse once their sends completed.
pub const SPARE_BUFFERS: usize = 64;

/// Any-source receives kept posted, each with a buffer of
/// [`ft_core::wire::frame_capacity`] bytes (about 66 KiB): about 0.5 MiB per rank.
pub const RECV_SLOTS: usize = 8;

/// Received frames of at least this many bytes are handed over
/// ([`Received::Owned`]), shorter ones lent ([`Received::Frame`]).
///
/// Why 4 KiB: handing a frame over costs an allocation (its new receive buffer, not
/// zeroed, about 0.1 µs) and, when the frame fills less than half its buffer, a
/// shrinking `realloc` (in place with glibc), while lending costs the receiver a copy
/// of the chunk (about 0.1 µs per KiB at a few GB/s): they break even around 1 KiB.
/// The library's control frames (detector, agreement, activation, request) stay below
/// 4 KiB up to thousands of ranks (a rank set takes n/8 bytes, a subtree entry a few),
/// so they keep the lent path with no allocation per frame; data chunks of 4 KiB and
/// more are not copied. A larger control frame is handed over too, which is correct,
/// only not free.
pub const HAND_OVER_FROM: usize = 4096;

/// Payloads of [`MpiTransport::send_parts`] shorter than this are copied after the
/// header into one message rather than sent as a message of their own behind it: 4
/// KiB, Open MPI's shared-memory eager limit, below which the second message costs
/// far more than the copy. `ftmpi send-parts --frames 2000 --payload-bytes P`, n = 2,
/// two runs, µs per frame copied / as two messages: P = 512: 1.13 / 9.07 and 1.11 /
/// 15.0; 1024: 1.76 / 21.9 and 1.91 / 8.53; 2048: 6.37 / 9.30 and 9.74 / 4.09; 4096:
/// 13.5 / 18.3 and 18.6 / 43.4; 8192: 18.2 / 24.8 and 14.8 / 15.9 (it was 512 when a
/// frame went as one two-block datatype message).
pub const COPY_BELOW: usize = 4096;

/// The broadcast chunk a relay is sent ([`Transport::chunk_bytes`]; leaves get whole
/// outputs, [`MAX_PAYLOAD`]): 256 KiB, so a large output pipelines down the tree.
///
/// Chunks are received straight into the output's one buffer
/// ([`MpiTransport::try_recv_placing`]), so a multi-chunk output costs no join. Before
/// that (session 9, first half), a relay and its leaf child each joined their chunks
/// into one buffer at the end, a copy of every byte that cost more than pipelining
/// saved, and 4 MiB chunks won. `ftmpi bench-bcast --sizes 262144,1048576,4194304
/// --outputs 1 --chunk-bytes C`, range of `ratio_to_mpi_bcast` over alternated rounds
/// (load about 1.5), for C = 256 KiB / 1 MiB / 4 MiB:
///
/// | case | n | joined (4 rounds) | received in place (3 rounds) |
/// |---|---|---|---|
/// | 1 MiB × 1 | 4 | 1.50–2.15 / 0.83–0.94 / 0.65–0.91 | 0.76–0.96 / 0.85–0.95 / 0.79–0.84 |
/// | 4 MiB × 1 | 4 | 0.91–1.24 / 0.86–1.08 / 0.72–0.78 | 0.72–0.75 / 0.72–0.75 / 0.71–0.77 |
/// | 1 MiB × 1 | 8 | 1.86–2.49 / 1.10–1.29 / 1.02–1.30 | 1.01–1.39 / 1.12–1.26 / 1.22–1.39 |
/// | 4 MiB × 1 | 8 | 1.62–2.03 / 1.46–1.63 / 0.94–1.48 | 1.09–1.19 / 0.98–1.35 / 1.15–1.41 |
///
/// In place, 256 KiB does as well as whole outputs on one node, and pipelines where a
/// link is slower than a copy (across nodes). (256 KiB × 1 is one chunk under all
/// three: 1.13–2.12.) `RankStack::set_chunk_bytes` (`ftmpi bench-bcast
/// --chunk-bytes`) overrides it.
pub const DEFAULT_CHUNK_BYTES: usize = 256 * 1024;

/// An MPI call failed for a reason other than a dead peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MpiError {
    /// The MPI function.
    pub call: &'static str,
    /// Its return code.
    pub code: c_int,
    /// The code's error class.
    pub class: c_int,
}

impl fmt::Display for MpiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} failed with MPI error {} (class {}): {}",
            self.call,
            self.code,
            self.class,
            error_string(self.code)
        )
    }
}

impl std::error::Error for MpiError {}

/// Counters of what the transport did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransportStats {
    /// Frames handed to MPI.
    pub sent: u64,
    /// Frames received.
    pub received: u64,
    /// Sends dropped because their peer died.
    pub dropped_to_failed: u64,
    /// Matched frames lost because their sender died during the transfer.
    pub lost_in_transfer: u64,
    /// Times process failures were acknowledged to re-enable any-source receives.
    pub failure_acks: u64,
    /// Send buffers allocated (the rest of the sends reused a spare one).
    pub send_buffers: u64,
    /// `MPI_Testsome` calls over the sends that returned a process failure as their own
    /// code instead of in a status, so that each send was then tested alone.
    pub unattributed_failures: u64,
    /// Payload bytes of [`MpiTransport::send_parts`] handed to MPI in place, in the
    /// caller's buffer (a send to a dead peer counts too).
    pub payload_bytes_in_place: u64,
    /// Payload bytes of [`MpiTransport::send_parts`] copied into a send buffer
    /// (payloads shorter than [`COPY_BELOW`]).
    pub payload_bytes_copied: u64,
    /// Received frames handed over ([`Received::Owned`], at least
    /// [`HAND_OVER_FROM`] bytes), each costing a new receive buffer; the rest of
    /// [`TransportStats::received`] were lent.
    pub frames_handed_over: u64,
    /// Frames whose payload came as its own message behind a head ([`HEAD_TAG`]):
    /// received straight behind the head in one buffer, handed over.
    pub payloads_received: u64,
    /// Of [`TransportStats::payloads_received`], those received into a buffer an
    /// earlier payload had used ([`crate::pool::ReceivePool`]); the rest allocated one.
    pub payload_buffers_reused: u64,
    /// Heads too short to carry a payload length: dropped.
    pub bad_heads: u64,
    /// Payload bytes received straight into memory the caller gave
    /// ([`MpiTransport::try_recv_placing`]: a broadcast output's buffer).
    pub payload_bytes_placed: u64,
    /// Payloads received into the caller's memory whose length differed from their
    /// head's: the slot goes back unfilled and the frame is lost.
    pub placed_mismatched: u64,
    /// Frames sent at the front of the next frame's message to the same peer
    /// ([`MpiTransport::send_then_parts`]).
    pub frames_joined: u64,
    /// Messages received holding two frames ([`JOINED_TAG`], [`JOINED_HEAD_TAG`],
    /// [`JOINED_PROMISED_HEAD_TAG`]).
    pub joined_received: u64,
    /// Heads sent ahead of their payload ([`MpiTransport::send_head`]).
    pub heads_sent_early: u64,
    /// Heads received ahead of their payload ([`PROMISED_HEAD_TAG`]): the payload's
    /// receive was posted before it left its sender.
    pub heads_received_early: u64,
    /// Promised payloads withdrawn ([`MpiTransport::withdraw`]).
    pub withdrawn: u64,
}

/// A pending send: the buffer MPI reads (a whole frame, or the header of a
/// [`MpiTransport::send_parts`]) and the payload it reads in place, if any.
struct Sending {
    bytes: Vec<u8>,
    /// Keeps the payload's memory alive (and unmoved: `Bytes` never moves its data)
    /// until the send completes.
    payload: Option<Bytes>,
}

/// The pre-posted receives: see the [module docs](self).
struct RecvRing {
    /// One request per slot; `MPI_REQUEST_NULL` while the slot is not posted.
    requests: Vec<ffi::MPI_Request>,
    /// One per slot, of capacity at least `capacity`: see the module's invariants.
    buffers: Vec<Vec<u8>>,
    /// The bytes each receive may take: the largest frame of the communicator.
    capacity: usize,
    /// The slot posted first among those posted: the next to match.
    head: usize,
    /// The head's frame was lent out (or lost): it must be re-posted, and the head
    /// moved on, before anything else is received.
    repost: bool,
    /// The head's message held two frames ([`JOINED_TAG`], [`JOINED_HEAD_TAG`]) and
    /// the first was lent out: the second, still in the slot, is handed on (or its
    /// payload's receive posted) before the slot is re-posted.
    rest: Option<Rest>,
}

/// The second frame of a joined message, waiting in the ring's head slot.
#[derive(Clone, Copy, Debug)]
struct Rest {
    from: Rank,
    /// Where it starts in the slot's buffer.
    start: usize,
    /// Whether it is a whole frame or a head whose payload follows.
    kind: Follows,
}

/// What follows a frame in a message: nothing (a whole frame), or its payload as a
/// message of its own on the payload communicator, right behind it ([`HEAD_TAG`]: the
/// head ends with the payload's length) or later under its own tag
/// ([`PROMISED_HEAD_TAG`]: the head ends with the payload's length and tag).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Follows {
    Nothing,
    Payload,
    PromisedPayload,
}

impl Follows {
    /// The bytes after the head that say where its payload comes.
    fn trailer(self) -> usize {
        match self {
            Follows::Nothing => 0,
            Follows::Payload => 4,
            Follows::PromisedPayload => 8,
        }
    }
}

/// A payload promised to `to` under `tag` ([`MpiTransport::send_head`]), `len` bytes.
#[derive(Clone, Copy, Debug)]
struct Promised {
    to: Rank,
    tag: c_int,
    len: usize,
}

/// A payload's receive, posted when its head ([`HEAD_TAG`]) arrived: `buffer` holds
/// the head, and MPI writes the payload right behind it, so the frame arrives whole;
/// or, if the caller gave memory for it ([`MpiTransport::try_recv_placing`]), into
/// `slot`, and `buffer` holds the head alone.
struct Incoming {
    /// Capacity: the head and the payload (or the head alone, for a payload refused or
    /// placed).
    buffer: Vec<u8>,
    from: Rank,
    /// The payload's length as its head announced it.
    len: usize,
    /// The caller's memory the payload is received into.
    slot: Option<Slot>,
}

/// What a payload receive gave, waiting for [`MpiTransport::try_recv`].
enum Arrival {
    Frame {
        from: Rank,
        frame: Vec<u8>,
    },
    Oversized {
        from: Rank,
        len: usize,
    },
    /// A payload received into the caller's slot, behind its head.
    Placed {
        from: Rank,
        head: Vec<u8>,
        payload: Filled,
    },
    /// A slot the caller gave that was not filled.
    Unplaced {
        slot: Slot,
    },
}

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
    /// (`MPI_TAG_UB`); `None` if MPI offers too few ([`PROMISE_TAGS_NEEDED`]).
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
            ring: RecvRing {
                requests: vec![null_request(); RECV_SLOTS],
                buffers: (0..RECV_SLOTS)
                    .map(|_| Vec::with_capacity(capacity))
                    .collect(),
                capacity,
                head: 0,
                repost: false,
                rest: None,
            },
            promised: HashMap::new(),
            promise_tags: None,
            stats: TransportStats::default(),
        };
        transport.promise_tags = tag_ub(&transport.data_comm)
            .filter(|&ub| ub - FIRST_PROMISE_TAG >= PROMISE_TAGS_NEEDED)
            .map(|ub| (FIRST_PROMISE_TAG, ub));
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

    /// Starts sending `frame` to `to`. A peer that died is not an error (the frame is
    /// dropped and counted).
    ///
    /// # Panics
    /// If `to` is not a rank of the communicator or the frame is longer than `i32::MAX`
    /// bytes (the protocol machines never produce either).
    pub fn send(&mut self, to: Rank, frame: &[u8]) -> Result<(), MpiError> {
        self.check_peer(to);
        self.send_copied(to, &[frame], FRAME_TAG).map(drop)
    }

    /// Sends `parts`, one after the other, as one message tagged `tag`, copied into a
    /// pooled buffer. Returns whether it was posted: a dead peer drops it.
    fn send_copied(&mut self, to: Rank, parts: &[&[u8]], tag: c_int) -> Result<bool, MpiError> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let len = c_int::try_from(total).expect("frame longer than i32::MAX bytes");
        let mut bytes = self.take_buffer();
        for part in parts {
            bytes.extend_from_slice(part);
        }
        let pending = Sending {
            bytes,
            payload: None,
        };
        // SAFETY: reading an MPI constant handle.
        let byte = unsafe { ffi::RSMPI_UINT8_T };
        let comm = self.comm.as_raw();
        self.isend(to, pending, len, byte, tag, comm)
    }

    /// Starts sending one frame, `head` followed by `payload`, to `to` without copying
    /// the payload (unless it is shorter than [`COPY_BELOW`]): the head goes as a small
    /// message tagged [`HEAD_TAG`] (with the payload's length after it), the payload
    /// right behind it as a contiguous message of its own on the payload communicator,
    /// sent from the caller's buffer, a clone of which is kept until the send completes.
    /// A peer that died is not an error.
    ///
    /// # Panics
    /// As [`MpiTransport::send`], for the whole frame; or if the payload is longer than
    /// [`MAX_PAYLOAD`].
    pub fn send_parts(&mut self, to: Rank, head: &[u8], payload: &Bytes) -> Result<(), MpiError> {
        self.check_peer(to);
        self.send_payload_frame(to, None, head, payload)
    }

    /// Starts sending `frame` and then the frame `head` + `payload` to `to` in the
    /// messages of one [`MpiTransport::send_parts`]: `frame` rides at the front of the
    /// head's message ([`JOINED_HEAD_TAG`], or [`JOINED_TAG`] when the payload is
    /// copied), so an activation and the data pushed behind it cost one small message,
    /// not two. [`TransportStats::frames_joined`] counts them. When that message would
    /// not fit a receive slot (every rank's are [`ft_core::wire::frame_capacity`] bytes:
    /// a large activation), the two go as [`MpiTransport::send`] and
    /// [`MpiTransport::send_parts`] do.
    ///
    /// # Panics
    /// As [`MpiTransport::send_parts`].
    pub fn send_then_parts(
        &mut self,
        to: Rank,
        frame: &[u8],
        head: &[u8],
        payload: &Bytes,
    ) -> Result<(), MpiError> {
        self.check_peer(to);
        if joined_len(frame.len(), head.len(), payload.len()) > self.ring.capacity {
            self.send_copied(to, &[frame], FRAME_TAG)?;
            return self.send_payload_frame(to, None, head, payload);
        }
        self.stats.frames_joined += 1;
        self.send_payload_frame(to, Some(frame), head, payload)
    }

    /// The frame `head` + `payload` to `to`, behind `first` (a whole frame, its length
    /// in front of it) when one is given: see [`MpiTransport::send_parts`] and
    /// [`MpiTransport::send_then_parts`].
    fn send_payload_frame(
        &mut self,
        to: Rank,
        first: Option<&[u8]>,
        head: &[u8],
        payload: &Bytes,
    ) -> Result<(), MpiError> {
        let first_len = first.map(|f| {
            u32::try_from(f.len())
                .expect("frame longer than u32::MAX bytes")
                .to_le_bytes()
        });
        let before: [&[u8]; 2] = match (&first_len, first) {
            (Some(len), Some(frame)) => [len, frame],
            _ => [&[], &[]],
        };
        if payload.len() < COPY_BELOW {
            self.stats.payload_bytes_copied += payload.len() as u64;
            let tag = if first.is_some() {
                JOINED_TAG
            } else {
                FRAME_TAG
            };
            return self
                .send_copied(to, &[before[0], before[1], head, &payload[..]], tag)
                .map(drop);
        }
        assert!(
            c_int::try_from(before[1].len() + head.len() + payload.len()).is_ok(),
            "frame longer than i32::MAX bytes"
        );
        assert!(payload.len() <= MAX_PAYLOAD, "payload over MAX_PAYLOAD");
        let mut bytes = self.take_buffer();
        bytes.extend_from_slice(before[0]);
        bytes.extend_from_slice(before[1]);
        bytes.extend_from_slice(head);
        bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        // SAFETY: reading an MPI constant handle.
        let byte = unsafe { ffi::RSMPI_UINT8_T };
        let len = bytes.len() as c_int;
        let head = Sending {
            bytes,
            payload: None,
        };
        let comm = self.comm.as_raw();
        let tag = if first.is_some() {
            JOINED_HEAD_TAG
        } else {
            HEAD_TAG
        };
        if !self.isend(to, head, len, byte, tag, comm)? {
            return Ok(()); // a dead peer: its payload goes nowhere either
        }
        self.isend_payload(to, payload, FRAME_TAG)?;
        self.stats.payload_bytes_in_place += payload.len() as u64;
        Ok(())
    }

    /// Posts `payload` to `to` as a message of its own tagged `tag` on the payload
    /// communicator, read in place (a clone is kept until the send completes). Returns
    /// whether it was posted: a dead peer drops it.
    fn isend_payload(&mut self, to: Rank, payload: &Bytes, tag: c_int) -> Result<bool, MpiError> {
        // Contiguous, so MPI moves it in one copy (shared memory's single-copy path)
        // instead of packing it as a datatype would.
        let pending = Sending {
            bytes: Vec::new(),
            payload: Some(payload.clone()),
        };
        // SAFETY: reading an MPI constant handle.
        let byte = unsafe { ffi::RSMPI_UINT8_T };
        let data = self.data_comm.as_raw();
        let count = c_int::try_from(payload.len()).expect("payload over MAX_PAYLOAD");
        self.isend(to, pending, count, byte, tag, data)
    }

    /// Whether [`MpiTransport::send_head`] sends heads ahead of their payloads: when
    /// `MPI_TAG_UB` leaves room for their tags (Open MPI's does).
    pub fn sends_heads_early(&self) -> bool {
        self.promise_tags.is_some()
    }

    /// Starts sending `head` to `to`, the head of a frame whose payload of `len` bytes
    /// follows later ([`MpiTransport::send_promised`]) under `promise`, behind `first` (a
    /// whole frame, in the same message as in [`MpiTransport::send_then_parts`]). The
    /// head's message ([`PROMISED_HEAD_TAG`]) names the payload's own tag, so the
    /// receiver posts the payload's receive into its place as soon as the head arrives,
    /// and the payload, once sent, lands there with no further step at the receiver.
    /// A dead peer is not an error (nothing is promised to it).
    ///
    /// # Panics
    /// As [`MpiTransport::send_parts`]; or if heads are not sent early here
    /// ([`MpiTransport::sends_heads_early`]).
    pub fn send_head(
        &mut self,
        to: Rank,
        first: Option<&[u8]>,
        head: &[u8],
        len: usize,
        promise: u64,
    ) -> Result<(), MpiError> {
        self.check_peer(to);
        assert!(len <= MAX_PAYLOAD, "payload over MAX_PAYLOAD");
        let (next, last) = self.promise_tags.expect("heads are not sent early here");
        let tag = next;
        self.promise_tags = Some((
            if next == last {
                FIRST_PROMISE_TAG
            } else {
                next + 1
            },
            last,
        ));
        let mut first = first;
        if let Some(frame) = first {
            let joined = 4 + frame.len() + head.len() + Follows::PromisedPayload.trailer();
            if joined > self.ring.capacity {
                self.send_copied(to, &[frame], FRAME_TAG)?;
                first = None;
            }
        }
        let first_len = first.map(|f| (f.len() as u32).to_le_bytes());
        let mut parts: [&[u8]; 5] = [&[], &[], head, &[], &[]];
        if let (Some(len), Some(frame)) = (&first_len, first) {
            parts[0] = len;
            parts[1] = frame;
            self.stats.frames_joined += 1;
        }
        let trailer_len = (len as u32).to_le_bytes();
        let trailer_tag = tag.to_le_bytes();
        parts[3] = &trailer_len;
        parts[4] = &trailer_tag;
        let message_tag = if first.is_some() {
            JOINED_PROMISED_HEAD_TAG
        } else {
            PROMISED_HEAD_TAG
        };
        if self.send_copied(to, &parts, message_tag)? {
            self.stats.heads_sent_early += 1;
            self.promised.insert(promise, Promised { to, tag, len });
        }
        Ok(())
    }

    /// Starts sending the payload promised under `promise` ([`MpiTransport::send_head`])
    /// on its tag, from the caller's buffer (a clone is kept until the send completes).
    /// A promise to a peer that died ([`MpiTransport::forget_peer`]) sends nothing.
    pub fn send_promised(&mut self, promise: u64, payload: &Bytes) -> Result<(), MpiError> {
        let Some(Promised { to, tag, len }) = self.promised.remove(&promise) else {
            return Ok(());
        };
        // A payload of another length than promised goes anyway: the receiver's slot
        // comes back unfilled (`placed_mismatched`), as for a head that lied.
        debug_assert_eq!(payload.len(), len, "a promised payload's length");
        if self.isend_payload(to, payload, tag)? {
            self.stats.payload_bytes_in_place += payload.len() as u64;
        }
        Ok(())
    }

    /// The payload promised under `promise` will not come: an empty message on its tag
    /// ends the receiver's wait (its slot comes back unfilled; the frame is lost).
    pub fn withdraw(&mut self, promise: u64) -> Result<(), MpiError> {
        let Some(Promised { to, tag, .. }) = self.promised.remove(&promise) else {
            return Ok(());
        };
        self.stats.withdrawn += 1;
        // SAFETY: reading an MPI constant handle.
        let byte = unsafe { ffi::RSMPI_UINT8_T };
        let data = self.data_comm.as_raw();
        let pending = Sending {
            bytes: self.take_buffer(),
            payload: None,
        };
        self.isend(to, pending, 0, byte, tag, data).map(drop)
    }

    /// Drops the promises to `rank`, which died: their payloads go nowhere.
    pub fn forget_peer(&mut self, rank: Rank) {
        self.promised.retain(|_, p| p.to != rank);
    }

    /// Whether [`MpiTransport::send_parts`] copies the payload: no (payloads shorter
    /// than [`COPY_BELOW`] aside).
    pub fn copies_payload(&self) -> bool {
        false
    }

    fn check_peer(&self, to: Rank) {
        assert!(
            to < self.n,
            "rank {to} outside a communicator of {}",
            self.n
        );
    }

    /// An empty send buffer: a spare one, else a new one.
    fn take_buffer(&mut self) -> Vec<u8> {
        let mut bytes = self.spare.pop().unwrap_or_else(|| {
            self.stats.send_buffers += 1;
            Vec::new()
        });
        bytes.clear();
        bytes
    }

    /// Posts `MPI_Isend` of `count` `datatype`s to `to` with `tag` on `comm`, reading
    /// `pending.payload` if it has one, else `pending.bytes`, and keeps `pending` until
    /// it completes. Returns whether it was posted: a dead peer drops the frame.
    fn isend(
        &mut self,
        to: Rank,
        pending: Sending,
        count: c_int,
        datatype: ffi::MPI_Datatype,
        tag: c_int,
        comm: ffi::MPI_Comm,
    ) -> Result<bool, MpiError> {
        let mut request = null_request();
        let at = match &pending.payload {
            Some(payload) => payload.as_ptr(),
            None => pending.bytes.as_ptr(),
        };
        // SAFETY: `count` `datatype`s (bytes) are the buffer at `at`, alive and unmoved
        // in `sending` (a `Vec`'s heap buffer, or the `Bytes` payload, which never moves
        // its data) until MPI completes or frees the request.
        let code = unsafe {
            ffi::MPI_Isend(
                at.cast::<c_void>(),
                count,
                datatype,
                to as c_int,
                tag,
                comm,
                &mut request,
            )
        };
        if is_process_failure(code) {
            self.stats.dropped_to_failed += 1;
            self.recycle(pending.bytes);
            return Ok(false);
        }
        if let Err(e) = check("MPI_Isend", code) {
            self.recycle(pending.bytes);
            return Err(e);
        }
        if pending.payload.is_none() {
            self.stats.sent += 1;
        }
        self.requests.push(request);
        self.sending.push(pending);
        Ok(true)
    }

    /// Completes the sends MPI has finished (their buffers go back to the pool), in one
    /// `MPI_Testsome`; sends whose peer died are dropped and counted.
    pub fn progress(&mut self) -> Result<(), MpiError> {
        if self.requests.is_empty() {
            return Ok(());
        }
        let count = self.requests.len();
        let (code, done) = test_some(&mut self.requests, &mut self.completed, &mut self.statuses);
        if is_process_failure(code) {
            // A failure that names no request (ULFM allows it; Open MPI 5.0 reports
            // failures in the statuses): find the failed sends one by one.
            self.stats.unattributed_failures += 1;
            return self.test_each_send();
        }
        let in_status = code == ffi::MPI_ERR_IN_STATUS as c_int;
        if code != ffi::MPI_SUCCESS as c_int && !in_status {
            return check("MPI_Testsome", code);
        }
        let done = usize::try_from(done).unwrap_or(0).min(count);
        let mut first_error = None;
        for k in 0..done {
            let error = if in_status {
                self.statuses[k].MPI_ERROR
            } else {
                0
            };
            if is_process_failure(error) {
                self.stats.dropped_to_failed += 1;
            } else if error != ffi::MPI_SUCCESS as c_int && first_error.is_none() {
                first_error = Some(error);
            }
        }
        // A completed request, failed or not, no longer reads its buffer. Remove from
        // the back so that the indices still to remove stay valid.
        let finished = &mut self.completed[..done];
        finished.sort_unstable_by(|a, b| b.cmp(a));
        for k in 0..done {
            let index = usize::try_from(self.completed[k]).unwrap_or(usize::MAX);
            if index < self.requests.len() {
                self.finish_send(index);
            }
        }
        if code != ffi::MPI_SUCCESS as c_int {
            self.forget_nulled_sends();
        }
        match first_error {
            Some(code) => check("MPI_Testsome", code),
            None => Ok(()),
        }
    }

    /// After an `MPI_Testsome` that returned an error: Open MPI 5 (its error handler
    /// for request arrays) frees every request of the array whose status holds an
    /// error, including sends to a dead peer that it marked failed but could not
    /// complete (a rendezvous send: the cancel of a send does not complete it), and
    /// reports those in no index. Their handles are now null: such a send is dropped
    /// and counted, and its buffers are leaked, since MPI may still read them.
    fn forget_nulled_sends(&mut self) {
        let null = null_request();
        for index in (0..self.requests.len()).rev() {
            if self.requests[index] == null {
                self.stats.dropped_to_failed += 1;
                self.requests.swap_remove(index);
                std::mem::forget(self.sending.swap_remove(index));
            }
        }
    }

    /// Tests every pending send alone (`MPI_Test`), from the last: drops those whose
    /// peer died, completes those done, keeps the rest.
    fn test_each_send(&mut self) -> Result<(), MpiError> {
        let mut first_error = Ok(());
        for index in (0..self.requests.len()).rev() {
            let mut flag: c_int = 0;
            let mut status = empty_status();
            // SAFETY: a live request of ours; MPI writes the flag and the status.
            let code = unsafe { ffi::MPI_Test(&mut self.requests[index], &mut flag, &mut status) };
            if is_process_failure(code) {
                self.stats.dropped_to_failed += 1;
            } else if code != ffi::MPI_SUCCESS as c_int {
                if first_error.is_ok() {
                    first_error = check("MPI_Test", code);
                }
            } else if flag == 0 {
                continue;
            }
            self.finish_send(index);
        }
        first_error
    }

    /// Forgets completed send `index` (swapping the last one into its place) and keeps
    /// its buffer. A request MPI left allocated after an error is freed.
    fn finish_send(&mut self, index: usize) {
        let mut request = self.requests.swap_remove(index);
        if request != null_request() {
            // SAFETY: a completed request of ours that MPI did not free.
            unsafe { ffi::MPI_Request_free(&mut request) };
        }
        let Sending { bytes, payload } = self.sending.swap_remove(index);
        drop(payload);
        self.recycle(bytes);
    }

    /// Keeps a completed send's buffer for a later send, up to [`SPARE_BUFFERS`].
    fn recycle(&mut self, bytes: Vec<u8>) {
        if bytes.capacity() > 0 && self.spare.len() < SPARE_BUFFERS {
            self.spare.push(bytes);
        }
    }

    /// Posts the any-source receive of ring slot `slot`; returns MPI's code.
    fn post_recv(&mut self, slot: usize) -> c_int {
        let buffer = &mut self.ring.buffers[slot];
        buffer.clear();
        debug_assert!(buffer.capacity() >= self.ring.capacity);
        // Frame capacities are far below i32::MAX.
        let capacity = self.ring.capacity as c_int;
        // SAFETY: the buffer has room for `capacity` bytes (its capacity, uninitialised
        // memory MPI only writes) and stays alive and unmoved (its `Vec` stays in the
        // ring, unresized, while posted) until the request completes, is cancelled, or
        // the transport is dropped (which leaks a buffer still posted).
        unsafe {
            ffi::MPI_Irecv(
                buffer.as_mut_ptr().cast::<c_void>(),
                capacity,
                ffi::RSMPI_UINT8_T,
                ffi::RSMPI_ANY_SOURCE,
                ffi::RSMPI_ANY_TAG,
                self.comm.as_raw(),
                &mut self.ring.requests[slot],
            )
        }
    }

    /// Receives one frame if one has arrived (a payload is received into this
    /// transport's own buffer: see [`MpiTransport::try_recv_placing`] for the caller's).
    pub fn try_recv(&mut self) -> Result<Option<Received<'_>>, MpiError> {
        Ok(self
            .try_recv_placing(&mut |_, _, _| None)?
            .and_then(Delivery::into_received))
    }

    /// Receives one frame if one has arrived; a payload that follows its head goes
    /// where `place(from, head, len)` says, if it gives a slot of exactly `len` bytes
    /// ([`Delivery::Placed`] once received, [`Delivery::Unplaced`] if its sender dies
    /// first), else into this transport's buffer as with [`MpiTransport::try_recv`].
    pub fn try_recv_placing(
        &mut self,
        place: &mut Place<'_>,
    ) -> Result<Option<Delivery<'_>>, MpiError> {
        // Each round either returns or retires the head (a lost or oversized message
        // whose slot is re-posted): bounded by the ring.
        for _ in 0..=RECV_SLOTS {
            if self.arrived.is_empty() && !self.incoming.is_empty() {
                self.poll_payloads()?;
            }
            match self.arrived.pop_front() {
                Some(Arrival::Frame { from, frame }) => {
                    self.stats.received += 1;
                    self.stats.payloads_received += 1;
                    self.stats.frames_handed_over += 1;
                    return Ok(Some(Delivery::Received(Received::Owned {
                        from,
                        frame: self.pool.share(frame),
                    })));
                }
                Some(Arrival::Oversized { from, len }) => {
                    return Ok(Some(Delivery::Received(Received::Oversized { from, len })));
                }
                Some(Arrival::Placed {
                    from,
                    head,
                    payload,
                }) => {
                    self.stats.received += 1;
                    self.stats.payloads_received += 1;
                    self.stats.payload_bytes_placed += payload.len() as u64;
                    self.placed_head = head;
                    return Ok(Some(Delivery::Placed {
                        from,
                        head: &self.placed_head,
                        payload,
                    }));
                }
                Some(Arrival::Unplaced { slot }) => {
                    return Ok(Some(Delivery::Unplaced { slot }));
                }
                None => {}
            }
            if let Some(rest) = self.ring.rest.take() {
                let slot = self.ring.head;
                if rest.kind != Follows::Nothing {
                    self.receive_payload(slot, rest.start, rest.from, rest.kind, place)?;
                    continue;
                }
                self.stats.received += 1;
                return Ok(Some(Delivery::Received(Received::Frame {
                    from: rest.from,
                    bytes: &self.ring.buffers[slot][rest.start..],
                })));
            }
            if self.ring.repost {
                let head = self.ring.head;
                let code = self.post_recv(head);
                if cfg!(feature = "ulfm") && is_process_failure(code) {
                    // Failures not yet acknowledged: the next call posts it again.
                    self.ack_failures()?;
                    return Ok(None);
                }
                check("MPI_Irecv", code)?;
                self.ring.repost = false;
                self.ring.head = (head + 1) % RECV_SLOTS;
            }
            let head = self.ring.head;
            let mut flag: c_int = 0;
            let mut status = empty_status();
            // SAFETY: the head's request is posted (re-posted above if it was not); MPI
            // writes the flag and the status, and nulls a completed request.
            let code =
                unsafe { ffi::MPI_Test(&mut self.ring.requests[head], &mut flag, &mut status) };
            if code == ffi::MPI_SUCCESS as c_int {
                if flag == 0 {
                    return Ok(None);
                }
                let from = status.MPI_SOURCE as Rank;
                let mut count: c_int = 0;
                // SAFETY: `status` describes the completed receive.
                check("MPI_Get_count", unsafe {
                    ffi::MPI_Get_count(&status, ffi::RSMPI_UINT8_T, &mut count)
                })?;
                let len = usize::try_from(count).unwrap_or(0).min(self.ring.capacity);
                let buffer = &mut self.ring.buffers[head];
                // SAFETY: the receive completed with `count` bytes, which MPI wrote at
                // the start of the buffer; `len` is no more than that nor than its
                // capacity.
                unsafe { buffer.set_len(len) };
                self.ring.repost = true;
                let tag = status.MPI_TAG;
                if tag == HEAD_TAG || tag == PROMISED_HEAD_TAG {
                    // Its payload follows: received behind it (or where `place` says),
                    // handed on when complete.
                    let kind = if tag == HEAD_TAG {
                        Follows::Payload
                    } else {
                        Follows::PromisedPayload
                    };
                    self.receive_payload(head, 0, from, kind, place)?;
                    continue;
                }
                if matches!(tag, JOINED_TAG | JOINED_HEAD_TAG | JOINED_PROMISED_HEAD_TAG) {
                    // The frame in front goes first (the machine may need it to place
                    // the payload behind it: an activation announces its sizes); the
                    // second waits in the slot for the next call.
                    let Some(first) = joined_front(&self.ring.buffers[head]) else {
                        self.stats.bad_heads += 1;
                        continue;
                    };
                    self.ring.rest = Some(Rest {
                        from,
                        start: 4 + first,
                        kind: match tag {
                            JOINED_HEAD_TAG => Follows::Payload,
                            JOINED_PROMISED_HEAD_TAG => Follows::PromisedPayload,
                            _ => Follows::Nothing,
                        },
                    });
                    self.stats.received += 1;
                    self.stats.joined_received += 1;
                    return Ok(Some(Delivery::Received(Received::Frame {
                        from,
                        bytes: &self.ring.buffers[head][4..4 + first],
                    })));
                }
                self.stats.received += 1;
                if len < HAND_OVER_FROM {
                    return Ok(Some(Delivery::Received(Received::Frame {
                        from,
                        bytes: &self.ring.buffers[head],
                    })));
                }
                // Handed over: the slot is re-posted (next call) with a new buffer.
                let fresh = Vec::with_capacity(self.ring.capacity);
                let mut frame = std::mem::replace(&mut self.ring.buffers[head], fresh);
                if frame.capacity() - len > len {
                    // A frame held for as long as its chunk keeps at most twice its
                    // length.
                    frame.shrink_to_fit();
                }
                self.stats.frames_handed_over += 1;
                return Ok(Some(Delivery::Received(Received::Owned {
                    from,
                    frame: Bytes::from(frame),
                })));
            }
            let class = error_class(code);
            if class == ffi::MPI_ERR_PROC_FAILED_PENDING as c_int {
                if !cfg!(feature = "ulfm") {
                    return check("MPI_Test", code).map(|()| None);
                }
                // The receive stays posted; once the failures are acknowledged it
                // matches again.
                self.ack_failures()?;
                return Ok(None);
            }
            // The receive completed with an error: MPI is done with the buffer.
            self.free_failed_recv(head);
            self.ring.repost = true;
            if class == ffi::MPI_ERR_TRUNCATE as c_int {
                let capacity = self.ring.capacity;
                let mut count: c_int = 0;
                // SAFETY: `status` describes the completed (truncated) receive.
                unsafe { ffi::MPI_Get_count(&status, ffi::RSMPI_UINT8_T, &mut count) };
                let len = usize::try_from(count).unwrap_or(0).max(capacity + 1);
                return Ok(Some(Delivery::Received(Received::Oversized {
                    from: status.MPI_SOURCE as Rank,
                    len,
                })));
            }
            if is_process_failure(code) {
                // The sender died while its matched frame was in transfer (a large
                // frame goes by rendezvous): the frame is lost, as if the sender had
                // died before sending it; the detector and the protocols' repair take
                // it from here.
                self.stats.lost_in_transfer += 1;
                continue;
            }
            return check("MPI_Test", code).map(|()| None);
        }
        Ok(None)
    }

    /// Frees slot `slot`'s receive if MPI left it allocated after completing it in
    /// error (Open MPI frees it itself).
    fn free_failed_recv(&mut self, slot: usize) {
        let request = &mut self.ring.requests[slot];
        if *request != null_request() {
            // SAFETY: a completed request of ours.
            unsafe { ffi::MPI_Request_free(request) };
        }
    }

    /// Ring slot `slot` holds a head from `from`: posts the receive of its payload from
    /// `from` on the payload communicator (MPI keeps a pair's messages in order, so the
    /// next payload from `from` is this head's), into the caller's memory if `place`
    /// gives a slot of exactly its length, else into a new buffer right behind a copy
    /// of the head. A payload longer than [`MAX_PAYLOAD`] is received into no room (MPI
    /// truncates it, which keeps the pair in step) and reported oversized.
    fn receive_payload(
        &mut self,
        slot: usize,
        start: usize,
        from: Rank,
        kind: Follows,
        place: &mut Place<'_>,
    ) -> Result<(), MpiError> {
        let frame = &self.ring.buffers[slot][start..];
        let Some(at) = frame.len().checked_sub(kind.trailer()) else {
            self.stats.bad_heads += 1;
            return Ok(());
        };
        let word = |k: usize| {
            let mut bytes = [0u8; 4];
            bytes.copy_from_slice(&frame[at + 4 * k..at + 4 * k + 4]);
            u32::from_le_bytes(bytes)
        };
        let len = word(0) as usize;
        let tag = match kind {
            Follows::PromisedPayload => {
                let tag = word(1) as c_int;
                if tag < FIRST_PROMISE_TAG {
                    self.stats.bad_heads += 1;
                    return Ok(());
                }
                self.stats.heads_received_early += 1;
                tag
            }
            _ => FRAME_TAG,
        };
        if len <= MAX_PAYLOAD {
            match place(from, &frame[..at], len) {
                Some(mut target) if target.len() == len => {
                    let head = frame[..at].to_vec();
                    // SAFETY: the slot's `len` bytes are ours to write until it is
                    // filled or given back (`ft_core::landing`); the slot (which keeps
                    // its memory alive) stays in `incoming` until the request completes,
                    // is cancelled, or the transport is dropped (which leaks it).
                    let (code, request) =
                        unsafe { self.post_payload(target.as_mut_ptr(), len, from, tag) };
                    if is_process_failure(code) {
                        self.stats.lost_in_transfer += 1;
                        self.arrived.push_back(Arrival::Unplaced { slot: target });
                        return Ok(());
                    }
                    check("MPI_Irecv", code)?;
                    timeline::mark(Mark::PayloadPosted, from);
                    self.incoming_requests.push(request);
                    self.incoming.push(Incoming {
                        buffer: head,
                        from,
                        len,
                        slot: Some(target),
                    });
                    return Ok(());
                }
                // Not of the payload's length: back unwritten, and the transport's
                // buffer takes the payload.
                Some(other) => self.arrived.push_back(Arrival::Unplaced { slot: other }),
                None => {}
            }
        }
        let room = if len > MAX_PAYLOAD { 0 } else { len };
        let (mut buffer, reused) = self.pool.take(at + room);
        self.stats.payload_buffers_reused += u64::from(reused);
        buffer.extend_from_slice(&self.ring.buffers[slot][start..start + at]);
        // SAFETY: the buffer has room for `room` bytes past its `at` initialised ones
        // (its capacity, uninitialised memory MPI only writes); it stays alive and
        // unmoved in `incoming` (a `Vec`'s heap buffer, unresized) until the request
        // completes, is cancelled, or the transport is dropped (which leaks it).
        let (code, request) =
            unsafe { self.post_payload(buffer.as_mut_ptr().add(at), room, from, tag) };
        if is_process_failure(code) {
            self.stats.lost_in_transfer += 1;
            return Ok(());
        }
        check("MPI_Irecv", code)?;
        timeline::mark(Mark::PayloadPosted, from);
        self.incoming_requests.push(request);
        self.incoming.push(Incoming {
            buffer,
            from,
            len,
            slot: None,
        });
        Ok(())
    }

    /// Posts the receive of the next payload from `from` tagged `tag` on the payload
    /// communicator ([`FRAME_TAG`]: the payloads that follow their heads, in order; a
    /// promise's own tag) into the `len` bytes at `into`: MPI's code and the request.
    ///
    /// # Safety
    /// The `len` bytes at `into` are writable and stay allocated, unread and unmoved
    /// until the request completes, is cancelled, or the transport is dropped.
    unsafe fn post_payload(
        &self,
        into: *mut u8,
        len: usize,
        from: Rank,
        tag: c_int,
    ) -> (c_int, ffi::MPI_Request) {
        let mut request = null_request();
        // SAFETY: the caller's contract; MPI writes the request.
        let code = unsafe {
            ffi::MPI_Irecv(
                into.cast::<c_void>(),
                len as c_int,
                ffi::RSMPI_UINT8_T,
                from as c_int,
                tag,
                self.data_comm.as_raw(),
                &mut request,
            )
        };
        (code, request)
    }

    /// Moves the payload receives that completed to `arrived`, in the order they were
    /// posted: one `MPI_Testsome` over all of them, or, if it reports an error, a test
    /// of each (a sender that died loses its frame).
    fn poll_payloads(&mut self) -> Result<(), MpiError> {
        let count = self.incoming_requests.len();
        let (code, done) = test_some(
            &mut self.incoming_requests,
            &mut self.completed,
            &mut self.statuses,
        );
        if code != ffi::MPI_SUCCESS as c_int {
            return self.test_each_payload();
        }
        let done = usize::try_from(done).unwrap_or(0).min(count);
        if done > 0 {
            timeline::mark(Mark::PayloadLanded, done as u32);
        }
        let mut finished = std::mem::take(&mut self.finished);
        finished.clear();
        finished.extend((0..done).filter_map(|k| {
            let index = usize::try_from(self.completed[k]).ok()?;
            let mut received: c_int = 0;
            // SAFETY: the status of a completed receive.
            unsafe { ffi::MPI_Get_count(&self.statuses[k], ffi::RSMPI_UINT8_T, &mut received) };
            Some((index, received))
        }));
        finished.sort_unstable();
        for &(index, received) in finished.iter().rev() {
            self.incoming_requests.remove(index);
            let incoming = self.incoming.remove(index);
            let arrival = arrival(incoming, received, true, &mut self.stats);
            self.arrived.push_front(arrival);
        }
        self.finished = finished;
        Ok(())
    }

    /// [`MpiTransport::poll_payloads`] one request at a time, after an `MPI_Testsome`
    /// that reported an error.
    fn test_each_payload(&mut self) -> Result<(), MpiError> {
        let mut index = 0;
        while index < self.incoming_requests.len() {
            let request = &mut self.incoming_requests[index];
            if *request == null_request() {
                // Freed by MPI after an error it reported for the whole array: lost.
                self.stats.lost_in_transfer += 1;
                self.incoming_requests.remove(index);
                let incoming = self.incoming.remove(index);
                self.give_back(incoming);
                continue;
            }
            let mut flag: c_int = 0;
            let mut status = empty_status();
            // SAFETY: a live request of ours; MPI writes the flag and the status.
            let code = unsafe { ffi::MPI_Test(request, &mut flag, &mut status) };
            let failed = is_process_failure(code);
            let truncated = error_class(code) == ffi::MPI_ERR_TRUNCATE as c_int;
            if code == ffi::MPI_SUCCESS as c_int && flag == 0 {
                index += 1;
                continue;
            }
            if code != ffi::MPI_SUCCESS as c_int && !failed && !truncated {
                return check("MPI_Test", code);
            }
            self.free_incoming_request(index);
            self.incoming_requests.remove(index);
            let incoming = self.incoming.remove(index);
            if failed {
                // The sender died before or while sending the payload: the frame is
                // lost, as a frame whose sender died in transfer.
                self.stats.lost_in_transfer += 1;
                self.give_back(incoming);
                continue;
            }
            let mut received: c_int = 0;
            // SAFETY: the status of a completed receive.
            unsafe { ffi::MPI_Get_count(&status, ffi::RSMPI_UINT8_T, &mut received) };
            let arrival = arrival(incoming, received, !truncated, &mut self.stats);
            self.arrived.push_back(arrival);
        }
        Ok(())
    }

    /// A payload receive that will never complete: its caller's slot, if it had one,
    /// goes back unfilled ([`Delivery::Unplaced`]).
    fn give_back(&mut self, incoming: Incoming) {
        if let Some(slot) = incoming.slot {
            self.arrived.push_back(Arrival::Unplaced { slot });
        }
    }

    /// Frees payload receive `index` if MPI left it allocated after completing it in
    /// error.
    fn free_incoming_request(&mut self, index: usize) {
        let request = &mut self.incoming_requests[index];
        if *request != null_request() {
            // SAFETY: a completed request of ours.
            unsafe { ffi::MPI_Request_free(request) };
        }
    }

    /// Acknowledges every failure MPI has noticed, so any-source operations work again.
    #[cfg(feature = "ulfm")]
    fn ack_failures(&mut self) -> Result<(), MpiError> {
        let mut acked: c_int = 0;
        // SAFETY: a valid communicator; MPI writes the count.
        check("MPIX_Comm_ack_failed", unsafe {
            crate::ulfm::MPIX_Comm_ack_failed(self.comm.as_raw(), self.n as c_int, &mut acked)
        })?;
        self.stats.failure_acks += 1;
        Ok(())
    }

    #[cfg(not(feature = "ulfm"))]
    fn ack_failures(&mut self) -> Result<(), MpiError> {
        Ok(())
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

/// Cancels a posted receive of ours (an unmatched receive then completes at once) and
/// frees `buffer`, or leaks it if the receive was matched and is still in transfer
/// (MPI may still write it). Returns whether the receive is done with.
fn cancel_receive(request: &mut ffi::MPI_Request, buffer: Vec<u8>) -> bool {
    if *request == null_request() {
        return true;
    }
    let mut flag: c_int = 0;
    let mut status = empty_status();
    // SAFETY: a posted receive of ours: cancelled, then tested; MPI writes the flag and
    // the status.
    unsafe {
        ffi::MPI_Cancel(request);
        ffi::MPI_Test(request, &mut flag, &mut status);
    }
    if flag == 0 && *request != null_request() {
        // SAFETY: a live request of ours, given up.
        unsafe { ffi::MPI_Request_free(request) };
        std::mem::forget(buffer);
        return false;
    }
    true
}
/// Whether `code` says a peer process died (ULFM's error classes).
fn is_process_failure(code: c_int) -> bool {
    if code == ffi::MPI_SUCCESS as c_int {
        return false;
    }
    let class = error_class(code);
    class == ffi::MPI_ERR_PROC_FAILED as c_int || class == ffi::MPI_ERR_PROC_FAILED_PENDING as c_int
}

pub(crate) fn error_class(code: c_int) -> c_int {
    let mut class: c_int = code;
    // SAFETY: MPI writes the class of any code.
    unsafe { ffi::MPI_Error_class(code, &mut class) };
    class
}

fn error_string(code: c_int) -> String {
    let mut buf = vec![0u8; 512];
    let mut len: c_int = 0;
    // SAFETY: the buffer holds MPI_MAX_ERROR_STRING (256 in Open MPI and MPICH) bytes
    // and more; MPI writes the string and its length.
    let ok = unsafe { ffi::MPI_Error_string(code, buf.as_mut_ptr().cast(), &mut len) };
    if ok != ffi::MPI_SUCCESS as c_int {
        return String::from("(no description)");
    }
    buf.truncate(usize::try_from(len).unwrap_or(0).min(512));
    String::from_utf8_lossy(&buf).into_owned()
}

/// Makes MPI calls on `comm` return their errors (a dead peer among them) instead of
/// aborting the job.
pub fn errors_return(comm: &SimpleCommunicator) -> Result<(), MpiError> {
    // SAFETY: `comm` is a valid communicator; the handler is MPI's own.
    check("MPI_Comm_set_errhandler", unsafe {
        ffi::MPI_Comm_set_errhandler(comm.as_raw(), ffi::RSMPI_ERRORS_RETURN)
    })
}

pub(crate) fn check(call: &'static str, code: c_int) -> Result<(), MpiError> {
    if code == ffi::MPI_SUCCESS as c_int {
        Ok(())
    } else {
        Err(MpiError {
            call,
            code,
            class: error_class(code),
        })
    }
}

/// What a completed payload receive gave: `received` bytes, all of them if it `fits`
/// (else MPI truncated a longer message). Into the caller's slot, the payload must be
/// exactly the length its head said (else the slot goes back unfilled, counted in
/// `stats`).
fn arrival(incoming: Incoming, received: c_int, fits: bool, stats: &mut TransportStats) -> Arrival {
    let Incoming {
        mut buffer,
        from,
        len,
        slot,
    } = incoming;
    let received = usize::try_from(received).unwrap_or(0);
    if let Some(slot) = slot {
        if !fits || received != len {
            stats.placed_mismatched += 1;
            return Arrival::Unplaced { slot };
        }
        // SAFETY: MPI completed the receive into the slot's `len` bytes and wrote all of
        // them (`received == len`).
        let payload = unsafe { slot.filled() };
        return Arrival::Placed {
            from,
            head: buffer,
            payload,
        };
    }
    let head = buffer.len();
    let room = buffer.capacity() - head;
    if !fits || len > room {
        return Arrival::Oversized {
            from,
            len: head + len,
        };
    }
    let received = received.min(room);
    // SAFETY: MPI wrote `received` bytes right after the head, within the capacity.
    unsafe { buffer.set_len(head + received) };
    Arrival::Frame {
        from,
        frame: buffer,
    }
}

/// `MPI_TAG_UB` of `comm`, the largest tag MPI takes there, if MPI says.
fn tag_ub(comm: &SimpleCommunicator) -> Option<c_int> {
    let mut value: *mut c_int = std::ptr::null_mut();
    let mut flag: c_int = 0;
    // SAFETY: MPI writes a pointer to the attribute's value (an int it owns, alive as
    // long as the communicator) and the flag.
    let code = unsafe {
        ffi::MPI_Comm_get_attr(
            comm.as_raw(),
            ffi::MPI_TAG_UB as c_int,
            (&mut value as *mut *mut c_int).cast::<c_void>(),
            &mut flag,
        )
    };
    if code != ffi::MPI_SUCCESS as c_int || flag == 0 || value.is_null() {
        return None;
    }
    // SAFETY: MPI gave a valid pointer to the attribute's int.
    Some(unsafe { *value })
}

/// `MPI_Testsome` over `requests` (live requests of ours), with `completed` and
/// `statuses` as its scratch: MPI's code and the count it completed.
fn test_some(
    requests: &mut [ffi::MPI_Request],
    completed: &mut Vec<c_int>,
    statuses: &mut Vec<ffi::MPI_Status>,
) -> (c_int, c_int) {
    let count = requests.len();
    completed.resize(count, 0);
    statuses.resize_with(count, empty_status);
    let mut done: c_int = 0;
    // SAFETY: `requests` holds `count` live requests of ours; MPI writes at most `count`
    // indices and statuses, and sets completed requests to null.
    let code = unsafe {
        ffi::MPI_Testsome(
            count as c_int,
            requests.as_mut_ptr(),
            &mut done,
            completed.as_mut_ptr(),
            statuses.as_mut_ptr(),
        )
    };
    (code, done)
}

/// The length of the message [`MpiTransport::send_then_parts`] sends for a frame of
/// `frame` bytes followed by a head of `head` bytes and a payload of `payload` bytes:
/// the frame's length and bytes, then the head and either the payload (copied, under
/// [`COPY_BELOW`]) or its length (the payload follows as its own message).
fn joined_len(frame: usize, head: usize, payload: usize) -> usize {
    let behind = if payload < COPY_BELOW { payload } else { 4 };
    4 + frame + head + behind
}

/// The length of the frame at the front of a joined message ([`JOINED_TAG`],
/// [`JOINED_HEAD_TAG`]), if the message holds it whole.
fn joined_front(message: &[u8]) -> Option<usize> {
    let len = u32::from_le_bytes(message.get(..4)?.try_into().ok()?) as usize;
    (len <= message.len() - 4).then_some(len)
}

fn null_request() -> ffi::MPI_Request {
    // SAFETY: reading an MPI constant handle.
    unsafe { ffi::RSMPI_REQUEST_NULL }
}

fn empty_status() -> ffi::MPI_Status {
    // SAFETY: `MPI_Status` is a C struct of integers; all zeroes is a valid value.
    unsafe { std::mem::zeroed() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_joined_message_fits_a_receive_slot_or_is_not_joined() {
        let capacity = wire::frame_capacity(8);
        // An activation of a few dozen bytes and a chunk's head: a small message.
        assert_eq!(joined_len(45, 26, 65_536), 4 + 45 + 26 + 4);
        assert_eq!(
            joined_len(45, 26, 100),
            4 + 45 + 26 + 100,
            "a copied payload"
        );
        // The largest activation frame the broadcaster makes (its cap is the frame
        // capacity less 32 bytes) cannot ride in front of a head in one slot.
        assert!(joined_len(capacity - 32, 26, 65_536) > capacity);
    }

    #[test]
    fn the_front_of_a_joined_message_must_lie_within_it() {
        let mut message = 3u32.to_le_bytes().to_vec();
        message.extend_from_slice(b"abcde");
        assert_eq!(joined_front(&message), Some(3));
        message[0] = 6;
        assert_eq!(joined_front(&message), None, "longer than what follows");
        assert_eq!(joined_front(&[1, 0]), None, "no length");
        assert_eq!(joined_front(&0u32.to_le_bytes()), Some(0));
    }
}
