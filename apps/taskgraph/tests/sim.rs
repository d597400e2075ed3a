//! `fttask` end to end on the simulator: the #624 lines under every strategy, the same
//! checksum on every rank count and with every kind of failure (one rank, a block of
//! adjacent ranks, two failures in sequence, a rank that dies as recovery starts), and
//! exit code 2 for bad input.

use std::process::{Command, Output};

use serde_json::Value;

fn fttask(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fttask"))
        .args(["--timeout-ms", "300", "--limit-s", "120"])
        .args(args)
        .output()
        .expect("fttask runs")
}

/// The job's lines and its JSON line, asserting it ended well.
fn run(args: &[&str]) -> (Vec<String>, Value) {
    let out = fttask(args);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "fttask {args:?}: {:?}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let mut lines: Vec<String> = stdout.lines().map(str::to_string).collect();
    let json: Value = serde_json::from_str(&lines.pop().expect("a JSON line")).expect("JSON");
    assert_eq!(json["ok"], true, "{json}");
    (lines, json)
}

#[test]
fn issue624_prints_the_seeds_lines_under_every_strategy() {
    for strategy in ["per-class", "fetch-for-descendants", "per-output"] {
        let (lines, json) = run(&["-n", "3", "--strategy", strategy, "issue624"]);
        assert_eq!(
            lines,
            ["0: have A and B", "1: have A", "2: have A and B"],
            "{strategy}"
        );
        assert_eq!(json["dead"], serde_json::json!([]));
    }
}

/// Runs `workload` failure-free on several rank counts and with each kill; every run
/// has the failure-free checksum, `dead` is the killed set, and fewer tasks ran again
/// than the graph has.
fn same_checksum_with_failures(workload: &[&str], kills: &[(&[&str], &[u64])]) {
    let base = |n: &str| {
        let mut args = vec!["-n", n];
        args.extend_from_slice(workload);
        run(&args).1
    };
    let reference = base("3");
    let checksum = reference["checksum"].clone();
    for n in ["4", "6"] {
        assert_eq!(base(n)["checksum"], checksum, "{workload:?} on {n} ranks");
    }
    for (flags, dead) in kills {
        let mut args = vec!["-n", "6"];
        args.extend_from_slice(flags);
        args.extend_from_slice(workload);
        let (_, json) = run(&args);
        assert_eq!(json["checksum"], checksum, "{args:?}: {json}");
        assert_eq!(json["dead"], serde_json::json!(dead), "{args:?}");
        let tasks = json["tasks"].as_u64().unwrap();
        assert!(
            json["reexecuted"].as_u64().unwrap() < tasks / 2,
            "{args:?}: {json}"
        );
    }
}

#[test]
fn cholesky_has_one_checksum_with_and_without_failures() {
    let workload = [
        "cholesky",
        "--tiles",
        "8",
        "--tile-size",
        "32",
        "--seed",
        "3",
    ];
    let (_, json) = run(&[&["-n", "4"][..], &workload[..]].concat());
    assert!(json["residual"].as_f64().unwrap() <= 1e-12, "{json}");
    assert_eq!(json["tasks"], 120);
    same_checksum_with_failures(
        &workload,
        &[
            (&["--kill", "2@5"], &[2]),
            (&["--kill", "2-3@4"], &[2, 3]),
            (&["--kill", "1@3", "--kill", "4@9"], &[1, 4]),
            // Rank 5 has done its 2 tasks when rank 0's failure is agreed: it dies as
            // recovery starts.
            (&["--kill", "0@6", "--kill", "5@2"], &[0, 5]),
        ],
    );
}

#[test]
fn random_dags_have_one_checksum_with_and_without_failures() {
    let workload = [
        "random",
        "--tasks",
        "200",
        "--max-bytes",
        "65536",
        "--seed",
        "5",
    ];
    same_checksum_with_failures(
        &workload,
        &[
            (&["--kill", "3@4"], &[3]),
            (&["--kill", "1,2@6"], &[1, 2]),
            (&["--kill", "0@5", "--kill", "5@1"], &[0, 5]),
        ],
    );
}

#[test]
fn bad_input_is_refused_with_exit_code_2() {
    for args in [
        &["lu"][..],
        &["--strategy", "merged", "issue624"],
        &["--topology", "ring", "issue624"],
        &["cholesky", "--tile-size", "0"],
        &["-n", "4", "--kill", "0-3@0", "cholesky"],
        &["-n", "4", "--kill", "4@0", "cholesky"],
        &["-n", "3", "--kill", "1@1", "issue624"],
        &["-n", "4", "--kill", "1@oops", "random"],
        &["-n", "4", "--baseline", "--kill", "1@0", "random"],
    ] {
        let out = fttask(args);
        assert_eq!(out.status.code(), Some(2), "fttask {args:?}");
        assert!(out.stdout.is_empty(), "fttask {args:?} did work");
        assert!(!out.stderr.is_empty(), "fttask {args:?} said nothing");
    }
}

#[test]
fn the_baseline_computes_the_same_data() {
    let (_, ft) = run(&[
        "-n",
        "4",
        "random",
        "--tasks",
        "100",
        "--max-bytes",
        "65536",
    ]);
    let (_, plain) = run(&[
        "-n",
        "4",
        "--baseline",
        "random",
        "--tasks",
        "100",
        "--max-bytes",
        "65536",
    ]);
    assert_eq!(ft["checksum"], plain["checksum"]);
}
