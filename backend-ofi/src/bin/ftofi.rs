//! `ftofi`: the whole per-rank stack over libfabric, one process per rank, with its own
//! launcher (libfabric has no `mpiexec`).
//!
//! ```sh
//! ftofi -n 4 validate --kill 2 --kill-at-ms 5
//! ftofi -n 8 validate --kill 4,5,6,7 --kill-on validate
//! ftofi -n 8 --provider sockets broadcast plans/mpi-8.json --kill 3 --kill-on activation
//! ```
//!
//! Run as above, `ftofi` is the launcher: it runs `-n` copies of itself with the same
//! arguments as a job of `ft-launch` (as `ftrun` does: a fresh rendezvous directory,
//! `FTOFI_RANK`, `FTOFI_SIZE`, `FTOFI_RENDEZVOUS`, `FTOFI_ADDRESS` = 127.0.0.1), and
//! prints every surviving rank's JSON line in rank order (each rank's standard error is
//! passed on, prefixed with its rank).
//!
//! Started with a rendezvous directory (`--rendezvous DIR` or `FTOFI_RENDEZVOUS`), it is
//! one rank: it opens its endpoint, meets the others through the directory, and runs
//! the job (`ft-jobs`' validate or broadcast, as `ftmpi` does over MPI). This is also
//! how it runs under a cluster's launcher, with `DIR` on a file system every host
//! shares; the rank and size come from the launcher's environment
//! (`backend_ofi::launcher_env`):
//!
//! ```sh
//! srun -n 64 ftofi --rendezvous /shared/job-$SLURM_JOB_ID validate
//! mpiexec -n 8 ftofi --rendezvous /shared/run1 --address 10.0.0.5 broadcast plan.json
//! ```
//!
//! The launcher first checks the whole command for `-n` ranks (`JobCommand::check`:
//! the options, the kill list, the plan file) and starts no rank if it is wrong. It
//! succeeds when the ranks `--kill` lists were killed by `SIGKILL` and every other rank
//! exited with status 0 or left by `SIGKILL` as a rank declared dead does (a stall, a
//! starved heartbeat: `ft_jobs::leave`); it then names those ranks on its standard
//! error ("declared dead but never killed"). The first rank to end any other way (an
//! error, another signal) fails the job at once: the launcher kills the other ranks
//! and says how that rank ended. A job still running after `--job-limit-s` is killed and fails.
//! An error line that several ranks print alike is passed on once.

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::Duration;

use backend_ofi::launcher_env::{self, ADDRESS_VAR, RENDEZVOUS_VAR};
use backend_ofi::{OfiConfig, OfiLaunch};
use clap::Parser;
use ft_core::Rank;
use ft_jobs::{Finished, JobCommand};
use ft_launch::{Exit, Job, Outcome, Output, Verdict};

#[derive(Parser)]
#[command(
    version,
    about = "Failure views and broadcasts over libfabric, one process per rank"
)]
struct Cli {
    /// Ranks to start (when `ftofi` launches the job itself).
    #[arg(short = 'n', long = "ranks", default_value_t = 4)]
    ranks: u32,
    /// The libfabric provider (`fi_info -l` lists them): `tcp;ofi_rxm`, `sockets`, ...
    #[arg(long, env = "FTOFI_PROVIDER", default_value = backend_ofi::DEFAULT_PROVIDER)]
    provider: String,
    /// The longest the whole job may run (when `ftofi` launches it).
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..))]
    job_limit_s: u64,
    /// Be one rank of a job, meeting the others in this directory (fresh per job, on a
    /// file system every rank's host shares); the rank and size come from the
    /// environment of the launcher that started this process.
    #[arg(long, env = RENDEZVOUS_VAR)]
    rendezvous: Option<PathBuf>,
    /// The local address this rank's endpoint binds to; by default the provider's
    /// first interface (127.0.0.1 when `ftofi` launches the job itself).
    #[arg(long, env = ADDRESS_VAR)]
    address: Option<String>,
    /// The broadcast chunk size in bytes (receive buffers grow to fit it); by default
    /// `backend_ofi::DEFAULT_CHUNK_BYTES`.
    #[arg(long, env = CHUNK_VAR, value_parser = clap::value_parser!(u64).range(1..))]
    chunk_bytes: Option<u64>,
    /// Move payloads of this many bytes and more by one-sided RMA reads (when the
    /// provider offers FI_RMA); by default `backend_ofi::DEFAULT_RMA_THRESHOLD`.
    #[arg(long, env = RMA_THRESHOLD_VAR, value_parser = clap::value_parser!(u64).range(1..))]
    rma_threshold: Option<u64>,
    /// Send every payload two-sided, never by RMA (for comparison runs).
    #[arg(long, env = TWO_SIDED_VAR, conflicts_with = "rma_threshold")]
    two_sided: bool,
    #[command(subcommand)]
    command: JobCommand,
}

/// What this program reads beside the launcher's variables ([`ft_launch`]'s).
const CHUNK_VAR: &str = "FTOFI_CHUNK_BYTES";
const RMA_THRESHOLD_VAR: &str = "FTOFI_RMA_THRESHOLD";
const TWO_SIDED_VAR: &str = "FTOFI_TWO_SIDED";

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.rendezvous {
        Some(dir) => run_rank(&cli, dir),
        None => launch(&cli),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::BadInput(e)) => {
            eprintln!("ftofi: {e}");
            ExitCode::from(BAD_INPUT)
        }
        Err(Failure::Job(e)) => {
            eprintln!("ftofi: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The exit status for bad input (options, kill list, plan file), as for clap's usage
/// errors; a job that fails exits with 1.
const BAD_INPUT: u8 = 2;

/// Why `ftofi` failed.
enum Failure {
    /// The command cannot run as given; no rank was started (or this rank did not
    /// connect).
    BadInput(String),
    /// The job ran and failed.
    Job(String),
}

impl From<String> for Failure {
    fn from(e: String) -> Self {
        Failure::Job(e)
    }
}

/// Rank mode: the job at one rank (checked before it connects); prints its line.
fn run_rank(cli: &Cli, rendezvous: &Path) -> Result<(), Failure> {
    let (rank, size) = launcher_env::rank_and_size()?;
    cli.command
        .check(size)
        .map_err(|e| Failure::BadInput(format!("rank {rank}: {e}")))?;
    let mut config = OfiConfig::new(size, rank, rendezvous);
    config.provider = cli.provider.clone();
    config.address = cli.address.clone();
    if let Some(bytes) = cli.chunk_bytes {
        config = config.with_chunk_bytes(bytes as usize);
    }
    if cli.two_sided {
        config.rma_threshold = None;
    } else if let Some(bytes) = cli.rma_threshold {
        config.rma_threshold = Some(bytes as usize);
    }
    let Finished { line, .. } = cli
        .command
        .run(&OfiLaunch::new(config))
        .map_err(|e| format!("rank {rank}: {e}"))?;
    println!("{line}");
    Ok(())
}

/// Launcher mode: checks the command, then runs `-n` copies of this program as a job of
/// [`ft_launch`], and prints the ranks' lines in rank order once every rank ended as
/// expected: killed by `SIGKILL` if `--kill` lists it, else exited with status 0. The
/// first rank to end any other way stops the job.
fn launch(cli: &Cli) -> Result<(), Failure> {
    let n = cli.ranks;
    if n == 0 {
        return Err(Failure::BadInput("-n must be at least 1".into()));
    }
    cli.command.check(n).map_err(Failure::BadInput)?;
    let job = cli.command.args();
    let exe = std::env::current_exe().map_err(|e| format!("cannot find ftofi itself: {e}"))?;
    let seen = Mutex::new(HashSet::new());
    let launched = Job::new(exe, n)
        .args(std::env::args_os().skip(1))
        .rendezvous_prefix("ftofi")
        .address(cli.address.as_deref().unwrap_or(ft_launch::LOOPBACK))
        .output(Output::Captured)
        .job_limit(Duration::from_secs(cli.job_limit_s))
        .stderr_filter(move |_, line| first_time(&seen, line));
    let declared = Mutex::new(Vec::new());
    let report = launched
        .run(|rank: Rank, exit: &Exit| {
            let killed = job.kills(rank);
            let by_sigkill = exit.signal() == Some(libc::SIGKILL);
            if !killed && by_sigkill {
                // Declared dead while alive (a stall, a starved heartbeat): it left as a
                // killed rank does, and the survivors go on without it.
                declared
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(rank);
                return Verdict::Continue;
            }
            let expected = if killed { by_sigkill } else { exit.success() };
            if expected {
                return Verdict::Continue;
            }
            let why = if killed {
                " (--kill lists it: it should have been killed by SIGKILL)"
            } else {
                ""
            };
            Verdict::Stop(format!(
                "rank {rank} {exit}{why}; the other ranks were stopped"
            ))
        })
        .map_err(|e| Failure::Job(e.to_string()))?;
    match report.outcome {
        Outcome::Completed => {
            let mut out = std::io::stdout().lock();
            for rank in &report.ranks {
                let _ = out.write_all(&rank.stdout);
            }
            let mut declared = declared.into_inner().unwrap_or_else(|e| e.into_inner());
            if !declared.is_empty() {
                declared.sort_unstable();
                eprintln!("ftofi: declared dead but never killed: ranks {declared:?}");
            }
            Ok(())
        }
        outcome => Err(Failure::Job(outcome.to_string())),
    }
}

/// Whether `line` of a rank's standard error has not been passed on yet: a rank's own
/// error line (`ftofi: rank R: ...`) counts as seen when another rank printed the same
/// error.
fn first_time(seen: &Mutex<HashSet<String>>, line: &str) -> bool {
    let Some(error) = line
        .strip_prefix("ftofi: rank ")
        .and_then(|rest| rest.split_once(": "))
        .map(|(_, error)| error)
    else {
        return true;
    };
    seen.lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(error.to_string())
}
