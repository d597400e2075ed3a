//! `ftjacobi` end to end on the simulator: the final grid's checksum is the same for
//! every number of ranks and equals a serial run computed here; spares wait for the end;
//! under `--mode shrink` the survivors of a kill, a node's block, two failures in
//! sequence and a failure during the recovery end with that same checksum; a
//! checkpoint lost with both its copies is an error; bad input exits with code 2 and
//! one message before any work.

use std::process::{Command, Output};

use serde_json::Value;
use xxhash_rust::xxh3::{xxh3_128, Xxh3};

fn ftjacobi(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ftjacobi"))
        .args(["--timeout-ms", "300", "--limit-s", "60"])
        .args(args)
        .output()
        .expect("ftjacobi runs")
}

/// The JSON line of a run that must end well.
fn run(args: &[&str]) -> Value {
    let out = ftjacobi(args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "ftjacobi {args:?}: {:?}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "one line from the reporting rank: {stdout}");
    let json: Value = serde_json::from_str(lines[0]).expect("JSON");
    assert_eq!(json["ok"], true, "{json}");
    json
}

/// The checksum of `iterations` Jacobi iterations on an `n × n` grid, computed on one
/// grid, cell by cell: the problem as the crate defines it (its starting values), the
/// stencil and the checksum written out again here.
fn serial_checksum(n: u32, iterations: u32) -> String {
    let side = n as usize;
    let mut old: Vec<f64> = (0..n)
        .flat_map(|r| (0..n).map(move |c| ft_jacobi::grid::initial_value(n, r, c)))
        .collect();
    let mut new = old.clone();
    for _ in 0..iterations {
        for r in 1..side - 1 {
            for c in 1..side - 1 {
                let at = |r: usize, c: usize| old[r * side + c];
                new[r * side + c] =
                    0.25 * ((at(r - 1, c) + at(r + 1, c)) + (at(r, c - 1) + at(r, c + 1)));
            }
        }
        std::mem::swap(&mut old, &mut new);
    }
    let mut h = Xxh3::new();
    h.update(&u64::from(n).to_le_bytes());
    for row in old.chunks_exact(side) {
        let bytes: Vec<u8> = row.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect();
        h.update(&xxh3_128(&bytes).to_le_bytes());
    }
    format!("{:032x}", h.digest128())
}

#[test]
fn the_checksum_is_the_serial_one_for_every_number_of_ranks() {
    let serial = serial_checksum(64, 40);
    for n in ["1", "2", "3", "4", "7"] {
        let json = run(&["-n", n, "--grid", "64", "--iterations", "40"]);
        assert_eq!(json["checksum"], serial.as_str(), "{n} ranks: {json}");
        assert_eq!(json["ranks"], n.parse::<u64>().unwrap());
        assert_eq!(json["dead"], serde_json::json!([]));
        assert_eq!(json["generations"], serde_json::json!({}));
        assert_eq!(
            (&json["iterations"], &json["rollbacks"]),
            (&40.into(), &0.into())
        );
    }
    // Strips of one row, the boundary rows among them.
    let json = run(&["-n", "9", "--grid", "9", "--iterations", "7"]);
    assert_eq!(json["checksum"], serial_checksum(9, 7).as_str(), "{json}");
}

#[test]
fn spares_wait_for_the_end_and_do_not_change_the_result() {
    let json = run(&[
        "-n",
        "3",
        "--mode",
        "rebuild",
        "--spares",
        "2",
        "--grid",
        "32",
        "--iterations",
        "12",
    ]);
    assert_eq!(json["checksum"], serial_checksum(32, 12).as_str(), "{json}");
    assert_eq!((&json["ranks"], &json["spares"]), (&3.into(), &2.into()));
}

/// The 6-rank job of the recovery tests with `extra` arguments, its JSON line checked
/// against the failure-free checksum and the ranks that died.
fn recovered(extra: &[&str], dead: &[u32]) -> Value {
    let base = [
        "-n",
        "6",
        "--grid",
        "48",
        "--iterations",
        "60",
        "--checkpoint-every",
        "8",
    ];
    let args: Vec<&str> = base.iter().copied().chain(extra.iter().copied()).collect();
    let json = run(&args);
    assert_eq!(
        json["checksum"],
        serial_checksum(48, 60).as_str(),
        "{args:?}: {json}"
    );
    assert_eq!(json["dead"], serde_json::json!(dead), "{args:?}: {json}");
    json
}

/// A shrink-mode recovery job with `extra`: the ranks that died and the rollbacks.
fn survives(extra: &[&str], dead: &[u32], rollbacks: u64) {
    let json = recovered(extra, dead);
    assert_eq!(json["rollbacks"], rollbacks, "{extra:?}: {json}");
    assert_eq!(json["mode"], "shrink");
}

#[test]
fn a_shrink_survives_a_kill_with_the_failure_free_checksum() {
    survives(&["--kill", "2@21"], &[2], 1);
}

#[test]
fn a_shrink_survives_a_nodes_block_whose_copies_sit_on_the_next_node() {
    survives(&["--ranks-per-node", "2", "--kill", "2,3@13"], &[2, 3], 1);
    // The last node's copies are on the first.
    survives(
        &["--ranks-per-node", "3", "--kill", "3-5@30"],
        &[3, 4, 5],
        1,
    );
}

#[test]
fn a_shrink_survives_two_failures_in_sequence_and_one_during_the_recovery() {
    survives(&["--kill", "1@9", "--kill", "4@40"], &[1, 4], 2);
    // Rank 3 dies once the survivors agreed on rank 1, before they shrank.
    survives(&["--kill", "1@17", "--kill", "3@0"], &[1, 3], 1);
}

/// A rebuild-mode recovery job with `spares` spares and `kills`: the ranks that died
/// and the incarnations expected.
fn rebuilds(spares: &str, kills: &[&str], dead: &[u32], generations: Value) {
    let rebuild = ["--mode", "rebuild", "--spares", spares];
    let extra: Vec<&str> = rebuild
        .iter()
        .copied()
        .chain(kills.iter().copied())
        .collect();
    let json = recovered(&extra, dead);
    assert_eq!(json["generations"], generations, "{extra:?}: {json}");
    assert_eq!(json["ranks"], 6, "the group keeps its size: {json}");
}

#[test]
fn a_rebuild_gives_failed_ranks_to_spares_with_the_failure_free_checksum() {
    rebuilds("1", &["--kill", "2@21"], &[2], serde_json::json!({"2": 1}));
    // A node's block, its copies on the next node.
    let block = ["--ranks-per-node", "2", "--kill", "2,3@13"];
    rebuilds("2", &block, &[2, 3], serde_json::json!({"2": 1, "3": 1}));
}

#[test]
fn a_rebuild_survives_the_same_rank_twice_and_a_failure_during_the_recovery() {
    let twice = ["--kill", "1@9", "--kill", "1@40"];
    rebuilds("2", &twice, &[1], serde_json::json!({"1": 2}));
    // Rank 3 dies once the survivors agreed on rank 1, before they rebuilt.
    let during = ["--kill", "1@17", "--kill", "3@0"];
    rebuilds("2", &during, &[1, 3], serde_json::json!({"1": 1, "3": 1}));
}

#[test]
fn a_lost_checkpoint_is_an_error_not_a_wrong_answer() {
    // Ranks 1 and 2 die together; with one rank per node, rank 1's copy is on rank 2.
    let out = ftjacobi(&[
        "-n",
        "4",
        "--grid",
        "32",
        "--iterations",
        "20",
        "--ranks-per-node",
        "1",
        "--kill",
        "1,2@5",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(out.stdout.is_empty());
    assert!(stderr.contains("rank 1's checkpoint is lost"), "{stderr}");
}

/// The real backends this binary was built without, and what it says when asked.
fn backends_left_out() -> Vec<(&'static [&'static str], &'static str)> {
    let mut left_out: Vec<(&'static [&'static str], &'static str)> = Vec::new();
    if cfg!(not(feature = "mpi")) {
        left_out.push((&["--backend", "mpi"], "without the `mpi` feature"));
    }
    if cfg!(not(feature = "ofi")) {
        left_out.push((&["--backend", "ofi"], "without the `ofi` feature"));
    }
    left_out
}

#[test]
fn bad_input_is_refused_with_exit_code_2() {
    for (args, says) in [
        (&["--mode", "blank"][..], "invalid value"),
        (&["--grid", "2"], "--grid 2"),
        (
            &["-n", "8", "--grid", "7"],
            "fewer rows than the 8 working ranks",
        ),
        (&["--iterations", "0"], "--iterations must be at least 1"),
        (&["--checkpoint-every", "0"], "--checkpoint-every"),
        (&["--ranks-per-node", "0"], "--ranks-per-node"),
        (
            &["-n", "4", "--kill", "0-3@1"],
            "every working rank would die",
        ),
        (
            &["-n", "4", "--kill", "0,1@1", "--kill", "2,3@2"],
            "every working rank would die",
        ),
        (&["-n", "4", "--kill", "4@1"], "outside the working ranks"),
        (&["--kill", "1@150"], "iterations 0..150"),
        (&["--kill", "1@oops"], "expected RANKS@ITER"),
        (&["--kill", "1@2", "--kill", "1@3"], "named twice"),
        (
            &["--mode", "rebuild", "--kill", "1@3"],
            "needs --spares K or --respawn",
        ),
        (
            &["--mode", "rebuild", "--spares", "1", "--kill", "1,2@3"],
            "2 ranks but there are 1",
        ),
        (
            &["--mode", "rebuild", "--respawn", "--kill", "1@3"],
            "--respawn",
        ),
    ]
    .into_iter()
    .chain(backends_left_out())
    {
        let out = ftjacobi(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "ftjacobi {args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "ftjacobi {args:?} did work");
        assert!(!stderr.is_empty(), "ftjacobi {args:?} said nothing");
        assert!(stderr.contains(says), "ftjacobi {args:?}: {stderr}");
    }
}
