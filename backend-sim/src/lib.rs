//! `backend-sim`: a deterministic discrete-event network that drives every rank's
//! protocol state machines in one process, under a virtual clock. It is the embedded
//! default backend, the scale simulator, and the engine of the `ftsim` CLI.
//!
//! It moves bytes and advances time; it holds no protocol logic.
//!
//! - [`engine`]: the event loop, network model, kills ([`engine::Sim`], generic over the
//!   machine through [`engine::SimRank`]);
//! - [`queue`]: its calendar queue;
//! - [`scenario`]: the scenario file contract;
//! - [`report`]: the run report contract;
//! - [`failure`]: the failure layer (`ft_core::node::Node`) as a simulated rank;
//! - [`stack`]: the whole stack (`ft_bcast::RankStack`) as a simulated rank, with
//!   broadcast actions;
//! - [`plan_file`]: `ftsim plan`.
pub mod engine;
pub mod failure;
pub mod plan_file;
pub mod queue;
pub mod report;
pub mod scenario;
pub mod stack;
