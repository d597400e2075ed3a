//! `ftmpi`: the whole per-rank stack (`ft_bcast::RankStack`) over real MPI, one process
//! per rank, started by `mpiexec`.
//!
//! ```sh
//! mpiexec -n 4 --with-ft ulfm ftmpi validate --kill 2 --kill-at-ms 5
//! mpiexec -n 8 --with-ft ulfm ftmpi validate --kill 4,5,6,7 --kill-on validate
//! mpiexec -n 8 --with-ft ulfm ftmpi broadcast plans/mpi-8.json --kill 1 --kill-on activation
//! ```
//!
//! The jobs are `ft-jobs`' (shared with every real backend): every surviving rank
//! prints one JSON line on stdout. Kills are real: every rank `--kill` lists sends
//! itself `SIGKILL`, either `--kill-at-ms` after the common start (a barrier) or at a
//! protocol step (`--kill-on`). `ftmpi bench` is this backend's own: it times
//! `validate_global` against ULFM's `MPIX_Comm_agree` (or, with `--kill R`, one rank,
//! `MPIX_Comm_shrink`). `ftmpi bench-bcast` is the shared job with this backend's
//! baseline: one `MPI_Bcast` per output instead of the two-sided broadcast, and the
//! activation floor beside it ([`floor`]: the least an activation-based broadcast
//! costs over MPI point-to-point alone).
//! `ftmpi send-parts` drives the transport alone: header + payload frames sent in
//! place (`MpiTransport::send_parts`), checked byte for byte at the receivers.
//!
//! How a job ends, so that no rank is left behind (with Open MPI 5.0 under
//! `--with-ft ulfm`, `MPI_Abort` does not stop the other ranks, and a rank that calls
//! `MPI_Finalize` after another left without it waits forever, ompi#11404):
//!
//! - **bad input** (a usage error, a check of `ft_jobs::JobCommand::check`): every rank
//!   checks before it connects, the ranks agree on the outcome (an all-reduce: no rank
//!   has failed yet), the lowest rank that refused prints why, once, and every rank
//!   finalizes and exits with status 2 (`--help` and `--version`: printed by rank 0,
//!   status 0);
//! - **a failure after connecting** (a timeout, an MPI error, the rank was declared
//!   dead): the rank prints why and ends by `SIGKILL` (`ft_jobs::die`), as a crashed
//!   rank does; under ULFM the others see it fail and finish without it. It does not
//!   exit with a non-zero status: PRRTE's `error-nonzero-status` policy (on by
//!   default) then tears the job down once a second rank has failed and a survivor
//!   leaves, killing the survivors still printing their results. So `mpiexec` exits 0, as it does after any failure ULFM survives; the
//!   reason is on stderr, and the survivors' `L` and `G` name the rank;
//! - **success**: a rank that saw a failure exits without finalizing; one that saw none
//!   finalizes, but gives up waiting after [`FINALIZE_LIMIT`] (a rank may have failed
//!   after this one stopped looking).

mod floor;

use std::io::Write as _;
use std::process::ExitCode;
use std::time::{Duration as StdDuration, Instant as WallInstant};

use backend_mpi::{MpiLaunch, MpiTransport};
use clap::{Parser, Subcommand};
use ft_core::shrink::Survivors;
use ft_jobs::bench_bcast::{phase, release, stack_rep, BenchBcastArgs};
use ft_jobs::{Finished, JobArgs, JobCommand, Launch, RankDriver};
use ft_runtime::timeline::{self, Mark};
use ft_runtime::{Received, Transport};
use mpi::collective::{CommunicatorCollectives, Root, SystemOperation};
use mpi::environment::Threading;
use mpi::topology::{Color, Communicator, SimpleCommunicator};
use serde_json::json;

#[derive(Parser)]
#[command(
    version,
    about = "Failure views and broadcasts over real MPI, one process per rank"
)]
struct Cli {
    /// Leave glibc's heap policy as it is: freed memory above 128 KiB goes back to the
    /// system, and the next broadcast's receive buffers fault their pages in again (by
    /// default ftmpi keeps freed memory in the process: `keep_heap`).
    #[arg(long, global = true)]
    trim_heap: bool,
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
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
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
    /// Checks and times the transport's bulk-data path alone (no protocol): rank 0
    /// sends `--frames` frames to every other rank with `send_parts` (a 16-byte header
    /// and a payload sliced from one shared buffer, sent in place), then the same frames
    /// copied into one buffer and sent with `send`. Every receiver checks every byte
    /// and the order, then answers; `--kill R` kills rank R right after the start, so
    /// rank 0's sends to it must be dropped, not fail the rank. Prints one JSON line per
    /// surviving rank with the transport's counters; rank 0's also has the time per
    /// frame of both ways.
    SendParts {
        /// Frames sent each way to each rank.
        #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=4096))]
        frames: u32,
        /// Payload bytes per frame (at most the stack's chunk, 65536).
        #[arg(long, default_value_t = 65536, value_parser = clap::value_parser!(u32).range(0..=65536))]
        payload_bytes: u32,
        /// Rank 0 first sends every other rank one message a byte longer than any
        /// frame, which must arrive as `Received::Oversized` and be discarded.
        #[arg(long)]
        oversized: bool,
        /// Ranks killed (SIGKILL) right after the start; not rank 0.
        #[arg(long, value_delimiter = ',')]
        kill: Vec<u32>,
        /// The longest any rank waits for its frames or its sends.
        #[arg(long, default_value_t = 60)]
        limit_s: u64,
    },
}

impl Cli {
    /// Checks the command for a job of `n` ranks under `threading`, before any rank
    /// connects.
    fn check(&self, n: u32, threading: Threading) -> Result<(), String> {
        match &self.command {
            Command::Job(job) => {
                if job.threaded() && threading < Threading::Serialized {
                    return Err(format!(
                        "this MPI offers {threading:?} threading; a progress thread needs Serialized"
                    ));
                }
                job.check(n)
            }
            Command::Bench { job, .. } => {
                job.check(n)?;
                if job.kill_on.is_some() {
                    return Err("bench: --kill-on does not apply (the killed rank dies \
                                --kill-at-ms after the start)"
                        .into());
                }
                if job.kill.len() > 1 {
                    return Err(format!(
                        "bench: --kill takes one rank (the shrink is timed after one \
                         death), not {:?}",
                        job.kill
                    ));
                }
                Ok(())
            }
            Command::SendParts { kill, .. } => match kill.iter().find(|&&r| r == 0 || r >= n) {
                Some(r) => Err(format!(
                    "send-parts: --kill {r}: not rank 0 (the sender), and below {n}"
                )),
                None => Ok(()),
            },
        }
    }
}

/// The exit status of bad input, as for clap's usage errors.
const BAD_INPUT: u8 = 2;

/// The longest a rank that saw no failure waits in `MPI_Finalize` before it exits
/// anyway.
const FINALIZE_LIMIT: StdDuration = StdDuration::from_secs(5);

/// Keeps the memory the process frees for its next allocations, as HPC runtimes
/// commonly set their allocator: glibc trims no free memory off the heap and serves
/// allocations up to 32 MiB (its largest) from the heap, not from fresh mappings. A
/// broadcast's receive buffers (one per chunk, owned by the outputs until the task is
/// released) then reuse the pages of the last task's instead of faulting in new zeroed
/// ones; `MPI_Bcast` reuses its caller's buffers and is unaffected.
fn keep_heap() {
    // SAFETY: `mallopt` only sets glibc's allocator parameters.
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
    }
}

fn main() -> ExitCode {
    let parsed = Cli::try_parse();
    // Serialized: in threaded runs the progress thread, not the main one, calls MPI.
    let Some((universe, threading)) = mpi::initialize_with_threading(Threading::Serialized) else {
        eprintln!("ftmpi: MPI was initialized already");
        return ExitCode::FAILURE;
    };
    let world = universe.world();
    let launch = MpiLaunch::world();
    let cli = match agree_on_input(&world, parsed, threading) {
        Ok(cli) => cli,
        Err(code) => {
            // Every rank refused together; still, Finalize's fence can hang: bound it as
            // after a clean run.
            exit_after(
                FINALIZE_LIMIT,
                if code == ExitCode::SUCCESS {
                    0
                } else {
                    i32::from(BAD_INPUT)
                },
            );
            drop(universe);
            return code;
        }
    };
    if !cli.trim_heap {
        keep_heap();
    }
    let result = match &cli.command {
        // This backend's baseline is MPI_Bcast, not the shared job's two-sided one.
        Command::Job(JobCommand::BenchBcast { bench, job }) => ft_jobs::start(&launch, job)
            .and_then(|mut driver| {
                bench.configure(&mut driver)?;
                bench_bcast(&world, driver, bench, job)
            }),
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
            match job.kill[..] {
                [] => bench(&world, driver, job, *reps),
                [dead] => bench_shrink(&world, driver, job, *reps, dead),
                _ => unreachable!("Cli::check allows one rank"),
            }
        }),
        Command::SendParts {
            frames,
            payload_bytes,
            oversized,
            kill,
            limit_s,
        } => send_parts(
            &world,
            *frames,
            *payload_bytes as usize,
            *oversized,
            kill,
            StdDuration::from_secs(*limit_s),
        ),
    };
    match result {
        Ok(Finished { line, saw_failure }) => {
            println!("{line}");
            let _ = std::io::stdout().flush();
            if saw_failure {
                // Open MPI 5's MPI_Finalize can wait forever on a dead process after a
                // failure (its PMIx fence: open-mpi/ompi#11404), so a rank that saw one
                // leaves without it, as ULFM programs that cannot finalize do.
                std::process::exit(0);
            }
            // A rank may have failed after this one stopped looking: bound the wait.
            exit_after(FINALIZE_LIMIT, 0);
            drop(universe);
            ExitCode::SUCCESS
        }
        Err(e) => {
            // Fail-stop: leave as a crashed rank does, so that the others (under
            // ULFM) see this rank fail and finish without it; finalizing could wait
            // forever on them, and a non-zero exit status can end the job (module doc).
            eprintln!("ftmpi: rank {}: {e}", launch.rank());
            let _ = std::io::stderr().flush();
            ft_jobs::die()
        }
    }
}

/// Ends the process with `status` after `limit`, unless it ended first: bounds a wait
/// in `MPI_Finalize`.
fn exit_after(limit: StdDuration, status: i32) {
    std::thread::spawn(move || {
        std::thread::sleep(limit);
        // SAFETY: _exit(2) ends the process at once; no memory is involved.
        unsafe { libc::_exit(status) };
    });
}

/// Every rank checks its command line (`parsed`, then [`Cli::check`]) before any
/// connects, and all agree on the outcome: the lowest rank that refused prints why
/// (clap's own text for usage errors), and every rank gets the exit code to end with.
fn agree_on_input(
    world: &SimpleCommunicator,
    parsed: Result<Cli, clap::Error>,
    threading: Threading,
) -> Result<Cli, ExitCode> {
    let (rank, size) = (world.rank(), world.size());
    let checked = parsed.map_err(Refusal::Usage).and_then(|cli| {
        cli.check(size as u32, threading)
            .map(|()| cli)
            .map_err(Refusal::Check)
    });
    let mut first_refusing = size;
    let mine = if checked.is_err() { rank } else { size };
    world.all_reduce_into(&mine, &mut first_refusing, SystemOperation::min());
    match checked {
        Ok(cli) if first_refusing == size => Ok(cli),
        Ok(_) => Err(ExitCode::from(BAD_INPUT)),
        Err(Refusal::Usage(e)) => {
            if rank == first_refusing {
                let _ = e.print();
            }
            Err(ExitCode::from(e.exit_code() as u8))
        }
        Err(Refusal::Check(e)) => {
            if rank == first_refusing {
                eprintln!("ftmpi: {e}");
            }
            Err(ExitCode::from(BAD_INPUT))
        }
    }
}

/// Why a rank refused its command line.
enum Refusal {
    /// Clap's (including `--help` and `--version`, which exit with 0).
    Usage(clap::Error),
    /// [`Cli::check`]'s.
    Check(String),
}

/// `ftmpi bench`: prints `{"rank", "n", "reps", "median_us": {"barrier",
/// "ulfm_agree", "validate_global"}, "ratio_to_ulfm_agree": {"barrier",
/// "validate_global"}, "ratio_to_barrier": {"validate_global"}, "slowest_rank":
/// {"median_us", "ratio_to_ulfm_agree", "ratio_to_barrier"}}`; on an MPI whose
/// agreement does not work ([`backend_mpi::ulfm::AGREE_WORKS`]) it is not timed and its
/// figures are `null`. Each
/// repetition starts from a barrier on another communicator, so the three operations
/// are timed from a common start. `median_us` is this rank's own time; `slowest_rank`
/// takes, per repetition, the largest time over the ranks (the operation is done
/// everywhere), as `bench-bcast` does. The two differ for `MPIX_Comm_agree`: its root
/// returns once the reduce has reached it, the other ranks a broadcast later.
fn bench(
    world: &SimpleCommunicator,
    mut driver: RankDriver<MpiTransport>,
    job: &JobArgs,
    reps: u32,
) -> Result<Finished, String> {
    let limit = StdDuration::from_secs(job.limit_s);
    let comm = world.duplicate();
    // times[phase][rep]: this rank's own microseconds, and the largest over the ranks
    // (an all-reduce after the timing).
    let mut own: [Vec<f64>; 3] = Default::default();
    let mut slowest: [Vec<f64>; 3] = Default::default();
    let micros = |since: WallInstant| since.elapsed().as_secs_f64() * 1e6;
    for _ in 0..reps {
        let mut mine = [0.0; 3];
        world.barrier();
        let since = WallInstant::now();
        comm.barrier();
        mine[0] = micros(since);

        if backend_mpi::ulfm::AGREE_WORKS {
            world.barrier();
            let since = WallInstant::now();
            backend_mpi::ulfm::agree(&comm, 1).map_err(|e| e.to_string())?;
            mine[1] = micros(since);
        } else {
            mine[1] = f64::NAN;
        }

        world.barrier();
        let since = WallInstant::now();
        ft_jobs::validate_once(&mut driver, limit)?;
        mine[2] = micros(since);

        let mut max = [0.0; 3];
        world.all_reduce_into(&mine[..], &mut max[..], SystemOperation::max());
        for phase in 0..3 {
            own[phase].push(mine[phase]);
            slowest[phase].push(max[phase]);
        }
    }
    let medians = |times: [Vec<f64>; 3]| times.map(|t| ft_jobs::median(t).unwrap_or(f64::NAN));
    let [barrier, agree, ours] = medians(own);
    let [barrier_max, agree_max, ours_max] = medians(slowest);
    let line = json!({
        "rank": world.rank(),
        "n": world.size(),
        "reps": reps,
        "median_us": {"barrier": barrier, "ulfm_agree": agree, "validate_global": ours},
        "ratio_to_ulfm_agree": {"barrier": barrier / agree, "validate_global": ours / agree},
        "ratio_to_barrier": {"validate_global": ours / barrier},
        "slowest_rank": {
            "median_us": {"barrier": barrier_max, "ulfm_agree": agree_max, "validate_global": ours_max},
            "ratio_to_ulfm_agree": {"barrier": barrier_max / agree_max, "validate_global": ours_max / agree_max},
            "ratio_to_barrier": {"validate_global": ours_max / barrier_max},
        },
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
    ft_jobs::await_death(&mut driver, &[dead], limit)?;
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

/// `ftmpi bench-bcast`: `ft_jobs::bench_bcast`'s cases against one `MPI_Bcast` per
/// output over a communicator of that output's root and destinations (split once per
/// case, outside the timing), and beside the activation floor ([`floor`]: the least an
/// activation-based broadcast costs over MPI point-to-point). Each repetition times
/// the stack, then `MPI_Bcast`, then the floor, each from a barrier on the world; a
/// repetition's time is the largest over the ranks (an all-reduce after it). Rank 0
/// prints one line per case (`Case::line_with`, baseline `"mpi_bcast"`, the floor as
/// `"activation_floor"`); the other ranks one line saying they took part.
fn bench_bcast(
    world: &SimpleCommunicator,
    mut driver: RankDriver<MpiTransport>,
    bench: &BenchBcastArgs,
    job: &JobArgs,
) -> Result<Finished, String> {
    let limit = StdDuration::from_secs(job.limit_s);
    let (me, n) = (world.rank() as u32, world.size() as u32);
    let cases = bench.cases(n, me);
    bench.start_timeline(cases.len(), 3); // stack, MPI_Bcast, floor
    let worst = |mine: f64| {
        let mut max = 0.0;
        world.all_reduce_into(&mine, &mut max, SystemOperation::max());
        max
    };
    let mut lines = Vec::new();
    let mut task = 0;
    // The activation floor's own communicator, so its tags meet nothing else.
    let floor_comm = world.duplicate();
    for case in &cases {
        // One communicator per output: its root (rank 0 there too) and destinations.
        let comms: Vec<Option<SimpleCommunicator>> = (0..case.outputs)
            .map(|j| {
                let member = case.members(j).contains(&me);
                world.split_by_color(if member {
                    Color::with_value(0)
                } else {
                    Color::undefined()
                })
            })
            .collect();
        let mut buffers: Vec<Vec<u8>> = (0..case.outputs as usize)
            .map(|j| {
                if me == case.spec().root {
                    case.payloads[j].to_vec()
                } else {
                    vec![0; case.bytes as usize]
                }
            })
            .collect();
        let floor = floor::Floor::new(case, me);
        let mut floor_buffers: Vec<Vec<u8>> = (0..case.outputs)
            .map(|_| vec![0; case.bytes as usize])
            .collect();
        let mut times: [Vec<f64>; 3] = Default::default();
        for rep in 0..bench.reps {
            let start = case.start(me);
            world.barrier();
            let mine = stack_rep(&mut driver, case, start, task, limit)?;
            settle(world, &mut driver, limit)?;
            if rep + 1 < bench.reps {
                release(&mut driver, case, task)?;
            }
            times[0].push(worst(mine));
            task += 1;

            world.barrier();
            let since = WallInstant::now();
            timeline::mark(Mark::RepStart, phase::MPI_BCAST);
            for (comm, buffer) in comms.iter().zip(&mut buffers) {
                if let Some(comm) = comm {
                    comm.process_at_rank(0).broadcast_into(&mut buffer[..]);
                }
            }
            let took = since.elapsed().as_secs_f64() * 1e6;
            timeline::mark(Mark::RepDone, phase::MPI_BCAST);
            times[1].push(worst(took));

            world.barrier();
            let mine = floor.rep(&floor_comm, case, &mut floor_buffers, rep)?;
            times[2].push(worst(mine));
        }
        if !case.stack_delivered(&driver, task - 1)
            || case.needs.iter().any(|j| {
                buffers[j as usize][..] != case.payloads[j as usize][..]
                    || floor_buffers[j as usize][..] != case.payloads[j as usize][..]
            })
        {
            return Err(format!(
                "an output of {} bytes arrived corrupted",
                case.bytes
            ));
        }
        release(&mut driver, case, task - 1)?;
        let [stack, base, floor] = times.map(|t| ft_jobs::median(t).unwrap_or(f64::NAN));
        lines.push(case.line_with(
            n,
            bench.reps,
            stack,
            "mpi_bcast",
            base,
            &[("activation_floor", floor)],
        ));
    }
    bench.write_timeline(me)?;
    let line = if me == 0 {
        lines.join("\n")
    } else {
        json!({"rank": me, "bench_bcast": "took part", "cases": cases.len()}).to_string()
    };
    Ok(Finished {
        line,
        saw_failure: ft_jobs::saw_failure(&driver),
    })
}

/// Keeps the stack serving until every rank has reached this point (a nonblocking
/// `MPI_Ibarrier` tested between pumps): a rank that holds its outputs may still have
/// children to serve.
fn settle(
    world: &SimpleCommunicator,
    driver: &mut RankDriver<MpiTransport>,
    limit: StdDuration,
) -> Result<(), String> {
    let mut barrier = Some(world.immediate_barrier());
    driver
        .run_until("every rank's broadcast", limit, |_, events| {
            events.clear();
            match barrier.take()?.test() {
                Ok(_) => Some(()),
                Err(pending) => {
                    barrier = Some(pending);
                    None
                }
            }
        })
        .map_err(|e| e.to_string())
}

/// The header of a `send-parts` frame: index, destination, payload length, way (0:
/// `send_parts`, 1: copied), little-endian `u32`s.
const PARTS_HEAD: usize = 16;

/// Byte `at` of the shared payload of `ftmpi send-parts`.
fn parts_byte(at: usize) -> u8 {
    (at.wrapping_mul(31) ^ (at >> 8)) as u8
}

/// `ftmpi send-parts`: see [`Command::SendParts`].
fn send_parts(
    world: &SimpleCommunicator,
    frames: u32,
    payload_bytes: usize,
    oversized: bool,
    kill: &[u32],
    limit: StdDuration,
) -> Result<Finished, String> {
    let (me, n) = (world.rank() as u32, world.size() as u32);
    let mut transport = MpiTransport::new(world).map_err(|e| e.to_string())?;
    world.barrier();
    if kill.contains(&me) {
        ft_jobs::die();
    }
    let start = WallInstant::now();
    let past_limit = || start.elapsed() > limit;
    let head = |index: u32, to: u32, way: u32| {
        let mut head = [0u8; PARTS_HEAD];
        for (k, word) in [index, to, payload_bytes as u32, way]
            .into_iter()
            .enumerate()
        {
            head[4 * k..4 * k + 4].copy_from_slice(&word.to_le_bytes());
        }
        head
    };
    let mut line = json!({"rank": me, "n": n, "frames": frames, "payload_bytes": payload_bytes});
    if me == 0 {
        let shared = bytes::Bytes::from(
            (0..frames as usize * payload_bytes)
                .map(parts_byte)
                .collect::<Vec<u8>>(),
        );
        let slice = |index: u32| {
            let at = index as usize * payload_bytes;
            shared.slice(at..at + payload_bytes)
        };
        if oversized {
            let too_long = vec![0xee; ft_core::wire::frame_capacity(n) + 1];
            for to in 1..n {
                transport.send(to, &too_long).map_err(|e| e.to_string())?;
            }
        }
        let mut micros = [0.0; 2];
        let mut frame = Vec::new();
        for way in 0..2u32 {
            let since = WallInstant::now();
            for index in 0..frames {
                for to in 1..n {
                    let head = head(index, to, way);
                    let payload = slice(index);
                    if way == 0 {
                        transport.send_parts(to, &head, &payload)
                    } else {
                        frame.clear();
                        frame.extend_from_slice(&head);
                        frame.extend_from_slice(&payload);
                        transport.send(to, &frame)
                    }
                    .map_err(|e| e.to_string())?;
                }
                transport.progress().map_err(|e| e.to_string())?;
            }
            while transport.pending_sends() > 0 {
                if past_limit() {
                    return Err(format!("{} sends still pending", transport.pending_sends()));
                }
                transport.progress().map_err(|e| e.to_string())?;
                // Receivers' answers must not pile up unread meanwhile.
                while transport.try_recv().map_err(|e| e.to_string())?.is_some() {}
            }
            micros[way as usize] =
                since.elapsed().as_secs_f64() * 1e6 / f64::from(frames * (n - 1).max(1));
        }
        // Every live receiver answers once it checked all its frames: count answers
        // (some may have been read above, while sends completed).
        let live = (1..n).filter(|r| !kill.contains(r)).count() as u64;
        while transport.stats().received < live {
            if past_limit() {
                return Err(format!(
                    "{} of {live} receivers answered",
                    transport.stats().received
                ));
            }
            if let Some(got) = transport.try_recv().map_err(|e| e.to_string())? {
                if !matches!(got.frame(), Some((_, b"done"))) {
                    return Err(format!("rank 0 got {got:?}, not an answer"));
                }
            }
        }
        line["us_per_frame"] = json!({"send_parts": micros[0], "copy_and_send": micros[1]});
    } else {
        let mut checked = 0u32;
        let mut discarded = 0u32;
        while oversized && discarded == 0 {
            if past_limit() {
                return Err("the oversized message never arrived".into());
            }
            match transport.try_recv().map_err(|e| e.to_string())? {
                None => continue,
                Some(Received::Oversized { from: 0, len })
                    if len > ft_core::wire::frame_capacity(n) =>
                {
                    discarded += 1
                }
                Some(got) => {
                    return Err(format!("rank {me} got {got:?}, not the oversized message"))
                }
            }
        }
        line["oversized_discarded"] = json!(discarded);
        while checked < 2 * frames {
            if past_limit() {
                return Err(format!("{checked} of {} frames arrived", 2 * frames));
            }
            let Some(got) = transport.try_recv().map_err(|e| e.to_string())? else {
                continue;
            };
            let Some((0, bytes)) = got.frame() else {
                return Err(format!("rank {me} got {got:?}, not a frame from rank 0"));
            };
            let (way, index) = (checked / frames, checked % frames);
            let expected_head = head(index, me, way);
            let at = index as usize * payload_bytes;
            let intact = bytes.len() == PARTS_HEAD + payload_bytes
                && bytes[..PARTS_HEAD] == expected_head
                && bytes[PARTS_HEAD..]
                    .iter()
                    .enumerate()
                    .all(|(k, &b)| b == parts_byte(at + k));
            if !intact {
                return Err(format!(
                    "rank {me}: frame {index} (way {way}) arrived garbled or out of order"
                ));
            }
            checked += 1;
        }
        transport.send(0, b"done").map_err(|e| e.to_string())?;
        while transport.pending_sends() > 0 {
            if past_limit() {
                return Err("the answer to rank 0 is still pending".into());
            }
            transport.progress().map_err(|e| e.to_string())?;
        }
        line["checked"] = json!(checked);
    }
    let stats = transport.stats();
    line["copies_payload"] = json!(Transport::copies_payload(&transport));
    line["stats"] = json!({
        "frames_sent": stats.sent,
        "frames_received": stats.received,
        "dropped_to_failed": stats.dropped_to_failed,
        "unattributed_failures": stats.unattributed_failures,
        "failure_acks": stats.failure_acks,
        "send_buffers": stats.send_buffers,
        "payload_bytes_in_place": stats.payload_bytes_in_place,
        "payload_bytes_copied": stats.payload_bytes_copied,
    });
    Ok(Finished {
        line: line.to_string(),
        saw_failure: !kill.is_empty(),
    })
}
