//! `ftjacobi --backend mpi` under `mpiexec --with-ft ulfm --oversubscribe`: three MPI
//! processes end with the simulator's checksum, and six survive real kills under
//! `--mode shrink` (a rank, a node's block, two in sequence, one during the recovery)
//! with that same checksum (`mpiexec` starts with `SIGPIPE` blocked: PRRTE ends a job
//! at its eleventh). `mpiexec` is `FT_MPIEXEC`, the one
//! beside `MPICC`, or the workspace's Open MPI (`.tools/openmpi-5.0.11`).

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::{report, run_within, sim_checksum, survives_kills, workspace, Spares, FTJACOBI};

/// The `mpiexec` of the MPI this crate was built against.
fn mpiexec() -> PathBuf {
    if let Some(path) = std::env::var_os("FT_MPIEXEC") {
        return path.into();
    }
    if let Some(mpicc) = std::env::var_os("MPICC") {
        let beside = PathBuf::from(mpicc).with_file_name("mpiexec");
        if beside.exists() {
            return beside;
        }
    }
    workspace().join(".tools/openmpi-5.0.11/bin/mpiexec")
}

#[test]
fn three_processes_end_with_the_simulators_checksum() {
    let job = ["--grid", "64", "--iterations", "40"];
    let want = sim_checksum(&job);
    let out = run_within(
        Command::new(mpiexec())
            .args(["--with-ft", "ulfm", "--oversubscribe", "-n", "3"])
            .arg(FTJACOBI)
            .args([
                "--backend",
                "mpi",
                "--timeout-ms",
                "2000",
                "--limit-s",
                "60",
            ])
            .args(job)
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"),
        Duration::from_secs(120),
    );
    let json = report("mpiexec -n 3 ftjacobi --backend mpi", &out);
    assert_eq!(json["checksum"], want, "{json}");
    assert_eq!(
        (&json["backend"], &json["ranks"]),
        (&"mpi".into(), &3.into())
    );
}

#[test]
fn six_processes_survive_kills_with_the_failure_free_checksum() {
    survives_kills("mpi", Spares::Flag, |working, spares| {
        let mut command = Command::new("env");
        command
            .arg("--block-signal=PIPE")
            .arg(mpiexec())
            .args([
                "--with-ft",
                "ulfm",
                "--oversubscribe",
                "-n",
                &(working + spares).to_string(),
            ])
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
        command
    });
}
