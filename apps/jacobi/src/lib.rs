//! `ft-jacobi`: a 2D Jacobi (heat) solver over row strips, built on `ft`'s public API
//! alone. Each rank owns a contiguous strip of rows ([`strip`], [`layout`]) of a grid
//! whose starting values and stencil are fixed ([`grid`]); halos travel over the
//! message channel ([`halo`]); the per-rank loop resumes from any iteration with given
//! strips ([`solver`]), so the recovery after a failure ([`recovery`]) restores a
//! checkpoint ([`checkpoint`]) and goes on. The final grid's checksum ([`checksum`]) is
//! the same bit for bit for every number of ranks. [`cli`] checks the command line,
//! [`kills`] says when `--kill` fires, [`rank`] runs one rank, [`backends`] runs the
//! ranks on the simulator, libfabric or MPI.

pub mod backends;
pub mod checkpoint;
pub mod checksum;
pub mod cli;
pub mod grid;
pub mod halo;
pub mod kills;
pub mod layout;
pub mod rank;
pub mod recovery;
pub mod solver;
pub mod strip;
