//! One rank of the runtime: worker threads run ready tasks, and one comm thread takes
//! the handle's events, schedules successors from them, agrees on failures and runs
//! recovery.
//!
//! The activation path: a worker that finishes task `t` keeps its outputs, hands the
//! local consumers theirs, and starts **one** broadcast for `t` (key `t` with a
//! per-rank sequence number above bit 32, header = class, parameters and the outputs
//! carried), each output to exactly the ranks that own its consumers. A remote rank
//! learns of it from [`Event::Arrived`](ft::Event::Arrived) (the header says which task and outputs) and
//! takes each output on [`Event::OutputReady`](ft::Event::OutputReady); a task whose inputs are all held is
//! queued for the workers.
//!
//! Invariants:
//! - an output is stored once, never changed and never dropped before the graph
//!   completes; a second copy (a re-send, a re-run) is ignored;
//! - a rank runs a task at most once; it runs exactly the tasks it owns under the
//!   latest plan (all of its failure-free tasks before any failure);
//! - bytes from peers are checked before use: a header that names no task of the
//!   graph, an output of the wrong size and malformed holdings are dropped with a
//!   message on standard error, never a panic;
//! - the collector runs at the lowest live rank, which reports once every live rank
//!   acknowledged the end.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ft::ft_bcast::Bytes;
use ft::{OutputSpec, PlanSpec, Rank, RankSet, Runtime, Strategy, Topology};
use xxhash_rust::xxh3::Xxh3;

use crate::graph::{Graph, Header, OutputId, TaskIdx};
use crate::recovery::{owner, Bits};
use crate::workloads::{Finish, Workload};

mod comm;

/// Message tags (the top byte says which kind).
const TAG_HOLDINGS: u64 = 1 << 56;
const TAG_FINISH: u64 = 2 << 56;
const TAG_ACK: u64 = 3 << 56;
const TAG_DATA: u64 = 4 << 56;
const TAG_LAST_WORDS: u64 = 5 << 56;
const TAG_LAST_WORDS_ACK: u64 = 6 << 56;
const KIND: u64 = 0xff << 56;
/// Output names in a broadcast spec (a task has at most 4 outputs).
const NAMES: [&str; 4] = ["o0", "o1", "o2", "o3"];
/// How long the comm thread waits for an event before it looks at its state again.
const TICK: Duration = Duration::from_millis(20);

/// One `--kill RANKS@K` flag: the ranks die right after each completes `after` tasks,
/// once every earlier flag's ranks are in `G`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KillFlag {
    /// The ranks.
    pub ranks: Vec<Rank>,
    /// Tasks each completes first.
    pub after: u32,
}

/// How the runtime runs.
#[derive(Clone, Debug)]
pub struct Options {
    /// How broadcasts are built.
    pub strategy: Strategy,
    /// Their trees' shape.
    pub topology: Topology,
    /// Worker threads per rank.
    pub workers: usize,
    /// The failures, in sequence.
    pub kills: Vec<KillFlag>,
    /// Plain two-sided sends from each producer to each consumer rank instead of
    /// broadcasts, and no recovery.
    pub baseline: bool,
    /// The longest a rank runs before it gives up.
    pub limit: Duration,
    /// Where every rank of this process records each task run it completes (tests
    /// read it to count re-runs themselves).
    pub log: Option<Arc<RunLog>>,
}

/// Every completed task run of the ranks sharing it, as (rank, task), in completion
/// order: a completion is recorded exactly when the rank counts it in `executed`.
#[derive(Debug, Default)]
pub struct RunLog(Mutex<Vec<(Rank, TaskIdx)>>);

impl RunLog {
    fn record(&self, rank: Rank, t: TaskIdx) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((rank, t));
    }

    /// The runs recorded so far.
    pub fn runs(&self) -> Vec<(Rank, TaskIdx)> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// What the lowest live rank reports at the end.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// The workload's lines.
    pub finish: Finish,
    /// xxh3-128 of the final data in canonical order, in hex.
    pub checksum: String,
    /// From the start of the graph to the collector's end.
    pub seconds: f64,
    /// The ranks that failed (job numbering).
    pub dead: Vec<Rank>,
    /// Task runs completed at every rank, the dead included (the collector left out).
    pub executed: u64,
    /// Runs past the first of each task: `executed` less the graph's tasks, since each
    /// task runs at least once (the collector needs every task's outputs, transitively).
    pub reexecuted: u64,
    /// Dead ranks whose runs are not in `executed`: they died without their last
    /// words (not by `--kill`), so `executed` and `reexecuted` are lower bounds.
    pub uncounted: Vec<Rank>,
}

/// The `u64` of an 8-byte message (a run count), if it is one.
fn count(bytes: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.try_into().ok()?))
}

/// The checksum of the final data: xxh3-128 over each item's length and bytes.
pub fn checksum(finals: &[&[u8]]) -> String {
    let mut h = Xxh3::new();
    for f in finals {
        h.update(&(f.len() as u64).to_le_bytes());
        h.update(f);
    }
    format!("{:032x}", h.digest128())
}

struct State {
    /// `G`, as last agreed.
    dead: RankSet,
    /// Every rank reported failed.
    known: RankSet,
    held: HashMap<OutputId, Bytes>,
    ran: Bits,
    done: Vec<bool>,
    started: Vec<bool>,
    runs: Vec<bool>,
    needed: Vec<bool>,
    ready: VecDeque<TaskIdx>,
    /// Task runs completed here (the collector left out).
    executed: u64,
    /// This rank's `--kill` fired: no task starts or completes here any more, and the
    /// comm thread dies once the live ranks acknowledged its last words.
    dying: bool,
    /// The runs each dead rank completed, from its last words.
    last_words: BTreeMap<Rank, u64>,
    stop: bool,
    result: Option<(Finish, String, Instant)>,
    seq: u64,
}

/// One rank: see the [module docs](self).
struct RankRun<'a> {
    handle: &'a Runtime,
    work: &'a dyn Workload,
    graph: &'a Graph,
    opts: &'a Options,
    me: Rank,
    n: u32,
    die: &'a (dyn Fn() + Sync),
    state: Mutex<State>,
    wake: Condvar,
}

/// Runs rank `me` of the job on `handle` to the end; the report at the rank that
/// reports. `die` ends this rank the way a crash does (for `--kill`).
pub fn run_rank(
    handle: &Runtime,
    work: &dyn Workload,
    opts: &Options,
    die: &(dyn Fn() + Sync),
) -> Result<Option<Report>, String> {
    let view = handle.view();
    let (n, me) = (view.size(), view.rank());
    let graph = work.graph();
    let tasks = graph.tasks.len();
    let rank = RankRun {
        handle,
        work,
        graph,
        opts,
        me,
        n,
        die,
        state: Mutex::new(State {
            dead: RankSet::new(n),
            known: RankSet::new(n),
            held: HashMap::new(),
            ran: Bits::new(tasks),
            done: vec![false; tasks],
            started: vec![false; tasks],
            runs: vec![false; tasks],
            needed: vec![true; tasks],
            ready: VecDeque::new(),
            executed: 0,
            dying: false,
            last_words: BTreeMap::new(),
            stop: false,
            result: None,
            seq: 0,
        }),
        wake: Condvar::new(),
    };
    // Every rank is up and connected before the clock starts.
    handle
        .validate_global()
        .map_err(|e| format!("rank {me}: first validation: {e}"))?;
    let start = Instant::now();
    {
        let mut s = rank.lock();
        let none = RankSet::new(n);
        for t in 0..tasks as TaskIdx {
            if owner(graph, t, &none) == me {
                s.runs[t as usize] = true;
                rank.maybe_ready(&mut s, t);
            }
        }
        rank.arm_kill(&mut s);
    }
    let outcome = std::thread::scope(|scope| {
        for _ in 0..opts.workers.max(1) {
            scope.spawn(|| rank.worker());
        }
        let outcome = rank.comm(start);
        rank.lock().stop = true;
        rank.wake.notify_all();
        outcome
    });
    outcome
}

impl RankRun<'_> {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `t` if this rank runs it and holds all its inputs.
    fn maybe_ready(&self, s: &mut State, t: TaskIdx) {
        let i = t as usize;
        if s.runs[i]
            && !s.started[i]
            && !s.done[i]
            && self
                .graph
                .task(t)
                .inputs
                .iter()
                .all(|o| s.held.contains_key(o))
        {
            s.ready.push_back(t);
            self.wake.notify_one();
        }
    }

    /// Stores output `o` (a peer's copy or this rank's own) and schedules its consumers.
    fn deliver(&self, o: OutputId, bytes: Bytes) {
        let Some(output) = self.graph.outputs.get(o as usize) else {
            eprintln!("rank {}: output {o} is not in the graph; dropped", self.me);
            return;
        };
        if bytes.len() as u64 != output.bytes {
            eprintln!(
                "rank {}: output {o} of {} bytes where the graph says {}; dropped",
                self.me,
                bytes.len(),
                output.bytes
            );
            return;
        }
        let mut s = self.lock();
        if s.held.contains_key(&o) {
            return;
        }
        s.held.insert(o, bytes);
        s.ran.set(output.producer);
        for &c in &output.consumers {
            self.maybe_ready(&mut s, c);
        }
    }

    /// The live ranks (other than this one) that own the needed consumers of `o`.
    fn dests(&self, s: &State, o: OutputId) -> Vec<Rank> {
        let mut dests: Vec<Rank> = self
            .graph
            .output(o)
            .consumers
            .iter()
            .filter(|&&c| s.needed[c as usize])
            .map(|&c| owner(self.graph, c, &s.dead))
            .filter(|&r| r != self.me && !s.known.contains(r))
            .collect();
        dests.sort_unstable();
        dests.dedup();
        dests
    }

    // ANCHOR: publish
    /// Sends outputs of task `t` to their ranks: one broadcast (or, as the baseline,
    /// one message per output and rank).
    fn publish(&self, t: TaskIdx, outputs: Vec<(OutputId, Bytes, Vec<Rank>)>) {
        let outputs: Vec<_> = outputs
            .into_iter()
            .filter(|(_, _, d)| !d.is_empty())
            .collect();
        if outputs.is_empty() {
            return;
        }
        if self.opts.baseline {
            for (o, bytes, dests) in outputs {
                for to in dests {
                    if let Err(e) = self.handle.send(to, TAG_DATA | u64::from(o), bytes.clone()) {
                        eprintln!("rank {}: send of output {o} to {to}: {e}", self.me);
                    }
                }
            }
            return;
        }
        let first = self.graph.task(t).first_output;
        let header = Header {
            task: t,
            outputs: outputs.iter().map(|(o, _, _)| o - first).collect(),
        };
        let (key, failed) = {
            let mut s = self.lock();
            s.seq += 1;
            ((s.seq << 32) | u64::from(t), s.known.clone())
        };
        let mut spec = PlanSpec::new(self.n, self.me)
            .with_topology(self.opts.topology)
            .with_strategy(self.opts.strategy);
        spec.failed = failed;
        let mut payloads = Vec::with_capacity(outputs.len());
        for (o, bytes, dests) in outputs {
            spec = spec.with_output(OutputSpec::new(
                NAMES[(o - first) as usize],
                bytes.len() as u64,
                dests,
            ));
            payloads.push(bytes);
        }
        if let Err(e) =
            self.handle
                .start_with_header(key, header.encode(self.graph), spec, payloads)
        {
            eprintln!("rank {}: broadcast of {}: {e}", self.me, self.graph.task(t));
        }
    }
    // ANCHOR_END: publish

    // ANCHOR: kill
    /// Starts this rank's death if its `--kill` is due: every earlier flag's ranks are
    /// in `G` and it completed its `K` tasks. Called with the state locked, in the
    /// same critical section as the completion that makes it due, so the dying rank
    /// completes no other task: it dies with exactly `K` runs when the flag was armed
    /// before its `K`-th completion, and with the runs it had when `G` armed it
    /// otherwise.
    fn arm_kill(&self, s: &mut State) {
        let Some(flag) = self
            .opts
            .kills
            .iter()
            .position(|f| f.ranks.contains(&self.me))
        else {
            return;
        };
        let armed = self.opts.kills[..flag]
            .iter()
            .all(|f| f.ranks.iter().all(|&r| s.dead.contains(r)));
        let completed = s.executed >= u64::from(self.opts.kills[flag].after);
        if armed && completed && !s.stop && !s.dying {
            s.dying = true;
            self.wake.notify_all();
        }
    }
    // ANCHOR_END: kill

    fn worker(&self) {
        loop {
            let (t, inputs) = {
                let mut s = self.lock();
                loop {
                    if s.stop || s.dying {
                        return;
                    }
                    if let Some(t) = s.ready.pop_front() {
                        let i = t as usize;
                        if s.runs[i] && !s.started[i] && !s.done[i] {
                            s.started[i] = true;
                            let inputs: Vec<Bytes> = self
                                .graph
                                .task(t)
                                .inputs
                                .iter()
                                .map(|o| s.held[o].clone())
                                .collect();
                            break (t, inputs);
                        }
                        continue;
                    }
                    s = self.wake.wait(s).unwrap_or_else(|e| e.into_inner());
                }
            };
            let task = self.graph.task(t);
            let refs: Vec<&[u8]> = inputs.iter().map(|b| &b[..]).collect();
            if t == self.graph.collector() {
                let finish = self.work.finish(&refs);
                let sum = checksum(&refs);
                let mut s = self.lock();
                if s.dying {
                    return;
                }
                s.done[t as usize] = true;
                s.ran.set(t);
                s.result = Some((finish, sum, Instant::now()));
                continue;
            }
            let outs = self.work.run(task, &refs);
            let sends = {
                let mut s = self.lock();
                // The rank died while this run was under way: the run never completed.
                if s.dying || s.stop {
                    return;
                }
                let mut sends = Vec::with_capacity(outs.len());
                for (o, bytes) in task.output_ids().zip(outs) {
                    let bytes = Bytes::from(bytes);
                    s.held.entry(o).or_insert_with(|| bytes.clone());
                    sends.push((o, bytes, self.dests(&s, o)));
                }
                s.done[t as usize] = true;
                s.ran.set(t);
                s.executed += 1;
                if let Some(log) = &self.opts.log {
                    log.record(self.me, t);
                }
                self.arm_kill(&mut s);
                for o in task.output_ids() {
                    for &c in &self.graph.output(o).consumers {
                        self.maybe_ready(&mut s, c);
                    }
                }
                sends
            };
            // The K-th task's broadcast starts even when it is the last: the rank
            // dies after completing it, and completing a task includes its activation.
            self.publish(t, sends);
        }
    }
}
