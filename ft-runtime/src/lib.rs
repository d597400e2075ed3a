//! `ft-runtime`: what every std backend shares, so a backend crate only moves bytes.
//!
//! - [`Transport`]: the one face a backend's network shows (send a frame, receive one,
//!   complete sends; dead peers are dropped frames);
//! - [`Driver`]: the backend loop of `ft_core::machine` for one rank over any transport,
//!   on the wall clock;
//! - [`Runtime`]: the stack on a progress thread, for applications with threads of
//!   their own (a task runtime's workers, an MPI program's compute threads). It runs
//!   any [`Engine`] (a [`Driver`] of a `RankStack` is one) and gives application
//!   threads blocking commands (`validate_local`, `validate_global`,
//!   `start_broadcast`, `wait_outputs`) and a published [`ViewSnapshot`] of the
//!   failure view;
//! - `shared` (crate-private): the one structure both sides touch, built on the
//!   `sync` shim so that `RUSTFLAGS="--cfg loom" cargo test -p ft-runtime` model-checks
//!   it with loom.
//!
//! No protocol logic lives here (the stack is `ft_bcast::RankStack`) and no network
//! either (that is the backends': `backend-mpi`, `backend-ofi`).
mod shared;
mod sync;

pub mod driver;
pub mod runtime;
pub mod transport;

pub use driver::{Driver, DriverError, DriverStats, IDLE_SLEEP, IDLE_SPIN};
pub use runtime::{Engine, Runtime, RuntimeError, ViewSnapshot};
pub use shared::Stopped;
pub use transport::{Received, Transport, Wake};
