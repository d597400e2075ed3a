//! `backend-sim`: a deterministic discrete-event network that drives every rank's
//! protocol state machines in one process, under a virtual clock. It is the embedded
//! default backend, the scale simulator, and the engine of the `ftsim` CLI.
//!
//! It moves bytes and advances time; it holds no protocol logic.
pub mod plan_file;
