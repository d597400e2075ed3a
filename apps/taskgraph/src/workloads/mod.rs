//! The workloads: each builds its [`Graph`] (the same for every rank count; only the
//! owners depend on it), runs its tasks' kernels, and reads the final data the
//! collector gathered.
//!
//! Invariant: a kernel is a pure function of the task and its inputs' bytes, so a task
//! re-run on another rank after a failure produces the same bytes, and the checksum of
//! the final data does not depend on who ran what.

pub mod cholesky;
pub mod issue624;
pub mod random;

use ft::{Rank, Topology};

use crate::graph::{Graph, Task};

/// What the collector reports once it holds the final data.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Finish {
    /// The workload's own lines, printed before the JSON line.
    pub lines: Vec<String>,
    /// `‖A − LLᵀ‖_F / ‖A‖_F`, for the Cholesky.
    pub residual: Option<f64>,
    /// Floating-point operations of the graph, for a GFLOP/s figure.
    pub flops: Option<f64>,
}

/// A workload: see the [module docs](self).
pub trait Workload: Send + Sync {
    /// Its name on the command line and in the JSON line.
    fn name(&self) -> &'static str;
    /// Its graph.
    fn graph(&self) -> &Graph;
    /// The topology its broadcasts use unless `--topology` says otherwise.
    fn default_topology(&self) -> Topology {
        Topology::Binomial
    }
    /// Runs `task` (not the collector) on its inputs' bytes, in `task.inputs` order;
    /// its outputs, each of the size the graph gives.
    fn run(&self, task: &Task, inputs: &[&[u8]]) -> Vec<Vec<u8>>;
    /// What the collector reports, from the final data in canonical order.
    fn finish(&self, finals: &[&[u8]]) -> Finish;
}

/// The number of ranks `n` as a 2D process grid `p × q` (`p ≤ q`, `p` the largest
/// divisor of `n` at most `√n`), for the block-cyclic owners.
pub fn grid(n: u32) -> (u32, u32) {
    let mut p = (f64::from(n).sqrt() as u32).max(1);
    while n % p != 0 {
        p -= 1;
    }
    (p, n / p)
}

/// The 2D block-cyclic owner of tile `(i, j)` over `n` ranks.
pub fn block_cyclic(i: u32, j: u32, n: u32) -> Rank {
    let (p, q) = grid(n);
    (i % p) * q + (j % q)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grid_is_as_square_as_the_rank_count_allows() {
        assert_eq!(grid(1), (1, 1));
        assert_eq!(grid(3), (1, 3));
        assert_eq!(grid(4), (2, 2));
        assert_eq!(grid(6), (2, 3));
        assert_eq!(grid(8), (2, 4));
        let owners: Vec<Rank> = (0..2)
            .flat_map(|i| (0..3).map(move |j| block_cyclic(i, j, 6)))
            .collect();
        assert_eq!(owners, [0, 1, 2, 3, 4, 5]);
    }
}
