//! The small-task shape of `benches/small_tasks.rs`, shared with `tests/memory.rs`:
//! destination `i` of `d` (spread over a communicator of `n` ranks, root 0) needs output
//! `j` of `m` when `(7i + 3j) mod 4 ≠ 0`, so the outputs' destination sets differ and
//! form several classes, as tasks whose consumers read different outputs do.

use ft_bcast::{OutputSpec, PlanSpec};
use ft_core::Rank;

/// Output names: literals, as code that knows its outputs writes them.
const NAMES: [&str; 8] = ["A", "B", "C", "D", "E", "F", "G", "H"];

/// Each output's destinations (increasing), for `d` destinations and `m ≤ 8` outputs.
pub fn lists(n: u32, d: u32, m: u32) -> Vec<Vec<Rank>> {
    let dest = |i: u32| 1 + i * (n - 1) / d;
    (0..m)
        .map(|j| {
            (0..d)
                .filter(|&i| m == 1 || (7 * i + 3 * j) % 4 != 0)
                .map(dest)
                .collect()
        })
        .collect()
}

/// The spec a runtime writes for the task: outputs of `bytes` bytes for `lists`, each
/// list copied.
pub fn spec(n: u32, lists: &[Vec<Rank>], bytes: u64) -> PlanSpec {
    lists
        .iter()
        .zip(NAMES)
        .fold(PlanSpec::new(n, 0), |spec, (dests, name)| {
            spec.with_output(OutputSpec::new(name, bytes, dests.clone()))
        })
}
