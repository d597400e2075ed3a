//! `fttask`: runs a workload on the task runtime, prints its lines and one JSON line.
//! Exit codes: 0 for a job that ended well, 1 for a failed one, 2 for a bad input.

use clap::Parser;
use ft_taskgraph::backends::{run_mpi, run_ofi, run_sim, JobEnd};
use ft_taskgraph::cli::{Backend, Cli};

fn main() {
    let cli = Cli::parse();
    if cli.owned {
        match ft_taskgraph::cli::owned_line(&cli) {
            Ok(line) => println!("{line}"),
            Err(e) => {
                eprintln!("fttask: {e}");
                std::process::exit(2);
            }
        }
        return;
    }
    let end = match cli.backend {
        Backend::Sim => run_sim(&cli),
        Backend::Ofi => run_ofi(&cli),
        Backend::Mpi => run_mpi(&cli),
    };
    match end {
        JobEnd::BadInput(e) => {
            eprintln!("fttask: {e}");
            std::process::exit(2);
        }
        JobEnd::Failed(e) => {
            eprintln!("fttask: {e}");
            std::process::exit(1);
        }
        JobEnd::Quiet => {}
        JobEnd::Reported(work, n, r) => {
            for line in &r.finish.lines {
                println!("{line}");
            }
            let ok = r.finish.residual.is_none_or(|x| x <= 1e-12);
            let mut json = serde_json::json!({
                "app": "taskgraph",
                "workload": work.name(),
                "ranks": n,
                "backend": format!("{:?}", cli.backend).to_lowercase(),
                "strategy": cli.strategy.name(),
                "baseline": cli.baseline,
                "ok": ok,
                "dead": r.dead,
                "tasks": work.graph().work_tasks(),
                "executed": r.executed,
                "reexecuted": r.reexecuted,
                "uncounted": r.uncounted,
                "checksum": r.checksum,
                "seconds": r.seconds,
            });
            if let Some(res) = r.finish.residual {
                json["residual"] = res.into();
            }
            if let Some(flops) = r.finish.flops {
                json["gflops"] = (flops / r.seconds / 1e9).into();
            }
            println!("{json}");
            if !ok {
                std::process::exit(1);
            }
        }
    }
}
