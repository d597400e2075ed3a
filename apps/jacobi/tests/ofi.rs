//! `ftjacobi --backend ofi` under `ftrun`: three processes over libfabric end with the
//! simulator's checksum, and six survive real kills with that same checksum: under
//! `--mode shrink` (a rank, a node's block, two in sequence, one during the recovery)
//! and under `--mode rebuild` from the two spares of `ftrun --spares 2`. `ftrun` is
//! taken from `FT_FTRUN`, or beside `ftjacobi` (built there with
//! `cargo build -p ft-launch --bin ftrun` when it is missing).

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::{report, run_within, sim_checksum, survives_kills, workspace, Spares, FTJACOBI};

/// The `ftrun` launcher.
fn ftrun() -> PathBuf {
    if let Some(path) = std::env::var_os("FT_FTRUN") {
        return path.into();
    }
    let dir = PathBuf::from(FTJACOBI)
        .parent()
        .expect("a directory")
        .to_path_buf();
    let beside = dir.join("ftrun");
    if !beside.exists() {
        let mut build = Command::new(env!("CARGO"));
        build
            .current_dir(workspace())
            .args(["build", "-q", "-p", "ft-launch", "--bin", "ftrun"]);
        if dir.ends_with("release") {
            build.arg("--release");
        }
        let status = build.status().expect("cargo runs");
        assert!(
            status.success() && beside.exists(),
            "building ftrun: {status:?}"
        );
    }
    beside
}

#[test]
fn three_processes_end_with_the_simulators_checksum() {
    let job = ["--grid", "64", "--iterations", "40"];
    let want = sim_checksum(&job);
    let out = run_within(
        Command::new(ftrun())
            .args(["-n", "3", "--"])
            .arg(FTJACOBI)
            .args([
                "--backend",
                "ofi",
                "--timeout-ms",
                "2000",
                "--limit-s",
                "60",
            ])
            .args(job),
        Duration::from_secs(120),
    );
    let json = report("ftrun -n 3 ftjacobi --backend ofi", &out);
    assert_eq!(json["checksum"], want, "{json}");
    assert_eq!(
        (&json["backend"], &json["ranks"]),
        (&"ofi".into(), &3.into())
    );
}

#[test]
fn six_processes_survive_kills_with_the_failure_free_checksum() {
    survives_kills("ofi", Spares::Launcher, |working, spares| {
        let mut command = Command::new(ftrun());
        command.args([
            "-n",
            &working.to_string(),
            "--spares",
            &spares.to_string(),
            "--",
        ]);
        command
    });
}
