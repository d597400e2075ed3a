//! Opening a rank over MPI (feature `mpi`): collective over the application's
//! communicator, which the library duplicates (the application keeps its own and
//! still owns MPI's initialization and finalization).
//!
//! The progress thread makes MPI calls of its own: initialize MPI with
//! `MPI_THREAD_MULTIPLE` if application threads call MPI while a handle is open
//! (`MPI_THREAD_SERIALIZED` is enough otherwise; less is refused). Fault tolerance
//! needs an MPI whose survivors go on after a process dies: Open MPI 5 under
//! `mpiexec --with-ft ulfm`.

use std::time::Instant as WallInstant;

pub use backend_mpi::{MpiError, MpiTransport};
use ft_runtime::{Driver, Runtime, RuntimeError};
use mpi::environment::Threading;
use mpi::ffi;
use mpi::raw::FromRaw;
use mpi::topology::{Communicator, SimpleCommunicator};

use crate::Settings;

/// Opens this process's rank of `comm` (collective: every rank of `comm` calls it).
pub fn open<C: Communicator>(comm: &C, settings: &Settings) -> Result<Runtime, RuntimeError> {
    // SAFETY: `comm` is a live communicator (the borrow keeps it alive for the call).
    unsafe { open_raw(comm.as_raw(), settings) }
}

/// A raw communicator handle handed to the progress thread, which alone uses it.
struct Handoff(ffi::MPI_Comm);

// SAFETY: an MPI handle is a plain value: it may be used from any thread of a process
// whose MPI runs at `MPI_THREAD_SERIALIZED` or more (checked before it crosses), and
// only the progress thread uses this one.
unsafe impl Send for Handoff {}

/// [`open`] over a raw `MPI_Comm` (the C API's constructor).
///
/// # Safety
/// `comm` must be a live intracommunicator of an initialized MPI, and every rank of it
/// must call this collectively.
pub unsafe fn open_raw(comm: ffi::MPI_Comm, settings: &Settings) -> Result<Runtime, RuntimeError> {
    let threading = mpi::environment::threading_support();
    if threading < Threading::Serialized {
        return Err(RuntimeError::Stopped(format!(
            "MPI offers {threading:?} threading; the progress thread needs Serialized or more"
        )));
    }
    // SAFETY: reading a predefined handle of an initialized MPI.
    let mut dup = unsafe { ffi::RSMPI_COMM_NULL };
    // SAFETY: `comm` is live (the caller's contract); `dup` is a valid out-pointer.
    let rc = unsafe { ffi::MPI_Comm_dup(comm, &mut dup) };
    if rc != ffi::MPI_SUCCESS as i32 {
        return Err(RuntimeError::Stopped(format!("MPI_Comm_dup failed ({rc})")));
    }
    let handoff = Handoff(dup);
    let settings = *settings;
    Runtime::spawn(move || {
        let handoff = handoff;
        // SAFETY: `dup` is our own live duplicate, used by nobody else; the wrapper
        // frees it when dropped, after the transport made its own duplicate.
        let comm = unsafe { SimpleCommunicator::from_raw(handoff.0) };
        let transport = MpiTransport::new(&comm).map_err(|e| e.to_string())?;
        let (n, me) = (comm.size() as u32, comm.rank() as u32);
        drop(comm);
        Ok(Driver::for_groups(
            settings.stack(n, me),
            transport,
            WallInstant::now(),
        ))
    })
}
