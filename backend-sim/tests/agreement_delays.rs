//! `validate_global` without failures under the simulator, 2 µs links and no jitter:
//! every rank returns within `2·⌈log2 n⌉ + 4` message delays of its call (the fast
//! path's two dissemination sweeps take `2·⌈log2 n⌉`). The delay counts are printed
//! (`--nocapture`) for the README.

use backend_sim::engine::{ceil_log2, Sim};
use backend_sim::failure::make_node;
use backend_sim::scenario::Scenario;
use ft_core::node::Node;

/// Runs one failure-free `validate_global` over `n` ranks; returns the largest
/// `(return - call) / latency` over the ranks.
fn largest_delay_count(n: u32) -> f64 {
    let text = format!(
        r#"{{ "ranks": {n}, "seed": 3,
              "network": {{ "latency_us": 2.0, "jitter_us": 0.0, "gbytes_per_s": 10.0 }},
              "detector": {{ "period_ms": 10, "timeout_ms": 40 }},
              "actions": [ {{ "at_ms": 1, "validate_global": {{}} }} ],
              "until_ms": 2 }}"#
    );
    let scenario = Scenario::from_json(&text).expect("scenario");
    let mut sim: Sim<Node> = Sim::new(&scenario, make_node).expect("sim");
    sim.run_to_end(|_| {}).expect("run");
    let latency = sim.net().latency.as_nanos() as f64;
    let mut worst: f64 = 0.0;
    for r in 0..n {
        let globals: Vec<_> = sim
            .log()
            .validations
            .get(&r)
            .map(|v| v.iter().filter(|l| l.kind == "global").collect())
            .unwrap_or_default();
        assert_eq!(globals.len(), 1, "n={n}: rank {r} returned {globals:?}");
        let v = globals[0];
        assert!(
            v.result.is_empty(),
            "n={n}: rank {r} returned {:?}",
            v.result
        );
        let took = v.finished.as_nanos().saturating_sub(v.started.as_nanos()) as f64;
        worst = worst.max(took / latency);
    }
    worst
}

#[test]
fn failure_free_validate_global_returns_within_two_sweeps_and_four_delays() {
    let sizes: &[u32] = if cfg!(debug_assertions) {
        &[8, 1024]
    } else {
        &[8, 1024, 65536]
    };
    for &n in sizes {
        let delays = largest_delay_count(n);
        let bound = f64::from(2 * ceil_log2(n) + 4);
        eprintln!(
            "n = {n}: every rank returned within {delays:.3} delays of 2 µs (bound {bound}, two sweeps {})",
            2 * ceil_log2(n)
        );
        assert!(delays <= bound, "n={n}: {delays} delays > {bound}");
    }
}
