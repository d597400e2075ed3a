//! The detector under load: every rank is descheduled again and again (the simulator's
//! load model, `Scenario::load`), as on an oversubscribed node.
//!
//! - Within the bound the detector claims for a live rank (a pause shorter than
//!   `timeout − period − jitter`, see the detector-tuning chapter), random schedules
//!   (4 to 15 ranks, with and without a kill) declare no live rank, and every survivor
//!   learns exactly the killed ranks: 1,000 schedules by default, `FT_LOAD_SCHEDULES`
//!   of them if set (`FT_LOAD_SCHEDULES=10000` for the figure the guide gives).
//! - Past it, ranks are declared: each declared rank stops once it runs again, and
//!   the survivors agree, in a global validation after the load, on exactly the ranks
//!   that left.

use std::collections::BTreeSet;

use backend_sim::engine::{Departure, Sim};
use backend_sim::failure::make_node;
use backend_sim::scenario::Scenario;
use ft_core::node::Node;
use ft_core::Rank;

mod common;
use common::first_false_declaration;

const PERIOD_MS: f64 = 50.0;
const TIMEOUT_MS: f64 = 1000.0;
const JITTER_US: f64 = 20.0;

/// A scenario of `n` ranks under load (pauses up to `pause_max_ms`, one every
/// `mean_gap_ms` on average, none after `load_until_ms`), `kill` (a JSON kill list),
/// and `actions`, until `until_ms`.
#[allow(clippy::too_many_arguments)]
fn scenario(
    n: u32,
    seed: u64,
    pause_max_ms: f64,
    mean_gap_ms: f64,
    load_until_ms: f64,
    kill: &str,
    actions: &str,
    until_ms: f64,
) -> Scenario {
    let text = format!(
        r#"{{ "ranks": {n}, "seed": {seed},
              "network": {{ "latency_us": 20, "jitter_us": {JITTER_US}, "gbytes_per_s": 10.0 }},
              "detector": {{ "period_ms": {PERIOD_MS}, "timeout_ms": {TIMEOUT_MS} }},
              "load": {{ "pause_max_ms": {pause_max_ms}, "mean_gap_ms": {mean_gap_ms},
                         "until_ms": {load_until_ms} }},
              "kill": [{kill}], "actions": [{actions}], "until_ms": {until_ms} }}"#
    );
    Scenario::from_json(&text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

/// How many schedules the bound is checked over.
fn schedules() -> u64 {
    std::env::var("FT_LOAD_SCHEDULES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

#[test]
fn pauses_within_the_bound_declare_no_live_rank() {
    // The bound: a pause under timeout − period − jitter (950 ms less 20 µs); the
    // longest drawn here is 940 ms, with one pause every 1.5 s per rank on average.
    let pause_max_ms = 940.0;
    let count = schedules();
    let mut with_kills = 0;
    for seed in 0..count {
        let n = 4 + (seed % 12) as u32;
        let (kill, killed): (String, Vec<Rank>) = match seed % 4 {
            0 | 1 => (String::new(), vec![]),
            2 => {
                let r = (seed / 4) as u32 % n;
                (format!(r#"{{"rank": {r}, "at_ms": 1500}}"#), vec![r])
            }
            _ => {
                // A block of two adjacent ranks (a node).
                let first = (seed / 4) as u32 % (n - 1);
                (
                    format!(r#"{{"ranks": [{first}, {}], "at_ms": 1500}}"#, first + 1),
                    vec![first, first + 1],
                )
            }
        };
        with_kills += usize::from(!killed.is_empty());
        // The load ends at 3.5 s; the run, long enough after it for every survivor to
        // learn the kill (a detection and a propagation).
        let s = scenario(n, seed, pause_max_ms, 1500.0, 3500.0, &kill, "", 7000.0);
        let mut sim: Sim<Node> = Sim::new(&s, make_node).expect("sim");
        sim.run_to_end(|_| {})
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        if let Some(r) = first_false_declaration(&sim, &killed) {
            panic!("seed {seed}: n {n}, kill {kill:?}: live rank {r} was declared dead");
        }
        for r in sim.survivors() {
            let known: Vec<Rank> = sim.machine(r).view().known_failed().iter().collect();
            assert_eq!(
                known, killed,
                "seed {seed}: n {n}: rank {r} knows {known:?}"
            );
        }
    }
    assert_eq!(with_kills as u64, count / 2);
}

#[test]
fn pauses_past_the_bound_cost_the_paused_ranks_and_the_rest_agree() {
    // Pauses up to 2.5 s (past timeout + period): ranks are declared. The load stops at
    // 8 s; a global validation at 14 s runs once every declared rank has stopped.
    let mut declared_total = 0;
    for seed in 0..100u64 {
        let n = 5 + (seed % 12) as u32;
        let s = scenario(
            n,
            seed,
            2500.0,
            4000.0,
            8000.0,
            "",
            r#"{"at_ms": 14000, "validate_global": {}}"#,
            20_000.0,
        );
        let mut sim: Sim<Node> = Sim::new(&s, make_node).expect("sim");
        sim.run_to_end(|_| {})
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        let log = sim.log();
        let left: BTreeSet<Rank> = log.departures.keys().copied().collect();
        assert!(
            log.departures
                .values()
                .all(|how| matches!(how, Departure::Stopped(_))),
            "seed {seed}: only declared ranks leave, and they stop: {:?}",
            log.departures
        );
        assert!(left.len() < n as usize, "seed {seed}: someone survives");
        declared_total += left.len();
        for r in sim.survivors() {
            let global: BTreeSet<Rank> = sim.machine(r).view().global().iter().collect();
            assert_eq!(global, left, "seed {seed}: n {n}: rank {r}'s G");
        }
    }
    assert!(declared_total > 0, "past the bound, some rank is declared");
}
