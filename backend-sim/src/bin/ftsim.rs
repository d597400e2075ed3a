//! `ftsim`: runs simulator scenarios and renders broadcast plans.
//!
//! - `ftsim run FILE [--json] [--summary] [--max-events N]`: runs a scenario (DESIGN.md's
//!   contract) and prints the readable report, or the JSON report with `--json`;
//!   `--summary` leaves the per-rank list out.
//! - `ftsim plan FILE [--json | --dot]`: builds and prints a broadcast plan.
//!
//! Exit codes, the same for both subcommands:
//! - `0`: done, the report or plan is on stdout;
//! - `2` ([`BAD_INPUT`]): bad input, nothing ran: a file that cannot be read, is not
//!   JSON or breaks its contract (scenario or plan), or a bad command line (clap's own
//!   usage errors exit 2 as well). One message on stderr, `ftsim: FILE: why`;
//! - `1`: the input was fine but the run failed (the event budget ran out, an action
//!   the simulator cannot run), a built plan broke an invariant (a bug), or stdout
//!   could not be written.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use backend_sim::failure::{run_scenario_keeping_state, RunOptions};
use backend_sim::plan_file::{self, PlanFileError, PlanFormat};
use backend_sim::scenario::Scenario;

/// A million-rank run makes hundreds of millions of small allocations (frames, rank
/// sets) spread over gigabytes: mimalloc's per-size free lists serve them faster than
/// the system allocator and keep a rank's objects closer together.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc v3's `mi_option_purge_delay` (its `mi_option_e` order; libmimalloc-sys
/// names only some options).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Tunes mimalloc for one big simulation:
/// - 2 MiB pages (transparent huge pages, where the kernel allows them): every event
///   touches a different rank's memory, and with 4 KiB pages a good share of that time
///   went to TLB misses;
/// - no purging of freed memory back to the OS: a run's footprint is its peak anyway,
///   and purged pages were faulted and zeroed again moments later (seconds of system
///   time in a 10^6-rank run).
fn tune_allocator() {
    // SAFETY: `mi_option_set_enabled` and `mi_option_set` store option values that
    // mimalloc reads when it next maps or purges memory; no other effect, no
    // precondition.
    unsafe {
        libmimalloc_sys::mi_option_set_enabled(libmimalloc_sys::mi_option_large_os_pages, true);
        libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1);
    }
}

/// The exit code of bad input (see the module docs): clap's for usage errors.
const BAD_INPUT: u8 = 2;

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
    tune_allocator();
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
                    return ExitCode::from(BAD_INPUT);
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
                    match e {
                        // A built plan that breaks an invariant is a bug, not the file's.
                        PlanFileError::Check(_) => ExitCode::FAILURE,
                        _ => ExitCode::from(BAD_INPUT),
                    }
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
