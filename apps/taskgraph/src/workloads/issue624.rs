//! The seed's #624 graph: `start(0)` sends A to `task_x(1)` and `task_y(2)`, and B to
//! `task_y(2)`; tile `i` is owned by rank `i`. Each task reports what it holds as its
//! line ("0: have A and B", "1: have A", "2: have A and B"), which the collector prints
//! in tile order. With the chain topology (the default here) rank 1 is rank 2's parent
//! for A although it never holds B: the shape that crashed PaRSEC.

use ft::Topology;

use crate::graph::{Class, Graph, GraphBuilder, Task};
use crate::workloads::{Finish, Workload};

/// The sizes of A and B.
const A_BYTES: u64 = 3000;
const B_BYTES: u64 = 70_000;
/// The longest line a task reports.
const LINE_BYTES: u64 = 32;

/// The #624 workload: see the [module docs](self).
#[derive(Debug)]
pub struct Issue624 {
    graph: Graph,
}

impl Issue624 {
    /// The graph on `n ≥ 3` ranks (tile `i` on rank `i`).
    pub fn new(n: u32) -> Self {
        let owner = |i: u32| i % n;
        let mut b = GraphBuilder::new();
        let start = b.add(
            Class::Start,
            [0; 3],
            owner(0),
            vec![],
            &[A_BYTES, B_BYTES, LINE_BYTES],
        );
        let a = b.output_of(start, 0);
        let bb = b.output_of(start, 1);
        let x = b.add(Class::TaskX, [1, 0, 0], owner(1), vec![a], &[LINE_BYTES]);
        let y = b.add(
            Class::TaskY,
            [2, 0, 0],
            owner(2),
            vec![a, bb],
            &[LINE_BYTES],
        );
        let finals = vec![b.output_of(start, 2), b.output_of(x, 0), b.output_of(y, 0)];
        Issue624 {
            graph: b.finish(finals),
        }
    }
}

/// A's or B's bytes: a pattern a receiver checks, so a wrong output cannot pass.
fn pattern(which: u8, bytes: u64) -> Vec<u8> {
    (0..bytes).map(|i| which.wrapping_add(i as u8)).collect()
}

/// Task `tile`'s line, padded to [`LINE_BYTES`] with spaces (outputs have fixed sizes).
fn line(tile: u32, have_a: bool, have_b: bool) -> Vec<u8> {
    let text = match (have_a, have_b) {
        (true, true) => format!("{tile}: have A and B"),
        (true, false) => format!("{tile}: have A"),
        (false, true) => format!("{tile}: have B"),
        (false, false) => format!("{tile}: have nothing"),
    };
    let mut bytes = text.into_bytes();
    bytes.resize(LINE_BYTES as usize, b' ');
    bytes
}

impl Workload for Issue624 {
    fn name(&self) -> &'static str {
        "issue624"
    }

    fn graph(&self) -> &Graph {
        &self.graph
    }

    fn default_topology(&self) -> Topology {
        Topology::Chain
    }

    fn run(&self, task: &Task, inputs: &[&[u8]]) -> Vec<Vec<u8>> {
        let a = pattern(b'A', A_BYTES);
        let b = pattern(b'B', B_BYTES);
        match task.class {
            Class::Start => vec![a, b, line(0, true, true)],
            Class::TaskX => vec![line(1, inputs.first() == Some(&&a[..]), false)],
            _ => vec![line(
                2,
                inputs.first() == Some(&&a[..]),
                inputs.get(1) == Some(&&b[..]),
            )],
        }
    }

    fn finish(&self, finals: &[&[u8]]) -> Finish {
        let lines = finals
            .iter()
            .map(|l| String::from_utf8_lossy(l).trim_end().to_string())
            .collect();
        Finish {
            lines,
            ..Finish::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tasks_report_the_seeds_lines() {
        let w = Issue624::new(3);
        let g = w.graph();
        let start = w.run(g.task(0), &[]);
        let x = w.run(g.task(1), &[&start[0]]);
        let y = w.run(g.task(2), &[&start[0], &start[1]]);
        let finish = w.finish(&[&start[2], &x[0], &y[0]]);
        assert_eq!(
            finish.lines,
            ["0: have A and B", "1: have A", "2: have A and B"]
        );
        // A wrong B shows in the line.
        let y = w.run(g.task(2), &[&start[0], &start[0]]);
        assert_eq!(w.finish(&[&y[0]]).lines, ["2: have A"]);
    }
}
