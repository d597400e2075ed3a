//! Plans under every strategy and topology: the PaRSEC #624 reproducer and its mirror
//! orderings, and property tests on random specs.

use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroU32;

use ft_bcast::{OutputSet, OutputSpec, Plan, PlanSpec, Strategy, Topology};
use ft_core::{Rank, SplitMix};
use proptest::prelude::*;

fn kary(k: u32) -> Topology {
    Topology::Kary(NonZeroU32::new(k).expect("k >= 1"))
}

fn topologies() -> [Topology; 5] {
    [
        Topology::Star,
        Topology::Chain,
        Topology::Binomial,
        kary(1),
        kary(2),
    ]
}

/// Plays the plan the way a runtime would: a rank that is activated asks its parent for
/// the outputs on its edge, and the parent answers only with data it holds; a request
/// for data not held yet waits (PaRSEC crashed here instead). Returns what every rank
/// ends up holding, and fails if a request can never be answered.
fn play(plan: &Plan) -> BTreeMap<Rank, BTreeSet<u32>> {
    let root = plan.spec().root;
    let all: BTreeSet<u32> = (0..plan.spec().outputs.len() as u32).collect();
    let mut held: BTreeMap<Rank, BTreeSet<u32>> = BTreeMap::new();
    held.insert(root, all);
    let mut waiting: Vec<(Rank, Rank, Vec<u32>)> = plan
        .edges()
        .map(|e| (e.parent, e.child, e.outputs.iter().collect()))
        .collect();
    while !waiting.is_empty() {
        let before = waiting.len();
        waiting.retain(|(parent, child, outputs)| {
            let parent_has = held
                .get(parent)
                .is_some_and(|h| outputs.iter().all(|o| h.contains(o)));
            if parent_has {
                held.entry(*child).or_default().extend(outputs);
            }
            !parent_has
        });
        assert!(
            waiting.len() < before,
            "requests that no parent can ever answer: {waiting:?}"
        );
    }
    held.remove(&root);
    held
}

fn needs(spec: &PlanSpec) -> BTreeMap<Rank, BTreeSet<u32>> {
    let mut needs: BTreeMap<Rank, BTreeSet<u32>> = BTreeMap::new();
    for (j, o) in spec.outputs.iter().enumerate() {
        for &r in &o.dests {
            if !spec.failed.contains(r) {
                needs.entry(r).or_default().insert(j as u32);
            }
        }
    }
    needs
}

fn names(plan: &Plan, set: &OutputSet) -> Vec<String> {
    set.iter()
        .map(|j| plan.spec().outputs[j as usize].name.to_string())
        .collect()
}

fn edges(plan: &Plan) -> Vec<(Rank, Rank, Vec<String>)> {
    plan.edges()
        .map(|e| (e.parent, e.child, names(plan, e.outputs)))
        .collect()
}

fn issue_624(strategy: Strategy, topology: Topology) -> PlanSpec {
    PlanSpec::new(3, 0)
        .with_topology(topology)
        .with_strategy(strategy)
        .with_output(OutputSpec::new("A", 1024, vec![1, 2]))
        .with_output(OutputSpec::new("B", 4096, vec![2]))
}

fn e(p: Rank, c: Rank, outputs: &[&str]) -> (Rank, Rank, Vec<String>) {
    (p, c, outputs.iter().map(|s| s.to_string()).collect())
}

#[test]
fn issue_624_chain_per_class_gives_each_rank_its_own_tree() {
    let plan = Plan::build(issue_624(Strategy::PerClass, Topology::Chain)).unwrap();
    plan.check().unwrap();
    assert_eq!(edges(&plan), [e(0, 1, &["A"]), e(0, 2, &["A", "B"])]);
    let s = plan.stats();
    assert_eq!(
        (s.trees, s.activations, s.bytes, s.max_depth),
        (2, 2, 6144, 1)
    );
}

#[test]
fn issue_624_chain_fetch_for_descendants_makes_rank_1_fetch_b() {
    let plan = Plan::build(issue_624(Strategy::FetchForDescendants, Topology::Chain)).unwrap();
    plan.check().unwrap();
    assert_eq!(edges(&plan), [e(0, 1, &["A", "B"]), e(1, 2, &["A", "B"])]);
    assert_eq!(plan.stats().bytes, 2 * 5120);
}

#[test]
fn issue_624_chain_per_output_sends_b_straight_from_the_root() {
    let plan = Plan::build(issue_624(Strategy::PerOutput, Topology::Chain)).unwrap();
    plan.check().unwrap();
    assert_eq!(
        edges(&plan),
        [e(0, 1, &["A"]), e(1, 2, &["A"]), e(0, 2, &["B"])]
    );
    assert_eq!(plan.stats().activations, 3);
}

/// Every mirror ordering of the reproducer: any rank as the root, either remaining rank
/// as the one needing both outputs, the outputs listed in either order, destination
/// lists in either order; under every strategy and topology, nothing is missing,
/// nothing is requested from a parent that never gets it, and `check()` holds.
#[test]
fn issue_624_mirror_orderings_under_every_strategy_and_topology() {
    let mut plans = 0;
    for root in 0..3u32 {
        let others: Vec<Rank> = (0..3).filter(|&r| r != root).collect();
        for (x, y) in [(others[0], others[1]), (others[1], others[0])] {
            for b_first in [false, true] {
                for reversed in [false, true] {
                    let a_dests = if reversed { vec![y, x] } else { vec![x, y] };
                    let a = OutputSpec::new("A", 1024, a_dests);
                    let b = OutputSpec::new("B", 4096, vec![y]);
                    let outputs = if b_first { [b, a] } else { [a, b] };
                    for strategy in Strategy::ALL {
                        for topology in topologies() {
                            let mut spec = PlanSpec::new(3, root)
                                .with_strategy(strategy)
                                .with_topology(topology);
                            spec.outputs = outputs.to_vec();
                            let want = needs(&spec);
                            let plan = Plan::build(spec).unwrap();
                            let ctx = format!(
                                "root {root} x {x} y {y} b_first {b_first} {strategy} {topology}"
                            );
                            plan.check().unwrap_or_else(|e| panic!("{ctx}: {e}"));
                            let got = play(&plan);
                            if strategy == Strategy::FetchForDescendants {
                                for (r, need) in &want {
                                    assert!(need.is_subset(&got[r]), "{ctx}");
                                }
                            } else {
                                assert_eq!(got, want, "{ctx}");
                            }
                            plans += 1;
                        }
                    }
                }
            }
        }
    }
    assert_eq!(plans, 6 * 2 * 2 * 3 * 5);
}

#[test]
fn failed_destinations_are_left_out_and_reported() {
    let spec = PlanSpec::new(8, 0)
        .with_topology(Topology::Chain)
        .with_output(OutputSpec::new("A", 10, vec![1, 2, 3, 4]))
        .with_output(OutputSpec::new("B", 20, vec![3, 4]))
        .with_failed(&[3, 6])
        .unwrap();
    for strategy in Strategy::ALL {
        let plan = Plan::build(spec.clone().with_strategy(strategy)).unwrap();
        plan.check().unwrap();
        assert_eq!(plan.unreachable(), [3]);
        assert!(plan.edges().all(|e| e.child != 3 && e.parent != 3));
        assert!(play(&plan)[&4].contains(&1));
    }
    // A fully failed output builds no tree at all.
    let plan = Plan::build(
        PlanSpec::new(4, 0)
            .with_output(OutputSpec::new("A", 1, vec![2]))
            .with_failed(&[2])
            .unwrap(),
    )
    .unwrap();
    plan.check().unwrap();
    assert_eq!(plan.stats().trees, 0);
    assert_eq!(plan.unreachable(), [2]);
}

#[test]
fn a_spec_from_a_failure_view_leaves_known_failures_out() {
    let mut view = ft_core::FailureView::new(6, 0);
    view.on_rank_failed(2).unwrap(); // pending: still treated as dead
    let spec = PlanSpec::new(6, 0)
        .with_output(OutputSpec::new("A", 1, vec![1, 2, 3]))
        .with_failure_view(&view)
        .unwrap();
    let plan = Plan::build(spec).unwrap();
    plan.check().unwrap();
    assert_eq!(plan.unreachable(), [2]);
    assert_eq!(plan.stats().activations, 2);
}

/// A random spec: `n` ranks, `m` outputs each going to a random fraction of the ranks
/// (lists shuffled), about `failed_pct`% of the ranks failed.
fn random_spec(n: u32, m: usize, failed_pct: u64, seed: u64) -> PlanSpec {
    let mut rng = SplitMix::new(seed);
    let root = rng.below(n.into()) as Rank;
    let mut spec = PlanSpec::new(n, root);
    for j in 0..m {
        // Densities from "a few ranks" to "almost everyone".
        let per_mille = [2, 20, 100, 500, 900][rng.below(5) as usize];
        let mut dests: Vec<Rank> = (0..n)
            .filter(|&r| r != root && rng.chance(per_mille, 1000))
            .collect();
        for i in (1..dests.len()).rev() {
            let k = rng.below(i as u64 + 1) as usize;
            dests.swap(i, k);
        }
        let bytes = 1 + rng.below(1 << 20);
        spec.outputs
            .push(OutputSpec::new(format!("o{j}"), bytes, dests));
    }
    let failed: Vec<Rank> = (0..n)
        .filter(|&r| r != root && rng.chance(failed_pct, 100))
        .collect();
    spec.with_failed(&failed).expect("in range")
}

fn check_every_strategy_and_topology(spec: &PlanSpec, k: u32) -> Result<(), TestCaseError> {
    let want = needs(spec);
    let live_dests = want.len();
    let min_bytes: u64 = spec
        .outputs
        .iter()
        .map(|o| {
            o.bytes
                * o.dests
                    .iter()
                    .filter(|&&r| !spec.failed.contains(r))
                    .count() as u64
        })
        .sum();
    let live_entries: usize = want.values().map(|s| s.len()).sum();
    for topology in [Topology::Star, Topology::Chain, Topology::Binomial, kary(k)] {
        for strategy in Strategy::ALL {
            let spec = spec.clone().with_topology(topology).with_strategy(strategy);
            let plan = Plan::build(spec).map_err(|e| TestCaseError::fail(e.to_string()))?;
            plan.check()
                .map_err(|e| TestCaseError::fail(format!("{strategy} {topology}: {e}")))?;
            let s = plan.stats();
            match strategy {
                Strategy::PerClass => {
                    prop_assert_eq!(s.bytes, min_bytes, "per-class bytes are the minimum");
                    prop_assert_eq!(s.activations, live_dests);
                    prop_assert_eq!(s.trees, plan.classes().len());
                    if topology == Topology::Binomial {
                        for (tree, class) in plan.trees().iter().zip(plan.classes()) {
                            let bound = (class.members.len() as u64 + 1)
                                .next_power_of_two()
                                .trailing_zeros();
                            prop_assert!(tree.depth <= bound, "depth {} > {bound}", tree.depth);
                        }
                    }
                }
                Strategy::FetchForDescendants => {
                    prop_assert!(s.bytes >= min_bytes);
                    prop_assert_eq!(s.activations, live_dests);
                    prop_assert_eq!(s.trees, usize::from(live_dests > 0));
                }
                Strategy::PerOutput => {
                    prop_assert_eq!(s.bytes, min_bytes);
                    prop_assert_eq!(s.activations, live_entries);
                }
            }
        }
    }
    Ok(())
}

proptest! {
    // Each case builds and checks 12 plans of up to 10^4 ranks: about 2.5 s unoptimised,
    // 0.1 s with --release.
    #![proptest_config(ProptestConfig { cases: if cfg!(debug_assertions) { 12 } else { 256 }, ..ProptestConfig::default() })]
    #[test]
    fn random_big_specs_hold_every_invariant(
        n in 1u32..=10_000,
        m in 0usize..=32,
        failed_pct in prop_oneof![Just(0u64), 0u64..30],
        k in 1u32..9,
        seed in any::<u64>(),
    ) {
        check_every_strategy_and_topology(&random_spec(n, m, failed_pct, seed), k)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]
    #[test]
    fn random_small_specs_hold_every_invariant(
        n in 1u32..=40,
        m in 0usize..=32,
        failed_pct in 0u64..50,
        k in 1u32..5,
        seed in any::<u64>(),
    ) {
        let spec = random_spec(n, m, failed_pct, seed);
        check_every_strategy_and_topology(&spec, k)?;
        // And playing any plan delivers exactly the needs (at least, when fetching for
        // descendants).
        for strategy in Strategy::ALL {
            let plan = Plan::build(spec.clone().with_strategy(strategy).with_topology(kary(k))).unwrap();
            let got = play(&plan);
            for (r, need) in needs(&spec) {
                let held = got.get(&r).cloned().unwrap_or_default();
                if strategy == Strategy::FetchForDescendants {
                    prop_assert!(need.is_subset(&held));
                } else {
                    prop_assert_eq!(need, held);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: if cfg!(debug_assertions) { 32 } else { 512 }, ..ProptestConfig::default() })]
    /// Ranks dying mid-broadcast: the repaired plan re-attaches orphans to their nearest
    /// live ancestor, still meets every invariant, and still delivers every surviving
    /// destination its outputs; repairing twice works too.
    #[test]
    fn repaired_plans_hold_every_invariant(
        n in 2u32..=400,
        m in 1usize..=12,
        failed_pct in 0u64..20,
        dead_pct in 1u64..60,
        k in 1u32..5,
        seed in any::<u64>(),
    ) {
        let spec = random_spec(n, m, failed_pct, seed);
        let mut rng = SplitMix::new(seed ^ 0xdead);
        let dead: Vec<Rank> = (0..n).filter(|&r| r != spec.root && rng.chance(dead_pct, 100)).collect();
        let (first, second) = dead.split_at(dead.len() / 2);
        for topology in [Topology::Star, Topology::Chain, Topology::Binomial, kary(k)] {
            for strategy in Strategy::ALL {
                let plan = Plan::build(spec.clone().with_topology(topology).with_strategy(strategy)).unwrap();
                let once = plan.repair(&ft_core::RankSet::from_ranks(n, first.iter().copied())).unwrap();
                once.check().map_err(|e| TestCaseError::fail(format!("{strategy} {topology} once: {e}")))?;
                let twice = once.repair(&ft_core::RankSet::from_ranks(n, second.iter().copied())).unwrap();
                twice.check().map_err(|e| TestCaseError::fail(format!("{strategy} {topology} twice: {e}")))?;
                let got = play(&twice);
                for (r, need) in needs(twice.spec()) {
                    let held = got.get(&r).cloned().unwrap_or_default();
                    prop_assert!(need.is_subset(&held), "{strategy} {topology}: rank {r}");
                }
                if strategy == Strategy::PerClass {
                    prop_assert!(twice.stats().max_depth <= plan.stats().max_depth);
                }
            }
        }
    }
}

#[test]
fn repair_reattaches_orphans_to_the_nearest_live_ancestor() {
    // Chain 0 -> 1 -> 2 -> 3 -> 4 of one class; 2 and 3 die: 4 fetches from 1.
    let spec = PlanSpec::new(5, 0)
        .with_topology(Topology::Chain)
        .with_output(OutputSpec::new("A", 8, vec![1, 2, 3, 4]));
    let plan = Plan::build(spec).unwrap();
    let repaired = plan
        .repair(&ft_core::RankSet::from_ranks(5, [2, 3]))
        .unwrap();
    repaired.check().unwrap();
    assert_eq!(edges(&repaired), [e(0, 1, &["A"]), e(1, 4, &["A"])]);
    assert_eq!(repaired.unreachable(), [2, 3]);
    assert_eq!(repaired.stats().max_depth, 2);
    assert!(plan.repair(&ft_core::RankSet::from_ranks(5, [0])).is_err());
}
