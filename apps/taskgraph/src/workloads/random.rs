//! Random multi-output DAGs, the #624 shapes at scale: `M` tasks, the last `M / 8`
//! (at least one) of them sinks. Every other task has 1 to 4 outputs of 1 B to
//! `max_bytes` (log-uniform), each read by its own random set of 1 to 3 later tasks
//! (within a window of 32), so each output of a broadcast goes to its own set of ranks.
//! Owners are random too.
//!
//! Each task computes its outputs from its inputs: output `j` is a ChaCha8 stream
//! seeded by the digest (xxh3-128) of the task's number, `j` and every input's bytes. A
//! sink's one output is the 16-byte digest of its inputs; the final data are the sinks'
//! digests, in task order.

use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use xxhash_rust::xxh3::{xxh3_64_with_seed, Xxh3};

use crate::graph::{Class, Graph, GraphBuilder, OutputId, Task, TaskIdx};
use crate::workloads::{Finish, Workload};

/// How far ahead a task's consumers are drawn.
const WINDOW: u32 = 32;
/// A sink's digest.
const DIGEST_BYTES: u64 = 16;

/// The random-DAG workload: see the [module docs](self).
#[derive(Debug)]
pub struct RandomDag {
    seed: u64,
    graph: Graph,
}

impl RandomDag {
    /// `tasks ≥ 1` tasks, outputs of at most `max_bytes ≥ 1` bytes, owners over `n`
    /// ranks.
    pub fn new(tasks: u32, max_bytes: u64, seed: u64, n: u32) -> Self {
        let sinks = (tasks / 8).max(1);
        let inner = tasks - sinks;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        // Per inner task: its outputs' sizes and consumers.
        let mut outputs: Vec<Vec<(u64, Vec<TaskIdx>)>> = Vec::with_capacity(inner as usize);
        for i in 0..inner {
            let count = rng.random_range(1..=4);
            let later = (i + 1)..(i + 1 + WINDOW).min(tasks);
            let outs = (0..count)
                .map(|_| {
                    let bytes = (rng.random_range(0.0..(max_bytes as f64).ln())).exp() as u64;
                    let want = rng.random_range(1..=3).min(later.len());
                    let mut consumers: Vec<TaskIdx> = Vec::with_capacity(want);
                    while consumers.len() < want {
                        let c = rng.random_range(later.clone());
                        if !consumers.contains(&c) {
                            consumers.push(c);
                        }
                    }
                    consumers.sort_unstable();
                    (bytes.clamp(1, max_bytes), consumers)
                })
                .collect();
            outputs.push(outs);
        }
        // Inputs of each task: the outputs that picked it, in output order.
        let mut inputs: Vec<Vec<(TaskIdx, u32)>> = vec![Vec::new(); tasks as usize];
        for (i, outs) in outputs.iter().enumerate() {
            for (j, (_, consumers)) in outs.iter().enumerate() {
                for &c in consumers {
                    inputs[c as usize].push((i as TaskIdx, j as u32));
                }
            }
        }
        let owner = |t: u32| (xxh3_64_with_seed(&t.to_le_bytes(), seed) % u64::from(n)) as u32;
        let mut b = GraphBuilder::new();
        let mut finals: Vec<OutputId> = Vec::new();
        for t in 0..tasks {
            let ins = inputs[t as usize]
                .iter()
                .map(|&(p, j)| b.output_of(p, j))
                .collect();
            if t < inner {
                let sizes: Vec<u64> = outputs[t as usize].iter().map(|o| o.0).collect();
                b.add(Class::Node, [t, 0, 0], owner(t), ins, &sizes);
            } else {
                let s = b.add(Class::Sink, [t, 0, 0], owner(t), ins, &[DIGEST_BYTES]);
                finals.push(b.output_of(s, 0));
            }
        }
        RandomDag {
            seed,
            graph: b.finish(finals),
        }
    }

    /// The digest of task `t`'s inputs under `salt`.
    fn digest(&self, task: &Task, salt: u32, inputs: &[&[u8]]) -> u128 {
        let mut h = Xxh3::with_seed(self.seed);
        h.update(&task.params[0].to_le_bytes());
        h.update(&salt.to_le_bytes());
        for input in inputs {
            h.update(&(input.len() as u64).to_le_bytes());
            h.update(input);
        }
        h.digest128()
    }
}

impl Workload for RandomDag {
    fn name(&self) -> &'static str {
        "random"
    }

    fn graph(&self) -> &Graph {
        &self.graph
    }

    fn run(&self, task: &Task, inputs: &[&[u8]]) -> Vec<Vec<u8>> {
        if task.class == Class::Sink {
            return vec![self.digest(task, u32::MAX, inputs).to_le_bytes().to_vec()];
        }
        task.output_ids()
            .enumerate()
            .map(|(j, o)| {
                let d = self.digest(task, j as u32, inputs);
                let mut rng = ChaCha8Rng::seed_from_u64(d as u64 ^ (d >> 64) as u64);
                let mut bytes = vec![0u8; self.graph.output(o).bytes as usize];
                rng.fill_bytes(&mut bytes);
                bytes
            })
            .collect()
    }

    fn finish(&self, finals: &[&[u8]]) -> Finish {
        let g = &self.graph;
        let bytes: u64 = g.outputs.iter().map(|o| o.bytes).sum();
        Finish {
            lines: vec![format!(
                "random: {} tasks, {} outputs, {} bytes of outputs, {} sinks",
                g.work_tasks(),
                g.outputs.len(),
                bytes,
                finals.len()
            )],
            ..Finish::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dag_is_the_same_on_every_rank_count_but_its_owners() {
        let a = RandomDag::new(200, 1 << 20, 5, 3);
        let b = RandomDag::new(200, 1 << 20, 5, 8);
        assert_eq!(a.graph().tasks.len(), b.graph().tasks.len());
        for (x, y) in a.graph().tasks.iter().zip(&b.graph().tasks) {
            assert_eq!(
                (x.class, x.params, &x.inputs),
                (y.class, y.params, &y.inputs)
            );
        }
        assert!(a
            .graph()
            .outputs
            .iter()
            .all(|o| (1..=1 << 20).contains(&o.bytes)));
        let inner = &a.graph().tasks[..175];
        assert!(inner.iter().all(|t| (1..=4).contains(&t.outputs)));
        assert!(a.graph().outputs.iter().all(|o| !o.consumers.is_empty()));
    }

    #[test]
    fn outputs_depend_on_the_inputs() {
        let w = RandomDag::new(20, 4096, 1, 2);
        let t = w.graph().task(0);
        assert_eq!(w.run(t, &[]), w.run(t, &[]));
        assert_ne!(w.run(t, &[b"x"]), w.run(t, &[b"y"]));
    }
}
