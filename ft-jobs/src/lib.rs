//! `ft-jobs`: the rank programs that every real backend runs, written once over any
//! [`ft_runtime::Transport`]. `ftmpi` (backend-mpi, started by `mpiexec`) and `ftofi`
//! (backend-ofi, its own launcher) are thin shells around them.
//!
//! - [`validate`] / [`validate_threaded`]: every rank runs `validate_global`; with
//!   kills, the survivors validate again once they know every killed rank dead
//!   ([`await_death`]), and must agree on exactly the killed set;
//! - [`broadcast`] / [`broadcast_threaded`]: a plan file's root broadcasts; every
//!   destination checks what it receives byte for byte against the root's payload;
//! - the `*_threaded` forms run the stack on `ft_runtime::Runtime`'s progress thread
//!   while the calling thread uses the blocking commands.
//!
//! Every rank that finishes returns one JSON line ([`Finished`]); the shell prints it.
//! Kills are real: every rank `--kill` lists (`--kill 2`, or a "node", `--kill
//! 4,5,6,7`) sends itself `SIGKILL` ([`die`]) at the same moment: `--kill-at-ms` after
//! the common start, or at a protocol step (`--kill-on validate`: as the first global
//! validation starts; `--kill-on activation`: as a broadcast activates it).
//!
//! Bad input never leaves a rank waiting: [`JobCommand::check`] refuses options that
//! do not apply to the job, a kill list that is not a set of the job's ranks, and a
//! plan file that is invalid, of another size or that never activates a rank to kill
//! on activation. [`JobCommand::run`] runs it before the rank connects, and a launcher
//! can run it before it starts any rank.
//!
//! [`report`] reads the lines back and checks them (agreement, exact delivery), and
//! [`conformance`] lists the fault scenarios every backend's tests run, with their
//! checks.
//!
//! A backend supplies a [`Launch`]: its rank, its size, and how to open its transport
//! once every rank has started (the common start: a barrier, a rendezvous). A
//! [`Launch`] is cloned onto the progress thread, which opens its own transport there
//! (an MPI communicator handle may not cross threads).

pub mod bench_bcast;
pub mod conformance;
pub mod latency;
pub mod mpiexec;
mod raw;
pub mod report;

use std::path::PathBuf;
use std::time::{Duration as StdDuration, Instant as WallInstant};

use backend_sim::stack::payload;
use clap::{Args, Subcommand, ValueEnum};
use ft_bcast::{BcastEvent, Bytes, OutputSet, PlanSpec, RankStack, StackEvent, TaskId};
use ft_core::detector::DetectorConfig;
use ft_core::node::NodeEvent;
use ft_core::{Duration, Instant, Rank};
use ft_runtime::{Driver, Runtime, RuntimeError, Transport};
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

/// The options every job takes. Clap refuses the combinations that cannot apply
/// (`--kill-at-ms` or `--kill-on` without `--kill`, both at once, zero periods or
/// limits); [`JobArgs::check`] and [`JobCommand::check`] refuse what needs the job's size
/// or subcommand.
#[derive(Args, Clone, Debug)]
pub struct JobArgs {
    /// Heartbeat period.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..))]
    pub period_ms: u64,
    /// Silence after which a rank's predecessor is declared dead.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout_ms: u64,
    /// Ranks to kill with SIGKILL, all at the same moment: `--kill 2` or a "node",
    /// `--kill 4,5,6,7`.
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub kill: Vec<Rank>,
    /// When the killed ranks die, after the common start.
    #[arg(
        long,
        default_value_t = 0,
        requires = "kill",
        conflicts_with = "kill_on"
    )]
    pub kill_at_ms: u64,
    /// Or: the protocol step at which each killed rank dies.
    #[arg(long, value_enum, requires = "kill")]
    pub kill_on: Option<KillStep>,
    /// How long a rank keeps serving its peers after it finished.
    #[arg(long, default_value_t = 500)]
    pub linger_ms: u64,
    /// The longest a rank waits for any one step.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub limit_s: u64,
    /// Ranks per node: the detector finds a node's block of adjacent deaths in about one
    /// timeout when its span covers the node. Default: the launcher's count of ranks on
    /// this node (Open MPI's `OMPI_COMM_WORLD_LOCAL_SIZE`, MPICH's `MPI_LOCALNRANKS`,
    /// Slurm's `SLURM_NTASKS_PER_NODE`), else the detector's default span.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub ranks_per_node: Option<u32>,
    /// Ranks to stall (`validate` without `--threaded` only): after the first validation
    /// and four periods, each stops its own process (SIGSTOP) for `--stall-ms`, as a
    /// rank descheduled that long would be; the ranks then validate again once the
    /// stall and a timeout have passed.
    #[arg(long, value_delimiter = ',', num_args = 1.., requires = "stall_ms", conflicts_with = "kill")]
    pub stall: Vec<Rank>,
    /// How long the stalled ranks stay stopped.
    #[arg(long, requires = "stall", value_parser = clap::value_parser!(u64).range(10..))]
    pub stall_ms: Option<u64>,
}

/// Where launchers say how many ranks share this node, tried in this order.
const LOCAL_SIZE_VARS: [&str; 3] = [
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "MPI_LOCALNRANKS",
    "SLURM_NTASKS_PER_NODE",
];

impl JobArgs {
    fn limit(&self) -> StdDuration {
        StdDuration::from_secs(self.limit_s)
    }

    /// The detector span: `--ranks-per-node`, else the launcher's ranks on this node,
    /// else [`ft_core::detector::DEFAULT_SPAN`]. (A Slurm count such as `4(x2)` is read
    /// up to its first non-digit.)
    pub fn span(&self) -> u32 {
        let from_launcher = || {
            LOCAL_SIZE_VARS.iter().find_map(|var| {
                let value = std::env::var(var).ok()?;
                let digits: String = value.chars().take_while(char::is_ascii_digit).collect();
                digits.parse::<u32>().ok().filter(|&k| k > 0)
            })
        };
        self.ranks_per_node
            .or_else(from_launcher)
            .unwrap_or(ft_core::detector::DEFAULT_SPAN)
    }

    /// Whether rank `me` is one of the ranks to kill.
    pub fn kills(&self, me: Rank) -> bool {
        self.kill.contains(&me)
    }

    /// Whether rank `me` is to die at protocol step `step`.
    fn dies_on(&self, me: Rank, step: KillStep) -> bool {
        self.kill_on == Some(step) && self.kills(me)
    }

    /// Checks the options against a job of `n` ranks: `--kill` and `--stall` each name
    /// distinct ranks of the job and leave one out, the kill comes within the step
    /// limit, and the heartbeat period is shorter than the timeout.
    pub fn check(&self, n: u32) -> Result<(), String> {
        check_ranks("--kill", &self.kill, n, "none would survive")?;
        if self.kill_at_ms >= self.limit_s.saturating_mul(1000) {
            return Err(format!(
                "--kill-at-ms {} is past --limit-s {}: the survivors would give up \
                 waiting for the death first",
                self.kill_at_ms, self.limit_s
            ));
        }
        check_ranks(
            "--stall",
            &self.stall,
            n,
            "none would be left to judge the stall",
        )?;
        if self.period_ms >= self.timeout_ms {
            return Err(format!(
                "--period-ms {} must be shorter than --timeout-ms {}",
                self.period_ms, self.timeout_ms
            ));
        }
        Ok(())
    }
}

/// Checks that option `flag` names distinct ranks of a job of `n` and not every one of
/// them (`all` says why that is refused).
fn check_ranks(flag: &str, ranks: &[Rank], n: u32, all: &str) -> Result<(), String> {
    if let Some(k) = ranks.iter().find(|&&k| k >= n) {
        return Err(format!("{flag} {k}: the job's ranks are 0..{n}"));
    }
    let mut seen = std::collections::BTreeSet::new();
    if let Some(k) = ranks.iter().find(|&&k| !seen.insert(k)) {
        return Err(format!("{flag} names rank {k} twice"));
    }
    if !ranks.is_empty() && seen.len() >= n as usize {
        return Err(format!("{flag} names every rank of {n}: {all}"));
    }
    Ok(())
}

/// A protocol step at which the ranks chosen by `--kill` die.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum KillStep {
    /// As soon as a broadcast activates the rank (`broadcast` only).
    Activation,
    /// When the first global validation starts, before the rank sends any of it
    /// (`validate` only).
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
        #[arg(long, conflicts_with = "kill_on")]
        threaded: bool,
    },
    /// Times, at every rank, a dissemination barrier and (ranks 0 and 1) a round trip
    /// on the bare transport, then `validate_global` through the stack, `--reps` times
    /// each, failure-free; prints the medians and how many barriers and round trips one
    /// `validate_global` costs (`ft_jobs::latency`).
    Latency {
        /// Repetitions of each operation.
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
        reps: u32,
        /// The job's options.
        #[command(flatten)]
        job: JobArgs,
    },
    /// Times the stack's broadcast (per-class binomial trees) of 1 and 4 outputs of
    /// 1 KiB to 4 MiB against a plain two-sided binomial broadcast of the same bytes
    /// over the same transport (`ftmpi`: against `MPI_Bcast`), failure-free; rank 0
    /// prints one line per case with the medians and their ratio
    /// (`ft_jobs::bench_bcast`).
    BenchBcast {
        /// What to time.
        #[command(flatten)]
        bench: bench_bcast::BenchBcastArgs,
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
            | JobCommand::Latency { job, .. }
            | JobCommand::BenchBcast { job, .. } => job,
        }
    }

    /// Whether the job runs the stack on a progress thread (the backend must allow
    /// calls from a second thread).
    pub fn threaded(&self) -> bool {
        match self {
            JobCommand::Validate { threaded, .. } | JobCommand::Broadcast { threaded, .. } => {
                *threaded
            }
            JobCommand::Latency { .. } | JobCommand::BenchBcast { .. } => false,
        }
    }

    /// Checks the whole command against a job of `n` ranks without starting it: the
    /// options ([`JobArgs::check`]), which of them apply to this job, and the plan file
    /// of a broadcast (read and validated). Every rank runs the same check before it
    /// connects, so bad input ends a job before any rank waits for another.
    pub fn check(&self, n: u32) -> Result<(), String> {
        self.prepare(n).map(drop)
    }

    /// [`JobCommand::check`]; returns the broadcast's plan.
    fn prepare(&self, n: u32) -> Result<Option<PlanSpec>, String> {
        let args = self.args();
        args.check(n)?;
        if !args.stall.is_empty() && !matches!(self, JobCommand::Validate { .. }) {
            return Err("--stall applies to the validate job".into());
        }
        if !args.stall.is_empty() && self.threaded() {
            return Err("--stall applies to the validate job without --threaded".into());
        }
        match self {
            JobCommand::Validate { job, .. } => {
                if job.kill_on == Some(KillStep::Activation) {
                    return Err("--kill-on activation needs a broadcast; \
                                validate takes --kill-on validate or --kill-at-ms"
                        .into());
                }
                Ok(None)
            }
            JobCommand::Latency { job, .. } => {
                if !job.kill.is_empty() {
                    return Err("the latency job runs failure-free; --kill does not apply".into());
                }
                if n < 2 {
                    return Err("the latency job needs at least 2 ranks (it times a round trip between ranks 0 and 1)".into());
                }
                Ok(None)
            }
            JobCommand::BenchBcast { bench, job } => bench.check(n, job).map(|()| None),
            JobCommand::Broadcast { plan, job, .. } => {
                if job.kill_on == Some(KillStep::Validate) {
                    return Err("--kill-on validate applies to the validate job; \
                                broadcast takes --kill-on activation or --kill-at-ms"
                        .into());
                }
                let spec = read_plan(plan)?;
                if spec.ranks != n {
                    return Err(format!(
                        "{}: the plan is for {} ranks, the job has {n}",
                        plan.display(),
                        spec.ranks
                    ));
                }
                if job.kill_on == Some(KillStep::Activation) {
                    let activated = |k: Rank| {
                        k != spec.root
                            && !spec.failed.contains(k)
                            && spec.outputs.iter().any(|o| o.dests.contains(&k))
                    };
                    if let Some(k) = job.kill.iter().find(|&&k| !activated(k)) {
                        return Err(format!(
                            "--kill {k} --kill-on activation: the plan never activates rank {k} \
                             (only live destinations other than the root {} are activated)",
                            spec.root
                        ));
                    }
                }
                Ok(Some(spec))
            }
        }
    }

    /// Runs the job at the rank `launch` opens, after [`JobCommand::check`] (so a rank
    /// with bad input fails before it connects).
    pub fn run<L: Launch>(&self, launch: &L) -> Result<Finished, String> {
        let spec = self.prepare(launch.size())?;
        match (self, spec) {
            (JobCommand::Validate { job, threaded }, _) if *threaded => {
                validate_threaded(launch, job)
            }
            (JobCommand::Validate { job, .. }, _) => validate(start(launch, job)?, job),
            (JobCommand::Latency { reps, job }, _) => latency::latency(launch, job, *reps),
            (JobCommand::BenchBcast { bench, job }, _) => {
                bench_bcast::bench_bcast(launch, bench, job)
            }
            (JobCommand::Broadcast { job, threaded, .. }, Some(spec)) => {
                if *threaded {
                    broadcast_threaded(launch, spec, job)
                } else {
                    broadcast(start(launch, job)?, spec, job)
                }
            }
            (JobCommand::Broadcast { .. }, None) => {
                unreachable!("prepare reads a broadcast's plan")
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
/// Checks `args` first, so a bad option fails before the rank connects.
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
        span: args.span(),
    };
    let origin = WallInstant::now();
    if args.kills(me) && args.kill_on.is_none() {
        let at = StdDuration::from_millis(args.kill_at_ms);
        std::thread::spawn(move || {
            std::thread::sleep(at.saturating_sub(origin.elapsed()));
            die();
        });
    }
    Driver::for_stack(RankStack::new(config, Instant::ZERO), transport, origin)
}

/// Stops this process (`SIGSTOP`) for `span`, as a rank descheduled that long is: a
/// child process (`sleep`, then `kill -CONT`) continues it, since nothing in a stopped
/// process runs. Returns once the process runs again.
pub fn stall_self(span: StdDuration) -> Result<(), String> {
    let me = std::process::id();
    let mut waker = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("sleep {:.3}; kill -CONT {me}", span.as_secs_f64()))
        .stdin(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start the stall's timer (sh): {e}"))?;
    // SAFETY: raising a signal has no memory-safety preconditions.
    unsafe { libc::raise(libc::SIGSTOP) };
    waker
        .wait()
        .map_err(|e| format!("the stall's timer: {e}"))?;
    Ok(())
}

/// Runs the stack for `span`, leaving as a killed rank does if it learns it was
/// declared dead meanwhile ([`leave`]).
fn run_watching<T: Transport>(driver: &mut RankDriver<T>, span: StdDuration) -> Result<(), String> {
    let until = WallInstant::now() + span;
    let limit = span + StdDuration::from_secs(1);
    driver
        .run_until("the end of the stall", limit, |_, events| {
            if let Some(stop) = events.iter().find_map(|(_, e)| stopped(e)) {
                leave(&stop);
            }
            events.clear();
            (WallInstant::now() >= until).then_some(Ok(()))
        })
        .map_err(|e| e.to_string())?
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
            // Formatted only if it times out: no String per call.
            format_args!("global validation {epoch}"),
            limit,
            |stack, events| {
                while let Some((_, event)) = events.pop_front() {
                    if let Some(stop) = stopped(&event) {
                        leave(&stop);
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

/// Runs the stack until it knows every rank of `dead` failed (or stops, or `limit`
/// passes). A rank that is itself in `dead` waits here until its kill fires.
pub fn await_death<T: Transport>(
    driver: &mut RankDriver<T>,
    dead: &[Rank],
    limit: StdDuration,
) -> Result<(), String> {
    if dead.is_empty() {
        return Ok(());
    }
    driver
        .run_until(learning_deaths(dead), limit, |stack, events| {
            if let Some(stop) = events.iter().find_map(|(_, e)| stopped(e)) {
                leave(&stop);
            }
            events.clear();
            let known = stack.node().view().known_failed();
            dead.iter()
                .all(|&rank| known.contains(rank))
                .then_some(Ok(()))
        })
        .map_err(|e| e.to_string())?
}

/// [`await_death`] on a [`Runtime`]: polls the published view (`L_i` and what is
/// pending) until it holds every rank of `dead`; fails with the reason as soon as the
/// progress thread stops (its view would never change again).
pub fn await_death_threaded(
    runtime: &Runtime,
    dead: &[Rank],
    limit: StdDuration,
) -> Result<(), String> {
    let since = WallInstant::now();
    loop {
        if let Some(e) = runtime.stopped() {
            return Err(e.to_string());
        }
        let view = runtime.view();
        if dead
            .iter()
            .all(|&rank| view.local().contains(rank) || view.pending().contains(rank))
        {
            return Ok(());
        }
        if since.elapsed() > limit {
            return Err(format!("timed out {}", learning_deaths(dead)));
        }
        std::thread::sleep(StdDuration::from_millis(5));
    }
}

/// What [`await_death`] waits for, for its timeout message.
fn learning_deaths(dead: &[Rank]) -> String {
    match dead {
        [rank] => format!("learning that rank {rank} died"),
        _ => format!("learning that ranks {dead:?} died"),
    }
}

/// Ends a rank that the others declared dead (or excluded) the way a killed rank ends,
/// by `SIGKILL`, after saying why on its standard error: its launcher then counts it
/// as a failure the job survives (`ftofi`, `ftrun`, `mpiexec --with-ft ulfm`), and the
/// survivors finish with it in `G`. A wrong declaration so costs one rank, not the job.
pub fn leave(why: &str) -> ! {
    eprintln!("{why}: leaving as a killed rank does (fail-stop)");
    die()
}

/// Milliseconds since this process started (Linux: its start time in `/proc/self/stat`
/// against the system's uptime, both in clock ticks of 10 ms), for the start-up
/// figures of the validation job; `None` where they cannot be read.
pub fn since_process_start_ms() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) may hold spaces: count fields after its ')'.
    let after = &stat[stat.rfind(')')? + 2..];
    let start_ticks: u64 = after.split_whitespace().nth(19)?.parse().ok()?;
    let uptime = std::fs::read_to_string("/proc/uptime").ok()?;
    let up_s: f64 = uptime.split_whitespace().next()?.parse().ok()?;
    // SAFETY: sysconf has no memory effects.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let per_s = u64::try_from(ticks).ok().filter(|&t| t > 0)?;
    let up_ms = (up_s * 1000.0) as u64;
    Some(up_ms.saturating_sub(start_ticks * 1000 / per_s))
}

/// Why the rank stopped, if `event` says it did.
pub fn stopped(event: &StackEvent) -> Option<String> {
    match event {
        StackEvent::Node(NodeEvent::DeclaredDeadSelf { by }) => {
            Some(format!("declared dead by rank {by} and stopped"))
        }
        StackEvent::Node(NodeEvent::SelfExcluded { epoch }) => {
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
    if args.dies_on(driver.transport().rank(), KillStep::Validate) {
        die();
    }
    let mut validations = vec![validate_once(&mut driver, limit)?];
    let first_validation_ms = since_process_start_ms();
    if let Some(stall_ms) = args.stall_ms {
        // First every watcher hears every rank it watches at least once (heartbeats go
        // every period, on the long edge every other one), so a stall is judged by the
        // steady timeout and not by the start-up grace of a rank never heard from.
        run_watching(&mut driver, StdDuration::from_millis(4 * args.period_ms))?;
        // The stalled ranks stop; everyone validates again once the stall and a
        // detector timeout (plus two periods, for the last heartbeat and the notice)
        // have passed, so the last G is exactly the ranks declared during the stall.
        let stall = StdDuration::from_millis(stall_ms);
        if args.stall.contains(&driver.transport().rank()) {
            stall_self(stall)?;
        }
        let settle = stall + StdDuration::from_millis(args.timeout_ms + 2 * args.period_ms);
        run_watching(&mut driver, settle)?;
        validations.push(validate_once(&mut driver, limit)?);
    }
    if !args.kill.is_empty() {
        // Everyone validates again once it knows every killed rank dead, so the last G
        // is the killed set. (A killed rank waits here until its kill timer fires.)
        await_death(&mut driver, &args.kill, limit)?;
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
        "first_validation_ms": first_validation_ms,
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
    if args.dies_on(me, KillStep::Validate) {
        die();
    }
    let global = |runtime: &Runtime| {
        runtime
            .validate_global()
            .map(|v| (v.epoch, v.agreed))
            .map_err(|e| e.to_string())
    };
    let mut validations = vec![global(&runtime)?];
    if !args.kill.is_empty() {
        await_death_threaded(&runtime, &args.kill, limit)?;
        validations.push(global(&runtime)?);
    }
    let local: Vec<Rank> = runtime.view().local().iter().collect();
    let saw_failure = !local.is_empty() || !runtime.view().pending().is_empty();
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
    Runtime::spawn(move || start(&launch, &args).map(Driver::into_groups))
        .map_err(|e| e.to_string())
}

/// The key of the one broadcast every broadcast job runs.
const TASK: u32 = 0;

/// What one rank of a broadcast job needs, and how to name and check it.
struct BroadcastJob {
    /// The job's broadcast: key [`TASK`] of the spec's root.
    task: TaskId,
    names: Vec<String>,
    sizes: Vec<u64>,
    needs: OutputSet,
}

impl BroadcastJob {
    fn new(spec: &PlanSpec, me: Rank) -> Self {
        BroadcastJob {
            task: TaskId::new(spec.root, TASK.into()),
            names: spec.outputs.iter().map(|o| o.name.to_string()).collect(),
            sizes: spec.outputs.iter().map(|o| o.bytes).collect(),
            needs: (0..spec.outputs.len() as u32)
                .filter(|&j| me != spec.root && spec.outputs[j as usize].dests.contains(&me))
                .collect(),
        }
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
    let me = driver.transport().rank();
    let job = BroadcastJob::new(&spec, me);
    if me == spec.root {
        let payloads = job.payloads();
        driver
            .command(|stack, now| {
                stack.start_broadcast(now, TASK.into(), Bytes::new(), spec, payloads)
            })
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
    }
    let kill_on_activation = args.dies_on(me, KillStep::Activation);
    let mut received = OutputSet::new();
    let mut abandoned = false;
    let outcome = driver.run_until("the outputs this rank needs", limit, |stack, events| {
        if kill_on_activation && stack.broadcaster().is_some() {
            die();
        }
        while let Some((_, event)) = events.pop_front() {
            if let Some(stop) = stopped(&event) {
                leave(&stop);
            }
            match event {
                StackEvent::Bcast(BcastEvent::Released { task, outputs, .. })
                    if task == job.task =>
                {
                    received.union_with(&outputs);
                }
                StackEvent::Bcast(BcastEvent::Abandoned { task }) if task == job.task => {
                    abandoned = true;
                }
                _ => {}
            }
        }
        // The rank to kill waits for its activation; the others for their outputs (a
        // rank that needs none goes on at once, and serves its subtree while it lingers).
        let finished = !kill_on_activation && (job.needs.is_subset(&received) || abandoned);
        finished.then_some(Ok::<(), String>(()))
    });
    outcome.map_err(|e| e.to_string())??;
    // The root and inner ranks must stay until every survivor is served (repairs need
    // them): they wait until every killed rank is dead (a killed rank below a killed
    // parent is activated only after a repair), then a global validation is the
    // fault-tolerant barrier, and its G is the killed set.
    await_death(&mut driver, &args.kill, limit)?;
    let (_, g) = validate_once(&mut driver, limit)?;
    driver
        .run_for(StdDuration::from_millis(args.linger_ms))
        .map_err(|e| e.to_string())?;
    let bcast = driver.machine().broadcaster();
    let verified = received.iter().all(|j| {
        bcast
            .and_then(|b| b.output(job.task, j))
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
    let limit = args.limit();
    let me = launch.rank();
    let job = BroadcastJob::new(&spec, me);
    let runtime = spawn(launch, args)?;
    if me == spec.root {
        runtime
            .start_broadcast(TASK.into(), spec, job.payloads())
            .map_err(|e| e.to_string())?;
    }
    let (data, abandoned) = if job.needs.is_empty() {
        (Vec::new(), false)
    } else {
        match runtime.wait_outputs(job.task, job.needs.clone(), Some(limit)) {
            Ok(data) => (data, false),
            // The root died: no live ancestor is left (as the single-threaded loop's
            // `abandoned`).
            Err(RuntimeError::Abandoned { .. }) => (Vec::new(), true),
            Err(e) => return Err(e.to_string()),
        }
    };
    let verified =
        data.len() == job.needs.len() && data.iter().all(|(j, bytes)| job.is_intact(*j, bytes));
    await_death_threaded(&runtime, &args.kill, limit)?;
    let counts = runtime.validate_local().map_err(|e| e.to_string())?;
    let g = runtime.validate_global().map_err(|e| e.to_string())?.agreed;
    let saw_failure = !g.is_empty() || counts.failed > 0;
    runtime
        .shutdown(StdDuration::from_millis(args.linger_ms))
        .map_err(|e| e.to_string())?;
    let line = json!({
        "rank": me,
        "needs": job.named(job.needs.iter()),
        "received": job.named(data.iter().map(|(j, _)| *j)),
        "verified": verified,
        "abandoned": abandoned,
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
    // What the broadcaster did with the payload bytes it received: kept where the
    // transport received them into the output's buffer, and copied to join outputs.
    let bcast = driver.machine().bcast_stats();
    stats.insert(
        "bcast_bytes_landed".into(),
        bcast.received_bytes_landed.into(),
    );
    stats.insert("bcast_bytes_joined".into(), bcast.joined_bytes.into());
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

/// Reads a plan file (DESIGN.md's contract) and validates the broadcast it describes
/// (names, destinations, root), so every rank refuses a bad plan before it connects.
pub fn read_plan(path: &std::path::Path) -> Result<PlanSpec, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let spec =
        backend_sim::plan_file::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    spec.validate()
        .map_err(|e| format!("{}: invalid plan: {e}", path.display()))?;
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(subcommand)]
        job: JobCommand,
    }

    fn parse(args: &str) -> Result<JobCommand, String> {
        Cli::try_parse_from(std::iter::once("ft").chain(args.split_whitespace()))
            .map(|cli| cli.job)
            .map_err(|e| e.to_string())
    }

    /// Parses and checks `args` for `n` ranks; the error as a user sees it.
    fn checked(args: &str, n: u32) -> Result<JobCommand, String> {
        let job = parse(args)?;
        job.check(n)?;
        Ok(job)
    }

    fn refused(args: &str, n: u32, why: &str) {
        match checked(args, n) {
            Ok(job) => panic!("{args:?} accepted: {job:?}"),
            Err(e) => assert!(e.contains(why), "{args:?}: {e}"),
        }
    }

    #[test]
    fn kill_takes_one_rank_or_a_list() {
        assert_eq!(checked("validate --kill 2", 5).unwrap().args().kill, [2]);
        let node = checked("validate --kill 4,5,6,7 --kill-on validate", 8).unwrap();
        assert_eq!(node.args().kill, [4, 5, 6, 7]);
        assert!(node.args().kills(6) && !node.args().kills(3));
        refused("validate --kill 4,5,4", 8, "--kill names rank 4 twice");
        refused(
            "validate --kill 4,8",
            8,
            "--kill 8: the job's ranks are 0..8",
        );
    }

    #[test]
    fn the_detector_span_is_the_ranks_per_node() {
        let job = checked("validate --ranks-per-node 16", 64).unwrap();
        assert_eq!(job.args().span(), 16);
        refused("validate --ranks-per-node 0", 64, "0 is not in 1..");
    }

    #[test]
    fn options_that_do_not_apply_are_refused() {
        // The backends' tests run conformance::BAD_INPUTS through the real launchers;
        // here they and a few more are parsed and checked in place (paths are relative
        // to the workspace root).
        std::env::set_current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).unwrap();
        for bad in conformance::BAD_INPUTS {
            refused(&bad.args.join(" "), bad.ranks, bad.message);
        }
        let more: [(&str, u32, &str); 7] = [
            ("validate --kill-at-ms 5", 4, "--kill"),
            ("latency", 1, "at least 2 ranks"),
            ("validate --period-ms 0", 4, "--period-ms"),
            ("validate --limit-s 0", 4, "--limit-s"),
            (
                "validate --period-ms 500 --timeout-ms 500",
                4,
                "shorter than",
            ),
            (
                "validate --kill 1 --kill-at-ms 5000 --limit-s 5",
                4,
                "past --limit-s 5",
            ),
            ("validate --kill 0,1", 2, "none would survive"),
        ];
        for (args, n, why) in more {
            refused(args, n, why);
        }
    }

    #[test]
    fn broadcast_plans_are_checked_before_any_rank_connects() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
        let plan = |name: &str| format!("{root}/plans/{name}");
        assert!(checked(&format!("broadcast {}", plan("mpi-8.json")), 8).is_ok());
        refused(
            &format!("broadcast {}", plan("mpi-8.json")),
            4,
            "the plan is for 8 ranks, the job has 4",
        );
        refused(
            "broadcast /no/such/plan.json",
            4,
            "cannot read /no/such/plan.json",
        );
        let dir = std::env::temp_dir().join(format!("ft-jobs-plan-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let partial = dir.join("partial.json");
        std::fs::write(
            &partial,
            r#"{"ranks": 4, "root": 0, "outputs": [{"name": "A", "bytes": 10, "dests": [1, 2]}]}"#,
        )
        .unwrap();
        let on_activation = |rank: u32| {
            format!(
                "broadcast {} --kill {rank} --kill-on activation",
                partial.display()
            )
        };
        assert!(checked(&on_activation(2), 4).is_ok());
        // The root and a rank that needs nothing are never activated.
        refused(&on_activation(0), 4, "never activates rank 0");
        refused(&on_activation(3), 4, "never activates rank 3");
        let duplicate = dir.join("duplicate.json");
        std::fs::write(
            &duplicate,
            r#"{"ranks": 4, "root": 0, "outputs": [
                {"name": "A", "bytes": 10, "dests": [1, 2]},
                {"name": "A", "bytes": 10, "dests": [3]}]}"#,
        )
        .unwrap();
        refused(
            &format!("broadcast {}", duplicate.display()),
            4,
            "invalid plan: two outputs are named \"A\"",
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
