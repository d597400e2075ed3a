//! Real multi-process runs over libfabric: `ftofi` launches one process per rank on this
//! machine (provider `tcp;ofi_rxm` on loopback unless a test names another), and the
//! fault tests kill one of them with `SIGKILL`. Every survivor prints one JSON line; the
//! launcher checks that only the chosen rank died, and the tests check the lines as
//! `ft_jobs::conformance` says (the scenarios every backend runs).
//!
//! The runs are serialized: ranks oversubscribe the cores already, and a second job
//! beside them could starve a heartbeat long enough for a false suspicion.

use std::process::{Command, Stdio};
use std::sync::Mutex;

use ft_jobs::conformance::{self, Scenario};
use ft_jobs::report;

/// One job at a time.
static JOBS: Mutex<()> = Mutex::new(());

/// Runs `scenario` with `ftofi LAUNCHER_ARGS -n RANKS JOB_ARGS`; checks the survivors'
/// lines.
fn check(launcher: &[&str], scenario: &Scenario) {
    let _job = JOBS.lock().unwrap_or_else(|e| e.into_inner());
    let args = scenario.args;
    let out = Command::new(env!("CARGO_BIN_EXE_ftofi"))
        .args(launcher)
        .args(["-n", &scenario.ranks.to_string(), "--job-limit-s", "120"])
        .args(args)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .output()
        .expect("starting ftofi");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "ftofi {launcher:?} {args:?} failed ({})\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    let lines = report::parse_lines(&stdout).unwrap_or_else(|e| panic!("{e}\n{stdout}"));
    scenario
        .check(&lines)
        .unwrap_or_else(|e| panic!("{launcher:?}: {e}\nstdout:\n{stdout}\nstderr:\n{stderr}"));
}

/// The default provider, `tcp;ofi_rxm`.
const TCP: &[&str] = &[];
const SOCKETS: &[&str] = &["--provider", "sockets"];

#[test]
fn validate_global_without_failures() {
    check(TCP, &conformance::VALIDATE_WITHOUT_FAILURES);
}

#[test]
fn validate_global_after_a_rank_is_killed() {
    check(TCP, &conformance::VALIDATE_AFTER_A_KILL);
}

#[test]
fn validate_global_on_a_progress_thread_after_a_rank_is_killed() {
    check(TCP, &conformance::VALIDATE_THREADED_AFTER_A_KILL);
}

#[test]
fn validate_global_when_the_coordinator_dies_in_the_call() {
    check(TCP, &conformance::VALIDATE_WHEN_THE_COORDINATOR_DIES);
}

#[test]
fn broadcast_issue_624_shapes_under_every_strategy() {
    for scenario in &conformance::BROADCAST_ISSUE_624 {
        check(TCP, scenario);
    }
}

#[test]
fn broadcast_repairs_the_subtree_of_a_killed_inner_rank() {
    check(TCP, &conformance::BROADCAST_REPAIR);
}

#[test]
fn broadcast_through_the_progress_thread_survives_a_killed_rank() {
    check(TCP, &conformance::BROADCAST_THREADED_REPAIR);
}

#[test]
fn latency_job_reports_its_ratios() {
    check(TCP, &conformance::LATENCY_SMOKE);
}

#[test]
fn the_sockets_provider_survives_kills_too() {
    check(SOCKETS, &conformance::VALIDATE_AFTER_A_KILL);
    check(SOCKETS, &conformance::VALIDATE_THREADED_AFTER_A_KILL);
    check(SOCKETS, &conformance::BROADCAST_REPAIR);
}

#[test]
fn ranks_started_by_another_launcher_meet_through_the_rendezvous() {
    // What `mpiexec` or `srun` does: start every rank with its rank and the size in the
    // environment (Open MPI's names here), all told the same fresh directory.
    let _job = JOBS.lock().unwrap_or_else(|e| e.into_inner());
    let scenario = &conformance::VALIDATE_WITHOUT_FAILURES;
    let dir = std::env::temp_dir().join(format!("ftofi-external-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let ranks: Vec<_> = (0..scenario.ranks)
        .map(|rank| {
            Command::new(env!("CARGO_BIN_EXE_ftofi"))
                .arg("--rendezvous")
                .arg(&dir)
                .args(["--address", "127.0.0.1"])
                .args(scenario.args)
                .env("OMPI_COMM_WORLD_RANK", rank.to_string())
                .env("OMPI_COMM_WORLD_SIZE", scenario.ranks.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("starting a rank")
        })
        .collect();
    let mut stdout = String::new();
    for rank in ranks {
        let out = rank.wait_with_output().expect("waiting for a rank");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout.push_str(&String::from_utf8_lossy(&out.stdout));
    }
    let _ = std::fs::remove_dir_all(&dir);
    let lines = report::parse_lines(&stdout).unwrap_or_else(|e| panic!("{e}"));
    scenario.check(&lines).unwrap_or_else(|e| panic!("{e}"));

    // A rank with no launcher's environment says so.
    let out = Command::new(env!("CARGO_BIN_EXE_ftofi"))
        .arg("--rendezvous")
        .arg(&dir)
        .arg("validate")
        .env_remove("OMPI_COMM_WORLD_RANK")
        .env_remove("PMI_RANK")
        .env_remove("SLURM_PROCID")
        .env_remove("FTOFI_RANK")
        .output()
        .expect("starting ftofi");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no launcher set this process's rank"));
}

#[test]
fn bad_launches_fail_with_a_message() {
    let out = Command::new(env!("CARGO_BIN_EXE_ftofi"))
        .args(["-n", "3", "validate", "--kill", "7"])
        .output()
        .expect("starting ftofi");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("outside 0..3"));

    let out = Command::new(env!("CARGO_BIN_EXE_ftofi"))
        .args(["-n", "2", "--provider", "no-such-provider", "validate"])
        .output()
        .expect("starting ftofi");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no-such-provider"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
