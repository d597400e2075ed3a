//! Bytes, activations, trees and depth of the three strategies on a few shapes of
//! broadcast. Every plan is checked; per-class bytes are asserted to be the minimum.
//!
//! Run: `cargo run --release -p ft-bcast --example strategies`

use ft_bcast::{OutputSpec, Plan, PlanSpec, Strategy, Topology};
use ft_core::SplitMix;

fn shapes() -> Vec<(&'static str, PlanSpec)> {
    let mut shapes = Vec::new();
    shapes.push((
        "#624: 3 ranks, A->{1,2} 1KiB, B->{2} 4KiB",
        PlanSpec::new(3, 0)
            .with_output(OutputSpec::new("A", 1024, vec![1, 2]))
            .with_output(OutputSpec::new("B", 4096, vec![2])),
    ));
    // Nested: output j (64 KiB) goes to ranks 1..n/2^j: the small sets need everything.
    let n = 4096;
    let mut nested = PlanSpec::new(n, 0);
    for j in 0..4 {
        nested.outputs.push(OutputSpec::new(
            format!("L{j}"),
            65536,
            (1..n >> j).collect::<Vec<_>>(),
        ));
    }
    shapes.push(("nested: 4096 ranks, 4 x 64KiB to 1..n/2^j", nested));
    // Disjoint: 8 outputs, each to its own eighth of the ranks.
    let mut disjoint = PlanSpec::new(n, 0);
    for j in 0..8u32 {
        disjoint.outputs.push(OutputSpec::new(
            format!("D{j}"),
            65536,
            (1..n).filter(|r| r % 8 == j).collect::<Vec<_>>(),
        ));
    }
    shapes.push(("disjoint: 4096 ranks, 8 x 64KiB to r%8==j", disjoint));
    // Random: 8 outputs of mixed sizes, each rank takes each with probability 1/2.
    let mut rng = SplitMix::new(0x9e37_79b9_7f4a_7c15);
    let mut random = PlanSpec::new(n, 0);
    for j in 0..8u32 {
        let dests: Vec<u32> = (1..n).filter(|_| rng.chance(1, 2)).collect();
        random
            .outputs
            .push(OutputSpec::new(format!("R{j}"), 4096 << j, dests));
    }
    shapes.push(("random: 4096 ranks, 8 outputs 4KiB..512KiB, p=1/2", random));
    // Sparse big: 10^5 ranks, one big output to everybody, a small one to 1%.
    let big = 100_000u32;
    shapes.push((
        "broadcast+sparse: 1e5 ranks, 1MiB to all, 4KiB to 1%",
        PlanSpec::new(big, 0)
            .with_output(OutputSpec::new(
                "all",
                1 << 20,
                (1..big).collect::<Vec<_>>(),
            ))
            .with_output(OutputSpec::new(
                "few",
                4096,
                (1..big).step_by(100).collect::<Vec<_>>(),
            )),
    ));
    shapes
}

fn main() {
    println!(
        "| shape | topology | strategy | trees | activations | bytes | max depth | bytes / minimum |"
    );
    println!("|---|---|---|---:|---:|---:|---:|---:|");
    for (name, spec) in shapes() {
        let minimum: u64 = spec
            .outputs
            .iter()
            .map(|o| o.bytes * o.dests.len() as u64)
            .sum();
        for topology in [Topology::Binomial, Topology::Chain] {
            for strategy in Strategy::ALL {
                let plan =
                    Plan::build(spec.clone().with_topology(topology).with_strategy(strategy))
                        .expect("valid spec");
                plan.check().expect("every plan meets the invariants");
                let s = plan.stats();
                if strategy == Strategy::PerClass {
                    assert_eq!(s.bytes, minimum, "per-class moves the minimum bytes");
                }
                println!(
                    "| {name} | {topology} | {strategy} | {} | {} | {} | {} | {:.2} |",
                    s.trees,
                    s.activations,
                    s.bytes,
                    s.max_depth,
                    s.bytes as f64 / minimum as f64
                );
            }
        }
    }
}
