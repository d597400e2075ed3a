//! The send path: every frame leaves through a nonblocking `MPI_Isend` whose buffers
//! the transport keeps until MPI is done with them.
//!
//! - **send** copies the frame into a buffer owned by the pending send, taken from a
//!   pool of spare buffers; when the request completes (one `MPI_Testsome` over every
//!   pending send in [`MpiTransport::progress`]) the buffer goes back to the pool (at
//!   most [`SPARE_BUFFERS`] are kept), so steady traffic allocates nothing. A send that
//!   fails because its peer died is dropped and counted: the protocol learns of deaths
//!   from its own detector, and every frame it sends to a rank it will find dead is one
//!   it no longer needs delivered. A process failure may come back in a request's
//!   status (`MPI_ERR_IN_STATUS`, what Open MPI 5 does) or, as ULFM allows, as
//!   `MPI_Testsome`'s own code, which names no request: then each send is tested alone
//!   ([`TransportStats::unattributed_failures`]);
//! - **send_parts** (the bulk-data path) sends a header and a payload without copying
//!   the payload: the header, followed by the payload's length, goes from a pooled
//!   buffer as a message tagged [`HEAD_TAG`], and the payload right behind it as a
//!   contiguous `MPI_Isend` of its own, straight from the caller's [`Bytes`] (a clone
//!   stays in the pending send until it completes), on the payload communicator.
//!   Contiguous, the payload takes shared memory's single-copy path (a two-block
//!   datatype would make Open MPI pack every byte at the sender). Payloads shorter than
//!   [`COPY_BELOW`] are copied after the header into one frame instead.
//!   [`TransportStats::payload_bytes_in_place`] and
//!   [`TransportStats::payload_bytes_copied`] count the two cases;
//! - **send_then_parts** (a control frame and the payload frame behind it to the same
//!   peer: what the driver does with a broadcast's activation and the data pushed right
//!   behind it) puts the control frame, after its length, at the front of the head's
//!   message ([`JOINED_HEAD_TAG`], or [`JOINED_TAG`] for a copied payload): one small
//!   message per tree edge instead of two, unless the joined message would not fit a
//!   receive slot.

use std::os::raw::{c_int, c_void};

use bytes::Bytes;
use ft_core::Rank;
use mpi::ffi;
use mpi::raw::AsRaw;

use super::failures::{check, is_process_failure};
use super::framing::{joined_len, FRAME_TAG, HEAD_TAG, JOINED_HEAD_TAG, JOINED_TAG};
use super::requests::{empty_status, null_request, test_some};
#[cfg(doc)]
use super::TransportStats;
use super::{MpiError, MpiTransport, MAX_PAYLOAD};

/// The most send buffers kept for reuse once their sends completed.
pub const SPARE_BUFFERS: usize = 64;

/// Payloads of [`MpiTransport::send_parts`] shorter than this are copied after the
/// header into one message rather than sent as a message of their own behind it: 4
/// KiB, Open MPI's shared-memory eager limit, below which the second message costs
/// far more than the copy.
pub const COPY_BELOW: usize = 4096;

/// A pending send: the buffer MPI reads (a whole frame, or the header of a
/// [`MpiTransport::send_parts`]) and the payload it reads in place, if any.
pub(super) struct Sending {
    pub(super) bytes: Vec<u8>,
    /// Keeps the payload's memory alive (and unmoved: `Bytes` never moves its data)
    /// until the send completes.
    pub(super) payload: Option<Bytes>,
}

impl MpiTransport {
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
    pub(super) fn send_copied(
        &mut self,
        to: Rank,
        parts: &[&[u8]],
        tag: c_int,
    ) -> Result<bool, MpiError> {
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
    pub(super) fn isend_payload(
        &mut self,
        to: Rank,
        payload: &Bytes,
        tag: c_int,
    ) -> Result<bool, MpiError> {
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

    /// Whether [`MpiTransport::send_parts`] copies the payload: no (payloads shorter
    /// than [`COPY_BELOW`] aside).
    pub fn copies_payload(&self) -> bool {
        false
    }

    pub(super) fn check_peer(&self, to: Rank) {
        assert!(
            to < self.n,
            "rank {to} outside a communicator of {}",
            self.n
        );
    }

    /// An empty send buffer: a spare one, else a new one.
    pub(super) fn take_buffer(&mut self) -> Vec<u8> {
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
    pub(super) fn isend(
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
}
