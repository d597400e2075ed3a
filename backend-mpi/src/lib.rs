//! `backend-mpi`: drives the protocol state machines of `ft-core` and `ft-bcast` over a
//! real MPI communicator. It moves bytes and reads the clock; it holds no protocol
//! logic.
//!
//! - [`transport`]: [`MpiTransport`], frames over a duplicate of a communicator with
//!   `MPI_ERRORS_RETURN`, nonblocking sends (a bulk payload sent in place as its own
//!   message behind its head), a ring of pre-posted any-source receives, and (feature
//!   `ulfm`, on by default) the failure acknowledgement ULFM requires for any-source
//!   receives after a process dies;
//! - [`pool`]: [`pool::ReceivePool`], the payload receive buffers, back for the next
//!   receives once the protocol drops the last `Bytes` of them;
//! - [`ulfm`] (feature `ulfm`): the ULFM calls the crate uses, and `MPIX_Comm_agree`
//!   for the benchmark;
//! - the backend loop itself is `ft_runtime::Driver` over an [`MpiTransport`] (and
//!   `ft_runtime::Runtime` puts it on a progress thread);
//! - `job` (feature `cli`, on by default): `MpiLaunch`, this backend's face for
//!   `ft-jobs` (the rank programs all real backends share);
//! - the `ftmpi` binary runs a global validation or a broadcast across the ranks of an
//!   `mpiexec` job, optionally killing one rank for real (`SIGKILL`), and prints one
//!   JSON line per surviving rank; `ftmpi bench` times `validate_global` against ULFM's
//!   `MPIX_Comm_agree` and `MPI_Barrier` in the same run; `ftmpi send-parts` checks
//!   and times the transport's bulk-data path alone.
//!
//! Failure detection is the core's own heartbeat detector, whatever the MPI: the MPI's
//! own failure reports only keep the transport working. Fault tests need an MPI that
//! lets survivors go on after a process dies: Open MPI 5 started with
//! `mpiexec --with-ft ulfm`. Failure-free runs work with any MPI the `mpi` crate builds
//! against (build without the `ulfm` feature for an MPI lacking `MPIX_Comm_ack_failed`).
//!
//! Known limit of Open MPI 5.0 (not of this crate): after a process died, `MPI_Finalize`
//! at a survivor can wait forever in its PMIx fence for the dead process
//! (open-mpi/ompi#11404). The application owns MPI's
//! initialization and finalization; `ftmpi` exits without finalizing once it has seen
//! a failure.
#[cfg(feature = "cli")]
pub mod job;
pub mod pool;
pub mod transport;
#[cfg(feature = "ulfm")]
pub mod ulfm;

#[cfg(feature = "cli")]
pub use job::MpiLaunch;
pub use transport::{MpiError, MpiTransport, TransportStats};
