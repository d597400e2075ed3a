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
//! `FTOFI_RENDEZVOUS` and `FTOFI_PROVIDER` in their environment, and prints every
//! surviving rank's JSON line in rank order (each child's standard error is passed on,
//! prefixed with its rank). Started with `FTOFI_RANK` set, it is that rank: it opens
//! its endpoint, meets the others through the rendezvous directory, and runs the job
//! (`ft-jobs`' validate or broadcast, as `ftmpi` does over MPI).
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

use backend_ofi::OfiLaunch;
use clap::Parser;
use ft_core::Rank;
use ft_jobs::{Finished, JobCommand};

#[derive(Parser)]
#[command(
    version,
    about = "Failure views and broadcasts over libfabric, one process per rank"
)]
struct Cli {
    /// Ranks to start.
    #[arg(short = 'n', long = "ranks", default_value_t = 4)]
    ranks: u32,
    /// The libfabric provider (`fi_info -l` lists them): `tcp;ofi_rxm`, `sockets`, ...
    #[arg(long, default_value = backend_ofi::DEFAULT_PROVIDER)]
    provider: String,
    /// The longest the whole job may run.
    #[arg(long, default_value_t = 120)]
    job_limit_s: u64,
    #[command(subcommand)]
    command: JobCommand,
}

/// The environment a launched rank reads.
const RANK_VAR: &str = "FTOFI_RANK";
const SIZE_VAR: &str = "FTOFI_SIZE";
const RENDEZVOUS_VAR: &str = "FTOFI_RENDEZVOUS";
const PROVIDER_VAR: &str = "FTOFI_PROVIDER";

fn main() -> ExitCode {
    let cli = Cli::parse();
    match std::env::var(RANK_VAR) {
        Ok(rank) => run_rank(&cli, &rank),
        Err(_) => match launch(&cli) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("ftofi: {e}");
                ExitCode::FAILURE
            }
        },
    }
}

/// Rank mode: the job at one rank; prints its line.
fn run_rank(cli: &Cli, rank: &str) -> ExitCode {
    let launch = rank_launch(rank);
    let result = launch
        .and_then(|launch| cli.command.run(&launch))
        .map_err(|e| format!("rank {rank}: {e}"));
    match result {
        Ok(Finished { line, .. }) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ftofi: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The rank's launch settings, from the environment the launcher set.
fn rank_launch(rank: &str) -> Result<OfiLaunch, String> {
    let var = |name: &str| std::env::var(name).map_err(|_| format!("{name} is not set"));
    let rank: Rank = rank
        .parse()
        .map_err(|_| format!("{RANK_VAR}={rank} is not a rank"))?;
    let size: u32 = var(SIZE_VAR)?
        .parse()
        .map_err(|_| format!("{SIZE_VAR} is not a size"))?;
    if rank >= size {
        return Err(format!("{RANK_VAR}={rank} is outside 0..{size}"));
    }
    Ok(OfiLaunch::new(
        rank,
        size,
        PathBuf::from(var(RENDEZVOUS_VAR)?),
        var(PROVIDER_VAR)?,
    ))
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
    if job.kill.is_some_and(|k| k >= n) {
        return Err(format!("--kill names a rank outside 0..{n}"));
    }
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
            .env(PROVIDER_VAR, &cli.provider)
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
