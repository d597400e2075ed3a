//! The PaRSEC #624 shape: output A goes to ranks 1 and 2, output B only to rank 2, on a
//! chain. A merged tree would make rank 2 fetch B from rank 1, which never had it. Every
//! strategy here plans it correctly; `Plan::check` proves the invariants.
//!
//! Run: `cargo run --release -p ft-examples --example multi_output_broadcast`

use ft_bcast::{OutputSpec, Plan, PlanSpec, Strategy, Topology};

fn main() {
    for strategy in Strategy::ALL {
        let spec = PlanSpec::new(3, 0)
            .with_topology(Topology::Chain)
            .with_strategy(strategy)
            .with_output(OutputSpec::new("A", 1024, vec![1, 2]))
            .with_output(OutputSpec::new("B", 4096, vec![2]));
        let plan = Plan::build(spec).expect("a valid spec");
        plan.check()
            .expect("every parent holds what its children fetch");

        // What each rank receives: the union of the outputs on its incoming edges.
        let mut received: Vec<Vec<&str>> = vec![Vec::new(); 3];
        for edge in plan.edges() {
            let names: Vec<&str> = edge
                .outputs
                .iter()
                .map(|j| plan.spec().outputs[j as usize].name.as_ref())
                .collect();
            println!(
                "{:>22}: {} -> {} carries {:?}",
                strategy.name(),
                edge.parent,
                edge.child,
                names
            );
            // The #624 bug was a parent asked for what it never received.
            if edge.parent != 0 {
                let held = &received[edge.parent as usize];
                assert!(
                    names.iter().all(|n| held.contains(n)),
                    "rank {} lacks {names:?}",
                    edge.parent
                );
            }
            received[edge.child as usize].extend(names);
        }
        let mut into_rank2 = received[2].clone();
        into_rank2.sort_unstable();
        into_rank2.dedup();
        assert_eq!(into_rank2, ["A", "B"], "rank 2 gets both outputs");
        let stats = plan.stats();
        println!(
            "{:>22}: {} trees, {} activations, {} bytes, depth {}",
            strategy.name(),
            stats.trees,
            stats.activations,
            stats.bytes,
            stats.max_depth
        );
    }
}
