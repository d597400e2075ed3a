//! [`OfiTransport`]: frames between the ranks of one job over a libfabric reliable
//! datagram (`FI_EP_RDM`) endpoint, with the failure semantics the protocol machines
//! expect.
//!
//! One transport owns one fabric, domain, address vector (`FI_AV_TABLE`), completion
//! queue (`FI_CQ_FORMAT_DATA`) and endpoint; nothing is shared with other transports,
//! so several can live in one process (the tests run one per thread).
//!
//! - **start-up** ([`OfiTransport::open`]): every rank writes its endpoint name to
//!   `<rendezvous>/rank-<i>.addr` (a temporary file renamed into place, so a reader
//!   never sees half a name), waits until all `size` names exist, and inserts them in
//!   rank order, so rank `i` is `peers[i]`. The directory must be fresh for every job:
//!   a name left over from an earlier run is read as if it were current;
//! - **send** copies the frame into a boxed buffer and posts it with `fi_senddata`, the
//!   remote CQ data carrying the sender's rank (the receiver cannot learn it otherwise:
//!   receives are posted for any source). **Bulk data** ([`Transport::send_parts`], a
//!   broadcast chunk) is not copied: the head is boxed (a few dozen bytes) and the
//!   payload, a shared slice of the broadcast's buffer, is posted in place with
//!   `fi_sendmsg` and a two-entry iovec; a clone of it stays in the send slab until the
//!   completion. Send and receive buffers are not registered (no `FI_MR_LOCAL`, so no
//!   descriptors are needed). A provider whose `tx_attr.iov_limit` is below 2 gets one
//!   copied frame instead, and [`Transport::copies_payload`] says so. (What the provider itself does
//!   with the iovec is its business: `ofi_rxm` copies messages under its eager limit
//!   into its own bounce buffers); A post refused with `-FI_EAGAIN` (the provider
//!   is out of send slots, or still connecting, as `tcp;ofi_rxm` is until both sides
//!   progress) parks the frame in a per-destination backlog that
//!   [`OfiTransport::progress`] retries first-in first-out, so one unreachable peer holds
//!   up no other;
//! - **dead peers**: a send that fails, at once or in an error completion, is dropped
//!   and counted. So is a frame refused for longer than [`OfiConfig::stall_timeout`]
//!   (`tcp;ofi_rxm` answers every send to a peer it cannot reach with `-FI_EAGAIN`,
//!   forever), and a posted send with no completion for that long stops counting as
//!   pending (its buffer stays, in case the provider still reads it). The protocol
//!   learns of deaths from its own detector, and every frame it sends to a rank it will
//!   find dead is one it no longer needs delivered; none of this is an error;
//! - **receive**: `recv_depth` buffers of `max_frame` bytes are posted for any source. A
//!   completion names its buffer; [`OfiTransport::try_recv`] lends the frame out of it
//!   and posts the buffer again at the next call that takes `&mut self`. A message longer
//!   than `max_frame` completes with `FI_ETRUNC` and is reported as
//!   [`Received::Oversized`]; one whose CQ data is not a rank of the job is dropped and
//!   counted. Receive completions found while polling for send completions wait in a
//!   queue, in completion order, for `try_recv`.
//!
//! - **RMA for bulk data** ([`crate::rma`]): a payload of at least
//!   [`OfiConfig::rma_threshold`] bytes is not sent at all. It is registered
//!   (`FI_REMOTE_READ`; one registration per payload slice, shared by every transfer of
//!   the same bytes, as a relay forwards one chunk to each child) and the receiver gets
//!   an offer (the head, address, length, key, transfer id) as a control message; it
//!   reads the payload with `fi_read` into a buffer behind the head, or, through
//!   [`OfiTransport::try_recv_placing`] (what the driver calls), into the memory the
//!   caller gives for it (the machine's [`ft_core::Protocol::place_payload`]: a chunk of
//!   a multi-chunk broadcast output lands at its offset in the output's one buffer,
//!   [`OfiStats::rma_bytes_placed`]); an offer's read starts once every frame received
//!   before it was handed on, so the activation that announces an output is seen first.
//!   It delivers the frame the sender meant, and answers done, whereupon the sender drops its `Bytes` clone
//!   and closes the registration once no transfer uses it. The endpoint asks for
//!   `FI_RMA` and copes with `FI_MR_VIRT_ADDR`, `FI_MR_PROV_KEY`, `FI_MR_ALLOCATED` and
//!   `FI_MR_ENDPOINT`; a provider without `FI_RMA` is opened for messages only and
//!   large payloads go two-sided (counted as fallbacks). A transfer is released
//!   without its done message when its receiver is taken for dead: a send to it failed,
//!   [`Transport::forget_peer`] told it the peer is dead (the driver does, for every death its stack learns), or it stayed unanswered for the stall
//!   timeout while that rank sent nothing. Its bytes then stay another stall timeout
//!   (the provider may still have a reply from them queued). A transfer unanswered for
//!   the stall timeout stops counting as pending. A read that fails (the sender died, or
//!   its offer named memory it does not have) is a lost frame: the protocol repairs
//!   it as it repairs frames of a dead rank. A malformed or stale control message is
//!   refused with a [`ControlError`] and counted, never a panic or a transport error;
//!   an offer longer than `max_frame` is reported as [`Received::Oversized`], as the
//!   two-sided frame would have been. `tcp;ofi_rxm` (1.17) breaks the connection to a
//!   peer whose read names a key it never registered;
//!
//! For `ofi_rxm` the transport turns off dynamic receive buffers
//! (`FI_OFI_RXM_ENABLE_DYN_RBUF=0`, unless the environment sets it): with them, libfabric
//! 1.17 reports a truncated message without its length or sender and breaks the
//! connection it came on.
//!
//! Invariants:
//!
//! - every buffer handed to libfabric (a posted send or receive, a send's shared payload
//!   through its `Bytes` clone, a read's target buffer) stays alive, unmoved (boxed, or
//!   shared and immutable), until its completion is read or the endpoint is closed;
//!   `Drop` closes the endpoint, then the registrations, before any buffer is freed.
//!   Closing may take as long as connected peers keep sending to this endpoint:
//!   `tcp;ofi_rxm` (libfabric 1.17) was seen spinning in `fi_close` until they stopped
//!   (the loopback test `a_peer_that_leaves_after_connecting_is_a_dropped_frame`);
//! - a registered payload stays alive and unchanged (a `Bytes` clone in its
//!   registration) until its MR is closed, and the MR is closed only when no transfer
//!   uses it (every receiver done or taken for dead) or at `Drop`;
//! - an operation's context is not a pointer but a key, `(slot << 2) | kind`, the kind
//!   saying send (slot in the send slab), receive (slot in the receive pool) or RMA read
//!   (slot in the read slab), so a completion finds its buffer without trusting memory
//!   libfabric hands back;
//! - control messages carry [`crate::rma::CONTROL_FLAG`] in their CQ data and never
//!   reach the protocol; a frame delivered from an RMA read is byte for byte the frame
//!   the sender's `send_parts` meant;
//! - frames to one destination are posted in the order they were sent; whether they are
//!   delivered in that order is the provider's business (`FI_ORDER_SAS` is not
//!   requested), and receivers must not rely on it.

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_int, c_void, CStr, CString};
use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

use ft_core::{wire, Filled, Rank, Slot};
use ft_runtime::{Bytes, Delivery, Place, Received, Transport, Wake};

use crate::rma::{self, Control, ControlError, Offer, CONTROL_FLAG};
use crate::sys;

/// The provider used unless the configuration names another.
pub const DEFAULT_PROVIDER: &str = "tcp;ofi_rxm";
/// Receive buffers posted unless the configuration says otherwise.
pub const DEFAULT_RECV_DEPTH: usize = 64;
/// The broadcast chunk size unless the configuration says otherwise
/// ([`OfiConfig::chunk_bytes`]): 256 KiB. Measured on `tcp;ofi_rxm` over loopback
/// (`ftofi -n 4 --chunk-bytes C bench-bcast --sizes 1048576 4194304 --outputs 1 --reps 9`,
/// two alternated rounds, 2 shared cores): the stack's median at 4 MiB was 11.5–12.6 ms
/// with 256 KiB chunks against 12.9–14.8 ms with 64 KiB and 20.0–22.4 ms with 1 MiB (too
/// few chunks left to pipeline down the tree); at 1 MiB 2.4–2.7 ms against 3.0–3.4 and
/// 2.7–3.1 ms. The price is receive memory: `recv_depth` buffers of about this size each
/// (16 MiB per rank with the defaults).
pub const DEFAULT_CHUNK_BYTES: usize = 256 * 1024;
/// The smallest payload [`OfiTransport::send_parts`] moves by RMA unless the
/// configuration says otherwise ([`OfiConfig::rma_threshold`]): 64 KiB. Below it the
/// offer → read → done round trip costs more than the copy a two-sided send makes.
pub const DEFAULT_RMA_THRESHOLD: usize = 64 * 1024;

/// `fi_addr_t` of "any source" (`FI_ADDR_UNSPEC`, a cast bindgen cannot translate).
const FI_ADDR_UNSPEC: sys::fi_addr_t = u64::MAX;
/// Context kind of a posted send.
const SEND: usize = 1;
/// Context kind of a posted receive.
const RECV: usize = 2;
/// Context kind of a posted RMA read.
const READ: usize = 3;
/// `FI_KEY_NOTAVAIL` (a cast bindgen cannot translate): the key is raw (`FI_MR_RAW`).
const FI_KEY_NOTAVAIL: u64 = u64::MAX;
/// Completions read per `fi_cq_read`.
const CQ_BATCH: usize = 16;
/// The longest [`OfiTransport::wait`] naps while frames wait for a retry.
const PARKED_NAP: Duration = Duration::from_micros(200);
/// How often [`OfiTransport::progress`] looks for stalled posted sends.
const STALL_SCAN: Duration = Duration::from_millis(100);
/// How often the rendezvous looks for the names still missing.
const RENDEZVOUS_POLL: Duration = Duration::from_millis(5);

/// How to open an [`OfiTransport`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OfiConfig {
    /// This rank.
    pub rank: Rank,
    /// Ranks in the job.
    pub size: u32,
    /// The libfabric provider, as `fi_info -l` names it (`tcp;ofi_rxm`, `sockets`, ...).
    pub provider: String,
    /// The local address the endpoint binds to (`fi_getinfo`'s node with `FI_SOURCE`),
    /// e.g. `127.0.0.1` for a job on one machine; `None` takes the provider's first
    /// interface, which is what ranks on several hosts need.
    pub address: Option<String>,
    /// A directory every rank of the job can read and write, fresh for this job.
    pub rendezvous: PathBuf,
    /// The longest frame received; longer ones arrive as [`Received::Oversized`] (and
    /// are lost). [`OfiConfig::new`] sets it to the stack's largest frame,
    /// [`wire::frame_capacity_for`] of `size` and `chunk_bytes`: set it lower only for
    /// traffic of your own. Every posted receive buffer has this size.
    pub max_frame: usize,
    /// The broadcast chunk this transport asks its stack to send
    /// ([`Transport::chunk_bytes`], at most what `max_frame` fits). Change `max_frame`
    /// with it ([`OfiConfig::with_chunk_bytes`]).
    pub chunk_bytes: usize,
    /// Receive buffers kept posted.
    pub recv_depth: usize,
    /// How long [`OfiTransport::open`] waits for the other ranks' names.
    pub connect_timeout: Duration,
    /// How long a frame may wait for the provider to accept it, or a posted send for
    /// its completion, before it is given up (its peer taken for dead).
    pub stall_timeout: Duration,
    /// Payloads of [`Transport::send_parts`] at least this long move by one-sided RMA
    /// (see [`crate::rma`]) when the provider offers `FI_RMA`; `None` forces two-sided
    /// sends (for comparison runs). Every rank of a job should agree on it only in
    /// that a rank with `None` still serves the offers of the others, so the ranks may
    /// differ.
    pub rma_threshold: Option<usize>,
}

impl OfiConfig {
    /// Rank `rank` of a job of `size` ranks (size first, then rank, as every config of
    /// the workspace takes them), meeting the others in `rendezvous`, with the
    /// defaults: [`DEFAULT_PROVIDER`], frames up to the stack's largest
    /// ([`wire::frame_capacity`] of `size`, so a broadcast's full data chunks fit),
    /// [`DEFAULT_RECV_DEPTH`], 30 s to connect, 10 s before a stalled send is given up,
    /// chunks of [`DEFAULT_CHUNK_BYTES`], payloads of [`DEFAULT_RMA_THRESHOLD`] bytes and
    /// more by RMA.
    pub fn new(size: u32, rank: Rank, rendezvous: impl Into<PathBuf>) -> Self {
        OfiConfig {
            rank,
            size,
            provider: DEFAULT_PROVIDER.to_owned(),
            address: None,
            rendezvous: rendezvous.into(),
            max_frame: wire::frame_capacity_for(size, DEFAULT_CHUNK_BYTES),
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            recv_depth: DEFAULT_RECV_DEPTH,
            connect_timeout: Duration::from_secs(30),
            stall_timeout: Duration::from_secs(10),
            rma_threshold: Some(DEFAULT_RMA_THRESHOLD),
        }
    }
}

impl OfiConfig {
    /// This configuration with broadcast chunks of `bytes`, and frames (receive buffers)
    /// long enough for them.
    pub fn with_chunk_bytes(mut self, bytes: usize) -> Self {
        self.chunk_bytes = bytes;
        self.max_frame = wire::frame_capacity_for(self.size, bytes);
        self
    }
}

/// Why the transport failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum OfiError {
    /// A libfabric call returned an error code.
    Call {
        /// The libfabric function.
        call: &'static str,
        /// Its error code, positive (`FI_E*`).
        code: i32,
        /// `fi_strerror` of the code.
        message: String,
    },
    /// No provider by this name offers reliable datagram message endpoints here.
    ProviderNotFound {
        /// The provider asked for.
        provider: String,
    },
    /// The configuration cannot work (API misuse).
    InvalidConfig {
        /// What is wrong with it.
        reason: String,
    },
    /// A send named a rank outside the job (API misuse).
    RankOutOfRange {
        /// The rank named.
        rank: Rank,
        /// Ranks in the job.
        size: u32,
    },
    /// A frame is longer than the provider can send in one message (API misuse).
    FrameTooLong {
        /// The frame's length.
        len: usize,
        /// The provider's limit.
        max: usize,
    },
    /// Reading or writing the rendezvous directory failed.
    Rendezvous {
        /// The file or directory.
        path: PathBuf,
        /// What failed.
        source: io::Error,
    },
    /// Some ranks did not publish their names before the connect timeout.
    RendezvousTimeout {
        /// The ranks still missing.
        missing: Vec<Rank>,
        /// How long the transport waited.
        waited: Duration,
    },
    /// A rank's published name is not an address of this provider.
    BadAddress {
        /// The rank.
        rank: Rank,
    },
}

impl fmt::Display for OfiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OfiError::Call {
                call,
                code,
                message,
            } => write!(f, "{call} failed: {message} (-{code})"),
            OfiError::ProviderNotFound { provider } => write!(
                f,
                "libfabric provider {provider:?} offers no reliable datagram (FI_EP_RDM) \
                 message endpoint here (`fi_info -l` lists the providers)"
            ),
            OfiError::InvalidConfig { reason } => write!(f, "invalid configuration: {reason}"),
            OfiError::RankOutOfRange { rank, size } => {
                write!(f, "rank {rank} is outside a job of {size} ranks")
            }
            OfiError::FrameTooLong { len, max } => write!(
                f,
                "a frame of {len} bytes is longer than the provider's {max}-byte messages"
            ),
            OfiError::Rendezvous { path, source } => {
                write!(f, "rendezvous at {}: {source}", path.display())
            }
            OfiError::RendezvousTimeout { missing, waited } => write!(
                f,
                "ranks {missing:?} published no endpoint name within {:.1} s",
                waited.as_secs_f64()
            ),
            OfiError::BadAddress { rank } => {
                write!(f, "rank {rank}'s endpoint name is not an address")
            }
        }
    }
}

impl std::error::Error for OfiError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OfiError::Rendezvous { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Counters of what the transport did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OfiStats {
    /// Frames handed to the provider (whole, or as an RMA offer).
    pub sent: u64,
    /// Of [`OfiStats::sent`], frames short enough to go by `fi_injectdata` (no send
    /// slot, no completion).
    pub injected: u64,
    /// Frames received (handed out by `try_recv`).
    pub received: u64,
    /// Sends dropped because the provider refused or failed them (a dead peer).
    pub send_errors: u64,
    /// Frames dropped after waiting [`OfiConfig::stall_timeout`] in the backlog.
    pub send_stalled: u64,
    /// Posted sends given up after [`OfiConfig::stall_timeout`] without a completion.
    pub send_abandoned: u64,
    /// Messages longer than `max_frame`, reported as [`Received::Oversized`].
    pub oversized: u64,
    /// Messages dropped because their CQ data named no rank of the job.
    pub bad_sender: u64,
    /// Receives that completed with an error other than truncation (dropped).
    pub recv_errors: u64,
    /// Posts refused with `-FI_EAGAIN` (and retried later).
    pub eagain_retries: u64,
    /// Payloads offered for RMA (a registration and an offer sent instead of the frame).
    pub rma_offered: u64,
    /// Offers served from a registration another transfer of the same bytes had made.
    pub rma_registrations_reused: u64,
    /// RMA reads completed (each delivered as one frame).
    pub rma_reads: u64,
    /// Payload bytes those reads moved.
    pub rma_bytes_read: u64,
    /// Payloads at or above the RMA threshold sent two-sided: the provider has no
    /// `FI_RMA`, or registering the payload failed.
    pub rma_fallbacks: u64,
    /// RMA reads that failed (the sender died, or its offer was bad): lost frames.
    pub rma_lost_reads: u64,
    /// Payload bytes RMA reads wrote straight into memory the caller gave
    /// ([`OfiTransport::try_recv_placing`]: a broadcast output's buffer).
    pub rma_bytes_placed: u64,
    /// Transfers released without a done message, their receiver taken for dead.
    pub rma_released_unread: u64,
    /// Transfers no longer counted as pending after [`OfiConfig::stall_timeout`]
    /// without a done message (their registration stays until one comes or the peer
    /// is found dead).
    pub rma_abandoned: u64,
    /// Control messages refused as malformed or stale ([`crate::rma::ControlError`]).
    pub bad_control: u64,
}

/// A frame to send: a whole frame, or a head followed by a shared payload.
struct Frame {
    head: Box<[u8]>,
    payload: Option<Bytes>,
    /// What the message carries.
    carries: Carries,
}

/// What a sent message carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Carries {
    /// A frame, whole.
    Frame,
    /// An RMA offer of a frame (a control message, flagged in the CQ data).
    Offer,
    /// A done message (a control message that stands for no frame).
    Done,
}

impl Frame {
    fn len(&self) -> usize {
        self.head.len() + self.payload.as_ref().map_or(0, Bytes::len)
    }
}

/// A posted send: its buffers, until its completion (or the endpoint's close).
struct InFlight {
    /// What libfabric reads until the completion.
    frame: Frame,
    /// The destination, taken for dead if the send fails.
    to: Rank,
    posted: Instant,
    /// No completion within the stall timeout: no longer counted as pending (the
    /// provider may still read the buffer, so it stays).
    abandoned: bool,
}

/// A frame the provider has not accepted yet.
struct Parked {
    frame: Frame,
    since: Instant,
}

/// What a receive completion left for `try_recv`.
#[derive(Debug)]
enum Arrival {
    /// A frame of `len` bytes from `from` in receive buffer `slot`.
    Frame { slot: usize, from: Rank, len: usize },
    /// A frame of `len` bytes from `from` whose payload an RMA read placed in `buf`.
    Read {
        from: Rank,
        buf: Box<[u8]>,
        len: usize,
    },
    /// A truncated message (its buffer is already posted again).
    Oversized { from: Rank, len: usize },
    /// A frame whose payload an RMA read placed in the caller's slot
    /// ([`OfiTransport::try_recv_placing`]).
    Placed {
        from: Rank,
        head: Vec<u8>,
        payload: Filled,
    },
    /// A slot the caller gave for a read that failed: back unwritten.
    Unplaced { slot: Slot },
}

/// A registered payload, shared by the transfers that offer it (a relay forwards one
/// chunk to each of its children: one registration serves them all).
struct Registration {
    mr: *mut sys::fid_mr,
    /// The remote address of the payload's first byte.
    addr: u64,
    key: u64,
    /// Keeps the registered bytes alive and unchanged while the registration lives.
    payload: Bytes,
    /// Transfers using it.
    users: usize,
    /// A user's receiver was taken for dead: its provider may still be sending from
    /// these bytes, so they are retired, not freed, when the registration closes.
    tainted: bool,
}

/// An offered payload, until its receiver's done message (or its death).
struct Transfer {
    to: Rank,
    /// The registration's key in [`OfiTransport::registrations`].
    region: (usize, usize),
    offered: Instant,
    /// Counted in [`OfiTransport::pending_sends`] (not abandoned).
    counted: bool,
}

/// A posted (or to be posted) RMA read: the frame being assembled.
struct PendingRead {
    from: Rank,
    id: u64,
    into: ReadInto,
    head_len: usize,
    frame_len: usize,
    addr: u64,
    key: u64,
}

/// Where an RMA read writes its payload.
enum ReadInto {
    /// The head, then the payload's place; `max_frame` bytes.
    Frame(Box<[u8]>),
    /// The caller's memory ([`OfiTransport::try_recv_placing`]), the head kept aside.
    Slot { head: Vec<u8>, slot: Slot },
}

/// An offer whose read has not started: reads start where the caller can say where
/// the payload goes ([`OfiTransport::try_recv_placing`]).
struct OfferedRead {
    from: Rank,
    id: u64,
    addr: u64,
    len: u64,
    key: u64,
    head: Vec<u8>,
}

/// What posting a send did.
enum Posted {
    Yes,
    /// `-FI_EAGAIN`: the frame comes back to be retried.
    Again(Frame),
    /// The provider refused it for a peer's sake: dropped.
    Dropped,
}

/// Frames between the ranks of one job over libfabric: see the [module docs](self).
pub struct OfiTransport {
    me: Rank,
    n: u32,
    max_frame: usize,
    max_msg: usize,
    /// Buffers one send may gather (the provider's `tx_attr.iov_limit`).
    iov_limit: usize,
    /// The longest frame sent by `fi_injectdata` (the provider's `tx_attr.inject_size`).
    inject_size: usize,
    chunk_bytes: usize,
    stall_timeout: Duration,
    info: *mut sys::fi_info,
    fabric: *mut sys::fid_fabric,
    domain: *mut sys::fid_domain,
    av: *mut sys::fid_av,
    cq: *mut sys::fid_cq,
    ep: *mut sys::fid_ep,
    /// `peers[i]` is rank `i`'s address.
    peers: Vec<sys::fi_addr_t>,
    /// Posted sends by slot; `None` is a free slot.
    in_flight: Vec<Option<InFlight>>,
    free_send_slots: Vec<usize>,
    /// Posted sends neither completed nor abandoned.
    in_flight_count: usize,
    /// When posted sends were last checked for stalls.
    last_stall_scan: Instant,
    /// Frames refused with `-FI_EAGAIN`, by destination, oldest first.
    backlog: Vec<VecDeque<Parked>>,
    backlog_count: usize,
    recv_bufs: Vec<Box<[u8]>>,
    /// Receive buffers to post again (completed, or refused with `-FI_EAGAIN`).
    unposted: Vec<usize>,
    /// The buffer the last frame `try_recv` returned was lent from.
    lent: Option<usize>,
    arrived: VecDeque<Arrival>,
    /// [`OfiConfig::rma_threshold`], `None` also when the provider has no `FI_RMA`.
    rma_threshold: Option<usize>,
    /// Whether the provider offers RMA reads (so offers from peers can be served).
    rma_available: bool,
    /// The `mr_mode` bits the provider asks for (of those requested).
    mr_mode: u64,
    next_transfer: u64,
    /// The key to request for the next registration (without `FI_MR_PROV_KEY`).
    next_mr_key: u64,
    /// Registrations by the payload's (address, length).
    registrations: HashMap<(usize, usize), Registration>,
    /// Offered payloads by transfer id.
    transfers: HashMap<u64, Transfer>,
    /// Transfers counted as pending.
    transfers_pending: usize,
    /// When each rank was last heard from (a message or a read completed).
    last_heard: Vec<Instant>,
    /// Payloads whose receiver died, kept [`OfiConfig::stall_timeout`] after their
    /// registration closed (the provider may still have a reply from them queued).
    retired: VecDeque<(Instant, Bytes)>,
    /// The head of the last frame handed on as [`Delivery::Placed`] (lent from here).
    placed_head: Vec<u8>,
    /// Offers received whose reads are not posted yet (posted at the next receive).
    offered: VecDeque<OfferedRead>,
    /// RMA reads by slot; `None` is a free slot.
    reads: Vec<Option<PendingRead>>,
    free_read_slots: Vec<usize>,
    /// Reads refused with `-FI_EAGAIN`, to post again.
    reads_waiting: VecDeque<usize>,
    /// Read buffers (`max_frame` bytes) to reuse.
    read_spares: Vec<Box<[u8]>>,
    /// The read buffer the last frame `try_recv` returned was lent from.
    lent_read: Option<Box<[u8]>>,
    recv_depth: usize,
    last_control_error: Option<ControlError>,
    /// Whether the CQ has a wait object, so [`OfiTransport::wait`] can block on it.
    waitable: bool,
    /// The CQ as other threads may signal it (set once the CQ is waitable).
    signal: Option<Arc<CqSignal>>,
    stats: OfiStats,
}

// SAFETY: the transport owns its libfabric objects outright (no other handle to them
// exists), and the domain is opened with FI_THREAD_DOMAIN, which only asks that calls on
// it be serialized: `&mut self` on every call that touches them guarantees that, on
// whichever thread the transport lives.
unsafe impl Send for OfiTransport {}

impl fmt::Debug for OfiTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OfiTransport")
            .field("me", &self.me)
            .field("n", &self.n)
            .field("pending_sends", &self.pending())
            .field("stats", &self.stats)
            .finish()
    }
}

impl OfiTransport {
    /// Opens an endpoint on `config.provider` and meets the other ranks through
    /// `config.rendezvous` (every rank of the job must call it; it returns once all
    /// their names are known, or fails after `config.connect_timeout`).
    pub fn open(config: OfiConfig) -> Result<Self, OfiError> {
        validate(&config)?;
        let provider =
            CString::new(config.provider.clone()).map_err(|_| OfiError::InvalidConfig {
                reason: "the provider name contains a NUL byte".into(),
            })?;
        let address = config
            .address
            .as_deref()
            .map(CString::new)
            .transpose()
            .map_err(|_| OfiError::InvalidConfig {
                reason: "the address contains a NUL byte".into(),
            })?;
        // RMA if the provider offers it (also when this rank sends two-sided: it still
        // serves its peers' offers); plain messages otherwise.
        let (info, rma_available) =
            match get_info(&provider, &config.provider, address.as_deref(), true) {
                Ok(info) => (info, true),
                Err(OfiError::ProviderNotFound { .. }) => (
                    get_info(&provider, &config.provider, address.as_deref(), false)?,
                    false,
                ),
                Err(e) => return Err(e),
            };
        let mut transport = OfiTransport {
            me: config.rank,
            n: config.size,
            max_frame: config.max_frame,
            max_msg: usize::MAX,
            iov_limit: 1,
            inject_size: 0,
            chunk_bytes: config.chunk_bytes,
            stall_timeout: config.stall_timeout,
            info,
            fabric: ptr::null_mut(),
            domain: ptr::null_mut(),
            av: ptr::null_mut(),
            cq: ptr::null_mut(),
            ep: ptr::null_mut(),
            peers: Vec::with_capacity(config.size as usize),
            in_flight: Vec::new(),
            free_send_slots: Vec::new(),
            in_flight_count: 0,
            last_stall_scan: Instant::now(),
            backlog: (0..config.size).map(|_| VecDeque::new()).collect(),
            backlog_count: 0,
            recv_bufs: (0..config.recv_depth)
                .map(|_| vec![0u8; config.max_frame].into_boxed_slice())
                .collect(),
            unposted: (0..config.recv_depth).rev().collect(),
            lent: None,
            arrived: VecDeque::new(),
            rma_threshold: config.rma_threshold,
            rma_available,
            // SAFETY: `info` is the fi_info fi_getinfo returned; its domain_attr is set.
            mr_mode: u64::from(unsafe { (*(*info).domain_attr).mr_mode } as u32),
            next_transfer: 0,
            next_mr_key: 1,
            registrations: HashMap::new(),
            transfers: HashMap::new(),
            transfers_pending: 0,
            last_heard: vec![Instant::now(); config.size as usize],
            retired: VecDeque::new(),
            placed_head: Vec::new(),
            offered: VecDeque::new(),
            reads: Vec::new(),
            free_read_slots: Vec::new(),
            reads_waiting: VecDeque::new(),
            read_spares: Vec::new(),
            lent_read: None,
            recv_depth: config.recv_depth,
            last_control_error: None,
            waitable: false,
            signal: None,
            stats: OfiStats::default(),
        };
        // On any error below, dropping `transport` closes what was opened.
        transport.open_objects(config.size)?;
        transport.post_receives()?;
        let name = transport.endpoint_name()?;
        let names = exchange_names(&config, &name)?;
        for (rank, name) in names.iter().enumerate() {
            let addr = transport.insert_address(rank as Rank, name)?;
            transport.peers.push(addr);
        }
        Ok(transport)
    }

    /// This rank.
    pub fn rank(&self) -> Rank {
        self.me
    }

    /// Ranks in the job.
    pub fn size(&self) -> u32 {
        self.n
    }

    /// What the transport did so far.
    pub fn stats(&self) -> OfiStats {
        self.stats
    }

    /// The longest frame [`OfiTransport::send`] hands to `fi_injectdata` (the provider's
    /// `tx_attr.inject_size`; 64 bytes on `tcp;ofi_rxm` here): copied at once, no
    /// completion, no send slot.
    pub fn inject_size(&self) -> usize {
        self.inject_size
    }

    /// The provider actually opened (`fi_info`'s `prov_name`, e.g. `tcp;ofi_rxm`).
    pub fn provider(&self) -> String {
        // SAFETY: `info` is the fi_info fi_getinfo returned, alive until drop; its
        // fabric_attr and prov_name, when set, are NUL-terminated strings it owns.
        unsafe {
            let attr = (*self.info).fabric_attr;
            if attr.is_null() || (*attr).prov_name.is_null() {
                return String::new();
            }
            CStr::from_ptr((*attr).prov_name)
                .to_string_lossy()
                .into_owned()
        }
    }

    /// Starts sending `frame` to `to` (any rank of the job, this one included). A peer
    /// that died is not an error: the frame is dropped and counted.
    pub fn send(&mut self, to: Rank, frame: &[u8]) -> Result<(), OfiError> {
        if frame.len() <= self.inject_size
            && to < self.n
            && self.backlog[to as usize].is_empty()
            && self.inject(to, frame)?
        {
            return Ok(());
        }
        self.start(
            to,
            Frame {
                head: frame.into(),
                payload: None,
                carries: Carries::Frame,
            },
        )
    }

    /// Starts sending `head` followed by `payload` to `to` as one frame: the payload is
    /// posted in place (a clone of it kept until the completion), unless the provider
    /// cannot gather two buffers, when the two are copied into one frame.
    pub fn send_parts(&mut self, to: Rank, head: &[u8], payload: &Bytes) -> Result<(), OfiError> {
        if let Some(threshold) = self.rma_threshold {
            if payload.len() >= threshold && !payload.is_empty() {
                if self.rma_available {
                    return self.offer(to, head, payload);
                }
                self.stats.rma_fallbacks += 1;
            }
        }
        self.send_two_sided(to, head, payload)
    }

    /// Whether payloads of [`OfiConfig::rma_threshold`] bytes and more move by RMA
    /// (configured, and the provider offers `FI_RMA`).
    pub fn uses_rma(&self) -> bool {
        self.rma_available && self.rma_threshold.is_some()
    }

    /// Transfers offered and not released yet (no done message from their receiver,
    /// which was not found dead either).
    pub fn rma_transfers_open(&self) -> usize {
        self.transfers.len()
    }

    /// The last control message refused ([`OfiStats::bad_control`] counts them all).
    pub fn last_control_error(&self) -> Option<&ControlError> {
        self.last_control_error.as_ref()
    }

    /// Releases every transfer offered to `rank` that it has not said it is done with:
    /// for a peer the caller knows is dead (the transport finds out by itself when a
    /// send to it fails). Their registrations close once no other transfer uses them.
    pub fn release_transfers_to(&mut self, rank: Rank) {
        let ids: Vec<u64> = self
            .transfers
            .iter()
            .filter(|(_, t)| t.to == rank)
            .map(|(&id, _)| id)
            .collect();
        for id in ids {
            self.stats.rma_released_unread += 1;
            self.release_transfer(id, true);
        }
    }

    /// `head` and `payload` as one two-sided frame (gathered, or copied if the provider
    /// cannot gather).
    fn send_two_sided(&mut self, to: Rank, head: &[u8], payload: &Bytes) -> Result<(), OfiError> {
        if self.iov_limit < 2 {
            let mut frame = Vec::with_capacity(head.len() + payload.len());
            frame.extend_from_slice(head);
            frame.extend_from_slice(payload);
            return self.send(to, &frame);
        }
        self.start(
            to,
            Frame {
                head: head.into(),
                payload: Some(payload.clone()),
                carries: Carries::Frame,
            },
        )
    }

    /// Registers `payload` (or shares the registration of the same bytes) and sends
    /// `to` an offer to read it; falls back to two-sided if registering fails.
    fn offer(&mut self, to: Rank, head: &[u8], payload: &Bytes) -> Result<(), OfiError> {
        if to >= self.n {
            return Err(OfiError::RankOutOfRange {
                rank: to,
                size: self.n,
            });
        }
        let region = (payload.as_ptr().addr(), payload.len());
        let (addr, key) = match self.registrations.get_mut(&region) {
            Some(registration) => {
                registration.users += 1;
                self.stats.rma_registrations_reused += 1;
                (registration.addr, registration.key)
            }
            None => match self.register(payload) {
                Some(registration) => {
                    let found = (registration.addr, registration.key);
                    self.registrations.insert(region, registration);
                    found
                }
                None => {
                    self.stats.rma_fallbacks += 1;
                    return self.send_two_sided(to, head, payload);
                }
            },
        };
        let id = self.next_transfer;
        self.next_transfer += 1;
        self.transfers.insert(
            id,
            Transfer {
                to,
                region,
                offered: Instant::now(),
                counted: true,
            },
        );
        self.transfers_pending += 1;
        self.stats.rma_offered += 1;
        let message = rma::encode_offer(&Offer {
            id,
            addr,
            len: payload.len() as u64,
            key,
            head,
        });
        self.start(
            to,
            Frame {
                head: message,
                payload: None,
                carries: Carries::Offer,
            },
        )
    }

    /// Registers `payload` for remote reads; `None` if the provider refuses.
    fn register(&mut self, payload: &Bytes) -> Option<Registration> {
        let requested_key = self.next_mr_key;
        self.next_mr_key += 1;
        let mut mr: *mut sys::fid_mr = ptr::null_mut();
        // SAFETY: `domain` is our open domain; the `len` bytes at `buf` are the heap
        // bytes of `payload`, a clone of which the Registration keeps (immutable, never
        // moved) until after `fi_close` of the MR; the provider only reads them
        // (FI_REMOTE_READ). On success libfabric writes the MR handle into `mr`.
        let ret = unsafe {
            sys::fi_mr_reg(
                self.domain,
                payload.as_ptr().cast::<c_void>(),
                payload.len(),
                u64::from(sys::FI_REMOTE_READ),
                0,
                requested_key,
                0,
                &mut mr,
                ptr::null_mut(),
            )
        };
        if ret != 0 || mr.is_null() {
            return None;
        }
        // SAFETY: `mr` is the MR just opened and `ep` our enabled endpoint; under
        // FI_MR_ENDPOINT an MR is bound to the endpoint and enabled before use.
        // fi_mr_key reads the key the provider stored in the MR. On failure the MR is
        // closed and not used again.
        unsafe {
            let endpoint = self.mr_mode & u64::from(sys::FI_MR_ENDPOINT) != 0;
            let bound = !endpoint
                || (sys::fi_mr_bind(mr, &mut (*self.ep).fid, 0) == 0 && sys::fi_mr_enable(mr) == 0);
            let key = sys::fi_mr_key(mr);
            if !bound || key == FI_KEY_NOTAVAIL {
                sys::fi_close(&raw mut (*mr).fid);
                return None;
            }
            let addr = if self.mr_mode & u64::from(sys::FI_MR_VIRT_ADDR) != 0 {
                payload.as_ptr().addr() as u64
            } else {
                0
            };
            Some(Registration {
                mr,
                addr,
                key,
                payload: payload.clone(),
                users: 1,
                tainted: false,
            })
        }
    }

    /// Ends transfer `id` (its receiver is done, or `dead`); closes its registration
    /// when no other transfer uses it.
    fn release_transfer(&mut self, id: u64, dead: bool) {
        let Some(transfer) = self.transfers.remove(&id) else {
            return;
        };
        if transfer.counted {
            self.transfers_pending -= 1;
        }
        let Some(registration) = self.registrations.get_mut(&transfer.region) else {
            return;
        };
        registration.tainted |= dead;
        registration.users -= 1;
        if registration.users > 0 {
            return;
        }
        let registration = self
            .registrations
            .remove(&transfer.region)
            .expect("the registration just found");
        // SAFETY: the MR is open (a registration is removed from the map exactly once,
        // here or in Drop) and no read of ours refers to it; remote reads that come
        // after the close fail at the provider.
        unsafe { sys::fi_close(&raw mut (*registration.mr).fid) };
        if registration.tainted {
            self.retired
                .push_back((Instant::now(), registration.payload));
        }
    }

    /// The transport learned that `rank` is dead (a send to it failed): releases the
    /// transfers offered to it.
    fn peer_failed(&mut self, rank: Rank) {
        if !self.transfers.is_empty() {
            self.release_transfers_to(rank);
        }
    }

    /// Posts `frame` to `to`, or parks it behind earlier frames to `to` or when the
    /// provider refuses it for now.
    fn start(&mut self, to: Rank, frame: Frame) -> Result<(), OfiError> {
        if to >= self.n {
            return Err(OfiError::RankOutOfRange {
                rank: to,
                size: self.n,
            });
        }
        if frame.len() > self.max_msg {
            return Err(OfiError::FrameTooLong {
                len: frame.len(),
                max: self.max_msg,
            });
        }
        self.return_lent();
        let queue = to as usize;
        if !self.backlog[queue].is_empty() {
            // Behind earlier frames to the same peer, to keep the posting order.
            self.park(queue, frame, Instant::now());
            return self.flush_backlog(queue);
        }
        match self.post_send(to, frame)? {
            Posted::Yes | Posted::Dropped => Ok(()),
            Posted::Again(frame) => {
                self.park(queue, frame, Instant::now());
                // Connection set-up (tcp;ofi_rxm) moves only when the CQ is polled.
                self.poll_cq()
            }
        }
    }

    /// Receives one frame if one has arrived. The frame borrows a receive buffer, which
    /// is posted again at the next call. (An offered payload is read into this
    /// transport's buffer: see [`OfiTransport::try_recv_placing`] for the caller's.)
    pub fn try_recv(&mut self) -> Result<Option<Received<'_>>, OfiError> {
        Ok(self
            .try_recv_placing(&mut |_, _, _| None)?
            .and_then(Delivery::into_received))
    }

    /// Receives one frame if one has arrived, as [`OfiTransport::try_recv`]; a payload
    /// offered for an RMA read goes where `place(from, head, len)` says, if it gives a
    /// slot of exactly the payload's length ([`Delivery::Placed`] once read,
    /// [`Delivery::Unplaced`] if the read fails), else behind its head in this
    /// transport's buffer. An offer's read is posted by this call once every frame
    /// received before the offer was handed on (offers that [`OfiTransport::progress`]
    /// received wait for it too).
    pub fn try_recv_placing(
        &mut self,
        place: &mut Place<'_>,
    ) -> Result<Option<Delivery<'_>>, OfiError> {
        self.return_lent();
        self.post_receives()?;
        if self.arrived.is_empty() {
            self.poll_cq()?;
            self.post_receives()?;
            self.retry_reads();
        }
        // An offer's reads start once every frame that came before it was handed on:
        // the activation that announces an output comes before its chunks' offers,
        // and the caller can only say where a chunk goes once it has seen it.
        if self.arrived.is_empty() {
            while let Some(offer) = self.offered.pop_front() {
                self.start_read(offer, place);
            }
        }
        match self.arrived.pop_front() {
            None => Ok(None),
            Some(Arrival::Oversized { from, len }) => {
                Ok(Some(Delivery::Received(Received::Oversized { from, len })))
            }
            Some(Arrival::Frame { slot, from, len }) => {
                self.lent = Some(slot);
                self.stats.received += 1;
                Ok(Some(Delivery::Received(Received::Frame {
                    from,
                    bytes: &self.recv_bufs[slot][..len],
                })))
            }
            Some(Arrival::Read { from, buf, len }) => {
                self.stats.received += 1;
                let buf = self.lent_read.insert(buf);
                Ok(Some(Delivery::Received(Received::Frame {
                    from,
                    bytes: &buf[..len],
                })))
            }
            Some(Arrival::Placed {
                from,
                head,
                payload,
            }) => {
                self.stats.received += 1;
                self.placed_head = head;
                Ok(Some(Delivery::Placed {
                    from,
                    head: &self.placed_head,
                    payload,
                }))
            }
            Some(Arrival::Unplaced { slot }) => Ok(Some(Delivery::Unplaced { slot })),
        }
    }

    /// Reads completions (freeing finished sends' buffers, queueing arrived frames),
    /// posts receive buffers again, and retries the backlog (dropping frames stalled
    /// past [`OfiConfig::stall_timeout`]).
    pub fn progress(&mut self) -> Result<(), OfiError> {
        self.return_lent();
        self.poll_cq()?;
        self.post_receives()?;
        self.retry_reads();
        if self.backlog_count > 0 {
            for queue in 0..self.backlog.len() {
                self.flush_backlog(queue)?;
            }
        }
        self.abandon_stalled_sends();
        Ok(())
    }

    /// Sends neither completed nor given up: posted and waiting for their completion,
    /// or refused with `-FI_EAGAIN` and waiting to be posted, for at most
    /// [`OfiConfig::stall_timeout`] (then dropped, or no longer waited for).
    pub fn pending_sends(&self) -> usize {
        self.pending()
    }

    fn pending(&self) -> usize {
        self.in_flight_count + self.backlog_count + self.transfers_pending
    }

    fn park(&mut self, queue: usize, frame: Frame, since: Instant) {
        self.backlog[queue].push_back(Parked { frame, since });
        self.backlog_count += 1;
    }

    /// Posts the frames parked for `queue` until the provider refuses one; drops those
    /// it refused for longer than the stall timeout.
    fn flush_backlog(&mut self, queue: usize) -> Result<(), OfiError> {
        while let Some(parked) = self.backlog[queue].pop_front() {
            self.backlog_count -= 1;
            match self.post_send(queue as Rank, parked.frame)? {
                Posted::Yes | Posted::Dropped => {}
                Posted::Again(frame) => {
                    if parked.since.elapsed() >= self.stall_timeout {
                        self.stats.send_stalled += 1;
                        self.peer_failed(queue as Rank);
                        continue;
                    }
                    self.backlog[queue].push_front(Parked {
                        frame,
                        since: parked.since,
                    });
                    self.backlog_count += 1;
                    break;
                }
            }
        }
        Ok(())
    }

    /// Posts one frame to `to`, its buffers kept in the send slab until its completion.
    fn post_send(&mut self, to: Rank, frame: Frame) -> Result<Posted, OfiError> {
        let slot = match self.free_send_slots.pop() {
            Some(slot) => slot,
            None => {
                self.in_flight.push(None);
                self.in_flight.len() - 1
            }
        };
        let head = (
            frame.head.as_ptr().cast_mut().cast::<c_void>(),
            frame.head.len(),
        );
        let payload = frame
            .payload
            .as_ref()
            .map(|p| (p.as_ptr().cast_mut().cast::<c_void>(), p.len()));
        // The box and the `Bytes` handle move into the slab; the heap bytes they point
        // to, which libfabric reads, do not.
        let carries = frame.carries;
        let data = u64::from(self.me)
            | if carries == Carries::Frame {
                0
            } else {
                CONTROL_FLAG
            };
        self.in_flight[slot] = Some(InFlight {
            frame,
            to,
            posted: Instant::now(),
            abandoned: false,
        });
        let ret = match payload {
            // SAFETY: `ep` is our enabled endpoint; `head` is `head.1` readable bytes
            // owned by the slab entry `slot`, which stays put until the completion for
            // the context key (or the endpoint's close); no descriptor is needed (no
            // FI_MR_LOCAL).
            None => unsafe {
                sys::fi_senddata(
                    self.ep,
                    head.0,
                    head.1,
                    ptr::null_mut(),
                    data,
                    self.peers[to as usize],
                    context(slot, SEND),
                )
            },
            Some(payload) => {
                let iov = [
                    sys::iovec {
                        iov_base: head.0,
                        iov_len: head.1,
                    },
                    sys::iovec {
                        iov_base: payload.0,
                        iov_len: payload.1,
                    },
                ];
                let msg = sys::fi_msg {
                    msg_iov: iov.as_ptr(),
                    desc: ptr::null_mut(),
                    iov_count: iov.len(),
                    addr: self.peers[to as usize],
                    context: context(slot, SEND),
                    data,
                };
                // SAFETY: as for `fi_senddata`, and the payload's bytes are kept alive,
                // unchanged (a `Bytes` is immutable), by the clone in slab entry `slot`;
                // `msg` and `iov` are read during the call only; the provider's
                // iov_limit is at least 2 (`send_parts` checked); no descriptors (no
                // FI_MR_LOCAL).
                unsafe {
                    sys::fi_sendmsg(
                        self.ep,
                        &msg,
                        u64::from(sys::FI_REMOTE_CQ_DATA | sys::FI_COMPLETION),
                    )
                }
            }
        };
        if ret == 0 {
            self.in_flight_count += 1;
            self.stats.sent += u64::from(carries != Carries::Done);
            return Ok(Posted::Yes);
        }
        let frame = self.in_flight[slot]
            .take()
            .expect("the frame just stored")
            .frame;
        self.free_send_slots.push(slot);
        let code = error_code(ret);
        if code == sys::FI_EAGAIN as i32 {
            self.stats.eagain_retries += 1;
            Ok(Posted::Again(frame))
        } else if is_peer_failure(code) {
            self.stats.send_errors += 1;
            self.peer_failed(to);
            Ok(Posted::Dropped)
        } else {
            Err(call_error("fi_senddata/fi_sendmsg", code))
        }
    }

    /// Sends a short frame by `fi_injectdata`: the provider copies it at once and
    /// reports no completion, so the frame takes no send slot, no allocation and no
    /// CQ entry (a control frame of the agreement or the detector, most of a
    /// `validate_global`'s frames). Whether it went (or was dropped for a dead peer);
    /// `false` when the provider has no room now (`-FI_EAGAIN`) and the caller must post
    /// it the ordinary way, behind which later frames to `to` queue as before.
    fn inject(&mut self, to: Rank, frame: &[u8]) -> Result<bool, OfiError> {
        // SAFETY: `ep` is our enabled endpoint; `frame` is `frame.len()` readable bytes,
        // no more than the provider's inject size, read during the call only (inject
        // semantics: the buffer may be reused on return).
        let ret = unsafe {
            sys::fi_injectdata(
                self.ep,
                frame.as_ptr().cast::<c_void>(),
                frame.len(),
                u64::from(self.me),
                self.peers[to as usize],
            )
        };
        if ret == 0 {
            self.stats.sent += 1;
            self.stats.injected += 1;
            return Ok(true);
        }
        let code = error_code(ret);
        if code == sys::FI_EAGAIN as i32 {
            Ok(false)
        } else if is_peer_failure(code) {
            self.stats.send_errors += 1;
            self.peer_failed(to);
            Ok(true)
        } else {
            Err(call_error("fi_injectdata", code))
        }
    }

    /// Marks the buffer of the last frame handed out for posting again.
    fn return_lent(&mut self) {
        if let Some(slot) = self.lent.take() {
            self.unposted.push(slot);
        }
        if let Some(buf) = self.lent_read.take() {
            self.recycle(buf);
        }
    }

    /// Keeps a read buffer for the next read, up to `recv_depth` of them.
    fn recycle(&mut self, buf: Box<[u8]>) {
        if self.read_spares.len() < self.recv_depth {
            self.read_spares.push(buf);
        }
    }

    /// Handles a control message of `len` bytes from `from` in receive buffer `slot`
    /// (which goes back to be posted).
    fn on_control(&mut self, slot: usize, from: Rank, len: usize) {
        self.unposted.push(slot);
        // Control messages are a few dozen bytes: decoding a copy frees the receive
        // buffer's borrow for the calls below.
        let message = self.recv_bufs[slot][..len].to_vec();
        match rma::decode(&message) {
            Err(e) => self.refuse_control(e),
            Ok(Control::Done { id }) => match self.transfers.get(&id) {
                None => self.refuse_control(ControlError::UnknownTransfer { id }),
                Some(t) if t.to != from => self.refuse_control(ControlError::WrongPeer {
                    id,
                    offered_to: t.to,
                    from,
                }),
                Some(_) => self.release_transfer(id, false),
            },
            // Read at the next receive, which can ask where the payload goes.
            Ok(Control::Offer(offer)) => self.offered.push_back(OfferedRead {
                from,
                id: offer.id,
                addr: offer.addr,
                len: offer.len,
                key: offer.key,
                head: offer.head.to_vec(),
            }),
        }
    }

    fn refuse_control(&mut self, error: ControlError) {
        self.stats.bad_control += 1;
        self.last_control_error = Some(error);
    }

    /// Starts reading `offer`'s payload: into the caller's slot if `place` gives one of
    /// the payload's length, else into a frame behind its head.
    fn start_read(&mut self, offer: OfferedRead, place: &mut Place<'_>) {
        let from = offer.from;
        let head_len = offer.head.len();
        // `decode` checked that the sum fits.
        let frame_len = head_len + offer.len as usize;
        if frame_len > self.max_frame || offer.len as usize > self.max_msg {
            // As a two-sided frame this long would have been.
            self.stats.oversized += 1;
            self.arrived.push_back(Arrival::Oversized {
                from,
                len: frame_len,
            });
            self.send_done(from, offer.id);
            return;
        }
        if !self.rma_available {
            self.stats.rma_lost_reads += 1;
            self.send_done(from, offer.id);
            return;
        }
        let into = match place(from, &offer.head, offer.len as usize) {
            Some(slot) if slot.len() as u64 == offer.len => ReadInto::Slot {
                head: offer.head,
                slot,
            },
            other => {
                if let Some(slot) = other {
                    // Not of the payload's length: back unwritten.
                    self.arrived.push_back(Arrival::Unplaced { slot });
                }
                let mut buf = self
                    .read_spares
                    .pop()
                    .unwrap_or_else(|| vec![0u8; self.max_frame].into_boxed_slice());
                buf[..head_len].copy_from_slice(&offer.head);
                ReadInto::Frame(buf)
            }
        };
        let read = PendingRead {
            from,
            id: offer.id,
            head_len,
            into,
            frame_len,
            addr: offer.addr,
            key: offer.key,
        };
        let slot = match self.free_read_slots.pop() {
            Some(slot) => {
                self.reads[slot] = Some(read);
                slot
            }
            None => {
                self.reads.push(Some(read));
                self.reads.len() - 1
            }
        };
        self.post_read(slot);
    }

    /// Posts the read in `slot`; queues it for a retry if the provider refuses it for
    /// now, and gives it up (a lost frame) on any other refusal.
    fn post_read(&mut self, slot: usize) {
        let Some(read) = self.reads.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
        let len = read.frame_len - read.head_len;
        let dest = match &mut read.into {
            ReadInto::Frame(buf) => buf[read.head_len..read.frame_len].as_mut_ptr(),
            ReadInto::Slot { slot, .. } => slot.as_mut_ptr(),
        };
        // SAFETY: `ep` is our endpoint; `dest` is `len` writable bytes of a boxed buffer
        // owned by read slot `slot`, or of the caller's slot it holds (`ft_core::landing`:
        // ours to write until filled or given back), neither moved nor touched until
        // the read's completion is read or the endpoint closes (Drop closes the
        // endpoint before the slab is freed). No descriptor is needed (no FI_MR_LOCAL).
        // A bad address or key from the peer fails the read at the provider, into an
        // error completion.
        let ret = unsafe {
            sys::fi_read(
                self.ep,
                dest.cast::<c_void>(),
                len,
                ptr::null_mut(),
                self.peers[read.from as usize],
                read.addr,
                read.key,
                context(slot, READ),
            )
        };
        if ret == 0 {
            return;
        }
        if error_code(ret) == sys::FI_EAGAIN as i32 {
            self.stats.eagain_retries += 1;
            self.reads_waiting.push_back(slot);
        } else {
            self.finish_read(slot, false);
        }
    }

    /// Posts the reads the provider refused earlier, until it refuses one again.
    fn retry_reads(&mut self) {
        for _ in 0..self.reads_waiting.len() {
            let Some(slot) = self.reads_waiting.pop_front() else {
                return;
            };
            let before = self.reads_waiting.len();
            self.post_read(slot);
            if self.reads_waiting.len() > before {
                return;
            }
        }
    }

    /// A read ended: delivers its frame if it succeeded, and tells the sender it may
    /// release the payload either way.
    fn finish_read(&mut self, slot: usize, ok: bool) {
        let Some(read) = self.reads.get_mut(slot).and_then(Option::take) else {
            return;
        };
        self.free_read_slots.push(slot);
        if ok {
            self.last_heard[read.from as usize] = Instant::now();
            self.stats.rma_reads += 1;
            self.stats.rma_bytes_read += (read.frame_len - read.head_len) as u64;
            match read.into {
                ReadInto::Frame(buf) => self.arrived.push_back(Arrival::Read {
                    from: read.from,
                    buf,
                    len: read.frame_len,
                }),
                ReadInto::Slot { head, slot } => {
                    self.stats.rma_bytes_placed += slot.len() as u64;
                    // SAFETY: the read completed without error: the provider wrote
                    // all the slot's bytes (the read's length is the slot's).
                    let payload = unsafe { slot.filled() };
                    self.arrived.push_back(Arrival::Placed {
                        from: read.from,
                        head,
                        payload,
                    });
                }
            }
        } else {
            self.stats.rma_lost_reads += 1;
            match read.into {
                ReadInto::Frame(buf) => self.recycle(buf),
                ReadInto::Slot { slot, .. } => self.arrived.push_back(Arrival::Unplaced { slot }),
            }
        }
        self.send_done(read.from, read.id);
    }

    /// Sends a done message for transfer `id` to `to`, without polling the CQ (this
    /// runs while completions are handled): a refused one waits in the backlog.
    fn send_done(&mut self, to: Rank, id: u64) {
        let frame = Frame {
            head: rma::encode_done(id),
            payload: None,
            carries: Carries::Done,
        };
        let queue = to as usize;
        if !self.backlog[queue].is_empty() {
            self.park(queue, frame, Instant::now());
            return;
        }
        match self.post_send(to, frame) {
            Ok(Posted::Again(frame)) => self.park(queue, frame, Instant::now()),
            // Posted, dropped (the sender is dead), or refused for good: the sender's
            // registration then waits for its own release rules.
            Ok(Posted::Yes | Posted::Dropped) | Err(_) => {}
        }
    }

    /// Posts every receive buffer not posted, until the provider refuses one.
    fn post_receives(&mut self) -> Result<(), OfiError> {
        while let Some(&slot) = self.unposted.last() {
            let buf = &mut self.recv_bufs[slot];
            // SAFETY: `ep` is our endpoint; the buffer is `max_frame` writable bytes,
            // boxed in `recv_bufs` (which never grows or shrinks after open), not lent
            // out and not posted, and stays untouched until its completion is read or
            // the endpoint closes.
            let ret = unsafe {
                sys::fi_recv(
                    self.ep,
                    buf.as_mut_ptr().cast::<c_void>(),
                    buf.len(),
                    ptr::null_mut(),
                    FI_ADDR_UNSPEC,
                    context(slot, RECV),
                )
            };
            if ret == 0 {
                self.unposted.pop();
                continue;
            }
            let code = error_code(ret);
            if code == sys::FI_EAGAIN as i32 {
                return Ok(());
            }
            return Err(call_error("fi_recv", code));
        }
        Ok(())
    }

    /// Reads the completion queue until it is empty.
    fn poll_cq(&mut self) -> Result<(), OfiError> {
        let mut entries = [sys::fi_cq_data_entry::default(); CQ_BATCH];
        loop {
            // SAFETY: `cq` is our CQ, opened with FI_CQ_FORMAT_DATA, so each entry is
            // an fi_cq_data_entry; the array holds CQ_BATCH of them.
            let ret = unsafe {
                sys::fi_cq_read(self.cq, entries.as_mut_ptr().cast::<c_void>(), CQ_BATCH)
            };
            if ret > 0 {
                for entry in &entries[..ret as usize] {
                    self.on_completion(entry);
                }
                continue;
            }
            let code = error_code(ret);
            // A peer's broken connection can surface here too (`tcp;ofi_rxm` progress
            // serving an RMA read of a rank that died): a dead peer is never our error.
            if ret == 0 || code == sys::FI_EAGAIN as i32 || is_peer_failure(code) {
                return Ok(());
            }
            if code != sys::FI_EAVAIL as i32 {
                return Err(call_error("fi_cq_read", code));
            }
            let mut err = sys::fi_cq_err_entry::default();
            // SAFETY: `cq` is our CQ; `err` is a zeroed entry whose err_data_size of 0
            // lets the provider point err_data at its own storage.
            let ret = unsafe { sys::fi_cq_readerr(self.cq, &mut err, 0) };
            if ret == 1 {
                self.on_error_completion(&err);
            } else if ret < 0 && error_code(ret) != sys::FI_EAGAIN as i32 {
                return Err(call_error("fi_cq_readerr", error_code(ret)));
            } else {
                // Announced but not there (yet): the next poll reads it.
                return Ok(());
            }
        }
    }

    /// Waits at most `timeout` for a completion, without the CPU when the CQ has a wait
    /// object (`fi_cq_sread`, in whole milliseconds; a shorter wait, or frames parked
    /// for a retry, nap instead). Completions it reads are handled as
    /// [`OfiTransport::try_recv`]'s are.
    pub fn wait(&mut self, timeout: Duration) -> Result<(), OfiError> {
        if !self.arrived.is_empty() {
            return Ok(());
        }
        self.return_lent();
        self.post_receives()?;
        let millis = timeout.as_millis();
        if !self.waitable || millis == 0 || self.backlog_count > 0 || !self.reads_waiting.is_empty()
        {
            std::thread::sleep(timeout.min(PARKED_NAP));
            return Ok(());
        }
        let millis = c_int::try_from(millis).unwrap_or(c_int::MAX);
        let mut entries = [sys::fi_cq_data_entry::default(); CQ_BATCH];
        // SAFETY: as in `poll_cq`; no wait condition is passed.
        let ret = unsafe {
            sys::fi_cq_sread(
                self.cq,
                entries.as_mut_ptr().cast::<c_void>(),
                CQ_BATCH,
                ptr::null(),
                millis,
            )
        };
        if ret > 0 {
            for entry in &entries[..ret as usize] {
                self.on_completion(entry);
            }
            return Ok(());
        }
        let code = error_code(ret);
        // Nothing came (EAGAIN, ETIMEDOUT), or a waker signalled the CQ (ECANCELED on
        // `sockets`).
        let woken_empty = [sys::FI_EAGAIN, sys::FI_ETIMEDOUT, sys::FI_ECANCELED];
        if ret == 0 || woken_empty.iter().any(|&c| code == c as i32) || is_peer_failure(code) {
            // (A peer failure: as in `poll_cq`.)
            Ok(())
        } else if code == sys::FI_EAVAIL as i32 {
            self.poll_cq()
        } else {
            Err(call_error("fi_cq_sread", code))
        }
    }

    fn on_completion(&mut self, entry: &sys::fi_cq_data_entry) {
        match key(entry.op_context) {
            (slot, SEND) => {
                self.finish_send(slot);
            }
            (slot, READ) => self.finish_read(slot, true),
            (slot, RECV) if slot < self.recv_bufs.len() => {
                let control = entry.data & CONTROL_FLAG != 0;
                let from = self.sender(entry.data & !CONTROL_FLAG);
                if let Some(from) = from {
                    self.last_heard[from as usize] = Instant::now();
                }
                match from {
                    Some(from) if control => {
                        self.on_control(slot, from, entry.len.min(self.max_frame))
                    }
                    Some(from) => self.arrived.push_back(Arrival::Frame {
                        slot,
                        from,
                        len: entry.len.min(self.max_frame),
                    }),
                    None => {
                        self.stats.bad_sender += 1;
                        self.unposted.push(slot);
                    }
                }
            }
            // Not a key of ours: nothing to free.
            _ => {}
        }
    }

    fn on_error_completion(&mut self, err: &sys::fi_cq_err_entry) {
        match key(err.op_context) {
            (slot, SEND) => {
                let to = self
                    .in_flight
                    .get(slot)
                    .and_then(Option::as_ref)
                    .map(|s| s.to);
                // An abandoned send was counted already.
                let counted = self.finish_send(slot);
                self.stats.send_errors += u64::from(counted);
                if let Some(to) = to {
                    self.peer_failed(to);
                }
            }
            (slot, READ) => self.finish_read(slot, false),
            (slot, RECV) if slot < self.recv_bufs.len() => {
                self.unposted.push(slot);
                if err.err != sys::FI_ETRUNC as i32 {
                    self.stats.recv_errors += 1;
                    return;
                }
                if err.data & CONTROL_FLAG != 0 {
                    self.refuse_control(ControlError::Oversized);
                    return;
                }
                match self.sender(err.data) {
                    Some(from) => {
                        self.stats.oversized += 1;
                        // `len` is the bytes placed and `olen` the rest, as the
                        // spec says, or (ofi_rxm) `len` is the whole message.
                        let len = if err.len > self.max_frame {
                            err.len
                        } else {
                            err.len.saturating_add(err.olen)
                        };
                        self.arrived.push_back(Arrival::Oversized { from, len });
                    }
                    None => self.stats.bad_sender += 1,
                }
            }
            _ => {}
        }
    }

    /// Frees a completed send's buffer; whether it was still counted as pending (not
    /// abandoned, and `slot` held a send at all).
    fn finish_send(&mut self, slot: usize) -> bool {
        match self.in_flight.get_mut(slot).and_then(Option::take) {
            Some(send) => {
                self.free_send_slots.push(slot);
                if !send.abandoned {
                    self.in_flight_count -= 1;
                }
                !send.abandoned
            }
            None => false,
        }
    }

    /// Stops counting posted sends that saw no completion for the stall timeout
    /// (`tcp;ofi_rxm` may never complete a send whose connection broke). Their buffers
    /// stay until a completion comes or the endpoint closes.
    fn abandon_stalled_sends(&mut self) {
        let idle =
            self.in_flight_count == 0 && self.transfers_pending == 0 && self.retired.is_empty();
        if idle || self.last_stall_scan.elapsed() < STALL_SCAN {
            return;
        }
        self.last_stall_scan = Instant::now();
        let mut silent = Vec::new();
        for transfer in self.transfers.values_mut() {
            if transfer.offered.elapsed() < self.stall_timeout {
                continue;
            }
            if transfer.counted {
                transfer.counted = false;
                self.transfers_pending -= 1;
                self.stats.rma_abandoned += 1;
            }
            if self.last_heard[transfer.to as usize].elapsed() >= self.stall_timeout {
                silent.push(transfer.to);
            }
        }
        // Unanswered for the stall timeout by a peer that sent nothing in that time:
        // taken for dead (a live reader answers, and the protocol's own traffic shows
        // it alive).
        silent.sort_unstable();
        silent.dedup();
        for rank in silent {
            self.release_transfers_to(rank);
        }
        while self
            .retired
            .front()
            .is_some_and(|(since, _)| since.elapsed() >= self.stall_timeout)
        {
            self.retired.pop_front();
        }
        for send in self.in_flight.iter_mut().flatten() {
            if !send.abandoned && send.posted.elapsed() >= self.stall_timeout {
                send.abandoned = true;
                self.in_flight_count -= 1;
                self.stats.send_abandoned += 1;
            }
        }
    }

    /// The rank a receive completion's CQ data names, if it names one. Every rank
    /// sends with CQ data, so the data is not required to come with its
    /// `FI_REMOTE_CQ_DATA` flag, which `sockets` (1.17) leaves off some completions.
    fn sender(&self, data: u64) -> Option<Rank> {
        Rank::try_from(data).ok().filter(|&rank| rank < self.n)
    }

    /// Opens fabric, domain, AV, CQ and endpoint, binds them and enables the endpoint.
    fn open_objects(&mut self, size: u32) -> Result<(), OfiError> {
        // SAFETY: `info` is a valid fi_info from fi_getinfo; each call writes the new
        // object's handle into a field of ours, which `Drop` closes (in reverse order)
        // if it is non-null; the attribute structs live across the calls that read them.
        unsafe {
            let info = self.info;
            self.max_msg = (*(*info).ep_attr).max_msg_size;
            self.iov_limit = (*(*info).tx_attr).iov_limit;
            self.inject_size = (*(*info).tx_attr).inject_size;
            check(
                "fi_fabric",
                sys::fi_fabric((*info).fabric_attr, &mut self.fabric, ptr::null_mut()),
            )?;
            check(
                "fi_domain",
                sys::fi_domain(self.fabric, info, &mut self.domain, ptr::null_mut()),
            )?;
            let mut av_attr = sys::fi_av_attr {
                type_: sys::fi_av_type_FI_AV_TABLE,
                count: size as usize,
                ..Default::default()
            };
            check(
                "fi_av_open",
                sys::fi_av_open(self.domain, &mut av_attr, &mut self.av, ptr::null_mut()),
            )?;
            // A wait object if the provider has one (idle ranks then block in
            // fi_cq_sread instead of polling); else a plain polled CQ.
            for wait_obj in [
                sys::fi_wait_obj_FI_WAIT_UNSPEC,
                sys::fi_wait_obj_FI_WAIT_NONE,
            ] {
                let mut cq_attr = sys::fi_cq_attr {
                    format: sys::fi_cq_format_FI_CQ_FORMAT_DATA,
                    wait_obj,
                    ..Default::default()
                };
                let ret = sys::fi_cq_open(self.domain, &mut cq_attr, &mut self.cq, ptr::null_mut());
                if ret == 0 {
                    self.waitable = wait_obj != sys::fi_wait_obj_FI_WAIT_NONE;
                    if self.waitable {
                        self.signal = Some(Arc::new(CqSignal {
                            cq: Mutex::new(CqPtr(self.cq)),
                        }));
                    }
                    break;
                }
                if wait_obj == sys::fi_wait_obj_FI_WAIT_NONE {
                    check("fi_cq_open", ret)?;
                }
            }
            check(
                "fi_endpoint",
                sys::fi_endpoint(self.domain, info, &mut self.ep, ptr::null_mut()),
            )?;
            check(
                "fi_ep_bind(av)",
                sys::fi_ep_bind(self.ep, &mut (*self.av).fid, 0),
            )?;
            check(
                "fi_ep_bind(cq)",
                sys::fi_ep_bind(
                    self.ep,
                    &mut (*self.cq).fid,
                    u64::from(sys::FI_TRANSMIT | sys::FI_RECV),
                ),
            )?;
            check("fi_enable", sys::fi_enable(self.ep))?;
        }
        Ok(())
    }

    /// This endpoint's name (its address, in the provider's format).
    fn endpoint_name(&mut self) -> Result<Vec<u8>, OfiError> {
        let mut name = vec![0u8; 64];
        loop {
            let mut len = name.len();
            // SAFETY: `ep` is our enabled endpoint; libfabric writes at most `len` bytes
            // into `name` and the name's real length into `len`.
            let ret = unsafe {
                sys::fi_getname(
                    &mut (*self.ep).fid,
                    name.as_mut_ptr().cast::<c_void>(),
                    &mut len,
                )
            };
            if ret == 0 {
                name.truncate(len);
                return Ok(name);
            }
            let code = error_code(ret as isize);
            if code != sys::FI_ETOOSMALL as i32 || len <= name.len() {
                return Err(call_error("fi_getname", code));
            }
            name.resize(len, 0);
        }
    }

    fn insert_address(&mut self, rank: Rank, name: &[u8]) -> Result<sys::fi_addr_t, OfiError> {
        let mut addr: sys::fi_addr_t = FI_ADDR_UNSPEC;
        // SAFETY: `av` is our AV; `name` is one address of the provider's format (as
        // another rank's fi_getname wrote it), and libfabric writes one fi_addr_t.
        let ret = unsafe {
            sys::fi_av_insert(
                self.av,
                name.as_ptr().cast::<c_void>(),
                1,
                &mut addr,
                0,
                ptr::null_mut(),
            )
        };
        match ret {
            1 => Ok(addr),
            0 => Err(OfiError::BadAddress { rank }),
            _ => Err(call_error("fi_av_insert", error_code(ret as isize))),
        }
    }
}

impl Transport for OfiTransport {
    type Error = OfiError;

    fn rank(&self) -> Rank {
        self.me
    }
    fn size(&self) -> u32 {
        self.n
    }
    fn send(&mut self, to: Rank, frame: &[u8]) -> Result<(), OfiError> {
        OfiTransport::send(self, to, frame)
    }
    fn send_parts(&mut self, to: Rank, head: &[u8], payload: &Bytes) -> Result<(), OfiError> {
        OfiTransport::send_parts(self, to, head, payload)
    }
    fn forget_peer(&mut self, rank: Rank) {
        self.release_transfers_to(rank);
    }
    fn copies_payload(&self) -> bool {
        self.iov_limit < 2
    }
    /// [`OfiConfig::chunk_bytes`], at most what the receive buffers (`max_frame`) fit.
    fn chunk_bytes(&self) -> usize {
        let overhead = wire::frame_capacity(self.n) - wire::MAX_CHUNK;
        self.chunk_bytes
            .min(self.max_frame.saturating_sub(overhead))
            .max(1)
    }
    fn try_recv(&mut self) -> Result<Option<Received<'_>>, OfiError> {
        OfiTransport::try_recv(self)
    }
    fn try_recv_placing(
        &mut self,
        place: &mut Place<'_>,
    ) -> Result<Option<Delivery<'_>>, OfiError> {
        OfiTransport::try_recv_placing(self, place)
    }
    fn progress(&mut self) -> Result<(), OfiError> {
        OfiTransport::progress(self)
    }
    fn pending_sends(&self) -> usize {
        self.pending()
    }
    fn wait(&mut self, timeout: Duration) -> Result<(), OfiError> {
        OfiTransport::wait(self, timeout)
    }
    fn wakes_on_arrival(&self) -> bool {
        self.waitable
    }
    /// Every round: over `tcp;ofi_rxm` on loopback a spinning rank that yields only
    /// every 16th round (the default, right for MPI's shared memory) holds up peers that
    /// share its core. `ftofi latency`, alternated, load 1.5-2: `validate_global` took
    /// 25-26 µs (1.4-1.6 raw round trips) at n = 2 against 26-67 µs (1.7-2.7), and
    /// 1.8-2.2 raw barriers at n = 4 against 3.0-4.5.
    fn idle_yield_every(&self) -> u32 {
        1
    }
    fn waker(&self) -> Option<Arc<dyn Wake>> {
        self.signal.clone().map(|signal| signal as Arc<dyn Wake>)
    }
}

/// The CQ pointer behind [`CqSignal`]'s lock; null once the CQ is closed.
struct CqPtr(*mut sys::fid_cq);

// SAFETY: the pointer is only dereferenced (by fi_cq_signal) under the CqSignal lock,
// and the transport nulls it under that lock before it closes the CQ.
unsafe impl Send for CqPtr {}

/// Ends an `fi_cq_sread` from another thread ([`Transport::waker`]): application threads
/// of `ft_runtime::Runtime` wake the progress thread when they submit a command.
struct CqSignal {
    cq: Mutex<CqPtr>,
}

impl Wake for CqSignal {
    fn wake(&self) {
        let cq = self.cq.lock().unwrap_or_else(|e| e.into_inner());
        if !cq.0.is_null() {
            // SAFETY: the CQ is open (the transport nulls the pointer under this lock
            // before closing it). fi_cq_signal only signals the CQ's wait object, which
            // libfabric's utility CQs guard themselves, so it may run beside the owning
            // thread's fi_cq_sread; that is what it exists for.
            unsafe { sys::fi_cq_signal(cq.0) };
        }
    }
}

impl Drop for OfiTransport {
    fn drop(&mut self) {
        // No waker may signal the CQ from here on.
        if let Some(signal) = &self.signal {
            signal.cq.lock().unwrap_or_else(|e| e.into_inner()).0 = ptr::null_mut();
        }
        // Endpoint first: after its close libfabric touches no buffer of ours, and the
        // buffers (fields) are freed only after this body. Then every object before the
        // ones it was opened from or bound to.
        // SAFETY: each pointer is null or an object we opened and have not closed; each
        // starts with its `struct fid`, which fi_close takes.
        unsafe {
            if !self.ep.is_null() {
                sys::fi_close(&raw mut (*self.ep).fid);
            }
            // Registrations before the domain; their bytes are freed with the fields.
            for (_, registration) in self.registrations.drain() {
                sys::fi_close(&raw mut (*registration.mr).fid);
            }
            if !self.cq.is_null() {
                sys::fi_close(&raw mut (*self.cq).fid);
            }
            if !self.av.is_null() {
                sys::fi_close(&raw mut (*self.av).fid);
            }
            if !self.domain.is_null() {
                sys::fi_close(&raw mut (*self.domain).fid);
            }
            if !self.fabric.is_null() {
                sys::fi_close(&raw mut (*self.fabric).fid);
            }
            if !self.info.is_null() {
                sys::fi_freeinfo(self.info);
            }
        }
    }
}

fn validate(config: &OfiConfig) -> Result<(), OfiError> {
    let reason = if config.size == 0 {
        "a job has at least one rank".to_owned()
    } else if config.rank >= config.size {
        format!("rank {} outside a job of {}", config.rank, config.size)
    } else if config.max_frame == 0 {
        "max_frame must be positive".to_owned()
    } else if config.recv_depth == 0 {
        "recv_depth must be positive".to_owned()
    } else {
        return Ok(());
    };
    Err(OfiError::InvalidConfig { reason })
}

/// Turns off `ofi_rxm`'s dynamic receive buffers (received data placed straight into
/// the application's buffer by the `tcp` provider) unless the environment already
/// decides: in libfabric 1.17 a message longer than its receive buffer then completes
/// with `FI_ETRUNC` but no length or CQ data, and breaks the connection, so later sends
/// to that rank fail. With rxm's own bounce buffers a truncated message is reported
/// whole and the connection lives on. libfabric reads the variable when its providers
/// load, at the process's first `fi_getinfo`.
fn configure_rxm_once() {
    static ONCE: Once = Once::new();
    const VAR: &str = "FI_OFI_RXM_ENABLE_DYN_RBUF";
    ONCE.call_once(|| {
        if std::env::var_os(VAR).is_none() {
            // Every fi_getinfo of this crate runs after this (the Once blocks them).
            std::env::set_var(VAR, "0");
        }
    });
}

/// The first `fi_info` of `provider` (`name` for messages) for an RDM endpoint bound to
/// `address` if one is given, with RMA reads of registered memory if `rma`.
fn get_info(
    provider: &CStr,
    name: &str,
    address: Option<&CStr>,
    rma: bool,
) -> Result<*mut sys::fi_info, OfiError> {
    configure_rxm_once();
    // SAFETY: fi_allocinfo returns a zeroed fi_info with its attribute structs
    // allocated (or null); the provider name is a malloc'd copy that fi_freeinfo frees
    // with the hints; fi_getinfo reads the hints and writes the list it allocates.
    unsafe {
        let hints = sys::fi_allocinfo();
        if hints.is_null() {
            return Err(call_error("fi_allocinfo", sys::FI_ENOMEM as i32));
        }
        (*hints).caps = u64::from(sys::FI_MSG);
        if rma {
            (*hints).caps |= u64::from(sys::FI_RMA | sys::FI_READ | sys::FI_REMOTE_READ);
        }
        // Contexts are keys, not fi_context structs: no FI_CONTEXT. Receives are always
        // posted, so FI_RX_CQ_DATA costs nothing.
        (*hints).mode = sys::FI_RX_CQ_DATA;
        (*(*hints).ep_attr).type_ = sys::fi_ep_type_FI_EP_RDM;
        let domain = (*hints).domain_attr;
        (*domain).threading = sys::fi_threading_FI_THREAD_DOMAIN;
        (*domain).av_type = sys::fi_av_type_FI_AV_TABLE;
        // Sends and receives use plain heap memory: no FI_MR_LOCAL (so no descriptors).
        // For RMA the transport copes with these modes: remote addresses as virtual
        // addresses, keys the provider picks, registrations of allocated memory only,
        // registrations bound to the endpoint. Not FI_MR_RAW (keys wider than 64 bits).
        (*domain).mr_mode = if rma {
            (sys::FI_MR_VIRT_ADDR
                | sys::FI_MR_PROV_KEY
                | sys::FI_MR_ALLOCATED
                | sys::FI_MR_ENDPOINT) as i32
        } else {
            0
        };
        // The sender's rank travels as CQ data.
        (*domain).cq_data_size = 4;
        let prov_name = libc::strdup(provider.as_ptr());
        if prov_name.is_null() {
            sys::fi_freeinfo(hints);
            return Err(call_error("strdup", sys::FI_ENOMEM as i32));
        }
        (*(*hints).fabric_attr).prov_name = prov_name;
        let mut info: *mut sys::fi_info = ptr::null_mut();
        let (node, flags) = match address {
            Some(address) => (address.as_ptr(), sys::FI_SOURCE),
            None => (ptr::null(), 0),
        };
        let ret = sys::fi_getinfo(
            (sys::FI_MAJOR_VERSION << 16) | sys::FI_MINOR_VERSION,
            node,
            ptr::null(),
            flags,
            hints,
            &mut info,
        );
        sys::fi_freeinfo(hints);
        if ret == -(sys::FI_ENODATA as i32) || (ret == 0 && info.is_null()) {
            return Err(OfiError::ProviderNotFound {
                provider: name.to_owned(),
            });
        }
        check("fi_getinfo", ret)?;
        // Keep the first match only.
        if !(*info).next.is_null() {
            sys::fi_freeinfo((*info).next);
            (*info).next = ptr::null_mut();
        }
        Ok(info)
    }
}

/// Publishes `name` as this rank's and waits for every rank's; names in rank order.
fn exchange_names(config: &OfiConfig, name: &[u8]) -> Result<Vec<Vec<u8>>, OfiError> {
    let dir = &config.rendezvous;
    let io_error = |path: &Path| {
        let path = path.to_owned();
        move |source| OfiError::Rendezvous { path, source }
    };
    fs::create_dir_all(dir).map_err(io_error(dir))?;
    let mine = name_file(dir, config.rank);
    let temp = dir.join(format!(
        ".rank-{}.addr.{}.tmp",
        config.rank,
        std::process::id()
    ));
    fs::write(&temp, name).map_err(io_error(&temp))?;
    fs::rename(&temp, &mine).map_err(io_error(&mine))?;

    let start = Instant::now();
    let mut names: Vec<Option<Vec<u8>>> = vec![None; config.size as usize];
    loop {
        for (rank, slot) in names.iter_mut().enumerate() {
            if slot.is_some() {
                continue;
            }
            let path = name_file(dir, rank as Rank);
            match fs::read(&path) {
                Ok(bytes) if !bytes.is_empty() => *slot = Some(bytes),
                Ok(_) => return Err(OfiError::BadAddress { rank: rank as Rank }),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_error(&path)(e)),
            }
        }
        if names.iter().all(Option::is_some) {
            return Ok(names.into_iter().flatten().collect());
        }
        if start.elapsed() >= config.connect_timeout {
            let missing = (0..config.size)
                .filter(|&rank| names[rank as usize].is_none())
                .collect();
            return Err(OfiError::RendezvousTimeout {
                missing,
                waited: start.elapsed(),
            });
        }
        std::thread::sleep(RENDEZVOUS_POLL);
    }
}

/// Where rank `rank` publishes its endpoint name.
fn name_file(dir: &Path, rank: Rank) -> PathBuf {
    dir.join(format!("rank-{rank}.addr"))
}

/// An operation's context: a key, not a pointer (see the module docs).
fn context(slot: usize, kind: usize) -> *mut c_void {
    ptr::without_provenance_mut((slot << 2) | kind)
}

/// The slot and kind of a context key.
fn key(context: *mut c_void) -> (usize, usize) {
    let key = context.addr();
    (key >> 2, key & 3)
}

/// Errors of a send that mean the peer is dead or unreachable, not that we erred.
fn is_peer_failure(code: i32) -> bool {
    [
        sys::FI_ECONNREFUSED,
        sys::FI_ECONNRESET,
        sys::FI_ECONNABORTED,
        sys::FI_ENOTCONN,
        sys::FI_ESHUTDOWN,
        sys::FI_EHOSTDOWN,
        sys::FI_EHOSTUNREACH,
        sys::FI_ENETUNREACH,
        sys::FI_ENETDOWN,
        sys::FI_ETIMEDOUT,
        sys::FI_EIO,
        // `sockets` (1.17): no connection to the peer could be made.
        sys::FI_ENOENT,
    ]
    .iter()
    .any(|&peer| code == peer as i32)
}

/// The positive error code of a negative return value.
fn error_code(ret: isize) -> i32 {
    i32::try_from(-ret).unwrap_or(i32::MAX)
}

fn check(call: &'static str, ret: i32) -> Result<(), OfiError> {
    if ret >= 0 {
        Ok(())
    } else {
        Err(call_error(call, -ret))
    }
}

fn call_error(call: &'static str, code: i32) -> OfiError {
    // SAFETY: fi_strerror returns a static NUL-terminated string for any code.
    let message = unsafe { CStr::from_ptr(sys::fi_strerror(code)) }
        .to_string_lossy()
        .into_owned();
    OfiError::Call {
        call,
        code,
        message,
    }
}

#[cfg(test)]
mod tests {
    //! A peer that sends malformed or stale control messages: each is refused with its
    //! typed error and counted, an offer the reader cannot serve is a lost (or
    //! oversized) frame, and the transport goes on delivering frames, RMA ones too.
    //! Two transports on `tcp;ofi_rxm` over loopback, one per thread.

    use super::*;

    /// How long either side waits for the other before the test fails.
    const LIMIT: Duration = Duration::from_secs(10);

    /// Rank 0 and rank 1 of a fresh job, each running `body` on its own thread.
    fn pair<R: Send>(test: &str, body: impl Fn(OfiTransport) -> R + Sync) -> Vec<R> {
        let dir = std::env::temp_dir().join(format!("ofi-unit-{test}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let results = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..2)
                .map(|rank| {
                    let mut config = OfiConfig::new(2, rank, &dir);
                    config.address = Some("127.0.0.1".into());
                    let body = &body;
                    scope.spawn(move || body(OfiTransport::open(config).expect("open")))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a rank panicked"))
                .collect()
        });
        let _ = fs::remove_dir_all(&dir);
        results
    }

    /// Progresses `t` until `done` holds, keeping every frame received in `frames` (an
    /// oversized one as its length's bytes).
    fn drive_until(
        t: &mut OfiTransport,
        what: &str,
        frames: &mut Vec<Vec<u8>>,
        mut done: impl FnMut(&OfiTransport, &[Vec<u8>]) -> bool,
    ) {
        let start = Instant::now();
        while !done(t, frames) {
            assert!(
                start.elapsed() < LIMIT,
                "rank {}: no {what}; {:?}, last control error {:?}",
                t.rank(),
                t.stats(),
                t.last_control_error()
            );
            t.progress().expect("progress");
            while let Some(got) = t.try_recv().expect("try_recv") {
                frames.push(match got {
                    Received::Frame { bytes, .. } => bytes.to_vec(),
                    Received::Owned { frame, .. } => frame.to_vec(),
                    Received::Oversized { len, .. } => len.to_le_bytes().to_vec(),
                });
            }
        }
    }

    /// Sends `bytes` as a control message, as a misbehaving peer would.
    fn send_raw_control(t: &mut OfiTransport, to: Rank, bytes: &[u8]) {
        let frame = Frame {
            head: bytes.into(),
            payload: None,
            carries: Carries::Done,
        };
        t.start(to, frame).expect("send");
    }

    #[test]
    fn bad_control_messages_are_typed_errors_and_the_transport_goes_on() {
        let payload = Bytes::from((0..200_000u32).map(|i| (i % 251) as u8).collect::<Vec<_>>());
        let mut done_with_extra = rma::encode_done(1).into_vec();
        done_with_extra.push(0);
        let bogus_key = rma::encode_offer(&Offer {
            id: 999,
            addr: 0x1000,
            len: 100_000,
            key: 0xdead_beef,
            head: b"h",
        });
        let too_long = rma::encode_offer(&Offer {
            id: 998,
            addr: 0,
            len: 1 << 40,
            key: 1,
            head: b"h",
        });
        // What rank 0 sends, and the error rank 1 must report for each.
        let malformed: Vec<(Vec<u8>, ControlError)> = vec![
            (vec![], ControlError::Empty),
            (vec![7, 0, 0], ControlError::UnknownKind { kind: 7 }),
            (
                vec![1, 0, 0, 0, 0],
                ControlError::Truncated { len: 5, need: 33 },
            ),
            (
                rma::encode_done(42).into_vec(),
                ControlError::UnknownTransfer { id: 42 },
            ),
            (done_with_extra, ControlError::TrailingBytes { len: 10 }),
        ];
        let finished = std::sync::atomic::AtomicBool::new(false);
        pair("badctl", |mut t| {
            let me = t.rank();
            let mut frames: Vec<Vec<u8>> = Vec::new();
            if me == 0 {
                assert!(t.uses_rma(), "tcp;ofi_rxm offers FI_RMA");
                for (step, (bytes, _)) in malformed.iter().enumerate() {
                    send_raw_control(&mut t, 1, bytes);
                    drive_until(&mut t, "go-ahead", &mut frames, |_, frames| {
                        frames.len() > step
                    });
                }
                send_raw_control(&mut t, 1, &too_long);
                // Rank 1 answers with a done message for an id never offered.
                drive_until(&mut t, "a stale done", &mut frames, |t, _| {
                    t.stats().bad_control == 1
                });
                assert_eq!(
                    t.last_control_error(),
                    Some(&ControlError::UnknownTransfer { id: 998 })
                );
                // A real RMA frame still goes through, and its done message comes back.
                t.send_parts(1, b"head", &payload).expect("send_parts");
                assert_eq!(t.rma_transfers_open(), 1);
                drive_until(&mut t, "the done message", &mut frames, |t, _| {
                    t.rma_transfers_open() == 0 && t.pending_sends() == 0
                });
                assert_eq!(t.stats().rma_offered, 1);
                // Last, an offer with a key this rank never registered: `tcp;ofi_rxm`
                // (1.17) answers the read with an error and breaks the connection.
                send_raw_control(&mut t, 1, &bogus_key);
                drive_until(&mut t, "the end", &mut frames, |_, _| {
                    finished.load(std::sync::atomic::Ordering::SeqCst)
                });
            } else {
                for (step, (_, error)) in malformed.iter().enumerate() {
                    drive_until(&mut t, "a bad control message", &mut frames, |t, _| {
                        t.stats().bad_control > step as u64
                    });
                    assert_eq!(t.last_control_error(), Some(error), "step {step}");
                    t.send(0, b"next").expect("send");
                }
                // The oversized offer is reported as a two-sided frame this long would
                // have been.
                drive_until(&mut t, "the oversized offer", &mut frames, |_, frames| {
                    !frames.is_empty()
                });
                assert_eq!(frames, vec![((1usize << 40) + 1).to_le_bytes().to_vec()]);
                assert_eq!(t.stats().oversized, 1);
                frames.clear();
                drive_until(&mut t, "the RMA frame", &mut frames, |_, frames| {
                    !frames.is_empty()
                });
                assert_eq!(&frames[0][..4], b"head");
                assert_eq!(&frames[0][4..], &payload[..]);
                let stats = t.stats();
                assert_eq!((stats.rma_reads, stats.rma_bytes_read), (1, 200_000));
                assert_eq!(stats.bad_control, malformed.len() as u64);
                // The read behind the bogus key fails: a lost frame, not an error.
                drive_until(&mut t, "the failed read", &mut frames, |t, _| {
                    t.stats().rma_lost_reads == 1
                });
                assert_eq!(frames.len(), 1, "the failed read delivered nothing");
                finished.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        });
    }
}
