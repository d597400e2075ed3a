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
//! - **send_parts** (the bulk-data path) sends a header and a payload as one message
//!   without copying the payload: the header goes into a pooled buffer and an
//!   `MPI_Type_create_hindexed` of two byte blocks (header, then payload, at their
//!   addresses relative to the header) describes the message; the datatype is freed
//!   once the `MPI_Isend` is posted (MPI keeps it while the send needs it), and a
//!   clone of the payload's [`Bytes`] stays in the pending send until it completes.
//!   Payloads shorter than [`COPY_BELOW`] are copied after the header instead (a
//!   datatype costs more than such a copy). The receiver sees one contiguous frame;
//!   [`TransportStats::payload_bytes_in_place`] and
//!   [`TransportStats::payload_bytes_copied`] count the two cases;
//! - **receive** keeps a ring of [`RECV_SLOTS`] any-source `MPI_Irecv`s posted, each
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

use std::fmt;
use std::os::raw::{c_int, c_void};

use bytes::Bytes;
use ft_core::{wire, Rank};
use ft_runtime::{Received, Transport};
use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::topology::{Communicator, SimpleCommunicator};

/// The tag of every frame.
const FRAME_TAG: c_int = 0x6674;

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
/// header rather than described by a datatype.
pub const COPY_BELOW: usize = 512;

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
}

/// Frames between the ranks of one communicator: see the [module docs](self).
pub struct MpiTransport {
    comm: SimpleCommunicator,
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
    statuses: Vec<ffi::MPI_Status>,
    ring: RecvRing,
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
        let me = comm.rank() as Rank;
        let n = comm.size() as u32;
        let capacity = wire::frame_capacity(n);
        let mut transport = MpiTransport {
            comm,
            me,
            n,
            requests: Vec::new(),
            sending: Vec::new(),
            spare: Vec::new(),
            completed: Vec::new(),
            statuses: Vec::new(),
            ring: RecvRing {
                requests: vec![null_request(); RECV_SLOTS],
                buffers: (0..RECV_SLOTS)
                    .map(|_| Vec::with_capacity(capacity))
                    .collect(),
                capacity,
                head: 0,
                repost: false,
            },
            stats: TransportStats::default(),
        };
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
        self.send_copied(to, &[frame])
    }

    /// Sends `parts`, one after the other, as one frame copied into a pooled buffer.
    fn send_copied(&mut self, to: Rank, parts: &[&[u8]]) -> Result<(), MpiError> {
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
        self.isend(to, pending, len, byte)
    }

    /// Starts sending one frame, `head` followed by `payload`, to `to` without copying
    /// the payload (unless it is shorter than [`COPY_BELOW`]): a clone of `payload` is
    /// kept until the send completes. A peer that died is not an error.
    ///
    /// # Panics
    /// As [`MpiTransport::send`], for the whole frame.
    pub fn send_parts(&mut self, to: Rank, head: &[u8], payload: &Bytes) -> Result<(), MpiError> {
        self.check_peer(to);
        if payload.len() < COPY_BELOW {
            self.stats.payload_bytes_copied += payload.len() as u64;
            return self.send_copied(to, &[head, payload]);
        }
        assert!(
            c_int::try_from(head.len() + payload.len()).is_ok(),
            "frame longer than i32::MAX bytes"
        );
        let mut bytes = self.take_buffer();
        bytes.extend_from_slice(head);
        // SAFETY: reading an MPI constant handle.
        let byte = unsafe { ffi::RSMPI_UINT8_T };
        let mut head_at: ffi::MPI_Aint = 0;
        let mut payload_at: ffi::MPI_Aint = 0;
        // SAFETY: MPI reads nothing at either address; it writes the two integers.
        unsafe {
            check(
                "MPI_Get_address",
                ffi::MPI_Get_address(bytes.as_ptr().cast::<c_void>(), &mut head_at),
            )?;
            check(
                "MPI_Get_address",
                ffi::MPI_Get_address(payload.as_ptr().cast::<c_void>(), &mut payload_at),
            )?;
        }
        // Both lengths fit: their sum does.
        let lengths = [head.len() as c_int, payload.len() as c_int];
        // Relative to the header's buffer, the Isend's base address, so that no
        // MPI_BOTTOM is needed.
        let displacements = [0, payload_at.wrapping_sub(head_at)];
        // SAFETY: reading an MPI constant handle.
        let mut datatype = unsafe { ffi::RSMPI_DATATYPE_NULL };
        // SAFETY: two blocks, both arrays hold two entries; MPI writes the new type.
        check("MPI_Type_create_hindexed", unsafe {
            ffi::MPI_Type_create_hindexed(
                2,
                lengths.as_ptr(),
                displacements.as_ptr(),
                byte,
                &mut datatype,
            )
        })?;
        // SAFETY: a datatype we created and own.
        let committed = check("MPI_Type_commit", unsafe {
            ffi::MPI_Type_commit(&mut datatype)
        });
        let pending = Sending {
            bytes,
            payload: Some(payload.clone()),
        };
        let sent = committed.and_then(|()| self.isend(to, pending, 1, datatype));
        // SAFETY: our datatype; a send posted with it completes normally after the free
        // (MPI keeps the type while a pending operation uses it).
        unsafe { ffi::MPI_Type_free(&mut datatype) };
        if sent.is_ok() {
            self.stats.payload_bytes_in_place += payload.len() as u64;
        }
        sent
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

    /// Posts `MPI_Isend(pending.bytes, count, datatype)` to `to` and keeps `pending`
    /// until it completes; a dead peer drops the frame.
    fn isend(
        &mut self,
        to: Rank,
        pending: Sending,
        count: c_int,
        datatype: ffi::MPI_Datatype,
    ) -> Result<(), MpiError> {
        let mut request = null_request();
        // SAFETY: `datatype` (`count` of it) describes `pending.bytes` and, for a
        // two-block type, `pending.payload`'s bytes, both alive and unmoved in
        // `sending` until MPI completes or frees the request.
        let code = unsafe {
            ffi::MPI_Isend(
                pending.bytes.as_ptr().cast::<c_void>(),
                count,
                datatype,
                to as c_int,
                FRAME_TAG,
                self.comm.as_raw(),
                &mut request,
            )
        };
        if is_process_failure(code) {
            self.stats.dropped_to_failed += 1;
            self.recycle(pending.bytes);
            return Ok(());
        }
        if let Err(e) = check("MPI_Isend", code) {
            self.recycle(pending.bytes);
            return Err(e);
        }
        self.stats.sent += 1;
        self.requests.push(request);
        self.sending.push(pending);
        Ok(())
    }

    /// Completes the sends MPI has finished (their buffers go back to the pool), in one
    /// `MPI_Testsome`; sends whose peer died are dropped and counted.
    pub fn progress(&mut self) -> Result<(), MpiError> {
        if self.requests.is_empty() {
            return Ok(());
        }
        let count = self.requests.len();
        self.completed.resize(count, 0);
        self.statuses.resize_with(count, empty_status);
        let mut done: c_int = 0;
        // SAFETY: `requests` holds `count` live requests of ours; MPI writes at most
        // `count` indices and statuses, and sets completed requests to null.
        let code = unsafe {
            ffi::MPI_Testsome(
                count as c_int,
                self.requests.as_mut_ptr(),
                &mut done,
                self.completed.as_mut_ptr(),
                self.statuses.as_mut_ptr(),
            )
        };
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
        if self.spare.len() < SPARE_BUFFERS {
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
                FRAME_TAG,
                self.comm.as_raw(),
                &mut self.ring.requests[slot],
            )
        }
    }

    /// Receives one frame if one has arrived.
    pub fn try_recv(&mut self) -> Result<Option<Received<'_>>, MpiError> {
        // Each round either returns or retires the head (a lost or oversized message
        // whose slot is re-posted): bounded by the ring.
        for _ in 0..=RECV_SLOTS {
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
                self.stats.received += 1;
                if len < HAND_OVER_FROM {
                    return Ok(Some(Received::Frame {
                        from,
                        bytes: &self.ring.buffers[head],
                    }));
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
                return Ok(Some(Received::Owned {
                    from,
                    frame: Bytes::from(frame),
                }));
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
                return Ok(Some(Received::Oversized {
                    from: status.MPI_SOURCE as Rank,
                    len,
                }));
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
    fn copies_payload(&self) -> bool {
        MpiTransport::copies_payload(self)
    }
    fn try_recv(&mut self) -> Result<Option<Received<'_>>, MpiError> {
        MpiTransport::try_recv(self)
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
            if *request == null_request() {
                continue;
            }
            let mut flag: c_int = 0;
            let mut status = empty_status();
            // SAFETY: a posted receive of ours: cancelled (an unmatched receive then
            // completes at once), then tested; MPI writes the flag and the status.
            unsafe {
                ffi::MPI_Cancel(request);
                ffi::MPI_Test(request, &mut flag, &mut status);
            }
            if flag == 0 && *request != null_request() {
                // Matched and still in transfer: MPI may still write the buffer.
                // SAFETY: a live request of ours, given up.
                unsafe { ffi::MPI_Request_free(request) };
                std::mem::forget(buffer);
            }
        }
    }
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

fn null_request() -> ffi::MPI_Request {
    // SAFETY: reading an MPI constant handle.
    unsafe { ffi::RSMPI_REQUEST_NULL }
}

fn empty_status() -> ffi::MPI_Status {
    // SAFETY: `MPI_Status` is a C struct of integers; all zeroes is a valid value.
    unsafe { std::mem::zeroed() }
}
