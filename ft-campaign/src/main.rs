//! `ftcampaign`: runs a fault campaign on one real backend and reports (see the
//! `ft_campaign` crate docs for what each run is checked for).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use ft_campaign::{Backend, Campaign, GenConfig, Timing, Tools};

#[derive(Parser)]
#[command(
    version,
    about = "Runs randomized real jobs with random kills on a backend and reports hangs, \
             disagreements on G and lost outputs"
)]
struct Cli {
    /// The backend: `ofi-tcp`, `ofi-sockets` or `mpi`.
    #[arg(long, value_parser = parse_backend)]
    backend: Backend,
    /// How many runs (indices 0..N).
    #[arg(long, default_value_t = 10)]
    runs: u64,
    /// The seed every run's generator derives from (with the run index).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Run only this run index (to replay a failure).
    #[arg(long)]
    only: Option<u64>,
    /// The largest job (jobs have 2 to this many ranks).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(2..))]
    ranks_max: u32,
    /// The most ranks one job kills (never more than half of them).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    max_kills: u32,
    /// Heartbeat period given to every job.
    #[arg(long, default_value_t = 50)]
    period_ms: u64,
    /// Detector timeout given to every job.
    #[arg(long, default_value_t = 1000)]
    timeout_ms: u64,
    /// The longest one job may run before its process group is killed (a hang).
    #[arg(long, default_value_t = 60)]
    job_timeout_s: u64,
    /// Where failing runs' logs go (default: a directory under the system's temp dir
    /// named for the backend and seed).
    #[arg(long)]
    logs: Option<PathBuf>,
    /// Keep the logs of passing runs too.
    #[arg(long)]
    keep_all: bool,
    /// Print the summary as one JSON object (progress goes to standard error).
    #[arg(long)]
    json: bool,
    /// The `ftofi` binary (default: beside this one).
    #[arg(long)]
    ftofi: Option<PathBuf>,
    /// The `ftmpi` binary (default: beside this one).
    #[arg(long)]
    ftmpi: Option<PathBuf>,
    /// Open MPI's `mpiexec` (default: `FT_MPIEXEC`, beside `MPICC`, or
    /// `.tools/openmpi-5.0.11/bin/mpiexec`).
    #[arg(long)]
    mpiexec: Option<PathBuf>,
}

fn parse_backend(name: &str) -> Result<Backend, String> {
    Backend::from_name(name).ok_or_else(|| {
        let names: Vec<&str> = Backend::ALL.iter().map(|b| b.name()).collect();
        format!("unknown backend {name:?} (one of {})", names.join(", "))
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut tools = Tools::beside_this_executable();
    tools.ftofi = cli.ftofi.clone().unwrap_or(tools.ftofi);
    tools.ftmpi = cli.ftmpi.clone().unwrap_or(tools.ftmpi);
    tools.mpiexec = cli.mpiexec.clone().unwrap_or(tools.mpiexec);
    let program = match cli.backend {
        Backend::OfiTcp | Backend::OfiSockets => &tools.ftofi,
        Backend::Mpi => &tools.ftmpi,
    };
    if !program.exists() {
        eprintln!(
            "ftcampaign: {} not found (build it: cargo build --release -p {}, or name it \
             with --{})",
            program.display(),
            if cli.backend == Backend::Mpi {
                "backend-mpi"
            } else {
                "backend-ofi"
            },
            if cli.backend == Backend::Mpi {
                "ftmpi"
            } else {
                "ftofi"
            },
        );
        return ExitCode::from(2);
    }
    let logs = cli.logs.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("ftcampaign-{}-seed{}", cli.backend, cli.seed))
    });
    let campaign = Campaign {
        backend: cli.backend,
        seed: cli.seed,
        runs: match cli.only {
            Some(run) => vec![run],
            None => (0..cli.runs).collect(),
        },
        gen: GenConfig {
            ranks_max: cli.ranks_max,
            max_kills: cli.max_kills,
        },
        timing: Timing {
            period_ms: cli.period_ms,
            timeout_ms: cli.timeout_ms,
            limit_s: cli.job_timeout_s,
        },
        job_timeout: Duration::from_secs(cli.job_timeout_s),
        logs,
        keep_all: cli.keep_all,
        tools,
    };
    let json = cli.json;
    let result = campaign.run(|r| {
        let line = format!(
            "run {:>4} {:<12} {:>5.1} s  {}{}",
            r.job.run,
            r.verdict.class.name(),
            r.wall.as_secs_f64(),
            r.job.describe(),
            if r.verdict.detail.is_empty() {
                String::new()
            } else {
                format!("\n          {}", r.verdict.detail)
            }
        );
        if json {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    });
    match result {
        Ok(summary) => {
            if json {
                println!("{}", campaign.summary_json(&summary));
            } else {
                println!("{}", campaign.summary_text(&summary));
            }
            if summary.passed() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("ftcampaign: {e}");
            ExitCode::from(2)
        }
    }
}
