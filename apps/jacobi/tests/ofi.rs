//! `ftjacobi --backend ofi` under `ftrun`: three processes over libfabric end with the
//! simulator's checksum, and six survive real kills under `--mode shrink` (a rank, a
//! node's block, two in sequence, one during the recovery) with that same checksum. `ftrun` is taken from `FT_FTRUN`, or beside `ftjacobi` (built
//! there with `cargo build -p ft-launch --bin ftrun` when it is missing).

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::{report, run_within, sim_checksum, workspace, FTJACOBI};

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
    let job = [
        "--grid",
        "96",
        "--iterations",
        "80",
        "--checkpoint-every",
        "10",
    ];
    let want = sim_checksum(&job);
    let cases: [(&[&str], &[u32]); 4] = [
        (&["--kill", "2@25"], &[2]),
        (&["--ranks-per-node", "2", "--kill", "2,3@25"], &[2, 3]),
        (&["--kill", "1@15", "--kill", "4@50"], &[1, 4]),
        (&["--kill", "1@15", "--kill", "3@0"], &[1, 3]),
    ];
    for (kills, dead) in cases {
        let mut command = Command::new(ftrun());
        command.args(["-n", "6", "--"]);
        command
            .arg(FTJACOBI)
            .args([
                "--backend",
                "ofi",
                "--timeout-ms",
                "1000",
                "--limit-s",
                "90",
            ])
            .args(job)
            .args(kills);
        let out = run_within(&mut command, Duration::from_secs(150));
        let json = report(&format!("{kills:?}"), &out);
        assert_eq!(json["checksum"], want, "{kills:?}: {json}");
        assert_eq!(json["dead"], serde_json::json!(dead), "{kills:?}: {json}");
        assert_eq!(json["ranks"], 6, "{json}");
    }
}
