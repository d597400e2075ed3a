//! The run report of `ftsim run`, through `failure::run_scenario` (the whole stack, as
//! the CLI runs it): the figures a node failure is judged by, and validation times.

use std::path::Path;

use backend_sim::failure::{run_scenario, RunOptions};
use backend_sim::report::Report;
use backend_sim::scenario::Scenario;
use serde_json::Value;

fn run(file: &str) -> (Report, Value) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../scenarios")
        .join(file);
    let scenario = Scenario::from_file(&path).unwrap_or_else(|e| panic!("{file}: {e}"));
    let options = RunOptions {
        per_rank: true,
        ..RunOptions::default()
    };
    let (report, _) = run_scenario(&scenario, options).expect("the run settles");
    let json = serde_json::from_str(&report.to_json()).expect("JSON");
    (report, json)
}

#[test]
fn the_demo_validates_globally_and_reports_when_each_validation_was_called() {
    let (report, json) = run("demo.json");
    let killed = serde_json::json!([17, 40, 41, 42, 43, 44, 45, 46, 47]);
    let mut survivors = 0;
    for rank in json["per_rank"].as_array().unwrap() {
        if rank["alive"] == false {
            continue;
        }
        survivors += 1;
        assert_eq!(rank["global"], killed, "{rank}");
        let global: Vec<&Value> = rank["validations"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|v| v["kind"] == "global")
            .collect();
        assert_eq!(global.len(), 1, "{rank}");
        assert_eq!(global[0]["started_ms"], 160.0, "the call's time: {rank}");
        assert!(global[0]["finished_ms"].as_f64().unwrap() > 160.0, "{rank}");
        assert_eq!(global[0]["result"], killed);
    }
    assert_eq!(survivors, 55);
    for d in json["detections"].as_array().unwrap() {
        let suspected = d["first_suspected_ms"].as_f64().expect("suspected");
        let everyone = d["all_survivors_ms"].as_f64().expect("known by all");
        assert!(suspected <= everyone, "{d}");
    }
    let text = report.to_text();
    // 64 participants: the fast path's two sweeps take 2·6 delays without failures.
    assert!(
        text.contains("called 160.0000 ms") && text.contains("(failure-free shape: 12 delays)"),
        "{text}"
    );
    assert!(
        text.contains("G=[17, 40, 41, 42, 43, 44, 45, 46, 47]  "),
        "{text}"
    );
    assert!(text.contains("global@160.0"), "{text}");
    assert!(text.contains("block [40, 47] (8 ranks)"), "{text}");
    assert_eq!(json["ranks_per_node"], 8);
    assert_eq!(json["detector_span"], 8);
}

#[test]
fn a_block_kill_gets_a_line_against_the_detection_bound() {
    let (report, json) = run("node-wrap.json");
    assert_eq!(json["ranks_per_node"], 8);
    assert_eq!(json["detector_span"], 8);
    let block = &json["blocks"][0];
    assert_eq!(
        (
            &block["first"],
            &block["last"],
            &block["ranks"],
            &block["killed_ms"]
        ),
        (
            &Value::from(252),
            &Value::from(3),
            &Value::from(8),
            &Value::from(20.0)
        )
    );
    // 2·40 + 10 + (⌈log2 256⌉ + 4) · (1.5 + 0.75) µs.
    assert!(
        (block["bound_ms"].as_f64().unwrap() - 90.027).abs() < 1e-9,
        "{block}"
    );
    let within = block["detection_ms"]
        .as_f64()
        .is_some_and(|d| d <= 90.027 && d == block["all_survivors_ms"].as_f64().unwrap() - 20.0);
    assert_eq!(block["within_bound"], within, "{block}");
    let text = report.to_text();
    assert!(
        text.contains("block [252, 3] (8 ranks) killed @ 20.000 ms: every survivor knew all of it"),
        "{text}"
    );
    assert!(
        text.contains("killed:  0..=3 @ 20.000 ms, 252..=255 @ 20.000 ms"),
        "{text}"
    );
    // Heartbeats: O(1) per rank per period, before the kill and after it.
    for key in [
        "heartbeats_per_rank_per_period",
        "heartbeats_per_rank_per_period_at_end",
    ] {
        let rate = json[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{key}: {json}"));
        assert!((0.5..=4.0).contains(&rate), "{key} = {rate}");
    }
}
