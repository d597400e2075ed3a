//! `ft`: what an HPC runtime depends on to know which of its processes failed (each
//! rank's local view `L_i`, the agreed view `G`, the seed's state queries) and to
//! broadcast a task's outputs to destinations that need different subsets of them,
//! correctly even when ranks die. It re-exports the protocol crates and opens one rank
//! over the backend its features pick; the CLIs and their dependencies stay out.
//!
//! # One rank, one handle
//!
//! Every backend gives the same thread-safe handle, a [`Runtime`]: the rank's protocol
//! stack on its own progress thread, which any number of application threads call
//! (`Send + Sync`; share it by reference or in an `Arc`):
//!
//! | feature | how to open a rank |
//! |---|---|
//! | `sim` (default) | [`sim::SimGroup::open`]: a whole group of ranks in this process (threads over an in-memory network), with kills, for tests and demos |
//! | `mpi` | `mpi::open(&communicator, &settings)`, or `mpi::open_raw` with the application's `MPI_Comm`: collective over the communicator |
//! | `ofi` | `ofi::open(config, &settings)`, or `ofi::open_from_env` under the `ftofi` launcher's variables: the ranks meet in a rendezvous directory |
//!
//! The handle answers the seed: [`Runtime::validate_local`] and
//! [`Runtime::validate_global`] (with `num_failed`, `num_new` as [`Counts`]), the
//! published [`ViewSnapshot`] ([`Runtime::view`]) with `get_state`, `num_state`,
//! `rank_info` per [`Scope`] and OR-ed [`StateMask`]s, [`Runtime::recognize`],
//! [`Runtime::revoke`], the shrink renumbering ([`ViewSnapshot::survivors`]) and the
//! shrunk group itself ([`Runtime::shrink`]: a new handle over the same connections); and the
//! broadcast: [`Runtime::start_broadcast`], [`Runtime::wait_outputs`] (with a timeout),
//! [`Runtime::release`]. `ft_runtime::runtime` documents which calls block.
//!
//! Invariants, as the core keeps them at every rank: `G ⊆ L_i ⊆ F`; a published view
//! never goes back (its global epoch only grows); a rank declared dead stops (its
//! handle's calls fail with [`RuntimeError::Stopped`]).

pub use ft_bcast;
pub use ft_core;
pub use ft_runtime;

pub use ft_bcast::{
    Allocate, BcastError, OutputSet, OutputSpec, PlanSpec, StackError, StoreStats, Strategy,
    TaskId, Topology,
};
pub use ft_core::shrink::Survivors;
pub use ft_core::{
    Counts, Landing, Modifier, Rank, RankInfo, RankSet, RankState, Scope, StateMask, ViewError,
};
pub use ft_runtime::{
    Event, GlobalValidation, GroupError, GroupId, Runtime, RuntimeError, StoreCommit, ViewSnapshot,
};

/// The thread-safe handle of one rank, whatever the backend (a [`Runtime`]).
pub type Handle = Runtime;

#[cfg(unix)]
pub mod failstop;
#[cfg(feature = "mpi")]
pub mod mpi;
#[cfg(feature = "ofi")]
pub mod ofi;
#[cfg(feature = "sim")]
pub mod sim;

use std::time::Duration as StdDuration;

use ft_bcast::RankStack;
use ft_core::detector::{DetectorConfig, DEFAULT_SPAN};
use ft_core::{Duration, Instant};

/// The failure detector's settings for every backend. A rank silent for `timeout` is
/// declared dead, and a declared rank stops for good (fail-stop): on shared or
/// oversubscribed cores keep `timeout` well above the longest pause a live rank may
/// take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// The communicator id every frame carries (distinct per group of one process).
    pub comm: u32,
    /// How often a rank heartbeats its observers.
    pub period: StdDuration,
    /// Silence after which a rank is declared dead.
    pub timeout: StdDuration,
    /// The detector's span: ranks per node (blocks of adjacent ranks that die together).
    pub span: u32,
}

impl Default for Settings {
    /// Communicator 0, heartbeats every 20 ms, declared dead after 300 ms of silence,
    /// the core's default span.
    fn default() -> Self {
        Settings {
            comm: 0,
            period: StdDuration::from_millis(20),
            timeout: StdDuration::from_millis(300),
            span: DEFAULT_SPAN,
        }
    }
}

impl Settings {
    /// The detector configuration of rank `me` of `n`.
    pub fn detector(&self, n: u32, me: Rank) -> DetectorConfig {
        let nanos = |d: StdDuration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let period = nanos(self.period).max(1);
        DetectorConfig {
            comm: self.comm,
            n,
            me,
            period: Duration::from_nanos(period),
            timeout: Duration::from_nanos(nanos(self.timeout)),
            // Spread the ranks' heartbeats over the period.
            phase: Duration::from_nanos(period / u64::from(n.max(1)) * u64::from(me)),
            span: self.span,
        }
    }

    /// A fresh stack for rank `me` of `n`, at time zero of its driver's clock.
    pub fn stack(&self, n: u32, me: Rank) -> RankStack {
        RankStack::new(self.detector(n, me), Instant::ZERO)
    }
}
