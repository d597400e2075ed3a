//! `ftsim plan` through `plan_file::run`: the plan-result contract, Graphviz and text
//! renderings, and the errors a bad plan file gets.

mod common;

use std::path::{Path, PathBuf};

use backend_sim::plan_file::{self, PlanFileError, PlanFormat};

fn plans_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../plans")
}

/// Writes `text` to a fresh temporary plan file and returns its path.
fn temp_plan(name: &str, text: &str) -> PathBuf {
    common::temp_file("plan_cli", name, text)
}

fn error_of(name: &str, text: &str) -> (PlanFileError, String) {
    let err = plan_file::run(&temp_plan(name, text), PlanFormat::Json).unwrap_err();
    let msg = err.to_string();
    (err, msg)
}

#[test]
fn issue_624_json_is_exactly_the_contract() {
    let out = plan_file::run(&plans_dir().join("issue624.json"), PlanFormat::Json).unwrap();
    assert_eq!(
        out,
        "{\n  \"edges\": [\n    [0, 1, [\"A\"]],\n    [0, 2, [\"A\", \"B\"]]\n  ],\n  \
         \"stats\": {\"trees\": 2, \"activations\": 2, \"bytes\": 6144, \"max_depth\": 1}\n}\n"
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v,
        serde_json::json!({
            "edges": [[0, 1, ["A"]], [0, 2, ["A", "B"]]],
            "stats": {"trees": 2, "activations": 2, "bytes": 6144, "max_depth": 1}
        })
    );
}

#[test]
fn every_sample_plan_builds_in_every_format() {
    let mut seen = 0;
    for entry in std::fs::read_dir(plans_dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        for format in [PlanFormat::Text, PlanFormat::Json, PlanFormat::Dot] {
            let out =
                plan_file::run(&path, format).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            if format == PlanFormat::Json {
                let v: serde_json::Value = serde_json::from_str(&out).unwrap();
                let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
                assert_eq!(keys, ["edges", "stats"]);
            }
        }
        seen += 1;
    }
    assert!(seen >= 4, "sample plans found: {seen}");
}

#[test]
fn design_example_leaves_the_failed_rank_out() {
    let path = plans_dir().join("design-example.json");
    let v: serde_json::Value =
        serde_json::from_str(&plan_file::run(&path, PlanFormat::Json).unwrap()).unwrap();
    assert_eq!(v["stats"]["bytes"], 6144);
    let text = plan_file::run(&path, PlanFormat::Text).unwrap();
    assert!(text.contains("failed ranks: 5"), "{text}");
    let lu = plan_file::run(&plans_dir().join("lu-step.json"), PlanFormat::Text).unwrap();
    assert!(
        lu.contains("unreachable destinations (failed, skipped): 17, 40"),
        "{lu}"
    );
}

#[test]
fn the_three_strategies_answer_624_differently() {
    let json = |text: &str| -> serde_json::Value {
        serde_json::from_str(&plan_file::run(&temp_plan("s", text), PlanFormat::Json).unwrap())
            .unwrap()
    };
    let spec = |strategy: &str| {
        format!(
            r#"{{"ranks": 3, "root": 0, "topology": "chain", "strategy": "{strategy}",
                "outputs": [{{"name": "A", "bytes": 1024, "dests": [1, 2]}},
                            {{"name": "B", "bytes": 4096, "dests": [2]}}]}}"#
        )
    };
    assert_eq!(
        json(&spec("fetch-for-descendants"))["edges"],
        serde_json::json!([[0, 1, ["A", "B"]], [1, 2, ["A", "B"]]])
    );
    assert_eq!(
        json(&spec("per-output"))["edges"],
        serde_json::json!([[0, 1, ["A"]], [1, 2, ["A"]], [0, 2, ["B"]]])
    );
}

#[test]
fn dot_has_one_colour_per_output_and_labels() {
    let out = plan_file::run(&plans_dir().join("issue624.json"), PlanFormat::Dot).unwrap();
    assert!(out.starts_with("digraph plan {"), "{out}");
    assert!(
        out.contains("0 -> 1 [label=\"A\", color=\"#1f77b4\"];"),
        "{out}"
    );
    assert!(
        out.contains("0 -> 2 [label=\"A,B\", color=\"#1f77b4:#d62728\"];"),
        "{out}"
    );
    assert!(out.contains("legend_1 [fillcolor=\"#d62728\", label=\"B (4096 B)\"]"));
    assert!(out.trim_end().ends_with('}'));
}

#[test]
fn text_shows_classes_trees_depth_bytes_activations() {
    let out = plan_file::run(&plans_dir().join("issue624.json"), PlanFormat::Text).unwrap();
    for line in [
        "plan: 3 ranks, root 0, topology chain, strategy per-class",
        "classes (2):",
        "  class 0 {A}: 1 rank: 1",
        "  class 1 {A, B}: 1 rank: 2",
        "  tree 1 {A, B}: 1 activation, depth 1, 5120 bytes",
        "    0 -> 2 {A, B}",
        "totals: trees 2, activations 2, bytes 6144, max depth 1",
    ] {
        assert!(out.lines().any(|l| l == line), "missing {line:?} in\n{out}");
    }
}

#[test]
fn syntax_and_type_errors_give_line_and_column() {
    let (err, msg) = error_of("syntax", "{\n  \"ranks\": 3,\n  \"root\": 0,\n  oops\n}");
    assert!(matches!(err, PlanFileError::Parse(_)));
    assert!(msg.contains("line 4 column 3"), "{msg}");
    let (_, msg) = error_of(
        "type",
        "{\"ranks\": \"three\", \"root\": 0, \"outputs\": []}",
    );
    assert!(
        msg.contains("invalid type") && msg.contains("line 1"),
        "{msg}"
    );
    let (_, msg) = error_of("neg", "{\"ranks\": 3, \"root\": -1, \"outputs\": []}");
    assert!(msg.contains("line 1"), "{msg}");
    let (_, msg) = error_of("missing", "{\"ranks\": 3, \"outputs\": []}");
    assert!(msg.contains("missing field `root`"), "{msg}");
}

#[test]
fn unknown_fields_and_names_are_rejected() {
    let (_, msg) = error_of(
        "unknown_field",
        r#"{"ranks": 3, "root": 0, "outputs": [], "colour": "red"}"#,
    );
    assert!(msg.contains("unknown field `colour`"), "{msg}");
    let (_, msg) = error_of(
        "unknown_output_field",
        r#"{"ranks": 3, "root": 0, "outputs": [{"name": "A", "bytes": 1, "dests": [1], "size": 2}]}"#,
    );
    assert!(msg.contains("unknown field `size`"), "{msg}");
    let (_, msg) = error_of(
        "topology",
        r#"{"ranks": 3, "root": 0, "topology": "kary:0", "outputs": []}"#,
    );
    assert!(msg.contains("kary:K (K >= 1), not \"kary:0\""), "{msg}");
    assert!(msg.contains("line 1 column"), "{msg}");
    let (_, msg) = error_of(
        "strategy",
        r#"{"ranks": 3, "root": 0, "strategy": "merged", "outputs": []}"#,
    );
    assert!(msg.contains("strategy must be one of"), "{msg}");
}

#[test]
fn impossible_broadcasts_are_named() {
    let cases = [
        (
            r#"{"ranks": 3, "root": 0, "outputs": [{"name": "A", "bytes": 1, "dests": [1, 3]}]}"#,
            "invalid plan: output \"A\": destination 3 is out of range (ranks = 3)",
        ),
        (
            r#"{"ranks": 3, "root": 0, "outputs": [{"name": "A", "bytes": 1, "dests": [0, 1]}]}"#,
            "invalid plan: output \"A\": destination list names the root 0",
        ),
        (
            r#"{"ranks": 3, "root": 0, "outputs": [{"name": "A", "bytes": 1, "dests": [1]}, {"name": "A", "bytes": 2, "dests": [2]}]}"#,
            "invalid plan: two outputs are named \"A\"",
        ),
        (
            r#"{"ranks": 3, "root": 0, "outputs": [{"name": "A", "bytes": 1, "dests": [1, 2, 1]}]}"#,
            "invalid plan: output \"A\": destination 1 is listed twice",
        ),
        (
            r#"{"ranks": 3, "root": 0, "outputs": [{"name": "", "bytes": 1, "dests": [1]}]}"#,
            "invalid plan: output #0 has an empty name",
        ),
        (
            r#"{"ranks": 3, "root": 3, "outputs": []}"#,
            "invalid plan: root 3 is out of range (ranks = 3)",
        ),
        (
            r#"{"ranks": 3, "root": 0, "failed": [0], "outputs": []}"#,
            "invalid plan: root 0 is in the failed set",
        ),
        (
            r#"{"ranks": 3, "root": 0, "failed": [7], "outputs": []}"#,
            "invalid plan: failed rank 7 is out of range (ranks = 3)",
        ),
    ];
    for (k, (text, want)) in cases.into_iter().enumerate() {
        let (err, msg) = error_of(&format!("spec{k}"), text);
        assert!(matches!(err, PlanFileError::Spec(_)), "{msg}");
        assert_eq!(msg, want);
    }
}

#[test]
fn a_missing_file_is_a_read_error() {
    let err = plan_file::run(Path::new("/nonexistent/plan.json"), PlanFormat::Text).unwrap_err();
    assert!(matches!(err, PlanFileError::Read(_)));
    assert!(err.to_string().starts_with("cannot read the plan file:"));
}

#[test]
fn an_empty_plan_renders() {
    let path = temp_plan("empty", r#"{"ranks": 1, "root": 0, "outputs": []}"#);
    assert_eq!(
        plan_file::run(&path, PlanFormat::Json).unwrap(),
        "{\n  \"edges\": [],\n  \"stats\": {\"trees\": 0, \"activations\": 0, \"bytes\": 0, \"max_depth\": 0}\n}\n"
    );
}
