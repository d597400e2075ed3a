//! `ftmpi`: the whole per-rank stack (`ft_bcast::RankStack`) over real MPI, one process
//! per rank, started by `mpiexec`.
//!
//! ```sh
//! mpiexec -n 4 --with-ft ulfm ftmpi validate --kill 2 --kill-at-ms 5
//! mpiexec -n 8 --with-ft ulfm ftmpi broadcast plans/mpi-8.json --kill 1 --kill-on activation
//! ```
//!
//! The jobs are `ft-jobs`' (shared with every real backend): every surviving rank
//! prints one JSON line on stdout; the process exits with status 1 if the rank could not
//! finish (a timeout, an MPI error, or the rank was declared dead and stopped). Kills
//! are real: the chosen rank sends itself `SIGKILL`, either `--kill-at-ms` after the
//! common start (a barrier) or at a protocol step (`--kill-on`). `ftmpi bench` is this
//! backend's own: it times `validate_global` against ULFM's `MPIX_Comm_agree`.

use std::process::ExitCode;
use std::time::{Duration as StdDuration, Instant as WallInstant};

use backend_mpi::{MpiLaunch, MpiTransport};
use clap::{Parser, Subcommand};
use ft_core::shrink::Survivors;
use ft_jobs::{Finished, JobArgs, JobCommand, Launch, RankDriver};
use mpi::collective::CommunicatorCollectives;
use mpi::environment::Threading;
use mpi::topology::{Communicator, SimpleCommunicator};
use serde_json::json;

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
    #[command(flatten)]
    Job(JobCommand),
    /// Times, at every rank, `MPI_Barrier`, ULFM's `MPIX_Comm_agree` and this library's
    /// `validate_global`, all failure-free and interleaved, `--reps` times each; prints
    /// the medians and their ratios to `MPIX_Comm_agree`. With `--kill R`, once rank R
    /// is dead, times ULFM's `MPIX_Comm_shrink` beside `validate_global` plus the shrink
    /// renumbering (`Survivors`) instead.
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
        job: JobArgs,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Serialized: in threaded runs the progress thread, not the main one, calls MPI.
    let Some((universe, threading)) = mpi::initialize_with_threading(Threading::Serialized) else {
        eprintln!("ftmpi: MPI was initialized already");
        return ExitCode::FAILURE;
    };
    let launch = MpiLaunch::world();
    let result = match &cli.command {
        Command::Job(job) if job.threaded() && threading < Threading::Serialized => Err(format!(
            "this MPI offers {threading:?} threading; a progress thread needs Serialized"
        )),
        Command::Job(job) => job.run(&launch),
        Command::Bench {
            reps,
            idle_us,
            spin_us,
            job,
        } => ft_jobs::start(&launch, job).and_then(|mut driver| {
            driver.set_idle(
                StdDuration::from_micros(*spin_us),
                StdDuration::from_micros(*idle_us),
            );
            match job.kill {
                None => bench(&universe.world(), driver, job, *reps),
                Some(dead) => bench_shrink(&universe.world(), driver, job, *reps, dead),
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
            eprintln!("ftmpi: rank {}: {e}", launch.rank());
            ExitCode::FAILURE
        }
    }
}

/// `ftmpi bench`: prints `{"rank", "n", "reps", "median_us": {"barrier",
/// "ulfm_agree", "validate_global"}, "ratio_to_ulfm_agree": {"barrier",
/// "validate_global"}}`. Each repetition starts from a barrier on another communicator,
/// so the three operations are timed from a common start.
fn bench(
    world: &SimpleCommunicator,
    mut driver: RankDriver<MpiTransport>,
    job: &JobArgs,
    reps: u32,
) -> Result<Finished, String> {
    let limit = StdDuration::from_secs(job.limit_s);
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
        ft_jobs::validate_once(&mut driver, limit)?;
        times[2].push(micros(since));
    }
    let [barrier, agree, ours] = times.map(|t| ft_jobs::median(t).unwrap_or(f64::NAN));
    let line = json!({
        "rank": world.rank(),
        "n": world.size(),
        "reps": reps,
        "median_us": {"barrier": barrier, "ulfm_agree": agree, "validate_global": ours},
        "ratio_to_ulfm_agree": {"barrier": barrier / agree, "validate_global": ours / agree},
    })
    .to_string();
    Ok(Finished {
        line,
        saw_failure: ft_jobs::saw_failure(&driver),
    })
}

/// `ftmpi bench --kill R`: prints `{"rank", "n", "reps", "dead", "median_us":
/// {"ulfm_shrink", "validate_global_and_renumber"}, "ratio_to_ulfm_shrink"}`. Once both
/// ULFM (a first shrink) and this library (a first `validate_global` holding R) know
/// rank R dead, each repetition starts from a barrier on the shrunk communicator and
/// times a shrink of the world, then a global validation and the renumbering of its `G`.
fn bench_shrink(
    world: &SimpleCommunicator,
    mut driver: RankDriver<MpiTransport>,
    job: &JobArgs,
    reps: u32,
    dead: u32,
) -> Result<Finished, String> {
    let limit = StdDuration::from_secs(job.limit_s);
    // Collectives on the world must report the dead rank, not abort the job.
    backend_mpi::transport::errors_return(world).map_err(|e| e.to_string())?;
    // The killed rank waits here for its kill timer.
    ft_jobs::await_death(&mut driver, dead, limit)?;
    ft_jobs::validate_once(&mut driver, limit)?;
    let live = backend_mpi::ulfm::shrink(world).map_err(|e| e.to_string())?;
    let mut times: [Vec<f64>; 2] = Default::default();
    let micros = |since: WallInstant| since.elapsed().as_secs_f64() * 1e6;
    let mut survivors = 0;
    for _ in 0..reps {
        live.barrier();
        let since = WallInstant::now();
        drop(backend_mpi::ulfm::shrink(world).map_err(|e| e.to_string())?);
        times[0].push(micros(since));

        live.barrier();
        let since = WallInstant::now();
        ft_jobs::validate_once(&mut driver, limit)?;
        let g = driver.machine().node().view().global();
        survivors = Survivors::new(g).len();
        times[1].push(micros(since));
    }
    let [shrink, ours] = times.map(|t| ft_jobs::median(t).unwrap_or(f64::NAN));
    let line = json!({
        "rank": world.rank(),
        "live_rank": live.rank(),
        "n": world.size(),
        "dead": dead,
        "survivors": survivors,
        "live_size": live.size(),
        "reps": reps,
        "median_us": {"ulfm_shrink": shrink, "validate_global_and_renumber": ours},
        "ratio_to_ulfm_shrink": ours / shrink,
    })
    .to_string();
    Ok(Finished {
        line,
        saw_failure: true,
    })
}
