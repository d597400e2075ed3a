//! `ftjacobi`: runs the Jacobi solver and prints one JSON line from the reporting rank.
//! Exit codes: 0 for a job that ended well, 1 for a failed one, 2 for a bad input.

use clap::Parser;
use ft_jacobi::backends::{run_mpi, run_ofi, run_sim, JobEnd};
use ft_jacobi::cli::{Backend, Cli};

fn main() {
    let cli = Cli::parse();
    let end = match cli.backend {
        Backend::Sim => run_sim(&cli),
        Backend::Ofi => run_ofi(&cli),
        Backend::Mpi => run_mpi(&cli),
    };
    match end {
        JobEnd::BadInput(e) => {
            eprintln!("ftjacobi: {e}");
            std::process::exit(2);
        }
        JobEnd::Failed(e) => {
            eprintln!("ftjacobi: {e}");
            std::process::exit(1);
        }
        JobEnd::Quiet => {}
        JobEnd::Reported(config, r) => {
            let generations: serde_json::Map<String, serde_json::Value> = r
                .generations
                .iter()
                .map(|(rank, g)| (rank.to_string(), (*g).into()))
                .collect();
            let json = serde_json::json!({
                "app": "jacobi",
                "backend": config.backend.name(),
                "mode": config.mode.name(),
                "ranks": config.ranks,
                "spares": config.spares,
                "grid": config.grid,
                "ok": true,
                "dead": r.dead,
                "generations": generations,
                "iterations": config.iterations,
                "rollbacks": r.rollbacks,
                "checkpoints": r.checkpoints.0,
                "checkpoint_bytes": r.checkpoints.1,
                "checksum": r.checksum,
                "seconds": r.seconds,
                "recovery_seconds": r.recoveries,
                "store_bytes_held": r.store.own_bytes + r.store.held_bytes,
                "store_bytes_sent": r.store.bytes_sent,
            });
            println!("{json}");
        }
    }
}
