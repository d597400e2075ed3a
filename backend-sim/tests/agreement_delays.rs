//! `validate_global` under the simulator, 2 µs links and no jitter: every survivor
//! returns within `2·⌈log2 m⌉ + 4` message delays of its call, `m` the ranks alive (the
//! fast path's two dissemination sweeps take `2·⌈log2 m⌉`):
//!
//! - without failures;
//! - right after a death that every survivor already knows at its call: one rank, the
//!   coordinator (rank 0), or a 4-rank node (a block of adjacent ranks), killed at 1 ms,
//!   the call at 200 ms. The sweeps then run over the survivors each rank knows; before
//!   the fast path covered this case, such a call paid a prepare and four tree
//!   traversals (10, 45 and 75 delays at n = 8, 1024 and 65536).
//!
//! The delay counts are printed (`--nocapture`) for the README.

use backend_sim::engine::{ceil_log2, Sim};
use backend_sim::failure::make_node;
use backend_sim::scenario::Scenario;
use ft_core::node::Node;

/// Runs one `validate_global` over `n` ranks at `call_ms`, after the kills of `kill`
/// (JSON kill entries); checks that every survivor returned exactly `dead` and returns
/// the largest `(return - call) / latency` over the survivors.
fn largest_delay_count(n: u32, kill: &str, dead: &[u32], call_ms: u32) -> f64 {
    let text = format!(
        r#"{{ "ranks": {n}, "seed": 3,
              "network": {{ "latency_us": 2.0, "jitter_us": 0.0, "gbytes_per_s": 10.0 }},
              "ranks_per_node": 4,
              "detector": {{ "period_ms": 10, "timeout_ms": 40 }},
              "kill": [ {kill} ],
              "actions": [ {{ "at_ms": {call_ms}, "validate_global": {{}} }} ],
              "until_ms": {} }}"#,
        call_ms + 1
    );
    let scenario = Scenario::from_json(&text).expect("scenario");
    let mut sim: Sim<Node> = Sim::new(&scenario, make_node).expect("sim");
    sim.run_to_end(|_| {}).expect("run");
    let latency = sim.net().latency.as_nanos() as f64;
    let mut worst: f64 = 0.0;
    for r in (0..n).filter(|r| !dead.contains(r)) {
        let globals: Vec<_> = sim
            .log()
            .validations
            .get(&r)
            .map(|v| v.iter().filter(|l| l.kind == "global").collect())
            .unwrap_or_default();
        assert_eq!(globals.len(), 1, "n={n}: rank {r} returned {globals:?}");
        let v = globals[0];
        assert_eq!(v.result, dead, "n={n}: rank {r} returned {:?}", v.result);
        let took = v.finished.as_nanos().saturating_sub(v.started.as_nanos()) as f64;
        worst = worst.max(took / latency);
    }
    worst
}

/// Checks one case against `2·⌈log2 m⌉ + 4` and prints its count.
fn within_two_sweeps_and_four_delays(n: u32, name: &str, kill: &str, dead: &[u32], call_ms: u32) {
    let delays = largest_delay_count(n, kill, dead, call_ms);
    let m = n - dead.len() as u32;
    let bound = f64::from(2 * ceil_log2(m) + 4);
    eprintln!(
        "n = {n}, {name}: every survivor returned within {delays:.3} delays of 2 µs (bound {bound}, two sweeps {})",
        2 * ceil_log2(m)
    );
    assert!(delays <= bound, "n={n} {name}: {delays} delays > {bound}");
}

fn sizes() -> &'static [u32] {
    if cfg!(debug_assertions) {
        &[8, 1024]
    } else {
        &[8, 1024, 65536]
    }
}

#[test]
fn failure_free_validate_global_returns_within_two_sweeps_and_four_delays() {
    for &n in sizes() {
        within_two_sweeps_and_four_delays(n, "no failure", "", &[], 1);
    }
}

#[test]
fn validate_global_after_deaths_known_at_the_call_returns_within_two_sweeps_and_four_delays() {
    let cases: [(&str, &str, &[u32]); 3] = [
        ("rank 5 dead", r#"{ "rank": 5, "at_ms": 1 }"#, &[5]),
        ("coordinator 0 dead", r#"{ "rank": 0, "at_ms": 1 }"#, &[0]),
        (
            "node 4..=7 dead",
            r#"{ "ranks": [4, 7], "at_ms": 1 }"#,
            &[4, 5, 6, 7],
        ),
    ];
    for &n in sizes() {
        for (name, kill, dead) in cases {
            within_two_sweeps_and_four_delays(n, name, kill, dead, 200);
        }
    }
}
