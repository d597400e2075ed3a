//! `validate_global` under the simulator: seeded random scenarios with ranks killed at
//! random times and at random agreement send steps, two successive validations each.
//!
//! Checked for every schedule (the failure message names the seed):
//! - uniform agreement: every rank that returned from validation `k`, including ranks
//!   that died after returning, returned the same `G`;
//! - termination: every survivor returned from both validations;
//! - validity: `G` holds only killed ranks (delays stay far below `timeout - period`, so
//!   nobody is falsely suspected), and the second validation, started once every death
//!   well after every death is detected, holds every rank killed before it;
//! - epochs: `G` only grows from one validation to the next, and the view's `G` at the
//!   end is the last returned one.

use std::collections::BTreeSet;

use backend_sim::engine::{Departure, Sim, SplitMix};
use backend_sim::failure::make_node;
use backend_sim::scenario::Scenario;
use ft_core::node::Node;
use ft_core::Rank;

fn scenario(seed: u64) -> (Scenario, BTreeSet<Rank>) {
    let mut rng = SplitMix::new(seed);
    let n = 2 + rng.below(63) as u32;
    let max_kills = (n / 2).max(1);
    let count = rng.below(u64::from(max_kills) + 1) as u32;
    let mut killed = BTreeSet::new();
    let mut kills = Vec::new();
    while killed.len() < count as usize {
        let rank = rng.below(u64::from(n)) as Rank;
        if !killed.insert(rank) {
            continue;
        }
        if rng.below(2) == 0 {
            // Around the first validation (at 100 ms): before, during and after it.
            let at = 60.0 + rng.below(100_000) as f64 / 1000.0;
            kills.push(format!(r#"{{"rank": {rank}, "at_ms": {at}}}"#));
        } else {
            let nth = 1 + rng.below(6);
            kills.push(format!(
                r#"{{"rank": {rank}, "on": "send", "kind": "agree", "nth": {nth}}}"#
            ));
        }
    }
    let text = format!(
        r#"{{ "ranks": {n}, "seed": {seed},
              "network": {{ "latency_us": 2.0, "jitter_us": 3.0, "gbytes_per_s": 10.0 }},
              "detector": {{ "period_ms": 10, "timeout_ms": 40 }},
              "kill": [{}],
              "actions": [ {{ "at_ms": 100, "validate_global": {{}} }},
                           {{ "at_ms": 2500, "validate_global": {{}} }} ],
              "until_ms": 4000 }}"#,
        kills.join(", ")
    );
    if std::env::var("AGREEMENT_SIM_DUMP").is_ok_and(|s| s == seed.to_string()) {
        eprintln!("{text}");
    }
    (Scenario::from_json(&text).expect("scenario"), killed)
}

fn check(seed: u64) {
    let (scenario, killed) = scenario(seed);
    let mut sim: Sim<Node> = Sim::new(&scenario, make_node).expect("sim");
    sim.run_to_end(|_| {})
        .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    let n = sim.size();
    let log = sim.log();
    let mut agreed: [Option<Vec<Rank>>; 2] = [None, None];
    for r in 0..n {
        let globals: Vec<&Vec<Rank>> = log
            .validations
            .get(&r)
            .map(|v| {
                v.iter()
                    .filter(|l| l.kind == "global")
                    .map(|l| &l.result)
                    .collect()
            })
            .unwrap_or_default();
        if sim.is_alive(r) {
            assert_eq!(
                globals.len(),
                2,
                "seed {seed}: survivor {r} returned {globals:?}"
            );
            assert_eq!(
                sim.machine(r).view().global().iter().collect::<Vec<_>>(),
                *globals[1],
                "seed {seed}: rank {r}"
            );
        }
        for (k, g) in globals.iter().enumerate() {
            match &agreed[k] {
                None => agreed[k] = Some((*g).clone()),
                Some(first) => assert_eq!(first, *g, "seed {seed}: rank {r} validation {k}"),
            }
        }
    }
    let first: BTreeSet<Rank> = agreed[0].clone().unwrap_or_default().into_iter().collect();
    let second: BTreeSet<Rank> = agreed[1].clone().unwrap_or_default().into_iter().collect();
    assert!(
        first.is_subset(&killed),
        "seed {seed}: G1 {first:?} holds a live rank (killed {killed:?})"
    );
    assert!(first.is_subset(&second), "seed {seed}: G shrank");
    assert!(
        second.is_subset(&killed),
        "seed {seed}: G2 {second:?} holds a live rank"
    );
    // Ranks killed well before the second validation (kills at a send step may also
    // strike during it) are known to every survivor by then.
    let long_dead: BTreeSet<Rank> = log
        .departures
        .iter()
        .filter(|(_, d)| matches!(d, Departure::Killed(t) if t.as_millis_f64() < 2000.0))
        .map(|(r, _)| *r)
        .collect();
    if sim.survivors().next().is_some() {
        assert!(
            long_dead.is_subset(&second),
            "seed {seed}: G2 {second:?} misses one of {long_dead:?}"
        );
    }
}

#[test]
fn random_schedules_agree_uniformly() {
    let schedules: u64 = std::env::var("AGREEMENT_SIM_SCHEDULES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    for seed in 0..schedules {
        check(seed);
    }
}
