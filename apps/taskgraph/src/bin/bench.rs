//! `fttask-bench`: what fault tolerance costs a task runtime, failure-free. In one run
//! of this process it times the same graphs on the simulator (`cholesky --tiles 8
//! --tile-size 64` and `random --tasks 200 --max-bytes 262144`, at n = 2, 4 and 8)
//! two ways, alternating, over several repetitions:
//!
//! - **ft**: the runtime as `fttask` runs it: each finished task's outputs leave as one
//!   broadcast over `ft`'s trees (`--strategy per-class`, the workload's topology),
//!   every output is kept, immutable, until the graph completes, and the comm thread
//!   watches for failures, ready to agree on `G` and recover;
//! - **baseline** (`--baseline`): the same graph, kernels, workers, scheduler and
//!   `Runtime` (its failure detector still heartbeats, and outputs are still kept),
//!   but each output goes by plain `Runtime::send` messages from its producer to each
//!   consumer rank. It leaves out the broadcast layer (plans, trees, activation
//!   headers, the relaying ranks' forwarding and the broadcasts' bookkeeping) and
//!   every step of failure handling (no recovery, no holdings, no validation after
//!   the first).
//!
//! It prints, per workload and rank count, the median over the repetitions of the
//! ratio ft / baseline of the graph's time (`seconds` of the report: from the start of
//! the graph to the collector's end), and the lowest and highest ratio. Ratios, not
//! times, are the result: both runs of a pair share the machine's state.
//!
//! Usage: `fttask-bench [REPETITIONS]` (5 by default).

use clap::Parser;
use ft_taskgraph::backends::{run_sim, JobEnd};
use ft_taskgraph::cli::Cli;

/// The graph's time of one simulated job, or why it failed.
fn seconds(args: &[String]) -> Result<f64, String> {
    let cli = Cli::try_parse_from(["fttask".to_string()].iter().chain(args))
        .map_err(|e| e.to_string())?;
    match run_sim(&cli) {
        JobEnd::Reported(_, _, report) => Ok(report.seconds),
        JobEnd::BadInput(e) => Err(format!("bad input: {e}")),
        JobEnd::Failed(e) => Err(e),
        JobEnd::Quiet => Err("nobody reported".into()),
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

fn main() {
    let reps: usize = match std::env::args().nth(1).map(|a| a.parse()) {
        None => 5,
        Some(Ok(r)) if r > 0 => r,
        Some(_) => {
            eprintln!("fttask-bench: the repetitions must be a positive integer");
            std::process::exit(2);
        }
    };
    let workloads: [(&str, &[&str]); 2] = [
        (
            "cholesky",
            &["cholesky", "--tiles", "8", "--tile-size", "64"],
        ),
        (
            "random",
            &["random", "--tasks", "200", "--max-bytes", "262144"],
        ),
    ];
    println!("ft / baseline, failure-free, sim backend, median of {reps} (range)");
    println!(
        "{:<10} {:>3} {:>8} {:>17} {:>9} {:>9}",
        "workload", "n", "ratio", "range", "ft s", "base s"
    );
    for (name, workload) in workloads {
        for n in [2u32, 4, 8] {
            let mut ratios = Vec::with_capacity(reps);
            let (mut ft_times, mut base_times) = (Vec::new(), Vec::new());
            for _ in 0..reps {
                let mut args: Vec<String> = vec!["-n".into(), n.to_string()];
                args.extend(workload.iter().map(|s| s.to_string()));
                let ft = seconds(&args);
                args.insert(0, "--baseline".into());
                let base = seconds(&args);
                match (ft, base) {
                    (Ok(ft), Ok(base)) => {
                        ratios.push(ft / base);
                        ft_times.push(ft);
                        base_times.push(base);
                    }
                    (Err(e), _) | (_, Err(e)) => {
                        eprintln!("fttask-bench: {name} on {n} ranks: {e}");
                        std::process::exit(1);
                    }
                }
            }
            for v in [&mut ratios, &mut ft_times, &mut base_times] {
                v.sort_by(f64::total_cmp);
            }
            println!(
                "{:<10} {:>3} {:>8.3} {:>17} {:>9.4} {:>9.4}",
                name,
                n,
                median(&ratios),
                format!("{:.3}..{:.3}", ratios[0], ratios[reps - 1]),
                median(&ft_times),
                median(&base_times),
            );
        }
    }
}
