//! `ftmpi`: the whole per-rank stack (`ft_bcast::RankStack`) over real MPI, one process
//! per rank, started by `mpiexec`.
//!
//! ```sh
//! mpiexec -n 4 --with-ft ulfm ftmpi validate --kill 2 --kill-at-ms 5
//! mpiexec -n 8 --with-ft ulfm ftmpi broadcast plans/mpi-8.json --kill 1 --kill-on activation
//! ```
//!
//! Every surviving rank prints one JSON line on stdout (see [`validate`] and
//! [`broadcast`]); the process exits with status 1 if the rank could not finish (a
//! timeout, an MPI error, or the rank was declared dead and stopped).
//!
//! Kills are real: the chosen rank sends itself `SIGKILL`, either `--kill-at-ms` after
//! the common start (a barrier) or, with `--kill-on activation`, as soon as it is
//! activated by a broadcast (before it forwards anything), so its subtree must be
//! repaired.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration as StdDuration, Instant as WallInstant};

use backend_mpi::MpiTransport;
use backend_sim::plan_file;
use backend_sim::stack::payload;
use clap::{Args, Parser, Subcommand, ValueEnum};
use ft_bcast::{BcastEvent, OutputSet, PlanSpec, RankStack, StackEvent};
use ft_core::detector::DetectorConfig;
use ft_core::node::NodeEvent;
use ft_core::{Duration, Instant, Rank};
use ft_runtime::{Driver, Runtime, Transport};
use mpi::collective::CommunicatorCollectives;
use mpi::environment::Threading;
use mpi::topology::{Communicator, SimpleCommunicator};
use serde_json::{json, Value};

#[derive(Parser)]
#[command(
    version,
    about = "Failure views and broadcasts over real MPI, one process per rank"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Every rank runs `validate_global`; with a kill, the survivors validate again
    /// once they know the dead rank, and must agree on it.
    Validate {
        #[command(flatten)]
        common: Common,
        /// Drive the stack on a progress thread (`ft_runtime::Runtime`) while the main
        /// thread calls the blocking commands and watches the published view.
        #[arg(long)]
        threaded: bool,
    },
    /// Times, at every rank, `MPI_Barrier`, ULFM's `MPIX_Comm_agree` and this library's
    /// `validate_global`, all failure-free and interleaved, `--reps` times each; prints
    /// the medians and their ratios to `MPIX_Comm_agree`.
    Bench {
        /// Repetitions of each operation.
        #[arg(long, default_value_t = 100)]
        reps: u32,
        /// The driver's idle sleep in microseconds (0: always spin, as MPI's own
        /// progress loop does).
        #[arg(long, default_value_t = 200)]
        idle_us: u64,
        /// How long after its last frame the driver spins before it sleeps, in
        /// microseconds.
        #[arg(long, default_value_t = 500)]
        spin_us: u64,
        #[command(flatten)]
        common: Common,
    },
    /// The plan file's root broadcasts; every destination checks what it receives
    /// byte for byte.
    Broadcast {
        /// A plan file (DESIGN.md's contract; `ranks` must be the job's size).
        plan: PathBuf,
        #[command(flatten)]
        common: Common,
        /// Drive the stack on a progress thread (`ft_runtime::Runtime`): the main thread
        /// starts the broadcast and blocks in `wait_outputs` (no `--kill-on`).
        #[arg(long)]
        threaded: bool,
    },
}

#[derive(Args, Clone)]
struct Common {
    /// Heartbeat period.
    #[arg(long, default_value_t = 50)]
    period_ms: u64,
    /// Silence after which a rank's predecessor is declared dead.
    #[arg(long, default_value_t = 1000)]
    timeout_ms: u64,
    /// A rank to kill with SIGKILL.
    #[arg(long)]
    kill: Option<Rank>,
    /// When the killed rank dies, after the common start.
    #[arg(long, default_value_t = 0)]
    kill_at_ms: u64,
    /// Or: the protocol step at which the killed rank dies.
    #[arg(long, value_enum)]
    kill_on: Option<KillStep>,
    /// How long a rank keeps serving its peers after it finished.
    #[arg(long, default_value_t = 500)]
    linger_ms: u64,
    /// The longest a rank waits for any one step.
    #[arg(long, default_value_t = 60)]
    limit_s: u64,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum KillStep {
    /// As soon as a broadcast activates the rank.
    Activation,
    /// When the first global validation starts, before the rank sends any of it.
    Validate,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Serialized: in threaded runs the progress thread, not the main one, calls MPI.
    let Some((universe, threading)) = mpi::initialize_with_threading(Threading::Serialized) else {
        eprintln!("ftmpi: MPI was initialized already");
        return ExitCode::FAILURE;
    };
    let world = universe.world();
    let rank = world.rank() as Rank;
    let result = match &cli.command {
        Command::Validate {
            common,
            threaded: false,
        } => start(&world, common).and_then(|d| validate(d, common)),
        Command::Validate {
            common,
            threaded: true,
        } if threading >= Threading::Serialized => validate_threaded(&world, common),
        Command::Validate { .. } => Err(format!(
            "this MPI offers {threading:?} threading; a progress thread needs Serialized"
        )),
        Command::Bench {
            reps,
            idle_us,
            spin_us,
            common,
        } => start(&world, common).and_then(|mut driver| {
            driver.set_idle(
                StdDuration::from_micros(*spin_us),
                StdDuration::from_micros(*idle_us),
            );
            bench(&world, driver, common, *reps)
        }),
        Command::Broadcast {
            plan,
            common,
            threaded,
        } => std::fs::read_to_string(plan)
            .map_err(|e| format!("cannot read {}: {e}", plan.display()))
            .and_then(|text| plan_file::parse(&text).map_err(|e| e.to_string()))
            .and_then(|spec| {
                if *threaded {
                    broadcast_threaded(&world, spec, common)
                } else {
                    broadcast(start(&world, common)?, spec, common)
                }
            }),
    };
    match result {
        Ok(Finished { line, saw_failure }) => {
            println!("{line}");
            if saw_failure {
                // Open MPI 5's MPI_Finalize can wait forever on a dead process after a
                // failure (its PMIx fence: open-mpi/ompi#11404), so a rank that saw one
                // leaves without it, as ULFM programs that cannot finalize do.
                let _ = std::io::Write::flush(&mut std::io::stdout());
                std::process::exit(0);
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ftmpi: rank {rank}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// What a rank prints, and whether it saw a rank fail.
struct Finished {
    line: String,
    saw_failure: bool,
}

/// The rank's stack on a transport over `world`, started together with every rank (a
/// barrier), with the kill timer armed if this rank is to die at a time.
fn start(
    world: &mpi::topology::SimpleCommunicator,
    common: &Common,
) -> Result<Driver<RankStack, MpiTransport>, String> {
    let transport = MpiTransport::new(world).map_err(|e| e.to_string())?;
    let (me, n) = (transport.rank(), transport.size());
    if common.kill.is_some_and(|k| k >= n) {
        return Err(format!("--kill names a rank outside 0..{n}"));
    }
    let period = Duration::from_millis(common.period_ms);
    let config = DetectorConfig {
        comm: 0,
        n,
        me,
        period,
        timeout: Duration::from_millis(common.timeout_ms),
        // Heartbeats spread over the period.
        phase: Duration::from_nanos(period.as_nanos() * u64::from(me) / u64::from(n)),
    };
    world.barrier();
    let origin = WallInstant::now();
    if common.kill == Some(me) && common.kill_on.is_none() {
        let at = StdDuration::from_millis(common.kill_at_ms);
        std::thread::spawn(move || {
            std::thread::sleep(at.saturating_sub(origin.elapsed()));
            die();
        });
    }
    Ok(Driver::new(
        RankStack::new(config, Instant::ZERO),
        transport,
        origin,
    ))
}

/// Ends this process the way a crashed node does: `SIGKILL`, no clean-up, no MPI call.
fn die() -> ! {
    // SAFETY: raising a signal has no memory-safety preconditions.
    unsafe { libc::raise(libc::SIGKILL) };
    unreachable!("SIGKILL cannot be caught")
}

/// Runs one global validation to its end; returns `G`.
fn validate_once(
    driver: &mut Driver<RankStack, MpiTransport>,
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

/// `ftmpi validate`: prints
/// `{"rank", "n", "validations": [{"epoch", "G"}...], "L", "stats": {...}}`.
fn validate(
    mut driver: Driver<RankStack, MpiTransport>,
    common: &Common,
) -> Result<Finished, String> {
    let limit = StdDuration::from_secs(common.limit_s);
    if common.kill == Some(driver.transport().rank())
        && matches!(common.kill_on, Some(KillStep::Validate))
    {
        die();
    }
    let mut validations = vec![validate_once(&mut driver, limit)?];
    if let Some(dead) = common.kill {
        // Everyone validates again once it knows the dead rank, so the last G holds it.
        // (The killed rank waits here until its kill timer fires.)
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
            .map_err(|e| e.to_string())??;
        validations.push(validate_once(&mut driver, limit)?);
    }
    driver
        .run_for(StdDuration::from_millis(common.linger_ms))
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

/// Whether this rank knows a rank failed, or MPI reported a failure to it.
fn saw_failure(driver: &Driver<RankStack, MpiTransport>) -> bool {
    !driver.machine().node().view().known_failed().is_empty()
        || driver.transport().stats().failure_acks > 0
        || driver.transport().stats().dropped_to_failed > 0
}

/// `ftmpi validate --threaded`: the flow of [`validate`] on a [`Runtime`]: the progress
/// thread drives the stack, this thread blocks in `validate_global` and polls the
/// published view to learn of the death. Prints the same line, without transport
/// counters.
fn validate_threaded(
    world: &mpi::topology::SimpleCommunicator,
    common: &Common,
) -> Result<Finished, String> {
    let limit = StdDuration::from_secs(common.limit_s);
    let (me, n) = (world.rank() as Rank, world.size() as u32);
    let settings = common.clone();
    // The communicator handle may not cross threads: the progress thread takes its own.
    let runtime = Runtime::spawn(move || start(&SimpleCommunicator::world(), &settings))
        .map_err(|e| e.to_string())?;
    if common.kill == Some(me) && common.kill_on == Some(KillStep::Validate) {
        die();
    }
    let mut validations = vec![runtime.validate_global().map_err(|e| e.to_string())?];
    if let Some(dead) = common.kill {
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
        .shutdown(StdDuration::from_millis(common.linger_ms))
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

/// `ftmpi broadcast`: prints `{"rank", "needs": [names], "received": [names],
/// "verified": bool, "abandoned": bool, "G", "stats": {...}}`; `received` lists the
/// outputs released at this rank, `verified` says each is byte-identical to the root's,
/// and `G` is the agreed failed set of the closing global validation.
fn broadcast(
    mut driver: Driver<RankStack, MpiTransport>,
    spec: PlanSpec,
    common: &Common,
) -> Result<Finished, String> {
    let limit = StdDuration::from_secs(common.limit_s);
    let (me, n) = (driver.transport().rank(), driver.transport().size());
    if spec.ranks != n {
        return Err(format!(
            "the plan is for {} ranks, the job has {n}",
            spec.ranks
        ));
    }
    const TASK: u32 = 0;
    let names: Vec<String> = spec.outputs.iter().map(|o| o.name.clone()).collect();
    let sizes: Vec<u64> = spec.outputs.iter().map(|o| o.bytes).collect();
    let needs: OutputSet = (0..spec.outputs.len() as u32)
        .filter(|&j| me != spec.root && spec.outputs[j as usize].dests.contains(&me))
        .collect();
    if me == spec.root {
        let payloads = sizes
            .iter()
            .enumerate()
            .map(|(j, &bytes)| payload(TASK, j as u32, bytes))
            .collect();
        driver
            .command(|stack, now| stack.start_broadcast(now, TASK, spec.clone(), payloads))
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
    }
    let kill_on_activation = common.kill == Some(me) && common.kill_on.is_some();
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
        let finished = !kill_on_activation && (needs.is_subset(&received) || abandoned);
        finished.then_some(Ok(()))
    });
    outcome.map_err(|e| e.to_string())??;
    // The root and inner ranks must stay until every survivor is served (repairs need
    // them): a global validation is the fault-tolerant barrier.
    let (_, g) = validate_once(&mut driver, limit)?;
    driver
        .run_for(StdDuration::from_millis(common.linger_ms))
        .map_err(|e| e.to_string())?;
    let bcast = driver.machine().broadcaster();
    let verified = received.iter().all(|j| {
        bcast
            .and_then(|b| b.output(TASK, j))
            .is_some_and(|bytes| bytes == payload(TASK, j, sizes[j as usize]).as_slice())
    });
    let named = |set: &OutputSet| {
        set.iter()
            .map(|j| names[j as usize].clone())
            .collect::<Vec<_>>()
    };
    let line = json!({
        "rank": me,
        "needs": named(&needs),
        "received": named(&received),
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

/// `ftmpi bench`: prints `{"rank", "n", "reps", "median_us": {"barrier",
/// "ulfm_agree", "validate_global"}, "ratio_to_ulfm_agree": {"barrier",
/// "validate_global"}}`. Each repetition starts from a barrier on another communicator,
/// so the three operations are timed from a common start.
fn bench(
    world: &SimpleCommunicator,
    mut driver: Driver<RankStack, MpiTransport>,
    common: &Common,
    reps: u32,
) -> Result<Finished, String> {
    let limit = StdDuration::from_secs(common.limit_s);
    let comm = world.duplicate();
    let mut times: [Vec<f64>; 3] = Default::default();
    let micros = |since: WallInstant| since.elapsed().as_secs_f64() * 1e6;
    for _ in 0..reps {
        world.barrier();
        let since = WallInstant::now();
        comm.barrier();
        times[0].push(micros(since));

        world.barrier();
        let since = WallInstant::now();
        backend_mpi::ulfm::agree(&comm, 1).map_err(|e| e.to_string())?;
        times[1].push(micros(since));

        world.barrier();
        let since = WallInstant::now();
        validate_once(&mut driver, limit)?;
        times[2].push(micros(since));
    }
    let [barrier, agree, ours] = times.map(|mut t| {
        t.sort_by(f64::total_cmp);
        t.get(t.len() / 2).copied().unwrap_or(f64::NAN)
    });
    let line = json!({
        "rank": driver.transport().rank(),
        "n": driver.transport().size(),
        "reps": reps,
        "median_us": {"barrier": barrier, "ulfm_agree": agree, "validate_global": ours},
        "ratio_to_ulfm_agree": {"barrier": barrier / agree, "validate_global": ours / agree},
    })
    .to_string();
    Ok(Finished {
        line,
        saw_failure: saw_failure(&driver),
    })
}

/// `ftmpi broadcast --threaded`: the flow of [`broadcast`] through a [`Runtime`]
/// (`start_broadcast`, `wait_outputs`, then `validate_local` and `validate_global` as
/// the closing barrier). Prints the same line, with `"threaded": true` and the counts
/// of `validate_local` instead of transport counters.
fn broadcast_threaded(
    world: &SimpleCommunicator,
    spec: PlanSpec,
    common: &Common,
) -> Result<Finished, String> {
    if common.kill_on.is_some() {
        return Err("--kill-on needs the single-threaded loop; use --kill-at-ms".into());
    }
    let (me, n) = (world.rank() as Rank, world.size() as u32);
    if spec.ranks != n {
        return Err(format!(
            "the plan is for {} ranks, the job has {n}",
            spec.ranks
        ));
    }
    const TASK: u32 = 0;
    let settings = common.clone();
    let runtime = Runtime::spawn(move || start(&SimpleCommunicator::world(), &settings))
        .map_err(|e| e.to_string())?;
    let needs: OutputSet = (0..spec.outputs.len() as u32)
        .filter(|&j| me != spec.root && spec.outputs[j as usize].dests.contains(&me))
        .collect();
    let sizes: Vec<u64> = spec.outputs.iter().map(|o| o.bytes).collect();
    let names: Vec<String> = spec.outputs.iter().map(|o| o.name.clone()).collect();
    if me == spec.root {
        let payloads = (0..sizes.len())
            .map(|j| payload(TASK, j as u32, sizes[j]))
            .collect();
        runtime
            .start_broadcast(TASK, spec, payloads)
            .map_err(|e| e.to_string())?;
    }
    let data = if needs.is_empty() {
        Vec::new()
    } else {
        runtime
            .wait_outputs(TASK, needs.clone())
            .map_err(|e| e.to_string())?
    };
    let verified = data.len() == needs.len()
        && data
            .iter()
            .all(|(j, bytes)| *bytes == payload(TASK, *j, sizes[*j as usize]));
    let counts = runtime.validate_local().map_err(|e| e.to_string())?;
    let (_, g) = runtime.validate_global().map_err(|e| e.to_string())?;
    let saw_failure = !g.is_empty() || counts.failed > 0;
    runtime
        .shutdown(StdDuration::from_millis(common.linger_ms))
        .map_err(|e| e.to_string())?;
    let named = |indices: &mut dyn Iterator<Item = u32>| {
        indices
            .map(|j| names[j as usize].clone())
            .collect::<Vec<_>>()
    };
    let line = json!({
        "rank": me,
        "needs": named(&mut needs.iter()),
        "received": named(&mut data.iter().map(|(j, _)| *j)),
        "verified": verified,
        "abandoned": false,
        "G": g.iter().collect::<Vec<_>>(),
        "validate_local": {"num_failed": counts.failed, "num_new": counts.new},
        "threaded": true,
    })
    .to_string();
    Ok(Finished { line, saw_failure })
}

fn stats(driver: &Driver<RankStack, MpiTransport>) -> Value {
    let t = driver.transport().stats();
    let d = driver.stats();
    json!({
        "frames_sent": t.sent,
        "frames_received": t.received,
        "dropped_to_failed": t.dropped_to_failed,
        "failure_acks": t.failure_acks,
        "rejected": d.rejected,
        "elapsed_ms": driver.now().as_nanos() / 1_000_000,
    })
}
