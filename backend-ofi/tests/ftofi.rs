//! Real multi-process runs over libfabric: `ftofi` launches one process per rank on this
//! machine (provider `tcp;ofi_rxm` on loopback unless a test names another), and the
//! fault tests kill one of them, or a "node" of four, with `SIGKILL`. Every survivor
//! prints one JSON line; the launcher checks that exactly the listed ranks died, and
//! the tests check the lines as `ft_jobs::conformance` says (the scenarios every
//! backend runs). Bad input (`conformance::BAD_INPUTS`) must end a job within
//! seconds, with one clear message and a non-zero status.
//!
//! The runs are serialized: ranks oversubscribe the cores already, and a second job
//! beside them could starve a heartbeat long enough for a false suspicion.

use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ft_jobs::conformance::{self, Scenario};
use ft_jobs::report;
use serde_json::{json, Value};

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
fn validate_global_after_a_node_is_killed() {
    check(TCP, &conformance::VALIDATE_AFTER_A_NODE_IS_KILLED);
}

#[test]
fn validate_global_when_a_node_dies_in_the_call() {
    check(TCP, &conformance::VALIDATE_WHEN_A_NODE_DIES_IN_THE_CALL);
}

#[test]
fn broadcast_serves_every_survivor_when_a_node_dies_on_activation() {
    check(TCP, &conformance::BROADCAST_WHEN_A_NODE_DIES_ON_ACTIVATION);
}

#[test]
fn latency_job_reports_its_ratios() {
    check(TCP, &conformance::LATENCY_SMOKE);
}

#[test]
fn bench_bcast_times_the_stack_beside_a_two_sided_broadcast() {
    check(TCP, &conformance::BENCH_BCAST_SMOKE);
}

#[test]
fn the_sockets_provider_survives_kills_too() {
    check(SOCKETS, &conformance::VALIDATE_AFTER_A_KILL);
    check(SOCKETS, &conformance::VALIDATE_THREADED_AFTER_A_KILL);
    check(SOCKETS, &conformance::BROADCAST_REPAIR);
    check(SOCKETS, &conformance::VALIDATE_AFTER_A_NODE_IS_KILLED);
}

/// The RMA counter `name` summed over the survivors' lines.
fn rma_total(lines: &[Value], name: &str) -> u64 {
    lines
        .iter()
        .map(|l| l["stats"][name].as_u64().unwrap_or(0))
        .sum()
}

/// Every rank that needs an output read some of it by RMA.
fn read_by_rma(lines: &[Value]) -> Result<(), String> {
    match lines
        .iter()
        .find(|l| l["needs"] != json!([]) && l["stats"]["rma_reads"].as_u64().unwrap_or(0) == 0)
    {
        Some(line) => Err(format!("rank {} read nothing by RMA", line["rank"])),
        None => Ok(()),
    }
}

/// 8 MiB and 3 MB outputs (one whole part-chunk at the end) at n = 4: every byte arrives
/// (each rank checks its outputs against the root's) and the receivers read the chunks
/// by RMA, straight into each output's one buffer (every chunk, the 3 MB tail of 116,416
/// bytes included, is above the RMA threshold: so no output is joined by a copy);
/// forced two-sided, the same job offers nothing for RMA.
#[test]
fn a_multi_mib_broadcast_moves_by_rma_and_arrives_exactly() {
    const RMA: Scenario = Scenario {
        ranks: 4,
        args: &["broadcast", "backend-ofi/tests/plans/rma-4.json"],
        check: |lines| {
            report::served(lines)?;
            read_by_rma(lines)?;
            let lost = rma_total(lines, "rma_lost_reads");
            if lost > 0 {
                return Err(format!("{lost} reads lost without a failure"));
            }
            let (read, placed) = (
                rma_total(lines, "rma_bytes_read"),
                rma_total(lines, "rma_bytes_placed"),
            );
            let (landed, joined) = (
                rma_total(lines, "bcast_bytes_landed"),
                rma_total(lines, "bcast_bytes_joined"),
            );
            (placed == read && landed == placed && joined == 0)
                .then_some(())
                .ok_or_else(|| {
                    format!("{read} bytes read by RMA, {placed} into the outputs' buffers ({landed} kept there), {joined} joined by a copy")
                })
        },
    };
    const TWO_SIDED: Scenario = Scenario {
        ranks: 4,
        args: &["broadcast", "backend-ofi/tests/plans/rma-4.json"],
        check: |lines| {
            report::served(lines)?;
            let offered = rma_total(lines, "rma_offered");
            (offered == 0)
                .then_some(())
                .ok_or_else(|| format!("{offered} payloads offered by RMA under --two-sided"))
        },
    };
    check(TCP, &RMA);
    check(SOCKETS, &RMA);
    check(&["--two-sided"], &TWO_SIDED);
}

/// A 32 MiB broadcast at n = 8 (128 chunks, each read by RMA), rank 2 (a relay: 3 is
/// its child in the binomial tree) killed 300 ms after the start, while the chunks
/// flow (transfers to 2 are then open at the root, and reads from 2 under way at
/// rank 3): the survivors' reads from it fail or never start, are counted as lost
/// frames, and the protocol repairs from the nearest live ancestor; every survivor
/// ends with its bytes intact and agrees on {2}.
#[test]
fn a_rank_killed_during_a_large_rma_broadcast_is_repaired() {
    const KILL: Scenario = Scenario {
        ranks: 8,
        args: &[
            "broadcast",
            "backend-ofi/tests/plans/rma-8.json",
            "--kill",
            "2",
            "--kill-at-ms",
            "300",
        ],
        check: |lines| {
            // Whether the kill hit transfers (it depends on the machine's speed): the
            // root's transfers to 2 left open, the survivors' reads from 2 lost.
            eprintln!(
                "kill during RMA: {} transfers left open, {} reads lost, {} released unread",
                rma_total(lines, "rma_transfers_open"),
                rma_total(lines, "rma_lost_reads"),
                rma_total(lines, "rma_released_unread"),
            );
            let survivors = report::ranks(lines);
            if survivors != [0, 1, 3, 4, 5, 6, 7] {
                return Err(format!("survivors {survivors:?}"));
            }
            report::served(lines)?;
            read_by_rma(lines)?;
            match lines.iter().find(|l| l["G"] != json!([2])) {
                Some(line) => Err(format!("rank {} agreed on {}", line["rank"], line["G"])),
                None => Ok(()),
            }
        },
    };
    check(TCP, &KILL);
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

/// Runs `ftofi ARGS` from the workspace root; its output and how long it took.
fn ftofi(args: &[&str]) -> (Output, Duration) {
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_ftofi"))
        .args(args)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .output()
        .expect("starting ftofi");
    (out, started.elapsed())
}

/// The job failed promptly with `message` said once (`conformance::refused`).
fn refused(args: &[&str], (out, took): &(Output, Duration), message: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    conformance::refused(out.status.success(), &stderr, *took, message)
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
}

#[test]
fn bad_input_is_refused_before_any_rank_starts() {
    for bad in conformance::BAD_INPUTS {
        let n = bad.ranks.to_string();
        let args: Vec<&str> = ["-n", &n]
            .iter()
            .copied()
            .chain(bad.args.iter().copied())
            .collect();
        let run = ftofi(&args);
        refused(&args, &run, bad.message);
        assert_eq!(
            run.0.status.code(),
            Some(2),
            "{args:?}: bad input exits with 2"
        );
    }
    let args = ["-n", "0", "validate"];
    refused(&args, &ftofi(&args), "-n must be at least 1");
}

#[test]
fn every_rank_refuses_a_bad_plan_before_it_connects() {
    // Under another launcher (no ftofi launcher to check first), each rank reads the
    // plan itself and refuses it at once instead of waiting for the others.
    let dir = std::env::temp_dir().join(format!("ftofi-bad-plan-{}", std::process::id()));
    let started = Instant::now();
    let ranks: Vec<_> = (0..3)
        .map(|rank| {
            Command::new(env!("CARGO_BIN_EXE_ftofi"))
                .arg("--rendezvous")
                .arg(&dir)
                .args(["broadcast", "ft-jobs/testdata/duplicate-output.json"])
                .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
                .env("OMPI_COMM_WORLD_RANK", rank.to_string())
                .env("OMPI_COMM_WORLD_SIZE", "3")
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("starting a rank")
        })
        .collect();
    for (rank, child) in ranks.into_iter().enumerate() {
        let out = child.wait_with_output().expect("waiting for a rank");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "rank {rank}: {stderr}");
        assert!(
            stderr.contains(&format!("ftofi: rank {rank}: "))
                && stderr.contains("two outputs are named \"A\""),
            "rank {rank}: {stderr}"
        );
    }
    assert!(
        started.elapsed() < conformance::PROMPTLY,
        "took {:?}",
        started.elapsed()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_rank_that_fails_ends_the_whole_job_at_once() {
    // Rank 1 dies at the start, but the detector's timeout (3 s) outlasts every step's
    // limit (1 s): the survivors fail. The launcher ends the job at the first failure
    // and says how that rank ended, in words.
    let _job = JOBS.lock().unwrap_or_else(|e| e.into_inner());
    let args = [
        "-n",
        "4",
        "validate",
        "--kill",
        "1",
        "--timeout-ms",
        "3000",
        "--limit-s",
        "1",
    ];
    let run = ftofi(&args);
    refused(&args, &run, "the other ranks were stopped");
    let stderr = String::from_utf8_lossy(&run.0.stderr);
    assert!(stderr.contains("exited with status 1"), "{stderr}");
    assert!(stderr.contains("timed out"), "{stderr}");
    assert_eq!(run.0.status.code(), Some(1));

    // A provider that does not exist fails every rank alike: its error is said once.
    let args = ["-n", "3", "--provider", "no-such-provider", "validate"];
    let run = ftofi(&args);
    let stderr = String::from_utf8_lossy(&run.0.stderr);
    assert!(!run.0.status.success());
    assert!(run.1 < conformance::PROMPTLY, "took {:?}", run.1);
    let said = stderr
        .lines()
        .filter(|l| l.contains("no-such-provider"))
        .count();
    assert_eq!(said, 1, "{stderr}");
}

/// Runs `ftofi -n RANKS validate --stall STALL --stall-ms MS`, which must succeed; the
/// survivors' lines and the launcher's standard error.
fn stall_job(ranks: u32, stall: &str, ms: &str) -> (Vec<Value>, String) {
    let _job = JOBS.lock().unwrap_or_else(|e| e.into_inner());
    let n = ranks.to_string();
    let args = [
        "-n",
        &n,
        "--job-limit-s",
        "120",
        "validate",
        "--stall",
        stall,
        "--stall-ms",
        ms,
    ];
    let (out, _) = ftofi(&args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "{args:?}: {}\n{stdout}\n{stderr}",
        out.status
    );
    let lines = report::parse_lines(&stdout).unwrap_or_else(|e| panic!("{e}\n{stdout}"));
    (lines, stderr)
}

/// The `G` of each line's last validation, by rank.
fn last_gs(lines: &[Value]) -> Vec<(u64, Value)> {
    lines
        .iter()
        .map(|l| {
            let validations = l["validations"].as_array().cloned().unwrap_or_default();
            let last = validations
                .last()
                .map(|v| v["G"].clone())
                .unwrap_or(Value::Null);
            (l["rank"].as_u64().unwrap_or(u64::MAX), last)
        })
        .collect()
}

#[test]
fn a_stall_past_the_timeout_costs_the_stalled_ranks_and_not_the_job() {
    // Ranks 2 and 3 (a block) stop for 2.5 s, past the 1 s timeout plus a period: the
    // others declare them, they leave as killed ranks do once they run again, and the
    // survivors agree on exactly them; the job succeeds and names them.
    let (lines, stderr) = stall_job(5, "2,3", "2500");
    assert_eq!(
        report::ranks(&lines),
        [0, 1, 4],
        "the stalled ranks print no line\n{stderr}"
    );
    for (rank, g) in last_gs(&lines) {
        assert_eq!(g, json!([2, 3]), "rank {rank}'s last G\n{lines:#?}");
    }
    assert!(
        stderr.contains("declared dead but never killed: ranks [2, 3]"),
        "the summary names them:\n{stderr}"
    );
    assert!(stderr.contains("leaving as a killed rank does"), "{stderr}");
}

#[test]
fn a_stall_shorter_than_the_timeout_declares_no_one() {
    // 400 ms, below the 1 s timeout less a 50 ms period: nobody is declared.
    let (lines, stderr) = stall_job(4, "1", "400");
    assert_eq!(report::ranks(&lines), [0, 1, 2, 3]);
    for (rank, g) in last_gs(&lines) {
        assert_eq!(g, json!([]), "rank {rank}'s last G\n{lines:#?}");
    }
    assert!(!stderr.contains("declared dead"), "{stderr}");
}

#[test]
fn a_stall_of_every_rank_out_of_range_or_outside_validate_is_refused() {
    for (args, message) in [
        (
            &[
                "-n",
                "3",
                "validate",
                "--stall",
                "0,1,2",
                "--stall-ms",
                "100",
            ][..],
            "--stall names every rank of 3",
        ),
        (
            &["-n", "3", "validate", "--stall", "5", "--stall-ms", "100"][..],
            "--stall 5",
        ),
        (
            &["-n", "3", "latency", "--stall", "1", "--stall-ms", "100"][..],
            "--stall applies to the validate job",
        ),
    ] {
        let _job = JOBS.lock().unwrap_or_else(|e| e.into_inner());
        refused(args, &ftofi(args), message);
    }
}
