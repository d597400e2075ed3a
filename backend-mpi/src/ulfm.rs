//! The ULFM extension (Open MPI's `mpi-ext.h`, MPICH's `MPIX_` calls; the `mpi` crate
//! binds neither): the failure acknowledgement and the error classes the transport
//! needs, and `MPIX_Comm_agree` and `MPIX_Comm_shrink`, which `ftmpi bench` puts beside
//! this library's `validate_global` (and its shrink renumbering,
//! `ft_core::shrink::Survivors`).
//!
//! The two families name them differently (`build.rs` sets `cfg(mpi_family)`):
//!
//! | | Open MPI 5 | MPICH 4.1+ |
//! |---|---|---|
//! | a peer died | `MPI_ERR_PROC_FAILED` | `MPIX_ERR_PROC_FAILED` |
//! | a wildcard receive may be affected | `MPI_ERR_PROC_FAILED_PENDING` | `MPIX_ERR_PROC_FAILED_PENDING` |
//! | acknowledge what is known | `MPIX_Comm_ack_failed(comm, n, &acked)` | `MPIX_Comm_failure_ack(comm)` |

use std::os::raw::c_int;

use mpi::ffi;
use mpi::raw::{AsRaw, FromRaw};
use mpi::topology::SimpleCommunicator;

use crate::transport::{check, MpiError};

/// The error class of an operation that involved a dead peer.
#[cfg(not(mpi_family = "mpich"))]
pub(crate) const ERR_PROC_FAILED: c_int = ffi::MPI_ERR_PROC_FAILED as c_int;
/// The error class of a wildcard receive that a peer's death may concern: it stays
/// pending, and works again once the failures are acknowledged.
#[cfg(not(mpi_family = "mpich"))]
pub(crate) const ERR_PROC_FAILED_PENDING: c_int = ffi::MPI_ERR_PROC_FAILED_PENDING as c_int;
/// See the Open MPI constant of the same name.
#[cfg(mpi_family = "mpich")]
pub(crate) const ERR_PROC_FAILED: c_int = ffi::MPIX_ERR_PROC_FAILED as c_int;
/// See the Open MPI constant of the same name.
#[cfg(mpi_family = "mpich")]
pub(crate) const ERR_PROC_FAILED_PENDING: c_int = ffi::MPIX_ERR_PROC_FAILED_PENDING as c_int;

#[cfg(not(mpi_family = "mpich"))]
extern "C" {
    /// Acknowledges up to `num_to_ack` failed processes of `comm`; writes how many are
    /// acknowledged in all.
    fn MPIX_Comm_ack_failed(comm: ffi::MPI_Comm, num_to_ack: c_int, num_acked: *mut c_int)
        -> c_int;
}

#[cfg(mpi_family = "mpich")]
extern "C" {
    /// Acknowledges every failure of `comm` noticed so far.
    fn MPIX_Comm_failure_ack(comm: ffi::MPI_Comm) -> c_int;
}

/// Acknowledges every failure of `comm` (of `size` processes) MPI has noticed, so
/// wildcard receives work again.
pub(crate) fn ack_failed(comm: &SimpleCommunicator, size: u32) -> Result<(), MpiError> {
    #[cfg(not(mpi_family = "mpich"))]
    {
        let mut acked: c_int = 0;
        // SAFETY: a valid communicator; MPI writes the count.
        check("MPIX_Comm_ack_failed", unsafe {
            MPIX_Comm_ack_failed(comm.as_raw(), size as c_int, &mut acked)
        })
    }
    #[cfg(mpi_family = "mpich")]
    {
        let _ = size;
        // SAFETY: a valid communicator.
        check("MPIX_Comm_failure_ack", unsafe {
            MPIX_Comm_failure_ack(comm.as_raw())
        })
    }
}

extern "C" {
    /// Fault-tolerant agreement on the bitwise AND of `flag` over the live processes.
    fn MPIX_Comm_agree(comm: ffi::MPI_Comm, flag: *mut c_int) -> c_int;

    /// A new communicator of `comm`'s live processes (collective over them).
    fn MPIX_Comm_shrink(comm: ffi::MPI_Comm, newcomm: *mut ffi::MPI_Comm) -> c_int;
}

/// Whether [`agree`] and [`shrink`] work on this MPI as it is launched for the tests and
/// benchmarks: Open MPI 5's do (under `mpiexec --with-ft ulfm`). MPICH 5.0.2's
/// `MPIX_Comm_agree` fails an assertion (`ch4_comm.c`, line 56) unless
/// `MPIR_CVAR_ENABLE_FT=1`, and with that set `MPI_Init` itself fails one
/// (`ch4_request.h`, line 16).
pub const AGREE_WORKS: bool = cfg!(not(mpi_family = "mpich"));

/// ULFM's agreement over `comm`: the bitwise AND of every live process's `flag`.
pub fn agree(comm: &SimpleCommunicator, flag: i32) -> Result<i32, MpiError> {
    let mut flag: c_int = flag;
    // SAFETY: a valid communicator; MPI reads and writes the flag.
    check("MPIX_Comm_agree", unsafe {
        MPIX_Comm_agree(comm.as_raw(), &mut flag)
    })?;
    Ok(flag)
}

/// ULFM's shrink: a new communicator of the processes of `comm` that are alive, agreed
/// on by all of them.
pub fn shrink(comm: &SimpleCommunicator) -> Result<SimpleCommunicator, MpiError> {
    // SAFETY: reading a handle constant.
    let mut raw = unsafe { ffi::RSMPI_COMM_NULL };
    // SAFETY: a valid communicator; MPI writes the new handle.
    check("MPIX_Comm_shrink", unsafe {
        MPIX_Comm_shrink(comm.as_raw(), &mut raw)
    })?;
    // SAFETY: MPIX_Comm_shrink returned a new intra-communicator we own and use only
    // through the wrapper, which frees it.
    Ok(unsafe { SimpleCommunicator::from_raw(raw) })
}
