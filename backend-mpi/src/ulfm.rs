//! Open MPI's ULFM extension (`mpi-ext.h`, which the `mpi` crate does not bind): the
//! failure acknowledgement the transport needs, and `MPIX_Comm_agree` and
//! `MPIX_Comm_shrink`, which `ftmpi bench` puts beside this library's `validate_global`
//! (and its shrink renumbering, `ft_core::shrink::Survivors`).

use std::os::raw::c_int;

use mpi::ffi;
use mpi::raw::{AsRaw, FromRaw};
use mpi::topology::SimpleCommunicator;

use crate::transport::{check, MpiError};

extern "C" {
    /// Acknowledges up to `num_to_ack` failed processes of `comm`; writes how many are
    /// acknowledged in all.
    pub(crate) fn MPIX_Comm_ack_failed(
        comm: ffi::MPI_Comm,
        num_to_ack: c_int,
        num_acked: *mut c_int,
    ) -> c_int;

    /// Fault-tolerant agreement on the bitwise AND of `flag` over the live processes.
    fn MPIX_Comm_agree(comm: ffi::MPI_Comm, flag: *mut c_int) -> c_int;

    /// A new communicator of `comm`'s live processes (collective over them).
    fn MPIX_Comm_shrink(comm: ffi::MPI_Comm, newcomm: *mut ffi::MPI_Comm) -> c_int;
}

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
