//! `ft-runtime`: what every std backend shares, so a backend crate only moves bytes.
//!
//! - [`Transport`]: the one face a backend's network shows (send a frame, receive one,
//!   complete sends; dead peers are dropped frames);
//! - [`Driver`]: the backend loop of `ft_core::machine` for one rank over any transport,
//!   on the wall clock;
//! - [`Runtime`]: the stack on a progress thread, for applications with threads of
//!   their own (a task runtime's workers, an MPI program's compute threads). It runs
//!   any [`Engine`] (a [`Driver`] of a `RankStack` is one) and gives application
//!   threads blocking commands (`validate_local`, `validate_global`, `recognize`,
//!   `revoke`, `start_broadcast`, `wait_outputs`, `release`) and a published
//!   [`ViewSnapshot`] of the failure view that answers the state queries;
//! - [`groups`]: the groups of one rank over one transport (the one it started in and
//!   those shrunk from it, [`Runtime::shrink`]), driven as one machine;
//! - [`events`]: what the rank learns (an activation arrived, an output is ready, a rank
//!   failed, `G` was agreed, ...) as [`Event`]s in one queue per handle, taken by any
//!   number of threads or watched through an eventfd;
//! - [`timeline`]: an opt-in record of when each step of a rank's work happened (frames
//!   handed to the machine and handled, payload receives posted and landed), for
//!   finding where a broadcast's time goes rank by rank;
//! - [`mem`]: an in-process network ([`MemNet`]) whose ranks are threads of one
//!   process, for groups simulated in one process (tests, demos, the `ft` crate's
//!   `sim` backend);
//! - `shared` (crate-private), the [`events`] queue and [`mem`]'s mailboxes: the structures several threads
//!   touch, built on the `sync` shim so that `RUSTFLAGS="--cfg loom" cargo test -p
//!   ft-runtime` model-checks them with loom.
//!
//! No protocol logic lives here (the stack is `ft_bcast::RankStack`) and no real
//! network either (that is the backends': `backend-mpi`, `backend-ofi`).
mod shared;
mod sync;

pub mod copies;
pub mod driver;
pub mod events;
pub mod groups;
pub mod mem;
pub mod runtime;
pub mod timeline;
pub mod transport;

pub use copies::Copies;
pub use driver::{Driver, DriverError, DriverStats, IDLE_SLEEP, IDLE_SPIN};
pub use events::{Event, DEFAULT_EVENT_CAPACITY};
pub use ft_bcast::{Allocate, TaskId};
pub use groups::{GroupError, GroupEvent, GroupId, Groups};
pub use mem::{MemError, MemNet, MemTransport};
pub use runtime::{Engine, GlobalValidation, Runtime, RuntimeError, StoreCommit, ViewSnapshot};
pub use shared::Stopped;
pub use transport::{Bytes, Delivery, Place, Received, Transport, Wake, DEFAULT_IDLE_YIELD_EVERY};

/// The loom harness every loom suite of this crate runs its models through.
#[cfg(all(test, loom))]
mod loom_model {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// Explores `f` under loom with at most 3 preemptions per execution (the bound
    /// loom's authors recommend: bugs almost always show within 2 or 3), and prints
    /// how many interleavings it ran.
    pub(crate) fn model(name: &str, f: impl Fn() + Sync + Send + 'static) {
        let runs = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&runs);
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(3);
        builder.check(move || {
            counter.fetch_add(1, Ordering::Relaxed);
            f();
        });
        eprintln!(
            "loom: {name}: {} interleavings",
            runs.load(Ordering::Relaxed)
        );
    }
}
