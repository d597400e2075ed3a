//! Errors as MPI returns them, and the process failures told apart from the rest.
//!
//! Both of the transport's communicators have `MPI_ERRORS_RETURN` ([`errors_return`]),
//! so a dead peer is a return code, never an abort. A code of ULFM's classes
//! (`MPI_ERR_PROC_FAILED`, `MPI_ERR_PROC_FAILED_PENDING`: [`is_process_failure`]) is
//! handled where it arises (a send dropped, a frame lost, a receive kept posted); any
//! other is an [`MpiError`].
//!
//! With the `ulfm` feature, an any-source receive that cannot complete because a
//! process died reports `MPI_ERR_PROC_FAILED_PENDING` and stays posted: the transport
//! acknowledges the failures (`MPIX_Comm_ack_failed`), after which the same receive
//! matches again (ULFM); a receive matched to a sender that died during the transfer
//! completes with `MPI_ERR_PROC_FAILED`: the frame is lost, counted and the slot
//! re-posted, as if the sender had died before sending it.

use std::fmt;
use std::os::raw::c_int;

use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::topology::SimpleCommunicator;

use super::MpiTransport;

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

impl MpiTransport {
    /// Acknowledges every failure MPI has noticed, so any-source operations work again.
    #[cfg(feature = "ulfm")]
    pub(super) fn ack_failures(&mut self) -> Result<(), MpiError> {
        crate::ulfm::ack_failed(&self.comm, self.n)?;
        self.stats.failure_acks += 1;
        Ok(())
    }

    #[cfg(not(feature = "ulfm"))]
    pub(super) fn ack_failures(&mut self) -> Result<(), MpiError> {
        Ok(())
    }
}

/// Whether `code` says a peer process died (ULFM's error classes).
pub(super) fn is_process_failure(code: c_int) -> bool {
    if code == ffi::MPI_SUCCESS as c_int {
        return false;
    }
    let class = error_class(code);
    class == crate::ulfm::ERR_PROC_FAILED || class == crate::ulfm::ERR_PROC_FAILED_PENDING
}

pub(super) fn error_class(code: c_int) -> c_int {
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
