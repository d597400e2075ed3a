//! Real multi-process runs: `mpiexec` starts `ftmpi` on several ranks of this machine,
//! and the fault tests kill one of them with `SIGKILL`. Every survivor prints one JSON
//! line; the tests read them all.
//!
//! The MPI is the one the crate was built against: `mpiexec` is taken from `FT_MPIEXEC`,
//! else from beside `MPICC`, else from `PATH`. Fault tests need Open MPI 5 with ULFM
//! (`--with-ft ulfm`); `scripts/test-all` installs it. The runs are serialized: ranks
//! oversubscribe the cores already, and a second job beside them could starve a
//! heartbeat long enough for a false suspicion.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

/// One `mpiexec` job at a time.
static JOBS: Mutex<()> = Mutex::new(());

/// The longest a job may take before it is killed and the test fails.
const JOB_LIMIT: Duration = Duration::from_secs(120);

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
    PathBuf::from("mpiexec")
}

/// Runs `ftmpi ARGS` on `ranks` ranks; returns the survivors' JSON lines by rank.
fn run(ranks: u32, args: &[&str]) -> Vec<Value> {
    let _job = JOBS.lock().unwrap_or_else(|e| e.into_inner());
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let mut child = Command::new(mpiexec())
        .args(["--oversubscribe", "--bind-to", "none", "--with-ft", "ulfm"])
        .args(["-n", &ranks.to_string()])
        .arg(env!("CARGO_BIN_EXE_ftmpi"))
        .args(args)
        .current_dir(root)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot start {} ({e}): set FT_MPIEXEC or MPICC, or run scripts/test-all, \
                 which installs Open MPI",
                mpiexec().display()
            )
        });
    let started = Instant::now();
    while child.try_wait().expect("waiting for mpiexec").is_none() {
        if started.elapsed() > JOB_LIMIT {
            let _ = child.kill();
            let out = child.wait_with_output().expect("reading mpiexec's output");
            panic!(
                "mpiexec {args:?} ran past {JOB_LIMIT:?}\nstdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("reading mpiexec's output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "mpiexec {args:?} failed ({})\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    let mut lines: Vec<Value> = stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad line {l:?}: {e}")))
        .collect();
    lines.sort_by_key(|v| v["rank"].as_u64());
    lines
}

fn ranks_of(lines: &[Value]) -> Vec<u64> {
    lines.iter().map(|v| v["rank"].as_u64().unwrap()).collect()
}

/// The `G` of every validation at every rank, checked identical across ranks.
fn agreed(lines: &[Value]) -> Vec<Value> {
    let first = lines[0]["validations"].as_array().unwrap().clone();
    for line in lines {
        assert_eq!(
            line["validations"].as_array().unwrap(),
            &first,
            "ranks disagree: {line}"
        );
    }
    first.iter().map(|v| v["G"].clone()).collect()
}

#[test]
fn validate_global_without_failures() {
    let lines = run(4, &["validate"]);
    assert_eq!(ranks_of(&lines), [0, 1, 2, 3]);
    assert_eq!(agreed(&lines), [serde_json::json!([])]);
    for line in &lines {
        assert_eq!(line["L"], serde_json::json!([]));
        assert_eq!(line["stats"]["rejected"], 0);
    }
}

#[test]
fn validate_global_after_a_rank_is_killed() {
    let lines = run(5, &["validate", "--kill", "2", "--kill-at-ms", "3"]);
    assert_eq!(ranks_of(&lines), [0, 1, 3, 4], "rank 2 was killed");
    let gs = agreed(&lines);
    assert_eq!(gs.len(), 2);
    // Rank 2 may die before or after the first validation; the second one is called
    // once every survivor knows it dead, so it holds it.
    assert!(gs[0] == serde_json::json!([]) || gs[0] == serde_json::json!([2]));
    assert_eq!(gs[1], serde_json::json!([2]));
    for line in &lines {
        assert_eq!(line["L"], serde_json::json!([2]));
    }
}

#[test]
fn validate_global_on_a_progress_thread_after_a_rank_is_killed() {
    // ft_runtime::Runtime: the progress thread drives the stack, the main thread blocks
    // in validate_global and watches the published view for the death.
    let lines = run(
        5,
        &["validate", "--threaded", "--kill", "2", "--kill-at-ms", "3"],
    );
    assert_eq!(ranks_of(&lines), [0, 1, 3, 4]);
    let gs = agreed(&lines);
    assert_eq!(gs.len(), 2);
    assert_eq!(gs[1], serde_json::json!([2]));
    for line in &lines {
        assert_eq!(line["threaded"], true);
        assert_eq!(line["L"], serde_json::json!([2]));
    }
}

#[test]
fn validate_global_when_the_coordinator_dies_in_the_call() {
    let lines = run(5, &["validate", "--kill", "0", "--kill-on", "validate"]);
    assert_eq!(ranks_of(&lines), [1, 2, 3, 4]);
    // Rank 0 died before sending anything of the first validation: the survivors can
    // only finish it by detecting that, so both agreed sets hold it.
    assert_eq!(
        agreed(&lines),
        [serde_json::json!([0]), serde_json::json!([0])]
    );
}

/// Every destination received exactly what it needs, byte for byte.
fn assert_served(lines: &[Value]) {
    for line in lines {
        assert_eq!(line["received"], line["needs"], "rank {}", line["rank"]);
        assert_eq!(line["verified"], true, "rank {}", line["rank"]);
        assert_eq!(line["abandoned"], false, "rank {}", line["rank"]);
    }
}

#[test]
fn broadcast_issue_624_shapes_under_every_strategy() {
    for plan in [
        "plans/issue624.json",
        "plans/issue624-mirror.json",
        "plans/issue624-merged.json",
    ] {
        let lines = run(3, &["broadcast", plan]);
        assert_eq!(ranks_of(&lines), [0, 1, 2], "{plan}");
        assert_served(&lines);
        let needs: usize = lines
            .iter()
            .map(|l| l["needs"].as_array().unwrap().len())
            .sum();
        assert_eq!(needs, 3, "{plan}: A to two ranks, B to one");
    }
}

#[test]
fn broadcast_repairs_the_subtree_of_a_killed_inner_rank() {
    // Per-class binomial trees of plans/mpi-8.json: 0 -> 1, 3, 7 and 3 -> 5 for {A, C};
    // 0 -> 2, 4 and 4 -> 6 for {A, B}. Rank 3 dies as soon as it is activated, before
    // it forwards anything: rank 5 must be adopted and served by the root.
    let lines = run(
        8,
        &[
            "broadcast",
            "plans/mpi-8.json",
            "--kill",
            "3",
            "--kill-on",
            "activation",
        ],
    );
    assert_eq!(ranks_of(&lines), [0, 1, 2, 4, 5, 6, 7]);
    assert_served(&lines);
    let five = &lines[4];
    assert_eq!(five["rank"], 5);
    assert_eq!(five["received"], serde_json::json!(["A", "C"]));
    for line in &lines {
        assert_eq!(line["G"], serde_json::json!([3]));
    }
}

#[test]
fn broadcast_through_the_progress_thread_survives_a_killed_rank() {
    // ft_runtime::Runtime: start_broadcast at the root, wait_outputs elsewhere, then
    // validate_local and validate_global. Rank 3 dies at the start, before or just
    // after its activation; rank 5 below it must still be served.
    let lines = run(
        8,
        &[
            "broadcast",
            "plans/mpi-8.json",
            "--threaded",
            "--kill",
            "3",
            "--kill-at-ms",
            "0",
        ],
    );
    assert_eq!(ranks_of(&lines), [0, 1, 2, 4, 5, 6, 7]);
    assert_served(&lines);
    for line in &lines {
        assert_eq!(line["threaded"], true);
        assert_eq!(line["G"], serde_json::json!([3]));
    }
    // Rank 5 could only be served after the death was known, so it validated it.
    assert_eq!(lines[4]["validate_local"]["num_failed"], 1);
}

#[test]
fn bench_times_validate_global_beside_ulfm_agree() {
    // A smoke run of the benchmark (the figures come from longer runs, see the README).
    let lines = run(3, &["bench", "--reps", "5"]);
    assert_eq!(ranks_of(&lines), [0, 1, 2]);
    for line in &lines {
        for op in ["barrier", "ulfm_agree", "validate_global"] {
            let median = line["median_us"][op].as_f64().unwrap();
            assert!(median > 0.0 && median.is_finite(), "{op}: {line}");
        }
        assert!(
            line["ratio_to_ulfm_agree"]["validate_global"]
                .as_f64()
                .unwrap()
                > 0.0
        );
    }
}
