//! `ft-taskgraph`: a reference dataflow task runtime in PaRSEC's mould, built on `ft`'s
//! public API alone. Task classes with parameters and owners ([`graph`], [`workloads`]),
//! one broadcast per finished task whose outputs each go to exactly their consumers'
//! ranks, successors scheduled from the handle's events ([`scheduler`]), and, when
//! ranks die mid-graph, agreement on `G` and a recovery that re-sends what survivors
//! hold and re-runs only what no survivor holds ([`recovery`]). [`cli`] checks the
//! command line; [`backends`] runs the ranks on the simulator, libfabric or MPI.

pub mod backends;
pub mod cli;
pub mod graph;
pub mod recovery;
pub mod scheduler;
pub mod workloads;

pub use scheduler::{checksum, Report};
