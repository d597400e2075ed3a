//! `ftrun`: runs any program as an N-rank job over libfabric on this machine.
//!
//! ```sh
//! ftrun -n 4 -- ./my-ft-program --steps 10
//! ftrun -n 3 --provider sockets --output ordered -- ftofi validate
//! ftrun -n 6 --spares 2 -- ftjacobi --backend ofi --mode rebuild --kill 2@60
//! ```
//!
//! It starts `-n` processes of the program (and `--spares` more, ranks `N..N+K`, with
//! `FT_SPARES=K` in their environment), each with `FTOFI_RANK`, `FTOFI_SIZE`,
//! `FTOFI_RENDEZVOUS` (a fresh directory, removed after the job, unless
//! `--rendezvous` names one), `FTOFI_ADDRESS` (127.0.0.1) and, with `--provider`,
//! `FTOFI_PROVIDER`: what `ft::ofi::open_from_env` reads. Standard output passes
//! whole lines unchanged, standard error lines prefixed `[rank N] `.
//!
//! The job survives ranks killed by a signal (each such end is noted once on standard
//! error); it exits 0 when every other rank exited 0. The first rank to exit non-zero
//! ends the job at once: the other ranks are killed and `ftrun` exits with that rank's
//! status. Bad command lines and a program that cannot be found exit 2 before any rank
//! starts.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use ft_launch::{Exit, Job, Outcome, Output, Report, Verdict, SPARES_VAR};

#[derive(Parser)]
#[command(
    version,
    override_usage = "ftrun -n N [--spares K] [OPTIONS] [--] PROGRAM [ARGS]...",
    about = "Runs a program as an N-rank job over libfabric on this machine",
    long_about = "Runs a program as an N-rank job over libfabric on this machine.\n\n\
        Each rank is a process of PROGRAM with FTOFI_RANK (0..N), FTOFI_SIZE (N), \
        FTOFI_RENDEZVOUS (a fresh directory, removed after the job, unless --rendezvous \
        names one), FTOFI_ADDRESS (127.0.0.1) and, with --provider, FTOFI_PROVIDER in \
        its environment: what ft::ofi::open_from_env reads. With --spares K, K more \
        ranks (N..N+K, FTOFI_SIZE N+K) start as spares and every rank has FT_SPARES=K \
        in its environment: a program that rebuilds from spares (ftjacobi --mode \
        rebuild) takes its spare count from it. Each rank leads its own process group; \
        SIGINT and SIGTERM are passed on to the ranks.\n\n\
        Standard output passes whole lines unchanged; standard error lines are \
        prefixed with '[rank N] '.",
    after_help = "Exit status: 0 when every rank that was not killed by a signal exited 0 \
        (a rank killed by a signal is noted and the job goes on; if every rank was \
        killed, 1). The first rank to exit non-zero stops the others (SIGKILL to their \
        process groups) and ftrun exits with its status (1 if it is outside 1..=255). \
        A job past --job-limit-s is killed and exits 1. A bad command line or a \
        program that cannot be found exits 2 before any rank starts; a signal that \
        interrupted ftrun ends it by the same signal."
)]
struct Cli {
    /// Ranks to start.
    #[arg(short = 'n', long = "ranks", value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    ranks: u32,
    /// Spare ranks started after the N working ones, to replace failed ranks: the
    /// job has N+K ranks, and FT_SPARES=K tells the program how many are spares.
    #[arg(long, value_name = "K", default_value_t = 0)]
    spares: u32,
    /// The libfabric provider every rank uses (FTOFI_PROVIDER): `tcp;ofi_rxm`,
    /// `sockets`, ... (`fi_info -l` lists them); unset, each rank's own default.
    #[arg(long)]
    provider: Option<String>,
    /// Meet in this directory (made if missing, left in place) instead of a fresh one.
    #[arg(long, value_name = "DIR")]
    rendezvous: Option<PathBuf>,
    /// The address every rank's endpoint binds to (FTOFI_ADDRESS).
    #[arg(long, default_value = ft_launch::LOOPBACK)]
    address: String,
    /// The longest the job may run, in seconds; past it every rank is killed.
    #[arg(long, value_name = "S", default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..))]
    job_limit_s: u64,
    /// How the ranks' standard output is passed on.
    #[arg(long, value_enum, default_value_t = OutputArg::Stream)]
    output: OutputArg,
    /// The program each rank runs, and its arguments.
    #[arg(
        value_name = "PROGRAM ARGS",
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    command: Vec<OsString>,
}

#[derive(Clone, Copy, ValueEnum)]
enum OutputArg {
    /// Each line as soon as a rank writes it.
    Stream,
    /// All of rank 0's lines, then rank 1's, ..., when the job ends.
    Ordered,
}

/// The exit status for a bad command line or a missing program, as clap's.
const BAD_INPUT: u8 = 2;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (program, args) = cli.command.split_first().expect("clap requires PROGRAM");
    if let Err(e) = ft_launch::find_program(program) {
        eprintln!("ftrun: {e}");
        return ExitCode::from(BAD_INPUT);
    }
    let Some(size) = cli.ranks.checked_add(cli.spares) else {
        eprintln!(
            "ftrun: -n {} with --spares {} is too many ranks",
            cli.ranks, cli.spares
        );
        return ExitCode::from(BAD_INPUT);
    };
    let mut job = Job::new(program, size)
        .args(args)
        .address(&cli.address)
        .job_limit(Duration::from_secs(cli.job_limit_s))
        .output(match cli.output {
            OutputArg::Stream => Output::Stream,
            OutputArg::Ordered => Output::Ordered,
        });
    if cli.spares > 0 {
        job = job.env(SPARES_VAR, cli.spares.to_string());
    }
    if let Some(provider) = &cli.provider {
        job = job.provider(provider);
    }
    if let Some(dir) = &cli.rendezvous {
        job = job.rendezvous(dir);
    }
    match job.run(survivors_decide) {
        Ok(report) => verdict(&report),
        Err(e) => {
            eprintln!("ftrun: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `ftrun`'s policy: a rank killed by a signal is noted and the job goes on; a rank
/// that exits non-zero (or whose end is unknown) stops it.
fn survivors_decide(rank: u32, exit: &Exit) -> Verdict {
    match exit {
        Exit::Status(0) => Verdict::Continue,
        Exit::Signal(_) => {
            eprintln!("ftrun: rank {rank} {exit}");
            Verdict::Continue
        }
        _ => Verdict::Stop(format!("rank {rank} {exit}; the other ranks were stopped")),
    }
}

/// The job's exit status, with one message when it failed.
fn verdict(report: &Report) -> ExitCode {
    match &report.outcome {
        Outcome::Completed => {
            let survivors = report
                .ranks
                .iter()
                .filter(|r| r.exit.as_ref().is_some_and(|e| e.signal().is_none()))
                .count();
            if survivors == 0 {
                eprintln!("ftrun: every rank was killed by a signal");
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        outcome => {
            eprintln!("ftrun: {outcome}");
            match *outcome {
                Outcome::Stopped { rank, .. } => {
                    ExitCode::from(report.exit(rank).map_or(1, Exit::failure_code))
                }
                Outcome::Interrupted { signal } => ft_launch::exit_like_signal(signal),
                _ => ExitCode::FAILURE,
            }
        }
    }
}
