//! `ft-launch`: starts an N-rank job of any program on this machine, the way `mpiexec`
//! does for MPI, with the environment `ft::ofi::open_from_env` (the libfabric backend)
//! reads: each rank's [`RANK_VAR`], [`SIZE_VAR`], [`RENDEZVOUS_VAR`] (a directory every
//! rank of the job shares) and [`ADDRESS_VAR`] ([`LOOPBACK`]: every rank is on this
//! machine), and [`PROVIDER_VAR`] when a provider is named.
//!
//! A [`Job`] is a builder (program, arguments, ranks, environment, rendezvous, output
//! mode, time limit); [`Job::run`] starts the ranks and judges each one's end through a
//! [`Policy`], the caller's rule for what a rank's end means for the job ([`Verdict`]).
//! The first [`Verdict::Stop`] ends the job: every rank still running is killed. The
//! [`Report`] says how the job ended ([`Outcome`]) and how each rank did.
//!
//! The names are the ones `backend_ofi::launcher_env` reads (a test there checks it).
//!
//! Invariants of a run:
//! - no rank starts unless the rendezvous directory exists; a fresh one
//!   ([`Job::rendezvous`] not given) is removed when [`Job::run`] returns;
//! - each rank is the leader of its own process group, and stopping the job sends
//!   `SIGKILL` to every rank's group, so a rank's own children end with it; the groups
//!   are killed when the job ends any way, so no process of a job outlives [`Job::run`]
//!   (unless it left its group);
//! - output passes whole lines only: the lines of two ranks never interleave within a
//!   line, on standard output ([`Output`]) or standard error (each line prefixed
//!   `[rank N] `);
//! - a job ends within [`Job::job_limit`] and its output is drained before
//!   [`Job::run`] returns (bounded by [`DRAIN`] once the ranks are gone), so a message
//!   the caller prints after it comes after every rank's lines.
//!
//! Two launchers use it: `ftrun` (this crate's binary: any program, the job survives
//! ranks killed by a signal) and `ftofi` (backend-ofi: its own rank program, the job
//! succeeds only when exactly the ranks it kills die).

#![deny(unsafe_code)]

mod exit;
mod job;
mod output;
mod rendezvous;
mod sys;

pub use exit::{Exit, Outcome, Policy, RankReport, Report, Verdict};
pub use job::{find_program, Job, LaunchError, DRAIN};
pub use output::Output;
pub use rendezvous::Rendezvous;
pub use sys::exit_like_signal;

/// A rank of a job: `0..size`.
pub type Rank = u32;

/// The variable that tells each rank its rank (`ft::ofi` reads the same names).
pub const RANK_VAR: &str = "FTOFI_RANK";
/// The job's size, in every rank's environment.
pub const SIZE_VAR: &str = "FTOFI_SIZE";
/// The job's rendezvous directory, in every rank's environment.
pub const RENDEZVOUS_VAR: &str = "FTOFI_RENDEZVOUS";
/// The local address each rank's endpoint binds to.
pub const ADDRESS_VAR: &str = "FTOFI_ADDRESS";
/// The libfabric provider, set only when the job names one.
pub const PROVIDER_VAR: &str = "FTOFI_PROVIDER";
/// How many of the job's last ranks are spares, set only when the job has some
/// (`ftrun --spares`; `ftjacobi --spares` reads the same name).
pub const SPARES_VAR: &str = "FT_SPARES";

/// The address every rank binds to by default: all ranks run on this machine.
pub const LOOPBACK: &str = "127.0.0.1";
