//! The bench-bcast job: the stack's broadcast (per-class trees, binomial) against a
//! plain broadcast of the same bytes on the same transport, in the same run, so the
//! report is a ratio that holds across machines and loads.
//!
//! **Cases.** Every size of `--sizes` with every count of `--outputs`: `m` outputs of
//! `bytes` bytes each from rank 0, output `j` to the ranks `r ≥ 1` with
//! `(r - 1) mod m ≠ j` (every rank when `m = 1`), so with several outputs the
//! destinations need different subsets and form several classes ([`case_spec`]).
//!
//! **What is timed.** Each repetition starts from a barrier; every rank times from it
//! until it holds every output it needs (the root: until its sends are queued), and a
//! repetition's time is the largest over the ranks: when the last destination got its
//! last byte. A case reports the median over `--reps` repetitions. The root has its
//! call ready before the barrier ([`Case::start`]): the broadcast and clones of the
//! case's shared payload buffers, as an application hands its outputs over once, so no
//! copy of the payloads after the barrier delays every destination.
//!
//! **Baselines.** This module's own, for any transport ([`bench_bcast`]): one plain
//! two-sided binomial broadcast per output over the same endpoints, in chunks of
//! [`MAX_CHUNK`] bytes (the stack's own chunk), each chunk forwarded to the children as
//! it arrives; it runs before the stack phase, on the bare transport (the crate's `raw`
//! module). `ftmpi` supplies `MPI_Bcast` instead, interleaved with the stack's
//! repetitions (`backend-mpi`'s `ftmpi bench-bcast`), using [`stack_rep`] and [`Case`]
//! from here.
//!
//! **Memory.** Every repetition is a new broadcast task. Once a repetition's closing
//! validation has returned, every rank holds what it needed, so each rank releases the
//! task ([`release`]; a case's last one after its bytes were checked): a rank holds
//! one repetition's outputs at a time.

use std::path::PathBuf;
use std::time::{Duration as StdDuration, Instant as WallInstant};

use backend_sim::stack::payload;
use clap::Args;
use ft_bcast::{BcastEvent, OutputSet, OutputSpec, Plan, PlanSpec, StackEvent, Strategy, TaskId};
use ft_core::wire::MAX_CHUNK;
use ft_core::Rank;
use ft_runtime::timeline::{self, Mark};
use ft_runtime::{Bytes, Transport};
use serde_json::{json, Value};

use crate::raw::{Raw, DATA_MAGIC};
use crate::{median, stopped, validate_once, Finished, JobArgs, Launch, RankDriver};

/// The output sizes timed by default: 1 KiB to 4 MiB.
pub const DEFAULT_SIZES: [u64; 6] = [1 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20];

/// The options of the bench-bcast job.
#[derive(Args, Clone, Debug)]
pub struct BenchBcastArgs {
    /// Output sizes in bytes (each case broadcasts outputs of one size).
    #[arg(long, value_delimiter = ',', num_args = 1.., default_values_t = DEFAULT_SIZES)]
    pub sizes: Vec<u64>,
    /// Output counts (each case broadcasts this many outputs).
    #[arg(long, value_delimiter = ',', num_args = 1.., default_values_t = [1u32, 4])]
    pub outputs: Vec<u32>,
    /// Repetitions of each case and each broadcast.
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u32).range(1..))]
    pub reps: u32,
    /// The driver's idle sleep in microseconds (0, the default: always spin, yielding
    /// the CPU, as MPI's own progress loops and the two-sided baseline do).
    #[arg(long, default_value_t = 0)]
    pub idle_us: u64,
    /// How long after its last frame the driver spins before it sleeps, in
    /// microseconds.
    #[arg(long, default_value_t = 500)]
    pub spin_us: u64,
    /// The longest chunk the stack sends, in bytes (the stack's `chunk_bytes`); unset,
    /// the transport's choice.
    #[arg(long)]
    pub chunk_bytes: Option<usize>,
    /// The longest chunk the stack sends to a leaf of a tree, in bytes (the stack's
    /// `leaf_chunk_bytes`); unset, the backend's choice.
    #[arg(long)]
    pub leaf_chunk_bytes: Option<usize>,
    /// The broadcast strategy: per-class, fetch-for-descendants or per-output.
    #[arg(long, default_value = "per-class", value_parser = parse_strategy)]
    pub strategy: Strategy,
    /// Plan every repetition anew (`RankStack::start_broadcast` from the spec) instead
    /// of once per case (`RankStack::start_planned`), as the baseline's communicators
    /// are split once per case
    #[arg(long)]
    pub plan_per_rep: bool,
    /// Record when each step of every repetition happened at each rank
    /// (`ft_runtime::timeline`: repetitions' starts and ends per phase, frames handed
    /// to the machine and handled, payload receives posted and landed) and write rank
    /// `r`'s to `DIR/rank-r.tsv`; `scripts/bcast-timeline` summarises them.
    #[arg(long, value_name = "DIR")]
    pub timeline: Option<PathBuf>,
}

/// The phases of a repetition, as a timeline's `rep_start` and `rep_done` name them.
pub mod phase {
    /// The stack's broadcast.
    pub const STACK: u32 = 0;
    /// One `MPI_Bcast` per output (`ftmpi`).
    pub const MPI_BCAST: u32 = 1;
    /// The activation floor (`ftmpi`).
    pub const ACTIVATION_FLOOR: u32 = 2;
    /// The plain two-sided broadcast on the bare transport (`ftofi`).
    pub const TWO_SIDED: u32 = 3;

    /// A phase's name in a written timeline.
    pub fn name(phase: u32) -> &'static str {
        match phase {
            STACK => "stack",
            MPI_BCAST => "mpi_bcast",
            ACTIVATION_FLOOR => "activation_floor",
            TWO_SIDED => "two_sided",
            _ => "other",
        }
    }
}

/// Marks a timeline keeps per rank and timed repetition (a relay's repetition of 4
/// outputs makes a few dozen).
const MARKS_PER_REP: usize = 256;

/// `--strategy`: a strategy's name.
fn parse_strategy(name: &str) -> Result<Strategy, String> {
    name.parse().map_err(|_| {
        let names: Vec<&str> = Strategy::ALL.iter().map(|s| s.name()).collect();
        format!("{name:?} is not one of {}", names.join(", "))
    })
}

impl BenchBcastArgs {
    /// Checks the options against a job of `n` ranks (failure-free, `args`).
    pub fn check(&self, n: u32, args: &JobArgs) -> Result<(), String> {
        if !args.kill.is_empty() {
            return Err("bench-bcast runs failure-free; --kill does not apply".into());
        }
        if n < 2 {
            return Err("bench-bcast needs at least 2 ranks".into());
        }
        if let Some(bad) = self.sizes.iter().find(|&&s| s == 0 || s > 1 << 30) {
            return Err(format!("--sizes {bad}: sizes are 1 B to 1 GiB"));
        }
        if let Some(bad) = self.outputs.iter().find(|&&m| m == 0 || m > 64) {
            return Err(format!("--outputs {bad}: counts are 1 to 64"));
        }
        Ok(())
    }

    /// The cases in the order they run: every size of each output count.
    pub fn cases(&self, n: u32, me: Rank) -> Vec<Case> {
        self.outputs
            .iter()
            .flat_map(|&m| self.sizes.iter().map(move |&bytes| (bytes, m)))
            .map(|(bytes, m)| Case::new(n, me, bytes, m, self.strategy, self.plan_per_rep))
            .collect()
    }

    /// Sets the driver's idle loop, and the stack's chunks (if given), as the options
    /// say.
    pub fn configure<T: Transport>(&self, driver: &mut RankDriver<T>) -> Result<(), String> {
        driver.set_idle(
            StdDuration::from_micros(self.spin_us),
            StdDuration::from_micros(self.idle_us),
        );
        if let Some(bytes) = self.chunk_bytes.filter(|&b| b > 0) {
            driver
                .command(|stack, _| stack.set_chunk_bytes(bytes))
                .map_err(|e| e.to_string())?;
        }
        if let Some(bytes) = self.leaf_chunk_bytes.filter(|&b| b > 0) {
            driver
                .command(|stack, _| stack.set_leaf_chunk_bytes(bytes))
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Starts recording the timeline if `--timeline` asks for one, with room for
    /// `cases` cases of `--reps` repetitions in each of `phases` timed phases.
    pub fn start_timeline(&self, cases: usize, phases: usize) {
        if self.timeline.is_some() {
            let reps = cases * phases * self.reps as usize;
            timeline::enable((reps * MARKS_PER_REP).max(1 << 12));
        }
    }

    /// Writes this thread's timeline to `DIR/rank-me.tsv` if `--timeline` asked for
    /// one: a line per mark, `nanoseconds<TAB>mark<TAB>argument` (the argument of
    /// `rep_start` and `rep_done` is the phase's name), oldest first, and a last line
    /// `# dropped <marks past the capacity>`.
    pub fn write_timeline(&self, me: Rank) -> Result<(), String> {
        let Some(dir) = &self.timeline else {
            return Ok(());
        };
        let recorded = timeline::take();
        let mut text = String::with_capacity(recorded.marks.len() * 32);
        for (nanos, mark, arg) in &recorded.marks {
            let arg = match mark {
                Mark::RepStart | Mark::RepDone => phase::name(*arg).to_string(),
                _ => arg.to_string(),
            };
            text.push_str(&format!("{nanos}\t{}\t{arg}\n", mark.name()));
        }
        text.push_str(&format!("# dropped {}\n", recorded.dropped));
        let path = dir.join(format!("rank-{me}.tsv"));
        std::fs::create_dir_all(dir)
            .and_then(|()| std::fs::write(&path, text))
            .map_err(|e| format!("cannot write the timeline {}: {e}", path.display()))
    }
}

/// The destinations of output `j` of `m` in a job of `n` ranks ([module docs](self)).
pub fn case_dests(n: u32, m: u32, j: u32) -> Vec<Rank> {
    (1..n).filter(|&r| m == 1 || (r - 1) % m != j).collect()
}

/// The broadcast of a case: `m` outputs of `bytes` bytes from rank 0, binomial trees
/// (the default of [`PlanSpec::new`]), under `strategy`.
pub fn case_spec(n: u32, bytes: u64, m: u32, strategy: Strategy) -> PlanSpec {
    (0..m)
        .fold(PlanSpec::new(n, 0), |spec, j| {
            spec.with_output(OutputSpec::new(format!("O{j}"), bytes, case_dests(n, m, j)))
        })
        .with_strategy(strategy)
}

/// One case at one rank: its broadcast, what this rank needs, and (at the root) the
/// payloads.
#[derive(Clone, Debug)]
pub struct Case {
    /// Bytes per output.
    pub bytes: u64,
    /// Number of outputs.
    pub outputs: u32,
    /// The broadcast's plan ([`Case::spec`] is its spec), built once per case and
    /// started from in every repetition (unless `--plan-per-rep`).
    pub plan: Plan,
    /// Whether each repetition plans anew (`--plan-per-rep`).
    pub plan_per_rep: bool,
    /// The outputs this rank needs.
    pub needs: OutputSet,
    /// The outputs' bytes (every rank has them, to check what it received), as the
    /// shared buffers an application hands over: a repetition passes clones of them
    /// (reference counts, no copy) to the stack.
    pub payloads: Vec<Bytes>,
}

impl Case {
    fn new(
        n: u32,
        me: Rank,
        bytes: u64,
        outputs: u32,
        strategy: Strategy,
        plan_per_rep: bool,
    ) -> Self {
        let plan = Plan::build(case_spec(n, bytes, outputs, strategy))
            .expect("a bench case is a valid broadcast");
        let needs = (0..outputs)
            .filter(|&j| plan.spec().outputs[j as usize].dests.contains(&me))
            .collect();
        // The payload of "broadcast" `outputs`: the same bytes whatever the task id.
        let payloads = (0..outputs)
            .map(|j| Bytes::from(payload(outputs, j, bytes)))
            .collect();
        Case {
            bytes,
            outputs,
            plan,
            plan_per_rep,
            needs,
            payloads,
        }
    }

    /// The broadcast.
    pub fn spec(&self) -> &PlanSpec {
        self.plan.spec()
    }

    /// Whether rank `me` is the root.
    fn is_root(&self, me: Rank) -> bool {
        me == self.spec().root
    }

    /// At the root (`me`), what [`stack_rep`] starts a repetition with; elsewhere
    /// nothing.
    pub fn start(&self, me: Rank) -> Option<Start> {
        self.is_root(me).then(|| Start {
            spec: self.plan_per_rep.then(|| self.spec().clone()),
            payloads: self.payloads.clone(),
        })
    }

    /// Output `j`'s root and destinations, in rank order (the members of its plain
    /// broadcast: an `MPI_Bcast` communicator, a two-sided tree).
    pub fn members(&self, j: u32) -> Vec<Rank> {
        let mut members = vec![self.spec().root];
        members.extend_from_slice(&self.spec().outputs[j as usize].dests);
        members
    }

    /// Whether the stack delivered broadcast `key` (of this case's root) intact at this
    /// rank.
    pub fn stack_delivered<T: Transport>(&self, driver: &RankDriver<T>, key: u64) -> bool {
        let task = TaskId::new(self.spec().root, key);
        let bcast = driver.machine().broadcaster();
        self.needs
            .iter()
            .all(|j| bcast.and_then(|b| b.output(task, j)) == Some(&self.payloads[j as usize][..]))
    }

    /// The payload bytes the root sends per repetition (outputs × bytes).
    fn total_bytes(&self) -> u64 {
        self.bytes * u64::from(self.outputs)
    }

    /// Rank 0's line for this case: `{"rank": 0, "bytes", "outputs", "strategy", "n", "reps", "median_us":
    /// {"stack", BASE}, "gbytes_per_s": {"stack", BASE}, RATIO}` where `RATIO` is
    /// `"ratio_to_" + BASE`: the stack's median over the baseline's.
    pub fn line(&self, n: u32, reps: u32, stack_us: f64, base: &str, base_us: f64) -> String {
        self.line_with(n, reps, stack_us, base, base_us, &[])
    }

    /// [`Case::line`] with more timed ways beside the stack: each `(name, us)` adds
    /// `name` to `"median_us"` and `"gbytes_per_s"`, and `"{name}_ratio_to_" + BASE`.
    pub fn line_with(
        &self,
        n: u32,
        reps: u32,
        stack_us: f64,
        base: &str,
        base_us: f64,
        others: &[(&str, f64)],
    ) -> String {
        let gbps = |us: f64| self.total_bytes() as f64 / (us * 1e3);
        let mut line = json!({
            "rank": 0,
            "bytes": self.bytes,
            "outputs": self.outputs,
            "strategy": self.spec().strategy.name(),
            "plan": if self.plan_per_rep { "per_rep" } else { "per_case" },
            "n": n,
            "reps": reps,
            "median_us": {"stack": stack_us, base: base_us},
            "gbytes_per_s": {"stack": gbps(stack_us), base: gbps(base_us)},
        });
        line[format!("ratio_to_{base}")] = Value::from(stack_us / base_us);
        for &(name, us) in others {
            line["median_us"][name] = Value::from(us);
            line["gbytes_per_s"][name] = Value::from(gbps(us));
            line[format!("{name}_ratio_to_{base}")] = Value::from(us / base_us);
        }
        line.to_string()
    }
}

/// What the root hands the stack to start one repetition: the broadcast's spec when
/// the repetition plans anew (else the case's plan serves), and the payloads (clones
/// of the case's shared buffers).
#[derive(Debug)]
pub struct Start {
    spec: Option<PlanSpec>,
    payloads: Vec<Bytes>,
}

/// One repetition of a case through the stack, from a common start the caller made:
/// the root starts broadcast `task` with `start` ([`Case::start`], prepared before the
/// common start: whatever the root does between that start and its call delays every
/// destination, and an application has its outputs ready when it broadcasts them);
/// every rank drives until it holds what it needs. Returns this rank's microseconds
/// from the call. The caller must keep the driver running afterwards until every rank
/// is done (this rank may have children to serve).
pub fn stack_rep<T: Transport>(
    driver: &mut RankDriver<T>,
    case: &Case,
    start: Option<Start>,
    key: u64,
    limit: StdDuration,
) -> Result<f64, String> {
    let task = TaskId::new(case.spec().root, key);
    let since = WallInstant::now();
    timeline::mark(Mark::RepStart, phase::STACK);
    if let Some(Start { spec, payloads }) = start {
        driver
            .command(|stack, now| match spec {
                Some(spec) => stack.start_broadcast(now, key, Bytes::new(), spec, payloads),
                None => stack.start_planned(now, key, Bytes::new(), &case.plan, payloads),
            })
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
    }
    // Held outputs, not `Released` events: a rank still finishing the previous
    // repetition's closing validation may release this task's outputs inside it, and
    // that loop does not keep other events.
    driver
        .run_until("a benchmark broadcast", limit, |stack, events| {
            while let Some((_, event)) = events.pop_front() {
                if let Some(stop) = stopped(&event) {
                    crate::leave(&stop);
                }
                if let StackEvent::Bcast(BcastEvent::Abandoned { task: t }) = event {
                    if t == task {
                        return Some(Err(format!("broadcast {task} abandoned")));
                    }
                }
            }
            let bcast = stack.broadcaster();
            let held = |j| bcast.and_then(|b| b.output(task, j)).is_some();
            case.needs.iter().all(held).then_some(Ok(()))
        })
        .map_err(|e| e.to_string())??;
    let took = since.elapsed().as_secs_f64() * 1e6;
    timeline::mark(Mark::RepDone, phase::STACK);
    Ok(took)
}

/// Drops what this rank keeps of broadcast `key` of `case`'s root (every rank must hold what it needs
/// of it: after the repetition's closing validation).
pub fn release<T: Transport>(
    driver: &mut RankDriver<T>,
    case: &Case,
    key: u64,
) -> Result<(), String> {
    let task = TaskId::new(case.spec().root, key);
    driver
        .command(|stack, _| stack.release(task))
        .map_err(|e| e.to_string())
}

/// Per output of a case, this rank's place in a plain broadcast's binomial tree over
/// that output's members (the two-sided baseline's, `ftmpi`'s activation floor's): its
/// parent (`None` at the root or off the tree) and children.
pub fn raw_trees(case: &Case, me: Rank) -> Vec<(Option<Rank>, Vec<Rank>)> {
    (0..case.outputs)
        .map(|j| {
            let edges = ft_bcast::tree_edges(
                case.spec().topology,
                case.spec().root,
                &case.members(j),
                &ft_bcast::NoFailures,
            );
            let parent = edges.iter().find(|e| e.1 == me).map(|e| e.0);
            let children = edges.iter().filter(|e| e.0 == me).map(|e| e.1).collect();
            (parent, children)
        })
        .collect()
}

/// Bytes before the data in a baseline frame: magic, tag, output, chunk index.
const DATA_HEADER: usize = 4 + 4 + 2 + 4;

/// One repetition of the two-sided baseline (tagged `tag`), from a common start: the
/// root sends each output chunk by chunk down its binomial tree, every other member
/// copies each chunk into place and forwards it to its children as it arrives. Returns
/// this rank's microseconds.
fn raw_rep<T: Transport>(
    raw: &mut Raw<T>,
    case: &Case,
    trees: &[(Option<Rank>, Vec<Rank>)],
    buffers: &mut [Vec<u8>],
    tag: u32,
) -> Result<f64, String> {
    let me = raw.transport.rank();
    let chunks = (case.bytes as usize).div_ceil(MAX_CHUNK);
    let mut frame = Vec::with_capacity(DATA_HEADER + MAX_CHUNK);
    let since = WallInstant::now();
    timeline::mark(Mark::RepStart, phase::TWO_SIDED);
    if case.is_root(me) {
        for (j, (_, children)) in trees.iter().enumerate() {
            for (c, chunk) in case.payloads[j].chunks(MAX_CHUNK).enumerate() {
                frame.clear();
                frame.extend_from_slice(&DATA_MAGIC);
                frame.extend_from_slice(&tag.to_le_bytes());
                frame.extend_from_slice(&(j as u16).to_le_bytes());
                frame.extend_from_slice(&(c as u32).to_le_bytes());
                frame.extend_from_slice(chunk);
                for &child in children {
                    raw.transport
                        .send(child, &frame)
                        .map_err(|e| e.to_string())?;
                }
            }
        }
    } else {
        let mut missing = case.needs.len() * chunks;
        while missing > 0 {
            raw.next_data(&mut frame)?;
            let (j, offset) = parse_data(&frame, tag, case.outputs)
                .ok_or("two-sided baseline: a malformed or misplaced data frame")?;
            let data = &frame[DATA_HEADER..];
            buffers[j]
                .get_mut(offset..offset + data.len())
                .ok_or("two-sided baseline: a chunk past its output's end")?
                .copy_from_slice(data);
            for &child in &trees[j].1 {
                raw.transport
                    .send(child, &frame)
                    .map_err(|e| e.to_string())?;
            }
            missing -= 1;
        }
    }
    let took = since.elapsed().as_secs_f64() * 1e6;
    timeline::mark(Mark::RepDone, phase::TWO_SIDED);
    Ok(took)
}

/// The output index and byte offset of a baseline data frame of repetition `tag`.
fn parse_data(frame: &[u8], tag: u32, outputs: u32) -> Option<(usize, usize)> {
    let header = frame.get(..DATA_HEADER)?;
    let field = |at: usize| u32::from_le_bytes(header[at..at + 4].try_into().unwrap());
    let j = u16::from_le_bytes([header[8], header[9]]);
    (field(4) == tag && u32::from(j) < outputs)
        .then(|| (usize::from(j), field(10) as usize * MAX_CHUNK))
}

/// The key of the gather that brings every rank's times to rank 0: every rank `k > 0`
/// broadcasts its times under this key (broadcast (`k`, `GATHER`)), past every
/// benchmark key.
const GATHER: u64 = 1 << 63;

/// The bench-bcast job over any transport, against the two-sided baseline: rank 0
/// returns one line per case ([`Case::line`], baseline `"two_sided"`); every other rank
/// a line saying it took part.
///
/// 1. Raw phase, on the bare transport: every case's `reps` baseline repetitions, each
///    from a dissemination barrier.
/// 2. Stack phase: every case's `reps` repetitions through the stack, each from a
///    global validation (the stack's own barrier, which keeps serving while it waits).
/// 3. Every rank sends its times to rank 0 through the stack (a one-output broadcast
///    with root `k` and destination 0), and rank 0 takes, per repetition, the largest.
pub fn bench_bcast<L: Launch>(
    launch: &L,
    bench: &BenchBcastArgs,
    args: &JobArgs,
) -> Result<Finished, String> {
    let (me, n) = (launch.rank(), launch.size());
    let limit = args.limit();
    let cases = bench.cases(n, me);
    bench.start_timeline(cases.len(), 2); // two-sided, stack
    let reps = bench.reps as usize;
    // times[case][rep]: this rank's raw, then stack, microseconds.
    let mut raw_times = vec![Vec::with_capacity(reps); cases.len()];
    let mut stack_times = vec![Vec::with_capacity(reps); cases.len()];

    let mut raw = Raw::new(launch.connect()?, limit);
    let mut tag = 0;
    for (case, times) in cases.iter().zip(&mut raw_times) {
        let trees = raw_trees(case, me);
        let mut buffers: Vec<Vec<u8>> = (0..case.outputs)
            .map(|_| vec![0; case.bytes as usize])
            .collect();
        for _ in 0..reps {
            raw.barrier(tag)?;
            times.push(raw_rep(&mut raw, case, &trees, &mut buffers, tag)?);
            tag += 1;
        }
        if let Some(j) = case
            .needs
            .iter()
            .find(|&j| buffers[j as usize][..] != case.payloads[j as usize][..])
        {
            return Err(format!("two-sided baseline: output {j} arrived corrupted"));
        }
    }
    raw.barrier(tag)?;

    let mut driver = crate::drive(raw.transport, me, n, args);
    bench.configure(&mut driver)?;
    for (from, bytes) in std::mem::take(&mut raw.early) {
        driver.deliver(from, &bytes).map_err(|e| e.to_string())?;
    }
    let mut task = 0;
    // Each repetition starts from a global validation (the previous one's closing
    // validation), the root's call prepared before it.
    let mut start = cases.first().and_then(|case| case.start(me));
    validate_once(&mut driver, limit)?;
    for (c, (case, times)) in cases.iter().zip(&mut stack_times).enumerate() {
        for rep in 0..reps {
            times.push(stack_rep(&mut driver, case, start.take(), task, limit)?);
            let next = if rep + 1 < reps {
                Some(case)
            } else {
                cases.get(c + 1)
            };
            start = next.and_then(|case| case.start(me));
            validate_once(&mut driver, limit)?;
            if rep + 1 < reps {
                release(&mut driver, case, task)?;
            }
            task += 1;
        }
        if !case.stack_delivered(&driver, task - 1) {
            return Err(format!(
                "stack: an output of {} bytes arrived corrupted",
                case.bytes
            ));
        }
        release(&mut driver, case, task - 1)?;
    }

    let mine: Vec<f64> = raw_times
        .iter()
        .chain(&stack_times)
        .flatten()
        .copied()
        .collect();
    bench.write_timeline(me)?;
    let all = gather_at_zero(&mut driver, &mine, limit)?;
    // The gather's roots serve rank 0 until it has every part.
    validate_once(&mut driver, limit)?;
    driver
        .run_for(StdDuration::from_millis(args.linger_ms))
        .map_err(|e| e.to_string())?;
    let line = match all {
        Some(all) => {
            // Per repetition, the largest time over the ranks.
            let worst: Vec<f64> = (0..mine.len())
                .map(|i| all.iter().map(|t| t[i]).fold(f64::MIN, f64::max))
                .collect();
            let (raw_worst, stack_worst) = worst.split_at(cases.len() * reps);
            cases
                .iter()
                .enumerate()
                .map(|(c, case)| {
                    let med = |t: &[f64]| median(t[c * reps..(c + 1) * reps].to_vec());
                    let (stack, base) = (med(stack_worst), med(raw_worst));
                    case.line(
                        n,
                        bench.reps,
                        stack.unwrap_or(f64::NAN),
                        "two_sided",
                        base.unwrap_or(f64::NAN),
                    )
                })
                .collect::<Vec<_>>()
                .join("\n")
        }
        None => json!({"rank": me, "bench_bcast": "took part", "cases": cases.len()}).to_string(),
    };
    Ok(Finished {
        line,
        saw_failure: crate::saw_failure(&driver),
    })
}

/// Brings every rank's `mine` (all of the same length) to rank 0 through the stack:
/// rank `k > 0` broadcasts them to rank 0 as broadcast (`k`, `GATHER`). Rank 0 gets every
/// rank's, its own first; the others get `None` (and must keep serving until rank 0
/// has them).
fn gather_at_zero<T: Transport>(
    driver: &mut RankDriver<T>,
    mine: &[f64],
    limit: StdDuration,
) -> Result<Option<Vec<Vec<f64>>>, String> {
    let (me, n) = (driver.transport().rank(), driver.transport().size());
    let bytes: Vec<u8> = mine.iter().flat_map(|t| t.to_le_bytes()).collect();
    if me != 0 {
        let spec =
            PlanSpec::new(n, me).with_output(OutputSpec::new("times", bytes.len() as u64, vec![0]));
        driver
            .command(|stack, now| {
                stack.start_broadcast(now, GATHER, Bytes::new(), spec, vec![bytes])
            })
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        return Ok(None);
    }
    driver
        .run_until("every rank's times", limit, |stack, events| {
            if let Some(stop) = events.iter().find_map(|(_, e)| stopped(e)) {
                crate::leave(&stop);
            }
            events.clear();
            let bcast = stack.broadcaster();
            let held = |k| {
                bcast
                    .and_then(|b| b.output(TaskId::new(k, GATHER), 0))
                    .is_some()
            };
            (1..n).all(held).then_some(Ok::<(), String>(()))
        })
        .map_err(|e| e.to_string())??;
    let bcast = driver
        .machine()
        .broadcaster()
        .ok_or("the gather's broadcasts left no trace")?;
    let mut all = vec![mine.to_vec()];
    for k in 1..n {
        let part = bcast
            .output(TaskId::new(k, GATHER), 0)
            .filter(|b| b.len() == bytes.len())
            .ok_or_else(|| format!("rank {k}'s times are missing or of another length"))?;
        all.push(
            part.chunks_exact(8)
                .map(|b| f64::from_le_bytes(b.try_into().unwrap()))
                .collect(),
        );
    }
    Ok(Some(all))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases_give_different_subsets_to_the_destinations() {
        assert_eq!(case_dests(8, 1, 0), [1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(case_dests(8, 4, 0), [2, 3, 4, 6, 7]);
        assert_eq!(case_dests(8, 4, 3), [1, 2, 3, 5, 6, 7]);
        let spec = case_spec(8, 1024, 4, Strategy::PerClass);
        spec.validate().unwrap();
        let plan = ft_bcast::Plan::build(spec).unwrap();
        // Ranks with the same (r - 1) mod 4 need the same outputs: four classes.
        assert_eq!(plan.stats().trees, 4);
        // Per output: one tree each; fetch-for-descendants: one merged tree.
        let trees = |strategy| {
            let plan = ft_bcast::Plan::build(case_spec(8, 1024, 4, strategy)).unwrap();
            plan.stats().trees
        };
        assert_eq!(trees(Strategy::PerOutput), 4);
        assert_eq!(trees(Strategy::FetchForDescendants), 1);
    }

    #[test]
    fn the_strategy_option_takes_every_name_and_refuses_others() {
        for strategy in Strategy::ALL {
            assert_eq!(parse_strategy(strategy.name()), Ok(strategy));
        }
        let refused = parse_strategy("star").unwrap_err();
        assert!(
            refused.contains("per-class, fetch-for-descendants, per-output"),
            "{refused}"
        );
    }

    #[test]
    fn data_frames_name_their_repetition_output_and_offset() {
        let mut frame = DATA_MAGIC.to_vec();
        frame.extend_from_slice(&7u32.to_le_bytes());
        frame.extend_from_slice(&2u16.to_le_bytes());
        frame.extend_from_slice(&3u32.to_le_bytes());
        frame.extend_from_slice(b"data");
        assert_eq!(parse_data(&frame, 7, 4), Some((2, 3 * MAX_CHUNK)));
        assert_eq!(parse_data(&frame, 8, 4), None, "another repetition");
        assert_eq!(parse_data(&frame, 7, 2), None, "an output out of range");
        assert_eq!(parse_data(&frame[..DATA_HEADER - 1], 7, 4), None);
    }

    #[test]
    fn the_root_starts_from_the_cases_plan_unless_each_repetition_plans() {
        let once = Case::new(8, 0, 1024, 4, Strategy::PerClass, false);
        let start = once.start(0).expect("rank 0 is the root");
        assert!(start.spec.is_none(), "the case's plan serves");
        assert_eq!(start.payloads.len(), 4);
        assert!(once.start(3).is_none(), "only the root starts");
        let each = Case::new(8, 0, 1024, 4, Strategy::PerClass, true);
        assert_eq!(
            each.start(0).and_then(|s| s.spec),
            Some(each.spec().clone())
        );
        assert_eq!(once.spec(), &case_spec(8, 1024, 4, Strategy::PerClass));
    }

    #[test]
    fn the_two_sided_trees_are_binomial_over_each_outputs_members() {
        let case = Case::new(8, 2, 1024, 4, Strategy::PerClass, false);
        let trees = raw_trees(&case, 2);
        // Output 1's members are 0, 1, 3, 4, 5, 7; rank 2 is not one of them.
        assert_eq!(trees[1], (None, Vec::new()));
        assert!(trees[0].0.is_some());
        assert_eq!(case.needs.iter().collect::<Vec<_>>(), [0, 2, 3]);
    }
}
