//! `fttask-bench`: what fault tolerance costs a task runtime. In one run of this
//! process it times the same graphs (`cholesky --tiles 12 --tile-size 128` and `random
//! --tasks 300 --max-bytes 1048576`, each at n = 2, 4 and 8) on one backend, two ways,
//! alternating, over several repetitions:
//!
//! - **ft**: the runtime as `fttask` runs it: each finished task's outputs leave as one
//!   broadcast over `ft`'s trees (`--strategy per-class`, the workload's topology),
//!   every output is kept, immutable, until the graph completes, and the comm thread
//!   watches for failures, ready to agree on `G` and recover;
//! - **baseline** (`--baseline`): the same graph, kernels, workers, scheduler and
//!   `Runtime` (its failure detector still heartbeats, and outputs are still kept),
//!   but each output goes by plain `Runtime::send` messages from its producer to each
//!   consumer rank, over the same transport. It leaves out the broadcast layer (plans,
//!   trees, activation headers, the relaying ranks' forwarding and the broadcasts'
//!   bookkeeping) and every step of failure handling (no recovery, no holdings, no
//!   validation after the first).
//!
//! It prints, per workload and rank count, the median over the repetitions of the
//! ratio ft / baseline of the graph's time (`seconds` of the report: from the start of
//! the graph to the collector's end), and the lowest and highest ratio. Then, at n = 8,
//! the time to finish when the block of ranks 2–3 dies mid-graph, against the
//! failure-free ft time of the same repetition, with the extra time in units of the
//! detector timeout (most of it is the silence the detector waits out). Ratios, not
//! times, are the result: both runs of a pair share the machine's state.
//!
//! - `--backend sim` (the default): the ranks are threads of this process.
//! - `--backend ofi`: each job runs under `ftrun -n N -- FTTASK --backend ofi …`.
//! - `--backend mpi`: each job runs under `mpiexec --with-ft ulfm --oversubscribe -n N
//!   FTTASK --backend mpi …`.
//!
//! `FTTASK` is a `fttask` binary built with the backend's feature (`--fttask`; by
//! default the one beside this binary).

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use ft_taskgraph::backends::{run_sim, JobEnd};
use ft_taskgraph::cli::Cli;

/// Where the jobs run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Backend {
    /// In this process, through `ft::sim`.
    Sim,
    /// Under `ftrun` (libfabric).
    Ofi,
    /// Under `mpiexec --with-ft ulfm` (Open MPI).
    Mpi,
}

#[derive(Parser)]
#[command(
    name = "fttask-bench",
    about = "ft / baseline and recovery time of fttask graphs"
)]
struct Args {
    /// Repetitions per workload and rank count.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    reps: u32,
    /// The backend.
    #[arg(long, value_enum, default_value = "sim")]
    backend: Backend,
    /// The `fttask` binary real jobs run (built with the backend's feature).
    #[arg(long)]
    fttask: Option<PathBuf>,
    /// The `ftrun` launcher (`--backend ofi`; default: beside this binary).
    #[arg(long)]
    ftrun: Option<PathBuf>,
    /// The `mpiexec` launcher (`--backend mpi`).
    #[arg(long, default_value = ".tools/openmpi-5.0.11/bin/mpiexec")]
    mpiexec: PathBuf,
}

/// The workloads: name, arguments, and the K of the block kill (below every rank's
/// failure-free task count at n = 8).
const WORKLOADS: [(&str, &[&str], u32); 2] = [
    (
        "cholesky",
        &[
            "cholesky",
            "--tiles",
            "12",
            "--tile-size",
            "128",
            "--seed",
            "3",
        ],
        6,
    ),
    (
        "random",
        &[
            "random",
            "--tasks",
            "300",
            "--max-bytes",
            "1048576",
            "--seed",
            "5",
        ],
        4,
    ),
];

/// The detector timeout every job runs with (fttask's default).
const TIMEOUT: Duration = Duration::from_millis(1000);

/// Runs jobs on one backend.
struct Runner {
    backend: Backend,
    fttask: PathBuf,
    ftrun: PathBuf,
    mpiexec: PathBuf,
}

impl Runner {
    /// The graph's time of one job of `n` ranks with `args`, or why it failed.
    fn seconds(&self, n: u32, args: &[String]) -> Result<f64, String> {
        let mut line = vec![
            "--backend".to_string(),
            format!("{:?}", self.backend).to_lowercase(),
        ];
        line.extend(args.iter().cloned());
        if self.backend == Backend::Sim {
            line.splice(0..0, ["-n".to_string(), n.to_string()]);
            let cli = Cli::try_parse_from(["fttask".to_string()].iter().chain(&line))
                .map_err(|e| e.to_string())?;
            return match run_sim(&cli) {
                JobEnd::Reported(_, _, report) => Ok(report.seconds),
                JobEnd::BadInput(e) => Err(format!("bad input: {e}")),
                JobEnd::Failed(e) => Err(e),
                JobEnd::Quiet => Err("nobody reported".into()),
            };
        }
        let mut command = match self.backend {
            Backend::Ofi => {
                let mut c = Command::new(&self.ftrun);
                c.args(["-n", &n.to_string(), "--"]);
                c
            }
            _ => {
                let mut c = Command::new(&self.mpiexec);
                c.args(["--with-ft", "ulfm", "--oversubscribe", "-n", &n.to_string()])
                    .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
                    .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
                c
            }
        };
        let out = command
            .arg(&self.fttask)
            .args(&line)
            .output()
            .map_err(|e| format!("cannot start the launcher: {e}"))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let report = stdout
            .lines()
            .rev()
            .find_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|r| r["ok"] == true)
            .ok_or_else(|| {
                format!(
                    "no ok report ({}): {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                        .lines()
                        .last()
                        .unwrap_or("")
                )
            })?;
        report["seconds"]
            .as_f64()
            .ok_or_else(|| "the report has no seconds".into())
    }
}

fn median(sorted: &[f64]) -> f64 {
    let m = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[m]
    } else {
        (sorted[m - 1] + sorted[m]) / 2.0
    }
}

/// Sorted `ratios`, printed as the median and the range.
fn summary(ratios: &mut [f64]) -> (f64, String) {
    ratios.sort_by(f64::total_cmp);
    let range = format!("{:.3}..{:.3}", ratios[0], ratios[ratios.len() - 1]);
    (median(ratios), range)
}

fn job_args(workload: &[&str], extra: &[String]) -> Vec<String> {
    let mut args: Vec<String> = extra.to_vec();
    args.extend(workload.iter().map(|s| s.to_string()));
    args
}

fn main() {
    let args = Args::parse();
    let beside = |name: &str| {
        std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(|d| d.join(name)))
            .unwrap_or_else(|| PathBuf::from(name))
    };
    let runner = Runner {
        backend: args.backend,
        fttask: args.fttask.unwrap_or_else(|| beside("fttask")),
        ftrun: args.ftrun.unwrap_or_else(|| beside("ftrun")),
        mpiexec: args.mpiexec,
    };
    let fail = |what: String| -> ! {
        eprintln!("fttask-bench: {what}");
        std::process::exit(1);
    };
    let reps = args.reps as usize;
    println!(
        "ft / baseline, failure-free, backend {:?}, median of {reps} (range)",
        args.backend
    );
    println!(
        "{:<10} {:>3} {:>8} {:>15}",
        "workload", "n", "ratio", "range"
    );
    for (name, workload, _) in WORKLOADS {
        for n in [2u32, 4, 8] {
            let mut ratios = Vec::with_capacity(reps);
            for _ in 0..reps {
                let ft = runner.seconds(n, &job_args(workload, &[]));
                let base = runner.seconds(n, &job_args(workload, &["--baseline".into()]));
                match (ft, base) {
                    (Ok(ft), Ok(base)) => ratios.push(ft / base),
                    (Err(e), _) | (_, Err(e)) => fail(format!("{name} on {n} ranks: {e}")),
                }
            }
            let (median, range) = summary(&mut ratios);
            println!("{name:<10} {n:>3} {median:>8.3} {range:>15}");
        }
    }
    println!();
    println!(
        "ranks 2-3 killed, n = 8: time / failure-free time, and the extra time in \
         detector timeouts ({} ms), median of {reps} (range)",
        TIMEOUT.as_millis()
    );
    println!(
        "{:<10} {:>8} {:>15} {:>9} {:>15}",
        "workload", "ratio", "range", "timeouts", "range"
    );
    for (name, workload, k) in WORKLOADS {
        let (mut ratios, mut extra) = (Vec::new(), Vec::new());
        for _ in 0..reps {
            let clean = runner.seconds(8, &job_args(workload, &[]));
            let kill = format!("--kill=2-3@{k}");
            let killed = runner.seconds(8, &job_args(workload, &[kill]));
            match (clean, killed) {
                (Ok(clean), Ok(killed)) => {
                    ratios.push(killed / clean);
                    extra.push((killed - clean) / TIMEOUT.as_secs_f64());
                }
                (Err(e), _) | (_, Err(e)) => fail(format!("{name} with a block killed: {e}")),
            }
        }
        let (ratio, ratio_range) = summary(&mut ratios);
        let (timeouts, timeout_range) = summary(&mut extra);
        println!("{name:<10} {ratio:>8.3} {ratio_range:>15} {timeouts:>9.2} {timeout_range:>15}");
    }
}
