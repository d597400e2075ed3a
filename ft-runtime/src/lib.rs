//! `ft-runtime`: the library's stack on a progress thread, for applications with
//! threads of their own (a task runtime's workers, an MPI program's compute threads).
//!
//! - [`Runtime`]: spawns the progress thread around any backend that implements
//!   [`Engine`] (`backend-mpi`'s driver does), and gives application threads blocking
//!   commands (`validate_local`, `validate_global`, `start_broadcast`, `wait_outputs`)
//!   and a published [`ViewSnapshot`] of the failure view;
//! - [`shared`] (crate-private): the one structure both sides touch, built on the
//!   [`sync`] shim so that `RUSTFLAGS="--cfg loom" cargo test -p ft-runtime` model-checks
//!   it with loom.
//!
//! No protocol logic lives here: the stack is `ft_bcast::RankStack`, the network is the
//! engine's.
mod shared;
mod sync;

pub mod runtime;

pub use runtime::{Engine, Runtime, RuntimeError, ViewSnapshot};
pub use shared::Stopped;
