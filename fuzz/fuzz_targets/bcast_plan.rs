//! Arbitrary broadcast specs: building a plan either fails with a typed `SpecError` or
//! yields a plan that passes `Plan::check()`; repairing it after arbitrary deaths (root
//! spared) passes `check()` too. Nothing may panic.
#![no_main]

use std::num::NonZeroU32;

use arbitrary::Arbitrary;
use ft_bcast::{OutputSpec, Plan, PlanSpec, Strategy, Topology};
use ft_core::RankSet;
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Output {
    /// Names are drawn from a small pool so duplicates (an error) happen.
    name: u8,
    bytes: u64,
    dests: Vec<u16>,
}

#[derive(Arbitrary, Debug)]
struct Input {
    ranks: u16,
    /// Spread the ranks over a huge communicator (exercises the sparse class map).
    huge: bool,
    root: u16,
    failed: Vec<u16>,
    topology: u8,
    k: u8,
    strategy: u8,
    outputs: Vec<Output>,
    dead: Vec<u16>,
}

fuzz_target!(|input: Input| {
    let scale = |r: u16| {
        if input.huge {
            u32::from(r) << 16
        } else {
            u32::from(r)
        }
    };
    let ranks = if input.huge {
        u32::MAX
    } else {
        u32::from(input.ranks)
    };
    let topology = match input.topology % 4 {
        0 => Topology::Star,
        1 => Topology::Chain,
        2 => Topology::Binomial,
        _ => Topology::Kary(NonZeroU32::new(u32::from(input.k)).unwrap_or(NonZeroU32::MIN)),
    };
    let strategy = Strategy::ALL[usize::from(input.strategy) % 3];
    let failed: Vec<u32> = input.failed.iter().map(|&r| scale(r)).collect();
    let Ok(mut spec) = PlanSpec::new(ranks, scale(input.root))
        .with_topology(topology)
        .with_strategy(strategy)
        .with_failed(&failed)
    else {
        return;
    };
    for o in &input.outputs {
        let name = if o.name == 0 {
            String::new()
        } else {
            format!("o{}", o.name % 64)
        };
        let dests = o.dests.iter().map(|&r| scale(r)).collect::<Vec<_>>();
        spec.outputs.push(OutputSpec::new(name, o.bytes, dests));
    }
    let Ok(plan) = Plan::build(spec) else { return };
    if let Err(e) = plan.check() {
        panic!("{strategy} {topology}: built plan fails check: {e}");
    }
    let dead: Vec<u32> = input
        .dead
        .iter()
        .map(|&r| scale(r))
        .filter(|&r| r < ranks && r != plan.spec().root)
        .collect();
    let repaired = plan
        .repair(&RankSet::from_ranks(ranks, dead))
        .expect("the root is alive");
    if let Err(e) = repaired.check() {
        panic!("{strategy} {topology}: repaired plan fails check: {e}");
    }
});
