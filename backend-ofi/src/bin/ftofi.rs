//! `ftofi`: the whole per-rank stack over libfabric, one process per rank, with its own
//! launcher (libfabric has no `mpiexec`).
//!
//! ```sh
//! ftofi -n 4 validate --kill 2 --kill-at-ms 5
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
//! The launcher succeeds when every rank exited with status 0, except the rank chosen
//! by `--kill`, which must have been killed by `SIGKILL`; a job still running after
//! `--job-limit-s` is killed and fails.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command as Process, ExitCode, ExitStatus, Stdio};
use std::sync::mpsc;
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
    #[arg(long, default_value_t = 120)]
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
    #[command(subcommand)]
    command: JobCommand,
}

/// What the launcher tells each rank it starts.
const RANK_VAR: &str = "FTOFI_RANK";
const SIZE_VAR: &str = "FTOFI_SIZE";
const RENDEZVOUS_VAR: &str = "FTOFI_RENDEZVOUS";
const ADDRESS_VAR: &str = "FTOFI_ADDRESS";

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
        Err(e) => {
            eprintln!("ftofi: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Rank mode: the job at one rank; prints its line.
fn run_rank(cli: &Cli, rendezvous: &Path) -> Result<(), String> {
    let (rank, size) = rank_and_size()?;
    let mut config = OfiConfig::new(rank, size, rendezvous);
    config.provider = cli.provider.clone();
    config.address = cli.address.clone();
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

/// Launcher mode: starts the ranks, waits for them, prints their lines, judges their
/// exits.
fn launch(cli: &Cli) -> Result<(), String> {
    let n = cli.ranks;
    if n == 0 {
        return Err("-n must be at least 1".into());
    }
    let job = cli.command.args();
    job.check(n)?;
    let rendezvous = Rendezvous::new()?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find ftofi itself: {e}"))?;
    let (done, exits) = mpsc::channel();
    let mut pids = Vec::new();
    for rank in 0..n {
        let mut child = Process::new(&exe)
            .args(std::env::args_os().skip(1))
            .env(RANK_VAR, rank.to_string())
            .env(SIZE_VAR, n.to_string())
            .env(RENDEZVOUS_VAR, rendezvous.path())
            .env(ADDRESS_VAR, cli.address.as_deref().unwrap_or(LOOPBACK))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start rank {rank}: {e}"))?;
        pids.push(child.id());
        let stderr = child.stderr.take().expect("piped");
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[rank {rank}] {line}");
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
            Ok(exit) => finished.push(exit),
            Err(_) => {
                for &pid in &pids {
                    // SAFETY: kill(2) on a child's pid; no memory is involved.
                    unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
                }
                return Err(format!(
                    "the job ran past {} s and was killed",
                    cli.job_limit_s
                ));
            }
        }
    }
    finished.sort_by_key(|e| e.rank);
    let mut wrong = Vec::new();
    for exit in &finished {
        print!("{}", exit.stdout);
        let status = exit.status.as_ref().map_err(|e| e.to_string());
        let expected = if job.kill == Some(exit.rank) {
            status
                .as_ref()
                .is_ok_and(|s| s.signal() == Some(libc::SIGKILL))
        } else {
            status.as_ref().is_ok_and(|s| s.success())
        };
        if !expected {
            wrong.push(format!("rank {} ended with {status:?}", exit.rank));
        }
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("; "))
    }
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
