//! `ftofi`: the whole per-rank stack over libfabric, one process per rank, with its own
//! launcher (libfabric has no `mpiexec`).
//!
//! ```sh
//! ftofi -n 4 validate --kill 2 --kill-at-ms 5
//! ftofi -n 8 validate --kill 4,5,6,7 --kill-on validate
//! ftofi -n 8 --provider sockets broadcast plans/mpi-8.json --kill 3 --kill-on activation
//! ```
//!
//! Run as above, `ftofi` is the launcher: it makes a fresh rendezvous directory, starts
//! `-n` copies of itself with the same arguments and `FTOFI_RANK`, `FTOFI_SIZE`,
//! `FTOFI_RENDEZVOUS`, `FTOFI_ADDRESS` (127.0.0.1: every rank is on this machine) in
//! their environment, and prints every surviving rank's JSON line in rank order (each
//! child's standard error is passed on, prefixed with its rank).
//!
//! Started with a rendezvous directory (`--rendezvous DIR` or `FTOFI_RENDEZVOUS`), it is
//! one rank: it opens its endpoint, meets the others through the directory, and runs
//! the job (`ft-jobs`' validate or broadcast, as `ftmpi` does over MPI). This is also
//! how it runs under a cluster's launcher, with `DIR` on a file system every host
//! shares; the rank and size come from the launcher's environment (see [`RANK_SIZE`]):
//!
//! ```sh
//! srun -n 64 ftofi --rendezvous /shared/job-$SLURM_JOB_ID validate
//! mpiexec -n 8 ftofi --rendezvous /shared/run1 --address 10.0.0.5 broadcast plan.json
//! ```
//!
//! The launcher first checks the whole command for `-n` ranks (`JobCommand::check`:
//! the options, the kill list, the plan file) and starts no rank if it is wrong. It
//! succeeds when exactly the ranks `--kill` lists were killed by `SIGKILL` and every
//! other rank exited with status 0. The first rank to end any other way (an error, an
//! unlisted signal) fails the job at once: the launcher kills the other ranks and says
//! how that rank ended. A job still running after `--job-limit-s` is killed and fails.
//! An error line that several ranks print alike is passed on once.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command as Process, ExitCode, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use backend_ofi::{OfiConfig, OfiLaunch};
use clap::Parser;
use ft_core::Rank;
use ft_jobs::{Finished, JobCommand};

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

/// What the launcher tells each rank it starts.
const RANK_VAR: &str = "FTOFI_RANK";
const SIZE_VAR: &str = "FTOFI_SIZE";
const RENDEZVOUS_VAR: &str = "FTOFI_RENDEZVOUS";
const ADDRESS_VAR: &str = "FTOFI_ADDRESS";
const CHUNK_VAR: &str = "FTOFI_CHUNK_BYTES";
const RMA_THRESHOLD_VAR: &str = "FTOFI_RMA_THRESHOLD";
const TWO_SIDED_VAR: &str = "FTOFI_TWO_SIDED";

/// Where launchers put a process's rank and the job's size, tried in this order:
/// `ftofi`'s own, Open MPI's `mpiexec`, MPICH's Hydra (and other PMI launchers), Slurm.
const RANK_SIZE: [(&str, &str); 4] = [
    (RANK_VAR, SIZE_VAR),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMI_RANK", "PMI_SIZE"),
    ("SLURM_PROCID", "SLURM_NTASKS"),
];

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
    let (rank, size) = rank_and_size()?;
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

/// This process's rank and the job's size, from the first launcher's pair of
/// [`RANK_SIZE`] variables that is set.
fn rank_and_size() -> Result<(Rank, u32), String> {
    let (rank_var, size_var) = RANK_SIZE
        .iter()
        .find(|(rank, _)| std::env::var_os(rank).is_some())
        .ok_or_else(|| {
            let names: Vec<&str> = RANK_SIZE.iter().map(|(rank, _)| *rank).collect();
            format!("no launcher set this process's rank (none of {names:?})")
        })?;
    let read = |name: &str| -> Result<u32, String> {
        let text = std::env::var(name).map_err(|_| format!("{name} is not set"))?;
        text.parse()
            .map_err(|_| format!("{name}={text} is not a number"))
    };
    let (rank, size) = (read(rank_var)?, read(size_var)?);
    if rank >= size {
        return Err(format!("{rank_var}={rank} is outside 0..{size}"));
    }
    Ok((rank, size))
}

/// What a launched rank left behind.
struct Exit {
    rank: Rank,
    status: std::io::Result<ExitStatus>,
    stdout: String,
}

impl Exit {
    /// Whether the rank ended as the job expects: killed by `SIGKILL` if `--kill`
    /// lists it, else exited with status 0.
    fn as_expected(&self, killed: bool) -> bool {
        self.status.as_ref().is_ok_and(|s| {
            if killed {
                s.signal() == Some(libc::SIGKILL)
            } else {
                s.success()
            }
        })
    }

    /// How the rank ended, for a person.
    fn describe(&self) -> String {
        match &self.status {
            Ok(status) => match status.signal() {
                Some(libc::SIGKILL) => "was killed by SIGKILL".to_string(),
                Some(signal) => format!("was killed by signal {signal}"),
                None => format!("exited with status {}", status.code().unwrap_or(-1)),
            },
            Err(e) => format!("could not be waited for: {e}"),
        }
    }
}

/// Launcher mode: checks the command, starts the ranks, waits for them, prints their
/// lines, judges their exits; the first unexpected exit ends the job.
fn launch(cli: &Cli) -> Result<(), Failure> {
    let n = cli.ranks;
    if n == 0 {
        return Err(Failure::BadInput("-n must be at least 1".into()));
    }
    cli.command.check(n).map_err(Failure::BadInput)?;
    let job = cli.command.args();
    let rendezvous = Rendezvous::new()?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find ftofi itself: {e}"))?;
    let (done, exits) = mpsc::channel();
    let seen = Arc::new(Mutex::new(HashSet::new()));
    let mut pids = Vec::new();
    let kill_all = |pids: &[u32]| {
        for &pid in pids {
            // SAFETY: kill(2) on a child's pid; no memory is involved. A child that has
            // exited already is a zombie until its waiting thread reaps it, so the pid
            // is still ours.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        }
    };
    for rank in 0..n {
        let child = Process::new(&exe)
            .args(std::env::args_os().skip(1))
            .env(RANK_VAR, rank.to_string())
            .env(SIZE_VAR, n.to_string())
            .env(RENDEZVOUS_VAR, rendezvous.path())
            .env(ADDRESS_VAR, cli.address.as_deref().unwrap_or(LOOPBACK))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        let mut child = match child {
            Ok(child) => child,
            Err(e) => {
                kill_all(&pids);
                return Err(Failure::Job(format!("cannot start rank {rank}: {e}")));
            }
        };
        pids.push(child.id());
        let stderr = child.stderr.take().expect("piped");
        let seen = Arc::clone(&seen);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if first_time(&seen, &line) {
                    eprintln!("[rank {rank}] {line}");
                }
            }
        });
        let done = done.clone();
        std::thread::spawn(move || {
            let mut stdout = String::new();
            if let Some(mut out) = child.stdout.take() {
                let _ = out.read_to_string(&mut stdout);
            }
            let status = child.wait();
            let _ = done.send(Exit {
                rank,
                status,
                stdout,
            });
        });
    }
    drop(done);
    let deadline = Instant::now() + Duration::from_secs(cli.job_limit_s);
    let mut finished: Vec<Exit> = Vec::with_capacity(n as usize);
    while finished.len() < n as usize {
        match exits.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(exit) if exit.as_expected(job.kills(exit.rank)) => finished.push(exit),
            Ok(exit) => {
                kill_all(&pids);
                // Let the other ranks' standard error drain before the verdict.
                std::thread::sleep(Duration::from_millis(100));
                return Err(Failure::Job(format!(
                    "rank {} {}{}; the other ranks were stopped",
                    exit.rank,
                    exit.describe(),
                    if job.kills(exit.rank) {
                        " (--kill lists it: it should have been killed by SIGKILL)"
                    } else {
                        ""
                    }
                )));
            }
            Err(_) => {
                kill_all(&pids);
                return Err(Failure::Job(format!(
                    "the job ran past {} s and was killed",
                    cli.job_limit_s
                )));
            }
        }
    }
    finished.sort_by_key(|e| e.rank);
    for exit in &finished {
        print!("{}", exit.stdout);
    }
    Ok(())
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

/// Where the ranks of a job `ftofi` launches listen: all on this machine.
const LOOPBACK: &str = "127.0.0.1";

/// A fresh directory for the ranks' endpoint names, removed when the job ends.
struct Rendezvous(PathBuf);

impl Rendezvous {
    fn new() -> Result<Self, String> {
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let path = std::env::temp_dir().join(format!("ftofi-{}-{stamp}", std::process::id()));
        std::fs::create_dir_all(&path)
            .map_err(|e| format!("cannot make {}: {e}", path.display()))?;
        Ok(Rendezvous(path))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Rendezvous {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
