//! Opening the job's ranks on the chosen backend and running each to the end: all `n`
//! in this process (`sim`), or this process's one rank under a launcher (`ofi`,
//! `mpi`). A `--kill` is a kill of the simulated rank, or `SIGKILL` to this process.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ft::Settings;

use crate::cli::{prepare, Cli, InputError};
use crate::scheduler::{run_rank, Report, RunLog};
use crate::workloads::Workload;

/// How a job ended, at this process.
pub enum JobEnd {
    /// The input was refused before any work (exit code 2).
    BadInput(InputError),
    /// This process reports: the workload, the job's size and the report.
    Reported(Box<dyn Workload>, u32, Report),
    /// This process's rank ended without reporting (another rank does).
    Quiet,
    /// The job failed here.
    Failed(String),
}

/// How long a rank keeps serving its peers after its end.
#[cfg_attr(not(any(feature = "ofi", feature = "mpi")), allow(dead_code))]
const LINGER: Duration = Duration::from_millis(200);

fn settings(cli: &Cli) -> Settings {
    let timeout = Duration::from_millis(cli.timeout_ms.max(50));
    Settings {
        period: (timeout / 10).max(Duration::from_millis(5)),
        timeout,
        ..Settings::default()
    }
}

/// Runs the whole job in this process, `-n` ranks on `ft::sim`.
pub fn run_sim(cli: &Cli) -> JobEnd {
    run_sim_logged(cli, None)
}

/// [`run_sim`], every rank recording each task run it completes in `log`.
pub fn run_sim_logged(cli: &Cli, log: Option<Arc<RunLog>>) -> JobEnd {
    let n = match cli.ranks {
        Some(n) => n,
        None => match cli.workload {
            crate::cli::WorkloadArgs::Issue624 => 3,
            _ => 4,
        },
    };
    let (work, mut options) = match prepare(cli, n) {
        Ok(p) => p,
        Err(e) => return JobEnd::BadInput(e),
    };
    options.log = log;
    let group = match ft::sim::SimGroup::open(n, &settings(cli)) {
        Ok(g) => g,
        Err(e) => return JobEnd::Failed(format!("cannot open the group: {e}")),
    };
    let results: Vec<Result<Option<Report>, String>> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..n)
            .map(|me| {
                let (group, work, options) = (&group, &*work, &options);
                s.spawn(move || {
                    let handle = group.rank(me).expect("a rank of the group");
                    let die = move || group.kill(me);
                    run_rank(handle, work, options, &die)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().unwrap_or_else(|_| Err("a rank panicked".into())))
            .collect()
    });
    let mut report = None;
    for (me, result) in results.into_iter().enumerate() {
        match result {
            Ok(Some(r)) => report = Some(r),
            Ok(None) => {}
            // A killed rank's calls fail: that is its death, not the job's.
            Err(_) if group.is_dead(me as u32) => {}
            Err(e) => return JobEnd::Failed(e),
        }
    }
    match report {
        Some(r) => JobEnd::Reported(work, n, r),
        None => JobEnd::Failed("no rank reported".into()),
    }
}

/// Runs this process's rank of the job over `handle`, once the input is checked.
#[cfg_attr(not(any(feature = "ofi", feature = "mpi")), allow(dead_code))]
fn run_one(
    cli: &Cli,
    n: u32,
    open: impl FnOnce(&Settings) -> Result<ft::Runtime, ft::RuntimeError>,
) -> JobEnd {
    let (work, options) = match prepare(cli, n) {
        Ok(p) => p,
        Err(e) => return JobEnd::BadInput(e),
    };
    let settings = settings(cli);
    let handle = match open(&settings) {
        Ok(h) => h,
        Err(e) => return JobEnd::Failed(format!("cannot open the rank: {e}")),
    };
    let done = AtomicBool::new(false);
    let result = std::thread::scope(|s| {
        s.spawn(|| ft::failstop::watch(&handle, &settings, &done, "fttask"));
        let result = run_rank(&handle, &*work, &options, &|| ft::failstop::die());
        done.store(true, Ordering::Relaxed);
        result
    });
    // Declared dead by its peers (rightly or not), the rank stops as a dead one does:
    // the job goes on without it.
    if let Err(why) = &result {
        ft::failstop::leave_if_declared(&handle, "fttask", why);
    }
    let _ = handle.shutdown(LINGER);
    match result {
        Ok(Some(r)) => JobEnd::Reported(work, n, r),
        Ok(None) => JobEnd::Quiet,
        Err(e) => JobEnd::Failed(e),
    }
}

/// This process's rank under `ftrun` (libfabric).
#[cfg(feature = "ofi")]
pub fn run_ofi(cli: &Cli) -> JobEnd {
    let config = match ft::ofi::config_from_env() {
        Ok(c) => c,
        Err(e) => return JobEnd::Failed(format!("not under ftrun: {e}")),
    };
    if cli.ranks.is_some_and(|n| n != config.size) {
        return JobEnd::BadInput(InputError::Ranks(format!(
            "-n {} but the launcher started {} ranks",
            cli.ranks.unwrap_or(0),
            config.size
        )));
    }
    let n = config.size;
    run_one(cli, n, move |settings| ft::ofi::open(config, settings))
}

/// Without the `ofi` feature: refused.
#[cfg(not(feature = "ofi"))]
pub fn run_ofi(_cli: &Cli) -> JobEnd {
    JobEnd::BadInput(InputError::BackendMissing("ofi"))
}

/// This process's rank under `mpiexec` (MPI; Open MPI's ULFM for failures).
#[cfg(feature = "mpi")]
pub fn run_mpi(cli: &Cli) -> JobEnd {
    use mpi::environment::Threading;
    use mpi::topology::Communicator;
    let Some((universe, _)) = mpi::initialize_with_threading(Threading::Multiple) else {
        return JobEnd::Failed("MPI is already initialized".into());
    };
    let world = universe.world();
    let n = world.size() as u32;
    let end = run_one(cli, n, |settings| ft::mpi::open(&world, settings));
    // `MPI_Finalize` is collective: a rank that finalizes while another leaves without
    // it waits forever, and a job that lost ranks cannot finalize. Every rank that got
    // past the input checks leaves without it (ULFM's launcher accepts that); a bad
    // input is refused at every rank alike, so those all finalize.
    if !matches!(end, JobEnd::BadInput(_)) {
        std::mem::forget(universe);
    }
    end
}

/// Without the `mpi` feature: refused.
#[cfg(not(feature = "mpi"))]
pub fn run_mpi(_cli: &Cli) -> JobEnd {
    JobEnd::BadInput(InputError::BackendMissing("mpi"))
}
