//! The receive ring: [`RECV_SLOTS`] any-source, any-tag `MPI_Irecv`s kept posted on the
//! frame communicator, each into its own buffer of the largest frame of this
//! communicator ([`ft_core::wire::frame_capacity`]).
//!
//! MPI matches an arriving message to the earliest posted receive that fits, so the
//! ring's head is always the first to be matched: [`MpiTransport::try_recv`] tests the
//! head alone (`MPI_Test`), lends its frame out, and re-posts it at the next call before
//! moving to the next slot. A frame of at least [`HAND_OVER_FROM`] bytes (a broadcast
//! chunk) is handed over instead ([`Received::Owned`]): the slot's buffer becomes the
//! frame's [`Bytes`], which the broadcaster keeps and forwards from without a copy, and
//! the slot is re-posted with a new buffer (an allocation per such frame, in place of a
//! copy of it). Smaller frames (control frames) are lent, allocating nothing. So frames
//! are handed on in the order MPI matched them, and frames from one sender keep their
//! order (MPI's non-overtaking rule), as with a probe per frame. A longer message is
//! truncated by MPI (`MPI_ERR_TRUNCATE`) and reported as [`Received::Oversized`], whose
//! `len` is then a lower bound (MPI does not say the length of a truncated message),
//! never handed on.
//!
//! A head ([`HEAD_TAG`], [`PROMISED_HEAD_TAG`]) starts the receive of its payload
//! (`super::payload`). A joined message ([`JOINED_TAG`], [`JOINED_HEAD_TAG`],
//! [`JOINED_PROMISED_HEAD_TAG`]) is taken apart: the receiver hands the front frame on
//! first and keeps the rest in its ring slot until the next call (so the machine has
//! taken in the activation, and knows the output's size, before it is asked where the
//! payload goes), then treats the rest as a head (or a whole frame); the slot is
//! re-posted after that. A joined message whose front length runs past its end is
//! counted in [`TransportStats::bad_heads`] and dropped.
//!
//! With the `ulfm` feature, a receive that cannot match because a process died stays
//! posted until the failures are acknowledged (`super::failures`); one matched to a
//! sender that died during the transfer loses its frame, and its slot is re-posted.
//! Open MPI 5 may report a receive that was found pending once, and then matched and
//! completed, as `MPI_ERR_PROC_FAILED_PENDING` with its completion flag set, at every
//! test from then on, and keeps the request: such a receive is taken as completed
//! ([`is_stale_pending`]; [`TransportStats::completed_pending`] counts them), or the
//! ring's head would never move again and the rank would hear no peer.

use std::os::raw::{c_int, c_void};

use bytes::Bytes;
use ft_core::Rank;
use ft_runtime::{Delivery, Place, Received};
use mpi::ffi;
use mpi::raw::AsRaw;

use super::failures::{check, error_class, is_process_failure};
use super::framing::{
    joined_front, Follows, HEAD_TAG, JOINED_HEAD_TAG, JOINED_PROMISED_HEAD_TAG, JOINED_TAG,
    PROMISED_HEAD_TAG,
};
use super::payload::Arrival;
use super::requests::{empty_status, null_request};
#[cfg(doc)]
use super::TransportStats;
use super::{MpiError, MpiTransport};

/// Any-source receives kept posted, each with a buffer of
/// [`ft_core::wire::frame_capacity`] bytes (about 66 KiB): about 0.5 MiB per rank.
pub const RECV_SLOTS: usize = 8;

/// Received frames of at least this many bytes are handed over
/// ([`Received::Owned`]), shorter ones lent ([`Received::Frame`]).
///
/// Handing a frame over costs an allocation (its new receive buffer) where lending costs
/// the receiver a copy, and the library's control frames (detector, agreement,
/// activation, request) stay below 4 KiB up to thousands of ranks, so they keep the lent
/// path with no allocation per frame while data chunks of 4 KiB and more are not copied.
/// A larger control frame is handed over too, which is correct, only not free.
pub const HAND_OVER_FROM: usize = 4096;

/// The pre-posted receives: see the [module docs](self).
pub(super) struct RecvRing {
    /// One request per slot; `MPI_REQUEST_NULL` while the slot is not posted.
    pub(super) requests: Vec<ffi::MPI_Request>,
    /// One per slot, of capacity at least `capacity`: see the module's invariants.
    pub(super) buffers: Vec<Vec<u8>>,
    /// The bytes each receive may take: the largest frame of the communicator.
    pub(super) capacity: usize,
    /// The slot posted first among those posted: the next to match.
    pub(super) head: usize,
    /// The head's frame was lent out (or lost): it must be re-posted, and the head
    /// moved on, before anything else is received.
    pub(super) repost: bool,
    /// The head's message held two frames ([`JOINED_TAG`], [`JOINED_HEAD_TAG`]) and
    /// the first was lent out: the second, still in the slot, is handed on (or its
    /// payload's receive posted) before the slot is re-posted.
    pub(super) rest: Option<Rest>,
}

impl RecvRing {
    /// [`RECV_SLOTS`] slots, none posted, with buffers of `capacity` bytes.
    pub(super) fn new(capacity: usize) -> Self {
        RecvRing {
            requests: vec![null_request(); RECV_SLOTS],
            buffers: (0..RECV_SLOTS)
                .map(|_| Vec::with_capacity(capacity))
                .collect(),
            capacity,
            head: 0,
            repost: false,
            rest: None,
        }
    }
}

/// The second frame of a joined message, waiting in the ring's head slot.
#[derive(Clone, Copy, Debug)]
pub(super) struct Rest {
    from: Rank,
    /// Where it starts in the slot's buffer.
    start: usize,
    /// Whether it is a whole frame or a head whose payload follows.
    kind: Follows,
}

impl MpiTransport {
    /// Posts the any-source receive of ring slot `slot`; returns MPI's code.
    pub(super) fn post_recv(&mut self, slot: usize) -> c_int {
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
            let completed_pending = flag != 0 && is_stale_pending(code);
            if completed_pending {
                // Completed, yet reported pending (Open MPI): MPI keeps the request;
                // the frame is here all the same.
                self.free_failed_recv(head);
                self.stats.completed_pending += 1;
                self.ack_failures()?;
            }
            if code == ffi::MPI_SUCCESS as c_int || completed_pending {
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
            if class == crate::ulfm::ERR_PROC_FAILED_PENDING {
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
}

/// Whether a test whose completion flag is set but whose code is
/// `MPI_ERR_PROC_FAILED_PENDING` (with the `ulfm` feature) is a completed receive: the
/// status's source and count describe what landed in the buffer (see the [module
/// docs](self)).
fn is_stale_pending(code: c_int) -> bool {
    cfg!(feature = "ulfm") && error_class(code) == crate::ulfm::ERR_PROC_FAILED_PENDING
}
