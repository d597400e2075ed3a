//! `ftsim`: runs simulator scenarios and renders broadcast plans.
//!
//! - `ftsim run FILE [--json] [--summary] [--max-events N]`: runs a scenario (DESIGN.md's
//!   contract) and prints the readable report, or the JSON report with `--json`;
//!   `--summary` leaves the per-rank list out.
//! - `ftsim plan FILE [--json | --dot]`: builds and prints a broadcast plan.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use backend_sim::failure::{run_scenario_keeping_state, RunOptions};
use backend_sim::plan_file::{self, PlanFormat};
use backend_sim::scenario::Scenario;

#[derive(Parser)]
#[command(
    name = "ftsim",
    version,
    about = "Fault-tolerance simulator and broadcast planner"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a scenario file and print the run report.
    Run {
        /// The scenario (JSON).
        file: PathBuf,
        /// Print the JSON report instead of text.
        #[arg(long)]
        json: bool,
        /// Leave the per-rank list out.
        #[arg(long)]
        summary: bool,
        /// Give up (non-zero exit) after this many events.
        #[arg(long)]
        max_events: Option<u64>,
    },
    /// Build a broadcast plan from a plan file and print it.
    Plan {
        /// The plan file (JSON).
        file: PathBuf,
        /// Print the plan-result JSON.
        #[arg(long, conflicts_with = "dot")]
        json: bool,
        /// Print Graphviz.
        #[arg(long)]
        dot: bool,
    },
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Run {
            file,
            json,
            summary,
            max_events,
        } => {
            let scenario = match Scenario::from_file(&file) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("ftsim: {}: {e}", file.display());
                    return ExitCode::from(2);
                }
            };
            let options = RunOptions {
                per_rank: !summary,
                progress: true,
                max_events,
            };
            match run_scenario_keeping_state(&scenario, options) {
                Ok((report, wall, sim)) => {
                    // The process ends here: no need to free every rank's state.
                    std::mem::forget(sim);
                    let text = if json {
                        format!("{}\n", report.to_json())
                    } else {
                        format!(
                            "{}wall time: {:.3} s\n",
                            report.to_text(),
                            wall.as_secs_f64()
                        )
                    };
                    emit(&text)
                }
                Err(e) => {
                    eprintln!("ftsim: {}: {e}", file.display());
                    ExitCode::FAILURE
                }
            }
        }
        Command::Plan { file, json, dot } => {
            let format = if json {
                PlanFormat::Json
            } else if dot {
                PlanFormat::Dot
            } else {
                PlanFormat::Text
            };
            match plan_file::run(&file, format) {
                Ok(out) => emit(&out),
                Err(e) => {
                    eprintln!("ftsim: {}: {e}", file.display());
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// Writes `text` to stdout. A reader that went away (`ftsim ... | head`) is not an
/// error worth a panic: the output is simply cut short.
fn emit(text: &str) -> ExitCode {
    use std::io::Write as _;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ftsim: writing the output: {e}");
            ExitCode::FAILURE
        }
    }
}
