//! `ft-bcast`: correct broadcast of a task's outputs to destinations that need different
//! subsets of them.
//!
//! It builds activation trees by partition refinement (one tree per class of ranks that
//! need the same outputs), checks plans against the invariants that keep every parent
//! holding what its children fetch, and runs the per-rank activation protocol, repairing
//! trees when ranks die mid-broadcast. Like `ft-core`, it does no I/O and reads no clock.
//!
//! - [`refine`](mod@refine): classes of destinations needing the same outputs, `O(n + Σ|D_j|)`.
//! - [`topology`]: star, chain, binomial and k-ary trees over an ordered member list.
//! - [`spec`]: what a broadcast must achieve ([`PlanSpec`]) and its validation.
//! - [`plan`]: the trees of the three [`Strategy`]s, and their repair after failures;
//!   [`check`] verifies a plan's invariants.
//! - [`protocol`]: the per-rank activation machine ([`Broadcaster`]) with the
//!   [`ft_core::Protocol`] face.
//! - [`stack`]: one rank's whole stack ([`RankStack`]): the failure layer of `ft-core`
//!   under the broadcaster, failures passed up as they are learned.
#![no_std]
#![forbid(unsafe_code)]

extern crate alloc;
#[cfg(any(test, feature = "std"))]
extern crate std;

pub mod check;
pub mod outputs;
pub mod plan;
pub mod protocol;
pub mod refine;
pub mod spec;
pub mod stack;
pub mod store;
pub mod topology;

pub use bytes::Bytes;
pub use check::CheckError;
pub use outputs::OutputSet;
pub use plan::{Edge, Plan, Stats, Tree, TreeEdges};
pub use protocol::{
    Allocate, BcastError, BcastEvent, BcastStats, Broadcaster, Config, TaskId,
    DEFAULT_MAX_HEADER_BYTES,
};
pub use refine::{refine, refine_without, Class, Classes, Partition, RefineError};
pub use spec::{OutputSpec, ParseStrategyError, PlanSpec, SpecError, Strategy};
pub use stack::{RankStack, StackError, StackEvent, CONTROL_TAG};
pub use store::{StoreStats, STORE_TAG};
pub use topology::{tree_edges, FailedRanks, NoFailures, ParseTopologyError, Topology};
