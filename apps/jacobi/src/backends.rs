//! Opening the job's ranks on the chosen backend and running each to the end: all of
//! them in this process (`sim`: `-n` working ranks and `--spares` more), or this
//! process's one rank under a launcher (`ofi` under `ftrun`, `mpi` under `mpiexec`).
//! A `--kill` is a kill of the simulated rank, or `SIGKILL` to this process.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ft::Settings;

use crate::cli::{prepare, Cli, Config, InputError};
use crate::rank::{run_rank, RankEnd, Report};

/// How a job ended, at this process.
#[derive(Debug)]
pub enum JobEnd {
    /// The input was refused before any work (exit code 2).
    BadInput(InputError),
    /// This process reports the job.
    Reported(Box<Config>, Report),
    /// This process's rank ended without reporting (another rank does).
    Quiet,
    /// The job failed here.
    Failed(String),
}

/// How long a rank keeps serving its peers after its end.
#[cfg_attr(not(any(feature = "ofi", feature = "mpi")), allow(dead_code))]
const LINGER: Duration = Duration::from_millis(200);

/// The detector's settings for `config`.
fn settings(config: &Config) -> Settings {
    let timeout = config.timeout.max(Duration::from_millis(50));
    Settings {
        period: (timeout / 10).max(Duration::from_millis(5)),
        timeout,
        span: config.ranks_per_node,
        ..Settings::default()
    }
}

/// Runs the whole job in this process: `-n` (default 4) working ranks and `--spares`
/// more on `ft::sim`, one thread each.
pub fn run_sim(cli: &Cli) -> JobEnd {
    let working = cli.ranks.unwrap_or(4);
    let config = match prepare(cli, working.saturating_add(cli.spares)) {
        Ok(c) => c,
        Err(e) => return JobEnd::BadInput(e),
    };
    let n = config.ranks + config.spares;
    let group = match ft::sim::SimGroup::open(n, &settings(&config)) {
        Ok(g) => g,
        Err(e) => return JobEnd::Failed(format!("cannot open the group: {e}")),
    };
    // Which ranks a `--kill` ended: their calls fail, and that is their death.
    let killed: Vec<AtomicBool> = (0..n).map(|_| AtomicBool::new(false)).collect();
    let results: Vec<Result<RankEnd, String>> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..n)
            .map(|me| {
                let (group, config, killed) = (&group, &config, &killed);
                s.spawn(move || {
                    let handle = group.rank(me).expect("a rank of the group");
                    let die = move || {
                        killed[me as usize].store(true, Ordering::Relaxed);
                        group.kill(me);
                    };
                    let result = run_rank(handle, config, &die);
                    // A rank that gives up leaves as a crashed process does, so its
                    // peers learn it and do not wait for it.
                    if result.is_err() {
                        group.kill(me);
                    }
                    result
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().unwrap_or_else(|_| Err("a rank panicked".into())))
            .collect()
    });
    let mut report = None;
    let mut failure = None;
    for (result, killed) in results.into_iter().zip(&killed) {
        match result {
            Ok(RankEnd::Reported(r)) => report = Some(r),
            Ok(RankEnd::Quiet) => {}
            Err(_) if killed.load(Ordering::Relaxed) => {}
            Err(e) => {
                failure.get_or_insert(e);
            }
        }
    }
    match (report, failure) {
        (Some(r), None) => JobEnd::Reported(Box::new(config), r),
        (_, Some(e)) => JobEnd::Failed(e),
        (None, None) => JobEnd::Failed("no rank reported".into()),
    }
}

/// Runs this process's rank of a group of `n` over the handle `open` gives, once the
/// input is checked.
#[cfg_attr(not(any(feature = "ofi", feature = "mpi")), allow(dead_code))]
fn run_one(
    cli: &Cli,
    n: u32,
    open: impl FnOnce(&Settings) -> Result<ft::Runtime, ft::RuntimeError>,
) -> JobEnd {
    let config = match prepare(cli, n) {
        Ok(c) => c,
        Err(e) => return JobEnd::BadInput(e),
    };
    let settings = settings(&config);
    let handle = match open(&settings) {
        Ok(h) => h,
        Err(e) => return JobEnd::Failed(format!("cannot open the rank: {e}")),
    };
    let done = AtomicBool::new(false);
    let result = std::thread::scope(|s| {
        s.spawn(|| ft::failstop::watch(&handle, &settings, &done, "ftjacobi"));
        let result = run_rank(&handle, &config, &|| ft::failstop::die());
        done.store(true, Ordering::Relaxed);
        result
    });
    // Declared dead by its peers (rightly or not), the rank stops as a dead one does:
    // the job goes on without it.
    if let Err(why) = &result {
        ft::failstop::leave_if_declared(&handle, "ftjacobi", why);
    }
    let _ = handle.shutdown(LINGER);
    match result {
        Ok(RankEnd::Reported(r)) => JobEnd::Reported(Box::new(config), r),
        Ok(RankEnd::Quiet) => JobEnd::Quiet,
        Err(e) => JobEnd::Failed(e),
    }
}

/// `-n`, if given to a real backend, must be the launcher's size.
#[cfg_attr(not(any(feature = "ofi", feature = "mpi")), allow(dead_code))]
fn launcher_size(cli: &Cli, size: u32) -> Result<u32, InputError> {
    match cli.ranks {
        Some(n) if n != size => Err(InputError::Ranks(format!(
            "-n {n} but the launcher started {size} ranks"
        ))),
        _ => Ok(size),
    }
}

/// This process's rank under `ftrun` (libfabric).
#[cfg(feature = "ofi")]
pub fn run_ofi(cli: &Cli) -> JobEnd {
    let config = match ft::ofi::config_from_env() {
        Ok(c) => c,
        Err(e) => return JobEnd::Failed(format!("not under ftrun: {e}")),
    };
    match launcher_size(cli, config.size) {
        Ok(n) => run_one(cli, n, move |settings| ft::ofi::open(config, settings)),
        Err(e) => JobEnd::BadInput(e),
    }
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
    let end = match launcher_size(cli, world.size() as u32) {
        Ok(n) => run_one(cli, n, |settings| ft::mpi::open(&world, settings)),
        Err(e) => JobEnd::BadInput(e),
    };
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
