//! The task graph every rank holds whole: task classes with their parameters, each
//! task's inputs (outputs of earlier tasks) and outputs, the failure-free owner of each
//! task, and the activation header that names a task on the wire.
//!
//! Invariants (checked by [`GraphBuilder`] as it builds):
//! - tasks are numbered in a topological order: every input of task `t` is an output of
//!   a task `< t`, so a reverse scan visits every consumer before its producers;
//! - outputs are numbered globally (`OutputId`), the outputs of one task being
//!   consecutive; each output lists its consumers once each, in task order;
//! - the last task is the collector: its inputs are the graph's final data (the factor's
//!   tiles, the sinks' digests, the #624 lines), in the canonical order the checksum
//!   reads them; it has no outputs and is owned by the lowest live rank;
//! - the graph depends on the workload and its seed only, never on the number of ranks:
//!   only the owners do, so the final data is the same on every rank count.

use std::fmt;

use ft::Rank;

/// A task's number in the graph (its topological position).
pub type TaskIdx = u32;
/// An output's number in the graph.
pub type OutputId = u32;

/// The task classes of every workload (the JDF's task names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Class {
    /// #624: the root task, producing A and B.
    Start = 1,
    /// #624: consumes A.
    TaskX = 2,
    /// #624: consumes A and B.
    TaskY = 3,
    /// Cholesky: factor a diagonal tile.
    Potrf = 4,
    /// Cholesky: solve a tile below the diagonal against the factored diagonal tile.
    Trsm = 5,
    /// Cholesky: update a diagonal tile.
    Syrk = 6,
    /// Cholesky: update an off-diagonal tile.
    Gemm = 7,
    /// Random DAG: an inner task of 1 to 4 outputs.
    Node = 8,
    /// Random DAG: a sink, whose one output is the digest of its inputs.
    Sink = 9,
    /// Every workload: gathers the final data on the lowest live rank.
    Collect = 10,
}

impl Class {
    fn from_code(code: u8) -> Option<Class> {
        Some(match code {
            1 => Class::Start,
            2 => Class::TaskX,
            3 => Class::TaskY,
            4 => Class::Potrf,
            5 => Class::Trsm,
            6 => Class::Syrk,
            7 => Class::Gemm,
            8 => Class::Node,
            9 => Class::Sink,
            10 => Class::Collect,
            _ => return None,
        })
    }

    /// The class's name, as in the JDF.
    pub fn name(self) -> &'static str {
        match self {
            Class::Start => "start",
            Class::TaskX => "task_x",
            Class::TaskY => "task_y",
            Class::Potrf => "POTRF",
            Class::Trsm => "TRSM",
            Class::Syrk => "SYRK",
            Class::Gemm => "GEMM",
            Class::Node => "node",
            Class::Sink => "sink",
            Class::Collect => "collect",
        }
    }
}

/// One task: its class and parameters, its inputs, its outputs and its failure-free
/// owner.
#[derive(Clone, Debug)]
pub struct Task {
    /// Its class.
    pub class: Class,
    /// Its parameters (unused ones are 0): `k` for POTRF, `(m, k)` for TRSM and SYRK,
    /// `(m, n, k)` for GEMM, the task's number for the random DAG.
    pub params: [u32; 3],
    /// The outputs it reads, in the order its kernel takes them.
    pub inputs: Vec<OutputId>,
    /// Its first output; its outputs are `first_output..first_output + outputs`.
    pub first_output: OutputId,
    /// How many outputs it has.
    pub outputs: u32,
    /// Its owner when no rank has failed.
    pub owner: Rank,
}

impl Task {
    /// Its outputs' ids.
    pub fn output_ids(&self) -> std::ops::Range<OutputId> {
        self.first_output..self.first_output + self.outputs
    }
}

impl fmt::Display for Task {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c] = self.params;
        match self.class {
            Class::Potrf | Class::Start | Class::TaskX | Class::TaskY | Class::Node => {
                write!(f, "{}({a})", self.class.name())
            }
            Class::Trsm | Class::Syrk => write!(f, "{}({a},{b})", self.class.name()),
            Class::Gemm => write!(f, "{}({a},{b},{c})", self.class.name()),
            Class::Sink | Class::Collect => write!(f, "{}({a})", self.class.name()),
        }
    }
}

/// One output: who produces it, its size and who consumes it.
#[derive(Clone, Debug)]
pub struct Output {
    /// The producing task.
    pub producer: TaskIdx,
    /// Its index among the producer's outputs.
    pub index: u32,
    /// Its size in bytes.
    pub bytes: u64,
    /// The tasks that read it, in task order.
    pub consumers: Vec<TaskIdx>,
}

/// A whole task graph: see the [module docs](self).
#[derive(Clone, Debug)]
pub struct Graph {
    /// The tasks, in topological order; the last is the collector.
    pub tasks: Vec<Task>,
    /// The outputs, by id.
    pub outputs: Vec<Output>,
}

impl Graph {
    /// The collector (the last task).
    pub fn collector(&self) -> TaskIdx {
        (self.tasks.len() - 1) as TaskIdx
    }

    /// The number of tasks, the collector left out (what a restart would run).
    pub fn work_tasks(&self) -> usize {
        self.tasks.len() - 1
    }

    /// The task `t`.
    pub fn task(&self, t: TaskIdx) -> &Task {
        &self.tasks[t as usize]
    }

    /// The output `o`.
    pub fn output(&self, o: OutputId) -> &Output {
        &self.outputs[o as usize]
    }

    /// How many tasks (the collector left out) each rank of `n` owns failure-free.
    pub fn owned_counts(&self, n: u32) -> Vec<u32> {
        let mut counts = vec![0u32; n as usize];
        for task in &self.tasks[..self.work_tasks()] {
            counts[task.owner as usize] += 1;
        }
        counts
    }
}

/// Builds a [`Graph`] task by task, in topological order.
#[derive(Debug, Default)]
pub struct GraphBuilder {
    tasks: Vec<Task>,
    outputs: Vec<Output>,
}

impl GraphBuilder {
    /// An empty graph.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a task reading `inputs` (outputs already added) and producing outputs of
    /// the given sizes; its number.
    pub fn add(
        &mut self,
        class: Class,
        params: [u32; 3],
        owner: Rank,
        inputs: Vec<OutputId>,
        output_bytes: &[u64],
    ) -> TaskIdx {
        let t = self.tasks.len() as TaskIdx;
        for &input in &inputs {
            let output = &mut self.outputs[input as usize];
            assert!(output.producer < t, "inputs come from earlier tasks");
            if output.consumers.last() != Some(&t) {
                output.consumers.push(t);
            }
        }
        let first_output = self.outputs.len() as OutputId;
        for (index, &bytes) in output_bytes.iter().enumerate() {
            self.outputs.push(Output {
                producer: t,
                index: index as u32,
                bytes,
                consumers: Vec::new(),
            });
        }
        self.tasks.push(Task {
            class,
            params,
            inputs,
            first_output,
            outputs: output_bytes.len() as u32,
            owner,
        });
        t
    }

    /// The output `index` of task `t`.
    pub fn output_of(&self, t: TaskIdx, index: u32) -> OutputId {
        let task = &self.tasks[t as usize];
        assert!(index < task.outputs);
        task.first_output + index
    }

    /// Ends the graph with the collector reading `finals`, in canonical order.
    pub fn finish(mut self, finals: Vec<OutputId>) -> Graph {
        self.add(Class::Collect, [0; 3], 0, finals, &[]);
        Graph {
            tasks: self.tasks,
            outputs: self.outputs,
        }
    }
}

/// The activation header of a broadcast: the task's class and parameters, its number
/// and which of its outputs the broadcast carries, in the broadcast's output order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// The task.
    pub task: TaskIdx,
    /// The producer's output index of each of the broadcast's outputs.
    pub outputs: Vec<u32>,
}

/// A header a peer sent that does not name a task of this graph.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeaderError {
    /// Shorter than its fields.
    Truncated,
    /// A task number past the graph.
    UnknownTask(u32),
    /// Class or parameters that are not those of the task it names.
    Mismatch(u32),
    /// An output index past the task's outputs.
    UnknownOutput {
        /// The task.
        task: u32,
        /// The index.
        output: u32,
    },
}

impl fmt::Display for HeaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeaderError::Truncated => write!(f, "activation header truncated"),
            HeaderError::UnknownTask(t) => write!(f, "activation header names unknown task {t}"),
            HeaderError::Mismatch(t) => {
                write!(
                    f,
                    "activation header's class or parameters are not task {t}'s"
                )
            }
            HeaderError::UnknownOutput { task, output } => {
                write!(
                    f,
                    "activation header names output {output} of task {task}, which has none such"
                )
            }
        }
    }
}

impl std::error::Error for HeaderError {}

impl Header {
    /// The header's bytes: class (1), parameters (3 × 4), task (4), count (1), output
    /// indices (1 each); little-endian.
    pub fn encode(&self, graph: &Graph) -> Vec<u8> {
        let task = graph.task(self.task);
        let mut out = Vec::with_capacity(18 + self.outputs.len());
        out.push(task.class as u8);
        for p in task.params {
            out.extend_from_slice(&p.to_le_bytes());
        }
        out.extend_from_slice(&self.task.to_le_bytes());
        out.push(self.outputs.len() as u8);
        out.extend(self.outputs.iter().map(|&j| j as u8));
        out
    }

    /// Decodes a peer's header against `graph`.
    pub fn decode(bytes: &[u8], graph: &Graph) -> Result<Header, HeaderError> {
        let word = |at: usize| -> Result<u32, HeaderError> {
            bytes
                .get(at..at + 4)
                .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
                .ok_or(HeaderError::Truncated)
        };
        let class = *bytes.first().ok_or(HeaderError::Truncated)?;
        let params = [word(1)?, word(5)?, word(9)?];
        let t = word(13)?;
        let count = *bytes.get(17).ok_or(HeaderError::Truncated)? as usize;
        let indices = bytes.get(18..18 + count).ok_or(HeaderError::Truncated)?;
        let task = graph
            .tasks
            .get(t as usize)
            .ok_or(HeaderError::UnknownTask(t))?;
        if Class::from_code(class) != Some(task.class) || params != task.params {
            return Err(HeaderError::Mismatch(t));
        }
        let mut outputs = Vec::with_capacity(count);
        for &j in indices {
            if u32::from(j) >= task.outputs {
                return Err(HeaderError::UnknownOutput {
                    task: t,
                    output: u32::from(j),
                });
            }
            outputs.push(u32::from(j));
        }
        Ok(Header { task: t, outputs })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> Graph {
        let mut b = GraphBuilder::new();
        let s = b.add(Class::Start, [0; 3], 0, vec![], &[4, 8]);
        let a = b.output_of(s, 0);
        let bb = b.output_of(s, 1);
        let x = b.add(Class::TaskX, [1, 0, 0], 1, vec![a], &[3]);
        let y = b.add(Class::TaskY, [2, 0, 0], 2, vec![a, bb], &[3]);
        let fx = b.output_of(x, 0);
        let fy = b.output_of(y, 0);
        b.finish(vec![fx, fy])
    }

    #[test]
    fn consumers_are_recorded_in_task_order() {
        let g = tiny();
        assert_eq!(g.output(0).consumers, [1, 2]);
        assert_eq!(g.output(1).consumers, [2]);
        assert_eq!(g.output(2).consumers, [g.collector()]);
        assert_eq!(g.owned_counts(3), [1, 1, 1]);
    }

    #[test]
    fn a_header_round_trips_and_a_forged_one_is_refused() {
        let g = tiny();
        let h = Header {
            task: 0,
            outputs: vec![1, 0],
        };
        let bytes = h.encode(&g);
        assert_eq!(Header::decode(&bytes, &g), Ok(h));
        assert_eq!(
            Header::decode(&bytes[..10], &g),
            Err(HeaderError::Truncated)
        );
        let mut forged = bytes.clone();
        forged[0] = Class::Gemm as u8;
        assert_eq!(Header::decode(&forged, &g), Err(HeaderError::Mismatch(0)));
        let mut forged = bytes.clone();
        forged[13] = 99;
        assert_eq!(
            Header::decode(&forged, &g),
            Err(HeaderError::UnknownTask(99))
        );
        let mut forged = bytes;
        forged[18] = 5;
        assert_eq!(
            Header::decode(&forged, &g),
            Err(HeaderError::UnknownOutput { task: 0, output: 5 })
        );
    }
}
