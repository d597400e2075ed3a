//! The `ftsim` binary's exit codes: `0` when done, `2` for bad input under both
//! subcommands (as for clap's usage errors), `1` when a good scenario's run fails.
//! Each error is one line on stderr, naming the file.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn ftsim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ftsim"))
        .args(args)
        .output()
        .expect("ftsim runs")
}

fn repo(path: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path)
        .display()
        .to_string()
}

fn temp_file(name: &str, text: &str) -> PathBuf {
    common::temp_file("ftsim_cli", name, text)
}

/// The exit code and stderr of `ftsim args`; stderr must be one line naming the file
/// when it failed.
fn exit_of(args: &[&str]) -> (i32, String) {
    let out = ftsim(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.code().expect("exited"), stderr)
}

fn assert_bad_input(args: &[&str], names: &str, why: &str) {
    let (code, stderr) = exit_of(args);
    assert_eq!(code, 2, "{args:?}: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "{args:?}: one line: {stderr}");
    assert!(
        stderr.starts_with(&format!("ftsim: {names}: ")) && stderr.contains(why),
        "{args:?}: {stderr}"
    );
}

#[test]
fn bad_input_exits_2_under_run_and_plan() {
    let missing = "/nonexistent/input.json";
    assert_bad_input(&["run", missing], missing, "cannot read");
    assert_bad_input(&["plan", missing], missing, "cannot read");

    let not_json = temp_file("not_json", "{ ranks: ");
    let not_json = not_json.to_str().unwrap();
    assert_bad_input(&["run", not_json], not_json, "bad scenario");
    assert_bad_input(&["plan", not_json], not_json, "not a valid plan file");

    let overlap = temp_file(
        "overlap",
        r#"{"ranks": 8, "kill": [{"ranks": [6, 1], "at_ms": 1}, {"rank": 0, "at_ms": 2}],
            "until_ms": 5}"#,
    );
    let overlap = overlap.to_str().unwrap();
    assert_bad_input(
        &["run", overlap],
        overlap,
        "kill[1] and kill[0] both kill rank 0",
    );

    let duplicate = temp_file(
        "duplicate",
        r#"{"ranks": 3, "root": 0, "outputs": [{"name": "A", "bytes": 1, "dests": [1]},
                                              {"name": "A", "bytes": 1, "dests": [2]}]}"#,
    );
    let duplicate = duplicate.to_str().unwrap();
    assert_bad_input(
        &["plan", duplicate],
        duplicate,
        "two outputs are named \"A\"",
    );
}

#[test]
fn usage_errors_exit_2_too() {
    assert_eq!(exit_of(&["run"]).0, 2);
    assert_eq!(exit_of(&["plan", "x.json", "--json", "--dot"]).0, 2);
    assert_eq!(exit_of(&["walk"]).0, 2);
}

#[test]
fn good_input_exits_0_and_a_failed_run_1() {
    assert_eq!(
        exit_of(&["plan", &repo("plans/issue624.json"), "--json"]).0,
        0
    );
    assert_eq!(
        exit_of(&["run", &repo("scenarios/demo.json"), "--summary"]).0,
        0
    );
    let (code, stderr) = exit_of(&["run", &repo("scenarios/demo.json"), "--max-events", "10"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("event budget exhausted"), "{stderr}");
}
