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
//!   (at most [`SPARE_BUFFERS`] are kept), so steady traffic allocates nothing;
//!   A send that fails because its peer died is dropped and counted: the protocol
//!   learns of deaths from its own detector, and every frame it sends to a rank it will
//!   find dead is one it no longer needs delivered;
//! - **receive** is a matched probe (`MPI_Improbe` from any source) then `MPI_Mrecv`,
//!   so the frame's size is known before it is read. A frame longer than the largest
//!   frame of this communicator ([`ft_core::wire::frame_capacity`]) is read and
//!   reported as [`Received::Oversized`], never handed on;
//! - with the `ulfm` feature, an any-source probe that fails because a process died
//!   (`MPI_ERR_PROC_FAILED`, `MPI_ERR_PROC_FAILED_PENDING`) acknowledges the failures
//!   (`MPIX_Comm_ack_failed`) and probes again, as ULFM requires.
//!
//! Invariants: every buffer handed to MPI stays alive, unmoved, until its request
//! completes or the transport is dropped (drop waits for nothing: it frees requests
//! that are still pending with `MPI_Request_free`, which lets MPI finish or discard them
//! on its own, and leaks their buffers rather than free memory MPI may still read).

use std::fmt;
use std::os::raw::{c_int, c_void};

use ft_core::{wire, Rank};
use ft_runtime::{Received, Transport};
use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::topology::{Communicator, SimpleCommunicator};

/// The tag of every frame.
const FRAME_TAG: c_int = 0x6674;

/// The most send buffers kept for reuse once their sends completed.
pub const SPARE_BUFFERS: usize = 64;

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
}

/// Frames between the ranks of one communicator: see the [module docs](self).
pub struct MpiTransport {
    comm: SimpleCommunicator,
    me: Rank,
    n: u32,
    /// Pending `MPI_Isend` requests, in step with `sending`: `sending[i]` is the frame
    /// `requests[i]` reads (a `Vec`'s heap buffer, which stays put while it is moved).
    requests: Vec<ffi::MPI_Request>,
    sending: Vec<Vec<u8>>,
    /// Buffers of completed sends, for the next ones.
    spare: Vec<Vec<u8>>,
    /// Scratch for `MPI_Testsome`.
    completed: Vec<c_int>,
    statuses: Vec<ffi::MPI_Status>,
    recv_buf: Vec<u8>,
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
    /// call it), with errors returned instead of aborting.
    pub fn new(comm: &SimpleCommunicator) -> Result<Self, MpiError> {
        let comm = comm.duplicate();
        errors_return(&comm)?;
        let me = comm.rank() as Rank;
        let n = comm.size() as u32;
        Ok(MpiTransport {
            comm,
            me,
            n,
            requests: Vec::new(),
            sending: Vec::new(),
            spare: Vec::new(),
            completed: Vec::new(),
            statuses: Vec::new(),
            recv_buf: vec![0; wire::frame_capacity(n)],
            stats: TransportStats::default(),
        })
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
        assert!(
            to < self.n,
            "rank {to} outside a communicator of {}",
            self.n
        );
        let len = c_int::try_from(frame.len()).expect("frame longer than i32::MAX bytes");
        let mut bytes = self.spare.pop().unwrap_or_else(|| {
            self.stats.send_buffers += 1;
            Vec::new()
        });
        bytes.clear();
        bytes.extend_from_slice(frame);
        let mut request = null_request();
        // SAFETY: the buffer is `len` valid bytes and lives in `sending` (its heap
        // buffer does not move) until MPI completes or frees the request.
        let code = unsafe {
            ffi::MPI_Isend(
                bytes.as_ptr().cast::<c_void>(),
                len,
                ffi::RSMPI_UINT8_T,
                to as c_int,
                FRAME_TAG,
                self.comm.as_raw(),
                &mut request,
            )
        };
        if is_process_failure(code) {
            self.stats.dropped_to_failed += 1;
            self.recycle(bytes);
            return Ok(());
        }
        check("MPI_Isend", code)?;
        self.stats.sent += 1;
        self.requests.push(request);
        self.sending.push(bytes);
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
                self.requests.swap_remove(index);
                let bytes = self.sending.swap_remove(index);
                self.recycle(bytes);
            }
        }
        match first_error {
            Some(code) => check("MPI_Testsome", code),
            None => Ok(()),
        }
    }

    /// Keeps a completed send's buffer for a later send, up to [`SPARE_BUFFERS`].
    fn recycle(&mut self, bytes: Vec<u8>) {
        if self.spare.len() < SPARE_BUFFERS {
            self.spare.push(bytes);
        }
    }

    /// Receives one frame if one has arrived.
    pub fn try_recv(&mut self) -> Result<Option<Received<'_>>, MpiError> {
        let mut found: c_int = 0;
        let mut message = null_message();
        let mut status = empty_status();
        let mut code = self.improbe(&mut found, &mut message, &mut status);
        if cfg!(feature = "ulfm") && is_process_failure(code) {
            self.ack_failures()?;
            code = self.improbe(&mut found, &mut message, &mut status);
            if is_process_failure(code) {
                // Failures noticed since the acknowledgement: the next call retries.
                return Ok(None);
            }
        }
        check("MPI_Improbe", code)?;
        if found == 0 {
            return Ok(None);
        }
        let from = status.MPI_SOURCE as Rank;
        let mut count: c_int = 0;
        // SAFETY: `status` describes the matched message.
        check("MPI_Get_count", unsafe {
            ffi::MPI_Get_count(&status, ffi::RSMPI_UINT8_T, &mut count)
        })?;
        let len = usize::try_from(count).unwrap_or(usize::MAX);
        let capacity = self.recv_buf.len();
        let take = len.min(capacity);
        // SAFETY: the buffer holds `take` bytes; MPI writes at most that many (a longer
        // message is truncated, which completes and discards it with an error code).
        let code = unsafe {
            ffi::MPI_Mrecv(
                self.recv_buf.as_mut_ptr().cast::<c_void>(),
                take as c_int,
                ffi::RSMPI_UINT8_T,
                &mut message,
                &mut status,
            )
        };
        if len > capacity {
            return Ok(Some(Received::Oversized { from, len }));
        }
        if is_process_failure(code) {
            // The sender died while its matched frame was in transfer (a large frame
            // goes by rendezvous): the frame is lost, as if the sender had died before
            // sending it; the detector and the protocols' repair take it from here.
            self.stats.lost_in_transfer += 1;
            return Ok(None);
        }
        check("MPI_Mrecv", code)?;
        self.stats.received += 1;
        Ok(Some(Received::Frame {
            from,
            bytes: &self.recv_buf[..take],
        }))
    }

    fn improbe(
        &self,
        found: &mut c_int,
        message: &mut ffi::MPI_Message,
        status: &mut ffi::MPI_Status,
    ) -> c_int {
        // SAFETY: MPI writes the flag, the message handle and the status.
        unsafe {
            ffi::MPI_Improbe(
                ffi::RSMPI_ANY_SOURCE,
                FRAME_TAG,
                self.comm.as_raw(),
                found,
                message,
                status,
            )
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
        for (mut request, bytes) in std::mem::take(&mut self.requests).into_iter().zip(sending) {
            // SAFETY: a live request of ours. After the free MPI may still read the
            // buffer, so the buffer is leaked, not freed.
            unsafe { ffi::MPI_Request_free(&mut request) };
            std::mem::forget(bytes);
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

fn null_message() -> ffi::MPI_Message {
    // SAFETY: reading an MPI constant handle.
    unsafe { ffi::RSMPI_MESSAGE_NULL }
}

fn empty_status() -> ffi::MPI_Status {
    // SAFETY: `MPI_Status` is a C struct of integers; all zeroes is a valid value.
    unsafe { std::mem::zeroed() }
}
