//! [`Job`]: starting the ranks, judging their ends, stopping the job.
//!
//! One thread per rank waits for its process and sends its [`Exit`] to the launcher's
//! loop, which judges the ends in the order they arrive; two more per rank read its
//! standard output and standard error ([`crate::output`]). The loop wakes at least every
//! [`TICK`] to see the time limit and forwarded signals. Once the job is over (every
//! rank ended, a stop, the limit, a signal) every rank's process group is killed, the
//! readers are drained (at most [`DRAIN`]), and only then does [`Job::run`] return.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::exit::{Exit, Outcome, Policy, RankReport, Report, Verdict};
use crate::output::{self, Output, StderrFilter};
use crate::rendezvous::Rendezvous;
use crate::sys::{self, Forwarding};
use crate::{Rank, ADDRESS_VAR, LOOPBACK, PROVIDER_VAR, RANK_VAR, RENDEZVOUS_VAR, SIZE_VAR};

/// How long the launcher waits, once a job is over and its ranks were killed, for the
/// ranks' last output (their pipes close when their processes are gone).
pub const DRAIN: Duration = Duration::from_secs(2);

/// How often the launcher's loop looks at the clock and for signals: short enough that
/// a limit or a Ctrl-C takes effect at once to a person.
const TICK: Duration = Duration::from_millis(50);

/// How long ranks that were passed a forwarded signal have to end before they are
/// killed: a program's own clean-up on `SIGINT` or `SIGTERM` takes well under this.
const INTERRUPT_GRACE: Duration = Duration::from_secs(5);

/// A job to launch: `ranks` processes of one program on this machine.
///
/// Each rank gets the launcher's environment, the variables [`Job::env`] adds, and
/// [`RANK_VAR`], [`SIZE_VAR`], [`RENDEZVOUS_VAR`], [`ADDRESS_VAR`] (and
/// [`PROVIDER_VAR`] if [`Job::provider`] names one). Its standard input is empty.
pub struct Job {
    program: OsString,
    args: Vec<OsString>,
    ranks: u32,
    env: Vec<(OsString, OsString)>,
    rendezvous: Option<PathBuf>,
    rendezvous_prefix: String,
    address: String,
    provider: Option<String>,
    output: Output,
    limit: Duration,
    stderr_filter: Option<StderrFilter>,
    forward_signals: bool,
}

impl fmt::Debug for Job {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Job")
            .field("program", &self.program)
            .field("args", &self.args)
            .field("ranks", &self.ranks)
            .field("rendezvous", &self.rendezvous)
            .field("output", &self.output)
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

impl Job {
    /// The default [`Job::job_limit`].
    pub const DEFAULT_LIMIT: Duration = Duration::from_secs(600);

    /// `ranks` processes of `program` (a path, or a name looked up in `PATH`), with no
    /// arguments, a fresh rendezvous, [`LOOPBACK`], [`Output::Stream`], the
    /// [`Job::DEFAULT_LIMIT`], every standard error line passed on, and signals
    /// forwarded.
    pub fn new(program: impl Into<OsString>, ranks: u32) -> Self {
        Job {
            program: program.into(),
            args: Vec::new(),
            ranks,
            env: Vec::new(),
            rendezvous: None,
            rendezvous_prefix: "ftrun".into(),
            address: LOOPBACK.into(),
            provider: None,
            output: Output::Stream,
            limit: Self::DEFAULT_LIMIT,
            stderr_filter: None,
            forward_signals: true,
        }
    }

    /// Adds arguments every rank gets.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Sets `key` to `value` in every rank's environment.
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Meets in `dir` (made if missing, never removed) instead of a fresh directory.
    pub fn rendezvous(mut self, dir: impl Into<PathBuf>) -> Self {
        self.rendezvous = Some(dir.into());
        self
    }

    /// Names a fresh rendezvous directory `PREFIX-PID-NANOS` (`ftrun` by default).
    pub fn rendezvous_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.rendezvous_prefix = prefix.into();
        self
    }

    /// The address every rank binds to ([`ADDRESS_VAR`]).
    pub fn address(mut self, address: impl Into<String>) -> Self {
        self.address = address.into();
        self
    }

    /// The libfabric provider every rank uses ([`PROVIDER_VAR`]).
    pub fn provider(mut self, provider: impl Into<String>) -> Self {
        self.provider = Some(provider.into());
        self
    }

    /// Where the ranks' standard output goes.
    pub fn output(mut self, output: Output) -> Self {
        self.output = output;
        self
    }

    /// The longest the job may run; past it, every rank is killed
    /// ([`Outcome::TimedOut`]).
    pub fn job_limit(mut self, limit: Duration) -> Self {
        self.limit = limit;
        self
    }

    /// Passes on only the standard error lines (without their newline) for which
    /// `filter(rank, line)` is true (it may keep state: several ranks' threads call it).
    pub fn stderr_filter(
        mut self,
        filter: impl Fn(Rank, &str) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.stderr_filter = Some(Arc::new(filter));
        self
    }

    /// Whether `SIGINT` and `SIGTERM` that reach the launcher while the job runs are
    /// passed on to every rank's process group ([`Outcome::Interrupted`]). Each rank
    /// leads its own group, so a terminal's Ctrl-C reaches the ranks only this way.
    /// The launcher's own dispositions are restored when [`Job::run`] returns.
    pub fn forward_signals(mut self, forward: bool) -> Self {
        self.forward_signals = forward;
        self
    }

    /// Starts the ranks and waits for the job to end: every rank ended, the first
    /// [`Verdict::Stop`] of `policy`, the limit, or a forwarded signal. A rank that
    /// cannot be started ends the job before it runs ([`LaunchError::Spawn`]).
    pub fn run(&self, mut policy: impl Policy) -> Result<Report, LaunchError> {
        if self.ranks == 0 {
            return Err(LaunchError::NoRanks);
        }
        let rendezvous = match &self.rendezvous {
            Some(dir) => Rendezvous::given(dir),
            None => Rendezvous::fresh(&self.rendezvous_prefix),
        }
        .map_err(LaunchError::Rendezvous)?;
        let mut forwarding = self.forward_signals.then(Forwarding::install);
        let started = Instant::now();
        let (ended, ends) = mpsc::channel();
        let mut ranks: Vec<Running> = Vec::with_capacity(self.ranks as usize);
        for rank in 0..self.ranks {
            match self.start(rank, &rendezvous, ended.clone()) {
                Ok(running) => ranks.push(running),
                Err(error) => {
                    stop(&ranks);
                    drain(&mut ranks, &ends, Instant::now() + DRAIN);
                    return Err(LaunchError::Spawn { rank, error });
                }
            }
        }
        drop(ended);

        let deadline = started + self.limit;
        let mut outcome = None;
        let mut interrupted: Option<(i32, Instant)> = None;
        let mut left = self.ranks;
        while left > 0 {
            let now = Instant::now();
            if let Some(signal) = forwarding.as_mut().and_then(Forwarding::take) {
                for running in &ranks {
                    sys::signal_group(running.group, signal);
                }
                interrupted.get_or_insert((signal, now));
            }
            if let Some((signal, since)) = interrupted {
                if now >= since + INTERRUPT_GRACE {
                    outcome = Some(Outcome::Interrupted { signal });
                    break;
                }
            }
            if now >= deadline {
                outcome = Some(Outcome::TimedOut { limit: self.limit });
                break;
            }
            let (rank, exit) = match ends.recv_timeout(TICK.min(deadline - now)) {
                Ok(end) => end,
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            };
            left -= 1;
            let verdict = if interrupted.is_some() {
                Verdict::Continue
            } else {
                policy.judge(rank, &exit)
            };
            ranks[rank as usize].exit = Some(exit);
            if let Verdict::Stop(reason) = verdict {
                outcome = Some(Outcome::Stopped { rank, reason });
                break;
            }
        }
        let outcome = match (outcome, interrupted) {
            (Some(outcome), _) => outcome,
            (None, Some((signal, _))) => Outcome::Interrupted { signal },
            (None, None) => Outcome::Completed,
        };
        stop(&ranks);
        drain(&mut ranks, &ends, Instant::now() + DRAIN);
        drop(forwarding);
        if self.output == Output::Ordered {
            for running in &ranks {
                output::print_kept(&running.stdout);
            }
        }
        let ranks = ranks
            .into_iter()
            .map(|running| RankReport {
                rank: running.rank,
                exit: running.exit,
                stdout: if self.output == Output::Captured {
                    running.stdout
                } else {
                    Vec::new()
                },
            })
            .collect();
        Ok(Report { outcome, ranks })
    }

    /// Starts `rank` in its own process group with its readers and its waiter.
    fn start(
        &self,
        rank: Rank,
        rendezvous: &Rendezvous,
        ended: mpsc::Sender<(Rank, Exit)>,
    ) -> std::io::Result<Running> {
        let mut command = Command::new(&self.program);
        command
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env(RANK_VAR, rank.to_string())
            .env(SIZE_VAR, self.ranks.to_string())
            .env(RENDEZVOUS_VAR, rendezvous.path())
            .env(ADDRESS_VAR, &self.address)
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(provider) = &self.provider {
            command.env(PROVIDER_VAR, provider);
        }
        let mut child = command.spawn()?;
        let group = child.id();
        let stdout = child.stdout.take().expect("stdout is piped");
        let stderr = child.stderr.take().expect("stderr is piped");
        let mode = self.output;
        let stdout = std::thread::spawn(move || match mode {
            Output::Stream => {
                output::stream_stdout(stdout);
                Vec::new()
            }
            Output::Ordered | Output::Captured => output::keep_stdout(stdout),
        });
        let filter = self.stderr_filter.clone();
        let stderr = std::thread::spawn(move || output::forward_stderr(rank, stderr, filter));
        std::thread::spawn(move || {
            let exit = Exit::from_wait(child.wait());
            let _ = ended.send((rank, exit));
        });
        Ok(Running {
            rank,
            group,
            exit: None,
            readers: Some((stdout, stderr)),
            stdout: Vec::new(),
        })
    }
}

/// A rank that was started.
struct Running {
    rank: Rank,
    /// Its process group (its pid: it leads the group).
    group: u32,
    exit: Option<Exit>,
    /// The threads reading its standard output (which returns what it kept) and its
    /// standard error, until they are joined.
    readers: Option<(JoinHandle<Vec<u8>>, JoinHandle<()>)>,
    /// What the standard output reader kept.
    stdout: Vec<u8>,
}

/// Kills every rank's process group (those that ended too: their children go with
/// them).
fn stop(ranks: &[Running]) {
    for running in ranks {
        sys::signal_group(running.group, libc::SIGKILL);
    }
}

/// Collects the ends of the ranks (killed by [`stop`]) and their readers, until
/// `until`; a reader still blocked then (a process that left its group holds the
/// pipe) is left behind.
fn drain(ranks: &mut [Running], ends: &mpsc::Receiver<(Rank, Exit)>, until: Instant) {
    loop {
        while let Ok((rank, exit)) = ends.try_recv() {
            ranks[rank as usize].exit.get_or_insert(exit);
        }
        for running in ranks.iter_mut() {
            if running
                .readers
                .as_ref()
                .is_some_and(|(out, err)| out.is_finished() && err.is_finished())
            {
                let (out, err) = running.readers.take().expect("checked");
                running.stdout = out.join().unwrap_or_default();
                let _ = err.join();
            }
        }
        let done = ranks
            .iter()
            .all(|r| r.readers.is_none() && r.exit.is_some());
        if done || Instant::now() >= until {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Why a job could not run.
#[derive(Debug)]
#[non_exhaustive]
pub enum LaunchError {
    /// A job of no ranks.
    NoRanks,
    /// The rendezvous directory could not be made (the error names it).
    Rendezvous(std::io::Error),
    /// A rank's process could not be started; the ranks started before it were
    /// killed.
    Spawn {
        /// The rank.
        rank: Rank,
        /// Why.
        error: std::io::Error,
    },
}

impl fmt::Display for LaunchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LaunchError::NoRanks => f.write_str("a job needs at least one rank"),
            LaunchError::Rendezvous(e) => write!(f, "{e}"),
            LaunchError::Spawn { rank, error } => write!(f, "cannot start rank {rank}: {error}"),
        }
    }
}

impl std::error::Error for LaunchError {}

/// The executable `program` names: a path (with a `/`) to an executable file, or the
/// first executable file of that name in `PATH`, as `execvp` finds it. A launcher
/// checks it before it starts any rank.
pub fn find_program(program: &OsStr) -> Result<PathBuf, String> {
    let shown = Path::new(program).display();
    if program.is_empty() {
        return Err("no program given".into());
    }
    if program.as_encoded_bytes().contains(&b'/') {
        let path = PathBuf::from(program);
        return match std::fs::metadata(&path) {
            Ok(meta) if is_executable(&meta) => Ok(path),
            Ok(_) => Err(format!("{shown} is not an executable file")),
            Err(e) => Err(format!("cannot run {shown}: {e}")),
        };
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(program))
        .find(|path| std::fs::metadata(path).is_ok_and(|meta| is_executable(&meta)))
        .ok_or_else(|| format!("cannot find {shown} in PATH"))
}

fn is_executable(meta: &std::fs::Metadata) -> bool {
    meta.is_file() && meta.permissions().mode() & 0o111 != 0
}
