//! `ftcampaign`: runs a fault campaign on one real backend and reports (see the
//! `ft_campaign` crate docs for what each run is checked for).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use ft_campaign::{parse_ranks, App, Backend, Campaign, GenConfig, Timing, Tools};

#[derive(Parser)]
#[command(
    version,
    about = "Runs randomized real jobs (ft-jobs' validate and broadcast, or fttask task \
             graphs) with random kills (and, in validate jobs, stalls) on a backend and \
             reports hangs, disagreements on G and lost outputs"
)]
struct Cli {
    /// The backend: `ofi-tcp`, `ofi-sockets` or `mpi` (for `--app taskgraph`: `ftrun`
    /// over tcp or sockets, or `mpiexec --with-ft ulfm`, around `fttask`).
    #[arg(long, value_parser = parse_backend)]
    backend: Backend,
    /// The application: `jobs` (ft-jobs' validate and broadcast jobs) or `taskgraph`
    /// (the task-graph runtime `fttask`).
    #[arg(long, value_parser = parse_app, default_value = "jobs")]
    app: App,
    /// How many runs (indices 0..N).
    #[arg(long, default_value_t = 10)]
    runs: u64,
    /// The seed every run's generator derives from (with the run index).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Run only this run index (to replay a failure).
    #[arg(long)]
    only: Option<u64>,
    /// Job sizes: `A..B` (A to B ranks, both included) or `N`; at least 2.
    #[arg(long, default_value = "2..8", value_parser = parse_ranks_arg)]
    ranks: (u32, u32),
    /// The most ranks one job kills or stalls (never more than half of them, never all).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    max_kills: u32,
    /// Heartbeat period given to every job (`--app jobs`; `fttask` has its own).
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
    /// The `fttask` binary, built with the backend's feature (`--features ofi` for
    /// `ofi-*`, `--features mpi` for `mpi`; default: beside this one).
    #[arg(long)]
    fttask: Option<PathBuf>,
    /// The `ftrun` launcher of task-graph jobs over libfabric (default: beside this one).
    #[arg(long)]
    ftrun: Option<PathBuf>,
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

fn parse_app(name: &str) -> Result<App, String> {
    App::from_name(name).ok_or_else(|| {
        let names: Vec<&str> = App::ALL.iter().map(|a| a.name()).collect();
        format!("unknown app {name:?} (one of {})", names.join(", "))
    })
}

fn parse_ranks_arg(s: &str) -> Result<(u32, u32), String> {
    parse_ranks(s).map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut tools = Tools::beside_this_executable();
    tools.ftofi = cli.ftofi.clone().unwrap_or(tools.ftofi);
    tools.ftmpi = cli.ftmpi.clone().unwrap_or(tools.ftmpi);
    tools.mpiexec = cli.mpiexec.clone().unwrap_or(tools.mpiexec);
    tools.fttask = cli.fttask.clone().unwrap_or(tools.fttask);
    tools.ftrun = cli.ftrun.clone().unwrap_or(tools.ftrun);
    let ofi = cli.backend != Backend::Mpi;
    // What must exist, and how to get it.
    let needed: Vec<(&PathBuf, &str, &str)> = match cli.app {
        App::Jobs if ofi => vec![(&tools.ftofi, "-p backend-ofi", "ftofi")],
        App::Jobs => vec![(&tools.ftmpi, "-p backend-mpi", "ftmpi")],
        App::Taskgraph if ofi => vec![
            (&tools.fttask, "-p ft-taskgraph --features ofi", "fttask"),
            (&tools.ftrun, "-p ft-launch", "ftrun"),
        ],
        App::Taskgraph => vec![(&tools.fttask, "-p ft-taskgraph --features mpi", "fttask")],
    };
    for (program, package, flag) in needed {
        if !program.exists() {
            eprintln!(
                "ftcampaign: {} not found (build it: cargo build --release {package}, or name \
                 it with --{flag})",
                program.display(),
            );
            return ExitCode::from(2);
        }
    }
    let logs = cli.logs.clone().unwrap_or_else(|| {
        let app = match cli.app {
            App::Jobs => String::new(),
            App::Taskgraph => "taskgraph-".into(),
        };
        std::env::temp_dir().join(format!("ftcampaign-{app}{}-seed{}", cli.backend, cli.seed))
    });
    let campaign = Campaign {
        backend: cli.backend,
        app: cli.app,
        seed: cli.seed,
        runs: match cli.only {
            Some(run) => vec![run],
            None => (0..cli.runs).collect(),
        },
        gen: GenConfig {
            ranks_min: cli.ranks.0,
            ranks_max: cli.ranks.1,
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
