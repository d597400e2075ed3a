//! One rank of the runtime: worker threads run ready tasks, and one comm thread takes
//! the handle's events, schedules successors from them, agrees on failures and runs
//! recovery.
//!
//! The activation path: a worker that finishes task `t` keeps its outputs, hands the
//! local consumers theirs, and starts **one** broadcast for `t` (key `t` with a
//! per-rank sequence number above bit 32, header = class, parameters and the outputs
//! carried), each output to exactly the ranks that own its consumers. A remote rank
//! learns of it from [`Event::Arrived`] (the header says which task and outputs) and
//! takes each output on [`Event::OutputReady`]; a task whose inputs are all held is
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

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ft::ft_bcast::Bytes;
use ft::{
    Event, OutputSet, OutputSpec, PlanSpec, Rank, RankSet, Runtime, Strategy, TaskId, Topology,
};
use xxhash_rust::xxh3::Xxh3;

use crate::graph::{Graph, Header, OutputId, TaskIdx};
use crate::recovery::{owner, plan, Bits, Holdings};
use crate::workloads::{Finish, Workload};

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

    /// The comm thread's loop; the report, at the reporting rank.
    fn comm(&self, start: Instant) -> Result<Option<Report>, String> {
        let me = self.me;
        let mut arrivals: HashMap<TaskId, Header> = HashMap::new();
        let mut holdings: BTreeMap<u32, BTreeMap<Rank, Holdings>> = BTreeMap::new();
        let mut pending: Option<u32> = None;
        let mut finish_sent = false;
        // The runs each rank that acknowledged the end completed.
        let mut acked: BTreeMap<Rank, u64> = BTreeMap::new();
        // While dying: the ranks yet to acknowledge this rank's last words.
        let mut words: Option<HashSet<Rank>> = None;
        loop {
            if self.lock().stop {
                return Ok(None);
            }
            if self.lock().dying && self.last_words(&mut words) {
                self.lock().stop = true;
                self.wake.notify_all();
                (self.die)();
                return Ok(None);
            }
            if start.elapsed() > self.opts.limit {
                return Err(format!(
                    "rank {me}: the job did not end within {:?}",
                    self.opts.limit
                ));
            }
            let event = match self.handle.next_event(Some(TICK)) {
                Ok(event) => event,
                Err(e) => return Err(format!("rank {me}: {e}")),
            };
            match event {
                Some(Event::Arrived { task, header, .. }) => {
                    match Header::decode(&header, self.graph) {
                        Ok(h) => {
                            self.lock().ran.set(h.task);
                            arrivals.entry(task).or_insert(h);
                        }
                        Err(e) => eprintln!("rank {me}: from rank {}: {e}; ignored", task.root),
                    }
                }
                Some(Event::OutputReady { task, output }) => {
                    let Some(h) = arrivals.get(&task) else {
                        eprintln!(
                            "rank {me}: output {output} of {task} without an arrival; ignored"
                        );
                        continue;
                    };
                    let Some(&j) = h.outputs.get(output as usize) else {
                        eprintln!(
                            "rank {me}: output {output} of {task} is not in its header; ignored"
                        );
                        continue;
                    };
                    let o = self.graph.task(h.task).first_output + j;
                    if self.lock().held.contains_key(&o) {
                        continue;
                    }
                    match self.handle.wait_outputs(
                        task,
                        OutputSet::single(output),
                        Some(Duration::ZERO),
                    ) {
                        Ok(data) => {
                            for (_, bytes) in data {
                                self.deliver(o, bytes);
                            }
                        }
                        Err(e) => eprintln!("rank {me}: output {output} of {task}: {e}"),
                    }
                }
                Some(Event::RankFailed { rank }) => {
                    self.lock().known.insert(rank);
                    if let Some(w) = &mut words {
                        w.remove(&rank);
                    }
                }
                Some(Event::Message { from, tag, bytes }) => match tag & KIND {
                    TAG_HOLDINGS => match Holdings::decode(&bytes, self.graph) {
                        Ok(h) => {
                            holdings.entry(h.epoch).or_default().insert(from, h);
                        }
                        Err(e) => eprintln!("rank {me}: holdings from rank {from}: {e}; ignored"),
                    },
                    // A dying rank does not take part in the end: it dies.
                    TAG_FINISH if self.lock().dying => {}
                    TAG_FINISH => {
                        let executed = self.lock().executed;
                        let _ = self
                            .handle
                            .send(from, TAG_ACK, executed.to_le_bytes().to_vec());
                        return Ok(None);
                    }
                    TAG_ACK => match count(&bytes) {
                        Some(runs) => {
                            acked.insert(from, runs);
                        }
                        None => eprintln!(
                            "rank {me}: end ack of {} bytes from rank {from}; ignored",
                            bytes.len()
                        ),
                    },
                    TAG_LAST_WORDS => match count(&bytes) {
                        Some(runs) => {
                            self.lock().last_words.insert(from, runs);
                            let _ = self.handle.send(from, TAG_LAST_WORDS_ACK, Vec::new());
                        }
                        None => eprintln!(
                            "rank {me}: last words of {} bytes from rank {from}; ignored",
                            bytes.len()
                        ),
                    },
                    TAG_LAST_WORDS_ACK => {
                        if let Some(w) = &mut words {
                            w.remove(&from);
                        }
                    }
                    TAG_DATA => {
                        self.deliver((tag & !KIND) as OutputId, bytes);
                    }
                    _ => eprintln!(
                        "rank {me}: message of unknown tag {tag:#x} from rank {from}; ignored"
                    ),
                },
                _ => {}
            }
            // Agree on every failure reported (the baseline has no recovery).
            loop {
                let (known, dead) = {
                    let s = self.lock();
                    (s.known.clone(), s.dead.clone())
                };
                if known.is_subset(&dead) || self.opts.baseline {
                    break;
                }
                let agreed = self
                    .handle
                    .validate_global()
                    .map_err(|e| format!("rank {me}: validate_global: {e}"))?;
                let mine = {
                    let mut s = self.lock();
                    s.dead = agreed.agreed.clone();
                    let dead = s.dead.clone();
                    s.known.union_with(&dead);
                    let mut h = Holdings::new(self.graph, agreed.epoch);
                    for &o in s.held.keys() {
                        h.held.set(o);
                    }
                    h.ran = s.ran.clone();
                    h
                };
                let message = mine.encode();
                for r in (0..self.n).filter(|&r| r != me && !agreed.agreed.contains(r)) {
                    let _ = self.handle.send(
                        r,
                        TAG_HOLDINGS | u64::from(agreed.epoch),
                        message.clone(),
                    );
                }
                holdings.entry(agreed.epoch).or_default().insert(me, mine);
                pending = Some(agreed.epoch);
                let mut s = self.lock();
                self.arm_kill(&mut s);
            }
            if let Some(epoch) = pending {
                let dead = self.lock().dead.clone();
                let have = holdings.get(&epoch).map_or(0, BTreeMap::len);
                if have == (self.n as usize - dead.len()) {
                    let all = holdings.remove(&epoch).unwrap_or_default();
                    holdings.retain(|&e, _| e > epoch);
                    self.recover(&dead, &all);
                    pending = None;
                }
            }
            // The reporter ends the job once every live rank acknowledged.
            let s = self.lock();
            if owner(self.graph, self.graph.collector(), &s.dead) != me {
                continue;
            }
            if let Some((finish, sum, end)) = s.result.clone() {
                let live: Vec<Rank> = (0..self.n)
                    .filter(|&r| r != me && !s.known.contains(r))
                    .collect();
                let executed = s.executed;
                drop(s);
                if !finish_sent {
                    for &r in &live {
                        let _ = self.handle.send(r, TAG_FINISH, Vec::new());
                    }
                    finish_sent = true;
                }
                if live.iter().all(|r| acked.contains_key(r)) {
                    let s = self.lock();
                    let mut dead: Vec<Rank> = s
                        .dead
                        .iter()
                        .chain(s.known.iter())
                        .filter(|r| !acked.contains_key(r))
                        .collect();
                    dead.sort_unstable();
                    dead.dedup();
                    // ANCHOR: count
                    // Every run completed anywhere: here, at each rank that acknowledged
                    // the end, and at each dead rank, from its last words.
                    let mut executed = executed + acked.values().sum::<u64>();
                    let mut uncounted = Vec::new();
                    for &d in &dead {
                        match s.last_words.get(&d) {
                            Some(&runs) => executed += runs,
                            None => uncounted.push(d),
                        }
                    }
                    let reexecuted = executed.saturating_sub(self.graph.work_tasks() as u64);
                    // ANCHOR_END: count
                    return Ok(Some(Report {
                        finish,
                        checksum: sum,
                        seconds: end.duration_since(start).as_secs_f64(),
                        dead,
                        executed,
                        reexecuted,
                        uncounted,
                    }));
                }
            }
        }
    }

    /// A dying rank's last words: it tells every live rank (but those dying in the same
    /// flag) how many task runs it completed, so that the report counts them; the
    /// survivors use them for nothing else. Whether every addressee acknowledged them
    /// or is known dead, so that the rank may die now.
    fn last_words(&self, words: &mut Option<HashSet<Rank>>) -> bool {
        let words = words.get_or_insert_with(|| {
            let s = self.lock();
            let together: &[Rank] = self
                .opts
                .kills
                .iter()
                .find(|f| f.ranks.contains(&self.me))
                .map_or(&[], |f| &f.ranks);
            let bytes = s.executed.to_le_bytes().to_vec();
            let to: Vec<Rank> = (0..self.n)
                .filter(|&r| r != self.me && !s.known.contains(r) && !together.contains(&r))
                .collect();
            drop(s);
            to.into_iter()
                .filter(|&r| self.handle.send(r, TAG_LAST_WORDS, bytes.clone()).is_ok())
                .collect()
        });
        words.is_empty()
    }

    /// Applies the plan after `G = dead`: runs what must run here, re-sends what this
    /// rank was picked to re-send, and re-publishes what it ran since its holdings.
    fn recover(&self, dead: &RankSet, holdings: &BTreeMap<Rank, Holdings>) {
        let collected = holdings.values().any(|h| h.ran.get(self.graph.collector()));
        let p = plan(self.graph, dead, holdings, collected);
        if std::env::var_os("FTTASK_DEBUG").is_some() {
            let count = |v: &[bool]| v.iter().filter(|&&b| b).count();
            eprintln!(
                "rank {}: plan after G = {:?}: {} tasks to run, {} of them again, {} re-sends",
                self.me,
                dead.iter().collect::<Vec<_>>(),
                count(&p.must_run),
                count(&p.rerun),
                p.resends.len()
            );
        }
        let mut republish = Vec::new();
        let mut resends = Vec::new();
        {
            let mut s = self.lock();
            s.needed = p.must_run.clone();
            for t in 0..self.graph.tasks.len() as TaskIdx {
                let i = t as usize;
                s.runs[i] = p.must_run[i] && owner(self.graph, t, dead) == self.me;
                if s.runs[i] && s.done[i] && !holdings[&self.me].ran.get(t) {
                    republish.push(t);
                } else {
                    self.maybe_ready(&mut s, t);
                }
            }
            for (&(sender, t), outs) in &p.resends {
                if sender != self.me {
                    continue;
                }
                let sends: Vec<_> = outs
                    .iter()
                    .filter_map(|(o, dests)| s.held.get(o).map(|b| (*o, b.clone(), dests.clone())))
                    .collect();
                resends.push((t, sends));
            }
            for &t in &republish {
                let sends: Vec<_> = self
                    .graph
                    .task(t)
                    .output_ids()
                    .filter_map(|o| s.held.get(&o).map(|b| (o, b.clone(), self.dests(&s, o))))
                    .collect();
                resends.push((t, sends));
            }
        }
        self.wake.notify_all();
        for (t, sends) in resends {
            self.publish(t, sends);
        }
    }
}
