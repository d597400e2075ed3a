//! `ft-jobs`: the rank programs that every real backend runs, written once over any
//! [`ft_runtime::Transport`]. `ftmpi` (backend-mpi, started by `mpiexec`) and `ftofi`
//! (backend-ofi, its own launcher) are thin shells around them.
//!
//! - [`validate`] / [`validate_threaded`]: every rank runs `validate_global`; with a
//!   kill, the survivors validate again once they know the dead rank, and must agree on
//!   it;
//! - [`broadcast`] / [`broadcast_threaded`]: a plan file's root broadcasts; every
//!   destination checks what it receives byte for byte against the root's payload;
//! - the `*_threaded` forms run the stack on `ft_runtime::Runtime`'s progress thread
//!   while the calling thread uses the blocking commands.
//!
//! Every rank that finishes returns one JSON line ([`Finished`]); the shell prints it.
//! Kills are real: the chosen rank sends itself `SIGKILL` ([`die`]), either
//! `--kill-at-ms` after the common start or at a protocol step (`--kill-on`).
//!
//! [`report`] reads the lines back and checks them (agreement, exact delivery), and
//! [`conformance`] lists the fault scenarios every backend's tests run, with their
//! checks.
//!
//! A backend supplies a [`Launch`]: its rank, its size, and how to open its transport
//! once every rank has started (the common start: a barrier, a rendezvous). A
//! [`Launch`] is cloned onto the progress thread, which opens its own transport there
//! (an MPI communicator handle may not cross threads).

pub mod conformance;
pub mod latency;
pub mod report;

use std::path::PathBuf;
use std::time::{Duration as StdDuration, Instant as WallInstant};

use backend_sim::stack::payload;
use clap::{Args, Subcommand, ValueEnum};
use ft_bcast::{BcastEvent, OutputSet, PlanSpec, RankStack, StackEvent};
use ft_core::detector::DetectorConfig;
use ft_core::node::NodeEvent;
use ft_core::{Duration, Instant, Rank};
use ft_runtime::{Driver, Runtime, Transport};
use serde_json::{json, Map, Value};

/// A backend's transport, as the jobs report it.
pub trait JobTransport: Transport {
    /// Counters for the JSON line's `stats` (frames sent and received, drops, ...).
    fn counters(&self) -> Vec<(&'static str, u64)>;
    /// Whether the transport itself saw a peer fail (a dropped frame to a dead peer, a
    /// failure report of the network).
    fn saw_failure(&self) -> bool;
}

/// How a backend starts a rank of a job.
pub trait Launch: Clone + Send + 'static {
    /// The backend's transport.
    type Transport: JobTransport;
    /// This rank.
    fn rank(&self) -> Rank;
    /// The job's size.
    fn size(&self) -> u32;
    /// Opens the transport; returns once every rank has reached the same point (the
    /// common start the kill timer counts from).
    fn connect(&self) -> Result<Self::Transport, String>;
}

/// The options every job takes.
#[derive(Args, Clone, Debug)]
pub struct JobArgs {
    /// Heartbeat period.
    #[arg(long, default_value_t = 50)]
    pub period_ms: u64,
    /// Silence after which a rank's predecessor is declared dead.
    #[arg(long, default_value_t = 1000)]
    pub timeout_ms: u64,
    /// A rank to kill with SIGKILL.
    #[arg(long)]
    pub kill: Option<Rank>,
    /// When the killed rank dies, after the common start.
    #[arg(long, default_value_t = 0)]
    pub kill_at_ms: u64,
    /// Or: the protocol step at which the killed rank dies.
    #[arg(long, value_enum)]
    pub kill_on: Option<KillStep>,
    /// How long a rank keeps serving its peers after it finished.
    #[arg(long, default_value_t = 500)]
    pub linger_ms: u64,
    /// The longest a rank waits for any one step.
    #[arg(long, default_value_t = 60)]
    pub limit_s: u64,
}

impl JobArgs {
    fn limit(&self) -> StdDuration {
        StdDuration::from_secs(self.limit_s)
    }

    /// Checks the options against a job of `n` ranks (`--kill` must name one of them).
    pub fn check(&self, n: u32) -> Result<(), String> {
        match self.kill {
            Some(k) if k >= n => Err(format!("--kill names a rank outside 0..{n}")),
            _ => Ok(()),
        }
    }
}

/// A protocol step at which the rank chosen by `--kill` dies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum KillStep {
    /// As soon as a broadcast activates the rank.
    Activation,
    /// When the first global validation starts, before the rank sends any of it.
    Validate,
}

/// The jobs, as subcommands of a backend's CLI (`ftmpi`, `ftofi`).
#[derive(Subcommand, Clone, Debug)]
pub enum JobCommand {
    /// Every rank runs `validate_global`; with a kill, the survivors validate again
    /// once they know the dead rank, and must agree on it.
    Validate {
        /// The job's options.
        #[command(flatten)]
        job: JobArgs,
        /// Drive the stack on a progress thread (`ft_runtime::Runtime`) while the main
        /// thread calls the blocking commands and watches the published view.
        #[arg(long)]
        threaded: bool,
    },
    /// The plan file's root broadcasts; every destination checks what it receives
    /// byte for byte.
    Broadcast {
        /// A plan file (DESIGN.md's contract; `ranks` must be the job's size).
        plan: PathBuf,
        /// The job's options.
        #[command(flatten)]
        job: JobArgs,
        /// Drive the stack on a progress thread (`ft_runtime::Runtime`): the main thread
        /// starts the broadcast and blocks in `wait_outputs` (no `--kill-on`).
        #[arg(long)]
        threaded: bool,
    },
    /// Times, at every rank, a dissemination barrier and (ranks 0 and 1) a round trip
    /// on the bare transport, then `validate_global` through the stack, `--reps` times
    /// each, failure-free; prints the medians and how many barriers and round trips one
    /// `validate_global` costs (`ft_jobs::latency`).
    Latency {
        /// Repetitions of each operation.
        #[arg(long, default_value_t = 100)]
        reps: u32,
        /// The job's options.
        #[command(flatten)]
        job: JobArgs,
    },
}

impl JobCommand {
    /// The options of the job.
    pub fn args(&self) -> &JobArgs {
        match self {
            JobCommand::Validate { job, .. }
            | JobCommand::Broadcast { job, .. }
            | JobCommand::Latency { job, .. } => job,
        }
    }

    /// Whether the job runs the stack on a progress thread (the backend must allow
    /// calls from a second thread).
    pub fn threaded(&self) -> bool {
        match self {
            JobCommand::Validate { threaded, .. } | JobCommand::Broadcast { threaded, .. } => {
                *threaded
            }
            JobCommand::Latency { .. } => false,
        }
    }

    /// Runs the job at the rank `launch` opens.
    pub fn run<L: Launch>(&self, launch: &L) -> Result<Finished, String> {
        match self {
            JobCommand::Validate { job, threaded } if *threaded => validate_threaded(launch, job),
            JobCommand::Validate { job, .. } => validate(start(launch, job)?, job),
            JobCommand::Latency { reps, job } => latency::latency(launch, job, *reps),
            JobCommand::Broadcast {
                plan,
                job,
                threaded,
            } => {
                let spec = read_plan(plan)?;
                if *threaded {
                    broadcast_threaded(launch, spec, job)
                } else {
                    broadcast(start(launch, job)?, spec, job)
                }
            }
        }
    }
}

/// What a rank prints, and whether it saw a rank fail.
#[derive(Clone, Debug)]
pub struct Finished {
    /// One JSON object.
    pub line: String,
    /// Whether this rank knows of a failure (some MPIs cannot finalize after one).
    pub saw_failure: bool,
}

/// The stack of one rank over its transport, on the wall clock.
pub type RankDriver<T> = Driver<RankStack, T>;

/// Opens the rank's transport (`launch.connect()`, the common start) and puts its
/// stack on it, with the kill timer armed if this rank is to die at a time.
pub fn start<L: Launch>(launch: &L, args: &JobArgs) -> Result<RankDriver<L::Transport>, String> {
    let n = launch.size();
    args.check(n)?;
    let transport = launch.connect()?;
    Ok(drive(transport, launch.rank(), n, args))
}

/// Puts rank `me`'s stack (of `n` ranks) on an open transport, its clock starting now,
/// with the kill timer armed if this rank is to die at a time.
pub fn drive<T: Transport>(transport: T, me: Rank, n: u32, args: &JobArgs) -> RankDriver<T> {
    let period = Duration::from_millis(args.period_ms);
    let config = DetectorConfig {
        comm: 0,
        n,
        me,
        period,
        timeout: Duration::from_millis(args.timeout_ms),
        // Heartbeats spread over the period.
        phase: Duration::from_nanos(period.as_nanos() * u64::from(me) / u64::from(n)),
        span: ft_core::detector::DEFAULT_SPAN,
    };
    let origin = WallInstant::now();
    if args.kill == Some(me) && args.kill_on.is_none() {
        let at = StdDuration::from_millis(args.kill_at_ms);
        std::thread::spawn(move || {
            std::thread::sleep(at.saturating_sub(origin.elapsed()));
            die();
        });
    }
    Driver::new(RankStack::new(config, Instant::ZERO), transport, origin)
}

/// Ends this process the way a crashed node does: `SIGKILL`, no clean-up, no goodbye
/// to any peer.
pub fn die() -> ! {
    // SAFETY: raising a signal has no memory-safety preconditions.
    unsafe { libc::raise(libc::SIGKILL) };
    unreachable!("SIGKILL cannot be caught")
}

/// Runs one global validation to its end; returns its epoch and `G`.
pub fn validate_once<T: Transport>(
    driver: &mut RankDriver<T>,
    limit: StdDuration,
) -> Result<(u32, Vec<Rank>), String> {
    let epoch = driver
        .command(|stack, now| stack.validate_global(now))
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    driver
        .run_until(
            &format!("global validation {epoch}"),
            limit,
            |stack, events| {
                while let Some((_, event)) = events.pop_front() {
                    if let Some(stop) = stopped(&event) {
                        return Some(Err(stop));
                    }
                    if let StackEvent::Node(NodeEvent::GlobalValidated { epoch: e, .. }) = event {
                        if e == epoch {
                            let g = stack.node().view().global().iter().collect();
                            return Some(Ok((epoch, g)));
                        }
                    }
                }
                None
            },
        )
        .map_err(|e| e.to_string())?
}

/// Runs the stack until it knows rank `dead` failed (or stops, or `limit` passes).
pub fn await_death<T: Transport>(
    driver: &mut RankDriver<T>,
    dead: Rank,
    limit: StdDuration,
) -> Result<(), String> {
    driver
        .run_until(
            &format!("learning that rank {dead} died"),
            limit,
            |stack, events| {
                if let Some(stop) = events.iter().find_map(|(_, e)| stopped(e)) {
                    return Some(Err(stop));
                }
                events.clear();
                stack
                    .node()
                    .view()
                    .known_failed()
                    .contains(dead)
                    .then_some(Ok(()))
            },
        )
        .map_err(|e| e.to_string())?
}

/// Why the rank stopped, if `event` says it did.
fn stopped(event: &StackEvent) -> Option<String> {
    match event {
        StackEvent::Node(NodeEvent::DeclaredDeadSelf { by }) => {
            Some(format!("declared dead by rank {by} and stopped"))
        }
        StackEvent::Node(NodeEvent::ExcludedSelf { epoch }) => {
            Some(format!("excluded by global validation {epoch} and stopped"))
        }
        _ => None,
    }
}

/// The validation job: prints
/// `{"rank", "n", "validations": [{"epoch", "G"}...], "L", "stats": {...}}`.
pub fn validate<T: JobTransport>(
    mut driver: RankDriver<T>,
    args: &JobArgs,
) -> Result<Finished, String> {
    let limit = args.limit();
    if args.kill == Some(driver.transport().rank()) && args.kill_on == Some(KillStep::Validate) {
        die();
    }
    let mut validations = vec![validate_once(&mut driver, limit)?];
    if let Some(dead) = args.kill {
        // Everyone validates again once it knows the dead rank, so the last G holds it.
        // (The killed rank waits here until its kill timer fires.)
        await_death(&mut driver, dead, limit)?;
        validations.push(validate_once(&mut driver, limit)?);
    }
    driver
        .run_for(StdDuration::from_millis(args.linger_ms))
        .map_err(|e| e.to_string())?;
    let view = driver.machine().node().view();
    let line = json!({
        "rank": driver.transport().rank(),
        "n": driver.transport().size(),
        "validations": validations
            .iter()
            .map(|(epoch, g)| json!({"epoch": epoch, "G": g}))
            .collect::<Vec<_>>(),
        "L": view.local().iter().collect::<Vec<_>>(),
        "stats": stats(&driver),
    })
    .to_string();
    Ok(Finished {
        line,
        saw_failure: saw_failure(&driver),
    })
}

/// Whether this rank knows a rank failed, or its transport saw one.
pub fn saw_failure<T: JobTransport>(driver: &RankDriver<T>) -> bool {
    !driver.machine().node().view().known_failed().is_empty() || driver.transport().saw_failure()
}

/// The flow of [`validate`] on a [`Runtime`]: the progress thread drives the stack,
/// this thread blocks in `validate_global` and polls the published view to learn of
/// the death. Prints the same line, without transport counters.
pub fn validate_threaded<L: Launch>(launch: &L, args: &JobArgs) -> Result<Finished, String> {
    let limit = args.limit();
    let (me, n) = (launch.rank(), launch.size());
    let runtime = spawn(launch, args)?;
    if args.kill == Some(me) && args.kill_on == Some(KillStep::Validate) {
        die();
    }
    let mut validations = vec![runtime.validate_global().map_err(|e| e.to_string())?];
    if let Some(dead) = args.kill {
        let since = WallInstant::now();
        loop {
            let view = runtime.view();
            if view.local.contains(dead) || view.pending.contains(dead) {
                break;
            }
            if since.elapsed() > limit {
                return Err(format!("timed out waiting to learn that rank {dead} died"));
            }
            std::thread::sleep(StdDuration::from_millis(5));
        }
        validations.push(runtime.validate_global().map_err(|e| e.to_string())?);
    }
    let local: Vec<Rank> = runtime.view().local.iter().collect();
    let saw_failure = !local.is_empty() || !runtime.view().pending.is_empty();
    runtime
        .shutdown(StdDuration::from_millis(args.linger_ms))
        .map_err(|e| e.to_string())?;
    let line = json!({
        "rank": me,
        "n": n,
        "validations": validations
            .iter()
            .map(|(epoch, g)| json!({"epoch": epoch, "G": g.iter().collect::<Vec<_>>()}))
            .collect::<Vec<_>>(),
        "L": local,
        "threaded": true,
    })
    .to_string();
    Ok(Finished { line, saw_failure })
}

/// The stack on a progress thread that opens its own transport.
fn spawn<L: Launch>(launch: &L, args: &JobArgs) -> Result<Runtime, String> {
    let (launch, args) = (launch.clone(), args.clone());
    Runtime::spawn(move || start(&launch, &args)).map_err(|e| e.to_string())
}

/// The one task every broadcast job runs.
const TASK: u32 = 0;

/// What one rank of a broadcast job needs, and how to name and check it.
struct BroadcastJob {
    names: Vec<String>,
    sizes: Vec<u64>,
    needs: OutputSet,
}

impl BroadcastJob {
    fn new(spec: &PlanSpec, me: Rank, n: u32) -> Result<Self, String> {
        if spec.ranks != n {
            return Err(format!(
                "the plan is for {} ranks, the job has {n}",
                spec.ranks
            ));
        }
        Ok(BroadcastJob {
            names: spec.outputs.iter().map(|o| o.name.clone()).collect(),
            sizes: spec.outputs.iter().map(|o| o.bytes).collect(),
            needs: (0..spec.outputs.len() as u32)
                .filter(|&j| me != spec.root && spec.outputs[j as usize].dests.contains(&me))
                .collect(),
        })
    }

    /// The root's payloads, one per output.
    fn payloads(&self) -> Vec<Vec<u8>> {
        (0..self.sizes.len())
            .map(|j| payload(TASK, j as u32, self.sizes[j]))
            .collect()
    }

    /// Whether `bytes` is output `j` as the root sent it.
    fn is_intact(&self, j: u32, bytes: &[u8]) -> bool {
        self.sizes
            .get(j as usize)
            .is_some_and(|&size| bytes == payload(TASK, j, size).as_slice())
    }

    fn named(&self, outputs: impl Iterator<Item = u32>) -> Vec<String> {
        outputs.map(|j| self.names[j as usize].clone()).collect()
    }
}

/// The broadcast job: prints `{"rank", "needs": [names], "received": [names],
/// "verified": bool, "abandoned": bool, "G", "stats": {...}}`; `received` lists the
/// outputs released at this rank, `verified` says each is byte-identical to the root's,
/// and `G` is the agreed failed set of the closing global validation.
pub fn broadcast<T: JobTransport>(
    mut driver: RankDriver<T>,
    spec: PlanSpec,
    args: &JobArgs,
) -> Result<Finished, String> {
    let limit = args.limit();
    let (me, n) = (driver.transport().rank(), driver.transport().size());
    let job = BroadcastJob::new(&spec, me, n)?;
    if me == spec.root {
        let payloads = job.payloads();
        driver
            .command(|stack, now| stack.start_broadcast(now, TASK, spec, payloads))
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
    }
    let kill_on_activation = args.kill == Some(me) && args.kill_on.is_some();
    let mut received = OutputSet::new();
    let mut abandoned = false;
    let outcome = driver.run_until("the outputs this rank needs", limit, |stack, events| {
        if kill_on_activation && stack.broadcaster().is_some() {
            die();
        }
        while let Some((_, event)) = events.pop_front() {
            if let Some(stop) = stopped(&event) {
                return Some(Err(stop));
            }
            match event {
                StackEvent::Bcast(BcastEvent::Released {
                    task: TASK,
                    outputs,
                    ..
                }) => {
                    received.union_with(&outputs);
                }
                StackEvent::Bcast(BcastEvent::Abandoned { task: TASK }) => abandoned = true,
                _ => {}
            }
        }
        // The rank to kill waits for its activation; the others for their outputs (a
        // rank that needs none goes on at once, and serves its subtree while it lingers).
        let finished = !kill_on_activation && (job.needs.is_subset(&received) || abandoned);
        finished.then_some(Ok(()))
    });
    outcome.map_err(|e| e.to_string())??;
    // The root and inner ranks must stay until every survivor is served (repairs need
    // them): a global validation is the fault-tolerant barrier.
    let (_, g) = validate_once(&mut driver, limit)?;
    driver
        .run_for(StdDuration::from_millis(args.linger_ms))
        .map_err(|e| e.to_string())?;
    let bcast = driver.machine().broadcaster();
    let verified = received.iter().all(|j| {
        bcast
            .and_then(|b| b.output(TASK, j))
            .is_some_and(|bytes| job.is_intact(j, bytes))
    });
    let line = json!({
        "rank": me,
        "needs": job.named(job.needs.iter()),
        "received": job.named(received.iter()),
        "verified": verified,
        "abandoned": abandoned,
        "G": g,
        "stats": stats(&driver),
    })
    .to_string();
    Ok(Finished {
        line,
        saw_failure: saw_failure(&driver),
    })
}

/// The flow of [`broadcast`] through a [`Runtime`] (`start_broadcast`, `wait_outputs`,
/// then `validate_local` and `validate_global` as the closing barrier). Prints the same
/// line, with `"threaded": true` and the counts of `validate_local` instead of
/// transport counters.
pub fn broadcast_threaded<L: Launch>(
    launch: &L,
    spec: PlanSpec,
    args: &JobArgs,
) -> Result<Finished, String> {
    if args.kill_on.is_some() {
        return Err("--kill-on needs the single-threaded loop; use --kill-at-ms".into());
    }
    let me = launch.rank();
    let job = BroadcastJob::new(&spec, me, launch.size())?;
    let runtime = spawn(launch, args)?;
    if me == spec.root {
        runtime
            .start_broadcast(TASK, spec, job.payloads())
            .map_err(|e| e.to_string())?;
    }
    let data = if job.needs.is_empty() {
        Vec::new()
    } else {
        runtime
            .wait_outputs(TASK, job.needs.clone())
            .map_err(|e| e.to_string())?
    };
    let verified =
        data.len() == job.needs.len() && data.iter().all(|(j, bytes)| job.is_intact(*j, bytes));
    let counts = runtime.validate_local().map_err(|e| e.to_string())?;
    let (_, g) = runtime.validate_global().map_err(|e| e.to_string())?;
    let saw_failure = !g.is_empty() || counts.failed > 0;
    runtime
        .shutdown(StdDuration::from_millis(args.linger_ms))
        .map_err(|e| e.to_string())?;
    let line = json!({
        "rank": me,
        "needs": job.named(job.needs.iter()),
        "received": job.named(data.iter().map(|(j, _)| *j)),
        "verified": verified,
        "abandoned": false,
        "G": g.iter().collect::<Vec<_>>(),
        "validate_local": {"num_failed": counts.failed, "num_new": counts.new},
        "threaded": true,
    })
    .to_string();
    Ok(Finished { line, saw_failure })
}

/// The `stats` object: the transport's counters, the driver's rejected frames, and the
/// time since the common start.
pub fn stats<T: JobTransport>(driver: &RankDriver<T>) -> Value {
    let mut stats: Map<String, Value> = driver
        .transport()
        .counters()
        .into_iter()
        .map(|(name, count)| (name.to_string(), count.into()))
        .collect();
    stats.insert("rejected".into(), driver.stats().rejected.into());
    stats.insert(
        "elapsed_ms".into(),
        (driver.now().as_nanos() / 1_000_000).into(),
    );
    Value::Object(stats)
}

/// The median of `times` (`None` if empty).
pub fn median(mut times: Vec<f64>) -> Option<f64> {
    times.sort_by(f64::total_cmp);
    times.get(times.len() / 2).copied()
}

/// Reads and checks a plan file (DESIGN.md's contract).
pub fn read_plan(path: &std::path::Path) -> Result<PlanSpec, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    backend_sim::plan_file::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
}
