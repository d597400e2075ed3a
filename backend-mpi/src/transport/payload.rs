//! The receives of payloads that follow their heads on the payload communicator.
//!
//! A receiver that gets a head posts the receive of its payload from that sender: under
//! [`FRAME_TAG`] for a payload sent right behind its head (MPI keeps a pair's messages
//! in order, so the next payload from that sender is this head's), or under the tag the
//! head names for a promised one (`super::promise`). The payload goes
//!
//! - **in place**, when the caller of [`MpiTransport::try_recv_placing`] (the driver)
//!   gives a slot of the payload's length: the machine's
//!   [`ft_core::Protocol::place_payload`] puts a broadcast chunk of a multi-chunk
//!   output straight at its offset in the output's one buffer, a [`ft_core::Slot`]. The
//!   `MPI_Irecv` writes there, and the frame comes out as [`Delivery::Placed`] (its head
//!   and the slot, filled), or the slot as [`Delivery::Unplaced`] if the sender died
//!   first or sent another length ([`TransportStats::placed_mismatched`]).
//!   [`TransportStats::payload_bytes_placed`] counts them;
//! - **behind its head** otherwise: into a buffer of the [`ReceivePool`] right behind a
//!   copy of the head, and the whole frame is handed over ([`Received::Owned`]) once it
//!   completes, so the protocol sees the same frames either way.
//!
//! Completions are found by one `MPI_Testsome` over the payloads pending, and handed on
//! in the order their receives were posted. A payload over [`MAX_PAYLOAD`] is received
//! into no room (truncated, which keeps the pair in step) and reported
//! [`Received::Oversized`]; a sender that dies first loses the frame
//! ([`TransportStats::lost_in_transfer`]). A payload may complete after a later whole
//! frame from its sender: the protocols do not rely on a pair's frames keeping their
//! order. With `ft_runtime::timeline` on, each payload receive posted and each poll
//! that found payloads landed is marked.
//!
//! [`ReceivePool`]: crate::pool::ReceivePool

use std::os::raw::{c_int, c_void};

#[cfg(doc)]
use super::framing::HEAD_TAG;
use ft_core::{Filled, Rank, Slot};
use ft_runtime::timeline::{self, Mark};
use ft_runtime::Place;
#[cfg(doc)]
use ft_runtime::{Delivery, Received};
use mpi::ffi;
use mpi::raw::AsRaw;

use super::failures::{check, error_class, is_process_failure};
use super::framing::{Follows, FIRST_PROMISE_TAG, FRAME_TAG};
use super::requests::{empty_status, null_request, test_some};
use super::{MpiError, MpiTransport, TransportStats, MAX_PAYLOAD};

/// A payload's receive, posted when its head ([`HEAD_TAG`]) arrived: `buffer` holds
/// the head, and MPI writes the payload right behind it, so the frame arrives whole;
/// or, if the caller gave memory for it ([`MpiTransport::try_recv_placing`]), into
/// `slot`, and `buffer` holds the head alone.
pub(super) struct Incoming {
    /// Capacity: the head and the payload (or the head alone, for a payload refused or
    /// placed).
    pub(super) buffer: Vec<u8>,
    pub(super) from: Rank,
    /// The payload's length as its head announced it.
    pub(super) len: usize,
    /// The caller's memory the payload is received into.
    pub(super) slot: Option<Slot>,
}

/// What a payload receive gave, waiting for [`MpiTransport::try_recv`].
pub(super) enum Arrival {
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

impl MpiTransport {
    /// Ring slot `slot` holds a head from `from`: posts the receive of its payload from
    /// `from` on the payload communicator (MPI keeps a pair's messages in order, so the
    /// next payload from `from` is this head's), into the caller's memory if `place`
    /// gives a slot of exactly its length, else into a new buffer right behind a copy
    /// of the head. A payload longer than [`MAX_PAYLOAD`] is received into no room (MPI
    /// truncates it, which keeps the pair in step) and reported oversized.
    pub(super) fn receive_payload(
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
    pub(super) fn poll_payloads(&mut self) -> Result<(), MpiError> {
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
