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
//!   copied frame instead, and [`Transport::copies_payload`] says so. (What the provider
//!   itself does with the iovec is its business: `ofi_rxm` copies messages under its
//!   eager limit into its own bounce buffers.) A post refused with `-FI_EAGAIN` (the
//!   provider is out of send slots, or still connecting, as `tcp;ofi_rxm` is until both
//!   sides progress) parks the frame in a per-destination backlog that
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
//!   completion names its buffer; [`OfiTransport::try_recv`] lends a short frame out of
//!   it and posts the buffer again at the next call that takes `&mut self`, and hands a
//!   frame of at least [`HAND_OVER_FROM`] bytes over with its
//!   buffer ([`Received::Owned`]), posting a fresh one in its place, so a broadcast
//!   chunk is kept without a copy. A message longer
//!   than `max_frame` completes with `FI_ETRUNC` and is reported as
//!   [`Received::Oversized`]; one whose CQ data is not a rank of the job is dropped and
//!   counted. Receive completions found while polling for send completions wait in a
//!   queue, in completion order, for `try_recv`;
//! - **RMA for bulk data** ([`crate::rma`]): a payload of at least
//!   [`OfiConfig::rma_threshold`] bytes is not sent at all. It is registered
//!   (`FI_REMOTE_READ`; one registration per payload slice, shared by every transfer of
//!   the same bytes, as a relay forwards one chunk to each child) and the receiver gets
//!   an offer (the head, address, length, key, transfer id) as a control message; it
//!   reads the payload with `fi_read` into a buffer behind the head (the frame then
//!   handed over with that buffer), or, through
//!   [`OfiTransport::try_recv_placing`] (what the driver calls), into the memory the
//!   caller gives for it (the machine's [`ft_core::Protocol::place_payload`]: a chunk of
//!   a multi-chunk broadcast output lands at its offset in the output's one buffer,
//!   [`OfiStats::rma_bytes_placed`]); an offer's read starts once every frame received
//!   before it was handed on, so the activation that announces an output is seen first.
//!   It delivers the frame the sender meant, and answers done, whereupon the sender
//!   drops its `Bytes` clone and closes the registration once no transfer uses it. The
//!   endpoint asks for `FI_RMA` and copes with `FI_MR_VIRT_ADDR`, `FI_MR_PROV_KEY`,
//!   `FI_MR_ALLOCATED` and `FI_MR_ENDPOINT`; a provider without `FI_RMA` is opened for
//!   messages only and large payloads go two-sided (counted as fallbacks). A transfer is
//!   released without its done message when its receiver is taken for dead: a send to it
//!   failed, [`Transport::forget_peer`] told it the peer is dead (the driver does, for
//!   every death its stack learns), or it stayed unanswered for the stall timeout while
//!   that rank sent nothing. Its bytes then stay another stall timeout (the provider may
//!   still have a reply from them queued). A transfer unanswered for the stall timeout
//!   stops counting as pending. A read that fails (the sender died, or its offer named
//!   memory it does not have) is a lost frame: the protocol repairs it as it repairs
//!   frames of a dead rank. A malformed or stale control message is refused with a
//!   [`ControlError`] and counted, never a panic or a transport error; an offer longer
//!   than `max_frame` is reported as [`Received::Oversized`], as the two-sided frame
//!   would have been. `tcp;ofi_rxm` (1.17) breaks the connection to a peer whose read
//!   names a key it never registered.
//!
//! For `ofi_rxm` the transport turns off dynamic receive buffers
//! (`FI_OFI_RXM_ENABLE_DYN_RBUF=0`, unless the environment sets it): with them, libfabric
//! 1.17 reports a truncated message without its length or sender and breaks the
//! connection it came on. It also sizes rxm's bounce buffers per connection
//! (`FI_OFI_RXM_MSG_RX_SIZE`) by the job: rxm's default of 128 up to 32 ranks, down to
//! 32 from 128 ranks, since rxm allocates and zeroes them inside the first send to each
//! peer, and at rxm's default that stalled the progress loops of a 64-rank job on 2
//! cores past the detector's timeout.
//!
//! Invariants:
//!
//! - every buffer handed to libfabric (a posted send or receive, a send's shared payload
//!   through its `Bytes` clone, a read's target buffer) stays alive, unmoved (boxed, or
//!   shared and immutable), until its completion is read or the endpoint is closed;
//!   `Drop` closes the endpoint, then the registrations, before any buffer is freed.
//!   Closing may take as long as connected peers keep sending to this endpoint:
//!   `tcp;ofi_rxm` (libfabric 1.17) spins in `fi_close` while they do (the loopback
//!   test `a_peer_that_leaves_after_connecting_is_a_dropped_frame`);
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
//!
//! The parts, one file each, all of them `impl OfiTransport` blocks over the one
//! struct defined here:
//!
//! - `config`, `error`, `stats`: [`OfiConfig`] and its defaults, [`OfiError`],
//!   [`OfiStats`];
//! - `endpoint`: [`OfiTransport::open`], the libfabric objects and their closing
//!   (`Drop`), and the CQ's waker;
//! - `rendezvous`: the exchange of endpoint names through the shared directory;
//! - `send`: posting frames (`fi_injectdata`, `fi_senddata`, `fi_sendmsg`), the
//!   per-destination backlog, send completions;
//! - `recv`: the posted receive buffers and what [`OfiTransport::try_recv_placing`]
//!   hands out;
//! - `rma_offer`: the sender's side of RMA, registrations and the transfers that offer
//!   them;
//! - `rma_read`: the receiver's side of RMA, control messages in, `fi_read`s, done
//!   messages out;
//! - `progress`: reading the completion queue, [`OfiTransport::progress`] and
//!   [`OfiTransport::wait`], and the stall timeout.

mod config;
mod endpoint;
mod error;
mod progress;
mod recv;
mod rendezvous;
mod rma_offer;
mod rma_read;
mod send;
mod stats;

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_void, CStr};
use std::fmt;
use std::ptr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ft_core::{wire, Rank};
use ft_runtime::{Bytes, Delivery, Place, Received, Transport, Wake};

use crate::rma::ControlError;
use crate::sys;

pub use config::{
    OfiConfig, DEFAULT_CHUNK_BYTES, DEFAULT_PROVIDER, DEFAULT_RECV_DEPTH, DEFAULT_RMA_THRESHOLD,
};
pub use error::OfiError;
pub use recv::HAND_OVER_FROM;
pub use stats::OfiStats;

use endpoint::CqSignal;
use recv::Arrival;
use rma_offer::{Registration, Transfer};
use rma_read::{OfferedRead, PendingRead};
use send::{InFlight, Parked};

/// `fi_addr_t` of "any source" (`FI_ADDR_UNSPEC`, a cast bindgen cannot translate).
pub(super) const FI_ADDR_UNSPEC: sys::fi_addr_t = u64::MAX;

/// Context kind of a posted send.
pub(super) const SEND: usize = 1;

/// Context kind of a posted receive.
pub(super) const RECV: usize = 2;

/// Context kind of a posted RMA read.
pub(super) const READ: usize = 3;

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
    /// Read buffers (`max_frame` bytes) of failed reads, to reuse.
    read_spares: Vec<Box<[u8]>>,
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
    /// `tx_attr.inject_size`, 64 bytes on `tcp;ofi_rxm`): copied at once, no
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

    /// Sends neither completed nor given up: posted and waiting for their completion,
    /// or refused with `-FI_EAGAIN` and waiting to be posted, for at most
    /// [`OfiConfig::stall_timeout`] (then dropped, or no longer waited for).
    pub fn pending_sends(&self) -> usize {
        self.pending()
    }

    fn pending(&self) -> usize {
        self.in_flight_count + self.backlog_count + self.transfers_pending
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
    /// share its core, and every round trip of theirs waits for it.
    fn idle_yield_every(&self) -> u32 {
        1
    }
    fn waker(&self) -> Option<Arc<dyn Wake>> {
        self.signal.clone().map(|signal| signal as Arc<dyn Wake>)
    }
}

/// An operation's context: a key, not a pointer (see the module docs).
pub(super) fn context(slot: usize, kind: usize) -> *mut c_void {
    ptr::without_provenance_mut((slot << 2) | kind)
}

/// The slot and kind of a context key.
pub(super) fn key(context: *mut c_void) -> (usize, usize) {
    let key = context.addr();
    (key >> 2, key & 3)
}

#[cfg(test)]
mod tests;
